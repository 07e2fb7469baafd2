"""What a harness session asks before each model call and tool call: the run's guard.

The engine that runs an agent step (:mod:`little_es.engine.executor`) sets a
:class:`CallGuard` around the step's code; the session calls it:

* :meth:`~CallGuard.before_model_call` right before a model is called (after
  the call's ``harness.model.called`` is committed), never for a turn answered
  from the log: it stops a cancelled run, and one whose budget is spent;
* :meth:`~CallGuard.model_call_ended` once the call returned or raised: a call
  counts from :meth:`~CallGuard.before_model_call` on, so calls made at once by
  parallel steps are each checked against the others;
* :meth:`~CallGuard.model_responded` for each response, so the guard counts
  the calls made since it read the totals from the log;
* :meth:`~CallGuard.before_tool_calls` right before a batch of tool calls runs
  (after their ``harness.tool_call.started`` are committed): it stops a
  cancelled run;
* :meth:`~CallGuard.watch` for each of those commits, which reads what the
  guard's next check would ask the database (another writer's append to the
  run), in its own transaction: nothing runs between such a commit and the
  check, so the check need not ask again.

A guard stops the session by raising a :class:`~little_es.errors.RunStoppedError`,
which the session records nothing for: the call stays in flight and is made
when the run resumes. Without a guard (a session run on its own) nothing is checked.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

from little_es.backends.base import StreamWatch
from little_es.values import ModelResponse
from little_es.waits import WaitRequest

__all__ = ["CallGuard", "SignalWaiter", "current_guard", "guarding"]


class CallGuard(Protocol):
    """The checks an engine makes before the calls of an agent step (see the module)."""

    def before_model_call(self, step_path: str) -> None:
        """Raise a :class:`~little_es.errors.RunStoppedError` if the model must not be called."""
        ...

    def model_responded(self, response: ModelResponse, at: datetime) -> None:
        """Count a response just received (made at ``at``) towards the budgets."""
        ...

    def model_call_ended(self) -> None:
        """The call :meth:`before_model_call` let through returned, raised or was cancelled."""
        ...

    def before_tool_calls(self, step_path: str) -> None:
        """Raise a :class:`~little_es.errors.RunStoppedError` if the tools must not run."""
        ...

    def watch(self) -> StreamWatch | None:
        """What the session's next commit should read for the check that follows it, or
        None (see :class:`~little_es.backends.base.StreamWatch`)."""
        ...


@runtime_checkable
class SignalWaiter(Protocol):
    """A guard that can also make a tool call wait for a signal (``ask_human``, an approval):
    the engine's, which records ``RunWaiting`` through the run's writer."""

    async def await_signal(self, request: WaitRequest) -> Any:
        """The data of the signal ``request`` waits for, when it came; else record the wait
        and raise :class:`~little_es.errors.RunWaitingError` (the call stays in flight)."""
        ...


_current: ContextVar[CallGuard | None] = ContextVar("little_es_call_guard", default=None)


def current_guard() -> CallGuard | None:
    """The guard of the step whose code runs in this context, or None."""
    return _current.get()


@contextmanager
def guarding(guard: CallGuard | None) -> Iterator[None]:
    """Make ``guard`` the current guard for the code run inside the ``with`` block."""
    token = _current.set(guard)
    try:
        yield
    finally:
        _current.reset(token)

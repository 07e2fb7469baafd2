"""The model protocol a harness session calls, and a scripted model for tests.

A :class:`Model` turns one :class:`ModelRequest` (the whole conversation, the
tools and the parameters) into one :class:`ModelResponse`. Implementations hold
no recording logic: whether a call is made at all, or answered from the log, is
decided by the session that uses them.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from little_es.backends.base import check_leases
from little_es.errors import ModelConfigError, ModelError, ModelUnavailableError
from little_es.harness.guard import current_guard
from little_es.values import ModelRequest, ModelResponse, ToolCall, Usage
from little_es.workflow.ir import RetryPolicy

__all__ = [
    "Model",
    "ScriptedModel",
    "ScriptedReply",
    "ScriptedResponder",
    "call_model",
]

_R = TypeVar("_R")

MAX_IN_PLACE_WAIT_S = 60.0
"""The longest wait between two tries of a model call retried in place (see
:func:`call_model`), whatever the policy's backoff or the provider's ``Retry-After``."""


async def call_model(
    send: Callable[[], Awaitable[_R]],
    *,
    run_id: str,
    step_path: str,
    retry: RetryPolicy | None,
) -> _R:
    """Make one model call of a session's turn, through the step's guard.

    A retryable :class:`~little_es.errors.ModelError` (a 429, a 5xx, a dropped
    connection) is retried here, in place, by the agent step's ``retry``: at most
    ``max_attempts`` calls in all, with its backoff between them, each checked by the
    guard as a new call (a cancel or a spent budget stops the run with the call in
    flight) and each retry by the leases held (a driver that lost the run's during the
    backoff stops with :class:`~little_es.errors.LeaseLostError`, the call in flight,
    which the driver that took the run makes); never sooner than the provider asked
    (``ModelError.retry_after``), and never more than ``max_backoff_s`` or
    :data:`MAX_IN_PLACE_WAIT_S` apart. When the tries run out the run stops with the
    call in flight (:class:`~little_es.errors.ModelUnavailableError`), nothing recorded:
    a failed step attempt would start a new session, which makes every call and tool
    call of the conversation again (the answers already recorded paid for again, the
    tools run again), where a resume continues this one.
    """
    guard = current_guard()
    limit = 1 if retry is None else retry.max_attempts
    tries = 0
    while True:
        tries += 1
        if tries > 1:
            # The first try follows the commit of its harness.model.called, which checked
            # the lease; a retry follows a backoff, in which the lease may have been lost
            # (and the call taken up by the driver that took it).
            check_leases()
        if guard is not None:
            guard.before_model_call(step_path)
        try:
            return await send()
        except ModelError as exc:
            if not exc.retryable:
                raise
            if tries >= limit:
                raise ModelUnavailableError.after(run_id, step_path, exc, tries) from exc
            assert retry is not None  # tries < limit
            delay = retry.backoff_for(tries)
            if exc.retry_after is not None:
                # Sooner than the provider asked would only spend a try.
                delay = max(delay, exc.retry_after)
            # Kept short: the tries are counted in this process only, and a wait that
            # outlasted a Temporal activity's start-to-close timeout would start them
            # again in the next one, for ever.
            delay = min(delay, retry.max_backoff_s or MAX_IN_PLACE_WAIT_S, MAX_IN_PLACE_WAIT_S)
        finally:
            if guard is not None:
                guard.model_call_ended()
        await asyncio.sleep(delay)


class Model(Protocol):
    """Anything that can answer a model request.

    ``provider`` and ``model_id`` are known before any call (they go into the
    session manifest and select the price); they must not change afterwards.
    """

    @property
    def provider(self) -> str:
        """The provider name used for pricing, e.g. ``"openai"``."""
        ...

    @property
    def model_id(self) -> str:
        """The model name sent to the provider, e.g. ``"gpt-4o-mini"``."""
        ...

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """Answer ``request``; raise :class:`~little_es.errors.ModelError` if the call fails."""
        ...


class ScriptedReply(BaseModel):
    """A scripted answer without provider and model: :class:`ScriptedModel` fills them in."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    content: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    usage: Usage = Field(default_factory=Usage)


ScriptedResponder = Callable[
    [ModelRequest], ModelResponse | ScriptedReply | Awaitable[ModelResponse | ScriptedReply]
]
"""A function that computes a scripted answer from the request (it may be async)."""


class ScriptedModel:
    """A deterministic model for tests and examples.

    Give either ``responses`` (answer ``i`` is returned for turn ``i + 1``,
    where the turn is one more than the number of assistant messages already in
    the request, so the answer is a pure function of the request and a resumed
    session asking for turn 3 again gets turn 3's answer again), or
    ``respond``, a function (sync or async) of the request.

    ``calls`` and ``requests`` count the real invocations, so a test can assert
    that a replay or a resume did not call the model again.
    """

    def __init__(
        self,
        responses: Sequence[ModelResponse | ScriptedReply] | None = None,
        *,
        respond: ScriptedResponder | None = None,
        provider: str = "scripted",
        model_id: str = "scripted-1",
    ) -> None:
        if (responses is None) == (respond is None):
            raise ModelConfigError(
                "ScriptedModel needs exactly one of responses=[...] (answers by turn) or"
                " respond=function(request)"
            )
        for label, value in (("provider", provider), ("model_id", model_id)):
            if not isinstance(value, str) or not value:
                raise ModelConfigError(f"ScriptedModel {label} must be a non-empty string")
        self._provider = provider
        self._model_id = model_id
        self._respond = respond
        self._responses: tuple[ModelResponse, ...] = ()
        if responses is not None:
            if isinstance(responses, str | bytes) or not isinstance(responses, Sequence):
                raise ModelConfigError(
                    "ScriptedModel responses must be a list of ModelResponse or ScriptedReply"
                )
            filled: list[ModelResponse] = []
            for i, answer in enumerate(responses):
                response = self._fill(answer)
                if isinstance(response, str):
                    raise ModelConfigError(f"ScriptedModel responses[{i}] {response}")
                filled.append(response)
            self._responses = tuple(filled)
        if respond is not None and not callable(respond):
            raise ModelConfigError("ScriptedModel respond must be a function of the ModelRequest")
        self._requests: list[ModelRequest] = []

    @property
    def provider(self) -> str:
        """The provider name reported in responses built from a :class:`ScriptedReply`."""
        return self._provider

    @property
    def model_id(self) -> str:
        """The model name reported in responses built from a :class:`ScriptedReply`."""
        return self._model_id

    @property
    def calls(self) -> int:
        """How many times :meth:`complete` was really invoked."""
        return len(self._requests)

    @property
    def requests(self) -> list[ModelRequest]:
        """The requests :meth:`complete` received, in order (a copy)."""
        return list(self._requests)

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """Return the scripted answer for ``request``.

        Raises :class:`~little_es.errors.ModelError` (not retryable) when the
        list of responses has no answer for the requested turn or ``respond``
        returns something that is not an answer; exceptions raised by
        ``respond`` propagate unchanged, so a test can simulate provider errors.
        """
        if not isinstance(request, ModelRequest):
            raise ModelError(
                f"ScriptedModel.complete expects a ModelRequest, got {type(request).__name__}",
                retryable=False,
                provider=self._provider,
            )
        self._requests.append(request)
        if self._respond is None:
            turn = 1 + sum(1 for m in request.messages if m.role == "assistant")
            if turn > len(self._responses):
                raise ModelError(
                    f"ScriptedModel {self._model_id!r} has {len(self._responses)} scripted"
                    f" response(s) but turn {turn} was asked for: add a response for turn"
                    f" {turn}, or check why the session called the model again",
                    retryable=False,
                    provider=self._provider,
                )
            return self._responses[turn - 1]
        answer: object = self._respond(request)
        if inspect.isawaitable(answer):
            answer = await answer
        response = self._fill(answer)
        if isinstance(response, str):
            raise ModelError(
                f"ScriptedModel respond(request) {response}",
                retryable=False,
                provider=self._provider,
            )
        return response

    def _fill(self, answer: object) -> ModelResponse | str:
        """The response for ``answer``, or what is wrong with it."""
        if isinstance(answer, ModelResponse):
            return answer
        if not isinstance(answer, ScriptedReply):
            return f"must be a ModelResponse or a ScriptedReply, got {type(answer).__name__}"
        try:
            return ModelResponse(
                content=answer.content,
                tool_calls=answer.tool_calls,
                usage=answer.usage,
                provider=self._provider,
                model=self._model_id,
            )
        except ValidationError as exc:
            return f"is not a valid response: {exc}"

"""The one step executor: what every engine does to run a step, over a seam that writes the log.

The local scheduler (:mod:`little_es.engine.local`) and the Temporal adapter
both run a workflow's steps with :class:`StepExecutor`; they differ only in
how the run's ``Run`` stream is read and written (:class:`RunWriter`) and in
who retries (the local loop sleeps the backoff; Temporal schedules the next
activity attempt). The protocol of a task, decision, agent or subworkflow step:

1. :meth:`StepExecutor.begin`: a step with a committed ``StepCompleted`` is not
   run (:class:`Committed`); a step started and never finished is *in flight*
   and continues as the same attempt (a crash is not a failure; an agent step
   continues its harness session); otherwise ``StepStarted`` of the next
   attempt is committed. Either way the attempt gets its
   :class:`~little_es.workflow.context.StepContext` (:class:`Begun`).
2. :meth:`StepExecutor.attempt`: the step's code, then the checks that make a
   bad result this attempt's failure (a decision's target, an output that is
   not JSON), or the log would show the step in flight forever.
3. :meth:`StepExecutor.settle`: ``StepCompleted``, or ``StepFailed`` with the
   retry decision (the step's :class:`~little_es.workflow.ir.RetryPolicy`
   within its attempt budget, see :func:`next_attempt`) and the backoff.

A :class:`~little_es.errors.RuntimeIntegrityError`, found before a step (the
restart checks) or during one (a harness session whose log disagrees with the
code, a sub-run that refused), is a *refusal*, not a failure: it propagates out
of :meth:`~StepExecutor.attempt` with nothing appended, so it is never recorded
as ``StepFailed``/``RunFailed``, never consumes a retry, and never makes the next
resume start a new attempt (a new harness session). Once the cause is fixed, the
attempt in flight continues and every committed call fast-forwards.

:class:`~little_es.errors.LeaseLostError` is such a refusal: before a step's
code (or a group's ``branches``) runs, and before every append, the process
confirms it still holds its lease (:func:`~little_es.backends.base.check_leases`:
the run's lease on the local engine, the step's on Temporal).

Stops on purpose are not failures either. A run cancelled by another process
(``RunCancelled``, :func:`~little_es.durability.cancel_run`) is noticed before
each step (:meth:`StepExecutor.begin`) and, through the step's
:class:`~little_es.harness.guard.CallGuard`, before each model call and each
batch of tool calls: :class:`~little_es.errors.RunCancelledError` propagates
with nothing recorded for the interrupted work. A budget
(:class:`~little_es.values.Budget`: the run's ``BudgetSet``, over the run and
its sub-runs, and an agent step's own) is checked before each model call; when
it is spent, ``BudgetExceeded`` is recorded as the run's outcome and
:class:`~little_es.errors.BudgetExceededError` propagates, the step left in
flight so a resume with a larger budget continues its session.

A wait (a ``wait_for`` step, an ``ask_human`` call, a tool that requires approval:
:meth:`StepExecutor.await_signal`) is a stop on purpose too: ``RunWaiting`` is recorded
once and :class:`~little_es.errors.RunWaitingError` propagates, the step in flight, until
a ``SignalReceived`` (appended by another process, :meth:`~little_es.world.World.signal`)
gives the step its output or the call its answer; a deadline that passed first records
``WaitTimedOut`` (:class:`~little_es.errors.WaitTimedOutError`). The local engine stops
the run; the Temporal adapter's workflow waits on a Temporal signal and runs the same
attempt again.

Parallel groups (:meth:`~StepExecutor.schedule_group`,
:meth:`~StepExecutor.complete_group`), sub-runs (:meth:`~StepExecutor.sub_run`),
and the run's start, end and failure (:func:`open_run`,
:meth:`~StepExecutor.complete_run`, :meth:`~StepExecutor.fail_run`) are here too.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, NamedTuple, TypeAlias, TypeVar
from uuid import UUID

from little_es._frozen import freeze
from little_es._threads import run_in_worker
from little_es.aggregates import DomainStream, StepAggregates
from little_es.backends.base import StreamWatch, check_leases
from little_es.durability import (
    INPUT_PATH,
    NOTHING_READ,
    RunRecorder,
    checked_output,
    normalize_output,
    read_output,
)
from little_es.engine.integrity import (
    assert_completed_parallel_replay_matches_input,
    fork_adopts,
    run_restart_checks,
)
from little_es.engine.walk import branch_path
from little_es.errors import (
    AggregateConflictError,
    BudgetExceededError,
    ConcurrencyConflictError,
    DrivenElsewhereError,
    EngineUnsupportedError,
    EventPayloadError,
    RunCancelledError,
    RunFailedError,
    RunStateError,
    RunStoppedError,
    RuntimeIntegrityError,
    RunWaitingError,
    StepSuspendedError,
    VisitLimitError,
    WaitTimedOutError,
    WorldStorageError,
)
from little_es.events import BudgetExceeded, Event, utc_now
from little_es.harness.guard import CallGuard, guarding
from little_es.harness.session import run_agent_session
from little_es.ids import run_stream_id, session_stream_id
from little_es.logging import get_logger
from little_es.materialize import COUNTED_ONLY, RunFold, StepFold, dollars, picodollars
from little_es.totals import run_tree_totals
from little_es.values import Budget, ErrorInfo, ModelResponse, Usage, UsageTotals
from little_es.waits import WaitRequest
from little_es.workflow.authoring import (
    AgentStep,
    DecisionStep,
    ParallelStep,
    SubworkflowStep,
    TaskStep,
    WaitStep,
    Workflow,
)
from little_es.workflow.context import StepContext
from little_es.workflow.ir import StepIR
from little_es.workflow.paths import StepPathParts
from little_es.workflow.paths import step_path as make_step_path
from little_es.world import World

__all__ = [
    "Begun",
    "BudgetTracker",
    "CodeStep",
    "Committed",
    "ExecutableStep",
    "GroupScheduled",
    "HostedRun",
    "Outcome",
    "Retry",
    "RunWriter",
    "StepExecutor",
    "StepGuard",
    "SubRunHost",
    "budget_stop_error",
    "call_maybe_async",
    "check_engine",
    "check_run_request",
    "completed_step",
    "execute_step",
    "failed_run_error",
    "next_attempt",
    "open_run",
    "outputs_from_fold",
    "resolve_run_budget",
    "sub_run_id_for",
    "timed_out_error",
    "waiting_error",
]

_log = get_logger()

T = TypeVar("T")

CodeStep: TypeAlias = TaskStep | AgentStep | DecisionStep
"""A step whose attempt runs its own code (:func:`execute_step`)."""

ExecutableStep: TypeAlias = CodeStep | SubworkflowStep | WaitStep
"""A step that runs as attempts (a parallel group runs its branches instead)."""


def sub_run_id_for(parent_run_id: str, step_path: str) -> str:
    """The deterministic id of the sub-run a ``subworkflow`` step starts."""
    digest = hashlib.sha256(f"{parent_run_id}\x00{step_path}".encode()).hexdigest()[:20]
    return f"sub_{digest}"


def check_run_request(workflow: object, input: object, budget: object = None) -> str | None:
    """Why a run of ``workflow`` with ``input`` (and ``budget``) cannot be asked for, or None
    when it can."""
    if not isinstance(workflow, Workflow):
        return (
            f"workflow must be a little_es Workflow, got {type(workflow).__name__}: build one"
            " with Workflow(id, steps=[...])"
        )
    if input is not None and not isinstance(input, Mapping):
        return f"input must be a mapping (JSON object) or None, got {type(input).__name__}"
    if budget is not None and not isinstance(budget, Budget):
        return (
            f"budget must be a Budget(usd=..., tokens=..., model_calls=...) or None, got"
            f" {type(budget).__name__}"
        )
    return None


def check_engine(workflow: Workflow, engine: str) -> None:
    """Refuse, with :class:`~little_es.errors.EngineUnsupportedError`, a run of ``workflow`` on
    ``engine`` when one of its steps or tools (its sub-workflows' included, and the workflows
    an orchestrator's tool may start) declares ``engines=[...]`` without it.

    Engines call it before they append anything, so the refusal records nothing.
    """
    seen: set[tuple[str, str]] = set()

    def refuse(flow: Workflow, what: str, engines: frozenset[str]) -> None:
        raise EngineUnsupportedError(
            f"workflow {flow.id!r}: {what} runs on {', '.join(sorted(engines))} only, and"
            f" this run was started on {engine}: run it there, or declare the step or tool"
            f" with engines=[..., {engine!r}] once it supports it (nothing was recorded)"
        )

    def walk(flow: Workflow) -> None:
        if (flow.id, flow.ir_hash) in seen:
            return
        seen.add((flow.id, flow.ir_hash))
        for step in flow.steps:
            inner = step.step if isinstance(step, ParallelStep) else step
            if isinstance(inner, TaskStep) and inner.engines and engine not in inner.engines:
                refuse(flow, f"step {inner.id!r}", inner.engines)
            if isinstance(inner, SubworkflowStep):
                walk(inner.workflow)
            if isinstance(inner, AgentStep):
                for found in inner.tools.values():
                    if found.engines and engine not in found.engines:
                        what = f"tool {found.name!r} of agent step {inner.id!r}"
                        refuse(flow, what, found.engines)
                    started = getattr(found, "workflows", None)
                    if isinstance(started, Mapping):
                        for child in started.values():
                            if isinstance(child, Workflow):
                                walk(child)

    walk(workflow)


async def call_maybe_async(fn: Callable[..., Any], *args: Any, in_thread: bool = True) -> Any:
    """Call a user function, sync (in a worker thread unless ``in_thread`` is False) or
    async, and await what it returns."""
    if inspect.iscoroutinefunction(fn):
        return await fn(*args)
    result = await run_in_worker(fn, *args) if in_thread else fn(*args)
    if inspect.isawaitable(result):
        return await result
    return result


def next_attempt(recorded: StepFold | None, max_attempts: int) -> tuple[int, bool, int]:
    """``(attempt, in_flight, last_allowed_attempt)`` for a step about to run.

    A step started and never finished is *in flight*: it runs again as the same
    attempt (a crash is not a failure). After a recorded retryable failure the
    next attempt follows. The budget is ``max_attempts`` attempts counted from
    the start, or from the attempt after the last one that gave up
    (:attr:`~little_es.materialize.StepFold.gave_up_attempt`): a failed run
    resumed gives the (fixed) code a fresh budget, however often it resumes.
    """
    if recorded is None:
        return 1, False, max_attempts
    limit = recorded.gave_up_attempt + max_attempts
    if recorded.status == "running":
        return recorded.attempts, True, limit
    return recorded.attempts + 1, False, limit


def completed_step(fold: RunFold, step_path: str) -> StepFold | None:
    """The fold of ``step_path`` when it has a committed ``StepCompleted``, else None."""
    found = fold.steps.get(step_path)
    return found if found is not None and found.status == "completed" else None


async def execute_step(world: World, step: CodeStep, ctx: StepContext) -> Any:
    """Run one attempt of a task, decision or agent step's code (no events are written here
    except the agent's own harness session)."""
    if isinstance(step, AgentStep):
        prompt = (
            step.prompt
            if isinstance(step.prompt, str)
            else await call_maybe_async(step.prompt, ctx)
        )
        if step.runner is not None:
            # An integration's agent (e.g. Pydantic AI's) drives the session itself; it
            # records on the same HarnessSession stream, so resume and replay are the same.
            return await step.runner(world, ctx, prompt)
        outcome = await run_agent_session(
            world,
            run_id=ctx.run_id,
            step_path=ctx.step_path,
            attempt=ctx.attempt,
            model=step.model,
            tools=tuple(step.tools.values()),
            prompt=prompt,
            system=step.system,
            parameters=step.parameters,
            max_turns=step.max_turns,
            retry=step.ir.retry,
        )
        return outcome.output
    return await call_maybe_async(step.fn, ctx, in_thread=step.run_in_thread)


def outputs_from_fold(world: World, fold: RunFold) -> dict[str, Any]:
    """The latest committed output of each top-level step, as a step's context shows them."""
    outputs: dict[str, Any] = {}
    for path, step in fold.steps.items():
        if step.status == "completed" and "/" not in path:
            outputs[step.step_id] = read_output(world, step.output, step.output_ref)
    return outputs


def open_run(
    world: World,
    workflow: Workflow,
    run_id: str,
    input: Mapping[str, Any] | None,
    existing: RunRecorder | None,
    *,
    parent_run_id: str | None = None,
    parent_step_path: str | None = None,
    observer: Callable[[Event], None] | None = None,
    budget: Budget | None = None,
    resume_cancelled: bool = False,
) -> RunRecorder:
    """Start ``run_id`` (``RunStarted``) when it has no log, else check that it may resume.

    ``existing`` is the run's recorder when its log exists; the restart checks
    (:func:`~little_es.engine.integrity.run_restart_checks`) run on it and it is
    returned. A cancelled run is refused with
    :class:`~little_es.errors.RunCancelledError` unless ``resume_cancelled``;
    a cancelled or out-of-budget run that continues records ``RunResumed``.
    ``budget`` (None: keep the recorded one) is recorded as ``BudgetSet`` when
    it differs from the run's. The caller holds the run's lease.
    """
    if existing is not None:
        adopting = fork_adopts(world, run_id, existing.fold, existing.run.version, workflow)
        run_restart_checks(world, run_id, existing.fold, workflow, input, adopting=adopting)
        fold = existing.fold
        if fold.status == "completed":
            return existing
        if fold.status == "cancelled" and not resume_cancelled:
            raise RunCancelledError(run_id, fold.stop_reason, resuming=True)
        if fold.status == "timed_out":
            raise timed_out_error(run_id, fold)
        if adopting:
            # A fork runs changed code after its fork point: recorded before anything runs.
            existing.workflow_adopted(workflow_version=workflow.version, ir_hash=workflow.ir_hash)
        if budget is not None and budget != fold.budget:
            existing.budget_set(budget)
        if fold.status in ("cancelled", "budget_exceeded"):
            existing.run_resumed()
        return existing
    started = RunRecorder.start(
        world,
        run_id=run_id,
        workflow_id=workflow.id,
        workflow_version=workflow.version,
        ir_hash=workflow.ir_hash,
        input=normalize_output(INPUT_PATH, dict(input or {})),
        parent_run_id=parent_run_id,
        parent_step_path=parent_step_path,
        observer=observer,
    )
    if budget is not None:
        started.budget_set(budget)
    return started


def timed_out_error(run_id: str, fold: RunFold) -> WaitTimedOutError:
    """The :class:`~little_es.errors.WaitTimedOutError` of a run whose wait timed out."""
    for wait in fold.waits.values():
        if wait.status == "timed_out" and wait.deadline is not None:
            return WaitTimedOutError(
                run_id,
                signal=wait.signal,
                step_path=wait.step_path,
                deadline=wait.deadline.isoformat(),
            )
    return WaitTimedOutError(
        run_id, signal="?", step_path=fold.stopped_step_path or "?", deadline="?"
    )


def budget_stop_error(world: World, run_id: str) -> BudgetExceededError:
    """The :class:`~little_es.errors.BudgetExceededError` of a run whose log says it is out
    of budget: its last ``BudgetExceeded``, as the driver that stopped raised it."""
    # The run's own stream holds it: its sessions' streams need not be read.
    stops = [e for e in world.read_stream(run_stream_id(run_id)) if isinstance(e, BudgetExceeded)]
    if not stops:
        raise RunStateError(f"run {run_id!r} is out of budget but its log holds no BudgetExceeded")
    stop = stops[-1]
    return BudgetExceededError(
        run_id,
        scope=stop.scope,
        spent=stop.spent,
        step_path=stop.step_path,
        unpriced_calls=stop.unpriced_calls,
    )


def failed_run_error(run_id: str, fold: RunFold) -> RunFailedError | VisitLimitError:
    """What a failed run raises to whoever drives it, as ``run_workflow`` raises it on every
    engine: a run stopped by a decision's visit limit (a failure at no step) its
    :class:`~little_es.errors.VisitLimitError`, any other its
    :class:`~little_es.errors.RunFailedError`."""
    if fold.error is None:
        raise RunStateError(f"run {run_id!r} is {fold.status}, not failed")
    if fold.failed_step_path is None and fold.error.type == VisitLimitError.__name__:
        return VisitLimitError(fold.error.message)
    return RunFailedError(run_id, fold.failed_step_path, fold.error)


def waiting_error(run_id: str, fold: RunFold) -> RunWaitingError:
    """The :class:`~little_es.errors.RunWaitingError` naming every open wait of the run."""
    return RunWaitingError(
        run_id,
        tuple(
            (w.signal, w.step_path, w.wait_id) for w in fold.waits.values() if w.status == "waiting"
        ),
    )


class BudgetTracker:
    """What a budget's scope has spent: its totals read from the log once, plus every model
    call counted since in this process.

    A call counts towards ``model_calls`` from the moment it starts (:meth:`begin_call`)
    until it returns or raises (:meth:`end_call`; :meth:`add` counts a response for good):
    otherwise parallel branches checking at one moment would all pass, each starting a
    call the limit has no room for. Its tokens and dollars are known only from its
    response, so calls in flight together may pass a ``tokens`` or ``usd`` limit by what
    they spend.

    A run's tracker counts the calls of its sub-runs driven in the same process
    too (their trackers are its children: :meth:`add` goes up the chain), and
    is checked with its ancestors' (:meth:`check`). Elsewhere (another worker,
    another process) a sub-run's calls are in the totals read at its next start.
    """

    def __init__(
        self,
        world: World,
        *,
        scope: str,
        budget: Budget,
        base: UsageTotals,
        parent: BudgetTracker | None = None,
    ) -> None:
        self.world = world
        self.scope = scope
        self.budget = budget
        self.parent = parent
        self._input = base.input_tokens
        self._output = base.output_tokens
        self._cached = base.cached_input_tokens
        self._reasoning = base.reasoning_tokens
        self._cache_write = base.cache_write_tokens
        self._calls = base.calls
        self._unpriced = base.unpriced_calls
        exact = base.cost_usd_exact
        self._pusd = 0 if exact is None else picodollars(exact)
        self._in_flight = 0

    def begin_call(self) -> None:
        """Count a call that starts (see the class) until it responds or fails."""
        tracker: BudgetTracker | None = self
        while tracker is not None:
            tracker._in_flight += 1
            tracker = tracker.parent

    def end_call(self) -> None:
        """A call counted by :meth:`begin_call` returned or raised."""
        tracker: BudgetTracker | None = self
        while tracker is not None:
            tracker._in_flight -= 1
            tracker = tracker.parent

    def add(self, response: ModelResponse, at: datetime) -> None:
        """Count one call (priced as the reducer prices it: the world's pricer, at ``at``)."""
        cost = self.world.pricer(response.provider, response.model, response.usage, at)
        self._add(response.usage, None if cost is None else picodollars(cost))

    def _add(self, usage: Usage, pusd: int | None) -> None:
        self._input += usage.input_tokens
        self._output += usage.output_tokens
        self._cached += usage.cached_input_tokens
        self._reasoning += usage.reasoning_tokens
        self._cache_write += usage.cache_write_tokens
        self._calls += 1
        if pusd is None:
            self._unpriced += 1
        else:
            self._pusd += pusd
        if self.parent is not None:
            self.parent._add(usage, pusd)

    def spent(self) -> UsageTotals:
        """The scope's totals as they stand."""
        none_priced = bool(self._calls) and self._calls == self._unpriced
        return UsageTotals(
            input_tokens=self._input,
            output_tokens=self._output,
            cached_input_tokens=self._cached,
            reasoning_tokens=self._reasoning,
            cache_write_tokens=self._cache_write,
            cost_usd=None if none_priced else float(dollars(self._pusd)),
            cost_usd_exact=None if none_priced else dollars(self._pusd),
            unpriced_calls=self._unpriced,
            calls=self._calls,
        )

    def check(self, run_id: str, step_path: str | None) -> None:
        """Raise :class:`~little_es.errors.BudgetExceededError` (for ``run_id``) when this
        scope's budget, or an ancestor's, is spent: the next call would start past it."""
        tracker: BudgetTracker | None = self
        while tracker is not None:
            spent = tracker.spent()
            # The calls in flight have started: the next one comes after them.
            started = spent.model_copy(update={"calls": spent.calls + tracker._in_flight})
            why = tracker.budget.exceeded(started)
            if why is not None:
                raise BudgetExceededError(
                    run_id,
                    scope=tracker.scope,
                    spent=why,
                    step_path=step_path,
                    unpriced_calls=spent.unpriced_calls,
                )
            tracker = tracker.parent


def resolve_run_budget(world: World, run_id: str, fold: RunFold) -> BudgetTracker | None:
    """The tracker of the budget that covers ``run_id``: its own, else its nearest ancestor's
    (read through ``parent_run_id``), with that run's tree totals read from the log."""
    owner, budget, parent = run_id, fold.budget, fold.parent_run_id
    seen = {run_id}
    while budget is None and parent is not None and parent not in seen:
        seen.add(parent)
        ancestor = world.load_run(parent).fold
        owner, budget, parent = parent, ancestor.budget, ancestor.parent_run_id
    if budget is None:
        return None
    return BudgetTracker(
        world,
        scope=f"run {owner!r} with its sub-runs",
        budget=budget,
        base=run_tree_totals(world, owner),
    )


_UNRESOLVED: Any = object()


def _current_task() -> asyncio.Task[Any] | None:
    try:
        return asyncio.current_task()
    except RuntimeError:  # no event loop in this thread
        return None


class StepGuard:
    """The :class:`~little_es.harness.guard.CallGuard` of one step attempt.

    Before each model call and batch of tool calls: the run (and, for a sub-run
    driven in this process, its parents) must not be cancelled; before each
    model call, the run's budget and the agent step's own must not be spent.
    The budgets' totals are read from the log at the first model call only.
    """

    def __init__(self, executor: StepExecutor, begun: Begun, parent: CallGuard | None) -> None:
        self.executor = executor
        # Not the attempt itself: its context would stay alive with this guard in the
        # copy of the contextvars a step's worker thread ran it in, for as long as that
        # copy lives.
        self.step = begun.step
        self.step_path = begun.step_path
        self.parent = parent
        self._step: BudgetTracker | None = _UNRESOLVED
        self._watch: tuple[StreamWatch, asyncio.Task[Any] | None] | None = None

    def watch(self) -> StreamWatch | None:
        """The watch for the commit of the next call's write-ahead record: the streams of
        this run and of the parents driven in this process, which the next check then
        need not query (see :class:`~little_es.backends.base.StreamWatch`)."""
        versions: dict[UUID, int] = {}
        guard: CallGuard | None = self
        while isinstance(guard, StepGuard):
            position = guard.executor.writer.watched()
            if position is not None:
                versions[position[0]] = position[1]
            guard = guard.parent
        if not versions:
            self._watch = None
            return None
        watch = StreamWatch(versions)
        self._watch = (watch, _current_task())
        return watch

    def check_stop(self) -> None:
        """Raise :class:`~little_es.errors.RunCancelledError` if the run (or a parent) was
        cancelled."""
        # A watch speaks for the check that follows its commit in the same task, with no
        # await between them (the session's order), once; not for another task's check
        # (two sessions of one step) nor for a later one.
        held, self._watch = self._watch, None
        unchanged = NOTHING_READ
        if held is not None and held[1] is not None and held[1] is _current_task():
            unchanged = held[0].unchanged_at()
        self.check_stopped_through(unchanged)

    def check_stopped_through(self, unchanged: Mapping[UUID, int] = NOTHING_READ) -> None:
        """Raise :class:`~little_es.errors.RunCancelledError` if this step's run, or one of
        its parents, was cancelled (``unchanged``: see :meth:`RunWriter.refresh`)."""
        self.executor.check_stopped(unchanged)
        self.executor.check_parents_stopped(unchanged)

    def _trackers(self) -> tuple[BudgetTracker, ...]:
        if self._step is _UNRESOLVED:
            self._step = None
            step = self.step
            if isinstance(step, AgentStep) and step.budget is not None:
                path = self.step_path
                state = self.executor.world.read_run_log_skipping(
                    self.executor.run_id, COUNTED_ONLY
                ).materialize()
                found = state.steps.get(path)
                self._step = BudgetTracker(
                    self.executor.world,
                    scope=f"agent step {path!r}",
                    budget=step.budget,
                    base=found.usage if found is not None else UsageTotals(),
                )
        run = self.executor.budget_tracker()
        return tuple(t for t in (self._step, run) if t is not None)

    def before_model_call(self, step_path: str) -> None:
        """Stop a cancelled run, then one whose budget (the run's or the step's) is spent;
        else count the call as started (:meth:`BudgetTracker.begin_call`)."""
        self.check_stop()
        trackers = self._trackers()
        for tracker in trackers:
            tracker.check(self.executor.run_id, self.step_path)
        for tracker in trackers:
            tracker.begin_call()

    def model_call_ended(self) -> None:
        """The call let through by :meth:`before_model_call` returned or raised: it is in
        flight no more (:meth:`model_responded` counts a response for good)."""
        for tracker in self._trackers():
            tracker.end_call()

    def model_responded(self, response: ModelResponse, at: datetime) -> None:
        """Count the call towards the step's budget and the run's (and the run's parents')."""
        for tracker in self._trackers():
            tracker.add(response, at)

    def before_tool_calls(self, step_path: str) -> None:
        """Stop a cancelled run before its tools run."""
        self.check_stop()

    async def await_signal(self, request: WaitRequest) -> Any:
        """A tool call's wait (``ask_human``, an approval), through the step's executor."""
        return await self.executor.await_signal(request)


class RunWriter(ABC):
    """How the executor reads and writes one run's ``Run`` stream: the seam to an engine.

    The local scheduler holds the run's one aggregate in memory and is its only
    writer. The Temporal adapter's activities may run on several workers at
    once: its writer catches up with what others appended before it decides,
    and decides again after a lost optimistic-concurrency race.
    """

    def __init__(self, world: World, run_id: str) -> None:
        self.world = world
        self.run_id = run_id

    @abstractmethod
    def read(self) -> RunFold:
        """The run's state to decide on, with everything committed so far."""

    @abstractmethod
    async def write(self, action: Callable[[RunRecorder], T], *, catch_up: bool = True) -> T:
        """Run ``action`` (it reads ``recorder.fold``, decides and commits); return its result.

        ``catch_up=False`` lets ``action`` see the state last read: only for an
        action that commits (the commit checks the stream's version) or returns
        early on a fact that never goes stale (a committed ``StepCompleted``).
        """

    @abstractmethod
    def refresh(self, unchanged: Mapping[UUID, int] = NOTHING_READ) -> RunFold:
        """The run's state with what other processes appended since it was last read
        (a ``RunCancelled``): one indexed query when they appended nothing, none when
        ``unchanged`` holds the run's stream at the version this writer holds
        (:meth:`RunRecorder.refresh <little_es.durability.RunRecorder.refresh>`)."""

    def watched(self) -> tuple[UUID, int] | None:
        """The run's stream and version for a commit to read past on :meth:`refresh`'s
        behalf (:class:`~little_es.backends.base.StreamWatch`), or None (nothing to offer)."""
        return None

    def parents(self) -> Iterator[tuple[str, RunFold]]:
        """The id and state of each parent of a sub-run whose driver is not in this process,
        nearest first, with everything committed so far; none for a writer whose
        sub-runs are driven beside their parents (the executor asks those through the
        parent step's guard)."""
        return iter(())

    @abstractmethod
    def outputs(self, fold: RunFold) -> Mapping[str, Any]:
        """The frozen ``outputs`` a step's context shows (latest output per top-level step)."""

    def flush(self) -> None:
        """Commit what the writer holds back (a held ``StepCompleted``, see
        :mod:`little_es.durability`); a writer that never holds anything does nothing."""
        # Only a writer that holds events back (the local one) overrides it.
        return


@dataclass(frozen=True)
class HostedRun:
    """A run an engine hosts for a step: its id, workflow and input, and who asked for it.

    The id is reserved (``SubRunReserved`` on the parent's stream) before the
    run is hosted, so a crash never hosts a second run for one request.
    ``max_concurrency`` is the requester's bound on how many of its sub-runs
    run at once (``start_workflow_tool``'s); None (a subworkflow step) sets
    none. The local engine applies it in the tool itself; an engine that hosts
    a step's requests all together elsewhere (Temporal's child workflows)
    applies the smallest one given.
    """

    run_id: str
    workflow: Workflow
    input: Mapping[str, Any]
    parent_run_id: str
    parent_step_path: str
    max_concurrency: int | None = None


class SubRunHost(ABC):
    """How an engine runs a sub-run a step asks for: the seam between a step and its engine.

    The local engine runs it in the step's own process (``run_workflow``);
    the Temporal adapter, whose step runs in an activity, cannot: it raises
    :class:`~little_es.errors.StepSuspendedError`, the workflow starts a child
    workflow whose id is the run id, and the same attempt runs again.
    """

    @abstractmethod
    async def run(self, request: HostedRun) -> Any:
        """Run ``request`` (or resume it, or read its recorded result) to its end; return its
        output. Raises :class:`~little_es.errors.RunFailedError` when it failed, and
        :class:`~little_es.errors.StepSuspendedError` when it runs elsewhere, unfinished."""


_UNREAD: Any = object()


class Committed(NamedTuple):
    """A step's committed ``StepCompleted``, as the run's fold holds it."""

    step: StepFold
    executed: bool
    """True when this call committed it, False when it was in the log already."""
    value: Any = _UNREAD

    def output(self, world: World) -> Any:
        """The committed output (read from its artifact when it is stored by reference)."""
        if self.value is _UNREAD:
            return read_output(world, self.step.output, self.step.output_ref)
        return self.value


class Begun(NamedTuple):
    """A step attempt whose ``StepStarted`` is committed (or that was in flight)."""

    step: ExecutableStep
    step_path: str
    visit: int
    attempt: int
    limit: int
    """The last attempt the step's retry budget allows."""
    in_flight: bool
    ctx: StepContext | None
    """The attempt's context (None when the attempt was only looked up, not started)."""


class Outcome(NamedTuple):
    """What an attempt came to: an output (and a decision's target), or a failure."""

    output: Any = None
    next_step: str | None = None
    error: ErrorInfo | None = None
    exception: BaseException | None = None
    encoded: tuple[bytes, Any] | None = None
    """The output's JSON and the value it reads back as, checked (``checked_output``) when
    the attempt ended: :meth:`StepExecutor.settle` records them without encoding again."""


class Retry(NamedTuple):
    """A recorded failure: whether another attempt follows, and after how many seconds."""

    error: ErrorInfo
    will_retry: bool
    delay_s: float = 0.0
    cause: BaseException | None = None


class GroupScheduled(NamedTuple):
    """A parallel group whose ``ParallelBranchScheduled`` is committed: its branch set."""

    keys: tuple[str, ...]
    branch_set: Mapping[str, Any]


def _kept_by_fork(fold: RunFold, step_path: str) -> StepFold | None:
    """The group ``step_path`` if it completed in the prefix a fork copied under another run
    input, else None.

    Its branch set was computed from the origin's input, which the fork no longer holds:
    recomputed from the new one it would differ (a refusal that leaves the fork unable to
    resume), and it is the origin's resume that checked it. The fork keeps the group's
    result as it keeps every step's before its fork point.
    """
    origin = fold.forked_from
    if origin is None or not origin.input_changed:
        return None
    done = completed_step(fold, step_path)
    # RunForked is version 1, the copied rows follow it; 0: a version not known (a
    # snapshot that named none), checked as any group is.
    if done is not None and 0 < done.output_version <= origin.copied_events + 1:
        return done
    return None


class StepExecutor:
    """Runs the steps of one run of ``workflow``, writing through ``writer`` (see the module)."""

    def __init__(self, writer: RunWriter, workflow: Workflow) -> None:
        self.writer = writer
        self.world = writer.world
        self.run_id = writer.run_id
        self.workflow = workflow
        self._input: Mapping[str, Any] | None = None
        self.run_budget: BudgetTracker | None = _UNRESOLVED
        """The run's budget tracker; resolved from the log when the engine did not set it."""
        self.parent_guard: CallGuard | None = None
        """The guard of the step that drives this run as a sub-run in this process, if any."""
        self.host: SubRunHost | None = None
        """How this engine runs the sub-runs of this run's steps (set by the engine)."""

    def budget_tracker(self) -> BudgetTracker | None:
        """The tracker of the budget over this run (its own or an ancestor's), or None."""
        if self.run_budget is _UNRESOLVED:
            self.run_budget = resolve_run_budget(self.world, self.run_id, self.writer.read())
        return self.run_budget

    def check_stopped(self, unchanged: Mapping[UUID, int] = NOTHING_READ) -> None:
        """Raise :class:`~little_es.errors.RunCancelledError` if the run was cancelled,
        :class:`~little_es.errors.WaitTimedOutError` if one of its waits timed out while
        another branch went on (on Temporal its timer fires as the others run: the run is
        stopped for good, and what it would call next is paid for nothing), and
        :class:`~little_es.errors.BudgetExceededError` if another branch found the run's
        budget spent (``unchanged``: see :meth:`RunWriter.refresh`)."""
        fold = self.writer.refresh(unchanged)
        if fold.status == "cancelled":
            raise RunCancelledError(self.run_id, fold.stop_reason)
        if fold.status == "timed_out":
            raise timed_out_error(self.run_id, fold)
        if fold.status == "budget_exceeded" and self._shares_spent_budget(fold):
            # Recorded by another branch: on Temporal each branch's activity counts its own
            # calls, and this one's count may not have reached the limit yet.
            raise budget_stop_error(self.world, self.run_id)

    def _shares_spent_budget(self, fold: RunFold) -> bool:
        """Whether the budget ``fold`` says is spent is the one over this whole run (not an
        agent step's own: the run's other branches go on within theirs). The fold's
        ``stop_reason`` starts with the scope of the tracker that stopped the run."""
        tracker = self.budget_tracker()
        spent = f"{tracker.scope} has spent " if tracker is not None else None
        return spent is not None and (fold.stop_reason or "").startswith(spent)

    def check_parents_stopped(self, unchanged: Mapping[UUID, int] = NOTHING_READ) -> None:
        """Raise :class:`~little_es.errors.RunCancelledError` if a parent of this sub-run was
        cancelled (:class:`~little_es.errors.WaitTimedOutError`: timed out): a sub-run stops
        with its parent, before its next step as before its
        next call. A parent driven in this process is asked through its step's guard;
        one driven elsewhere (a Temporal parent workflow) through its log."""
        if isinstance(self.parent_guard, StepGuard):
            self.parent_guard.check_stopped_through(unchanged)
        for parent_id, parent in self.writer.parents():
            if parent.status == "cancelled":
                raise RunCancelledError(parent_id, parent.stop_reason)
            if parent.status == "timed_out":
                raise timed_out_error(parent_id, parent)

    def context(
        self,
        fold: RunFold,
        step_path: str,
        attempt: int,
        branch_value: Any = None,
        *,
        aggregates: bool = False,
    ) -> StepContext:
        """The context of an attempt of ``step_path``, over the run's input and outputs.

        With ``aggregates``, it carries the attempt's unit of work (``ctx.aggregates``),
        which :meth:`settle` commits: only for a task, decision or agent step, whose
        attempt is settled with the context it ran with. A group's ``branches(ctx)`` and a
        subworkflow step's ``input(ctx)`` get none, so a change there is refused instead
        of lost.
        """
        if self._input is None:
            self._input = freeze(read_output(self.world, fold.input, fold.input_ref) or {})
        return StepContext(
            run_id=self.run_id,
            input=self._input,
            outputs=self.writer.outputs(fold),
            step_path=step_path,
            attempt=attempt,
            branch_value=branch_value,
            domain_aggregates=StepAggregates(self.world.load_domain_stream) if aggregates else None,
        )

    # ------------------------------------------------------------ one step

    async def begin(
        self,
        step: ExecutableStep,
        step_path: str,
        visit: int,
        branch_value: Any = None,
        *,
        start: bool = True,
        catch_up: bool = False,
    ) -> Begun | Committed:
        """The committed result of ``step_path``, or the attempt to run now.

        The attempt in flight when there is one, else the next one, whose
        ``StepStarted`` (with the agent's session id) is committed first. With
        ``start=False`` nothing is written and no context is built: the caller
        looks up the attempt in flight (``in_flight`` says whether there is one).
        """
        max_attempts = step.ir.retry.max_attempts
        session = isinstance(step, AgentStep)

        def begin(rec: RunRecorder) -> Begun | Committed:
            recorded = rec.fold.steps.get(step_path)
            if recorded is not None and recorded.status == "completed":
                return Committed(recorded, executed=False)
            if start and rec.fold.status == "cancelled":
                raise RunCancelledError(self.run_id, rec.fold.stop_reason)
            if start:
                self.check_parents_stopped()
            attempt, in_flight, limit = next_attempt(recorded, max_attempts)
            if start and not in_flight:
                rec.step_started(
                    step_path,
                    step_id=step.id,
                    kind=step.ir.kind,
                    visit=visit,
                    attempt=attempt,
                    session_id=(
                        session_stream_id(self.run_id, step_path, attempt) if session else None
                    ),
                )
            ctx = (
                self.context(
                    rec.fold,
                    step_path,
                    attempt,
                    branch_value,
                    aggregates=not isinstance(step, SubworkflowStep),
                )
                if start
                else None
            )
            return Begun(step, step_path, visit, attempt, limit, in_flight, ctx)

        begun = await self.writer.write(begin, catch_up=catch_up)
        if start and isinstance(begun, Begun) and begun.in_flight:
            # A new attempt's StepStarted was appended at the next version: a cancel
            # recorded by another process made it lose the version check, and the
            # writer decided again, seeing the cancel. An attempt in flight appends
            # nothing, so it looks.
            self.check_stopped()
        return begun

    async def attempt(self, begun: Begun, code: Callable[[], Awaitable[Any]]) -> Outcome:
        """Await ``code()`` (the attempt's work) and check what it returned.

        An :class:`Exception` the step raised is the outcome's (its failure),
        except a :class:`~little_es.errors.RuntimeIntegrityError`, which
        propagates: it is a refusal (see :mod:`little_es.engine.executor`), and a
        :class:`~little_es.errors.WorldStorageError`, the database failing the
        step's own records.
        """
        # The step's code may read what the previous step held back: committed first.
        self.writer.flush()
        # A process that lost the run's lease starts nothing more (LeaseLostError, a refusal).
        check_leases()
        try:
            with guarding(StepGuard(self, begun, self.parent_guard)):
                output = await code()
            next_step = None
            if isinstance(begun.step, DecisionStep):
                next_step = self.workflow.check_decision_target(begun.step.id, output)
            encoded = checked_output(begun.step_path, output)
        except StepSuspendedError:
            # The engine hosts sub-runs elsewhere: the attempt stays in flight, nothing
            # is recorded, and the engine runs it again once they finished.
            raise
        except (RuntimeIntegrityError, WorldStorageError, DrivenElsewhereError):
            # The log and the code disagree (a changed prompt, a tampered recorded
            # response, a sub-run that refused), the world's database failed the
            # step's own records (a harness call's commit), or another process drives
            # a part of the run (the step's sub-run, its harness session): not the
            # step's failure. (A conflict the step's own code meets is.)
            # Recording StepFailed would spend a retry and start a new harness session
            # that re-runs every committed call; nothing is written, the attempt stays
            # in flight, and a resume after the cause is fixed continues it.
            raise
        except RunStoppedError as exc:
            # Cancelled, or out of budget: not the step's failure either. The attempt
            # stays in flight; a budget stop is recorded as the run's own outcome.
            if isinstance(exc, BudgetExceededError):
                await self._budget_exceeded(exc, begun.step_path)
            raise
        except Exception as exc:
            return Outcome(error=ErrorInfo.from_exception(exc), exception=exc)
        return Outcome(output=output, next_step=next_step, encoded=encoded)

    async def _budget_exceeded(self, exc: BudgetExceededError, step_path: str) -> None:
        def record(rec: RunRecorder) -> None:
            # Parallel branches stop one by one: the first records the run's outcome.
            if rec.fold.status not in ("budget_exceeded", "cancelled", "completed"):
                rec.budget_exceeded(
                    scope=exc.scope,
                    spent=exc.spent,
                    step_path=step_path,
                    unpriced_calls=exc.unpriced_calls,
                )

        await self.writer.write(record)

    async def settle(
        self, begun: Begun, outcome: Outcome, *, hold: bool = False
    ) -> Committed | Retry:
        """Commit the attempt's ``StepCompleted``, or its ``StepFailed`` and the retry decision.

        ``hold``: the ``StepCompleted`` may be held back and committed with the run's next
        record (:mod:`little_es.durability`, "One commit per step"); only for an engine
        whose writer keeps the run's recorder between steps, and a top-level step.
        """
        if outcome.error is not None:
            return await self._fail(begun, outcome.error, outcome.exception)
        path = begun.step_path
        changes: tuple[DomainStream, ...] = ()
        unit = begun.ctx.domain_aggregates if begun.ctx is not None else None
        if unit is not None:
            try:
                changes = unit.take_changes()
            except EventPayloadError as exc:
                # An aggregate event that cannot be stored: this attempt's failure, and
                # one a retry of the same code would repeat.
                return await self._fail(begun, ErrorInfo.from_exception(exc, retryable=False), exc)

        def complete(rec: RunRecorder) -> Committed:
            done = completed_step(rec.fold, path)
            if done is not None:
                # Another attempt (one Temporal gave up on but that kept running)
                # committed first; its result (and its effect on aggregates) is the step's.
                return Committed(done, executed=True)
            try:
                value = rec.step_completed(
                    path,
                    step_id=begun.step.id,
                    visit=begun.visit,
                    attempt=begun.attempt,
                    output=outcome.output,
                    next_step=outcome.next_step,
                    aggregates=changes,
                    hold=hold,
                    encoded=outcome.encoded,
                )
            except ConcurrencyConflictError:
                stale = [c for c in changes if self.world.has_events_after(c.id, c.base_version)]
                if not stale:
                    raise  # the run's own stream: the writer decides again
                # Nothing was written; the run's aggregate holds the StepCompleted that
                # was not saved, so it is read afresh before the failure is recorded.
                rec.reload()
                raise AggregateConflictError(
                    f"step {path!r} of run {self.run_id!r}: another writer changed "
                    + ", ".join(
                        f"{type(c.aggregate).__qualname__} {c.id} (read at version"
                        f" {c.base_version})"
                        for c in stale
                    )
                    + " first; nothing of this attempt was committed, and the next attempt"
                    " reads it afresh (give the step a RetryPolicy to retry it)"
                ) from None
            return Committed(rec.fold.steps[path], executed=True, value=value)

        try:
            return await self.writer.write(complete, catch_up=False)
        except AggregateConflictError as exc:
            return await self._fail(begun, ErrorInfo.from_exception(exc), exc)

    async def _fail(self, begun: Begun, error: ErrorInfo, cause: BaseException | None) -> Retry:
        return await self._attempt_failed(
            begun.step.ir, begun.step_path, begun.visit, begun.attempt, begun.limit, error, cause
        )

    async def _attempt_failed(
        self,
        step: StepIR,
        step_path: str,
        visit: int,
        attempt: int,
        limit: int,
        error: ErrorInfo,
        cause: BaseException | None,
    ) -> Retry:
        """Commit ``StepFailed`` for an attempt of ``step`` and decide on a retry by its
        policy (a step's code, or a parallel group's ``branches``)."""
        will_retry = error.retryable and attempt < limit

        def fail(rec: RunRecorder) -> None:
            rec.step_failed(
                step_path,
                step_id=step.id,
                visit=visit,
                attempt=attempt,
                error=error,
                will_retry=will_retry,
            )

        await self.writer.write(fail, catch_up=False)
        _log.warning(
            "step failed",
            run_id=self.run_id,
            step_path=step_path,
            attempt=attempt,
            error=error.message,
            will_retry=will_retry,
        )
        delay = step.retry.backoff_for(attempt) if will_retry else 0.0
        return Retry(error, will_retry, delay, cause)

    # ------------------------------------------------------------ parallel groups

    async def branch_set(
        self, fold: RunFold, group: ParallelStep, group_path: str
    ) -> dict[str, Any]:
        """The group's branch set, computed by its ``branches(ctx)`` from the run's data."""
        ctx = self.context(fold, group_path, 1)
        # User code: what the previous step held back is committed before it runs.
        self.writer.flush()
        check_leases()
        return group.branch_set(await call_maybe_async(group.branches, ctx))

    async def schedule_group(
        self, group: ParallelStep, step_path: str, visit: int, fold: RunFold | None = None
    ) -> Committed | GroupScheduled | Retry:
        """Start a parallel group: ``StepStarted``, its branch set, ``ParallelBranchScheduled``.

        The branch set is computed from the run's data (``fold``: the state
        just read, if the caller has it) and compared with the recorded one,
        for a completed group too (raising
        :class:`~little_es.errors.ParallelReplayMismatchError`). A completed
        group gives its committed result; a failing ``branches`` function is
        the failure of the group's attempt, retried by the group's own ``retry``
        policy as a step's code is (the :class:`Retry` says when).
        """
        if fold is None:
            fold = self.writer.read()
        kept = _kept_by_fork(fold, step_path)
        if kept is not None:
            return Committed(kept, executed=False)
        recorded = fold.steps.get(step_path)
        attempt, in_flight, limit = next_attempt(recorded, group.ir.retry.max_attempts)
        if recorded is not None and completed_step(fold, step_path) is None:
            # Started before (a resume): no StepStarted append to lose to a cancel.
            self.check_stopped()
        if not in_flight and completed_step(fold, step_path) is None:
            # A group's attempt is its branches(ctx): after a failure of it, the next
            # attempt is started as a step's is (and the run is running again, so a
            # failure now is recorded as the run's, not the one before).

            def start(rec: RunRecorder) -> None:
                if rec.fold.status == "cancelled":
                    raise RunCancelledError(self.run_id, rec.fold.stop_reason)
                self.check_parents_stopped()
                now = rec.fold.steps.get(step_path)
                if now is None or (now.status in ("failed", "pending") and now.attempts < attempt):
                    rec.step_started(
                        step_path, step_id=group.id, kind="parallel", visit=visit, attempt=attempt
                    )

            await self.writer.write(start, catch_up=False)
        try:
            # The group's own StepStarted changes nothing its branches(ctx) can see.
            branch_set = await self.branch_set(fold, group, step_path)
        except Exception as exc:
            error = ErrorInfo.from_exception(exc)
            return await self._attempt_failed(
                group.ir, step_path, visit, attempt, limit, error, exc
            )
        keys = tuple(branch_set)

        def schedule(rec: RunRecorder) -> Committed | None:
            scheduled = rec.fold.parallel_groups.get(step_path)
            if scheduled is not None:
                # The seed checks completed groups too: if the branch set the run's
                # data gives now differs, replay cannot stand in for the original run.
                assert_completed_parallel_replay_matches_input(
                    self.run_id, step_path, scheduled, keys
                )
            done = completed_step(rec.fold, step_path)
            if done is not None:
                return Committed(done, executed=False)
            if scheduled is None:
                rec.branches_scheduled(step_path, step_id=group.id, branch_keys=keys)
            return None

        done = await self.writer.write(schedule)
        return done if done is not None else GroupScheduled(keys, branch_set)

    async def branch_value(self, fold: RunFold, parts: StepPathParts) -> Any:
        """The value of the branch ``parts`` names, its group's branch set recomputed and checked.

        For an engine that does not carry branch values from the group to its
        branches (they may be large): the branch set is a function of the
        run's data, so each branch computes it again.
        """
        group = self.workflow.step(parts.group_id or "")
        if not isinstance(group, ParallelStep):
            raise RunStateError(f"step {parts.group_id!r} is not a parallel group")
        group_path = make_step_path(group.id, visit=parts.group_visit)
        recorded_keys = fold.parallel_groups.get(group_path)
        if recorded_keys is None:
            raise RunStateError(
                f"run {self.run_id!r}: branch {parts.path!r} runs before its group"
                f" {group_path!r} recorded ParallelBranchScheduled"
            )
        branch_set = await self.branch_set(fold, group, group_path)
        assert_completed_parallel_replay_matches_input(
            self.run_id, group_path, recorded_keys, tuple(branch_set)
        )
        return branch_set[parts.branch_key or ""]

    async def complete_group(
        self,
        group: ParallelStep,
        step_path: str,
        visit: int,
        branch_outputs: Sequence[Any] | None = None,
        *,
        hold: bool = False,
    ) -> Committed:
        """Commit a parallel group's ``StepCompleted``: its branches' outputs by branch key.

        ``branch_outputs`` are the outputs in branch key order, when the caller
        has them; else they are read from the run's log. ``hold`` as for :meth:`settle`.
        """

        def complete(rec: RunRecorder) -> Committed:
            done = completed_step(rec.fold, step_path)
            if done is not None:
                return Committed(done, executed=False)
            keys = rec.fold.parallel_groups.get(step_path)
            if keys is None:
                raise RunStateError(f"group {step_path!r} completes before it was scheduled")
            if branch_outputs is not None:
                output = dict(zip(keys, branch_outputs, strict=True))
            else:
                output = {key: self._branch_output(rec.fold, group, visit, key) for key in keys}
            started = rec.fold.steps.get(step_path)
            value = rec.step_completed(
                step_path,
                step_id=group.id,
                visit=visit,
                attempt=started.attempts if started is not None and started.attempts else 1,
                output=output,
                hold=hold,
            )
            return Committed(rec.fold.steps[step_path], executed=True, value=value)

        return await self.writer.write(complete)

    def _branch_output(self, fold: RunFold, group: ParallelStep, visit: int, key: str) -> Any:
        path = branch_path(group.ir, key, visit)
        branch = completed_step(fold, path)
        if branch is None:
            raise RunStateError(f"group {group.id!r} completes before its branch {path!r}")
        return read_output(self.world, branch.output, branch.output_ref)

    # ------------------------------------------------------------ sub-runs

    async def sub_run(self, begun: Begun) -> tuple[str, dict[str, Any]]:
        """Reserve the sub-run of a subworkflow step (``SubRunReserved``, once): its id, input."""
        step = begun.step
        if not isinstance(step, SubworkflowStep) or begun.ctx is None:
            raise RunStateError(f"step {begun.step_path!r} is not a started subworkflow step")
        sub_run_id = sub_run_id_for(self.run_id, begun.step_path)
        workflow_id = step.workflow.id

        await self.reserve_sub_run(begun.step_path, sub_run_id=sub_run_id, workflow_id=workflow_id)
        ctx = begun.ctx
        child_input = ctx.input if step.input is None else await call_maybe_async(step.input, ctx)
        return sub_run_id, dict(child_input)

    async def execute(self, begun: Begun) -> Any:
        """The work of one attempt: the step's code, or a subworkflow step's sub-run."""
        step, ctx = begun.step, begun.ctx
        if ctx is None:
            raise RunStateError(f"step {begun.step_path!r} was looked up, not started")
        if isinstance(step, SubworkflowStep):
            sub_run_id, child_input = await self.sub_run(begun)
            return await self.host_run(
                HostedRun(sub_run_id, step.workflow, child_input, self.run_id, begun.step_path)
            )
        if isinstance(step, WaitStep):
            return await self.await_signal(
                WaitRequest(
                    wait_id=begun.step_path,
                    step_path=begun.step_path,
                    kind="step",
                    signal=step.signal,
                    model=step.model,
                    timeout_s=step.timeout_s,
                )
            )
        return await execute_step(self.world, step, ctx)

    async def await_signal(self, request: WaitRequest) -> Any:
        """The data of the signal ``request`` waits for, once it came (a ``SignalReceived``
        in the log): the waiting step's output, or the waiting tool call's answer.

        Before it came: ``RunWaiting`` is committed (once: a resume that finds it appends
        nothing) and :class:`~little_es.errors.RunWaitingError` propagates, the step or
        call left in flight, so the process can exit. Past the wait's deadline,
        ``WaitTimedOut`` is committed and :class:`~little_es.errors.WaitTimedOutError`
        propagates: the run's own outcome, not a failure of the step.
        """
        # A signal sent since this driver read the log: one indexed query otherwise.
        self.writer.refresh()

        def decide(rec: RunRecorder) -> Any:
            wait = rec.fold.waits.get(request.wait_id)
            if wait is None:
                deadline = (
                    None
                    if request.timeout_s is None
                    else utc_now() + timedelta(seconds=request.timeout_s)
                )
                wait = rec.run_waiting(request, deadline)
            if wait.status == "signalled":
                return wait.data
            if (
                wait.status == "waiting"
                and wait.deadline is not None
                and utc_now() >= wait.deadline
            ):
                rec.wait_timed_out(wait)
                wait = rec.fold.waits[request.wait_id]
            if wait.status == "timed_out":
                raise timed_out_error(self.run_id, rec.fold)
            raise RunWaitingError(self.run_id, ((wait.signal, wait.step_path, wait.wait_id),))

        return await self.writer.write(decide)

    async def reserve_sub_run(
        self, step_path: str, *, sub_run_id: str, workflow_id: str, call_id: str | None = None
    ) -> None:
        """Commit ``SubRunReserved`` for ``sub_run_id`` unless it is reserved already (a call
        re-dispatched after a crash finds its reservation committed)."""

        def reserve(rec: RunRecorder) -> None:
            if sub_run_id not in rec.fold.sub_run_ids:
                rec.sub_run_reserved(
                    step_path, sub_run_id=sub_run_id, workflow_id=workflow_id, call_id=call_id
                )

        await self.writer.write(reserve)

    async def host_run(self, request: HostedRun) -> Any:
        """Run a reserved sub-run through the engine's :class:`SubRunHost`; its output."""
        if self.host is None:
            raise RunStateError(
                f"run {self.run_id!r}: the engine set no SubRunHost, so step"
                f" {request.parent_step_path!r} cannot run sub-run {request.run_id!r}"
            )
        return await self.host.run(request)

    # ------------------------------------------------------------ the run's end

    async def complete_run(self, output_step_path: str | None) -> RunFold:
        """Commit ``RunCompleted`` (once) with the output of ``output_step_path`` (None: none)."""

        def complete(rec: RunRecorder) -> RunFold:
            if rec.fold.status == "cancelled":
                raise RunCancelledError(self.run_id, rec.fold.stop_reason)
            if rec.fold.status != "completed":
                output: Any = None
                if output_step_path is not None:
                    step = completed_step(rec.fold, output_step_path)
                    if step is None:
                        raise RunStateError(
                            f"run {self.run_id!r} completes before step {output_step_path!r}"
                        )
                    output = read_output(self.world, step.output, step.output_ref)
                rec.run_completed(output)
            return rec.fold

        return await self.writer.write(complete)

    async def fail_run(self, *, step_path: str | None, error: ErrorInfo | None = None) -> None:
        """Commit ``RunFailed`` (unless the run failed so already): at ``step_path``, whose
        recorded error is the run's unless ``error`` is given, or with ``error`` alone."""

        def fail(rec: RunRecorder) -> None:
            fold = rec.fold
            found = error
            if found is None and step_path is not None:
                step = rec.fold.steps.get(step_path)
                found = step.error if step is not None else None
            if found is None:
                raise RunStateError(
                    f"run {self.run_id!r}: failing it needs an error or a failed step path"
                )
            if fold.status == "failed" and (fold.failed_step_path, fold.error) == (
                step_path,
                found,
            ):
                return
            # A failed run resumed that failed again before any step started (a group's
            # branches(ctx) whose group was in flight): its failure is the new one.
            rec.run_failed(found, step_path=step_path)

        await self.writer.write(fail)

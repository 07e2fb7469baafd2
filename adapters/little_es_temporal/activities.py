"""The activity side of the Temporal adapter: the data that crosses Temporal, and the activities.

Everything here runs in a worker process with a :class:`~little_es.world.World`,
outside the workflow sandbox. The generic workflow
(:mod:`little_es_temporal.workflow`) only ever sees the small models defined
here: ids, step paths, a decision's target, a parallel group's branch keys and a
"done" marker per step. Step outputs stay in the run's log (large ones as
artifacts); a :class:`StepDone` carries an output inline only when it is small,
so Temporal's history does not grow with the length of an agent's conversation.

Every ``Run`` event is written through :class:`~little_es.durability.RunRecorder`,
exactly as the local scheduler writes it, so ``replay_run``, ``little report``
and a local resume read a Temporal-executed run like any other. Parallel
branches may run on several workers at once and all append to the run's
stream: each write reloads the run, re-checks what it is about to record and
commits, and on a lost optimistic-concurrency race does it again
(:func:`write_run`).

The step activity itself (``little_es.run_step``) only runs the step's code;
the :class:`~little_es_temporal.interceptor.LittleInterceptor` around it writes
``StepStarted``/``StepCompleted``/``StepFailed`` and skips committed steps.
"""

from __future__ import annotations

import asyncio
import inspect
import random
from collections import OrderedDict
from collections.abc import Callable, Iterable
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import orjson
from pydantic import BaseModel, ConfigDict, Field
from temporalio import activity
from temporalio.exceptions import ApplicationError

from little_es.domain import Run
from little_es.durability import RunRecorder, encode_output, normalize_output, read_output
from little_es.errors import (
    ConcurrencyConflictError,
    LittleEsError,
    RuntimeIntegrityError,
    WorkflowDefinitionError,
)
from little_es.events import StepFailed
from little_es.ids import run_stream_id, session_stream_id, validate_run_id
from little_es.integrity import (
    assert_completed_parallel_replay_matches_input,
    run_restart_checks,
)
from little_es.logging import get_logger
from little_es.materialize import RunFold, StepFold
from little_es.values import ArtifactRef, ErrorInfo, JSONValue
from little_es.workflow.authoring import (
    AgentStep,
    DecisionStep,
    ParallelStep,
    SubworkflowStep,
    TaskStep,
    Workflow,
)
from little_es.workflow.context import StepContext
from little_es.workflow.ir import WorkflowIR
from little_es.workflow.paths import parse_step_path
from little_es.workflow.paths import step_path as make_step_path
from little_es.workflow.runtime import (
    RunFailedError,
    execute_step,
    next_attempt,
    outputs_from_fold,
    sub_run_id_for,
)
from little_es.world import World

__all__ = [
    "BEGIN_SUBWORKFLOW",
    "COMPLETE_GROUP",
    "COMPLETE_RUN",
    "CURRENT_STEP",
    "FAIL_RUN",
    "FAIL_SUBWORKFLOW",
    "FINISH_SUBWORKFLOW",
    "GAVE_UP_MARKER",
    "RUN_STEP",
    "SCHEDULE_BRANCHES",
    "START_RUN",
    "TEMPORAL_INLINE_LIMIT",
    "BegunStep",
    "GroupPlan",
    "LittleActivities",
    "RunCache",
    "RunDone",
    "RunEnd",
    "RunFailure",
    "RunInput",
    "RunPlan",
    "StepCall",
    "StepDone",
    "StepInput",
    "StepRetry",
    "StepTimeouts",
    "SubRunFailure",
    "SubRunPlan",
    "TemporalAdapterError",
    "UnregisteredWorkflowError",
    "WorkflowRegistry",
    "attempt_limit",
    "done_from_fold",
    "non_retryable",
    "to_application_error",
    "write_run",
]

_log = get_logger()

T = TypeVar("T")

START_RUN = "little_es.start_run"
RUN_STEP = "little_es.run_step"
SCHEDULE_BRANCHES = "little_es.schedule_branches"
COMPLETE_GROUP = "little_es.complete_group"
BEGIN_SUBWORKFLOW = "little_es.begin_subworkflow"
FINISH_SUBWORKFLOW = "little_es.finish_subworkflow"
FAIL_SUBWORKFLOW = "little_es.fail_subworkflow"
COMPLETE_RUN = "little_es.complete_run"
FAIL_RUN = "little_es.fail_run"

TEMPORAL_INLINE_LIMIT = 4 * 1024
"""Outputs and inputs up to this many JSON bytes travel through Temporal inline;
larger ones travel as an :class:`~little_es.artifacts.ArtifactRef` or stay in the log."""

GAVE_UP_MARKER = "little_es.step_gave_up"
"""First detail of the ApplicationError a step activity raises when its attempts ran out."""

# Lost races resolve (each round one writer wins); a step's result must not be
# lost to them, so give up only after many.
_CONFLICT_RETRIES = 100


class TemporalAdapterError(LittleEsError):
    """The Temporal adapter was set up or called in a way it cannot work with."""


class UnregisteredWorkflowError(TemporalAdapterError, LookupError):
    """A run names a workflow (id and IR hash) that this worker was not given."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class StepTimeouts(_Frozen):
    """Timeouts of the activities a run schedules; set them once in :func:`start_run`.

    ``heartbeat``: step activities heartbeat every third of it in the
    background; a worker that dies (SIGKILL, OOM, lost host) is noticed after
    this long and the step is retried on another worker, where an agent step
    fast-forwards its committed model and tool calls. Keep it short enough that
    a crash is noticed quickly, long enough to ride out a busy event loop.
    ``step_start_to_close`` / ``agent_start_to_close`` bound one attempt of a
    task or decision step / an agent step (generous: a stuck step is caught by
    the heartbeat, not by these). ``bookkeeping_start_to_close`` bounds the
    short activities that only read and write the log.
    """

    heartbeat: timedelta = Field(default=timedelta(seconds=30), gt=timedelta(0))
    step_start_to_close: timedelta = Field(default=timedelta(hours=1), gt=timedelta(0))
    agent_start_to_close: timedelta = Field(default=timedelta(hours=4), gt=timedelta(0))
    bookkeeping_start_to_close: timedelta = Field(default=timedelta(minutes=1), gt=timedelta(0))


class RunInput(_Frozen):
    """The Temporal workflow's input: which run of which workflow, and its input.

    ``input`` is inline when small; a large one is stored as an artifact first
    and ``input_ref`` names it. Both None: resume an existing run (or start
    one with ``{}``).
    """

    run_id: str
    workflow_id: str
    workflow_version: str
    ir_hash: str
    input: JSONValue = None
    input_ref: ArtifactRef | None = None
    parent_run_id: str | None = None
    parent_step_path: str | None = None
    timeouts: StepTimeouts = StepTimeouts()


class RunDone(_Frozen):
    """What the Temporal workflow returns: the run's output, inline when small.

    ``output_inline`` False means the output was too large for Temporal: read
    it from the log (``replay_run(world, run_id).state.output``, or
    ``output_ref`` when the log stores it as an artifact).
    """

    run_id: str
    output: JSONValue = None
    output_ref: ArtifactRef | None = None
    output_inline: bool = True


class RunPlan(_Frozen):
    """``start_run``'s answer: the IR to walk, or the result of a run already completed."""

    ir: WorkflowIR
    done: RunDone | None = None


class StepInput(_Frozen):
    """Names one step execution of a run (the workflow and the step follow from the log)."""

    run_id: str
    step_path: str


class StepDone(_Frozen):
    """A step's committed result, as small as Temporal needs it.

    ``next_step`` is a decision's target (a step id or END). ``executed`` is
    False when the result was read from the log instead of running the step.
    """

    step_path: str
    attempt: int = 1
    next_step: str | None = None
    output: JSONValue = None
    output_ref: ArtifactRef | None = None
    output_inline: bool = True
    executed: bool = False


class GroupPlan(_Frozen):
    """``schedule_branches``' answer: the group's branch keys, or its committed result."""

    branch_keys: tuple[str, ...] = ()
    done: StepDone | None = None


class SubRunPlan(_Frozen):
    """``begin_subworkflow``'s answer: the child run to start, or the step's committed result."""

    done: StepDone | None = None
    sub_run_id: str | None = None
    workflow_id: str | None = None
    workflow_version: str | None = None
    ir_hash: str | None = None
    input: JSONValue = None
    input_ref: ArtifactRef | None = None


class SubRunFailure(_Frozen):
    """A subworkflow step's child run failed; ``error`` is what Temporal reported."""

    run_id: str
    step_path: str
    error: ErrorInfo


class StepRetry(_Frozen):
    """Whether a failed step is attempted again, and after how many seconds."""

    will_retry: bool
    delay_s: float = 0.0


class RunEnd(_Frozen):
    """Complete a run; its output is the output of ``output_step_path`` (None: no output)."""

    run_id: str
    output_step_path: str | None = None


class RunFailure(_Frozen):
    """Fail a run: at ``step_path`` (its recorded error) or with ``error`` (visit limit)."""

    run_id: str
    step_path: str | None = None
    error: ErrorInfo | None = None


# ---------------------------------------------------------------------- registry


class WorkflowRegistry:
    """The workflow definitions a worker can run, by workflow id and IR hash.

    Sub-workflows of registered workflows are registered too. Two definitions
    may share an id (different versions), never an id and an IR hash.
    """

    def __init__(self, workflows: Iterable[Workflow]) -> None:
        self._by_key: dict[tuple[str, str], Workflow] = {}
        items = list(workflows) if not isinstance(workflows, Workflow) else [workflows]
        if not items:
            raise TemporalAdapterError(
                "a worker needs at least one workflow: pass workflows=[my_workflow, ...]"
            )
        for workflow in items:
            self._add(workflow)

    def _add(self, workflow: object) -> None:
        if not isinstance(workflow, Workflow):
            raise TemporalAdapterError(
                f"workflows must be little_es Workflow objects, got {type(workflow).__name__}:"
                " build them with Workflow(id, steps=[...])"
            )
        key = (workflow.id, workflow.ir_hash)
        if key in self._by_key:
            return
        self._by_key[key] = workflow
        for step in workflow.steps:
            inner = step.step if isinstance(step, ParallelStep) else step
            if isinstance(inner, SubworkflowStep):
                self._add(inner.workflow)

    @property
    def workflows(self) -> tuple[Workflow, ...]:
        """Every registered definition, sub-workflows included."""
        return tuple(self._by_key.values())

    def get(self, workflow_id: str, ir_hash: str) -> Workflow:
        """The definition with this id and IR hash; raises :class:`UnregisteredWorkflowError`."""
        found = self._by_key.get((workflow_id, ir_hash))
        if found is not None:
            return found
        known = sorted(
            f"{w.id} (version {w.version}, IR {w.ir_hash[:12]})" for w in self._by_key.values()
        )
        raise UnregisteredWorkflowError(
            f"this worker has no workflow {workflow_id!r} with IR hash {ir_hash[:12]}...; it has"
            f" {', '.join(known)}: start the worker with the definition the run was started"
            " with (create_worker(..., workflows=[...]) or `little worker module:attr`)"
        )


# ---------------------------------------------------------------------- helpers


def non_retryable(exc: BaseException) -> bool:
    """Whether an error raised by the adapter itself (not by a step) must stop the run.

    Integrity and definition errors cannot heal by retrying; a lost race, a
    busy lease or a database hiccup can.
    """
    if isinstance(exc, ConcurrencyConflictError):
        return False
    if isinstance(exc, RuntimeIntegrityError | WorkflowDefinitionError | TemporalAdapterError):
        return True
    return not ErrorInfo.from_exception(exc).retryable


def to_application_error(exc: BaseException) -> ApplicationError:
    """The Temporal error for an adapter-side failure (retryable unless :func:`non_retryable`)."""
    return ApplicationError(
        str(exc) or type(exc).__qualname__,
        type=type(exc).__qualname__,
        non_retryable=non_retryable(exc),
    )


class RunCache:
    """The ``Run`` aggregates a worker has loaded, brought up to date by reading only new events.

    Loading a run folds its stream from the latest snapshot (up to
    ``RUN_SNAPSHOT_INTERVAL`` events); a step activity needs the run's state
    two or three times. Instead, each use reads the events appended since the
    cached version (usually none: one indexed query) and folds just those, so
    the state is always the stored one, whoever wrote it. An aggregate whose
    save failed is dropped: its state may hold the event that was not saved.
    """

    def __init__(self, world: World, capacity: int = 256) -> None:
        self._world = world
        self._capacity = capacity
        self._runs: OrderedDict[str, Run] = OrderedDict()

    def recorder(self, run_id: str) -> RunRecorder | None:
        """A recorder over the current state of ``run_id``, or None when it has no log."""
        run = self._runs.get(run_id)
        if run is None:
            loaded = RunRecorder.load(self._world, run_id)
            if loaded is None:
                return None
            run = loaded.run
        else:
            for event in self._world.read_stream(run_stream_id(run_id), after=run.version):
                run.mutate(event)
        self._keep(run_id, run)
        return RunRecorder(self._world, run)

    def cached(self, run_id: str) -> RunRecorder | None:
        """A recorder over the cached state of ``run_id`` as it is (None when not cached)."""
        run = self._runs.get(run_id)
        return None if run is None else RunRecorder(self._world, run)

    def keep(self, recorder: RunRecorder) -> None:
        """Cache the aggregate of a recorder that just committed (a run just started)."""
        self._keep(recorder.run_id, recorder.run)

    def _keep(self, run_id: str, run: Run) -> None:
        self._runs[run_id] = run
        self._runs.move_to_end(run_id)
        while len(self._runs) > self._capacity:
            self._runs.popitem(last=False)

    def forget(self, run_id: str) -> None:
        """Drop ``run_id``: the next use loads it afresh."""
        self._runs.pop(run_id, None)


async def write_run(
    cache: RunCache,
    run_id: str,
    action: Callable[[RunRecorder], T],
    *,
    current: RunRecorder | None = None,
    catch_up: bool = True,
) -> T:
    """Run ``action`` on the state of ``run_id``; redo it on the caught-up state after a lost race.

    ``action`` reads the fold, decides and commits through the recorder. When
    another writer (a parallel branch on another worker, another process)
    appended first, nothing was written: catch up, decide again, commit again.
    ``current`` is a recorder the caller has just caught up (used for the first
    try). ``catch_up=False`` tries on the cached state first; that is safe only
    for an action that either commits (the commit checks the version) or
    returns early on a fact that never goes stale (a committed
    ``StepCompleted``).
    """
    for attempt in range(_CONFLICT_RETRIES):
        recorder = current if attempt == 0 else None
        if recorder is None and attempt == 0 and not catch_up:
            recorder = cache.cached(run_id)
        if recorder is None:
            recorder = cache.recorder(run_id)
        if recorder is None:
            raise TemporalAdapterError(
                f"run {run_id!r} has no log in this world: the worker's world must be the one"
                " the run was started in (--world / LITTLE_ES_WORLD)"
            )
        try:
            return action(recorder)
        except ConcurrencyConflictError:
            cache.forget(run_id)
            if attempt + 1 == _CONFLICT_RETRIES:
                raise
            await asyncio.sleep(random.uniform(0, 0.005 * 2 ** min(attempt, 6)))
        except BaseException:
            cache.forget(run_id)
            raise
    raise AssertionError("unreachable")


def _inline(value: JSONValue) -> tuple[JSONValue, bool]:
    data = orjson.dumps(value)
    if len(data) <= TEMPORAL_INLINE_LIMIT:
        return value, True
    return None, False


def done_from_fold(step: StepFold, *, executed: bool) -> StepDone:
    """The :class:`StepDone` of a committed step, its output inline only when small."""
    output, inline = (None, False) if step.output_ref is not None else _inline(step.output)
    return StepDone(
        step_path=step.step_path,
        attempt=max(step.attempts, 1),
        next_step=step.next_step,
        output=output,
        output_ref=step.output_ref,
        output_inline=inline,
        executed=executed,
    )


def _completed(fold: RunFold, step_path: str) -> StepFold | None:
    found = fold.steps.get(step_path)
    return found if found is not None and found.status == "completed" else None


def attempt_limit(
    world: World, run_id: str, step_path: str, recorded: StepFold | None, max_attempts: int
) -> int:
    """The last attempt the current retry budget of ``step_path`` allows.

    The budget is ``max_attempts`` attempts, counted from the start, or from the
    attempt after the last one that gave up (a failed run resumed gets a fresh
    budget). The local scheduler keeps the start in memory while it retries;
    here each Temporal attempt is a new activity, so it is read back from the
    log, and only when an earlier attempt exists.
    """
    if recorded is None or recorded.attempts == 0:
        return max_attempts
    if recorded.status == "failed":
        return recorded.attempts + max_attempts
    base = 0
    for event in world.read_stream(run_stream_id(run_id)):
        if isinstance(event, StepFailed) and event.step_path == step_path and not event.will_retry:
            base = event.attempt
    return base + max_attempts


async def _call(fn: Callable[..., Any], *args: Any) -> Any:
    if inspect.iscoroutinefunction(fn):
        return await fn(*args)
    result = await asyncio.to_thread(fn, *args)
    if inspect.isawaitable(result):
        return await result
    return result


# ------------------------------------------------------------------ step protocol


@dataclass(frozen=True)
class BegunStep:
    """A step attempt whose ``StepStarted`` is committed (or that was in flight)."""

    run_id: str
    workflow: Workflow
    step: TaskStep | AgentStep | DecisionStep | SubworkflowStep
    step_path: str
    visit: int
    attempt: int
    limit: int
    in_flight: bool
    ctx: StepContext | None
    """The step's context (None when the attempt was only looked up, not started)."""


@dataclass(frozen=True)
class StepCall:
    """What the interceptor hands the ``run_step`` activity body: the step and its context."""

    world: World
    step: TaskStep | AgentStep | DecisionStep
    ctx: StepContext


CURRENT_STEP: ContextVar[StepCall | None] = ContextVar("little_es_temporal_step", default=None)
"""Set by the interceptor around the ``run_step`` activity body."""


class LittleActivities:
    """The activities of the generic workflow, bound to a world and the registered workflows.

    Register them all with :meth:`all` (``create_worker`` does it, together
    with the :class:`~little_es_temporal.interceptor.LittleInterceptor`, which
    the ``run_step`` activity needs).
    """

    def __init__(self, world: World, workflows: WorkflowRegistry | Iterable[Workflow]) -> None:
        if not isinstance(world, World):
            raise TemporalAdapterError(
                f"world must be a little_es World (from open_world()), got {type(world).__name__}"
            )
        self.world = world
        self.runs = RunCache(world)
        self.registry = (
            workflows if isinstance(workflows, WorkflowRegistry) else (WorkflowRegistry(workflows))
        )

    def all(self) -> list[Callable[..., Any]]:
        """Every activity, for ``Worker(activities=...)``."""
        return [
            self.start_run,
            self.run_step,
            self.schedule_branches,
            self.complete_group,
            self.begin_subworkflow,
            self.finish_subworkflow,
            self.fail_subworkflow,
            self.complete_run,
            self.fail_run,
        ]

    # ------------------------------------------------------------ shared pieces

    def _recorder(self, run_id: str) -> RunRecorder:
        recorder = self.runs.recorder(validate_run_id(run_id))
        if recorder is None:
            raise TemporalAdapterError(
                f"run {run_id!r} has no log in world {self.world.name}: the worker's world must"
                " be the one the run was started in (--world / LITTLE_ES_WORLD)"
            )
        return recorder

    def workflow_of(self, fold: RunFold) -> Workflow:
        """The registered definition that started the run ``fold`` describes."""
        if fold.workflow_id is None or fold.ir_hash is None:
            raise TemporalAdapterError(f"run {fold.run_id!r} has no RunStarted in its log")
        return self.registry.get(fold.workflow_id, fold.ir_hash)

    def _context(
        self, fold: RunFold, step_path: str, attempt: int, branch_value: Any = None
    ) -> StepContext:
        assert fold.run_id is not None
        return StepContext(
            run_id=fold.run_id,
            input=fold.input or {},
            outputs=outputs_from_fold(self.world, fold),
            step_path=step_path,
            attempt=attempt,
            branch_value=branch_value,
        )

    async def _branch_set(
        self, fold: RunFold, group: ParallelStep, group_path: str
    ) -> dict[str, Any]:
        ctx = self._context(fold, group_path, 1)
        return group.branch_set(await _call(group.branches, ctx))

    async def begin_step(
        self, input: StepInput, *, kinds: tuple[str, ...], start: bool = True
    ) -> BegunStep | StepDone:
        """Commit ``StepStarted`` for the next attempt of a step, unless it is done or in flight.

        Returns the committed result when the step already has a
        ``StepCompleted`` (nothing runs), else the attempt to run: the same
        attempt when it was in flight (a crash is not a failure; an agent's
        session fast-forwards), the next one after a recorded failure. With
        ``start=False`` nothing is written: the step must be in flight, and
        its attempt is returned without a context.
        """
        validate_run_id(input.run_id)
        parts = parse_step_path(input.step_path)
        recorder = self._recorder(input.run_id)
        workflow = self.workflow_of(recorder.fold)
        step = workflow.step(parts.step_id)
        if step.ir.kind not in kinds or isinstance(step, ParallelStep):
            raise TemporalAdapterError(
                f"step {input.step_path!r} of workflow {workflow.id!r} is a {step.ir.kind} step;"
                f" this activity runs {', '.join(kinds)} steps"
            )
        branch_value: Any = None
        current: RunRecorder | None = recorder
        if (
            start
            and parts.group_id is not None
            and _completed(recorder.fold, input.step_path) is None
        ):
            # branches(ctx) may take a while: decide on state caught up after it.
            current = None
            branch_value = await self._branch_value(
                recorder.fold,
                workflow,
                input,
                parts.group_id,
                parts.group_visit,
                parts.branch_key or "",
            )
        max_attempts = step.ir.retry.max_attempts

        def begin(rec: RunRecorder) -> BegunStep | StepDone:
            done = _completed(rec.fold, input.step_path)
            if done is not None:
                return done_from_fold(done, executed=False)
            recorded = rec.fold.steps.get(input.step_path)
            attempt, in_flight, _ = next_attempt(recorded, max_attempts)
            if not start and not in_flight:
                raise TemporalAdapterError(
                    f"run {input.run_id!r}: step {input.step_path!r} is not in flight"
                )
            limit = attempt_limit(self.world, input.run_id, input.step_path, recorded, max_attempts)
            if not in_flight:
                rec.step_started(
                    input.step_path,
                    step_id=step.id,
                    kind=step.ir.kind,
                    visit=parts.visit,
                    attempt=attempt,
                    session_id=(
                        session_stream_id(input.run_id, input.step_path, attempt)
                        if isinstance(step, AgentStep)
                        else None
                    ),
                )
            return BegunStep(
                run_id=input.run_id,
                workflow=workflow,
                step=step,
                step_path=input.step_path,
                visit=parts.visit,
                attempt=attempt,
                limit=limit,
                in_flight=in_flight,
                ctx=(
                    self._context(rec.fold, input.step_path, attempt, branch_value)
                    if start
                    else None
                ),
            )

        return await write_run(self.runs, input.run_id, begin, current=current)

    async def _branch_value(
        self,
        fold: RunFold,
        workflow: Workflow,
        input: StepInput,
        group_id: str,
        group_visit: int,
        branch_key: str,
    ) -> Any:
        # The branch set is a function of the run's data (the integrity check
        # relies on that), so each branch recomputes it rather than passing
        # branch values, which may be large, through Temporal.
        group = workflow.step(group_id)
        assert isinstance(group, ParallelStep)
        group_path = make_step_path(group.id, visit=group_visit)
        recorded_keys = fold.parallel_groups.get(group_path)
        if recorded_keys is None:
            raise TemporalAdapterError(
                f"run {input.run_id!r}: branch {input.step_path!r} runs before its group"
                f" {group_path!r} recorded ParallelBranchScheduled"
            )
        branch_set = await self._branch_set(fold, group, group_path)
        assert_completed_parallel_replay_matches_input(
            input.run_id, group_path, recorded_keys, tuple(branch_set)
        )
        return branch_set[branch_key]

    async def complete_step(self, begun: BegunStep, output: Any) -> StepDone:
        """Commit ``StepCompleted`` for ``begun`` (a decision's target checked first)."""
        next_step = None
        if isinstance(begun.step, DecisionStep):
            next_step = begun.workflow.check_decision_target(begun.step.id, output)
        run_id = begun.run_id

        def complete(rec: RunRecorder) -> StepDone:
            done = _completed(rec.fold, begun.step_path)
            if done is None:
                rec.step_completed(
                    begun.step_path,
                    step_id=begun.step.id,
                    visit=begun.visit,
                    attempt=begun.attempt,
                    output=output,
                    next_step=next_step,
                )
                return done_from_fold(rec.fold.steps[begun.step_path], executed=True)
            # Another attempt (a zombie after a heartbeat timeout) committed first;
            # its result is the step's result.
            return done_from_fold(done, executed=True)

        return await write_run(self.runs, run_id, complete, catch_up=False)

    async def fail_step(self, begun: BegunStep, error: ErrorInfo) -> StepRetry:
        """Commit ``StepFailed`` for ``begun``; say whether (and when) the next attempt follows."""
        will_retry = error.retryable and begun.attempt < begun.limit

        def fail(rec: RunRecorder) -> None:
            rec.step_failed(
                begun.step_path,
                step_id=begun.step.id,
                visit=begun.visit,
                attempt=begun.attempt,
                error=error,
                will_retry=will_retry,
            )

        await write_run(self.runs, begun.run_id, fail, catch_up=False)
        _log.warning(
            "step failed",
            run_id=begun.run_id,
            step_path=begun.step_path,
            attempt=begun.attempt,
            error=error.message,
            will_retry=will_retry,
        )
        delay = begun.step.ir.retry.backoff_for(begun.attempt) if will_retry else 0.0
        return StepRetry(will_retry=will_retry, delay_s=delay)

    # ------------------------------------------------------------ the activities

    @activity.defn(name=START_RUN)
    async def start_run(self, input: RunInput) -> RunPlan:
        """Start the run (``RunStarted``) or load it and run the restart checks.

        Holds the run's lease while it does, so a run that a local process is
        still driving is refused (retried later) instead of driven twice.
        """
        try:
            return await self._start_run(input)
        except ApplicationError:
            raise
        except Exception as exc:
            raise to_application_error(exc) from exc

    async def _start_run(self, input: RunInput) -> RunPlan:
        run_id = validate_run_id(input.run_id)
        workflow = self.registry.get(input.workflow_id, input.ir_hash)
        given: Any = input.input
        if input.input_ref is not None:
            given = orjson.loads(self.world.artifacts.get(input.input_ref).payload)
        with self.world.run_lease(run_id):
            recorder = self.runs.recorder(run_id)
            if recorder is None:
                try:
                    started = RunRecorder.start(
                        self.world,
                        run_id=run_id,
                        workflow_id=workflow.id,
                        workflow_version=workflow.version,
                        ir_hash=workflow.ir_hash,
                        input=normalize_output("<input>", dict(given or {})),
                        parent_run_id=input.parent_run_id,
                        parent_step_path=input.parent_step_path,
                    )
                    self.runs.keep(started)
                except ConcurrencyConflictError:
                    # Another worker started it a moment ago: resume that one.
                    recorder = self.runs.recorder(run_id)
                    if recorder is None:
                        raise
                _log.info("run started", run_id=run_id, workflow_id=workflow.id, engine="temporal")
            if recorder is not None:
                fold = recorder.fold
                run_restart_checks(self.world, run_id, fold, workflow, given)
                if fold.status == "completed":
                    return RunPlan(ir=workflow.ir, done=self._run_done(fold))
                _log.info("run resumed", run_id=run_id, workflow_id=workflow.id, engine="temporal")
        return RunPlan(ir=workflow.ir)

    def _run_done(self, fold: RunFold) -> RunDone:
        assert fold.run_id is not None
        if fold.output_ref is not None:
            return RunDone(run_id=fold.run_id, output_ref=fold.output_ref, output_inline=False)
        output, inline = _inline(fold.output)
        return RunDone(run_id=fold.run_id, output=output, output_inline=inline)

    @activity.defn(name=RUN_STEP)
    async def run_step(self, input: StepInput) -> Any:
        """Run one attempt of a task, decision or agent step's code.

        The :class:`~little_es_temporal.interceptor.LittleInterceptor` writes
        the step's events around this and hands it the step and its context;
        without the interceptor the activity refuses to run.
        """
        call = CURRENT_STEP.get()
        if call is None or call.ctx.run_id != input.run_id or call.ctx.step_path != input.step_path:
            raise ApplicationError(
                f"{RUN_STEP} ran without the LittleInterceptor around it, so nothing would be"
                " recorded: build the worker with little_es_temporal.create_worker(...) (or add"
                " LittleInterceptor(activities) to Worker(interceptors=...))",
                type=TemporalAdapterError.__qualname__,
                non_retryable=True,
            )
        return await execute_step(call.world, call.step, call.ctx)

    @activity.defn(name=SCHEDULE_BRANCHES)
    async def schedule_branches(self, input: StepInput) -> GroupPlan:
        """Start a parallel group: resolve ``branches(ctx)`` and record it before any branch runs.

        A group already scheduled has its branch set recomputed and compared
        with the recorded one; a completed group returns its result.
        """
        try:
            return await self._schedule_branches(input)
        except ApplicationError:
            raise
        except Exception as exc:
            raise to_application_error(exc) from exc

    async def _schedule_branches(self, input: StepInput) -> GroupPlan:
        parts = parse_step_path(input.step_path)
        recorder = self._recorder(input.run_id)
        group = self.workflow_of(recorder.fold).step(parts.step_id)
        if not isinstance(group, ParallelStep):
            raise TemporalAdapterError(f"step {input.step_path!r} is not a parallel group")
        done = _completed(recorder.fold, input.step_path)
        if done is not None:
            return GroupPlan(done=done_from_fold(done, executed=False))

        def start(rec: RunRecorder) -> None:
            if input.step_path not in rec.fold.steps:
                rec.step_started(
                    input.step_path, step_id=group.id, kind="parallel", visit=parts.visit, attempt=1
                )

        await write_run(self.runs, input.run_id, start)
        # The group's own StepStarted changes nothing its branches(ctx) can see.
        keys = tuple(await self._branch_set(recorder.fold, group, input.step_path))

        def schedule(rec: RunRecorder) -> None:
            scheduled = rec.fold.parallel_groups.get(input.step_path)
            if scheduled is None:
                rec.branches_scheduled(input.step_path, step_id=group.id, branch_keys=keys)
            else:
                assert_completed_parallel_replay_matches_input(
                    input.run_id, input.step_path, scheduled, keys
                )

        await write_run(self.runs, input.run_id, schedule)
        return GroupPlan(branch_keys=keys)

    @activity.defn(name=COMPLETE_GROUP)
    async def complete_group(self, input: StepInput) -> StepDone:
        """Commit a parallel group's ``StepCompleted``: its branches' outputs by branch key."""
        try:
            return await self._complete_group(input)
        except ApplicationError:
            raise
        except Exception as exc:
            raise to_application_error(exc) from exc

    async def _complete_group(self, input: StepInput) -> StepDone:
        parts = parse_step_path(input.step_path)

        def complete(rec: RunRecorder) -> StepDone:
            done = _completed(rec.fold, input.step_path)
            if done is not None:
                return done_from_fold(done, executed=False)
            group = self.workflow_of(rec.fold).step(parts.step_id)
            assert isinstance(group, ParallelStep)
            keys = rec.fold.parallel_groups.get(input.step_path)
            if keys is None:
                raise TemporalAdapterError(
                    f"group {input.step_path!r} completes before it was scheduled"
                )
            output: dict[str, Any] = {}
            for key in keys:
                path = make_step_path(
                    group.step.id, group_id=group.id, branch_key=key, group_visit=parts.visit
                )
                branch = _completed(rec.fold, path)
                if branch is None:
                    raise TemporalAdapterError(
                        f"group {input.step_path!r} completes before its branch {path!r}"
                    )
                output[key] = read_output(self.world, branch.output, branch.output_ref)
            rec.step_completed(
                input.step_path, step_id=group.id, visit=parts.visit, attempt=1, output=output
            )
            return done_from_fold(rec.fold.steps[input.step_path], executed=True)

        return await write_run(self.runs, input.run_id, complete)

    @activity.defn(name=BEGIN_SUBWORKFLOW)
    async def begin_subworkflow(self, input: StepInput) -> SubRunPlan:
        """Start an attempt of a subworkflow step: ``StepStarted``, ``SubRunReserved``, child input.

        The workflow then starts the child workflow whose id is the reserved
        sub-run id.
        """
        try:
            return await self._begin_subworkflow(input)
        except ApplicationError:
            raise
        except Exception as exc:
            raise to_application_error(exc) from exc

    async def _begin_subworkflow(self, input: StepInput) -> SubRunPlan:
        begun = await self.begin_step(input, kinds=("subworkflow",))
        if isinstance(begun, StepDone):
            return SubRunPlan(done=begun)
        step = begun.step
        assert isinstance(step, SubworkflowStep) and begun.ctx is not None
        sub_run_id = sub_run_id_for(input.run_id, input.step_path)

        def reserve(rec: RunRecorder) -> None:
            if sub_run_id not in rec.fold.sub_run_ids:
                rec.sub_run_reserved(
                    input.step_path, sub_run_id=sub_run_id, workflow_id=step.workflow.id
                )

        await write_run(self.runs, input.run_id, reserve)
        child_input = begun.ctx.input if step.input is None else await _call(step.input, begun.ctx)
        data = encode_output("<input>", dict(child_input))
        inline: Any = None
        input_ref = None
        if len(data) <= TEMPORAL_INLINE_LIMIT:
            inline = orjson.loads(data)
        else:
            input_ref = self.world.artifacts.put(
                data, run_id=sub_run_id, step_path="<input>", media_type="application/json"
            )
        return SubRunPlan(
            sub_run_id=sub_run_id,
            workflow_id=step.workflow.id,
            workflow_version=step.workflow.version,
            ir_hash=step.workflow.ir_hash,
            input=inline,
            input_ref=input_ref,
        )

    async def _begun_subworkflow(self, input: StepInput) -> BegunStep:
        begun = await self.begin_step(input, kinds=("subworkflow",), start=False)
        if isinstance(begun, StepDone):
            raise TemporalAdapterError(f"subworkflow step {input.step_path!r} already completed")
        return begun

    @activity.defn(name=FINISH_SUBWORKFLOW)
    async def finish_subworkflow(self, input: StepInput) -> StepDone:
        """Commit a subworkflow step's ``StepCompleted`` with its child run's recorded output."""
        try:
            recorder = self.runs.recorder(input.run_id)
            if recorder is not None:
                done = _completed(recorder.fold, input.step_path)
                if done is not None:
                    return done_from_fold(done, executed=False)
            begun = await self._begun_subworkflow(input)
            sub_run_id = sub_run_id_for(input.run_id, input.step_path)
            child = self.runs.recorder(sub_run_id)
            if child is None or child.fold.status != "completed":
                raise TemporalAdapterError(
                    f"sub-run {sub_run_id!r} of step {input.step_path!r} has not completed"
                )
            output = read_output(self.world, child.fold.output, child.fold.output_ref)
            return await self.complete_step(begun, output)
        except ApplicationError:
            raise
        except Exception as exc:
            raise to_application_error(exc) from exc

    @activity.defn(name=FAIL_SUBWORKFLOW)
    async def fail_subworkflow(self, input: SubRunFailure) -> StepRetry:
        """Commit ``StepFailed`` for a subworkflow step whose child run failed.

        The error recorded is the one the local scheduler records: the child's
        ``RunFailedError`` when the child's log says it failed, else what
        Temporal reported.
        """
        try:
            begun = await self._begun_subworkflow(
                StepInput(run_id=input.run_id, step_path=input.step_path)
            )
            error = input.error
            child = self.runs.recorder(sub_run_id_for(input.run_id, input.step_path))
            if child is not None and child.fold.status == "failed" and child.fold.error:
                if child.fold.failed_step_path is None:
                    error = ErrorInfo(type=child.fold.error.type, message=child.fold.error.message)
                else:
                    assert child.fold.run_id is not None
                    error = ErrorInfo.from_exception(
                        RunFailedError(
                            child.fold.run_id, child.fold.failed_step_path, child.fold.error
                        )
                    )
            return await self.fail_step(begun, error)
        except ApplicationError:
            raise
        except Exception as exc:
            raise to_application_error(exc) from exc

    @activity.defn(name=COMPLETE_RUN)
    async def complete_run(self, input: RunEnd) -> RunDone:
        """Commit ``RunCompleted`` with the output of the last non-decision step."""
        try:

            def complete(rec: RunRecorder) -> RunDone:
                if rec.fold.status != "completed":
                    output: Any = None
                    if input.output_step_path is not None:
                        step = _completed(rec.fold, input.output_step_path)
                        if step is None:
                            raise TemporalAdapterError(
                                f"run {input.run_id!r} completes before step"
                                f" {input.output_step_path!r}"
                            )
                        output = read_output(self.world, step.output, step.output_ref)
                    rec.run_completed(output)
                    _log.info("run completed", run_id=input.run_id, engine="temporal")
                return self._run_done(rec.fold)

            return await write_run(self.runs, input.run_id, complete)
        except ApplicationError:
            raise
        except Exception as exc:
            raise to_application_error(exc) from exc

    @activity.defn(name=FAIL_RUN)
    async def fail_run(self, input: RunFailure) -> None:
        """Commit ``RunFailed``: at a step whose retries ran out, or for a visit limit."""
        try:

            def fail(rec: RunRecorder) -> None:
                if rec.fold.status == "failed":
                    return
                error = input.error
                if error is None and input.step_path is not None:
                    step = rec.fold.steps.get(input.step_path)
                    error = step.error if step is not None else None
                if error is None:
                    raise TemporalAdapterError(
                        f"run {input.run_id!r}: fail_run needs an error or a failed step path"
                    )
                rec.run_failed(error, step_path=input.step_path)

            await write_run(self.runs, input.run_id, fail)
        except ApplicationError:
            raise
        except Exception as exc:
            raise to_application_error(exc) from exc

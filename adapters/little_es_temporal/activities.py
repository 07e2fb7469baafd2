"""The activity side of the Temporal adapter: thin activities over the engine's step executor.

Everything here runs in a worker process with a :class:`~little_es.world.World`,
outside the workflow sandbox; the data that crosses Temporal is in
:mod:`little_es_temporal.models`. Every step of the protocol is the one
:class:`~little_es.engine.executor.StepExecutor` the local scheduler uses, so
``replay_run``, ``little report`` and a local resume read a Temporal-executed
run like any other. What is Temporal's is how the run's stream is written
(:class:`TemporalRunWriter`): parallel branches may run on several workers at
once and all append to the run's stream, so each write catches up with the
stored stream, decides and commits, and on a lost optimistic-concurrency race
does it again.

The step activity itself (``little_es.run_step``) only runs the step's code;
the :class:`~little_es_temporal.interceptor.LittleInterceptor` around it begins
and settles the attempt, and maps every activity's errors to Temporal's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import orjson
from temporalio import activity
from temporalio.exceptions import ApplicationError

from little_es.durability import encode_output, read_output
from little_es.engine.executor import (
    Begun,
    CodeStep,
    Committed,
    GroupScheduled,
    HostedRun,
    Outcome,
    Retry,
    StepExecutor,
    SubRunHost,
    budget_stop_error,
    check_engine,
    completed_step,
    execute_step,
    failed_run_error,
    open_run,
    sub_run_id_for,
    timed_out_error,
)
from little_es.errors import (
    ConcurrencyConflictError,
    RunCancelledError,
    StepSuspendedError,
    SubRunTimedOutError,
)
from little_es.ids import validate_run_id
from little_es.logging import get_logger
from little_es.materialize import RunFold, StepFold
from little_es.values import ErrorInfo, JSONValue
from little_es.workflow.authoring import AgentStep, ParallelStep, SubworkflowStep, Workflow
from little_es.workflow.context import StepContext
from little_es.workflow.paths import parse_step_path
from little_es.world import World
from little_es_temporal.errors import (
    ChildWorkflowEndedError,
    ChildWorkflowFailedError,
    TemporalAdapterError,
    UnregisteredWorkflowError,
    gave_up_error,
)
from little_es_temporal.models import (
    BEGIN_SUBWORKFLOW,
    COMPLETE_GROUP,
    COMPLETE_RUN,
    FAIL_RUN,
    FAIL_SUBWORKFLOW,
    FINISH_SUBWORKFLOW,
    RUN_STEP,
    SCHEDULE_BRANCHES,
    START_RUN,
    TEMPORAL_INLINE_LIMIT,
    GroupPlan,
    RunDone,
    RunEnd,
    RunFailure,
    RunInput,
    RunPlan,
    StepDone,
    StepInput,
    StepRetry,
    SubRunFailure,
    SubRunPlan,
    SubRunStart,
)
from little_es_temporal.stream import RunCache, TemporalRunWriter

__all__ = [
    "CURRENT_STEP",
    "LittleActivities",
    "StepCall",
    "TemporalSubRunHost",
    "WorkflowRegistry",
    "done_from_fold",
]

_log = get_logger()

_UNFINISHED = ("pending", "running", "waiting")
"""The statuses of a run that has not ended: a child workflow that ended with its run so
was ended outside little_es (terminated, cancelled, timed out in Temporal)."""


def child_ended_error(
    run_id: str, fold: RunFold, parent_run_id: str, step_path: str
) -> ChildWorkflowEndedError:
    """The refusal for sub-run ``run_id``, whose child workflow ended with its log unfinished."""
    return ChildWorkflowEndedError(
        f"sub-run {run_id!r} of step {step_path!r} of run {parent_run_id!r}: its child"
        f" workflow ended but its log shows it {fold.status}, unfinished: the workflow was"
        " ended outside little_es (terminated, cancelled or timed out in Temporal). Nothing"
        f" was recorded for it in run {parent_run_id!r}; start run {parent_run_id!r} again"
        " (start_run or TemporalEngine.run with the same run id) to resume it and its"
        " sub-run, which continues from its log"
    )


def child_failed_error(
    run_id: str, fold: RunFold, parent_run_id: str, step_path: str, failure: ErrorInfo
) -> ChildWorkflowFailedError:
    """The refusal for sub-run ``run_id``, whose child workflow failed by ``failure`` (an
    error of its own, as Temporal reported it) with its log unfinished."""
    return ChildWorkflowFailedError(
        f"sub-run {run_id!r} of step {step_path!r} of run {parent_run_id!r}: its child"
        f" workflow failed with {failure.type}: {failure.message} -- and its log shows it"
        f" {fold.status}, unfinished, as that error stops a run without recording it."
        f" Nothing was recorded for it in run {parent_run_id!r}; fix that cause, then start"
        f" run {parent_run_id!r} again (start_run or TemporalEngine.run with the same run"
        " id) to resume it and its sub-run, which continues from its log"
    )


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
            if isinstance(inner, AgentStep):
                # An orchestrator's start_workflow tool names the workflows it may start.
                for found in inner.tools.values():
                    started = getattr(found, "workflows", None)
                    if isinstance(started, Mapping):
                        for child in started.values():
                            self._add(child)

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


def _done(committed: Committed) -> StepDone:
    return done_from_fold(committed.step, executed=committed.executed)


def child_input(world: World, run_id: str, value: Any) -> tuple[Any, Any]:
    """``(inline, input_ref)``: a child run's input inline when small, else as an artifact."""
    data = encode_output("<input>", value)
    if len(data) <= TEMPORAL_INLINE_LIMIT:
        return orjson.loads(data), None
    ref = world.artifacts.put(
        data, run_id=run_id, step_path="<input>", media_type="application/json"
    )
    return None, ref


class TemporalSubRunHost(SubRunHost):
    """The adapter's :class:`~little_es.engine.executor.SubRunHost`: sub-runs are child workflows.

    A step activity cannot wait for a workflow, so a sub-run that has not
    finished suspends the attempt (:class:`~little_es.errors.StepSuspendedError`,
    nothing recorded); the workflow starts the child workflows (id = the
    reserved sub-run id), waits, and runs the same attempt again, which reads
    each sub-run's result from its log: a completed sub-run is never run again.
    A failed one is the step's failure only when its child workflow just ran
    for this step (``hosted``); otherwise (a retried step) it is run again,
    resuming from its own log, as ``run_workflow`` would. A cancelled one stops
    the step as it does locally (:class:`~little_es.errors.RunCancelledError`),
    and one whose wait timed out fails it (:class:`~little_es.errors.SubRunTimedOutError`).
    One whose child workflow ended while its log shows it unfinished (terminated or
    cancelled in Temporal) is a refusal (:class:`~little_es_temporal.ChildWorkflowEndedError`):
    nothing is recorded, and the parent run, started again, hosts it again. So is one
    whose child workflow failed by an error of its own (``failures``, as the workflow saw
    it) with its log unfinished, refused with that error
    (:class:`~little_es_temporal.ChildWorkflowFailedError`).
    """

    def __init__(
        self,
        activities: LittleActivities,
        hosted: Iterable[str],
        failures: Mapping[str, ErrorInfo] | None = None,
    ) -> None:
        self.activities = activities
        self.hosted = frozenset(hosted)
        self.failures = dict(failures or {})

    async def run(self, request: HostedRun) -> Any:
        child = self.activities.runs.recorder(request.run_id)
        fold = child.fold if child is not None else None
        if fold is not None and fold.status == "completed":
            return read_output(self.activities.world, fold.output, fold.output_ref)
        if fold is not None and fold.status == "cancelled":
            # As run_workflow raises for it locally: a stop, recorded as nothing here, the
            # parent's step in flight until the sub-run is resumed (resume_cancelled).
            raise RunCancelledError(request.run_id, fold.stop_reason)
        if request.run_id in self.hosted:
            if fold is not None and fold.status == "failed" and fold.error is not None:
                raise failed_run_error(request.run_id, fold)
            if fold is not None and fold.status == "timed_out":
                raise SubRunTimedOutError(timed_out_error(request.run_id, fold))
            if fold is not None and fold.status == "budget_exceeded":
                # As run_workflow raises it to the parent's step locally: the parent then
                # records the stop as its own outcome. (Not hosted just now, the child is
                # hosted again instead, and resumes under the budget as it is.)
                raise budget_stop_error(self.activities.world, request.run_id)
            failure = self.failures.get(request.run_id)
            if fold is not None and fold.status in _UNFINISHED:
                # Not the step's failure: the log says the sub-run is unfinished, as after a
                # killed process, which a resume continues. Refused with what ended it.
                if failure is not None:
                    raise child_failed_error(
                        request.run_id,
                        fold,
                        request.parent_run_id,
                        request.parent_step_path,
                        failure,
                    )
                raise child_ended_error(
                    request.run_id, fold, request.parent_run_id, request.parent_step_path
                )
            reported = (
                f"{failure.type}: {failure.message}"
                if failure is not None
                else "see that workflow's failure in Temporal"
            )
            raise TemporalAdapterError(
                f"sub-run {request.run_id!r}: its child workflow ended but its log shows it"
                f" {fold.status if fold is not None else 'not started'}: {reported}"
            )
        raise StepSuspendedError((request,))

    def start(self, request: HostedRun) -> SubRunStart:
        """The child workflow to start for ``request``."""
        inline, ref = child_input(self.activities.world, request.run_id, dict(request.input))
        return SubRunStart(
            run_id=request.run_id,
            workflow_id=request.workflow.id,
            workflow_version=request.workflow.version,
            ir_hash=request.workflow.ir_hash,
            input=inline,
            input_ref=ref,
            parent_step_path=request.parent_step_path,
            max_concurrency=request.max_concurrency,
        )


@dataclass(frozen=True)
class StepCall:
    """What the interceptor hands the ``run_step`` activity body: the step and its context."""

    world: World
    step: CodeStep
    ctx: StepContext


CURRENT_STEP: ContextVar[StepCall | None] = ContextVar("little_es_temporal_step", default=None)
"""Set by the interceptor around the ``run_step`` activity body."""


class LittleActivities:
    """The activities of the generic workflow, bound to a world and the registered workflows.

    Register them all with :meth:`all` (``create_worker`` does it, together
    with the :class:`~little_es_temporal.interceptor.LittleInterceptor`, which
    they need: it writes a step's events around ``run_step`` and maps every
    activity's errors to Temporal's).
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

    def workflow_of(self, fold: RunFold) -> Workflow:
        """The registered definition that started the run ``fold`` describes."""
        if fold.workflow_id is None or fold.ir_hash is None:
            raise TemporalAdapterError(f"run {fold.run_id!r} has no RunStarted in its log")
        return self.registry.get(fold.workflow_id, fold.ir_hash)

    def executor(self, run_id: str) -> tuple[StepExecutor, RunFold]:
        """The step executor of ``run_id`` on this worker, and the run's state just read."""
        writer = TemporalRunWriter(self.runs, self.world, validate_run_id(run_id))
        fold = writer.read()
        return StepExecutor(writer, self.workflow_of(fold)), fold

    async def begin_step(
        self, input: StepInput, *, kinds: tuple[str, ...], start: bool = True
    ) -> tuple[StepExecutor, Begun | Committed]:
        """Begin an attempt of the step ``input`` names (see :meth:`StepExecutor.begin`).

        A branch's value is recomputed from its group's branch set. With
        ``start=False`` the attempt in flight is looked up, and it must be one.
        """
        parts = parse_step_path(input.step_path)
        executor, fold = self.executor(input.run_id)
        step = executor.workflow.step(parts.step_id)
        if step.ir.kind not in kinds or isinstance(step, ParallelStep):
            raise TemporalAdapterError(
                f"step {input.step_path!r} of workflow {executor.workflow.id!r} is a"
                f" {step.ir.kind} step; this activity runs {', '.join(kinds)} steps"
            )
        branch_value: Any = None
        # branches(ctx) may take a while: decide on the state caught up after it.
        late = start and parts.group_id is not None and not completed_step(fold, input.step_path)
        if late:
            branch_value = await executor.branch_value(fold, parts)
        begun = await executor.begin(
            step, input.step_path, parts.visit, branch_value, start=start, catch_up=late
        )
        if not start and isinstance(begun, Begun) and not begun.in_flight:
            raise TemporalAdapterError(
                f"run {input.run_id!r}: step {input.step_path!r} is not in flight"
            )
        return executor, begun

    async def _begun_subworkflow(self, input: StepInput) -> tuple[StepExecutor, Begun]:
        executor, begun = await self.begin_step(input, kinds=("subworkflow",), start=False)
        if isinstance(begun, Committed):
            raise TemporalAdapterError(f"subworkflow step {input.step_path!r} already completed")
        return executor, begun

    def _run_done(self, fold: RunFold) -> RunDone:
        assert fold.run_id is not None
        if fold.output_ref is not None:
            return RunDone(run_id=fold.run_id, output_ref=fold.output_ref, output_inline=False)
        output, inline = _inline(fold.output)
        return RunDone(run_id=fold.run_id, output=output, output_inline=inline)

    # ------------------------------------------------------------ the activities

    @activity.defn(name=START_RUN)
    async def start_run(self, input: RunInput) -> RunPlan:
        """Start the run (``RunStarted``) or load it and run the restart checks.

        Holds the run's lease while it does, so a run that a local process is
        still driving is refused (retried later) instead of driven twice.
        """
        run_id = validate_run_id(input.run_id)
        workflow = self.registry.get(input.workflow_id, input.ir_hash)
        # A child run (or a client that skipped start_run) meets the check here, before
        # anything is appended; the refusal is not retryable.
        check_engine(workflow, "temporal")
        given: Any = input.input
        if input.input_ref is not None:
            given = orjson.loads(self.world.artifacts.get(input.input_ref).payload)
        with self.world.run_lease(run_id):
            existing = self.runs.recorder(run_id)
            if existing is None:
                try:
                    started = open_run(
                        self.world,
                        workflow,
                        run_id,
                        given,
                        None,
                        parent_run_id=input.parent_run_id,
                        parent_step_path=input.parent_step_path,
                        budget=input.budget,
                    )
                except ConcurrencyConflictError:
                    # Another worker started it a moment ago: resume that one.
                    existing = self.runs.recorder(run_id)
                    if existing is None:
                        raise
                else:
                    self.runs.keep(started)
                    _log.info(
                        "run started", run_id=run_id, workflow_id=workflow.id, engine="temporal"
                    )
                    return RunPlan(ir=workflow.ir)
            fold = open_run(
                self.world,
                workflow,
                run_id,
                given,
                existing,
                budget=input.budget,
                resume_cancelled=input.resume_cancelled,
            ).fold
            if fold.status == "completed":
                return RunPlan(ir=workflow.ir, done=self._run_done(fold))
            _log.info("run resumed", run_id=run_id, workflow_id=workflow.id, engine="temporal")
        return RunPlan(ir=workflow.ir)

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
        parts = parse_step_path(input.step_path)
        executor, fold = self.executor(input.run_id)
        group = executor.workflow.step(parts.step_id)
        if not isinstance(group, ParallelStep):
            raise TemporalAdapterError(f"step {input.step_path!r} is not a parallel group")
        done = completed_step(fold, input.step_path)
        if done is not None:
            return GroupPlan(done=done_from_fold(done, executed=False))
        plan = await executor.schedule_group(group, input.step_path, parts.visit, fold)
        if isinstance(plan, Retry):
            message = (
                f"parallel group {input.step_path!r} of run {input.run_id!r} failed:"
                f" {plan.error.type}: {plan.error.message}"
            )
            if plan.will_retry:
                # Temporal retries this activity after the group's backoff: the next
                # attempt of branches(ctx), as the step activities' retries are.
                raise ApplicationError(
                    message,
                    type=plan.error.type,
                    next_retry_delay=timedelta(seconds=max(plan.delay_s, 0.001)),
                ) from plan.cause
            raise gave_up_error(message, plan.error) from plan.cause
        if isinstance(plan, Committed):
            return GroupPlan(done=_done(plan))
        assert isinstance(plan, GroupScheduled)
        return GroupPlan(branch_keys=plan.keys)

    @activity.defn(name=COMPLETE_GROUP)
    async def complete_group(self, input: StepInput) -> StepDone:
        """Commit a parallel group's ``StepCompleted``: its branches' outputs by branch key."""
        parts = parse_step_path(input.step_path)
        executor, _ = self.executor(input.run_id)
        group = executor.workflow.step(parts.step_id)
        if not isinstance(group, ParallelStep):
            raise TemporalAdapterError(f"step {input.step_path!r} is not a parallel group")
        return _done(await executor.complete_group(group, input.step_path, parts.visit))

    @activity.defn(name=BEGIN_SUBWORKFLOW)
    async def begin_subworkflow(self, input: StepInput) -> SubRunPlan:
        """Start an attempt of a subworkflow step: ``StepStarted``, ``SubRunReserved``, child input.

        The workflow then starts the child workflow whose id is the reserved
        sub-run id.
        """
        executor, begun = await self.begin_step(input, kinds=("subworkflow",))
        if isinstance(begun, Committed):
            return SubRunPlan(done=_done(begun))
        step = begun.step
        assert isinstance(step, SubworkflowStep)
        sub_run_id, given = await executor.sub_run(begun)
        inline, input_ref = child_input(self.world, sub_run_id, given)
        return SubRunPlan(
            sub_run_id=sub_run_id,
            workflow_id=step.workflow.id,
            workflow_version=step.workflow.version,
            ir_hash=step.workflow.ir_hash,
            input=inline,
            input_ref=input_ref,
        )

    @activity.defn(name=FINISH_SUBWORKFLOW)
    async def finish_subworkflow(self, input: StepInput) -> StepDone:
        """Commit a subworkflow step's ``StepCompleted`` with its child run's recorded output."""
        executor, begun = await self.begin_step(input, kinds=("subworkflow",), start=False)
        if isinstance(begun, Committed):
            return _done(begun)
        sub_run_id = sub_run_id_for(input.run_id, input.step_path)
        child = self.runs.recorder(sub_run_id)
        if child is None or child.fold.status != "completed":
            raise TemporalAdapterError(
                f"sub-run {sub_run_id!r} of step {input.step_path!r} has not completed"
            )
        output = read_output(self.world, child.fold.output, child.fold.output_ref)
        settled = await executor.settle(begun, Outcome(output=output))
        assert isinstance(settled, Committed)
        return _done(settled)

    @activity.defn(name=FAIL_SUBWORKFLOW)
    async def fail_subworkflow(self, input: SubRunFailure) -> StepRetry:
        """Commit ``StepFailed`` for a subworkflow step whose child run failed.

        The error recorded is the one the local scheduler records: what the child's
        failure raises (:func:`~little_es.engine.executor.failed_run_error`) when its
        log says it failed, else what Temporal reported. A child whose log shows it
        unfinished is a refusal instead, recorded as nothing:
        :class:`~little_es_temporal.ChildWorkflowEndedError` when its workflow was
        terminated, cancelled or timed out in Temporal, else
        :class:`~little_es_temporal.ChildWorkflowFailedError` with its error. (Only
        histories from before :data:`~little_es_temporal.workflow.SUBWORKFLOW_PATCH` call
        this; newer ones read the child's log in the step activity.)
        """
        sub_run_id = sub_run_id_for(input.run_id, input.step_path)
        child = self.runs.recorder(sub_run_id)
        if child is not None and child.fold.status in _UNFINISHED:
            if not input.ended_outside:
                raise child_failed_error(
                    sub_run_id, child.fold, input.run_id, input.step_path, input.error
                )
            raise child_ended_error(sub_run_id, child.fold, input.run_id, input.step_path)
        executor, begun = await self._begun_subworkflow(
            StepInput(run_id=input.run_id, step_path=input.step_path)
        )
        error = input.error
        if child is not None and child.fold.status == "failed" and child.fold.error:
            assert child.fold.run_id is not None
            error = ErrorInfo.from_exception(failed_run_error(child.fold.run_id, child.fold))
        retry = await executor.settle(begun, Outcome(error=error))
        assert isinstance(retry, Retry)
        return StepRetry(will_retry=retry.will_retry, delay_s=retry.delay_s)

    @activity.defn(name=COMPLETE_RUN)
    async def complete_run(self, input: RunEnd) -> RunDone:
        """Commit ``RunCompleted`` with the output of the last non-decision step."""
        executor, _ = self.executor(input.run_id)
        fold = await executor.complete_run(input.output_step_path)
        _log.info("run completed", run_id=input.run_id, engine="temporal")
        return self._run_done(fold)

    @activity.defn(name=FAIL_RUN)
    async def fail_run(self, input: RunFailure) -> None:
        """Commit ``RunFailed``: at a step whose retries ran out, or for a visit limit."""
        executor, _ = self.executor(input.run_id)
        await executor.fail_run(step_path=input.step_path, error=input.error)

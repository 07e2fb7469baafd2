"""The local scheduler: run a workflow in-process on asyncio, resumable after any crash.

``run_workflow(world, workflow, input, run_id=...)`` starts a run, or resumes it
when the run id already has a log. Resuming walks the workflow in the order it
ran before, using the log instead of the code for everything committed:

* a step with a committed ``StepCompleted`` is not run; its recorded output is
  used (and for a decision, its recorded target);
* visit counters are recounted from the walk, so ``review@2`` is the same path
  in every process;
* a parallel group recomputes its branch set and compares it with the recorded
  ``ParallelBranchScheduled`` before running any branch;
* the first step without a terminal event runs again with the same attempt
  number (an agent step continues its harness session, fast-forwarding every
  committed model and tool call).

Before anything runs, the restart checks of :mod:`little_es.integrity` refuse a
log that the code no longer matches. A lease (:meth:`World.run_lease`) makes
sure only one process drives a run at a time.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from little_es._frozen import FrozenDict, freeze
from little_es.durability import RunRecorder, encode_output, normalize_output, read_output
from little_es.errors import LittleEsError, StepExecutionError, WorkflowDefinitionError
from little_es.events import Event
from little_es.ids import new_run_id, session_stream_id, validate_run_id
from little_es.integrity import (
    assert_completed_parallel_replay_matches_input,
    run_restart_checks,
)
from little_es.logging import get_logger
from little_es.materialize import MaterializedRunState, RunFold, StepFold
from little_es.values import ErrorInfo
from little_es.workflow.authoring import (
    AgentStep,
    BranchStep,
    DecisionStep,
    ParallelStep,
    Step,
    SubworkflowStep,
    TaskStep,
    Workflow,
)
from little_es.workflow.context import StepContext
from little_es.workflow.ir import END
from little_es.workflow.paths import step_path as make_step_path
from little_es.world import World

_log = get_logger()


class VisitLimitError(StepExecutionError, WorkflowDefinitionError):
    """A decision jumped to a step that has used all of its ``max_visits``."""

    @classmethod
    def for_step(cls, run_id: str, step_id: str, visit: int, max_visits: int) -> VisitLimitError:
        """The error for visit ``visit`` of ``step_id``, worded the same by every engine."""
        return cls(
            f"run {run_id!r}: step {step_id!r} would be visited {visit} times, but"
            f" max_visits={max_visits}: raise max_visits or make the decision leave the loop"
        )


class RunFailedError(StepExecutionError):
    """The run stopped: a step failed and its retries are exhausted. Resume it once fixed."""

    def __init__(self, run_id: str, step_path: str | None, error: ErrorInfo) -> None:
        self.run_id = run_id
        self.step_path = step_path
        self.error = error
        super().__init__(
            f"run {run_id!r} failed at step {step_path!r}: {error.type}: {error.message}."
            " Fix the cause, then resume with the same run id"
        )


@dataclass(frozen=True, repr=False)
class RunResult:
    """What :func:`run_workflow` returns: the run's output and its materialized state."""

    run_id: str
    output: Any
    state: MaterializedRunState
    resumed: bool
    """True when the run id already had a log."""
    steps_executed: int
    """Step executions (attempts) that ran code in this call."""

    def __repr__(self) -> str:
        # Not the whole state: it can hold thousands of steps, and asyncio.run()
        # formats the repr of its main task's result as it returns (3.11).
        return (
            f"RunResult(run_id={self.run_id!r}, status={self.state.status!r},"
            f" steps={len(self.state.steps)}, resumed={self.resumed},"
            f" steps_executed={self.steps_executed})"
        )


_current_recorder: ContextVar[RunRecorder | None] = ContextVar(
    "little_es_current_recorder", default=None
)


def current_run_recorder() -> RunRecorder | None:
    """The recorder of the run whose step code is running in this context, else None.

    The local scheduler sets it around each task, decision and agent step, so a
    tool called by an agent (``start_workflow``) writes the run's own stream
    through the one object that holds its ``Run`` aggregate in memory.
    """
    return _current_recorder.get()


def sub_run_id_for(parent_run_id: str, step_path: str) -> str:
    """The deterministic id of the sub-run a ``subworkflow`` step starts."""
    digest = hashlib.sha256(f"{parent_run_id}\x00{step_path}".encode()).hexdigest()[:20]
    return f"sub_{digest}"


async def _call(fn: Callable[..., Any], *args: Any) -> Any:
    if inspect.iscoroutinefunction(fn):
        return await fn(*args)
    result = await asyncio.to_thread(fn, *args)
    if inspect.isawaitable(result):
        return await result
    return result


def next_attempt(recorded: StepFold | None, max_attempts: int) -> tuple[int, bool, int]:
    """``(attempt, in_flight, last_allowed_attempt)`` for a step about to run.

    A step started and never finished is *in flight*: it runs again as the same
    attempt (a crash is not a failure). After a recorded retryable failure the
    next attempt follows; after the run failed for good, a resume gives the
    (fixed) code a fresh budget of ``max_attempts``.
    """
    if recorded is None:
        return 1, False, max_attempts
    if recorded.status == "running":
        return recorded.attempts, True, max_attempts
    if recorded.status == "failed":
        return recorded.attempts + 1, False, recorded.attempts + max_attempts
    return recorded.attempts + 1, False, max_attempts


async def execute_step(
    world: World, step: TaskStep | AgentStep | DecisionStep, ctx: StepContext
) -> Any:
    """Run one attempt of a task, decision or agent step's code (no events are written here
    except the agent's own harness session). Both engines call this."""
    if isinstance(step, AgentStep):
        from little_es.harness.session import run_agent_session

        prompt = step.prompt if isinstance(step.prompt, str) else await _call(step.prompt, ctx)
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
        )
        return outcome.output
    return await _call(step.fn, ctx)


def outputs_from_fold(world: World, fold: RunFold) -> dict[str, Any]:
    """The latest committed output of each top-level step, as a step's context shows them."""
    outputs: dict[str, Any] = {}
    for path, step in fold.steps.items():
        if step.status == "completed" and "/" not in path:
            outputs[step.step_id] = read_output(world, step.output, step.output_ref)
    return outputs


class _Scheduler:
    def __init__(
        self, world: World, workflow: Workflow, recorder: RunRecorder, input: Mapping[str, Any]
    ) -> None:
        self.world = world
        self.workflow = workflow
        self.recorder = recorder
        self.run_id = recorder.run_id
        self.input = freeze(input)
        # Each output is frozen once, when it is committed; the read-only view
        # handed to step contexts is rebuilt only after an output changed, by a
        # C-level copy. StepContext would otherwise re-freeze every output for
        # every step, O(steps) Python work per step.
        self.outputs: dict[str, Any] = {}
        self._outputs_view: FrozenDict[str, Any] | None = None
        self.executed = 0

    # -------------------------------------------------------------- the walk

    async def drive(self) -> Any:
        """Walk the workflow to END; return the last non-decision step's output."""
        visits: dict[str, int] = {}
        step_id = self.workflow.steps[0].id
        output: Any = None
        while step_id != END:
            step = self.workflow.step(step_id)
            visit = visits.get(step_id, 0) + 1
            if visit > step.ir.max_visits:
                raise VisitLimitError.for_step(self.run_id, step_id, visit, step.ir.max_visits)
            visits[step_id] = visit
            path = make_step_path(step_id, visit=visit)
            result = await self._step(step, path, visit)
            self.outputs[step_id] = freeze(result)
            self._outputs_view = None
            if isinstance(step, DecisionStep):
                step_id = self.workflow.check_decision_target(step_id, result)
            else:
                output = result
                step_id = self.workflow.next_step_id(step_id)
        return output

    def _context(self, path: str, attempt: int, branch_value: Any = None) -> StepContext:
        if self._outputs_view is None:
            view: FrozenDict[str, Any] = FrozenDict()
            dict.update(view, self.outputs)  # the values are frozen already
            self._outputs_view = view
        return StepContext(
            run_id=self.run_id,
            input=self.input,
            outputs=self._outputs_view,
            step_path=path,
            attempt=attempt,
            branch_value=branch_value,
        )

    async def _step(self, step: Step, path: str, visit: int, branch_value: Any = None) -> Any:
        if isinstance(step, ParallelStep):
            return await self._parallel(step, path, visit)
        recorded = self.recorder.fold.steps.get(path)
        if recorded is not None and recorded.status == "completed":
            return read_output(self.world, recorded.output, recorded.output_ref)
        return await self._attempts(step, path, visit, recorded, branch_value)

    async def _attempts(
        self,
        step: TaskStep | AgentStep | DecisionStep | SubworkflowStep,
        path: str,
        visit: int,
        recorded: StepFold | None,
        branch_value: Any,
    ) -> Any:
        policy = step.ir.retry
        attempt, in_flight, limit = next_attempt(recorded, policy.max_attempts)
        kind = step.ir.kind
        while True:
            session_id = (
                session_stream_id(self.run_id, path, attempt)
                if isinstance(step, AgentStep)
                else None
            )
            if not in_flight:
                self.recorder.step_started(
                    path,
                    step_id=step.id,
                    kind=kind,
                    visit=visit,
                    attempt=attempt,
                    session_id=session_id,
                )
            in_flight = False
            ctx = self._context(path, attempt, branch_value)
            self.executed += 1
            next_step = None
            try:
                output = await self._execute(step, ctx)
                # A decision's unknown target and an output that is not JSON are
                # this attempt's failure: record them, or the log would show the
                # step in flight forever and every resume would run it again.
                if isinstance(step, DecisionStep):
                    next_step = self.workflow.check_decision_target(step.id, output)
                encode_output(path, output)
            except Exception as exc:
                error = ErrorInfo.from_exception(exc)
                will_retry = error.retryable and attempt < limit
                self.recorder.step_failed(
                    path,
                    step_id=step.id,
                    visit=visit,
                    attempt=attempt,
                    error=error,
                    will_retry=will_retry,
                )
                _log.warning(
                    "step failed",
                    run_id=self.run_id,
                    step_path=path,
                    attempt=attempt,
                    error=error.message,
                    will_retry=will_retry,
                )
                if not will_retry:
                    raise _RetriesExhaustedError(path, error) from exc
                await asyncio.sleep(policy.backoff_for(attempt))
                attempt += 1
                continue
            return self.recorder.step_completed(
                path,
                step_id=step.id,
                visit=visit,
                attempt=attempt,
                output=output,
                next_step=next_step,
            )

    async def _execute(
        self, step: TaskStep | AgentStep | DecisionStep | SubworkflowStep, ctx: StepContext
    ) -> Any:
        if isinstance(step, SubworkflowStep):
            return await self._subworkflow(step, ctx)
        token = _current_recorder.set(self.recorder)
        try:
            return await execute_step(self.world, step, ctx)
        finally:
            _current_recorder.reset(token)

    async def _subworkflow(self, step: SubworkflowStep, ctx: StepContext) -> Any:
        fold = self.recorder.fold
        sub_run_id = sub_run_id_for(self.run_id, ctx.step_path)
        if sub_run_id not in fold.sub_run_ids:
            self.recorder.sub_run_reserved(
                ctx.step_path, sub_run_id=sub_run_id, workflow_id=step.workflow.id
            )
        child_input = self.input if step.input is None else await _call(step.input, ctx)
        result = await run_workflow(
            self.world,
            step.workflow,
            dict(child_input),
            run_id=sub_run_id,
            _parent=(self.run_id, ctx.step_path),
        )
        return result.output

    async def _parallel(self, step: ParallelStep, path: str, visit: int) -> Any:
        fold = self.recorder.fold
        recorded = fold.steps.get(path)
        if recorded is None:
            self.recorder.step_started(
                path, step_id=step.id, kind="parallel", visit=visit, attempt=1
            )
        ctx = self._context(path, 1)
        try:
            branch_set = step.branch_set(await _call(step.branches, ctx))
        except Exception as exc:
            # Recorded, or the group would look in flight forever.
            error = ErrorInfo.from_exception(exc, retryable=False)
            self.recorder.step_failed(
                path, step_id=step.id, visit=visit, attempt=1, error=error, will_retry=False
            )
            raise _RetriesExhaustedError(path, error) from exc
        keys = tuple(branch_set)
        scheduled = fold.parallel_groups.get(path)
        if recorded is not None and recorded.status == "completed":
            # The seed checks completed groups too: if the branch set the run's
            # data gives now differs, replay cannot stand in for the original run.
            if scheduled is not None:
                assert_completed_parallel_replay_matches_input(self.run_id, path, scheduled, keys)
            return read_output(self.world, recorded.output, recorded.output_ref)
        if scheduled is None:
            self.recorder.branches_scheduled(path, step_id=step.id, branch_keys=keys)
        else:
            assert_completed_parallel_replay_matches_input(self.run_id, path, scheduled, keys)
        limit = asyncio.Semaphore(step.max_concurrency or max(len(keys), 1))
        inner: BranchStep = step.step

        async def branch(key: str) -> Any:
            branch_path = make_step_path(
                inner.id, group_id=step.id, branch_key=key, group_visit=visit
            )
            async with limit:
                return await self._step(inner, branch_path, 1, branch_set[key])

        results = await asyncio.gather(*(branch(k) for k in keys), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result
        output = dict(zip(keys, results, strict=True))
        return self.recorder.step_completed(
            path, step_id=step.id, visit=visit, attempt=1, output=output
        )


class _RetriesExhaustedError(Exception):
    def __init__(self, step_path: str, error: ErrorInfo) -> None:
        super().__init__(step_path)
        self.step_path = step_path
        self.error = error


async def run_workflow(
    world: World,
    workflow: Workflow,
    input: Mapping[str, Any] | None = None,
    *,
    run_id: str | None = None,
    observer: Callable[[Event], None] | None = None,
    _parent: tuple[str, str] | None = None,
) -> RunResult:
    """Run ``workflow`` to the end, or resume the run ``run_id`` where its log stops.

    A new (or no) ``run_id`` starts a run with ``input``; an existing one resumes
    it (``input`` may be omitted, and must equal the recorded one if given).
    A completed run returns its recorded result without running anything.

    Raises :class:`RunFailedError` when a step fails with its retries
    exhausted (the failure is recorded; resume later), a
    :class:`~little_es.errors.RuntimeIntegrityError` when the log does not match
    the code, and :class:`~little_es.errors.ConcurrentRunError` when another
    process is driving the run.
    """
    if not isinstance(workflow, Workflow):
        raise TypeError(
            f"workflow must be a little_es Workflow, got {type(workflow).__name__}: build one"
            " with Workflow(id, steps=[...])"
        )
    if input is not None and not isinstance(input, Mapping):
        raise TypeError(
            f"input must be a mapping (JSON object) or None, got {type(input).__name__}"
        )
    run_id = validate_run_id(run_id) if run_id is not None else new_run_id()
    with world.run_lease(run_id):
        recorder = RunRecorder.load(world, run_id, observer=observer)
        resumed = recorder is not None
        if recorder is None:
            recorder = RunRecorder.start(
                world,
                run_id=run_id,
                workflow_id=workflow.id,
                workflow_version=workflow.version,
                ir_hash=workflow.ir_hash,
                input=normalize_output("<input>", dict(input or {})),
                parent_run_id=_parent[0] if _parent else None,
                parent_step_path=_parent[1] if _parent else None,
                observer=observer,
            )
        else:
            fold = recorder.fold
            run_restart_checks(world, run_id, fold, workflow, input)
            if fold.status == "completed":
                return RunResult(
                    run_id=run_id,
                    output=read_output(world, fold.output, fold.output_ref),
                    state=fold.freeze(),
                    resumed=True,
                    steps_executed=0,
                )
        scheduler = _Scheduler(world, workflow, recorder, recorder.fold.input or {})
        log = _log.bind(run_id=run_id, workflow_id=workflow.id)
        log.info("run resumed" if resumed else "run started")
        try:
            output = await scheduler.drive()
        except _RetriesExhaustedError as gave_up:
            recorder.run_failed(gave_up.error, step_path=gave_up.step_path)
            raise RunFailedError(run_id, gave_up.step_path, gave_up.error) from gave_up.__cause__
        except VisitLimitError as exc:
            error = ErrorInfo.from_exception(exc, retryable=False)
            recorder.run_failed(error, step_path=None)
            raise
        except LittleEsError:
            raise
        recorder.run_completed(output)
        log.info("run completed", steps_executed=scheduler.executed)
        return RunResult(
            run_id=run_id,
            output=read_output(world, recorder.fold.output, recorder.fold.output_ref),
            state=recorder.fold.freeze(),
            resumed=resumed,
            steps_executed=scheduler.executed,
        )

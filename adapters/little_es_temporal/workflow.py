"""The generic Temporal workflow that runs any little_es workflow: :class:`LittleRunWorkflow`.

Its workflow id is the little_es run id. It walks the workflow's IR exactly as
the local scheduler's ``_Scheduler.drive`` does (list order, decisions' jumps,
visit counters and ``max_visits``, step paths from
:func:`~little_es.workflow.paths.step_path`), and asks activities to do
everything that touches the world:

* ``start_run`` starts or loads the run and returns the IR to walk (so a
  replay of this workflow reads the IR from history, never from the worker's
  current code);
* each task, decision and agent step is one ``run_step`` activity; its result
  is a small :class:`~little_es_temporal.activities.StepDone` (a decision's
  target; an output only when tiny);
* a parallel group is ``schedule_branches`` (its branch keys, resolved from the
  run's data and recorded), the branches gathered (bounded by
  ``max_concurrency``), then ``complete_group``;
* a subworkflow step is ``begin_subworkflow`` (which reserves the sub-run id),
  a child workflow whose id is that sub-run id, then ``finish_subworkflow``;
* ``complete_run`` / ``fail_run`` end the run.

Workflow code must stay deterministic: this module does no I/O, reads no
clock, draws no random numbers and never touches an aggregate. The little_es
modules it uses (the IR models, step paths, the activities' data models) are
imported through ``workflow.unsafe.imports_passed_through()``; the sandbox
would let their side effects through silently, so only their pure parts are
used here. Logging goes through ``workflow.logger``.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy as TemporalRetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, ChildWorkflowError

with workflow.unsafe.imports_passed_through():
    from little_es.values import ErrorInfo
    from little_es.workflow.ir import END, RetryPolicy, StepIR, WorkflowIR
    from little_es.workflow.paths import step_path as make_step_path
    from little_es.workflow.runtime import VisitLimitError
    from little_es_temporal.activities import (
        BEGIN_SUBWORKFLOW,
        COMPLETE_GROUP,
        COMPLETE_RUN,
        FAIL_RUN,
        FAIL_SUBWORKFLOW,
        FINISH_SUBWORKFLOW,
        GAVE_UP_MARKER,
        RUN_STEP,
        SCHEDULE_BRANCHES,
        START_RUN,
        GroupPlan,
        RunDone,
        RunEnd,
        RunFailure,
        RunInput,
        RunPlan,
        StepDone,
        StepInput,
        StepRetry,
        StepTimeouts,
        SubRunFailure,
        SubRunPlan,
    )

__all__ = ["WORKFLOW_TYPE", "LittleRunWorkflow", "step_retry_policy"]

WORKFLOW_TYPE = "little_es.Run"
"""The Temporal workflow type name of :class:`LittleRunWorkflow`."""

_BOOKKEEPING_RETRY = TemporalRetryPolicy(
    initial_interval=timedelta(milliseconds=200),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=10),
)


def step_retry_policy(policy: RetryPolicy) -> TemporalRetryPolicy:
    """The Temporal retry policy of a step activity, from the step's little_es ``RetryPolicy``.

    The backoff (initial interval, coefficient, cap) is the step's. The number
    of attempts is not bounded here but by the log: a failed attempt is
    recorded as ``StepFailed`` and the interceptor raises a non-retryable error
    once ``max_attempts`` is used up (or when the error says it is not
    retryable), and a retryable one with ``next_retry_delay`` set to the
    step's backoff otherwise. What Temporal retries on its own, beyond that,
    are crashes and timeouts, which are not failures and use no attempt: the
    attempt in flight is continued.
    """
    initial = policy.initial_backoff_s if policy.initial_backoff_s > 0 else 0.1
    return TemporalRetryPolicy(
        initial_interval=timedelta(seconds=initial),
        backoff_coefficient=policy.backoff_coefficient,
        maximum_interval=(
            None
            if policy.max_backoff_s is None
            else timedelta(seconds=max(policy.max_backoff_s, initial))
        ),
        maximum_attempts=0,
    )


class _GaveUpError(Exception):
    def __init__(self, step_path: str, message: str) -> None:
        super().__init__(message)
        self.step_path = step_path


def _gave_up(error: BaseException) -> bool:
    cause = error.cause if isinstance(error, ActivityError) else None
    return (
        isinstance(cause, ApplicationError)
        and bool(cause.details)
        and cause.details[0] == GAVE_UP_MARKER
    )


def _describe(error: BaseException) -> ErrorInfo:
    # The innermost application failure says what went wrong in the child.
    inner: BaseException = error
    while getattr(inner, "cause", None) is not None:
        inner = inner.cause  # type: ignore[attr-defined]
    kind = (
        inner.type if isinstance(inner, ApplicationError) and inner.type else type(inner).__name__
    )
    return ErrorInfo(type=kind, message=getattr(inner, "message", None) or str(inner))


@workflow.defn(name=WORKFLOW_TYPE)
class LittleRunWorkflow:
    """Runs one little_es run (workflow id = run id) by interpreting its workflow's IR."""

    def __init__(self) -> None:
        self._run_id = ""
        self._timeouts = StepTimeouts()
        self._input: RunInput | None = None

    @workflow.run
    async def run(self, input: RunInput) -> RunDone:
        """Drive the run to its end; return its output (inline when small)."""
        self._input = input
        self._run_id = input.run_id
        self._timeouts = input.timeouts
        plan: RunPlan = await self._bookkeeping(START_RUN, input, RunPlan)
        if plan.done is not None:
            workflow.logger.info("run %s already completed; nothing runs", input.run_id)
            return plan.done
        try:
            output_path = await self._drive(plan.ir)
        except _GaveUpError as gave_up:
            await self._bookkeeping(
                FAIL_RUN, RunFailure(run_id=self._run_id, step_path=gave_up.step_path), None
            )
            raise ApplicationError(
                f"run {self._run_id!r} failed at step {gave_up.step_path!r}: {gave_up}. Fix the"
                " cause, then start the workflow again with the same run id to resume",
                type="RunFailedError",
                non_retryable=True,
            ) from None
        except VisitLimitError as exc:
            error = ErrorInfo.from_exception(exc, retryable=False)
            await self._bookkeeping(FAIL_RUN, RunFailure(run_id=self._run_id, error=error), None)
            raise ApplicationError(str(exc), type=error.type, non_retryable=True) from None
        done: RunDone = await self._bookkeeping(
            COMPLETE_RUN, RunEnd(run_id=self._run_id, output_step_path=output_path), RunDone
        )
        return done

    # ---------------------------------------------------------------- the walk

    async def _drive(self, ir: WorkflowIR) -> str | None:
        index = {step.id: position for position, step in enumerate(ir.steps)}
        visits: dict[str, int] = {}
        step_id = ir.steps[0].id
        output_path: str | None = None
        while step_id != END:
            step = ir.steps[index[step_id]]
            visit = visits.get(step_id, 0) + 1
            if visit > step.max_visits:
                raise VisitLimitError.for_step(self._run_id, step_id, visit, step.max_visits)
            visits[step_id] = visit
            path = make_step_path(step_id, visit=visit)
            done = await self._step(step, path, visit)
            if step.kind == "decision":
                target = done.next_step
                if target is None or (target != END and target not in index):
                    raise ApplicationError(
                        f"decision {path!r} recorded target {target!r}, which is not a step of"
                        f" workflow {ir.id!r}: the log and the IR disagree",
                        type="WorkflowChangedError",
                        non_retryable=True,
                    )
                step_id = target
            else:
                output_path = path
                position = index[step_id] + 1
                step_id = END if position == len(ir.steps) else ir.steps[position].id
        return output_path

    async def _step(self, step: StepIR, path: str, visit: int) -> StepDone:
        if step.kind == "parallel":
            return await self._parallel(step, path, visit)
        return await self._leaf(step, path)

    async def _leaf(self, step: StepIR, path: str) -> StepDone:
        if step.kind == "subworkflow":
            return await self._subworkflow(step, path)
        heartbeat = self._timeouts.heartbeat
        try:
            done: StepDone = await workflow.execute_activity(
                RUN_STEP,
                StepInput(run_id=self._run_id, step_path=path),
                result_type=StepDone,
                start_to_close_timeout=(
                    self._timeouts.agent_start_to_close
                    if step.kind == "agent"
                    else self._timeouts.step_start_to_close
                ),
                heartbeat_timeout=heartbeat,
                retry_policy=step_retry_policy(step.retry),
                summary=path,
            )
        except ActivityError as exc:
            if _gave_up(exc):
                raise _GaveUpError(path, _describe(exc).message) from exc
            raise
        return done

    async def _parallel(self, step: StepIR, path: str, visit: int) -> StepDone:
        plan: GroupPlan = await self._bookkeeping(
            SCHEDULE_BRANCHES, StepInput(run_id=self._run_id, step_path=path), GroupPlan
        )
        if plan.done is not None:
            return plan.done
        inner = step.branch_step
        assert inner is not None
        limit = asyncio.Semaphore(step.max_concurrency or max(len(plan.branch_keys), 1))

        async def branch(key: str) -> StepDone:
            branch_path = make_step_path(
                inner.id, group_id=step.id, branch_key=key, group_visit=visit
            )
            async with limit:
                return await self._leaf(inner, branch_path)

        results = await asyncio.gather(
            *(branch(key) for key in plan.branch_keys), return_exceptions=True
        )
        for result in results:
            if isinstance(result, BaseException):
                raise result
        done: StepDone = await self._bookkeeping(
            COMPLETE_GROUP, StepInput(run_id=self._run_id, step_path=path), StepDone
        )
        return done

    async def _subworkflow(self, step: StepIR, path: str) -> StepDone:
        step_input = StepInput(run_id=self._run_id, step_path=path)
        while True:
            plan: SubRunPlan = await self._bookkeeping(BEGIN_SUBWORKFLOW, step_input, SubRunPlan)
            if plan.done is not None:
                return plan.done
            assert plan.sub_run_id is not None and plan.workflow_id is not None
            assert plan.workflow_version is not None and plan.ir_hash is not None
            child = RunInput(
                run_id=plan.sub_run_id,
                workflow_id=plan.workflow_id,
                workflow_version=plan.workflow_version,
                ir_hash=plan.ir_hash,
                input=plan.input,
                input_ref=plan.input_ref,
                parent_run_id=self._run_id,
                parent_step_path=path,
                timeouts=self._timeouts,
            )
            try:
                await workflow.execute_child_workflow(
                    LittleRunWorkflow.run,
                    child,
                    id=plan.sub_run_id,
                    static_summary=f"{self._run_id} {path}",
                )
            except ChildWorkflowError as exc:
                failure = SubRunFailure(run_id=self._run_id, step_path=path, error=_describe(exc))
                retry: StepRetry = await self._bookkeeping(FAIL_SUBWORKFLOW, failure, StepRetry)
                if not retry.will_retry:
                    raise _GaveUpError(path, failure.error.message) from exc
                if retry.delay_s > 0:
                    await workflow.sleep(retry.delay_s)
                continue
            done: StepDone = await self._bookkeeping(FINISH_SUBWORKFLOW, step_input, StepDone)
            return done

    # ------------------------------------------------------------------ helpers

    async def _bookkeeping(self, name: str, arg: Any, result_type: type[Any] | None) -> Any:
        return await workflow.execute_activity(
            name,
            arg,
            result_type=result_type,
            start_to_close_timeout=self._timeouts.bookkeeping_start_to_close,
            retry_policy=_BOOKKEEPING_RETRY,
        )

"""The generic Temporal workflow that runs any little_es workflow: :class:`LittleRunWorkflow`.

Its workflow id is the little_es run id. It walks the workflow's IR with the
local scheduler's own walk (:class:`~little_es.engine.walk.Walk`: list order,
decisions' jumps, visit counters and ``max_visits``, step paths), and asks
activities to do everything that touches the world:

* ``start_run`` starts or loads the run and returns the IR to walk (so a
  replay of this workflow reads the IR from history, never from the worker's
  current code);
* each task, decision and agent step is one ``run_step`` activity; its result
  is a small :class:`~little_es_temporal.models.StepDone` (a decision's
  target; an output only when tiny);
* a parallel group is ``schedule_branches`` (its branch keys, resolved from the
  run's data and recorded), the branches gathered (bounded by
  ``max_concurrency``), then ``complete_group``;
* a step whose activity answers ``suspended`` (an orchestrator's
  ``start_workflow`` calls, through the executor's sub-run host) has those
  sub-runs run as child workflows (ids = the reserved sub-run ids), then the
  same step attempt runs again and reads their results from their logs;
* a subworkflow step is a ``run_step`` activity too, through the same sub-run
  host: its first attempt reserves the sub-run id and suspends, the child
  workflow (id = that sub-run id) runs, and the attempt runs again to record
  the child's result (histories from before this, marked by the absence of
  :data:`SUBWORKFLOW_PATCH`, replay the older ``begin_subworkflow`` /
  ``finish_subworkflow`` path);
* ``complete_run`` / ``fail_run`` end the run.

Workflow code must stay deterministic: this module does no I/O, reads no
clock, draws no random numbers and never touches an aggregate. The little_es
modules it uses (the IR models, the walk, the wire models) are
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
from temporalio.exceptions import (
    ActivityError,
    ApplicationError,
    CancelledError,
    ChildWorkflowError,
    TerminatedError,
)
from temporalio.exceptions import TimeoutError as TemporalTimeoutError

with workflow.unsafe.imports_passed_through():
    from little_es import errors as _errors
    from little_es.engine.walk import StepVisit, Walk, branch_path, gather_branches
    from little_es.errors import RuntimeIntegrityError, VisitLimitError, WorkflowChangedError
    from little_es.values import ErrorInfo
    from little_es.workflow.ir import RetryPolicy, StepIR
    from little_es_temporal.errors import (
        ChildWorkflowEndedError,
        ChildWorkflowFailedError,
        refused_failure,
    )
    from little_es_temporal.models import (
        BEGIN_SUBWORKFLOW,
        COMPLETE_GROUP,
        COMPLETE_RUN,
        FAIL_RUN,
        FAIL_SUBWORKFLOW,
        FINISH_SUBWORKFLOW,
        GAVE_UP_MARKER,
        REFUSED_MARKER,
        RUN_STEP,
        SCHEDULE_BRANCHES,
        SIGNAL_NAME,
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
        SubRunStart,
        WaitNotice,
    )

__all__ = [
    "BRANCH_REFUSAL_PATCH",
    "BUDGET_SUB_RUN_PATCH",
    "CHILD_REFUSAL_PATCH",
    "GAVE_UP_FIRST_PATCH",
    "RUN_SUB_RUN_LIMIT_PATCH",
    "STOP_ENDS_WAITS_PATCH",
    "SUBWORKFLOW_PATCH",
    "SUB_RUNS_PATCH",
    "SUB_RUN_LIMIT_PATCH",
    "TIMED_OUT_SUB_RUN_PATCH",
    "WAITS_PATCH",
    "WORKFLOW_TYPE",
    "LittleRunWorkflow",
    "step_retry_policy",
]

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


SUB_RUNS_PATCH = "little_es.step-hosted-sub-runs"
"""The patch id of child workflows a step activity asks for (orchestrator sub-runs)."""

SUB_RUN_LIMIT_PATCH = "little_es.sub-run-max-concurrency"
"""The patch id of a step's child workflows started at most ``max_concurrency`` at once."""

RUN_SUB_RUN_LIMIT_PATCH = "little_es.sub-run-max-concurrency-per-run"
"""The patch id of child workflows started at most ``max_concurrency`` at once in the whole
run, as locally (the steps of a parallel group share the bound), not in each step."""

TIMED_OUT_SUB_RUN_PATCH = "little_es.timed-out-sub-run-fails-its-step"
"""The patch id of a hosted child whose wait timed out, left to its step to fail on (asked
only then, as :data:`BRANCH_REFUSAL_PATCH` is)."""

BUDGET_SUB_RUN_PATCH = "little_es.sub-run-budget-stops-its-parent"
"""The patch id of a hosted child that ran out of budget, left to its step to stop on, so
the parent records ``BudgetExceeded`` as locally (asked only then)."""

BRANCH_REFUSAL_PATCH = "little_es.refusal-cancels-branches"
"""The patch id of a parallel group whose other branches are cancelled when one refuses.

Asked only when a branch refused, so a history records the marker only where the
cancels follow it; one from before replays with every branch run to its end."""

CHILD_REFUSAL_PATCH = "little_es.child-refusal-cancels-branches"
"""The patch id of a parallel group whose other branches are cancelled when one refuses with
the adapter's own refusal (:class:`~little_es_temporal.ChildWorkflowEndedError`,
:class:`~little_es_temporal.ChildWorkflowFailedError`), as for an integrity refusal. Asked
only then; histories from before ran every other branch to its end."""

_CHILD_REFUSALS = frozenset(
    kind.__qualname__ for kind in (ChildWorkflowEndedError, ChildWorkflowFailedError)
)

SUBWORKFLOW_PATCH = "little_es.hosted-subworkflow-steps"
"""The patch id of subworkflow steps run as a step activity through the sub-run host."""

WAITS_PATCH = "little_es.durable-waits"
"""The patch id of a step that waits on a Temporal signal (``wait_for``, ``ask_human``, an
approval)."""

STOP_ENDS_WAITS_PATCH = "little_es.branch-stop-ends-waits"
"""The patch id of a parallel group whose branches waiting on a signal stop waiting once
another branch ended the group with an error (a budget, a cancel, a wait's timeout, retries
run out), and end with that error, as locally (asked only then, as
:data:`BRANCH_REFUSAL_PATCH` is; before it they waited on for their signal)."""

GAVE_UP_FIRST_PATCH = "little_es.gave-up-branch-first"
"""The patch id of a parallel group that ends with a branch out of retries rather than with
another branch's stop (a budget, a cancel) before it in key order, as locally: the run then
records ``RunFailed``. Asked only when two branches or more failed."""

_CHILD_FIELDS = {"workflow_id", "workflow_version", "ir_hash", "input", "input_ref"}
"""What a child run's :class:`RunInput` takes from the :class:`SubRunPlan` as it is."""


class _GaveUpError(Exception):
    def __init__(self, step_path: str, message: str) -> None:
        super().__init__(message)
        self.step_path = step_path


def _gave_up_first(error: BaseException) -> int:
    # gather_branches' rank, asked only when two branches or more failed: a branch out of
    # retries before another's stop, as locally, so the run records its failure (or a
    # resume would run the branch again). Histories from before took the first in key order.
    return 0 if isinstance(error, _GaveUpError) and workflow.patched(GAVE_UP_FIRST_PATCH) else 1


def _gave_up(error: BaseException) -> bool:
    cause = error.cause if isinstance(error, ActivityError) else None
    return (
        isinstance(cause, ApplicationError)
        and bool(cause.details)
        and cause.details[0] == GAVE_UP_MARKER
    )


def _refusal_cancels_branches(error: BaseException) -> bool:
    # The marker stands for a stop too (a budget, a cancel, a wait's timeout), which the
    # other branches see for themselves at their next call, as locally: only an integrity
    # refusal, named by its type, stops them at once.
    refused = refused_failure(error)
    kind = getattr(_errors, refused.type or "", None) if refused is not None else None
    integrity = isinstance(kind, type) and issubclass(kind, RuntimeIntegrityError)
    if integrity:
        return workflow.patched(BRANCH_REFUSAL_PATCH)
    # The adapter's own refusals (a sub-run's child workflow that ended unfinished) are
    # integrity refusals too, named outside little_es.errors.
    return (
        refused is not None
        and refused.type in _CHILD_REFUSALS
        and workflow.patched(CHILD_REFUSAL_PATCH)
    )


def _ended_outside(error: ChildWorkflowError) -> bool:
    # Terminated, cancelled or timed out in Temporal, not failed by an error of its own.
    return isinstance(error.cause, TerminatedError | CancelledError | TemporalTimeoutError)


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
        self._signalled: set[str] = set()
        # The error the first parallel branch to fail ended with, and, once the patch is
        # asked for (a wait open then, or one that starts after), the error every
        # branch waiting ends with too.
        self._failed: BaseException | None = None
        self._stop: BaseException | None = None
        self._waiting = 0
        # One gate per bound, shared by every step of the run that asks with it.
        self._sub_run_gates: dict[int, asyncio.Semaphore] = {}

    @workflow.signal(name=SIGNAL_NAME)
    def signalled(self, wait_id: str) -> None:
        """A little_es signal for ``wait_id`` was recorded in the run's log: wake its wait.

        Sent by :func:`~little_es_temporal.signal_run` (``little signal --temporal``) after
        ``SignalReceived`` is committed; the data is read from the log, not from here.
        """
        self._signalled.add(wait_id)

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
            output_path = await Walk(plan.ir, self._run_id).drive(self._visit)
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
        except WorkflowChangedError as exc:
            raise ApplicationError(
                str(exc), type=type(exc).__qualname__, non_retryable=True
            ) from None
        done: RunDone = await self._bookkeeping(
            COMPLETE_RUN, RunEnd(run_id=self._run_id, output_step_path=output_path), RunDone
        )
        return done

    # ---------------------------------------------------------------- the walk

    async def _visit(self, visit: StepVisit) -> str | None:
        done = await self._step(visit.step, visit.path, visit.visit)
        return done.next_step

    async def _step(self, step: StepIR, path: str, visit: int) -> StepDone:
        if step.kind == "parallel":
            return await self._parallel(step, path, visit)
        return await self._leaf(step, path)

    async def _leaf(self, step: StepIR, path: str) -> StepDone:
        # A subworkflow step goes the way of an orchestrator's sub-runs, through the
        # step executor's sub-run host; histories from before that replay the old path.
        if step.kind == "subworkflow" and not workflow.patched(SUBWORKFLOW_PATCH):
            return await self._subworkflow(step, path)
        hosted: tuple[str, ...] = ()
        hosted_attempt: int | None = None
        hosted_failures: dict[str, ErrorInfo] = {}
        while True:
            done = await self._run_step(step, path, hosted, hosted_attempt, hosted_failures)
            if done.waiting:
                # Histories from before durable waits never reach here; the patch marks
                # the ones that do.
                workflow.patched(WAITS_PATCH)
                await self._wait(done.waiting)
                continue
            if not done.suspended:
                return done
            # The step waits for sub-runs (an orchestrator's start_workflow calls):
            # histories from before this existed never reach here, the patch marks
            # the ones that do.
            workflow.patched(SUB_RUNS_PATCH)
            hosted_failures = await self._host(done.suspended)
            hosted = tuple(start.run_id for start in done.suspended)
            hosted_attempt = done.attempt

    async def _run_step(
        self,
        step: StepIR,
        path: str,
        hosted: tuple[str, ...],
        hosted_attempt: int | None,
        hosted_failures: dict[str, ErrorInfo],
    ) -> StepDone:
        heartbeat = self._timeouts.heartbeat
        try:
            done: StepDone = await workflow.execute_activity(
                RUN_STEP,
                StepInput(
                    run_id=self._run_id,
                    step_path=path,
                    hosted=hosted,
                    hosted_attempt=hosted_attempt,
                    hosted_failures=hosted_failures,
                ),
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

    async def _wait(self, waits: tuple[WaitNotice, ...]) -> None:
        """Wait for the Temporal signal of one of ``waits``, or for the first deadline.

        Either way the step runs again: it reads the signal's data from the log, or
        records the timeout (``WaitTimedOut``) when its deadline passed first.
        """
        deadlines = [w.deadline for w in waits if w.deadline is not None]
        timeout = None
        if deadlines:
            # Deadlines are wall-clock times in the log; workflow.now() is deterministic.
            timeout = max((min(deadlines) - workflow.now()).total_seconds(), 0.0) + 0.05
        ids = {w.wait_id for w in waits}
        if self._failed is not None:
            self._end_waits()
        self._waiting += 1
        try:
            await workflow.wait_condition(
                lambda: bool(ids & self._signalled) or self._stop is not None,
                timeout=None if timeout is None else timedelta(seconds=timeout),
            )
        except TimeoutError:
            workflow.logger.info("run %s: a wait's deadline passed", self._run_id)
        finally:
            self._waiting -= 1
        if self._stop is not None:
            # Another branch ended the group (see _parallel): locally this branch's wait
            # ends at once with the walk, and the run stops with that branch's error.
            raise self._stop

    def _end_waits(self) -> None:
        """End every wait with the error a parallel branch failed with (:attr:`_failed`).

        Asked only when a wait is open as a branch fails, or starts after: histories
        from before this waited on, and the patch marks the ones that do not; a history
        with no such wait gets no marker.
        """
        if self._stop is None and workflow.patched(STOP_ENDS_WAITS_PATCH):
            self._stop = self._failed

    async def _host(self, starts: tuple[SubRunStart, ...]) -> dict[str, ErrorInfo]:
        """Run each sub-run as a child workflow (id = sub-run id) and wait for them all.

        At most the smallest ``max_concurrency`` among ``starts`` run at once in the
        whole run (``start_workflow_tool``'s bound per parent run, as the local engine
        applies it: the branches of a parallel group share it); none given: all at
        once. A child that failed is left to the step, run again, to read from the
        child's log; a refusal (or a stop) is the run's: nothing more runs. Returns the
        children that failed by an error of their own (not terminated, cancelled or
        timed out in Temporal), with that error, for the step to tell from those ended
        outside little_es.
        """
        failures: dict[str, ErrorInfo] = {}

        async def child(start: SubRunStart) -> None:
            arg = RunInput(
                **start.model_dump(include=_CHILD_FIELDS),
                run_id=start.run_id,
                parent_run_id=self._run_id,
                parent_step_path=start.parent_step_path,
                timeouts=self._timeouts,
            )
            try:
                await workflow.execute_child_workflow(
                    LittleRunWorkflow.run,
                    arg,
                    id=start.run_id,
                    static_summary=f"{self._run_id} {start.parent_step_path}",
                )
            except ChildWorkflowError as exc:
                refused = refused_failure(exc)
                if refused is not None:
                    if refused.type == "WaitTimedOutError" and workflow.patched(
                        TIMED_OUT_SUB_RUN_PATCH
                    ):
                        # Every resume of the child stops so: the step, run again, reads
                        # the timeout from its log as its failure (SubRunTimedOutError).
                        return
                    if refused.type == "BudgetExceededError" and workflow.patched(
                        BUDGET_SUB_RUN_PATCH
                    ):
                        # The step, run again, reads the stop from the child's log and
                        # records it as the parent's own outcome, as locally.
                        return
                    raise ApplicationError(
                        refused.message, REFUSED_MARKER, type=refused.type, non_retryable=True
                    ) from None
                if not _ended_outside(exc):
                    failures[start.run_id] = _describe(exc)

        limits = [s.max_concurrency for s in starts if s.max_concurrency is not None]
        by_key = {str(n): start for n, start in enumerate(starts)}
        # Histories from before the bound started every child at once, and then, until
        # it was the run's, bounded each step's children alone; each patch marks the
        # histories that start them its way (only when there is a bound, so hosts
        # without one keep their histories as they were).
        if limits and workflow.patched(RUN_SUB_RUN_LIMIT_PATCH):
            bound = min(limits)
            gate = self._sub_run_gates.setdefault(bound, asyncio.Semaphore(bound))

            async def gated(key: str) -> None:
                async with gate:
                    await child(by_key[key])

            await gather_branches(list(by_key), None, gated)
            return failures
        if limits and workflow.patched(SUB_RUN_LIMIT_PATCH):

            async def keyed(key: str) -> None:
                await child(by_key[key])

            await gather_branches(list(by_key), min(limits), keyed)
            return failures
        await asyncio.gather(*(child(start) for start in starts))
        return failures

    async def _parallel(self, step: StepIR, path: str, visit: int) -> StepDone:
        try:
            plan: GroupPlan = await self._bookkeeping(
                SCHEDULE_BRANCHES, StepInput(run_id=self._run_id, step_path=path), GroupPlan
            )
        except ActivityError as exc:
            if _gave_up(exc):
                raise _GaveUpError(path, _describe(exc).message) from exc
            raise
        if plan.done is not None:
            return plan.done
        inner = step.branch_step
        assert inner is not None

        async def branch(key: str) -> StepDone:
            try:
                return await self._leaf(inner, branch_path(step, key, visit))
            except Exception as exc:
                # The group ends with an error: branches that wait for a signal stop
                # waiting, as locally.
                if self._failed is None:
                    self._failed = exc
                    if self._waiting:
                        self._end_waits()
                raise

        await gather_branches(
            plan.branch_keys,
            step.max_concurrency,
            branch,
            stops_all=_refusal_cancels_branches,
            rank=_gave_up_first,
        )
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
            # The plan names the child run and its workflow; a field it left None
            # fails validation here.
            assert plan.sub_run_id is not None
            child = RunInput(
                **plan.model_dump(include=_CHILD_FIELDS),
                run_id=plan.sub_run_id,
                parent_run_id=self._run_id,
                parent_step_path=path,
                timeouts=self._timeouts,
            )
            try:
                await workflow.execute_child_workflow(
                    LittleRunWorkflow.run,
                    child,
                    id=child.run_id,
                    static_summary=f"{self._run_id} {path}",
                )
            except ChildWorkflowError as exc:
                refused = refused_failure(exc)
                if refused is not None:
                    # Nothing is recorded for a refusal, in the child or here: the
                    # step stays in flight and resumes once the cause is fixed.
                    raise ApplicationError(
                        refused.message,
                        REFUSED_MARKER,
                        type=refused.type,
                        non_retryable=True,
                    ) from None
                failure = SubRunFailure(
                    run_id=self._run_id,
                    step_path=path,
                    error=_describe(exc),
                    ended_outside=_ended_outside(exc),
                )
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

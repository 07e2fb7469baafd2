"""The activity interceptor that makes each step activity follow little_es's durability protocol.

Around every ``little_es.run_step`` activity, :class:`LittleInterceptor`:

1. takes the step's lease (:func:`~little_es.ids.step_lease_id`), so two
   attempts of one step never run at once (an attempt that Temporal gave up
   on after a heartbeat timeout may still be running on a live but stalled
   worker; the new attempt waits, retried by Temporal, until it has finished,
   or until ``little unlock RUN_ID --force`` takes the lease from it). The
   step's code, each of its model and tool calls and each append check that
   lease first, as on the local engine: an attempt that lost it stops with
   :class:`~little_es.errors.LeaseLostError`, retryably, recording nothing;
2. returns the recorded result, without running anything, when the step
   already has a committed ``StepCompleted`` (a terminated workflow started
   again with the same run id, a reset, a duplicate delivery);
3. otherwise commits ``StepStarted`` for the next attempt, or continues the
   attempt in flight when a worker died mid-step: a crash is not a failure,
   so an agent step resumes the same harness session, which fast-forwards
   every committed model and tool call and re-runs only the one in flight;
4. runs the step's code (the activity body), heartbeating in the background
   every third of the activity's ``heartbeat_timeout``;
5. commits ``StepCompleted``, or ``StepFailed`` and raises an
   ``ApplicationError`` that is retryable with the step's own backoff
   (``next_retry_delay``) while its ``RetryPolicy`` allows another attempt,
   and non-retryable once it does not. A
   :class:`~little_es.errors.RuntimeIntegrityError` (the step's harness
   session disagrees with the log, a sub-run refused) is a refusal: nothing is
   committed, and the activity fails non-retryably (so does the workflow),
   leaving the attempt in flight for a resume once the cause is fixed.

Steps 2, 3 and 5 are the engine's :class:`~little_es.engine.executor.StepExecutor`,
the same code the local scheduler runs, so the log cannot tell the engines
apart. Around every little_es activity, the interceptor also maps what it
raises to Temporal's ``ApplicationError``, in this one place
(:func:`~little_es_temporal.errors.to_application_error`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Awaitable, Callable, Iterator
from datetime import timedelta
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError
from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput, Interceptor

from little_es.engine.executor import Committed, HostedRun
from little_es.errors import ConcurrentRunError, RunWaitingError, StepSuspendedError
from little_es.ids import step_lease_id
from little_es.logging import get_logger
from little_es.values import MAX_ERROR_MESSAGE
from little_es.workflow.authoring import SubworkflowStep, WaitStep
from little_es.world import World
from little_es_temporal.activities import (
    CURRENT_STEP,
    LittleActivities,
    StepCall,
    TemporalSubRunHost,
    done_from_fold,
)
from little_es_temporal.errors import TemporalAdapterError, gave_up_error, to_application_error
from little_es_temporal.models import ACTIVITY_NAMES, RUN_STEP, StepDone, StepInput, WaitNotice
from little_es_temporal.stream import TemporalRunWriter

__all__ = ["LittleInterceptor", "StepBusyError", "run_step_durably"]

_log = get_logger()

_STEP_KINDS = ("task", "agent", "decision", "subworkflow", "wait")


class StepBusyError(ConcurrentRunError):
    """Another attempt of the same step is still running; Temporal retries this one later."""


class LittleInterceptor(Interceptor):
    """A ``temporalio.worker.Interceptor`` that records little_es step events around steps.

    Give it the :class:`~little_es_temporal.activities.LittleActivities`
    registered on the same worker (``create_worker`` wires both).
    """

    def __init__(self, activities: LittleActivities) -> None:
        if not isinstance(activities, LittleActivities):
            raise TemporalAdapterError(
                "LittleInterceptor needs the LittleActivities registered on the same worker,"
                f" got {type(activities).__name__}"
            )
        self.activities = activities

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        """Wrap the activity chain; only little_es's own activities are touched."""
        return _LittleInbound(next, self.activities)


class _LittleInbound(ActivityInboundInterceptor):
    def __init__(self, next: ActivityInboundInterceptor, activities: LittleActivities) -> None:
        super().__init__(next)
        self._activities = activities

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        name = activity.info().activity_type
        if name not in ACTIVITY_NAMES:
            return await self.next.execute_activity(input)
        try:
            if name != RUN_STEP:
                return await self.next.execute_activity(input)
            if len(input.args) != 1 or not isinstance(input.args[0], StepInput):
                raise ApplicationError(
                    f"{RUN_STEP} takes one StepInput, got {list(map(type, input.args))}: start"
                    " runs with little_es_temporal.start_run and a client using the pydantic"
                    " data converter",
                    type=TemporalAdapterError.__qualname__,
                    non_retryable=True,
                )
            return await run_step_durably(
                self._activities, input.args[0], lambda: self.next.execute_activity(input)
            )
        except ApplicationError:
            raise
        except Exception as exc:
            raise to_application_error(exc) from exc


@contextlib.contextmanager
def _step_lease(world: World, run_id: str, step_path: str) -> Iterator[None]:
    try:
        lease = world.run_lease(
            step_lease_id(run_id, step_path), what=f"step {step_path!r} of run {run_id!r}"
        )
        lease.__enter__()
    except ConcurrentRunError as exc:
        raise StepBusyError(
            f"step {step_path!r} of run {run_id!r} is still being executed by an earlier attempt"
            " (a worker that missed its heartbeats but is alive): Temporal retries this attempt"
            " once it has finished"
        ) from exc
    try:
        yield
    finally:
        lease.__exit__(None, None, None)


def _start_heartbeat() -> asyncio.Task[None] | None:
    timeout = activity.info().heartbeat_timeout
    if not timeout:
        return None
    interval = max(timeout.total_seconds() / 3, 0.05)

    async def beat() -> None:
        # The first beat after one interval: a step shorter than that costs no RPC.
        while True:
            await asyncio.sleep(interval)
            activity.heartbeat()

    return asyncio.create_task(beat(), name="little_es heartbeat")


async def run_step_durably(
    activities: LittleActivities, step_input: StepInput, body: Callable[[], Awaitable[Any]]
) -> StepDone:
    """Run one step activity under the durability protocol (see the module docstring).

    ``body`` runs the step's code once :data:`CURRENT_STEP` holds its context.
    When Temporal cancels the activity because the run was cancelled
    (:func:`~little_es_temporal.cancel_run` records ``RunCancelled`` before it
    cancels the workflow), the step is not cut off mid-call: it goes on as on
    the local engine, a task step to its result (recorded), an agent step to
    its next model or tool call, where it sees the cancellation and stops.
    """
    work = asyncio.ensure_future(_run_step(activities, step_input, body))
    try:
        return await asyncio.shield(work)
    except asyncio.CancelledError:
        if work.done() and not activity.is_cancelled():
            # The step's own code raised it, nobody cancelled the activity: locally it
            # reaches the caller with the step in flight; retried here, it would be for
            # ever. The run stops instead, the step in flight, nothing recorded.
            raise ApplicationError(
                f"step {step_input.step_path!r} of run {step_input.run_id!r} raised"
                " asyncio.CancelledError though nothing cancelled it: the step stays in"
                " flight; fix the step, then start the workflow again with the same run id",
                type="CancelledError",
                non_retryable=True,
            ) from None
        cancelled = not work.done() and _cancelled_in_log(activities, step_input.run_id)
        if not cancelled:
            # A worker shutting down, a lost attempt: stop now, as before.
            work.cancel()
        with contextlib.suppress(BaseException):
            await work
        raise


def _cancelled_in_log(activities: LittleActivities, run_id: str) -> bool:
    # A sub-run's child workflow is cancelled with its parent's: a cancelled parent
    # counts, and the step goes on to where it sees that (check_parents_stopped).
    recorder = activities.runs.recorder(run_id)
    if recorder is None:
        return False
    writer = TemporalRunWriter(activities.runs, activities.world, run_id)
    parents = (fold for _, fold in writer.parents())
    return any(fold.status == "cancelled" for fold in (recorder.fold, *parents))


async def _run_step(
    activities: LittleActivities, step_input: StepInput, body: Callable[[], Awaitable[Any]]
) -> StepDone:
    heartbeat = _start_heartbeat()
    try:
        with _step_lease(activities.world, step_input.run_id, step_input.step_path):
            executor, begun = await activities.begin_step(step_input, kinds=_STEP_KINDS)
            if isinstance(begun, Committed):
                return done_from_fold(begun.step, executed=False)
            step = begun.step
            if begun.ctx is None:
                raise TemporalAdapterError(f"step {begun.step_path!r} was not started")
            if begun.in_flight:
                _log.info(
                    "step continues after a crash",
                    run_id=step_input.run_id,
                    step_path=begun.step_path,
                    attempt=begun.attempt,
                    temporal_attempt=activity.info().attempt,
                )
            hosted = step_input.hosted
            if step_input.hosted_attempt not in (None, begun.attempt):
                # A later attempt than the one its sub-runs just ran for: they run again.
                hosted = ()
            host = TemporalSubRunHost(activities, hosted, step_input.hosted_failures)
            executor.host = host
            if isinstance(step, (SubworkflowStep, WaitStep)):
                # No code of the user's: the executor reserves the sub-run and hosts it,
                # or records the wait (or reads the signal that came).
                token = CURRENT_STEP.set(None)
                work: Callable[[], Awaitable[Any]] = functools.partial(executor.execute, begun)
            else:
                token = CURRENT_STEP.set(StepCall(activities.world, step, begun.ctx))
                work = body
            try:
                outcome = await executor.attempt(begun, work)
            except RunWaitingError as waiting:
                # The wait is recorded (RunWaiting): the workflow waits on a Temporal
                # signal, then runs the same attempt again, which reads the signal's data.
                waits = executor.writer.read().waits
                notices = tuple(
                    WaitNotice(wait_id=wait_id, signal=name, deadline=waits[wait_id].deadline)
                    for name, _, wait_id in waiting.waits
                    if wait_id in waits
                )
                if not notices:
                    # Another run waits (a run the step drove itself): this one stops, its
                    # step in flight, as locally; a wait of none would read as the step done.
                    raise
                return StepDone(step_path=begun.step_path, attempt=begun.attempt, waiting=notices)
            except StepSuspendedError as suspended:
                # Sub-runs to host as child workflows; the attempt stays in flight.
                starts = tuple(
                    host.start(run) for run in suspended.runs if isinstance(run, HostedRun)
                )
                if not starts:
                    raise TemporalAdapterError(
                        f"step {begun.step_path!r} of run {step_input.run_id!r} raised"
                        " StepSuspendedError with no sub-run to host: it is the engine's own"
                        " signal, not one for a step's code to raise"
                    ) from suspended
                return StepDone(step_path=begun.step_path, attempt=begun.attempt, suspended=starts)
            finally:
                CURRENT_STEP.reset(token)
            settled = await executor.settle(begun, outcome)
            if isinstance(settled, Committed):
                return done_from_fold(settled.step, executed=True)
            error = settled.error
            message = (
                f"step {begun.step_path!r} of run {step_input.run_id!r} failed (attempt"
                f" {begun.attempt}): {error.type}: {error.message}"
            )
            # The step's exception as the cause, for Temporal's view of the failure, unless
            # it could not carry it: its message is in ``message`` already, cut as recorded.
            cause = outcome.exception
            if cause is not None and not _carried(cause):
                cause = None
            if settled.will_retry:
                raise ApplicationError(
                    message,
                    type=error.type,
                    next_retry_delay=timedelta(seconds=max(settled.delay_s, 0.001)),
                ) from cause
            raise gave_up_error(message, error) from cause
    finally:
        if heartbeat is not None:
            heartbeat.cancel()


def _carried(exc: BaseException) -> bool:
    """Whether a failure can carry ``exc`` as its cause: its ``str()`` works and is not cut
    (a message of a few megabytes, twice in a failure, is more than Temporal takes)."""
    try:
        return len(str(exc)) <= MAX_ERROR_MESSAGE
    except Exception:
        return False

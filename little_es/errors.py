"""Every public exception of little_es, and how they relate.

Every error a user can meet derives from :class:`LittleEsError`, and each
one's message says what happened and what to do about it. Catch a branch to
handle a family::

    LittleEsError
    ├── InvalidRunIdError (ValueError)       a run id is not 1-128 of [A-Za-z0-9_.-]
    ├── WorldConfigError (ValueError)        a world URL or data directory is unusable
    ├── RunNotFoundError (LookupError)       no run with this id in the world
    ├── ForkError (ValueError)               an unusable fork_run argument
    │   ├── ForkPointError                   the fork point names no step the origin completed
    │   └── ForkRunExistsError               the fork's run id is taken
    ├── OuterLoopNotFoundError (LookupError) no outer loop with this id in the world
    ├── OuterLoopRequestError (ValueError)   an unusable run_outer_loop argument
    ├── LoggingConfigError (ValueError)      a log level or LITTLE_ES_LOG_* value
    ├── PricingError (ValueError)            a price or a pricing argument
    ├── WorkflowRefError (ValueError)        a `module:attribute` that names no Workflow
    ├── SessionInputError (ValueError)       an unusable agent-session argument
    ├── RunRequestError (TypeError)          run_workflow given no World, Workflow or mapping
    ├── ModelConfigError (ValueError)        a model built with invalid arguments
    ├── OutputNotSerializableError (TypeError)  a step output that is not JSON
    ├── UnstorableEventError (TypeError)     not a little_es event, or one with no wire name
    ├── EventLogError                        a stored event cannot be read
    │   ├── UnknownEventTypeError (LookupError)
    │   └── EventPayloadError (ValueError)
    ├── AggregateArgumentError (TypeError)   ctx.aggregates given no eventsourcing aggregate
    ├── AggregateNotFoundError (LookupError) ctx.aggregates.get of an id with no events
    ├── AggregateConflictError               another writer changed a step's aggregate first
    ├── ConcurrencyConflictError             another writer appended first
    │   └── ConcurrentRunError               another process drives this run
    │       └── DrivenElsewhereError         ... or a sub-run or session of it
    ├── RunsProjectionError                  the runs read model cannot catch up
    ├── RunStateError                        the log is not where a protocol step needs it
    ├── ArtifactError
    │   ├── ArtifactNotFoundError (LookupError)
    │   └── ArtifactIntegrityError
    ├── ExportFormatError (ValueError)       not a whole, unchanged `little export` stream
    │   ├── ExportTruncatedError             the stream ends before its trailer
    │   └── ExportVersionError               a format version this little_es cannot read
    ├── ImportConflictError                  the target world already holds an exported stream
    ├── WorkflowDefinitionError (ValueError) an invalid workflow definition
    │   ├── InvalidStepPathError
    │   ├── UnknownStepError (LookupError)
    │   ├── InvalidBranchSetError
    │   └── VisitLimitError                  (also a StepExecutionError)
    ├── StepExecutionError                   a step or the run stopped
    │   ├── VisitLimitError
    │   ├── RunFailedError                   retries ran out; resume once fixed
    │   │   └── SubRunTimedOutError          a sub-run's wait timed out: its step's failure
    │   ├── ReplayedFailureError             a recorded failure, raised again as it was
    │   ├── TurnLimitExceededError
    │   ├── AgentUsageError                  a Pydantic AI agent refused how it is built
    │   ├── SubRunFailedError
    │   ├── OrchestratorContextError
    │   ├── PlannerAnswerError               an outer loop's planner did not answer a decision
    │   └── EngineUnsupportedError           a step or tool cannot run on this engine
    ├── RunStoppedError                      the run was stopped on purpose; resumable
    │   ├── RunCancelledError                `little cancel` / cancel_run
    │   ├── BudgetExceededError              the next model call would start past a budget
    │   ├── ModelUnavailableError            the model's provider kept failing: resume later
    │   ├── RunWaitingError                  the run waits for a signal (a person, a system)
    │   └── WaitTimedOutError                a wait's deadline passed before its signal came
    ├── SignalError (ValueError)             a signal the run cannot take; nothing recorded
    │   ├── SignalDataError                  its data does not validate against the model
    │   ├── NoSuchWaitError (LookupError)    the run does not wait for this signal
    │   ├── SignalConsumedError              a duplicate: the wait took another signal first
    │   └── StaleApprovalError               an approval of another action (digest)
    ├── RuntimeIntegrityError                the log and the code disagree: nothing runs
    │   ├── WorkflowChangedError
    │   ├── ArtifactMismatchError
    │   ├── ParallelReplayMismatchError
    │   ├── CapabilityDriftError
    │   ├── RunInputMismatchError
    │   ├── OuterLoopMismatchError           a loop resumed with other settings than its own
    │   ├── ConversationDivergedError
    │   ├── LogTamperedError                 a stream's hash chain is broken
    │   ├── WorldIntegrityError              the database is not this world's
    │   └── LeaseLostError                   this process no longer holds the run's lease
    ├── WorldStorageError                    the database failed a read or a commit: resume later
    ├── StepSuspendedError                   not a failure: the attempt waits for sub-runs
    ├── ModelError                           a model provider call failed
    ├── MissingExtraError (ImportError)      an integration's optional extra is not installed
    └── ToolError
        ├── ToolArgumentsError (ValueError)
        └── ApprovalDeniedError              a person declined a tool call (shown to the model)

The Temporal adapter's own errors (``little_es_temporal.errors``) derive from
:class:`LittleEsError` too.
"""

from __future__ import annotations

from little_es.values import ErrorInfo

# -------------------------------------------------------------- the base


class LittleEsError(Exception):
    """Base class of every little_es error."""


# ------------------------------------------- bad input and configuration


class InvalidRunIdError(LittleEsError, ValueError):
    """A run id is not a string of 1-128 letters, digits, ``_``, ``-`` or ``.``."""


class WorldConfigError(LittleEsError, ValueError):
    """A world URL or data directory cannot be used."""


class RunNotFoundError(LittleEsError, LookupError):
    """No run with this id exists in the world."""

    def __init__(self, run_id: str, world: str) -> None:
        self.run_id = run_id
        self.world = world
        super().__init__(
            f"run {run_id!r} not found in world {world}: check the run id (`little runs` lists"
            " them) and the world (--world or LITTLE_ES_WORLD)"
        )


class ForkError(LittleEsError, ValueError):
    """A :func:`~little_es.fork.fork_run` argument cannot be used (nothing was written)."""


class ForkPointError(ForkError):
    """The fork point is not a step path, or names no step (or turn) the origin completed;
    the message lists the points the run can be forked at."""


class ForkRunExistsError(ForkError):
    """The run id asked for the fork is the id of a run that exists."""


class OuterLoopNotFoundError(LittleEsError, LookupError):
    """No outer loop with this id exists in the world."""

    def __init__(self, outer_loop_id: str, world: str) -> None:
        self.outer_loop_id = outer_loop_id
        self.world = world
        super().__init__(
            f"outer loop {outer_loop_id!r} not found in world {world}: check the id (`little"
            " loops` lists them) and the world (--world or LITTLE_ES_WORLD)"
        )


class OuterLoopRequestError(LittleEsError, ValueError):
    """An outer loop was asked for with an argument it cannot take (see the message)."""


class LoggingConfigError(LittleEsError, ValueError):
    """A log level or ``LITTLE_ES_LOG_*`` environment value is not one little_es understands."""


class PricingError(LittleEsError, ValueError):
    """A pricing call got an invalid argument: empty name, negative price, inconsistent usage."""


class WorkflowRefError(LittleEsError, ValueError):
    """A ``module:attribute`` reference does not name a Workflow."""


class SessionInputError(LittleEsError, ValueError):
    """An argument of a harness session (model, tools, prompt, parameters, ...) is unusable."""


class RunRequestError(LittleEsError, TypeError):
    """``run_workflow`` was given something that is not a World, a Workflow, a mapping input
    or a Budget."""


class ModelConfigError(LittleEsError, ValueError):
    """A model was constructed with invalid arguments (empty id, conflicting options, ...)."""


class MissingExtraError(LittleEsError, ImportError):
    """An integration (``little_es.contrib.*``) was imported without its optional extra; the
    message names the extra to install."""


class OutputNotSerializableError(LittleEsError, TypeError):
    """A step returned a value that cannot be stored as JSON."""


class UnstorableEventError(LittleEsError, TypeError):
    """The world's mapper was given an event it cannot store.

    Not a :class:`little_es.events.Event` (an eventsourcing ``DomainEvent`` of
    another application, say), or an ``Event`` subclass without a
    ``wire_name``: a world stores its own events only, each under its wire name.
    """


class AggregateArgumentError(LittleEsError, TypeError):
    """``ctx.aggregates`` was given something other than an eventsourcing aggregate (class)
    and a UUID, or a step's aggregates are not available on this engine."""


class AggregateNotFoundError(LittleEsError, LookupError):
    """``ctx.aggregates.get`` of an aggregate id with no events in the world."""


class AggregateConflictError(LittleEsError):
    """Another writer changed an aggregate a step changed, after the step read it.

    Nothing of the step's commit was written; the attempt is recorded as a
    retryable ``StepFailed`` and the next attempt (the step's ``RetryPolicy``)
    reads the aggregate afresh. Not a :class:`ConcurrencyConflictError`: that
    one means another writer of the run's own stream, which the engine decides
    again on its own.
    """

    retryable = True


# -------------------------------------------------------- the stored log


class EventLogError(LittleEsError):
    """A stored event cannot be read: unknown type, malformed payload, or tampered log."""


class UnknownEventTypeError(EventLogError, LookupError):
    """A stored event names an event type (topic) that no loaded class registers."""


class EventPayloadError(EventLogError, ValueError):
    """A stored or new event's payload does not validate against its schema."""


class ConcurrencyConflictError(LittleEsError):
    """Another writer appended to the same stream first (optimistic concurrency)."""


class ConcurrentRunError(ConcurrencyConflictError):
    """Another process is making progress on this run; this one stopped without running anything."""


class DrivenElsewhereError(ConcurrentRunError):
    """Another process drives a part of this run: a sub-run one of its steps (or
    ``start_workflow`` calls) hosts, or a step's harness session.

    Raised by little_es itself, never recorded as the step's or the call's failure: the
    run stops with it in flight, and a resume once that process has stopped continues
    it. (The same error from a step's own code, a ``run_workflow`` it calls, is a
    :class:`ConcurrentRunError`, the step's failure like any other.)
    """


class RunsProjectionError(LittleEsError):
    """The runs read model cannot be brought up to date (unreadable event, refused position)."""


class RunStateError(LittleEsError):
    """The run's log is not in the state a step of the protocol needs (asked out of order)."""

    retryable = False


# ------------------------------------------------------------- artifacts


class ArtifactError(LittleEsError):
    """An artifact is missing, or its bytes do not match its recorded sha256."""


class ArtifactNotFoundError(ArtifactError, LookupError):
    """No artifact with this id is stored."""


class ArtifactIntegrityError(ArtifactError):
    """An artifact's stored bytes do not hash to the sha256 its reference records."""


# ------------------------------------------------------ moving a world


class ExportFormatError(LittleEsError, ValueError):
    """A ``little export`` stream is malformed, or its lines were changed, added or moved.

    The message names the line. Nothing was written to the target world.
    """


class ExportTruncatedError(ExportFormatError):
    """A ``little export`` stream ends before its trailer (cut off in transit or on disk)."""


class ExportVersionError(ExportFormatError):
    """A ``little export`` stream in a format version this little_es does not read."""


class ImportConflictError(LittleEsError):
    """The target world already holds a stream the export carries; nothing was written."""


# -------------------------------------------------- workflow definitions


class WorkflowDefinitionError(LittleEsError, ValueError):
    """A workflow definition is invalid (duplicate step ids, unknown jump target, ...)."""


class InvalidStepPathError(WorkflowDefinitionError):
    """A step path, or one of the parts it is built from, does not follow the step path grammar."""


class UnknownStepError(WorkflowDefinitionError, LookupError):
    """A step id (asked for, or returned by a decision) is not a step of the workflow."""


class InvalidBranchSetError(WorkflowDefinitionError):
    """A parallel group's ``branches`` function returned something that is not a branch set."""


# -------------------------------------------------------- step execution


class StepExecutionError(LittleEsError):
    """A step failed and its retries are exhausted; the run is recorded as failed."""


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


class SubRunTimedOutError(RunFailedError):
    """A sub-run's wait timed out: the failure of the step that hosts it (a subworkflow step,
    an orchestrator's ``start_workflow`` call), on either engine.

    Not a stop that holds the parent's step in flight: every resume of the sub-run would
    stop the same way. Not retryable, for the same reason: fork the sub-run, or change the
    parent, to try again.
    """

    retryable = False

    def __init__(self, stop: WaitTimedOutError) -> None:
        super().__init__(
            stop.run_id,
            stop.step_path,
            ErrorInfo(type=type(stop).__name__, message=str(stop), retryable=False),
        )


class ReplayedFailureError(StepExecutionError):
    """A failure answered from the log, raised again on resume as it was recorded.

    A Pydantic AI tool call recorded as failed raises this where the tool raised:
    the step's failure is then the recorded one (its type, message and whether it is
    retryable, :attr:`recorded_error`), exactly as when the tool first raised.
    """

    def __init__(self, error: ErrorInfo) -> None:
        super().__init__(f"{error.type}: {error.message}")
        self.recorded_error = error
        self.retryable = error.retryable


class TurnLimitExceededError(StepExecutionError):
    """The model was still calling tools after ``max_turns`` model calls.

    Nothing is recorded for the calls the last response asked for, and the
    session is not marked completed. Not retryable: the same attempt would
    stop at the same place; tighten the prompt, or raise ``max_turns`` in a new
    run (``max_turns`` is part of the agent's manifest, so a resume of this run
    with another one is a :class:`CapabilityDriftError`).
    """

    retryable = False


class AgentUsageError(StepExecutionError):
    """A Pydantic AI agent step stopped on Pydantic AI's ``UserError``: the agent cannot
    run as it is built (a deferred tool call with no ``DeferredToolRequests`` among its
    output types, say). Not retryable: each attempt would be a new session that pays
    again for every request before the same refusal and runs its tool calls again; fix
    the agent and start a new run (a resume with a changed agent is a
    :class:`CapabilityDriftError`).
    """

    retryable = False


class SubRunFailedError(StepExecutionError):
    """A sub-run started by ``start_workflow`` failed; the tool call fails with this error.

    The orchestrator's model sees it as the call's result and decides what to
    do. The sub-run's failure is recorded in its own log; it can be resumed.
    """

    def __init__(self, sub_run_id: str, step_path: str | None, error: ErrorInfo) -> None:
        self.sub_run_id = sub_run_id
        self.step_path = step_path
        self.error = error
        self.retryable = error.retryable
        super().__init__(
            f"sub-run {sub_run_id!r} failed at step {step_path!r}: {error.type}: {error.message}"
        )


class OrchestratorContextError(StepExecutionError):
    """``start_workflow`` ran outside an agent step of an engine (``run_workflow``, a
    Temporal worker), or without its recorded ``sub_run_id``; it cannot reserve a sub-run
    there."""

    retryable = False


class PlannerAnswerError(StepExecutionError):
    """An outer loop's planner answered something that is not a :class:`PlannerDecision`."""

    retryable = False


class EngineUnsupportedError(StepExecutionError):
    """A step or tool of the workflow declares ``engines=[...]`` without the engine it is
    started on. Raised before the run's first event is appended: nothing is recorded."""

    retryable = False


class StepSuspendedError(LittleEsError):
    """A step attempt waits for sub-runs that its engine hosts outside this process.

    Not a failure and not a stop: nothing is recorded for it, the attempt stays
    in flight. The Temporal adapter raises it from a step activity whose
    ``subworkflow`` step or ``start_workflow`` calls need sub-runs that have
    not finished; the workflow starts them as child workflows, waits, then runs
    the same attempt again, which finds their results in their logs. ``runs``
    are the :class:`~little_es.engine.executor.HostedRun` requests.
    """

    def __init__(self, runs: tuple[object, ...]) -> None:
        self.runs = runs
        super().__init__(
            f"the step waits for {len(runs)} sub-run(s) hosted by its engine; it runs again"
            " once they finished"
        )


# ------------------------------------------- stopped on purpose: resumable


class RunStoppedError(LittleEsError):
    """The run was stopped (cancelled, out of budget, waiting, its model's provider not
    answering), not by a failure.

    Nothing of the work it interrupted is recorded as a failure: no
    ``StepFailed``, no retry spent, the step in flight stays in flight (an agent
    step keeps its harness session), so a resume continues where it stopped.
    """

    retryable = False

    def __init__(self, run_id: str, message: str) -> None:
        self.run_id = run_id
        super().__init__(message)


class RunCancelledError(RunStoppedError):
    """The run was cancelled (``RunCancelled`` is in its log); its driver stopped.

    Raised by the driver that notices the cancellation (before its next step,
    model call or tool call) and by ``run_workflow`` asked to resume a
    cancelled run without ``resume_cancelled=True``.
    """

    def __init__(self, run_id: str, reason: str | None, *, resuming: bool = False) -> None:
        self.reason = reason
        why = f" ({reason})" if reason else ""
        if resuming:
            message = (
                f"run {run_id!r} was cancelled{why}: it is not resumed by accident; to continue"
                " it, pass resume_cancelled=True to run_workflow (little resume"
                " --force-cancelled)"
            )
        else:
            message = (
                f"run {run_id!r} was cancelled{why}; it stopped before its next step, model call"
                " or tool call. Nothing was recorded as a failure: resume it with"
                " resume_cancelled=True (little resume --force-cancelled) to continue"
            )
        super().__init__(run_id, message)


class BudgetExceededError(RunStoppedError):
    """The run's (or an agent step's) budget is spent: the next model call was not made.

    Recorded as the run's own outcome (``BudgetExceeded``, status
    ``budget_exceeded``), not as a failure of the step. Resume with a larger
    budget: nothing committed runs again, and the agent's session continues.
    """

    def __init__(
        self, run_id: str, *, scope: str, spent: str, step_path: str | None, unpriced_calls: int
    ) -> None:
        self.scope = scope
        self.spent = spent
        self.step_path = step_path
        self.unpriced_calls = unpriced_calls
        at = f" at step {step_path!r}" if step_path else ""
        super().__init__(
            run_id,
            f"run {run_id!r} stopped{at} before a model call: {scope} has spent {spent}."
            " Resume it with a larger budget (run_workflow(..., budget=Budget(...)), little"
            " resume --budget-...) to continue; nothing committed runs again",
        )


class ModelUnavailableError(RunStoppedError):
    """A model call still failed with a retryable error (a 429, a 5xx, no answer) when the
    agent step's tries ran out: the run stopped with the call in flight.

    Not a failure of the step: a new attempt would be a new session, which pays again for
    every answer recorded and runs every committed tool call again. Nothing is recorded;
    resume the run (``run_workflow`` with the same run id) once the provider answers: its
    session continues from the log and only this call is made again, as after a crash.
    ``error`` is the provider's last :class:`ModelError` (None where the stop was rebuilt
    from its message, as on Temporal).
    """

    def __init__(
        self,
        run_id: str,
        message: str,
        *,
        step_path: str | None = None,
        error: ModelError | None = None,
    ) -> None:
        self.step_path = step_path
        self.error = error
        super().__init__(run_id, message)

    @classmethod
    def after(
        cls, run_id: str, step_path: str, error: ModelError, tries: int
    ) -> ModelUnavailableError:
        """The stop of ``run_id`` at ``step_path``, whose call failed ``tries`` times."""
        return cls(
            run_id,
            f"run {run_id!r} stopped at step {step_path!r}: its model call failed {tries}"
            f" time{'' if tries == 1 else 's'} ({error}). Nothing was recorded as a failure:"
            " resume the run (run_workflow with the same run id, little resume) once the"
            " provider answers, and only this call is made again; give the step a"
            " RetryPolicy with more max_attempts to try longer in place",
            step_path=step_path,
            error=error,
        )


class RunWaitingError(RunStoppedError):
    """The run waits for a signal (``RunWaiting`` is in its log); its driver stopped cleanly.

    Not a failure: the waiting step (or tool call) stays in flight, and the
    process may exit. Send the signal (``world.signal``, ``little signal``) and
    resume the run: it continues from the wait with the signal's data.
    ``waits`` holds ``(signal, step_path, wait_id)`` of each wait, and
    ``wait_run_ids`` the run each is a wait of: ``run_id``, or a sub-run's (an
    orchestrator's sub-runs, or a parallel group's, may wait at once).
    """

    def __init__(
        self,
        run_id: str,
        waits: tuple[tuple[str, str, str], ...],
        wait_run_ids: tuple[str, ...] | None = None,
    ) -> None:
        self.waits = waits
        self.wait_run_ids = wait_run_ids if wait_run_ids is not None else (run_id,) * len(waits)
        by_run: dict[str, list[tuple[str, str, str]]] = {}
        for owner, wait in zip(self.wait_run_ids, waits, strict=True):
            by_run.setdefault(owner, []).append(wait)
        if not by_run:
            by_run[run_id] = []
        what = "; ".join(
            f"run {owner!r} waits for "
            + (", ".join(f"signal {s!r} at step {p!r}" for s, p, _ in found) or "a signal")
            for owner, found in by_run.items()
        )
        send = ", ".join(
            f"`little signal {owner} {found[0][0] if found else 'NAME'} --data JSON`"
            for owner, found in by_run.items()
        )
        super().__init__(
            run_id,
            f"{what}: send {'it' if len(waits) <= 1 else 'each'} with {send} (or"
            " world.signal(...)), then resume the run; nothing was recorded as a failure",
        )


class WaitTimedOutError(RunStoppedError):
    """A wait's deadline passed before its signal came: recorded as ``WaitTimedOut``, the
    run's own outcome (status ``timed_out``), not a failure of the step."""

    def __init__(self, run_id: str, *, signal: str, step_path: str, deadline: str) -> None:
        self.signal = signal
        self.step_path = step_path
        self.deadline = deadline
        super().__init__(
            run_id,
            f"run {run_id!r} stopped at step {step_path!r}: its wait for signal {signal!r}"
            f" timed out at {deadline}; a signal is no longer taken (fork or re-run it to try"
            " again)",
        )


class SignalError(LittleEsError, ValueError):
    """A signal the run cannot take; nothing was recorded (see the message)."""


class SignalDataError(SignalError):
    """The signal's data does not validate against the wait's declared pydantic model (or the
    model cannot be imported, or changed since the wait was recorded)."""


class NoSuchWaitError(SignalError, LookupError):
    """The run does not wait for a signal of this name (it is not waiting, or waits for
    another one)."""


class SignalConsumedError(SignalError):
    """A duplicate: the wait this signal names already took a signal (named in the message),
    or a signal with this ``signal_id`` was recorded before. A wait takes one signal, once."""


class StaleApprovalError(SignalError):
    """The signal names the digest of another action than the one the run waits to have
    approved (the run asks about something else now): refused as stale."""


# ------------------------------ integrity: the log and the code disagree


class RuntimeIntegrityError(LittleEsError):
    """The log and the code disagree; resuming would not be a faithful continuation.

    Raised by the restart checks before anything is scheduled. Subclasses name
    which check failed; each message names the run, the step and what differed.
    """


class WorkflowChangedError(RuntimeIntegrityError):
    """The workflow definition's IR hash differs from the one recorded at ``RunStarted``."""


class ArtifactMismatchError(RuntimeIntegrityError):
    """A completed step's artifact is missing, corrupt, foreign, or disagrees with its output."""


class ParallelReplayMismatchError(RuntimeIntegrityError):
    """A parallel group's recomputed branch set differs from the recorded one."""


class CapabilityDriftError(RuntimeIntegrityError):
    """An agent step's harness manifest (model, prompt, tools, ...) changed since it started."""


class RunInputMismatchError(RuntimeIntegrityError):
    """A resume was asked for with an input other than the one the run started with."""


class OuterLoopMismatchError(RuntimeIntegrityError):
    """An outer loop was resumed with a workflow or setting other than the recorded one."""


class ConversationDivergedError(RuntimeIntegrityError):
    """A resumed session's rebuilt conversation does not match what its log recorded.

    The user prompt (or the recorded responses and results) differ from those
    the session was started with, so the recorded calls cannot stand in for
    new ones.
    """

    retryable = False


class LogTamperedError(RuntimeIntegrityError, EventLogError):
    """A stream's hash chain is broken: a row was edited, deleted, inserted or cut off.

    The message names the stream, the version and what differs
    (:mod:`little_es.chain`). Nothing was appended or executed; restore the
    world from a backup (``little verify`` says which streams hold).
    """


class WorldIntegrityError(RuntimeIntegrityError):
    """The database is not the one this world was: emptied, replaced, truncated or corrupt.

    Raised instead of treating the world as new (which would run every step
    again) or surfacing a raw driver error.
    """


class WorldStorageError(LittleEsError):
    """The world's database failed a read or a commit: a full disk, a write lock held too
    long by another process, a lost connection to the server.

    Not a failure of the step or call under way, and never recorded as one
    (that would spend a retry, and an agent step's next attempt would start a
    new harness session that makes every recorded call again): the attempt
    stays in flight, and a resume once the database is back continues it,
    the call in flight made again at most once. Retryable on Temporal.
    """

    retryable = True


class LeaseLostError(RuntimeIntegrityError):
    """This process no longer holds the lease of the run it drives; it stopped before running more.

    Checked before every step, model call and tool call and before every
    append: the lease's PostgreSQL connection died (idle timeout, proxy,
    network, ``little unlock --force``) or its SQLite lock file was removed or
    replaced. Another process may be driving the run now; this one records
    nothing more. Resume the run (in one process) once the other has stopped.
    """


# ------------------------------------------------------ models and tools


class ModelError(LittleEsError):
    """A model provider call failed. ``retryable`` says whether trying again can help;
    ``retry_after``, the seconds the provider asked to wait first (its ``Retry-After``),
    if it said."""

    def __init__(
        self,
        message: str,
        *,
        retryable: bool,
        provider: str = "",
        status: int | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.provider = provider
        self.status = status
        self.retry_after = retry_after


class ToolError(LittleEsError):
    """A tool's arguments did not validate, or the model named a tool that does not exist."""


class ToolArgumentsError(ToolError, ValueError):
    """The arguments a model sent do not validate against the tool's schema.

    ``tool`` is the tool's name and ``fields`` the dotted paths of the
    arguments that failed (``""`` for the arguments object itself).
    """

    def __init__(self, message: str, *, tool: str, fields: tuple[str, ...]) -> None:
        super().__init__(message)
        self.tool = tool
        self.fields = fields


class ApprovalDeniedError(ToolError):
    """A person declined a tool call that needed approval: the call's failure, shown to the
    model, which may try something else."""

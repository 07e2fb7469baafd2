"""What crosses Temporal: the activity names and the models workflow and activities exchange.

The generic workflow (:mod:`little_es_temporal.workflow`) only ever sees these:
ids, step paths, a decision's target, a parallel group's branch keys and a
"done" marker per step. Step outputs stay in the run's log (large ones as
artifacts); a :class:`StepDone` carries an output inline only when it is small,
so Temporal's history does not grow with the length of an agent's conversation.

The names and the fields are part of every running workflow's history: change
them only in ways a replay of an existing history still accepts.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from pydantic import BaseModel, ConfigDict, Field

from little_es.values import ArtifactRef, Budget, ErrorInfo, JSONValue
from little_es.workflow.ir import WorkflowIR

__all__ = [
    "ACTIVITY_NAMES",
    "BEGIN_SUBWORKFLOW",
    "COMPLETE_GROUP",
    "COMPLETE_RUN",
    "FAIL_RUN",
    "FAIL_SUBWORKFLOW",
    "FINISH_SUBWORKFLOW",
    "GAVE_UP_MARKER",
    "REFUSED_MARKER",
    "RUN_STEP",
    "SCHEDULE_BRANCHES",
    "SIGNAL_NAME",
    "START_RUN",
    "TEMPORAL_INLINE_LIMIT",
    "GroupPlan",
    "RunDone",
    "RunEnd",
    "RunFailure",
    "RunInput",
    "RunPlan",
    "StepDone",
    "StepInput",
    "StepRetry",
    "StepTimeouts",
    "SubRunFailure",
    "SubRunPlan",
    "SubRunStart",
    "WaitNotice",
]

START_RUN = "little_es.start_run"
RUN_STEP = "little_es.run_step"
SCHEDULE_BRANCHES = "little_es.schedule_branches"
COMPLETE_GROUP = "little_es.complete_group"
BEGIN_SUBWORKFLOW = "little_es.begin_subworkflow"
FINISH_SUBWORKFLOW = "little_es.finish_subworkflow"
FAIL_SUBWORKFLOW = "little_es.fail_subworkflow"
COMPLETE_RUN = "little_es.complete_run"
FAIL_RUN = "little_es.fail_run"

ACTIVITY_NAMES = frozenset(
    {
        START_RUN,
        RUN_STEP,
        SCHEDULE_BRANCHES,
        COMPLETE_GROUP,
        BEGIN_SUBWORKFLOW,
        FINISH_SUBWORKFLOW,
        FAIL_SUBWORKFLOW,
        COMPLETE_RUN,
        FAIL_RUN,
    }
)
"""The names of the adapter's activities (the interceptor maps their errors)."""

TEMPORAL_INLINE_LIMIT = 4 * 1024
"""Outputs and inputs up to this many JSON bytes travel through Temporal inline;
larger ones travel as an :class:`~little_es.values.ArtifactRef` or stay in the log."""

GAVE_UP_MARKER = "little_es.step_gave_up"
"""First detail of the ApplicationError a step activity raises when its attempts ran out."""

REFUSED_MARKER = "little_es.refused"
"""The first detail of the ``ApplicationError`` of a
:class:`~little_es.errors.RuntimeIntegrityError`: a refusal, which recorded nothing. A parent
workflow whose child run refused must not record the child's step as failed."""


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

    run_id: str = Field(description="The little_es run id, also the Temporal workflow id.")
    workflow_id: str = Field(description="The id of the workflow definition to run.")
    workflow_version: str = Field(description="Its version (for messages; the hash decides).")
    ir_hash: str = Field(description="Its IR hash: with the id, the registered definition.")
    input: JSONValue = None
    input_ref: ArtifactRef | None = None
    parent_run_id: str | None = Field(default=None, description="A sub-run's parent run.")
    parent_step_path: str | None = Field(default=None, description="The step that started it.")
    timeouts: StepTimeouts = StepTimeouts()
    budget: Budget | None = Field(
        default=None, description="The run's budget (None: keep the recorded one)."
    )
    resume_cancelled: bool = Field(default=False, description="Resume a cancelled run.")


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
    """Names one step execution of a run (the workflow and the step follow from the log).

    ``hosted``: the sub-runs whose child workflows the workflow just waited
    for, at the step's request (a failure of one of them is the step's to see),
    for its attempt ``hosted_attempt`` (None: any). A later attempt (Temporal
    retrying the activity after a recorded failure) hosts them again: a
    subworkflow step's sub-run id is the same on every attempt.

    ``hosted_failures``: those of them whose child workflow failed by an error of its
    own (not terminated, cancelled or timed out in Temporal), with that error as Temporal
    reported it; a child whose log shows it unfinished is refused with it
    (:class:`~little_es_temporal.ChildWorkflowFailedError`), not as ended outside little_es.
    """

    run_id: str
    step_path: str
    hosted: tuple[str, ...] = ()
    hosted_attempt: int | None = None
    hosted_failures: dict[str, ErrorInfo] = Field(default_factory=dict)


class SubRunStart(_Frozen):
    """A sub-run a suspended step waits for: the child workflow to start (id = ``run_id``)."""

    run_id: str
    workflow_id: str
    workflow_version: str
    ir_hash: str
    input: JSONValue = None
    input_ref: ArtifactRef | None = None
    parent_step_path: str
    max_concurrency: int | None = Field(
        default=None,
        ge=1,
        description=(
            "At most this many of a step's sub-runs run at once (the smallest one given among"
            " them wins); None: no bound (a subworkflow step, or a result recorded before"
            " the field existed)."
        ),
    )


SIGNAL_NAME = "little_es.signal"
"""The Temporal signal that wakes a run waiting for a little_es signal: its argument is the
wait id; the data is in the run's log (``SignalReceived``, validated when it was sent)."""


class WaitNotice(_Frozen):
    """A wait a step activity recorded (``RunWaiting``): the workflow waits on the Temporal
    signal :data:`SIGNAL_NAME` for ``wait_id``, or until ``deadline``."""

    wait_id: str
    signal: str
    deadline: datetime | None = None


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
    suspended: tuple[SubRunStart, ...] = ()
    """Not done yet: start these child workflows, wait, then run the step again."""
    waiting: tuple[WaitNotice, ...] = ()
    """Not done yet: wait for one of these signals (or a deadline), then run the step again."""


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
    """A subworkflow step's child run failed; ``error`` is what Temporal reported.

    ``ended_outside``: its workflow was terminated, cancelled or timed out in Temporal
    (True where the workflow did not say: what was assumed before the field existed).
    """

    run_id: str
    step_path: str
    error: ErrorInfo
    ended_outside: bool = True


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

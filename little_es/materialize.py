"""The one reducer: ``apply(state, event)`` folds any event of a run's log into its state.

Everything that needs a run's state uses this module: the local runtime keeps
its live view with :func:`apply`, :func:`little_es.replay.replay_run` folds the
stored log with :func:`materialize_run_state`, the projection behind
``little runs`` calls :func:`apply` per event, and the Temporal adapter reuses
the runtime's code. There is no second implementation.

The fold is kept in a mutable :class:`RunFold` so that each event costs O(1)
however long the run is; :meth:`RunFold.freeze` returns the immutable
:class:`MaterializedRunState` handed to users.

Cost rules (the only place a dollar figure is produced):

* each ``harness.model.responded`` is priced from its provider, model, token
  counts and timestamp by the :class:`~little_es.values.Pricer` the fold was
  given (a world gives its own, see :attr:`little_es.world.World.pricer`); the
  reducer looks up no price itself, so what a fold computes depends on its
  events and its pricer only;
* a call's cost is kept in integer picodollars (:func:`picodollars`) and
  every total is an integer sum of them, so totals are exact and the same in
  whatever order the events are folded; ``cost_usd`` is a float made from the
  exact figure at the edge, ``cost_usd_exact`` the exact figure itself;
* a call whose model has no price adds nothing to ``cost_usd`` and one to
  ``unpriced_calls``; a scope's ``cost_usd`` is ``None`` only when it has calls
  and every one of them was unpriced; with no calls it is a true ``0.0``;
* ``harness.session.completed`` carries a rollup of the same calls and is never
  folded, so no call is counted twice.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from decimal import ROUND_HALF_EVEN, Decimal
from typing import Any, Literal
from uuid import UUID

from pydantic import BaseModel, ConfigDict

from little_es._compact import (
    construct_compact,
    construct_ordinary,
    ordinary_copy,
    prepare_compact,
)
from little_es._frozen import FrozenDict, freeze
from little_es.errors import InvalidStepPathError
from little_es.events import (
    BudgetExceeded,
    BudgetSet,
    Event,
    ForkOrigin,
    ModelCalled,
    ModelResponded,
    ParallelBranchScheduled,
    RunCancelled,
    RunCompleted,
    RunFailed,
    RunForked,
    RunResumed,
    RunStarted,
    RunWaiting,
    SessionCompleted,
    SessionStarted,
    SignalReceived,
    StepCompleted,
    StepFailed,
    StepKind,
    StepStarted,
    SubRunReserved,
    ToolCallFailed,
    ToolCallStarted,
    ToolCallSucceeded,
    WaitTimedOut,
    WorkflowAdopted,
)
from little_es.values import (
    ArtifactRef,
    Budget,
    ErrorInfo,
    JSONValue,
    PicodollarPricer,
    Pricer,
    Usage,
    UsageTotals,
)
from little_es.workflow.paths import visit_key

StepStatus = Literal["pending", "running", "completed", "failed"]
RunStatus = Literal[
    "pending",
    "running",
    "completed",
    "failed",
    "cancelled",
    "budget_exceeded",
    "waiting",
    "timed_out",
]
"""``cancelled`` (``RunCancelled``) and ``budget_exceeded`` (``BudgetExceeded``) are stops on
purpose, not failures: the run resumes from where it stopped (see ``RunResumed``).
``waiting`` (``RunWaiting``): the run waits for a signal; once every open wait has its
signal it is ``running`` again (resume it). ``timed_out`` (``WaitTimedOut``): a wait's
deadline passed first."""

WaitStatus = Literal["waiting", "signalled", "timed_out"]


class WaitState(BaseModel):
    """One wait of the run (``RunWaiting``) and what became of it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    wait_id: str
    step_path: str
    kind: Literal["step", "ask_human", "approval"]
    signal: str
    model_ref: str
    schema_digest: str
    status: WaitStatus = "waiting"
    since: datetime | None = None
    deadline: datetime | None = None
    action: JSONValue = None
    action_digest: str | None = None
    question: str | None = None
    data: JSONValue = None
    """The signal's data (validated against the model), once signalled."""
    signal_id: str | None = None
    signalled_at: datetime | None = None
    signalled_by: str | None = None


def visit_counter(step_path: str) -> str:
    """The key of :attr:`MaterializedRunState.visits` a committed visit counts against.

    :func:`little_es.workflow.paths.visit_key` as one string: ``review@3`` counts
    for ``review``, ``check@2[a.py]/lint`` for ``check[a.py]/lint``.
    """
    try:
        step_id, branch_path = visit_key(step_path)
    except InvalidStepPathError:
        # Not a path the workflow grammar makes (a hand-written log): count it as itself.
        return step_path
    return f"{branch_path}/{step_id}" if branch_path else step_id


class StepState(BaseModel):
    """What the log says about one step path."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    step_path: str
    step_id: str
    kind: StepKind | None = None
    status: StepStatus = "pending"
    visit: int = 1
    attempts: int = 0
    output: JSONValue = None
    output_ref: ArtifactRef | None = None
    artifact_refs: tuple[ArtifactRef, ...] = ()
    next_step: str | None = None
    error: ErrorInfo | None = None
    session_ids: tuple[UUID, ...] = ()
    usage: UsageTotals = UsageTotals()


# A long run holds one per step, in its result and in a replay's.
prepare_compact(StepState)


class MaterializedRunState(BaseModel):
    """A run's state as its log says, immutable all the way down."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    run_id: str | None = None
    workflow_id: str | None = None
    workflow_version: str | None = None
    ir_hash: str | None = None
    parent_run_id: str | None = None
    status: RunStatus = "pending"
    input: JSONValue = None
    input_ref: ArtifactRef | None = None
    output: JSONValue = None
    output_ref: ArtifactRef | None = None
    error: ErrorInfo | None = None
    failed_step_path: str | None = None
    stop_reason: str | None = None
    """Why a ``cancelled`` or ``budget_exceeded`` run stopped (the reason given, what was spent)."""
    stopped_step_path: str | None = None
    """The step a ``budget_exceeded`` run stopped in (None: before a step)."""
    budget: Budget | None = None
    """The run's budget (the latest ``BudgetSet``), over it and its sub-runs."""
    forked_from: ForkOrigin | None = None
    """A fork's origin and copied prefix (``RunForked``); None for a run that is no fork."""
    steps: Mapping[str, StepState] = FrozenDict()
    """Per step path, in the order the steps were first started."""
    waits: Mapping[str, WaitState] = FrozenDict()
    """Every wait of the run (``RunWaiting``) by wait id, in the order they were recorded."""
    visits: Mapping[str, int] = FrozenDict()
    """Committed visits per (step id, branch path), see :func:`visit_counter`."""
    parallel_groups: Mapping[str, tuple[str, ...]] = FrozenDict()
    """Recorded branch keys per parallel group step path."""
    pending_decision_target: str | None = None
    """The target chosen by the most recent committed decision."""
    sub_run_ids: tuple[str, ...] = ()
    usage: UsageTotals = UsageTotals()
    started_at: datetime | None = None
    updated_at: datetime | None = None
    completed_at: datetime | None = None
    event_count: int = 0


_PICO_EXPONENT = 12


def picodollars(cost: Decimal) -> int:
    """A call's exact cost in integer picodollars (10^-12 USD), rounded half to even.

    A picodollar is 1/10,000 of one token of a model at $0.01 per million
    tokens, so no listed price loses anything here; integers make every sum
    exact, whatever the order of folding.
    """
    return int(cost.scaleb(_PICO_EXPONENT).to_integral_value(ROUND_HALF_EVEN))


def _in_picodollars(pricer: Pricer) -> Callable[[str, str, Usage, datetime], int | None]:
    if isinstance(pricer, PicodollarPricer):
        return pricer.picodollars

    def pusd(provider: str, model_id: str, usage: Usage, at: datetime) -> int | None:
        cost = pricer(provider, model_id, usage, at)
        return None if cost is None else picodollars(cost)

    return pusd


def dollars(pusd: int) -> Decimal:
    """Picodollars as exact US dollars, without trailing zeros (``Decimal('0.0025')``)."""
    if not pusd:
        return Decimal(0)
    usd = Decimal(pusd).scaleb(-_PICO_EXPONENT).normalize()
    return usd.quantize(Decimal(1)) if usd.as_tuple().exponent > 0 else usd  # type: ignore[operator]


@dataclass(slots=True)
class _UsageSum:
    input_tokens: int = 0
    output_tokens: int = 0
    cached_input_tokens: int = 0
    reasoning_tokens: int = 0
    cache_write_tokens: int = 0
    cost_pusd: int = 0
    """Picodollars: integers, so a sum never depends on the order it was added in."""
    priced_calls: int = 0
    unpriced_calls: int = 0

    def add(self, u: Usage, cost_pusd: int | None) -> None:
        self.input_tokens += u.input_tokens
        self.output_tokens += u.output_tokens
        self.cached_input_tokens += u.cached_input_tokens
        self.reasoning_tokens += u.reasoning_tokens
        self.cache_write_tokens += u.cache_write_tokens
        if cost_pusd is None:
            self.unpriced_calls += 1
        else:
            self.priced_calls += 1
            self.cost_pusd += cost_pusd

    @classmethod
    def from_totals(cls, totals: UsageTotals) -> _UsageSum:
        exact = totals.cost_usd_exact
        return cls(
            input_tokens=totals.input_tokens,
            output_tokens=totals.output_tokens,
            cached_input_tokens=totals.cached_input_tokens,
            reasoning_tokens=totals.reasoning_tokens,
            cache_write_tokens=totals.cache_write_tokens,
            cost_pusd=0 if exact is None else picodollars(exact),
            priced_calls=totals.calls - totals.unpriced_calls,
            unpriced_calls=totals.unpriced_calls,
        )

    def freeze(self) -> UsageTotals:
        if self == _NO_CALLS:
            return _NO_USAGE  # most steps call no model: one shared instance serves them all
        calls = self.priced_calls + self.unpriced_calls
        unpriced = calls and not self.priced_calls
        pusd = self.cost_pusd
        return UsageTotals.model_construct(
            _USAGE_FIELDS,
            input_tokens=self.input_tokens,
            output_tokens=self.output_tokens,
            cached_input_tokens=self.cached_input_tokens,
            reasoning_tokens=self.reasoning_tokens,
            cache_write_tokens=self.cache_write_tokens,
            # int / int is correctly rounded: the float nearest the exact figure.
            cost_usd=None if unpriced else pusd / 10**_PICO_EXPONENT,
            cost_usd_exact=None if unpriced else dollars(pusd),
            unpriced_calls=self.unpriced_calls,
            calls=calls,
        )


_NO_CALLS = _UsageSum()
_NO_USAGE = UsageTotals()
# model_construct gives each instance a set of the field names it was given, about
# as large as the instance itself; these views are frozen and always get every
# field, so one set serves them all (model_copy copies it before changing it).
_STEP_FIELDS = set(StepState.model_fields)
_USAGE_FIELDS = set(UsageTotals.model_fields)


@dataclass(slots=True)
class StepFold:
    """The mutable per-step part of a :class:`RunFold`.

    Call :meth:`changing` before changing it (:meth:`RunFold.step` does): a
    long run is frozen again and again (for each snapshot, and for the result),
    and the cached :meth:`freeze` view is rebuilt only for the steps that changed.
    """

    step_path: str
    step_id: str
    kind: StepKind | None = None
    status: StepStatus = "pending"
    visit: int = 1
    attempts: int = 0
    output: JSONValue = None
    output_ref: ArtifactRef | None = None
    artifact_refs: tuple[ArtifactRef, ...] = ()
    next_step: str | None = None
    error: ErrorInfo | None = None
    session_ids: tuple[UUID, ...] = ()
    usage: _UsageSum = field(default_factory=lambda: _NO_CALLS)
    """Shared by every step that has no model call yet: change it with :meth:`add_usage`."""
    gave_up_attempt: int = 0
    """The attempt of the last ``StepFailed(will_retry=False)`` (0: none): a resume after it
    gets a fresh budget of attempts counted from there."""
    output_version: int = 0
    """The version of the ``StepCompleted`` that holds :attr:`output` (0: not known), which a
    snapshot names instead of copying the output."""
    _view: StepState | None = field(default=None, repr=False, compare=False)

    def changing(self) -> StepFold:
        """Drop the cached frozen view before the caller changes this step; return it."""
        self._view = None
        return self

    def add_usage(self, usage: Usage, cost_pusd: int | None) -> None:
        """Add one model call's usage and cost to this step's."""
        if self.usage is _NO_CALLS:
            # Most steps never call a model: one sum each would be most of their fold.
            self.usage = _UsageSum()
        self.usage.add(usage, cost_pusd)

    def freeze(self) -> StepState:
        """The immutable view of this step."""
        if self._view is None:
            self._view = construct_compact(StepState, _STEP_FIELDS, self._values())
        return self._view

    def dumpable(self) -> StepState:
        """This step as an ordinary :class:`StepState`, to dump (a snapshot): not the cached
        compact view (see :mod:`little_es._compact`), and not made into one."""
        if self._view is not None:
            return ordinary_copy(self._view)
        return construct_ordinary(StepState, _STEP_FIELDS, self._values())

    def _values(self) -> dict[str, Any]:
        return {
            "step_path": self.step_path,
            "step_id": self.step_id,
            "kind": self.kind,
            "status": self.status,
            "visit": self.visit,
            "attempts": self.attempts,
            "output": freeze(self.output),
            "output_ref": self.output_ref,
            "artifact_refs": self.artifact_refs,
            "next_step": self.next_step,
            "error": self.error,
            "session_ids": self.session_ids,
            "usage": self.usage.freeze(),
        }


@dataclass(slots=True)
class RunFold:
    """The reducer's working state. Mutated in place by :func:`apply`; see :meth:`freeze`.

    ``pricer`` prices each model call as it is folded.
    """

    pricer: Pricer
    pusd: Callable[[str, str, Usage, datetime], int | None] = field(
        init=False, repr=False, compare=False
    )
    """``pricer`` in picodollars: its own method if it has one, else its Decimal converted."""
    run_id: str | None = None
    workflow_id: str | None = None
    workflow_version: str | None = None
    ir_hash: str | None = None
    parent_run_id: str | None = None
    status: RunStatus = "pending"
    input: JSONValue = None
    input_ref: ArtifactRef | None = None
    output: JSONValue = None
    output_ref: ArtifactRef | None = None
    error: ErrorInfo | None = None
    failed_step_path: str | None = None
    stop_reason: str | None = None
    stopped_step_path: str | None = None
    budget: Budget | None = None
    forked_from: ForkOrigin | None = None
    steps: dict[str, StepFold] = field(default_factory=dict)
    waits: dict[str, WaitState] = field(default_factory=dict)
    visits: dict[str, int] = field(default_factory=dict)
    parallel_groups: dict[str, tuple[str, ...]] = field(default_factory=dict)
    pending_decision_target: str | None = None
    sub_run_ids: list[str] = field(default_factory=list)
    usage: _UsageSum = field(default_factory=_UsageSum)
    session_steps: dict[UUID, str] = field(default_factory=dict)
    started_at: datetime | None = None
    updated_at: datetime | None = None
    completed_at: datetime | None = None
    event_count: int = 0

    def __post_init__(self) -> None:
        self.pusd = _in_picodollars(self.pricer)

    @classmethod
    def from_state(
        cls,
        state: MaterializedRunState,
        pricer: Pricer,
        gave_up_attempts: Mapping[str, int] | None = None,
    ) -> RunFold:
        """A fold that continues from a materialized state (a snapshot).

        ``gave_up_attempts`` restores :attr:`StepFold.gave_up_attempt`, which the
        materialized state does not show (see :meth:`gave_up_attempts`); without
        it a failed step's own last attempt is taken.
        """
        fold = cls(
            pricer=pricer,
            run_id=state.run_id,
            workflow_id=state.workflow_id,
            workflow_version=state.workflow_version,
            ir_hash=state.ir_hash,
            parent_run_id=state.parent_run_id,
            status=state.status,
            input=state.input,
            input_ref=state.input_ref,
            output=state.output,
            output_ref=state.output_ref,
            error=state.error,
            failed_step_path=state.failed_step_path,
            stop_reason=state.stop_reason,
            stopped_step_path=state.stopped_step_path,
            budget=state.budget,
            forked_from=state.forked_from,
            waits=dict(state.waits),
            visits=dict(state.visits),
            parallel_groups=dict(state.parallel_groups),
            pending_decision_target=state.pending_decision_target,
            sub_run_ids=list(state.sub_run_ids),
            usage=_UsageSum.from_totals(state.usage),
            started_at=state.started_at,
            updated_at=state.updated_at,
            completed_at=state.completed_at,
            event_count=state.event_count,
        )
        for path, s in state.steps.items():
            # An output a snapshot of the older format holds inline is read back as plain
            # JSON: frozen here, so the step's view is read-only as a folded one is.
            output = freeze(s.output)
            fold.steps[path] = StepFold(
                step_path=path,
                step_id=s.step_id,
                kind=s.kind,
                status=s.status,
                visit=s.visit,
                attempts=s.attempts,
                output=output,
                output_ref=s.output_ref,
                artifact_refs=s.artifact_refs,
                next_step=s.next_step,
                error=s.error,
                session_ids=s.session_ids,
                usage=_NO_CALLS if not s.usage.calls else _UsageSum.from_totals(s.usage),
                gave_up_attempt=(
                    gave_up_attempts.get(path, 0)
                    if gave_up_attempts is not None
                    else s.attempts
                    if s.status == "failed"
                    else 0
                ),
                _view=s if output is s.output else None,
            )
            for session_id in s.session_ids:
                fold.session_steps[session_id] = path
        return fold

    def gave_up_attempts(self) -> dict[str, int]:
        """:attr:`StepFold.gave_up_attempt` of each step that gave up, for a snapshot."""
        return {p: s.gave_up_attempt for p, s in self.steps.items() if s.gave_up_attempt}

    def output_versions(self) -> dict[str, int]:
        """:attr:`StepFold.output_version` of each step whose output is inline and known to
        be held by a stored ``StepCompleted``, for a snapshot."""
        return {
            p: s.output_version
            for p, s in self.steps.items()
            if s.output_version and s.output is not None
        }

    def set_output(self, step_path: str, output: JSONValue, version: int) -> None:
        """Put back the output of ``step_path`` that a snapshot names by the ``version`` of
        its ``StepCompleted`` (read from the stream)."""
        step = self.steps[step_path].changing()
        step.output = freeze(output)
        step.output_version = version

    def step(self, step_path: str, step_id: str) -> StepFold:
        """The fold of ``step_path``, about to change (created pending on first sight)."""
        found = self.steps.get(step_path)
        if found is None:
            found = self.steps[step_path] = StepFold(step_path=step_path, step_id=step_id)
            return found
        return found.changing()

    def freeze(self, *, steps: bool = True) -> MaterializedRunState:
        """The immutable :class:`MaterializedRunState` of everything folded so far (with
        ``steps=False``, all but the steps: a snapshot dumps them one by one)."""
        return MaterializedRunState.model_construct(
            run_id=self.run_id,
            workflow_id=self.workflow_id,
            workflow_version=self.workflow_version,
            ir_hash=self.ir_hash,
            parent_run_id=self.parent_run_id,
            status=self.status,
            input=freeze(self.input),
            input_ref=self.input_ref,
            output=freeze(self.output),
            output_ref=self.output_ref,
            error=self.error,
            failed_step_path=self.failed_step_path,
            stop_reason=self.stop_reason,
            stopped_step_path=self.stopped_step_path,
            budget=self.budget,
            forked_from=self.forked_from,
            steps=_frozen_steps(self.steps) if steps else FrozenDict(),
            waits=_frozen_waits(self.waits),
            visits=_frozen_visits(self.visits),
            parallel_groups=FrozenDict(self.parallel_groups),
            pending_decision_target=self.pending_decision_target,
            sub_run_ids=tuple(self.sub_run_ids),
            usage=self.usage.freeze(),
            started_at=self.started_at,
            updated_at=self.updated_at,
            completed_at=self.completed_at,
            event_count=self.event_count,
        )


COUNTED_ONLY: frozenset[type[Event]] = frozenset(
    {ModelCalled, ToolCallStarted, ToolCallSucceeded, ToolCallFailed, SessionCompleted}
)
"""The harness events :func:`apply` only counts: the bulk of a long log, which a replay
need not decode (see ``skipped`` in :func:`materialize_run_state`).
``harness.session.completed`` is one: its usage is a rollup of the same
``harness.model.responded`` events and is never folded."""


def _frozen_waits(waits: dict[str, WaitState]) -> FrozenDict[str, WaitState]:
    view: FrozenDict[str, WaitState] = FrozenDict()
    dict.update(view, {wait_id: _frozen_wait(wait) for wait_id, wait in waits.items()})
    return view


def _frozen_wait(wait: WaitState) -> WaitState:
    # A WaitState is a frozen model, but the JSON it holds (the signal's data, the
    # approval's action) comes as the event or the stored state had it: plain dicts.
    data, action = freeze(wait.data), freeze(wait.action)
    if data is wait.data and action is wait.action:
        return wait
    return wait.model_copy(update={"data": data, "action": action})


def _frozen_visits(visits: dict[str, int]) -> FrozenDict[str, int]:
    view: FrozenDict[str, int] = FrozenDict()
    dict.update(view, visits)  # ints: nothing to freeze, and one entry per step of a long run
    return view


def _frozen_steps(steps: dict[str, StepFold]) -> FrozenDict[str, StepState]:
    view: FrozenDict[str, StepState] = FrozenDict()
    # StepStates are frozen already: skip FrozenDict's deep freeze of every value.
    dict.update(view, {path: step.freeze() for path, step in steps.items()})
    return view


def apply(state: RunFold, event: Event) -> RunFold:
    """Fold one event into ``state`` (in place) and return it.

    Events this reducer does not know (a user's own :class:`~little_es.events.RunEvent`
    subclasses, outer-loop events) only count towards ``event_count``.
    """
    state.event_count += 1
    state.updated_at = event.timestamp
    if type(event) in COUNTED_ONLY:
        return state
    match event:
        case ModelResponded():
            # Priced once, here: the one place a dollar figure is produced.
            r = event.response
            cost = state.pusd(r.provider, r.model, r.usage, event.timestamp)
            state.usage.add(r.usage, cost)
            path = event.step_path or state.session_steps.get(event.originator_id)
            if path is not None and path in state.steps:
                state.steps[path].changing().add_usage(r.usage, cost)
        case StepStarted():
            step = state.step(event.step_path, event.step_id)
            step.kind = event.kind
            step.status = "running"
            step.visit = event.visit
            step.attempts = event.attempt
            step.error = None
            if event.session_id is not None:
                step.session_ids = (*step.session_ids, event.session_id)
                state.session_steps[event.session_id] = event.step_path
            if state.status == "failed":
                state.status = "running"
                state.error = None
                state.failed_step_path = None
        case StepCompleted():
            step = state.step(event.step_path, event.step_id)
            step.status = "completed"
            step.visit = event.visit
            step.attempts = event.attempt
            # Frozen here rather than in the view: the fold, the view and the recorder
            # then hold one copy of the output, not a mutable one beside a frozen one.
            step.output = freeze(event.output)
            step.output_version = event.originator_version
            step.output_ref = event.output_ref
            step.artifact_refs = event.artifact_refs
            step.next_step = event.next_step
            step.error = None
            key = visit_counter(event.step_path)
            state.visits[key] = state.visits.get(key, 0) + 1
            if event.next_step is not None:
                state.pending_decision_target = event.next_step
        case StepFailed():
            step = state.step(event.step_path, event.step_id)
            step.status = "pending" if event.will_retry else "failed"
            step.attempts = event.attempt
            step.error = event.error
            if not event.will_retry:
                step.gave_up_attempt = event.attempt
        case SessionStarted():
            state.session_steps[event.originator_id] = event.step_path
        case ParallelBranchScheduled():
            state.parallel_groups[event.step_path] = event.branch_keys
        case SubRunReserved():
            state.sub_run_ids.append(event.sub_run_id)
        case RunStarted():
            state.run_id = event.run_id
            state.workflow_id = event.workflow_id
            state.workflow_version = event.workflow_version
            state.ir_hash = event.ir_hash
            state.parent_run_id = event.parent_run_id
            state.input = event.input
            state.input_ref = event.input_ref
            state.status = "running"
            state.started_at = event.timestamp
        case RunCompleted():
            state.status = "completed"
            state.output = event.output
            state.output_ref = event.output_ref
            state.completed_at = event.timestamp
        case RunFailed():
            state.status = "failed"
            state.error = event.error
            state.failed_step_path = event.step_path
        case RunCancelled():
            if state.status != "completed":
                state.status = "cancelled"
                state.stop_reason = event.reason
                state.stopped_step_path = None
        case BudgetSet():
            state.budget = event.budget
        case BudgetExceeded():
            state.status = "budget_exceeded"
            state.stop_reason = f"{event.scope} has spent {event.spent}"
            state.stopped_step_path = event.step_path
        case RunResumed():
            # A run cancelled while it waited still waits once resumed.
            waiting = any(w.status == "waiting" for w in state.waits.values())
            state.status = "waiting" if waiting else "running"
            state.stop_reason = None
            state.stopped_step_path = None
        case RunForked():
            state.forked_from = event.origin
        case WorkflowAdopted():
            state.workflow_version = event.workflow_version
            state.ir_hash = event.ir_hash
        case RunWaiting():
            state.waits[event.wait_id] = WaitState(
                wait_id=event.wait_id,
                step_path=event.step_path,
                kind=event.kind,
                signal=event.signal,
                model_ref=event.model_ref,
                schema_digest=event.schema_digest,
                since=event.timestamp,
                deadline=event.deadline,
                action=event.action,
                action_digest=event.action_digest,
                question=event.question,
            )
            if state.status not in ("completed", "cancelled"):
                state.status = "waiting"
        case SignalReceived():
            found = state.waits.get(event.wait_id)
            if found is not None and found.status == "waiting":
                state.waits[event.wait_id] = found.model_copy(
                    update={
                        "status": "signalled",
                        "data": event.data,
                        "signal_id": event.signal_id,
                        "signalled_at": event.timestamp,
                        "signalled_by": event.sent_by,
                    }
                )
            if state.status == "waiting" and not any(
                w.status == "waiting" for w in state.waits.values()
            ):
                # Every open wait has its signal: the run goes on at its next resume.
                state.status = "running"
        case WaitTimedOut():
            found = state.waits.get(event.wait_id)
            if found is not None:
                state.waits[event.wait_id] = found.model_copy(update={"status": "timed_out"})
            if state.status != "completed":
                state.status = "timed_out"
                state.stop_reason = (
                    f"the wait for signal {event.signal!r} timed out at"
                    f" {event.deadline.isoformat()}"
                )
                state.stopped_step_path = event.step_path
        case _:
            pass
    return state


def materialize_run_state(
    events: Iterable[Event], *, pricer: Pricer, skipped: int = 0
) -> MaterializedRunState:
    """Fold a run's log (its ``Run`` stream and its harness sessions) into its state.

    ``skipped`` counts events of the log the caller left out because this
    reducer only counts them (of a class in :data:`COUNTED_ONLY`, and never the
    last event of its stream, whose timestamp may be the run's ``updated_at``):
    the state is the same as if they had been folded.
    """
    state = RunFold(pricer)
    for event in events:
        apply(state, event)
    state.event_count += skipped
    return state.freeze()

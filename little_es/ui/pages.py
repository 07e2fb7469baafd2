"""What the pages of ``little ui`` show, gathered from a world: plain data, no HTML.

Every figure comes from the one reducer: the runs list from the runs read model
(:func:`~little_es.projections.list_runs`), a run's state from
:func:`~little_es.replay.read_run_state`, its sub-run tree from
:func:`~little_es.orchestrator.run_tree` and
:func:`~little_es.totals.run_tree_totals`, and a single model call's cost by
folding that call's ``harness.model.responded`` event alone with
:func:`~little_es.materialize.materialize_run_state` (so no dollar figure is made
anywhere else). What this module adds is the ordering the log already has: each
step attempt's start and end, and each session's turns with their tool calls.

The outer-loop pages read the :class:`~little_es.domain.OuterLoop` aggregate
(:func:`~little_es.outer_loop.list_outer_loops`,
:func:`~little_es.outer_loop.load_outer_loop`) and price it with
:func:`~little_es.outer_loop.cycle_cost` and :func:`~little_es.outer_loop.loop_totals`,
as ``little loops`` and ``little report --loop`` do.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from uuid import UUID

from little_es.backends.base import RunSummary
from little_es.domain import LoopCycle, OuterLoop
from little_es.errors import ConversationDivergedError
from little_es.events import (
    Event,
    HarnessEvent,
    ModelCalled,
    ModelResponded,
    SessionStarted,
    StepCompleted,
    StepFailed,
    StepStarted,
    ToolCallFailed,
    ToolCallStarted,
    ToolCallSucceeded,
)
from little_es.harness.session import sent_messages
from little_es.materialize import MaterializedRunState, materialize_run_state
from little_es.orchestrator import RunTree, run_tree
from little_es.outer_loop import (
    CycleCost,
    cycle_cost,
    list_outer_loops,
    load_outer_loop,
    loop_totals,
)
from little_es.projections import RunsProjection, list_runs
from little_es.totals import run_tree_totals
from little_es.values import (
    ArtifactRef,
    ErrorInfo,
    JSONValue,
    Message,
    ModelResponse,
    UsageTotals,
)
from little_es.world import World

__all__ = [
    "RUN_FILTERS",
    "CycleView",
    "LiveStatus",
    "LoopPage",
    "LoopRow",
    "ModelCall",
    "RunPage",
    "SessionView",
    "StepAttempt",
    "ToolCallView",
    "live_status",
    "loop_page",
    "loops_list",
    "run_page",
    "runs_list",
]

RUN_FILTERS: dict[str, frozenset[str]] = {
    "running": frozenset({"running"}),
    "waiting": frozenset({"pending", "waiting", "cancelled", "budget_exceeded", "timed_out"}),
    "failed": frozenset({"failed"}),
    "completed": frozenset({"completed"}),
}
"""The runs list's filters, by name: the statuses each shows. ``waiting`` is every run that
goes on only when someone acts (signals it, resumes it, raises its budget, or it is yet to
start)."""


@dataclass(frozen=True, slots=True)
class StepAttempt:
    """One ``StepStarted`` of a step path and what ended it (nothing yet: still running)."""

    step_path: str
    kind: str
    visit: int
    attempt: int
    started_at: datetime
    ended_at: datetime | None = None
    outcome: str = "running"
    """``running``, ``completed``, ``retrying`` (failed, will retry) or ``failed``."""
    error: ErrorInfo | None = None
    output: JSONValue = None
    session_id: UUID | None = None
    output_ref: ArtifactRef | None = None
    """The artifact that holds the output when it was too large to inline."""


@dataclass(slots=True)
class ToolCallView:
    """A tool call of a turn: its arguments, and its result or error once recorded."""

    call_id: str
    name: str
    args: JSONValue
    started_at: datetime
    ended_at: datetime | None = None
    result: JSONValue = None
    error: ErrorInfo | None = None


@dataclass(slots=True)
class ModelCall:
    """One turn of a session: what the model was sent, what it answered, and the tool calls."""

    turn: int
    called_at: datetime
    messages: tuple[Message, ...]
    calls: int = 1
    """How many ``harness.model.called`` this turn has (more than one: made again on resume)."""
    responded_at: datetime | None = None
    response: ModelResponse | None = None
    usage: UsageTotals = field(default_factory=UsageTotals)
    tool_calls: list[ToolCallView] = field(default_factory=list)


@dataclass(slots=True)
class SessionView:
    """A harness session (one agent step attempt) and its turns."""

    session_id: UUID
    step_path: str
    attempt: int
    started_at: datetime | None
    turns: list[ModelCall] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class RunPage:
    """Everything the run page shows."""

    run_id: str
    state: MaterializedRunState
    attempts: tuple[StepAttempt, ...]
    sessions: dict[UUID, SessionView]
    tree: RunTree
    tree_total: UsageTotals
    """The run and all its sub-runs (:func:`~little_es.totals.run_tree_totals`)."""


@dataclass(frozen=True, slots=True)
class LiveStatus:
    """What the live view polls for: enough to tell that the run page has changed."""

    run_id: str
    status: str
    event_count: int
    updated_at: datetime | None


@dataclass(frozen=True, slots=True)
class LoopRow:
    """An outer loop of the loops list, with what it spent (every cycle, with sub-runs)."""

    loop: OuterLoop
    totals: UsageTotals


@dataclass(frozen=True, slots=True)
class CycleView:
    """A cycle of a loop page: its events, its cost, and which of its runs have a log."""

    cycle: LoopCycle
    cost: CycleCost
    planner_run_exists: bool
    run_exists: bool
    """False for a cycle the planner ended (``done``) or one whose run is yet to start."""


@dataclass(frozen=True, slots=True)
class LoopPage:
    """Everything an outer loop's page shows."""

    loop: OuterLoop
    cycles: tuple[CycleView, ...]
    totals: UsageTotals
    """The planner runs and cycle runs of every cycle, abandoned ones included."""


def loops_list(world: World) -> tuple[LoopRow, ...]:
    """The outer loops of ``world``, newest first, each with its totals."""
    return tuple(
        LoopRow(loop, loop_totals(world, loop)) for loop in reversed(list_outer_loops(world))
    )


def loop_page(world: World, outer_loop_id: str) -> LoopPage:
    """Gather the page of ``outer_loop_id``. Raises what
    :func:`~little_es.outer_loop.load_outer_loop` raises for the id."""
    loop = load_outer_loop(world, outer_loop_id)
    cycles = tuple(
        CycleView(
            c,
            cycle_cost(world, c),
            world.run_exists(c.started.planner_run_id),
            world.run_exists(c.started.run_id),
        )
        for _, c in sorted(loop.cycles.items())
    )
    return LoopPage(loop, cycles, loop_totals(world, loop))


def runs_list(
    world: World, filter_name: str | None = None, *, projection: RunsProjection | None = None
) -> tuple[RunSummary, ...]:
    """The runs of ``world``, newest first, only those of ``filter_name`` (see
    :data:`RUN_FILTERS`) when given; an unknown filter raises ``ValueError``.

    ``projection``: the world's runs projection to bring up to date and read (a server
    keeps one); a new one by default."""
    if projection is None:
        runs = list_runs(world)
    else:
        projection.catch_up()
        runs = projection.runs()
    if filter_name:
        if filter_name not in RUN_FILTERS:
            raise ValueError(f"unknown filter {filter_name!r}; use one of {sorted(RUN_FILTERS)}")
        wanted = RUN_FILTERS[filter_name]
        runs = tuple(r for r in runs if r.status in wanted)
    return tuple(reversed(runs))


def live_status(
    world: World, run_id: str, *, projection: RunsProjection | None = None
) -> LiveStatus | None:
    """The run's status and event count from the runs read model brought up to date;
    None when the model has not seen the run. ``projection`` as for :func:`runs_list`."""
    if projection is None:
        projection = RunsProjection(world)
    projection.catch_up()
    state = projection.view.load_state(run_id)
    if state is None:
        return None
    return LiveStatus(run_id, state.status, state.event_count, state.updated_at)


def run_page(world: World, run_id: str) -> RunPage:
    """Read ``run_id``'s log and gather its page. Raises what
    :func:`~little_es.replay.read_run_state` raises for the id and the log."""
    events = world.read_run_log(run_id)
    # The full log is decoded here (the turns need the calls' arguments and results);
    # its state is the reducer's fold of exactly these events.
    state = materialize_run_state(events, pricer=world.pricer)
    attempts, sessions = _timeline(world, events)
    return RunPage(
        run_id=run_id,
        state=state,
        attempts=attempts,
        sessions=sessions,
        tree=run_tree(world, run_id),
        tree_total=run_tree_totals(world, run_id),
    )


def _sent_by_session(events: list[Event]) -> dict[UUID, dict[int, tuple[Message, ...]]]:
    """What each model call of each session was sent, the messages its
    ``harness.model.called`` leaves to earlier events rebuilt (:func:`sent_messages`)."""
    by_session: dict[UUID, list[Event]] = {}
    for event in events:
        if isinstance(event, HarnessEvent):
            by_session.setdefault(event.originator_id, []).append(event)
    sent: dict[UUID, dict[int, tuple[Message, ...]]] = {}
    for session_id, session_events in by_session.items():
        try:
            sent[session_id] = sent_messages(session_events)
        except ConversationDivergedError:
            # A page shows what is stored; resuming the session refuses such a log.
            continue
    return sent


def _timeline(
    world: World, events: list[Event]
) -> tuple[tuple[StepAttempt, ...], dict[UUID, SessionView]]:
    attempts: list[StepAttempt] = []
    open_attempt: dict[str, int] = {}
    sessions: dict[UUID, SessionView] = {}
    turns: dict[tuple[UUID, int], ModelCall] = {}
    tools: dict[tuple[UUID, str], ToolCallView] = {}
    sent = _sent_by_session(events)
    for event in events:
        match event:
            case StepStarted():
                open_attempt[event.step_path] = len(attempts)
                attempts.append(
                    StepAttempt(
                        step_path=event.step_path,
                        kind=event.kind,
                        visit=event.visit,
                        attempt=event.attempt,
                        started_at=event.timestamp,
                        session_id=event.session_id,
                    )
                )
                if event.session_id is not None and event.session_id not in sessions:
                    sessions[event.session_id] = SessionView(
                        event.session_id, event.step_path, event.attempt, None
                    )
            case StepCompleted() | StepFailed():
                index = open_attempt.pop(event.step_path, None)
                if index is None:
                    continue
                a = attempts[index]
                output_ref = None
                if isinstance(event, StepCompleted):
                    outcome, error, output = "completed", None, event.output
                    output_ref = event.output_ref
                else:
                    outcome = "retrying" if event.will_retry else "failed"
                    error, output = event.error, None
                attempts[index] = StepAttempt(
                    a.step_path,
                    a.kind,
                    a.visit,
                    a.attempt,
                    a.started_at,
                    event.timestamp,
                    outcome,
                    error,
                    output,
                    a.session_id,
                    output_ref,
                )
            case SessionStarted():
                view = sessions.setdefault(
                    event.originator_id,
                    SessionView(event.originator_id, event.step_path, event.attempt, None),
                )
                view.started_at = event.timestamp
            case ModelCalled():
                key = (event.originator_id, event.turn)
                found = turns.get(key)
                if found is not None:
                    found.calls += 1
                    continue
                messages = sent.get(event.originator_id, {}).get(event.turn, event.messages)
                call = turns[key] = ModelCall(event.turn, event.timestamp, messages)
                if event.originator_id in sessions:
                    sessions[event.originator_id].turns.append(call)
            case ModelResponded():
                call = turns.get((event.originator_id, event.turn)) or ModelCall(
                    event.turn, event.timestamp, ()
                )
                call.responded_at = event.timestamp
                call.response = event.response
                # This call's cost is the reducer's fold of its one response event.
                call.usage = materialize_run_state([event], pricer=world.pricer).usage
            case ToolCallStarted():
                tool = tools[(event.originator_id, event.call_id)] = ToolCallView(
                    event.call_id, event.name, event.args, event.timestamp
                )
                owner = turns.get((event.originator_id, event.turn))
                if owner is not None:
                    owner.tool_calls.append(tool)
            case ToolCallSucceeded() | ToolCallFailed():
                done = tools.get((event.originator_id, event.call_id))
                if done is None:
                    continue
                done.ended_at = event.timestamp
                if isinstance(event, ToolCallSucceeded):
                    done.result = event.result
                else:
                    done.error = event.error
            case _:
                pass
    return tuple(attempts), sessions

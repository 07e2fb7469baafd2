"""Fork a run from any point: a new run whose log begins with the origin's history up to there.

``fork_run(world, run_id, at="review")`` writes a new run whose ``Run`` stream is

* ``RunForked``: the origin run, the fork point, and where the copied prefix
  ends in the origin's stream (its version and that row's chain digest, so the
  copy stays tied to the history it came from; ``little verify`` checks it);
* a copy of every event of the origin's ``Run`` stream before the fork point's
  first ``StepStarted``, ``RunStarted`` first (with the fork's run id, and the
  new input if one is given), with the origin's timestamps;

and, for each agent step attempt of that prefix, a copy of its harness session
under the fork's own session id. Copying (rather than referencing the origin's
streams) keeps every promise of the log on the fork's own streams: each has its
own hash chain and head, its artifacts are made for it, and a replay, a report
or ``little verify`` of the fork reads nothing of another run except its
sub-runs, which stay where they are (a sub-run completed before the fork point
is the fork's sub-run too, and is not run again).

``at="plan#turn=3"`` forks inside the agent step ``plan``: the fork keeps the
step's session up to turn 2 (its model calls and tool calls, the sub-runs they
started), and resuming it calls the model again from turn 3.

What is not copied: the origin's outcomes and operations (``RunCompleted``,
``RunFailed``, ``RunCancelled``, ``RunResumed``, ``BudgetSet``,
``BudgetExceeded``, an origin's own ``RunForked``): a fork starts running, with
no budget until one is given.

Resuming the fork is ``run_workflow(world, workflow, run_id=FORK)``: the
restart checks hold the prefix to the log as for any run, and a workflow that
differs from the origin's after the fork point is adopted once, before anything
runs (``WorkflowAdopted``, :func:`~little_es.engine.integrity.fork_adopts`).
The fork is written in one transaction: it exists whole, or not at all.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

import orjson

from little_es.chain import is_framed, row_digest
from little_es.domain import Aggregate, HarnessSession, Run
from little_es.durability import (
    INPUT_PATH,
    OUTPUT_INLINE_LIMIT,
    OUTPUT_MEDIA_TYPE,
    encode_output,
    read_output,
)
from little_es.errors import (
    ConcurrencyConflictError,
    ForkError,
    ForkPointError,
    ForkRunExistsError,
    InvalidStepPathError,
    RunNotFoundError,
)
from little_es.events import (
    BudgetExceeded,
    BudgetSet,
    Event,
    ForkedSession,
    ForkOrigin,
    ModelCalled,
    ModelResponded,
    RunCancelled,
    RunCompleted,
    RunEvent,
    RunFailed,
    RunForked,
    RunResumed,
    RunStarted,
    SessionStarted,
    StepCompleted,
    StepStarted,
    SubRunReserved,
    ToolCallFailed,
    ToolCallStarted,
    ToolCallSucceeded,
    utc_now,
)
from little_es.ids import new_run_id as _fresh_run_id
from little_es.ids import run_stream_id, validate_run_id
from little_es.values import ArtifactRef
from little_es.workflow.paths import parse_step_path
from little_es.world import World

__all__ = ["fork_points", "fork_run"]

_NOT_COPIED: tuple[type[Event], ...] = (
    RunForked,
    RunCompleted,
    RunFailed,
    RunCancelled,
    RunResumed,
    BudgetSet,
    BudgetExceeded,
)
"""The origin's outcomes and operations: they are the origin's, not history a fork re-uses."""

_AT_RE = re.compile(r"(?P<path>[^#]+)(?:#turn=(?P<turn>[0-9]+))?")


@dataclass
class _Origin:
    """The origin run's ``Run`` stream as stored, and what it says about its steps."""

    run_id: str
    events: list[Event]
    rows: Sequence[tuple[int, str, bytes]]
    completed: dict[str, int] = field(default_factory=dict)
    """Top-level step path -> index of its ``StepCompleted`` in ``events``."""
    kinds: dict[str, str] = field(default_factory=dict)

    def digest(self, version: int) -> str:
        return _digest_hex(self.rows, version)


def _digest_hex(rows: Sequence[tuple[int, str, bytes]], version: int) -> str:
    data = rows[version - 1][2]
    # A row written before the chain has no digest of its own: pin nothing for it.
    return row_digest(data).hex() if is_framed(data) else ""


def _read_origin(world: World, run_id: str) -> _Origin:
    stream = run_stream_id(run_id)
    events = world.read_stream(stream)  # every row verified against the chain and head
    if not events:
        raise RunNotFoundError(run_id, world.name)
    origin = _Origin(run_id, events, world.backend.select_rows(stream, None))
    for index, event in enumerate(events):
        if isinstance(event, StepStarted):
            origin.kinds.setdefault(event.step_path, event.kind)
        elif isinstance(event, StepCompleted) and _top_level(event.step_path):
            origin.completed.setdefault(event.step_path, index)
    return origin


def _top_level(path: str) -> bool:
    try:
        return parse_step_path(path).group_id is None
    except InvalidStepPathError:
        return False


def _turns(events: Sequence[Event]) -> int:
    """How many turns of a session can be fork points: turn ``k`` is one when turn ``k`` was
    called and every turn before it has its response and every tool result."""
    called = {e.turn for e in events if isinstance(e, ModelCalled)}
    responded = {e.turn for e in events if isinstance(e, ModelResponded)}
    starts = {e.call_id: e.turn for e in events if isinstance(e, ToolCallStarted)}
    done = {e.call_id for e in events if isinstance(e, ToolCallSucceeded | ToolCallFailed)}
    open_turns = {turn for call_id, turn in starts.items() if call_id not in done}
    turns = 0
    while turns + 1 in called:
        previous = turns  # turn `turns + 1` needs turns 1..`turns` answered
        if previous and (previous not in responded or previous in open_turns):
            break
        turns += 1
    return turns


def _session_of(origin: _Origin, step_path: str) -> StepStarted | None:
    """The ``StepStarted`` of the attempt of ``step_path`` that completed."""
    end = origin.completed[step_path]
    for event in reversed(origin.events[:end]):
        if isinstance(event, StepStarted) and event.step_path == step_path:
            return event
    return None


def fork_points(world: World, run_id: str) -> tuple[str, ...]:
    """Every point ``run_id`` can be forked at, in the order the run reached them.

    A top-level step the run completed (``fetch``, ``review@2``), and for each
    agent step among them its turns (``plan#turn=1`` ... ``plan#turn=N``).
    Raises :class:`~little_es.errors.RunNotFoundError` for an unknown run.
    """
    _check_world(world)
    origin = _read_origin(world, validate_run_id(run_id))
    return _points(world, origin)


def _points(world: World, origin: _Origin) -> tuple[str, ...]:
    points: list[str] = []
    for path in origin.completed:
        points.append(path)
        if origin.kinds.get(path) == "agent":
            started = _session_of(origin, path)
            if started is not None and started.session_id is not None:
                turns = _turns(world.read_stream(started.session_id))
                points.extend(f"{path}#turn={t}" for t in range(1, turns + 1))
    return tuple(points)


def _shown_points(points: Sequence[str]) -> str:
    if not points:
        return "none: it completed no step yet"
    shown = [p for p in points if "#turn=" not in p]
    turns: dict[str, int] = {}
    for p in points:
        if "#turn=" in p:
            step, turn = p.split("#turn=")
            turns[step] = max(turns.get(step, 0), int(turn))
    return ", ".join(
        f"{p} ({p}#turn=1..{turns[p]})" if p in turns and turns[p] > 1 else p for p in shown
    )


def _check_world(world: object) -> None:
    if not isinstance(world, World):
        raise ForkError(
            f"world must be a little_es World, got {type(world).__name__}: open one with"
            " open_world(), local_world(path) or memory_world()"
        )


def _parse_at(at: object) -> tuple[str, int | None]:
    if not isinstance(at, str) or not at:
        raise ForkPointError(
            f"the fork point must be a step path such as 'review' or 'plan#turn=3', got {at!r}"
        )
    match = _AT_RE.fullmatch(at)
    if match is None:
        raise ForkPointError(
            f"fork point {at!r} is not STEP_PATH or STEP_PATH#turn=N (N >= 1), such as"
            " 'review', 'review@2' or 'plan#turn=3'"
        )
    path = match["path"]
    try:
        parts = parse_step_path(path)
    except InvalidStepPathError as exc:
        raise ForkPointError(f"fork point {at!r} is not a step path: {exc}") from exc
    if parts.group_id is not None:
        raise ForkPointError(
            f"fork point {at!r} is a branch of the parallel group {parts.group_id!r}: fork at"
            " the group (its branches run again), or at a step before or after it"
        )
    turn = match["turn"]
    if turn is not None and int(turn) < 1:
        raise ForkPointError(f"fork point {at!r}: turns are numbered from 1")
    return path, None if turn is None else int(turn)


def _refs_moved(world: World, event: Event, run_id: str) -> dict[str, Any]:
    """The event's artifact references, re-made for ``run_id`` (the bytes are verified on the
    way; content-addressed, so nothing is stored twice): a run's artifacts are its own."""

    def moved(ref: ArtifactRef) -> ArtifactRef:
        payload = world.artifacts.get(ref).payload
        return world.artifacts.put(
            payload, run_id=run_id, step_path=ref.step_path, media_type=ref.media_type
        )

    changes: dict[str, Any] = {}
    for name in type(event).model_fields:
        value = getattr(event, name)
        if isinstance(value, ArtifactRef):
            changes[name] = moved(value)
        elif isinstance(value, tuple) and any(isinstance(v, ArtifactRef) for v in value):
            changes[name] = tuple(moved(v) if isinstance(v, ArtifactRef) else v for v in value)
    return changes


def _kept_session_events(events: Sequence[Event], turn: int | None) -> list[Event]:
    """The session's events a fork keeps: all of them, or those of the turns before ``turn``."""
    if turn is None:
        return list(events)
    call_turn = {e.call_id: e.turn for e in events if isinstance(e, ToolCallStarted)}
    kept: list[Event] = []
    for event in events:
        if isinstance(event, ModelCalled | ModelResponded | ToolCallStarted):
            keep = event.turn < turn
        elif isinstance(event, ToolCallSucceeded | ToolCallFailed):
            keep = call_turn.get(event.call_id, turn) < turn
        else:
            keep = isinstance(event, SessionStarted)
        if keep:
            kept.append(event)
    return kept


def fork_run(
    world: World,
    run_id: str,
    *,
    at: str,
    new_run_id: str | None = None,
    input: Mapping[str, Any] | None = None,
) -> RunForked:
    """Start a new run that re-uses ``run_id``'s committed history up to the fork point ``at``.

    ``at`` is a top-level step the origin completed (``review``, ``review@2``):
    the fork keeps everything before it and runs it again; or a turn of such
    an agent step (``plan#turn=3``): the fork keeps that step's turns 1-2 and
    calls the model again from turn 3. ``input`` replaces the run input for the
    steps that run in the fork (None: the origin's). The fork runs with
    ``run_workflow(world, workflow, run_id=<the fork's id>)``, which re-uses
    every committed step, model call and tool call before the fork point; a
    workflow changed after the fork point is accepted then.

    Returns the fork's ``RunForked`` event (``.run_id``, ``.origin``). Raises
    :class:`~little_es.errors.RunNotFoundError` for an unknown origin,
    :class:`~little_es.errors.ForkPointError` for a fork point that is not a
    step path or names no step (or turn) the origin completed (the message
    lists those it can be forked at), :class:`~little_es.errors.ForkRunExistsError`
    when ``new_run_id`` is taken, :class:`~little_es.errors.InvalidRunIdError`
    for an invalid id, and :class:`~little_es.errors.ForkError` for other
    unusable arguments. Nothing is written unless the whole fork is.
    """
    _check_world(world)
    validate_run_id(run_id)
    fork_id = validate_run_id(new_run_id) if new_run_id is not None else new_run_id_for(run_id)
    if input is not None and not isinstance(input, Mapping):
        raise ForkError(
            f"input must be a mapping (the fork's run input) or None, got {type(input).__name__}"
        )
    path, turn = _parse_at(at)
    if not world.run_exists(run_id):
        raise RunNotFoundError(run_id, world.name)
    if fork_id == run_id or world.run_exists(fork_id):
        raise ForkRunExistsError(
            f"run {fork_id!r} exists already in world {world.name}: give the fork another run"
            " id (new_run_id=..., little fork --new-run-id), or none for a generated one"
        )
    origin = _read_origin(world, run_id)
    if path not in origin.completed:
        state = "did not complete" if path in origin.kinds else "was never reached"
        raise ForkPointError(
            f"run {run_id!r} cannot be forked at {at!r}: step {path!r} {state} in it. It can be"
            f" forked at a step it completed: {_shown_points(_points(world, origin))}"
        )
    first_start = next(
        i for i, e in enumerate(origin.events) if isinstance(e, StepStarted) and e.step_path == path
    )
    prefix: list[Event] = [e for e in origin.events[:first_start] if not isinstance(e, _NOT_COPIED)]
    cut_session: UUID | None = None
    if turn is not None:
        if origin.kinds.get(path) != "agent":
            raise ForkPointError(
                f"run {run_id!r} cannot be forked at {at!r}: step {path!r} is a"
                f" {origin.kinds.get(path)} step, and only an agent step has turns; fork at"
                f" {path!r}"
            )
        started = _session_of(origin, path)
        if started is None or started.session_id is None:
            raise ForkPointError(
                f"run {run_id!r} cannot be forked at {at!r}: step {path!r} recorded no harness"
                f" session to keep turns of; fork at {path!r}"
            )
        turns = _turns(world.read_stream(started.session_id))
        if turn > turns:
            raise ForkPointError(
                f"run {run_id!r} cannot be forked at {at!r}: step {path!r} recorded"
                f" {turns} turn(s) (attempt {started.attempt}); fork at {path}#turn=1.."
                f"{turns}, or at {path!r}"
            )
        cut_session = started.session_id
        # The attempts before the one that completed, then that one, in flight.
        end = origin.completed[path]
        attempt_start = origin.events.index(started)
        prefix.extend(
            e
            for e in origin.events[first_start : attempt_start + 1]
            if not isinstance(e, _NOT_COPIED)
        )
        kept_calls = {
            e.call_id
            for e in world.read_stream(cut_session)
            if isinstance(e, ToolCallStarted) and e.turn < turn
        }
        # Sub-runs reserved by the kept turns' calls are the fork's sub-runs too.
        prefix.extend(
            e
            for e in origin.events[attempt_start + 1 : end]
            if isinstance(e, SubRunReserved) and e.step_path == path and e.call_id in kept_calls
        )
    return _write_fork(world, origin, fork_id, at, path, turn, prefix, cut_session, input)


def new_run_id_for(run_id: str) -> str:
    """A fresh id for a fork of ``run_id``: ``{run_id}-fork-{8 hex digits}`` (shortened to fit)."""
    suffix = _fresh_run_id("fork").removeprefix("fork_")[:8]
    return validate_run_id(f"{run_id[:110]}-fork-{suffix}")


def _write_fork(
    world: World,
    origin: _Origin,
    fork_id: str,
    at: str,
    path: str,
    turn: int | None,
    prefix: list[Event],
    cut_session: UUID | None,
    input: Mapping[str, Any] | None,
) -> RunForked:
    origin_started = prefix[0]
    assert isinstance(origin_started, RunStarted)
    recorded_input = read_output(world, origin_started.input, origin_started.input_ref)
    input_changes: dict[str, Any]
    input_changed = False
    if input is None:
        input_changes = _refs_moved(world, origin_started, fork_id)
    else:
        data = encode_output(INPUT_PATH, dict(input))
        given = orjson.loads(data)
        # As JSON, not as Python values: 1.0, True and 1 are equal in Python, not to a
        # branches function that formats them.
        input_changed = data != orjson.dumps(recorded_input)
        if len(data) > OUTPUT_INLINE_LIMIT:
            ref = world.artifacts.put(
                data, run_id=fork_id, step_path=INPUT_PATH, media_type=OUTPUT_MEDIA_TYPE
            )
            input_changes = {"input": None, "input_ref": ref}
        else:
            input_changes = {"input": given, "input_ref": None}

    sessions: list[HarnessSession] = []
    copied: list[ForkedSession] = []
    plans: list[tuple[Event, dict[str, Any]]] = []
    for event in prefix:
        changes = _refs_moved(world, event, fork_id)
        if isinstance(event, RunStarted):
            changes = {
                **input_changes,
                "run_id": fork_id,
                "parent_run_id": None,
                "parent_step_path": None,
            }
        elif isinstance(event, StepStarted) and event.session_id is not None:
            session = HarnessSession(fork_id, event.step_path, event.attempt)
            changes["session_id"] = session.id
            source = event.session_id
            events = world.read_stream(source)
            kept = _kept_session_events(events, turn if source == cut_session else None)
            for session_event in kept:
                more = _refs_moved(world, session_event, fork_id)
                if isinstance(session_event, SessionStarted):
                    more["run_id"] = fork_id
                session.copy_in(session_event, **more)
            if kept:
                last = kept[-1].originator_version
                copied.append(
                    ForkedSession(
                        origin_session_id=source,
                        session_id=session.id,
                        origin_version=last,
                        origin_digest=_digest_hex(world.backend.select_rows(source, None), last),
                        copied_events=len(kept),
                    )
                )
                sessions.append(session)
        plans.append((event, changes))

    last_version = prefix[-1].originator_version
    forked = RunForked(
        timestamp=origin_started.timestamp,
        run_id=fork_id,
        origin=ForkOrigin(
            origin_run_id=origin.run_id,
            at=at,
            step_path=path,
            turn=turn,
            origin_version=last_version,
            origin_digest=origin.digest(last_version),
            copied_events=len(plans),
            sessions=tuple(copied),
            input_changed=input_changed,
            forked_at=utc_now(),
        ),
    )
    run = Run(fork_id, world.pricer)
    placed = run.copy_in(forked)
    for event, changes in plans:
        assert isinstance(event, RunEvent)
        run.copy_in(event, **changes)
    streams: list[Aggregate] = [run, *sessions]
    with world.run_lease(fork_id):
        if world.run_exists(fork_id):
            raise ForkRunExistsError(
                f"run {fork_id!r} was started while the fork was being made: give the fork"
                " another run id"
            )
        try:
            world.save(*streams)
        except ConcurrencyConflictError as exc:
            raise ForkRunExistsError(
                f"run {fork_id!r} was written by another process first: give the fork another"
                " run id"
            ) from exc
    return placed

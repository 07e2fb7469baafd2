"""One conformance suite for every storage backend (memory, SQLite, PostgreSQL).

Each test uses the ``world`` fixture of ``conftest.py`` and so runs once per
backend; tests that need storage surviving a close are restricted to the
persistent backends with ``@pytest.mark.backends("sqlite", "postgres")``.
"""

from __future__ import annotations

import hashlib
import os
import re
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING, Any
from uuid import UUID

import psycopg
import pytest
from psycopg import sql

from little_es.backends.memory import MemoryArtifactStore
from little_es.backends.sqlite import FileArtifactStore
from little_es.domain import HarnessSession, Run
from little_es.errors import (
    ArtifactIntegrityError,
    ArtifactNotFoundError,
    ConcurrencyConflictError,
    ConcurrentRunError,
    InvalidRunIdError,
    RunNotFoundError,
)
from little_es.events import (
    ModelCalled,
    ModelResponded,
    ParallelBranchScheduled,
    RunCompleted,
    RunStarted,
    SessionCompleted,
    SessionStarted,
    Snapshot,
    StepCompleted,
    StepFailed,
    StepStarted,
    SubRunReserved,
    ToolCallFailed,
    ToolCallStarted,
    ToolCallSucceeded,
)
from little_es.ids import run_stream_id, session_stream_id
from little_es.materialize import materialize_run_state
from little_es.pricing import price_usage
from little_es.values import ArtifactRef, ErrorInfo, Message, ModelResponse, ToolCall, Usage
from little_es.world import LittleApplication, World, postgres_world

if TYPE_CHECKING:
    from conftest import WorldSpec

_REPO = Path(__file__).resolve().parents[1]

# --------------------------------------------------------------------- builders


def _start_run(run_id: str, *, parent_run_id: str | None = None) -> Run:
    run = Run(run_id, price_usage)
    run.trigger(
        RunStarted,
        run_id=run_id,
        workflow_id="triage",
        workflow_version="3",
        ir_hash="f" * 64,
        input={"ticket": 42, "tags": ["a", "b"], "nested": {"x": 1.5, "text": "héllo ✓ 🚀"}},
        parent_run_id=parent_run_id,
    )
    return run


_Each = Callable[[HarnessSession], None]


def _nothing(session: HarnessSession) -> None:
    """The default ``each``: leave the events queued."""


def _turn(
    session: HarnessSession, turn: int, *, tool_fails: bool = False, each: _Each = _nothing
) -> None:
    """One model call that asks for one tool, and the tool's outcome.

    ``each`` runs after every event (pass ``world.save`` to write ahead one at a time).
    """
    call_id = f"c{turn}"
    session.trigger(
        ModelCalled,
        turn=turn,
        messages=(Message(role="user", content=f"question {turn}: " + "lorem ipsum " * 10),),
        conversation_hash=f"{turn:064x}",
    )
    each(session)
    session.trigger(
        ModelResponded,
        turn=turn,
        response=ModelResponse(
            content=f"answer {turn}",
            tool_calls=(ToolCall(id=call_id, name="lookup", arguments={"q": [turn, "x"]}),),
            usage=Usage(input_tokens=100 + turn, output_tokens=20, cached_input_tokens=5),
            provider="openai",
            model="gpt-4o-mini",
        ),
    )
    each(session)
    session.trigger(ToolCallStarted, turn=turn, call_id=call_id, name="lookup", args={"q": turn})
    each(session)
    if tool_fails:
        session.trigger(
            ToolCallFailed,
            call_id=call_id,
            error=ErrorInfo(type="TimeoutError", message="slow", retryable=True),
        )
    else:
        session.trigger(ToolCallSucceeded, call_id=call_id, result={"rows": [turn, turn + 1]})
    each(session)


def _agent_step(
    run: Run, step_path: str, *, turns: int = 2, attempt: int = 1, each: _Each = _nothing
) -> HarnessSession:
    """Start an agent step on ``run`` and drive its session to completion.

    Nothing of the run is saved; ``each`` runs after every session event.
    """
    assert run.run_id is not None
    session = HarnessSession(run.run_id, step_path, attempt)
    run.trigger(
        StepStarted,
        step_path=step_path,
        step_id=step_path.split("/")[-1],
        kind="agent",
        visit=1,
        attempt=attempt,
        session_id=session.id,
    )
    session.trigger(
        SessionStarted,
        run_id=run.run_id,
        step_path=step_path,
        attempt=attempt,
        manifest={"model": "gpt-4o-mini", "tools": ["lookup"]},
        manifest_hash="a" * 64,
    )
    each(session)
    for turn in range(1, turns + 1):
        _turn(session, turn, tool_fails=turn == 2, each=each)
    session.trigger(
        SessionCompleted, usage=Usage(input_tokens=1, output_tokens=2), turns=turns, output="done"
    )
    each(session)
    run.trigger(
        StepCompleted,
        step_path=step_path,
        step_id=step_path.split("/")[-1],
        visit=1,
        attempt=attempt,
        output={"answer": "done", "score": 0.25},
    )
    return session


def _task_steps(run: Run, count: int, *, prefix: str = "t") -> None:
    """``count`` task steps, with a retried failure, a parallel group and a sub-run."""
    for i in range(count):
        path = f"{prefix}{i}"
        run.trigger(StepStarted, step_path=path, step_id=path, kind="task", visit=1, attempt=1)
        if i % 3 == 1:
            run.trigger(
                StepFailed,
                step_path=path,
                step_id=path,
                visit=1,
                attempt=1,
                error=ErrorInfo(type="ValueError", message=f"bad {i}"),
                will_retry=True,
            )
            run.trigger(StepStarted, step_path=path, step_id=path, kind="task", visit=1, attempt=2)
        if i % 4 == 2:
            run.trigger(
                ParallelBranchScheduled, step_path=path, step_id=path, branch_keys=("k1", "k2")
            )
        if i % 5 == 3:
            run.trigger(SubRunReserved, step_path=path, sub_run_id=f"sub_{i}", workflow_id="child")
        run.trigger(
            StepCompleted,
            step_path=path,
            step_id=path,
            visit=1,
            attempt=2 if i % 3 == 1 else 1,
            output={"i": i},
            next_step=f"{prefix}{i + 1}" if i % 2 else None,
        )


def _session_view(session: HarnessSession | None) -> tuple[Any, ...]:
    """Everything a HarnessSession's state holds, comparable with ==."""
    assert session is not None
    return (
        session.id,
        session.version,
        session.started,
        session.called,
        session.responses,
        session.tool_calls,
        session.tool_results,
        session.completed,
    )


# ------------------------------------------------------------------- round trip


def test_events_round_trip_with_their_types(world: World) -> None:
    run = _start_run("run_roundtrip")
    session = _agent_step(run, "plan/draft", turns=3)
    ref = world.artifacts.put(b"report", run_id="run_roundtrip", step_path="plan/draft")
    run.trigger(
        StepStarted, step_path="publish", step_id="publish", kind="task", visit=1, attempt=1
    )
    run.trigger(
        StepCompleted,
        step_path="publish",
        step_id="publish",
        visit=1,
        attempt=1,
        output_ref=ref,
        artifact_refs=(ref,),
    )
    run.trigger(ParallelBranchScheduled, step_path="fan", step_id="fan", branch_keys=("x", "y"))
    run.trigger(RunCompleted, output={"ok": True})
    written_run, written_session = run.pending_events, session.pending_events

    world.save(run, session)

    read_run = world.read_stream(run.id)
    read_session = world.read_stream(session.id)
    assert read_run == list(written_run)
    assert read_session == list(written_session)
    assert [type(e) for e in read_run] == [type(e) for e in written_run]
    for event in [*read_run, *read_session]:
        assert event.timestamp.tzinfo is not None
        assert event.timestamp.utcoffset() == timedelta(0)
        assert isinstance(event.originator_id, UUID)
    started = next(e for e in read_run if isinstance(e, StepStarted) and e.kind == "agent")
    assert isinstance(started.session_id, UUID) and started.session_id == session.id
    called = next(e for e in read_session if isinstance(e, ModelCalled))
    assert isinstance(called.messages, tuple) and isinstance(called.messages[0], Message)
    responded = next(e for e in read_session if isinstance(e, ModelResponded))
    assert isinstance(responded.response, ModelResponse)
    assert isinstance(responded.response.tool_calls, tuple)
    assert responded.response.tool_calls[0].arguments == {"q": [1, "x"]}
    assert responded.response.usage == Usage(
        input_tokens=101, output_tokens=20, cached_input_tokens=5
    )
    completed = next(e for e in read_run if isinstance(e, StepCompleted) and e.output_ref)
    assert completed.output_ref == ref and completed.artifact_refs == (ref,)
    assert isinstance(completed.artifact_refs, tuple)
    branches = next(e for e in read_run if isinstance(e, ParallelBranchScheduled))
    assert branches.branch_keys == ("x", "y")
    first = read_run[0]
    assert isinstance(first, RunStarted)
    assert first.input["nested"]["text"] == "héllo ✓ 🚀"


def test_read_stream_after_version(world: World) -> None:
    run = _start_run("run_after")
    _task_steps(run, 3)
    world.save(run)
    everything = world.read_stream(run.id)
    assert world.read_stream(run.id, after=2) == everything[2:]
    assert world.read_stream(run.id, after=len(everything)) == []


# ------------------------------------------------------------------ run log


def test_read_run_log_merges_sessions_and_never_another_run(world: World) -> None:
    parent = _start_run("run_parent")
    first = _agent_step(parent, "a", turns=2)
    parent.trigger(SubRunReserved, step_path="b", sub_run_id="run_child", workflow_id="child")
    world.save(parent, first)
    second = _agent_step(parent, "c", turns=1)
    world.save(parent, second)

    child = _start_run("run_child", parent_run_id="run_parent")
    child_session = _agent_step(child, "a", turns=2)
    world.save(child, child_session)
    stranger = _start_run("run_stranger")
    world.save(stranger)

    log = world.read_run_log("run_parent")

    expected = [
        *world.read_stream(parent.id),
        *world.read_stream(first.id),
        *world.read_stream(second.id),
    ]
    assert {(e.originator_id, e.originator_version) for e in log} == {
        (e.originator_id, e.originator_version) for e in expected
    }
    assert len(log) == len(expected)
    assert {e.originator_id for e in log} == {parent.id, first.id, second.id}
    assert child.id not in {e.originator_id for e in log}
    assert child_session.id not in {e.originator_id for e in log}
    timestamps = [e.timestamp for e in log]
    assert timestamps == sorted(timestamps)
    for stream_id in (parent.id, first.id, second.id):
        versions = [e.originator_version for e in log if e.originator_id == stream_id]
        assert versions == list(range(1, len(versions) + 1))
    # The child's log is its own, and does not reach back into the parent.
    child_log = world.read_run_log("run_child")
    assert {e.originator_id for e in child_log} == {child.id, child_session.id}


def test_unknown_run_is_reported(world: World) -> None:
    assert not world.run_exists("run_nobody")
    with pytest.raises(RunNotFoundError, match="run_nobody"):
        world.read_run_log("run_nobody")
    with pytest.raises(RunNotFoundError, match="run_nobody"):
        world.load_run("run_nobody")
    assert world.load_session(session_stream_id("run_nobody", "a", 1)) is None
    assert world.load_outer_loop("loop_nobody") is None
    world.save(_start_run("run_somebody"))
    assert world.run_exists("run_somebody")


# --------------------------------------------------------- optimistic concurrency


def test_second_writer_at_the_same_version_conflicts_and_writes_nothing(world: World) -> None:
    world.save(_start_run("run_race"))
    mine = world.load_run("run_race")
    theirs = world.load_run("run_race")
    mine.trigger(StepStarted, step_path="a", step_id="a", kind="task", visit=1, attempt=1)
    world.save(mine)
    theirs.trigger(StepStarted, step_path="b", step_id="b", kind="task", visit=1, attempt=1)
    theirs.trigger(StepStarted, step_path="c", step_id="c", kind="task", visit=1, attempt=1)

    with pytest.raises(ConcurrencyConflictError, match="reload and retry"):
        world.save(theirs)

    stored = world.read_stream(run_stream_id("run_race"))
    assert [type(e) for e in stored] == [RunStarted, StepStarted]
    assert isinstance(stored[1], StepStarted) and stored[1].step_path == "a"
    # The loser reloads and retries on top of the winner.
    retry = world.load_run("run_race")
    retry.trigger(StepStarted, step_path="b", step_id="b", kind="task", visit=1, attempt=1)
    world.save(retry)
    assert len(world.read_stream(run_stream_id("run_race"))) == 3


@pytest.mark.parametrize("stale_first", [True, False], ids=["stale-first", "stale-last"])
def test_multi_aggregate_save_is_atomic(world: World, stale_first: bool) -> None:
    run = _start_run("run_atomic")
    session = HarnessSession("run_atomic", "a", 1)
    session.trigger(
        SessionStarted,
        run_id="run_atomic",
        step_path="a",
        attempt=1,
        manifest={},
        manifest_hash="h",
    )
    world.save(run, session)
    stale_session = world.load_session(session.id)
    assert stale_session is not None
    winner = world.load_session(session.id)
    assert winner is not None
    _turn(winner, 1)
    world.save(winner)

    fresh_run = world.load_run("run_atomic")
    fresh_run.trigger(StepStarted, step_path="a", step_id="a", kind="agent", visit=1, attempt=1)
    _turn(stale_session, 1)
    pair = (stale_session, fresh_run) if stale_first else (fresh_run, stale_session)

    with pytest.raises(ConcurrencyConflictError):
        world.save(*pair)

    assert [type(e) for e in world.read_stream(run.id)] == [RunStarted]
    assert len(world.read_stream(session.id)) == 1 + 4


def test_multi_aggregate_save_commits_all(world: World) -> None:
    run = _start_run("run_both")
    session = _agent_step(run, "a")
    world.save(run, session)
    assert world.load_run("run_both").version == 3
    loaded = world.load_session(session.id)
    assert loaded is not None and loaded.version == len(world.read_stream(session.id)) == 10


# -------------------------------------------------------------------- snapshots


@pytest.fixture
def small_snapshot_intervals(monkeypatch: pytest.MonkeyPatch) -> tuple[int, int]:
    """Snapshot Runs every 4 and HarnessSessions every 5 events in worlds opened after this.

    Open the world inside the test (``world_factory``), not with the ``world``
    fixture: whether a world has a snapshot store is decided when it is opened.
    """
    monkeypatch.setitem(LittleApplication.snapshotting_intervals, Run, 4)
    monkeypatch.setitem(LittleApplication.snapshotting_intervals, HarnessSession, 5)
    return 4, 5


def _snapshot_versions(world: World, stream_id: UUID) -> list[int]:
    assert world.app.snapshots is not None
    rows = world.app.snapshots.recorder.select_events(stream_id)
    assert {r.topic for r in rows} <= {Snapshot.wire_name}
    return [r.originator_version for r in rows]


def _spy_event_reads(world: World, monkeypatch: pytest.MonkeyPatch) -> list[int | None]:
    """Record the ``gt`` version each aggregate load starts reading events after."""
    store = world.app.repository.event_store
    real_get = store.get
    starts: list[int | None] = []

    def get(*args: Any, **kwargs: Any) -> Any:
        starts.append(kwargs.get("gt"))
        return real_get(*args, **kwargs)

    monkeypatch.setattr(store, "get", get)
    return starts


def test_snapshots_are_written_and_loads_equal_a_full_fold(
    small_snapshot_intervals: tuple[int, int],
    world_factory: Callable[[], World],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    run_interval, session_interval = small_snapshot_intervals
    world = world_factory()  # opened after the intervals are set: they pick the snapshot store
    run = _start_run("run_snap")
    world.save(run)
    session = HarnessSession("run_snap", "agent", 1)
    run.trigger(
        StepStarted,
        step_path="agent",
        step_id="agent",
        kind="agent",
        visit=1,
        attempt=1,
        session_id=session.id,
    )
    session.trigger(
        SessionStarted,
        run_id="run_snap",
        step_path="agent",
        attempt=1,
        manifest={},
        manifest_hash="h",
    )
    saved_at: dict[UUID, list[int]] = {run.id: [], session.id: []}

    def save(*aggregates: Run | HarnessSession) -> None:
        world.save(*aggregates)
        for a in aggregates:
            saved_at[a.id].append(a.version)

    save(run, session)
    # Harness events are written ahead one or two at a time, as the runtime does.
    for turn in range(1, 6):
        _turn(session, turn, tool_fails=turn == 3, each=save)
    _task_steps(run, 7)
    save(run)

    run_events = world.read_stream(run.id)
    session_events = world.read_stream(session.id)
    assert len(run_events) > 3 * run_interval and len(session_events) > 3 * session_interval
    run_snaps = _snapshot_versions(world, run.id)
    session_snaps = _snapshot_versions(world, session.id)
    # One at each save that reached interval * 2**k events, at the version saved.
    assert run_snaps == _doublings([1, *saved_at[run.id]], run_interval) == [len(run_events)]
    assert session_snaps == _doublings([0, *saved_at[session.id]], session_interval)
    assert session_snaps == [5, 10, 20]
    # A load reads at most the later half of the stream after its snapshot.
    assert session_snaps[-1] >= len(session_events) / 2

    starts = _spy_event_reads(world, monkeypatch)
    loaded_run = world.load_run("run_snap")
    loaded_session = world.load_session(session.id)
    assert starts == [run_snaps[-1], session_snaps[-1]]

    assert loaded_run.version == len(run_events)
    assert loaded_run.run_id == "run_snap"
    assert loaded_run.fold.freeze() == materialize_run_state(run_events, pricer=price_usage)
    assert loaded_run.fold.freeze() == run.fold.freeze()
    folded_session = HarnessSession.from_events(session.id, session_events)
    assert _session_view(loaded_session) == _session_view(folded_session)
    assert _session_view(loaded_session) == _session_view(session)

    # An aggregate restored from a snapshot keeps writing at the right version.
    assert loaded_session is not None
    _turn(loaded_session, 6)
    loaded_run.trigger(RunCompleted, output=None)
    world.save(loaded_run, loaded_session)
    assert world.load_run("run_snap").fold.freeze() == materialize_run_state(
        world.read_stream(run.id), pricer=price_usage
    )
    assert _session_view(world.load_session(session.id)) == _session_view(
        HarnessSession.from_events(session.id, world.read_stream(session.id))
    )


def _doublings(saved_versions: list[int], interval: int) -> list[int]:
    """The versions of the saves (after the first) that reached ``interval * 2**k`` events."""
    marks = [interval << k for k in range(32)]
    return [v for before, v in pairwise(saved_versions) if any(before < m <= v for m in marks)]


def test_batch_save_reaching_several_doublings_snapshots_once_at_its_version(
    small_snapshot_intervals: tuple[int, int], world_factory: Callable[[], World]
) -> None:
    world = world_factory()
    run = _start_run("run_batch")
    _task_steps(run, 6)
    world.save(run)
    count = len(world.read_stream(run.id))
    assert count > 2 * 4
    assert _snapshot_versions(world, run.id) == [count]
    assert world.load_run("run_batch").fold.freeze() == run.fold.freeze()


# -------------------------------------------------------------------- artifacts


def _tamper(spec: WorldSpec, world: World, ref: ArtifactRef, data: bytes) -> None:
    """Overwrite an artifact's stored bytes behind the store's back (disk corruption)."""
    if spec.backend == "memory":
        assert isinstance(world.artifacts, MemoryArtifactStore)
        world.artifacts._blobs[ref.sha256] = data
    elif spec.backend == "sqlite":
        assert isinstance(world.artifacts, FileArtifactStore)
        assert spec.data_dir is not None
        path = spec.data_dir / "artifacts" / ref.sha256[:2] / ref.sha256
        assert path.is_file()
        path.write_bytes(data)
    else:
        with spec.connect_postgres() as conn:
            cur = conn.execute(
                "UPDATE little_es_artifacts SET data = %s WHERE sha256 = %s", (data, ref.sha256)
            )
            assert cur.rowcount == 1


def test_artifact_put_get_exists(world: World) -> None:
    data = b"\x00binary\xffpayload" * 100
    ref = world.artifacts.put(data, run_id="run_art", step_path="a/b", media_type="text/plain")
    assert ref.sha256 == hashlib.sha256(data).hexdigest()
    assert ref.artifact_id == f"sha256:{ref.sha256}"
    assert (ref.size, ref.media_type, ref.run_id, ref.step_path) == (
        len(data),
        "text/plain",
        "run_art",
        "a/b",
    )
    assert world.artifacts.exists(ref)
    hydrated = world.artifacts.get(ref)
    assert hydrated.payload == data and hydrated.manifest == ref
    assert (
        world.artifacts.put(data, run_id="run_art", step_path="a/b", media_type="text/plain") == ref
    )


def test_tampered_artifact_is_refused(world: World, world_spec: WorldSpec) -> None:
    ref = world.artifacts.put(b"the real bytes", run_id="run_art", step_path="s")
    _tamper(world_spec, world, ref, b"the evil bytes")
    assert world.artifacts.exists(ref)
    with pytest.raises(ArtifactIntegrityError, match=r"run_art.*'s'.*corrupt"):
        world.artifacts.get(ref)


def test_missing_artifact_is_reported(world: World) -> None:
    data = b"never stored here"
    sha = hashlib.sha256(data).hexdigest()
    ref = ArtifactRef(
        artifact_id=f"sha256:{sha}", sha256=sha, size=len(data), run_id="run_art", step_path="s"
    )
    assert not world.artifacts.exists(ref)
    with pytest.raises(ArtifactNotFoundError, match=r"run_art.*missing"):
        world.artifacts.get(ref)


# ----------------------------------------------------------------------- leases


def test_second_lease_on_a_run_is_refused_until_released(world: World) -> None:
    with world.run_lease("run_lease"):
        with pytest.raises(ConcurrentRunError, match="run_lease"), world.run_lease("run_lease"):
            pytest.fail("a second holder got the lease")
        with world.run_lease("run_other"):
            pass
    with world.run_lease("run_lease"):
        pass


def test_lease_is_released_when_the_block_raises(world: World) -> None:
    with pytest.raises(RuntimeError), world.run_lease("run_lease"):
        raise RuntimeError("step crashed")
    with world.run_lease("run_lease"):
        pass


@pytest.mark.backends("sqlite", "postgres")
def test_lease_excludes_another_world_on_the_same_storage(
    world: World, world_factory: Callable[[], World]
) -> None:
    other = world_factory()
    with (
        world.run_lease("run_lease"),
        pytest.raises(ConcurrentRunError),
        other.run_lease("run_lease"),
    ):
        pytest.fail("a second world got the lease")
    with other.run_lease("run_lease"):
        pass


_HOLD_LEASE = textwrap.dedent(
    """
    import sys, time
    from little_es.world import open_world
    world = open_world()
    with world.run_lease(sys.argv[1]):
        print("held", flush=True)
        time.sleep(120)
    """
)


@pytest.mark.backends("sqlite", "postgres")
def test_lease_dies_with_a_killed_holder(world: World, world_spec: WorldSpec) -> None:
    env = {**os.environ, "LITTLE_ES_WORLD": world_spec.url, "PYTHONPATH": str(_REPO)}
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD_LEASE, "run_lease"],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(ConcurrentRunError), world.run_lease("run_lease"):
            pytest.fail("got a lease another process holds")
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
        if holder.stdout is not None:
            holder.stdout.close()
    # PostgreSQL notices the dead client's connection a moment later.
    deadline = time.monotonic() + 20
    while True:
        try:
            with world.run_lease("run_lease"):
                break
        except ConcurrentRunError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


@pytest.mark.backends("postgres")
def test_postgres_leases_are_scoped_to_the_worlds_schema(
    world: World, world_spec: WorldSpec
) -> None:
    assert world_spec.dsn is not None
    other_schema = f"{world_spec.schema}_b"
    with psycopg.connect(world_spec.dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(other_schema)))
    try:
        with (
            postgres_world(world_spec.dsn, schema=other_schema) as neighbour,
            world.run_lease("run_lease"),
            neighbour.run_lease("run_lease"),
        ):
            pass
    finally:
        with psycopg.connect(world_spec.dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(other_schema)))


@pytest.mark.backends("postgres")
def test_postgres_lease_closes_its_connection_when_the_lock_query_fails(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened: list[psycopg.Connection[Any]] = []
    real_connect = psycopg.connect

    def connect(*args: Any, **kwargs: Any) -> psycopg.Connection[Any]:
        opened.append(real_connect(*args, **kwargs))
        return opened[-1]

    def execute(*args: Any, **kwargs: Any) -> Any:
        raise psycopg.OperationalError("the server went away")

    with monkeypatch.context() as patched:
        patched.setattr(psycopg, "connect", connect)
        patched.setattr(psycopg.Connection, "execute", execute)
        with pytest.raises(psycopg.OperationalError, match="went away"):
            world.run_lease("run_lease_fails").__enter__()
    assert len(opened) == 1 and opened[0].closed
    with world.run_lease("run_lease_fails"):
        pass


# --------------------------------------------------------------------- bad ids


@pytest.mark.parametrize("bad", ["../etc/passwd", "a/b", "", "x" * 200, "nul\x00byte"])
def test_bad_run_ids_are_refused_by_every_entry_point(world: World, bad: str) -> None:
    calls: list[Callable[[], object]] = [
        lambda: world.read_run_log(bad),
        lambda: world.load_run(bad),
        lambda: world.run_exists(bad),
        lambda: world.record_run_event(bad, StepStarted),
        lambda: world.run_lease(bad).__enter__(),
        lambda: world.artifacts.put(b"x", run_id=bad, step_path="s"),
        lambda: Run(bad, price_usage),
        lambda: HarnessSession(bad, "s", 1),
    ]
    for call in calls:
        with pytest.raises(InvalidRunIdError):
            call()


# ------------------------------------------------------------------ durability


@pytest.mark.backends("sqlite", "postgres")
def test_everything_survives_close_and_reopen(
    small_snapshot_intervals: tuple[int, int], world_factory: Callable[[], World]
) -> None:
    world = world_factory()
    run = _start_run("run_durable")
    session = _agent_step(run, "a", turns=3)
    ref = world.artifacts.put(b"kept", run_id="run_durable", step_path="a")
    world.save(run, session)
    run_events, session_events = world.read_stream(run.id), world.read_stream(session.id)
    log = world.read_run_log("run_durable")
    world.close()

    reopened = world_factory()
    assert reopened.read_stream(run.id) == run_events
    assert reopened.read_stream(session.id) == session_events
    assert reopened.read_run_log("run_durable") == log
    assert reopened.load_run("run_durable").fold.freeze() == run.fold.freeze()
    assert _session_view(reopened.load_session(session.id)) == _session_view(session)
    assert reopened.artifacts.get(ref).payload == b"kept"
    # And it keeps going where the first world stopped.
    more = reopened.load_run("run_durable")
    more.trigger(RunCompleted, output="fin")
    reopened.save(more)
    assert len(reopened.read_stream(run.id)) == len(run_events) + 1


# -------------------------------------------------- insert-only: never UPDATE/DELETE


def _full_exercise(open_world: Callable[[], World]) -> int:
    """Drive a world through every write path; return how many events it stored."""
    world = open_world()
    run = _start_run("run_full")
    world.save(run)
    for step in range(3):
        _agent_step(run, f"agent{step}", turns=3, each=world.save)
        world.save(run)
    _task_steps(run, 8)
    world.save(run)
    stale = world.load_run("run_full")
    winner = world.load_run("run_full")
    winner.trigger(StepStarted, step_path="z", step_id="z", kind="task", visit=1, attempt=1)
    world.save(winner)
    stale.trigger(StepStarted, step_path="y", step_id="y", kind="task", visit=1, attempt=1)
    with pytest.raises(ConcurrencyConflictError):
        world.save(stale)
    ref = world.artifacts.put(b"blob", run_id="run_full", step_path="z")
    world.artifacts.put(b"blob", run_id="run_full", step_path="z")
    with world.run_lease("run_full"):
        world.artifacts.get(ref)
    world.read_run_log("run_full")
    world.close()

    again = open_world()
    resumed = again.load_run("run_full")
    resumed.trigger(RunCompleted, output=None)
    again.save(resumed)
    total = len(again.read_run_log("run_full"))
    again.close()
    return total


_MUTATION = re.compile(r"\b(UPDATE|DELETE|REPLACE|DROP|TRUNCATE|ALTER)\b", re.IGNORECASE)


@pytest.mark.backends("sqlite")
def test_sqlite_never_updates_or_deletes_events(
    world_spec: WorldSpec,
    monkeypatch: pytest.MonkeyPatch,
    small_snapshot_intervals: tuple[int, int],
) -> None:
    statements: list[str] = []
    real_connect = sqlite3.connect

    def traced_connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        conn: sqlite3.Connection = real_connect(*args, **kwargs)
        conn.set_trace_callback(statements.append)
        return conn

    monkeypatch.setattr(sqlite3, "connect", traced_connect)
    total = _full_exercise(world_spec.open)

    on_events = [s for s in statements if re.search(r"stored_(events|snapshots)", s)]
    assert any(s.lstrip().upper().startswith("INSERT INTO STORED_EVENTS") for s in on_events)
    assert any(s.lstrip().upper().startswith("INSERT INTO STORED_SNAPSHOTS") for s in on_events)
    mutations = [s for s in on_events if _MUTATION.search(s)]
    assert mutations == []
    assert total > 50


@pytest.mark.backends("postgres")
def test_postgres_never_updates_or_deletes_events(
    world_spec: WorldSpec, small_snapshot_intervals: tuple[int, int]
) -> None:
    # Create the tables, then make every UPDATE, DELETE or TRUNCATE on them raise,
    # even one that would match no row (statement-level triggers).
    world_spec.open().close()
    with world_spec.connect_postgres() as conn:
        conn.execute(
            "CREATE FUNCTION little_es_refuse() RETURNS trigger LANGUAGE plpgsql AS $$"
            " BEGIN RAISE EXCEPTION 'little_es test: % on % is forbidden', TG_OP, TG_TABLE_NAME;"
            " END $$"
        )
        for table in ("littlees_events", "littlees_snapshots"):
            conn.execute(
                f"CREATE TRIGGER refuse_mutation BEFORE UPDATE OR DELETE OR TRUNCATE ON {table}"
                " FOR EACH STATEMENT EXECUTE FUNCTION little_es_refuse()"
            )

    total = _full_exercise(world_spec.open)

    assert total > 50
    with world_spec.connect_postgres() as conn:
        count = conn.execute("SELECT count(*) FROM littlees_events").fetchone()
        snaps = conn.execute("SELECT count(*) FROM littlees_snapshots").fetchone()
        assert count is not None and isinstance(count[0], int) and count[0] >= total
        assert snaps is not None and isinstance(snaps[0], int) and snaps[0] > 0
        # The trap itself works: a no-op DELETE is refused.
        with pytest.raises(psycopg.errors.RaiseException, match="DELETE on littlees_events"):
            conn.execute("DELETE FROM littlees_events WHERE false")


def test_timestamps_are_recorded_in_utc(world: World) -> None:
    before = datetime.now(UTC)
    world.save(_start_run("run_clock"))
    [event] = world.read_stream(run_stream_id("run_clock"))
    assert before <= event.timestamp <= datetime.now(UTC)

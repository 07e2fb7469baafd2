"""The runs read model: exactly once, durable, caught up after downtime, equal to replay."""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest
from conftest import WorldSpec
from eventsourcing.persistence import IntegrityError, StoredEvent, Tracking

from little_es import projections
from little_es.backends.base import RunSummary
from little_es.domain import OuterLoop
from little_es.errors import LogTamperedError, RunsProjectionError
from little_es.events import OuterLoopStarted, utc_now
from little_es.ids import run_stream_id
from little_es.projections import RunsProjection, list_runs
from little_es.replay import replay_run
from little_es.testing.logs import RunWriter, append_raw_row, priced, unpriced, write_agent_run
from little_es.world import World, local_world


def _by_id(world: World) -> dict[str, RunSummary]:
    return {s.run_id: s for s in RunsProjection(world).runs()}


def _assert_matches_replay(world: World, summary: RunSummary) -> None:
    state = replay_run(world, summary.run_id).state
    assert summary.usage == state.usage
    assert summary.status == state.status
    assert summary.workflow_id == state.workflow_id
    assert summary.started_at == state.started_at
    assert summary.updated_at == state.updated_at
    assert summary.completed_at == state.completed_at
    assert summary.event_count == state.event_count
    assert summary.steps == len(state.steps)
    assert summary.steps_completed == len(
        [s for s in state.steps.values() if s.status == "completed"]
    )


def _write_mixed_runs(world: World) -> None:
    a = RunWriter(world, "run_a")
    b = RunWriter(world, "run_b")
    # Interleaved in the notification log: each session must still go to its own run.
    a.agent_step("plan", [priced(), unpriced()])
    b.agent_step("plan", [unpriced(input_tokens=5)])
    a.agent_step("work", [priced(input_tokens=77, cached_input_tokens=64)] * 2)
    b.start_step("broken")
    b.fail_step("broken")
    b.fail("broken")
    a.complete("ok")


def test_projection_equals_replay_for_every_run(world: World) -> None:
    _write_mixed_runs(world)
    runs = list_runs(world)
    assert [r.run_id for r in runs] == ["run_a", "run_b"]
    for summary in runs:
        _assert_matches_replay(world, summary)
    a, b = runs
    assert a.status == "completed" and a.steps_completed == 2
    assert a.usage.unpriced_calls == 1 and a.usage.cost_usd is not None
    assert b.status == "failed" and b.steps_failed == 1 and b.steps_completed == 1
    assert b.usage.cost_usd is None and b.usage.unpriced_calls == 1


def test_catching_up_twice_applies_each_event_once(world: World) -> None:
    _write_mixed_runs(world)
    projection = RunsProjection(world)
    read = projection.catch_up()
    assert read == world.app.recorder.max_notification_id()
    assert projection.position == read
    first = projection.runs()
    assert projection.catch_up() == 0
    assert RunsProjection(world).catch_up() == 0
    assert projection.runs() == first
    assert list_runs(world) == first


def test_catch_up_after_downtime(
    world: World, world_factory: Callable[[], World], backend: str
) -> None:
    write_agent_run(world, "run_early", steps=1, calls_per_step=2)
    assert [r.run_id for r in list_runs(world)] == ["run_early"]
    position = RunsProjection(world).position

    # The projection is not running while these are written (by another process).
    writer = world if backend == "memory" else world_factory()
    more = RunWriter(writer, "run_early_more")
    more.agent_step("x", [priced()] * 3)
    late = RunWriter(writer, "run_late")
    late.agent_step("y", [unpriced()], complete=False)
    if writer is not world:
        writer.close()

    later = world if backend == "memory" else world_factory()
    projection = RunsProjection(later)
    assert projection.position == position
    read = projection.catch_up()
    assert read == (later.app.recorder.max_notification_id() or 0) - (position or 0)
    by_id = _by_id(later)
    assert set(by_id) == {"run_early", "run_early_more", "run_late"}
    for summary in by_id.values():
        _assert_matches_replay(later, summary)


def test_a_run_continued_after_catch_up_is_folded_on(world: World) -> None:
    w = RunWriter(world, "run_long")
    w.agent_step("a", [priced()])
    list_runs(world)
    w.agent_step("b", [priced(input_tokens=9), unpriced()])
    w.complete("fin")
    (summary,) = list_runs(world)
    _assert_matches_replay(world, summary)
    assert summary.steps == 2 and summary.status == "completed"


def test_sub_runs_are_runs_of_their_own(world: World) -> None:
    parent = RunWriter(world, "run_p")
    parent.start_step("delegate", kind="subworkflow")
    child = parent.sub_run("delegate", "run_p_child")
    child.agent_step("work", [priced(input_tokens=4000)])
    by_id = {r.run_id: r for r in list_runs(world)}
    assert by_id["run_p_child"].parent_run_id == "run_p"
    assert by_id["run_p"].usage.calls == 0
    assert by_id["run_p_child"].usage.input_tokens == 4000
    for summary in by_id.values():
        _assert_matches_replay(world, summary)


def test_other_streams_are_skipped_without_decoding(world: World) -> None:
    loop = OuterLoop("loop_1")
    loop.trigger(OuterLoopStarted, outer_loop_id="loop_1", workflow_id="wf", max_cycles=3)
    world.save(loop)
    # An event of a type this program does not know, on a stream of no run.
    foreign = StoredEvent(uuid.uuid4(), 1, "acme.Unrelated", b'{"x":1}')
    world.app.recorder.insert_events([foreign])
    write_agent_run(world, "run_after", steps=1, calls_per_step=1)
    (summary,) = list_runs(world)
    assert summary.run_id == "run_after"
    _assert_matches_replay(world, summary)


def test_an_unreadable_run_event_stops_the_page_and_writes_nothing(world: World) -> None:
    write_agent_run(world, "run_ok", steps=1, calls_per_step=1)
    state = orjson.dumps({"timestamp": utc_now().isoformat()})
    append_raw_row(world, run_stream_id("run_ok"), "acme.FromTheFuture", state)
    projection = RunsProjection(world)
    with pytest.raises(RunsProjectionError, match=r"acme\.FromTheFuture.*import the module"):
        projection.catch_up()
    assert projection.position is None
    assert projection.runs() == ()


def test_an_unframed_row_is_refused_as_a_whole_read_refuses_it(world: World) -> None:
    """A row written behind the world's back without a chain frame is not folded into the
    read model (replay refuses it too)."""
    write_agent_run(world, "run_forged", steps=1, calls_per_step=1)
    stream = run_stream_id("run_forged")
    version = len(world.read_stream(stream)) + 1
    forged = orjson.dumps({"timestamp": utc_now().isoformat(), "output": "forged"})
    world.app.recorder.insert_events([StoredEvent(stream, version, "RunCompleted", forged)])
    projection = RunsProjection(world)
    with pytest.raises(LogTamperedError, match="no chain frame"):
        projection.catch_up()
    assert projection.runs() == ()


def test_a_stale_position_is_refused_atomically(world: World) -> None:
    write_agent_run(world, "run_t", steps=1, calls_per_step=1)
    projection = RunsProjection(world)
    projection.catch_up()
    before = projection.runs()
    position = projection.position
    assert position is not None
    state = replay_run(world, "run_t").state.model_copy(update={"event_count": 10**6})
    with pytest.raises(IntegrityError):
        projection.view.commit({"run_t": state}, {}, Tracking(world.app.name, position))
    assert projection.runs() == before
    assert projection.position == position


def test_the_model_is_stored_next_to_the_events(
    world: World, world_factory: Callable[[], World], backend: str
) -> None:
    write_agent_run(world, "run_durable", steps=2, calls_per_step=1)
    first = list_runs(world)
    if backend == "memory":
        assert RunsProjection(world).runs() == first
        return
    world.close()
    reopened = world_factory()
    projection = RunsProjection(reopened)
    assert projection.runs() == first  # read back before any catch-up
    assert projection.catch_up() == 0


def test_events_fed_one_by_one_give_the_same_model(world: World) -> None:
    _write_mixed_runs(world)
    projection = RunsProjection(world)
    mapper = world.app.mapper
    for notification in world.app.recorder.select_notifications(start=None, limit=10_000):
        event = mapper.to_domain_event(notification)
        projection.process_event(event, Tracking(world.app.name, notification.id))
    assert projection.position == world.app.recorder.max_notification_id()
    by_id = {r.run_id: r for r in projection.runs()}
    assert set(by_id) == {"run_a", "run_b"}
    for summary in by_id.values():
        _assert_matches_replay(world, summary)
    assert projection.catch_up() == 0


def _write_runs_differing_in_case(world: World) -> None:
    write_agent_run(world, "nightly", steps=1, calls_per_step=1)
    write_agent_run(world, "Nightly", steps=3, calls_per_step=2, complete=False)


def _assert_two_runs_differing_in_case(world: World) -> None:
    runs = _by_id(world)
    assert set(runs) == {"nightly", "Nightly"}
    assert (runs["nightly"].steps, runs["Nightly"].steps) == (1, 3)
    for summary in runs.values():
        _assert_matches_replay(world, summary)
    view = RunsProjection(world).view
    for run_id in runs:
        state = view.load_state(run_id)
        assert state is not None and len(state.steps) == runs[run_id].steps


def test_runs_whose_ids_differ_in_case_are_two_runs(world: World) -> None:
    _write_runs_differing_in_case(world)
    list_runs(world)
    _assert_two_runs_differing_in_case(world)


_OLD_MARIADB_VIEW = (
    "CREATE TABLE little_es_runs_tracking (application_name VARCHAR(255) PRIMARY KEY,"
    " notification_id BIGINT NOT NULL) ENGINE=InnoDB",
    "CREATE TABLE little_es_runs (run_id VARCHAR(255) PRIMARY KEY,"
    " summary LONGBLOB NOT NULL, state LONGBLOB NOT NULL) ENGINE=InnoDB",
    "CREATE TABLE little_es_run_streams (stream_id BINARY(16) PRIMARY KEY,"
    " run_id VARCHAR(255) NOT NULL) ENGINE=InnoDB",
)


@pytest.mark.backends("mariadb")
def test_a_mariadb_read_model_keyed_without_case_is_rebuilt_at_open(
    world: World, world_factory: Callable[[], World], world_spec: WorldSpec
) -> None:
    _write_runs_differing_in_case(world)
    with world_spec.connect_mysql() as conn, conn.cursor() as cur:
        for table in ("little_es_runs_tracking", "little_es_runs", "little_es_run_streams"):
            cur.execute(f"DROP TABLE IF EXISTS {table}")
        for statement in _OLD_MARIADB_VIEW:
            cur.execute(statement)
    assert len(list_runs(world)) == 1, "the old tables no longer fold the two runs together"
    world.close()
    reopened = world_factory()
    list_runs(reopened)
    _assert_two_runs_differing_in_case(reopened)
    with world_spec.connect_mysql() as conn, conn.cursor() as cur:
        cur.execute(
            "SELECT DISTINCT COLLATION_NAME FROM information_schema.COLUMNS"
            " WHERE TABLE_SCHEMA = DATABASE() AND COLUMN_NAME = 'run_id'"
        )
        assert cur.fetchall() == (("ascii_bin",),)


def test_projection_needs_a_world() -> None:
    with pytest.raises(TypeError, match="World"):
        RunsProjection("memory://")  # type: ignore[arg-type]


# ------------------------------------------------------------------ a tampered log


def _tampered_copy(tmp_path: Path, where: str) -> tuple[Path, tuple[object, ...]]:
    """A world of two runs; ``where`` of ``run_t``'s stream deleted (``"end"``: its last two
    rows, ``"middle"``: its version 3); returns the data dir and the rows deleted."""
    data_dir = tmp_path / "w"
    with local_world(data_dir) as world:
        write_agent_run(world, "run_ok", steps=1, calls_per_step=1)
        write_agent_run(world, "run_t", steps=3, calls_per_step=1)
    conn = sqlite3.connect(data_dir / "events.sqlite3", isolation_level=None)
    (stream,) = conn.execute(
        "SELECT id FROM little_es_streams WHERE stream_id = ?", (run_stream_id("run_t").hex,)
    ).fetchone()
    rows = conn.execute(
        "SELECT rowid, stream, version, topic, state FROM little_es_events WHERE stream = ?"
        " ORDER BY version",
        (stream,),
    ).fetchall()
    deleted = tuple(rows[-2:] if where == "end" else rows[2:3])
    conn.executemany("DELETE FROM little_es_events WHERE rowid = ?", [(r[0],) for r in deleted])
    conn.close()
    return data_dir, deleted


@pytest.mark.parametrize("page", [1000, 2], ids=["one page", "pages of 2"])
@pytest.mark.parametrize("where", ["end", "middle"])
def test_rows_deleted_from_a_run_are_refused_and_the_model_stays_before_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str, page: int
) -> None:
    monkeypatch.setattr(projections, "_PAGE_SIZE", page)
    data_dir, deleted = _tampered_copy(tmp_path, where)
    assert deleted
    with local_world(data_dir) as world:
        projection = RunsProjection(world)
        with pytest.raises(LogTamperedError, match="runs read model of world") as refused:
            projection.catch_up()
        assert "deleted" in str(refused.value) or "does not follow" in str(refused.value)
        stuck = projection.position
        with pytest.raises(LogTamperedError):
            list_runs(world)
        assert projection.position == stuck, "a refused page moved the position"
    # Put back from a backup: the next catch-up folds the run as replay reads it.
    conn = sqlite3.connect(data_dir / "events.sqlite3", isolation_level=None)
    conn.executemany(
        "INSERT INTO little_es_events (rowid, stream, version, topic, state)"
        " VALUES (?, ?, ?, ?, ?)",
        deleted,
    )
    conn.close()
    with local_world(data_dir) as world:
        runs = {s.run_id: s for s in list_runs(world)}
        assert set(runs) == {"run_ok", "run_t"}
        for summary in runs.values():
            _assert_matches_replay(world, summary)

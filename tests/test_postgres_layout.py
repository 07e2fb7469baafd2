"""The compact table layout of a PostgreSQL world (``CompactPostgresApplicationRecorder``).

A new world's rows hold integer keys for their stream and topic; keys given by
another writer are read back by name; two writers giving the same new key at
once both get the one key; the log's readers go through the bucket index, not a
scan of the table; a version the layout cannot hold is refused with nothing
written; rows are filed under their own names even where the server lost a key
the process knows (a failover). The recorder's other promises are eventsourcing's
cases and the world cases (``tests/test_backends.py``), run on both layouts.
"""

from __future__ import annotations

import threading
import uuid
from typing import Any

import pytest
from eventsourcing.persistence import PersistenceError, StoredEvent

from little_es import open_world
from little_es.backends.postgres import CompactPostgresApplicationRecorder
from little_es.chain import GENESIS, check_rows, frame
from little_es.errors import LogTamperedError
from little_es.world import World
from tests.conftest import WorldSpec

pytestmark = pytest.mark.backends("postgres")


def _recorder(world: World) -> CompactPostgresApplicationRecorder:
    recorder = world.app.recorder
    assert type(recorder) is CompactPostgresApplicationRecorder
    return recorder


def _tables(world_spec: WorldSpec) -> set[str]:
    with world_spec.connect_postgres() as conn:
        rows = conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"
        ).fetchall()
    return {str(name) for (name,) in rows}


def test_a_new_world_holds_integer_keys_and_no_eventsourcing_table(
    world_spec: WorldSpec, world: World
) -> None:
    recorder = _recorder(world)
    stream = uuid.uuid4()
    recorder.insert_events([StoredEvent(stream, 1, "layout.row", b"{}")])
    tables = _tables(world_spec)
    assert {"little_es_events", "little_es_streams", "little_es_topics"} <= tables
    assert "littlees_events" not in tables
    with world_spec.connect_postgres() as conn:
        columns = conn.execute(
            "SELECT column_name, data_type FROM information_schema.columns"
            " WHERE table_schema = current_schema() AND table_name = 'little_es_events'"
            " ORDER BY ordinal_position"
        ).fetchall()
        spelled = conn.execute(
            "SELECT originator_id, originator_version, topic FROM little_es_rows"
            " WHERE originator_id = %s",
            (stream,),
        ).fetchall()
    assert columns == [
        ("notification_id", "bigint"),
        ("stream", "integer"),
        ("version", "integer"),
        ("topic", "integer"),
        ("state", "bytea"),
    ]
    assert spelled == [(stream, 1, "layout.row")]


def test_keys_given_by_another_writer_are_read_back_by_name(
    world_spec: WorldSpec, world: World
) -> None:
    stream = uuid.uuid4()
    with open_world(world_spec.url) as other:
        _recorder(other).insert_events(
            [StoredEvent(stream, 1, "layout.first", b"1"), StoredEvent(stream, 2, "layout.b", b"2")]
        )
    recorder = _recorder(world)
    assert [(e.originator_version, e.topic, e.state) for e in recorder.select_events(stream)] == [
        (1, "layout.first", b"1"),
        (2, "layout.b", b"2"),
    ]
    assert recorder.stream_rows(stream, 1) == [(2, "layout.b", b"2")]
    assert recorder.has_rows_after(stream, 1) and not recorder.has_rows_after(stream, 2)
    # A stream nobody wrote has no key and no rows; asking gives it none.
    nobody = uuid.uuid4()
    assert recorder.stream_rows(nobody, None) == [] and not recorder.has_rows_after(nobody, 0)
    assert recorder.select_events(nobody) == []
    with world_spec.connect_postgres() as conn:
        found = conn.execute(
            "SELECT count(*) FROM little_es_streams WHERE stream_id = %s", (nobody,)
        ).fetchone()
    assert found == (0,)


def test_two_writers_giving_the_same_new_keys_at_once_get_one_key_each(
    world_spec: WorldSpec, world: World
) -> None:
    with open_world(world_spec.url) as other:
        recorders = [_recorder(world), _recorder(other)]
        rounds = 20
        barrier = threading.Barrier(len(recorders))
        errors: list[BaseException] = []

        def write(n: int) -> None:
            try:
                for i in range(rounds):
                    # Both start one new topic each round, each on a stream of its own.
                    barrier.wait(timeout=30)
                    recorders[n].insert_events(
                        [StoredEvent(uuid.uuid4(), 1, f"layout.race{i}", b"%d" % n)]
                    )
            except BaseException as exc:
                errors.append(exc)
                barrier.abort()

        threads = [threading.Thread(target=write, args=(n,)) for n in range(len(recorders))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert errors == []
    with world_spec.connect_postgres() as conn:
        topics = conn.execute(
            "SELECT topic, count(*) FROM little_es_topics WHERE topic LIKE 'layout.race%%'"
            " GROUP BY topic"
        ).fetchall()
        rows = conn.execute(
            "SELECT topic, count(*) FROM little_es_rows WHERE topic LIKE 'layout.race%%'"
            " GROUP BY topic"
        ).fetchall()
    assert sorted(topics) == sorted((f"layout.race{i}", 1) for i in range(rounds))
    assert sorted(rows) == sorted((f"layout.race{i}", 2) for i in range(rounds))


def test_new_keys_are_given_in_the_order_of_their_names(
    world_spec: WorldSpec, world: World
) -> None:
    # So two writers giving the same new names at once take their locks in one order:
    # one waits for the other, neither waits for a deadlock to be found (1 s).
    names = [f"layout.order{i:02d}" for i in range(20)]
    _recorder(world).insert_events(
        [StoredEvent(uuid.uuid4(), 1, name, b"{}") for name in reversed(names)]
    )
    with world_spec.connect_postgres() as conn:
        given = conn.execute(
            "SELECT topic FROM little_es_topics WHERE topic LIKE 'layout.order%%' ORDER BY id"
        ).fetchall()
    assert [name for (name,) in given] == names


def _plan(world_spec: WorldSpec, statement: bytes, params: tuple[Any, ...]) -> str:
    with world_spec.connect_postgres() as conn:
        conn.execute("ANALYZE little_es_events")
        rows = conn.execute(b"EXPLAIN " + statement, params).fetchall()
    return "\n".join(str(line) for (line,) in rows)


def test_the_logs_readers_go_through_the_bucket_index(world_spec: WorldSpec, world: World) -> None:
    recorder = _recorder(world)
    for _ in range(5):
        stream = uuid.uuid4()
        recorder.insert_events(
            [StoredEvent(stream, v, "layout.row", b"x" * 100) for v in range(1, 2001)]
        )
    last = recorder.max_notification_id()
    assert last is not None
    page = recorder.select_notifications(last - 5000, 100)
    assert [n.id for n in page] == sorted(n.id for n in page) and len(page) == 100
    assert page[0].id == last - 5000
    index = "little_es_events_notification_bucket"
    for statement, params in (
        (recorder._every_notification, (last - 5000, last - 5000, last, 100)),
        (recorder._notifications_of_topics, (1, 1, last, ["layout.row"], 100)),
        (recorder._last_at_or_below, (last, last)),
    ):
        plan = _plan(world_spec, statement, params)
        assert index in plan, plan
        assert "Seq Scan on little_es_events" not in plan, plan


def test_a_version_past_the_layouts_integer_is_refused_with_nothing_written(
    world_spec: WorldSpec, world: World
) -> None:
    recorder = _recorder(world)
    stream = uuid.uuid4()
    recorder.insert_events([StoredEvent(stream, 1, "layout.row", b"{}")])
    with pytest.raises(PersistenceError, match="out of range"):
        recorder.insert_events(
            [
                StoredEvent(stream, 2, "layout.row", b"{}"),
                StoredEvent(stream, 2**31, "layout.row", b"{}"),
            ]
        )
    assert [e.originator_version for e in recorder.select_events(stream)] == [1]


def test_rows_are_filed_by_name_when_the_server_lost_a_key_this_process_knows(
    world_spec: WorldSpec, world: World
) -> None:
    # A failover to a replica that had not received a key's commit: the key is gone,
    # and the sequence gives its integer again, here to another stream. This process
    # still knows the old key; its next rows must go under their own stream's name.
    recorder = _recorder(world)
    lost, other = uuid.uuid4(), uuid.uuid4()
    recorder.insert_events([StoredEvent(lost, 1, "layout.row", b"1")])
    with world_spec.connect_postgres() as conn:
        # What the replica holds: neither the stream's key nor its row, and the key's
        # integer given to another stream.
        conn.execute(
            "DELETE FROM little_es_events WHERE stream ="
            " (SELECT id FROM little_es_streams WHERE stream_id = %s)",
            (lost,),
        )
        conn.execute(
            "UPDATE little_es_streams SET stream_id = %s WHERE stream_id = %s", (other, lost)
        )
    with open_world(world_spec.url) as fresh:
        theirs = frame(GENESIS, other, 1, "layout.row", b"theirs")
        _recorder(fresh).insert_events([StoredEvent(other, 1, "layout.row", theirs)])
    # Until its next insert, this process reads the lost stream by the old key: the other
    # stream's rows, which the hash chain refuses as the stream's (their digests name the
    # other stream), so a replay never folds them.
    stale = recorder.stream_rows(lost, None)
    assert stale == [(1, "layout.row", theirs)]
    with pytest.raises(LogTamperedError, match="does not match its own digest"):
        check_rows(lost, stale)
    recorder.insert_events([StoredEvent(lost, 1, "layout.row", b"again")])
    with open_world(world_spec.url) as fresh:
        reader = _recorder(fresh)
        assert [e.state for e in reader.select_events(lost)] == [b"again"]
        assert [e.state for e in reader.select_events(other)] == [theirs]
    # And this process reads the stream under its new key.
    assert [e.state for e in recorder.select_events(lost)] == [b"again"]

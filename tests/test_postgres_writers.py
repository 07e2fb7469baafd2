"""Concurrent PostgreSQL writers, and readers of the notification log that never miss a row.

Writers of one database no longer queue on a table lock; readers read up to the
recorder's horizon (``LittlePostgresApplicationRecorder`` says why that is
enough). Here: eight processes appending at once while a follower reads the log
by notification id, as the runs projection does; an insert held open while a
later one commits, which a reader must wait for instead of passing over; and
subscriptions, which poll now that inserts send no NOTIFY.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from uuid import UUID

import pytest
from eventsourcing.persistence import IntegrityError, Notification, StoredEvent

from little_es.backends.postgres import LittlePostgresApplicationRecorder
from little_es.world import World
from tests.conftest import WorldSpec

pytestmark = pytest.mark.backends("postgres")

_REPO = Path(__file__).resolve().parents[1]
_WRITERS = 8
_APPENDS = 60

# A writer: its own stream, versions 1.., one row or a few per insert, write-ahead
# and durable commits mixed, as the runtime's. Prints the number of rows it wrote.
_WRITE = """
import sys, time, uuid
from pathlib import Path
from eventsourcing.persistence import StoredEvent
from little_es import open_world
url, go, stream, appends = sys.argv[1], Path(sys.argv[2]), uuid.UUID(sys.argv[3]), int(sys.argv[4])
with open_world(url) as world:
    recorder = world.app.recorder
    (go.parent / f"ready-{stream}").touch()
    while not go.exists():
        time.sleep(0.002)
    version = 0
    for i in range(appends):
        rows = []
        for _ in range(1 + i % 3):
            version += 1
            rows.append(StoredEvent(stream, version, "writer.row", b'{"i":%d}' % version))
        recorder.insert_events(rows, durable=i % 2 == 1)
    print("WROTE", version)
"""


def _recorder(world: World) -> LittlePostgresApplicationRecorder:
    recorder = world.app.recorder
    assert isinstance(recorder, LittlePostgresApplicationRecorder)
    return recorder


def _follow(recorder: LittlePostgresApplicationRecorder, after: int | None) -> list[Notification]:
    """Every notification after ``after`` that a reader continuing page by page gets now."""
    seen: list[Notification] = []
    position = after
    while page := recorder.select_notifications(
        start=position, limit=7, inclusive_of_start=position is None
    ):
        seen.extend(page)
        position = page[-1].id
    return seen


def test_a_follower_of_eight_concurrent_writers_sees_every_row_once_in_order(
    world_spec: WorldSpec, world: World, tmp_path: Path
) -> None:
    recorder = _recorder(world)
    start = recorder.max_notification_id()
    go = tmp_path / "go"
    streams = [uuid.uuid4() for _ in range(_WRITERS)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WRITE, world_spec.url, str(go), str(s), str(_APPENDS)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=_REPO,
        )
        for s in streams
    ]
    seen: list[Notification] = []
    position = start
    try:
        # Released together, once each has opened the world.
        deadline = time.monotonic() + 120
        while not all((tmp_path / f"ready-{s}").exists() for s in streams):
            assert all(p.poll() is None for p in procs), "a writer died before starting"
            assert time.monotonic() < deadline, "the writers did not start"
            time.sleep(0.005)
        go.touch()
        # Follow while they write: each read continues after the last id read.
        while any(p.poll() is None for p in procs):
            page = _follow(recorder, position)
            seen.extend(page)
            if page:
                position = page[-1].id
            time.sleep(0.001)
        results = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for proc, (_out, err) in zip(procs, results, strict=True):
        assert proc.returncode == 0, err
    seen.extend(_follow(recorder, position))

    ids = [n.id for n in seen]
    assert ids == sorted(set(ids)), "the follower read an id twice or out of order"
    written = {s: int(out.split()[-1]) for s, (out, _) in zip(streams, results, strict=True)}
    with world_spec.connect_postgres() as conn:
        stored = conn.execute(
            "SELECT notification_id, originator_id, originator_version FROM little_es_rows"
            " WHERE originator_id = ANY(%s) ORDER BY notification_id",
            (streams,),
        ).fetchall()
    assert len(stored) == sum(written.values())
    mine = [
        (n.id, n.originator_id, n.originator_version) for n in seen if n.originator_id in written
    ]
    assert mine == [(i, UUID(str(s)), v) for i, s, v in stored], "the follower missed a row"
    for stream, count in written.items():
        versions = [n.originator_version for n in seen if n.originator_id == stream]
        assert versions == list(range(1, count + 1))


def test_a_reader_waits_for_an_insert_in_flight_instead_of_passing_over_its_id(
    world_spec: WorldSpec, world: World
) -> None:
    recorder = _recorder(world)
    before = recorder.max_notification_id() or 0
    slow, fast = uuid.uuid4(), uuid.uuid4()
    with world_spec.connect_postgres() as held:
        # The keys of the stream and topic first, committed, as the recorder gives them.
        held.execute("INSERT INTO little_es_streams (stream_id) VALUES (%s)", (slow,))
        held.execute(
            "INSERT INTO little_es_topics (topic) VALUES ('writer.row') ON CONFLICT DO NOTHING"
        )
        # An insert as the recorder makes it, held open: it has drawn its id.
        held.execute("BEGIN")
        held.execute("SELECT pg_advisory_xact_lock_shared(%s)", (recorder.appends_lock_key,))
        slow_id = held.execute(
            "INSERT INTO little_es_events (stream, version, topic, state)"
            " SELECT s.id, 1, t.id, '{}' FROM little_es_streams s, little_es_topics t"
            " WHERE s.stream_id = %s AND t.topic = 'writer.row' RETURNING notification_id",
            (slow,),
        ).fetchone()
        assert slow_id is not None
        # A later insert draws a larger id and commits first.
        (fast_id,) = recorder.insert_events([StoredEvent(fast, 1, "writer.row", b"{}")]) or [0]
        assert fast_id > slow_id[0] > before

        got: list[list[Notification]] = []
        reader = threading.Thread(target=lambda: got.append(_follow(recorder, before)))
        reader.start()
        reader.join(timeout=0.5)
        # Still waiting: reading the committed row now would pass over the held one.
        assert reader.is_alive() and not got
        held.execute("COMMIT")
        reader.join(timeout=60)
    assert not reader.is_alive()
    assert [n.id for n in got[0]] == [slow_id[0], fast_id]
    assert recorder.max_notification_id() == fast_id


def test_a_rolled_back_insert_leaves_a_gap_that_readers_pass(world: World) -> None:
    recorder = _recorder(world)
    stream = uuid.uuid4()
    (first,) = recorder.insert_events([StoredEvent(stream, 1, "writer.row", b"{}")]) or [0]
    with pytest.raises(IntegrityError, match="duplicate key"):
        recorder.insert_events([StoredEvent(stream, 1, "writer.row", b"{}")])
    (last,) = recorder.insert_events([StoredEvent(stream, 2, "writer.row", b"{}")]) or [0]
    assert last > first + 1  # the conflicting insert used up an id
    assert [n.id for n in _follow(recorder, first - 1)] == [first, last]
    assert recorder.max_notification_id() == last


def test_a_subscription_receives_inserts_without_notify(world: World) -> None:
    recorder = _recorder(world)
    start = recorder.max_notification_id()
    stream = uuid.uuid4()
    with recorder.subscribe(gt=start) as subscription:
        recorder.insert_events([StoredEvent(stream, 1, "writer.row", b"{}")])
        recorder.insert_events(
            [StoredEvent(stream, 2, "writer.row", b"{}"), StoredEvent(stream, 3, "x", b"{}")]
        )
        versions = []
        for notification in subscription:
            versions.append(notification.originator_version)
            if len(versions) == 3:
                break
    assert versions == [1, 2, 3]

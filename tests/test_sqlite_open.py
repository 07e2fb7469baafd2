"""A local (SQLite) world's file while other processes and threads use it.

Processes that open a new world at the same moment all open it (SQLite refuses
a switch to WAL that meets another at once, instead of waiting: the world tries
again); a world opened while another process makes its first commit is not
taken for one whose database was replaced; a thread waits for the writer
connection as long as its holder may wait for the file's lock; a file restored
from a backup under an open world gets its rows under their own streams and
topics (the insert reads the integer keys by name, the process keeps none).
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest
from eventsourcing.persistence import StoredEvent

from little_es import local_world
from little_es.backends.sqlite import SQLiteBackend, _SQLiteConnectionPool
from little_es.testing.backend import _start_run

# Each child opens the world of every trial, once the trial's go file is there: the
# children of a trial open the new world at the same moment. It stops at its first failure.
_OPENER = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    from little_es import local_world
    from little_es.testing.backend import _start_run

    base, trials, n = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    (base / f"ready{n}").touch()
    for trial in range(trials):
        go, deadline = str(base / f"go{trial}"), time.monotonic() + 60
        while not os.path.exists(go):  # no sleep: one spreads the openings too far apart
            if time.monotonic() > deadline:
                sys.exit("no go file in 60 s")
        with local_world(base / f"world{trial}") as world:
            world.save(_start_run(f"run_{n}"))
        (base / f"done{trial}-{n}").touch()
    """
)


def _wait_for(paths: list[Path], children: list[subprocess.Popen[str]]) -> None:
    deadline = time.monotonic() + 60
    while not all(p.exists() for p in paths):
        failed = [c for c in children if c.poll() not in (None, 0)]
        assert not failed, [c.stderr.read().strip().splitlines()[-1:] for c in failed if c.stderr]
        assert time.monotonic() < deadline, "the children did not get there in 60 s"
        time.sleep(0.005)


def test_processes_opening_a_new_world_at_once_all_open_it(tmp_path: Path) -> None:
    trials, processes = 8, 4
    children = [
        subprocess.Popen(
            [sys.executable, "-c", _OPENER, str(tmp_path), str(trials), str(n)],
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in range(processes)
    ]
    try:
        _wait_for([tmp_path / f"ready{n}" for n in range(processes)], children)
        for trial in range(trials):
            (tmp_path / f"go{trial}").touch()
            _wait_for([tmp_path / f"done{trial}-{n}" for n in range(processes)], children)
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
        for child in children:
            child.wait()
            if child.stderr:
                child.stderr.close()
    for trial in range(trials):
        with local_world(tmp_path / f"world{trial}") as world:
            for n in range(processes):
                assert world.load_run(f"run_{n}").fold.status == "running"


def test_a_world_opened_while_another_process_makes_its_first_commit_is_not_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = tmp_path / "world"
    first = local_world(directory)
    read_marker = SQLiteBackend.marker
    committed: list[bool] = []

    def marker(self: SQLiteBackend) -> str | None:
        # The other opener's first commit (the world's record, then the marker file)
        # lands while this one is checking the record against the marker.
        if not committed:
            committed.append(True)
            first.save(_start_run("run_first"))
        return read_marker(self)

    monkeypatch.setattr(SQLiteBackend, "marker", marker)
    try:
        with local_world(directory) as second:
            assert second.load_run("run_first").fold.status == "running"
    finally:
        first.close()
    assert committed


def test_a_world_opened_while_another_stores_its_first_runs_large_input_is_not_refused(
    tmp_path: Path,
) -> None:
    """A first run's large input is an artifact stored before the run's first commit: the
    world records itself before it, so an opener in between finds the record beside the
    artifact, not an artifact store without a database (what an emptied database leaves)."""
    import asyncio

    from little_es import Workflow, run_workflow, task
    from little_es.durability import OUTPUT_INLINE_LIMIT

    directory = tmp_path / "world"
    first = local_world(directory)
    put = first.artifacts.put
    opened: list[str] = []

    def put_then_another_opens(data: bytes, **kwargs: object) -> object:
        ref = put(data, **kwargs)  # type: ignore[arg-type]
        with local_world(directory) as second:
            opened.append(second.name)
        return ref

    first.artifacts.put = put_then_another_opens  # type: ignore[method-assign]
    try:
        big = {"text": "x" * (OUTPUT_INLINE_LIMIT + 1)}
        wf = Workflow("big_input", steps=[task("a", lambda ctx: len(ctx.input["text"]))])
        assert asyncio.run(run_workflow(first, wf, big, run_id="run_big")).output == len(
            big["text"]
        )
    finally:
        first.close()
    assert opened


def test_a_thread_waits_for_the_writer_connection_as_long_as_for_the_files_lock(
    tmp_path: Path,
) -> None:
    # eventsourcing's pool gives up after 5 s: a second thread appending while another
    # process held the file's lock failed, where the first waited up to the lock timeout.
    with local_world(tmp_path / "world") as world:
        pool = world.app.factory.datastore.pool  # type: ignore[attr-defined]
        assert isinstance(pool, _SQLiteConnectionPool)
        assert pool.lock_timeout is not None and pool.lock_timeout > 5
        assert pool.pool_timeout >= pool.lock_timeout


def test_a_file_restored_under_an_open_world_gets_its_rows_under_their_own_names(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "world"
    events, backup = directory / "events.sqlite3", tmp_path / "backup.sqlite3"
    with local_world(directory) as world, local_world(directory) as other:
        recorder = world.app.recorder
        first, second = uuid.uuid4(), uuid.uuid4()
        recorder.insert_events([StoredEvent(first, 1, "restore.started", b"1")])
        with sqlite3.connect(events) as source, sqlite3.connect(backup) as copy:
            source.backup(copy)
        recorder.insert_events(
            [
                StoredEvent(second, 1, "restore.started", b"2"),
                StoredEvent(second, 2, "restore.secret", b"3"),
            ]
        )
        # Restored in place: the second stream and its new topic are gone, and the
        # integers they had are free for other names.
        with sqlite3.connect(backup) as source, sqlite3.connect(events) as restored:
            source.backup(restored)
        another = uuid.uuid4()
        other.app.recorder.insert_events([StoredEvent(another, 1, "restore.other", b"4")])
        recorder.insert_events([StoredEvent(second, 3, "restore.secret", b"5")])
        rows = [
            (n.originator_id, n.originator_version, n.topic, n.state)
            for n in recorder.select_notifications(None, 10)
        ]
        assert rows == [
            (first, 1, "restore.started", b"1"),
            (another, 1, "restore.other", b"4"),
            (second, 3, "restore.secret", b"5"),
        ]
        assert [e.state for e in other.app.recorder.select_events(another)] == [b"4"]

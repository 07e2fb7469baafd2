"""Which commits wait for the disk: a result's do, a write-ahead record's alone do not.

A write-ahead record (``StepStarted``, ``harness.model.called``, ...) only says
that a call is in flight; losing it to a power cut makes the call run again,
which a crash without a result makes happen anyway. So a commit of nothing but
write-ahead records is not fsynced (SQLite) or does not wait for the WAL flush
(PostgreSQL); the next commit that holds a result does, and makes the earlier
records durable with it, because the log is written in order.
"""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from little_es.domain import Run
from little_es.errors import WorldStorageError
from little_es.events import (
    RunStarted,
    StepCompleted,
    StepStarted,
    event_class_for,
    registered_wire_names,
)
from little_es.pricing import price_usage_exact
from little_es.world import World, local_world
from tests.conftest import WorldSpec

WRITE_AHEAD = {
    "StepStarted",
    "ParallelBranchScheduled",
    "SubRunReserved",
    "harness.session.started",
    "harness.model.called",
    "harness.tool_call.started",
}


def test_the_write_ahead_records_are_exactly_the_in_flight_markers() -> None:
    classes = {name: event_class_for(name) for name in registered_wire_names()}
    assert {name for name, cls in classes.items() if cls and cls.write_ahead} == WRITE_AHEAD


def _started(world: World, run_id: str) -> Run:
    run = Run(run_id, price_usage_exact)
    run.trigger(RunStarted, run_id=run_id, workflow_id="w", workflow_version="1", ir_hash="0")
    world.save(run)
    return run


def _step(run: Run, world: World, i: int, *, complete: bool) -> None:
    path = f"s{i}"
    run.trigger(StepStarted, step_path=path, step_id=path, kind="task", visit=1, attempt=1)
    world.save(run)
    if complete:
        run.trigger(StepCompleted, step_path=path, step_id=path, visit=1, attempt=1, output=i)
        world.save(run)


# ------------------------------------------------------------------------- SQLite

_FSYNCS_SCRIPT = textwrap.dedent(
    """
    import sys
    from little_es.domain import Run
    from little_es.events import RunStarted, StepCompleted, StepStarted
    from little_es.world import local_world

    data_dir, what, synchronous = sys.argv[1], sys.argv[2], sys.argv[3]
    with local_world(data_dir, synchronous=synchronous) as world:
        run = Run("run_fsyncs", world.pricer)
        run.trigger(RunStarted, run_id="run_fsyncs", workflow_id="w", workflow_version="1",
                    ir_hash="0")
        world.save(run)
        print("ready", flush=True)
        sys.stdin.readline()
        for i in range(40):
            path = f"s{i}"
            run.trigger(StepStarted, step_path=path, step_id=path, kind="task", visit=1, attempt=1)
            if what != "results":
                world.save(run)
            if what != "write-ahead":
                run.trigger(StepCompleted, step_path=path, step_id=path, visit=1, attempt=1)
                world.save(run)
    """
)


def _fsyncs(tmp_path: Path, what: str, synchronous: str = "full") -> int:
    """fsync/fdatasync calls of a process that commits 40 times (after opening its world)."""
    strace = shutil.which("strace")
    if strace is None:
        pytest.skip("strace is not installed: cannot count fsync calls")
    data_dir = tmp_path / what
    proc = subprocess.Popen(
        [sys.executable, "-c", _FSYNCS_SCRIPT, str(data_dir), what, synchronous],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert proc.stdout is not None and proc.stdin is not None
    try:
        assert proc.stdout.readline().strip() == "ready"
        # Attached once the world is open: only the 40 commits are counted.
        trace = subprocess.Popen(
            [strace, "-f", "-c", "-e", "trace=fsync,fdatasync", "-p", str(proc.pid)],
            stderr=subprocess.PIPE,
            text=True,
        )
        _wait_attached(proc.pid)
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert proc.wait(timeout=60) == 0
        _, summary = trace.communicate(timeout=30)
    finally:
        proc.kill()
    calls = 0
    for line in summary.splitlines():
        fields = line.split()
        if fields and fields[-1] in ("fsync", "fdatasync"):
            calls += int(fields[3])
    return calls


def _wait_attached(pid: int) -> None:
    status = Path(f"/proc/{pid}/status")
    for _ in range(500):
        tracer = next(
            (line for line in status.read_text().splitlines() if line.startswith("TracerPid")), ""
        )
        if tracer.split()[-1:] != ["0"]:
            return
        time.sleep(0.01)
    pytest.fail("strace did not attach")


@pytest.mark.skipif(sys.platform != "linux", reason="counts fsync calls with strace (Linux)")
def test_sqlite_fsyncs_results_not_write_ahead_records(tmp_path: Path) -> None:
    # 40 StepStarted commits alone; 40 StepCompleted commits alone; 40 steps
    # of both (80 commits, 40 of them holding a result).
    assert _fsyncs(tmp_path, "write-ahead") <= 4
    assert _fsyncs(tmp_path, "results") >= 40
    both = _fsyncs(tmp_path, "both")
    assert 40 <= both <= 44


@pytest.mark.skipif(sys.platform != "linux", reason="counts fsync calls with strace (Linux)")
def test_sqlite_normal_fsyncs_no_commit(tmp_path: Path) -> None:
    assert _fsyncs(tmp_path, "both", synchronous="normal") <= 4


def test_sqlite_connection_returns_to_the_worlds_policy(tmp_path: Path) -> None:
    with local_world(tmp_path) as world:
        run = _started(world, "run_policy")
        _step(run, world, 1, complete=False)
        datastore = world.app.recorder.datastore  # type: ignore[attr-defined]
        with datastore.transaction(commit=False) as cursor:
            cursor.execute("PRAGMA synchronous")
            assert cursor.fetchone()[0] == 2  # FULL
        _step(run, world, 2, complete=True)
        assert [e.wire_name for e in world.read_stream(run.id)][-3:] == [
            "StepStarted",
            "StepStarted",
            "StepCompleted",
        ]


class _CommitFails:
    """A connection whose next COMMIT fails and leaves its transaction open, as a failed
    COMMIT can (SQLITE_BUSY, SQLITE_FULL), and whose ROLLBACKs fail too if ``stuck``;
    everything else goes to the real one."""

    def __init__(self, real: sqlite3.Connection, *, stuck: bool) -> None:
        self.real = real
        self.stuck = stuck
        self.failed = False

    def commit(self) -> None:
        if self.failed:
            self.real.commit()
            return
        self.failed = True
        raise sqlite3.OperationalError("disk I/O error")

    def rollback(self) -> None:
        if self.stuck:
            raise sqlite3.OperationalError("disk I/O error on rollback")
        self.real.rollback()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


@pytest.mark.parametrize("stuck", [False, True], ids=["rolled-back", "stuck"])
@pytest.mark.parametrize("failing", ["write-ahead", "result"])
def test_sqlite_connection_left_in_a_transaction_is_not_reused(
    tmp_path: Path, failing: str, stuck: bool
) -> None:
    # A write-ahead commit runs at synchronous=NORMAL and sets the world's level again
    # after it, which SQLite refuses inside a transaction: a connection its failed COMMIT
    # left in one would go back to the pool at NORMAL (and the error be that refusal), and
    # a later result's commit on it would not be fsynced. After a result's failed COMMIT,
    # the connection would refuse its next BEGIN.
    with local_world(tmp_path) as world:
        run = _started(world, "run_failed_commit")
        if failing == "result":
            _step(run, world, 1, complete=False)
        datastore = world.app.recorder.datastore  # type: ignore[attr-defined]
        writer = datastore.pool.get_connection(is_writer=True)
        real = writer._sqlite_conn
        writer._sqlite_conn = _CommitFails(real, stuck=stuck)
        datastore.pool.put_connection(writer)
        with pytest.raises(WorldStorageError, match=r"failed a commit.*: disk I/O error\."):
            if failing == "result":
                run.trigger(StepCompleted, step_path="s1", step_id="s1", visit=1, attempt=1)
                world.save(run)
            else:
                _step(run, world, 1, complete=False)
        if stuck:
            # Closed: a fresh connection, at the world's level, takes the next commits.
            assert writer.closed
        else:
            assert not writer.closed and not real.in_transaction
            assert real.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
        _step(world.load_run("run_failed_commit"), world, 2, complete=True)
        names = [e.wire_name for e in world.read_stream(run.id)][1:]
        started = ["StepStarted"] if failing == "result" else []
        assert names == [*started, "StepStarted", "StepCompleted"]


# --------------------------------------------------------------------- PostgreSQL


def _lsns(spec: WorldSpec) -> tuple[int, int]:
    """(insert, flush) positions of the server's WAL, in bytes."""
    assert spec.dsn is not None
    with psycopg.connect(spec.dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT pg_current_wal_insert_lsn() - '0/0', pg_current_wal_flush_lsn() - '0/0'"
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


@pytest.mark.backends("postgres")
def test_postgres_write_ahead_commit_returns_before_the_flush(
    world: World, world_spec: WorldSpec
) -> None:
    run = _started(world, "run_async")
    # The WAL writer flushes on its own every wal_writer_delay (200 ms): a
    # commit that did not wait is seen unflushed right after it, almost always.
    unflushed = 0
    for i in range(10):
        _step(run, world, i, complete=False)
        inserted, flushed = _lsns(world_spec)
        unflushed += flushed < inserted
    assert unflushed > 0


@pytest.mark.backends("postgres")
def test_postgres_result_commit_flushes_what_was_written_ahead(
    world: World, world_spec: WorldSpec
) -> None:
    run = _started(world, "run_sync")
    for i in range(10):
        _step(run, world, i, complete=False)
        written_ahead, _ = _lsns(world_spec)
        run.trigger(StepCompleted, step_path=f"s{i}", step_id=f"s{i}", visit=1, attempt=1)
        world.save(run)
        _, flushed = _lsns(world_spec)
        assert flushed >= written_ahead

"""One workload, the figures a peer compares, each beside the raw floor measured in the same run.

The workload: N sequential trivial task steps, each returning
``{"i": i, "payload": "x" * 100}``, on SQLite (``local_world``: WAL,
``synchronous=FULL``, both read back from the world's connection with ``PRAGMA``)
and on PostgreSQL (a scratch database created for the run and dropped after it;
each world in a fresh schema of it). The floor is what a hand-rolled durable
loop has to do at least: per step, call the function, encode its output with
``orjson`` and ``INSERT`` it (run id, step id, output; primary key run id +
step id) with its own fsynced ``COMMIT``, through the bare driver, into the same
kind of database (a fresh WAL-mode SQLite file with ``synchronous=FULL`` beside
the world's; a table of the scratch database, on a ``psycopg`` connection with
``synchronous_commit=on``). Ratio = little_es / floor.

1. ms per task step: ``run_workflow`` of N steps on a fresh world (opened
   beforehand) over N, for a sync step function (run in a worker thread), the
   same with ``run_in_thread=False``, and an async one; at each of ``--sizes``
   (100, 1,000); medians of ``--reps`` (5) repetitions, the four measurements
   interleaved in each. On SQLite also a fifth: the floor with its WAL grown ahead
   of its frames by the world's own code (a world writes its WAL's blocks before
   its commits need them; a bare driver's first 1,000 pages of commits each extend
   the file, which costs its fsync more), and the async steps over that floor.
2. bytes on disk per step of a finished run of N sync steps (1,000 and 10,000;
   1,000 with ``--quick``): SQLite, every file in the data dir (events file, WAL,
   lease and id files), measured after the world is closed and its WAL
   checkpointed (``PRAGMA wal_checkpoint(TRUNCATE)``), so the figure is the
   stable size, over N; PostgreSQL, ``pg_total_relation_size`` (heap, indexes,
   TOAST) of every table of the world's schema, over N. Baseline: the floor's
   file (checkpointed the same way) or table after the same N steps. Without
   ``--quick``, also what a further step adds: (bytes at 10,000 - at 1,000) /
   9,000, which leaves out the pages every world's tables start with (on
   PostgreSQL a table's free-space and visibility maps, each index's root).
3. resume of 1,000 steps with 900 recorded (the building run stopped right after
   its 900th ``StepCompleted`` by an observer that raises, as a kill would leave
   it), on a fresh copy (SQLite) or a fresh build (PostgreSQL), the world opened
   beforehand: the time until the first new step's function is called, and to
   the end. Floor: the hand-rolled loop's resume, ``SELECT`` of its recorded
   rows and ``orjson.loads`` of each, then the 100 remaining steps as above.
4. agent workload: a workflow of one agent step whose scripted model asks for
   one tool call a turn for 50 turns, then answers: 51 model calls and 50 tool
   calls, recorded. Overhead per call = (``run_workflow``'s wall time - the same
   model/tool loop with no recording) / 101, medians of ``--reps``; bytes on disk
   per recorded call = (the world's bytes, measured as in 2, after the run - an
   empty world's) / 101; and what a further call adds, the conversation growing
   all the way: (the bytes after an agent step of 250 such turns - after the 50
   turns) / 400 calls.
5. with ``--split``, where the time of a task step of figure 1 (async) and of a
   call of figure 4 goes, on SQLite, on SQLite with ``synchronous="normal"`` (no
   commit waits for the disk) and in ``memory_world`` (no database): the
   ``COMMIT``, the rest of ``World.save`` (encoding, the hash chain, the
   statements) and the engine outside ``World.save``, timed by wrapping those two
   methods for the run. Then the same engine code with and without a wait for the
   disk before it: ``memory_world`` runs of task steps whose function does a 12 KiB
   ``pwrite`` + ``fdatasync`` of a file of its own, or nothing, the engine's time
   per step being the run's minus that I/O (after a wait, the same Python takes
   longer on this kind of machine, which is part of why a step costs more than its
   commit and its Python apart). And what a sync step's worker-thread hop costs with no
   step around it: little_es's worker threads (``little_es._threads``) and
   ``asyncio.to_thread``, each calling a function that does nothing, awaited from
   a running loop, beside the least any hop costs: one thread of this benchmark's
   own waiting on a queue and answering with ``call_soon_threadsafe`` (two
   wake-ups of a sleeping thread).

    .venv/bin/python -m benchmarks.bench_peer [--sizes 100,1000] [--reps 5] \
        [--backends sqlite,postgres] [--quick] [--only agent] [--profile] [--split] [--json]

PostgreSQL is skipped, with the reason printed, when the server cannot be reached.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import os
import queue
import shutil
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psycopg
from psycopg import sql

from benchmarks.bench_harness import ECHO, PROMPT, SYSTEM, _bare, _model
from benchmarks.figures import Figures, add_json_option, reporting
from little_es import (
    Event,
    ScriptedModel,
    StepCompleted,
    StepContext,
    Workflow,
    World,
    agent,
    configure_logging,
    local_world,
    memory_world,
    postgres_world,
    run_workflow,
    task,
)
from little_es._threads import run_in_worker
from little_es.backends.sqlite import _WalPreallocation

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/test"
RUN_ID = "run_bench_peer"
RESUME_N = 1000
RESUME_DONE = 900
AGENT_TURNS = 50
AGENT_CALLS = (AGENT_TURNS + 1) + AGENT_TURNS
"""51 model calls and 50 tool calls."""
AGENT_TURNS_LONG = 250
"""The longer agent step of the marginal bytes per call: 251 model calls and 250 tool calls."""

_FIRST_CALL: list[float] = []
"""When a step function was first called since it was last emptied (the resume's first new
step)."""


def _output(i: int) -> dict[str, Any]:
    return {"i": i, "payload": "x" * 100}


def _index(ctx: StepContext) -> int:
    return int(ctx.step_path[1:])


def _step_sync(ctx: StepContext) -> dict[str, Any]:
    if not _FIRST_CALL:
        _FIRST_CALL.append(time.perf_counter())
    return _output(_index(ctx))


async def _step_async(ctx: StepContext) -> dict[str, Any]:
    if not _FIRST_CALL:
        _FIRST_CALL.append(time.perf_counter())
    return _output(_index(ctx))


VARIANTS: dict[str, tuple[Callable[[StepContext], Any], bool]] = {
    "sync": (_step_sync, True),
    "sync (run_in_thread=False)": (_step_sync, False),
    "async": (_step_async, True),
}
"""The step function and its ``run_in_thread`` of each timed variant."""


def steps_workflow(n: int, variant: str = "sync") -> Workflow:
    """N sequential trivial task steps ``s0`` ... ``s{n-1}``."""
    fn, in_thread = VARIANTS[variant]
    return Workflow(
        f"bench-peer-{n}",
        steps=[task(f"s{i}", fn, run_in_thread=in_thread) for i in range(n)],
    )


def agent_workflow(turns: int = AGENT_TURNS) -> tuple[Workflow, ScriptedModel]:
    """One agent step: ``turns`` turns of one tool call each, then the answer."""
    model = _model(turns, 1)
    step = agent(
        "agent", model=model, prompt=PROMPT, tools=[ECHO], system=SYSTEM, max_turns=turns + 1
    )
    return Workflow("bench-peer-agent", steps=[step]), model


def _quiet() -> None:
    """Before a timed run: the disk's pending writes and the blocks freed by the places
    just removed (which a ``discard`` mount trims at the next journal commit) flushed, so
    that neither lands in the run's fsyncs; and a collection."""
    os.sync()
    gc.collect()


def _timed_run(world: World, wf: Workflow) -> float:
    _quiet()
    t0 = time.perf_counter()
    asyncio.run(run_workflow(world, wf, {}, run_id=RUN_ID))
    return time.perf_counter() - t0


class _Stop(BaseException):
    """Stops the building run right after a chosen StepCompleted, as a kill would."""


def build_partial(world: World, wf: Workflow, done: int) -> None:
    """Run ``wf`` until its ``done``-th step's StepCompleted is committed."""
    last = f"s{done - 1}"

    def stop(event: Event) -> None:
        if isinstance(event, StepCompleted) and event.step_path == last:
            raise _Stop

    try:
        asyncio.run(run_workflow(world, wf, {}, run_id=RUN_ID, observer=stop))
    except _Stop:
        return
    raise AssertionError("the building run was not stopped")


def timed_resume(world: World, wf: Workflow) -> tuple[float, float]:
    """(seconds until the first new step's function is called, seconds to the end)."""
    _FIRST_CALL.clear()
    _quiet()
    t0 = time.perf_counter()
    result = asyncio.run(run_workflow(world, wf, run_id=RUN_ID))
    total = time.perf_counter() - t0
    assert result.resumed and result.steps_executed == RESUME_N - RESUME_DONE, result
    return _FIRST_CALL[0] - t0, total


# ------------------------------------------------------------------ the floor


class Floor:
    """The hand-rolled durable loop: one INSERT of the step's output + one COMMIT per step."""

    def __init__(self, conn: Any, table: Any) -> None:
        self.conn = conn
        insert = "INSERT INTO {} (run_id, step, output) VALUES (%s, %s, %s)"
        select = "SELECT step, output FROM {} WHERE run_id = %s"
        self._insert = self._statement(insert, table)
        self._select = self._statement(select, table)

    def _statement(self, text: str, table: Any) -> Any:
        raise NotImplementedError

    def _commit_one(self, step: str, output: bytes) -> None:
        raise NotImplementedError

    def run(self, n: int, recorded: set[str] | None = None) -> float | None:
        """Run the N steps, skipping the recorded ones; when the first new step starts."""
        first = None
        dumps = orjson.dumps
        for i in range(n):
            step = f"s{i}"
            if recorded is not None and step in recorded:
                continue
            if first is None:
                first = time.perf_counter()
            self._commit_one(step, dumps(_output(i)))
        return first

    def resume(self, n: int) -> tuple[float, float]:
        """(seconds until the first new step starts, seconds to the end) of resuming the run."""
        _quiet()
        t0 = time.perf_counter()
        rows = self.conn.execute(self._select, (RUN_ID,)).fetchall()
        loads = orjson.loads
        recorded = {step: loads(output) for step, output in rows}
        first = self.run(n, set(recorded))
        total = time.perf_counter() - t0
        assert first is not None
        return first - t0, total

    def timed(self, n: int) -> float:
        """Seconds for N steps."""
        _quiet()
        t0 = time.perf_counter()
        self.run(n)
        return time.perf_counter() - t0


class SqliteFloor(Floor):
    """sqlite3, autocommit off, BEGIN / INSERT / COMMIT per step; with ``wal``, the WAL
    grown before each COMMIT as a world grows its own."""

    def __init__(self, conn: Any, table: Any, wal: _WalPreallocation | None = None) -> None:
        super().__init__(conn, table)
        self._wal = wal

    def _statement(self, text: str, table: Any) -> Any:
        return text.format(table).replace("%s", "?")

    def _commit_one(self, step: str, output: bytes) -> None:
        self.conn.execute("BEGIN")
        self.conn.execute(self._insert, (RUN_ID, step, output))
        if self._wal is not None:
            self._wal.grow(self.conn.cursor())
        self.conn.execute("COMMIT")


class PostgresFloor(Floor):
    """psycopg, one transaction per step."""

    def _statement(self, text: str, table: Any) -> Any:
        return sql.SQL(text).format(table)

    def _commit_one(self, step: str, output: bytes) -> None:
        with self.conn.transaction():
            self.conn.execute(self._insert, (RUN_ID, step, output))


_FLOOR_TABLE = "(run_id TEXT, step TEXT, output {}, PRIMARY KEY (run_id, step))"


# ------------------------------------------------------------------ backends


@dataclass
class Place:
    """Where one world lives: a SQLite data dir, or a PostgreSQL schema."""

    path: Path | None = None
    schema: str = ""


class Kind:
    """One database kind: fresh worlds and floors, and their bytes on disk."""

    name = ""

    def describe(self) -> str:
        """The settings that make a commit durable, read from the database."""
        raise NotImplementedError

    @contextlib.contextmanager
    def place(self) -> Iterator[Place]:
        """A fresh place for one world or floor, removed afterwards."""
        raise NotImplementedError
        yield Place()

    def world(self, place: Place) -> World:
        """Open the world of ``place``."""
        raise NotImplementedError

    def world_bytes(self, place: Place) -> int:
        """The world's bytes on disk (the world closed)."""
        raise NotImplementedError

    def world_parts(self, place: Place) -> dict[str, int]:
        """The largest parts of :meth:`world_bytes`, by table or index (the world closed)."""
        raise NotImplementedError

    grown_floor = False
    """Whether :meth:`floor` takes ``grown_wal`` (a floor whose WAL is grown as a world's)."""

    @contextlib.contextmanager
    def floor(self, place: Place, *, grown_wal: bool = False) -> Iterator[Floor]:
        """A floor writing into ``place``."""
        raise NotImplementedError
        yield

    def floor_bytes(self, place: Place) -> int:
        """The floor's bytes on disk (the floor closed)."""
        raise NotImplementedError

    def copy(self, place: Place, into: Place) -> bool:
        """Copy a closed world or floor into a fresh place, if this kind can (else rebuild)."""
        return False

    def close(self) -> None:
        """Remove what the kind created."""


def _checkpointed_dir_bytes(path: Path) -> int:
    for db in path.glob("*.sqlite3"):
        conn = sqlite3.connect(db)
        try:
            busy, _, _ = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        finally:
            conn.close()
        assert busy == 0, f"{db}: the WAL could not be checkpointed"
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


class SqliteKind(Kind):
    """``local_world`` in temporary directories; the floor in a SQLite file beside it."""

    name = "sqlite"

    def __init__(self) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="bench-peer-")
        self._root = Path(self._tmp.name)

    def describe(self) -> str:
        """Read the pragmas from a world's own connection and from a floor's."""
        with self.place() as place, self.world(place) as world:
            datastore: Any = world.app.recorder.datastore  # type: ignore[attr-defined]
            with datastore.transaction(commit=False) as cursor:
                cursor.execute("PRAGMA journal_mode")
                journal = cursor.fetchone()[0]
                cursor.execute("PRAGMA synchronous")
                sync = cursor.fetchone()[0]
        with self.place() as place, self.floor(place) as floor:
            f_journal = floor.conn.execute("PRAGMA journal_mode").fetchone()[0]
            f_sync = floor.conn.execute("PRAGMA synchronous").fetchone()[0]
        names = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}
        said = (journal, names.get(sync), f_journal, names.get(f_sync))
        if said != ("wal", "FULL", "wal", "FULL"):
            raise RuntimeError(f"not WAL + synchronous=FULL (world, floor): {said}")
        return (
            f"SQLite {sqlite3.sqlite_version}: journal_mode={journal}, synchronous=FULL,"
            " read back by PRAGMA from the world's connection and from the floor's"
        )

    @contextlib.contextmanager
    def place(self) -> Iterator[Place]:
        """A fresh directory."""
        path = Path(tempfile.mkdtemp(dir=self._root))
        try:
            yield Place(path=path)
        finally:
            shutil.rmtree(path, ignore_errors=True)

    def world(self, place: Place) -> World:
        """``local_world`` with its default fsync policy."""
        assert place.path is not None
        return local_world(place.path / "world")

    def world_bytes(self, place: Place) -> int:
        """Every file in the data dir, its WAL checkpointed."""
        assert place.path is not None
        return _checkpointed_dir_bytes(place.path / "world")

    def world_parts(self, place: Place) -> dict[str, int]:
        """The pages of each table and index of the world's file (SQLite's ``dbstat``)."""
        assert place.path is not None
        conn = sqlite3.connect(place.path / "world" / "events.sqlite3")
        try:
            rows = conn.execute("SELECT name, sum(pgsize) FROM dbstat GROUP BY name").fetchall()
        finally:
            conn.close()
        return {str(name): int(size) for name, size in rows}

    grown_floor = True

    @contextlib.contextmanager
    def floor(self, place: Place, *, grown_wal: bool = False) -> Iterator[Floor]:
        """A WAL-mode file with synchronous=FULL, as the world's; with ``grown_wal``, its
        WAL grown ahead of its frames by the world's own code."""
        assert place.path is not None
        directory = place.path / "floor"
        directory.mkdir(exist_ok=True)
        path = directory / "floor.sqlite3"
        conn = sqlite3.connect(path, isolation_level=None)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute(f"CREATE TABLE IF NOT EXISTS steps {_FLOOR_TABLE.format('BLOB')}")
            wal = _WalPreallocation() if grown_wal else None
            yield SqliteFloor(conn, "steps", wal)
        finally:
            conn.close()

    def floor_bytes(self, place: Place) -> int:
        """Every file of the floor, its WAL checkpointed."""
        assert place.path is not None
        return _checkpointed_dir_bytes(place.path / "floor")

    def copy(self, place: Place, into: Place) -> bool:
        """Copy the directory."""
        assert place.path is not None and into.path is not None
        shutil.copytree(place.path, into.path, dirs_exist_ok=True)
        return True

    def close(self) -> None:
        """Delete the temporary directory."""
        self._tmp.cleanup()


class PostgresKind(Kind):
    """A scratch database of the server; each world and floor in a fresh schema of it."""

    name = "postgres"

    def __init__(self, server_dsn: str) -> None:
        self.database = f"little_es_peer_{uuid.uuid4().hex[:10]}"
        with psycopg.connect(server_dsn, autocommit=True, connect_timeout=5) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(self.database)))
        self._server_dsn = server_dsn
        base, _, query = server_dsn.partition("?")
        self.dsn = base.rsplit("/", 1)[0] + "/" + self.database + (f"?{query}" if query else "")

    def _connect(self) -> psycopg.Connection[Any]:
        return psycopg.connect(self.dsn, autocommit=True)

    def describe(self) -> str:
        """The server's version and the settings that make a COMMIT durable."""
        with self._connect() as conn:
            shown = {}
            for name in ("server_version", "fsync", "synchronous_commit", "wal_sync_method"):
                row = conn.execute(f"SHOW {name}").fetchone()
                assert row is not None
                shown[name] = str(row[0])
        if shown["synchronous_commit"] != "on" or shown["fsync"] != "on":
            raise RuntimeError(f"the server does not fsync each commit: {shown}")
        return (
            f"PostgreSQL {shown['server_version']}: fsync={shown['fsync']},"
            f" synchronous_commit={shown['synchronous_commit']} (the floor sets it on its own"
            f" connection too), wal_sync_method={shown['wal_sync_method']};"
            f" psycopg {psycopg.__version__}; scratch database {self.database}"
        )

    @contextlib.contextmanager
    def place(self) -> Iterator[Place]:
        """A fresh schema."""
        schema = f"w_{uuid.uuid4().hex[:12]}"
        with self._connect() as conn:
            conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        try:
            yield Place(schema=schema)
        finally:
            with self._connect() as conn:
                conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))

    def world(self, place: Place) -> World:
        """``postgres_world`` in the schema."""
        return postgres_world(self.dsn, schema=place.schema)

    def _schema_bytes(self, schema: str, only: str | None = None) -> int:
        query = (
            "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c"
            " JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = %s AND c.relkind = 'r' AND (%s::text IS NULL OR c.relname = %s)"
        )
        with self._connect() as conn:
            row = conn.execute(query, (schema, only, only)).fetchone()
        assert row is not None
        return int(row[0])

    def world_bytes(self, place: Place) -> int:
        """``pg_total_relation_size`` of every table of the world's schema."""
        return self._schema_bytes(place.schema)

    def world_parts(self, place: Place) -> dict[str, int]:
        """Each table of the world's schema: its heap (and TOAST), and its indexes."""
        query = (
            "SELECT c.relname, pg_total_relation_size(c.oid) - pg_indexes_size(c.oid),"
            " pg_indexes_size(c.oid) FROM pg_class c"
            " JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = %s AND c.relkind = 'r'"
        )
        with self._connect() as conn:
            rows = conn.execute(query, (place.schema,)).fetchall()
        parts: dict[str, int] = {}
        for name, heap, indexes in rows:
            parts[str(name)] = int(heap)
            parts[f"{name} indexes"] = int(indexes)
        return parts

    @contextlib.contextmanager
    def floor(self, place: Place, *, grown_wal: bool = False) -> Iterator[Floor]:
        """A table of the schema, on a connection with synchronous_commit=on (the server
        keeps its WAL's segments written ahead itself)."""
        table = sql.Identifier(place.schema, "floor")
        conn = self._connect()
        try:
            conn.execute("SET synchronous_commit = on")
            row = conn.execute("SHOW synchronous_commit").fetchone()
            assert row is not None and row[0] == "on", row
            create = "CREATE TABLE IF NOT EXISTS {} " + _FLOOR_TABLE.format("BYTEA")
            conn.execute(sql.SQL(create).format(table))
            yield PostgresFloor(conn, table)
        finally:
            conn.close()

    def floor_bytes(self, place: Place) -> int:
        """``pg_total_relation_size`` of the floor's table."""
        return self._schema_bytes(place.schema, "floor")

    def close(self) -> None:
        """Drop the scratch database."""
        with psycopg.connect(self._server_dsn, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                    sql.Identifier(self.database)
                )
            )


# ------------------------------------------------------------------ measurements


def _median_ms(xs: list[float], per: int = 1) -> float:
    return statistics.median(xs) / per * 1000


def per_step(kind: Kind, n: int, reps: int, figures: Figures) -> None:
    """Figure 1 at one size: the three variants and the floor, interleaved."""
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    floor_times: list[float] = []
    grown_times: list[float] = []
    workflows = {v: steps_workflow(n, v) for v in VARIANTS}
    for _ in range(reps):
        with kind.place() as place, kind.floor(place) as floor:
            floor_times.append(floor.timed(n))
        if kind.grown_floor:
            with kind.place() as place, kind.floor(place, grown_wal=True) as floor:
                grown_times.append(floor.timed(n))
        for variant, wf in workflows.items():
            with kind.place() as place, kind.world(place) as world:
                times[variant].append(_timed_run(world, wf))
    floor_ms = _median_ms(floor_times, n)
    for variant, xs in times.items():
        figures.add(
            f"{kind.name}: run_workflow of {n:,} trivial {variant} task steps, per step,"
            f" median of {reps}",
            _median_ms(xs, n),
            "ms",
            baseline=floor_ms,
            baseline_what="the floor: one INSERT of the step's output + fsynced COMMIT a step",
        )
    if grown_times:
        # The world writes its WAL's blocks ahead of its commits (_WalPreallocation); a
        # bare driver does not, and its first 1,000 pages of commits cost more for it.
        grown_ms = _median_ms(grown_times, n)
        figures.add(
            f"{kind.name}: the floor with its WAL grown ahead as a world's, N={n:,}, per"
            f" step, median of {reps}",
            grown_ms,
            "ms",
            baseline=floor_ms,
            baseline_what="the floor",
        )
        figures.add(
            f"{kind.name}: run_workflow of {n:,} trivial async task steps, per step, over"
            " that floor",
            _median_ms(times["async"], n),
            "ms",
            baseline=grown_ms,
            baseline_what="the floor with its WAL grown ahead as a world's",
        )


def bytes_per_step(kind: Kind, n: int, empty: int, figures: Figures) -> int:
    """Figure 2 at one size; the world's bytes."""
    wf = steps_workflow(n)
    with kind.place() as place:
        with kind.world(place) as world:
            asyncio.run(run_workflow(world, wf, {}, run_id=RUN_ID))
        ours = kind.world_bytes(place)
        parts = kind.world_parts(place)
    with kind.place() as place:
        with kind.floor(place) as floor:
            floor.run(n)
        floors = kind.floor_bytes(place)
    how = (
        "every file in the data dir, WAL checkpointed"
        if kind.name == "sqlite"
        else "pg_total_relation_size of the world's tables"
    )
    figures.add(
        f"{kind.name}: bytes on disk per step, N={n:,} ({how}; an empty world: {empty:,} B)",
        ours / n,
        "B",
        baseline=floors / n,
        baseline_what="the floor's rows (table, primary key), measured the same way",
    )
    # Where they go: the parts of at least a tenth of a byte a step.
    for part, size in sorted(parts.items(), key=lambda item: -item[1]):
        if size >= n // 10:
            figures.add(f"{kind.name}: of those, {part}, per step, N={n:,}", size / n, "B")
    return ours


def marginal_bytes_per_step(kind: Kind, sizes: dict[int, int], figures: Figures) -> None:
    """Figure 2's growth: what a further step adds, between the smallest and largest N.

    A world's tables start with pages that a run of any length needs (PostgreSQL's
    free-space and visibility maps, an index's root, a heads row rewritten in place),
    which the per-step figure at N spreads over N; this one leaves them out.
    """
    small, large = min(sizes), max(sizes)
    if small == large:
        return
    figures.add(
        f"{kind.name}: bytes on disk per step, added from N={small:,} to N={large:,}"
        f" ((bytes at {large:,} - at {small:,}) / {large - small:,})",
        (sizes[large] - sizes[small]) / (large - small),
        "B",
    )


def resume(kind: Kind, reps: int, figures: Figures) -> None:
    """Figure 3: resume 1,000 steps with 900 recorded, and the floor's resume."""
    wf = steps_workflow(RESUME_N)
    ours: list[tuple[float, float]] = []
    floors: list[tuple[float, float]] = []
    with kind.place() as built_world, kind.place() as built_floor:
        with kind.world(built_world) as world:
            build_partial(world, wf, RESUME_DONE)
        with kind.floor(built_floor) as floor:
            floor.run(RESUME_DONE)
        for _ in range(reps):
            with kind.place() as place:
                if not kind.copy(built_world, place):
                    with kind.world(place) as world:
                        build_partial(world, wf, RESUME_DONE)
                with kind.world(place) as world:
                    ours.append(timed_resume(world, wf))
            with kind.place() as place:
                if not kind.copy(built_floor, place):
                    with kind.floor(place) as floor:
                        floor.run(RESUME_DONE)
                with kind.floor(place) as floor:
                    floors.append(floor.resume(RESUME_N))
    what = f"resume {RESUME_N:,} steps with {RESUME_DONE} recorded"
    floor_what = "the floor: SELECT + orjson.loads of its rows, then the same steps"
    for i, part in enumerate(("until the first new step starts", "to the end")):
        figures.add(
            f"{kind.name}: {what}: {part}, median of {reps}",
            _median_ms([o[i] for o in ours]),
            "ms",
            baseline=_median_ms([f[i] for f in floors]),
            baseline_what=floor_what,
        )


def agent_step(kind: Kind, reps: int, empty: int, figures: Figures) -> None:
    """Figure 4: one agent step of 51 model calls and 50 tool calls, recorded and bare."""
    recorded: list[float] = []
    bare: list[float] = []
    stored: list[int] = []
    for _ in range(reps):
        wf, model = agent_workflow()
        with kind.place() as place:
            with kind.world(place) as world:
                recorded.append(_timed_run(world, wf))
            stored.append(kind.world_bytes(place))
        assert len(model.requests) == AGENT_TURNS + 1, len(model.requests)
        gc.collect()
        t0 = time.perf_counter()
        asyncio.run(_bare(_model(AGENT_TURNS, 1), [ECHO], AGENT_TURNS + 1))
        bare.append(time.perf_counter() - t0)
    rec_us = statistics.median(recorded) / AGENT_CALLS * 1e6
    bare_us = statistics.median(bare) / AGENT_CALLS * 1e6
    calls = f"{AGENT_TURNS + 1} model calls and {AGENT_TURNS} tool calls"
    figures.add(
        f"{kind.name}: an agent step of {calls} (run_workflow), per call, median of {reps}",
        rec_us,
        "µs",
        baseline=bare_us,
        baseline_what="the same model/tool loop with no recording",
    )
    figures.add(
        f"{kind.name}: recording overhead per call of that agent step (recorded - bare)",
        rec_us - bare_us,
        "µs",
    )
    figures.add(
        f"{kind.name}: bytes on disk per recorded call of that agent step"
        f" (the world's bytes - an empty world's {empty:,} B, over {AGENT_CALLS})",
        (statistics.median(stored) - empty) / AGENT_CALLS,
        "B",
    )
    # What a further call adds, the pages any world's tables start with left out (as in
    # marginal_bytes_per_step); the conversation grows all the way.
    long_wf, long_model = agent_workflow(AGENT_TURNS_LONG)
    with kind.place() as place:
        with kind.world(place) as world:
            asyncio.run(run_workflow(world, long_wf, {}, run_id=RUN_ID))
        long_bytes = kind.world_bytes(place)
    assert len(long_model.requests) == AGENT_TURNS_LONG + 1, len(long_model.requests)
    added = (2 * AGENT_TURNS_LONG + 1) - AGENT_CALLS
    figures.add(
        f"{kind.name}: bytes on disk per recorded call, added from {AGENT_TURNS} to"
        f" {AGENT_TURNS_LONG} turns ((bytes after {AGENT_TURNS_LONG} turns - after"
        f" {AGENT_TURNS}) / {added} calls)",
        (long_bytes - statistics.median(stored)) / added,
        "B",
    )


def profile_agent_step(kind: Kind, top: int = 30) -> None:
    """Where the agent step's time goes: cProfile over five recorded runs of it, the
    little_es and eventsourcing functions by cumulative time (printed, not a figure)."""
    import cProfile
    import io
    import pstats

    profile = cProfile.Profile()
    for _ in range(5):
        wf = agent_workflow()[0]
        with kind.place() as place, kind.world(place) as world:
            gc.collect()
            profile.enable()
            asyncio.run(run_workflow(world, wf, {}, run_id=RUN_ID))
            profile.disable()
    out = io.StringIO()
    stats = pstats.Stats(profile, stream=out)
    stats.sort_stats("cumulative").print_stats(r"little_es|eventsourcing", top)
    print(f"{kind.name}: profile of the agent step (5 runs, cProfile, cumulative)")
    print(out.getvalue().rstrip())


@dataclass
class _Split:
    """Seconds spent in ``World.save`` and, of those, in sqlite3's COMMIT (its fsync)."""

    save: float = 0.0
    commit: float = 0.0


@contextlib.contextmanager
def _timing_saves() -> Iterator[_Split]:
    """Time every ``World.save`` and every SQLite COMMIT while in the block (wrapping the
    two methods on their classes, restored on the way out)."""
    import eventsourcing.sqlite

    split = _Split()
    save, commit = World.save, eventsourcing.sqlite.SQLiteConnection.commit

    def timed_save(self: World, *args: Any, **kwargs: Any) -> None:
        t0 = time.perf_counter()
        try:
            save(self, *args, **kwargs)
        finally:
            split.save += time.perf_counter() - t0

    def timed_commit(self: eventsourcing.sqlite.SQLiteConnection) -> None:
        t0 = time.perf_counter()
        try:
            commit(self)
        finally:
            split.commit += time.perf_counter() - t0

    World.save = timed_save  # type: ignore[method-assign]
    eventsourcing.sqlite.SQLiteConnection.commit = timed_commit  # type: ignore[method-assign]
    try:
        yield split
    finally:
        World.save = save  # type: ignore[method-assign]
        eventsourcing.sqlite.SQLiteConnection.commit = commit  # type: ignore[method-assign]


def split_step_time(kind: Kind, reps: int, figures: Figures) -> None:
    """Where a task step's and an agent call's time goes, on SQLite (with its default
    ``synchronous="full"`` and with ``"normal"``) and with no database (``memory_world``):
    the COMMIT, the rest of ``World.save`` (encoding, the hash chain, the statements),
    and the engine outside ``World.save``; medians of reps."""
    cases: list[tuple[str, Callable[[], Workflow], int]] = [
        (
            f"a task step of {RESUME_N:,} async ones",
            lambda: steps_workflow(RESUME_N, "async"),
            RESUME_N,
        ),
        (
            f"a call of the agent step of {AGENT_CALLS} calls",
            lambda: agent_workflow()[0],
            AGENT_CALLS,
        ),
    ]
    normal = f"{kind.name} synchronous=normal"

    def world_of(name: str, place: Place) -> World:
        if name == "memory":
            return memory_world()
        if name == normal:
            assert place.path is not None
            return local_world(place.path / "world", synchronous="normal")
        return kind.world(place)

    for what, make, count in cases:
        # With synchronous=normal no commit waits for the disk: the same Python, not
        # slowed by an fsync before it.
        for name in ("memory", kind.name, normal):
            rows: list[tuple[float, float, float]] = []
            for _ in range(reps):
                with kind.place() as place:
                    world = world_of(name, place)
                    with world, _timing_saves() as split:
                        total = _timed_run(world, make())
                    rows.append((total, split.save, split.commit))
            total, save, commit = (
                statistics.median(col) / count * 1e6 for col in zip(*rows, strict=True)
            )
            figures.add(f"{name}: {what}, all of it, median of {reps}", total, "µs")
            if name == "memory":
                figures.add(f"{name}: of that, World.save", save, "µs")
            else:
                fsynced = "" if name == normal else "fsynced "
                figures.add(f"{name}: of that, the {fsynced}COMMIT", commit, "µs")
                figures.add(f"{name}: of that, World.save besides its COMMIT", save - commit, "µs")
            figures.add(f"{name}: of that, the engine outside World.save", total - save, "µs")


class _WaitsForTheDisk:
    """A task step's function that first writes 12 KiB (about a commit's WAL frames) into
    a file of its own and waits for ``fdatasync``, timing that; or does no I/O."""

    def __init__(self, fd: int | None) -> None:
        self._fd = fd
        self.io = 0.0

    def __call__(self, ctx: StepContext) -> dict[str, Any]:
        if self._fd is not None:
            t0 = time.perf_counter()
            os.pwrite(self._fd, bytes(12288), 0)
            os.fdatasync(self._fd)
            self.io += time.perf_counter() - t0
        return _output(_index(ctx))


def engine_after_io(kind: Kind, reps: int, figures: Figures, n: int = 500) -> None:
    """The same engine code, with and without a wait for the disk before it: a run of
    ``n`` task steps in ``memory_world`` (no database), each step's function waiting for
    an ``fdatasync`` of its own file or not; the engine's time per step is the run's time
    minus that I/O. Medians of reps, the two interleaved. What it shows: the time a
    step's Python takes after its thread waited for the disk, as every commit's does."""
    engine: dict[bool, list[float]] = {False: [], True: []}
    with kind.place() as place:
        assert place.path is not None
        fd = os.open(place.path / "io", os.O_RDWR | os.O_CREAT)
        try:
            os.pwrite(fd, bytes(1 << 20), 0)
            os.fsync(fd)
            for _ in range(reps):
                for waits in (False, True):
                    fn = _WaitsForTheDisk(fd if waits else None)
                    wf = Workflow(
                        f"bench-peer-io-{waits}",
                        steps=[task(f"s{i}", fn, run_in_thread=False) for i in range(n)],
                    )
                    with memory_world() as world:
                        total = _timed_run(world, wf)
                    engine[waits].append((total - fn.io) / n * 1e6)
        finally:
            os.close(fd)
    figures.add(
        f"memory: the engine's time per task step of {n} after a wait for the disk (each"
        f" step's code: a 12 KiB pwrite + fdatasync, its time taken out), median of {reps}",
        statistics.median(engine[True]),
        "µs",
        baseline=statistics.median(engine[False]),
        baseline_what="the same steps with no I/O",
    )


def _nothing() -> int:
    return 0


class _BareHop:
    """The least a hop from the loop to a thread and back costs: a thread waiting on a
    queue, which calls the function and hands the loop its result."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._jobs: queue.SimpleQueue[asyncio.Future[Any] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while (future := self._jobs.get()) is not None:
            self._loop.call_soon_threadsafe(future.set_result, _nothing())

    def call(self) -> asyncio.Future[Any]:
        future = self._loop.create_future()
        self._jobs.put(future)
        return future

    def close(self) -> None:
        self._jobs.put(None)
        self._thread.join()


def thread_hop(reps: int, figures: Figures, calls: int = 2000) -> None:
    """What a sync step's hop to a worker thread costs with no step around it
    (``little_es._threads.run_in_worker``), and ``asyncio.to_thread``'s, beside the bare
    hop of :class:`_BareHop`; medians of reps of ``calls``, the three interleaved."""

    async def timed() -> tuple[list[float], list[float], list[float]]:
        bare = _BareHop(asyncio.get_running_loop())
        hops: list[float] = []
        stdlib: list[float] = []
        floors: list[float] = []
        try:
            for _ in range(reps):
                gc.collect()
                t0 = time.perf_counter()
                for _ in range(calls):
                    await run_in_worker(_nothing)
                hops.append((time.perf_counter() - t0) / calls)
                t0 = time.perf_counter()
                for _ in range(calls):
                    await asyncio.to_thread(_nothing)
                stdlib.append((time.perf_counter() - t0) / calls)
                t0 = time.perf_counter()
                for _ in range(calls):
                    await bare.call()
                floors.append((time.perf_counter() - t0) / calls)
        finally:
            bare.close()
        return hops, stdlib, floors

    hops, stdlib, floors = asyncio.run(timed())
    floor = statistics.median(floors) * 1e6
    for what, times in (("little_es's worker threads", hops), ("asyncio.to_thread", stdlib)):
        figures.add(
            f"a sync step's thread hop alone: {what}, a function that does nothing,"
            f" per call, median of {reps}",
            statistics.median(times) * 1e6,
            "µs",
            baseline=floor,
            baseline_what="a thread waiting on a queue, answering with call_soon_threadsafe",
        )


def empty_world_bytes(kind: Kind) -> int:
    """The bytes of a world opened and closed with nothing in it."""
    with kind.place() as place:
        with kind.world(place):
            pass
        return kind.world_bytes(place)


def measure(kind: Kind, args: argparse.Namespace, figures: Figures) -> None:
    """Every figure of one kind."""
    print(kind.describe(), flush=True)
    t0 = time.perf_counter()
    # Warm up: imports, the first world's tables, the driver.
    with kind.place() as place, kind.world(place) as world:
        asyncio.run(run_workflow(world, steps_workflow(10), {}, run_id=RUN_ID))
    if args.only != "agent":
        for n in args.sizes:
            per_step(kind, n, args.reps, figures)
    empty = empty_world_bytes(kind)
    if args.only != "agent":
        sizes = {n: bytes_per_step(kind, n, empty, figures) for n in args.bytes_sizes}
        marginal_bytes_per_step(kind, sizes, figures)
        resume(kind, args.reps, figures)
    agent_step(kind, args.reps, empty, figures)
    if args.profile:
        profile_agent_step(kind)
    if args.split and kind.name == "sqlite":
        split_step_time(kind, args.reps, figures)
        engine_after_io(kind, args.reps, figures)
        thread_hop(args.reps, figures)
    print(f"{kind.name}: measured in {time.perf_counter() - t0:.0f} s", flush=True)


def _table(figures: Figures) -> str:
    """The compact human table: little_es, the floor, the ratio."""
    rows = [("what", "little_es", "floor, same run", "ratio")]
    for f in figures.figures:
        rows.append(
            (
                f.figure,
                _value(f.value, f.unit),
                "" if f.baseline is None else _value(f.baseline, f.unit),
                "" if f.ratio is None else f"x{f.ratio:.2f}",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(1, 4)]
    lines = []
    for i, (what, *cells) in enumerate(rows):
        right = " ".join(c.rjust(w) for c, w in zip(cells, widths, strict=True))
        lines.append(f"{right}  {what}")
        if i == 0:
            lines.append("-" * (sum(widths) + len(widths) + 1 + len(what)))
    return "\n".join(lines)


def _value(value: float, unit: str) -> str:
    number = f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"
    return f"{number} {unit}"


def main(argv: list[str] | None = None) -> int:
    """Parse the options, measure each backend, print the table (or the JSON line)."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--sizes", help="comma-separated N of figure 1 (default 100,1000)")
    parser.add_argument("--reps", type=int, help="repetitions per median (default 5)")
    parser.add_argument("--backends", default="sqlite,postgres", help="comma-separated")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="N=100 only, 3 repetitions, bytes at N=1,000 only (unless --sizes/--reps say)",
    )
    parser.add_argument(
        "--dsn",
        default=os.environ.get("LITTLE_ES_TEST_POSTGRES_DSN", DEFAULT_DSN),
        help="PostgreSQL server (a scratch database is created there and dropped)",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="also print a cProfile of the agent step (where its time goes)",
    )
    parser.add_argument(
        "--split",
        action="store_true",
        help="also split a task step's and an agent call's time (SQLite, also with"
        " synchronous=normal, and no database)",
    )
    parser.add_argument(
        "--only",
        choices=("agent",),
        help="measure only this figure (agent: figure 4), e.g. to alternate two checkouts",
    )
    add_json_option(parser)
    args = parser.parse_args(argv)
    args.sizes = [int(s) for s in (args.sizes or ("100" if args.quick else "100,1000")).split(",")]
    args.reps = args.reps or (3 if args.quick else 5)
    args.bytes_sizes = [1000] if args.quick else [1000, 10_000]
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    if set(backends) - {"sqlite", "postgres"} or min(args.sizes) < 1 or args.reps < 1:
        parser.error("backends: sqlite,postgres; --sizes >= 1; --reps >= 1")
    configure_logging(level="WARNING")
    with reporting("bench_peer", args.json) as figures:
        print(
            "N trivial task steps, each returning {'i': i, 'payload': 'x' * 100};"
            " floor = per step one INSERT of the step's output + its fsynced COMMIT,"
            " bare driver, same database kind; ratio = little_es / floor"
        )
        for name in backends:
            kind: Kind
            if name == "sqlite":
                kind = SqliteKind()
            else:
                try:
                    kind = PostgresKind(args.dsn)
                except psycopg.Error as exc:
                    print(
                        f"postgres skipped: cannot create a scratch database at {args.dsn}: {exc}"
                    )
                    continue
            try:
                measure(kind, args, figures)
            finally:
                kind.close()
        print(_table(figures))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

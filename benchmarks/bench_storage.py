"""How fast the event log stores and reads events, on SQLite, PostgreSQL and MariaDB.

For each backend, in a fresh world (a temporary directory; a PostgreSQL schema
or a MariaDB database created for the run and dropped after it), with a
realistic harness mix (mostly
``harness.model.called`` / ``harness.model.responded`` of a few hundred bytes,
some tool calls):

* append 1: the median (and p95) time of ``World.save`` of one event, i.e. one
  transaction, over ``--single`` samples, apart for results (fsynced:
  ``model.responded``, ``tool_call.succeeded``) and write-ahead records (not
  fsynced: ``model.called``, ``tool_call.started``);
* a step's storage: the median time of a task step's two commits (``StepStarted``,
  write-ahead, then ``StepCompleted``, a result) through ``World.save``, beside a
  floor measured in the same run: two plain ``INSERT`` + ``COMMIT`` of rows of
  the same size into a table of the same database, through the bare driver
  (``sqlite3`` with the world's pragmas / ``psycopg`` / ``pymysql``); and of the
  one commit a sequential step costs on the local engine (its ``StepCompleted``
  with the next step's ``StepStarted``), beside one such ``INSERT`` + ``COMMIT``;
* append batch: events/s of ``World.save`` over ``--events`` events, ``--batch``
  per save (encoding and writing; building the events is timed apart);
* read_stream: events/s of ``World.read_stream`` of that stream (decoded and
  validated pydantic events), best of ``--repeat``;
* rows: events/s of eventsourcing's recorder ``select_events`` (no decoding);
* raw: events/s of a direct ``SELECT`` + ``orjson.loads`` of the same rows
  (``sqlite3`` / ``psycopg``), the floor any decoder sits on; and the ratio.

Snapshotting is switched off: it is not storage, and a ``HarnessSession``
snapshot holds the whole session (see ``bench_snapshots.py``).

    .venv/bin/python benchmarks/bench_storage.py [--events 100000] \
        [--backends sqlite,postgres,mariadb]
"""

from __future__ import annotations

import argparse
import gc
import importlib.metadata
import os
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from uuid import UUID

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psycopg
import pymysql
from psycopg import sql

from benchmarks.figures import Figures, add_json_option, reporting
from little_es import (
    HarnessSession,
    Message,
    ModelCalled,
    ModelResponded,
    ModelResponse,
    Run,
    RunStarted,
    SessionStarted,
    StepCompleted,
    StepStarted,
    ToolCall,
    ToolCallStarted,
    ToolCallSucceeded,
    Usage,
    World,
    local_world,
    mysql_world,
    postgres_world,
)
from little_es.chain import FRAME_SIZE
from little_es.pricing import price_usage_exact
from little_es.world import LittleApplication

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/test"
DEFAULT_MYSQL = "127.0.0.1:3306"
RUN_ID = "run_bench_storage"

_WORDS = [
    *[
        "the",
        "customer",
        "reports",
        "that",
        "the",
        "invoice",
        "total",
        "does",
        "not",
        "match",
        "the",
        "order",
        "lines",
    ],
    *[
        "and",
        "asks",
        "for",
        "a",
        "corrected",
        "statement",
        "before",
        "the",
        "end",
        "of",
        "the",
        "quarter",
    ],
]


def _text(seed: int, words: int) -> str:
    return " ".join(_WORDS[(seed * 7 + i) % len(_WORDS)] for i in range(words))


def open_session(run_id: str, step_path: str) -> HarnessSession:
    """A new HarnessSession with its ``harness.session.started`` queued."""
    session = HarnessSession(run_id, step_path, 1)
    session.trigger(
        SessionStarted,
        run_id=run_id,
        step_path=step_path,
        attempt=1,
        manifest={"model": "gpt-4o-mini", "tools": ["lookup_invoice"], "temperature": 0},
        manifest_hash="5" * 64,
    )
    return session


def _queue_only() -> None:
    """The default ``each``: leave events queued."""


def add_turn(session: HarnessSession, turn: int, each: Callable[[], None] = _queue_only) -> int:
    """Queue one turn of the realistic mix; return how many events it added.

    Every turn: model called (one new message, ~250 bytes) and responded (~250
    bytes of text, usage); one turn in four also calls a tool. ``each`` runs
    after every event (to save them one at a time, as the write-ahead path does).
    """
    with_tool = turn % 4 == 0
    call_id = f"call_{turn}"
    session.trigger(
        ModelCalled,
        turn=turn,
        messages=(Message(role="user", content=_text(turn, 40)),),
        conversation_hash=f"{turn:064x}",
    )
    each()
    session.trigger(
        ModelResponded,
        turn=turn,
        response=ModelResponse(
            content=_text(turn + 1, 40),
            tool_calls=(
                (ToolCall(id=call_id, name="lookup_invoice", arguments={"invoice": turn}),)
                if with_tool
                else ()
            ),
            usage=Usage(input_tokens=1200 + turn, output_tokens=180, cached_input_tokens=1024),
            provider="openai",
            model="gpt-4o-mini",
        ),
    )
    each()
    if not with_tool:
        return 2
    session.trigger(
        ToolCallStarted, turn=turn, call_id=call_id, name="lookup_invoice", args={"invoice": turn}
    )
    each()
    session.trigger(
        ToolCallSucceeded,
        call_id=call_id,
        result={"invoice": turn, "lines": [{"sku": "A-1", "qty": 2, "total": 19.9}]},
    )
    each()
    return 4


def turns_for(session: HarnessSession, events: int, start_turn: int = 1) -> Iterator[int]:
    """Queue turns until ``events`` more events are queued; yield after each turn."""
    queued, turn = 0, start_turn
    while queued < events:
        queued += add_turn(session, turn)
        turn += 1
        yield queued


@contextmanager
def without_snapshots() -> Iterator[None]:
    """Switch snapshotting off for worlds opened inside the block."""
    saved = dict(LittleApplication.snapshotting_intervals)
    LittleApplication.snapshotting_intervals.clear()
    try:
        yield
    finally:
        LittleApplication.snapshotting_intervals.update(saved)


class Backend:
    """A fresh world on one backend, and a raw reader of its event rows."""

    name = ""

    def open(self) -> World:
        """Open the world."""
        raise NotImplementedError

    def raw_read(self, stream_id: UUID) -> list[tuple[str, Any]]:
        """``SELECT topic, state`` of a stream, in order, with ``orjson.loads`` of each state."""
        raise NotImplementedError

    def describe(self) -> str:
        """Server/library version, for the report."""
        raise NotImplementedError

    def cleanup(self) -> None:
        """Remove what the benchmark stored."""

    def commit_floor(self, row: bytes) -> Callable[[], None]:
        """A function that does one plain INSERT of ``row`` and its COMMIT via the bare driver."""
        raise NotImplementedError


class SqliteBackend(Backend):
    """``local_world`` in a temporary directory."""

    name = "sqlite"

    def __init__(self) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="little_es_bench_")
        self.data_dir = Path(self._tmp.name)

    def open(self) -> World:
        """Open the world."""
        return local_world(self.data_dir)

    def raw_read(self, stream_id: UUID) -> list[tuple[str, Any]]:
        """Direct sqlite3 query plus orjson."""
        conn = sqlite3.connect(self.data_dir / "events.sqlite3")
        try:
            rows = conn.execute(
                "SELECT topic, state FROM little_es_rows WHERE originator_id = ?"
                " ORDER BY originator_version",
                (stream_id.hex,),
            ).fetchall()
        finally:
            conn.close()
        loads = orjson.loads
        # The floor parses the payload behind each row's chain frame, unverified.
        return [(topic, loads(state[FRAME_SIZE:])) for topic, state in rows]

    def commit_floor(self, row: bytes) -> Callable[[], None]:
        """sqlite3 in the world's file, WAL and synchronous=FULL as the world has them."""
        conn = sqlite3.connect(self.data_dir / "events.sqlite3", isolation_level=None)
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("CREATE TABLE IF NOT EXISTS bench_floor (id INTEGER PRIMARY KEY, b BLOB)")

        def insert() -> None:
            conn.execute("BEGIN")
            conn.execute("INSERT INTO bench_floor (b) VALUES (?)", (row,))
            conn.execute("COMMIT")

        return insert

    def describe(self) -> str:
        """SQLite library version and journal mode."""
        return f"SQLite {sqlite3.sqlite_version} (WAL, synchronous=FULL default)"

    def cleanup(self) -> None:
        """Delete the directory."""
        self._tmp.cleanup()


class PostgresBackend(Backend):
    """``postgres_world`` in a schema of its own."""

    name = "postgres"

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.schema = f"little_es_bench_{uuid.uuid4().hex[:10]}"
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(self.schema)))

    def open(self) -> World:
        """Open the world."""
        return postgres_world(self.dsn, schema=self.schema)

    def raw_read(self, stream_id: UUID) -> list[tuple[str, Any]]:
        """Direct psycopg query plus orjson."""
        with psycopg.connect(self.dsn) as conn:
            rows = conn.execute(
                sql.SQL(
                    "SELECT topic, state FROM {}.little_es_rows WHERE originator_id = %s"
                    " ORDER BY originator_version"
                ).format(sql.Identifier(self.schema)),
                (stream_id,),
            ).fetchall()
        loads = orjson.loads
        # The floor parses the payload behind each row's chain frame, unverified.
        return [(topic, loads(state[FRAME_SIZE:])) for topic, state in rows]

    def describe(self) -> str:
        """Server version."""
        with psycopg.connect(self.dsn) as conn:
            row = conn.execute("SHOW server_version").fetchone()
            sync = conn.execute("SHOW synchronous_commit").fetchone()
        assert row is not None and sync is not None
        return f"PostgreSQL {row[0]} (synchronous_commit={sync[0]}, psycopg {psycopg.__version__})"

    def commit_floor(self, row: bytes) -> Callable[[], None]:
        """psycopg, one connection, in the world's schema."""
        conn = psycopg.connect(self.dsn, autocommit=True)
        table = sql.SQL("{}.bench_floor").format(sql.Identifier(self.schema))
        conn.execute(sql.SQL("CREATE TABLE {} (id bigserial PRIMARY KEY, b bytea)").format(table))
        statement = sql.SQL("INSERT INTO {} (b) VALUES (%s)").format(table)

        def insert() -> None:
            with conn.transaction():
                conn.execute(statement, (row,))

        return insert

    def cleanup(self) -> None:
        """Drop the schema."""
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(self.schema))
            )


class MySQLBackend(Backend):
    """``mysql_world`` in a database of its own."""

    name = "mariadb"

    def __init__(self, server: str) -> None:
        host, _, port = server.partition(":")
        self._connect_args: dict[str, Any] = {
            "host": host,
            "port": int(port or 3306),
            "user": "root",
            "autocommit": True,
        }
        self.database = f"little_es_bench_{uuid.uuid4().hex[:10]}"
        with pymysql.connect(**self._connect_args) as conn, conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE `{self.database}`")
        self.url = f"mysql+pymysql://root@{host}:{port or 3306}/{self.database}"

    def _connect(self) -> pymysql.connections.Connection[Any]:
        return pymysql.connect(**self._connect_args, database=self.database)

    def open(self) -> World:
        """Open the world."""
        return mysql_world(self.url)

    def raw_read(self, stream_id: UUID) -> list[tuple[str, Any]]:
        """Direct pymysql query plus orjson."""
        with self._connect() as conn, conn.cursor() as cur:
            cur.execute(
                "SELECT topic, state FROM littlees_events WHERE originator_id = %s"
                " ORDER BY originator_version",
                (stream_id.bytes,),
            )
            rows = cur.fetchall()
        loads = orjson.loads
        return [(topic, loads(state[FRAME_SIZE:])) for topic, state in rows]

    def commit_floor(self, row: bytes) -> Callable[[], None]:
        """pymysql, one connection, in the world's database."""
        conn = self._connect()
        with conn.cursor() as cur:
            cur.execute(
                "CREATE TABLE bench_floor (id BIGINT AUTO_INCREMENT PRIMARY KEY, b LONGBLOB)"
                " ENGINE=InnoDB"
            )
        conn.autocommit(False)

        def insert() -> None:
            with conn.cursor() as cur:
                cur.execute("INSERT INTO bench_floor (b) VALUES (%s)", (row,))
            conn.commit()

        return insert

    def describe(self) -> str:
        """Server version and its commit-flush settings."""
        with self._connect() as conn, conn.cursor() as cur:
            cur.execute(
                "SELECT VERSION(), @@innodb_flush_log_at_trx_commit, @@log_bin, @@sync_binlog"
            )
            row = cur.fetchone()
        assert row is not None
        binlog = f"log_bin=ON, sync_binlog={row[3]}" if row[2] else "log_bin=OFF"
        return (
            f"MariaDB/MySQL {row[0]} (innodb_flush_log_at_trx_commit={row[1]}, {binlog},"
            f" eventsourcing-sqlalchemy {importlib.metadata.version('eventsourcing-sqlalchemy')},"
            f" PyMySQL {pymysql.__version__})"
        )

    def cleanup(self) -> None:
        """Drop the database."""
        with pymysql.connect(**self._connect_args) as conn, conn.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS `{self.database}`")


def _started_run(world: World, run_id: str) -> Run:
    run = Run(run_id, price_usage_exact)
    run.trigger(
        RunStarted,
        run_id=run_id,
        workflow_id="bench",
        workflow_version="1",
        ir_hash="f" * 64,
        input={},
    )
    world.save(run)
    return run


def _steps(world: World, backend: Backend, samples: int) -> tuple[float, float, float, float]:
    """Median ms of a task step's two commits, of a step's one commit (its StepCompleted with
    the next StepStarted), and of two and one plain INSERT + COMMIT of such rows."""
    run = _started_run(world, "run_bench_steps")
    step_times: list[float] = []
    for i in range(samples):
        path = f"s{i}"
        start = time.perf_counter()
        run.trigger(StepStarted, step_path=path, step_id=path, kind="task", visit=1, attempt=1)
        world.save(run)
        run.trigger(
            StepCompleted, step_path=path, step_id=path, visit=1, attempt=1, output={"i": i}
        )
        world.save(run)
        step_times.append(time.perf_counter() - start)
    one = _started_run(world, "run_bench_one_commit")
    one.trigger(StepStarted, step_path="s0", step_id="s0", kind="task", visit=1, attempt=1)
    world.save(one)
    one_times: list[float] = []
    for i in range(samples):
        path, following = f"s{i}", f"s{i + 1}"
        start = time.perf_counter()
        one.trigger(
            StepCompleted, step_path=path, step_id=path, visit=1, attempt=1, output={"i": i}
        )
        one.trigger(
            StepStarted, step_path=following, step_id=following, kind="task", visit=1, attempt=1
        )
        world.save(one)
        one_times.append(time.perf_counter() - start)
    rows = world.select_stored(run.id)
    row = os.urandom(int(statistics.fmean(len(r.state) for r in rows)))
    insert = backend.commit_floor(row)
    floor_times: list[float] = []
    floor_one: list[float] = []
    for _ in range(samples):
        start = time.perf_counter()
        insert()
        middle = time.perf_counter()
        insert()
        floor_times.append(time.perf_counter() - start)
        floor_one.append(middle - start)
    return (
        statistics.median(step_times) * 1000,
        statistics.median(one_times) * 1000,
        statistics.median(floor_times) * 1000,
        statistics.median(floor_one) * 1000,
    )


def _best(repeat: int, fn: Callable[[], int]) -> tuple[float, int]:
    """The best wall time of ``repeat`` calls of ``fn`` and what it returned.

    The cyclic collector is paused around each call, as ``World.read_stream``
    pauses it while decoding, so that every reader is measured alike.
    """
    best, result = float("inf"), 0
    for _ in range(repeat):
        gc.collect()
        gc.disable()
        try:
            start = time.perf_counter()
            result = fn()
            best = min(best, time.perf_counter() - start)
        finally:
            gc.enable()
    return best, result


def measure(
    backend: Backend, *, events: int, batch: int, single: int, repeat: int
) -> dict[str, Any]:
    """Run every measurement on one backend; return the figures."""
    out: dict[str, Any] = {"describe": backend.describe()}
    with without_snapshots(), backend.open() as world:
        # One event per save: the write-ahead path of a harness call.
        short = open_session(RUN_ID, "single")
        world.save(short)
        samples: dict[bool, list[float]] = {True: [], False: []}

        def timed_save() -> None:
            write_ahead = all(type(e).write_ahead for e in short.pending_events)
            start = time.perf_counter()
            world.save(short)
            samples[write_ahead].append(time.perf_counter() - start)

        turn = 1
        while min(len(s) for s in samples.values()) < single:
            add_turn(short, turn, timed_save)
            turn += 1
        for key, write_ahead in (("result", False), ("ahead", True)):
            times = samples[write_ahead]
            out[f"{key}_median_ms"] = statistics.median(times) * 1000
            out[f"{key}_p95_ms"] = statistics.quantiles(times, n=20)[-1] * 1000
        out["step_ms"], out["one_ms"], out["floor_ms"], out["floor1_ms"] = _steps(
            world, backend, single
        )

        # Batches of ``batch`` events per save, into one long stream.
        session = open_session(RUN_ID, "long")
        build_s = save_s = 0.0
        written = 0
        start = time.perf_counter()
        for queued in turns_for(session, events - 1):
            if len(session.pending_events) >= batch or queued >= events - 1:
                build_s += time.perf_counter() - start
                pending = len(session.pending_events)
                t0 = time.perf_counter()
                world.save(session)
                save_s += time.perf_counter() - t0
                written += pending
                start = time.perf_counter()
        out["events"] = written
        out["append_eps"] = written / save_s
        out["build_eps"] = written / build_s
        rows = world.select_stored(session.id)
        out["mean_bytes"] = statistics.fmean(len(r.state) for r in rows)
        del rows

        sid = session.id
        # The writer's aggregate holds every event; a reader process would not.
        del session
        gc.collect()
        out["read_s"], n_read = _best(repeat, lambda: len(world.read_stream(sid)))
        out["rows_s"], n_rows = _best(repeat, lambda: len(world.select_stored(sid)))
        out["raw_s"], n_raw = _best(repeat, lambda: len(backend.raw_read(sid)))
        assert n_read == n_rows == n_raw == written, (n_read, n_rows, n_raw, written)
    out["read_eps"] = written / out["read_s"]
    out["rows_eps"] = written / out["rows_s"]
    out["raw_eps"] = written / out["raw_s"]
    out["ratio"] = out["read_s"] / out["raw_s"]
    return out


def _table(results: dict[str, dict[str, Any]], batch: int, single: int) -> str:
    names = list(results)
    lines = [
        (
            f"append 1 result, median (p95) [{single} saves]",
            "{result_median_ms:.2f} ms ({result_p95_ms:.2f})",
        ),
        (
            f"append 1 write-ahead record [{single} saves]",
            "{ahead_median_ms:.2f} ms ({ahead_p95_ms:.2f})",
        ),
        (f"a task step's two commits, median [{single}]", "{step_ms:.2f} ms"),
        ("  floor: 2 x bare INSERT + COMMIT", "{floor_ms:.2f} ms"),
        (f"a step's one commit (local engine) [{single}]", "{one_ms:.2f} ms"),
        ("  floor: 1 x bare INSERT + COMMIT", "{floor1_ms:.2f} ms"),
        (f"append, {batch} events per save", "{append_eps:,.0f} ev/s"),
        ("  (building the events, apart)", "{build_eps:,.0f} ev/s"),
        ("read_stream, decoded + validated", "{read_eps:,.0f} ev/s"),
        ("recorder select_events (no decode)", "{rows_eps:,.0f} ev/s"),
        ("raw SELECT + orjson.loads", "{raw_eps:,.0f} ev/s"),
        ("read_stream time / raw time", "{ratio:.1f}x"),
        ("events in the stream", "{events:,}"),
        ("mean stored row (payload + 21 B chain frame)", "{mean_bytes:.0f} B"),
    ]
    width = max(len(label) for label, _ in lines)
    cols = [[fmt.format(**results[n]) for _, fmt in lines] for n in names]
    colw = [max(len(n), *(len(c) for c in col)) for n, col in zip(names, cols, strict=True)]
    head = " " * width + " | " + " | ".join(n.rjust(w) for n, w in zip(names, colw, strict=True))
    rule = "-" * len(head)
    body = [
        label.ljust(width)
        + " | "
        + " | ".join(col[i].rjust(w) for col, w in zip(cols, colw, strict=True))
        for i, (label, _) in enumerate(lines)
    ]
    return "\n".join([head, rule, *body])


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, run the measurements, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=100_000, help="events in the long stream")
    parser.add_argument("--batch", type=int, default=500, help="events per save when batching")
    parser.add_argument("--single", type=int, default=200, help="one-event saves to time")
    parser.add_argument("--repeat", type=int, default=3, help="reads per figure (best is kept)")
    parser.add_argument("--backends", default="sqlite,postgres,mariadb", help="comma-separated")
    parser.add_argument(
        "--dsn",
        default=os.environ.get("LITTLE_ES_TEST_POSTGRES_DSN", DEFAULT_DSN),
        help="PostgreSQL server (a schema is created and dropped)",
    )
    parser.add_argument(
        "--mysql",
        default=DEFAULT_MYSQL,
        help="MariaDB/MySQL server host:port, user root (a database is created and dropped)",
    )
    add_json_option(parser)
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.backends.split(",") if n.strip()]
    unknown = set(names) - {"sqlite", "postgres", "mariadb"}
    if unknown or args.events < 2 or args.batch < 1 or args.single < 2:
        parser.error(
            f"unknown backend(s) {sorted(unknown)}"
            if unknown
            else "need --events >= 2, --batch >= 1, --single >= 2"
        )
    with reporting("bench_storage", args.json) as figures:
        print(
            f"little_es storage benchmark: Python {sys.version.split()[0]},"
            f" eventsourcing {importlib.metadata.version('eventsourcing')}"
        )
        results: dict[str, dict[str, Any]] = {}
        for name in names:
            backend: Backend = (
                SqliteBackend()
                if name == "sqlite"
                else PostgresBackend(args.dsn)
                if name == "postgres"
                else MySQLBackend(args.mysql)
            )
            try:
                results[name] = measure(
                    backend,
                    events=args.events,
                    batch=args.batch,
                    single=args.single,
                    repeat=args.repeat,
                )
            finally:
                backend.cleanup()
            print(f"  {name}: {results[name]['describe']}")
            _figures(figures, name, results[name], args.batch, args.single)
        print()
        print(_table(results, args.batch, args.single))
    return 0


def _figures(figures: Figures, name: str, r: dict[str, Any], batch: int, single: int) -> None:
    figures.add(
        f"{name}: append one result (one transaction, fsynced), median of {single}",
        r["result_median_ms"],
        "ms",
    )
    figures.add(
        f"{name}: append one write-ahead record (one transaction), median of {single}",
        r["ahead_median_ms"],
        "ms",
    )
    figures.add(
        f"{name}: a task step's two commits (StepStarted, StepCompleted), median of {single}",
        r["step_ms"],
        "ms",
        baseline=r["floor_ms"],
        baseline_what="two bare INSERT + COMMIT of rows that size, same database",
    )
    figures.add(
        f"{name}: a step's one commit on the local engine (its StepCompleted with the next"
        f" StepStarted), median of {single}",
        r["one_ms"],
        "ms",
        baseline=r["floor1_ms"],
        baseline_what="one bare INSERT + COMMIT of a row that size, same database",
    )
    figures.add(
        f"{name}: append {r['events']:,} events, {batch} per transaction", r["append_eps"], "ev/s"
    )
    figures.add(
        f"{name}: read back a {r['events']:,}-event stream (every event decoded, validated,"
        f" its chain verified); {r['mean_bytes']:.0f} B a row stored",
        r["read_eps"],
        "ev/s",
        baseline=r["raw_eps"],
        baseline_what="raw SELECT + orjson.loads of the same rows",
    )


if __name__ == "__main__":
    raise SystemExit(main())

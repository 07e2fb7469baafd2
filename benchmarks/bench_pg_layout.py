"""What a PostgreSQL world takes on disk in each of its two table layouts.

The same N trivial task steps (``bench_peer``'s workload) run twice, each in a fresh
schema of a scratch database:

1. a world as this version creates it: the compact layout
   (``CompactPostgresApplicationRecorder``: integer stream and topic keys, the
   notification ids indexed in buckets);
2. a world in a schema that already holds eventsourcing's events table, created
   there first by eventsourcing's own recorder, as schemas made by earlier versions
   hold it: the world keeps that layout (``LittlePostgresApplicationRecorder``).

A world's bytes per step are everything in its schema (``pg_total_relation_size``:
heap, indexes, TOAST) over N, split by table. Baselines: for the compact world, the
floor's (one row of the step's output a step, ``bench_peer``'s floor table, after the
same N steps); for eventsourcing's table, the compact world's. Then, with both worlds
open, what the log's readers ask of each (a resume's read of the run's rows, the check
for a later row, a page of notifications), the two taking turns: the compact layout's
median time against eventsourcing's table's.

    .venv/bin/python -m benchmarks.bench_pg_layout [--steps 10000] [--rounds 50] [--dsn URL]
        [--json]

Skipped, with the reason printed, when the server cannot be reached.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import unquote, urlsplit

import psycopg
from eventsourcing.postgres import PostgresApplicationRecorder, PostgresDatastore

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_peer import DEFAULT_DSN, RUN_ID, Place, PostgresKind, steps_workflow
from benchmarks.figures import Figures, add_json_option, reporting
from little_es import run_workflow
from little_es.backends.postgres import (
    CompactPostgresApplicationRecorder,
    LittlePostgresApplicationRecorder,
)
from little_es.ids import run_stream_id
from little_es.logging import configure_logging
from little_es.world import World


def _create_eventsourcing_table(dsn: str, schema: str) -> None:
    """eventsourcing's events table (and its index, type and function) in ``schema``,
    created by eventsourcing's own recorder, named as for a world's application."""
    parts = urlsplit(dsn)
    datastore = PostgresDatastore(
        dbname=parts.path.lstrip("/"),
        host=parts.hostname or "127.0.0.1",
        port=str(parts.port or 5432),
        user=unquote(parts.username or "postgres"),
        password=unquote(parts.password or ""),
        schema=schema,
    )
    try:
        PostgresApplicationRecorder(datastore, events_table_name="littlees_events").create_table()
    finally:
        datastore.close()


def _run_world(
    kind: PostgresKind, place: Place, n: int, layout: type, stack: contextlib.ExitStack
) -> World:
    """N steps in a world of the place, which must come up in ``layout``; kept open."""
    world = stack.enter_context(kind.world(place))
    assert type(world.app.recorder) is layout, type(world.app.recorder)
    asyncio.run(run_workflow(world, steps_workflow(n), {}, run_id=RUN_ID))
    return world


_READS: dict[str, Callable[[LittlePostgresApplicationRecorder, int], object]] = {
    "the run's rows (a resume's read)": lambda r, n: r.stream_rows(run_stream_id(RUN_ID), None),
    "whether the run has a row after its middle (the check before each step)": (
        lambda r, n: r.has_rows_after(run_stream_id(RUN_ID), n)
    ),
    "500 notifications from the log's middle (the runs projection, verify, export)": (
        lambda r, n: r.select_notifications(n, 500)
    ),
}
"""What the log's readers ask, each given the recorder and N."""


def _time_reads(worlds: dict[str, World], n: int, rounds: int) -> dict[tuple[str, str], float]:
    """The median time of each read in each world, the worlds taking turns."""
    times: dict[tuple[str, str], list[float]] = {(w, r): [] for w in worlds for r in _READS}
    for _ in range(rounds):
        for read, call in _READS.items():
            for name, world in worlds.items():
                recorder = world.app.recorder
                assert isinstance(recorder, LittlePostgresApplicationRecorder)
                # Each read timed on its own: not the collection of what the one before
                # it allocated (the run's 20,000 rows).
                gc.collect()
                start = time.perf_counter()
                call(recorder, n)
                times[(name, read)].append(time.perf_counter() - start)
    return {key: statistics.median(found) for key, found in times.items()}


def _add_parts(figures: Figures, what: str, parts: dict[str, int], n: int) -> None:
    events = "little_es_events" if "little_es_events" in parts else "littlees_events"
    shown = {
        events: parts[events],
        f"{events} indexes": parts[f"{events} indexes"],
        "the other tables and their indexes": sum(parts.values())
        - parts[events]
        - parts[f"{events} indexes"],
    }
    for name, size in shown.items():
        figures.add(f"postgres: {what}, of those, {name}, per step, N={n:,}", size / n, "B")


def measure(kind: PostgresKind, n: int, rounds: int, figures: Figures) -> None:
    """Run both worlds and the floor; add the figures."""
    with contextlib.ExitStack() as stack:
        place = stack.enter_context(kind.place())
        worlds = {"compact": _run_world(kind, place, n, CompactPostgresApplicationRecorder, stack)}
        compact = kind.world_parts(place)
        with kind.floor(place) as floor:
            floor.run(n)
        floor_bytes = kind.floor_bytes(place)
        place = stack.enter_context(kind.place())
        _create_eventsourcing_table(kind.dsn, place.schema)
        worlds["eventsourcing"] = _run_world(
            kind, place, n, LittlePostgresApplicationRecorder, stack
        )
        eventsourcing = kind.world_parts(place)
        reads = _time_reads(worlds, n, rounds)
    compact.pop("floor", None)
    compact.pop("floor indexes", None)
    what = "pg_total_relation_size of the schema's tables"
    compact_bytes = sum(compact.values())
    figures.add(
        f"postgres: bytes on disk per step of a world (the compact layout), N={n:,}, {what}",
        compact_bytes / n,
        "B",
        baseline=floor_bytes / n,
        baseline_what="the floor's rows (table, primary key), measured the same way",
    )
    _add_parts(figures, "the compact layout", compact, n)
    figures.add(
        f"postgres: the same in eventsourcing's table (a schema from before the compact"
        f" layout), N={n:,}, {what}",
        sum(eventsourcing.values()) / n,
        "B",
        baseline=compact_bytes / n,
        baseline_what="the compact layout",
    )
    _add_parts(figures, "eventsourcing's table", eventsourcing, n)
    for read in _READS:
        figures.add(
            f"postgres: {read}, the compact layout, N={n:,}, median of {rounds}",
            reads[("compact", read)] * 1e3,
            "ms",
            baseline=reads[("eventsourcing", read)] * 1e3,
            baseline_what="the same in eventsourcing's table, the two taking turns",
        )


def main() -> None:
    """Print the figures."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=50, help="repetitions of each read")
    parser.add_argument(
        "--dsn",
        default=os.environ.get("LITTLE_ES_TEST_POSTGRES_DSN", DEFAULT_DSN),
        help="PostgreSQL server (a scratch database is created there and dropped)",
    )
    add_json_option(parser)
    args = parser.parse_args()
    if args.steps < 1 or args.rounds < 1:
        parser.error("--steps >= 1 and --rounds >= 1")
    configure_logging(level="WARNING")
    with reporting("bench_pg_layout", args.json) as figures:
        try:
            kind = PostgresKind(args.dsn)
        except psycopg.Error as exc:
            print(f"postgres skipped: cannot create a scratch database at {args.dsn}: {exc}")
            return
        try:
            measure(kind, args.steps, args.rounds, figures)
        finally:
            kind.close()
        for f in figures.figures:
            ratio = f"x{f.ratio:.2f}" if f.ratio is not None else ""
            base = f"{f.baseline:7.3g} {f.unit}" if f.baseline is not None else ""
            print(f"{f.value:7.3g} {f.unit:2}  {base:10}  {ratio:6}  {f.figure}")


if __name__ == "__main__":
    main()

"""What a PostgreSQL world's rows would take on disk in other table layouts.

A world runs N trivial task steps (``bench_peer``'s workload) in a fresh schema of a
scratch database. Then its events table's rows are copied, in notification-id order
(the order the world appended them), into a table of each layout below, in the same
schema. A layout's bytes per step are everything in the schema
(``pg_total_relation_size``: heap, indexes, TOAST) with the world's events table
replaced by the layout's tables, over N. The layouts:

1. eventsourcing's table, as a world has it: a check of the method, since the copy
   must take what the world's own table takes;
2. integer keys: a row holds a 4-byte integer for its stream and a 2-byte one for its
   topic, a 4-byte version, the notification id and the state; primary key
   ``(stream, version)`` and a unique B-tree on the notification id; the two small
   tables that give the integers are counted. This is the layout of a world's SQLite
   file (``CompactSQLiteApplicationRecorder``);
3. the same with a BRIN index on the notification id instead of the B-tree. A BRIN
   index cannot serve ``ORDER BY notification_id LIMIT n``: eventsourcing's readers
   of the notification log (``select_notifications``) would have to read bounded
   ranges of ids for it to be of use.

Baseline: the world's bytes per step as it stores them today. The floor's (one row of
the step's output a step, ``bench_peer``'s floor table, after the same N steps) is
the baseline of that figure itself.

    .venv/bin/python -m benchmarks.bench_pg_layout [--steps 10000] [--dsn URL] [--json]

Skipped, with the reason printed, when the server cannot be reached.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from eventsourcing.postgres import PostgresApplicationRecorder
from psycopg import sql

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_peer import DEFAULT_DSN, RUN_ID, Place, PostgresKind, steps_workflow
from benchmarks.figures import Figures, add_json_option, reporting
from little_es import run_workflow
from little_es.logging import configure_logging


@dataclass(frozen=True)
class Layout:
    """A table layout the world's rows are copied into."""

    name: str
    tables: tuple[str, ...]
    """The tables it adds to the schema (its events table first)."""
    create: tuple[str, ...]
    """Its DDL; ``{s}`` is the schema."""
    copy: tuple[str, ...]
    """The statements that copy the world's rows into it; ``{e}`` is the world's events table."""


_ES_COLUMNS = "originator_id, originator_version, topic, state, notification_id"
_COMPACT_TABLE = (
    "CREATE TABLE {s}.{t} (notification_id bigint NOT NULL, stream int NOT NULL,"
    " version int NOT NULL, topic smallint NOT NULL, state bytea NOT NULL,"
    " PRIMARY KEY (stream, version))"
)
_KEYS = (
    "CREATE TABLE {s}.layout_streams (id serial PRIMARY KEY, stream_id uuid NOT NULL UNIQUE)",
    "CREATE TABLE {s}.layout_topics (id smallserial PRIMARY KEY, topic text NOT NULL UNIQUE)",
)
_FILL_KEYS = (
    "INSERT INTO {s}.layout_streams (stream_id)"
    " SELECT originator_id FROM {s}.{e} GROUP BY originator_id ORDER BY min(notification_id)",
    "INSERT INTO {s}.layout_topics (topic)"
    " SELECT topic FROM {s}.{e} GROUP BY topic ORDER BY min(notification_id)",
)


def _copy_compact(table: str) -> str:
    return (
        f"INSERT INTO {{s}}.{table} (notification_id, stream, version, topic, state)"
        " SELECT e.notification_id, k.id, e.originator_version, t.id, e.state FROM {s}.{e} e"
        " JOIN {s}.layout_streams k ON k.stream_id = e.originator_id"
        " JOIN {s}.layout_topics t ON t.topic = e.topic ORDER BY e.notification_id"
    )


LAYOUTS = (
    Layout(
        "eventsourcing's table, as a world has it (a check of the method)",
        ("layout_es",),
        (
            "CREATE TABLE {s}.layout_es (originator_id uuid NOT NULL, originator_version"
            " bigint NOT NULL, topic text NOT NULL, state bytea, notification_id bigint NOT"
            " NULL, PRIMARY KEY (originator_id, originator_version))",
            "CREATE UNIQUE INDEX ON {s}.layout_es (notification_id)",
        ),
        (
            f"INSERT INTO {{s}}.layout_es ({_ES_COLUMNS}) SELECT {_ES_COLUMNS} FROM {{s}}.{{e}}"
            " ORDER BY notification_id",
        ),
    ),
    Layout(
        "integer stream and topic keys (the SQLite file's layout), a B-tree on the notification id",
        ("layout_btree", "layout_streams", "layout_topics"),
        (
            *_KEYS,
            _COMPACT_TABLE.replace("{t}", "layout_btree"),
            "CREATE UNIQUE INDEX ON {s}.layout_btree (notification_id)",
        ),
        (*_FILL_KEYS, _copy_compact("layout_btree")),
    ),
    Layout(
        "integer stream and topic keys, a BRIN index on the notification id (readers"
        " would need bounded id ranges)",
        ("layout_brin", "layout_streams", "layout_topics"),
        (
            _COMPACT_TABLE.replace("{t}", "layout_brin"),
            "CREATE INDEX ON {s}.layout_brin USING brin (notification_id)",
        ),
        (_copy_compact("layout_brin"),),
    ),
)
"""In order: the third reuses the second's key tables."""


def _table_bytes(kind: PostgresKind, place: Place) -> dict[str, int]:
    """Each table of the place's schema: its heap, TOAST and indexes."""
    parts = kind.world_parts(place)
    return {
        name: size + parts[f"{name} indexes"]
        for name, size in parts.items()
        if not name.endswith(" indexes")
    }


def _run(statements: tuple[str, ...], conn: psycopg.Connection[Any], **names: str) -> None:
    identifiers = {key: sql.Identifier(name) for key, name in names.items()}
    for text in statements:
        conn.execute(sql.SQL(text).format(**identifiers))


def measure(kind: PostgresKind, n: int, figures: Figures) -> None:
    """Run the world, copy its rows into each layout, add the figures."""
    with kind.place() as place:
        with kind.world(place) as world:
            asyncio.run(run_workflow(world, steps_workflow(n), {}, run_id=RUN_ID))
            recorder = world.app.recorder
            assert isinstance(recorder, PostgresApplicationRecorder)
            events = recorder.events_table_name
        with kind.floor(place) as floor:
            floor.run(n)
        floor_bytes = kind.floor_bytes(place)
        with psycopg.connect(kind.dsn, autocommit=True) as conn:
            world_parts = _table_bytes(kind, place)
            world_parts.pop("floor")
            world_bytes = sum(world_parts.values())
            others = world_bytes - world_parts[events]
            layouts: dict[str, int] = {}
            for layout in LAYOUTS:
                _run(layout.create, conn, s=place.schema)
                _run(layout.copy, conn, s=place.schema, e=events)
                sizes = _table_bytes(kind, place)
                layouts[layout.name] = others + sum(sizes[t] for t in layout.tables)
    what = f"N={n:,}, pg_total_relation_size of the schema's tables"
    figures.add(
        f"postgres: bytes on disk per step of a world, {what}",
        world_bytes / n,
        "B",
        baseline=floor_bytes / n,
        baseline_what="the floor's rows (table, primary key), measured the same way",
    )
    for name, total in layouts.items():
        figures.add(
            f"postgres: the same, its rows copied into {name}",
            total / n,
            "B",
            baseline=world_bytes / n,
            baseline_what="the world as it stores them",
        )


def main() -> None:
    """Print the figures."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument(
        "--dsn",
        default=os.environ.get("LITTLE_ES_TEST_POSTGRES_DSN", DEFAULT_DSN),
        help="PostgreSQL server (a scratch database is created there and dropped)",
    )
    add_json_option(parser)
    args = parser.parse_args()
    if args.steps < 1:
        parser.error("--steps >= 1")
    configure_logging(level="WARNING")
    with reporting("bench_pg_layout", args.json) as figures:
        try:
            kind = PostgresKind(args.dsn)
        except psycopg.Error as exc:
            print(f"postgres skipped: cannot create a scratch database at {args.dsn}: {exc}")
            return
        try:
            measure(kind, args.steps, figures)
        finally:
            kind.close()
        for f in figures.figures:
            ratio = f"x{f.ratio:.2f}" if f.ratio is not None else ""
            base = f"{f.baseline:7.1f} B" if f.baseline is not None else ""
            print(f"{f.value:7.1f} B  {base}  {ratio:6}  {f.figure}")


if __name__ == "__main__":
    main()

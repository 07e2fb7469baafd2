"""Lease check benchmark: what confirming a held lease costs, per backend.

Run from the repository root::

    .venv/bin/python -m benchmarks.bench_leases
    .venv/bin/python -m benchmarks.bench_leases --postgres ""   # SQLite only

The engines call :func:`little_es.check_leases` before every step, model call,
tool call and append; a harness turn with one tool call makes about four checks.
Printed, per check (medians of ``--repeats`` batches of ``--checks`` checks):

* ``check_leases()`` outside any lease (a session run on its own);
* SQLite: ``stat`` of the lock file, compared with the inode this process locked;
* PostgreSQL, the usual check: a ``poll`` of the lock connection's socket;
* PostgreSQL, the confirming query of ``pg_locks`` that a check makes at most every
  ``PostgresRunLeases.verify_interval_s`` (and at once when the socket is readable).

PostgreSQL runs in a fresh schema of ``--postgres`` (default
``postgresql://postgres@127.0.0.1:5432/test``), dropped afterwards.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import psycopg

from benchmarks.figures import Figures, add_json_option, reporting
from little_es import check_leases, local_world, postgres_world
from little_es.backends.postgres import PostgresRunLeases

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/test"


def _per_call(fn: Callable[[], None], checks: int, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(checks):
            fn()
        times.append((time.perf_counter() - start) / checks)
    return statistics.median(times)


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:8.2f} µs"


def main() -> None:
    """Parse the options and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checks", type=int, default=2000, help="checks per batch")
    parser.add_argument("--repeats", type=int, default=9, help="batches per median")
    parser.add_argument(
        "--postgres", default=DEFAULT_DSN, help="PostgreSQL URL ('' to skip PostgreSQL)"
    )
    add_json_option(parser)
    args = parser.parse_args()
    with reporting("bench_leases", args.json) as figures:
        _main(args, figures)


def _main(args: argparse.Namespace, figures: Figures) -> None:
    n, r = args.checks, args.repeats
    print(f"per check, medians of {r} batches of {n}")
    none = _per_call(check_leases, n, r)
    print(f"  check_leases(), no lease held           {_us(none)}")
    base = {"baseline": none * 1e6, "baseline_what": "check_leases() with no lease held"}
    root = Path(tempfile.mkdtemp(prefix="bench_leases_"))
    try:
        with local_world(root) as world, world.run_lease("bench_lease") as lease:
            stat = _per_call(lease.check, n, r)
            print(f"  sqlite: stat of the lock file            {_us(stat)}")
            held = _per_call(check_leases, n, r)
            print(f"  sqlite: check_leases(), one lease held   {_us(held)}")
            figures.add(
                "sqlite: one lease check (check_leases(), one lease held)", held * 1e6, "µs", **base
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if not args.postgres:
        return
    schema = f"bench_leases_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(args.postgres, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    try:
        with (
            postgres_world(args.postgres, schema=schema) as world,
            world.run_lease("bench_lease") as lease,
        ):
            polled = _per_call(lease.check, n, r)
            print(f"  postgres: poll of the lock connection    {_us(polled)}")
            figures.add(
                "postgres: one lease check (a poll of the lock connection)",
                polled * 1e6,
                "µs",
                **base,
            )
            leases = world.leases
            assert isinstance(leases, PostgresRunLeases)
            leases.verify_interval_s = 0.0  # every check queries
            queried = _per_call(lease.check, max(n // 10, 1), r)
            print(f"  postgres: the confirming pg_locks query  {_us(queried)}")
            figures.add(
                f"postgres: the confirming pg_locks query (at most every"
                f" {PostgresRunLeases.verify_interval_s} s of driving)",
                queried * 1e6,
                "µs",
            )
            leases.verify_interval_s = PostgresRunLeases.verify_interval_s
            share = queried / PostgresRunLeases.verify_interval_s
            print(
                f"  postgres: the query at most every {PostgresRunLeases.verify_interval_s} s is"
                f" {share:.3%} of a driver's time at most"
            )
    finally:
        with psycopg.connect(args.postgres, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


if __name__ == "__main__":
    main()

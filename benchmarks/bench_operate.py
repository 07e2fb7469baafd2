"""What watching for a cancellation costs: the check a driver makes before a call, per backend.

Run from the repository root::

    .venv/bin/python -m benchmarks.bench_operate
    .venv/bin/python -m benchmarks.bench_operate --postgres ""   # SQLite only

A driver looks for a ``RunCancelled`` another process appended before each
model call, each batch of tool calls and each step attempt it continues (a new
attempt's ``StepStarted`` append does it for free: it loses the version check
to a foreign append). The look is :meth:`~little_es.durability.RunRecorder.refresh`
with nothing appended: one indexed query for a row past the driver's version.
Printed: its median per check over ``--repeats`` batches of ``--checks``, and
the budget's one-time cost at a driver's start, :func:`~little_es.run_tree_totals`
of a run with ``--sub-runs`` sub-runs.

PostgreSQL runs in a fresh schema of ``--postgres`` (default
``postgresql://postgres@127.0.0.1:5432/test``), dropped afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from benchmarks.figures import Figures, add_json_option, reporting
from little_es import Workflow, local_world, postgres_world, run_tree_totals, run_workflow, task
from little_es.durability import RunRecorder
from little_es.world import World

_LEAF = Workflow("leaf", steps=[task("a", lambda ctx: 1)])


def _tree(world: World, sub_runs: int) -> str:
    from little_es.workflow.authoring import subworkflow

    root = Workflow(
        "root",
        steps=[subworkflow(f"s{i}", _LEAF) for i in range(sub_runs)] or [task("a", lambda c: 1)],
    )
    asyncio.run(run_workflow(world, root, {}, run_id="bench_root"))
    return "bench_root"


def _measure(
    world: World, label: str, checks: int, repeats: int, sub_runs: int, figures: Figures
) -> None:
    run_id = _tree(world, sub_runs)
    recorder = RunRecorder.load(world, run_id)
    assert recorder is not None
    batches = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(checks):
            recorder.refresh()
        batches.append((time.perf_counter() - start) / checks)
    totals = []
    for _ in range(repeats):
        start = time.perf_counter()
        run_tree_totals(world, run_id)
        totals.append(time.perf_counter() - start)
    check_us = statistics.median(batches) * 1e6
    totals_ms = statistics.median(totals) * 1e3
    print(
        f"{label:10} cancel check {check_us:7.1f} µs"
        f" · run_tree_totals of a run with {sub_runs} sub-runs {totals_ms:7.1f} ms"
    )
    figures.add(f"{label}: cancel check before a call (median)", check_us, "µs")
    figures.add(f"{label}: run_tree_totals of a run with {sub_runs} sub-runs", totals_ms, "ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--checks", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--sub-runs", type=int, default=100)
    parser.add_argument("--postgres", default="postgresql://postgres@127.0.0.1:5432/test")
    add_json_option(parser)
    args = parser.parse_args()
    with reporting("bench_operate", args.json) as figures:
        _main(args, figures)


def _main(args: argparse.Namespace, figures: Figures) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="bench_operate_"))
    try:
        with local_world(tmp / "world") as world:
            _measure(world, "SQLite", args.checks, args.repeats, args.sub_runs, figures)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if not args.postgres:
        return
    import psycopg

    schema = f"bench_operate_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(args.postgres, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    try:
        with postgres_world(args.postgres, schema=schema) as world:
            _measure(world, "PostgreSQL", args.checks, args.repeats, args.sub_runs, figures)
    finally:
        with psycopg.connect(args.postgres, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


if __name__ == "__main__":
    main()

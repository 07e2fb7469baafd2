"""What snapshots cost and buy: load time and write overhead per snapshotting interval.

A world snapshots an aggregate when it reaches ``interval`` events, then 4, 16...
times as many (``little_es.world.RUN_SNAPSHOT_INTERVAL``). For each
backend, stream length N (``--events``) and interval (``--intervals``;
``none`` = snapshotting off), in a fresh world:

* writes a ``HarnessSession`` of N events (the realistic harness mix of
  ``bench_storage.py``) and a ``Run`` of N events (task steps, started and
  completed), ``--batch`` events per save (1 = the write-ahead path);
* reports the total write time, the part of it spent taking snapshots (timed
  inside ``World._snapshot``), the number and size of snapshots,
  and the median time of ``World.load_session`` / ``World.load_run``.

It ends with a recommendation per aggregate: the interval with the best load
time whose write overhead stays within ``--max-overhead`` of the time without
snapshots, or ``none`` when no interval makes loading at least 1.5x faster.

    .venv/bin/python benchmarks/bench_snapshots.py [--events 1000,5000,20000]
        [--intervals 200,1000,none] [--backends sqlite] [--batch 1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_storage import (
    DEFAULT_DSN,
    Backend,
    PostgresBackend,
    SqliteBackend,
    add_turn,
    open_session,
)

from benchmarks.figures import Figures, add_json_option, reporting
from little_es import (
    HarnessSession,
    Run,
    RunStarted,
    StepCompleted,
    StepStarted,
    World,
)
from little_es.ids import run_stream_id
from little_es.pricing import price_usage_exact
from little_es.world import RUN_SNAPSHOT_INTERVAL, LittleApplication

RUN_ID = "run_bench_snapshots"


def _set_interval(interval: int | None) -> None:
    intervals = LittleApplication.snapshotting_intervals
    intervals.clear()
    if interval is not None:
        intervals[Run] = interval
        intervals[HarnessSession] = interval


def _timed_snapshots(world: World) -> list[float]:
    """Accumulate the seconds spent in each snapshot the world takes (and stores)."""
    spent: list[float] = []
    real = world._snapshot

    def snapshot(*args: Any, **kwargs: Any) -> None:
        start = time.perf_counter()
        real(*args, **kwargs)
        spent.append(time.perf_counter() - start)

    world._snapshot = snapshot  # type: ignore[method-assign]
    return spent


def _write_session(world: World, events: int, batch: int) -> HarnessSession:
    session = open_session(RUN_ID, "agent")
    world.save(session)
    written = 1

    def each() -> None:
        nonlocal written
        if len(session.pending_events) >= batch:
            written += len(session.pending_events)
            world.save(session)

    turn = 1
    while written + len(session.pending_events) < events:
        add_turn(session, turn, each)
        turn += 1
    world.save(session)
    return session


def _write_run(world: World, events: int, batch: int) -> Run:
    run = Run(RUN_ID, price_usage_exact)
    run.trigger(RunStarted, run_id=RUN_ID, workflow_id="bench", workflow_version="1", ir_hash="0")
    world.save(run)
    count = 1
    step = 0
    while count < events:
        path = f"step_{step}"
        run.trigger(StepStarted, step_path=path, step_id=path, kind="task", visit=1, attempt=1)
        run.trigger(
            StepCompleted,
            step_path=path,
            step_id=path,
            visit=1,
            attempt=1,
            output={"step": step, "summary": "invoice lines reconciled " * 6},
        )
        count += 2
        step += 1
        if len(run.pending_events) >= batch:
            world.save(run)
    world.save(run)
    return run


def _median_time(fn: Callable[[], object], repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def measure(
    make_backend: Callable[[], Backend],
    aggregate: str,
    events: int,
    interval: int | None,
    batch: int,
    loads: int,
) -> dict[str, Any]:
    """One configuration in a fresh world; the figures."""
    backend = make_backend()
    _set_interval(interval)
    try:
        with backend.open() as world:
            spent = _timed_snapshots(world)
            start = time.perf_counter()
            if aggregate == "HarnessSession":
                session = _write_session(world, events, batch)
                stream_id = session.id

                def load() -> object:
                    return world.load_session(stream_id)
            else:
                _write_run(world, events, batch)
                stream_id = run_stream_id(RUN_ID)

                def load() -> object:
                    return world.load_run(RUN_ID)

            write_s = time.perf_counter() - start
            written = len(world.select_stored(stream_id))
            snaps = (
                world.app.snapshots.recorder.select_events(stream_id, desc=True, limit=1)
                if world.app.snapshots is not None
                else []
            )
            load_s = _median_time(load, loads)
    finally:
        backend.cleanup()
    return {
        "events": written,
        "write_s": write_s,
        "snapshot_s": sum(spent),
        "snapshots": len(spent),
        "last_snapshot_kb": len(snaps[0].state) / 1024 if snaps else 0.0,
        "load_ms": load_s * 1000,
    }


def _label(interval: int | None) -> str:
    return "none" if interval is None else str(interval)


def _recommend(
    rows: dict[int | None, dict[str, Any]], max_overhead: float
) -> tuple[int | None, str]:
    base = rows[None]
    best: int | None = None
    for interval, row in rows.items():
        if interval is None:
            continue
        overhead = row["snapshot_s"] / base["write_s"]
        if overhead <= max_overhead and (best is None or row["load_ms"] < rows[best]["load_ms"]):
            best = interval
    if best is None:
        return None, f"every interval costs more than {max_overhead:.0%} extra write time"
    speedup = base["load_ms"] / rows[best]["load_ms"]
    if speedup < 1.5:
        return None, f"the best interval ({best}) loads only {speedup:.1f}x faster"
    overhead = rows[best]["snapshot_s"] / base["write_s"]
    return best, f"loads {speedup:.1f}x faster for {overhead:.1%} extra write time"


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, run every configuration, print tables and a recommendation."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--events", default="1000,5000,20000", help="stream lengths, comma-separated"
    )
    parser.add_argument("--intervals", default="200,1000,none", help="comma-separated")
    parser.add_argument("--backends", default="sqlite", help="sqlite and/or postgres")
    parser.add_argument("--batch", type=int, default=1, help="events per save (1 = write-ahead)")
    parser.add_argument("--loads", type=int, default=5, help="loads per figure (median kept)")
    parser.add_argument("--max-overhead", type=float, default=0.10, help="e.g. 0.10 = 10%%")
    parser.add_argument("--dsn", default=os.environ.get("LITTLE_ES_TEST_POSTGRES_DSN", DEFAULT_DSN))
    add_json_option(parser)
    args = parser.parse_args(argv)
    try:
        lengths = [int(n) for n in args.events.split(",")]
        intervals = [None if i.strip() == "none" else int(i) for i in args.intervals.split(",")]
    except ValueError:
        parser.error("--events and --intervals take comma-separated integers (and 'none')")
    if None not in intervals:
        intervals.append(None)
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    if set(backends) - {"sqlite", "postgres"} or args.batch < 1 or min(lengths) < 10:
        parser.error("backends: sqlite,postgres; --batch >= 1; --events >= 10")

    saved = dict(LittleApplication.snapshotting_intervals)
    with reporting("bench_snapshots", args.json) as figures:
        try:
            _measure(args, backends, lengths, intervals, figures)
        finally:
            LittleApplication.snapshotting_intervals.clear()
            LittleApplication.snapshotting_intervals.update(saved)
    return 0


def _measure(
    args: argparse.Namespace,
    backends: list[str],
    lengths: list[int],
    intervals: list[int | None],
    figures: Figures,
) -> None:
    for name in backends:

        def make(name: str = name) -> Backend:
            return SqliteBackend() if name == "sqlite" else PostgresBackend(args.dsn)

        for aggregate in ("HarnessSession", "Run"):
            for n in lengths:
                rows = {
                    iv: measure(make, aggregate, n, iv, args.batch, args.loads) for iv in intervals
                }
                _print(name, aggregate, n, args.batch, rows, args.max_overhead)
                _figures(figures, name, aggregate, rows)


def _figures(
    figures: Figures, backend: str, aggregate: str, rows: dict[int | None, dict[str, Any]]
) -> None:
    """A ``Run``'s load and write time at the interval worlds use, against no snapshots."""
    if aggregate != "Run" or RUN_SNAPSHOT_INTERVAL not in rows:
        return
    base, r = rows[None], rows[RUN_SNAPSHOT_INTERVAL]
    where = (
        f"Run of {base['events']:,} events (task steps), {backend}, snapshots at"
        f" {RUN_SNAPSHOT_INTERVAL}, {2 * RUN_SNAPSHOT_INTERVAL}, ... events ({r['snapshots']})"
    )
    figures.add(
        f"{where}: load", r["load_ms"], "ms", baseline=base["load_ms"], baseline_what="no snapshots"
    )
    figures.add(
        f"{where}: write", r["write_s"], "s", baseline=base["write_s"], baseline_what="no snapshots"
    )


def _print(
    backend: str,
    aggregate: str,
    n: int,
    batch: int,
    rows: dict[int | None, dict[str, Any]],
    max_overhead: float,
) -> None:
    events = rows[None]["events"]
    print(f"\n{aggregate}, {events:,} events, {backend}, {batch} event(s) per save")
    head = (
        f"{'interval':>8} | {'write s':>8} | {'in snapshots s':>14} | {'overhead':>8} |"
        f" {'snapshots':>9} | {'last snap KB':>12} | {'load ms':>8} | {'load speedup':>12}"
    )
    print(head)
    print("-" * len(head))
    base = rows[None]
    for interval, r in rows.items():
        print(
            f"{_label(interval):>8} | {r['write_s']:8.2f} | {r['snapshot_s']:14.2f} |"
            f" {r['snapshot_s'] / base['write_s']:8.1%} | {r['snapshots']:9d} |"
            f" {r['last_snapshot_kb']:12.1f} | {r['load_ms']:8.2f} |"
            f" {base['load_ms'] / r['load_ms']:11.1f}x"
        )
    best, why = _recommend(rows, max_overhead)
    print(f"recommended {aggregate} interval at this length: {_label(best)} ({why})")


if __name__ == "__main__":
    raise SystemExit(main())

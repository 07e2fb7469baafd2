"""How a long run's cost grows: resume time, bytes on disk and memory at 1k / 10k (/ 100k) steps.

The workload is N sequential trivial sync task steps, each returning
``{"i": i, "payload": "x" * 100}``, on a SQLite world (``synchronous=normal`` to
build quickly; neither the resume nor the bytes nor the memory depend on it).

* resume: a run of N steps stopped right after its ``done``-th ``StepCompleted``
  (an observer raises, as a kill would leave it), resumed by ``run_workflow`` on a
  fresh copy of the world: the time until the first new step runs (load, checks,
  skipping the recorded steps) and the time to finish;
* bytes per step: everything in the data dir after a finished run (the SQLite file
  and its WAL, snapshots and indexes included), over N, and the snapshot rows' part;
* memory, each size in a fresh subprocess under ``tracemalloc``: the workflow
  definition, the finished ``RunResult``, what stays after the result is dropped,
  and a ``replay_run`` result beside the stored bytes of the outputs it holds;
  and, in another fresh subprocess without tracemalloc, the peak RSS of defining,
  running and holding the result.

    .venv/bin/python benchmarks/bench_memory.py [--sizes 1000,10000] [--big] [--json]

``--big`` adds 100,000 steps (several minutes).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import resource
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.figures import Figures, add_json_option, reporting
from little_es import Event, StepCompleted, StepContext, Workflow, local_world, run_workflow, task

RUN_ID = "run_bench_memory"


def _step(ctx: StepContext) -> dict[str, Any]:
    return {"i": ctx.visit, "payload": "x" * 100}


def workflow(n: int) -> Workflow:
    """N sequential trivial sync task steps."""
    return Workflow(f"bench-memory-{n}", steps=[task(f"s{i}", _step) for i in range(n)])


class _Stop(BaseException):
    """Stops the building run right after a chosen StepCompleted, as a kill would."""


def build(data_dir: Path, wf: Workflow, done: int | None) -> None:
    """Run ``wf`` in ``data_dir``: to its end, or stopped after ``done`` committed steps."""
    last = f"s{done - 1}" if done is not None else None

    def stop(event: Event) -> None:
        if isinstance(event, StepCompleted) and event.step_path == last:
            raise _Stop

    with local_world(data_dir, synchronous="normal") as world:
        try:
            asyncio.run(run_workflow(world, wf, {}, run_id=RUN_ID, observer=stop))
        except _Stop:
            return
    if done is not None:
        raise AssertionError("the building run was not stopped")


def resume_once(built: Path, scratch: Path, wf: Workflow) -> tuple[float, float]:
    """(seconds until the first new step runs, seconds to finish) of a resume on a fresh copy."""
    shutil.rmtree(scratch, ignore_errors=True)
    shutil.copytree(built, scratch)
    first: list[float] = []

    def observe(event: Event) -> None:
        if not first:
            first.append(time.perf_counter())

    with local_world(scratch, synchronous="normal") as world:
        t0 = time.perf_counter()
        result = asyncio.run(run_workflow(world, wf, run_id=RUN_ID, observer=observe))
        total = time.perf_counter() - t0
    assert result.resumed and result.state.status == "completed"
    return first[0] - t0, total


def dir_bytes(path: Path) -> int:
    """Bytes of every file under ``path``."""
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def snapshot_bytes(data_dir: Path) -> int:
    """Bytes of the stored snapshot rows (topic + state) in the world's SQLite file."""
    db = next(data_dir.rglob("*.sqlite*"), None) or next(data_dir.rglob("*.db"))
    con = sqlite3.connect(db)
    try:
        tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        total = 0
        for table in tables:
            if "snapshot" in table:
                row = con.execute(f"SELECT SUM(LENGTH(state) + LENGTH(topic)) FROM {table}")
                total += row.fetchone()[0] or 0
        return total
    finally:
        con.close()


# ------------------------------------------------------------ memory (subprocess)


def _memory_child(n: int, data_dir: str) -> dict[str, float]:
    from little_es import replay_run

    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    wf = workflow(n)
    gc.collect()
    definition = tracemalloc.get_traced_memory()[0] - base
    world = local_world(data_dir, synchronous="normal")
    gc.collect()
    opened = tracemalloc.get_traced_memory()[0]
    result = asyncio.run(run_workflow(world, wf, {}, run_id=RUN_ID))
    gc.collect()
    with_result = tracemalloc.get_traced_memory()[0] - opened
    del result
    gc.collect()
    retained = tracemalloc.get_traced_memory()[0] - opened
    replay = replay_run(world, RUN_ID)
    gc.collect()
    replayed = tracemalloc.get_traced_memory()[0] - opened - retained
    outputs = sum(
        len(json.dumps(s.output, separators=(",", ":"))) for s in replay.state.steps.values()
    )
    del replay
    gc.collect()
    world.close()
    return {
        "definition": definition,
        "result": with_result,
        "retained": retained,
        "replay": replayed,
        "output_bytes": outputs,
    }


def _peak_rss() -> int:
    """This process's peak resident set size, in bytes."""
    # Linux carries ru_maxrss over an exec: a child of this benchmark would report the
    # parent's peak (hundreds of MB once it has built 100k steps), not its own.
    # VmHWM is the peak of this process's own memory.
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    for line in status.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _rss_child(n: int, data_dir: str) -> dict[str, float]:
    wf = workflow(n)
    with local_world(data_dir, synchronous="normal") as world:
        result = asyncio.run(run_workflow(world, wf, {}, run_id=RUN_ID))
        peak = _peak_rss()
        assert result.state.status == "completed"
    return {"peak_rss": peak}


def _child(kind: str, n: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        out = subprocess.run(
            [sys.executable, __file__, "--child", kind, "--sizes", str(n), "--dir", tmp],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    figures: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    return figures


# --------------------------------------------------------------------------- main


def main() -> None:
    """Measure and print."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--sizes", default="1000,10000", help="comma-separated step counts")
    parser.add_argument("--big", action="store_true", help="add 100,000 steps")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--child", choices=["memory", "rss"], help=argparse.SUPPRESS)
    parser.add_argument("--dir", help=argparse.SUPPRESS)
    add_json_option(parser)
    args = parser.parse_args()
    if args.child:
        n = int(args.sizes)
        fn = _memory_child if args.child == "memory" else _rss_child
        print(json.dumps(fn(n, args.dir)))
        return
    with reporting("bench_memory", args.json) as figures:
        _main(args, figures)


def _main(args: argparse.Namespace, figures: Figures) -> None:
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.big and 100_000 not in sizes:
        sizes.append(100_000)
    for n in sizes:
        wf = workflow(n)
        done = n * 9 // 10
        with tempfile.TemporaryDirectory() as tmp:
            built = Path(tmp) / "built"
            build(built, wf, done)
            runs = [resume_once(built, Path(tmp) / "copy", wf) for _ in range(args.repeat)]
            first = min(r[0] for r in runs)
            total = min(r[1] for r in runs)
            finished = Path(tmp) / "finished"
            build(finished, wf, None)
            size = dir_bytes(finished)
            snaps = snapshot_bytes(finished)
        print(
            f"N={n:,}: resume with {done:,} recorded: first new step after {first * 1000:.1f} ms"
            f" (median {statistics.median(r[0] for r in runs) * 1000:.1f}), finished in"
            f" {total * 1000:.1f} ms; {size / n:,.0f} B/step on disk ({snaps / n:,.0f} of"
            " them snapshots)"
        )
        figures.add(
            f"resume {n:,} steps with {done:,} recorded: until the first new step runs, best",
            first,
            "s",
        )
        figures.add(f"resume {n:,} steps with {done:,} recorded: to the end, best", total, "s")
        figures.add(f"bytes on disk per step, N={n:,} (snapshots included)", size / n, "B")
        figures.add(f"snapshot bytes per step, N={n:,}", snaps / n, "B")

        mem = _child("memory", n)
        rss = _child("rss", n)
        mb = 1024 * 1024
        allowed = 3 * mem["output_bytes"] + 300 * n
        print(
            f"N={n:,}: definition {mem['definition'] / mb:.1f} MB"
            f" ({mem['definition'] / n:,.0f} B/step), RunResult {mem['result'] / mb:.1f} MB"
            f" ({mem['result'] / n:,.0f} B/step), retained after dropping it"
            f" {mem['retained'] / 1024:,.0f} KB, replay_run result {mem['replay'] / mb:.1f} MB"
            f" ({mem['replay'] / n:,.0f} B/step; target {allowed / n:,.0f} B/step ="
            f" 3 x {mem['output_bytes'] / n:,.0f} B of stored output + 300; x"
            f"{mem['replay'] / allowed:.2f}), peak RSS of define+run+result"
            f" {rss['peak_rss'] / mb:.0f} MB"
        )
        figures.add(f"workflow definition of {n:,} steps, per step", mem["definition"] / n, "B")
        figures.add(f"finished RunResult of {n:,} steps, per step", mem["result"] / n, "B")
        figures.add(f"retained after the RunResult of {n:,} steps is dropped", mem["retained"], "B")
        figures.add(
            f"replay_run result of {n:,} steps",
            mem["replay"],
            "B",
            baseline=allowed,
            baseline_what="3x the stored bytes of its outputs + 300 B per step",
        )
        figures.add(f"peak RSS, define + run + hold the result, {n:,} steps", rss["peak_rss"], "B")


if __name__ == "__main__":
    main()

"""What the local durable runtime costs per step, and how fast it resumes a long run.

Two measurements on a SQLite world (best of ``--repeat``):

* per-step overhead: a workflow of ``--steps`` (1,000) trivial task steps run by
  ``run_workflow`` against the same functions called in a plain loop; printed
  for sync step functions (which the runtime runs in a worker thread, and with
  ``run_in_thread=False`` on the event loop) and for async ones, as total time,
  ms/step and the ratio;
* resume: a run of 10,000 steps (a task and a decision looping 5,000 times,
  stopped once the task's last ``StepCompleted`` is committed, with the last
  decision's ``StepStarted`` in the same commit) resumed by ``run_workflow``:
  load (snapshot + later events), the restart checks, the walk over 9,999
  committed steps, the last decision (a trivial function: the only step that
  runs, checked) and the one commit of its ``StepCompleted`` with
  ``RunCompleted``. (The last step's ``StepCompleted`` is committed with
  ``RunCompleted``, so a run cannot be stopped between them.)

Targets: overhead < 1 ms/step; resume of 10,000 steps < 1 s.

``--synchronous normal`` measures worlds opened with
``local_world(..., synchronous="normal")``, to show what the per-commit fsync
costs; the default is ``full``, as ``local_world`` opens a world. The
10,000-step run is always built with ``synchronous="normal"`` (only to build it
faster; it is measured on a copy opened with the chosen mode). ``--profile`` prints the top
cProfile entries of one 1,000-step run and one resume.

    .venv/bin/python benchmarks/bench_runtime.py [--steps 1000] [--repeat 3] \
        [--synchronous full|normal] [--profile]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import pstats
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


from benchmarks.figures import Figures, add_json_option, reporting
from little_es import (
    END,
    Event,
    RunResult,
    StepCompleted,
    StepContext,
    Workflow,
    decision,
    local_world,
    run_workflow,
    task,
)

RESUME_VISITS = 5000
"""Visits of each of the two loop steps: 10,000 completed steps in all."""

RESUME_RUN_ID = "run_bench_resume"
"""The run id of the 10,000-step run."""


def _trivial_sync(ctx: StepContext) -> int:
    return 1


async def _trivial_async(ctx: StepContext) -> int:
    return 1


async def _work(ctx: StepContext) -> int:
    return ctx.visit


async def _loop(ctx: StepContext) -> str:
    return "work" if ctx.visit < RESUME_VISITS else END


RESUME_WORKFLOW: Workflow = Workflow(
    "bench-resume",
    steps=[
        task("work", _work, max_visits=RESUME_VISITS),
        decision("loop", _loop, max_visits=RESUME_VISITS),
    ],
)
"""A task and a decision that loops back to it RESUME_VISITS times."""


def _pragma_synchronous(data_dir: Path, mode: str) -> str:
    with local_world(data_dir, synchronous=mode) as world:  # type: ignore[arg-type]
        datastore: Any = world.app.recorder.datastore  # type: ignore[attr-defined]
        with datastore.transaction(commit=False) as cursor:
            cursor.execute("PRAGMA synchronous")
            value = cursor.fetchone()[0]
    return {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}.get(value, str(value))


# ------------------------------------------------------------- per-step overhead


def plain_loop(fn: Callable[[StepContext], Any], steps: int) -> float:
    """Seconds to call ``fn`` ``steps`` times in a plain loop (awaiting it when async)."""
    ctx = StepContext(run_id="plain", input={}, outputs={}, step_path="s0")

    async def calls() -> float:
        t0 = time.perf_counter()
        if asyncio.iscoroutinefunction(fn):
            for _ in range(steps):
                await fn(ctx)
        else:
            for _ in range(steps):
                fn(ctx)
        return time.perf_counter() - t0

    return asyncio.run(calls())


def runtime_run(
    wf: Workflow, steps: int, mode: str, profiler: cProfile.Profile | None = None
) -> float:
    """Seconds for ``run_workflow`` to run ``wf`` on a fresh SQLite world."""
    with (
        tempfile.TemporaryDirectory() as tmp,
        local_world(tmp, synchronous=mode) as world,  # type: ignore[arg-type]
    ):
        t0 = time.perf_counter()
        if profiler is not None:
            profiler.enable()
        result = asyncio.run(run_workflow(world, wf, {}, run_id="run_bench_steps"))
        if profiler is not None:
            profiler.disable()
        elapsed = time.perf_counter() - t0
    assert result.steps_executed == steps, result.steps_executed
    return elapsed


# ---------------------------------------------------------------------- resume


class _Stop(BaseException):
    """Stops the building run once its last task step is committed, with the last decision in
    flight."""


def build_resume_run(data_dir: Path) -> int:
    """Run RESUME_WORKFLOW until its 9,999th step is committed; return the event count."""
    last = f"work@{RESUME_VISITS}"

    def stop_after_last(event: Event) -> None:
        if isinstance(event, StepCompleted) and event.step_path == last:
            raise _Stop

    with local_world(data_dir, synchronous="normal") as world:
        try:
            asyncio.run(
                run_workflow(
                    world, RESUME_WORKFLOW, {}, run_id=RESUME_RUN_ID, observer=stop_after_last
                )
            )
        except _Stop:
            pass
        else:
            raise AssertionError("the building run was not stopped")
        return len(world.read_run_log(RESUME_RUN_ID))


def resume_once(
    built: Path, scratch: Path, mode: str, profiler: cProfile.Profile | None = None
) -> tuple[float, float]:
    """(seconds to open the world, seconds for run_workflow to resume) on a fresh copy."""
    shutil.rmtree(scratch, ignore_errors=True)
    shutil.copytree(built, scratch)
    t0 = time.perf_counter()
    world = local_world(scratch, synchronous=mode)  # type: ignore[arg-type]
    opened = time.perf_counter() - t0
    try:
        t0 = time.perf_counter()
        if profiler is not None:
            profiler.enable()
        result: RunResult = asyncio.run(run_workflow(world, RESUME_WORKFLOW, run_id=RESUME_RUN_ID))
        if profiler is not None:
            profiler.disable()
        resumed = time.perf_counter() - t0
    finally:
        world.close()
    assert result.resumed and result.steps_executed == 1, result.steps_executed
    assert result.output == RESUME_VISITS
    assert len(result.state.steps) == 2 * RESUME_VISITS
    return opened, resumed


def _verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


def _top(profiler: cProfile.Profile, n: int = 15) -> str:
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(n)
    return out.getvalue()


def main() -> None:
    """Measure and print."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--synchronous", choices=["full", "normal"], default="full")
    parser.add_argument("--profile", action="store_true")
    add_json_option(parser)
    args = parser.parse_args()
    with reporting("bench_runtime", args.json) as figures:
        _main(args, figures)


def _main(args: argparse.Namespace, figures: Figures) -> None:
    mode: str = args.synchronous
    steps: int = args.steps

    with tempfile.TemporaryDirectory() as tmp:
        pragma = _pragma_synchronous(Path(tmp) / "probe", mode)
    print(f"SQLite {sqlite3.sqlite_version}, PRAGMA synchronous={pragma} (--synchronous {mode})")

    for label, fn, in_thread in (
        ("sync", _trivial_sync, True),
        ("sync (run_in_thread=False)", _trivial_sync, False),
        ("async", _trivial_async, True),
    ):
        wf = Workflow(
            f"bench-{label.split()[0]}",
            steps=[task(f"s{i}", fn, run_in_thread=in_thread) for i in range(steps)],
        )
        plain = min(plain_loop(fn, steps) for _ in range(args.repeat))
        runtime = min(runtime_run(wf, steps, mode) for _ in range(args.repeat))
        overhead_ms = (runtime - plain) / steps * 1000
        print(
            f"{steps} trivial {label:5} steps: plain loop {plain * 1000:8.2f} ms,"
            f" run_workflow {runtime * 1000:8.1f} ms, ratio {runtime / plain:8.0f}x,"
            f" overhead {overhead_ms:.3f} ms/step (target < 1 ms: {_verdict(overhead_ms < 1)})"
        )
        figures.add(
            f"run_workflow of {steps:,} trivial {label} task steps, SQLite"
            f" synchronous={mode}, per step",
            runtime / steps * 1000,
            "ms",
            baseline=plain / steps * 1000,
            baseline_what="a plain loop calling the same functions",
        )

    with tempfile.TemporaryDirectory() as tmp:
        built = Path(tmp) / "built"
        t0 = time.perf_counter()
        events = build_resume_run(built)
        print(
            f"built a run of {2 * RESUME_VISITS} steps, the last in flight ({events} events) in"
            f" {time.perf_counter() - t0:.1f}s"
        )
        runs = [resume_once(built, Path(tmp) / "copy", mode) for _ in range(args.repeat)]
        resumes = [r for _, r in runs]
        best, opening_ms = min(resumes), min(o for o, _ in runs) * 1000
        print(
            f"resume of {2 * RESUME_VISITS} steps (the last one runs): best {best:.3f}s, median"
            f" {statistics.median(resumes):.3f}s (opening the world: {opening_ms:.0f} ms more;"
            f" target < 1 s: {_verdict(best < 1)})"
        )
        figures.add(
            f"resume a run of {2 * RESUME_VISITS:,} completed steps (replay, checks,"
            f" scheduling), SQLite synchronous={mode}, best",
            best,
            "s",
        )

        if args.profile:
            profiler = cProfile.Profile()
            wf = Workflow("bench-sync", steps=[task(f"s{i}", _trivial_sync) for i in range(steps)])
            runtime_run(wf, steps, mode, profiler)
            print(f"\n--- profile: {steps} trivial sync steps ---\n{_top(profiler)}")
            profiler = cProfile.Profile()
            resume_once(built, Path(tmp) / "copy", mode, profiler)
            print(f"--- profile: resume of {2 * RESUME_VISITS} steps ---\n{_top(profiler)}")


if __name__ == "__main__":
    main()

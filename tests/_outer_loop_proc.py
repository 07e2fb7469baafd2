"""The outer loop of the outer-loop tests, and the child that drives it.

Run as the target ``tests._outer_loop_proc:main`` of a
:class:`~little_es.testing.CrashRunner`, with ``argv = [world_url, outer_loop_id]``.
It runs (or resumes) the loop and prints ``RESULT {"reason": ...}``.

The planner is a scripted model that looks at the loop context in its prompt:
turn 1 calls the ``look`` tool, turn 2 answers the decision; it runs cycles
with ``{"x": 1}`` and ``{"x": 2}`` and says done in the third. Each cycle's
run is two task steps. Every model call, tool call and step appends one line
to the ledger ``$OUTER_LOOP_LEDGER`` (one ``O_APPEND`` write, in the file
before the process can be killed), so the tests count real executions.

``$OUTER_LOOP_PROMPT`` picks the planner (``v1``, the default; ``v2``, another
prompt; ``tools``, one more tool: the drift tests change it between a kill and
a resume);
``$OUTER_LOOP_KILL_IN_CYCLE=N`` makes the ``work`` step of the cycle whose
input is ``{"x": N}`` SIGKILL its process the first time it runs.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path
from typing import Any

from little_es import (
    ModelRequest,
    ModelResponse,
    ScriptedModel,
    StepContext,
    ToolCall,
    Usage,
    Workflow,
    task,
    tool,
)
from little_es.outer_loop import Planner, run_outer_loop
from little_es.world import open_world

PROMPTS = {"v1": "Improve the score; stop when it is good.", "v2": "Raise the score, then stop."}


def ledger(line: str) -> None:
    path = os.environ.get("OUTER_LOOP_LEDGER")
    if not path:
        return
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


@tool
def look(cycle: int) -> str:
    """Look at how the loop is going before deciding."""
    ledger(f"tool look {cycle}")
    return f"cycle {cycle}: looks fine"


def _context_of(request: ModelRequest) -> dict[str, Any]:
    text = next(m.content for m in request.messages if m.role == "user")
    loaded: dict[str, Any] = json.loads(str(text).split("(JSON):\n", 1)[1])
    return loaded


def plan(request: ModelRequest) -> ModelResponse:
    context = _context_of(request)
    cycle = context["cycle"]
    turn = sum(1 for m in request.messages if m.role == "assistant") + 1
    ledger(f"model {context['outer_loop_id']} {cycle} {turn}")
    usage = Usage(input_tokens=1000, output_tokens=100)
    if turn == 1:
        call = ToolCall(id=f"look-{cycle}", name="look", arguments={"cycle": cycle})
        return ModelResponse(
            tool_calls=(call,), usage=usage, provider="scripted", model="planner-1"
        )
    completed = [c for c in context["cycles"] if c["status"] == "completed"]
    if len(completed) >= 2:
        body: dict[str, Any] = {"done": True, "reason": "the score is good"}
    else:
        x = len(completed) + 1
        body = {"done": False, "input": {"x": x}, "reason": f"try x={x}"}
    return ModelResponse(
        content=json.dumps(body), usage=usage, provider="scripted", model="planner-1"
    )


def work(ctx: StepContext) -> dict[str, Any]:
    ledger(f"step {ctx.run_id} work")
    kill_in = os.environ.get("OUTER_LOOP_KILL_IN_CYCLE")
    marker = Path(os.environ.get("OUTER_LOOP_LEDGER", "") + f".killed-{ctx.run_id}")
    if kill_in == str(ctx.input["x"]) and not marker.exists():
        marker.touch()
        os.kill(os.getpid(), signal.SIGKILL)
    return {"x": ctx.input["x"]}


def score(ctx: StepContext) -> dict[str, Any]:
    ledger(f"step {ctx.run_id} score")
    return {"score": ctx.outputs["work"]["x"] * 10}


improve = Workflow("improve", steps=[task("work", work), task("score", score)])


@tool
def peek(cycle: int) -> str:
    """Peek at one cycle's logs (given to the planner by the ``tools`` variant only)."""
    ledger(f"tool peek {cycle}")
    return "nothing unusual"


def make_planner(variant: str | None = None) -> Planner:
    """The planner; ``variant`` ``v2`` has another prompt, ``tools`` one more tool."""
    variant = variant or os.environ.get("OUTER_LOOP_PROMPT", "v1")
    return Planner(
        model=ScriptedModel(respond=plan, model_id="planner-1"),
        prompt=PROMPTS["v1" if variant == "tools" else variant],
        tools=[look, peek] if variant == "tools" else [look],
        system="You plan improvement cycles.",
    )


async def drive(url: str, outer_loop_id: str) -> str:
    world = open_world(url)
    try:
        result = await run_outer_loop(
            world,
            planner=make_planner(),
            workflow=improve,
            outer_loop_id=outer_loop_id,
            max_cycles=5,
            input={"goal": "score"},
        )
    finally:
        world.close()
    return result.reason


def main(argv: list[str]) -> int:
    url, outer_loop_id = argv
    reason = asyncio.run(drive(url, outer_loop_id))
    print("RESULT " + json.dumps({"reason": reason}), flush=True)
    return 0

"""An outer loop killed mid-cycle for real, resumed, then reported.

    python examples/outer_loop.py

1. A child process runs the outer loop ``tune``: each cycle a planner agent
   looks at the earlier cycles' outcomes and chooses the next cycle's input
   (a learning rate to try), then a run of the ``train`` workflow tries it.
   The child is killed with SIGKILL in the middle of cycle 2's run, right
   after its ``train`` step started.
2. This process resumes the loop with the same id. Cycle 1 is not run again
   and its planner is not asked again; cycle 2's run resumes through ordinary
   run resume (only the step in flight runs again); cycle 3's planner sees
   both outcomes and ends the loop.
3. It prints which calls really ran, and ``little report --loop``.

No network: the planner is a ScriptedModel with a price registered for it.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from little_es import (
    ModelRequest,
    ModelResponse,
    Planner,
    ScriptedModel,
    StepContext,
    Usage,
    Workflow,
    local_world,
    run_outer_loop,
    task,
)
from little_es.render import render_loop_report

LOOP_ID = "tune_lr"


def _ledger(line: str) -> None:
    # One line per real execution, flushed at once so a SIGKILL cannot lose it.
    with Path(os.environ["TUNE_LEDGER"]).open("a") as f:
        f.write(line + "\n")


def plan(request: ModelRequest) -> ModelResponse:
    prompt = next(m.content for m in request.messages if m.role == "user")
    context = json.loads(str(prompt).split("(JSON):\n", 1)[1])
    _ledger(f"planner of cycle {context['cycle']}")
    tried = [c["output"] for c in context["cycles"] if c["status"] == "completed"]
    if len(tried) >= 2:
        best = max(tried, key=lambda o: o["accuracy"])
        body: dict[str, Any] = {"done": True, "reason": f"best lr is {best['lr']}"}
    else:
        lr = [0.1, 0.03][len(tried)]
        body = {"done": False, "input": {"lr": lr}, "reason": f"try lr={lr}"}
    return ModelResponse(
        content=json.dumps(body),
        usage=Usage(input_tokens=900, output_tokens=60),
        provider="scripted",
        model="planner-1",
    )


def train(ctx: StepContext) -> dict[str, Any]:
    _ledger(f"train lr={ctx.input['lr']}")
    if os.environ.get("TUNE_KILL") == str(ctx.input["lr"]):
        time.sleep(30)  # the parent kills this process here, mid-step
    return {"lr": ctx.input["lr"], "loss": round(1 - ctx.input["lr"] * 5, 3)}


def evaluate(ctx: StepContext) -> dict[str, Any]:
    _ledger(f"evaluate lr={ctx.input['lr']}")
    return {"lr": ctx.input["lr"], "accuracy": round(0.9 - abs(ctx.input["lr"] - 0.03), 3)}


training = Workflow("train", steps=[task("train", train), task("evaluate", evaluate)])
planner = Planner(
    model=ScriptedModel(respond=plan, model_id="planner-1"),
    prompt="Find the learning rate with the best accuracy in few tries.",
)


async def _loop(world_dir: str) -> str:
    with local_world(world_dir) as world:
        result = await run_outer_loop(
            world,
            planner=planner,
            workflow=training,
            outer_loop_id=LOOP_ID,
            max_cycles=5,
            input={"model": "tiny"},
        )
    return result.reason


def main() -> None:
    console = Console(width=110)
    world_dir = tempfile.mkdtemp(prefix="little-es-loop-")
    ledger = Path(world_dir) / "ledger.txt"
    os.environ["TUNE_LEDGER"] = str(ledger)
    with local_world(world_dir) as world:
        world.set_model_price("scripted", "planner-1", input_per_mtok=3.0, output_per_mtok=15.0)

    console.print(f"[bold]1.[/] running outer loop [cyan]{LOOP_ID}[/] in a child ({world_dir})")
    child = subprocess.Popen(
        [sys.executable, __file__, "--child", world_dir], env={**os.environ, "TUNE_KILL": "0.03"}
    )
    while "train lr=0.03" not in (ledger.read_text() if ledger.exists() else ""):
        if child.poll() is not None:
            raise SystemExit(f"the child exited early with {child.returncode}")
        time.sleep(0.05)
    child.kill()  # SIGKILL, mid-cycle 2: its train step started and did not finish
    child.wait()
    console.print(f"   child exited with {child.returncode} (SIGKILL mid-cycle 2)")
    before = ledger.read_text().splitlines()

    console.print(f"[bold]2.[/] resuming {LOOP_ID} in this process")
    reason = asyncio.run(_loop(world_dir))
    after = ledger.read_text().splitlines()[len(before) :]
    console.print(f"   the loop ended: {reason}")
    console.print("   what really ran [dim](before the kill | after the resume)[/]:")
    counts_before, counts_after = collections.Counter(before), collections.Counter(after)
    for line in dict.fromkeys(before + after):
        console.print(
            f"     {escape(f'{line:<24}')} {counts_before[line]} | {counts_after[line]}",
            highlight=False,
        )

    console.print(f"[bold]3.[/] little report --loop {LOOP_ID}")
    with local_world(world_dir) as world:
        render_loop_report(world, LOOP_ID, console)
    console.print(
        f"\nInspect it yourself: little report --loop {LOOP_ID} --world sqlite:///{world_dir}"
        f"\nThe manifest view: {world_dir}/outer-loops/{LOOP_ID}.json"
    )


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        asyncio.run(_loop(sys.argv[2]))
    else:
        main()

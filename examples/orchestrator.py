"""An orchestrator fans out to 50 sub-runs, is killed mid-way for real, and is resumed.

    python examples/orchestrator.py

1. A child process runs the ``review_repo`` workflow: its ``dispatch`` agent step is
   a scripted orchestrator whose first turn calls ``start_workflow`` 50 times (one
   ``review_file`` sub-run per file, at most 8 at once). Each sub-run is a run of its
   own: ``read`` (a task), ``review`` (an agent with its own model calls), ``score``.
   The child is killed with SIGKILL (the fault-injection switch) right after the
   orchestrator committed the 30th call's result, while other sub-runs are mid-way.
2. This process resumes the run with the same run id. The 30 completed calls are
   answered from the orchestrator's log; the 20 in flight are dispatched again with
   the sub-run ids reserved before the crash, and each of those sub-runs resumes
   from its own log (steps committed before the kill do not run again).
3. It prints what really ran (from a ledger every step and model call appends to)
   and the run tree with each sub-run's status and cost (``little report --tree``).

No network: the models are ScriptedModels with prices registered for them.
"""

# No `from __future__ import annotations` needed: no tool is defined here.
import asyncio
import collections
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from rich.console import Console

from little_es import (
    ModelRequest,
    ScriptedModel,
    ScriptedReply,
    StepContext,
    ToolCall,
    Usage,
    Workflow,
    World,
    agent,
    configure_logging,
    list_sub_runs,
    local_world,
    run_workflow,
    start_workflow_tool,
    task,
)
from little_es.render import render_report, render_tree

RUN_ID = "run_review_repo"
FILES = [f"src/module_{i:02d}.py" for i in range(1, 51)]
CRASH_AFTER = "harness.tool_call.succeeded:call_id=c30"


def _ledger(line: str) -> None:
    # One line per real execution, written at once so a SIGKILL cannot lose it.
    with Path(os.environ["ORCHESTRATOR_LEDGER"]).open("a") as f:
        f.write(line + "\n")


async def read(ctx: StepContext) -> dict[str, Any]:
    _ledger(f"{ctx.run_id} read")
    await asyncio.sleep(0.005)  # I/O: lets the 8 concurrent sub-runs interleave
    return {"path": ctx.input["path"], "lines": 40 + len(ctx.input["path"]) * 3}


def _reviewer(request: ModelRequest) -> ScriptedReply:
    prompt = request.messages[-1].content or ""
    return ScriptedReply(
        content=f"LGTM with {len(prompt) % 4} nits",
        usage=Usage(input_tokens=900 + len(prompt), output_tokens=60),
    )


async def score(ctx: StepContext) -> dict[str, Any]:
    _ledger(f"{ctx.run_id} score")
    await asyncio.sleep(0.005)
    nits = int(str(ctx.outputs["review"]).split()[2])
    return {"path": ctx.input["path"], "score": 10 - nits}


def _review_prompt(ctx: StepContext) -> str:
    _ledger(f"{ctx.run_id} review")  # once per execution of the review step
    return f"Review {ctx.outputs['read']['path']} ({ctx.outputs['read']['lines']} lines)."


review_file = Workflow(
    "review_file",
    version="1",
    steps=[
        task("read", read),
        agent(
            "review",
            model=ScriptedModel(respond=_reviewer, provider="scripted", model_id="reviewer-1"),
            prompt=_review_prompt,
        ),
        task("score", score),
    ],
)


def _dispatcher(request: ModelRequest) -> ScriptedReply:
    turn = 1 + sum(1 for m in request.messages if m.role == "assistant")
    _ledger(f"orchestrator model turn {turn}")
    if turn == 1:
        calls = tuple(
            ToolCall(
                id=f"c{i}",
                name="start_workflow",
                arguments={"workflow_id": "review_file", "input": {"path": path}},
            )
            for i, path in enumerate(FILES, start=1)
        )
        return ScriptedReply(tool_calls=calls, usage=Usage(input_tokens=2500, output_tokens=1800))
    done = sum(
        1 for m in request.messages if m.role == "tool" and '"completed"' in (m.content or "")
    )
    return ScriptedReply(
        content=f"Reviewed {done} of {len(FILES)} files.",
        usage=Usage(input_tokens=9000, output_tokens=40),
    )


review_repo = Workflow(
    "review_repo",
    version="1",
    steps=[
        agent(
            "dispatch",
            model=ScriptedModel(respond=_dispatcher, provider="scripted", model_id="planner-1"),
            tools=[start_workflow_tool([review_file], max_concurrency=8)],
            system="You split a repository review into one sub-run per file.",
            prompt="Review every file of the repository.",
            max_turns=3,
        )
    ],
)


def _record_prices(world: World) -> None:
    """Scripted models have no list price: record them in the world, so every report has dollars."""
    world.set_model_price("scripted", "planner-1", input_per_mtok=3.0, output_per_mtok=15.0)
    world.set_model_price("scripted", "reviewer-1", input_per_mtok=0.15, output_per_mtok=0.6)


def _child(world_dir: str) -> None:
    configure_logging(level="WARNING")
    with local_world(world_dir) as world:
        asyncio.run(run_workflow(world, review_repo, {}, run_id=RUN_ID))


def main() -> None:
    configure_logging(level="WARNING")
    console = Console()
    if not console.is_terminal:
        console = Console(width=160)  # a pipe: wide enough for the report's rows
    world_dir = tempfile.mkdtemp(prefix="little-es-orchestrator-")
    with local_world(world_dir) as world:
        _record_prices(world)
    ledger = Path(world_dir) / "ledger.txt"
    os.environ["ORCHESTRATOR_LEDGER"] = str(ledger)

    console.print(f"[bold]1.[/] running [cyan]{RUN_ID}[/] in a child process ({world_dir})")
    child = subprocess.run(
        [sys.executable, __file__, "--child", world_dir],
        env={**os.environ, "LITTLE_ES_CRASH_AFTER_EVENT": CRASH_AFTER},
        check=False,
    )
    console.print(
        f"   child exited with {child.returncode}"
        + (" (killed by SIGKILL mid fan-out)" if child.returncode == -9 else "")
    )
    before = ledger.read_text().splitlines()
    with local_world(world_dir) as world:
        at_crash = collections.Counter(s.status for s in list_sub_runs(world, RUN_ID))
    console.print(
        f"   at the crash: {len(FILES)} sub-runs reserved; by their own logs"
        f" {at_crash['completed']} completed, {at_crash['running']} mid-way,"
        f" {at_crash['pending']} not started"
    )

    console.print(f"[bold]2.[/] resuming {RUN_ID} in this process")
    with local_world(world_dir) as world:
        result = asyncio.run(run_workflow(world, review_repo, run_id=RUN_ID))
        after = ledger.read_text().splitlines()[len(before) :]
        console.print(f"   resumed={result.resumed}, output={result.output!r}")
        ran_before, ran_after = collections.Counter(before), collections.Counter(after)
        again = sorted(line for line in ran_after if line in ran_before)
        touched = {line.split()[0] for line in after if line.startswith("sub_")}
        console.print(
            f"   before the kill: {sum(ran_before.values())} executions; after the resume:"
            f" {sum(ran_after.values())}, in {len(touched)} sub-runs"
        )
        console.print(
            f"   ran in both processes (in flight at the kill): {len(again)}"
            + (
                f" [dim]({', '.join(again[:3])}{', ...' if len(again) > 3 else ''})[/]"
                if again
                else ""
            )
        )
        turns = [line.rsplit(" ", 1)[1] for line in before + after if line.startswith("orch")]
        console.print(f"   orchestrator model calls, by turn, across both processes: {turns}")

        console.print(f"[bold]3.[/] little report {RUN_ID} --tree")
        render_report(world, RUN_ID, console)
        render_tree(world, RUN_ID, console)
    console.print(f"\nInspect it yourself: little report {RUN_ID} --world sqlite:///{world_dir}")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        _child(sys.argv[2])
    else:
        main()

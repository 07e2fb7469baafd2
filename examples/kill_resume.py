"""The main example: a workflow killed mid-run for real, resumed, then reported.

    python examples/kill_resume.py

1. A child process runs the ``triage`` workflow. It is killed with SIGKILL
   (the fault-injection switch) right after committing the planner agent's
   third model call, before the model answers: a real crash in the middle of
   an agent step.
2. This process resumes the run with the same run id. The completed ``fetch``
   step is skipped, the planner's session fast-forwards through its two
   recorded model calls and their tool calls, and only the in-flight model
   call (turn 3) is made again. Then the rest of the workflow runs.
3. It prints which calls really ran (from a ledger every step, tool and model
   call appends to), and the ``little report`` of the run.

No network: the model is a ScriptedModel with a price registered for it.
"""

from __future__ import annotations

import asyncio
import collections
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from little_es import (
    ModelRequest,
    ModelResponse,
    ScriptedModel,
    StepContext,
    ToolCall,
    Usage,
    Workflow,
    agent,
    decision,
    local_world,
    parallel,
    run_workflow,
    task,
    tool,
)
from little_es.render import render_report

RUN_ID = "run_triage_42"
LEDGER = "ledger.txt"


def _ledger(line: str) -> None:
    # One line per real execution, flushed at once so a SIGKILL cannot lose it.
    with Path(os.environ["TRIAGE_LEDGER"]).open("a") as f:
        f.write(line + "\n")


def fetch_ticket(ctx: StepContext) -> dict[str, Any]:
    _ledger("step fetch")
    return {"ticket": ctx.input["ticket"], "title": "Login fails after password reset"}


@tool
def search_code(query: str) -> list[str]:
    """Search the code base; returns matching file names."""
    _ledger(f"tool search_code({query})")
    return ["auth/reset.py", "auth/session.py", "web/login.py"]


@tool
def read_file(path: str) -> str:
    """Read one file of the code base."""
    _ledger(f"tool read_file({path})")
    return f"# {path}\n...{len(path)} lines..."


def _planner(request: ModelRequest) -> ModelResponse:
    turn = sum(1 for m in request.messages if m.role == "assistant") + 1
    _ledger(f"model turn {turn}")
    usage = Usage(input_tokens=1200 * turn, output_tokens=150, cached_input_tokens=800 * (turn - 1))
    calls: tuple[ToolCall, ...] = ()
    content = None
    if turn == 1:
        calls = (ToolCall(id="c1", name="search_code", arguments={"query": "password reset"}),)
    elif turn == 2:
        calls = (
            ToolCall(id="c2", name="read_file", arguments={"path": "auth/reset.py"}),
            ToolCall(id="c3", name="read_file", arguments={"path": "auth/session.py"}),
        )
    elif turn == 3:
        calls = (ToolCall(id="c4", name="read_file", arguments={"path": "web/login.py"}),)
    else:
        content = "Invalidate the old session in auth/reset.py; re-check login in web/login.py."
    return ModelResponse(
        content=content, tool_calls=calls, usage=usage, provider="scripted", model="planner-1"
    )


def lint_file(ctx: StepContext) -> dict[str, Any]:
    _ledger(f"step {ctx.step_path}")
    return {"file": ctx.branch_value, "warnings": len(str(ctx.branch_value)) % 3}


def write_patch(ctx: StepContext) -> str:
    _ledger(f"step {ctx.step_path}")
    return f"patch v{ctx.visit}"


def review(ctx: StepContext) -> str:
    _ledger(f"step {ctx.step_path}")
    return "draft" if ctx.visit < 2 else "publish"


def publish(ctx: StepContext) -> dict[str, Any]:
    _ledger("step publish")
    return {"published": ctx.outputs["draft"], "ticket": ctx.input["ticket"]}


planner = ScriptedModel(respond=_planner, provider="scripted", model_id="planner-1")

triage = Workflow(
    "triage",
    version="1",
    steps=[
        task("fetch", fetch_ticket),
        agent(
            "plan",
            model=planner,
            tools=[search_code, read_file],
            system="You are a careful senior engineer.",
            prompt=lambda ctx: f"Plan a fix for: {ctx.outputs['fetch']['title']}",
        ),
        parallel(
            "check",
            branches=lambda ctx: {
                "reset": "auth/reset.py",
                "session": "auth/session.py",
                "login": "web/login.py",
            },
            step=task("lint", lint_file),
        ),
        task("draft", write_patch, max_visits=3),
        decision("review", review, max_visits=3),
        task("publish", publish),
    ],
)


def _child(world_dir: str) -> None:
    asyncio.run(run_workflow(local_world(world_dir), triage, {"ticket": 42}, run_id=RUN_ID))


def main() -> None:
    console = Console(width=110)
    world_dir = tempfile.mkdtemp(prefix="little-es-example-")
    os.environ["TRIAGE_LEDGER"] = str(Path(world_dir) / LEDGER)
    # A scripted model has no list price: record one in the world, so the report
    # shows dollars, here and in `little report` in another process.
    with local_world(world_dir) as world:
        world.set_model_price("scripted", "planner-1", input_per_mtok=3.0, output_per_mtok=15.0)

    console.print(f"[bold]1.[/] running [cyan]{RUN_ID}[/] in a child process ({world_dir})")
    child = subprocess.run(
        [sys.executable, __file__, "--child", world_dir],
        env={**os.environ, "LITTLE_ES_CRASH_AFTER_EVENT": "harness.model.called:turn=3"},
        check=False,
    )
    console.print(
        f"   child exited with {child.returncode}"
        + (" (killed by SIGKILL mid agent step)" if child.returncode == -9 else "")
    )
    before = Path(os.environ["TRIAGE_LEDGER"]).read_text().splitlines()

    console.print(f"[bold]2.[/] resuming {RUN_ID} in this process")
    with local_world(world_dir) as world:
        result = asyncio.run(run_workflow(world, triage, run_id=RUN_ID))
        after = Path(os.environ["TRIAGE_LEDGER"]).read_text().splitlines()[len(before) :]
        console.print(f"   resumed={result.resumed}, output={result.output}")
        console.print("   what really ran [dim](before the kill | after the resume)[/]:")
        counts_before = collections.Counter(before)
        counts_after = collections.Counter(after)
        for line in dict.fromkeys(before + after):
            console.print(
                f"     {escape(f'{line:<34}')} {counts_before[line]} | {counts_after[line]}",
                highlight=False,
            )

        console.print(f"[bold]3.[/] little report {RUN_ID}")
        render_report(world, RUN_ID, console)
    console.print(f"\nInspect it yourself: little report {RUN_ID} --world sqlite:///{world_dir}")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        _child(sys.argv[2])
    else:
        main()

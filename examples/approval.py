"""An agent that asks a person, exits, and continues after ``little signal``.

    python examples/approval.py

1. A child process runs the ``release`` workflow: ``build``, then the agent ``ship``,
   which asks a person (the ``ask_human`` tool) where to deploy. The run records
   ``RunWaiting`` and the child exits (exit code 3: waiting, not failed).
2. ``little runs --waiting`` shows what the run waits for; ``little signal`` answers.
3. A second child resumes: the agent's session fast-forwards through its recorded call
   and continues with the answer as the tool's result. It calls ``deploy``, a tool
   declared ``requires_approval=True``: the run waits again, for an approval bound to the
   digest of ``deploy`` and its arguments. A signal with another digest is refused.
4. ``little signal ... approval --digest ...`` approves; a third child completes the run.
5. What really ran (a ledger every step, model call and tool call appends to) and
   ``little report``.

No network: the model is a ScriptedModel. Every process exits between the steps; the
log in the SQLite file is all that carries the run from one to the next.
"""

from __future__ import annotations

import asyncio
import collections
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import orjson
from rich.console import Console
from rich.markup import escape

from little_es import (
    ModelRequest,
    ModelResponse,
    RunWaitingError,
    ScriptedModel,
    StepContext,
    ToolCall,
    Usage,
    Workflow,
    agent,
    ask_human,
    local_world,
    run_workflow,
    task,
    tool,
)
from little_es.waits import action_digest

RUN_ID = "run_release_142"
LEDGER = "ledger.txt"
WAITING = 3


def _ledger(line: str) -> None:
    # One line per real execution, flushed at once so nothing is lost when a process exits.
    with Path(os.environ["RELEASE_LEDGER"]).open("a") as f:
        f.write(line + "\n")


def build(ctx: StepContext) -> dict[str, Any]:
    _ledger("step build")
    return {"version": "1.4.2", "artifact": "release-1.4.2.tar.gz"}


@tool(requires_approval=True)
def deploy(env: str, version: str) -> str:
    """Deploy a version to an environment."""
    _ledger(f"tool deploy({env}, {version})")
    return f"{version} is live on {env}"


def _shipper(request: ModelRequest) -> ModelResponse:
    turn = sum(1 for m in request.messages if m.role == "assistant") + 1
    _ledger(f"model turn {turn}")
    calls: tuple[ToolCall, ...] = ()
    content = None
    if turn == 1:
        question = "Build 1.4.2 is ready. Which environment should I deploy it to?"
        calls = (ToolCall(id="ask", name="ask_human", arguments={"question": question}),)
    elif turn == 2:
        answer = next(m.content for m in request.messages if m.name == "ask_human")
        env = orjson.loads(answer or "{}")["answer"]
        calls = (ToolCall(id="go", name="deploy", arguments={"env": env, "version": "1.4.2"}),)
    else:
        content = f"Done: {request.messages[-1].content}."
    return ModelResponse(
        content=content,
        tool_calls=calls,
        usage=Usage(input_tokens=400 * turn, output_tokens=40),
        provider="scripted",
        model="shipper-1",
    )


release = Workflow(
    "release",
    version="1",
    steps=[
        task("build", build),
        agent(
            "ship",
            model=ScriptedModel(respond=_shipper, provider="scripted", model_id="shipper-1"),
            tools=[ask_human(), deploy],
            prompt=lambda ctx: f"Ship {ctx.outputs['build']['artifact']}.",
        ),
    ],
)


def _child(world_dir: str) -> None:
    try:
        result = asyncio.run(run_workflow(local_world(world_dir), release, {}, run_id=RUN_ID))
    except RunWaitingError as exc:
        print(f"   waiting: {exc}")
        sys.exit(WAITING)
    print(f"   completed: {result.output}")


def main() -> None:
    console = Console(width=110)
    world_dir = tempfile.mkdtemp(prefix="little-es-approval-")
    world = f"sqlite:///{world_dir}"
    os.environ["RELEASE_LEDGER"] = str(Path(world_dir) / LEDGER)
    env = {**os.environ, "LITTLE_ES_WORLD": world, "COLUMNS": "110"}
    seen: list[str] = []
    # A scripted model has no list price: record one, so the report shows dollars.
    with local_world(world_dir) as w:
        w.set_model_price("scripted", "shipper-1", input_per_mtok=3.0, output_per_mtok=15.0)

    def drive(label: str) -> None:
        console.print(f"[bold]{label}[/] a child process drives {RUN_ID}")
        sys.stdout.flush()
        child = subprocess.run([sys.executable, __file__, "--child", world_dir], check=False)
        how = {0: "completed", WAITING: "waiting"}.get(child.returncode, "failed")
        lines = Path(os.environ["RELEASE_LEDGER"]).read_text().splitlines()
        console.print(f"   exit code {child.returncode} ({how}); it ran: {lines[len(seen) :]}")
        seen[:] = lines

    def little(*args: str) -> None:
        console.print(f"   [dim]$[/] little {escape(shlex.join(args))}", highlight=False)
        sys.stdout.flush()
        subprocess.run([sys.executable, "-m", "little_es.cli", *args], env=env, check=False)

    drive("1.")
    console.print("[bold]2.[/] a person looks and answers")
    little("runs", "--waiting")
    little("signal", RUN_ID, "human", "--data", '{"answer": "prod"}')
    little("signal", RUN_ID, "human", "--data", '{"answer": "staging"}')  # a double click

    drive("3.")
    digest = action_digest("deploy", {"env": "prod", "version": "1.4.2"})
    little("runs", "--waiting")
    stale = action_digest("deploy", {"env": "staging", "version": "1.4.2"})
    little("signal", RUN_ID, "approval", "--data", '{"approved": true}', "--digest", stale[:16])

    console.print("[bold]4.[/] the approval of what the run asks about")
    little("signal", RUN_ID, "approval", "--data", '{"approved": true}', "--digest", digest[:16])
    drive("   ")

    console.print("[bold]5.[/] what really ran, once each:")
    for line, n in collections.Counter(seen).items():
        console.print(f"     {escape(f'{line:<36}')} {n}", highlight=False)
    little("report", RUN_ID)
    console.print(f"Inspect it yourself: little events {RUN_ID} --world {world}")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        _child(sys.argv[2])
    else:
        main()

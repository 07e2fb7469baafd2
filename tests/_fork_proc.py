"""The workflows of the fork tests, and the child process that runs (or resumes) one of them.

::

    python tests/_fork_proc.py fork-flow --world URL --ledger FILE --run-id ID

It prints ``RESULT {...}`` (exit 0). Every step, model call and tool call first
appends one line to the ledger (one ``O_APPEND`` write, fsynced, in the file
before anything can kill the process), naming the run, so the ledger counts
real executions of each run.
"""

# No `from __future__ import annotations`: the tools' hints must stay real objects.
import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import Any

import orjson

from little_es.engine.local import run_workflow
from little_es.harness.tools import ToolContext, tool
from little_es.orchestrator import start_workflow_tool
from little_es.values import ModelRequest, ModelResponse, ToolCall, Usage
from little_es.workflow.authoring import Workflow, agent, subworkflow, task
from little_es.workflow.context import StepContext
from little_es.world import open_world

TURNS = 5
"""The agent's model calls: four ask for a tool, the fifth answers."""

LEDGER: list[Path] = []


def record(line: str) -> None:
    """Append ``line`` to the ledger in one fsynced write."""
    if not LEDGER:
        return
    fd = os.open(LEDGER[0], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{line}\n".encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def ledger_lines(path: Path) -> list[str]:
    """The ledger's lines (none when nothing ran)."""
    return path.read_text().splitlines() if path.exists() else []


def _step(ctx: StepContext) -> dict[str, Any]:
    record(f"step {ctx.run_id} {ctx.step_path}")
    return {"path": ctx.step_path, "topic": ctx.input.get("topic")}


def _finish(ctx: StepContext) -> dict[str, Any]:
    record(f"step {ctx.run_id} {ctx.step_path}")
    return {"plan": ctx.outputs["plan"], "topic": ctx.input.get("topic"), "style": "v1"}


def _finish_v2(ctx: StepContext) -> dict[str, Any]:
    record(f"step {ctx.run_id} {ctx.step_path}")
    return {"plan": ctx.outputs["plan"], "topic": ctx.input.get("topic"), "style": "v2"}


class LedgerModel:
    """Answers by turn, and writes each real call (with the tool results it saw) to the ledger."""

    provider = "scripted"
    model_id = "scripted-1"

    def __init__(self, answer: str = "done") -> None:
        self.answer = answer

    async def complete(self, request: ModelRequest) -> ModelResponse:
        turn = 1 + sum(1 for m in request.messages if m.role == "assistant")
        record(f"model {turn}")
        usage = Usage(input_tokens=100 * turn, output_tokens=10)
        if turn < TURNS:
            call = ToolCall(id=f"c{turn}", name="look", arguments={"q": f"q{turn}"})
            return ModelResponse(
                tool_calls=(call,), usage=usage, provider=self.provider, model=self.model_id
            )
        return ModelResponse(
            content=self.answer, usage=usage, provider=self.provider, model=self.model_id
        )


@tool
def look(q: str, ctx: ToolContext) -> str:
    """Look something up."""
    record(f"tool {ctx.run_id} {q}")
    return q.upper()


SMALL = Workflow("fork-small", steps=[task("work", _step)])
"""The sub-run: one task step."""

FLOW = Workflow(
    "fork-flow",
    steps=[
        task("fetch", _step),
        subworkflow("sub", SMALL, input=lambda ctx: {"topic": ctx.input.get("topic")}),
        agent("plan", model=LedgerModel(), prompt="plan it", tools=[look]),
        task("finish", _finish),
    ],
)
"""A task, a sub-run, an agent step of five model calls and four tool calls, a task."""

FLOW_V2 = Workflow(
    "fork-flow",
    version="2",
    steps=[
        task("fetch", _step),
        subworkflow("sub", SMALL, input=lambda ctx: {"topic": ctx.input.get("topic")}),
        agent("plan", model=LedgerModel(), prompt="plan it", tools=[look]),
        task("finish", _finish_v2),
        task("publish", _step),
    ],
)
"""FLOW changed after ``plan``: ``finish`` is another function and ``publish`` is new."""

FLOW_PLAN_V2 = Workflow(
    "fork-flow",
    version="3",
    steps=[
        task("fetch", _step),
        subworkflow("sub", SMALL, input=lambda ctx: {"topic": ctx.input.get("topic")}),
        agent("plan", model=LedgerModel("done, differently"), prompt="plan it again", tools=[look]),
        task("finish", _finish),
    ],
)
"""FLOW with the agent step's prompt changed: forkable at ``plan``, not inside it."""

FLOW_BEFORE = Workflow(
    "fork-flow",
    version="4",
    steps=[
        task("fetch", _step),
        task("extra", _step),
        subworkflow("sub", SMALL, input=lambda ctx: {"topic": ctx.input.get("topic")}),
        agent("plan", model=LedgerModel(), prompt="plan it", tools=[look]),
        task("finish", _finish),
    ],
)
"""FLOW with a step inserted before ``sub``: a change before a fork point at ``finish``."""


class OrchestratorModel:
    """Starts one sub-run a turn for turns 1-3, then answers; each real call in the ledger."""

    provider = "scripted"
    model_id = "scripted-1"

    async def complete(self, request: ModelRequest) -> ModelResponse:
        turn = 1 + sum(1 for m in request.messages if m.role == "assistant")
        record(f"model {turn}")
        usage = Usage(input_tokens=50, output_tokens=5)
        if turn <= 3:
            call = ToolCall(
                id=f"s{turn}",
                name="start_workflow",
                arguments={"workflow_id": "fork-small", "input": {"topic": f"t{turn}"}},
            )
            return ModelResponse(
                tool_calls=(call,), usage=usage, provider=self.provider, model=self.model_id
            )
        return ModelResponse(
            content="all started", usage=usage, provider=self.provider, model=self.model_id
        )


ORCH = Workflow(
    "fork-orch",
    steps=[
        task("fetch", _step),
        agent(
            "fan",
            model=OrchestratorModel(),
            prompt="start them",
            tools=[start_workflow_tool([SMALL])],
        ),
        task("done", _step),
    ],
)
"""An orchestrator: each of its first three turns starts a sub-run."""

WORKFLOWS = {w.id: w for w in (FLOW, ORCH)} | {"fork-flow-v2": FLOW_V2}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("workflow")
    parser.add_argument("--world", required=True)
    parser.add_argument("--ledger", required=True)
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--input", default=None)
    parser.add_argument("--workflow-key", default=None, help="a key of WORKFLOWS to run instead")
    args = parser.parse_args(argv)
    LEDGER.append(Path(args.ledger))
    given = orjson.loads(args.input) if args.input else None
    with open_world(args.world) as world:
        result = asyncio.run(
            run_workflow(
                world, WORKFLOWS[args.workflow_key or args.workflow], given, run_id=args.run_id
            )
        )
    print("RESULT " + orjson.dumps({"output": result.output}).decode(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

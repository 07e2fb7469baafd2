"""The workflows of the cancel and budget kill tests, and the child process that drives them.

::

    python tests/_operate_proc.py slow --world URL --ledger FILE --run-id ID --sleep 3
    python tests/_operate_proc.py agent --world URL --ledger FILE --run-id ID --budget-calls 2
    python tests/_operate_proc.py agent ... --budget-calls 10          # resume, larger budget
    python tests/_operate_proc.py slow ... --force-cancelled            # resume a cancelled run

It runs (or resumes) the run and prints one line: ``RESULT {...}`` (exit 0), or
``STOPPED <error type> <message>`` (exit :data:`STOPPED_EXIT_CODE`) when the run
stopped on purpose (cancelled, out of budget). Every step, model call and tool
call first appends one line to the ledger (one ``O_APPEND`` write, in the file
before anything can kill the process), so the ledger counts real executions.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

import orjson

from little_es.engine.local import run_workflow
from little_es.errors import RunStoppedError
from little_es.harness.tools import tool
from little_es.values import Budget, ModelRequest, ModelResponse, ToolCall, Usage
from little_es.workflow.authoring import Workflow, agent, subworkflow, task
from little_es.workflow.context import StepContext
from little_es.world import open_world

STOPPED_EXIT_CODE = 4
TURNS = 5
"""The agent's model calls in a run that completes: four ask for a tool, the fifth answers."""

_ledger: Path | None = None
_sleep_s = 0.0
_until: Path | None = None


def record(line: str) -> None:
    """Append ``pid line`` to the ledger in one write."""
    assert _ledger is not None
    fd = os.open(_ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{os.getpid()} {line}\n".encode())
    finally:
        os.close(fd)


def _step(ctx: StepContext) -> str:
    record(f"step {ctx.step_path}")
    return ctx.step_path


def _slow(ctx: StepContext) -> str:
    record(f"step {ctx.step_path}")
    if _until is not None:
        # Held until the test says so: a loaded machine cannot finish the step early.
        deadline = time.monotonic() + 60
        while not _until.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
    time.sleep(_sleep_s)
    return "slow"


SLOW = Workflow("op-slow", steps=[task("first", _step), task("slow", _slow), task("last", _step)])
"""Three steps; the middle one sleeps ``--sleep`` seconds."""


class LedgerModel:
    """Answers by turn like ScriptedModel, and writes each real call to the ledger."""

    provider = "scripted"
    model_id = "scripted-1"

    async def complete(self, request: ModelRequest) -> ModelResponse:
        turn = 1 + sum(1 for m in request.messages if m.role == "assistant")
        record(f"model {turn}")
        usage = Usage(input_tokens=100, output_tokens=10)
        if turn < TURNS:
            call = ToolCall(id=f"c{turn}", name="look", arguments={"q": f"q{turn}"})
            return ModelResponse(
                tool_calls=(call,), usage=usage, provider=self.provider, model=self.model_id
            )
        return ModelResponse(
            content="done", usage=usage, provider=self.provider, model=self.model_id
        )


@tool
def look(q: str) -> str:
    """Look something up."""
    record(f"tool {q}")
    return q.upper()


def _finish(ctx: StepContext) -> dict[str, Any]:
    record(f"step {ctx.step_path}")
    return {"plan": ctx.outputs["plan"], "topic": ctx.input.get("topic")}


AGENT = Workflow(
    "op-agent",
    steps=[
        task("fetch", _step),
        agent("plan", model=LedgerModel(), prompt="plan it", tools=[look]),
        task("finish", _finish),
    ],
)
"""A task, an agent step of five model calls and four tool calls, a task."""

TREE = Workflow("op-tree", steps=[task("start", _step), subworkflow("sub", AGENT)])
"""The agent workflow as a sub-run: a budget over the run covers it."""

NESTED = Workflow(
    "op-nested", steps=[task("start", _step), subworkflow("inner", SLOW), task("end", _step)]
)
"""The slow workflow as a sub-run: a cancel of the parent stops it too."""

_WORKFLOWS = {"slow": SLOW, "agent": AGENT, "tree": TREE, "nested": NESTED}


def main(argv: list[str]) -> int:
    """Parse ``argv``, drive the run, print its outcome; return the exit code."""
    global _ledger, _sleep_s, _until
    parser = argparse.ArgumentParser()
    parser.add_argument("workflow", choices=sorted(_WORKFLOWS))
    parser.add_argument("--world", required=True)
    parser.add_argument("--ledger", required=True, type=Path)
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--input", default="{}")
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--until", type=Path, help="the slow step waits until this file exists")
    parser.add_argument("--budget-calls", type=int)
    parser.add_argument("--force-cancelled", action="store_true")
    args = parser.parse_args(argv)
    _ledger, _sleep_s, _until = args.ledger, args.sleep, args.until
    budget = None if args.budget_calls is None else Budget(model_calls=args.budget_calls)
    with open_world(args.world) as world:
        try:
            result = asyncio.run(
                run_workflow(
                    world,
                    _WORKFLOWS[args.workflow],
                    orjson.loads(args.input),
                    run_id=args.run_id,
                    budget=budget,
                    resume_cancelled=args.force_cancelled,
                )
            )
        except RunStoppedError as exc:
            print("STOPPED", type(exc).__name__, exc, flush=True)
            return STOPPED_EXIT_CODE
    summary = {"output": result.output, "status": result.state.status, "resumed": result.resumed}
    print("RESULT " + orjson.dumps(summary).decode(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

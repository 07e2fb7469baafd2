"""The workflow of the durable-waits kill test, and the child process that drives it.

::

    python tests/_waits_proc.py --world URL --ledger FILE --run-id ID

It runs (or resumes) the run and prints one line: ``RESULT {...}`` (exit 0),
``WAITING <message>`` (exit :data:`WAITING_EXIT_CODE`) when the run stopped to wait
for a signal, or ``STOPPED <error type> <message>`` (exit 4). Every step, model call
and tool call first appends one line to the ledger (one ``O_APPEND`` write), so the
ledger counts real executions across processes and kills.

The workflow: ``fetch`` (a task), ``plan`` (an agent that asks a person which
environment, looks a key up in the same batch, then answers), ``review`` (a
``wait_for`` step whose data is a :class:`Review`), ``publish`` (a task). The model
classes live in an importable module (this one, imported as ``tests._waits_proc``), so
``little signal`` in another process can validate a signal with them.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import Any

import orjson
from pydantic import BaseModel

from little_es.engine.local import run_workflow
from little_es.errors import RunStoppedError, RunWaitingError
from little_es.harness.model import ScriptedModel
from little_es.harness.tools import ask_human, tool
from little_es.values import ModelRequest, ModelResponse, ToolCall, Usage
from little_es.workflow.authoring import Workflow, agent, task, wait_for
from little_es.workflow.context import StepContext
from little_es.world import open_world

WAITING_EXIT_CODE = 3
STOPPED_EXIT_CODE = 4

_ledger: Path | None = None


class Review(BaseModel):
    """What the reviewer sends to the ``review`` step."""

    approved: bool
    reviewer: str


def record(line: str) -> None:
    """Append ``pid line`` to the ledger in one write."""
    assert _ledger is not None
    fd = os.open(_ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{os.getpid()} {line}\n".encode())
    finally:
        os.close(fd)


def _fetch(ctx: StepContext) -> dict[str, Any]:
    record("step fetch")
    return {"ticket": 7}


def _publish(ctx: StepContext) -> dict[str, Any]:
    record("step publish")
    return {"plan": ctx.outputs["plan"], "review": ctx.outputs["review"]}


@tool
def lookup(key: str) -> str:
    """Look a key up."""
    record(f"tool lookup {key}")
    return f"{key}=42"


def _respond(request: ModelRequest) -> ModelResponse:
    turn = sum(1 for m in request.messages if m.role == "assistant") + 1
    record(f"model {turn}")
    usage = Usage(input_tokens=100 * turn, output_tokens=10)
    calls: tuple[ToolCall, ...] = ()
    content = None
    if turn == 1:
        calls = (
            ToolCall(id="q", name="ask_human", arguments={"question": "deploy to which env?"}),
            ToolCall(id="k", name="lookup", arguments={"key": "build"}),
        )
    else:
        answer = next(m.content for m in request.messages if m.name == "ask_human")
        content = f"deploy to {orjson.loads(answer or 'null')['answer']}"
    return ModelResponse(
        content=content, tool_calls=calls, usage=usage, provider="scripted", model="waits-1"
    )


workflow = Workflow(
    "waits",
    steps=[
        task("fetch", _fetch),
        agent(
            "plan",
            model=ScriptedModel(respond=_respond, provider="scripted", model_id="waits-1"),
            prompt="plan the deploy",
            tools=[ask_human(), lookup],
        ),
        wait_for("review", model=Review, timeout=3600),
        task("publish", _publish),
    ],
)


async def _main(world_url: str, run_id: str) -> int:
    world = open_world(world_url)
    try:
        result = await run_workflow(world, workflow, {}, run_id=run_id)
    except RunWaitingError as exc:
        print(f"WAITING {exc}", flush=True)
        return WAITING_EXIT_CODE
    except RunStoppedError as exc:
        print(f"STOPPED {type(exc).__name__} {exc}", flush=True)
        return STOPPED_EXIT_CODE
    finally:
        world.close()
    print(f"RESULT {orjson.dumps(result.output).decode()}", flush=True)
    return 0


def main() -> None:
    """Parse the arguments and drive the run."""
    global _ledger
    parser = argparse.ArgumentParser()
    parser.add_argument("--world", required=True)
    parser.add_argument("--ledger", required=True)
    parser.add_argument("--run-id", required=True)
    args = parser.parse_args()
    _ledger = Path(args.ledger)
    # The models must be importable by `little signal`: drive the module's own objects.
    import tests._waits_proc as me

    me._ledger = _ledger
    sys.exit(asyncio.run(me._main(args.world, args.run_id)))


if __name__ == "__main__":
    main()

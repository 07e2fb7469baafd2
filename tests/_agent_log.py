"""The workflow of ``tests/fixtures/agent_log.jsonl``: agent sessions in the form log format 3
stored them before a ``harness.model.called`` left out the messages earlier events imply
(every turn's assistant message and tool results stored again).

The fixture was written once, by the code of commit e1c70af, with ``PYTHONPATH=.:tests
python -c 'import _agent_log as a, asyncio, pathlib; asyncio.run(a.write(pathlib.Path("OUT")))'``
and ``little export --world sqlite:///OUT`` (imported as ``_agent_log``, as the tests import
it: the module's name is part of the workflow's IR hash). Never regenerate it with newer
code: it would then test nothing.

Two runs of one agent step (four turns: two tool calls, then a call id the model reuses,
then a failing tool, then the answer; turn 2's response names another model than the
manifest's): ``run_agent_done`` completed; ``run_agent_half`` was stopped inside the
model call of turn 3 (its ``harness.model.called`` committed, no response), as a killed
process leaves it. :data:`CALLS` counts the real model and tool invocations in this
process.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from pathlib import Path

from little_es import Workflow, agent
from little_es.harness.model import ScriptedModel
from little_es.harness.tools import tool
from little_es.values import ModelRequest, ModelResponse, ToolCall, Usage

DONE_RUN = "run_agent_done"
HALF_RUN = "run_agent_half"
PROVIDER = "scripted"
MODEL_ID = "agent-log-1"
OTHER_MODEL = "agent-log-1-0925"
"""What turn 2's response reports: a dated variant of the manifest's model."""

CALLS: Counter[str] = Counter()
KILL: dict[str, int | None] = {"turn": None}


class Killed(BaseException):
    """Stops the process's run inside a model call, as a kill would."""


def lookup(key: str) -> str:
    """Look a key up."""
    CALLS[f"lookup:{key}"] += 1
    return f"value of {key}"


def fail(reason: str) -> str:
    """Always fails."""
    CALLS[f"fail:{reason}"] += 1
    raise RuntimeError(f"cannot: {reason}")


def _response(turn: int) -> ModelResponse:
    usage = Usage(input_tokens=10 * turn, output_tokens=turn)
    if turn == 1:
        calls = (
            ToolCall(id="c1", name="lookup", arguments={"key": "disk"}),
            ToolCall(id="c2", name="lookup", arguments={"key": "inode"}),
        )
        return ModelResponse(
            content="looking", tool_calls=calls, usage=usage, provider=PROVIDER, model=MODEL_ID
        )
    if turn == 2:
        # The model reuses a call id: recorded as "c1#t2".
        calls = (ToolCall(id="c1", name="lookup", arguments={"key": "quota"}),)
        return ModelResponse(tool_calls=calls, usage=usage, provider=PROVIDER, model=OTHER_MODEL)
    if turn == 3:
        calls = (ToolCall(id="c3", name="fail", arguments={"reason": "read-only"}),)
        return ModelResponse(tool_calls=calls, usage=usage, provider=PROVIDER, model=MODEL_ID)
    return ModelResponse(content="free space", usage=usage, provider=PROVIDER, model=MODEL_ID)


def respond(request: ModelRequest) -> ModelResponse:
    turn = 1 + sum(1 for m in request.messages if m.role == "assistant")
    if KILL["turn"] == turn:
        raise Killed
    CALLS[f"model:{turn}"] += 1
    return _response(turn)


MODEL = ScriptedModel(respond=respond, provider=PROVIDER, model_id=MODEL_ID)

WORKFLOW = Workflow(
    "agent_log",
    version="1",
    steps=[
        agent(
            "plan",
            model=MODEL,
            prompt="free some space",
            system="You fix disks.",
            tools=[tool(lookup), tool(fail)],
        )
    ],
)


async def write(directory: Path) -> None:
    from little_es import local_world, run_workflow

    world = local_world(directory)
    await run_workflow(world, WORKFLOW, {}, run_id=DONE_RUN)
    KILL["turn"] = 3
    with contextlib.suppress(Killed):
        await run_workflow(world, WORKFLOW, {}, run_id=HALF_RUN)
    KILL["turn"] = None
    world.close()

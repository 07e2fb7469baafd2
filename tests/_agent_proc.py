"""A child process for the crash tests: run (or resume) one scripted agent session.

Usage: ``python tests/_agent_proc.py WORLD_DIR LEDGER LABEL`` with the repo on
``PYTHONPATH``. The session runs in ``local_world(WORLD_DIR)``; the model and
the tools append one JSON line per REAL invocation to ``LEDGER`` (tagged with
``LABEL``), so a test can count invocations across a killed process and the
one that resumed it. On success the final conversation is written, as
canonical JSON bytes, to ``WORLD_DIR/conversation.json`` and the outcome's
counts are printed as one JSON line. Set ``LITTLE_ES_CRASH_AFTER_*`` (see
:mod:`little_es.faults`) to have the process SIGKILLed mid-session.

The session (5 turns): turn 1 calls ``c1`` and ``c2`` in parallel, turn 2
calls ``c3``, turn 3 calls ``c42`` alone, turn 4 calls ``c5`` and ``c6``,
turn 5 answers.
"""

# No `from __future__ import annotations`: the tools' hints must stay real objects.
import asyncio
import sys
from pathlib import Path
from typing import Any

import orjson

from little_es.harness.model import ScriptedModel, ScriptedReply
from little_es.harness.session import run_agent_session
from little_es.harness.tools import Tool, ToolContext, tool
from little_es.logging import configure_logging
from little_es.values import ModelRequest, ModelResponse, ToolCall, Usage
from little_es.world import local_world, open_world

RUN_ID = "run_crash_agent"
STEP_PATH = "agent"


def _call(call_id: str, name: str, **arguments: Any) -> ToolCall:
    return ToolCall(id=call_id, name=name, arguments=arguments)


SCRIPT = [
    ScriptedReply(
        content="looking up",
        tool_calls=(_call("c1", "lookup", key="alpha"), _call("c2", "lookup", key="beta")),
        usage=Usage(input_tokens=10, output_tokens=3),
    ),
    ScriptedReply(tool_calls=(_call("c3", "add", a=1, b=2),), usage=Usage(input_tokens=20)),
    ScriptedReply(tool_calls=(_call("c42", "add", a=40, b=2),), usage=Usage(input_tokens=30)),
    ScriptedReply(
        tool_calls=(_call("c5", "lookup", key="gamma"), _call("c6", "add", a=3, b=4)),
        usage=Usage(input_tokens=40),
    ),
    ScriptedReply(content="done: 42", usage=Usage(input_tokens=50, output_tokens=2)),
]


class _Ledger:
    """Appends one JSON line per real invocation, tagged with the process's label."""

    def __init__(self, path: Path, label: str) -> None:
        self.path = path
        self.label = label

    def write(self, **entry: Any) -> None:
        """Append ``entry`` (plus the label) as one line."""
        # One open/append/close per entry: the line is in the kernel before the
        # call returns, so it survives the SIGKILL that may follow.
        with self.path.open("ab") as f:
            f.write(orjson.dumps({"label": self.label, **entry}) + b"\n")


class _LedgerModel:
    """The scripted model, writing each real invocation to the ledger."""

    def __init__(self, ledger: _Ledger) -> None:
        self._ledger = ledger
        self._scripted = ScriptedModel(SCRIPT, provider="scripted", model_id="crash-1")

    @property
    def provider(self) -> str:
        """The scripted model's provider."""
        return self._scripted.provider

    @property
    def model_id(self) -> str:
        """The scripted model's id."""
        return self._scripted.model_id

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """Write the turn to the ledger, then answer from the script."""
        turn = 1 + sum(1 for m in request.messages if m.role == "assistant")
        self._ledger.write(kind="model", turn=turn)
        return await self._scripted.complete(request)


def _tools(ledger: _Ledger) -> list[Tool]:
    async def lookup(key: str, ctx: ToolContext) -> str:
        """Look a key up."""
        ledger.write(kind="tool", call_id=ctx.call_id, name="lookup", args={"key": key})
        # Yield, so parallel calls interleave and a crash can find one in flight.
        await asyncio.sleep(0)
        return f"value of {key}"

    async def add(a: int, b: int, ctx: ToolContext) -> int:
        """Add two integers."""
        ledger.write(kind="tool", call_id=ctx.call_id, name="add", args={"a": a, "b": b})
        await asyncio.sleep(0)
        return a + b

    return [tool(lookup), tool(add)]


async def _main(world_dir: Path, ledger_path: Path, label: str, url: str | None) -> None:
    ledger = _Ledger(ledger_path, label)
    # With a URL, the world is there and WORLD_DIR only holds conversation.json.
    world_dir.mkdir(parents=True, exist_ok=True)
    with local_world(world_dir) if url is None else open_world(url) as world:
        outcome = await run_agent_session(
            world,
            run_id=RUN_ID,
            step_path=STEP_PATH,
            attempt=1,
            model=_LedgerModel(ledger),
            tools=_tools(ledger),
            prompt="compute things",
            system="You are a calculator.",
            parameters={"temperature": 1.0},
            max_turns=10,
        )
    conversation = [m.model_dump(mode="json") for m in outcome.conversation]
    (world_dir / "conversation.json").write_bytes(
        orjson.dumps(conversation, option=orjson.OPT_SORT_KEYS)
    )
    counts = outcome.model_dump(
        include={
            "output",
            "turns",
            "model_calls_made",
            "tool_calls_made",
            "replayed_model_calls",
            "replayed_tool_calls",
        }
    )
    sys.stdout.write(orjson.dumps(counts).decode() + "\n")


if __name__ == "__main__":
    configure_logging(json=True, level="WARNING")
    world_arg, ledger_arg, label_arg = sys.argv[1:4]
    url_arg = sys.argv[4] if len(sys.argv) > 4 else None
    asyncio.run(_main(Path(world_arg), Path(ledger_arg), label_arg, url_arg))

"""A child process for the lease-loss tests: drive (or resume) one run of a workflow.

Usage: ``python tests/_lease_proc.py LEDGER LABEL [STOP_AFTER]`` with the world in
``$LITTLE_ES_WORLD`` and the repo on ``PYTHONPATH``. The workflow is four task steps,
an agent step of six turns (each turn one tool call, the seventh answers) and two more
task steps. Every step body, model call and tool call appends a ``start`` line to
``LEDGER`` before it does anything and an ``end`` line as its last act (one ``O_APPEND``
write each, tagged with ``LABEL`` and the pid), taking 30 ms in between. With
``STOP_AFTER=N`` the process SIGSTOPs itself right after its Nth ``end`` line: a driver
that is alive but stuck, between two executions.

Exit code 0 and ``completed`` on stdout when the run completes; 2 and
``ErrorClass: message`` on stderr when a little_es error stops it.
"""

# No `from __future__ import annotations`: the tools' hints must stay real objects.
import asyncio
import os
import signal
import sys
from pathlib import Path
from typing import Any

import orjson

from little_es.engine.local import run_workflow
from little_es.errors import LittleEsError
from little_es.harness.model import ScriptedModel, ScriptedReply
from little_es.harness.tools import ToolContext, tool
from little_es.values import ModelRequest, ModelResponse, ToolCall, Usage
from little_es.workflow.authoring import Workflow, agent, task
from little_es.workflow.context import StepContext
from little_es.world import open_world

RUN_ID = "run_lease_loss"
TURNS = 6
SECONDS = 0.03


class _Ledger:
    def __init__(self, path: Path, label: str, stop_after: int | None) -> None:
        self.path = path
        self.label = label
        self.stop_after = stop_after
        self.ends = 0

    def write(self, event: str, kind: str, name: str) -> None:
        line = orjson.dumps(
            {"label": self.label, "pid": os.getpid(), "ev": event, "kind": kind, "name": name}
        )
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line + b"\n")
        finally:
            os.close(fd)
        if event == "end":
            self.ends += 1
            if self.ends == self.stop_after:
                os.kill(os.getpid(), signal.SIGSTOP)

    async def execute(self, kind: str, name: str) -> None:
        self.write("start", kind, name)
        await asyncio.sleep(SECONDS)
        self.write("end", kind, name)


def _script() -> list[ScriptedReply]:
    replies = [
        ScriptedReply(
            tool_calls=(ToolCall(id=f"c{turn}", name="work", arguments={"n": turn}),),
            usage=Usage(input_tokens=10 * turn),
        )
        for turn in range(1, TURNS + 1)
    ]
    return [*replies, ScriptedReply(content="done", usage=Usage(input_tokens=100))]


class _LedgerModel:
    provider = "scripted"
    model_id = "lease-1"

    def __init__(self, ledger: _Ledger) -> None:
        self._ledger = ledger
        self._scripted = ScriptedModel(_script(), provider=self.provider, model_id=self.model_id)

    async def complete(self, request: ModelRequest) -> ModelResponse:
        turn = 1 + sum(1 for m in request.messages if m.role == "assistant")
        await self._ledger.execute("model", f"turn{turn}")
        return await self._scripted.complete(request)


def workflow(ledger: _Ledger) -> Workflow:
    def step(name: str) -> Any:
        async def body(ctx: StepContext) -> str:
            await ledger.execute("step", ctx.step_path)
            return name

        return task(name, body)

    async def work(n: int, ctx: ToolContext) -> int:
        """Do one unit of work."""
        await ledger.execute("tool", ctx.call_id)
        return n * n

    return Workflow(
        "lease_flow",
        version="1",
        steps=[
            *(step(f"t{i}") for i in range(1, 5)),
            agent("agent", model=_LedgerModel(ledger), tools=[tool(work)], prompt="work"),
            *(step(f"t{i}") for i in range(5, 7)),
        ],
    )


def main() -> int:
    stop_after = int(sys.argv[3]) if len(sys.argv) > 3 else None
    ledger = _Ledger(Path(sys.argv[1]), sys.argv[2], stop_after)
    world = open_world()
    try:
        asyncio.run(run_workflow(world, workflow(ledger), {}, run_id=RUN_ID))
    except LittleEsError as exc:
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return 2
    finally:
        world.close()
    print("completed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A child process for the orchestrator crash tests: run (or resume) one fan-out orchestrator.

Usage: ``python tests/_orchestrator_proc.py WORLD_DIR LEDGER LABEL N CONCURRENCY`` with
the repo on ``PYTHONPATH``. The run ``run_orchestrator_crash`` of the ``orchestrate``
workflow runs in ``local_world(WORLD_DIR)``: its agent step ``fan_out`` is a scripted
orchestrator whose turn 1 calls ``start_workflow`` N times (call ids ``c001``...,
input ``{"n": i}``) with at most CONCURRENCY sub-runs at once, and whose turn 2 answers
with the sum of the sub-runs' outputs; a ``report`` task step follows.

Each sub-run is the ``work`` workflow: task ``fetch`` then task ``compute``, output
``10 * n + 1``. The model and every step append one JSON line per REAL execution to
``LEDGER`` (tagged with ``LABEL``), so a test can count executions across a killed
process and the one that resumed it. On success the run's output and counts are
printed as one JSON line. Set ``LITTLE_ES_CRASH_AFTER_*`` (see :mod:`little_es.faults`)
to have the process SIGKILLed mid-run, and ``ORCHESTRATOR_FAIL_N=i`` to have sub-run
``i``'s ``compute`` fail for good.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

import orjson

from little_es.engine.local import run_workflow
from little_es.harness.model import ScriptedModel, ScriptedReply
from little_es.logging import configure_logging
from little_es.orchestrator import start_workflow_tool
from little_es.values import ModelRequest, ToolCall, Usage
from little_es.workflow.authoring import Workflow, agent, task
from little_es.workflow.context import StepContext
from little_es.world import local_world, open_world

RUN_ID = "run_orchestrator_crash"
AGENT_STEP = "fan_out"


def call_id(i: int) -> str:
    """The model's call id for sub-run ``i`` (1-based)."""
    return f"c{i:03d}"


def expected_output(n: int) -> dict[str, Any]:
    """The run's output when all ``n`` sub-runs completed."""
    return {"answer": f"total={sum(10 * i + 1 for i in range(1, n + 1))} ok={n} failed=0"}


class _Ledger:
    """Appends one JSON line per real execution, tagged with the process's label."""

    def __init__(self, path: Path, label: str) -> None:
        self.path = path
        self.label = label

    def write(self, **entry: Any) -> None:
        """Append ``entry`` (plus the label) as one line."""
        # One open/append/close per entry: the line is in the kernel before the
        # step returns, so it survives the SIGKILL that may follow.
        with self.path.open("ab") as f:
            f.write(orjson.dumps({"label": self.label, **entry}) + b"\n")


def _work(ledger: _Ledger) -> Workflow:
    async def fetch(ctx: StepContext) -> dict[str, int]:
        ledger.write(kind="step", run_id=ctx.run_id, step=ctx.step_path)
        # Yield, so concurrent sub-runs interleave and a crash finds some mid-way.
        await asyncio.sleep(0.002)
        return {"value": 10 * int(ctx.input["n"])}

    failing = int(os.environ.get("ORCHESTRATOR_FAIL_N", "0"))

    async def compute(ctx: StepContext) -> int:
        ledger.write(kind="step", run_id=ctx.run_id, step=ctx.step_path)
        await asyncio.sleep(0.002)
        if int(ctx.input["n"]) == failing:
            raise ValueError(f"sub-run {failing} fails for good")
        return int(ctx.outputs["fetch"]["value"]) + 1

    return Workflow("work", version="1", steps=[task("fetch", fetch), task("compute", compute)])


def _result(content: str | None) -> Any:
    # A failed call's result is its error's text, not JSON.
    try:
        return orjson.loads(content or "null")
    except orjson.JSONDecodeError:
        return content


def _report(ctx: StepContext) -> dict[str, Any]:
    return {"answer": ctx.outputs[AGENT_STEP]}


def _orchestrate(ledger: _Ledger, n: int, concurrency: int) -> Workflow:
    def respond(request: ModelRequest) -> ScriptedReply:
        turn = 1 + sum(1 for m in request.messages if m.role == "assistant")
        ledger.write(kind="model", turn=turn)
        if turn == 1:
            calls = tuple(
                ToolCall(
                    id=call_id(i),
                    name="start_workflow",
                    arguments={"workflow_id": "work", "input": {"n": i}},
                )
                for i in range(1, n + 1)
            )
            return ScriptedReply(tool_calls=calls, usage=Usage(input_tokens=100, output_tokens=n))
        results = [_result(m.content) for m in request.messages if m.role == "tool"]
        ok = [r for r in results if isinstance(r, dict) and r.get("status") == "completed"]
        total = sum(int(r["output"]) for r in ok)
        return ScriptedReply(
            content=f"total={total} ok={len(ok)} failed={len(results) - len(ok)}",
            usage=Usage(input_tokens=100 + 10 * n, output_tokens=5),
        )

    model = ScriptedModel(respond=respond, provider="scripted", model_id="orchestrator-1")
    return Workflow(
        "orchestrate",
        version="1",
        steps=[
            agent(
                AGENT_STEP,
                model=model,
                tools=[start_workflow_tool([_work(ledger)], max_concurrency=concurrency)],
                prompt=f"Start {n} work sub-runs and add up their outputs.",
                max_turns=3,
            ),
            task("report", _report),
        ],
    )


async def _main(world_arg: str, ledger_path: Path, label: str, n: int, concurrency: int) -> None:
    ledger = _Ledger(ledger_path, label)
    # A data directory, or a world's URL (a MariaDB world).
    with open_world(world_arg) if "://" in world_arg else local_world(world_arg) as world:
        result = await run_workflow(world, _orchestrate(ledger, n, concurrency), {}, run_id=RUN_ID)
    line = {
        "output": result.output,
        "resumed": result.resumed,
        "steps_executed": result.steps_executed,
    }
    sys.stdout.write(orjson.dumps(line).decode() + "\n")


if __name__ == "__main__":
    configure_logging(json=True, level="WARNING")
    world_arg, ledger_arg, label_arg, n_arg, concurrency_arg = sys.argv[1:6]
    asyncio.run(_main(world_arg, Path(ledger_arg), label_arg, int(n_arg), int(concurrency_arg)))

"""The workflow of the clock-skew test: one agent step under a step budget of 3 model calls.

Imported by the child of a :class:`~little_es.testing.CrashRunner` (target
``little_es.testing.crash:workflow_main``, workflow ``tests._skew_proc:WORKFLOW``).
With ``SKEW_S`` in its environment, every event the child records is stamped
that many seconds after the real time: the child stands for a process, or a
Temporal worker, whose clock is ahead of the next one's.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta

import little_es.domain
from little_es.events import utc_now
from little_es.harness.model import ScriptedModel, ScriptedReply
from little_es.harness.tools import tool
from little_es.values import Budget, ToolCall, Usage
from little_es.workflow.authoring import Workflow, agent, task

_skew = float(os.environ.get("SKEW_S", "0"))
if _skew:

    def _skewed_now() -> datetime:
        return utc_now() + timedelta(seconds=_skew)

    little_es.domain.utc_now = _skewed_now  # type: ignore[attr-defined]


def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


def _turn(i: int) -> ScriptedReply:
    return ScriptedReply(
        tool_calls=(ToolCall(id=f"c{i}", name="add", arguments={"a": i, "b": 1}),),
        usage=Usage(input_tokens=10 * i, output_tokens=1),
    )


MODEL = ScriptedModel(
    [*(_turn(i) for i in range(1, 5)), ScriptedReply(content="done", usage=Usage(input_tokens=50))],
    model_id="skew-1",
)

WORKFLOW = Workflow(
    "skewed",
    steps=[
        task("fetch", lambda ctx: {"n": 1}),
        agent(
            "ask",
            model=MODEL,
            prompt="add",
            tools=[tool(add)],
            max_turns=6,
            budget=Budget(model_calls=3),
        ),
    ],
)

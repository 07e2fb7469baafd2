"""``run_workflow(...).state`` is the state ``replay_run`` folds from the log, for every run.

The runtime's view of a run and replay's are the same: usage, cost and event
count included (a run's harness sessions are part of its log), on a run that
completes, on one that resumes, and on a completed one asked again.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from little_es.engine.local import run_workflow
from little_es.harness.model import ScriptedModel, ScriptedReply
from little_es.harness.tools import tool
from little_es.pricing import register_model_price, unregister_model_price
from little_es.replay import replay_run
from little_es.values import ToolCall, Usage
from little_es.workflow.authoring import Workflow, agent, task
from little_es.workflow.context import StepContext
from little_es.world import World


@pytest.fixture
def prices() -> Iterator[None]:
    """A price for the scripted model, removed afterwards."""
    register_model_price("acme", "acme-1", input_per_mtok=2.0, output_per_mtok=10.0)
    yield
    unregister_model_price("acme", "acme-1")


def _double(ctx: StepContext) -> int:
    return int(ctx.input["n"]) * 2


def _add_one(ctx: StepContext) -> int:
    return int(ctx.outputs["double"]) + 1


async def test_a_task_run(world: World) -> None:
    wf = Workflow("tasks", steps=[task("double", _double), task("add_one", _add_one)])
    result = await run_workflow(world, wf, {"n": 2}, run_id="run_tasks")
    assert result.output == 5
    assert result.state == replay_run(world, "run_tasks").state
    assert result.state.event_count == 6
    again = await run_workflow(world, wf, run_id="run_tasks")
    assert again.state == result.state


async def test_an_agent_run(world: World, prices: None) -> None:
    async def lookup(key: str) -> str:
        """Look a key up."""
        return f"value of {key}"

    model = ScriptedModel(
        [
            ScriptedReply(
                tool_calls=(ToolCall(id="c1", name="lookup", arguments={"key": "k"}),),
                usage=Usage(input_tokens=100, output_tokens=10),
            ),
            ScriptedReply(content="done", usage=Usage(input_tokens=200, output_tokens=20)),
        ],
        provider="acme",
        model_id="acme-1",
    )
    wf = Workflow(
        "agents",
        steps=[
            task("double", _double),
            agent("ask", model=model, prompt="look k up", tools=[tool(lookup)], max_turns=3),
        ],
    )
    result = await run_workflow(world, wf, {"n": 1}, run_id="run_agent_state")
    replayed = replay_run(world, "run_agent_state").state
    assert result.state == replayed
    assert result.state.usage.input_tokens == 300 and result.state.usage.output_tokens == 30
    assert result.state.usage.cost_usd == pytest.approx((300 * 2.0 + 30 * 10.0) / 1e6)
    assert result.state.steps["ask"].usage == replayed.steps["ask"].usage
    assert result.state.event_count == len(world.read_run_log("run_agent_state"))
    again = await run_workflow(world, wf, run_id="run_agent_state")
    assert again.state == replayed

"""The restart checks as the runtime runs them, before anything is scheduled."""

from __future__ import annotations

from typing import Any

import pytest

from little_es import (
    CapabilityDriftError,
    RunFailedError,
    ScriptedModel,
    ScriptedReply,
    StepContext,
    Workflow,
    WorkflowChangedError,
    World,
    agent,
    run_workflow,
    task,
    tool,
)


@tool
def search(query: str) -> str:
    """Search."""
    return f"results for {query}"


@tool
def fetch(url: str) -> str:
    """Fetch a page."""
    return url


def _workflow(tools: list[Any], fail: bool, steps_after: int = 1) -> Workflow:
    model = ScriptedModel([ScriptedReply(content="plan ready")])

    def publish(ctx: StepContext) -> str:
        if fail:
            raise RuntimeError("publisher down")
        return "published"

    steps = [agent("plan", model=model, prompt="plan it", tools=tools), task("publish", publish)]
    if steps_after > 1:
        steps.append(task("notify", lambda ctx: "ok"))
    return Workflow("checked", steps=steps)


async def test_a_changed_agent_is_named_even_when_its_step_completed(memory: World) -> None:
    with pytest.raises(RunFailedError):
        await run_workflow(memory, _workflow([search], fail=True), {}, run_id="run_drift")

    with pytest.raises(CapabilityDriftError, match="tool 'fetch' added"):
        await run_workflow(memory, _workflow([search, fetch], fail=False), run_id="run_drift")

    result = await run_workflow(memory, _workflow([search], fail=False), run_id="run_drift")
    assert result.output == "published"


async def test_another_change_is_refused_by_the_ir_hash(memory: World) -> None:
    with pytest.raises(RunFailedError):
        await run_workflow(memory, _workflow([search], fail=True), {}, run_id="run_changed")

    with pytest.raises(WorkflowChangedError, match="run_changed"):
        await run_workflow(
            memory, _workflow([search], fail=False, steps_after=2), run_id="run_changed"
        )


@pytest.fixture
def memory() -> World:
    from little_es import memory_world

    return memory_world()

"""Tools and steps that run on some engines only: refused at the run's start, nothing recorded."""

from __future__ import annotations

import pytest

from little_es import (
    EngineUnsupportedError,
    ScriptedModel,
    ScriptedReply,
    ToolError,
    Workflow,
    WorkflowDefinitionError,
    agent,
    memory_world,
    run_workflow,
    start_workflow_tool,
    task,
    tool,
)


def _one(ctx: object) -> int:
    return 1


def _answer(q: str) -> str:
    """Answer."""
    return q


_MODEL = ScriptedModel([ScriptedReply(content="done")])


async def test_a_tool_for_another_engine_refuses_the_run_before_anything_is_recorded() -> None:
    only_temporal = tool(_answer, engines=["temporal"])
    assert only_temporal.engines == frozenset({"temporal"})
    workflow = Workflow(
        "w_engines",
        steps=[task("a", _one), agent("ask", model=_MODEL, tools=[only_temporal], prompt="go")],
    )
    with memory_world() as world:
        with pytest.raises(EngineUnsupportedError, match="tool '_answer' of agent step 'ask'"):
            await run_workflow(world, workflow, {}, run_id="run_engines")
        assert not world.run_exists("run_engines")


async def test_a_local_only_step_in_a_sub_workflow_an_orchestrator_starts_is_found() -> None:
    child = Workflow("w_child", steps=[task("here", _one, engines=["temporal"])])
    parent = Workflow(
        "w_parent",
        steps=[agent("plan", model=_MODEL, tools=[start_workflow_tool([child])], prompt="go")],
    )
    with memory_world() as world:
        with pytest.raises(EngineUnsupportedError, match="workflow 'w_child': step 'here'"):
            await run_workflow(world, parent, {}, run_id="run_engines_sub")
        assert not world.run_exists("run_engines_sub")


async def test_a_step_declared_for_this_engine_runs_and_the_ir_is_unchanged() -> None:
    plain = Workflow("w_same", steps=[task("a", _one)])
    declared = Workflow("w_same", steps=[task("a", _one, engines=["local", "temporal"])])
    # Declaring engines is no change to the definition a log was recorded with.
    assert plain.ir_hash == declared.ir_hash
    with memory_world() as world:
        result = await run_workflow(world, declared, {}, run_id="run_local_ok")
    assert result.output == 1


def test_unknown_or_empty_engines_are_refused() -> None:
    with pytest.raises(ToolError, match="engines must be"):
        tool(_answer, engines=["lambda"])
    with pytest.raises(ToolError, match="engines must be"):
        tool(_answer, engines="local")
    with pytest.raises(WorkflowDefinitionError, match="engines must be"):
        task("a", _one, engines=[])

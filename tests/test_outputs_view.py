"""The ``ctx.outputs`` the local scheduler hands to steps: one view, extended in place.

The view is a :class:`~little_es._frozen.FrozenDict` (so ``json``, orjson, pickle
and ``isinstance(..., dict)`` keep working). Rebuilding it for every step made a
run of N steps copy O(N**2) entries; it is now extended in place while nothing but
the scheduler holds it, and copied only when a step kept it (its context or the
mapping itself), so that what a step was shown never changes afterwards.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any

import pytest

import little_es.engine.local as local
from little_es import memory_world
from little_es._frozen import FrozenDict
from little_es.engine.local import run_workflow
from little_es.workflow.authoring import Workflow, decision, task
from little_es.workflow.context import StepContext


def _value(ctx: StepContext) -> dict[str, Any]:
    return {"path": ctx.step_path, "seen": len(ctx.outputs)}


async def _async_value(ctx: StepContext) -> dict[str, Any]:
    await asyncio.sleep(0)
    return _value(ctx)


def test_a_run_whose_steps_keep_nothing_never_copies_the_outputs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made: list[int] = []

    class Counted(FrozenDict[str, Any]):
        __slots__ = ()

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            made.append(1)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(local, "FrozenDict", Counted)
    seen: list[int] = []

    def check(ctx: StepContext) -> int:
        seen.append(len(ctx.outputs))
        return len(ctx.outputs)

    n = 150
    steps = [
        task(f"t{i}", _value)
        if i % 3 == 0
        else task(f"t{i}", _value, run_in_thread=False)
        if i % 3 == 1
        else task(f"t{i}", _async_value)
        for i in range(n)
    ]
    wf = Workflow("view", steps=[*steps, task("check", check)])
    with memory_world() as world:
        result = asyncio.run(run_workflow(world, wf, {}, run_id="run_view"))
    assert result.output == n
    assert seen == [n]
    # One view for the whole run: rebuilt per step, it was one per step.
    assert len(made) == 1


def test_what_a_step_was_shown_does_not_change_as_the_run_goes_on() -> None:
    kept: dict[str, Mapping[str, Any]] = {}
    contexts: dict[str, StepContext] = {}

    def keep_mapping(ctx: StepContext) -> int:
        kept[ctx.step_path] = ctx.outputs
        return ctx.visit

    def keep_context(ctx: StepContext) -> int:
        contexts[ctx.step_path] = ctx
        return ctx.visit

    def route(ctx: StepContext) -> str:
        kept[ctx.step_path] = ctx.outputs
        return "a" if ctx.visit < 2 else "end_step"

    def last(ctx: StepContext) -> Any:
        # A step may return the view itself: it is stored as the JSON it is now.
        return ctx.outputs

    wf = Workflow(
        "kept",
        steps=[
            task("a", keep_mapping, max_visits=2),
            task("b", keep_context, max_visits=2),
            decision("route", route, max_visits=2),
            task("end_step", last),
        ],
    )
    with memory_world() as world:
        result = asyncio.run(run_workflow(world, wf, {}, run_id="run_kept"))

    assert kept["a"] == {}
    assert contexts["b"].outputs == {"a": 1}
    assert kept["route"] == {"a": 1, "b": 1}
    # A later visit replaces the step's output where the step first appeared.
    assert list(kept["a@2"]) == ["a", "b", "route"]
    assert kept["a@2"] == {"a": 1, "b": 1, "route": "a"}
    assert contexts["b@2"].outputs == {"a": 2, "b": 1, "route": "a"}
    assert kept["route@2"] == {"a": 2, "b": 2, "route": "a"}
    assert result.output == {"a": 2, "b": 2, "route": "end_step"}
    assert list(result.output) == ["a", "b", "route"]
    for shown in (*kept.values(), *(c.outputs for c in contexts.values())):
        assert isinstance(shown, FrozenDict)
        assert json.loads(json.dumps(shown)) == shown
        with pytest.raises(TypeError, match="read-only"):
            shown["x"] = 1  # type: ignore[index]

"""Integrity errors are refusals: nothing is appended, no retry is spent, the session survives.

An agent step is stopped mid-session (a ``BaseException`` from a tool stands in
for the process dying: nothing records it), then resumed with a log or code
that disagrees: a named :class:`~little_es.errors.RuntimeIntegrityError` is
raised and the run's log (its ``Run`` stream and its sessions) has exactly the
rows it had. Resumed again once the cause is gone, the same session continues
and only the call in flight runs; every committed model and tool call is
answered from the log (the model's and the ledger's counts say so).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from little_es.domain import HarnessSession
from little_es.engine.local import run_workflow
from little_es.errors import (
    CapabilityDriftError,
    ConversationDivergedError,
    RunFailedError,
    RuntimeIntegrityError,
)
from little_es.events import (
    ModelResponded,
    RunFailed,
    SessionStarted,
    StepCompleted,
    StepFailed,
    StepStarted,
)
from little_es.harness import session as session_module
from little_es.harness.manifest import PROMPT_KEY, compute_manifest
from little_es.harness.model import ScriptedModel, ScriptedReply
from little_es.harness.tools import Tool, ToolContext, tool
from little_es.ids import session_stream_id
from little_es.replay import replay_run
from little_es.values import ToolCall, Usage
from little_es.workflow.authoring import Workflow, agent, parallel, subworkflow, task
from little_es.workflow.context import StepContext
from little_es.world import World

RUN = "run_refusal"


class _Crash(BaseException):
    """Stands in for the process dying: not an Exception, so nothing records it."""


SCRIPT = [
    ScriptedReply(
        content="looking things up",
        tool_calls=(
            ToolCall(id="c1", name="lookup", arguments={"key": "alpha"}),
            ToolCall(id="c2", name="lookup", arguments={"key": "beta"}),
        ),
        usage=Usage(input_tokens=100, output_tokens=10),
    ),
    ScriptedReply(
        tool_calls=(ToolCall(id="c3", name="add", arguments={"a": 1, "b": 2}),),
        usage=Usage(input_tokens=150, output_tokens=8),
    ),
    ScriptedReply(content="the answer is 3", usage=Usage(input_tokens=170, output_tokens=5)),
]

# What the callable prompt renders; a test changes it to stand for changed code.
_PROMPT = {"text": "what is 1 + 2?"}


def _prompt(ctx: StepContext) -> str:
    return f"{_PROMPT['text']} ({ctx.outputs['prep']['n']})"


def _prep(ctx: StepContext) -> dict[str, int]:
    return {"n": 1}


def _tools(ledger: list[str], crash_on: frozenset[str] = frozenset()) -> list[Tool]:
    async def lookup(key: str, ctx: ToolContext) -> str:
        """Look a key up."""
        ledger.append(ctx.call_id)
        if ctx.call_id in crash_on:
            raise _Crash
        return f"value of {key}"

    async def add(a: int, b: int, ctx: ToolContext) -> int:
        """Add two integers."""
        ledger.append(ctx.call_id)
        if ctx.call_id in crash_on:
            raise _Crash
        return a + b

    return [tool(lookup), tool(add)]


def _workflow(
    model: ScriptedModel,
    tools: list[Tool],
    prompt: Any = _prompt,
) -> Workflow:
    return Workflow(
        "refusals",
        version="1",
        steps=[
            task("prep", _prep),
            agent(
                "agent",
                model=model,
                tools=tools,
                prompt=prompt,
                system="You are terse.",
                max_turns=5,
            ),
        ],
    )


def _model() -> ScriptedModel:
    return ScriptedModel(SCRIPT, provider="acme", model_id="acme-1")


def _rows(world: World) -> tuple[int, int]:
    """Rows of the run's log, and of its one session's stream."""
    return (
        len(world.read_run_log(RUN)),
        len(world.read_stream(session_stream_id(RUN, "agent", 1))),
    )


async def _stopped_mid_session(world: World, prompt: Any = _prompt) -> list[str]:
    """Run until tool call c3 (turn 2) is in flight, and 'die' there; the ledger so far."""
    ledger: list[str] = []
    with pytest.raises(_Crash):
        await run_workflow(
            world,
            _workflow(_model(), _tools(ledger, frozenset({"c3"})), prompt),
            {},
            run_id=RUN,
        )
    assert ledger == ["c1", "c2", "c3"]
    return ledger


def _assert_never_failed(world: World) -> None:
    log = world.read_run_log(RUN)
    assert not [e for e in log if isinstance(e, StepFailed | RunFailed)]
    state = replay_run(world, RUN).state
    assert state.status == "running"
    assert state.steps["agent"].status == "running" and state.steps["agent"].attempts == 1
    assert state.steps["agent"].session_ids == (session_stream_id(RUN, "agent", 1),)


async def _resumes_with_only_the_call_in_flight(world: World) -> None:
    ledger: list[str] = []
    model = _model()
    result = await run_workflow(world, _workflow(model, _tools(ledger)), run_id=RUN)
    assert result.output == "the answer is 3"
    assert result.state == replay_run(world, RUN).state
    # c3 was in flight at the stop; turn 3 was never called. Nothing else ran again.
    assert ledger == ["c3"]
    assert model.calls == 1
    state = replay_run(world, RUN).state
    assert state.steps["agent"].attempts == 1
    assert state.steps["agent"].session_ids == (session_stream_id(RUN, "agent", 1),)


async def test_a_tampered_recorded_response_is_refused_mid_session_and_recorded_nowhere(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _stopped_mid_session(world)
    before = _rows(world)
    session_id = session_stream_id(RUN, "agent", 1)
    forged = HarnessSession.from_events(
        session_id,
        [
            e.model_copy(update={"response": e.response.model_copy(update={"content": "forged"})})
            if isinstance(e, ModelResponded) and e.turn == 1
            else e
            for e in world.read_stream(session_id)
        ],
    )
    # The session as a tampered log reads back; the run stream is intact.
    real_load = world.load_session
    monkeypatch.setattr(
        world, "load_session", lambda sid: forged if sid == session_id else real_load(sid)
    )
    for _ in range(2):  # refused every time: no retry is spent, no new session started
        ledger: list[str] = []
        model = _model()
        with pytest.raises(ConversationDivergedError, match=r"turn 2"):
            await run_workflow(world, _workflow(model, _tools(ledger)), run_id=RUN)
        assert ledger == [] and model.calls == 0
        assert _rows(world) == before
    monkeypatch.undo()  # the log repaired from a backup
    _assert_never_failed(world)
    await _resumes_with_only_the_call_in_flight(world)


async def test_a_changed_callable_prompt_is_refused_inside_the_step_and_recorded_nowhere(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _stopped_mid_session(world)
    before = _rows(world)
    monkeypatch.setitem(_PROMPT, "text", "what is 2 + 2?")
    ledger: list[str] = []
    model = _model()
    with pytest.raises(CapabilityDriftError, match=r"prompt changed"):
        await run_workflow(world, _workflow(model, _tools(ledger)), run_id=RUN)
    assert ledger == [] and model.calls == 0
    assert _rows(world) == before
    monkeypatch.undo()  # the code restored
    _assert_never_failed(world)
    await _resumes_with_only_the_call_in_flight(world)


async def test_a_changed_static_prompt_is_refused_before_the_run_resumes(world: World) -> None:
    await _stopped_mid_session(world, prompt="what is 1 + 2?")
    before = _rows(world)
    ledger: list[str] = []
    model = _model()
    with pytest.raises(CapabilityDriftError, match=r"prompt changed"):
        await run_workflow(
            world, _workflow(model, _tools(ledger), prompt="what is 2 + 2?"), run_id=RUN
        )
    assert ledger == [] and model.calls == 0
    assert _rows(world) == before
    _assert_never_failed(world)
    model = _model()
    result = await run_workflow(
        world, _workflow(model, _tools(ledger), prompt="what is 1 + 2?"), run_id=RUN
    )
    assert result.output == "the answer is 3"
    assert ledger == ["c3"] and model.calls == 1


async def test_a_changed_static_prompt_is_refused_on_a_completed_run(world: World) -> None:
    ledger: list[str] = []
    await run_workflow(
        world, _workflow(_model(), _tools(ledger), prompt="what is 1 + 2?"), {}, run_id=RUN
    )
    before = len(world.read_run_log(RUN))
    with pytest.raises(CapabilityDriftError, match=r"prompt changed"):
        await run_workflow(
            world, _workflow(_model(), _tools(ledger), prompt="what is 2 + 2?"), run_id=RUN
        )
    assert len(world.read_run_log(RUN)) == before


async def test_a_run_whose_session_was_recorded_without_the_prompt_still_resumes(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A log written before the prompt was in the manifest: the missing key is "not
    recorded", so the restart check and the session's check both let it resume."""
    with monkeypatch.context() as old_code:
        old_code.setattr(
            session_module, "compute_manifest", lambda *args: compute_manifest(*args[:5])
        )
        await _stopped_mid_session(world, prompt="what is 1 + 2?")
    started = world.read_stream(session_stream_id(RUN, "agent", 1))[0]
    assert isinstance(started, SessionStarted) and PROMPT_KEY not in started.manifest
    ledger: list[str] = []
    model = _model()
    result = await run_workflow(
        world, _workflow(model, _tools(ledger), prompt="what is 1 + 2?"), run_id=RUN
    )
    assert result.output == "the answer is 3"
    assert ledger == ["c3"] and model.calls == 1
    again = await run_workflow(
        world, _workflow(_model(), _tools(ledger), prompt="what is 1 + 2?"), run_id=RUN
    )
    assert again.output == "the answer is 3" and again.steps_executed == 0


async def test_a_refusal_inside_a_sub_run_is_no_failure_of_the_parent_step(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []

    def child_step(ctx: StepContext) -> str:
        calls.append(ctx.run_id)
        raise ConversationDivergedError("stands for a refusal found inside the child's step")

    child = Workflow("refusals_child", version="1", steps=[task("c", child_step)])
    parent = Workflow("refusals_parent", version="1", steps=[subworkflow("sub", child)])
    with pytest.raises(RuntimeIntegrityError):
        await run_workflow(world, parent, {}, run_id=RUN)
    log = world.read_run_log(RUN)
    assert not [e for e in log if isinstance(e, StepFailed | RunFailed)]
    assert replay_run(world, RUN).state.steps["sub"].status == "running"
    assert calls and not [e for e in world.read_run_log(calls[0]) if isinstance(e, StepFailed)]


async def test_a_genuine_step_failure_is_still_recorded(world: World) -> None:
    def boom(ctx: StepContext) -> None:
        raise ValueError("the user's code raised")

    wf = Workflow("refusals_boom", version="1", steps=[task("boom", boom)])
    with pytest.raises(RunFailedError):
        await run_workflow(world, wf, {}, run_id=RUN)
    log = world.read_run_log(RUN)
    assert [type(e) for e in log if isinstance(e, StepFailed | RunFailed)][-1] is RunFailed


async def test_a_refusal_in_one_branch_stops_the_others_before_they_append_or_start(
    world: World,
) -> None:
    """Branch ``a`` refuses while ``b`` is running and ``c`` waits for its turn: ``b`` is
    stopped with its step in flight (as a kill leaves it), ``c`` never starts, and the
    refusal is raised at once, not after the others ran to their end."""
    refuse = {"on": True}
    ran: list[str] = []

    async def work(ctx: StepContext) -> str:
        ran.append(ctx.step_path)
        if ctx.branch_key == "a":
            await asyncio.sleep(0.05)
            if refuse["on"]:
                raise ConversationDivergedError("stands for a refusal found inside the step")
        elif ctx.branch_key == "b" and refuse["on"]:
            await asyncio.sleep(5)
        return ctx.branch_key or ""

    group = parallel(
        "fan", branches=lambda ctx: ["a", "b", "c"], step=task("work", work), max_concurrency=2
    )
    wf = Workflow("refusals_fan", version="1", steps=[group])
    started = time.monotonic()
    with pytest.raises(ConversationDivergedError):
        await run_workflow(world, wf, {}, run_id=RUN)
    assert time.monotonic() - started < 3, "the other branches ran on after the refusal"
    assert sorted(ran) == ["fan[a]/work", "fan[b]/work"]
    log = world.read_run_log(RUN)
    assert not [e for e in log if isinstance(e, StepCompleted | StepFailed | RunFailed)]
    assert sorted(e.step_path for e in log if isinstance(e, StepStarted)) == [
        "fan",
        "fan[a]/work",
        "fan[b]/work",
    ]
    # Once the cause is gone, the in-flight branches run again and the third starts.
    refuse["on"] = False
    result = await run_workflow(world, wf, run_id=RUN)
    assert result.output == {"a": "a", "b": "b", "c": "c"}

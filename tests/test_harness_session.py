"""Harness sessions in one process: recording, deltas, usage, resume, drift, call ids, log size."""

# No `from __future__ import annotations`: tools are defined inside factories,
# and their hints must stay real objects.
import asyncio
import hashlib
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from little_es.domain import HarnessSession
from little_es.errors import (
    CapabilityDriftError,
    ConversationDivergedError,
    InvalidRunIdError,
    ModelError,
    ModelUnavailableError,
    SessionInputError,
    ToolError,
    TurnLimitExceededError,
)
from little_es.events import (
    Event,
    ModelCalled,
    ModelResponded,
    SessionCompleted,
    SessionStarted,
    ToolCallFailed,
    ToolCallStarted,
    ToolCallSucceeded,
)
from little_es.harness import session as session_module
from little_es.harness.manifest import assert_session_manifest_consistent, compute_manifest
from little_es.harness.model import ScriptedModel, ScriptedReply
from little_es.harness.session import (
    SessionOutcome,
    conversation_hash,
    run_agent_session,
    sent_messages,
)
from little_es.harness.tools import Tool, ToolContext, tool
from little_es.ids import session_stream_id
from little_es.values import ModelRequest, ToolCall, Usage
from little_es.workflow.ir import canonical_json
from little_es.world import World, local_world, memory_world

RUN = "run_session_test"
STEP = "research"


class _Crash(BaseException):
    """Stands in for the process dying: not an Exception, so nothing records it."""


@pytest.fixture(params=["memory", "sqlite"])
def world(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[World]:
    w = memory_world() if request.param == "memory" else local_world(tmp_path / "world")
    with w:
        yield w


def _tools(
    ledger: list[tuple[str, str, dict[str, Any]]], *, crash_on: frozenset[str] = frozenset()
) -> list[Tool]:
    """lookup and add; each real invocation is appended to ``ledger``."""

    async def lookup(key: str, ctx: ToolContext) -> str:
        """Look a key up."""
        ledger.append((ctx.call_id, "lookup", {"key": key}))
        if ctx.call_id in crash_on:
            raise _Crash
        return f"value of {key}"

    async def add(a: int, b: int, ctx: ToolContext) -> int:
        """Add two integers."""
        ledger.append((ctx.call_id, "add", {"a": a, "b": b}))
        if ctx.call_id in crash_on:
            raise _Crash
        return a + b

    return [tool(lookup), tool(add)]


def _call(call_id: str, name: str, **arguments: Any) -> ToolCall:
    return ToolCall(id=call_id, name=name, arguments=arguments)


SCRIPT = [
    ScriptedReply(
        content="looking things up",
        tool_calls=(_call("c1", "lookup", key="alpha"), _call("c2", "lookup", key="beta")),
        usage=Usage(input_tokens=100, output_tokens=10, cached_input_tokens=20),
    ),
    ScriptedReply(
        tool_calls=(_call("c3", "add", a=1, b=2),),
        usage=Usage(input_tokens=150, output_tokens=8, reasoning_tokens=3),
    ),
    ScriptedReply(content="the answer is 3", usage=Usage(input_tokens=170, output_tokens=5)),
]


def _model(script: list[ScriptedReply] | None = SCRIPT, **kwargs: Any) -> ScriptedModel:
    return ScriptedModel(script, provider="acme", model_id="acme-1", **kwargs)


async def _run(world: World, model: Any, tools: list[Tool], **overrides: Any) -> SessionOutcome:
    kwargs: dict[str, Any] = {
        "run_id": RUN,
        "step_path": STEP,
        "attempt": 1,
        "model": model,
        "tools": tools,
        "prompt": "what is 1 + 2?",
        "system": "You are terse.",
        "parameters": {"temperature": 0},
        "max_turns": 5,
    }
    kwargs.update(overrides)
    return await run_agent_session(world, **kwargs)


def _events(world: World) -> list[Event]:
    return world.read_stream(session_stream_id(RUN, STEP, 1))


def _names(events: list[Event]) -> list[str]:
    return [e.wire_name for e in events]


# ------------------------------------------------------------------ recording


async def test_records_every_call_in_order_with_message_deltas(world: World) -> None:
    ledger: list[tuple[str, str, dict[str, Any]]] = []
    model = _model()
    outcome = await _run(world, model, _tools(ledger))

    assert outcome.output == "the answer is 3"
    assert outcome.turns == 3
    assert (outcome.model_calls_made, outcome.tool_calls_made) == (3, 3)
    assert (outcome.replayed_model_calls, outcome.replayed_tool_calls) == (0, 0)
    assert model.calls == 3
    assert sorted(c for c, _, _ in ledger) == ["c1", "c2", "c3"]

    events = _events(world)
    names = _names(events)
    assert names[:3] == [
        "harness.session.started",
        "harness.model.called",
        "harness.model.responded",
    ]
    assert names[3:5] == ["harness.tool_call.started"] * 2
    assert sorted(names[5:7]) == ["harness.tool_call.succeeded"] * 2
    assert names[7:] == [
        "harness.model.called",
        "harness.model.responded",
        "harness.tool_call.started",
        "harness.tool_call.succeeded",
        "harness.model.called",
        "harness.model.responded",
        "harness.session.completed",
    ]

    called = [e for e in events if isinstance(e, ModelCalled)]
    assert [c.turn for c in called] == [1, 2, 3]
    # Turn 1 stores the system and user prompts; a later turn's messages (the
    # previous response and its tool results) are implied by their own events.
    assert [m.role for m in called[0].messages] == ["system", "user"]
    assert [(c.implied, c.messages) for c in called] == [(0, called[0].messages), (3, ()), (2, ())]
    deltas = sent_messages(events)
    assert [m.role for m in deltas[1]] == ["system", "user"]
    assert [m.role for m in deltas[2]] == ["assistant", "tool", "tool"]
    assert [m.role for m in deltas[3]] == ["assistant", "tool"]
    assert deltas[2][1].content == "value of alpha"
    assert deltas[3][1].content == "3"
    # The deltas concatenated are exactly the conversation each model call was sent.
    sent = [r.messages for r in model.requests]
    assert sent[2] == deltas[1] + deltas[2] + deltas[3]
    assert outcome.conversation == sent[2] + (outcome.conversation[-1],)
    # The hash chain covers the whole conversation up to each call.
    h = ""
    for c in called:
        h = conversation_hash(h, deltas[c.turn])
        assert c.conversation_hash == h

    started = [e for e in events if isinstance(e, ToolCallStarted)]
    assert [(s.turn, s.call_id, s.name, s.args) for s in started] == [
        (1, "c1", "lookup", {"key": "alpha"}),
        (1, "c2", "lookup", {"key": "beta"}),
        (2, "c3", "add", {"a": 1, "b": 2}),
    ]
    results = {e.call_id: e.result for e in events if isinstance(e, ToolCallSucceeded)}
    assert results == {"c1": "value of alpha", "c2": "value of beta", "c3": 3}
    responded = [e for e in events if isinstance(e, ModelResponded)]
    assert {r.step_path for r in responded} == {STEP}

    first = events[0]
    assert isinstance(first, SessionStarted)
    manifest, manifest_hash = compute_manifest(
        model, _tools([]), "You are terse.", {"temperature": 0}, 5, "what is 1 + 2?"
    )
    assert first.manifest["prompt_sha256"] == hashlib.sha256(b"what is 1 + 2?").hexdigest()
    assert (first.run_id, first.step_path, first.attempt) == (RUN, STEP, 1)
    assert (first.manifest, first.manifest_hash) == (manifest, manifest_hash)


async def test_each_call_is_committed_before_it_is_made(world: World) -> None:
    """Write-ahead: the model and the tools read the store itself when they are invoked."""
    session_id = session_stream_id(RUN, STEP, 1)
    seen: list[str] = []

    def committed() -> list[Event]:
        return world.read_stream(session_id)

    def respond(request: ModelRequest) -> ScriptedReply:
        turn = 1 + sum(1 for m in request.messages if m.role == "assistant")
        events = committed()
        calls = [e for e in events if isinstance(e, ModelCalled) and e.turn == turn]
        assert len(calls) == 1, f"turn {turn} was not committed before the call"
        # Every result the model is about to see is in the log too.
        started = {e.call_id for e in events if isinstance(e, ToolCallStarted)}
        finished = {e.call_id for e in events if isinstance(e, ToolCallSucceeded | ToolCallFailed)}
        assert started == finished, f"turn {turn}: results of {started - finished} not committed"
        seen.append(f"model {turn}")
        return SCRIPT[turn - 1]

    async def lookup(key: str, ctx: ToolContext) -> str:
        """Look a key up."""
        events = committed()
        assert any(isinstance(e, ToolCallStarted) and e.call_id == ctx.call_id for e in events)
        assert isinstance(events[-1], ToolCallStarted | ToolCallSucceeded)
        seen.append(f"tool {ctx.call_id}")
        return key

    async def add(a: int, b: int, ctx: ToolContext) -> int:
        """Add two integers."""
        assert any(isinstance(e, ToolCallStarted) and e.call_id == ctx.call_id for e in committed())
        seen.append(f"tool {ctx.call_id}")
        return a + b

    outcome = await _run(world, _model(None, respond=respond), [tool(lookup), tool(add)])
    assert outcome.output == "the answer is 3"
    assert seen == ["model 1", "tool c1", "tool c2", "model 2", "tool c3", "model 3"]
    assert isinstance(committed()[-1], SessionCompleted)


async def test_usage_is_rolled_up_from_the_responses(world: World) -> None:
    outcome = await _run(world, _model(), _tools([]))
    expected = Usage(input_tokens=420, output_tokens=23, cached_input_tokens=20, reasoning_tokens=3)
    assert outcome.usage == expected
    completed = _events(world)[-1]
    assert isinstance(completed, SessionCompleted)
    assert (completed.usage, completed.turns, completed.output) == (expected, 3, "the answer is 3")


async def test_model_request_carries_the_whole_conversation_tools_and_parameters(
    world: World,
) -> None:
    model = _model()
    tools = _tools([])
    await _run(world, model, tools, parameters={"temperature": 0.5, "seed": 7})
    request = model.requests[1]
    assert isinstance(request, ModelRequest)
    assert [m.role for m in request.messages] == ["system", "user", "assistant", "tool", "tool"]
    assert request.tools == tuple(t.spec for t in tools)
    assert request.parameters == {"temperature": 0.5, "seed": 7}


async def test_tool_messages_follow_the_response_order_not_the_completion_order(
    world: World,
) -> None:
    async def slow(ctx: ToolContext) -> str:
        """Answer late."""
        await asyncio.sleep(0.05)
        return "slow"

    async def fast(ctx: ToolContext) -> str:
        """Answer early."""
        return "fast"

    model = _model(
        [
            ScriptedReply(tool_calls=(_call("a", "slow"), _call("b", "fast"))),
            ScriptedReply(content="ok"),
        ]
    )
    outcome = await _run(world, model, [tool(slow), tool(fast)])
    terminals = [e.call_id for e in _events(world) if isinstance(e, ToolCallSucceeded)]
    assert terminals == ["b", "a"]
    tool_messages = [m for m in outcome.conversation if m.role == "tool"]
    assert [(m.tool_call_id, m.content) for m in tool_messages] == [("a", "slow"), ("b", "fast")]


async def test_tool_calls_of_one_response_run_concurrently(world: World) -> None:
    both_running = asyncio.Event()
    running = 0

    async def wait_for_peer(ctx: ToolContext) -> str:
        """Finish only once the other call is running too."""
        nonlocal running
        running += 1
        if running == 2:
            both_running.set()
        await asyncio.wait_for(both_running.wait(), timeout=5)
        return "met"

    model = _model(
        [
            ScriptedReply(tool_calls=(_call("a", "wait_for_peer"), _call("b", "wait_for_peer"))),
            ScriptedReply(content="ok"),
        ]
    )
    outcome = await _run(world, model, [tool(wait_for_peer)])
    assert outcome.output == "ok"
    assert [m.content for m in outcome.conversation if m.role == "tool"] == ["met", "met"]


async def test_tool_failures_are_recorded_and_shown_to_the_model(world: World) -> None:
    async def explode(ctx: ToolContext) -> str:
        """Always fail."""
        raise RuntimeError("disk on fire")

    model = _model(
        [
            ScriptedReply(
                tool_calls=(
                    _call("u", "no_such_tool"),
                    _call("v", "add", a="one", b=2),
                    _call("x", "explode"),
                    _call("ok", "add", a=2, b=2),
                )
            ),
            ScriptedReply(content="recovered"),
        ]
    )
    tools = [*_tools([]), tool(explode)]
    outcome = await _run(world, model, tools)
    assert outcome.output == "recovered"
    failed = {e.call_id: e.error for e in _events(world) if isinstance(e, ToolCallFailed)}
    assert set(failed) == {"u", "v", "x"}
    assert failed["u"].type == "ToolError" and "no_such_tool" in failed["u"].message
    assert failed["v"].type == "ToolArgumentsError" and "a: Input should be" in failed["v"].message
    assert (failed["x"].type, failed["x"].message) == ("RuntimeError", "disk on fire")
    seen = {m.tool_call_id: m.content for m in model.requests[1].messages if m.role == "tool"}
    assert seen["u"] is not None and seen["u"].startswith("error: ToolError: no tool named")
    assert seen["x"] == "error: RuntimeError: disk on fire"
    assert seen["ok"] == "4"
    assert outcome.tool_calls_made == 4


async def test_duplicate_call_ids_across_turns_are_recorded_uniquely(world: World) -> None:
    """Some local models answer call_0 every turn; the session must still tell them apart."""
    ledger: list[tuple[str, str, dict[str, Any]]] = []
    script = [
        ScriptedReply(tool_calls=(_call("call_0", "add", a=1, b=1),)),
        ScriptedReply(tool_calls=(_call("call_0", "add", a=2, b=2),)),
        ScriptedReply(
            tool_calls=(_call("call_0", "add", a=3, b=3), _call("call_0#t3", "add", a=4, b=4))
        ),
        ScriptedReply(content="done"),
    ]
    outcome = await _run(world, _model(script), _tools(ledger))
    started = [e for e in _events(world) if isinstance(e, ToolCallStarted)]
    recorded = [s.call_id for s in started]
    assert recorded == ["call_0", "call_0#t2", "call_0#t3", "call_0#t3#t3"]
    assert len(set(recorded)) == len(recorded)
    # The tools were told the recorded ids (their idempotency keys differ)...
    assert [c for c, _, _ in sorted(ledger, key=lambda e: e[2]["a"])] == recorded
    # ...and the conversation keeps the model's ids, so each tool message answers its call.
    tool_ids = [m.tool_call_id for m in outcome.conversation if m.role == "tool"]
    assert tool_ids == ["call_0", "call_0", "call_0", "call_0#t3"]
    assert [m.content for m in outcome.conversation if m.role == "tool"] == ["2", "4", "6", "8"]

    again = await _run(world, _model(script), _tools(ledger))
    assert again.conversation == outcome.conversation
    assert (again.model_calls_made, again.tool_calls_made) == (0, 0)
    assert again.replayed_tool_calls == 4


async def test_turn_limit_raises_and_records_nothing_misleading(world: World) -> None:
    looping = [ScriptedReply(tool_calls=(_call(f"c{i}", "add", a=i, b=i),)) for i in range(5)]
    with pytest.raises(TurnLimitExceededError, match=r"max_turns=2") as info:
        await _run(world, _model(looping), _tools([]), max_turns=2)
    assert RUN in str(info.value) and STEP in str(info.value)
    # Not "raise max_turns and resume": max_turns is in the manifest, so that resume is drift.
    assert "a higher max_turns in a new run" in str(info.value)
    assert "refused as drift" in str(info.value)
    events = _events(world)
    assert not any(isinstance(e, SessionCompleted) for e in events)
    assert [e.turn for e in events if isinstance(e, ModelCalled)] == [1, 2]
    assert [e.call_id for e in events if isinstance(e, ToolCallStarted)] == ["c0"]
    assert _names(events)[-1] == "harness.model.responded"
    assert TurnLimitExceededError.retryable is False


# -------------------------------------------------------------------- resume


async def test_resume_after_a_crash_in_a_tool_replays_and_reruns_only_that_call(
    world: World,
) -> None:
    ledger: list[tuple[str, str, dict[str, Any]]] = []
    first_model = _model()
    with pytest.raises(_Crash):
        await _run(world, first_model, _tools(ledger, crash_on=frozenset({"c3"})))
    assert first_model.calls == 2
    assert _names(_events(world))[-1] == "harness.tool_call.started"

    model = _model()
    outcome = await _run(world, model, _tools(ledger))
    assert model.calls == 1  # only turn 3: turns 1 and 2 replay from the log
    assert (outcome.model_calls_made, outcome.replayed_model_calls) == (1, 2)
    assert (outcome.tool_calls_made, outcome.replayed_tool_calls) == (1, 2)
    assert [c for c, _, _ in ledger].count("c3") == 2  # crashed once, re-run once
    assert ledger[-1] == ("c3", "add", {"a": 1, "b": 2})
    assert outcome.output == "the answer is 3"

    events = _events(world)
    assert [e.turn for e in events if isinstance(e, ModelCalled)] == [1, 2, 3]
    assert [e.call_id for e in events if isinstance(e, ToolCallStarted)] == ["c1", "c2", "c3"]

    fresh = memory_world()
    with fresh:
        reference = await _run(fresh, _model(), _tools([]))
    assert outcome.conversation == reference.conversation
    assert outcome.usage == reference.usage


async def test_resume_after_a_crash_in_the_model_reinvokes_only_that_turn(world: World) -> None:
    def crash_on_turn_3(request: ModelRequest) -> ScriptedReply:
        turn = 1 + sum(1 for m in request.messages if m.role == "assistant")
        if turn == 3:
            raise _Crash
        return SCRIPT[turn - 1]

    first_model = _model(None, respond=crash_on_turn_3)
    with pytest.raises(_Crash):
        await _run(world, first_model, _tools([]))
    assert _names(_events(world))[-1] == "harness.model.called"

    model = _model()
    outcome = await _run(world, model, _tools([]))
    assert model.calls == 1
    # Re-invoked with exactly what the crashed call was sent.
    assert model.requests[0] == first_model.requests[-1]
    assert (outcome.replayed_model_calls, outcome.replayed_tool_calls) == (2, 3)
    assert (outcome.model_calls_made, outcome.tool_calls_made) == (1, 0)
    # No second harness.model.called for the in-flight turn.
    assert [e.turn for e in _events(world) if isinstance(e, ModelCalled)] == [1, 2, 3]


async def test_in_flight_turn_may_diverge_and_its_new_tool_calls_run(world: World) -> None:
    def crash_on_turn_2(request: ModelRequest) -> ScriptedReply:
        if sum(1 for m in request.messages if m.role == "assistant") == 1:
            raise _Crash
        return SCRIPT[0]

    with pytest.raises(_Crash):
        await _run(world, _model(None, respond=crash_on_turn_2), _tools([]))
    different = [
        SCRIPT[0],
        ScriptedReply(tool_calls=(_call("c9", "add", a=20, b=22),)),
        ScriptedReply(content="42"),
    ]
    ledger: list[tuple[str, str, dict[str, Any]]] = []
    outcome = await _run(world, _model(different), _tools(ledger))
    assert outcome.output == "42"
    assert ledger == [("c9", "add", {"a": 20, "b": 22})]


async def test_model_errors_propagate_and_leave_the_turn_to_be_called_again(
    world: World,
) -> None:
    for retryable in (True, False):

        def fail(request: ModelRequest, retryable: bool = retryable) -> ScriptedReply:
            raise ModelError("provider down", retryable=retryable, provider="acme")

        # A retryable one is a stop once the step's tries (here one) ran out: the error
        # the provider gave is kept.
        with pytest.raises(ModelUnavailableError if retryable else ModelError) as info:
            await _run(world, _model(None, respond=fail), _tools([]))
        error = info.value.error if isinstance(info.value, ModelUnavailableError) else info.value
        assert isinstance(error, ModelError) and error.retryable is retryable
    events = _events(world)
    assert _names(events) == ["harness.session.started", "harness.model.called"]
    outcome = await _run(world, _model(), _tools([]))
    assert outcome.model_calls_made == 3 and outcome.output == "the answer is 3"


async def test_a_completed_session_returns_its_outcome_without_any_call(world: World) -> None:
    first = await _run(world, _model(), _tools([]))
    versions = len(_events(world))
    model = _model()
    ledger: list[tuple[str, str, dict[str, Any]]] = []
    again = await _run(world, model, _tools(ledger))
    assert model.calls == 0 and ledger == []
    assert (again.model_calls_made, again.tool_calls_made) == (0, 0)
    assert (again.replayed_model_calls, again.replayed_tool_calls) == (3, 3)
    assert again == first.model_copy(
        update={
            "model_calls_made": 0,
            "tool_calls_made": 0,
            "replayed_model_calls": 3,
            "replayed_tool_calls": 3,
        }
    )
    assert len(_events(world)) == versions


async def test_another_attempt_is_another_session(world: World) -> None:
    one = await _run(world, _model(), _tools([]))
    two = await _run(world, _model(), _tools([]), attempt=2)
    assert one.session_id != two.session_id
    assert two.model_calls_made == 3
    assert two.session_id == session_stream_id(RUN, STEP, 2)


async def test_a_changed_prompt_is_refused_on_resume(world: World) -> None:
    with pytest.raises(_Crash):
        await _run(world, _model(), _tools([], crash_on=frozenset({"c3"})))
    before = len(_events(world))
    model = _model()
    with pytest.raises(CapabilityDriftError, match=r"prompt changed") as info:
        await _run(world, model, _tools([]), prompt="what is 2 + 2?")
    assert RUN in str(info.value) and STEP in str(info.value)
    assert len(_events(world)) == before and model.calls == 0


async def test_a_session_recorded_without_the_prompt_resumes_and_its_chain_guards_it(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A session started before the prompt was in the manifest (the old code is
    simulated by leaving the prompt out): the missing key means "not recorded"."""
    with monkeypatch.context() as old_code:
        old_code.setattr(
            session_module,
            "compute_manifest",
            lambda *args: compute_manifest(*args[:5]),  # the manifest as it was: no prompt
        )
        with pytest.raises(_Crash):
            await _run(world, _model(), _tools([], crash_on=frozenset({"c3"})))
    first = _events(world)[0]
    assert isinstance(first, SessionStarted) and "prompt_sha256" not in first.manifest
    before = len(_events(world))
    # A changed prompt is still refused before any call, by the conversation chain.
    with pytest.raises(ConversationDivergedError, match=r"turn 1"):
        await _run(world, _model(), _tools([]), prompt="what is 2 + 2?")
    assert len(_events(world)) == before
    ledger: list[tuple[str, str, dict[str, Any]]] = []
    model = _model()
    outcome = await _run(world, model, _tools(ledger))
    assert outcome.output == "the answer is 3"
    assert [c for c, _, _ in ledger] == ["c3"] and model.calls == 1


async def test_a_model_whose_settings_changed_is_refused_and_one_recorded_before_resumes(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(_Crash):
        await _run(world, _TunedModel({"temperature": 0}), _tools([], crash_on=frozenset({"c3"})))
    first = _events(world)[0]
    assert isinstance(first, SessionStarted)
    assert first.manifest["request_settings"] == {"temperature": 0}
    before = len(_events(world))
    model = _TunedModel({"temperature": 1.5})
    with pytest.raises(CapabilityDriftError, match="request setting 'temperature' changed"):
        await _run(world, model, _tools([]))
    assert len(_events(world)) == before and model.calls == 0

    # A session started before the settings were pinned has no such key: not compared.
    with monkeypatch.context() as old_code:

        def unpinned(*args: Any) -> Any:
            manifest, _ = compute_manifest(*args)
            del manifest["request_settings"]
            return manifest, hashlib.sha256(canonical_json(manifest)).hexdigest()

        old_code.setattr(session_module, "compute_manifest", unpinned)
        with pytest.raises(_Crash):
            await _run(
                world,
                _TunedModel({"temperature": 0}),
                _tools([], crash_on=frozenset({"c3"})),
                attempt=2,
            )
    outcome = await _run(world, _TunedModel({"temperature": 1.5}), _tools([]), attempt=2)
    assert outcome.output == "the answer is 3"


async def test_an_edited_manifest_body_is_refused_though_its_hash_is_unchanged(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _run(world, _model(), _tools([]))
    session_id = session_stream_id(RUN, STEP, 1)
    events = world.read_stream(session_id)
    started = events[0]
    assert isinstance(started, SessionStarted)
    edited = started.model_copy(update={"manifest": {**started.manifest, "max_turns": 50}})
    forged = HarnessSession.from_events(session_id, [edited, *events[1:]])
    monkeypatch.setattr(world, "load_session", lambda _id: forged)
    with pytest.raises(CapabilityDriftError, match=r"the log was altered"):
        await _run(world, _model(), _tools([]))


async def test_a_tampered_result_is_detected_at_the_next_turn(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Replayed history that does not hash to the recorded chain is refused, not trusted."""
    with pytest.raises(_Crash):
        await _run(world, _model(), _tools([], crash_on=frozenset({"c3"})))
    session_id = session_stream_id(RUN, STEP, 1)
    forged = HarnessSession.from_events(
        session_id,
        [
            e.model_copy(update={"result": "forged"})
            if isinstance(e, ToolCallSucceeded) and e.call_id == "c1"
            else e
            for e in world.read_stream(session_id)
        ],
    )
    # The session as a corrupted log would read back.
    monkeypatch.setattr(world, "load_session", lambda _id: forged)
    with pytest.raises(ConversationDivergedError, match=r"turn 2"):
        await _run(world, _model(), _tools([]))


# --------------------------------------------------------------------- drift


def _lookup_v2() -> list[Tool]:
    async def lookup(key: str, limit: int, ctx: ToolContext) -> str:
        """Look a key up."""
        return key

    return [tool(lookup), _tools([])[1]]


def _with_search() -> list[Tool]:
    async def search(query: str) -> str:
        """Search."""
        return query

    return [*_tools([]), tool(search)]


class _TunedModel(ScriptedModel):
    """A model that sends settings of its own with every request (as the provider
    adapters' ``parameters``): they are pinned as its ``request_settings``."""

    def __init__(self, settings: dict[str, Any]) -> None:
        super().__init__(SCRIPT, provider="acme", model_id="acme-1")
        self.request_settings = settings


ORIGINAL: dict[str, Any] = {
    "system": "You are terse.",
    "parameters": {"temperature": 0},
    "max_turns": 5,
}
DRIFTS: list[tuple[str, Callable[[], dict[str, Any]], str]] = [
    (
        "provider",
        lambda: {"model": ScriptedModel(SCRIPT, provider="other", model_id="acme-1")},
        "provider changed from 'acme' to 'other'",
    ),
    (
        "model id",
        lambda: {"model": ScriptedModel(SCRIPT, provider="acme", model_id="acme-2")},
        "model_id changed from 'acme-1' to 'acme-2'",
    ),
    ("system prompt", lambda: {"system": "You are chatty."}, "system prompt changed"),
    ("system prompt removed", lambda: {"system": None}, "system prompt removed"),
    ("tool added", lambda: {"tools": _with_search()}, "tool 'search' added"),
    ("tool removed", lambda: {"tools": _tools([])[1:]}, "tool 'lookup' removed"),
    ("tool schema", lambda: {"tools": _lookup_v2()}, "tool 'lookup' schema changed"),
    (
        "parameters",
        lambda: {"parameters": {"temperature": 0.7}},
        "parameter 'temperature' changed from 0 to 0.7",
    ),
    (
        "parameter added",
        lambda: {"parameters": {"temperature": 0, "seed": 1}},
        "parameter 'seed' added",
    ),
    (
        "model settings",
        lambda: {"model": _TunedModel({"temperature": 1.5})},
        "request setting 'temperature' added",
    ),
    ("max_turns", lambda: {"max_turns": 9}, "max_turns changed from 5 to 9"),
    ("prompt", lambda: {"prompt": "what is 2 + 2?"}, "prompt changed"),
]


@pytest.mark.parametrize(("label", "change", "expected"), DRIFTS, ids=[d[0] for d in DRIFTS])
async def test_each_manifest_change_is_capability_drift(
    world: World, label: str, change: Callable[[], dict[str, Any]], expected: str
) -> None:
    with pytest.raises(_Crash):
        await _run(world, _model(), _tools([], crash_on=frozenset({"c3"})))
    before = len(_events(world))
    inputs = {"model": _model(), "tools": _tools([]), **ORIGINAL, **change()}
    with pytest.raises(CapabilityDriftError) as info:
        await _run(world, **inputs)
    message = str(info.value)
    assert f"run {RUN!r} step {STEP!r} (attempt 1)" in message
    listed = message.split("since its harness session started: ", 1)[1].split(". The recorded")[0]
    assert listed == expected  # exactly the one change, nothing else
    assert len(_events(world)) == before  # nothing was appended, nothing was called

    # The runtime's pre-scheduling check says the same, reading the first event only.
    with pytest.raises(CapabilityDriftError, match=re.escape(expected)):
        assert_session_manifest_consistent(world, run_id=RUN, step_path=STEP, attempt=1, **inputs)


async def test_several_changes_are_all_named(world: World) -> None:
    await _run(world, _model(), _tools([]))
    with pytest.raises(CapabilityDriftError) as info:
        await _run(
            world,
            ScriptedModel(SCRIPT, provider="acme", model_id="acme-2"),
            _with_search(),
            system=None,
        )
    message = str(info.value)
    for change in ("model_id changed", "system prompt removed", "tool 'search' added"):
        assert change in message


async def test_unchanged_agent_and_reordered_tools_are_not_drift(world: World) -> None:
    with pytest.raises(_Crash):
        await _run(world, _model(), _tools([], crash_on=frozenset({"c3"})))
    tools = list(reversed(_tools([])))
    assert_session_manifest_consistent(
        world,
        run_id=RUN,
        step_path=STEP,
        attempt=1,
        model=_model(),
        tools=tools,
        system="You are terse.",
        parameters={"temperature": 0},
        max_turns=5,
    )
    outcome = await _run(world, _model(), tools)
    assert outcome.output == "the answer is 3"


def test_manifest_check_without_a_session_does_nothing() -> None:
    with memory_world() as w:
        assert_session_manifest_consistent(
            w, run_id=RUN, step_path=STEP, attempt=1, model=_model(), tools=[]
        )


def test_manifest_contents_and_hash() -> None:
    tools = _tools([])
    manifest, manifest_hash = compute_manifest(_model(), tools, "sys", {"t": 1}, 3)
    assert manifest["provider"] == "acme" and manifest["model_id"] == "acme-1"
    assert manifest["tools"] == [
        {"name": "add", "schema_hash": tools[1].schema_hash},
        {"name": "lookup", "schema_hash": tools[0].schema_hash},
    ]
    assert manifest["parameters"] == {"t": 1} and manifest["max_turns"] == 3
    assert manifest["system_prompt_sha256"] == hashlib.sha256(b"sys").hexdigest()
    canonical = orjson.dumps(manifest, option=orjson.OPT_SORT_KEYS)
    assert manifest_hash == hashlib.sha256(canonical).hexdigest()
    assert "prompt_sha256" not in manifest  # no prompt given: not pinned
    with_prompt, _ = compute_manifest(_model(), tools, "sys", {"t": 1}, 3, "go")
    assert with_prompt == {**manifest, "prompt_sha256": hashlib.sha256(b"go").hexdigest()}
    assert compute_manifest(_model(), list(reversed(tools)), "sys", {"t": 1}, 3)[1] == manifest_hash


# ------------------------------------------------------------------ log size


async def test_log_bytes_per_turn_stay_flat_as_the_conversation_grows(world: World) -> None:
    turns = 60
    filler = "x" * 200

    def respond(request: ModelRequest) -> ScriptedReply:
        turn = 1 + sum(1 for m in request.messages if m.role == "assistant")
        if turn == turns:
            return ScriptedReply(content="done")
        return ScriptedReply(
            content=f"thinking {filler}", tool_calls=(_call(f"k{turn}", "echo", text=filler),)
        )

    async def echo(text: str) -> str:
        """Echo the text."""
        return text

    model = ScriptedModel(respond=respond, provider="acme", model_id="acme-1")
    await _run(world, model, [tool(echo)], max_turns=turns)

    session_id = session_stream_id(RUN, STEP, 1)
    stored = world.select_stored(session_id)
    events = world.read_stream(session_id)
    turn_of_call = {e.call_id: e.turn for e in events if isinstance(e, ToolCallStarted)}
    per_turn: dict[int, int] = {}
    for row, event in zip(stored, events, strict=True):
        turn = getattr(event, "turn", None) or turn_of_call.get(getattr(event, "call_id", ""))
        if turn is not None:
            per_turn[turn] = per_turn.get(turn, 0) + len(row.state)
    prompt_bytes = [len(orjson.dumps([m.model_dump() for m in r.messages])) for r in model.requests]
    assert prompt_bytes[49] > 4 * prompt_bytes[9]  # the conversation really grows
    for turn in (20, 30, 50):
        assert abs(per_turn[turn] - per_turn[10]) <= 0.1 * per_turn[10], per_turn


# ---------------------------------------------------------------- validation


BAD_INPUTS: list[tuple[dict[str, Any], type[Exception], str]] = [
    ({"run_id": "../etc"}, InvalidRunIdError, "may only contain"),
    ({"step_path": ""}, SessionInputError, "step_path"),
    ({"attempt": 0}, SessionInputError, "attempt"),
    ({"attempt": True}, SessionInputError, "attempt"),
    ({"prompt": ""}, SessionInputError, "prompt"),
    ({"max_turns": 0}, SessionInputError, "max_turns"),
    ({"system": 3}, SessionInputError, "system"),
    ({"parameters": {"t": float("nan")}}, SessionInputError, "NaN"),
    ({"parameters": {"when": object()}}, SessionInputError, "not plain JSON"),
    ({"parameters": ["t"]}, SessionInputError, "mapping"),
    ({"model": object()}, SessionInputError, "complete"),
    ({"tools": [tool(lambda: 1, name="x"), tool(lambda: 2, name="x")]}, ToolError, "two tools"),
]


@pytest.mark.parametrize(("change", "error", "match"), BAD_INPUTS)
async def test_invalid_inputs_are_refused_before_anything_is_recorded(
    change: dict[str, Any], error: type[Exception], match: str
) -> None:
    with memory_world() as w:
        kwargs: dict[str, Any] = {"model": _model(), "tools": _tools([]), **change}
        with pytest.raises(error, match=match):
            await _run(w, **kwargs)
        assert w.load_session(session_stream_id(RUN, STEP, 1)) is None


def test_model_without_provider_is_refused() -> None:
    class Nameless:
        provider = ""
        model_id = "m"

        async def complete(self, request: ModelRequest) -> None:
            """Never called."""

    with pytest.raises(SessionInputError, match="provider"):
        compute_manifest(Nameless(), [], None, None, 1)  # type: ignore[arg-type]

"""AnthropicModel against a real local HTTP server speaking the Anthropic Messages protocol.

Requests go through the official ``anthropic`` client to ``tests/_anthropic_support.py``'s
server; the kill tests run the workflow in a child process, SIGKILL it mid-turn and
resume it in another, counting the requests the server received per turn.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import anthropic
import pytest
from _anthropic_support import (
    API_KEY,
    MODEL,
    RUN_ID,
    MessagesServer,
    error_body,
    message,
    run,
    start_server,
)

from little_es.contrib.anthropic import AnthropicModel
from little_es.errors import ModelConfigError, ModelError
from little_es.events import ModelResponded
from little_es.harness.tools import tool
from little_es.ids import session_stream_id
from little_es.pricing import get_model_info_for, price_usage_exact
from little_es.values import Message, ModelRequest, ToolCall, Usage
from little_es.world import local_world

_SUPPORT = Path(__file__).with_name("_anthropic_support.py")
_ROOT = Path(__file__).resolve().parents[1]
_HI = ModelRequest(messages=(Message(role="user", content="hi"),))


@pytest.fixture
def server() -> Iterator[MessagesServer]:
    state = MessagesServer()
    httpd = start_server(state)
    try:
        yield state
    finally:
        state.release.set()
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture
async def model(server: MessagesServer) -> AsyncIterator[AnthropicModel]:
    claude = AnthropicModel(
        MODEL, base_url=server.base_url, api_key=API_KEY, parameters={"temperature": 0.2}
    )
    try:
        yield claude
    finally:
        await claude.aclose()


@tool
def get_weather(city: str, days: int = 1) -> str:
    """Get the weather for a city."""
    return f"sunny in {city}"


def _reply(content: list[dict[str, Any]], stop: str = "end_turn", **usage: Any) -> dict[str, Any]:
    body = message(3, MODEL)
    body.update(content=content, stop_reason=stop)
    body["usage"] = {"input_tokens": 5, "output_tokens": 1, **usage}
    return body


# ---------------------------------------------------------------- the adapter


async def test_tool_use_then_text_round_trip(server: MessagesServer, model: AnthropicModel) -> None:
    conversation: tuple[Message, ...] = (
        Message(role="system", content="You answer about weather."),
        Message(role="user", content="Weather in Paris?", name="ana"),
    )
    first = await model.complete(
        ModelRequest(
            messages=conversation, tools=(get_weather.spec,), parameters={"temperature": 0.7}
        )
    )
    # Turn 1 of the script: text and two tool_use blocks.
    assert first.content == "Looking both up."
    assert first.tool_calls == (
        ToolCall(id="toolu_1", name="lookup", arguments={"key": "alpha"}),
        ToolCall(id="toolu_2", name="add", arguments={"a": 1, "b": 2}),
    )
    # Anthropic's 50 input tokens leave out the 2,000 written to the cache; ours include them.
    assert first.usage == Usage(input_tokens=2050, output_tokens=10, cache_write_tokens=2000)
    assert (first.provider, first.model) == ("anthropic", MODEL)

    conversation += (
        first.as_message(),
        Message(role="tool", tool_call_id="toolu_1", content="1"),
        Message(role="tool", tool_call_id="toolu_2", content="3"),
        Message(role="user", content="And now?"),
    )
    second = await model.complete(
        ModelRequest(messages=conversation, parameters={"max_tokens": 77})
    )
    assert second.content is None
    assert second.tool_calls == (ToolCall(id="toolu_3", name="add", arguments={"a": 40, "b": 2}),)
    assert second.usage == Usage(input_tokens=2100, output_tokens=20, cached_input_tokens=2000)

    assert dict(server.requests) == {1: 1, 2: 1}
    (path_one, headers, one), (path_two, _, two) = server.received
    assert path_one == path_two == "/v1/messages"
    assert API_KEY in (headers.get("x-api-key"), headers.get("authorization", "")[7:])
    assert "anthropic-version" in headers
    assert one["model"] == MODEL
    assert one["max_tokens"] == 4096  # required by the API: the constructor's default
    assert one["temperature"] == 0.7  # the request's parameter wins
    assert "stream" not in one
    assert one["system"] == "You answer about weather."
    assert one["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]}
    ]
    assert one["tools"] == [
        {
            "name": "get_weather",
            "description": "Get the weather for a city.",
            "input_schema": get_weather.spec.parameters,
        }
    ]
    assert (two["max_tokens"], two["temperature"]) == (77, 0.2)
    assert "tools" not in two
    # Tool results, and the user text after them, are one user turn.
    assert two["messages"][1:] == [
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Looking both up."},
                {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {"key": "alpha"}},
                {"type": "tool_use", "id": "toolu_2", "name": "add", "input": {"a": 1, "b": 2}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "1"},
                {"type": "tool_result", "tool_use_id": "toolu_2", "content": "3"},
                {"type": "text", "text": "And now?"},
            ],
        },
    ]


async def test_thinking_is_dropped_and_counted_in_reasoning_tokens(
    server: MessagesServer, model: AnthropicModel
) -> None:
    server.replies = [
        (
            200,
            _reply(
                [
                    {"type": "thinking", "thinking": "hmm", "signature": "sig"},
                    {"type": "text", "text": "4"},
                ],
                output_tokens=30,
                output_tokens_details={"thinking_tokens": 25},
                cache_read_input_tokens=7,
            ),
        )
    ]
    response = await model.complete(_HI)
    assert response.content == "4"
    assert response.usage == Usage(
        input_tokens=12, cached_input_tokens=7, output_tokens=30, reasoning_tokens=25
    )


@pytest.mark.parametrize(
    ("status", "retryable"),
    [
        (529, True),  # overloaded
        (429, True),
        (500, True),
        (409, True),
        (400, False),
        (401, False),
        (403, False),
        (404, False),
        (413, False),
    ],
)
async def test_http_errors_map_to_model_error(
    server: MessagesServer, model: AnthropicModel, status: int, retryable: bool
) -> None:
    server.replies = [(status, error_body(status))]
    with pytest.raises(ModelError) as info:
        await model.complete(_HI)
    error = info.value
    assert (error.retryable, error.status, error.provider) == (retryable, status, "anthropic")
    assert f"HTTP {status}" in str(error) and f"refused with {status}" in str(error)
    assert MODEL in str(error)
    assert isinstance(error.__cause__, anthropic.APIStatusError)
    # max_retries=0: the client made exactly one attempt, retrying is the runtime's call.
    assert len(server.received) == 1


async def test_connection_refused_is_retryable() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # The port is closed now: nothing listens there.
    dead = AnthropicModel(MODEL, base_url=f"http://127.0.0.1:{port}", api_key="k")
    try:
        with pytest.raises(ModelError) as info:
            await dead.complete(_HI)
    finally:
        await dead.aclose()
    assert (info.value.retryable, info.value.status) == (True, None)


@pytest.mark.parametrize(
    ("content", "stop", "match"),
    [
        ([{"type": "server_tool_use", "id": "s", "name": "web_search", "input": {}}], "end_turn",
         "content block of type 'server_tool_use'"),
        ([{"type": "text", "text": "..."}], "pause_turn", "pause_turn"),
        ([{"type": "tool_use", "id": "t", "name": "add", "input": {"a": 1}}], "max_tokens",
         "raise max_tokens"),
    ],
)  # fmt: skip
async def test_answers_that_cannot_be_used_are_not_retryable(
    server: MessagesServer, model: AnthropicModel, content: Any, stop: str, match: str
) -> None:
    server.replies = [(200, _reply(content, stop))]
    with pytest.raises(ModelError, match=match) as info:
        await model.complete(_HI)
    assert info.value.retryable is False


async def test_text_cut_at_max_tokens_is_returned(
    server: MessagesServer, model: AnthropicModel
) -> None:
    server.replies = [(200, _reply([{"type": "text", "text": "Once upon a"}], "max_tokens"))]
    assert (await model.complete(_HI)).content == "Once upon a"


async def test_a_client_passed_in_is_used_as_given(server: MessagesServer) -> None:
    async with anthropic.AsyncAnthropic(
        base_url=server.base_url, api_key="other-key", max_retries=0
    ) as client:
        proxied = AnthropicModel("claude-x", provider="my-proxy", client=client)
        response = await proxied.complete(_HI)
        await proxied.aclose()  # not ours: the client stays open
        assert not client.is_closed()
    # The answer names the model that answered.
    assert (response.provider, response.model) == ("my-proxy", "claude-x")


async def test_reserved_parameters_and_bad_messages_are_refused(
    server: MessagesServer, model: AnthropicModel
) -> None:
    for bad in ({"stream": True}, {"system": "x"}, {"max_tokens": 0}):
        with pytest.raises(ModelError) as info:
            await model.complete(ModelRequest(messages=_HI.messages, parameters=bad))
        assert info.value.retryable is False
        assert next(iter(bad)) in str(info.value)
    with pytest.raises(ModelError, match="tool message without tool_call_id"):
        await model.complete(ModelRequest(messages=(Message(role="tool", content="x"),)))
    assert server.received == []


async def test_a_max_tokens_the_client_will_not_send_is_not_retryable(
    server: MessagesServer, model: AnthropicModel
) -> None:
    # The client insists on streaming past ~10 minutes of expected output.
    with pytest.raises(ModelError, match="refused to send") as info:
        await model.complete(ModelRequest(messages=_HI.messages, parameters={"max_tokens": 10**6}))
    assert info.value.retryable is False
    assert server.received == []


def test_constructor_validates() -> None:
    with pytest.raises(ModelConfigError, match="model_id"):
        AnthropicModel("", api_key="k")
    with pytest.raises(ModelConfigError, match="must not set messages"):
        AnthropicModel("m", api_key="k", parameters={"messages": []})
    with pytest.raises(ModelConfigError, match="max_tokens"):
        AnthropicModel("m", api_key="k", max_tokens=0)
    with pytest.raises(ModelConfigError, match="not both"):
        AnthropicModel("m", api_key="k", client=anthropic.AsyncAnthropic(api_key="k"))


# ---------------------------------------------------------------- a workflow, its totals


def _expected_cost() -> Decimal:
    # The script's three turns: 50/100/150 uncached input, 2,000 written on turn 1 and
    # read on turns 2 and 3, 10/20/30 output; each kind at its own genai-prices rate.
    info = get_model_info_for("anthropic", MODEL)
    assert info is not None and info.cache_write_per_mtok and info.cached_input_per_mtok
    rate = {
        k: Decimal(str(v))
        for k, v in info.model_dump().items()
        if v is not None and k.endswith("_mtok")
    }
    return (
        300 * rate["input_per_mtok"]
        + 2000 * rate["cache_write_per_mtok"]
        + 4000 * rate["cached_input_per_mtok"]
        + 60 * rate["output_per_mtok"]
    ) / 1_000_000


async def test_a_workflow_totals_and_prices_the_cache_tokens(
    tmp_path: Path, server: MessagesServer
) -> None:
    outcome = await run(str(tmp_path / "world"), server.base_url, str(tmp_path / "ledger"))
    again = await run(str(tmp_path / "world"), server.base_url, str(tmp_path / "ledger"))
    assert outcome == again  # a completed run sends nothing more
    assert dict(server.requests) == {1: 1, 2: 1, 3: 1}
    assert outcome["output"] == "alpha is 1, 40 + 2 = 42"
    usage = outcome["usage"]
    assert (usage["input_tokens"], usage["cached_input_tokens"]) == (6300, 4000)
    assert (usage["cache_write_tokens"], usage["output_tokens"], usage["calls"]) == (2000, 60, 3)
    assert Decimal(usage["cost_usd_exact"]) == _expected_cost()
    # The same figure, call by call, as the pricing prices each recorded usage.
    with local_world(tmp_path / "world") as world:
        events = world.read_stream(session_stream_id(RUN_ID, "solve", 1))
    responded = [e for e in events if isinstance(e, ModelResponded)]
    assert [e.response.usage.cache_write_tokens for e in responded] == [2000, 0, 0]
    total = sum(
        price_usage_exact("anthropic", MODEL, e.response.usage) or Decimal(0) for e in responded
    )
    assert total == _expected_cost()
    # A count at its default is left out of the payload: a call without cache writes is
    # stored exactly as before the field existed.
    with sqlite3.connect(tmp_path / "world" / "events.sqlite3") as conn:
        rows = conn.execute(
            "SELECT state FROM little_es_rows WHERE topic = 'harness.model.responded'"
        ).fetchall()
    assert ['"cache_write_tokens"' in bytes(r[0]).decode("latin-1") for r in rows] == [
        True,
        False,
        False,
    ]
    # The parameter that asks Anthropic to cache the prompt went with every request.
    assert all(body["cache_control"] == {"type": "ephemeral"} for _, _, body in server.received)


# ---------------------------------------------------------------- killed mid-turn


def _child(args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("LITTLE_ES_CRASH_")}
    full = {**base, "PYTHONPATH": f"{_ROOT}{os.pathsep}{_ROOT / 'tests'}", **(env or {})}
    return subprocess.Popen(
        [sys.executable, str(_SUPPORT), *args],
        env=full,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def _ledger(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def _resume(tmp_path: Path, server: MessagesServer) -> dict[str, Any]:
    proc = _child([str(tmp_path / "world"), server.base_url, str(tmp_path / "ledger")])
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err.decode()
    result: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    return result


def _check_finished(result: dict[str, Any]) -> None:
    assert result["status"] == "completed"
    assert result["output"] == "alpha is 1, 40 + 2 = 42"
    # Only the recorded responses count: a request lost with the killed process is not paid.
    usage = result["usage"]
    assert (usage["calls"], usage["cache_write_tokens"], usage["cached_input_tokens"]) == (
        3,
        2000,
        4000,
    )
    assert Decimal(usage["cost_usd_exact"]) == _expected_cost()


def test_kill_while_the_second_request_is_in_flight(tmp_path: Path, server: MessagesServer) -> None:
    server.hold_turn = 2
    proc = _child([str(tmp_path / "world"), server.base_url, str(tmp_path / "ledger")])
    try:
        deadline = time.monotonic() + 60
        while server.count(2) == 0:
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            assert time.monotonic() < deadline, "the second request never arrived"
            time.sleep(0.02)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    before = _ledger(tmp_path / "ledger")
    assert sorted(e["call"] for e in before) == ["toolu_1", "toolu_2"]
    server.hold_turn = None

    result = _resume(tmp_path, server)

    # Turn 1 was answered from the log; only the in-flight turn 2 was sent again.
    assert dict(server.requests) == {1: 1, 2: 2, 3: 1}
    after = _ledger(tmp_path / "ledger")
    assert sorted(e["call"] for e in after) == ["toolu_1", "toolu_2", "toolu_3"]
    assert {e["pid"] for e in after if e["call"] != "toolu_3"} == {proc.pid}
    _check_finished(result)


def test_kill_while_a_tool_runs_sends_no_request_again(
    tmp_path: Path, server: MessagesServer
) -> None:
    # Killed after toolu_3 ran and before its result was committed: turn 2's answer is
    # in the log, so the resume re-runs that tool only and asks the server nothing again.
    proc = _child(
        [str(tmp_path / "world"), server.base_url, str(tmp_path / "ledger")],
        {"LITTLE_ES_CRASH_BEFORE_EVENT": "harness.tool_call.succeeded:call_id=toolu_3"},
    )
    proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGKILL
    assert dict(server.requests) == {1: 1, 2: 1}
    assert [e["call"] for e in _ledger(tmp_path / "ledger")].count("toolu_3") == 1

    result = _resume(tmp_path, server)

    assert dict(server.requests) == {1: 1, 2: 1, 3: 1}
    calls = sorted(e["call"] for e in _ledger(tmp_path / "ledger"))
    assert calls == ["toolu_1", "toolu_2", "toolu_3", "toolu_3"]
    _check_finished(result)


def test_kill_right_after_a_response_is_committed_does_not_ask_again(
    tmp_path: Path, server: MessagesServer
) -> None:
    proc = _child(
        [str(tmp_path / "world"), server.base_url, str(tmp_path / "ledger")],
        {"LITTLE_ES_CRASH_AFTER_EVENT": "harness.model.responded:turn=1"},
    )
    proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGKILL
    assert dict(server.requests) == {1: 1}
    assert _ledger(tmp_path / "ledger") == []  # no tool had run yet

    result = _resume(tmp_path, server)

    assert dict(server.requests) == {1: 1, 2: 1, 3: 1}
    assert sorted(e["call"] for e in _ledger(tmp_path / "ledger")) == [
        "toolu_1",
        "toolu_2",
        "toolu_3",
    ]
    _check_finished(result)


def test_the_example_runs_offline_killed_and_resumed() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LITTLE_ES_CRASH_")}
    done = subprocess.run(
        [sys.executable, str(_ROOT / "examples" / "anthropic_agent.py")],
        env={**env, "PYTHONPATH": str(_ROOT)},
        cwd=_ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "child killed (exit -9)" in out
    assert "resumed=True" in out
    # Turn 2 was in flight when the child died: the only request sent twice.
    assert "requests the server received: turn 1: 1, turn 2: 2, turn 3: 1" in out
    total = next(line for line in out.splitlines() if line.strip().startswith("total"))
    # input (cache included), output, cached, reasoning, cache write, cost
    assert total.split()[1:6] == ["6,720", "120", "4,000", "0", "2,000"]
    assert "$" in total.split()[6]


async def test_an_answer_that_is_no_json_is_a_model_error_not_a_refusal_to_send(
    server: MessagesServer, model: AnthropicModel
) -> None:
    server.replies = [(200, b"<html><body>Sign in to the proxy</body></html>")]
    with pytest.raises(ModelError, match="the answer is not JSON") as info:
        await model.complete(_HI)
    assert info.value.retryable is False
    assert "refused to send" not in str(info.value)


def test_max_tokens_and_the_parameters_are_the_models_request_settings() -> None:
    claude = AnthropicModel("claude-x", api_key="k", parameters={"temperature": 0.2})
    assert claude.request_settings == {"max_tokens": 4096, "temperature": 0.2}
    capped = AnthropicModel("claude-x", api_key="k", max_tokens=100)
    assert capped.request_settings == {"max_tokens": 100}

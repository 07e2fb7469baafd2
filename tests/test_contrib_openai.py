"""OpenAIChatModel against a real local HTTP server speaking the chat-completions protocol."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import openai
import pytest

from little_es import ToolCallFailed, Workflow, agent, local_world, replay_run, run_workflow
from little_es.contrib.openai import OpenAIChatModel
from little_es.errors import ModelConfigError, ModelError
from little_es.harness.tools import read_arguments, tool
from little_es.values import Message, ModelRequest, ToolCall, Usage


@dataclass
class _Received:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


@dataclass
class ChatServer:
    """A chat-completions endpoint on 127.0.0.1 that answers from a queue."""

    base_url: str = ""
    replies: list[tuple[int, Any]] = field(default_factory=list)
    """(status, body): a dict sent as JSON, bytes as they are, or (body, headers)."""
    received: list[_Received] = field(default_factory=list)


def _completion(
    message: dict[str, Any], usage: dict[str, Any] | None, model: str
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
    }
    if usage is not None:
        body["usage"] = usage
    return body


@pytest.fixture
def chat_server() -> Iterator[ChatServer]:
    state = ChatServer()

    class Handler(BaseHTTPRequestHandler):
        # HTTP/1.0: every connection closes after its response, so no handler
        # thread outlives the test.
        protocol_version = "HTTP/1.0"

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            state.received.append(
                _Received(
                    path=self.path,
                    headers={k.lower(): v for k, v in self.headers.items()},
                    body=json.loads(self.rfile.read(length)),
                )
            )
            status, payload = (
                state.replies.pop(0)
                if state.replies
                else (500, {"error": {"message": "no reply scripted", "type": "server_error"}})
            )
            headers: dict[str, str] = {}
            if isinstance(payload, tuple):
                payload, headers = payload
            # Bytes are sent as they are: a proxy's page that says it is JSON.
            data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.02}, name="chat-server", daemon=True
    )
    thread.start()
    state.base_url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@pytest.fixture
async def model(chat_server: ChatServer) -> AsyncIterator[OpenAIChatModel]:
    chat_model = OpenAIChatModel(
        "gpt-test",
        base_url=chat_server.base_url,
        api_key="sk-local-test",
        parameters={"temperature": 0.2, "max_tokens": 100},
    )
    try:
        yield chat_model
    finally:
        await chat_model.aclose()


@tool
def get_weather(city: str, days: int = 1) -> str:
    """Get the weather for a city."""
    return f"sunny in {city}"


async def test_tool_call_then_text_round_trip(
    chat_server: ChatServer, model: OpenAIChatModel
) -> None:
    chat_server.replies = [
        (
            200,
            _completion(
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                        }
                    ],
                },
                {
                    "prompt_tokens": 50,
                    "completion_tokens": 12,
                    "total_tokens": 62,
                    "prompt_tokens_details": {"cached_tokens": 20},
                    "completion_tokens_details": {"reasoning_tokens": 4},
                },
                model="gpt-test-2024-01-01",
            ),
        ),
        (
            200,
            _completion(
                {"role": "assistant", "content": "It is sunny in Paris."},
                {"prompt_tokens": 80, "completion_tokens": 7, "total_tokens": 87},
                model="gpt-test-2024-01-01",
            ),
        ),
    ]
    conversation: tuple[Message, ...] = (
        Message(role="system", content="You answer about weather."),
        Message(role="user", content="Weather in Paris?", name="ana"),
    )
    first = await model.complete(
        ModelRequest(
            messages=conversation, tools=(get_weather.spec,), parameters={"temperature": 0.7}
        )
    )
    assert first.content is None
    assert first.tool_calls == (
        ToolCall(id="call_1", name="get_weather", arguments={"city": "Paris"}),
    )
    assert first.usage == Usage(
        input_tokens=50, output_tokens=12, cached_input_tokens=20, reasoning_tokens=4
    )
    assert (first.provider, first.model) == ("openai", "gpt-test-2024-01-01")

    conversation += (
        first.as_message(),
        Message(role="tool", tool_call_id="call_1", content="sunny in Paris"),
    )
    second = await model.complete(ModelRequest(messages=conversation, tools=(get_weather.spec,)))
    assert second.content == "It is sunny in Paris."
    assert second.tool_calls == ()
    assert second.usage == Usage(input_tokens=80, output_tokens=7)

    assert len(chat_server.received) == 2
    one, two = chat_server.received
    assert one.path == two.path == "/v1/chat/completions"
    assert one.headers["authorization"] == "Bearer sk-local-test"
    assert one.body["model"] == "gpt-test"
    assert one.body["temperature"] == 0.7  # the request's parameter wins
    assert one.body["max_tokens"] == 100  # the constructor's default stays
    assert "stream" not in one.body
    assert one.body["messages"] == [
        {"role": "system", "content": "You answer about weather."},
        {"role": "user", "content": "Weather in Paris?", "name": "ana"},
    ]
    assert one.body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Get the weather for a city.",
                "parameters": get_weather.spec.parameters,
            },
        }
    ]
    assert two.body["temperature"] == 0.2
    assert two.body["messages"][2:] == [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny in Paris"},
    ]


async def test_missing_usage_and_model_fall_back(
    chat_server: ChatServer, model: OpenAIChatModel
) -> None:
    chat_server.replies = [
        (200, _completion({"role": "assistant", "content": "ok"}, None, model=""))
    ]
    response = await model.complete(ModelRequest(messages=(Message(role="user", content="hi"),)))
    assert response.usage == Usage()
    assert response.model == "gpt-test"
    assert "tools" not in chat_server.received[0].body


@pytest.mark.parametrize(
    ("status", "retryable"),
    [
        (429, True),
        (500, True),
        (503, True),
        (409, True),
        (400, False),
        (401, False),
        (404, False),
        (422, False),
    ],
)
async def test_http_errors_map_to_model_error(
    chat_server: ChatServer, model: OpenAIChatModel, status: int, retryable: bool
) -> None:
    chat_server.replies = [(status, {"error": {"message": f"refused with {status}", "type": "x"}})]
    with pytest.raises(ModelError) as info:
        await model.complete(ModelRequest(messages=(Message(role="user", content="hi"),)))
    error = info.value
    assert (error.retryable, error.status, error.provider) == (retryable, status, "openai")
    assert f"HTTP {status}" in str(error)
    assert "gpt-test" in str(error)
    assert isinstance(error.__cause__, openai.APIStatusError)
    # max_retries=0: the client made exactly one attempt, retrying is the runtime's call.
    assert len(chat_server.received) == 1


@pytest.mark.parametrize(
    ("headers", "seconds"),
    [({"retry-after-ms": "1500"}, 1.5), ({"retry-after": "7"}, 7.0), ({}, None)],
)
async def test_a_refusal_says_how_long_the_provider_asked_to_wait(
    chat_server: ChatServer,
    model: OpenAIChatModel,
    headers: dict[str, str],
    seconds: float | None,
) -> None:
    body = {"error": {"message": "slow down", "type": "rate_limit"}}
    chat_server.replies = [(429, (body, headers))]
    with pytest.raises(ModelError) as info:
        await model.complete(ModelRequest(messages=(Message(role="user", content="hi"),)))
    assert info.value.retryable and info.value.retry_after == seconds


async def test_connection_refused_is_retryable() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # The port is closed now: nothing listens there.
    dead = OpenAIChatModel(
        "gpt-test", base_url=f"http://127.0.0.1:{port}/v1", api_key="k", provider="vllm"
    )
    try:
        with pytest.raises(ModelError) as info:
            await dead.complete(ModelRequest(messages=(Message(role="user", content="hi"),)))
    finally:
        await dead.aclose()
    assert (info.value.retryable, info.value.status, info.value.provider) == (True, None, "vllm")


async def test_arguments_that_are_no_json_are_kept_as_sent_not_an_error(
    chat_server: ChatServer, model: OpenAIChatModel
) -> None:
    calls = [
        {"id": f"call_{n}", "type": "function", "function": {"name": "get_weather", "arguments": a}}
        for n, a in enumerate(('{"city": Par', '["Paris"]'))
    ]
    chat_server.replies = [
        (200, _completion({"role": "assistant", "tool_calls": calls}, None, model="m"))
    ]
    response = await model.complete(ModelRequest(messages=(Message(role="user", content="hi"),)))
    assert response.tool_calls == (
        ToolCall(id="call_0", name="get_weather", unparsed_arguments='{"city": Par'),
        ToolCall(id="call_1", name="get_weather", unparsed_arguments='["Paris"]'),
    )
    # Sent back as the model wrote them: the conversation is the one it had.
    chat_server.replies = [(200, _completion({"role": "assistant", "content": "ok"}, None, "m"))]
    await model.complete(ModelRequest(messages=(response.as_message(),)))
    sent = chat_server.received[1].body["messages"][0]["tool_calls"]
    assert [c["function"]["arguments"] for c in sent] == ['{"city": Par', '["Paris"]']


async def test_empty_arguments_mean_no_arguments(
    chat_server: ChatServer, model: OpenAIChatModel
) -> None:
    call = {"id": "call_2", "type": "function", "function": {"name": "now", "arguments": ""}}
    chat_server.replies = [
        (200, _completion({"role": "assistant", "tool_calls": [call]}, None, model="m"))
    ]
    response = await model.complete(ModelRequest(messages=(Message(role="user", content="time?"),)))
    assert response.tool_calls == (ToolCall(id="call_2", name="now", arguments={}),)


async def test_a_client_passed_in_is_used_as_given(chat_server: ChatServer) -> None:
    chat_server.replies = [
        (200, _completion({"role": "assistant", "content": "hi"}, None, model="llama"))
    ]
    async with openai.AsyncOpenAI(
        base_url=chat_server.base_url, api_key="ollama", max_retries=0
    ) as client:
        ollama = OpenAIChatModel("llama3", provider="ollama", client=client)
        response = await ollama.complete(
            ModelRequest(messages=(Message(role="user", content="hi"),))
        )
        await ollama.aclose()  # not ours: the client stays open
        assert not client.is_closed()
    assert (response.provider, response.model) == ("ollama", "llama")
    assert chat_server.received[0].headers["authorization"] == "Bearer ollama"


async def test_reserved_parameters_are_refused(
    chat_server: ChatServer, model: OpenAIChatModel
) -> None:
    with pytest.raises(ModelError) as info:
        await model.complete(
            ModelRequest(
                messages=(Message(role="user", content="hi"),), parameters={"stream": True}
            )
        )
    assert info.value.retryable is False
    assert "stream" in str(info.value)
    with pytest.raises(ModelError, match="tool message without tool_call_id"):
        await model.complete(ModelRequest(messages=(Message(role="tool", content="x"),)))
    assert chat_server.received == []


def test_constructor_validates(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ModelConfigError, match="model_id"):
        OpenAIChatModel("", api_key="k")
    with pytest.raises(ModelConfigError, match="must not set messages"):
        OpenAIChatModel("m", api_key="k", parameters={"messages": []})
    with pytest.raises(ModelConfigError, match="not both"):
        OpenAIChatModel("m", api_key="k", client=openai.AsyncOpenAI(api_key="k"))
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(ModelConfigError, match="OPENAI_API_KEY"):
        OpenAIChatModel("m", base_url="http://127.0.0.1:9/v1")


async def test_an_answer_without_choices_is_not_retryable(
    chat_server: ChatServer, model: OpenAIChatModel
) -> None:
    chat_server.replies = [(200, {"object": "list", "data": []})]
    with pytest.raises(ModelError, match="no choices") as info:
        await model.complete(ModelRequest(messages=(Message(role="user", content="hi"),)))
    assert info.value.retryable is False


async def test_an_answer_that_is_no_json_is_a_model_error(
    chat_server: ChatServer, model: OpenAIChatModel
) -> None:
    chat_server.replies = [(200, b"<html><body>Sign in to the proxy</body></html>")]
    with pytest.raises(ModelError, match="the answer is not JSON") as info:
        await model.complete(ModelRequest(messages=(Message(role="user", content="hi"),)))
    assert info.value.retryable is False


async def test_an_integer_past_64_bits_in_the_arguments_is_kept_as_sent_not_rounded(
    chat_server: ChatServer, model: OpenAIChatModel
) -> None:
    text = '{"city": "Paris", "days": 1180591620717411303424}'
    call = {
        "id": "call_7",
        "type": "function",
        "function": {"name": "get_weather", "arguments": text},
    }
    chat_server.replies = [
        (200, _completion({"role": "assistant", "tool_calls": [call]}, None, model="m"))
    ]
    response = await model.complete(ModelRequest(messages=(Message(role="user", content="hi"),)))
    assert response.tool_calls[0] == ToolCall(
        id="call_7", name="get_weather", unparsed_arguments=text
    )
    problem = read_arguments("get_weather", text)
    assert isinstance(problem, str) and "arguments.days is an integer of 71 bits" in problem


async def test_an_agent_is_told_its_arguments_were_no_json_and_pays_once_per_call(
    chat_server: ChatServer, tmp_path: Path
) -> None:
    """The answer with arguments that are no JSON is recorded with its tokens; the call
    fails as the call's own error, which the model reads, and the run goes on."""
    ran: list[str] = []

    @tool
    def lookup(city: str = "Rome") -> str:
        """Look a city up (its one argument has a default: {} would validate)."""
        ran.append(city)
        return f"found {city}"

    def asking(arguments: str, call_id: str) -> dict[str, Any]:
        function = {"name": "lookup", "arguments": arguments}
        message = {
            "role": "assistant",
            "tool_calls": [{"id": call_id, "type": "function", "function": function}],
        }
        return _completion(message, {"prompt_tokens": 10, "completion_tokens": 3}, "gpt-test")

    chat_server.replies = [
        (200, asking('{"city": "Par', "call_1")),
        (200, asking('{"city": "Paris"}', "call_2")),
        (
            200,
            _completion(
                {"role": "assistant", "content": "Paris found."},
                {"prompt_tokens": 30, "completion_tokens": 4},
                "gpt-test",
            ),
        ),
    ]
    chat_model = OpenAIChatModel("gpt-test", base_url=chat_server.base_url, api_key="k")
    world = local_world(tmp_path / "data")
    wf = Workflow(
        "no-json-args", steps=[agent("a", model=chat_model, prompt="find Paris", tools=[lookup])]
    )
    try:
        result = await run_workflow(world, wf, {}, run_id="run_no_json")
    finally:
        await chat_model.aclose()
    assert (result.state.status, result.output) == ("completed", "Paris found.")
    assert ran == ["Paris"]  # the unreadable call never ran, not even as lookup()
    told = chat_server.received[1].body["messages"]
    assert told[-2]["tool_calls"][0]["function"]["arguments"] == '{"city": "Par'
    assert told[-1]["role"] == "tool" and told[-1]["tool_call_id"] == "call_1"
    assert "not valid JSON" in told[-1]["content"]
    assert "ToolArgumentsError" in told[-1]["content"]
    # All three answers are paid for and counted.
    usage = replay_run(world, "run_no_json").state.usage
    assert (usage.calls, usage.input_tokens, usage.output_tokens) == (3, 50, 10)
    failed = [e for e in world.read_run_log("run_no_json") if isinstance(e, ToolCallFailed)]
    assert [(e.call_id, e.error.type) for e in failed] == [("call_1", "ToolArgumentsError")]
    # A resume of the finished run runs nothing and asks nothing.
    again = await run_workflow(world, wf, {}, run_id="run_no_json")
    assert again.output == "Paris found." and len(chat_server.received) == 3 and ran == ["Paris"]


def test_the_parameters_are_the_models_request_settings_pinned_in_a_session() -> None:
    from little_es.harness.manifest import SETTINGS_KEY, compute_manifest

    tuned = OpenAIChatModel("m", api_key="k", parameters={"temperature": 0})
    assert tuned.request_settings == {"temperature": 0}
    manifest, _ = compute_manifest(tuned, (), None, None, 5)
    assert manifest[SETTINGS_KEY] == {"temperature": 0}
    plain, _ = compute_manifest(OpenAIChatModel("m", api_key="k"), (), None, None, 5)
    assert plain[SETTINGS_KEY] == {}


async def test_an_answer_whose_usage_parts_pass_its_totals_is_kept_and_counted(
    chat_server: ChatServer, model: OpenAIChatModel
) -> None:
    # Some compatible servers count reasoning tokens outside completion_tokens: the answer
    # is paid for; it was thrown away as "cannot be used", and a resume paid again.
    usage = {
        "prompt_tokens": 100,
        "completion_tokens": 50,
        "prompt_tokens_details": {"cached_tokens": 120},
        "completion_tokens_details": {"reasoning_tokens": 400},
    }
    chat_server.replies = [(200, _completion({"role": "assistant", "content": "hi"}, usage, "m"))]
    response = await model.complete(ModelRequest(messages=(Message(role="user", content="x"),)))
    assert response.usage == Usage(
        input_tokens=100, output_tokens=50, cached_input_tokens=100, reasoning_tokens=50
    )

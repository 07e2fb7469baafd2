"""ScriptedModel: answers by turn or by function, counts real calls, fails clearly."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest

from little_es.errors import ModelConfigError, ModelError
from little_es.harness.model import Model, ScriptedModel, ScriptedReply
from little_es.values import Message, ModelRequest, ModelResponse, ToolCall, Usage
from little_es.workflow.ir import RetryPolicy


def _request(*assistant_turns: str) -> ModelRequest:
    """A conversation with one user message and the given assistant replies."""
    messages = [Message(role="user", content="hi")]
    for text in assistant_turns:
        messages.append(Message(role="assistant", content=text))
        messages.append(Message(role="user", content="go on"))
    return ModelRequest(messages=tuple(messages))


def _script() -> ScriptedModel:
    return ScriptedModel(
        responses=[
            ScriptedReply(
                tool_calls=[ToolCall(id="c1", name="search", arguments={"q": "x"})],
                usage=Usage(input_tokens=10, output_tokens=2),
            ),
            ScriptedReply(content="second"),
            ModelResponse(content="third", provider="elsewhere", model="other-9"),
        ],
        provider="acme",
        model_id="acme-1",
    )


async def test_answers_by_turn_and_fills_provider_and_model() -> None:
    model = _script()
    first = await model.complete(_request())
    assert first.tool_calls == (ToolCall(id="c1", name="search", arguments={"q": "x"}),)
    assert first.usage == Usage(input_tokens=10, output_tokens=2)
    assert (first.provider, first.model) == ("acme", "acme-1")
    second = await model.complete(_request("a"))
    assert (second.content, second.provider, second.model) == ("second", "acme", "acme-1")
    third = await model.complete(_request("a", "b"))
    # A full ModelResponse is returned as given, provider and model included.
    assert third == ModelResponse(content="third", provider="elsewhere", model="other-9")


async def test_turn_is_a_pure_function_of_the_request() -> None:
    model = _script()
    again = [await model.complete(_request("a", "b")) for _ in range(2)]
    assert again[0] == again[1]
    assert again[0].content == "third"
    # Tool messages and system messages do not count as turns.
    request = ModelRequest(
        messages=(
            Message(role="system", content="be brief"),
            Message(role="user", content="hi"),
            Message(role="assistant", tool_calls=(ToolCall(id="c1", name="search"),)),
            Message(role="tool", tool_call_id="c1", content="found"),
        )
    )
    assert (await model.complete(request)).content == "second"


async def test_counts_real_invocations_and_keeps_requests() -> None:
    model = _script()
    assert model.calls == 0
    assert model.requests == []
    first, second = _request(), _request("a")
    await model.complete(first)
    await model.complete(second)
    assert model.calls == 2
    assert model.requests == [first, second]
    model.requests.clear()  # a copy: the model's own record is untouched
    assert model.calls == 2


async def test_running_past_the_script_is_a_non_retryable_error() -> None:
    model = _script()
    with pytest.raises(ModelError) as info:
        await model.complete(_request("a", "b", "c"))
    assert info.value.retryable is False
    assert info.value.provider == "acme"
    assert "3 scripted response(s)" in str(info.value)
    assert "turn 4" in str(info.value)
    assert model.calls == 1


async def test_an_empty_script_refuses_every_call() -> None:
    model = ScriptedModel(responses=[])
    with pytest.raises(ModelError, match="0 scripted response"):
        await model.complete(_request())


async def test_respond_function_sync_and_async() -> None:
    def echo(request: ModelRequest) -> ScriptedReply:
        return ScriptedReply(content=f"echo {request.messages[-1].content}")

    async def slow_echo(request: ModelRequest) -> ModelResponse:
        await asyncio.sleep(0)
        return ModelResponse(content="async", provider="p", model="m")

    sync_model = ScriptedModel(respond=echo, model_id="echo-1")
    answer = await sync_model.complete(_request("a"))
    assert (answer.content, answer.provider, answer.model) == ("echo go on", "scripted", "echo-1")
    assert sync_model.calls == 1

    async_model = ScriptedModel(respond=slow_echo)
    assert (await async_model.complete(_request())).content == "async"


async def test_respond_errors_propagate_and_bad_answers_are_refused() -> None:
    def flaky(request: ModelRequest) -> ModelResponse:
        raise ModelError("rate limited", retryable=True, provider="scripted", status=429)

    model = ScriptedModel(respond=flaky)
    with pytest.raises(ModelError) as info:
        await model.complete(_request())
    assert info.value.retryable is True
    assert model.calls == 1

    bad = ScriptedModel(respond=lambda request: "not a response")  # type: ignore[arg-type,return-value]
    with pytest.raises(ModelError, match="must be a ModelResponse or a ScriptedReply, got str"):
        await bad.complete(_request())


def test_constructor_validates() -> None:
    with pytest.raises(ModelConfigError, match="exactly one"):
        ScriptedModel()
    with pytest.raises(ModelConfigError, match="exactly one"):
        ScriptedModel(responses=[], respond=lambda r: ScriptedReply())
    with pytest.raises(ModelConfigError, match="provider"):
        ScriptedModel(responses=[], provider="")
    with pytest.raises(ModelConfigError, match=r"responses\[1\]"):
        ScriptedModel(responses=[ScriptedReply(), "text"])  # type: ignore[list-item]
    duplicate = ScriptedReply(tool_calls=(ToolCall(id="c", name="a"), ToolCall(id="c", name="b")))
    with pytest.raises(ModelConfigError, match="unique"):
        ScriptedModel(responses=[duplicate])


async def test_complete_refuses_a_non_request() -> None:
    with pytest.raises(ModelError, match="expects a ModelRequest"):
        await _script().complete({"messages": []})  # type: ignore[arg-type]


async def test_scripted_model_satisfies_the_protocol() -> None:
    async def ask(model: Model) -> tuple[str, str, str | None]:
        response = await model.complete(_request("a"))
        return model.provider, model.model_id, response.content

    assert await ask(_script()) == ("acme", "acme-1", "second")


def test_retry_after_reads_the_providers_headers() -> None:
    from email.utils import format_datetime

    from little_es.contrib._provider import retry_after

    later = format_datetime(datetime.now(UTC) + timedelta(seconds=30), usegmt=True)
    assert retry_after({"retry-after-ms": "250", "retry-after": "9"}) == 0.25
    assert retry_after({"retry-after": "9"}) == 9.0
    assert 25 < (retry_after({"retry-after": later}) or 0) <= 30
    for useless in ("soon", "-3", "0", "nan", "inf", "Mon, 01 Jan 1990 00:00:00 GMT"):
        assert retry_after({"retry-after": useless}) is None, useless
    assert retry_after({}) is None


async def test_a_call_is_tried_again_in_place_after_the_wait_the_provider_asked_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from little_es.harness import model as model_module

    waited: list[float] = []

    async def sleep(seconds: float) -> None:
        waited.append(seconds)

    monkeypatch.setattr(model_module.asyncio, "sleep", sleep)
    answers: list[object] = [
        ModelError("429", retryable=True, retry_after=4.0),
        ModelError("503", retryable=True),
        "ok",
    ]

    async def send() -> str:
        answer = answers.pop(0)
        if isinstance(answer, ModelError):
            raise answer
        return str(answer)

    retry = RetryPolicy(max_attempts=3, initial_backoff_s=1.0)
    assert await model_module.call_model(send, run_id="r", step_path="a", retry=retry) == "ok"
    assert waited == [4.0, 2.0]  # the provider's wait, then the policy's own backoff
    # A refusal for good is not tried again, whatever the policy.
    answers[:] = [ModelError("400", retryable=False), "never"]
    with pytest.raises(ModelError, match=r"^400$"):
        await model_module.call_model(send, run_id="r", step_path="a", retry=retry)
    assert answers == ["never"]


async def test_a_wait_in_place_is_short_whatever_the_provider_asks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The tries are counted in the process only: a wait past a Temporal activity's
    # timeout would start them again in the next attempt of the activity, for ever.
    from little_es.harness import model as model_module

    waited: list[float] = []

    async def sleep(seconds: float) -> None:
        waited.append(seconds)

    monkeypatch.setattr(model_module.asyncio, "sleep", sleep)

    async def send() -> str:
        if len(waited) < 2:
            raise ModelError("429", retryable=True, retry_after=86_400.0)
        return "ok"

    policy = RetryPolicy(max_attempts=3, initial_backoff_s=1.0)
    assert await model_module.call_model(send, run_id="r", step_path="a", retry=policy) == "ok"
    assert waited == [model_module.MAX_IN_PLACE_WAIT_S] * 2
    waited.clear()
    capped = RetryPolicy(max_attempts=3, initial_backoff_s=1.0, max_backoff_s=3.0)
    assert await model_module.call_model(send, run_id="r", step_path="a", retry=capped) == "ok"
    assert waited == [3.0, 3.0]

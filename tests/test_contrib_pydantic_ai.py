"""A Pydantic AI agent as a little_es step: real requests to a local chat-completions server
through Pydantic AI's OpenAI provider, a child process SIGKILLed mid-run and resumed."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import orjson
import pytest
from _pydantic_ai_support import RUN_ID, Answer, ChatServer, build, main, start_server
from openai import AsyncOpenAI
from pydantic_ai import Agent, RunContext
from pydantic_ai.exceptions import ModelHTTPError, ModelQuotaExceededError, ModelServerError
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models import Model
from pydantic_ai.models.fallback import FallbackModel
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider
from pydantic_ai.tools import DeferredToolRequests

from little_es import RetryPolicy, RunFailedError, Workflow, local_world, run_workflow
from little_es.contrib.pydantic_ai import pydantic_ai_step
from little_es.engine.executor import StepGuard
from little_es.events import ModelCalled, StepStarted, ToolCallFailed
from little_es.harness.session import conversation_hash, sent_messages
from little_es.ids import run_stream_id
from little_es.world import World

_SUPPORT = Path(__file__).with_name("_pydantic_ai_support.py")
_ROOT = Path(__file__).resolve().parents[1]


def _child(args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    full = {**os.environ, "PYTHONPATH": f"{_ROOT}{os.pathsep}{_ROOT / 'tests'}", **(env or {})}
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


def _resume(tmp_path: Path, server: ChatServer, ledger: Path) -> dict[str, Any]:
    proc = _child([str(tmp_path / "world"), server.base_url, str(ledger)])
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err.decode()
    result: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    return result


def test_kill_while_the_second_request_is_in_flight(tmp_path: Path) -> None:
    server = ChatServer(hold_turn=2)
    httpd = start_server(server)
    ledger = tmp_path / "ledger.jsonl"
    try:
        proc = _child([str(tmp_path / "world"), server.base_url, str(ledger)])
        deadline = time.monotonic() + 60
        while server.count(2) == 0:
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            assert time.monotonic() < deadline, "the second request never arrived"
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        killed_pid = proc.pid
        before = _ledger(ledger)
        assert sorted(e["call"] for e in before) == ["c1", "c2"]
        server.hold_turn = None
        result = _resume(tmp_path, server, ledger)
    finally:
        server.release.set()
        httpd.shutdown()
        httpd.server_close()
    # Turn 1 was answered from the log; only the in-flight turn 2 was sent again.
    assert dict(server.requests) == {1: 1, 2: 2, 3: 1}
    after = _ledger(ledger)
    assert sorted(e["call"] for e in after) == ["c1", "c2", "c3"]
    assert {e["pid"] for e in after if e["call"] in ("c1", "c2")} == {killed_pid}
    assert result["status"] == "completed"
    assert result["output"] == {"answer": 42, "summary": "alpha is 1, 40 + 2 = 42"}
    # Usage of the three recorded responses (100/10 per turn number), in the run's totals.
    assert (result["calls"], result["input_tokens"], result["output_tokens"]) == (3, 600, 60)


def test_kill_after_a_tool_ran_re_runs_only_that_tool(tmp_path: Path) -> None:
    server = ChatServer()
    httpd = start_server(server)
    ledger = tmp_path / "ledger.jsonl"
    try:
        proc = _child(
            [str(tmp_path / "world"), server.base_url, str(ledger)],
            {"LITTLE_ES_CRASH_BEFORE_EVENT": "harness.tool_call.succeeded:call_id=c3"},
        )
        proc.communicate(timeout=120)
        assert proc.returncode == -signal.SIGKILL
        assert [e["call"] for e in _ledger(ledger)].count("c3") == 1
        result = _resume(tmp_path, server, ledger)
    finally:
        httpd.shutdown()
        httpd.server_close()
    # No model request re-sent; the tool in flight (c3) ran again, c1 and c2 did not.
    assert dict(server.requests) == {1: 1, 2: 1, 3: 1}
    calls = [e["call"] for e in _ledger(ledger)]
    assert sorted(calls) == ["c1", "c2", "c3", "c3"]
    assert result["output"]["answer"] == 42


def test_output_and_usage_in_process(tmp_path: Path, capsys: Any) -> None:
    server = ChatServer()
    httpd = start_server(server)
    try:
        main([str(tmp_path / "world"), server.base_url, str(tmp_path / "ledger")])
        # A second call of a completed run sends nothing.
        main([str(tmp_path / "world"), server.base_url, str(tmp_path / "ledger")])
    finally:
        httpd.shutdown()
        httpd.server_close()
    lines = capsys.readouterr().out.strip().splitlines()
    first, second = (json.loads(line) for line in lines)
    assert first == second
    assert first["output"] == {"answer": 42, "summary": "alpha is 1, 40 + 2 = 42"}
    assert dict(server.requests) == {1: 1, 2: 1, 3: 1}


def test_the_check_before_each_call_makes_no_query_of_its_own(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """As with little_es's own agent steps: the commit of each call's write-ahead record
    read the run's stream for the guard's check that follows it."""
    asked_before_calls = 0
    checks = 0
    real = World.has_events_after

    def counted(self: World, stream_id: Any, version: int) -> bool:
        nonlocal asked_before_calls
        callers = {frame.name for frame in traceback.extract_stack()}
        asked_before_calls += bool(callers & {"before_model_call", "before_tool_calls"})
        return real(self, stream_id, version)

    real_check = StepGuard.check_stop

    def counted_check(self: StepGuard) -> None:
        nonlocal checks
        checks += 1
        real_check(self)

    monkeypatch.setattr(World, "has_events_after", counted)
    monkeypatch.setattr(StepGuard, "check_stop", counted_check)
    server = ChatServer()
    httpd = start_server(server)
    try:
        main([str(tmp_path / "world"), server.base_url, str(tmp_path / "ledger")])
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert dict(server.requests) == {1: 1, 2: 1, 3: 1}
    assert checks >= 3  # one before each request at least, and before each tool call
    assert asked_before_calls == 0


def _model_calls(world: World) -> tuple[list[ModelCalled], dict[int, tuple[Any, ...]]]:
    """The session's ``harness.model.called`` events, and what a reader rebuilds as sent."""
    session_id = next(
        e.session_id
        for e in world.read_stream(run_stream_id(RUN_ID))
        if isinstance(e, StepStarted) and e.session_id is not None
    )
    events = world.read_stream(session_id)
    return [e for e in events if isinstance(e, ModelCalled)], sent_messages(events)


def test_a_request_stores_only_the_messages_no_earlier_event_holds(tmp_path: Path) -> None:
    """With a system prompt (sent once), a later request's new messages are the previous
    response and its tools' results, which their own events hold: stored as ``implied``,
    and rebuilt by a reader into exactly the conversation the hash chain covers. With
    ``instructions`` (sent again in every request, between those messages) every new
    message is stored, as before."""
    server = ChatServer()
    httpd = start_server(server)
    try:
        for system_prompt in (True, False):
            world_dir = tmp_path / f"world-{system_prompt}"
            with local_world(world_dir) as world:
                flow = build(server.base_url, tmp_path / "ledger", system_prompt=system_prompt)
                result = asyncio.run(run_workflow(world, flow, run_id=RUN_ID))
                assert result.output == {"answer": 42, "summary": "alpha is 1, 40 + 2 = 42"}
                # Resumed, it is answered from the log: the stored form reads back.
                again = asyncio.run(run_workflow(world, flow, run_id=RUN_ID))
                assert again.output == result.output
                calls, sent = _model_calls(world)
            assert [c.turn for c in calls] == [1, 2, 3]
            if system_prompt:
                # Turn 2: the response with two tool calls and both results; turn 3: one.
                assert [(c.implied, len(c.messages)) for c in calls[1:]] == [(3, 0), (2, 0)]
            else:
                assert all(c.implied == 0 for c in calls)
                assert [len(c.messages) for c in calls[1:]] == [4, 3]
            chain = ""
            for call in calls:
                chain = conversation_hash(chain, list(sent[call.turn]))
                assert chain == call.conversation_hash
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert dict(server.requests) == {1: 2, 2: 2, 3: 2}


# ------------------------------------------------------------ failures, and their replay


class PaymentDeclinedError(Exception):
    retryable = False


def _tools_workflow(
    base_url: str,
    ran: list[str],
    *,
    lookup_declines: bool,
    max_turns: int = 20,
    client_retries: int | None = None,
    output_type: Any = str,
    fallback: bool = False,
) -> Workflow:
    """Turn 1 asks for ``lookup`` and ``add``. With ``lookup_declines`` it raises a
    non-retryable error, which ends the step (Pydantic AI lets a tool's exception through).
    ``ran`` gets each real tool call. With ``fallback`` the agent's model is a
    ``FallbackModel`` of two models of the same server."""
    provider = (
        OpenAIProvider(base_url=base_url, api_key="k")
        if client_retries is None
        else OpenAIProvider(
            openai_client=AsyncOpenAI(base_url=base_url, api_key="k", max_retries=client_retries)
        )
    )
    model: Model = OpenAIChatModel("gpt-4o-mini", provider=provider)
    if fallback:
        model = FallbackModel(model, OpenAIChatModel("gpt-4o", provider=provider))
    agent = Agent(
        model,
        output_type=output_type,
        name="payer",
        instructions="Pay.",
    )

    @agent.tool
    def lookup(ctx: RunContext[None], key: str) -> int:
        """Look a key up (it charges a card)."""
        ran.append("lookup")
        if lookup_declines:
            raise PaymentDeclinedError("card declined")
        return 1

    @agent.tool
    def add(ctx: RunContext[None], a: int, b: int) -> int:
        """Add two numbers."""
        ran.append("add")
        return a + b

    step = pydantic_ai_step(
        "pay", agent, prompt="pay", max_turns=max_turns, retry=RetryPolicy(max_attempts=3)
    )
    return Workflow("pydantic_ai_pay", steps=[step])


class _Crash(BaseException):
    """The process dies right after the tool's failure is committed."""


def test_a_tool_failure_answered_from_the_log_fails_the_step_as_it_did(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """Killed right after ``harness.tool_call.failed`` is committed, the resume fails the
    step with the recorded error (its type, not retryable), as the uninterrupted run does:
    no second attempt, which would charge the card again in a new session."""
    from little_es.contrib import pydantic_ai as integration

    server = ChatServer()
    httpd = start_server(server)
    ran: list[str] = []
    save = integration._Recorder.save
    crashed: list[bool] = []

    def save_then_crash(self: Any, *args: Any, **kwargs: Any) -> None:
        save(self, *args, **kwargs)
        failed = any(isinstance(r, ToolCallFailed) for r in self.session.tool_results.values())
        if failed and not crashed:
            crashed.append(True)
            raise _Crash

    try:
        wf = _tools_workflow(server.base_url, ran, lookup_declines=True)
        with local_world(tmp_path / "w") as world:
            with monkeypatch.context() as mp:
                mp.setattr(integration._Recorder, "save", save_then_crash)
                with pytest.raises(_Crash):
                    asyncio.run(run_workflow(world, wf, {}, run_id="run_pay"))
            with pytest.raises(RunFailedError) as failed:
                asyncio.run(run_workflow(world, wf, run_id="run_pay"))
            log = world.read_run_log("run_pay")
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert failed.value.error.type == "PaymentDeclinedError"
    assert not failed.value.error.retryable
    assert ran.count("lookup") == 1, ran
    assert [e.attempt for e in log if isinstance(e, StepStarted)] == [1]
    assert dict(server.requests) == {1: 1}


def test_a_rate_limited_request_is_retried_in_the_same_session(tmp_path: Path) -> None:
    """A 429 past the client's own retries is tried again by the step's retry, in place: a
    new attempt would start a new session and run the committed tools again."""
    server = ChatServer(rate_limited={2: 2})
    httpd = start_server(server)
    ran: list[str] = []
    try:
        wf = _tools_workflow(
            server.base_url, ran, lookup_declines=False, client_retries=0, output_type=Answer
        )
        with local_world(tmp_path / "w") as world:
            result = asyncio.run(run_workflow(world, wf, {}, run_id="run_429"))
            log = world.read_run_log("run_429")
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert result.state.status == "completed"
    assert [e.attempt for e in log if isinstance(e, StepStarted)] == [1]
    assert dict(server.requests) == {1: 1, 2: 3, 3: 1}
    assert sorted(ran) == ["add", "add", "lookup"], "a retry ran the committed tools again"


def test_every_fallback_model_rate_limited_is_retried_in_the_same_session(tmp_path: Path) -> None:
    """A FallbackModel whose models all failed (Pydantic AI's FallbackExceptionGroup) is
    retried in place when one of them may succeed later, as a single model's 429 is."""
    server = ChatServer(rate_limited={2: 2})
    httpd = start_server(server)
    ran: list[str] = []
    try:
        wf = _tools_workflow(
            server.base_url,
            ran,
            lookup_declines=False,
            client_retries=0,
            output_type=Answer,
            fallback=True,
        )
        with local_world(tmp_path / "w") as world:
            result = asyncio.run(run_workflow(world, wf, {}, run_id="run_fallback"))
            log = world.read_run_log("run_fallback")
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert result.state.status == "completed"
    assert [e.attempt for e in log if isinstance(e, StepStarted)] == [1]
    # Turn 2: both models refused (one try), then the first one answered (a second try).
    assert dict(server.requests) == {1: 1, 2: 3, 3: 1}
    assert sorted(ran) == ["add", "add", "lookup"], "a retry ran the committed tools again"


def _function_workflow(error: Exception, ran: list[str], sent: list[int]) -> Workflow:
    """Turn 1 calls ``add``; the first request of turn 2 raises ``error``, the next answers."""

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        turn = sum(isinstance(m, ModelResponse) for m in messages) + 1
        sent.append(turn)
        if turn == 1:
            return ModelResponse(parts=[ToolCallPart("add", {"a": 40, "b": 2}, "call_1")])
        if sent.count(2) == 1:
            raise error
        return ModelResponse(parts=[TextPart("42")])

    agent = Agent(FunctionModel(respond), name="adder")

    @agent.tool
    def add(ctx: RunContext[None], a: int, b: int) -> int:
        """Add two numbers."""
        ran.append("add")
        return a + b

    step = pydantic_ai_step("add", agent, prompt="add", retry=RetryPolicy(max_attempts=3))
    return Workflow("fn", steps=[step])


def test_a_provider_error_without_http_is_retried_in_the_same_session(tmp_path: Path) -> None:
    """Pydantic AI's categorised errors of providers that speak no HTTP status (a server
    error, a throttled or overloaded model, an empty answer) are retried in place."""
    ran: list[str] = []
    sent: list[int] = []
    wf = _function_workflow(ModelServerError("fn", "the model's server failed"), ran, sent)
    with local_world(tmp_path / "w") as world:
        result = asyncio.run(run_workflow(world, wf, {}, run_id="run_fn"))
        log = world.read_run_log("run_fn")
    assert result.output == "42"
    assert [e.attempt for e in log if isinstance(e, StepStarted)] == [1]
    assert sent == [1, 2, 2]
    assert ran == ["add"], "a retry ran the committed tool again"


@pytest.mark.parametrize("http", [False, True])
def test_a_provider_error_that_cannot_succeed_later_is_not_retried(
    tmp_path: Path, http: bool
) -> None:
    """A spent quota (or credentials refused, an unknown model...) fails the step for good:
    each retry would be a new session that runs the committed tool again. So does one
    that came as an HTTP 429, as OpenAI reports a spent quota."""
    ran: list[str] = []
    sent: list[int] = []
    error: Exception = (
        ModelHTTPError.for_category(
            ModelQuotaExceededError,
            status_code=429,
            model_name="fn",
            body={"error": {"code": "insufficient_quota", "message": "out of credits"}},
        )
        if http
        else ModelQuotaExceededError("fn", "out of credits")
    )
    wf = _function_workflow(error, ran, sent)
    with local_world(tmp_path / "w") as world:
        with pytest.raises(RunFailedError) as failed:
            asyncio.run(run_workflow(world, wf, {}, run_id="run_quota"))
        log = world.read_run_log("run_quota")
    assert failed.value.error.type == "ModelError" and not failed.value.error.retryable
    assert "out of credits" in failed.value.error.message
    assert [e.attempt for e in log if isinstance(e, StepStarted)] == [1]
    assert sent == [1, 2]
    assert ran == ["add"]


def _deferring_workflow(ran: list[str], output_type: Any) -> Workflow:
    """Turn 1 calls ``add`` and ``deploy``, a tool that needs an approval (deferred)."""

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        return ModelResponse(
            parts=[
                ToolCallPart("add", {"a": 40, "b": 2}, "call_1"),
                ToolCallPart("deploy", {"env": "prod"}, "call_2"),
            ]
        )

    agent = Agent(FunctionModel(respond), name="deployer", output_type=output_type)

    @agent.tool
    def add(ctx: RunContext[None], a: int, b: int) -> int:
        """Add two numbers."""
        ran.append("add")
        return a + b

    @agent.tool(requires_approval=True)
    def deploy(ctx: RunContext[None], env: str) -> str:
        """Deploy."""
        ran.append("deploy")
        return "deployed"

    step = pydantic_ai_step("ship", agent, prompt="ship", retry=RetryPolicy(max_attempts=3))
    return Workflow("deferring", steps=[step])


def test_a_deferred_tool_call_the_agent_cannot_return_fails_the_step_once(
    tmp_path: Path,
) -> None:
    """Pydantic AI's UserError (here: a deferred call, no DeferredToolRequests output) is
    the agent's build: a retry would pay again and run the committed tool again."""
    ran: list[str] = []
    with local_world(tmp_path / "w") as world:
        with pytest.raises(RunFailedError) as failed:
            asyncio.run(run_workflow(world, _deferring_workflow(ran, str), {}, run_id="run_d"))
        log = world.read_run_log("run_d")
    assert failed.value.error.type == "AgentUsageError" and not failed.value.error.retryable
    assert "DeferredToolRequests" in failed.value.error.message
    assert [e.attempt for e in log if isinstance(e, StepStarted)] == [1]
    assert ran == ["add"]


def test_deferred_tool_requests_are_the_steps_output_and_resume_from_the_log(
    tmp_path: Path,
) -> None:
    """An agent that returns its deferred calls ends the step with them as its output; the
    call that ran is not run again, and a second run_workflow changes nothing."""
    ran: list[str] = []
    wf = _deferring_workflow(ran, [str, DeferredToolRequests])
    with local_world(tmp_path / "w") as world:
        result = asyncio.run(run_workflow(world, wf, {}, run_id="run_dr"))
        again = asyncio.run(run_workflow(world, wf, run_id="run_dr"))
    assert ran == ["add"]
    assert [a["tool_name"] for a in result.output["approvals"]] == ["deploy"]
    assert result.output["approvals"][0]["args"] == {"env": "prod"}
    assert again.output == result.output and again.steps_executed == 0


def test_a_request_the_provider_refuses_for_good_is_not_retried(tmp_path: Path) -> None:
    """An HTTP 400 (401, 403, 404...) cannot succeed later: one failed attempt, not three,
    each of which would run the committed tools again in a new session."""
    server = ChatServer(status_for_turn={2: 400})
    httpd = start_server(server)
    ran: list[str] = []
    try:
        wf = _tools_workflow(server.base_url, ran, lookup_declines=False)
        with local_world(tmp_path / "w") as world:
            with pytest.raises(RunFailedError) as failed:
                asyncio.run(run_workflow(world, wf, {}, run_id="run_400"))
            log = world.read_run_log("run_400")
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert failed.value.error.type == "ModelError" and not failed.value.error.retryable
    assert "HTTP 400" in failed.value.error.message
    assert [e.attempt for e in log if isinstance(e, StepStarted)] == [1]
    assert dict(server.requests) == {1: 1, 2: 1}
    assert sorted(ran) == ["add", "lookup"], "a retry ran the committed tools again"


def test_an_agent_past_its_max_turns_is_not_retried(tmp_path: Path) -> None:
    """Pydantic AI's request limit is the step's turn limit: a retry would stop at the same
    place, after paying for every call and running every tool again."""
    server = ChatServer()
    httpd = start_server(server)
    ran: list[str] = []
    try:
        wf = _tools_workflow(server.base_url, ran, lookup_declines=False, max_turns=1)
        with local_world(tmp_path / "w") as world:
            with pytest.raises(RunFailedError) as failed:
                asyncio.run(run_workflow(world, wf, {}, run_id="run_turns"))
            log = world.read_run_log("run_turns")
    finally:
        httpd.shutdown()
        httpd.server_close()
    error = failed.value.error
    assert error.type == "TurnLimitExceededError" and not error.retryable
    assert "after max_turns=1 model requests" in error.message
    assert [e.attempt for e in log if isinstance(e, StepStarted)] == [1]
    assert dict(server.requests) == {1: 1}
    assert sorted(ran) == ["add", "lookup"]


def test_a_resume_with_other_model_settings_or_output_schema_is_refused(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """The settings the agent sends with every request (its model's and its own) and its
    output schema are pinned in the session's manifest: a resume with others would
    continue a conversation made by another agent."""
    from pydantic import BaseModel

    from little_es.contrib import pydantic_ai as integration
    from little_es.errors import CapabilityDriftError

    class Answer(BaseModel):
        answer: int

    server = ChatServer()
    httpd = start_server(server)

    def workflow(temperature: float, output: Any = str) -> Workflow:
        model = OpenAIChatModel(
            "gpt-4o-mini", provider=OpenAIProvider(base_url=server.base_url, api_key="k")
        )
        agent = Agent(model, output_type=output, model_settings={"temperature": temperature})

        @agent.tool
        def lookup(ctx: RunContext[None], key: str) -> int:
            """Look a key up."""
            return 1

        @agent.tool
        def add(ctx: RunContext[None], a: int, b: int) -> int:
            """Add two numbers."""
            return a + b

        return Workflow("pai_settings", steps=[pydantic_ai_step("ask", agent, prompt="go")])

    settings = workflow(0.0).steps[0].model.request_settings  # type: ignore[attr-defined]
    assert set(settings) == {"output_schema_sha256", "agent_settings_sha256"}
    # Pinned as hashes: a header's secret is not written to the log, and a setting that
    # is no JSON (an httpx.Timeout) still defines the step.
    secret = Agent(
        OpenAIChatModel("gpt-4o-mini", provider=OpenAIProvider(base_url="http://x", api_key="k")),
        model_settings={
            "extra_headers": {"Authorization": "Bearer sk-secret"},
            "timeout": object(),
        },  # type: ignore[typeddict-item]
    )
    pinned = pydantic_ai_step("s", secret, prompt="go").model.request_settings  # type: ignore[attr-defined]
    assert b"sk-secret" not in orjson.dumps(pinned)
    save = integration._Recorder.save

    def save_then_crash(self: Any, *args: Any, **kwargs: Any) -> None:
        save(self, *args, **kwargs)
        raise _Crash

    try:
        with local_world(tmp_path / "w") as world:
            with monkeypatch.context() as mp:
                mp.setattr(integration._Recorder, "save", save_then_crash)
                with pytest.raises(_Crash):
                    asyncio.run(run_workflow(world, workflow(0.0), {}, run_id="run_tuned"))
            sent = dict(server.requests)
            rows = len(world.read_run_log("run_tuned"))
            for changed, said in (
                (workflow(1.5), "'agent_settings_sha256' changed"),
                (workflow(0.0, Answer), "'output_schema_sha256' changed"),
            ):
                with pytest.raises(CapabilityDriftError, match=f"request setting {said}"):
                    asyncio.run(run_workflow(world, changed, run_id="run_tuned"))
            assert dict(server.requests) == sent
            assert len(world.read_run_log("run_tuned")) == rows
    finally:
        httpd.shutdown()
        httpd.server_close()

"""A Pydantic AI ``Agent`` run as a little_es agent step, its model requests and tool calls
recorded and memoized on the run's log.

This follows the seams of Pydantic AI's own durable-execution integrations
(``pydantic_ai.durable_exec.temporal`` / ``.dbos`` / ``.prefect``): the agent runs
unchanged, with its ``Model`` and its toolsets overridden by wrappers (a
:class:`~pydantic_ai.models.wrapper.WrapperModel` whose ``request`` is a recorded model
call, a :class:`~pydantic_ai.toolsets.WrapperToolset` whose ``call_tool`` is a recorded
tool call). Instead of Temporal activities or DBOS steps, each call goes through the
step's harness session, exactly as the built-in agent loop's calls do:

* ``harness.model.called`` (the messages added since the previous request, mapped to
  :class:`~little_es.values.Message`, and the conversation's hash chain) is committed
  before the request is sent, ``harness.model.responded`` (text, tool calls, usage) after;
  when the added messages begin with the previous response and its tools' results, those
  are left ``implied`` (rebuilt from their own events, as the built-in loop's are);
* ``harness.tool_call.started`` is committed before a tool runs, its ``succeeded`` /
  ``failed`` after;
* ``harness.session.completed`` carries the agent's output.

A resumed step runs the agent again from the start: the Nth model request is answered
from turn N's recorded response (after checking the rebuilt conversation against the
recorded hash chain) and a tool call with a recorded result returns it; only the call in
flight at the crash is made again. So the usage, cost and budget of the calls are the
run's (``little report``, ``replay_run``), on either engine, with the embedded SQLite log
and no Temporal or DBOS.

What a response keeps: its text, its tool calls (ids, names, arguments) and its usage.
The agent is given the response rebuilt from that record on the first run too, so the
run that was killed and the run that resumed see the same messages; parts beyond these
(thinking, provider details) are not recorded. Streaming (``request_stream``) is not
recorded and is refused. A tool's ``ModelRetry`` is recorded as the call's failure and
raised again on replay; a tool's result is recorded as JSON and the agent gets the JSON
form.

Install with ``pip install 'little-es[pydantic-ai]'``.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import orjson
from pydantic import TypeAdapter

from little_es.errors import MissingExtraError

try:
    from pydantic_ai import Agent
    from pydantic_ai import exceptions as _pai_errors
    from pydantic_ai import messages as _pm
    from pydantic_ai.exceptions import (
        FallbackExceptionGroup,
        ModelHTTPError,
        ModelRetry,
        UsageLimitExceeded,
    )
    from pydantic_ai.models import Model as _PaiModel
    from pydantic_ai.models import ModelRequestParameters, StreamedResponse
    from pydantic_ai.models.wrapper import WrapperModel
    from pydantic_ai.settings import ModelSettings
    from pydantic_ai.tools import RunContext
    from pydantic_ai.toolsets import AbstractToolset, FunctionToolset, ToolsetTool, WrapperToolset
    from pydantic_ai.usage import RequestUsage, UsageLimits
    from pydantic_core import to_jsonable_python
except ImportError as _exc:  # pragma: no cover - depends on the installed extras
    raise MissingExtraError(
        "little_es.contrib.pydantic_ai needs Pydantic AI: pip install 'little-es[pydantic-ai]'"
        f" (could not import it: {_exc})"
    ) from _exc

from little_es.backends.base import check_leases
from little_es.contrib._provider import RETRYABLE_STATUSES
from little_es.domain import HarnessSession
from little_es.errors import (
    AgentUsageError,
    ConversationDivergedError,
    ModelError,
    ReplayedFailureError,
    SessionInputError,
    ToolError,
    TurnLimitExceededError,
    WorkflowDefinitionError,
)
from little_es.events import (
    ModelCalled,
    ModelResponded,
    SessionCompleted,
    SessionStarted,
    ToolCallFailed,
    ToolCallStarted,
    ToolCallSucceeded,
)
from little_es.harness.guard import current_guard
from little_es.harness.manifest import check_manifest, compute_manifest
from little_es.harness.model import call_model
from little_es.harness.session import conversation_hash, implied_messages, save_session
from little_es.ids import session_stream_id
from little_es.values import (
    ErrorInfo,
    JSONValue,
    Message,
    ModelResponse,
    ToolCall,
    Usage,
)
from little_es.values import ModelRequest as LittleModelRequest
from little_es.workflow.authoring import AgentStep, PromptFn, agent
from little_es.workflow.context import StepContext
from little_es.workflow.ir import RetryPolicy
from little_es.world import World

__all__ = ["pydantic_ai_step"]

_ModelRequest = _pm.ModelRequest
_ModelResponse = _pm.ModelResponse


def pydantic_ai_step(
    id: str,
    agent_: Agent[Any, Any],
    *,
    prompt: str | PromptFn,
    deps: Callable[[StepContext], Any] | None = None,
    max_turns: int = 20,
    retry: RetryPolicy | None = None,
    max_visits: int = 1,
    budget: Any = None,
) -> AgentStep:
    """An agent step that runs the Pydantic AI agent ``agent_`` on ``prompt``.

    ``prompt`` is the user prompt, a string or a function of the
    :class:`~little_es.workflow.context.StepContext` (sync or async) returning one.
    ``deps`` (optional) computes the run's ``deps`` from the context. ``max_turns``
    bounds the model requests of one attempt (Pydantic AI's ``request_limit``). The
    step's output is the agent's output as JSON data (a ``BaseModel`` or dataclass
    output type becomes its JSON object). ``retry``, ``max_visits`` and ``budget`` are
    those of :func:`~little_es.workflow.authoring.agent`.

    The agent needs a model set on it (``Agent(model, ...)``), as Pydantic AI's own
    durable integrations require: its ``system`` and ``model_name`` are pinned in the
    session manifest with the agent's function tools (name and schema hash) and its
    output type, so a resume with a changed agent is refused before any call
    (:class:`~little_es.errors.CapabilityDriftError`). Raises
    :class:`~little_es.errors.WorkflowDefinitionError` for unusable arguments.
    """
    if not isinstance(agent_, Agent):
        raise WorkflowDefinitionError(
            f"pydantic_ai_step {id!r}: agent must be a pydantic_ai Agent, got"
            f" {type(agent_).__name__}"
        )
    model = agent_.model
    if not isinstance(model, _PaiModel):
        raise WorkflowDefinitionError(
            f"pydantic_ai_step {id!r}: the agent has no model object (got {model!r}): build it"
            " with Agent(OpenAIChatModel(...), ...) so the step can pin and record its model;"
            " a model chosen at run time cannot be recorded"
        )
    if deps is not None and not callable(deps):
        raise WorkflowDefinitionError(
            f"pydantic_ai_step {id!r}: deps must be a function of the StepContext, got"
            f" {type(deps).__name__}"
        )
    descriptor = _ModelDescriptor(
        provider=model.system or "unknown",
        model_id=model.model_name,
        request_settings=_request_settings(agent_, model),
    )
    parameters: dict[str, Any] = {"pydantic_ai": _agent_pin(id, agent_)}
    step = agent(
        id,
        model=descriptor,
        prompt=prompt,
        max_turns=max_turns,
        parameters=parameters,
        retry=retry,
        max_visits=max_visits,
        budget=budget,
    )
    runner = _Runner(agent_, descriptor, parameters, max_turns, deps, step.ir.retry)
    return AgentStep(
        ir=step.ir,
        model=step.model,
        prompt=step.prompt,
        tools=step.tools,
        system=step.system,
        max_turns=step.max_turns,
        parameters=step.parameters,
        budget=step.budget,
        runner=runner,
    )


@dataclass(frozen=True, slots=True)
class _ModelDescriptor:
    """What the manifest and the prices need of the agent's model (a little_es ``Model``'s
    ``provider``, ``model_id`` and ``request_settings``); the calls go through the Pydantic
    AI model itself."""

    provider: str
    model_id: str
    request_settings: dict[str, Any] = field(default_factory=dict)

    async def complete(self, request: LittleModelRequest) -> ModelResponse:
        """Never called: the step's runner sends the agent's requests through its model."""
        raise SessionInputError(
            f"the Pydantic AI model {self.provider}:{self.model_id} is called by its agent;"
            " use pydantic_ai_step(), not agent(model=...), to run it"
        )


def _request_settings(agent_: Agent[Any, Any], model: _PaiModel) -> dict[str, Any]:
    """What the agent sends with every request besides the conversation and its function
    tools: its model's and its own settings, and the schema of its output (its output
    tools). Pinned in the session's manifest, not in the IR (see ``request_settings`` in
    :mod:`little_es.harness.manifest`), as hashes: settings may hold secrets (headers)
    and values that are not JSON (an ``httpx.Timeout``)."""
    pinned: dict[str, Any] = {}
    output: Any = agent_.output_type
    try:
        schema: Any = TypeAdapter(output).json_schema()
    except Exception:
        # An output spec TypeAdapter cannot describe (an output function): its type is
        # pinned in the IR already, and a repr would hold memory addresses.
        schema = None
    if schema is not None:
        pinned["output_schema_sha256"] = _sha256_of(schema)
    given = (("model_settings", model.settings), ("agent_settings", agent_.model_settings))
    for key, settings in given:
        if settings:
            pinned[f"{key}_sha256"] = _sha256_of(
                to_jsonable_python(settings, fallback=lambda value: type(value).__qualname__)
            )
    return pinned


def _sha256_of(value: Any) -> str:
    return hashlib.sha256(orjson.dumps(value, option=orjson.OPT_SORT_KEYS)).hexdigest()


def _agent_pin(step_id: str, agent_: Agent[Any, Any]) -> dict[str, Any]:
    """The agent's parts a resume must find unchanged: its function tools and output type."""
    tools: dict[str, str] = {}

    def collect(toolset: AbstractToolset[Any]) -> None:
        if isinstance(toolset, FunctionToolset):
            for name, found in toolset.tools.items():
                schema = orjson.dumps(
                    {
                        "description": found.description,
                        "parameters": found.function_schema.json_schema,
                    },
                    option=orjson.OPT_SORT_KEYS,
                )
                tools[name] = hashlib.sha256(schema).hexdigest()

    for toolset in agent_.toolsets:
        toolset.apply(collect)
    output_type = agent_.output_type
    return {
        "tools": dict(sorted(tools.items())),
        "output_type": getattr(output_type, "__qualname__", None) or repr(output_type),
        "name": agent_.name or step_id,
    }


class _Runner:
    """Runs one attempt of the step: the agent with its model and toolsets overridden."""

    def __init__(
        self,
        agent_: Agent[Any, Any],
        descriptor: _ModelDescriptor,
        parameters: Mapping[str, Any],
        max_turns: int,
        deps: Callable[[StepContext], Any] | None,
        retry: RetryPolicy,
    ) -> None:
        self._agent = agent_
        self._retry = retry
        self._descriptor = descriptor
        self._parameters = parameters
        self._max_turns = max_turns
        self._deps = deps

    async def __call__(self, world: World, ctx: StepContext, prompt: str) -> Any:
        manifest, manifest_hash = compute_manifest(
            self._descriptor, (), None, self._parameters, self._max_turns, prompt
        )
        session_id = session_stream_id(ctx.run_id, ctx.step_path, ctx.attempt)
        session = world.load_session(session_id)
        if session is None:
            session = HarnessSession(ctx.run_id, ctx.step_path, ctx.attempt)
            session.trigger(
                SessionStarted,
                run_id=ctx.run_id,
                step_path=ctx.step_path,
                attempt=ctx.attempt,
                manifest=manifest,
                manifest_hash=manifest_hash,
            )
            # Not saved alone: it is committed with turn 1's harness.model.called.
        elif session.started is None:
            raise ConversationDivergedError(
                f"run {ctx.run_id!r} step {ctx.step_path!r}: harness session {session_id} has"
                " events but no harness.session.started: the log is not one little_es wrote"
            )
        else:
            check_manifest(session.started, manifest)
        recorder = _Recorder(world, session, ctx, self._descriptor, self._retry)
        model = _RecordedModel(self._agent.model, recorder)  # type: ignore[arg-type]
        toolsets = [_RecordedToolset(t, recorder) for t in self._agent.toolsets]
        deps = None if self._deps is None else self._deps(ctx)
        with self._agent.override(model=model, toolsets=toolsets, tools=[]):
            try:
                result = await self._agent.run(
                    prompt,
                    deps=deps,
                    usage_limits=UsageLimits(request_limit=self._max_turns),
                )
            except UsageLimitExceeded as exc:
                # As the harness's own turn limit: a retry would stop at the same place,
                # after paying for every call again.
                raise TurnLimitExceededError(
                    f"{recorder.where()}: the agent still had requests to make after"
                    f" max_turns={self._max_turns} model requests; tell the model when to stop, or"
                    " give the step a higher max_turns in a new run (this run's agent cannot"
                    " change: a resume with another max_turns is refused as drift)"
                ) from exc
            except _pai_errors.UserError as exc:
                raise AgentUsageError(
                    f"{recorder.where()}: Pydantic AI refused to run the agent as it is built:"
                    f" {str(exc).rstrip('.')}. Fix the agent and start a new run (a resume of"
                    " this one with a changed agent is refused as drift)"
                ) from exc
        output: JSONValue = to_jsonable_python(result.output)
        recorder.complete(output)
        return output


def _errors(*names: str) -> tuple[type[BaseException], ...]:
    """Those of Pydantic AI's error classes ``names`` its installed version has."""
    return tuple(
        found
        for found in (getattr(_pai_errors, name, None) for name in names)
        if isinstance(found, type)
    )


_FINAL = _errors("ModelRequestRejectedError", "ModelQuotaExceededError")
"""Pydantic AI's errors of a request the provider refused for good (credentials, quota,
a context window too small, an unknown model): trying again cannot help."""

_API_ERROR = _errors("ModelAPIError", "ModelConnectionError", "ModelRequestTimeout")
"""Pydantic AI's errors of a call that failed at the provider or on the way (a dropped
connection, a timeout, a rate limit, an overloaded or failing server, an empty answer):
worth trying again, unless :data:`_FINAL`."""


def _model_error(exc: BaseException, label: str, provider: str) -> ModelError | None:
    """``exc``, Pydantic AI's error of one model request, as little_es's :class:`ModelError`,
    or None when it is no provider's error (a bug in the agent's own code)."""
    if isinstance(exc, ModelHTTPError):
        # Pydantic AI's own error says nothing of retrying: a status that cannot
        # succeed later (400, 401...) must not be tried again, nor a refusal its
        # category says is for good (a spent quota is a 429 on OpenAI).
        status = exc.status_code
        return ModelError(
            f"{label}: call failed with HTTP {status}: {exc}",
            retryable=(status in RETRYABLE_STATUSES or status >= 500)
            and not isinstance(exc, _FINAL),
            provider=provider,
            status=status,
            retry_after=_seconds(getattr(exc, "retry_after", None)),
        )
    if isinstance(exc, _API_ERROR):
        return ModelError(
            f"{label}: call failed: {type(exc).__name__}: {exc}",
            retryable=not isinstance(exc, _FINAL),
            provider=provider,
            retry_after=_seconds(getattr(exc, "retry_after", None)),
        )
    if isinstance(exc, FallbackExceptionGroup):
        # Every model of a FallbackModel failed: worth trying again if one of them is.
        each = [_model_error(e, label, provider) for e in exc.exceptions]
        if not each or None in each:
            return None
        mapped = [e for e in each if e is not None]
        waits = [e.retry_after for e in mapped if e.retryable and e.retry_after is not None]
        return ModelError(
            f"{label}: every fallback model failed: " + "; ".join(str(e) for e in mapped),
            retryable=any(e.retryable for e in mapped),
            provider=provider,
            retry_after=min(waits) if waits else None,
        )
    return None


def _seconds(value: object) -> float | None:
    """A ``retry_after`` of Pydantic AI's (its versions differ), as positive seconds."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if value > 0 else None


class _Recorder:
    """The session's memo as the agent's calls reach it: turn by turn, call by call."""

    def __init__(
        self,
        world: World,
        session: HarnessSession,
        ctx: StepContext,
        model: _ModelDescriptor,
        retry: RetryPolicy,
    ) -> None:
        self.world = world
        self.retry = retry
        self.session = session
        self.run_id = ctx.run_id
        self.step_path = ctx.step_path
        self.attempt = ctx.attempt
        self.model = model
        self.turn = 0
        self.hash = ""
        self.sent = 0
        self.usages: list[Usage] = []

    def where(self) -> str:
        return (
            f"run {self.run_id!r} step {self.step_path!r} (attempt {self.attempt}) turn {self.turn}"
        )

    def save(self, *, checked_next: bool = False) -> None:
        """Commit what the session holds; with ``checked_next`` (the guard's check of the
        call this commit records comes right after it, in this task) the commit also
        reads the run's stream for that check (``CallGuard.watch``)."""
        # A driver that lost its lease appends (and so calls) nothing more.
        check_leases()
        guard = current_guard() if checked_next else None
        save_session(self.world, self.session, None if guard is None else guard.watch())

    async def request(
        self, messages: Sequence[_pm.ModelMessage], send: Callable[[], Any]
    ) -> _pm.ModelResponse:
        self.turn += 1
        turn = self.turn
        conversation = _to_messages(messages)
        new = conversation[self.sent :]
        self.hash = conversation_hash(self.hash, new)
        self.sent = len(conversation)
        session = self.session
        called = session.called.get(turn)
        if called is None:
            # What the session's earlier events hold already (the previous response and
            # its tools' results) is not stored twice, when that is exactly how the new
            # messages begin; otherwise (instructions repeated by Pydantic AI, a retry
            # prompt) every new message is stored.
            implied = implied_messages(session, turn) if turn > 1 else []
            if implied and new[: len(implied)] == implied:
                session.trigger(
                    ModelCalled,
                    turn=turn,
                    messages=tuple(new[len(implied) :]),
                    implied=len(implied),
                    conversation_hash=self.hash,
                )
            else:
                session.trigger(
                    ModelCalled, turn=turn, messages=tuple(new), conversation_hash=self.hash
                )
        elif called.conversation_hash != self.hash:
            raise ConversationDivergedError(
                f"{self.where()}: the agent's conversation does not match the one recorded in"
                " harness.model.called (hash chain differs): the prompt, the agent or the"
                " recorded history changed since the session started; resume with the original"
                " agent, or start a new run"
            )
        recorded = session.responses.get(turn)
        if recorded is not None:
            # Answered from the log: the request is not sent again.
            self.usages.append(recorded.response.usage)
            # A recorded turn that had no ModelCalled of its own yet (it cannot happen
            # with a log little_es wrote) is committed here; otherwise nothing is appended.
            self.save()
            return _from_response(recorded.response, recorded.timestamp)
        # Committed before the request is sent.
        self.save(checked_next=True)
        guard = current_guard()

        async def mapped() -> _pm.ModelResponse:
            try:
                live: _pm.ModelResponse = await send()
            except Exception as exc:
                model = self.model
                error = _model_error(exc, f"{model.provider}:{model.model_id}", model.provider)
                if error is None:
                    raise
                raise error from exc
            return live

        live = await call_model(
            mapped, run_id=self.run_id, step_path=self.step_path, retry=self.retry
        )
        response = _to_response(live, self.model)
        responded = session.trigger(
            ModelResponded, turn=turn, response=response, step_path=self.step_path
        )
        self.save()
        if guard is not None:
            guard.model_responded(response, responded.timestamp)
        self.usages.append(response.usage)
        # What the agent sees is what a resume will see: the response rebuilt from its record.
        return _from_response(response, responded.timestamp)

    def call_id(self, tool_call_id: str | None, name: str) -> str:
        base = tool_call_id or name
        started = self.session.tool_calls.get(base)
        # Some models reuse ids across turns (call_0 every turn): the recorded id must name
        # one call of the session, the same on every resume.
        if started is None or started.turn == self.turn:
            return base
        return f"{base}#t{self.turn}"

    async def call_tool(
        self, name: str, args: dict[str, Any], tool_call_id: str | None, call: Callable[[], Any]
    ) -> Any:
        session = self.session
        call_id = self.call_id(tool_call_id, name)
        json_args = to_jsonable_python(args)
        started = session.tool_calls.get(call_id)
        if started is None:
            session.trigger(
                ToolCallStarted, turn=self.turn, call_id=call_id, name=name, args=json_args
            )
            # Committed before the tool runs.
            self.save(checked_next=True)
        elif started.name != name or started.args != json_args:
            raise ConversationDivergedError(
                f"{self.where()}: recorded tool call {call_id!r} ({started.name}) does not match"
                f" the agent's call ({name}): the log is inconsistent"
            )
        result = session.tool_results.get(call_id)
        if result is None:
            guard = current_guard()
            if guard is not None:
                guard.before_tool_calls(self.step_path)
            try:
                value = await call()
            except ModelRetry as exc:
                session.trigger(
                    ToolCallFailed,
                    call_id=call_id,
                    error=ErrorInfo(type="ModelRetry", message=exc.message, retryable=True),
                )
                self.save()
                raise
            except Exception as exc:
                session.trigger(
                    ToolCallFailed, call_id=call_id, error=ErrorInfo.from_exception(exc)
                )
                self.save()
                raise
            try:
                result_json: JSONValue = to_jsonable_python(value)
            except Exception as exc:
                raise ToolError(
                    f"tool {name!r} returned a {type(value).__name__}, which cannot be recorded"
                    f" as JSON ({exc}); return JSON data, a BaseModel or a dataclass"
                ) from exc
            session.trigger(ToolCallSucceeded, call_id=call_id, result=result_json)
            self.save()
            return result_json
        if isinstance(result, ToolCallFailed):
            if result.error.type == "ModelRetry":
                raise ModelRetry(result.error.message)
            # The tool's exception went on to fail the step: the recorded one does the same.
            raise ReplayedFailureError(result.error)
        return result.result

    def complete(self, output: JSONValue) -> None:
        if self.session.completed is None:
            self.session.trigger(
                SessionCompleted, usage=_sum_usage(self.usages), turns=self.turn, output=output
            )
        self.save()


class _RecordedModel(WrapperModel):
    """The agent's model, each ``request`` a recorded model call."""

    def __init__(self, wrapped: _PaiModel, recorder: _Recorder) -> None:
        super().__init__(wrapped)
        self._recorder = recorder

    async def request(
        self,
        messages: list[_pm.ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
    ) -> _pm.ModelResponse:
        async def send() -> _pm.ModelResponse:
            return await self.wrapped.request(messages, model_settings, model_request_parameters)

        return await self._recorder.request(messages, send)

    @asynccontextmanager
    async def request_stream(
        self,
        messages: list[_pm.ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
        run_context: RunContext[Any] | None = None,
    ) -> AsyncIterator[StreamedResponse]:
        raise SessionInputError(
            "a pydantic_ai_step runs its agent with agent.run(): streamed requests are not"
            " recorded; do not set an event_stream_handler on the agent"
        )
        yield  # pragma: no cover - makes this an async generator


class _RecordedToolset(WrapperToolset[Any]):
    """The agent's toolset, each ``call_tool`` a recorded tool call."""

    def __init__(self, wrapped: AbstractToolset[Any], recorder: _Recorder) -> None:
        super().__init__(wrapped)
        self._recorder = recorder

    async def call_tool(
        self, name: str, tool_args: dict[str, Any], ctx: RunContext[Any], tool: ToolsetTool[Any]
    ) -> Any:
        async def call() -> Any:
            return await self.wrapped.call_tool(name, tool_args, ctx, tool)

        return await self._recorder.call_tool(name, tool_args, ctx.tool_call_id, call)


# ------------------------------------------------------------------ mapping


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return orjson.dumps(to_jsonable_python(content), option=orjson.OPT_SORT_KEYS).decode()


def _tool_calls(parts: Sequence[_pm.ModelResponsePart]) -> tuple[ToolCall, ...]:
    return tuple(
        ToolCall(id=p.tool_call_id or p.tool_name, name=p.tool_name, arguments=p.args_as_dict())
        for p in parts
        if isinstance(p, _pm.ToolCallPart)
    )


def _to_messages(messages: Sequence[_pm.ModelMessage]) -> list[Message]:
    """The conversation as little_es messages: what the hash chain covers (no timestamps)."""
    out: list[Message] = []
    for message in messages:
        if isinstance(message, _ModelResponse):
            content = "".join(p.content for p in message.parts if isinstance(p, _pm.TextPart))
            calls = tuple(
                ToolCall(
                    id=p.tool_call_id or p.tool_name, name=p.tool_name, arguments=p.args_as_dict()
                )
                for p in message.parts
                if isinstance(p, _pm.ToolCallPart)
            )
            out.append(Message(role="assistant", content=content or None, tool_calls=calls))
            continue
        if message.instructions:
            out.append(Message(role="system", content=message.instructions))
        for part in message.parts:
            if isinstance(part, _pm.SystemPromptPart):
                out.append(Message(role="system", content=part.content))
            elif isinstance(part, _pm.UserPromptPart):
                out.append(Message(role="user", content=_text(part.content)))
            elif isinstance(part, _pm.ToolReturnPart):
                out.append(
                    Message(
                        role="tool",
                        content=_text(part.content),
                        tool_call_id=part.tool_call_id,
                        name=part.tool_name,
                    )
                )
            elif isinstance(part, _pm.RetryPromptPart):
                out.append(
                    Message(
                        role="tool" if part.tool_name else "user",
                        content=f"retry: {_text(part.content)}",
                        tool_call_id=part.tool_call_id if part.tool_name else None,
                        name=part.tool_name,
                    )
                )
    return out


def _to_response(live: _pm.ModelResponse, model: _ModelDescriptor) -> ModelResponse:
    content = "".join(p.content for p in live.parts if isinstance(p, _pm.TextPart))
    calls = _tool_calls(live.parts)
    usage = live.usage
    return ModelResponse(
        content=content or None,
        tool_calls=calls,
        usage=Usage.reported(
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            cached_input_tokens=usage.cache_read_tokens,
            reasoning_tokens=usage.output_reasoning_tokens,
            cache_write_tokens=usage.cache_write_tokens,
        ),
        provider=model.provider,
        model=live.model_name or model.model_id,
    )


def _from_response(response: ModelResponse, timestamp: Any) -> _pm.ModelResponse:
    parts: list[_pm.ModelResponsePart] = []
    if response.content:
        parts.append(_pm.TextPart(content=response.content))
    for call in response.tool_calls:
        parts.append(
            _pm.ToolCallPart(
                tool_name=call.name,
                args=dict(call.arguments)
                if call.unparsed_arguments is None
                else call.unparsed_arguments,
                tool_call_id=call.id,
            )
        )
    usage = response.usage
    return _pm.ModelResponse(
        parts=parts,
        usage=RequestUsage(
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            cache_read_tokens=usage.cached_input_tokens,
            output_reasoning_tokens=usage.reasoning_tokens,
            cache_write_tokens=usage.cache_write_tokens,
        ),
        model_name=response.model,
        timestamp=timestamp,
        provider_name=response.provider,
    )


def _sum_usage(usages: Sequence[Usage]) -> Usage:
    return Usage(
        input_tokens=sum(u.input_tokens for u in usages),
        output_tokens=sum(u.output_tokens for u in usages),
        cached_input_tokens=sum(u.cached_input_tokens for u in usages),
        reasoning_tokens=sum(u.reasoning_tokens for u in usages),
        cache_write_tokens=sum(u.cache_write_tokens for u in usages),
    )

"""A :class:`~little_es.harness.model.Model` over Anthropic's Messages API (Claude).

It uses the official ``anthropic`` package (the optional extra ``anthropic``):
``AsyncAnthropic().messages.create``, without streaming. Tool calls are
``tool_use`` content blocks, tool results go back as ``tool_result`` blocks in
the next user message, and the usage Anthropic reports is mapped to little_es's
convention: Anthropic's ``input_tokens`` leaves out the tokens read from and
written to the prompt cache, little_es's includes them, so

- ``input_tokens`` = ``input_tokens + cache_read_input_tokens + cache_creation_input_tokens``
- ``cached_input_tokens`` = ``cache_read_input_tokens``
- ``cache_write_tokens`` = ``cache_creation_input_tokens``
- ``reasoning_tokens`` = ``output_tokens_details.thinking_tokens`` where reported
  (they are part of ``output_tokens`` on both sides)

and each is priced at its own rate (genai-prices' Anthropic prices).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, cast

import orjson
from pydantic import ValidationError

try:
    import anthropic
    from anthropic.types import Message as AnthropicMessage
except ImportError as _exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "little_es.contrib.anthropic needs the anthropic package:"
        " pip install 'little-es[anthropic]'"
    ) from _exc

from little_es.contrib._provider import ProviderModel
from little_es.errors import ModelConfigError
from little_es.values import JSONValue, Message, ModelRequest, ModelResponse, ToolSpec, Usage

__all__ = ["AnthropicModel"]

# Keys this class fills in itself; a parameter with one of these names would
# silently override the conversation or switch the wire format to streaming.
_RESERVED_PARAMETERS = frozenset({"messages", "model", "tools", "stream", "system"})

# Stop reasons after which the answer cannot be used as it is.
_UNUSABLE_STOPS = {
    "pause_turn": "the model paused a long server-tool turn (pause_turn), which is not supported",
}

_DEFAULT_MAX_TOKENS = 4096


class AnthropicModel(ProviderModel):
    """A Claude model reached through ``AsyncAnthropic().messages.create``.

    ``parameters`` (``max_tokens``, ``temperature``, ``tool_choice``,
    ``cache_control``, ...) are sent with every call; a request's own
    ``ModelRequest.parameters`` override them key by key. The Messages API
    requires ``max_tokens``: ``max_tokens=`` here is used when no parameter
    sets it. Other parameters go in the request body as given.

    System messages of the conversation become the request's ``system`` text
    (joined by a blank line, in order), consecutive tool results one user
    message of ``tool_result`` blocks. Text and ``tool_use`` blocks of the answer
    are kept; ``thinking`` blocks are dropped (so extended thinking together
    with tool use, which needs them sent back, is not supported).

    Pass either ``client`` (an ``anthropic.AsyncAnthropic`` you configured) or
    ``base_url``/``api_key`` (a client is created with ``max_retries=0``: retries
    are the runtime's decision, made from :attr:`ModelError.retryable`).
    """

    _reserved_parameters = _RESERVED_PARAMETERS
    _filled_in = "messages, tools, the system text and the model"
    _api_key_variable = "ANTHROPIC_API_KEY"
    _status_advice = MappingProxyType(
        {413: "the request is too large; shorten the conversation or the tool results"}
    )

    def __init__(
        self,
        model_id: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        provider: str = "anthropic",
        client: anthropic.AsyncAnthropic | None = None,
        parameters: Mapping[str, JSONValue] | None = None,
        max_tokens: int = _DEFAULT_MAX_TOKENS,
    ) -> None:
        if not isinstance(model_id, str) or not model_id:
            raise ModelConfigError("AnthropicModel model_id must be a non-empty string")
        if not isinstance(provider, str) or not provider:
            raise ModelConfigError("AnthropicModel provider must be a non-empty string")
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ModelConfigError(
                f"AnthropicModel max_tokens must be an integer >= 1, got {max_tokens!r}"
            )
        if parameters is not None and not isinstance(parameters, Mapping):
            raise ModelConfigError(
                f"AnthropicModel parameters must be a mapping, got {type(parameters).__name__}"
            )
        params = dict(parameters or {})
        self._check_parameters(params, "AnthropicModel parameters", ModelConfigError)
        # A client we create is ours to close; a client passed in belongs to the caller.
        self._owns_client = client is None
        if client is not None:
            if base_url is not None or api_key is not None:
                raise ModelConfigError(
                    "AnthropicModel takes either client= or base_url=/api_key=, not both:"
                    " configure the client you pass"
                )
            if not isinstance(client, anthropic.AsyncAnthropic):
                raise ModelConfigError(
                    f"AnthropicModel client must be an anthropic.AsyncAnthropic,"
                    f" got {type(client).__name__}"
                )
        else:
            try:
                client = anthropic.AsyncAnthropic(base_url=base_url, api_key=api_key, max_retries=0)
            except anthropic.AnthropicError as exc:
                raise ModelConfigError(
                    f"cannot create the Anthropic client: {exc}. Pass api_key= or set"
                    " ANTHROPIC_API_KEY"
                ) from exc
        self._model_id = model_id
        self._provider = provider
        self._client = client
        self._max_tokens = max_tokens
        self._parameters: Mapping[str, JSONValue] = MappingProxyType(params)

    @property
    def request_settings(self) -> dict[str, JSONValue]:
        """The parameters and the ``max_tokens`` sent with every request (see
        :attr:`ProviderModel.request_settings`)."""
        return {"max_tokens": self._max_tokens, **self._parameters}

    async def aclose(self) -> None:
        """Close the HTTP client if this model created it (a client passed in is left open)."""
        if self._owns_client:
            await self._client.close()

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """Send ``request`` to the Messages endpoint and map the answer back.

        Raises :class:`~little_es.errors.ModelError`: retryable for connection
        errors, timeouts, 408/409/429 and 5xx (529 "overloaded" included); not
        retryable for other refusals (400, 401, 403, 404, 413, ...), for a
        request the client refuses to send and for answers that cannot be mapped.
        """
        if not isinstance(request, ModelRequest):
            raise self._error(
                f"complete expects a ModelRequest, got {type(request).__name__}", retryable=False
            )
        params = {**self._parameters, **request.parameters}
        self._check_parameters(params, "request parameters", self._parameter_error)
        max_tokens = params.pop("max_tokens", self._max_tokens)
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise self._error(
                f"the max_tokens parameter must be an integer >= 1, got {max_tokens!r}",
                retryable=False,
            )
        body: dict[str, Any] = dict(params)
        if request.tools:
            body["tools"] = [_tool_to_anthropic(spec) for spec in request.tools]
        system, messages = self._conversation(request.messages)
        if system is not None:
            body["system"] = system
        try:
            answer = await self._client.messages.create(
                model=self._model_id,
                max_tokens=max_tokens,
                messages=cast("Any", messages),
                extra_body=body,
            )
        except anthropic.APIStatusError as exc:
            raise self._status_error(exc.status_code, exc.message, exc.response.headers) from exc
        except anthropic.APIConnectionError as exc:
            # APITimeoutError is a subclass: both mean the request may not have
            # reached the model, so trying again can help.
            raise self._error(
                f"call failed ({type(exc).__name__}: {exc}); check base_url and the network,"
                " the runtime may retry",
                retryable=True,
            ) from exc
        except anthropic.AnthropicError as exc:
            raise self._error(
                f"call failed ({type(exc).__name__}: {exc}); the answer could not be used,"
                " check that base_url speaks the Anthropic Messages protocol",
                retryable=False,
            ) from exc
        except json.JSONDecodeError as exc:
            # The client's own json.loads of a 200 answer that is no JSON (a proxy's page).
            raise self._error(
                f"the answer is not JSON ({exc}); check that base_url speaks the Anthropic"
                " Messages protocol (a proxy or a web server answered)",
                retryable=False,
            ) from exc
        except (TypeError, ValueError) as exc:
            # Raised by the client before sending: no credentials resolved, or a
            # max_tokens it will only send streaming. The same request fails again.
            raise self._error(
                f"the client refused to send the request ({exc}); pass api_key= (or set"
                " ANTHROPIC_API_KEY) and keep max_tokens within a non-streaming call",
                retryable=False,
            ) from exc
        return self._response_from_anthropic(answer)

    def _conversation(
        self, messages: tuple[Message, ...]
    ) -> tuple[str | None, list[dict[str, Any]]]:
        system: list[str] = []
        turns: list[dict[str, Any]] = []
        for index, message in enumerate(messages):
            if message.role == "system":
                system.append(message.content or "")
                continue
            role = "assistant" if message.role == "assistant" else "user"
            blocks = self._blocks(message, index)
            # The API wants user and assistant turns to alternate, and every tool
            # result of a turn in the one user message after it: merge neighbours.
            if turns and turns[-1]["role"] == role:
                turns[-1]["content"].extend(blocks)
            else:
                turns.append({"role": role, "content": blocks})
        return ("\n\n".join(system) if system else None), turns

    def _blocks(self, message: Message, index: int) -> list[dict[str, Any]]:
        if message.role == "tool":
            if not message.tool_call_id:
                raise self._error(
                    f"messages[{index}] is a tool message without tool_call_id: every tool"
                    " result must name the call it answers",
                    retryable=False,
                )
            return [
                {
                    "type": "tool_result",
                    "tool_use_id": message.tool_call_id,
                    "content": message.content or "",
                }
            ]
        blocks: list[dict[str, Any]] = []
        # The API refuses an empty text block; an assistant turn of only tool calls has none.
        if message.content or not message.tool_calls:
            blocks.append({"type": "text", "text": message.content or ""})
        for call in message.tool_calls:
            blocks.append(
                {"type": "tool_use", "id": call.id, "name": call.name, "input": call.arguments}
            )
        return blocks

    def _response_from_anthropic(self, answer: AnthropicMessage) -> ModelResponse:
        if not isinstance(answer, AnthropicMessage) or not isinstance(
            getattr(answer, "content", None), list
        ):
            raise self._error(
                "the answer has no content blocks; check that the server speaks the"
                " Anthropic Messages protocol",
                retryable=False,
            )
        stop = getattr(answer, "stop_reason", None)
        if stop in _UNUSABLE_STOPS:
            raise self._error(_UNUSABLE_STOPS[stop], retryable=False)
        texts: list[str] = []
        calls: list[dict[str, JSONValue]] = []
        for block in answer.content:
            kind = getattr(block, "type", None)
            if kind == "text":
                texts.append(getattr(block, "text", "") or "")
            elif kind == "tool_use":
                calls.append(
                    {
                        "id": getattr(block, "id", None),
                        "name": getattr(block, "name", None),
                        "arguments": self._arguments(block),
                    }
                )
            elif kind in ("thinking", "redacted_thinking"):
                continue
            else:
                raise self._error(
                    f"the answer has a content block of type {kind!r}; only text, tool_use and"
                    " thinking blocks are supported (no server tools)",
                    retryable=False,
                )
        if calls and stop == "max_tokens":
            raise self._error(
                "the answer stopped at max_tokens inside a tool call, whose arguments may be"
                " cut off; raise max_tokens",
                retryable=False,
            )
        try:
            return ModelResponse.model_validate(
                {
                    "content": "".join(texts) if texts else None,
                    "tool_calls": calls,
                    "usage": _usage_from_anthropic(answer),
                    "provider": self._provider,
                    "model": getattr(answer, "model", None) or self._model_id,
                }
            )
        except ValidationError as exc:
            raise self._error(f"the answer cannot be used: {exc}", retryable=False) from exc

    def _arguments(self, block: Any) -> dict[str, JSONValue]:
        raw = getattr(block, "input", None)
        if raw is None:
            return {}
        if not isinstance(raw, dict):
            raise self._error(
                f"tool call {getattr(block, 'name', None)!r} has input that is not a JSON"
                f" object: {raw!r}",
                retryable=False,
            )
        try:
            # The client does not validate the input's values: keep only what JSON holds.
            decoded: dict[str, JSONValue] = orjson.loads(orjson.dumps(raw))
        except TypeError as exc:
            raise self._error(
                f"tool call {getattr(block, 'name', None)!r} has input that is not JSON ({exc})",
                retryable=False,
            ) from exc
        return decoded


def _tool_to_anthropic(spec: ToolSpec) -> dict[str, Any]:
    tool: dict[str, Any] = {
        "name": spec.name,
        "input_schema": spec.parameters or {"type": "object", "properties": {}},
    }
    if spec.description:
        tool["description"] = spec.description
    return tool


def _usage_from_anthropic(answer: AnthropicMessage) -> Usage:
    # Anthropic's input_tokens leaves the cache reads and writes out; little_es's
    # includes them. A count a compatible server leaves out is 0.
    usage = getattr(answer, "usage", None)
    uncached = getattr(usage, "input_tokens", None) or 0
    read = getattr(usage, "cache_read_input_tokens", None) or 0
    written = getattr(usage, "cache_creation_input_tokens", None) or 0
    output = getattr(usage, "output_tokens", None) or 0
    # Thinking tokens are part of output_tokens, where the API breaks them out.
    details = getattr(usage, "output_tokens_details", None)
    thinking = getattr(details, "thinking_tokens", None) or 0
    return Usage(
        input_tokens=uncached + read + written,
        output_tokens=output,
        cached_input_tokens=read,
        cache_write_tokens=written,
        reasoning_tokens=min(thinking, output),
    )

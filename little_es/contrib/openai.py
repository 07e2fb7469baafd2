"""A :class:`~little_es.harness.model.Model` over an OpenAI-compatible chat-completions API.

It uses the official ``openai`` package (the optional extra ``openai``), so it
serves OpenAI itself and every server that speaks the same protocol (vLLM,
Ollama, LiteLLM, ...) through ``base_url``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, cast

import orjson
from pydantic import ValidationError

try:
    import openai
    from openai.types.chat import ChatCompletion, ChatCompletionMessageParam
except ImportError as _exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "little_es.contrib.openai needs the openai package: pip install 'little-es[openai]'"
    ) from _exc

from little_es.contrib._provider import ProviderModel
from little_es.errors import ModelConfigError
from little_es.harness.tools import read_arguments
from little_es.values import JSONValue, Message, ModelRequest, ModelResponse, ToolSpec, Usage

__all__ = ["OpenAIChatModel"]

# Keys this class fills in itself; a parameter with one of these names would
# silently override the conversation or switch the wire format to streaming.
_RESERVED_PARAMETERS = frozenset({"messages", "model", "tools", "stream"})


class OpenAIChatModel(ProviderModel):
    """A model reached through ``AsyncOpenAI().chat.completions.create``.

    ``parameters`` (temperature, max_tokens, tool_choice, ...) are sent with
    every call; a request's own ``ModelRequest.parameters`` override them key
    by key. They are sent in the request body as given, so parameters a
    compatible server adds (``top_k`` on vLLM, ...) work too.

    Pass either ``client`` (an ``openai.AsyncOpenAI`` you configured) or
    ``base_url``/``api_key`` (a client is created with ``max_retries=0``: retries
    are the runtime's decision, made from :attr:`ModelError.retryable`).
    """

    _reserved_parameters = _RESERVED_PARAMETERS
    _filled_in = "messages, tools and the model"
    _api_key_variable = "OPENAI_API_KEY"

    def __init__(
        self,
        model_id: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        provider: str = "openai",
        client: openai.AsyncOpenAI | None = None,
        parameters: Mapping[str, JSONValue] | None = None,
    ) -> None:
        if not isinstance(model_id, str) or not model_id:
            raise ModelConfigError("OpenAIChatModel model_id must be a non-empty string")
        if not isinstance(provider, str) or not provider:
            raise ModelConfigError("OpenAIChatModel provider must be a non-empty string")
        if parameters is not None and not isinstance(parameters, Mapping):
            raise ModelConfigError(
                f"OpenAIChatModel parameters must be a mapping, got {type(parameters).__name__}"
            )
        params = dict(parameters or {})
        self._check_parameters(params, "OpenAIChatModel parameters", ModelConfigError)
        # A client we create is ours to close; a client passed in belongs to the caller.
        self._owns_client = client is None
        if client is not None:
            if base_url is not None or api_key is not None:
                raise ModelConfigError(
                    "OpenAIChatModel takes either client= or base_url=/api_key=, not both:"
                    " configure the client you pass"
                )
            if not isinstance(client, openai.AsyncOpenAI):
                raise ModelConfigError(
                    f"OpenAIChatModel client must be an openai.AsyncOpenAI,"
                    f" got {type(client).__name__}"
                )
        else:
            try:
                client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
            except openai.OpenAIError as exc:
                raise ModelConfigError(
                    f"cannot create the OpenAI client: {exc}. Pass api_key= or set"
                    " OPENAI_API_KEY (a local server such as Ollama accepts any non-empty key)"
                ) from exc
        self._model_id = model_id
        self._provider = provider
        self._client = client
        self._parameters: Mapping[str, JSONValue] = MappingProxyType(params)

    async def aclose(self) -> None:
        """Close the HTTP client if this model created it (a client passed in is left open)."""
        if self._owns_client:
            await self._client.close()

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """Send ``request`` to the chat-completions endpoint and map the answer back.

        Raises :class:`~little_es.errors.ModelError`: retryable for connection
        errors, timeouts, 408/409/429 and 5xx; not retryable for other refusals
        (400, 401, 403, 404, 422, ...) and for answers that cannot be mapped.
        """
        if not isinstance(request, ModelRequest):
            raise self._error(
                f"complete expects a ModelRequest, got {type(request).__name__}", retryable=False
            )
        params = {**self._parameters, **request.parameters}
        self._check_parameters(params, "request parameters", self._parameter_error)
        body: dict[str, Any] = dict(params)
        if request.tools:
            body["tools"] = [_tool_to_chat(spec) for spec in request.tools]
        messages = [self._message_to_chat(m, i) for i, m in enumerate(request.messages)]
        try:
            completion = await self._client.chat.completions.create(
                model=self._model_id,
                messages=cast("list[ChatCompletionMessageParam]", messages),
                extra_body=body,
            )
        except openai.APIStatusError as exc:
            raise self._status_error(exc.status_code, exc.message, exc.response.headers) from exc
        except openai.APIConnectionError as exc:
            # APITimeoutError is a subclass: both mean the request may not have
            # reached the model, so trying again can help.
            raise self._error(
                f"call failed ({type(exc).__name__}: {exc}); check base_url and the network,"
                " the runtime may retry",
                retryable=True,
            ) from exc
        except openai.OpenAIError as exc:
            raise self._error(
                f"call failed ({type(exc).__name__}: {exc}); the answer could not be used,"
                " check that base_url speaks the OpenAI chat-completions protocol",
                retryable=False,
            ) from exc
        except json.JSONDecodeError as exc:
            # The client's own json.loads of a 200 answer that is no JSON (a proxy's page).
            raise self._error(
                f"the answer is not JSON ({exc}); check that base_url speaks the OpenAI"
                " chat-completions protocol (a proxy or a web server answered)",
                retryable=False,
            ) from exc
        return self._response_from_chat(completion)

    def _message_to_chat(self, message: Message, index: int) -> dict[str, Any]:
        if message.role == "tool":
            if not message.tool_call_id:
                raise self._error(
                    f"messages[{index}] is a tool message without tool_call_id: every tool"
                    " result must name the call it answers",
                    retryable=False,
                )
            return {
                "role": "tool",
                "tool_call_id": message.tool_call_id,
                "content": message.content or "",
            }
        chat: dict[str, Any] = {"role": message.role}
        if message.role == "assistant":
            # null content is only valid next to tool calls.
            chat["content"] = message.content if message.tool_calls else message.content or ""
            if message.tool_calls:
                chat["tool_calls"] = [
                    {
                        "id": call.id,
                        "type": "function",
                        "function": {
                            "name": call.name,
                            # As the model sent them, when they could not be read.
                            "arguments": orjson.dumps(call.arguments).decode()
                            if call.unparsed_arguments is None
                            else call.unparsed_arguments,
                        },
                    }
                    for call in message.tool_calls
                ]
        else:
            chat["content"] = message.content or ""
        if message.name is not None:
            chat["name"] = message.name
        return chat

    def _response_from_chat(self, completion: ChatCompletion) -> ModelResponse:
        if not isinstance(completion, ChatCompletion) or not getattr(completion, "choices", None):
            raise self._error(
                "the answer has no choices; check that the server supports chat completions",
                retryable=False,
            )
        reply = completion.choices[0].message
        calls: list[dict[str, JSONValue]] = []
        for raw in reply.tool_calls or ():
            function = getattr(raw, "function", None)
            if getattr(raw, "type", "function") != "function" or function is None:
                raise self._error(
                    f"the answer has a tool call of type {getattr(raw, 'type', None)!r};"
                    " only function tools are supported",
                    retryable=False,
                )
            text = function.arguments or ""
            arguments = read_arguments(function.name, text)
            if isinstance(arguments, str):
                # Recorded with the answer (paid for) and failed as the call's own error,
                # which the model is told.
                calls.append({"id": raw.id, "name": function.name, "unparsed_arguments": text})
            else:
                calls.append({"id": raw.id, "name": function.name, "arguments": arguments})
        try:
            return ModelResponse.model_validate(
                {
                    "content": reply.content,
                    "tool_calls": calls,
                    "usage": _usage_from_chat(completion),
                    "provider": self._provider,
                    "model": getattr(completion, "model", None) or self._model_id,
                }
            )
        except ValidationError as exc:
            raise self._error(f"the answer cannot be used: {exc}", retryable=False) from exc


def _tool_to_chat(spec: ToolSpec) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": spec.name,
            "description": spec.description,
            "parameters": spec.parameters or {"type": "object", "properties": {}},
        },
    }


def _usage_from_chat(completion: ChatCompletion) -> Usage:
    # The client does not validate answers strictly, so compatible servers may
    # leave any of these out; a missing count is 0.
    usage = getattr(completion, "usage", None)
    prompt_details = getattr(usage, "prompt_tokens_details", None)
    completion_details = getattr(usage, "completion_tokens_details", None)
    return Usage.reported(
        input_tokens=getattr(usage, "prompt_tokens", None) or 0,
        output_tokens=getattr(usage, "completion_tokens", None) or 0,
        cached_input_tokens=getattr(prompt_details, "cached_tokens", None) or 0,
        reasoning_tokens=getattr(completion_details, "reasoning_tokens", None) or 0,
    )

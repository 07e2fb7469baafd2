"""Value objects a harness session exchanges with a model.

They are frozen pydantic models because they travel inside recorded events:
what the model saw and said must read back exactly as it was written.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

JSONValue = Any
"""Any value that survives a JSON round trip (dict, list, str, int, float, bool, None)."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ToolCall(_Frozen):
    """A model's request to run one tool with arguments."""

    id: str = Field(min_length=1, description="The call id the model gave, e.g. 'c42'.")
    name: str = Field(min_length=1)
    arguments: dict[str, JSONValue] = Field(default_factory=dict)


class Message(_Frozen):
    """One message of a conversation.

    ``role`` is ``system``, ``user``, ``assistant`` (possibly with tool calls)
    or ``tool`` (the result of the tool call named by ``tool_call_id``).
    """

    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None


class ToolSpec(_Frozen):
    """What the model is told about a tool: its name, description and JSON schema."""

    name: str = Field(min_length=1)
    description: str = ""
    parameters: dict[str, JSONValue] = Field(default_factory=dict)


class Usage(_Frozen):
    """Token counts a provider reported for one model call.

    ``input_tokens`` includes ``cached_input_tokens`` and ``output_tokens``
    includes ``reasoning_tokens`` (OpenAI's convention, which the pricing
    follows); a model adapter whose provider counts them apart adds them in.

    There is deliberately no cost field: dollars are computed from tokens by
    the pricing module at materialization time, never recorded. A payload that
    carries ``cost_usd`` (or ``cost``) is refused.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    input_tokens: int = Field(default=0, ge=0)
    output_tokens: int = Field(default=0, ge=0)
    cached_input_tokens: int = Field(default=0, ge=0)
    reasoning_tokens: int = Field(default=0, ge=0)

    @model_validator(mode="before")
    @classmethod
    def _refuse_cost(cls, data: Any) -> Any:
        if isinstance(data, dict):
            costly = sorted(k for k in data if "cost" in str(k).lower())
            if costly:
                raise ValueError(
                    f"usage must not carry a cost ({', '.join(costly)}): record token counts only;"
                    " little_es prices calls itself from provider and model"
                    " (see little_es.pricing.register_model_price)"
                )
        return data

    @model_validator(mode="after")
    def _parts_within_totals(self) -> Usage:
        if self.cached_input_tokens > self.input_tokens:
            raise ValueError(
                f"cached_input_tokens ({self.cached_input_tokens}) exceeds input_tokens"
                f" ({self.input_tokens}): input_tokens must include the cached ones"
            )
        if self.reasoning_tokens > self.output_tokens:
            raise ValueError(
                f"reasoning_tokens ({self.reasoning_tokens}) exceeds output_tokens"
                f" ({self.output_tokens}): output_tokens must include the reasoning ones"
            )
        return self


class ModelRequest(_Frozen):
    """Everything a model call depends on: the whole conversation, tools, parameters."""

    messages: tuple[Message, ...]
    tools: tuple[ToolSpec, ...] = ()
    parameters: dict[str, JSONValue] = Field(default_factory=dict)


class ModelResponse(_Frozen):
    """A model's answer: text and/or tool calls, the usage it reported, and who answered."""

    content: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    usage: Usage = Field(default_factory=Usage)
    provider: str = Field(min_length=1)
    model: str = Field(min_length=1)

    @field_validator("tool_calls")
    @classmethod
    def _unique_call_ids(cls, calls: tuple[ToolCall, ...]) -> tuple[ToolCall, ...]:
        ids = [c.id for c in calls]
        if len(ids) != len(set(ids)):
            raise ValueError(f"tool call ids must be unique within a response, got {ids}")
        return calls

    def as_message(self) -> Message:
        """The assistant message this response adds to the conversation."""
        return Message(role="assistant", content=self.content, tool_calls=self.tool_calls)

"""The value types: what events, the reducer, models and tools exchange.

This module sits at the bottom of little_es and imports nothing from it, so
every layer above (events, the reducer, the harness, both engines) can use
these types without pulling anything else in. They are frozen pydantic models
because they travel inside recorded events: what was written must read back
exactly as it was.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from decimal import Decimal
from typing import Any, Literal, Protocol, Self, runtime_checkable

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic_core import ErrorDetails

JSONValue = Any
"""Any value that survives a JSON round trip (dict, list, str, int, float, bool, None).

Numbers are finite (no NaN or Infinity) and arrays and objects nest at most
``little_es.MAX_JSON_DEPTH`` (64) levels: the recorder refuses anything
else, since it could not be read back as it was written."""

UNCHECKED_KEY = "__little_es_unchecked__"
"""Where :meth:`Checked.model_construct` keeps what it was given outside the schema.

Its presence in an object's ``__dict__`` marks an object pydantic did not
validate; the recorder validates it in full before it is stored
(:mod:`little_es._strict`). Never a field: it is neither dumped nor compared."""


class Checked(BaseModel):
    """A pydantic model whose unvalidated instances the recorder can tell apart.

    ``model_construct`` and ``model_copy(update=...)`` skip validation (and
    ``model_construct`` drops a keyword that is not a field, such as a
    ``cost_usd`` given to :class:`Usage`): an object built so is marked, so
    that recording an event that holds it validates it as a reader would, and
    refuses the dropped keyword by name instead of losing it.
    """

    @classmethod
    def model_construct(  # type: ignore[override]  # pydantic's mypy plugin types it per model
        cls, _fields_set: set[str] | None = None, **values: Any
    ) -> Self:
        """pydantic's ``model_construct``, marking the object as not validated."""
        made = super().model_construct(_fields_set, **values)
        fields = cls.__pydantic_fields__
        aliases = {f.alias for f in fields.values() if f.alias}
        made.__dict__[UNCHECKED_KEY] = tuple(
            k for k in values if k not in fields and k not in aliases
        )
        return made

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """pydantic's ``model_copy``; a copy with ``update`` is marked as not validated."""
        copied = super().model_copy(update=update, deep=deep)
        if update:
            copied.__dict__.setdefault(UNCHECKED_KEY, ())
        return copied


class _Frozen(Checked):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class ToolCall(_Frozen):
    """A model's request to run one tool with arguments."""

    id: str = Field(min_length=1, description="The call id the model gave, e.g. 'c42'.")
    name: str = Field(min_length=1)
    arguments: dict[str, JSONValue] = Field(default_factory=dict)
    unparsed_arguments: str | None = Field(
        default=None,
        description=(
            "The arguments as the model sent them, when they are no JSON object that can be"
            " read as it meant it (``arguments`` is then empty): the call fails with"
            " ToolArgumentsError and the model is told, and later requests send the text"
            " back as it was."
        ),
    )

    @model_validator(mode="after")
    def _unparsed_has_no_arguments(self) -> Self:
        # A tool must never run with a part of what the model meant.
        if self.unparsed_arguments is not None and self.arguments:
            raise ValueError("a tool call with unparsed_arguments has no arguments")
        return self

    @model_serializer(mode="wrap")
    def _without_unparsed(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # Left out when None, in every dump: a session's conversation hashes, recorded
        # before the field was, hash the dumps of their messages.
        dumped: dict[str, Any] = handler(self)
        if dumped.get("unparsed_arguments", "") is None:
            del dumped["unparsed_arguments"]
        return dumped


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


MAX_TOKENS = 2**53
"""The most tokens a :class:`Usage` may count of one kind: far past any call's, and so far
inside a JSON integer's range (:data:`~little_es.JSON_INT_RANGE`) that the sums of a
session's or a run's calls stay in it too (a count past it would be recorded call by call,
then break the record of their sum)."""


class Usage(_Frozen):
    """Token counts a provider reported for one model call.

    ``input_tokens`` is the whole prompt: it includes ``cached_input_tokens``
    (read from a prompt cache) and ``cache_write_tokens`` (written to it), and
    ``output_tokens`` includes ``reasoning_tokens`` (OpenAI's convention, which
    genai-prices and the pricing follow); a model adapter whose provider counts
    them apart adds them in (Anthropic reports cache reads and writes outside
    ``input_tokens``: :mod:`little_es.contrib.anthropic` sums the three).

    There is deliberately no cost field: dollars are computed from tokens by
    the pricing module at materialization time, never recorded. A payload that
    carries ``cost_usd`` (or ``cost``) is refused.
    """

    input_tokens: int = Field(default=0, ge=0, le=MAX_TOKENS)
    output_tokens: int = Field(default=0, ge=0, le=MAX_TOKENS)
    cached_input_tokens: int = Field(default=0, ge=0, le=MAX_TOKENS)
    reasoning_tokens: int = Field(default=0, ge=0, le=MAX_TOKENS)
    cache_write_tokens: int = Field(default=0, ge=0, le=MAX_TOKENS)
    """Prompt tokens written to the provider's cache (priced at its cache-write rate)."""

    @classmethod
    def reported(
        cls,
        *,
        input_tokens: int,
        output_tokens: int,
        cached_input_tokens: int = 0,
        reasoning_tokens: int = 0,
        cache_write_tokens: int = 0,
    ) -> Usage:
        """A provider's counts, each part cut to its total where a server reports it past
        that (reasoning tokens outside the completion's, say): the answer is paid for and
        must be recorded, and a count the totals do not hold cannot be priced."""
        cached = min(cached_input_tokens, input_tokens)
        return cls(
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            cached_input_tokens=cached,
            cache_write_tokens=min(cache_write_tokens, input_tokens - cached),
            reasoning_tokens=min(reasoning_tokens, output_tokens),
        )

    @model_validator(mode="after")
    def _parts_within_totals(self) -> Usage:
        if self.cached_input_tokens + self.cache_write_tokens > self.input_tokens:
            raise ValueError(
                f"cached_input_tokens ({self.cached_input_tokens}) plus cache_write_tokens"
                f" ({self.cache_write_tokens}) exceeds input_tokens ({self.input_tokens}):"
                " input_tokens must include the tokens read from and written to the cache"
            )
        if self.reasoning_tokens > self.output_tokens:
            raise ValueError(
                f"reasoning_tokens ({self.reasoning_tokens}) exceeds output_tokens"
                f" ({self.output_tokens}): output_tokens must include the reasoning ones"
            )
        return self


_NO_USAGE = Usage()
"""The usage of a response that reports none: all counts zero."""


def usage_cost_message(keys: list[str]) -> str:
    """Why a usage carrying ``keys`` (cost fields) is refused, and what to record instead."""
    return (
        f"usage must not carry a cost ({', '.join(sorted(keys))}): record token counts only;"
        " little_es prices calls itself from provider and model"
        " (see little_es.pricing.register_model_price)"
    )


def is_usage_cost_error(error: ErrorDetails) -> bool:
    """Whether a validation error is a cost key given to a ``usage`` (a :class:`Usage`).

    ``extra="forbid"`` refuses such a key inside pydantic-core at no cost on the
    hot read path (a Python before-validator doubled a Usage's validation
    time); this tells the refusal apart so callers can explain it.
    """
    loc = error["loc"]
    return len(loc) >= 2 and loc[-2] == "usage" and _is_cost_key(error)


def _is_cost_key(error: ErrorDetails) -> bool:
    return error["type"] == "extra_forbidden" and "cost" in str(error["loc"][-1]).lower()


class ModelRequest(_Frozen):
    """Everything a model call depends on: the whole conversation, tools, parameters."""

    messages: tuple[Message, ...]
    tools: tuple[ToolSpec, ...] = ()
    parameters: dict[str, JSONValue] = Field(default_factory=dict)


class ModelResponse(_Frozen):
    """A model's answer: text and/or tool calls, the usage it reported, and who answered."""

    content: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    # One shared zero Usage (frozen): serialised with exclude_defaults, as every recorded
    # response is, the default is made for the comparison each time, and building a Usage
    # runs its validators (measured: a third of a ModelResponded's serialisation).
    usage: Usage = Field(default_factory=lambda: _NO_USAGE)
    provider: str = Field(min_length=1)
    model: str = Field(min_length=1)

    @field_validator("tool_calls")
    @classmethod
    def _unique_call_ids(cls, calls: tuple[ToolCall, ...]) -> tuple[ToolCall, ...]:
        if len(calls) < 2:
            return calls
        ids = [c.id for c in calls]
        if len(ids) != len(set(ids)):
            raise ValueError(f"tool call ids must be unique within a response, got {ids}")
        return calls

    def as_message(self) -> Message:
        """The assistant message this response adds to the conversation."""
        return Message(role="assistant", content=self.content, tool_calls=self.tool_calls)


# ------------------------------------------------------------------ records


class ArtifactRef(_Frozen):
    """The manifest of one stored artifact, as recorded in events."""

    artifact_id: str = Field(description="sha256:<hex>, the content address of the bytes.")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    size: int = Field(ge=0)
    media_type: str = "application/octet-stream"
    run_id: str
    step_path: str


class HydratedArtifact(BaseModel):
    """An artifact's manifest together with its bytes, verified against the manifest's sha256.

    Large outputs are stored once, by the sha256 of their bytes, in the world's
    :class:`~little_es.backends.base.ArtifactStore`; events carry only the
    :class:`ArtifactRef`. Reading one back gives this.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    manifest: ArtifactRef
    payload: bytes


class ErrorInfo(_Frozen):
    """A recorded failure: exception type, message, and whether a retry can help."""

    type: str
    message: str
    retryable: bool = True

    @classmethod
    def from_exception(cls, exc: BaseException, *, retryable: bool | None = None) -> ErrorInfo:
        """Describe ``exc``; ``retryable`` defaults to the exception's own flag or True.

        An exception that carries the failure it stands for (``recorded_error``, as
        :class:`~little_es.errors.ReplayedFailureError` does) is described by it. Else
        the message is ``str(exc)``, cut to :data:`MAX_ERROR_MESSAGE` characters (a log
        records it with every failed attempt, and Temporal refuses a failure of a few
        megabytes, so such a step would be retried for ever there); an exception whose
        ``str()`` raises is described by its type.
        """
        recorded = getattr(exc, "recorded_error", None)
        if isinstance(recorded, ErrorInfo):
            # A failure answered from the log (ReplayedFailureError): the one recorded.
            return (
                recorded
                if retryable is None
                else recorded.model_copy(update={"retryable": retryable})
            )
        flag = getattr(exc, "retryable", True) if retryable is None else retryable
        return cls(type=type(exc).__qualname__, message=error_message(exc), retryable=bool(flag))


MAX_ERROR_MESSAGE = 16_384
"""The most characters of an exception's message a recorded failure keeps."""


def error_message(exc: BaseException) -> str:
    """``str(exc)`` as a failure records it (see :meth:`ErrorInfo.from_exception`)."""
    try:
        message = str(exc)
    except Exception as inner:  # a user's __str__ that fails: the failure is still theirs
        return f"({type(exc).__qualname__} whose str() raised {type(inner).__qualname__})"
    if len(message) <= MAX_ERROR_MESSAGE:
        return message
    cut = len(message) - MAX_ERROR_MESSAGE
    return f"{message[:MAX_ERROR_MESSAGE]}… [{cut:,} more characters not recorded]"


# ------------------------------------------------------------------ totals


class UsageTotals(BaseModel):
    """Token and dollar totals of a scope (a step, or the whole run).

    ``cost_usd_exact`` is the exact sum (each call's cost to the picodollar,
    summed in integers, so it never depends on the order calls were folded);
    ``cost_usd`` is the same figure as a float, for display. Sum exact figures.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    input_tokens: int = 0
    output_tokens: int = 0
    cached_input_tokens: int = 0
    reasoning_tokens: int = 0
    cache_write_tokens: int = 0
    cost_usd: float | None = 0.0
    """USD over the priced calls; None only when there were calls and none was priced."""
    cost_usd_exact: Decimal | None = Decimal(0)
    """``cost_usd`` exactly (None when it is None)."""
    unpriced_calls: int = 0
    calls: int = 0

    @model_validator(mode="before")
    @classmethod
    def _exact_and_float_agree(cls, data: Any) -> Any:
        # One given without the other (a state stored before the exact field existed,
        # or a hand-built total): derive the missing one, so both always say the same.
        if isinstance(data, dict):
            has_float, has_exact = "cost_usd" in data, "cost_usd_exact" in data
            if has_float and not has_exact:
                value = data["cost_usd"]
                exact = None if value is None else Decimal(repr(float(value)))
                data = {**data, "cost_usd_exact": exact}
            elif has_exact and not has_float:
                exact = data["cost_usd_exact"]
                data = {**data, "cost_usd": None if exact is None else float(Decimal(exact))}
        return data


MAX_BUDGET_COUNT = 2**64 - 1
"""The largest ``tokens`` or ``model_calls`` limit: the largest integer the log holds (its JSON
integers are 64-bit), so a budget that is accepted can be recorded (``BudgetSet``)."""


class Budget(_Frozen):
    """Limits on what a run (with its sub-runs) or one agent step may spend on model calls.

    Checked before every model call against the totals recorded so far: when
    any limit is reached (``spent >= limit``), the next call would start past
    it and is not made. ``usd`` counts priced calls only (an unpriced call adds
    no dollars; the error says how many there were); ``tokens`` counts input
    plus output tokens and ``model_calls`` every call, priced or not. None:
    no limit of that kind.
    """

    usd: Decimal | None = Field(default=None, ge=0, allow_inf_nan=False)
    tokens: int | None = Field(default=None, ge=0, le=MAX_BUDGET_COUNT)
    model_calls: int | None = Field(default=None, ge=0, le=MAX_BUDGET_COUNT)

    def exceeded(self, spent: UsageTotals) -> str | None:
        """What limit ``spent`` has reached, in words, or None while the next call may start."""
        if self.model_calls is not None and spent.calls >= self.model_calls:
            return f"{spent.calls} model calls of a budget of {self.model_calls}"
        used = spent.input_tokens + spent.output_tokens
        if self.tokens is not None and used >= self.tokens:
            return f"{used:,} tokens (input + output) of a budget of {self.tokens:,}"
        cost = spent.cost_usd_exact or Decimal(0)
        if self.usd is not None and cost >= self.usd:
            unpriced = spent.unpriced_calls
            note = (
                f" ({unpriced} unpriced call{'' if unpriced == 1 else 's'} not counted in dollars:"
                " give their model a price with `little prices set`, or add a tokens= or"
                " model_calls= limit)"
                if unpriced
                else ""
            )
            return f"${cost} of a budget of ${self.usd}{note}"
        return None


class Pricer(Protocol):
    """Prices one model call made at ``at``: exact USD for ``usage`` of ``model_id``, or None.

    None means the model has no known price (the call counts as unpriced).
    ``at`` is the call's time (the ``harness.model.responded`` timestamp), so a
    price that changed since is applied as it was then. The reducer is handed
    one rather than looking prices up itself, so the same fold gives the same
    dollars wherever the pricer comes from: a world's is
    :meth:`little_es.world.World.pricer`, :func:`little_es.pricing.price_usage_exact`
    is one without the world's recorded prices.
    """

    def __call__(
        self, provider: str, model_id: str, usage: Usage, at: datetime
    ) -> Decimal | None: ...


@runtime_checkable
class PicodollarPricer(Pricer, Protocol):
    """A :class:`Pricer` that also gives a call's cost in integer picodollars (10^-12 USD).

    The reducer sums picodollars; given a pricer of this kind it asks for them
    directly instead of converting each Decimal (a world's pricer is one). The
    two must agree: ``picodollars(...)`` is ``__call__(...)`` rounded half to even.
    """

    def picodollars(
        self, provider: str, model_id: str, usage: Usage, at: datetime
    ) -> int | None: ...

"""Model prices: what one recorded model call cost, in US dollars.

This is the single place a dollar figure is produced (the reducer calls
:func:`price_usage` for every ``harness.model.responded``). Prices come from
two sources, in this order:

1. overrides the application registered with :func:`register_model_price`;
2. the price data bundled with the installed ``genai-prices`` package.

Nothing here reaches the network. genai-prices can refresh its prices from a
remote URL (``genai_prices.UpdatePrices``); little_es never starts that, and
reads the bundled data directly even if the application started it, so a run's
cost depends only on its log, the installed genai-prices version and the
registered overrides. To take newer prices, upgrade genai-prices or register an
override.

Token conventions (genai-prices' own, which is OpenAI's):

- ``Usage.input_tokens`` is the whole prompt and *includes*
  ``cached_input_tokens``; the cached part is charged at the cached rate and
  the rest at the input rate. (Anthropic reports cache reads separately; an
  adapter for it must add them into ``input_tokens``.)
- ``Usage.output_tokens`` is the whole completion and *includes*
  ``reasoning_tokens`` (OpenAI counts reasoning inside ``completion_tokens``).
  Reasoning tokens are never charged twice: they are charged at the reasoning
  rate where the data has one (a few models do) and at the output rate
  otherwise, and only the remaining output tokens at the output rate.

:func:`price_usage` applies exactly genai-prices' rules for these four counts:
its long-context tiers (the rate every token of a kind pays is chosen by the
call's total ``input_tokens``) and its per-request fees, so its figure equals
``genai_prices.calc_price(...).total_price``. :class:`ModelInfo` shows the
base-tier rates.

Lookups are cached per ``(provider, model_id)`` for the life of the process;
time-dependent prices in the data (dated price changes, off-peak hours) are
resolved when a model is first looked up.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Final

from pydantic import BaseModel, ConfigDict, Field

from little_es.errors import PricingError
from little_es.values import Usage

if TYPE_CHECKING:
    from genai_prices.data_snapshot import DataSnapshot
    from genai_prices.types import ModelPrice

__all__ = [
    "ModelInfo",
    "get_model_info_for",
    "price_usage",
    "register_model_price",
    "unregister_model_price",
]


class ModelInfo(BaseModel):
    """One model's prices in US dollars per million tokens.

    ``cached_input_per_mtok`` is ``None`` when cached input tokens cost the same
    as other input tokens, and ``reasoning_per_mtok`` is ``None`` when reasoning
    tokens cost the same as other output tokens (the usual case, OpenAI's
    included). A price the data leaves out is ``0.0``: genai-prices charges
    nothing for it. For models with long-context tiers these are the base-tier
    rates; :func:`price_usage` applies the tiers.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    provider: str = Field(min_length=1, description="Provider id, e.g. 'openai'.")
    model_id: str = Field(
        min_length=1,
        description="The model id that was priced, e.g. 'gpt-4o' for 'gpt-4o-2024-08-06'.",
    )
    input_per_mtok: float = Field(ge=0)
    output_per_mtok: float = Field(ge=0)
    cached_input_per_mtok: float | None = Field(default=None, ge=0)
    reasoning_per_mtok: float | None = Field(default=None, ge=0)


# A rate is a base USD/MTok price plus long-context tiers as (above_input_tokens, price),
# highest threshold first so the first tier the call's input exceeds is the one that applies.
_Rate = tuple[float, tuple[tuple[int, float], ...]]


@dataclass(frozen=True, slots=True)
class _Entry:
    info: ModelInfo
    input: _Rate
    output: _Rate
    cached_input: _Rate | None
    reasoning: _Rate | None
    per_request_usd: float


_MTOK: Final = 1_000_000
# genai-prices prices requests per thousand (its `requests_kcount` key).
_REQUESTS_PER_PRICE: Final = 1_000

_lock = threading.Lock()
# Keyed by the arguments exactly as passed, so a hit is one dict lookup; `None` caches "unpriced".
_cache: dict[tuple[object, object], _Entry | None] = {}
_overrides: dict[tuple[str, str], _Entry] = {}
_snapshot: DataSnapshot | None = None


def get_model_info_for(provider: str, model_id: str) -> ModelInfo | None:
    """Return the prices of ``model_id`` served by ``provider``, or ``None`` if it has none.

    Registered overrides are consulted first (exact id, case-insensitive), then
    genai-prices, whose matching rules map dated or aliased ids to a model
    (``('openai', 'gpt-4o-2024-08-06')`` is priced as ``gpt-4o``). An unknown
    provider or model gives ``None``; only a malformed argument raises
    :class:`PricingError`.
    """
    # The hit path is inlined (no helper call): the reducer calls this once per model call.
    try:
        entry = _cache[(provider, model_id)]
    except (KeyError, TypeError):
        entry = _resolve(provider, model_id)
    return None if entry is None else entry.info


def price_usage(provider: str, model_id: str, usage: Usage) -> float | None:
    """Return the US dollar cost of one model call's ``usage``; ``None`` if the model is unpriced.

    A priced call with no tokens costs ``0.0`` (plus the per-request fee of the
    few models genai-prices lists with one). See the module docstring for how
    cached and reasoning tokens are counted (:class:`Usage` itself refuses counts
    that break that convention, when the call is recorded).
    """
    if not isinstance(usage, Usage):
        raise PricingError(f"usage must be a little_es Usage, got {type(usage).__name__}")
    try:
        entry = _cache[(provider, model_id)]
    except (KeyError, TypeError):
        entry = _resolve(provider, model_id)
    if entry is None:
        return None
    inp, cached = usage.input_tokens, usage.cached_input_tokens
    out, reasoning = usage.output_tokens, usage.reasoning_tokens
    # genai-prices picks every kind's tier by the call's total input tokens, output included.
    input_rate = _rate_at(entry.input, inp)
    output_rate = _rate_at(entry.output, inp)
    cached_rate = input_rate if entry.cached_input is None else _rate_at(entry.cached_input, inp)
    reasoning_rate = output_rate if entry.reasoning is None else _rate_at(entry.reasoning, inp)
    tokens_usd = (
        (inp - cached) * input_rate
        + cached * cached_rate
        + (out - reasoning) * output_rate
        + reasoning * reasoning_rate
    ) / _MTOK
    return tokens_usd + entry.per_request_usd


def register_model_price(
    provider: str,
    model_id: str,
    *,
    input_per_mtok: float,
    output_per_mtok: float,
    cached_input_per_mtok: float | None = None,
    reasoning_per_mtok: float | None = None,
) -> ModelInfo:
    """Price ``model_id`` of ``provider`` (USD per million tokens), overriding genai-prices.

    Use it for a model genai-prices does not know (a local or fine-tuned model,
    the scripted test model) or to apply negotiated prices. The override matches
    the exact id, case-insensitively; register each id your calls report. It
    replaces any earlier override for the same pair and applies to every later
    lookup in this process. Returns the registered :class:`ModelInfo`.

    Example::

        from little_es.pricing import register_model_price

        register_model_price(
            "vllm", "my-llama-3-8b",
            input_per_mtok=0.10, output_per_mtok=0.20, cached_input_per_mtok=0.05,
        )

    Raises :class:`PricingError` for an empty name or a price that is negative,
    infinite or not a number.
    """
    key = _normalized_key(provider, model_id)
    info = ModelInfo(
        provider=key[0],
        model_id=key[1],
        input_per_mtok=_checked_price("input_per_mtok", input_per_mtok),
        output_per_mtok=_checked_price("output_per_mtok", output_per_mtok),
        cached_input_per_mtok=(
            None
            if cached_input_per_mtok is None
            else _checked_price("cached_input_per_mtok", cached_input_per_mtok)
        ),
        reasoning_per_mtok=(
            None
            if reasoning_per_mtok is None
            else _checked_price("reasoning_per_mtok", reasoning_per_mtok)
        ),
    )
    entry = _Entry(
        info=info,
        input=(info.input_per_mtok, ()),
        output=(info.output_per_mtok, ()),
        cached_input=None
        if info.cached_input_per_mtok is None
        else (info.cached_input_per_mtok, ()),
        reasoning=None if info.reasoning_per_mtok is None else (info.reasoning_per_mtok, ()),
        per_request_usd=0.0,
    )
    with _lock:
        _overrides[key] = entry
        _cache.clear()
    return info


def unregister_model_price(provider: str, model_id: str) -> None:
    """Remove an override set by :func:`register_model_price`; lookups fall back to genai-prices.

    Raises :class:`PricingError` if no override is registered for the pair, so a
    misspelt name does not silently leave the override in place.
    """
    key = _normalized_key(provider, model_id)
    with _lock:
        if _overrides.pop(key, None) is None:
            registered = ", ".join(f"{p}/{m}" for p, m in sorted(_overrides)) or "none"
            raise PricingError(
                f"no price is registered for provider {provider!r} model {model_id!r}"
                f" (registered: {registered})"
            )
        _cache.clear()


def _resolve(provider: object, model_id: object) -> _Entry | None:
    key = _normalized_key(provider, model_id)
    with _lock:
        # Re-read under the lock: a register/unregister may have cleared the cache meanwhile.
        if (provider, model_id) in _cache:
            return _cache[(provider, model_id)]
        entry = _overrides.get(key)
        if entry is None:
            entry = _from_genai_prices(*key)
        _cache[(provider, model_id)] = entry
        return entry


def _normalized_key(provider: object, model_id: object) -> tuple[str, str]:
    if not isinstance(provider, str) or not provider.strip():
        raise PricingError(
            f"provider must be a non-empty string such as 'openai', got {provider!r}"
        )
    if not isinstance(model_id, str) or not model_id.strip():
        raise PricingError(
            f"model_id must be a non-empty string such as 'gpt-4o', got {model_id!r}"
        )
    return provider.strip().lower(), model_id.strip().lower()


def _checked_price(name: str, value: object) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value < 0
    ):
        raise PricingError(
            f"{name} must be a finite number >= 0 in USD per million tokens, got {value!r}"
        )
    return float(value)


def _bundled_snapshot() -> DataSnapshot:
    global _snapshot
    if _snapshot is None:
        # Imported on first lookup: the bundled data is a large module, and most
        # imports of little_es never price anything.
        from genai_prices.data import providers
        from genai_prices.data_snapshot import DataSnapshot

        _snapshot = DataSnapshot(providers=providers, from_auto_update=False)
    return _snapshot


def _from_genai_prices(provider: str, model_id: str) -> _Entry | None:
    try:
        found_provider, model = _bundled_snapshot().find_provider_model(
            model_id, None, provider, None
        )
    except LookupError:
        return None
    prices = model.get_prices(datetime.now(tz=UTC))
    input_rate = _genai_rate(prices, "input_mtok") or (0.0, ())
    output_rate = _genai_rate(prices, "output_mtok") or (0.0, ())
    cached_rate = _genai_rate(prices, "cache_read_mtok")
    reasoning_rate = _genai_rate(prices, "output_reasoning_mtok")
    request_price = getattr(prices, "requests_kcount", None)
    info = ModelInfo(
        provider=found_provider.id,
        model_id=model.id,
        input_per_mtok=input_rate[0],
        output_per_mtok=output_rate[0],
        cached_input_per_mtok=None if cached_rate is None else cached_rate[0],
        reasoning_per_mtok=None if reasoning_rate is None else reasoning_rate[0],
    )
    return _Entry(
        info=info,
        input=input_rate,
        output=output_rate,
        cached_input=cached_rate,
        reasoning=reasoning_rate,
        per_request_usd=(
            float(request_price) / _REQUESTS_PER_PRICE
            if isinstance(request_price, Decimal)
            else 0.0
        ),
    )


def _genai_rate(prices: ModelPrice, price_key: str) -> _Rate | None:
    from genai_prices.types import TieredPrices

    value = getattr(prices, price_key, None)
    if value is None:
        return None
    if isinstance(value, TieredPrices):
        tiers = sorted(value.tiers, key=lambda tier: tier.start, reverse=True)
        return float(value.base), tuple((tier.start, float(tier.price)) for tier in tiers)
    return float(value), ()


def _rate_at(rate: _Rate, input_tokens: int) -> float:
    base, tiers = rate
    for above, price in tiers:
        # genai-prices' cliff model: past a threshold, every token pays the tier price.
        if input_tokens > above:
            return price
    return base

"""Model prices: what one recorded model call cost, in US dollars.

This is the single place a dollar figure is produced (the reducer asks the
world's pricer, in picodollars, for every ``harness.model.responded``). Prices
come from three sources, in this order:

1. prices recorded in the world (``world.set_model_price(...)``, ``little prices
   set``), as :class:`~little_es.events.ModelPriceSet` events of its price book,
   each effective from a moment (:class:`RecordedPrices`); a world's pricer
   consults them, :func:`price_usage` alone does not;
2. overrides the application registered in this process with
   :func:`register_model_price`;
3. the price data bundled with the installed ``genai-prices`` package, at the
   moment of the call (a dated price change in the data applies to calls made
   after it, however late the log is folded).

Nothing here reaches the network. genai-prices can refresh its prices from a
remote URL (``genai_prices.UpdatePrices``); little_es never starts that, and
reads the bundled data directly even if the application started it, so a run's
cost depends only on its log (calls' timestamps and the world's recorded
prices), the installed genai-prices version and the registered overrides. To
take newer prices, upgrade genai-prices or record a price in the world.

Token conventions (genai-prices' own, which is OpenAI's):

- ``Usage.input_tokens`` is the whole prompt and *includes*
  ``cached_input_tokens`` (read from the prompt cache) and
  ``cache_write_tokens`` (written to it); the cached part is charged at the
  cache-read rate, the written part at the cache-write rate (genai-prices'
  ``cache_write_mtok``, Anthropic's 5-minute cache write), and the rest at the
  input rate. A model without one of these rates charges those tokens at the
  input rate. (Anthropic reports cache reads and writes outside its
  ``input_tokens``; :mod:`little_es.contrib.anthropic` adds them in.)
- ``Usage.output_tokens`` is the whole completion and *includes*
  ``reasoning_tokens`` (OpenAI counts reasoning inside ``completion_tokens``).
  Reasoning tokens are never charged twice: they are charged at the reasoning
  rate where the data has one (a few models do) and at the output rate
  otherwise, and only the remaining output tokens at the output rate.

:func:`price_usage` applies exactly genai-prices' rules for these five counts:
its long-context tiers (the rate every token of a kind pays is chosen by the
call's total ``input_tokens``) and its per-request fees, so its figure equals
``genai_prices.calc_price(...).total_price``. :class:`ModelInfo` shows the
base-tier rates.

Exact figures: rates are kept as integers of 10^-18 USD per token (USD per
million tokens to 12 decimal places, far finer than any listed price) and a
call's cost is computed in integers, so :func:`price_usage_exact` returns an
exact :class:`~decimal.Decimal`; :func:`price_usage` is the same figure as a
float, for display. The reducer sums calls in integer picodollars
(:mod:`little_es.materialize`).

Lookups are cached per ``(provider, model_id)`` for the life of the process;
time-dependent prices in the data (dated price changes, off-peak hours) are
resolved per call, from the call's timestamp.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import ROUND_HALF_EVEN, Decimal, InvalidOperation
from typing import TYPE_CHECKING, Final

from pydantic import BaseModel, ConfigDict, Field

from little_es.errors import PricingError
from little_es.events import ModelPriceSet
from little_es.values import Usage

if TYPE_CHECKING:
    from genai_prices.data_snapshot import DataSnapshot
    from genai_prices.types import ModelInfo as GenaiModel
    from genai_prices.types import ModelPrice

__all__ = [
    "ModelInfo",
    "RecordedPrices",
    "get_model_info_for",
    "price_usage",
    "price_usage_exact",
    "price_usage_picodollars",
    "register_model_price",
    "unregister_model_price",
]


class ModelInfo(BaseModel):
    """One model's prices in US dollars per million tokens.

    ``cached_input_per_mtok`` (cache reads) and ``cache_write_per_mtok`` are
    ``None`` when those tokens cost the same as other input tokens, and
    ``reasoning_per_mtok`` is ``None`` when reasoning tokens cost the same as
    other output tokens (the usual case, OpenAI's included). A price the data
    leaves out is ``0.0``: genai-prices charges nothing for it. For models
    with long-context tiers these are the base-tier rates; :func:`price_usage`
    applies the tiers.
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
    cache_write_per_mtok: float | None = Field(default=None, ge=0)


# A rate is a base price in attodollars (10^-18 USD) per token plus long-context tiers as
# (above_input_tokens, price), highest threshold first so the first tier the call's input
# exceeds is the one that applies. USD/MTok x 10^12 = attodollars per token.
_Rate = tuple[int, tuple[tuple[int, int], ...]]


@dataclass(frozen=True, slots=True)
class _Entry:
    info: ModelInfo
    input: _Rate
    output: _Rate
    cached_input: _Rate | None
    reasoning: _Rate | None
    cache_write: _Rate | None
    per_request_atto: int


@dataclass(slots=True)
class _Dated:
    """A genai-prices model whose prices depend on the call's time (dated changes, off-peak)."""

    provider_id: str
    model: GenaiModel
    # By id() of the genai-prices ModelPrice chosen for a time; the data keeps those alive.
    entries: dict[int, _Entry] = field(default_factory=dict)

    def at(self, when: datetime) -> _Entry:
        prices = self.model.get_prices(when)
        entry = self.entries.get(id(prices))
        if entry is None:
            entry = self.entries[id(prices)] = _entry_from_genai(
                self.provider_id, self.model.id, prices
            )
        return entry


_ATTO_PER_MTOK_USD: Final = 10**12
_ATTO_EXPONENT: Final = -18
_ATTO_PER_PICO: Final = 10**6
_HALF_PICO: Final = _ATTO_PER_PICO // 2
# genai-prices prices requests per thousand (its `requests_kcount` key).
_REQUESTS_PER_PRICE: Final = 1_000

_lock = threading.Lock()
# Keyed by the arguments exactly as passed, so a hit is one dict lookup; `None` caches "unpriced".
_cache: dict[tuple[object, object], _Entry | _Dated | None] = {}
_overrides: dict[tuple[str, str], _Entry] = {}
_snapshot: DataSnapshot | None = None


def get_model_info_for(
    provider: str, model_id: str, at: datetime | None = None
) -> ModelInfo | None:
    """Return the prices of ``model_id`` served by ``provider``, or ``None`` if it has none.

    Registered overrides are consulted first (exact id, case-insensitive), then
    genai-prices at the moment ``at`` (default: now), whose matching rules map
    dated or aliased ids to a model (``('openai', 'gpt-4o-2024-08-06')`` is
    priced as ``gpt-4o``). An unknown provider or model gives ``None``; only a
    malformed argument raises :class:`PricingError`.
    """
    entry = _lookup(provider, model_id, at)
    return None if entry is None else entry.info


def price_usage_exact(
    provider: str, model_id: str, usage: Usage, at: datetime | None = None
) -> Decimal | None:
    """The exact US dollar cost of one model call made at ``at``; ``None`` if the model is unpriced.

    ``at`` (default: now) picks genai-prices' rates in force at that moment;
    the reducer passes each ``harness.model.responded``'s timestamp. Overrides
    registered with :func:`register_model_price` come first. A
    :class:`~little_es.values.Pricer`. A priced call with no tokens costs ``0``
    (plus the per-request fee of the few models genai-prices lists with one).
    See the module docstring for how cached and reasoning tokens are counted.
    """
    if not isinstance(usage, Usage):
        raise PricingError(f"usage must be a little_es Usage, got {type(usage).__name__}")
    entry = _lookup(provider, model_id, at)
    return None if entry is None else _cost(entry, usage)


def price_usage(
    provider: str, model_id: str, usage: Usage, at: datetime | None = None
) -> float | None:
    """Return the US dollar cost of one model call's ``usage``; ``None`` if the model is unpriced.

    :func:`price_usage_exact` as a float, for display; sum exact figures, not these.
    """
    cost = price_usage_exact(provider, model_id, usage, at)
    return None if cost is None else float(cost)


def checked_at(at: object) -> None:
    """Refuse an ``at`` that is neither None nor a timezone-aware datetime."""
    if at is not None and (not isinstance(at, datetime) or at.utcoffset() is None):
        raise PricingError(
            "at must be a timezone-aware datetime (e.g. datetime.now(UTC)) or None for now,"
            f" got {at!r}"
        )


def _lookup(provider: object, model_id: object, at: datetime | None) -> _Entry | None:
    checked_at(at)
    # The hit path is inlined (no helper call): the reducer calls this once per model call.
    try:
        entry = _cache[(provider, model_id)]
    except (KeyError, TypeError):
        entry = _resolve(provider, model_id)
    if type(entry) is _Dated:
        return entry.at(datetime.now(tz=UTC) if at is None else at)
    return entry  # type: ignore[return-value]


def price_usage_picodollars(
    provider: str, model_id: str, usage: Usage, at: datetime | None = None
) -> int | None:
    """:func:`price_usage_exact` in integer picodollars (10^-12 USD), rounded half to even.

    What the reducer sums (:class:`~little_es.values.PicodollarPricer`).
    """
    if not isinstance(usage, Usage):
        raise PricingError(f"usage must be a little_es Usage, got {type(usage).__name__}")
    checked_at(at)
    # The reducer's hot path: _lookup and _picodollars inlined (no helper calls).
    try:
        entry = _cache[(provider, model_id)]
    except (KeyError, TypeError):
        entry = _resolve(provider, model_id)
    if entry is None:
        return None
    if type(entry) is _Dated:
        entry = entry.at(datetime.now(tz=UTC) if at is None else at)
    pusd, rest = divmod(_atto(entry, usage), _ATTO_PER_PICO)  # type: ignore[arg-type]
    if rest > _HALF_PICO or (rest == _HALF_PICO and pusd & 1):
        pusd += 1
    return pusd


def _atto(entry: _Entry, usage: Usage) -> int:
    inp, cached, written = usage.input_tokens, usage.cached_input_tokens, usage.cache_write_tokens
    out, reasoning = usage.output_tokens, usage.reasoning_tokens
    # genai-prices picks every kind's tier by the call's total input tokens, output included.
    input_rate = _rate_at(entry.input, inp)
    output_rate = _rate_at(entry.output, inp)
    cached_rate = input_rate if entry.cached_input is None else _rate_at(entry.cached_input, inp)
    reasoning_rate = output_rate if entry.reasoning is None else _rate_at(entry.reasoning, inp)
    written_rate = input_rate if entry.cache_write is None else _rate_at(entry.cache_write, inp)
    return (
        (inp - cached - written) * input_rate
        + cached * cached_rate
        + written * written_rate
        + (out - reasoning) * output_rate
        + reasoning * reasoning_rate
        + entry.per_request_atto
    )


def _cost(entry: _Entry, usage: Usage) -> Decimal:
    return Decimal(_atto(entry, usage)).scaleb(_ATTO_EXPONENT)


def _picodollars(atto: int) -> int:
    # Half to even, as Decimal's default rounding: the same figure as picodollars(_cost(...)).
    pusd, rest = divmod(atto, _ATTO_PER_PICO)
    if rest > _HALF_PICO or (rest == _HALF_PICO and pusd & 1):
        pusd += 1
    return pusd


def register_model_price(
    provider: str,
    model_id: str,
    *,
    input_per_mtok: float | Decimal,
    output_per_mtok: float | Decimal,
    cached_input_per_mtok: float | Decimal | None = None,
    reasoning_per_mtok: float | Decimal | None = None,
    cache_write_per_mtok: float | Decimal | None = None,
) -> ModelInfo:
    """Price ``model_id`` of ``provider`` (USD per million tokens), overriding genai-prices.

    Use it for a model genai-prices does not know (a local or fine-tuned model,
    the scripted test model) or to apply negotiated prices. The override matches
    the exact id, case-insensitively; register each id your calls report. It
    replaces any earlier override for the same pair and applies to every later
    lookup in this process (only: to price every process's folds alike, record
    the price in the world with ``world.set_model_price(...)`` or ``little
    prices set``, which comes before this). Returns the registered :class:`ModelInfo`.

    Example::

        from little_es.pricing import register_model_price

        register_model_price(
            "vllm", "my-llama-3-8b",
            input_per_mtok=0.10, output_per_mtok=0.20, cached_input_per_mtok=0.05,
        )

    ``cache_write_per_mtok`` prices ``Usage.cache_write_tokens`` (default: the
    input rate), ``cached_input_per_mtok`` cache reads (default: the input rate)
    and ``reasoning_per_mtok`` reasoning tokens (default: the output rate).

    Raises :class:`PricingError` for an empty name or a price that is negative,
    infinite or not a number.
    """
    key = _new_price_key(provider, model_id)
    entry = _flat_entry(
        key,
        checked_price("input_per_mtok", input_per_mtok),
        checked_price("output_per_mtok", output_per_mtok),
        None
        if cached_input_per_mtok is None
        else checked_price("cached_input_per_mtok", cached_input_per_mtok),
        None
        if reasoning_per_mtok is None
        else checked_price("reasoning_per_mtok", reasoning_per_mtok),
        None
        if cache_write_per_mtok is None
        else checked_price("cache_write_per_mtok", cache_write_per_mtok),
    )
    info = entry.info
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


class RecordedPrices:
    """The prices recorded in a world's price book, each effective from a moment.

    A call made at ``at`` is priced by the latest-effective recorded price of
    its ``(provider, model_id)`` (exact id, case-insensitive) whose
    ``effective_from`` is not after ``at``; a call with none falls through to
    :func:`price_usage_exact` (process overrides, then genai-prices at ``at``).
    So recording a price never changes the cost of a call made before the
    price took effect, and every process that folds the same log with the same
    book gets the same dollars. A world keeps one of these current
    (:meth:`little_es.world.World.set_model_price`).
    """

    __slots__ = ("_by_key", "_keys", "recorded")

    def __init__(self, events: Iterable[ModelPriceSet] = ()) -> None:
        # Per normalized key: effective_from times, ascending, and the entry of each.
        self._by_key: dict[tuple[str, str], tuple[list[datetime], list[_Entry]]] = {}
        self._keys: dict[tuple[object, object], tuple[str, str]] = {}
        self.recorded: list[ModelPriceSet] = []
        """Every recorded price, in the order it was recorded."""
        for event in events:
            self.add(event)

    def add(self, event: ModelPriceSet) -> None:
        """Take one recorded price into account."""
        key = _normalized_key(event.provider, event.model_id)
        entry = _flat_entry(
            key,
            event.input_per_mtok,
            event.output_per_mtok,
            event.cached_input_per_mtok,
            event.reasoning_per_mtok,
            event.cache_write_per_mtok,
        )
        times, entries = self._by_key.setdefault(key, ([], []))
        # After every price with the same or an earlier effective_from: a later record wins a tie.
        at = bisect.bisect_right(times, event.effective_from)
        times.insert(at, event.effective_from)
        entries.insert(at, entry)
        self.recorded.append(event)

    def __call__(self, provider: str, model_id: str, usage: Usage, at: datetime) -> Decimal | None:
        """The exact cost of one call made at ``at`` (a :class:`~little_es.values.Pricer`)."""
        entry = self._entry(provider, model_id, usage, at)
        return None if entry is None else _cost(entry, usage)

    def picodollars(self, provider: str, model_id: str, usage: Usage, at: datetime) -> int | None:
        """The cost of one call made at ``at`` in integer picodollars, as the reducer sums it."""
        if not self._by_key:
            # The usual book, empty: the reducer's hot path, one call away from the lookup.
            return price_usage_picodollars(provider, model_id, usage, at)
        entry = self._entry(provider, model_id, usage, at)
        return None if entry is None else _picodollars(_atto(entry, usage))

    def _entry(self, provider: str, model_id: str, usage: Usage, at: datetime) -> _Entry | None:
        if not isinstance(usage, Usage):
            raise PricingError(f"usage must be a little_es Usage, got {type(usage).__name__}")
        checked_at(at)
        if self._by_key:
            raw = (provider, model_id)
            key = self._keys.get(raw)
            if key is None:
                key = self._keys[raw] = _normalized_key(provider, model_id)
            found = self._by_key.get(key)
            if found is not None:
                times, entries = found
                i = bisect.bisect_right(times, at)
                if i:
                    return entries[i - 1]
        return _lookup(provider, model_id, at)


MAX_PRICE_PER_MTOK = Decimal(1_000_000)
"""The highest price accepted, in USD per million tokens (a dollar a token)."""


def checked_price(name: str, value: object) -> Decimal:
    """``value`` (USD per million tokens) as a Decimal, or :class:`PricingError` saying why not.

    A float is taken by its shortest decimal form (``0.1`` is ``Decimal('0.1')``).
    """
    if isinstance(value, bool) or not isinstance(value, int | float | Decimal):
        raise PricingError(
            f"{name} must be a finite number >= 0 in USD per million tokens, got {value!r}"
        )
    try:
        price = value if isinstance(value, Decimal) else Decimal(str(value))
    except InvalidOperation:
        price = Decimal("NaN")
    if not price.is_finite() or price < 0:
        raise PricingError(
            f"{name} must be a finite number >= 0 in USD per million tokens, got {value!r}"
        )
    if price > MAX_PRICE_PER_MTOK:
        # A price past any model's is a typo (per token, not per million, or cents): priced
        # in picodollars it would overflow the 64-bit integers a recorded cost is stored in.
        raise PricingError(
            f"{name} is {value!r} USD per million tokens, over the ceiling of"
            f" {MAX_PRICE_PER_MTOK}: give the price in USD per million tokens"
        )
    return price


def normalized_model_key(provider: object, model_id: object) -> tuple[str, str]:
    """``(provider, model_id)`` stripped and lower-cased, as prices are matched.

    Raises :class:`PricingError` for an empty, non-string or unprintable name (it is the
    key of a price being set).
    """
    return _new_price_key(provider, model_id)


def _flat_entry(
    key: tuple[str, str],
    input_per_mtok: Decimal,
    output_per_mtok: Decimal,
    cached_input_per_mtok: Decimal | None,
    reasoning_per_mtok: Decimal | None,
    cache_write_per_mtok: Decimal | None = None,
) -> _Entry:
    info = ModelInfo(
        provider=key[0],
        model_id=key[1],
        input_per_mtok=float(input_per_mtok),
        output_per_mtok=float(output_per_mtok),
        cached_input_per_mtok=None
        if cached_input_per_mtok is None
        else float(cached_input_per_mtok),
        reasoning_per_mtok=None if reasoning_per_mtok is None else float(reasoning_per_mtok),
        cache_write_per_mtok=None if cache_write_per_mtok is None else float(cache_write_per_mtok),
    )
    return _Entry(
        info=info,
        input=(_atto_per_token(input_per_mtok), ()),
        output=(_atto_per_token(output_per_mtok), ()),
        cached_input=None
        if cached_input_per_mtok is None
        else (_atto_per_token(cached_input_per_mtok), ()),
        reasoning=None if reasoning_per_mtok is None else (_atto_per_token(reasoning_per_mtok), ()),
        cache_write=None
        if cache_write_per_mtok is None
        else (_atto_per_token(cache_write_per_mtok), ()),
        per_request_atto=0,
    )


def _atto_per_token(usd_per_mtok: Decimal) -> int:
    """USD per million tokens as attodollars per token (a finer price is rounded to it)."""
    return int((usd_per_mtok * _ATTO_PER_MTOK_USD).to_integral_value(ROUND_HALF_EVEN))


def _resolve(provider: object, model_id: object) -> _Entry | _Dated | None:
    key = _normalized_key(provider, model_id)
    with _lock:
        # Re-read under the lock: a register/unregister may have cleared the cache meanwhile.
        if (provider, model_id) in _cache:
            return _cache[(provider, model_id)]
        entry: _Entry | _Dated | None = _overrides.get(key)
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


def _new_price_key(provider: object, model_id: object) -> tuple[str, str]:
    """The key of a price being set: as :func:`_normalized_key`, and printable.

    Only new prices are held to it, so a price recorded before is still read.
    """
    key = _normalized_key(provider, model_id)
    for name, value in zip(("provider", "model_id"), key, strict=True):
        # A lone surrogate cannot be encoded as UTF-8: the recorded price could not be stored.
        if not value.isprintable() or any("\ud800" <= c <= "\udfff" for c in value):
            raise PricingError(
                f"{name} {value!r} holds a control character or a lone surrogate: give the"
                " provider's printable model name, e.g. 'gpt-4o'"
            )
    return key


def _bundled_snapshot() -> DataSnapshot:
    global _snapshot
    if _snapshot is None:
        # Imported on first lookup: the bundled data is a large module, and most
        # imports of little_es never price anything.
        from genai_prices.data import providers
        from genai_prices.data_snapshot import DataSnapshot

        _snapshot = DataSnapshot(providers=providers, from_auto_update=False)
    return _snapshot


def _from_genai_prices(provider: str, model_id: str) -> _Entry | _Dated | None:
    try:
        found_provider, model = _bundled_snapshot().find_provider_model(
            model_id, None, provider, None
        )
    except LookupError:
        return None
    if isinstance(model.prices, list):
        return _Dated(found_provider.id, model)
    return _entry_from_genai(found_provider.id, model.id, model.prices)


def _entry_from_genai(provider_id: str, model_id: str, prices: ModelPrice) -> _Entry:
    input_rate = _genai_rate(prices, "input_mtok") or (0, ())
    output_rate = _genai_rate(prices, "output_mtok") or (0, ())
    cached_rate = _genai_rate(prices, "cache_read_mtok")
    reasoning_rate = _genai_rate(prices, "output_reasoning_mtok")
    cache_write_rate = _genai_rate(prices, "cache_write_mtok")
    request_price = getattr(prices, "requests_kcount", None)
    info = ModelInfo(
        provider=provider_id,
        model_id=model_id,
        input_per_mtok=input_rate[0] / _ATTO_PER_MTOK_USD,
        output_per_mtok=output_rate[0] / _ATTO_PER_MTOK_USD,
        cached_input_per_mtok=None if cached_rate is None else cached_rate[0] / _ATTO_PER_MTOK_USD,
        reasoning_per_mtok=(
            None if reasoning_rate is None else reasoning_rate[0] / _ATTO_PER_MTOK_USD
        ),
        cache_write_per_mtok=(
            None if cache_write_rate is None else cache_write_rate[0] / _ATTO_PER_MTOK_USD
        ),
    )
    return _Entry(
        info=info,
        input=input_rate,
        output=output_rate,
        cached_input=cached_rate,
        reasoning=reasoning_rate,
        cache_write=cache_write_rate,
        per_request_atto=(
            int((request_price * 10**18 / _REQUESTS_PER_PRICE).to_integral_value(ROUND_HALF_EVEN))
            if isinstance(request_price, Decimal)
            else 0
        ),
    )


def _genai_rate(prices: ModelPrice, price_key: str) -> _Rate | None:
    from genai_prices.types import TieredPrices

    value = getattr(prices, price_key, None)
    if value is None:
        return None
    if isinstance(value, TieredPrices):
        tiers = sorted(value.tiers, key=lambda tier: tier.start, reverse=True)
        return _atto_per_token(value.base), tuple(
            (tier.start, _atto_per_token(tier.price)) for tier in tiers
        )
    return _atto_per_token(value), ()


def _rate_at(rate: _Rate, input_tokens: int) -> int:
    base, tiers = rate
    for above, price in tiers:
        # genai-prices' cliff model: past a threshold, every token pays the tier price.
        if input_tokens > above:
            return price
    return base

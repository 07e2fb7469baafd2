"""Tests of little_es.pricing against the price data bundled with genai-prices."""

from __future__ import annotations

import math
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import genai_prices
import pydantic
import pytest
from genai_prices.types import ModelPrice, TieredPrices
from genai_prices.types import Usage as GenaiUsage

from little_es.errors import LittleEsError, PricingError
from little_es.pricing import (
    ModelInfo,
    RecordedPrices,
    get_model_info_for,
    price_usage,
    price_usage_exact,
    price_usage_picodollars,
    register_model_price,
    unregister_model_price,
)
from little_es.values import Usage
from little_es.world import memory_world

_REPO = Path(__file__).resolve().parents[1]

Register = Callable[..., ModelInfo]


@pytest.fixture
def register() -> Iterator[Register]:
    """register_model_price that removes what it registered when the test ends."""
    added: list[tuple[str, str]] = []

    def _register(provider: str, model_id: str, **prices: Any) -> ModelInfo:
        info = register_model_price(provider, model_id, **prices)
        added.append((provider, model_id))
        return info

    yield _register
    for provider, model_id in dict.fromkeys(added):
        unregister_model_price(provider, model_id)


def _genai_price(provider: str, model_id: str) -> ModelPrice:
    """The price genai-prices itself reports for a model, via its public API."""
    return genai_prices.calc_price(GenaiUsage(), model_id, provider_id=provider).model_price


def _per_mtok(price: Decimal | TieredPrices | None) -> float:
    assert isinstance(price, Decimal), price
    return float(price)


def _genai_total(provider: str, model_id: str, usage: Usage) -> float:
    genai_usage = GenaiUsage(
        input_tokens=usage.input_tokens,
        cache_read_tokens=usage.cached_input_tokens,
        cache_write_tokens=usage.cache_write_tokens,
        output_tokens=usage.output_tokens,
        output_reasoning_tokens=usage.reasoning_tokens,
    )
    return float(genai_prices.calc_price(genai_usage, model_id, provider_id=provider).total_price)


def test_known_model_is_priced_at_the_rates_genai_prices_reports() -> None:
    genai = _genai_price("openai", "gpt-4o")
    info = get_model_info_for("openai", "gpt-4o")

    assert info is not None
    assert (info.provider, info.model_id) == ("openai", "gpt-4o")
    assert info.input_per_mtok == _per_mtok(genai.input_mtok) > 0
    assert info.output_per_mtok == _per_mtok(genai.output_mtok) > 0
    assert info.cached_input_per_mtok == _per_mtok(genai.cache_read_mtok)

    cost = price_usage("openai", "gpt-4o", Usage(input_tokens=1200, output_tokens=345))
    expected = (1200 * info.input_per_mtok + 345 * info.output_per_mtok) / 1_000_000
    assert cost is not None and cost > 0
    assert cost == pytest.approx(expected, rel=1e-12)


def test_dated_model_ids_match_by_genai_prices_rules() -> None:
    info = get_model_info_for("openai", "gpt-4o-2024-08-06")

    assert info is not None
    assert info.model_id == "gpt-4o"
    usage = Usage(input_tokens=10, output_tokens=20)
    assert price_usage("openai", "gpt-4o-2024-08-06", usage) == price_usage(
        "openai", "gpt-4o", usage
    )


def test_cached_input_tokens_are_part_of_input_and_charged_at_the_cached_rate() -> None:
    info = get_model_info_for("openai", "gpt-4o")
    assert info is not None and info.cached_input_per_mtok is not None
    assert info.cached_input_per_mtok < info.input_per_mtok

    cached = price_usage("openai", "gpt-4o", Usage(input_tokens=1000, cached_input_tokens=400))
    uncached = price_usage("openai", "gpt-4o", Usage(input_tokens=1000))

    expected = (600 * info.input_per_mtok + 400 * info.cached_input_per_mtok) / 1_000_000
    assert cached == pytest.approx(expected, rel=1e-12)
    assert uncached is not None and cached is not None and cached < uncached


def test_openai_reasoning_tokens_are_inside_output_tokens_and_not_charged_twice() -> None:
    info = get_model_info_for("openai", "o3")
    assert info is not None
    assert info.reasoning_per_mtok is None

    with_reasoning = price_usage("openai", "o3", Usage(output_tokens=1000, reasoning_tokens=600))

    assert with_reasoning == price_usage("openai", "o3", Usage(output_tokens=1000))
    assert with_reasoning == pytest.approx(1000 * info.output_per_mtok / 1_000_000, rel=1e-12)


def test_reasoning_tokens_use_a_separate_rate_where_the_data_has_one() -> None:
    genai = _genai_price("perplexity", "sonar-deep-research")
    info = get_model_info_for("perplexity", "sonar-deep-research")
    assert info is not None
    assert info.reasoning_per_mtok == _per_mtok(genai.output_reasoning_mtok)
    assert info.reasoning_per_mtok != info.output_per_mtok

    cost = price_usage(
        "perplexity", "sonar-deep-research", Usage(output_tokens=1000, reasoning_tokens=400)
    )

    expected = (600 * info.output_per_mtok + 400 * info.reasoning_per_mtok) / 1_000_000
    assert cost == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(
    ("provider", "model_id"),
    [
        ("openai", "gpt-4o"),
        ("openai", "o3"),
        ("anthropic", "claude-sonnet-4-5"),
        ("google", "gemini-2.5-pro"),
        ("perplexity", "sonar-deep-research"),
        ("perplexity", "sonar"),
    ],
)
@pytest.mark.parametrize(
    "usage",
    [
        Usage(input_tokens=1000, cached_input_tokens=300, output_tokens=500, reasoning_tokens=100),
        # Cache writes: at the cache-write rate where the data has one, at the input rate else.
        Usage(
            input_tokens=1000,
            cached_input_tokens=300,
            cache_write_tokens=250,
            output_tokens=500,
            reasoning_tokens=100,
        ),
        # Past the 200k-token long-context threshold some of these models charge more.
        Usage(
            input_tokens=250_000,
            cached_input_tokens=20_000,
            cache_write_tokens=30_000,
            output_tokens=4000,
            reasoning_tokens=900,
        ),
    ],
)
def test_cost_equals_genai_prices_own_calculation(
    provider: str, model_id: str, usage: Usage
) -> None:
    cost = price_usage(provider, model_id, usage)

    assert cost == pytest.approx(_genai_total(provider, model_id, usage), rel=1e-9)


def test_anthropic_cache_reads_and_writes_are_charged_at_their_own_rates() -> None:
    genai = _genai_price("anthropic", "claude-3-5-haiku")
    info = get_model_info_for("anthropic", "claude-3-5-haiku")
    assert info is not None
    assert info.cache_write_per_mtok == _per_mtok(genai.cache_write_mtok)
    assert info.cached_input_per_mtok == _per_mtok(genai.cache_read_mtok)
    # Anthropic's prices: a cache write costs more than plain input, a read less.
    assert info.cached_input_per_mtok < info.input_per_mtok < info.cache_write_per_mtok
    usage = Usage(
        input_tokens=10_000, cached_input_tokens=6_000, cache_write_tokens=3_000, output_tokens=500
    )

    cost = price_usage_exact("anthropic", "claude-3-5-haiku", usage)

    rates = {k: Decimal(str(v)) for k, v in info.model_dump().items() if "mtok" in k and v}
    expected = (
        6_000 * rates["cached_input_per_mtok"]
        + 3_000 * rates["cache_write_per_mtok"]
        + 1_000 * rates["input_per_mtok"]
        + 500 * rates["output_per_mtok"]
    ) / 1_000_000
    assert cost == expected
    # Were the writes priced as plain input, the call would cost less.
    as_input = price_usage_exact(
        "anthropic",
        "claude-3-5-haiku",
        Usage(input_tokens=10_000, cached_input_tokens=6_000, output_tokens=500),
    )
    assert as_input is not None and cost is not None and as_input < cost


def test_long_context_tier_applies_to_every_token_of_the_call() -> None:
    genai_input = _genai_price("anthropic", "claude-sonnet-4-5").input_mtok
    assert isinstance(genai_input, TieredPrices), "the fixture model should have tiered prices"
    threshold = genai_input.tiers[0].start
    info = get_model_info_for("anthropic", "claude-sonnet-4-5")
    assert info is not None and info.input_per_mtok == float(genai_input.base)

    below = price_usage("anthropic", "claude-sonnet-4-5", Usage(input_tokens=threshold))
    above = price_usage("anthropic", "claude-sonnet-4-5", Usage(input_tokens=threshold + 1))

    assert below == pytest.approx(threshold * float(genai_input.base) / 1_000_000, rel=1e-12)
    expected_above = (threshold + 1) * float(genai_input.tiers[0].price) / 1_000_000
    assert above == pytest.approx(expected_above, rel=1e-12)


@pytest.mark.parametrize(
    ("provider", "model_id"),
    [
        ("openai", "no-such-model-xyz"),
        ("no-such-provider", "gpt-4o"),
        ("scripted", "scripted"),
        ("scripted", "gpt-4o"),
    ],
)
def test_unknown_models_are_unpriced_not_zero(provider: str, model_id: str) -> None:
    assert get_model_info_for(provider, model_id) is None
    assert price_usage(provider, model_id, Usage(input_tokens=5, output_tokens=5)) is None


def test_a_priced_call_with_no_tokens_costs_a_true_zero() -> None:
    cost = price_usage("openai", "gpt-4o", Usage())

    assert cost is not None
    assert cost == 0.0
    assert isinstance(cost, float)


def test_register_prices_an_unknown_model(register: Register) -> None:
    assert get_model_info_for("scripted", "scripted-model") is None  # cached as unpriced

    info = register(
        "scripted",
        "scripted-model",
        input_per_mtok=1.0,
        output_per_mtok=4.0,
        cached_input_per_mtok=0.5,
        reasoning_per_mtok=2.0,
        cache_write_per_mtok=1.25,
    )

    assert get_model_info_for("scripted", "scripted-model") == info
    assert info == ModelInfo(
        provider="scripted",
        model_id="scripted-model",
        input_per_mtok=1.0,
        output_per_mtok=4.0,
        cached_input_per_mtok=0.5,
        reasoning_per_mtok=2.0,
        cache_write_per_mtok=1.25,
    )
    usage = Usage(
        input_tokens=1000,
        cached_input_tokens=200,
        cache_write_tokens=100,
        output_tokens=300,
        reasoning_tokens=100,
    )
    expected = (700 * 1.0 + 200 * 0.5 + 100 * 1.25 + 200 * 4.0 + 100 * 2.0) / 1_000_000
    assert price_usage("scripted", "scripted-model", usage) == pytest.approx(expected, rel=1e-12)


def test_registered_cached_and_reasoning_default_to_input_and_output_rates(
    register: Register,
) -> None:
    register("scripted", "plain", input_per_mtok=2, output_per_mtok=8)
    usage = Usage(
        input_tokens=1000,
        cached_input_tokens=500,
        cache_write_tokens=300,
        output_tokens=100,
        reasoning_tokens=50,
    )

    cost = price_usage("scripted", "plain", usage)

    assert cost == pytest.approx((1000 * 2 + 100 * 8) / 1_000_000, rel=1e-12)


def test_override_wins_over_genai_prices_until_unregistered() -> None:
    genai_cost = price_usage("openai", "gpt-4o", Usage(input_tokens=1_000_000))
    assert genai_cost is not None and genai_cost > 0

    register_model_price("openai", "gpt-4o", input_per_mtok=0.25, output_per_mtok=1)
    try:
        assert price_usage("openai", "gpt-4o", Usage(input_tokens=1_000_000)) == 0.25
        # Matching is exact, not by genai-prices' rules: the dated id keeps genai's price.
        assert price_usage("openai", "gpt-4o-2024-08-06", Usage(input_tokens=1_000_000)) == (
            genai_cost
        )
    finally:
        unregister_model_price("openai", "gpt-4o")

    assert price_usage("openai", "gpt-4o", Usage(input_tokens=1_000_000)) == genai_cost


def test_registering_again_replaces_the_override(register: Register) -> None:
    register("scripted", "m", input_per_mtok=1, output_per_mtok=1)
    register("scripted", "m", input_per_mtok=3, output_per_mtok=1)

    assert price_usage("scripted", "m", Usage(input_tokens=1_000_000)) == 3.0


def test_overrides_match_case_insensitively(register: Register) -> None:
    register("Scripted", "My-Model", input_per_mtok=1, output_per_mtok=1)

    info = get_model_info_for("scripted", "my-model")
    assert info is not None and info.model_id == "my-model"


def test_unregister_falls_back_to_unpriced() -> None:
    register_model_price("scripted", "temp", input_per_mtok=1, output_per_mtok=1)
    assert get_model_info_for("scripted", "temp") is not None

    unregister_model_price("scripted", "temp")

    assert get_model_info_for("scripted", "temp") is None


def test_unregister_of_an_unregistered_model_says_so() -> None:
    with pytest.raises(PricingError, match="no price is registered"):
        unregister_model_price("scripted", "never-registered")


@pytest.mark.parametrize(
    ("provider", "model_id"),
    [("", "gpt-4o"), ("   ", "gpt-4o"), ("openai", ""), (None, "gpt-4o"), ("openai", ["x"])],
)
def test_lookups_refuse_malformed_names(provider: Any, model_id: Any) -> None:
    with pytest.raises(PricingError, match="must be a non-empty string"):
        get_model_info_for(provider, model_id)
    with pytest.raises(PricingError, match="must be a non-empty string"):
        price_usage(provider, model_id, Usage())
    with pytest.raises(PricingError, match="must be a non-empty string"):
        register_model_price(provider, model_id, input_per_mtok=1, output_per_mtok=1)


@pytest.mark.parametrize("at", ["2024-01-01", datetime(2024, 1, 1), 1_700_000_000])
def test_every_pricer_refuses_an_at_that_is_no_aware_datetime(at: Any) -> None:
    """For a fixed-price model too, where the time changes nothing: the same call with a
    dated model or a recorded price would fail."""
    usage = Usage(input_tokens=10)
    with memory_world() as world:
        world.set_model_price("acme", "m1", input_per_mtok=1, output_per_mtok=1)
        for price in (
            lambda: get_model_info_for("openai", "gpt-4o", at),
            lambda: price_usage("openai", "gpt-4o", usage, at),
            lambda: price_usage_exact("openai", "gpt-4o", usage, at),
            lambda: price_usage_picodollars("openai", "gpt-4o", usage, at),
            lambda: RecordedPrices().picodollars("openai", "gpt-4o", usage, at),
            lambda: world.pricer("acme", "m1", usage, at),
            lambda: world.pricer.picodollars("acme", "m1", usage, at),  # type: ignore[attr-defined]
        ):
            with pytest.raises(PricingError, match="timezone-aware datetime"):
                price()


_PRICE_FIELDS = (
    "input_per_mtok",
    "output_per_mtok",
    "cached_input_per_mtok",
    "reasoning_per_mtok",
    "cache_write_per_mtok",
)
_BAD_PRICES = (-0.01, math.nan, math.inf, True, "1.0")


@pytest.mark.parametrize(
    ("field", "bad"),
    [(field, bad) for field in _PRICE_FIELDS for bad in _BAD_PRICES]
    # None means "same as input/output" for the optional ones, so only the required ones refuse it.
    + [("input_per_mtok", None), ("output_per_mtok", None)],
)
def test_register_refuses_bad_prices(field: str, bad: Any) -> None:
    prices: dict[str, Any] = {"input_per_mtok": 1.0, "output_per_mtok": 1.0, field: bad}

    with pytest.raises(PricingError, match=f"{field} must be a finite number >= 0"):
        register_model_price("scripted", "bad-price", **prices)

    assert get_model_info_for("scripted", "bad-price") is None


def test_pricing_error_is_a_little_es_value_error() -> None:
    assert issubclass(PricingError, LittleEsError)
    assert issubclass(PricingError, ValueError)


def test_usage_that_breaks_the_token_convention_is_refused_when_recorded() -> None:
    with pytest.raises(pydantic.ValidationError, match="input_tokens must include the tokens"):
        Usage(input_tokens=10, cached_input_tokens=11)
    # Reads and writes are both parts of input_tokens, so together they fit in it.
    with pytest.raises(pydantic.ValidationError, match=r"plus cache_write_tokens \(5\) exceeds"):
        Usage(input_tokens=10, cached_input_tokens=6, cache_write_tokens=5)
    assert Usage(input_tokens=10, cached_input_tokens=5, cache_write_tokens=5).input_tokens == 10
    with pytest.raises(pydantic.ValidationError, match="output_tokens must include the reason"):
        Usage(output_tokens=10, reasoning_tokens=11)
    with pytest.raises(PricingError, match="usage must be a little_es Usage"):
        price_usage("openai", "gpt-4o", {"input_tokens": 1})  # type: ignore[arg-type]


def test_model_info_is_frozen() -> None:
    info = get_model_info_for("openai", "gpt-4o")
    assert info is not None

    with pytest.raises(pydantic.ValidationError):
        info.input_per_mtok = 0.0  # type: ignore[misc]


def test_repeated_lookups_are_served_from_the_cache() -> None:
    get_model_info_for("anthropic", "claude-sonnet-4-5")
    calls = 20_000

    start = time.perf_counter()
    for _ in range(calls):
        get_model_info_for("anthropic", "claude-sonnet-4-5")
    per_call = (time.perf_counter() - start) / calls

    # A hit is a dict lookup (well under 1 µs); a genai-prices lookup is ~100x slower.
    # The bound is loose so a slow CI machine does not fail it.
    assert per_call < 20e-6


def _refuse_network(*args: object, **kwargs: object) -> None:
    raise AssertionError(f"pricing tried to use the network: {args!r}")


def test_lookup_and_pricing_work_with_the_network_blocked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(socket.socket, "connect", _refuse_network)
    monkeypatch.setattr(socket.socket, "connect_ex", _refuse_network)
    monkeypatch.setattr(socket, "create_connection", _refuse_network)
    monkeypatch.setattr(socket, "getaddrinfo", _refuse_network)

    # A model no other test looks up, so this is a fresh genai-prices lookup.
    info = get_model_info_for("openai", "gpt-4o-mini-2024-07-18")
    cost = price_usage("openai", "gpt-4o-mini-2024-07-18", Usage(input_tokens=100))

    assert info is not None and info.model_id == "gpt-4o-mini"
    assert cost is not None and cost > 0
    assert not any(t.name.startswith("genai_prices") for t in threading.enumerate())


def test_import_and_first_lookup_need_no_network() -> None:
    script = textwrap.dedent(
        """
        import socket

        def refuse(*args, **kwargs):
            raise SystemExit("network used: %r" % (args,))

        socket.socket.connect = refuse
        socket.socket.connect_ex = refuse
        socket.create_connection = refuse
        socket.getaddrinfo = refuse

        import threading
        from little_es.values import Usage
        from little_es.pricing import price_usage

        cost = price_usage("anthropic", "claude-sonnet-4-5", Usage(input_tokens=1000))
        assert cost is not None and cost > 0, cost
        assert not any(t.name.startswith("genai_prices") for t in threading.enumerate())
        print("ok", cost)
        """
    )
    env = {**os.environ, "PYTHONPATH": str(_REPO)}

    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=_REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )

    assert done.returncode == 0, done.stderr + done.stdout
    assert done.stdout.startswith("ok ")


def test_set_model_price_refuses_an_effective_from_that_is_no_datetime() -> None:
    from little_es import PricingError, memory_world

    with memory_world() as world, pytest.raises(PricingError, match="timezone-aware datetime"):
        world.set_model_price(
            "p",
            "m",
            input_per_mtok=1,
            output_per_mtok=1,
            effective_from="2024-01-01",  # type: ignore[arg-type]
        )

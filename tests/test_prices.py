"""Prices are data in the world: recorded prices, prices at the call's time, exact sums.

A price recorded with ``world.set_model_price`` (or ``little prices set``) is an
event of the world's price book, so every process that folds the log prices
the same; genai-prices rates are taken at each call's timestamp; costs are
summed in integer picodollars, so no order of folding changes a total.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest
from genai_prices import calc_price
from genai_prices.types import Usage as GenaiUsage

from little_es.engine.local import run_workflow
from little_es.errors import PricingError
from little_es.events import Event, ModelPriceSet, ModelResponded
from little_es.harness.model import ScriptedModel, ScriptedReply
from little_es.ids import price_book_stream_id
from little_es.materialize import RunFold, apply, materialize_run_state
from little_es.orchestrator import run_tree, sum_usage
from little_es.pricing import (
    price_usage_exact,
    register_model_price,
    unregister_model_price,
)
from little_es.projections import list_runs
from little_es.replay import replay_run
from little_es.testing.logs import UNPRICED, Call, RunWriter, priced, unpriced
from little_es.values import Usage, UsageTotals
from little_es.workflow.authoring import Workflow, agent
from little_es.world import World, local_world, memory_world
from tests.conftest import WorldSpec

ROOT = Path(__file__).resolve().parent.parent
LONG_AGO = datetime(2020, 1, 1, tzinfo=UTC)


def _unpriced_cost(*, input_per_mtok: str, output_per_mtok: str) -> Decimal:
    """What ``unpriced()``'s usage costs at the given prices (1000 input, 200 output tokens)."""
    usage = unpriced().usage
    return (
        Decimal(input_per_mtok) * usage.input_tokens
        + Decimal(output_per_mtok) * usage.output_tokens
    ) / 1_000_000


# ---------------------------------------------------------------- recorded prices


def test_a_price_recorded_in_the_world_prices_the_calls_made_after_it(world: World) -> None:
    RunWriter(world, "run_before").agent_step("a", [unpriced()])
    event = world.set_model_price(
        " Scripted ", "SCRIPTED-model", input_per_mtok=Decimal("1.25"), output_per_mtok=2
    )
    RunWriter(world, "run_after").agent_step("a", [unpriced(), unpriced()])

    assert (event.provider, event.model_id) == UNPRICED
    assert world.model_prices() == (event,)
    # A call made before the price took effect keeps the price it had (none).
    before = replay_run(world, "run_before").state.usage
    assert before.cost_usd is None and before.unpriced_calls == 1
    after = replay_run(world, "run_after").state.usage
    one = _unpriced_cost(input_per_mtok="1.25", output_per_mtok="2")
    assert after.unpriced_calls == 0
    assert after.cost_usd_exact == 2 * one
    assert after.cost_usd == float(2 * one)


def test_a_backdated_price_prices_calls_already_recorded(world: World) -> None:
    RunWriter(world, "run_old").agent_step("a", [unpriced()])
    world.set_model_price(*UNPRICED, input_per_mtok=1, output_per_mtok=2, effective_from=LONG_AGO)
    usage = replay_run(world, "run_old").state.usage
    assert usage.cost_usd_exact == _unpriced_cost(input_per_mtok="1", output_per_mtok="2")


def test_the_latest_effective_price_applies_and_a_later_record_wins_a_tie(world: World) -> None:
    w = RunWriter(world, "run_prices")
    w.agent_step("a", [unpriced()])
    called = next(e for e in world.read_run_log("run_prices") if isinstance(e, ModelResponded))
    # Recorded out of order of effect: the one effective latest before the call applies.
    world.set_model_price(*UNPRICED, input_per_mtok=3, output_per_mtok=3, effective_from=LONG_AGO)
    world.set_model_price(
        *UNPRICED,
        input_per_mtok=5,
        output_per_mtok=5,
        effective_from=called.timestamp + timedelta(seconds=1),
    )
    world.set_model_price(
        *UNPRICED,
        input_per_mtok=2,
        output_per_mtok=2,
        effective_from=called.timestamp - timedelta(days=1),
    )
    cost = _unpriced_cost(input_per_mtok="2", output_per_mtok="2")
    assert replay_run(world, "run_prices").state.usage.cost_usd_exact == cost
    # Same effective_from: the one recorded last.
    world.set_model_price(
        *UNPRICED,
        input_per_mtok=4,
        output_per_mtok=4,
        effective_from=called.timestamp - timedelta(days=1),
    )
    cost = _unpriced_cost(input_per_mtok="4", output_per_mtok="4")
    assert replay_run(world, "run_prices").state.usage.cost_usd_exact == cost


@pytest.mark.backends("memory")
def test_the_world_price_comes_before_the_process_override_before_genai_prices(
    world: World,
) -> None:
    call = priced()
    RunWriter(world, "run_genai").agent_step("a", [call])
    genai = replay_run(world, "run_genai").state.usage.cost_usd_exact
    assert genai == price_usage_exact(*call_model(call), call.usage)

    register_model_price("openai", "gpt-4o", input_per_mtok=0.5, output_per_mtok=0.5)
    try:
        overridden = replay_run(world, "run_genai").state.usage.cost_usd_exact
        assert overridden == Decimal("0.0006")  # 1200 tokens at $0.5/MTok
        world.set_model_price(
            "openai", "gpt-4o", input_per_mtok=1, output_per_mtok=1, effective_from=LONG_AGO
        )
        assert replay_run(world, "run_genai").state.usage.cost_usd_exact == Decimal("0.0012")
    finally:
        unregister_model_price("openai", "gpt-4o")


def call_model(call: Call) -> tuple[str, str]:
    return call.provider, call.model


@pytest.mark.backends("sqlite", "postgres", "mariadb")
def test_a_world_opened_earlier_sees_a_price_another_one_recorded(
    world_factory: Callable[[], World],
) -> None:
    reader = world_factory()
    RunWriter(reader, "run_first").agent_step("a", [unpriced()])
    assert replay_run(reader, "run_first").state.usage.cost_usd is None  # the book is read here

    writer = world_factory()
    writer.set_model_price(*UNPRICED, input_per_mtok=1, output_per_mtok=2)
    RunWriter(writer, "run_second").agent_step("a", [unpriced()])

    cost = _unpriced_cost(input_per_mtok="1", output_per_mtok="2")
    assert replay_run(reader, "run_second").state.usage.cost_usd_exact == cost
    assert replay_run(reader, "run_first").state.usage.cost_usd is None
    assert [e.model_id for e in reader.model_prices()] == [UNPRICED[1]]
    # The reader records on top of what the writer recorded (it reads the book first).
    reader.set_model_price(*UNPRICED, input_per_mtok=3, output_per_mtok=3)
    assert len(writer.model_prices()) == 2
    assert [e.originator_version for e in writer.read_stream(price_book_stream_id())] == [1, 2]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"input_per_mtok": -1}, "input_per_mtok must be a finite number >= 0"),
        ({"output_per_mtok": float("nan")}, "output_per_mtok must be a finite number >= 0"),
        ({"cached_input_per_mtok": Decimal("Infinity")}, "cached_input_per_mtok must be"),
        ({"reasoning_per_mtok": "1"}, "reasoning_per_mtok must be a finite number"),
        ({"effective_from": datetime(2026, 1, 1)}, "effective_from must be timezone-aware"),
        ({"provider": " "}, "provider must be a non-empty string"),
        ({"model_id": ""}, "model_id must be a non-empty string"),
    ],
)
def test_a_bad_price_is_refused_and_nothing_is_recorded(
    fields: dict[str, object], message: str
) -> None:
    world = memory_world()
    args: dict[str, object] = {
        "provider": "vllm",
        "model_id": "m",
        "input_per_mtok": 1,
        "output_per_mtok": 1,
        **fields,
    }
    with pytest.raises(PricingError, match=message):
        world.set_model_price(**args)  # type: ignore[arg-type]
    assert world.model_prices() == ()
    assert world.read_stream(price_book_stream_id()) == []


def test_a_recorded_price_reads_back_exactly(world: World) -> None:
    world.set_model_price(
        "vllm",
        "m",
        input_per_mtok=Decimal("0.000001"),
        output_per_mtok=0.1,
        cached_input_per_mtok=Decimal("0.05"),
        reasoning_per_mtok=Decimal("7"),
        cache_write_per_mtok=Decimal("3.75"),
        effective_from=datetime(2026, 1, 1, 9, tzinfo=UTC),
    )
    (stored,) = world.read_stream(price_book_stream_id())
    assert isinstance(stored, ModelPriceSet)
    assert stored.input_per_mtok == Decimal("0.000001")
    assert stored.output_per_mtok == Decimal("0.1")  # a float by its shortest decimal form
    assert stored.cached_input_per_mtok == Decimal("0.05")
    assert stored.reasoning_per_mtok == Decimal("7")
    assert stored.cache_write_per_mtok == Decimal("3.75")
    assert stored.effective_from == datetime(2026, 1, 1, 9, tzinfo=UTC)


# ---------------------------------------------------------------- other processes


def _little(*args: str, env_world: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "LITTLE_ES_WORLD": env_world, "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "little_es.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
        check=False,
    )


def test_a_price_set_by_one_process_is_used_by_little_report_in_another(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'world'}"
    set_price = _little(
        "prices", "set", *UNPRICED, "--input", "2.5", "--output", "10", env_world=url
    )
    assert set_price.returncode == 0, set_price.stderr
    assert "recorded scripted/scripted-model" in set_price.stdout

    with local_world(tmp_path / "world") as world:
        RunWriter(world, "run_sub").agent_step("plan", [unpriced(), unpriced()])
        expected = replay_run(world, "run_sub").state.usage
    # 2 x (1000 x $2.5 + 200 x $10) / 1M
    assert expected.cost_usd_exact == Decimal("0.009")

    report = _little("report", "run_sub", env_world=url)
    assert report.returncode == 0, report.stderr
    total = next(line for line in report.stdout.splitlines() if "total" in line)
    assert "$0.009000" in total and "unpriced" not in total
    assert "cache write" not in report.stdout  # no call wrote to a prompt cache

    listed = _little("prices", "list", env_world=url)
    assert listed.returncode == 0, listed.stderr
    row = next(line for line in listed.stdout.splitlines() if "scripted-model" in line)
    assert row.split()[:6] == ["scripted", "scripted-model", "2.5", "=", "10", "="]


def test_a_recorded_cache_write_price_prices_cache_writes_in_run_totals(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'world'}"
    set_price = _little(
        "prices", "set", *UNPRICED, "--input", "2", "--output", "10", "--cached-input", "0.2",
        "--cache-write", "2.5", "--from", "2020-01-01", env_world=url,
    )  # fmt: skip
    assert set_price.returncode == 0, set_price.stderr
    call = unpriced(input_tokens=1000, cached_input_tokens=400, cache_write_tokens=300)
    with local_world(tmp_path / "world") as world:
        RunWriter(world, "run_cache").agent_step("plan", [call, call])
        usage = replay_run(world, "run_cache").state.usage
    assert (usage.cached_input_tokens, usage.cache_write_tokens) == (800, 600)
    # 2 x (300 x $2 + 400 x $0.2 + 300 x $2.5 + 200 x $10) / 1M
    assert usage.cost_usd_exact == Decimal("0.00686")

    listed = _little("prices", "list", env_world=url)
    assert listed.returncode == 0, listed.stderr
    assert "cache write" in listed.stdout
    row = next(line for line in listed.stdout.splitlines() if "scripted-model" in line)
    assert row.split()[:7] == ["scripted", "scripted-model", "2", "0.2", "2.5", "10", "="]
    report = _little("report", "run_cache", env_world=url)
    assert report.returncode == 0, report.stderr
    assert "cache write" in report.stdout
    total = next(line for line in report.stdout.splitlines() if "total" in line)
    assert total.split()[-3:] == ["0", "600", "$0.006860"]


def test_little_prices_set_refuses_what_is_not_a_price(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'world'}"
    bad = _little("prices", "set", "vllm", "m", "--input", "cheap", "--output", "1", env_world=url)
    assert bad.returncode == 1
    assert "--input must be a number of US dollars per million tokens" in bad.stderr
    bad_date = _little(
        "prices", "set", "vllm", "m", "--input", "1", "--output", "1", "--from", "soon",
        env_world=url,
    )  # fmt: skip
    assert bad_date.returncode == 1 and "--from must be an ISO 8601" in bad_date.stderr
    empty = _little("prices", "list", env_world=url)
    assert empty.returncode == 0 and "no prices recorded" in empty.stdout


# ---------------------------------------------------------------- prices at the call's time

# mistral-small-latest is $0.1 / $0.3 per MTok until 2026-03-16, $0.15 / $0.6 from then
# on, in the genai-prices data little_es is installed with.
_DATED = ("mistral", "mistral-small-latest")
_BEFORE_CHANGE = datetime(2026, 1, 10, 12, tzinfo=UTC)


def _shifted(events: list[Event], to: datetime) -> list[Event]:
    """The same log, as if it had been recorded from ``to`` on."""
    delta = to - events[0].timestamp
    return [e.model_copy(update={"timestamp": e.timestamp + delta}) for e in events]


def test_genai_prices_are_taken_at_the_call_s_timestamp(mem_world: World) -> None:
    call = Call(provider=_DATED[0], model=_DATED[1], input_tokens=1_000_000, output_tokens=0)
    RunWriter(mem_world, "run_dated").agent_step("a", [call])
    log = mem_world.read_run_log("run_dated")
    old = _shifted(log, _BEFORE_CHANGE)

    # The same log folded now, with genai-prices' current rate, and as recorded in January.
    assert materialize_run_state(log, pricer=mem_world.pricer).usage.cost_usd_exact == Decimal(
        "0.15"
    )
    replayed = materialize_run_state(old, pricer=mem_world.pricer).usage
    assert replayed.cost_usd_exact == Decimal("0.1")
    genai = calc_price(
        GenaiUsage(input_tokens=1_000_000),
        _DATED[1],
        provider_id=_DATED[0],
        genai_request_timestamp=_BEFORE_CHANGE,
    )
    assert replayed.cost_usd_exact == genai.total_price
    assert price_usage_exact(*_DATED, call.usage, _BEFORE_CHANGE) == Decimal("0.1")
    assert price_usage_exact(*_DATED, call.usage, _BEFORE_CHANGE.replace(month=4)) == Decimal(
        "0.15"
    )


@pytest.fixture
def mem_world() -> World:
    return memory_world()


# ---------------------------------------------------------------- exact sums


def _permutations_of_responses(log: list[Event]) -> Iterator[list[Event]]:
    """``log`` with its model responses in every order (the other events stay in place)."""
    slots = [i for i, e in enumerate(log) if isinstance(e, ModelResponded)]
    responses = [log[i] for i in slots]
    for order in itertools.permutations(responses):
        permuted = list(log)
        for slot, event in zip(slots, order, strict=True):
            permuted[slot] = event
        yield permuted


def test_totals_are_exact_whatever_the_order_of_folding(mem_world: World) -> None:
    # $0.1, $0.2 and $0.3 a call: as floats, (0.1 + 0.2) + 0.3 != 0.1 + (0.2 + 0.3).
    mem_world.set_model_price(
        *UNPRICED, input_per_mtok=100_000, output_per_mtok=0, effective_from=LONG_AGO
    )
    calls = [unpriced(input_tokens=n, output_tokens=0) for n in (1, 2, 3)]
    RunWriter(mem_world, "run_exact").agent_step("a", calls)
    log = mem_world.read_run_log("run_exact")

    totals = {
        materialize_run_state(order, pricer=mem_world.pricer).usage
        .model_dump_json(include={"cost_usd", "cost_usd_exact"})
        for order in _permutations_of_responses(log)
    }  # fmt: skip
    assert totals == {'{"cost_usd":0.6,"cost_usd_exact":"0.6"}'}
    state = replay_run(mem_world, "run_exact").state
    assert state.usage.cost_usd_exact == Decimal("0.6")
    assert state.steps["a"].usage.cost_usd_exact == Decimal("0.6")


def test_sums_of_runs_are_exact_whatever_their_order(mem_world: World) -> None:
    mem_world.set_model_price(
        *UNPRICED, input_per_mtok=100_000, output_per_mtok=0, effective_from=LONG_AGO
    )
    parent = RunWriter(mem_world, "run_parent")
    parent.agent_step("own", [unpriced(input_tokens=1, output_tokens=0)])
    for i, n in enumerate((2, 3)):
        parent.sub_run("fan", f"run_parent.sub{i}").agent_step(
            "a", [unpriced(input_tokens=n, output_tokens=0)]
        )
    tree = run_tree(mem_world, "run_parent")
    assert tree.total.cost_usd_exact == Decimal("0.6") and tree.total.cost_usd == 0.6
    scopes = [tree.usage, *(c.usage for c in tree.children)]
    assert {sum_usage(list(order)) for order in itertools.permutations(scopes)} == {tree.total}


def test_a_snapshot_keeps_the_exact_figure(mem_world: World) -> None:
    mem_world.set_model_price(
        *UNPRICED, input_per_mtok=100_000, output_per_mtok=0, effective_from=LONG_AGO
    )
    RunWriter(mem_world, "run_snap").agent_step(
        "a", [unpriced(input_tokens=n, output_tokens=0) for n in (1, 2)]
    )
    log = mem_world.read_run_log("run_snap")
    first = RunFold(mem_world.pricer)
    for event in log[:5]:
        apply(first, event)
    stored = first.freeze().model_dump(mode="json")
    resumed = RunFold.from_state(type(first.freeze()).model_validate(stored), mem_world.pricer)
    for event in log[5:]:
        apply(resumed, event)
    assert resumed.freeze() == materialize_run_state(log, pricer=mem_world.pricer)
    assert resumed.freeze().usage.cost_usd_exact == Decimal("0.3")


def test_a_total_stored_before_the_exact_field_still_loads() -> None:
    old = UsageTotals.model_validate({"cost_usd": 0.25, "calls": 1})
    assert old.cost_usd_exact == Decimal("0.25")
    unpriced_old = UsageTotals.model_validate({"cost_usd": None, "calls": 1, "unpriced_calls": 1})
    assert unpriced_old.cost_usd_exact is None
    exact_only = UsageTotals(cost_usd_exact=Decimal("0.1"))
    assert exact_only.cost_usd == 0.1
    round_trip = UsageTotals.model_validate_json(exact_only.model_dump_json())
    assert round_trip == exact_only


# ---------------------------------------------------------------- every reader agrees


async def test_a_run_priced_from_the_world_reads_the_same_everywhere(
    world: World, world_spec: WorldSpec
) -> None:
    world.set_model_price("acme", "acme-2", input_per_mtok=Decimal("2"), output_per_mtok=10)
    model = ScriptedModel(
        [
            ScriptedReply(content="one", usage=Usage(input_tokens=100, output_tokens=10)),
        ],
        provider="acme",
        model_id="acme-2",
    )
    wf = Workflow("priced", steps=[agent("ask", model=model, prompt="hi", max_turns=1)])
    result = await run_workflow(world, wf, {}, run_id="run_world_priced")
    expected = Decimal(100 * 2 + 10 * 10) / 1_000_000
    assert result.state.usage.cost_usd_exact == expected
    assert result.state == replay_run(world, "run_world_priced").state
    (summary,) = list_runs(world)
    assert summary.usage == result.state.usage
    if world_spec.persistent:
        with world_spec.open() as fresh:  # another process's view: nothing registered in it
            assert replay_run(fresh, "run_world_priced").state.usage == result.state.usage

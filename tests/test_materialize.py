"""The reducer's rules, on logs written through the real aggregates.

Costs are checked against :func:`little_es.pricing.price_usage` call by call
(the pricing module owns the figures), plus the one rule that matters most:
``harness.session.completed`` never adds anything.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime
from decimal import Decimal

import pytest

from little_es.events import ModelResponded
from little_es.materialize import (
    MaterializedRunState,
    RunFold,
    apply,
    materialize_run_state,
    visit_counter,
)
from little_es.pricing import price_usage, price_usage_exact
from little_es.replay import replay_run
from little_es.testing.logs import Call, RunWriter, priced, unpriced
from little_es.values import Usage, UsageTotals
from little_es.world import World, memory_world


@pytest.fixture
def mem() -> World:
    return memory_world()


def _cost(calls: Sequence[Call]) -> float:
    total = 0.0
    for c in calls:
        cost = price_usage(c.provider, c.model, c.usage)
        assert cost is not None and cost > 0
        total += cost
    return total


def _state(world: World, run_id: str) -> MaterializedRunState:
    return materialize_run_state(world.read_run_log(run_id), pricer=price_usage_exact)


# ---------------------------------------------------------------- the pricer


def test_the_fold_prices_with_the_pricer_it_is_given_and_nothing_else(mem: World) -> None:
    w = RunWriter(mem, "run_pricer")
    w.agent_step("a", [priced(), unpriced()])
    log = mem.read_run_log("run_pricer")
    seen: list[tuple[str, str, int, datetime]] = []

    def flat(provider: str, model_id: str, usage: Usage, at: datetime) -> Decimal | None:
        seen.append((provider, model_id, usage.input_tokens, at))
        return Decimal("0.25")

    flat_state = materialize_run_state(log, pricer=flat)
    assert flat_state.usage.cost_usd == 0.5
    assert flat_state.usage.cost_usd_exact == Decimal("0.5")
    assert flat_state.usage.unpriced_calls == 0
    assert len(seen) == 2
    # Each call is priced at the moment it was answered.
    responded = [e.timestamp for e in log if isinstance(e, ModelResponded)]
    assert [at for *_, at in seen] == responded
    none_state = materialize_run_state(log, pricer=lambda provider, model_id, usage, at: None)
    assert none_state.usage.cost_usd is None
    assert none_state.usage.unpriced_calls == 2
    # A world hands its own pricer to every fold it makes: replay and loaded runs alike.
    mem.pricer = flat
    assert replay_run(mem, "run_pricer").state.usage.cost_usd == 0.5


# ---------------------------------------------------------------- the four cost cases


def test_all_calls_priced(world: World) -> None:
    calls = [priced(), priced(input_tokens=3000, output_tokens=50, cached_input_tokens=2048)]
    w = RunWriter(world, "run_priced")
    w.agent_step("a", calls)
    state = replay_run(world, "run_priced").state
    assert state.usage.cost_usd == pytest.approx(_cost(calls), rel=1e-12)
    assert state.usage.unpriced_calls == 0
    assert state.usage.calls == 2
    assert state.usage.input_tokens == 4000
    assert state.usage.output_tokens == 250
    assert state.usage.cached_input_tokens == 2048
    assert state.steps["a"].usage == state.usage


def test_mixed_priced_and_unpriced(mem: World) -> None:
    w = RunWriter(mem, "run_mixed")
    w.agent_step("priced_step", [priced()])
    w.agent_step("unpriced_step", [unpriced(), unpriced()])
    w.agent_step("mixed_step", [unpriced(), priced(input_tokens=10)])
    state = _state(mem, "run_mixed")
    expected = _cost([priced(), priced(input_tokens=10)])
    assert state.usage.cost_usd == pytest.approx(expected, rel=1e-12)
    assert state.usage.unpriced_calls == 3
    assert state.usage.calls == 5
    steps = state.steps
    assert steps["priced_step"].usage.cost_usd == pytest.approx(_cost([priced()]))
    assert steps["unpriced_step"].usage.cost_usd is None
    assert steps["unpriced_step"].usage.unpriced_calls == 2
    assert steps["unpriced_step"].usage.input_tokens == 2000
    assert steps["mixed_step"].usage.cost_usd == pytest.approx(_cost([priced(input_tokens=10)]))
    assert steps["mixed_step"].usage.unpriced_calls == 1


def test_all_calls_unpriced_is_none_not_zero(mem: World) -> None:
    w = RunWriter(mem, "run_unpriced")
    w.agent_step("a", [unpriced(), unpriced(reasoning_tokens=50)])
    usage = _state(mem, "run_unpriced").usage
    assert usage.cost_usd is None
    assert usage.unpriced_calls == 2
    assert usage.input_tokens == 2000
    assert usage.reasoning_tokens == 50


def test_no_calls_is_a_true_zero(mem: World) -> None:
    w = RunWriter(mem, "run_free")
    w.task_step("a", 1)
    w.agent_step("b", [])
    state = _state(mem, "run_free")
    assert state.usage == UsageTotals()
    assert state.usage.cost_usd == 0.0
    assert state.usage.cost_usd is not None
    assert state.steps["b"].usage.cost_usd == 0.0


def test_session_completed_rollup_is_never_folded(mem: World) -> None:
    w = RunWriter(mem, "run_rollup")
    huge = Usage(
        input_tokens=10**9, output_tokens=10**9, cached_input_tokens=10**9, reasoning_tokens=10**9
    )
    w.agent_step("a", [priced()], session_completed_usage=huge)
    alone = RunWriter(mem, "run_no_rollup")
    alone.agent_step("a", [priced()], complete=False)
    with_rollup = _state(mem, "run_rollup")
    assert with_rollup.usage == _state(mem, "run_no_rollup").usage
    assert with_rollup.usage.input_tokens == 1000
    assert with_rollup.steps["a"].usage.input_tokens == 1000
    assert "harness.session.completed" in [e.wire_name for e in mem.read_run_log("run_rollup")]


def test_per_step_totals_from_the_event_or_the_session(mem: World) -> None:
    w = RunWriter(mem, "run_steps")
    w.agent_step("named", [priced(input_tokens=111, step_path_on_event=True)])
    w.agent_step("by_session", [priced(input_tokens=222, step_path_on_event=False)])
    w.task_step("plain", "x")
    state = _state(mem, "run_steps")
    assert state.steps["named"].usage.input_tokens == 111
    assert state.steps["by_session"].usage.input_tokens == 222
    assert state.steps["plain"].usage == UsageTotals()
    assert state.usage.input_tokens == 333
    assert state.usage.cost_usd == pytest.approx(
        sum(s.usage.cost_usd or 0.0 for s in state.steps.values()), rel=1e-12
    )


def test_cache_writes_are_totalled_per_step_and_run_and_priced(mem: World) -> None:
    writes = priced(input_tokens=3000, cached_input_tokens=1000, cache_write_tokens=1500)
    w = RunWriter(mem, "run_cache_writes")
    w.agent_step("a", [writes, priced()])
    w.agent_step("b", [priced(input_tokens=2000, cache_write_tokens=2000)], complete=False)
    log = mem.read_run_log("run_cache_writes")
    state = _state(mem, "run_cache_writes")
    assert state.steps["a"].usage.cache_write_tokens == 1500
    assert state.steps["b"].usage.cache_write_tokens == 2000
    assert (state.usage.cache_write_tokens, state.usage.cached_input_tokens) == (3500, 1000)
    assert state.usage.cost_usd == pytest.approx(
        _cost([writes, priced(), priced(input_tokens=2000, cache_write_tokens=2000)]), rel=1e-12
    )
    # Folding on from a frozen state keeps them.
    fold = RunFold(price_usage_exact)
    for event in log[:-2]:
        apply(fold, event)
    resumed = RunFold.from_state(fold.freeze(), price_usage_exact)
    for event in log[-2:]:
        apply(resumed, event)
    assert resumed.freeze() == state


def test_every_session_of_the_run_counts(mem: World) -> None:
    # A retried agent step opens a new session per attempt; both were paid for.
    w = RunWriter(mem, "run_retry")
    w.agent_step("a", [priced(input_tokens=100)], complete=False)
    w.fail_step("a", will_retry=True)
    w.agent_step("a", [priced(input_tokens=200)], attempt=2)
    state = _state(mem, "run_retry")
    assert state.usage.input_tokens == 300
    assert state.steps["a"].usage.input_tokens == 300
    assert len(state.steps["a"].session_ids) == 2
    assert state.steps["a"].status == "completed"


# ---------------------------------------------------------------- run and step state


def test_visits_and_the_pending_decision_target(mem: World) -> None:
    w = RunWriter(mem, "run_loop")
    w.task_step("review", "v1")
    w.task_step("decide", None, next_step="review")
    w.task_step("review@2", "v2", visit=2)
    w.task_step("decide@2", None, visit=2, next_step="publish")
    state = _state(mem, "run_loop")
    assert visit_counter("review@2") == "review"
    assert visit_counter("check@2[a.py]/lint") == "check[a.py]/lint"
    assert state.visits == {"review": 2, "decide": 2}
    assert state.steps["review@2"].visit == 2
    assert state.pending_decision_target == "publish"


def test_run_status_through_failure_and_resume(mem: World) -> None:
    w = RunWriter(mem, "run_status")
    w.start_step("a")
    w.fail_step("a", will_retry=False, message="disk full")
    w.fail(step_path="a", message="disk full")
    failed = _state(mem, "run_status")
    assert failed.status == "failed"
    assert failed.failed_step_path == "a"
    assert failed.error is not None and failed.error.message == "disk full"
    w.start_step("a", attempt=2)
    resumed = _state(mem, "run_status")
    assert resumed.status == "running"
    assert resumed.error is None
    w.complete_step("a", "ok", attempt=2)
    w.complete("ok")
    done = _state(mem, "run_status")
    assert done.status == "completed"
    assert done.output == "ok"
    assert done.completed_at is not None and done.started_at is not None
    assert done.started_at <= done.completed_at == done.updated_at


def test_the_runtimes_live_fold_equals_the_replayed_state(mem: World) -> None:
    # The Run aggregate folds its stream with the same apply() while writing.
    w = RunWriter(mem, "run_live", input={"q": [1, 2]})
    w.task_step("a", {"x": 1})
    w.start_step("b")
    w.fail_step("b", will_retry=True)
    w.task_step("b", [3], attempt=2)
    w.complete({"done": True})
    assert w.run.fold.freeze() == replay_run(mem, "run_live").state
    assert mem.load_run("run_live").fold.freeze() == w.run.fold.freeze()


def test_fold_continues_from_a_materialized_state(mem: World) -> None:
    w = RunWriter(mem, "run_resume_fold")
    w.agent_step("a", [priced(), unpriced()])
    w.agent_step("b", [priced(input_tokens=7)], complete=False)
    log = mem.read_run_log("run_resume_fold")
    half = len(log) // 2
    first = RunFold(price_usage_exact)
    for event in log[:half]:
        apply(first, event)
    second = RunFold.from_state(first.freeze(), price_usage_exact)
    for event in log[half:]:
        apply(second, event)
    assert second.freeze() == materialize_run_state(log, pricer=price_usage_exact)


def test_freezing_as_the_fold_goes_equals_freezing_once(mem: World) -> None:
    # Each step's frozen view is cached until the step changes: freezing after
    # every event must see every change, and end where a single freeze does.
    w = RunWriter(mem, "run_freeze_often")
    w.agent_step("a", [priced(tool_calls=1), unpriced()])
    w.start_step("b")
    w.fail_step("b", will_retry=True)
    w.task_step("b", {"ok": True}, attempt=2)
    w.agent_step("c", [priced()], complete=False)
    log = mem.read_run_log("run_freeze_often")
    often = RunFold(price_usage_exact)
    for i, event in enumerate(log):
        apply(often, event)
        assert often.freeze() == materialize_run_state(log[: i + 1], pricer=price_usage_exact)
    assert often.freeze() == materialize_run_state(log, pricer=price_usage_exact)
    resumed = RunFold.from_state(often.freeze(), price_usage_exact)
    assert resumed.freeze() == often.freeze()


def test_costs_are_finite_floats(mem: World) -> None:
    w = RunWriter(mem, "run_floats")
    w.agent_step("a", [priced(input_tokens=1, output_tokens=1)] * 50)
    cost = _state(mem, "run_floats").usage.cost_usd
    assert isinstance(cost, float) and math.isfinite(cost) and cost > 0

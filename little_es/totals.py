"""What a run and all its sub-runs have spent: :func:`run_tree_totals`, and :func:`sum_usage`.

A run's own totals (:attr:`~little_es.materialize.MaterializedRunState.usage`)
never include a sub-run's: each sub-run is a run with its own log. A budget
(:class:`~little_es.values.Budget`) is over the run *and* its sub-runs, and an
outer loop's budget over all of its cycles' runs, so the sum over a run tree is
written once, here, below the engine that checks budgets.
"""

from __future__ import annotations

from collections.abc import Sequence

from little_es.ids import validate_run_id
from little_es.materialize import COUNTED_ONLY, dollars, picodollars
from little_es.values import UsageTotals
from little_es.world import World, gc_paused

__all__ = ["run_tree_totals", "sum_usage"]


def sum_usage(totals: Sequence[UsageTotals]) -> UsageTotals:
    """The totals of several scopes: cost is None only when there were calls and none was priced.

    The cost is summed exactly (in picodollars, as the reducer does), so it is the
    same in whatever order the scopes come.
    """
    calls = sum(t.calls for t in totals)
    unpriced = sum(t.unpriced_calls for t in totals)
    none_priced = bool(calls) and calls == unpriced
    pusd = sum(picodollars(t.cost_usd_exact) for t in totals if t.cost_usd_exact is not None)
    return UsageTotals(
        input_tokens=sum(t.input_tokens for t in totals),
        output_tokens=sum(t.output_tokens for t in totals),
        cached_input_tokens=sum(t.cached_input_tokens for t in totals),
        reasoning_tokens=sum(t.reasoning_tokens for t in totals),
        cache_write_tokens=sum(t.cache_write_tokens for t in totals),
        cost_usd=None if none_priced else float(dollars(pusd)),
        cost_usd_exact=None if none_priced else dollars(pusd),
        unpriced_calls=unpriced,
        calls=calls,
    )


def run_tree_totals(world: World, run_id: str) -> UsageTotals:
    """The tokens, dollars and calls of ``run_id`` and of every sub-run below it, summed.

    Each run is folded from its own log by the one reducer (as ``replay_run``
    folds it); a reserved sub-run that never started adds nothing, and a run
    is counted once however the logs name it. Raises
    :class:`~little_es.errors.InvalidRunIdError` or
    :class:`~little_es.errors.RunNotFoundError` for ``run_id``.
    """
    validate_run_id(run_id)
    seen = {run_id}
    pending = [run_id]
    found: list[UsageTotals] = []
    with gc_paused():
        while pending:
            current = pending.pop()
            if current != run_id and not world.run_exists(current):
                continue
            state = world.read_run_log_skipping(current, COUNTED_ONLY).materialize()
            found.append(state.usage)
            for sub_run_id in state.sub_run_ids:
                if sub_run_id not in seen:
                    seen.add(sub_run_id)
                    pending.append(sub_run_id)
    return sum_usage(found)

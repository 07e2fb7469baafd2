"""Properties of the reducer (:mod:`little_es.materialize`) over generated run logs.

The logs are sequences of the protocol's run events in any order a writer, a
crash or a concurrent ``cancel`` could leave; the fold must be a pure function
of them, foldable in pieces (a snapshot is a fold of a prefix) and keep its
status rules.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import uuid4

from hypothesis import given, settings
from hypothesis import strategies as st

from little_es.events import (
    BudgetExceeded,
    BudgetSet,
    Event,
    RunCancelled,
    RunCompleted,
    RunFailed,
    RunResumed,
    RunStarted,
    StepCompleted,
    StepFailed,
    StepStarted,
)
from little_es.materialize import RunFold, apply, materialize_run_state
from little_es.pricing import price_usage_exact
from little_es.values import Budget, ErrorInfo

_STREAM = uuid4()
_T0 = datetime(2026, 1, 1, tzinfo=UTC)
_PATHS = st.sampled_from(["a", "b", "loop.c"])
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=6,
)
_ERROR = st.builds(ErrorInfo, type=st.just("RuntimeError"), message=st.text(max_size=8))
_N = st.integers(1, 3)

# Each body event as (class, fields); originator_version and timestamp are set by _log.
_BODY: st.SearchStrategy[tuple[type[Event], dict[str, Any]]] = st.one_of(
    st.fixed_dictionaries(
        {"step_path": _PATHS, "kind": st.just("task"), "visit": _N, "attempt": _N}
    ).map(lambda f: (StepStarted, {**f, "step_id": f["step_path"]})),
    st.fixed_dictionaries({"step_path": _PATHS, "visit": _N, "attempt": _N, "output": _JSON}).map(
        lambda f: (StepCompleted, {**f, "step_id": f["step_path"]})
    ),
    st.fixed_dictionaries(
        {
            "step_path": _PATHS,
            "visit": _N,
            "attempt": _N,
            "error": _ERROR,
            "will_retry": st.booleans(),
        }
    ).map(lambda f: (StepFailed, {**f, "step_id": f["step_path"]})),
    st.fixed_dictionaries({"output": _JSON}).map(lambda f: (RunCompleted, f)),
    st.fixed_dictionaries({"error": _ERROR}).map(lambda f: (RunFailed, f)),
    st.fixed_dictionaries({"reason": st.none() | st.text(max_size=5)}).map(
        lambda f: (RunCancelled, f)
    ),
    st.integers(0, 10).map(lambda n: (BudgetSet, {"budget": Budget(model_calls=n)})),
    st.just((BudgetExceeded, {"scope": "run", "spent": "1 call"})),
    st.just((RunResumed, {"previous_status": "cancelled"})),
)


def _log(body: list[tuple[type[Event], dict[str, Any]]], input: Any) -> list[Event]:
    start = (
        RunStarted,
        {"run_id": "run_p", "workflow_id": "w", "workflow_version": "1", "ir_hash": "h"}
        | {"input": input},
    )
    return [
        cls(originator_id=_STREAM, originator_version=i, timestamp=_T0 + timedelta(seconds=i), **f)
        for i, (cls, f) in enumerate([start, *body], start=1)
    ]


_LOGS = st.builds(_log, st.lists(_BODY, max_size=25), _JSON)


def _fold(events: list[Event]) -> Any:
    return materialize_run_state(events, pricer=price_usage_exact)


@settings(max_examples=150, deadline=None)
@given(_LOGS)
def test_folding_is_deterministic_and_counts_every_event(events: list[Event]) -> None:
    state = _fold(events)
    assert state == _fold(list(events))
    assert state.event_count == len(events)
    assert state.updated_at == events[-1].timestamp and state.started_at == _T0 + timedelta(
        1 / 86400
    )


@settings(max_examples=150, deadline=None)
@given(_LOGS, st.data())
def test_a_prefix_then_the_rest_is_the_whole(events: list[Event], data: st.DataObject) -> None:
    cut = data.draw(st.integers(0, len(events)))
    whole = _fold(events)
    fold = RunFold(price_usage_exact)
    for event in events[:cut]:
        apply(fold, event)
    # Continued in place, and continued from the frozen state as a snapshot is.
    snapshot = RunFold.from_state(fold.freeze(), price_usage_exact, fold.gave_up_attempts())
    for event in events[cut:]:
        apply(fold, event)
        apply(snapshot, event)
    assert fold.freeze() == whole
    assert snapshot.freeze() == whole


@settings(max_examples=150, deadline=None)
@given(_LOGS)
def test_the_status_rules(events: list[Event]) -> None:
    state = _fold(events)
    # The run's status, as the protocol states it, event by event.
    expected = "pending"
    for e in events:
        match e:
            case RunStarted() | RunResumed():
                expected = "running"
            case StepStarted() if expected == "failed":
                expected = "running"  # a retry after a resume
            case RunCompleted():
                expected = "completed"
            case RunFailed():
                expected = "failed"
            case RunCancelled() if expected != "completed":
                expected = "cancelled"  # a cancel that races a completion never undoes it
            case BudgetExceeded():
                expected = "budget_exceeded"
    assert state.status == expected
    last_done = [e for e in events if isinstance(e, RunCompleted)]
    if last_done:
        assert state.output == last_done[-1].output
    # Each step is where its own last event put it.
    for path, step in state.steps.items():
        mine = [e for e in events if getattr(e, "step_path", None) == path]
        final = mine[-1]
        step_status = {StepStarted: "running", StepCompleted: "completed"}.get(type(final))
        if isinstance(final, StepFailed):
            step_status = "pending" if final.will_retry else "failed"
        assert step.status == step_status
        assert step.attempts == final.attempt  # type: ignore[attr-defined]

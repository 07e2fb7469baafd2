"""Compact per-step instances (little_es._compact) behave as validated ones and are smaller."""

from __future__ import annotations

import copy
import gc
import pickle
import sys
import tracemalloc
from collections.abc import Callable

import pytest
from pydantic import BaseModel, ValidationError

from little_es import task
from little_es.materialize import StepState
from little_es.replay import ReplayPlanStep
from little_es.workflow.ir import RetryPolicy, StepIR


def _work(ctx: object) -> int:
    return 1


def _compact_step_state() -> StepState:
    from little_es.materialize import StepFold

    fold = StepFold(step_path="fetch", step_id="fetch")
    fold.kind = "task"
    fold.status = "completed"
    fold.attempts = 1
    fold.output = {"rows": [1, 2]}
    return fold.freeze()


def test_a_compact_step_state_is_an_ordinary_step_state() -> None:
    made = _compact_step_state()
    validated = StepState.model_validate(made.model_dump())
    assert made == validated
    assert made.model_dump() == validated.model_dump()
    assert made.model_dump_json() == validated.model_dump_json()
    assert made.model_fields_set == validated.model_fields_set
    assert copy.deepcopy(made) == made
    assert pickle.loads(pickle.dumps(made)) == made
    with pytest.raises(ValidationError):
        made.status = "failed"  # type: ignore[misc]


def test_a_copy_with_changes_leaves_the_shared_field_set_alone() -> None:
    made = _compact_step_state()
    other = _compact_step_state()
    changed = made.model_copy(update={"status": "failed"})
    assert changed.status == "failed" and made.status == "completed"
    assert other.model_fields_set == set(StepState.model_fields)


def test_a_compact_step_ir_hashes_and_dumps_as_a_validated_one() -> None:
    ir = task("fetch", _work).ir
    validated = StepIR(id="fetch", kind="task", ref=ir.ref, retry=RetryPolicy(), max_visits=1)
    assert ir == validated
    assert ir.model_dump(exclude_defaults=True) == validated.model_dump(exclude_defaults=True)
    assert ir.model_dump(exclude_unset=True) == validated.model_dump(exclude_unset=True)
    assert hash(ir) == hash(validated)


def _traced_bytes(build: Callable[[], object], n: int = 500) -> float:
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        kept = [build() for _ in range(n)]
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert len(kept) == n
    return (after - before) / n


@pytest.mark.skipif(sys.implementation.name != "cpython", reason="CPython's split dicts")
@pytest.mark.parametrize(
    "sample",
    [_compact_step_state, lambda: task("fetch", _work).ir, lambda: _plan_step()],
    ids=["StepState", "StepIR", "ReplayPlanStep"],
)
def test_compact_instances_are_smaller_than_pydantics_own(sample: Callable[[], BaseModel]) -> None:
    from little_es import _compact

    one = sample()
    cls = type(one)
    values = dict(one.__dict__)
    fields = set(one.model_fields_set)
    compact = _traced_bytes(lambda: _compact.construct_compact(cls, fields, values))
    ordinary = _traced_bytes(lambda: cls.model_construct(fields, **values))
    assert compact < 0.6 * ordinary, (compact, ordinary)


def _plan_step() -> ReplayPlanStep:
    from little_es import _compact
    from little_es.replay import _PLAN_FIELDS

    return _compact.construct_compact(
        ReplayPlanStep,
        _PLAN_FIELDS,
        {
            "step_path": "fetch",
            "status": "completed",
            "should_run": False,
            "output": 1,
            "output_ref": None,
            "artifact_refs": (),
        },
    )


def test_only_plain_models_are_built_compact() -> None:
    from little_es import _compact

    class Hooked(BaseModel):
        a: int = 0

        def model_post_init(self, context: object) -> None:
            pass

    with pytest.raises(TypeError, match="plain models"):
        _compact.prepare_compact(Hooked)

"""Compact per-step instances (little_es._compact) behave as validated ones and are smaller."""

from __future__ import annotations

import copy
import gc
import hashlib
import pickle
import sys
import tracemalloc
from collections.abc import Callable

import pytest
from pydantic import BaseModel, ValidationError

from little_es import Workflow, decision, parallel, subworkflow, task
from little_es.materialize import StepState
from little_es.replay import ReplayPlanStep
from little_es.workflow.ir import RetryPolicy, StepIR, canonical_json


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


def _mixed_workflow(n: int) -> Workflow:
    child = Workflow("child", steps=[task("c", _work)])
    return Workflow(
        "mixed",
        steps=[
            *(task(f"s{i}", _work, retry=RetryPolicy(max_attempts=2)) for i in range(n)),
            parallel(
                "fan",
                branches=_work,
                step=task("inner", _work, run_in_thread=False),
                max_concurrency=3,
            ),
            decision("route", _work, max_visits=2),
            subworkflow("sub", child),
        ],
    )


@pytest.mark.skipif(sys.implementation.name != "cpython", reason="CPython's split dicts")
def test_hashing_a_workflow_keeps_its_steps_compact() -> None:
    n = 400
    wf = _mixed_workflow(n)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        digest = wf.ir_hash
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    # A dump of the steps themselves gives each one a dict of its own: 64 bytes a step.
    assert kept < 8 * n, kept
    # The bytes hashed are those of pydantic's own dump of the whole IR.
    plain = canonical_json(_mixed_workflow(n).ir.model_dump(mode="json", exclude_defaults=True))
    assert wf.ir.canonical_json() == plain
    assert digest == hashlib.sha256(plain).hexdigest()

"""The workflow IR, the authoring API and the step context."""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
from pydantic import ValidationError

from little_es._frozen import FrozenDict, FrozenList, freeze
from little_es.errors import (
    InvalidBranchSetError,
    InvalidStepPathError,
    UnknownStepError,
    WorkflowDefinitionError,
)
from little_es.harness.model import ScriptedModel
from little_es.harness.tools import tool
from little_es.workflow.authoring import (
    AgentStep,
    DecisionStep,
    ParallelStep,
    SubworkflowStep,
    TaskStep,
    Workflow,
    agent,
    decision,
    parallel,
    subworkflow,
    task,
)
from little_es.workflow.context import StepContext
from little_es.workflow.ir import END, MAX_BACKOFF_S, AgentSpecIR, RetryPolicy, StepIR, WorkflowIR

# --- step functions at module level, so a subprocess can rebuild the same workflow ---


def fetch_ticket(ctx: StepContext) -> dict[str, Any]:
    return {"ticket": ctx.input["ticket"]}


def fetch_ticket_v2(ctx: StepContext) -> dict[str, Any]:
    return {"ticket": ctx.input["ticket"], "v": 2}


def lint_file(ctx: StepContext) -> str:
    return f"ok {ctx.branch_key}"


def choose_next(ctx: StepContext) -> str:
    return END


async def publish(ctx: StepContext) -> str:
    return "published"


def search(query: str) -> str:
    """Search the code base."""
    return query


def open_file(path: str) -> str:
    """Open a file."""
    return path


def plan_prompt(ctx: StepContext) -> str:
    return f"plan ticket {ctx.input['ticket']}"


def review_prompt(ctx: StepContext) -> str:
    return "review the plan"


def plan_files(ctx: StepContext) -> Any:
    return ctx.outputs["plan"]["files"]


def model() -> ScriptedModel:
    return ScriptedModel([], provider="openai", model_id="gpt-4o-mini")


def build_triage(**overrides: Any) -> Workflow:
    """The issue's example workflow; ``overrides`` replace individual steps by id."""
    steps: dict[str, Any] = {
        "fetch": task("fetch", fetch_ticket),
        "plan": agent("plan", model=model(), tools=[search], prompt=plan_prompt),
        "check": parallel("check", branches=plan_files, step=task("lint", lint_file)),
        "review": decision("review", choose_next, max_visits=3),
        "publish": task("publish", publish),
    }
    steps.update(overrides)
    return Workflow("triage", version="1", steps=list(steps.values()))


# --- builders ---


def test_issue_example_builds_with_lambda_branches() -> None:
    wf = Workflow(
        "triage",
        version="1",
        steps=[
            task("fetch", fetch_ticket),
            agent("plan", model=model(), tools=[search], prompt=plan_prompt),
            parallel(
                "check",
                branches=lambda ctx: ctx.outputs["plan"]["files"],
                step=task("lint", lint_file),
            ),
            decision("review", choose_next, max_visits=3),
            task("publish", publish),
        ],
    )
    assert [s.id for s in wf.steps] == ["fetch", "plan", "check", "review", "publish"]
    assert wf.ir.steps[2].ref == (
        f"{__name__}:test_issue_example_builds_with_lambda_branches.<locals>.<lambda>"
    )


def test_builders_record_kind_ref_and_settings() -> None:
    wf = build_triage()
    fetch, plan, check, review, publish_ir = wf.ir.steps
    assert (fetch.kind, fetch.ref) == ("task", f"{__name__}:fetch_ticket")
    assert (review.kind, review.ref, review.max_visits) == (
        "decision",
        f"{__name__}:choose_next",
        3,
    )
    assert publish_ir.ref == f"{__name__}:publish"
    assert check.kind == "parallel"
    assert check.ref == f"{__name__}:plan_files"
    assert check.branch_step is not None
    assert (check.branch_step.id, check.branch_step.kind) == ("lint", "task")
    assert plan.kind == "agent"
    assert plan.ref == f"{__name__}:plan_prompt"
    assert plan.agent is not None
    assert (plan.agent.provider, plan.agent.model_id) == ("openai", "gpt-4o-mini")
    assert [t.name for t in plan.agent.tools] == ["search"]
    assert plan.agent.tools[0].schema_hash == tool(search).schema_hash
    assert plan.agent.system_prompt_sha256 is None
    assert plan.agent.max_turns == 20


def test_step_objects_carry_the_live_callables() -> None:
    wf = build_triage()
    fetch = wf.step("fetch")
    assert isinstance(fetch, TaskStep) and fetch.fn is fetch_ticket
    check = wf.step("check")
    assert isinstance(check, ParallelStep)
    assert check.branches is plan_files
    assert isinstance(check.step, TaskStep) and check.step.fn is lint_file
    assert wf.step("lint") is check.step
    review = wf.step("review")
    assert isinstance(review, DecisionStep) and review.fn is choose_next
    plan = wf.step("plan")
    assert isinstance(plan, AgentStep)
    assert plan.prompt is plan_prompt
    assert list(plan.tools) == ["search"]
    assert plan.tools["search"].fn is search


def test_agent_options_go_into_the_spec() -> None:
    step = agent(
        "plan",
        model=model(),
        prompt="Plan the change.",
        tools=[search, tool(open_file, name="open")],
        system="You are careful.",
        max_turns=5,
        parameters={"temperature": 0, "stop": ["\n"]},
    )
    spec = step.ir.agent
    assert spec is not None
    assert step.ir.ref is None  # a literal prompt names no function
    assert [t.name for t in spec.tools] == ["search", "open"]
    assert spec.system_prompt_sha256 is not None and len(spec.system_prompt_sha256) == 64
    assert spec.parameters == {"temperature": 0, "stop": ["\n"]}
    assert spec.max_turns == 5
    assert step.parameters == {"temperature": 0, "stop": ["\n"]}


def test_agent_parameters_are_copied() -> None:
    params: dict[str, Any] = {"temperature": 0}
    step = agent("plan", model=model(), prompt="p", parameters=params)
    params["temperature"] = 1
    assert step.ir.agent is not None and step.ir.agent.parameters == {"temperature": 0}


def test_subworkflow_records_child_id_and_version() -> None:
    child = Workflow("child", version="2.1", steps=[task("only", fetch_ticket)])
    step = subworkflow("sub", child, input=lambda ctx: {"x": 1})
    assert isinstance(step, SubworkflowStep)
    assert (step.ir.workflow_id, step.ir.workflow_version) == ("child", "2.1")
    assert step.ir.ref == (
        f"{__name__}:test_subworkflow_records_child_id_and_version.<locals>.<lambda>"
    )
    assert subworkflow("sub", child).ir.ref is None
    assert subworkflow("sub", child).input is None


class _Callable:
    def __call__(self, ctx: StepContext) -> int:
        return 1

    def method(self, ctx: StepContext) -> int:
        return 2


def _two_args(ctx: StepContext, extra: int) -> int:
    return extra


@pytest.mark.parametrize(
    ("fn", "ref"),
    [
        (fetch_ticket, f"{__name__}:fetch_ticket"),
        (lambda ctx: 1, f"{__name__}:<lambda>"),
        (functools.partial(_two_args, extra=3), f"{__name__}:_two_args"),
        (_Callable(), f"{__name__}:_Callable"),
        (_Callable().method, f"{__name__}:_Callable.method"),
    ],
)
def test_ref_names_module_and_qualname(fn: Any, ref: str) -> None:
    assert task("t", fn).ir.ref == ref


def test_retry_policy_backoff() -> None:
    policy = RetryPolicy(max_attempts=5, initial_backoff_s=0.5, max_backoff_s=3.0)
    assert [policy.backoff_for(n) for n in (1, 2, 3, 4, 5)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert RetryPolicy().max_attempts == 1
    assert RetryPolicy().backoff_for(7) == 0.0
    # Past any timer: a year at most (Temporal could not set a longer one).
    assert RetryPolicy(initial_backoff_s=1.0).backoff_for(100_000) == MAX_BACKOFF_S
    assert RetryPolicy(initial_backoff_s=1.0, max_backoff_s=9).backoff_for(100_000) == 9
    for field in ("initial_backoff_s", "max_backoff_s"):
        with pytest.raises(ValueError, match="less than or equal to 31536000"):
            RetryPolicy(**{field: 1e14})
    with pytest.raises(ValueError, match="attempt must be an integer >= 1"):
        policy.backoff_for(0)


@pytest.mark.parametrize(
    "fields",
    [
        {"max_attempts": 0},
        {"initial_backoff_s": -1},
        {"backoff_coefficient": 0.5},
        {"max_backoff_s": -1},
        {"initial_backoff_s": float("nan")},
        {"unknown": 1},
    ],
)
def test_retry_policy_refuses_bad_values(fields: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        RetryPolicy(**fields)


def test_retry_policy_is_attached_to_the_step() -> None:
    policy = RetryPolicy(max_attempts=3)
    assert task("t", fetch_ticket, retry=policy).ir.retry == policy
    assert task("t", fetch_ticket).ir.retry == RetryPolicy()


# --- validation ---
# The definitions below are wrong on purpose; calling the builders through Any
# keeps the type checker from rejecting what the runtime checks must reject.
_task: Any = task
_decision: Any = decision
_parallel: Any = parallel
_subworkflow: Any = subworkflow
_agent: Any = agent
_Workflow: Any = Workflow


def _definition_error(build: Any, match: str) -> None:
    with pytest.raises(WorkflowDefinitionError, match=match):
        build()


@pytest.mark.parametrize("bad_id", ["", "1fetch", "a[b]", "a/b", "a@2", "a.b", "a b", None])
def test_bad_step_ids_are_refused(bad_id: Any) -> None:
    _definition_error(lambda: _task(bad_id, fetch_ticket), "id")


def test_step_id_error_names_path_syntax() -> None:
    _definition_error(lambda: _task("a/b", fetch_ticket), "step path syntax")


@pytest.mark.parametrize(
    ("build", "match"),
    [
        (lambda: _task("t", "fetch_ticket"), "fn must be a function"),
        (lambda: _decision("d", None), "fn must be a function"),
        (lambda: _task("t", fetch_ticket, max_visits=0), "max_visits must be an integer >= 1"),
        (lambda: _task("t", fetch_ticket, max_visits=True), "max_visits"),
        (lambda: _decision("d", choose_next, max_visits="3"), "max_visits"),
        (lambda: _task("t", fetch_ticket, retry={"max_attempts": 3}), "RetryPolicy"),
        (lambda: _task("t", fetch_ticket, run_in_thread=1), "run_in_thread must be True or"),
        (lambda: _decision("d", choose_next, run_in_thread=None), "run_in_thread"),
        (
            lambda: _parallel(
                "outer",
                branches=plan_files,
                step=_parallel("inner", branches=plan_files, step=_task("lint", lint_file)),
            ),
            "nesting is not supported",
        ),
        (
            lambda: _parallel("g", branches=plan_files, step=_decision("d", choose_next)),
            "must be a task, agent or subworkflow",
        ),
        (
            lambda: _parallel("g", branches=plan_files, step=_task("t", lint_file, max_visits=2)),
            "set max_visits on the parallel group",
        ),
        (lambda: _parallel("g", branches=plan_files, step=_task("g", lint_file)), "same id"),
        (lambda: _parallel("g", branches=[1, 2], step=_task("t", lint_file)), "branches"),
        (lambda: _parallel("g", branches=plan_files, step=fetch_ticket), "task()"),
        (
            lambda: _parallel(
                "g", branches=plan_files, step=_task("t", lint_file), max_concurrency=0
            ),
            "max_concurrency",
        ),
        (lambda: _subworkflow("s", build_triage), "must be a Workflow"),
        (lambda: _subworkflow("s", build_triage(), input={"a": 1}), "input"),
        (lambda: _agent("a", model=object(), prompt="p"), "provider"),
        (lambda: _agent("a", model=model(), prompt=""), "prompt is empty"),
        (lambda: _agent("a", model=model(), prompt=3), "prompt"),
        (lambda: _agent("a", model=model(), prompt="p", max_turns=0), "max_turns"),
        (lambda: _agent("a", model=model(), prompt="p", system=b"x"), "system"),
        (
            lambda: _agent("a", model=model(), prompt="p", parameters={"t": object()}),
            "not plain JSON",
        ),
        (
            lambda: _agent("a", model=model(), prompt="p", parameters={"t": float("inf")}),
            "NaN or infinity",
        ),
        (lambda: _agent("a", model=model(), prompt="p", parameters=[1]), "mapping"),
        (
            lambda: _agent("a", model=model(), prompt="p", tools=[search, search]),
            "two tools are named 'search'",
        ),
    ],
)
def test_builders_refuse_invalid_definitions(build: Any, match: str) -> None:
    _definition_error(build, match)


def test_agent_needs_model_id() -> None:
    class NoModelId:
        provider = "openai"

    _definition_error(lambda: _agent("a", model=NoModelId(), prompt="p"), "model_id")


@pytest.mark.parametrize(
    ("build", "match"),
    [
        (lambda: _Workflow("w", steps=[]), "has no steps"),
        (lambda: _Workflow("w", steps=_task("t", fetch_ticket)), "list of steps"),
        (lambda: _Workflow("w", steps=[fetch_ticket]), r"steps\[0\]"),
        (
            lambda: _Workflow("w", steps=[_task("t", fetch_ticket), _task("t", publish)]),
            "'t' is used twice",
        ),
        (
            lambda: _Workflow(
                "w",
                steps=[
                    _task("lint", fetch_ticket),
                    _parallel("g", branches=plan_files, step=_task("lint", lint_file)),
                ],
            ),
            "'lint' is used twice",
        ),
        (lambda: _Workflow("", steps=[_task("t", fetch_ticket)]), "workflow id"),
        (lambda: _Workflow("a/b", steps=[_task("t", fetch_ticket)]), "workflow id"),
        (lambda: _Workflow("w", version="", steps=[_task("t", fetch_ticket)]), "version"),
        (lambda: _Workflow("w", version=1, steps=[_task("t", fetch_ticket)]), "version"),
    ],
)
def test_workflow_refuses_invalid_definitions(build: Any, match: str) -> None:
    _definition_error(build, match)


# --- navigation ---


def test_step_lookup_and_order() -> None:
    wf = build_triage()
    assert wf.index_of("fetch") == 0
    assert wf.index_of("publish") == 4
    assert wf.next_step_id("fetch") == "plan"
    assert wf.next_step_id("review") == "publish"
    assert wf.next_step_id("publish") == END
    with pytest.raises(UnknownStepError, match="no step 'nope'"):
        wf.step("nope")
    with pytest.raises(UnknownStepError, match="no step 'nope'"):
        wf.next_step_id("nope")
    with pytest.raises(UnknownStepError, match="branch step"):
        wf.index_of("lint")
    with pytest.raises(LookupError):
        wf.step("nope")


def test_decision_targets_are_checked() -> None:
    wf = build_triage()
    assert wf.check_decision_target("review", "check") == "check"
    assert wf.check_decision_target("review", END) == END
    with pytest.raises(UnknownStepError, match=r"decision 'review'.*returned 'lint'"):
        wf.check_decision_target("review", "lint")
    with pytest.raises(UnknownStepError, match="returned 3"):
        wf.check_decision_target("review", 3)
    with pytest.raises(WorkflowDefinitionError, match="not a decision"):
        wf.check_decision_target("fetch", END)


def _group() -> ParallelStep:
    return parallel("check", branches=plan_files, step=task("lint", lint_file))


def test_branch_set_from_list_and_mapping() -> None:
    group = _group()
    assert group.branch_set(["a.py", "b.py"]) == {"a.py": "a.py", "b.py": "b.py"}
    assert group.branch_set((3, "x")) == {"3": 3, "x": "x"}
    assert group.branch_set({"z": {"n": 1}, "a": None}) == {"z": {"n": 1}, "a": None}
    assert list(group.branch_set({"z": 1, "a": 2})) == ["z", "a"]  # order kept
    assert group.branch_set([]) == {}


@pytest.mark.parametrize(
    ("result", "match"),
    [
        ("abc", "returned a str"),
        (None, "returned a NoneType"),
        (["a", "a"], "'a' twice"),
        ([1, "1"], "'1' twice"),
        ([True], "strings or ints"),
        ([1.5], "strings or ints"),
        (["a b"], "keys may only contain"),
        (["x/y"], "keys may only contain"),
        ({1: "a"}, "keys must be strings"),
        ({"": 1}, "keys may only contain"),
    ],
)
def test_branch_set_refuses_bad_results(result: Any, match: str) -> None:
    with pytest.raises(InvalidBranchSetError, match=match):
        _group().branch_set(result)


# --- IR hash ---


def test_same_definition_gives_same_hash() -> None:
    assert build_triage().ir_hash == build_triage().ir_hash
    assert build_triage().ir == build_triage().ir
    assert len(build_triage().ir_hash) == 64


def test_run_in_thread_is_not_part_of_the_ir() -> None:
    # It changes where the code runs, never what is recorded: flipping it on a
    # recorded run is not drift.
    on_loop = build_triage(
        fetch=task("fetch", fetch_ticket, run_in_thread=False),
        review=decision("review", choose_next, max_visits=3, run_in_thread=False),
    )
    assert on_loop.ir_hash == build_triage().ir_hash


@pytest.mark.parametrize(
    "overrides",
    [
        {"fetch": task("fetch", fetch_ticket_v2)},
        {"review": decision("review", choose_next, max_visits=4)},
        {"publish": task("publish", publish, retry=RetryPolicy(max_attempts=2))},
        {"publish": task("publish", publish, retry=RetryPolicy(initial_backoff_s=1))},
        {"check": parallel("check", branches=plan_files, step=task("lint", publish))},
        {
            "check": parallel(
                "check", branches=plan_files, step=task("lint", lint_file), max_concurrency=2
            )
        },
        {"plan": agent("plan", model=model(), tools=[search, open_file], prompt=plan_prompt)},
        {"plan": agent("plan", model=model(), tools=[search], prompt=review_prompt)},
        {"plan": agent("plan", model=model(), tools=[search], prompt=plan_prompt, system="s")},
        {"plan": agent("plan", model=model(), tools=[search], prompt=plan_prompt, max_turns=3)},
        {
            "plan": agent(
                "plan",
                model=ScriptedModel([], provider="openai", model_id="gpt-4o"),
                tools=[search],
                prompt=plan_prompt,
            )
        },
        {
            "plan": agent(
                "plan",
                model=model(),
                tools=[search],
                prompt=plan_prompt,
                parameters={"temperature": 0.2},
            )
        },
    ],
)
def test_changing_a_step_changes_the_hash(overrides: dict[str, Any]) -> None:
    assert build_triage(**overrides).ir_hash != build_triage().ir_hash


def test_step_order_changes_the_hash() -> None:
    a = Workflow("w", steps=[task("a", fetch_ticket), task("b", publish)])
    b = Workflow("w", steps=[task("b", publish), task("a", fetch_ticket)])
    assert a.ir_hash != b.ir_hash


def test_workflow_id_and_version_change_the_hash() -> None:
    steps = [task("a", fetch_ticket)]
    base = Workflow("w", version="1", steps=steps).ir_hash
    assert Workflow("w", version="2", steps=steps).ir_hash != base
    assert Workflow("w2", version="1", steps=steps).ir_hash != base


def test_tool_schema_changes_the_hash() -> None:
    def lookup(query: str) -> str:
        """Look up."""
        return query

    def lookup_v2(query: str, limit: int = 3) -> str:
        """Look up."""
        return query

    a = agent("plan", model=model(), prompt="p", tools=[tool(lookup)])
    b = agent("plan", model=model(), prompt="p", tools=[tool(lookup_v2, name="lookup")])
    assert a.ir.agent is not None and b.ir.agent is not None
    assert a.ir.agent.tools[0].name == b.ir.agent.tools[0].name
    assert a.ir.agent.tools[0].schema_hash != b.ir.agent.tools[0].schema_hash


def test_explicit_defaults_hash_like_omitted_ones() -> None:
    a = Workflow("w", steps=[task("a", fetch_ticket)])
    b = Workflow("w", steps=[task("a", fetch_ticket, retry=RetryPolicy(max_attempts=1))])
    assert a.ir_hash == b.ir_hash


def test_ir_is_plain_json_and_round_trips() -> None:
    wf = build_triage()
    data = json.loads(wf.ir.model_dump_json())
    again = WorkflowIR.model_validate(data)
    assert again == wf.ir
    assert again.ir_hash == wf.ir_hash
    assert WorkflowIR.model_validate_json(orjson.dumps(data)).ir_hash == wf.ir_hash


def test_hash_of_fixed_data_is_pinned() -> None:
    # Changing this hash makes every recorded run refuse to resume
    # (WorkflowChangedError): only change the IR's canonical form deliberately.
    ir = WorkflowIR(
        id="w",
        version="1",
        steps=(
            StepIR(id="a", kind="task", ref="m:f"),
            StepIR(id="b", kind="decision", ref="m:g", max_visits=2),
        ),
    )
    assert ir.canonical_json() == (
        b'{"id":"w","steps":[{"id":"a","kind":"task","ref":"m:f"},'
        b'{"id":"b","kind":"decision","max_visits":2,"ref":"m:g"}],"version":"1"}'
    )
    assert ir.ir_hash == "4b43ecaff710848203473dff68590bd51b053731c30c902745b2cc32dc116c9d"


_CHILD = """
import importlib, sys
sys.path[:0] = [sys.argv[1], sys.argv[2]]
module = importlib.import_module(sys.argv[3])
print(module.build_triage().ir_hash)
"""


@pytest.mark.parametrize("seed", ["0", "1", "4242"])
def test_hash_is_stable_across_processes_and_hash_seeds(seed: str) -> None:
    here = Path(__file__).resolve().parent
    root = here.parent
    env = {**os.environ, "PYTHONHASHSEED": seed}
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, str(root), str(here), __name__],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert out.stdout.strip() == build_triage().ir_hash


# --- the IR validates data that did not come from the builders ---


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"id": "p", "kind": "parallel", "ref": "m:f"}, "branch_step is required"),
        (
            {
                "id": "t",
                "kind": "task",
                "ref": "m:f",
                "branch_step": {"id": "x", "kind": "task", "ref": "m:g"},
            },
            "branch_step is required for parallel steps only",
        ),
        (
            {
                "id": "p",
                "kind": "parallel",
                "ref": "m:f",
                "branch_step": {
                    "id": "q",
                    "kind": "parallel",
                    "ref": "m:g",
                    "branch_step": {"id": "x", "kind": "task", "ref": "m:h"},
                },
            },
            "must be a task, agent or subworkflow",
        ),
        ({"id": "t", "kind": "task"}, "ref"),
        ({"id": "a", "kind": "agent"}, "agent is required"),
        ({"id": "s", "kind": "subworkflow", "workflow_id": "c"}, "workflow_version"),
        ({"id": "t", "kind": "task", "ref": "m:f", "max_concurrency": 2}, "max_concurrency"),
        ({"id": "t", "kind": "task", "ref": "m:f", "max_visits": 0}, "max_visits"),
        ({"id": "a/b", "kind": "task", "ref": "m:f"}, "id"),
        ({"id": "t", "kind": "loop", "ref": "m:f"}, "kind"),
        ({"id": "t", "kind": "task", "ref": "m:f", "extra": 1}, "extra"),
    ],
)
def test_step_ir_refuses_inconsistent_data(fields: dict[str, Any], match: str) -> None:
    with pytest.raises(ValidationError, match=match):
        StepIR.model_validate(fields)


def test_workflow_ir_refuses_duplicate_ids_and_no_steps() -> None:
    step = StepIR(id="a", kind="task", ref="m:f")
    with pytest.raises(ValidationError, match="unique"):
        WorkflowIR(id="w", version="1", steps=(step, step))
    with pytest.raises(ValidationError):
        WorkflowIR(id="w", version="1", steps=())


def test_agent_spec_refuses_duplicate_tools_and_non_json() -> None:
    tool_ir = {"name": "t", "schema_hash": "h"}
    with pytest.raises(ValidationError, match="unique"):
        AgentSpecIR.model_validate({"provider": "p", "model_id": "m", "tools": [tool_ir, tool_ir]})
    with pytest.raises(ValidationError, match="plain JSON"):
        AgentSpecIR(provider="p", model_id="m", parameters={"x": {1, 2}})


def test_ir_models_are_frozen() -> None:
    wf = build_triage()
    with pytest.raises(ValidationError):
        wf.ir.steps[0].max_visits = 5  # type: ignore[misc]
    fetch = wf.step("fetch")
    assert isinstance(fetch, TaskStep)
    with pytest.raises(dataclasses.FrozenInstanceError):
        fetch.fn = publish  # type: ignore[misc]


# --- the step context ---


def _ctx(**overrides: Any) -> StepContext:
    fields: dict[str, Any] = {
        "run_id": "run_triage_42",
        "input": {"ticket": 42, "tags": ["a"], "meta": {"owner": "x"}},
        "outputs": {"plan": {"files": ["a.py", "b.py"]}, "check": {"a.py": "ok"}},
        "step_path": "review@2",
    }
    fields.update(overrides)
    return StepContext(**fields)


def test_context_reads_step_identity_from_the_path() -> None:
    ctx = _ctx(step_path="check@2[a.py]/lint", attempt=3, branch_value={"path": "a.py"})
    assert (ctx.step_id, ctx.visit, ctx.group_id, ctx.branch_key, ctx.group_visit) == (
        "lint",
        1,
        "check",
        "a.py",
        2,
    )
    assert ctx.attempt == 3
    assert ctx.branch_value == {"path": "a.py"}
    top = _ctx()
    assert (top.step_id, top.visit, top.branch_key, top.branch_value) == ("review", 2, None, None)


def test_idempotency_key_is_stable_across_attempts_not_visits() -> None:
    first = _ctx(attempt=1)
    retried = dataclasses.replace(first, attempt=2)
    assert first.idempotency_key == retried.idempotency_key == "run_triage_42:review@2"
    assert _ctx(step_path="review@3").idempotency_key != first.idempotency_key
    assert retried.attempt == 2 and retried.visit == 2


def test_context_is_immutable() -> None:
    ctx = _ctx()
    with pytest.raises(dataclasses.FrozenInstanceError):
        ctx.attempt = 2  # type: ignore[misc]
    with pytest.raises(TypeError, match="read-only"):
        ctx.input["ticket"] = 43  # type: ignore[index]
    with pytest.raises(TypeError, match="read-only"):
        ctx.input["tags"].append("b")
    with pytest.raises(TypeError, match="read-only"):
        ctx.input["meta"].update(owner="y")
    with pytest.raises(TypeError, match="read-only"):
        ctx.outputs["plan"]["files"][0] = "c.py"
    with pytest.raises(TypeError, match="read-only"):
        del ctx.outputs["check"]  # type: ignore[attr-defined]
    assert ctx.input["tags"] == ["a"]
    assert ctx.outputs["plan"]["files"] == ["a.py", "b.py"]


def test_context_copies_the_data_it_is_given() -> None:
    run_input: dict[str, Any] = {"tags": ["a"]}
    ctx = _ctx(input=run_input)
    run_input["tags"].append("b")
    run_input["new"] = 1
    assert dict(ctx.input) == {"tags": ["a"]}


def test_frozen_values_still_serialise_and_compare() -> None:
    ctx = _ctx()
    assert orjson.loads(orjson.dumps(ctx.input)) == {
        "ticket": 42,
        "tags": ["a"],
        "meta": {"owner": "x"},
    }
    assert json.loads(json.dumps(ctx.outputs)) == ctx.outputs
    assert isinstance(ctx.input, dict) and isinstance(ctx.input["tags"], list)
    clone = copy.deepcopy(ctx.input)
    assert clone == ctx.input and isinstance(clone, FrozenDict)
    assert pickle.loads(pickle.dumps(ctx.outputs)) == ctx.outputs
    mutable = dict(ctx.input)
    mutable["ticket"] = 1  # a copy is an ordinary dict
    assert ctx.input["ticket"] == 42


def test_frozen_mappings_share_their_keys() -> None:
    # The outputs of a long run repeat the same keys: each is kept once, not once per output.
    first, second = (freeze(orjson.loads(b'{"payload_key": %d}' % i)) for i in range(2))
    (one,), (other,) = first, second
    assert one == other and one is other


def test_freeze_is_idempotent_and_deep() -> None:
    frozen = freeze({"a": [1, {"b": {2, 3}}], "t": (1, [2])})
    assert isinstance(frozen, FrozenDict)
    assert isinstance(frozen["a"], FrozenList)
    assert isinstance(frozen["a"][1]["b"], frozenset)
    assert isinstance(frozen["t"][1], FrozenList)
    assert freeze(frozen) is frozen
    assert freeze("s") == "s" and freeze(None) is None


@pytest.mark.parametrize(
    ("overrides", "error", "match"),
    [
        ({"run_id": "../etc"}, ValueError, "run id"),
        ({"step_path": "review@1"}, InvalidStepPathError, "canonical"),
        ({"attempt": 0}, ValueError, "attempt"),
        ({"attempt": True}, ValueError, "attempt"),
        ({"branch_value": "a.py"}, ValueError, "not inside a parallel branch"),
        ({"input": [1]}, TypeError, "mapping"),
        ({"outputs": None}, TypeError, "mapping"),
    ],
)
def test_context_refuses_bad_fields(overrides: dict[str, Any], error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        _ctx(**overrides)

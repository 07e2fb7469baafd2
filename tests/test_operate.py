"""Cancel, budgets and diff in one process: what is recorded, what is refused, what is counted.

The kill tests, with real processes, are in ``test_operate_kill.py``.
"""

# No `from __future__ import annotations`: the test tool's hints must stay real objects.
import asyncio
from decimal import Decimal
from typing import Any
from uuid import UUID

import pytest
from rich.console import Console
from typer.testing import CliRunner

from little_es import (
    Budget,
    BudgetExceededError,
    RunCancelledError,
    RunNotFoundError,
    RunStateError,
    RunStoppedError,
    cancel_run,
    run_tree_totals,
)
from little_es.cli import app
from little_es.diff import diff_runs, json_diff
from little_es.engine.local import run_workflow
from little_es.errors import ModelError, RuntimeIntegrityError, StepExecutionError
from little_es.events import BudgetExceeded, RunFailed, StepFailed, ToolCallFailed
from little_es.harness.model import ScriptedModel, ScriptedReply
from little_es.harness.tools import ToolContext, tool
from little_es.orchestrator import run_tree, start_workflow_tool
from little_es.pricing import register_model_price, unregister_model_price
from little_es.render import render_diff, render_report
from little_es.replay import replay_run
from little_es.values import ModelRequest, ModelResponse, ToolCall, Usage
from little_es.workflow.authoring import RetryPolicy, Workflow, agent, parallel, subworkflow, task
from little_es.workflow.context import StepContext
from little_es.world import World

pytestmark = pytest.mark.backends("memory", "sqlite")

CALL_USAGE = Usage(input_tokens=100, output_tokens=10)


def _looping_model(turns: int, *, model_id: str = "scripted-1") -> ScriptedModel:
    """Asks for ``look`` on turns 1..turns-1 and answers on turn ``turns``."""

    def respond(request: ModelRequest) -> ScriptedReply:
        turn = 1 + sum(1 for m in request.messages if m.role == "assistant")
        if turn < turns:
            call = ToolCall(id=f"c{turn}", name="look", arguments={"q": f"q{turn}"})
            return ScriptedReply(tool_calls=(call,), usage=CALL_USAGE)
        return ScriptedReply(content=f"answer after {turn} calls", usage=CALL_USAGE)

    return ScriptedModel(respond=respond, model_id=model_id)


looked: list[str] = []


@tool
def look(q: str, ctx: ToolContext) -> str:
    """Look something up."""
    looked.append(q)
    return q.upper()


def _agent_wf(model: ScriptedModel, budget: Budget | None = None) -> Workflow:
    return Workflow(
        "plan-flow",
        steps=[
            task("fetch", lambda ctx: {"topic": ctx.input.get("topic", "x")}),
            agent("plan", model=model, prompt="plan", tools=[look], budget=budget),
            task("finish", lambda ctx: {"plan": ctx.outputs["plan"]}),
        ],
    )


def _run(world: World, wf: Workflow, run_id: str, input: Any = None, **kw: Any) -> Any:
    return asyncio.run(run_workflow(world, wf, input, run_id=run_id, **kw))


# ------------------------------------------------------------------ cancel


def test_a_cancelled_run_stops_before_its_next_step_and_resumes_only_when_asked(
    world: World,
) -> None:
    ran: list[str] = []

    def cancel_me(ctx: StepContext) -> str:
        ran.append(ctx.step_path)
        # Another writer than the driver, holding no lease: the driver's next append
        # loses the version check and it decides again on the stream as stored.
        assert cancel_run(world, ctx.run_id, reason="stop", requested_by="ops") is not None
        return "kept"

    wf = Workflow(
        "cancel-flow",
        steps=[
            task("a", lambda ctx: ran.append("a")),
            task("b", cancel_me),
            task("c", lambda ctx: ran.append("c")),
        ],
    )
    with pytest.raises(RunCancelledError, match="'run_c' was cancelled \\(stop\\)") as stopped:
        _run(world, wf, "run_c", {})
    assert isinstance(stopped.value, RunStoppedError)
    assert not isinstance(stopped.value, StepExecutionError | RuntimeIntegrityError)
    state = replay_run(world, "run_c").state
    assert ran == ["a", "b"]
    assert state.status == "cancelled" and state.stop_reason == "stop"
    assert state.steps["b"].status == "completed" and "c" not in state.steps
    assert not any(isinstance(e, StepFailed | RunFailed) for e in world.read_run_log("run_c"))
    assert cancel_run(world, "run_c") is None  # cancelled already: nothing appended
    with pytest.raises(RunCancelledError, match="not resumed by accident"):
        _run(world, wf, "run_c")
    result = _run(world, wf, "run_c", resume_cancelled=True)
    assert result.state.status == "completed" and ran == ["a", "b", "c"]


@pytest.mark.parametrize("after", ["task", "parallel"])
def test_a_sub_run_stops_with_its_cancelled_parent_before_its_next_step(
    world: World, after: str
) -> None:
    ran: list[str] = []

    def cancel_the_parent(ctx: StepContext) -> str:
        ran.append("child a")
        assert cancel_run(world, "run_cp", reason="stop") is not None
        return "kept"

    def next_one(ctx: StepContext) -> str:
        ran.append("child next")
        return "next"

    # A task's start and a parallel group's own start are both step boundaries.
    nxt = (
        task("next", next_one)
        if after == "task"
        else parallel("next", branches=lambda ctx: ["x"], step=task("each", next_one))
    )
    child = Workflow("child-flow", steps=[task("a", cancel_the_parent), nxt])
    parent = Workflow(
        "parent-flow",
        steps=[subworkflow("sub", child), task("after", lambda ctx: ran.append("after"))],
    )
    with pytest.raises(RunCancelledError, match="'run_cp' was cancelled \\(stop\\)"):
        _run(world, parent, "run_cp", {})
    assert ran == ["child a"]
    state = replay_run(world, "run_cp").state
    (sub_id,) = state.sub_run_ids
    sub = replay_run(world, sub_id).state
    # The child keeps the step it was in, starts nothing more and records no stop of
    # its own: it goes on when its parent does.
    assert state.status == "cancelled" and state.steps["sub"].status == "running"
    assert sub.status == "running" and list(sub.steps) == ["a"]
    assert sub.steps["a"].status == "completed"
    for run_id in ("run_cp", sub_id):
        assert not any(isinstance(e, StepFailed | RunFailed) for e in world.read_run_log(run_id))
    result = _run(world, parent, "run_cp", resume_cancelled=True)
    assert result.state.status == "completed" and ran == ["child a", "child next", "after"]


def test_cancel_refuses_a_completed_run_and_an_unknown_one(world: World) -> None:
    wf = Workflow("done-flow", steps=[task("a", lambda ctx: 1)])
    _run(world, wf, "run_done", {})
    with pytest.raises(RunStateError, match="completed: there is nothing to cancel"):
        cancel_run(world, "run_done")
    with pytest.raises(RunNotFoundError):
        cancel_run(world, "run_never")


def test_a_cancel_stops_an_agent_before_its_next_model_call_and_tool_call(world: World) -> None:
    looked.clear()
    model = _looping_model(4)

    @tool
    def stop_here(ctx: ToolContext) -> str:
        """Cancel the run, from inside a tool (as another process would)."""
        cancel_run(world, ctx.run_id, reason="from a tool")
        return "cancelled"

    def respond(request: ModelRequest) -> ScriptedReply:
        turn = 1 + sum(1 for m in request.messages if m.role == "assistant")
        if turn == 1:
            return ScriptedReply(
                tool_calls=(ToolCall(id="s", name="stop_here", arguments={}),), usage=CALL_USAGE
            )
        return model._respond(request)  # type: ignore[misc,return-value]

    scripted = ScriptedModel(respond=respond)
    wf = Workflow(
        "agent-cancel",
        steps=[agent("plan", model=scripted, prompt="p", tools=[look, stop_here])],
    )
    with pytest.raises(RunCancelledError):
        _run(world, wf, "run_ac", {})
    assert scripted.calls == 1  # the tool's turn-2 model call was not made
    log = world.read_run_log("run_ac")
    assert not any(isinstance(e, ToolCallFailed | StepFailed) for e in log)
    resumed = _run(world, wf, "run_ac", resume_cancelled=True)
    assert resumed.state.status == "completed"
    assert scripted.calls == 4  # turns 2, 3 and 4, each once


def test_the_check_before_each_call_is_read_by_the_commit_just_before_it(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No query of its own before a call: the commit of the call's write-ahead record read
    the run's stream in its transaction (StreamWatch), and nothing ran in between."""
    looked.clear()
    asked: list[int] = []
    real = World.has_events_after

    def counted(self: World, stream_id: UUID, version: int) -> bool:
        asked.append(version)
        return real(self, stream_id, version)

    monkeypatch.setattr(World, "has_events_after", counted)
    model = _looping_model(4)
    done = _run(world, _agent_wf(model), "run_watched", {})
    assert done.state.status == "completed" and model.calls == 4
    assert asked == []  # 4 model calls and 3 batches of tool calls, each checked


# ------------------------------------------------------------------ budgets


def test_a_token_budget_counts_unpriced_calls(world: World) -> None:
    looked.clear()
    model = _looping_model(6, model_id="unpriced-model")
    with pytest.raises(BudgetExceededError, match="330 tokens \\(input \\+ output\\) of a budget"):
        _run(world, _agent_wf(model), "run_tok", {}, budget=Budget(tokens=250))
    assert model.calls == 3
    state = replay_run(world, "run_tok").state
    assert state.status == "budget_exceeded"
    assert state.usage.unpriced_calls == 3 and state.usage.cost_usd is None
    done = _run(world, _agent_wf(model), "run_tok", budget=Budget(tokens=10_000))
    assert done.state.status == "completed" and model.calls == 6
    assert looked == [f"q{t}" for t in range(1, 6)]


def test_a_dollar_budget_says_how_many_calls_were_unpriced(world: World) -> None:
    register_model_price("scripted", "priced-1", input_per_mtok=1000, output_per_mtok=1000)
    try:

        def respond(request: ModelRequest) -> Any:
            turn = 1 + sum(1 for m in request.messages if m.role == "assistant")
            reply = _looping_model(5)._respond(request)  # type: ignore[misc]
            # Turn 1 by a model without a price, the others by one with a price.
            from little_es.values import ModelResponse

            return ModelResponse(
                content=reply.content,
                tool_calls=reply.tool_calls,
                usage=reply.usage,
                provider="scripted",
                model="free-1" if turn == 1 else "priced-1",
            )

        model = ScriptedModel(respond=respond)
        with pytest.raises(BudgetExceededError) as stopped:
            _run(world, _agent_wf(model), "run_usd", {}, budget=Budget(usd=Decimal("0.2")))
        # 110 tokens at $1000 per million: $0.11 a priced call; the second priced one passes $0.2.
        assert model.calls == 3
        assert stopped.value.unpriced_calls == 1
        assert "$0.22 of a budget of $0.2 (1 unpriced call not counted in dollars" in str(
            stopped.value
        )
        recorded = [e for e in world.read_run_log("run_usd") if isinstance(e, BudgetExceeded)]
        assert [e.unpriced_calls for e in recorded] == [1]
    finally:
        unregister_model_price("scripted", "priced-1")


def test_an_agent_steps_own_budget_and_a_resume_that_raises_it(world: World) -> None:
    model = _looping_model(5)
    wf = _agent_wf(model, budget=Budget(model_calls=2))
    with pytest.raises(BudgetExceededError, match="agent step 'plan' has spent 2 model calls"):
        _run(world, wf, "run_step_budget", {})
    # The step budget is not part of the IR: a definition with a larger one resumes the run.
    larger = _agent_wf(model, budget=Budget(model_calls=9))
    assert larger.ir_hash == wf.ir_hash
    done = _run(world, larger, "run_step_budget")
    assert done.state.status == "completed" and model.calls == 5


class _SlowModel:
    """Answers after a moment, as a real model does: calls of parallel branches overlap."""

    provider = "scripted"
    model_id = "slow-1"

    def __init__(self) -> None:
        self.calls = 0

    async def complete(self, request: ModelRequest) -> Any:
        self.calls += 1
        await asyncio.sleep(0.05)
        return ModelResponse(content="ok", usage=CALL_USAGE, provider="scripted", model="slow-1")


@pytest.mark.parametrize("limit", [1, 3])
def test_calls_in_flight_count_towards_the_budget_of_parallel_branches(
    world: World, limit: int
) -> None:
    """Four branches ask at the same moment: a call in flight counts from when it starts,
    so no more calls start than the budget has room for."""
    model = _SlowModel()
    group = parallel(
        "fan",
        branches=lambda ctx: ["a", "b", "c", "d"],
        step=agent("ask", model=model, prompt=lambda ctx: f"branch {ctx.step_path}"),
    )
    wf = Workflow("budget-fan", steps=[group])
    with pytest.raises(BudgetExceededError, match=f"spent {limit} model calls of a budget of"):
        _run(world, wf, "run_fan_budget", {}, budget=Budget(model_calls=limit))
    assert model.calls == limit
    state = replay_run(world, "run_fan_budget").state
    assert state.status == "budget_exceeded" and state.usage.calls == limit
    # What was in flight was recorded: a larger budget runs only the branches left.
    done = _run(world, wf, "run_fan_budget", budget=Budget(model_calls=4))
    assert done.state.status == "completed" and model.calls == 4


def test_a_model_call_that_raised_is_in_flight_no_more(world: World) -> None:
    """The first call raises (nothing is spent); the retry's call fits a budget of one."""

    class FailsOnce(_SlowModel):
        async def complete(self, request: ModelRequest) -> Any:
            if self.calls == 0:
                self.calls += 1
                raise ModelError("the provider is busy", retryable=True)
            return await super().complete(request)

    model = FailsOnce()
    step = agent("ask", model=model, prompt="ask", retry=RetryPolicy(max_attempts=2))
    done = _run(
        world,
        Workflow("budget-retry", steps=[step]),
        "run_retry_budget",
        {},
        budget=Budget(model_calls=1),
    )
    assert done.state.status == "completed" and model.calls == 2
    assert done.state.usage.calls == 1


def test_the_run_budget_covers_its_sub_runs(world: World) -> None:
    inner_model = _looping_model(3, model_id="inner-1")
    inner = Workflow("inner", steps=[agent("work", model=inner_model, prompt="w", tools=[look])])
    outer_model = _looping_model(2, model_id="outer-1")
    outer = Workflow(
        "outer",
        steps=[
            agent("think", model=outer_model, prompt="t", tools=[look]),
            subworkflow("sub", inner),
        ],
    )
    # 2 calls in the run itself, then 3 in the sub-run: a budget of 3 stops in the sub-run.
    with pytest.raises(BudgetExceededError, match="run 'run_tree' with its sub-runs has spent 3"):
        _run(world, outer, "run_tree", {}, budget=Budget(model_calls=3))
    state = replay_run(world, "run_tree").state
    (sub_id,) = state.sub_run_ids
    assert state.status == "budget_exceeded" and state.stopped_step_path == "sub"
    assert replay_run(world, sub_id).state.status == "budget_exceeded"
    totals = run_tree_totals(world, "run_tree")
    assert totals.calls == 3 and totals == run_tree(world, "run_tree").total
    done = _run(world, outer, "run_tree", budget=Budget(model_calls=5))
    assert done.state.status == "completed"
    assert outer_model.calls == 2 and inner_model.calls == 3
    assert run_tree_totals(world, "run_tree").calls == 5


def test_an_orchestrators_budget_stops_its_sub_runs_and_records_no_tool_failure(
    world: World,
) -> None:
    inner_model = _looping_model(2, model_id="inner-1")
    inner = Workflow("inner", steps=[agent("work", model=inner_model, prompt="w", tools=[look])])

    def respond(request: ModelRequest) -> ScriptedReply:
        turn = 1 + sum(1 for m in request.messages if m.role == "assistant")
        if turn == 1:
            calls = tuple(
                ToolCall(
                    id=f"s{i}",
                    name="start_workflow",
                    arguments={"workflow_id": "inner", "input": {"i": i}},
                )
                for i in range(3)
            )
            return ScriptedReply(tool_calls=calls, usage=CALL_USAGE)
        return ScriptedReply(content="done", usage=CALL_USAGE)

    orchestrator = ScriptedModel(respond=respond)
    wf = Workflow(
        "orch",
        steps=[
            agent(
                "fan",
                model=orchestrator,
                prompt="fan out",
                tools=[start_workflow_tool([inner], max_concurrency=1)],
            )
        ],
    )
    with pytest.raises(BudgetExceededError):
        _run(world, wf, "run_orch_budget", {}, budget=Budget(model_calls=4))
    log = world.read_run_log("run_orch_budget")
    assert not any(isinstance(e, ToolCallFailed | StepFailed) for e in log)
    assert run_tree_totals(world, "run_orch_budget").calls == 4
    done = _run(world, wf, "run_orch_budget", budget=Budget(model_calls=100))
    assert done.state.status == "completed"
    assert orchestrator.calls == 2 and inner_model.calls == 6
    assert run_tree_totals(world, "run_orch_budget").calls == 8


# ------------------------------------------------------------------ diff


def test_json_diff_names_each_differing_path() -> None:
    changes = json_diff(
        {"a": 1, "files": ["x", "y"], "deep": {"k": [1, {"z": True}]}, "gone": 0},
        {"a": 2, "files": ["x"], "deep": {"k": [1, {"z": False}]}, "new": None},
    )
    assert [(c.path, c.kind) for c in changes] == [
        ("$.a", "changed"),
        ("$.files[1]", "removed"),
        ("$.deep.k[1].z", "changed"),
        ("$.gone", "removed"),
        ("$.new", "added"),
    ]
    assert json_diff({"a": [1]}, {"a": [1]}) == []
    assert json_diff(1, 1.0)[0].kind == "changed"  # an int is not a float in JSON output


def test_diff_of_two_runs_of_one_workflow(world: World) -> None:
    looked.clear()
    _run(world, _agent_wf(_looping_model(3)), "run_a", {"topic": "cats"})
    _run(world, _agent_wf(_looping_model(4)), "run_b", {"topic": "dogs"})
    diff = diff_runs(world, "run_a", "run_b")
    by_path = {s.step_path: s for s in diff.steps}
    assert list(by_path) == ["fetch", "plan", "finish"]
    assert [(c.path, c.a, c.b) for c in by_path["fetch"].output_changes] == [
        ("$.topic", "cats", "dogs")
    ]
    plan = by_path["plan"]
    assert plan.status_a == plan.status_b == "completed"
    assert (plan.usage_a.calls, plan.usage_b.calls) == (3, 4)
    assert (plan.usage_a.input_tokens, plan.usage_b.input_tokens) == (300, 400)
    assert [c.name for c in plan.tool_calls_a] == ["look", "look"]
    assert [c.args["q"] for c in plan.tool_calls_b] == ["q1", "q2", "q3"]
    assert all(c.ok for c in plan.tool_calls_b)
    assert not diff.same and not plan.same
    assert diff_runs(world, "run_a", "run_a").same
    with pytest.raises(TypeError, match="diff_runs needs a World"):
        diff_runs("memory://", "run_a", "run_b")  # type: ignore[arg-type]
    out = Console(width=160, record=True)
    render_diff(diff, out)
    text = out.export_text()
    assert "3 of 3 steps differ" in text and '$.topic: "cats" → "dogs"' in text


def test_a_step_only_one_run_has_differs_by_its_status_not_as_a_null_output(
    world: World,
) -> None:
    longer = Workflow("longer", steps=[task("a", lambda ctx: 1), task("b", lambda ctx: "x")])
    shorter = Workflow("shorter", steps=[task("a", lambda ctx: 1)])
    _run(world, longer, "run_long", {})
    _run(world, shorter, "run_short", {})
    step = {s.step_path: s for s in diff_runs(world, "run_long", "run_short").steps}["b"]
    assert (step.status_a, step.status_b, step.output_changes) == ("completed", None, ())
    assert not step.same
    out = Console(width=160, record=True)
    render_diff(diff_runs(world, "run_long", "run_short"), out)
    assert "null" not in out.export_text()


def test_little_diff_and_little_cancel_on_the_command_line(
    world: World, world_spec: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    _run(world, _agent_wf(_looping_model(2)), "run_x", {"topic": "a"})
    _run(world, _agent_wf(_looping_model(2)), "run_y", {"topic": "a"})
    if not world_spec.persistent:
        pytest.skip("the command opens the world afresh")
    runner = CliRunner()
    same = runner.invoke(app, ["diff", "run_x", "run_y", "--world", world_spec.url])
    assert same.exit_code == 0, same.output
    assert "same: every step has the same status, output, model calls" in same.output
    as_json = runner.invoke(app, ["diff", "run_x", "run_y", "--json", "--world", world_spec.url])
    assert '"run_a": "run_x"' in as_json.output
    done = runner.invoke(app, ["cancel", "run_x", "--world", world_spec.url])
    assert done.exit_code == 1 and "nothing to cancel" in done.output


def test_report_shows_a_budget_stop(world: World) -> None:
    with pytest.raises(BudgetExceededError):
        _run(world, _agent_wf(_looping_model(3)), "run_rep", {}, budget=Budget(model_calls=1))
    out = Console(width=160, record=True)
    render_report(world, "run_rep", out)
    text = out.export_text()
    assert "budget_exceeded" in text and "budget (with sub-runs): 1 model calls" in text
    assert "in step plan: run 'run_rep' with its sub-runs has spent 1 model calls" in text


def test_a_budget_must_be_a_budget(world: World) -> None:
    wf = Workflow("b-flow", steps=[task("a", lambda ctx: 1)])
    with pytest.raises(TypeError, match="budget must be a Budget"):
        _run(world, wf, "run_bad_budget", {}, budget={"usd": 1})
    with pytest.raises(ValueError):
        Budget(usd=-1)
    with pytest.raises(Exception, match="budget must be a Budget"):
        agent("plan", model=_looping_model(1), prompt="p", budget=3)  # type: ignore[arg-type]


def test_a_budget_the_log_cannot_hold_is_refused_before_the_run_starts(world: World) -> None:
    # The log's integers are 64-bit: a larger limit was taken, RunStarted committed, and
    # only its BudgetSet refused, leaving a run started without the budget it was given.
    with pytest.raises(ValueError, match="less than or equal to 18446744073709551615"):
        Budget(tokens=2**64)
    with pytest.raises(ValueError, match="less than or equal to 18446744073709551615"):
        Budget(model_calls=10**30)
    wf = Workflow("b-flow", steps=[task("a", lambda ctx: 1)])
    _run(world, wf, "run_big_budget", {}, budget=Budget(tokens=2**64 - 1))
    assert replay_run(world, "run_big_budget").state.budget == Budget(tokens=2**64 - 1)
    result = CliRunner().invoke(
        app, ["resume", "run_big_budget", "--workflow", "x:y", "--budget-calls", str(2**64)]
    )
    assert result.exit_code != 0
    assert "--budget-calls 18446744073709551616" in result.output, result.output
    assert "--budget-usd" not in result.output.split(":")[0]


class _Writer:
    """Where a guard reads its run's position and makes its check: the real executor's
    calls, answered here so the guard's own bookkeeping can be watched."""

    def __init__(self) -> None:
        self.stream = UUID(int=7)
        self.checks: list[dict[UUID, int]] = []

    def watched(self) -> tuple[UUID, int]:
        return self.stream, 3

    def check_stopped(self, unchanged: Any) -> None:
        self.checks.append(dict(unchanged))


def _guard() -> tuple[Any, _Writer]:
    from types import SimpleNamespace

    from little_es.engine.executor import StepGuard

    writer = _Writer()
    executor = SimpleNamespace(
        writer=writer,
        check_stopped=writer.check_stopped,
        check_parents_stopped=lambda unchanged: None,  # a run with no parent
    )
    begun = SimpleNamespace(step=None, step_path="plan")
    return StepGuard(executor, begun, None), writer  # type: ignore[arg-type]


def test_a_watch_speaks_once_and_only_for_a_check_in_its_own_task() -> None:
    async def scenario() -> list[dict[UUID, int]]:
        guard, writer = _guard()
        answered = guard.watch()
        answered.found([])  # the commit found nothing past version 3
        guard.before_tool_calls("plan")  # the check after that commit: no query
        guard.before_tool_calls("plan")  # a later check: the watch is spent
        other = guard.watch()
        other.found([])

        async def elsewhere() -> None:
            guard.before_tool_calls("plan")  # another task's check: it makes its query

        await asyncio.create_task(elsewhere())
        guard.before_tool_calls("plan")  # spent by the other task's check
        changed = guard.watch()
        changed.found([writer.stream])  # another writer appended: the check must look
        guard.before_tool_calls("plan")
        return writer.checks

    checks = asyncio.run(scenario())
    stream = UUID(int=7)
    assert checks == [{stream: 3}, {}, {}, {}, {}]

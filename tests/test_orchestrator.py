"""Orchestrators in one process: ``start_workflow`` sub-runs, their ids, bounds, replay, report.

Every test runs a real orchestrator (an agent step with a scripted model and the
``start_workflow`` tool) through ``run_workflow`` on the ``world`` fixture (memory,
SQLite and PostgreSQL) and checks the logs it wrote. The crash scenarios, with
real process kills, are in ``test_orchestrator_crash.py``.
"""

# No `from __future__ import annotations`: the test tool's hints must stay real objects.
import asyncio
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import orjson
import pytest
from pydantic import BaseModel
from rich.console import Console

from little_es.durability import cancel_run
from little_es.engine.local import run_workflow
from little_es.errors import RunCancelledError, RunWaitingError, ToolError
from little_es.events import (
    RunStarted,
    SubRunReserved,
    ToolCallFailed,
    ToolCallStarted,
    ToolCallSucceeded,
)
from little_es.harness.model import ScriptedModel, ScriptedReply
from little_es.harness.session import run_agent_session
from little_es.harness.tools import Tool, ToolContext
from little_es.ids import run_stream_id, session_stream_id
from little_es.orchestrator import (
    RunTree,
    list_sub_runs,
    start_workflow_tool,
    sub_run_id_for_call,
    sum_usage,
)
from little_es.pricing import register_model_price, unregister_model_price
from little_es.render import render_sub_runs, render_tree
from little_es.replay import replay_run
from little_es.values import JSONValue, ModelRequest, ToolCall, Usage
from little_es.workflow.authoring import Workflow, agent, task, wait_for
from little_es.workflow.context import StepContext
from little_es.workflow.ir import RetryPolicy
from little_es.world import World

RUN_ID = "run_orch"
STEP = "fan_out"


def _session_id(run_id: str = RUN_ID) -> str:
    return str(session_stream_id(run_id, STEP, 1))


def _calls(inputs: Sequence[dict[str, Any]], workflow_id: str = "work") -> tuple[ToolCall, ...]:
    return tuple(
        ToolCall(
            id=f"c{i}",
            name="start_workflow",
            arguments={"workflow_id": workflow_id, "input": dict(value)},
        )
        for i, value in enumerate(inputs, start=1)
    )


def _orchestrator_model(
    calls: tuple[ToolCall, ...], *, model_id: str = "orch-1"
) -> tuple[ScriptedModel, list[list[str]]]:
    """Turn 1 makes ``calls``; turn 2 answers. Returns the model and the tool messages
    each turn-2 request showed it."""
    seen: list[list[str]] = []

    def respond(request: ModelRequest) -> ScriptedReply:
        turn = 1 + sum(1 for m in request.messages if m.role == "assistant")
        if turn == 1:
            return ScriptedReply(
                tool_calls=calls, usage=Usage(input_tokens=1000, output_tokens=100)
            )
        seen.append([m.content or "" for m in request.messages if m.role == "tool"])
        return ScriptedReply(content="all done", usage=Usage(input_tokens=2000, output_tokens=10))

    return ScriptedModel(respond=respond, provider="scripted", model_id=model_id), seen


def _orchestrator(tool: Tool, model: ScriptedModel) -> Workflow:
    return Workflow(
        "orchestrate", steps=[agent(STEP, model=model, tools=[tool], prompt="fan out", max_turns=3)]
    )


def _work(fn: Callable[[StepContext], Any]) -> Workflow:
    return Workflow("work", steps=[task("compute", fn)])


def _events(world: World, run_id: str) -> list[Any]:
    return world.read_run_log(run_id)


@pytest.fixture
def prices() -> Iterator[None]:
    """Prices for the scripted models of these tests, removed afterwards."""
    register_model_price("scripted", "orch-1", input_per_mtok=2.0, output_per_mtok=10.0)
    register_model_price("scripted", "worker-1", input_per_mtok=1.0, output_per_mtok=4.0)
    yield
    unregister_model_price("scripted", "orch-1")
    unregister_model_price("scripted", "worker-1")


# ------------------------------------------------------------- reservation


async def test_the_sub_run_id_is_in_the_recorded_args_and_reserved_before_the_sub_run_starts(
    world: World,
) -> None:
    seen_by_sub_run: dict[str, tuple[list[str], dict[str, Any]]] = {}

    def compute(ctx: StepContext) -> int:
        # What the parent's log already holds when the sub-run's first step runs.
        reserved = [
            e.sub_run_id
            for e in world.read_stream(run_stream_id(RUN_ID))
            if isinstance(e, SubRunReserved)
        ]
        args = {
            e.call_id: e.args
            for e in world.read_stream(session_stream_id(RUN_ID, STEP, 1))
            if isinstance(e, ToolCallStarted)
        }
        seen_by_sub_run[ctx.run_id] = (reserved, args)
        return int(ctx.input["n"]) * 2

    calls = _calls([{"n": 1}, {"n": 2}, {"n": 3}])
    model, seen = _orchestrator_model(calls)
    result = await run_workflow(
        world, _orchestrator(start_workflow_tool([_work(compute)]), model), {}, run_id=RUN_ID
    )
    assert result.output == "all done"

    ids = {c.id: sub_run_id_for_call(RUN_ID, _session_id(), c.id) for c in calls}
    assert len(set(ids.values())) == 3
    for call in calls:
        sub_run_id = ids[call.id]
        reserved, args = seen_by_sub_run[sub_run_id]
        assert sub_run_id in reserved
        assert args[call.id] == {**call.arguments, "sub_run_id": sub_run_id}
    parent_log = _events(world, RUN_ID)
    reservations = [e for e in parent_log if isinstance(e, SubRunReserved)]
    assert [(r.sub_run_id, r.call_id, r.step_path, r.workflow_id) for r in reservations] == [
        (ids[c.id], c.id, STEP, "work") for c in calls
    ]
    results = {e.call_id: e.result for e in parent_log if isinstance(e, ToolCallSucceeded)}
    assert results == {
        c.id: {"sub_run_id": ids[c.id], "status": "completed", "output": 2 * (i + 1)}
        for i, c in enumerate(calls)
    }
    # What the model was shown: the small result, not the sub-run's log.
    assert [orjson.loads(m) for m in seen[0]] == [results[c.id] for c in calls]
    for call in calls:
        started = _events(world, ids[call.id])[0]
        assert isinstance(started, RunStarted)
        assert (started.parent_run_id, started.parent_step_path) == (RUN_ID, STEP)
        assert started.input == call.arguments["input"]


async def test_resuming_a_completed_orchestrator_starts_no_sub_run_again(world: World) -> None:
    runs: list[str] = []

    def compute(ctx: StepContext) -> str:
        runs.append(ctx.run_id)
        return "ok"

    model, _ = _orchestrator_model(_calls([{"n": 1}, {"n": 2}]))
    workflow = _orchestrator(start_workflow_tool([_work(compute)]), model)
    await run_workflow(world, workflow, {}, run_id=RUN_ID)
    again = await run_workflow(world, workflow, run_id=RUN_ID)
    assert (again.output, again.steps_executed) == ("all done", 0)
    assert len(runs) == 2
    assert len([e for e in _events(world, RUN_ID) if isinstance(e, SubRunReserved)]) == 2


# ------------------------------------------------------------- concurrency


@pytest.mark.parametrize("bound", [1, 3])
async def test_sub_runs_of_one_turn_run_concurrently_up_to_the_bound(
    world: World, bound: int
) -> None:
    running = {"now": 0, "max": 0}

    async def compute(ctx: StepContext) -> int:
        running["now"] += 1
        running["max"] = max(running["max"], running["now"])
        await asyncio.sleep(0.03)
        running["now"] -= 1
        return 1

    model, _ = _orchestrator_model(_calls([{"n": i} for i in range(7)]))
    tool = start_workflow_tool([_work(compute)], max_concurrency=bound)
    await run_workflow(world, _orchestrator(tool, model), {}, run_id=RUN_ID)
    assert running["max"] == bound


async def test_the_bound_is_per_parent_run(world: World) -> None:
    running = {"now": 0, "max": 0}

    async def compute(ctx: StepContext) -> int:
        running["now"] += 1
        running["max"] = max(running["max"], running["now"])
        await asyncio.sleep(0.03)
        running["now"] -= 1
        return 1

    model, _ = _orchestrator_model(_calls([{"n": i} for i in range(3)]))
    workflow = _orchestrator(start_workflow_tool([_work(compute)], max_concurrency=1), model)
    # Two orchestrators sharing one tool object: each has its own permit.
    await asyncio.gather(
        run_workflow(world, workflow, {}, run_id="run_orch_a"),
        run_workflow(world, workflow, {}, run_id="run_orch_b"),
    )
    assert running["max"] == 2


# ------------------------------------------------------------- failures


async def test_a_failed_sub_run_fails_the_call_and_the_model_sees_why(world: World) -> None:
    def compute(ctx: StepContext) -> int:
        if ctx.input["n"] == 2:
            raise ValueError("n=2 is not allowed")
        return int(ctx.input["n"])

    work = Workflow("work", steps=[task("compute", compute, retry=RetryPolicy(max_attempts=1))])
    model, seen = _orchestrator_model(_calls([{"n": 1}, {"n": 2}]))
    result = await run_workflow(
        world, _orchestrator(start_workflow_tool([work]), model), {}, run_id=RUN_ID
    )
    assert result.output == "all done"  # the orchestrator decided to carry on
    failed_id = sub_run_id_for_call(RUN_ID, _session_id(), "c2")
    failures = [e for e in _events(world, RUN_ID) if isinstance(e, ToolCallFailed)]
    assert [(f.call_id, f.error.type) for f in failures] == [("c2", "SubRunFailedError")]
    assert (
        failed_id in failures[0].error.message and "n=2 is not allowed" in failures[0].error.message
    )
    assert seen[0][1].startswith("error: SubRunFailedError: sub-run")
    assert replay_run(world, failed_id).state.status == "failed"


async def test_an_unknown_workflow_fails_the_call_without_reserving_anything(
    world: World,
) -> None:
    model, seen = _orchestrator_model(_calls([{"n": 1}], workflow_id="nope"))
    await run_workflow(
        world, _orchestrator(start_workflow_tool([_work(lambda ctx: 1)]), model), {}, run_id=RUN_ID
    )
    assert "no workflow 'nope'; the workflows are: work" in seen[0][0]
    assert not [e for e in _events(world, RUN_ID) if isinstance(e, SubRunReserved)]


async def test_the_model_cannot_choose_the_sub_run_id(world: World) -> None:
    call = ToolCall(
        id="c1",
        name="start_workflow",
        arguments={"workflow_id": "work", "input": {}, "sub_run_id": "run_mine"},
    )
    model, seen = _orchestrator_model((call,))
    await run_workflow(
        world, _orchestrator(start_workflow_tool([_work(lambda ctx: 1)]), model), {}, run_id=RUN_ID
    )
    log = _events(world, RUN_ID)
    started = [e for e in log if isinstance(e, ToolCallStarted)]
    assert [e.args for e in started] == [call.arguments]  # recorded as the model sent them
    assert "chooses 'sub_run_id' itself" in seen[0][0]
    assert not [e for e in log if isinstance(e, SubRunReserved)]
    assert not world.run_exists("run_mine")


async def test_outside_the_runtime_the_call_fails_and_says_where_to_use_the_tool(
    world: World,
) -> None:
    model, seen = _orchestrator_model(_calls([{"n": 1}]))
    await run_agent_session(
        world,
        run_id=RUN_ID,
        step_path=STEP,
        attempt=1,
        model=model,
        tools=[start_workflow_tool([_work(lambda ctx: 1)])],
        prompt="fan out",
    )
    assert seen[0][0].startswith("error: OrchestratorContextError:")
    assert "put the tool on an agent() step" in seen[0][0]


def test_start_workflow_tool_refuses_unusable_arguments() -> None:
    work = _work(lambda ctx: 1)
    for bad, kwargs in [
        ([], {}),
        ("work", {}),
        ([object()], {}),
        ([work, _work(lambda ctx: 2)], {}),
        ([work], {"max_concurrency": 0}),
        ([work], {"max_concurrency": True}),
    ]:
        with pytest.raises(ToolError):
            start_workflow_tool(bad, **kwargs)  # type: ignore[arg-type]
    tool = start_workflow_tool([work])
    assert tool.name == "start_workflow"
    assert set(tool.spec.parameters["properties"]) == {"workflow_id", "input"}


# ------------------------------------------------------------- the session hook


class _Stamping(Tool):
    """A tool whose prepare_args adds a stamp; counts how often the hook runs."""

    def __init__(self, change_model_args: bool = False) -> None:
        async def stamp(key: str, stamp: str = "") -> str:
            """Echo the key and its stamp."""
            return f"{key}:{stamp}"

        super().__init__(stamp, name="stamp")
        self.prepared = 0
        self.change_model_args = change_model_args

    def prepare_args(self, args: dict[str, JSONValue], ctx: ToolContext) -> dict[str, JSONValue]:
        """Add ``stamp`` (or, misbehaving, overwrite ``key``)."""
        self.prepared += 1
        if self.change_model_args:
            return {**args, "key": "changed"}
        return {**args, "stamp": ctx.call_id}


async def test_prepare_args_is_applied_once_before_recording_and_never_on_replay(
    world: World,
) -> None:
    tool = _Stamping()
    model = ScriptedModel(
        [
            ScriptedReply(tool_calls=(ToolCall(id="k1", name="stamp", arguments={"key": "a"}),)),
            ScriptedReply(content="done"),
        ]
    )

    async def session() -> Any:
        return await run_agent_session(
            world, run_id=RUN_ID, step_path=STEP, attempt=1, model=model, tools=[tool], prompt="go"
        )

    first = await session()
    assert tool.prepared == 1
    started = [e for e in _events_of_session(world) if isinstance(e, ToolCallStarted)]
    assert [e.args for e in started] == [{"key": "a", "stamp": "k1"}]
    assert first.conversation[-2].content == "a:k1"
    replayed = await session()  # the recorded args differ from the model's, and that is fine
    assert tool.prepared == 1 and replayed.replayed_tool_calls == 1
    assert replayed.conversation == first.conversation


async def test_prepare_args_that_changes_a_model_argument_fails_the_call(world: World) -> None:
    tool = _Stamping(change_model_args=True)
    model = ScriptedModel(
        [
            ScriptedReply(tool_calls=(ToolCall(id="k1", name="stamp", arguments={"key": "a"}),)),
            ScriptedReply(content="done"),
        ]
    )
    outcome = await run_agent_session(
        world, run_id=RUN_ID, step_path=STEP, attempt=1, model=model, tools=[tool], prompt="go"
    )
    log = _events_of_session(world)
    assert [e.args for e in log if isinstance(e, ToolCallStarted)] == [{"key": "a"}]
    failed = [e for e in log if isinstance(e, ToolCallFailed)]
    assert len(failed) == 1 and "may only add arguments" in failed[0].error.message
    assert outcome.tool_calls_made == 1


def _events_of_session(world: World) -> list[Any]:
    return world.read_stream(session_stream_id(RUN_ID, STEP, 1))


# ------------------------------------------------------------- replay and report


def _priced_work() -> Workflow:
    """A sub-workflow with an agent step, so each sub-run has model usage of its own."""
    model = ScriptedModel(
        [ScriptedReply(content="summary", usage=Usage(input_tokens=300, output_tokens=30))],
        provider="scripted",
        model_id="worker-1",
    )

    def fail_on_three(ctx: StepContext) -> int:
        if ctx.input["n"] == 3:
            raise ValueError("three")
        return int(ctx.input["n"])

    return Workflow(
        "work",
        steps=[
            agent("summarize", model=model, prompt="summarize"),
            task("check", fail_on_three),
        ],
    )


async def test_replay_of_the_parent_reads_none_of_its_sub_runs_events(
    world: World, prices: None
) -> None:
    model, _ = _orchestrator_model(_calls([{"n": 1}, {"n": 2}]))
    await run_workflow(
        world, _orchestrator(start_workflow_tool([_priced_work()]), model), {}, run_id=RUN_ID
    )
    parent = replay_run(world, RUN_ID)
    sub_ids = [sub_run_id_for_call(RUN_ID, _session_id(), c) for c in ("c1", "c2")]
    assert parent.state.sub_run_ids == tuple(sub_ids)
    assert list(parent.state.steps) == [STEP]
    # Only the orchestrator's two model calls are in its totals.
    assert (parent.state.usage.input_tokens, parent.state.usage.calls) == (3000, 2)
    parent_streams = {e.originator_id for e in _events(world, RUN_ID)}
    assert parent.state.event_count == len(_events(world, RUN_ID))
    for sub_id in sub_ids:
        sub = replay_run(world, sub_id)
        assert sub.state.status == "completed" and sub.state.parent_run_id == RUN_ID
        assert (sub.state.usage.input_tokens, sub.state.usage.calls) == (300, 1)
        assert parent_streams.isdisjoint({e.originator_id for e in _events(world, sub_id)})


async def test_report_lists_sub_runs_with_status_and_cost_and_the_tree_adds_them_up(
    world: World, prices: None
) -> None:
    model, _ = _orchestrator_model(_calls([{"n": 1}, {"n": 2}, {"n": 3}]))
    await run_workflow(
        world, _orchestrator(start_workflow_tool([_priced_work()]), model), {}, run_id=RUN_ID
    )
    sub_ids = [sub_run_id_for_call(RUN_ID, _session_id(), f"c{i}") for i in (1, 2, 3)]

    summaries = list_sub_runs(world, RUN_ID)
    assert [(s.sub_run_id, s.call_id, s.status) for s in summaries] == [
        (sub_ids[0], "c1", "completed"),
        (sub_ids[1], "c2", "completed"),
        (sub_ids[2], "c3", "failed"),
    ]
    worker_cost = (300 * 1.0 + 30 * 4.0) / 1e6
    for s in summaries:
        assert s.usage.cost_usd == pytest.approx(worker_cost)
        assert s.usage == replay_run(world, s.sub_run_id).state.usage
    assert [(s.steps_completed, s.steps) for s in summaries] == [(2, 2), (2, 2), (1, 2)]

    console = Console(record=True, width=200)
    render_sub_runs(world, RUN_ID, console)
    table = console.export_text()
    for sub_id in sub_ids:
        assert sub_id in table
    assert table.count("completed") >= 2 and "failed" in table
    assert f"${worker_cost:,.6f}" in table and "3 sub-runs" in table

    console = Console(record=True, width=250)
    tree = render_tree(world, RUN_ID, console)
    assert isinstance(tree, RunTree)
    assert [c.run_id for c in tree.children] == sub_ids and tree.runs == 4
    parent_usage = replay_run(world, RUN_ID).state.usage
    orchestrator_cost = (3000 * 2.0 + 110 * 10.0) / 1e6
    assert parent_usage.cost_usd == pytest.approx(orchestrator_cost)
    assert tree.usage == parent_usage
    assert tree.total.cost_usd == pytest.approx(orchestrator_cost + 3 * worker_cost)
    assert (tree.total.input_tokens, tree.total.calls) == (3000 + 3 * 300, 5)
    text = console.export_text()
    assert "total: 4 runs (3 completed, 1 failed)" in text
    assert f"${orchestrator_cost + 3 * worker_cost:,.6f}" in text


async def test_a_run_without_sub_runs_prints_no_sub_run_table(world: World) -> None:
    await run_workflow(world, _work(lambda ctx: 1), {}, run_id="run_plain")
    console = Console(record=True)
    assert render_sub_runs(world, "run_plain", console) == ()
    assert console.export_text() == ""
    assert render_tree(world, "run_plain", Console(record=True)).runs == 1


def test_sum_usage_keeps_unpriced_apart_from_zero() -> None:
    from little_es.values import UsageTotals

    unpriced = UsageTotals(input_tokens=5, cost_usd=None, unpriced_calls=1, calls=1)
    priced = UsageTotals(input_tokens=7, cost_usd=0.5, calls=1)
    assert sum_usage([unpriced, unpriced]).cost_usd is None
    both = sum_usage([unpriced, priced])
    assert (both.cost_usd, both.unpriced_calls, both.calls, both.input_tokens) == (0.5, 1, 2, 12)
    assert sum_usage([]).cost_usd == 0.0


async def test_the_run_result_state_is_replays_for_an_orchestrator_and_its_sub_runs(
    world: World, prices: None
) -> None:
    model, _ = _orchestrator_model(_calls([{"n": 1}, {"n": 2}]))
    workflow = _orchestrator(start_workflow_tool([_priced_work()]), model)
    result = await run_workflow(world, workflow, {}, run_id=RUN_ID)
    assert result.state == replay_run(world, RUN_ID).state
    assert result.state.usage.input_tokens == 3000 and result.state.usage.cost_usd
    for sub_run_id in result.state.sub_run_ids:
        sub = await run_workflow(world, _priced_work(), run_id=sub_run_id)
        assert sub.state == replay_run(world, sub_run_id).state
        assert sub.state.usage.input_tokens == 300
    again = await run_workflow(world, workflow, run_id=RUN_ID)
    assert again.state == result.state


class _Gate(BaseModel):
    ok: bool


def test_sub_runs_waiting_at_once_are_each_named_with_their_own_run(world: World) -> None:
    gated = Workflow("gated", steps=[wait_for("gate", model=_Gate)])

    def respond(request: ModelRequest) -> ScriptedReply:
        if not any(m.role == "assistant" for m in request.messages):
            calls = tuple(
                ToolCall(id=f"c{i}", name="start_workflow", arguments={"workflow_id": "gated"})
                for i in range(2)
            )
            return ScriptedReply(tool_calls=calls)
        return ScriptedReply(content="both answered")

    orchestrator = Workflow(
        "gate_keeper",
        steps=[
            agent(
                "fan",
                model=ScriptedModel(respond=respond),
                prompt="open both",
                tools=[start_workflow_tool([gated])],
            )
        ],
    )
    with pytest.raises(RunWaitingError) as waiting:
        asyncio.run(run_workflow(world, orchestrator, {}, run_id="run_gates"))
    subs = [
        sub_run_id_for_call("run_gates", str(session_stream_id("run_gates", "fan", 1)), c)
        for c in ("c0", "c1")
    ]
    assert sorted(waiting.value.wait_run_ids) == sorted(subs)
    for sub in subs:
        assert f"run {sub!r} waits for signal 'gate'" in str(waiting.value)
        assert f"`little signal {sub} gate --data JSON`" in str(waiting.value)
    # What the error names is what to signal: each run once.
    for owner, (signal, _, _) in zip(waiting.value.wait_run_ids, waiting.value.waits, strict=True):
        world.signal(owner, signal, {"ok": True})
    result = asyncio.run(run_workflow(world, orchestrator, run_id="run_gates"))
    assert result.output == "both answered"


def test_a_sub_run_that_stops_leaves_its_siblings_calls_to_finish(world: World) -> None:
    # A stop in one call of a batch (here the parent cancelled from a sub-run's step)
    # lets the other calls go on to their own next check: cut off, the slow sub-run's
    # model call in flight was made again on resume, and paid twice.
    started: list[str] = []

    cancelled: list[bool] = []

    def cancel_parent(ctx: StepContext) -> int:
        if not cancelled:  # once: the resume goes on
            cancel_run(world, "run_stopper", reason="enough")
            cancelled.append(True)
        return 0

    async def slow(request: ModelRequest) -> ScriptedReply:
        started.append("slow")
        await asyncio.sleep(0.3)
        return ScriptedReply(content="slow answer")

    # Its next step stops with the parent: the tool call it runs in is stopped.
    stopper = Workflow("stopper", steps=[task("stop", cancel_parent), task("next", lambda ctx: 1)])
    slow_agent = Workflow(
        "slow_agent", steps=[agent("think", model=ScriptedModel(respond=slow), prompt="think")]
    )

    def respond(request: ModelRequest) -> ScriptedReply:
        if not any(m.role == "assistant" for m in request.messages):
            return ScriptedReply(
                tool_calls=(
                    ToolCall(
                        id="slow", name="start_workflow", arguments={"workflow_id": "slow_agent"}
                    ),
                    ToolCall(
                        id="stop", name="start_workflow", arguments={"workflow_id": "stopper"}
                    ),
                )
            )
        return ScriptedReply(content="done")

    wf = Workflow(
        "stop_fan",
        steps=[
            agent(
                "fan",
                model=ScriptedModel(respond=respond),
                prompt="fan out",
                tools=[start_workflow_tool([stopper, slow_agent])],
            )
        ],
    )
    with pytest.raises(RunCancelledError):
        asyncio.run(run_workflow(world, wf, {}, run_id="run_stopper"))
    asyncio.run(run_workflow(world, wf, run_id="run_stopper", resume_cancelled=True))
    assert started == ["slow"]

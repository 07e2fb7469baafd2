"""The same workflow on both engines ends the same way, against the real ``temporal server
start-dev``: each case runs once locally and once on Temporal, in worlds of their own.

* a sub-run stopped by a decision's visit limit fails its parent's step with the same
  recorded error (the child's ``VisitLimitError``), not a ``RunFailedError`` "at step
  None" on Temporal;
* an outer loop whose cycle run hits a visit limit records a failed cycle and goes on
  (``on_cycle_failure="continue"``) on both, where locally it used to raise;
* an outer loop whose cycle run waits for a signal stops with ``RunWaitingError`` on
  both, where ``TemporalEngine`` used to wait for the workflow for ever; signalled, the
  loop resumes and ends;
* a step whose code raises ``asyncio.CancelledError`` (nothing cancelled it) stops its
  run with the step in flight on both, where Temporal retried it for ever;
* a retryable model error (a 429) is retried in place by the agent step's ``retry``, in
  the same session, and past those tries fails the run for good: a new attempt would
  start a new session, paying for every answer again and running every tool again;
* a parallel group's ``retry`` is its ``branches(ctx)``'s, as a step's is its code's (it
  was accepted and never applied), and a failed run resumed that fails again in a
  group's ``branches(ctx)`` records that failure as the run's.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from little_es_temporal import TemporalEngine, create_worker, signal_run, start_run
from pydantic import BaseModel
from temporalio.client import Client, WorkflowFailureError

import tests._temporal_support as _support
from little_es.engine.local import run_workflow
from little_es.errors import (
    BudgetExceededError,
    ModelError,
    ModelUnavailableError,
    RunFailedError,
    RunWaitingError,
)
from little_es.events import RunFailed, StepFailed
from little_es.harness.model import ScriptedModel
from little_es.harness.tools import tool
from little_es.outer_loop import Planner, run_outer_loop
from little_es.replay import replay_run
from little_es.values import Budget, ModelRequest, ModelResponse, ToolCall, Usage
from little_es.workflow.authoring import (
    Workflow,
    agent,
    decision,
    parallel,
    subworkflow,
    task,
    wait_for,
)
from little_es.workflow.ir import RetryPolicy
from little_es.world import World, local_world

dev_server = _support.dev_server
client = _support.client

pytestmark = [pytest.mark.temporal, pytest.mark.timeout(300)]

ENGINES = ("local", "temporal")


class Go(BaseModel):
    go: bool


def _one(ctx: Any) -> int:
    return 1


def _back(ctx: Any) -> str:
    return "a"


LOOPING = Workflow(
    "looping", steps=[task("a", _one, max_visits=2), decision("d", _back, max_visits=2)]
)
"""Its decision jumps back to ``a`` until ``a`` has used its visits: a visit limit."""
WAITING = Workflow("waiting", steps=[task("a", _one), wait_for("w", model=Go)])
PARENT = Workflow("parent", steps=[subworkflow("s", LOOPING)])


async def _cancels_itself(ctx: Any) -> str:
    raise asyncio.CancelledError


SELF_CANCELLING = Workflow("self_cancelling", steps=[task("a", _cancels_itself), task("b", _one)])

_FLAKY = {"branches": 0, "fail_branches": 1, "fail_branch": False}


def _flaky_branches(ctx: Any) -> list[str]:
    _FLAKY["branches"] += 1
    if _FLAKY["branches"] <= _FLAKY["fail_branches"]:
        raise ConnectionError("the branch list is not there yet")
    return ["a", "b"]


def _branch(ctx: Any) -> str:
    if _FLAKY["fail_branch"]:
        raise ValueError("branch broken")
    return str(ctx.step_path)


GROUPED = Workflow(
    "grouped",
    steps=[
        parallel(
            "p",
            branches=_flaky_branches,
            step=task("t", _branch),
            retry=RetryPolicy(max_attempts=2, initial_backoff_s=0.01),
        )
    ],
)


def _plan(request: ModelRequest) -> ModelResponse:
    # One cycle, then done.
    prompt = next(m.content for m in request.messages if m.role == "user")
    context = json.loads(str(prompt).split("(JSON):\n", 1)[1])
    body: dict[str, Any] = (
        {"done": True, "reason": "one cycle seen"}
        if context["cycles"]
        else {"done": False, "input": {"n": 1}, "reason": "try once"}
    )
    return ModelResponse(
        content=json.dumps(body),
        usage=Usage(input_tokens=10, output_tokens=5),
        provider="scripted",
        model="planner-1",
    )


PLANNER = Planner(model=ScriptedModel(respond=_plan, model_id="planner-1"), prompt="plan")

_PROVIDER = {"fail_turn": 3, "failures": 1, "failed": 0, "paid": 0}
_CHARGED: list[int] = []


@tool
def charge(n: int) -> str:
    """Charge order n."""
    _CHARGED.append(n)
    return f"charged {n}"


def _rate_limited(request: ModelRequest) -> ModelResponse:
    # One charge a turn for three turns, then the answer; turn fail_turn is refused
    # (a 429) its first `failures` times.
    turn = 1 + sum(1 for m in request.messages if m.role == "assistant")
    if turn == _PROVIDER["fail_turn"] and _PROVIDER["failed"] < _PROVIDER["failures"]:
        _PROVIDER["failed"] += 1
        raise ModelError("429: slow down", retryable=True, provider="scripted", status=429)
    _PROVIDER["paid"] += 1
    usage = Usage(input_tokens=10, output_tokens=1)
    if turn > 3:
        return ModelResponse(content="charged all", usage=usage, provider="p", model="m")
    call = ToolCall(id=f"c{turn}", name="charge", arguments={"n": turn})
    return ModelResponse(tool_calls=(call,), usage=usage, provider="p", model="m")


RATE_LIMITED = Workflow(
    "rate_limited",
    steps=[
        agent(
            "a",
            model=ScriptedModel(respond=_rate_limited),
            prompt="charge the orders",
            tools=[charge],
            retry=RetryPolicy(max_attempts=3, initial_backoff_s=0.01),
        )
    ],
)


@tool
async def _pause(seconds: float) -> str:
    """Wait a while."""
    await asyncio.sleep(seconds)
    return "paused"


def _fast_or_slow(request: ModelRequest) -> ModelResponse:
    # One call a turn, for ever: branch "fast" at once, branch "slow" two seconds apart.
    first = next(m.content for m in request.messages if m.role == "user")
    turn = sum(1 for m in request.messages if m.role == "assistant")
    seconds = 0.0 if first == "fast" else 2.0
    call = ToolCall(id=f"p{turn}", name="_pause", arguments={"seconds": seconds})
    return ModelResponse(tool_calls=(call,), usage=Usage(input_tokens=1), provider="p", model="m")


SPENDING = Workflow(
    "spending",
    steps=[
        parallel(
            "g",
            branches=lambda ctx: ["fast", "slow"],
            step=agent(
                "one",
                model=ScriptedModel(respond=_fast_or_slow),
                prompt=lambda ctx: ctx.branch_key,
                tools=[_pause],
                max_turns=50,
            ),
        )
    ],
)


def _stop_or_fail(request: ModelRequest) -> ModelResponse:
    # Branch "a_stop" spends its step's budget of one call at its second; branch "b_fail"
    # fails for good at its first.
    first = next(m.content for m in request.messages if m.role == "user")
    if first == "b_fail":
        raise ModelError("400: refused", retryable=False, provider="p", status=400)
    turn = sum(1 for m in request.messages if m.role == "assistant")
    call = ToolCall(id=f"p{turn}", name="_pause", arguments={"seconds": 0.0})
    return ModelResponse(tool_calls=(call,), usage=Usage(input_tokens=1), provider="p", model="m")


STOP_OR_FAIL = Workflow(
    "stop_or_fail",
    steps=[
        parallel(
            "g",
            branches=lambda ctx: ["a_stop", "b_fail"],
            step=agent(
                "one",
                model=ScriptedModel(respond=_stop_or_fail),
                prompt=lambda ctx: ctx.branch_key,
                tools=[_pause],
                budget=Budget(model_calls=1),
            ),
        )
    ],
)


@asynccontextmanager
async def _engine(client: Client, world: World, name: str) -> AsyncIterator[Any]:
    """The keyword arguments that run a loop on ``name``, with a worker while needed."""
    if name == "local":
        yield {}
        return
    queue = f"q-{uuid.uuid4().hex[:12]}"
    workflows = [
        PLANNER.workflow,
        LOOPING,
        WAITING,
        PARENT,
        GROUPED,
        SELF_CANCELLING,
        RATE_LIMITED,
        SPENDING,
        STOP_OR_FAIL,
    ]
    async with create_worker(client, world, workflows=workflows, task_queue=queue):
        yield {"engine": TemporalEngine(client, task_queue=queue), "queue": queue}
    await asyncio.sleep(0.2)


async def _drive(
    client: Client, world: World, kw: dict[str, Any], wf: Workflow, run_id: str
) -> Any:
    if "queue" not in kw:
        return await run_workflow(world, wf, {}, run_id=run_id)
    handle = await start_run(client, wf, {}, run_id=run_id, task_queue=kw["queue"])
    return await handle.result()


@pytest.mark.parametrize("engine", ENGINES)
async def test_a_sub_runs_visit_limit_fails_its_parents_step_with_the_childs_error(
    client: Client, tmp_path: Path, engine: str
) -> None:
    with local_world(tmp_path / "world") as world:
        async with _engine(client, world, engine) as kw:
            with pytest.raises((RunFailedError, WorkflowFailureError)):
                await _drive(client, world, kw, PARENT, "run_parent")
        state = replay_run(world, "run_parent").state
        assert state.status == "failed" and state.failed_step_path == "s"
        assert state.error is not None and state.error.type == "VisitLimitError"
        assert "would be visited 3 times, but max_visits=2" in state.error.message
        assert "at step None" not in state.error.message
        failed = [e for e in world.read_run_log("run_parent") if isinstance(e, StepFailed)]
        assert [e.error for e in failed] == [state.error]


@pytest.mark.parametrize("engine", ENGINES)
async def test_an_outer_loops_cycle_that_hits_a_visit_limit_is_a_failed_cycle(
    client: Client, tmp_path: Path, engine: str
) -> None:
    with local_world(tmp_path / "world") as world:
        async with _engine(client, world, engine) as kw:
            result = await run_outer_loop(
                world,
                planner=PLANNER,
                workflow=LOOPING,
                outer_loop_id="loop_visits",
                max_cycles=3,
                on_cycle_failure="continue",
                engine=kw.get("engine"),
            )
        assert result.reason == "planner_done"
        assert [c.completed.status for c in result.cycles if c.completed] == ["failed"]
        cycle = replay_run(world, "loop_visits.cycle-1").state
        assert cycle.status == "failed" and cycle.error is not None
        assert cycle.error.type == "VisitLimitError"
        assert sum(isinstance(e, RunFailed) for e in world.read_run_log("loop_visits.cycle-1")) == 1


@pytest.mark.parametrize("engine", ENGINES)
async def test_an_outer_loops_waiting_cycle_stops_the_loop_until_it_is_signalled(
    client: Client, tmp_path: Path, engine: str
) -> None:
    with local_world(tmp_path / "world") as world:
        async with _engine(client, world, engine) as kw:

            async def drive() -> Any:
                return await asyncio.wait_for(
                    run_outer_loop(
                        world,
                        planner=PLANNER,
                        workflow=WAITING,
                        outer_loop_id="loop_waits",
                        max_cycles=3,
                        engine=kw.get("engine"),
                    ),
                    timeout=60,
                )

            with pytest.raises(
                RunWaitingError, match=r"'loop_waits\.cycle-1' waits for signal 'w'"
            ):
                await drive()
            if engine == "local":
                world.signal("loop_waits.cycle-1", "w", {"go": True})
            else:
                await signal_run(client, world, "loop_waits.cycle-1", "w", {"go": True})
            result = await drive()
        assert result.reason == "planner_done"
        assert [c.completed.status for c in result.cycles if c.completed] == ["completed"]
        assert replay_run(world, "loop_waits.cycle-1").state.output == {"go": True}


@pytest.mark.parametrize("engine", ENGINES)
async def test_a_groups_retry_is_its_branches_and_a_new_failure_there_is_the_runs(
    client: Client, tmp_path: Path, engine: str
) -> None:
    with local_world(tmp_path / "world") as world:
        async with _engine(client, world, engine) as kw:
            # branches(ctx) fails once: its second attempt, by the group's policy, runs.
            _FLAKY.update(branches=0, fail_branches=1, fail_branch=False)
            await _drive(client, world, kw, GROUPED, "run_retried")
            state = replay_run(world, "run_retried").state
            assert state.status == "completed"
            assert state.steps["p"].attempts == 2
            failed = [e for e in world.read_run_log("run_retried") if isinstance(e, StepFailed)]
            assert [(e.step_path, e.attempt, e.will_retry) for e in failed] == [("p", 1, True)]

            # A branch fails the run; resumed, branches(ctx) fails it (twice, its retry
            # spent): the run's recorded failure is that one, as the error raised says.
            _FLAKY.update(branches=1, fail_branches=0, fail_branch=True)
            with pytest.raises((RunFailedError, WorkflowFailureError)):
                await _drive(client, world, kw, GROUPED, "run_refailed")
            assert replay_run(world, "run_refailed").state.failed_step_path == "p[a]/t"
            _FLAKY.update(branches=0, fail_branches=5, fail_branch=False)
            with pytest.raises((RunFailedError, WorkflowFailureError)):
                await _drive(client, world, kw, GROUPED, "run_refailed")
            state = replay_run(world, "run_refailed").state
            assert state.status == "failed" and state.failed_step_path == "p"
            assert state.error is not None and state.error.type == "ConnectionError"


@pytest.mark.parametrize("engine", ENGINES)
async def test_a_step_raising_cancelled_error_stops_its_run_with_the_step_in_flight(
    client: Client, tmp_path: Path, engine: str
) -> None:
    with local_world(tmp_path / "world") as world:
        async with _engine(client, world, engine) as kw:
            if engine == "local":
                with pytest.raises(asyncio.CancelledError):
                    await _drive(client, world, kw, SELF_CANCELLING, "run_self_cancel")
            else:
                with pytest.raises(WorkflowFailureError) as failure:
                    await asyncio.wait_for(
                        _drive(client, world, kw, SELF_CANCELLING, "run_self_cancel"), 60
                    )
                assert "raised asyncio.CancelledError" in str(failure.value.cause.cause)  # type: ignore[union-attr]
        state = replay_run(world, "run_self_cancel").state
        assert list(state.steps) == ["a"] and state.steps["a"].status == "running"
        assert state.steps["a"].attempts == 1


@pytest.mark.parametrize("engine", ENGINES)
async def test_a_retryable_model_error_is_retried_in_the_same_session(
    client: Client, tmp_path: Path, engine: str
) -> None:
    # A new attempt would start a new session: turns 1 and 2 paid again, orders 1 and 2
    # charged again.
    _PROVIDER.update(fail_turn=3, failures=2, failed=0, paid=0)
    _CHARGED.clear()
    with local_world(tmp_path / "world") as world:
        async with _engine(client, world, engine) as kw:
            await _drive(client, world, kw, RATE_LIMITED, "run_429")
        state = replay_run(world, "run_429").state
        assert (state.status, state.output) == ("completed", "charged all")
        assert _CHARGED == [1, 2, 3] and _PROVIDER == {
            "fail_turn": 3,
            "failures": 2,
            "failed": 2,
            "paid": 4,
        }
        assert state.steps["a"].attempts == 1 and state.usage.calls == 4
        assert not [e for e in world.read_run_log("run_429") if isinstance(e, StepFailed)]


@pytest.mark.parametrize("engine", ENGINES)
async def test_a_model_error_past_the_steps_tries_stops_the_run_and_a_resume_goes_on(
    client: Client, tmp_path: Path, engine: str
) -> None:
    # Failed, the step's next attempt would be a new session: turn 1 paid again, order 1
    # charged again. Stopped, nothing is recorded, and the resume makes only turn 2 again.
    _PROVIDER.update(fail_turn=2, failures=10, failed=0, paid=0)
    _CHARGED.clear()
    with local_world(tmp_path / "world") as world:
        async with _engine(client, world, engine) as kw:

            async def run() -> Any:
                if "engine" in kw:
                    return await kw["engine"].run(world, RATE_LIMITED, {}, run_id="run_429s")
                return (await run_workflow(world, RATE_LIMITED, {}, run_id="run_429s")).output

            with pytest.raises(ModelUnavailableError) as stopped:
                await run()
            assert "its model call failed 3 times (429: slow down)" in str(stopped.value)
            state = replay_run(world, "run_429s").state
            assert (state.status, state.steps["a"].attempts, state.usage.calls) == (
                "running",
                1,
                1,
            )
            assert not [e for e in world.read_run_log("run_429s") if isinstance(e, StepFailed)]
            assert _CHARGED == [1] and _PROVIDER["failed"] == 3 and _PROVIDER["paid"] == 1
            _PROVIDER.update(failures=0)
            assert await run() == "charged all"
        state = replay_run(world, "run_429s").state
        assert (state.status, state.steps["a"].attempts) == ("completed", 1)
        assert _CHARGED == [1, 2, 3] and _PROVIDER["paid"] == 4 and state.usage.calls == 4


async def test_a_cancel_between_an_activitys_read_and_its_step_start_stops_the_step(
    tmp_path: Path,
) -> None:
    # The Temporal writer's check of a run's parents must not catch up the run's own
    # aggregate inside the action: the cancel would be folded in, and the StepStarted
    # after it would not lose the version check that stops the step.
    from little_es_temporal.stream import RunCache, TemporalRunWriter

    from little_es.durability import RunRecorder, cancel_run
    from little_es.engine.executor import StepExecutor
    from little_es.errors import RunCancelledError

    wf = Workflow("two", steps=[task("a", _one), task("b", _one)])
    with local_world(tmp_path / "world") as world:
        RunRecorder.start(
            world,
            run_id="run_raced",
            workflow_id=wf.id,
            workflow_version=wf.version,
            ir_hash=wf.ir_hash,
            input={},
        )
        writer = TemporalRunWriter(RunCache(world), world, "run_raced")
        writer.read()  # as an activity reads its run first
        cancel_run(world, "run_raced", reason="stop")
        step = wf.step("a")
        with pytest.raises(RunCancelledError):
            await StepExecutor(writer, wf).begin(step, "a", 1, catch_up=False)  # type: ignore[arg-type]
        kinds = [type(e).__name__ for e in world.read_run_log("run_raced")]
        assert kinds == ["RunStarted", "RunCancelled"]


@pytest.mark.parametrize("engine", ENGINES)
async def test_a_budget_one_branch_spent_stops_the_others_at_their_next_call(
    client: Client, tmp_path: Path, engine: str
) -> None:
    # On Temporal each branch's activity counts its own calls: the slow branch went on to
    # four calls of its own after the fast one had spent the run's four (8 in all).
    with local_world(tmp_path / "world") as world:
        async with _engine(client, world, engine) as kw:
            with pytest.raises((BudgetExceededError, WorkflowFailureError)):
                if "queue" in kw:
                    handle = await start_run(
                        client,
                        SPENDING,
                        {},
                        run_id="run_spend",
                        task_queue=kw["queue"],
                        budget=Budget(model_calls=4),
                    )
                    await handle.result()
                else:
                    await run_workflow(
                        world, SPENDING, {}, run_id="run_spend", budget=Budget(model_calls=4)
                    )
        state = replay_run(world, "run_spend").state
    assert state.status == "budget_exceeded"
    # The fast branch's four, and at most the one the slow branch had in flight.
    assert state.usage.calls <= 5, state.usage.calls


@pytest.mark.parametrize("engine", ENGINES)
async def test_a_branch_out_of_retries_fails_the_run_though_another_stopped_first_in_key_order(
    client: Client, tmp_path: Path, engine: str
) -> None:
    # On Temporal the first error in key order ended the group: the stop, so the run never
    # recorded the other branch's failure, as the local engine does.
    with local_world(tmp_path / "world") as world:
        async with _engine(client, world, engine) as kw:
            with pytest.raises((RunFailedError, WorkflowFailureError)):
                await _drive(client, world, kw, STOP_OR_FAIL, "run_stop_or_fail")
        state = replay_run(world, "run_stop_or_fail").state
        failed = [e for e in world.read_run_log("run_stop_or_fail") if isinstance(e, RunFailed)]
    assert state.status == "failed" and state.failed_step_path == "g[b_fail]/one"
    assert len(failed) == 1
    assert state.steps["g[a_stop]/one"].status == "running"

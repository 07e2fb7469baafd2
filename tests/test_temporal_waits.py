"""Durable waits on Temporal, against the real ``temporal server start-dev``.

The workflow is the kill test's (``tests/_waits_proc.py``): an agent that asks a person
(``ask_human``) and a ``wait_for`` step. On Temporal each wait is a workflow wait on the
Temporal signal ``little_es.signal``: the step activity records ``RunWaiting`` and
returns, the workflow waits (no activity runs, no worker is busy), and
``little_es_temporal.signal_run`` (or ``little signal --temporal ADDRESS``) records
``SignalReceived`` in the log and wakes it; the same step attempt runs again and reads
the signal's data from the log (the first worker stops while the run waits; a second
one continues it after the signal). The log is the local engine's, the ledger shows every
step, model call and tool call executed once, and the history replays. A deadline that
passes first records ``WaitTimedOut`` and ends the workflow, as locally.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from little_es_temporal import StepTimeouts, create_replayer, create_worker, signal_run, start_run
from little_es_temporal.workflow import STOP_ENDS_WAITS_PATCH, TIMED_OUT_SUB_RUN_PATCH
from pydantic import BaseModel
from temporalio.client import Client, WorkflowFailureError

import tests._temporal_support as _support
from little_es.errors import SignalConsumedError, SignalDataError
from little_es.events import RunWaiting, SignalReceived, StepFailed, WaitTimedOut
from little_es.harness.model import ScriptedModel, ScriptedReply
from little_es.harness.tools import tool
from little_es.replay import replay_run
from little_es.values import Budget, ModelRequest, ToolCall
from little_es.workflow.authoring import Workflow, agent, parallel, subworkflow, task, wait_for
from little_es.workflow.context import StepContext
from little_es.world import World, local_world
from tests import _waits_proc as wp

dev_server = _support.dev_server
client = _support.client

pytestmark = [pytest.mark.temporal, pytest.mark.timeout(300)]

_FAST = StepTimeouts(heartbeat=timedelta(seconds=1))
REPO = Path(__file__).resolve().parent.parent


class Go(BaseModel):
    go: bool


def _noop(ctx: StepContext) -> str:
    return "ran"


SHORT = Workflow("short_wait", steps=[wait_for("go", model=Go, timeout=1.0), task("after", _noop)])


@pytest.fixture
def ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "ledger"
    monkeypatch.setattr(wp, "_ledger", path)
    return path


def _ledger(path: Path) -> Counter[str]:
    if not path.exists():
        return Counter()
    return Counter(line.split(" ", 1)[1] for line in path.read_text().splitlines())


async def _until_waiting(world: World, run_id: str, signal: str) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            waits = world.load_run(run_id).fold.waits
        except LookupError:
            waits = {}
        if any(w.signal == signal and w.status == "waiting" for w in waits.values()):
            return
        assert time.monotonic() < deadline, f"run {run_id} never waited for {signal}"
        await asyncio.sleep(0.05)


def _little(world_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env: dict[str, Any] = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "adapters")]),
    }
    return subprocess.run(
        [sys.executable, "-m", "little_es.cli", *args, "--world", f"sqlite:///{world_dir}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )


async def test_waits_on_temporal_are_workflow_waits_on_a_temporal_signal(
    client: Client, dev_server: Any, tmp_path: Path, ledger: Path
) -> None:
    queue = f"q-{uuid.uuid4().hex[:12]}"
    run_id = "run_t_wait"
    with local_world(tmp_path / "world") as world:
        async with create_worker(client, world, workflows=[wp.workflow], task_queue=queue):
            handle = await start_run(
                client, wp.workflow, {}, run_id=run_id, task_queue=queue, timeouts=_FAST
            )
            await _until_waiting(world, run_id, "human")
        # No worker runs while the workflow waits: Temporal holds the wait.
        assert _ledger(ledger) == Counter({"step fetch": 1, "model 1": 1, "tool lookup build": 1})
        with pytest.raises(SignalDataError):
            await signal_run(client, world, run_id, "human", {"answer": 1})
        await signal_run(client, world, run_id, "human", {"answer": "prod"})
        with pytest.raises(SignalConsumedError):
            await signal_run(client, world, run_id, "human", {"answer": "dev"})
        async with create_worker(client, world, workflows=[wp.workflow], task_queue=queue):
            await _until_waiting(world, run_id, "review")
            # From another process: `little signal --temporal` records it and wakes the run.
            sent = _little(
                tmp_path / "world",
                "signal",
                run_id,
                "review",
                "--data",
                '{"approved": true, "reviewer": "ana"}',
                "--temporal",
                dev_server.address,
            )
            assert sent.returncode == 0, sent.stderr
            assert "its Temporal workflow was woken" in sent.stdout
            done = await handle.result()
            history = await handle.fetch_history()
        assert isinstance(done.output, dict)
        assert done.output["plan"] == "deploy to prod"
        assert done.output["review"] == {"approved": True, "reviewer": "ana"}
        events = list(world.read_run_log(run_id))
        state = replay_run(world, run_id).state
    assert state.status == "completed"
    assert sum(isinstance(e, RunWaiting) for e in events) == 2
    assert sum(isinstance(e, SignalReceived) for e in events) == 2
    assert not any(isinstance(e, StepFailed) for e in events)
    assert _ledger(ledger) == Counter(
        {"step fetch": 1, "model 1": 1, "tool lookup build": 1, "model 2": 1, "step publish": 1}
    )
    replayed = await create_replayer().replay_workflow(history, raise_on_replay_failure=False)
    assert replayed.replay_failure is None, replayed.replay_failure


async def test_a_deadline_on_temporal_records_its_own_outcome(
    client: Client, tmp_path: Path
) -> None:
    queue = f"q-{uuid.uuid4().hex[:12]}"
    with local_world(tmp_path / "world") as world:
        async with create_worker(client, world, workflows=[SHORT], task_queue=queue):
            handle = await start_run(
                client, SHORT, {}, run_id="run_t_late", task_queue=queue, timeouts=_FAST
            )
            with pytest.raises(WorkflowFailureError) as failure:
                await handle.result()
        assert "WaitTimedOutError" in repr(failure.value.cause.cause)  # type: ignore[union-attr]
        state = replay_run(world, "run_t_late").state
        events = list(world.read_run_log("run_t_late"))
    assert state.status == "timed_out" and state.stopped_step_path == "go"
    assert sum(isinstance(e, WaitTimedOut) for e in events) == 1
    assert "after" not in state.steps


PARENT_OF_SHORT = Workflow("parent_of_short", steps=[subworkflow("sub", SHORT)])


async def test_a_sub_run_whose_wait_timed_out_fails_its_parents_step_on_temporal_as_locally(
    client: Client, tmp_path: Path
) -> None:
    queue = f"q-{uuid.uuid4().hex[:12]}"
    with local_world(tmp_path / "world") as world:
        workflows = [PARENT_OF_SHORT, SHORT]
        async with create_worker(client, world, workflows=workflows, task_queue=queue):
            handle = await start_run(
                client, PARENT_OF_SHORT, {}, run_id="run_t_parent", task_queue=queue, timeouts=_FAST
            )
            with pytest.raises(WorkflowFailureError):
                await asyncio.wait_for(handle.result(), 60)
            history = await handle.fetch_history()
        state = replay_run(world, "run_t_parent").state
        (sub_run,) = state.sub_run_ids
        assert replay_run(world, sub_run).state.status == "timed_out"
    assert state.status == "failed" and state.steps["sub"].status == "failed"
    error = state.steps["sub"].error
    assert error is not None and error.type == "SubRunTimedOutError" and not error.retryable
    assert f"run {sub_run!r} stopped at step 'go': its wait for signal" in error.message
    assert TIMED_OUT_SUB_RUN_PATCH in str(history.events)
    replayed = await create_replayer().replay_workflow(history, raise_on_replay_failure=False)
    assert replayed.replay_failure is None, replayed.replay_failure


_NESTED_WORLD: list[World] = []
INNER = Workflow("inner_wait", steps=[wait_for("approve", model=Go)])


async def _drive_inner(ctx: StepContext) -> Any:
    # A step that drives a run of its own, which waits: that run's wait, not this one's.
    from little_es.engine.local import run_workflow

    result = await run_workflow(_NESTED_WORLD[0], INNER, {}, run_id=f"{ctx.run_id}-inner")
    return result.output


def _suspends(ctx: StepContext) -> str:
    from little_es.errors import StepSuspendedError

    raise StepSuspendedError(())


def _after(ctx: StepContext) -> dict[str, Any]:
    return {"before": ctx.outputs["a"]}


async def test_a_step_stopped_by_another_runs_wait_stops_its_run_on_temporal_as_locally(
    client: Client, tmp_path: Path
) -> None:
    # A wait the workflow cannot wait on, or a suspension with nothing to host, used to
    # read as the step done: the next step ran and the run completed without it.
    nested = Workflow("nested_wait", steps=[task("a", _drive_inner), task("b", _after)])
    suspends = Workflow("suspends", steps=[task("a", _suspends), task("b", _after)])
    queue = f"q-{uuid.uuid4().hex[:12]}"
    with local_world(tmp_path / "world") as world:
        _NESTED_WORLD[:] = [world]
        worker = create_worker(client, world, workflows=[nested, suspends], task_queue=queue)
        async with worker:
            for wf, run_id, said in (
                (nested, "run_t_nested_wait", "waits for signal 'approve'"),
                (suspends, "run_t_suspends", "with no sub-run to host"),
            ):
                handle = await start_run(
                    client, wf, {}, run_id=run_id, task_queue=queue, timeouts=_FAST
                )
                with pytest.raises(WorkflowFailureError) as failure:
                    await handle.result()
                assert said in str(failure.value.cause.cause)  # type: ignore[union-attr]
                state = replay_run(world, run_id).state
                assert state.status == "running" and list(state.steps) == ["a"]
                assert state.steps["a"].status == "running"
                assert not any(isinstance(e, StepFailed) for e in world.read_run_log(run_id))
            world.signal("run_t_nested_wait-inner", "approve", {"go": True})
            again = await start_run(
                client, nested, run_id="run_t_nested_wait", task_queue=queue, timeouts=_FAST
            )
            await again.result()
        await asyncio.sleep(0.2)
        assert replay_run(world, "run_t_nested_wait").state.output == {"before": {"go": True}}


_DEPLOYED: list[str] = []


@tool(requires_approval=True)
def _deploy(env: str) -> str:
    """Deploy, once approved."""
    _DEPLOYED.append(env)
    return f"deployed to {env}"


@tool
def _look() -> str:
    """Look around."""
    return "nothing new"


def _wait_or_spend(request: ModelRequest) -> ScriptedReply:
    # Branch "wait" asks for an approval and waits; branch "spend" calls models until the
    # run's budget is spent.
    first = next(m.content for m in request.messages if m.role == "user")
    turn = sum(1 for m in request.messages if m.role == "assistant")
    if first == "wait":
        return ScriptedReply(
            tool_calls=(ToolCall(id="c", name="_deploy", arguments={"env": "prod"}),)
        )
    return ScriptedReply(tool_calls=(ToolCall(id=f"c{turn}", name="_look", arguments={}),))


WAIT_OR_SPEND = Workflow(
    "wait_or_spend",
    steps=[
        parallel(
            "g",
            branches=lambda ctx: ["wait", "spend"],
            step=agent(
                "one",
                model=ScriptedModel(respond=_wait_or_spend),
                prompt=lambda ctx: ctx.branch_key,
                tools=[_deploy, _look],
                max_turns=50,
            ),
        )
    ],
)


async def test_a_branch_that_stops_the_run_ends_another_branchs_wait_on_temporal_as_locally(
    client: Client, tmp_path: Path
) -> None:
    # Locally the run stops with the budget's error; on Temporal the waiting branch waited
    # on for its signal, the workflow open while the log said budget_exceeded.
    _DEPLOYED.clear()
    queue = f"q-{uuid.uuid4().hex[:12]}"
    with local_world(tmp_path / "world") as world:
        async with create_worker(client, world, workflows=[WAIT_OR_SPEND], task_queue=queue):
            handle = await start_run(
                client,
                WAIT_OR_SPEND,
                {},
                run_id="run_t_wait_or_spend",
                task_queue=queue,
                timeouts=_FAST,
                budget=Budget(model_calls=4),
            )
            with pytest.raises(WorkflowFailureError) as failure:
                await asyncio.wait_for(handle.result(), 30)
            history = await handle.fetch_history()
        state = replay_run(world, "run_t_wait_or_spend").state
    assert "BudgetExceededError" in repr(failure.value.cause.cause)  # type: ignore[union-attr]
    assert state.status == "budget_exceeded"
    assert state.waits["g[wait]/one#1:c"].status == "waiting" and _DEPLOYED == []
    assert STOP_ENDS_WAITS_PATCH in str(history.events)
    replayed = await create_replayer().replay_workflow(history, raise_on_replay_failure=False)
    assert replayed.replay_failure is None, replayed.replay_failure


_CONFIRMED: list[str] = []
_BUSY: list[int] = []


@tool(requires_approval=True, approval_timeout=0.5)
def _confirm() -> str:
    """Confirm the release."""
    _CONFIRMED.append("confirmed")
    return "confirmed"


@tool
async def _slow() -> str:
    """Work a while."""
    await asyncio.sleep(0.3)
    return "worked"


def _late_or_busy(request: ModelRequest) -> ScriptedReply:
    # Branch "late" asks for an approval that times out; branch "busy" keeps calling.
    first = next(m.content for m in request.messages if m.role == "user")
    turn = sum(1 for m in request.messages if m.role == "assistant")
    if first == "late":
        return ScriptedReply(tool_calls=(ToolCall(id="c", name="_confirm", arguments={}),))
    _BUSY.append(turn)
    if turn >= 20:
        return ScriptedReply(content="done")
    return ScriptedReply(tool_calls=(ToolCall(id=f"s{turn}", name="_slow", arguments={}),))


LATE_OR_BUSY = Workflow(
    "late_or_busy",
    steps=[
        parallel(
            "g",
            branches=lambda ctx: ["late", "busy"],
            step=agent(
                "one",
                model=ScriptedModel(respond=_late_or_busy),
                prompt=lambda ctx: ctx.branch_key,
                tools=[_confirm, _slow],
                max_turns=30,
            ),
        )
    ],
)


async def test_a_timed_out_run_makes_no_more_model_calls_in_its_other_branches(
    client: Client, tmp_path: Path
) -> None:
    # A wait's timer fires while another branch works: the run is stopped for good, and
    # each model call that branch made after it (20 more, here) was paid for nothing.
    _CONFIRMED.clear()
    _BUSY.clear()
    queue = f"q-{uuid.uuid4().hex[:12]}"
    with local_world(tmp_path / "world") as world:
        async with create_worker(client, world, workflows=[LATE_OR_BUSY], task_queue=queue):
            handle = await start_run(
                client, LATE_OR_BUSY, {}, run_id="run_t_late", task_queue=queue, timeouts=_FAST
            )
            with pytest.raises(WorkflowFailureError):
                await asyncio.wait_for(handle.result(), 60)
        state = replay_run(world, "run_t_late").state
    await asyncio.sleep(0.2)
    assert state.status == "timed_out" and _CONFIRMED == []
    # Stopped at its first model call after the deadline (0.5 s; a turn takes 0.3 s).
    assert state.steps["g[busy]/one"].status == "running"
    assert len(_BUSY) < 10, _BUSY

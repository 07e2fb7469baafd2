"""Cancel and budgets on Temporal, against the real ``temporal server start-dev``.

The workflows are those of ``test_operate_kill.py`` (``tests/_operate_proc.py``),
run by an in-process worker; their steps, model calls and tool calls write
every real execution to a ledger file.

* a budget stop fails the workflow with ``BudgetExceededError``, recorded in
  the log as the run's outcome like on the local engine; ``start_run(...,
  budget=larger)`` continues it, with nothing executed twice;
* ``little_es_temporal.cancel_run`` records ``RunCancelled`` and cancels the
  workflow through Temporal; the step in flight keeps its result, the next
  step never starts, and ``start_run(..., resume_cancelled=True)`` finishes it.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
import traceback
import uuid
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from eventsourcing.persistence import OperationalError
from little_es_temporal import (
    DevServer,
    StepTimeouts,
    cancel_run,
    create_worker,
    start_run,
)
from temporalio.client import Client, WorkflowFailureError
from temporalio.exceptions import CancelledError

import tests._temporal_support as _support
from little_es.events import RunCancelled, RunFailed, StepFailed, ToolCallSucceeded
from little_es.replay import replay_run
from little_es.values import Budget
from little_es.world import World, local_world
from tests import _operate_proc as op

# The shared fixtures, bound to the names pytest finds them by.
dev_server = _support.dev_server
client = _support.client

pytestmark = [pytest.mark.temporal, pytest.mark.timeout(300)]

_FAST = StepTimeouts(heartbeat=timedelta(seconds=1))


@pytest.fixture
def ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "ledger"
    monkeypatch.setattr(op, "_ledger", path)
    return path


def _ledger(path: Path) -> Counter[str]:
    if not path.exists():
        return Counter()
    return Counter(line.split(" ", 1)[1] for line in path.read_text().splitlines())


def _run_events(world: World, run_id: str) -> list[object]:
    stream = world.load_run(run_id).id
    return [e for e in world.read_run_log(run_id) if e.originator_id == stream]


async def test_a_budget_stop_on_temporal_and_its_resume_with_a_larger_budget(
    client: Client, tmp_path: Path, ledger: Path
) -> None:
    queue = f"q-{uuid.uuid4().hex[:12]}"
    with local_world(tmp_path / "world") as world:
        worker = create_worker(client, world, workflows=[op.AGENT], task_queue=queue)
        async with worker:
            handle = await start_run(
                client,
                op.AGENT,
                {},
                run_id="run_t_budget",
                task_queue=queue,
                timeouts=_FAST,
                budget=Budget(model_calls=2),
            )
            with pytest.raises(WorkflowFailureError) as failure:
                await handle.result()
            assert "BudgetExceededError" in repr(failure.value.cause.cause)  # type: ignore[union-attr]
            state = replay_run(world, "run_t_budget").state
            assert state.status == "budget_exceeded" and state.stopped_step_path == "plan"
            assert not any(
                isinstance(e, StepFailed | RunFailed) for e in _run_events(world, "run_t_budget")
            )
            assert _ledger(ledger) == Counter(
                {"step fetch": 1, "model 1": 1, "tool q1": 1, "model 2": 1, "tool q2": 1}
            )
            again = await start_run(
                client,
                op.AGENT,
                run_id="run_t_budget",
                task_queue=queue,
                timeouts=_FAST,
                budget=Budget(model_calls=10),
            )
            await again.result()
        await asyncio.sleep(0.2)
        assert replay_run(world, "run_t_budget").state.status == "completed"
    expected = Counter({"step fetch": 1, "step finish": 1})
    expected.update({f"model {t}": 1 for t in range(1, 6)})
    expected.update({f"tool q{t}": 1 for t in range(1, 5)})
    assert _ledger(ledger) == expected


async def test_the_check_before_each_call_on_temporal_is_read_by_the_commit_before_it(
    client: Client, tmp_path: Path, ledger: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As on the local engine: no query of its own before a model call or a batch of tool
    calls, the commit of the call's write-ahead record read the run's stream."""
    asked_before_calls = 0
    real = World.has_events_after

    def counted(self: World, stream_id: uuid.UUID, version: int) -> bool:
        nonlocal asked_before_calls
        callers = {frame.name for frame in traceback.extract_stack()}
        asked_before_calls += bool(callers & {"before_model_call", "before_tool_calls"})
        return real(self, stream_id, version)

    monkeypatch.setattr(World, "has_events_after", counted)
    queue = f"q-{uuid.uuid4().hex[:12]}"
    with local_world(tmp_path / "world") as world:
        worker = create_worker(client, world, workflows=[op.AGENT], task_queue=queue)
        async with worker:
            handle = await start_run(
                client, op.AGENT, {}, run_id="run_t_watch", task_queue=queue, timeouts=_FAST
            )
            await handle.result()
        await asyncio.sleep(0.2)
        assert replay_run(world, "run_t_watch").state.status == "completed"
    assert _ledger(ledger)["model 5"] == 1  # five model calls and four tool calls, each checked
    assert asked_before_calls == 0


async def test_cancel_on_temporal_stops_before_the_next_step_and_resumes_when_asked(
    client: Client, tmp_path: Path, ledger: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(op, "_sleep_s", 2.0)
    queue = f"q-{uuid.uuid4().hex[:12]}"
    with local_world(tmp_path / "world") as world:
        worker = create_worker(client, world, workflows=[op.SLOW], task_queue=queue)
        async with worker:
            handle = await start_run(
                client, op.SLOW, {}, run_id="run_t_cancel", task_queue=queue, timeouts=_FAST
            )
            deadline = time.monotonic() + 30
            while "step slow" not in _ledger(ledger):
                assert time.monotonic() < deadline
                await asyncio.sleep(0.02)
            event = await cancel_run(client, world, "run_t_cancel", reason="not needed")
            assert isinstance(event, RunCancelled) and event.engine == "temporal"
            with pytest.raises(WorkflowFailureError) as failure:
                await handle.result()
            assert isinstance(failure.value.cause, CancelledError)
            # The step in flight finishes and keeps its result; the next never starts.
            deadline = time.monotonic() + 30
            while replay_run(world, "run_t_cancel").state.steps["slow"].status != "completed":
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)
            await asyncio.sleep(1.0)
            assert _ledger(ledger) == Counter({"step first": 1, "step slow": 1})
            state = replay_run(world, "run_t_cancel").state
            assert state.status == "cancelled" and state.stop_reason == "not needed"
            refused = await start_run(client, op.SLOW, run_id="run_t_cancel", task_queue=queue)
            with pytest.raises(WorkflowFailureError) as failure:
                await refused.result()
            assert "not resumed by accident" in str(failure.value.cause.cause)  # type: ignore[union-attr]
            resumed = await start_run(
                client,
                op.SLOW,
                run_id="run_t_cancel",
                task_queue=queue,
                resume_cancelled=True,
            )
            await resumed.result()
        await asyncio.sleep(0.2)
        assert replay_run(world, "run_t_cancel").state.status == "completed"
    assert _ledger(ledger) == Counter({"step first": 1, "step slow": 1, "step last": 1})


async def test_a_cancel_on_temporal_stops_the_sub_run_after_its_step_in_flight(
    client: Client, tmp_path: Path, ledger: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As locally: the child's step in flight keeps its result, its next one never
    # starts, and it goes on when its parent is resumed.
    monkeypatch.setattr(op, "_sleep_s", 2.0)
    queue = f"q-{uuid.uuid4().hex[:12]}"
    with local_world(tmp_path / "world") as world:
        worker = create_worker(client, world, workflows=[op.NESTED], task_queue=queue)
        async with worker:
            handle = await start_run(
                client, op.NESTED, {}, run_id="run_t_nested", task_queue=queue, timeouts=_FAST
            )
            deadline = time.monotonic() + 30
            while "step slow" not in _ledger(ledger):
                assert time.monotonic() < deadline
                await asyncio.sleep(0.02)
            await cancel_run(client, world, "run_t_nested", reason="not needed")
            with pytest.raises(WorkflowFailureError) as failure:
                await handle.result()
            assert isinstance(failure.value.cause, CancelledError)
            (sub_id,) = replay_run(world, "run_t_nested").state.sub_run_ids
            deadline = time.monotonic() + 30
            while replay_run(world, sub_id).state.steps["slow"].status != "completed":
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)
            await asyncio.sleep(1.0)
            assert _ledger(ledger) == Counter({"step start": 1, "step first": 1, "step slow": 1})
            sub = replay_run(world, sub_id).state
            assert sub.status == "running" and "last" not in sub.steps
            assert replay_run(world, "run_t_nested").state.status == "cancelled"
            for run_id in ("run_t_nested", sub_id):
                events = _run_events(world, run_id)
                assert not any(isinstance(e, StepFailed | RunFailed) for e in events)
            resumed = await start_run(
                client,
                op.NESTED,
                run_id="run_t_nested",
                task_queue=queue,
                timeouts=_FAST,
                resume_cancelled=True,
            )
            await resumed.result()
        await asyncio.sleep(0.2)
        assert replay_run(world, "run_t_nested").state.status == "completed"
    assert _ledger(ledger) == Counter(
        {"step start": 1, "step first": 1, "step slow": 1, "step last": 1, "step end": 1}
    )


async def test_a_budget_over_a_sub_run_on_temporal_stops_the_parent_as_locally_with_no_failure(
    client: Client, tmp_path: Path, ledger: Path
) -> None:
    queue = f"q-{uuid.uuid4().hex[:12]}"
    with local_world(tmp_path / "world") as world:
        worker = create_worker(client, world, workflows=[op.TREE], task_queue=queue)
        async with worker:
            handle = await start_run(
                client,
                op.TREE,
                {},
                run_id="run_t_tree",
                task_queue=queue,
                timeouts=_FAST,
                budget=Budget(model_calls=2),
            )
            with pytest.raises(WorkflowFailureError):
                await handle.result()
            (sub_id,) = replay_run(world, "run_t_tree").state.sub_run_ids
            assert replay_run(world, sub_id).state.status == "budget_exceeded"
            parent = replay_run(world, "run_t_tree").state
            assert parent.steps["sub"].status == "running"  # in flight, not failed
            # The stop is the parent's own outcome too, as locally.
            assert parent.status == "budget_exceeded" and parent.stopped_step_path == "sub"
            assert not any(
                isinstance(e, StepFailed | RunFailed) for e in _run_events(world, "run_t_tree")
            )
            again = await start_run(
                client,
                op.TREE,
                run_id="run_t_tree",
                task_queue=queue,
                timeouts=_FAST,
                budget=Budget(model_calls=10),
            )
            await again.result()
        await asyncio.sleep(0.2)
        assert replay_run(world, "run_t_tree").state.status == "completed"
    expected = Counter({"step start": 1, "step fetch": 1, "step finish": 1})
    expected.update({f"model {t}": 1 for t in range(1, 6)})
    expected.update({f"tool q{t}": 1 for t in range(1, 5)})
    assert _ledger(ledger) == expected


async def test_little_cancel_with_temporal_cancels_the_workflow(
    client: Client,
    dev_server: DevServer,
    tmp_path: Path,
    ledger: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(op, "_sleep_s", 5.0)  # longer than the command takes to start
    queue = f"q-{uuid.uuid4().hex[:12]}"
    url = f"sqlite:///{tmp_path / 'world'}"
    with local_world(tmp_path / "world") as world:
        worker = create_worker(client, world, workflows=[op.SLOW], task_queue=queue)
        async with worker:
            handle = await start_run(
                client, op.SLOW, {}, run_id="run_t_cli", task_queue=queue, timeouts=_FAST
            )
            while "step slow" not in _ledger(ledger):
                await asyncio.sleep(0.02)
            repo = Path(__file__).resolve().parents[1]
            env = {
                **os.environ,
                "PYTHONPATH": os.pathsep.join([str(repo), str(repo / "adapters")]),
            }
            done = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "little_es.cli",
                "cancel",
                "run_t_cli",
                "--reason",
                "from the command line",
                "--temporal",
                dev_server.address,
                "--world",
                url,
                env=env,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
            )
            out, _ = await done.communicate()
            assert done.returncode == 0, out.decode()
            assert "recorded RunCancelled (and its Temporal workflow)" in out.decode()
            with pytest.raises(WorkflowFailureError) as failure:
                await handle.result()
            assert isinstance(failure.value.cause, CancelledError)
            deadline = time.monotonic() + 30
            while replay_run(world, "run_t_cli").state.steps["slow"].status != "completed":
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)
        await asyncio.sleep(0.2)
        state = replay_run(world, "run_t_cli").state
        assert state.status == "cancelled" and state.stop_reason == "from the command line"
    assert "step last" not in _ledger(ledger)


async def test_a_failed_commit_inside_an_agent_step_on_temporal_spends_nothing(
    client: Client, tmp_path: Path, ledger: Path
) -> None:
    """The database failing a harness call's commit (``WorldStorageError``) is not the step's
    failure on Temporal either: the activity is retried, the attempt in flight continues in
    the same session, and no model call is made twice."""
    queue = f"q-{uuid.uuid4().hex[:12]}"
    with local_world(tmp_path / "world") as world:
        recorder = world.app.recorder
        real = recorder.insert_events
        failed: list[int] = []

        def insert_events(stored: Any, **kwargs: Any) -> Any:
            if not failed and any(s.topic == ToolCallSucceeded.wire_name for s in stored):
                failed.append(1)
                raise OperationalError("server closed the connection unexpectedly")
            return real(stored, **kwargs)

        recorder.insert_events = insert_events  # type: ignore[method-assign]
        worker = create_worker(client, world, workflows=[op.AGENT], task_queue=queue)
        async with worker:
            handle = await start_run(
                client, op.AGENT, {}, run_id="run_t_storage", task_queue=queue, timeouts=_FAST
            )
            await handle.result()
        await asyncio.sleep(0.2)
        assert failed == [1]
        state = replay_run(world, "run_t_storage").state
        assert state.status == "completed"
        assert state.steps["plan"].attempts == 1
        assert not any(
            isinstance(e, StepFailed | RunFailed) for e in _run_events(world, "run_t_storage")
        )
    calls = _ledger(ledger)
    assert all(calls[f"model {t}"] == 1 for t in range(1, 6))
    # q1's result was the commit that failed: q1 ran again, once; every other call once.
    assert calls["tool q1"] == 2
    assert all(calls[f"tool q{t}"] == 1 for t in range(2, 5))

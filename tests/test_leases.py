"""A driver that loses its run's lease stops before it executes anything more.

Before every step, model call, tool call and append, the driver checks its lease
(:func:`~little_es.backends.base.check_leases`). Here a lease is lost the two ways the
issue names: taken from a live driver (``little unlock --force``: the SQLite lock file
replaced, the PostgreSQL backend holding the advisory lock terminated), and taken from
a driver that is alive but stuck (SIGSTOPped) which then wakes up after a second
process completed the run. Real processes, real SQLite files and the real PostgreSQL
server; a ledger file outside the processes, one line per execution start and end,
shows that no step, model call or tool call ran in two processes at once.
"""

from __future__ import annotations

import contextvars
import dataclasses
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest
from psycopg import sql
from typer.testing import CliRunner

from little_es.backends.mysql import MySQLBackend, MySQLRunLeases
from little_es.backends.postgres import PostgresRunLeases
from little_es.cli import app
from little_es.durability import RunRecorder
from little_es.engine.executor import sub_run_id_for
from little_es.engine.local import run_workflow
from little_es.errors import (
    ConcurrencyConflictError,
    ConcurrentRunError,
    LeaseLostError,
    ModelError,
    RunFailedError,
    WorldConfigError,
)
from little_es.events import RunFailed, StepCompleted, StepFailed
from little_es.harness.model import ScriptedModel, ScriptedReply
from little_es.harness.tools import ToolContext, tool
from little_es.ids import session_stream_id, step_lease_id
from little_es.orchestrator import start_workflow_tool, sub_run_id_for_call
from little_es.replay import replay_run
from little_es.values import ModelRequest, ModelResponse, ToolCall, Usage
from little_es.workflow.authoring import Workflow, agent, subworkflow, task
from little_es.workflow.ir import RetryPolicy
from little_es.world import World
from tests.conftest import WorldSpec

REPO = Path(__file__).resolve().parent.parent
CHILD = REPO / "tests" / "_lease_proc.py"
RUN_ID = "run_lease_loss"  # the child's run

persistent = pytest.mark.backends("sqlite", "postgres")


# ------------------------------------------------------------------ processes


def _env(spec: WorldSpec) -> dict[str, str]:
    return {
        **os.environ,
        "LITTLE_ES_WORLD": spec.url,
        "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "adapters")]),
    }


def _driver(spec: WorldSpec, ledger: Path, label: str, stop_after: int | None = None) -> Any:
    args = [sys.executable, str(CHILD), str(ledger), label]
    if stop_after is not None:
        args.append(str(stop_after))
    return subprocess.Popen(
        args, env=_env(spec), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _finish(proc: Any) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    code: int = proc.returncode
    return code, out, err


def _unlock(spec: WorldSpec, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "little_es.cli", "unlock", RUN_ID, "--world", spec.url, *args],
        env=_env(spec),
        capture_output=True,
        text=True,
        timeout=60,
    )


def _ledger(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line]


def _mark(path: Path, event: str) -> None:
    with path.open("ab") as f:
        f.write(orjson.dumps({"label": "test", "ev": event}) + b"\n")


def _wait_for(what: str, condition: Callable[[], bool], *procs: Any) -> None:
    deadline = time.monotonic() + 60
    while not condition():
        for proc in procs:
            assert proc.poll() is None, f"a driver exited before {what}: {proc.communicate()}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


def _stopped(pid: int) -> bool:
    # /proc/PID/stat: "pid (comm) STATE ..."; T is stopped by a signal.
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"


def _assert_nothing_ran_twice_at_once(lines: list[dict[str, Any]]) -> None:
    """No execution of one process overlaps (in ledger order) one of another process."""
    intervals: list[tuple[int, int, int, str]] = []
    open_at: dict[tuple[int, str, str], int] = {}
    for i, line in enumerate(lines):
        if line["label"] == "test":
            continue
        key = (line["pid"], line["kind"], line["name"])
        if line["ev"] == "start":
            assert key not in open_at, f"{key} started twice in one process"
            open_at[key] = i
        else:
            intervals.append((open_at.pop(key), i, line["pid"], f"{line['kind']} {line['name']}"))
    # A driver stops only between executions: nothing is left open.
    assert not open_at, f"executions without an end: {open_at}"
    for a_start, a_end, a_pid, a_what in intervals:
        for b_start, b_end, b_pid, b_what in intervals:
            if a_pid != b_pid:
                assert not (a_start < b_end and b_start < a_end), (
                    f"{a_what} in pid {a_pid} (ledger lines {a_start}-{a_end}) overlaps"
                    f" {b_what} in pid {b_pid} (lines {b_start}-{b_end})"
                )


def _assert_completed_once(world: World) -> None:
    replay = replay_run(world, RUN_ID)
    assert replay.state.status == "completed"
    assert sorted(replay.completed_step_paths) == sorted(
        ["t1", "t2", "t3", "t4", "agent", "t5", "t6"]
    )
    # One attempt of every step: the lost lease cost no StepFailed, no new session.
    assert all(step.attempts == 1 for step in replay.state.steps.values())
    assert not any(isinstance(e, StepFailed | RunFailed) for e in world.read_run_log(RUN_ID))
    session = world.load_session(session_stream_id(RUN_ID, "agent", 1))
    assert session is not None and session.completed is not None
    assert len(session.responses) == 7 and len(session.tool_results) == 6


def _rows(world: World) -> int:
    return len(world.read_run_log(RUN_ID))


# ------------------------------------------------------------------ the tests


@persistent
@pytest.mark.parametrize(
    "lose_at",
    [
        pytest.param(("step", "t3"), id="during-task-steps"),
        pytest.param(("tool", "c2"), id="during-the-agent-session"),
    ],
)
def test_a_live_driver_that_loses_its_lease_stops_and_another_takes_over(
    world_spec: WorldSpec, world: World, tmp_path: Path, lose_at: tuple[str, str]
) -> None:
    ledger = tmp_path / "ledger.jsonl"
    first = _driver(world_spec, ledger, "first")
    second = None
    try:
        kind, name = lose_at
        _wait_for(
            f"{kind} {name} to start",
            lambda: any(
                line["kind"] == kind and line["name"] == name and line["ev"] == "start"
                for line in _ledger(ledger)
            ),
            first,
        )
        # What `little unlock --force` does (the stuck-driver test runs the command),
        # in this process: the command's own start-up would outlast the run.
        holder = world.break_lease(RUN_ID)
        assert holder is not None and f"pid {first.pid}" in holder
        _mark(ledger, "unlocked")
        # The second driver starts at once, while the first may still be alive.
        second = _driver(world_spec, ledger, "second")
        code, _, err = _finish(first)
        assert code == 2 and err.startswith("LeaseLostError"), err
        code, out, err = _finish(second)
        assert code == 0 and out.strip() == "completed", err
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.communicate()
    lines = _ledger(ledger)
    _assert_nothing_ran_twice_at_once(lines)
    marker = next(i for i, line in enumerate(lines) if line["ev"] == "unlocked")
    first_pid = first.pid
    late = [
        line for line in lines[marker:] if line.get("pid") == first_pid and line["ev"] == "start"
    ]
    # At most the one execution whose check passed just before the lease was taken.
    assert len(late) <= 1, late
    assert any(line.get("pid") == second.pid for line in lines)
    _assert_completed_once(world)


@persistent
@pytest.mark.parametrize(
    "stop_after",
    [pytest.param(3, id="stuck-in-task-t3"), pytest.param(7, id="stuck-after-model-turn-2")],
)
def test_a_stuck_driver_is_unlocked_and_fenced_off_when_it_wakes(
    world_spec: WorldSpec, world: World, tmp_path: Path, stop_after: int
) -> None:
    ledger = tmp_path / "ledger.jsonl"
    stuck = _driver(world_spec, ledger, "stuck", stop_after=stop_after)
    try:
        _wait_for("the driver to stop itself", lambda: _stopped(stuck.pid), stuck)
        shown = _unlock(world_spec)
        assert shown.returncode == 1 and f"pid {stuck.pid}" in shown.stdout, shown
        assert "--force" in shown.stdout
        taken = _unlock(world_spec, "--force")
        assert taken.returncode == 0 and f"pid {stuck.pid}" in taken.stdout, taken
        _mark(ledger, "unlocked")
        code, out, err = _finish(_driver(world_spec, ledger, "second"))
        assert code == 0 and out.strip() == "completed", err
        rows = _rows(world)
        sessions = len(world.read_stream(session_stream_id(RUN_ID, "agent", 1)))
        _mark(ledger, "woken")
        stuck.send_signal(signal.SIGCONT)
        code, _, err = _finish(stuck)
    finally:
        if stuck.poll() is None:
            os.kill(stuck.pid, signal.SIGCONT)
            stuck.kill()
            stuck.communicate()
    # It woke inside a step (or a model call) whose result it must not record.
    assert code == 2 and err.startswith("LeaseLostError"), err
    assert _rows(world) == rows
    assert len(world.read_stream(session_stream_id(RUN_ID, "agent", 1))) == sessions
    lines = _ledger(ledger)
    woken = next(i for i, line in enumerate(lines) if line["ev"] == "woken")
    assert not [line for line in lines[woken:] if line["label"] != "test"]
    _assert_nothing_ran_twice_at_once(lines)
    _assert_completed_once(world)


@persistent
def test_a_stale_append_after_takeover_fails_the_version_check(
    world_factory: Callable[[], World],
) -> None:
    stale_world, new_world = world_factory(), world_factory()
    with stale_world.run_lease("run_fenced"):
        stale = RunRecorder.start(
            stale_world,
            run_id="run_fenced",
            workflow_id="w",
            workflow_version="1",
            ir_hash="h",
            input={},
        )
        stale.step_started("a", step_id="a", kind="task", visit=1, attempt=1)
        # Taken from it while it runs step a, by a driver that resumes the run.
        assert new_world.break_lease("run_fenced") is not None

        def take_over() -> None:
            with new_world.run_lease("run_fenced"):
                resumed = RunRecorder.load(new_world, "run_fenced")
                assert resumed is not None
                resumed.step_completed("a", step_id="a", visit=1, attempt=1, output="new")

        # Another process: a context that does not hold the stale driver's lease.
        contextvars.Context().run(take_over)
        rows = len(new_world.read_run_log("run_fenced"))
        with pytest.raises(LeaseLostError, match="run_fenced"):
            stale.step_completed("a", step_id="a", visit=1, attempt=1, output="stale")
        # A check that passed a moment before the lease was taken (here: a context
        # holding no lease) leaves the stream's version check, which refuses it too.
        with pytest.raises(ConcurrencyConflictError):
            contextvars.Context().run(
                stale.step_completed, "a", step_id="a", visit=1, attempt=1, output="stale"
            )
    assert len(new_world.read_run_log("run_fenced")) == rows
    (step,) = replay_run(new_world, "run_fenced").steps
    assert (step.step_path, step.output) == ("a", "new")


@persistent
async def test_a_stale_commit_landing_before_the_new_driver_appended_is_not_recorded_twice(
    world_factory: Callable[[], World],
) -> None:
    """The stale driver's commit passed its lease check, then it got stuck (in the commit,
    SIGSTOPped); it lands while the new driver re-runs the step in flight, which has appended
    nothing yet, so the version check lets it through."""
    world, stale_world = world_factory(), world_factory()
    stale: list[RunRecorder] = []

    def x(ctx: Any) -> str:
        if stale:
            contextvars.Context().run(
                stale.pop().step_completed, "x", step_id="x", visit=1, attempt=1, output="stale"
            )
        return "new"

    ran: list[Any] = []
    flow = Workflow(
        "stale_commit",
        version="1",
        steps=[task("x", x), task("y", lambda ctx: ran.append(ctx.outputs["x"]) or "y")],
    )
    recorder = RunRecorder.start(
        stale_world,
        run_id="run_stale",
        workflow_id=flow.id,
        workflow_version="1",
        ir_hash=flow.ir_hash,
        input={},
    )
    recorder.step_started("x", step_id="x", kind="task", visit=1, attempt=1)
    stale.append(recorder)
    with pytest.raises(ConcurrentRunError, match="step 'x' was recorded by another process"):
        await run_workflow(world, flow, run_id="run_stale")
    completions = [
        e.output for e in world.read_run_log("run_stale") if isinstance(e, StepCompleted)
    ]
    assert completions == ["stale"] and ran == []
    done = await run_workflow(world, flow, run_id="run_stale")
    assert done.output == "y" and ran == ["stale"]
    assert done.state.visits == {"x": 1, "y": 1}


def _lossy_workflow(world: World, model: ScriptedModel, ledger: list[str]) -> Workflow:
    async def work(n: int, ctx: ToolContext) -> int:
        """Work; the first call loses the run's lease while it runs."""
        ledger.append(f"tool {ctx.call_id}")
        if "--" not in ledger:  # the first run, not the resume
            world.break_lease("run_lossy")
        return n

    return Workflow(
        "lossy",
        version="1",
        steps=[
            task("fetch", lambda ctx: ledger.append("step fetch") or "fetched"),
            agent("agent", model=model, tools=[tool(work)], prompt="work"),
            task("publish", lambda ctx: ledger.append("step publish") or "published"),
        ],
    )


SCRIPT = [
    ScriptedReply(
        tool_calls=(ToolCall(id="c1", name="work", arguments={"n": 1}),),
        usage=Usage(input_tokens=5),
    ),
    ScriptedReply(content="done", usage=Usage(input_tokens=7)),
]


async def test_a_lost_lease_is_a_refusal_and_the_same_session_continues(world: World) -> None:
    model = ScriptedModel(SCRIPT)
    ledger: list[str] = []
    with pytest.raises(LeaseLostError, match="run_lossy"):
        await run_workflow(world, _lossy_workflow(world, model, ledger), {}, run_id="run_lossy")
    # The model's turn 2 was never called, nothing of it (nor the tool result) appended.
    assert model.calls == 1 and ledger == ["step fetch", "tool c1"]
    session = world.load_session(session_stream_id("run_lossy", "agent", 1))
    assert session is not None and session.tool_results == {} and 2 not in session.called
    events = world.read_run_log("run_lossy")
    assert not any(isinstance(e, StepFailed | RunFailed) for e in events)
    ledger.append("--")
    ledger_before = len(ledger)
    done = await run_workflow(world, _lossy_workflow(world, model, ledger), run_id="run_lossy")
    assert done.output == "published"
    # The same attempt and session: turn 1 answered from the log, only the call in
    # flight (c1, whose result was not recorded) ran again, idempotency_key's case.
    assert model.calls == 2
    assert ledger[ledger_before:] == ["tool c1", "step publish"]
    assert replay_run(world, "run_lossy").state.steps["agent"].attempts == 1


async def test_a_model_call_retried_after_the_lease_was_lost_is_not_made(world: World) -> None:
    calls: list[str] = []

    class _Flaky:
        provider, model_id = "scripted", "flaky"

        async def complete(self, request: ModelRequest) -> ModelResponse:
            calls.append("call")
            if len(calls) == 1:
                # Lost while this call is out: the driver that takes the run makes it.
                world.break_lease("run_flaky")
                raise ModelError("429: slow down", retryable=True, provider="scripted", status=429)
            return ModelResponse(content="ok", provider="scripted", model="flaky")

    flow = Workflow(
        "flaky",
        version="1",
        steps=[
            agent(
                "a",
                model=_Flaky(),
                prompt="hi",
                retry=RetryPolicy(max_attempts=3, initial_backoff_s=0.01),
            )
        ],
    )
    with pytest.raises(LeaseLostError, match="run_flaky"):
        await run_workflow(world, flow, {}, run_id="run_flaky")
    # Not retried in place without the lease; nothing recorded as a failure.
    assert calls == ["call"]
    assert not any(isinstance(e, StepFailed | RunFailed) for e in world.read_run_log("run_flaky"))
    done = await run_workflow(world, flow, run_id="run_flaky")
    assert done.output == "ok" and calls == ["call", "call"]
    assert replay_run(world, "run_flaky").state.steps["a"].attempts == 1


@pytest.mark.backends("sqlite")
def test_unlock_takes_the_leases_of_a_runs_steps_in_flight(
    world: World, world_spec: WorldSpec
) -> None:
    """A Temporal worker holds a lease per step: `little unlock` finds the steps in flight."""
    recorder = RunRecorder.start(
        world, run_id="run_steps", workflow_id="w", workflow_version="1", ir_hash="h", input={}
    )
    recorder.step_started("a", step_id="a", kind="task", visit=1, attempt=1)
    with world.run_lease(step_lease_id("run_steps", "a")) as step_lease:
        shown = CliRunner().invoke(app, ["unlock", "run_steps", "--world", world_spec.url])
        assert shown.exit_code == 1
        assert f"step a of run run_steps: its lease is held by pid {os.getpid()}" in shown.stdout
        taken = CliRunner().invoke(
            app, ["unlock", "run_steps", "--force", "--world", world_spec.url]
        )
        assert taken.exit_code == 0, taken.output
        assert "step a of run run_steps: took the lease" in taken.stdout
        with pytest.raises(LeaseLostError):
            step_lease.check()
    again = CliRunner().invoke(app, ["unlock", "run_steps", "--world", world_spec.url])
    assert again.exit_code == 0 and "no process holds its lease" in again.stdout


@pytest.mark.backends("sqlite", "postgres")
def test_unlock_takes_the_leases_of_a_runs_sub_runs(world: World, world_spec: WorldSpec) -> None:
    """A driver stuck in a sub-run holds its lease too: the resumed parent would stop there."""
    parent = RunRecorder.start(
        world, run_id="run_up", workflow_id="w", workflow_version="1", ir_hash="h", input={}
    )
    parent.step_started("sub", step_id="sub", kind="subworkflow", visit=1, attempt=1)
    parent.sub_run_reserved("sub", sub_run_id="run_down", workflow_id="c")
    child = RunRecorder.start(
        world,
        run_id="run_down",
        workflow_id="c",
        workflow_version="1",
        ir_hash="h",
        input={},
        parent_run_id="run_up",
        parent_step_path="sub",
    )
    child.step_started("a", step_id="a", kind="task", visit=1, attempt=1)
    with world.run_lease("run_up") as own, world.run_lease("run_down") as sub_lease:
        shown = CliRunner().invoke(app, ["unlock", "run_up", "--world", world_spec.url])
        assert shown.exit_code == 1
        assert "sub-run run_down of run run_up: its lease is held by" in shown.stdout
        taken = CliRunner().invoke(app, ["unlock", "run_up", "--force", "--world", world_spec.url])
        assert taken.exit_code == 0, taken.output
        assert "sub-run run_down of run run_up: took the lease" in taken.stdout
        for lease in (own, sub_lease):
            with pytest.raises(LeaseLostError):
                lease.check()


@pytest.mark.backends("postgres")
def test_unlock_without_the_right_to_terminate_the_holder_says_so(
    world: World, world_spec: WorldSpec
) -> None:
    assert world_spec.schema is not None
    role = f"little_es_test_{uuid.uuid4().hex[:8]}"
    with world_spec.connect_postgres() as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
    try:
        info = psycopg.conninfo.conninfo_to_dict(world_spec.dsn)
        restricted = PostgresRunLeases(
            f"dbname={info['dbname']} host={info.get('host', '127.0.0.1')}"
            f" port={info.get('port', 5432)} user={role}",
            scope=world_spec.schema,
        )
        with world.run_lease("run_held") as lease:
            assert restricted.holder("run_held") is not None
            with pytest.raises(WorldConfigError, match="pg_signal_backend"):
                restricted.break_lease("run_held")
            lease.check()
    finally:
        with world_spec.connect_postgres() as conn:
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


@pytest.mark.backends("mariadb")
def test_mysql_unlock_without_the_right_to_kill_the_holder_says_so(
    world: World, world_spec: WorldSpec
) -> None:
    assert world_spec.database is not None
    user = f"little_es_test_{uuid.uuid4().hex[:8]}"
    with world_spec.connect_mysql() as conn, conn.cursor() as cur:
        cur.execute(f"CREATE USER '{user}'@'%'")
        cur.execute(f"GRANT SELECT, INSERT, UPDATE ON `{world_spec.database}`.* TO '{user}'@'%'")
    try:
        backend = world.backend
        assert isinstance(backend, MySQLBackend)
        info = backend.leases._info  # type: ignore[attr-defined]
        restricted = MySQLRunLeases(dataclasses.replace(info, user=user, password=""))
        with world.run_lease("run_held") as lease:
            assert restricted.holder("run_held") is not None
            with pytest.raises(WorldConfigError, match="CONNECTION ADMIN"):
                restricted.break_lease("run_held")
            lease.check()
    finally:
        with world_spec.connect_mysql() as conn, conn.cursor() as cur:
            cur.execute(f"DROP USER '{user}'@'%'")


# ------------------------------------------- a sub-run driven by another process


def _hold_elsewhere(world: World, run_id: str) -> Any:
    """Hold ``run_id``'s lease as another process would: outside this context's leases."""
    held = world.run_lease(run_id)
    contextvars.Context().run(held.__enter__)
    return held


async def test_a_sub_run_driven_elsewhere_stops_the_parent_without_a_step_failure(
    world: World,
) -> None:
    ran: list[str] = []
    child = Workflow("leased_child", version="1", steps=[task("c", lambda ctx: ran.append("c"))])
    parent = Workflow(
        "leased_parent",
        version="1",
        steps=[task("p", lambda ctx: ran.append("p") or "p"), subworkflow("sub", child)],
    )
    held = _hold_elsewhere(world, sub_run_id_for("run_parent", "sub"))
    try:
        with pytest.raises(ConcurrentRunError, match="another process"):
            await run_workflow(world, parent, {}, run_id="run_parent")
    finally:
        contextvars.Context().run(held.__exit__, None, None, None)
    # Nothing recorded as the step's failure: no retry spent, no RunFailed.
    assert not any(isinstance(e, StepFailed | RunFailed) for e in world.read_run_log("run_parent"))
    done = await run_workflow(world, parent, run_id="run_parent")
    assert done.state.status == "completed" and ran == ["p", "c"]
    assert replay_run(world, "run_parent").state.steps["sub"].attempts == 1


async def test_a_start_workflow_call_whose_sub_run_is_driven_elsewhere_is_not_its_failure(
    world: World,
) -> None:
    child = Workflow("leased_work", version="1", steps=[task("w", lambda ctx: "worked")])
    script = [
        ScriptedReply(
            tool_calls=(
                ToolCall(id="c1", name="start_workflow", arguments={"workflow_id": "leased_work"}),
            )
        ),
        ScriptedReply(content="done"),
    ]
    model = ScriptedModel(script)
    flow = Workflow(
        "leased_orchestrator",
        version="1",
        steps=[agent("boss", model=model, tools=[start_workflow_tool([child])], prompt="go")],
    )
    session_id = session_stream_id("run_boss", "boss", 1)
    held = _hold_elsewhere(world, sub_run_id_for_call("run_boss", str(session_id), "c1"))
    try:
        with pytest.raises(ConcurrentRunError, match="another process"):
            await run_workflow(world, flow, {}, run_id="run_boss")
    finally:
        contextvars.Context().run(held.__exit__, None, None, None)
    session = world.load_session(session_id)
    # The call stays in flight: no tool_call.failed shown to the model, no StepFailed.
    assert session is not None and session.tool_results == {}
    assert not any(isinstance(e, StepFailed | RunFailed) for e in world.read_run_log("run_boss"))
    done = await run_workflow(world, flow, run_id="run_boss")
    assert done.output == "done" and model.calls == 2
    assert replay_run(world, "run_boss").state.steps["boss"].attempts == 1


async def test_a_run_its_own_code_finds_driven_elsewhere_is_the_steps_failure(
    world: World,
) -> None:
    """Only little_es's own hosting stops the run: the step's code meeting another
    process's run is a failure of the step, retried by its policy like any other."""
    calls: list[int] = []
    job = Workflow("job", version="1", steps=[task("work", lambda ctx: "worked")])

    async def launch(ctx: Any) -> Any:
        calls.append(ctx.attempt)
        return (await run_workflow(world, job, {}, run_id="run_job")).output

    parent = Workflow(
        "launcher",
        version="1",
        steps=[task("launch", launch, retry=RetryPolicy(max_attempts=2, initial_backoff_s=0))],
    )
    held = _hold_elsewhere(world, "run_job")
    try:
        with pytest.raises(RunFailedError) as failed:
            await run_workflow(world, parent, {}, run_id="run_launcher")
    finally:
        contextvars.Context().run(held.__exit__, None, None, None)
    assert failed.value.error.type == "ConcurrentRunError"
    assert calls == [1, 2]

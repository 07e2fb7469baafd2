"""Forks in one process: what a fork copies, what resuming it re-uses, what is refused.

Every test runs a real origin run (``tests/_fork_proc.py``'s workflows, whose
steps, model calls and tool calls write a ledger file as they execute), forks
it with :func:`~little_es.fork.fork_run` and resumes the fork with
``run_workflow``; the ledger of the fork's resume shows what executed again.
The kill test (a fork's first resume SIGKILLed) is ``test_fork_kill.py``.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from little_es.backends.base import RunSummary
from little_es.chain import DIGEST_SIZE, FRAME_SIZE, LINK_SIZE
from little_es.cli import app
from little_es.diff import diff_runs
from little_es.durability import cancel_run
from little_es.engine.local import run_workflow
from little_es.errors import (
    CapabilityDriftError,
    ForkError,
    ForkPointError,
    ForkRunExistsError,
    InvalidRunIdError,
    RunCancelledError,
    RunFailedError,
    RunNotFoundError,
    WorkflowChangedError,
)
from little_es.events import (
    ModelCalled,
    ModelResponded,
    RunCompleted,
    RunForked,
    RunStarted,
    SessionStarted,
    StepStarted,
    ToolCallStarted,
    WorkflowAdopted,
)
from little_es.fork import fork_points, fork_run
from little_es.ids import run_stream_id, session_stream_id
from little_es.orchestrator import list_sub_runs
from little_es.projections import list_runs
from little_es.render import render_report
from little_es.replay import replay_run
from little_es.ui.html import run_body
from little_es.ui.pages import run_page
from little_es.verify import verify_world
from little_es.workflow.authoring import Workflow, parallel, task
from little_es.workflow.context import StepContext
from little_es.workflow.ir import RetryPolicy
from little_es.world import World
from tests import _fork_proc as proc
from tests.conftest import WorldSpec

ORIGIN = "run_origin"
FORK = "run_fork"


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[Path]:
    """The ledger this process's steps, model calls and tool calls write to."""
    path = tmp_path / "ledger"
    proc.LEDGER[:] = [path]
    yield path
    proc.LEDGER.clear()


def _executed(ledger: Path) -> list[str]:
    """What ran since the last call (and empty the ledger)."""
    lines = proc.ledger_lines(ledger)
    ledger.unlink(missing_ok=True)
    return lines


def _origin(world: World, ledger: Path, workflow: Workflow = proc.FLOW) -> None:
    asyncio.run(run_workflow(world, workflow, {"topic": "cats"}, run_id=ORIGIN))
    _executed(ledger)


def _run(world: World, workflow: Workflow = proc.FLOW, run_id: str = FORK) -> object:
    return asyncio.run(run_workflow(world, workflow, run_id=run_id)).output


@pytest.mark.backends("memory", "sqlite", "postgres")
def test_a_fork_at_a_step_reuses_everything_before_it_and_runs_from_there(
    world: World, ledger: Path
) -> None:
    _origin(world, ledger)
    forked = fork_run(world, ORIGIN, at="finish", new_run_id=FORK)
    assert forked.run_id == FORK and forked.origin.origin_run_id == ORIGIN
    assert _executed(ledger) == []  # forking runs nothing
    events = world.read_stream(run_stream_id(FORK))
    assert isinstance(events[0], RunForked) and events[0].origin.step_path == "finish"
    assert isinstance(events[1], RunStarted) and events[1].run_id == FORK
    assert events[1].timestamp == world.read_stream(run_stream_id(ORIGIN))[0].timestamp
    assert len(events) == 1 + forked.origin.copied_events
    # The agent step's session is the fork's own stream, copied whole.
    session = world.read_stream(session_stream_id(FORK, "plan", 1))
    assert isinstance(session[0], SessionStarted) and session[0].run_id == FORK

    output = _run(world)
    assert _executed(ledger) == [f"step {FORK} finish"]
    assert output == _run(world, run_id=ORIGIN)
    # Same history and cost as the origin, step for step.
    assert diff_runs(world, FORK, ORIGIN).same
    assert replay_run(world, FORK).state.usage == replay_run(world, ORIGIN).state.usage
    console = Console(record=True, width=200)
    render_report(world, FORK, console)
    assert f"forked from {ORIGIN} at finish · re-uses fetch, sub, plan" in console.export_text()
    assert verify_world(world, FORK).ok
    # The runs read model folds the fork from its RunForked on, as replay does.
    summary = {s.run_id: s for s in list_runs(world)}[FORK]
    assert summary == RunSummary.of(FORK, replay_run(world, FORK).state)


@pytest.mark.backends("memory", "sqlite")
def test_a_fork_inside_an_agent_step_keeps_the_turns_before_it(world: World, ledger: Path) -> None:
    _origin(world, ledger)
    forked = fork_run(world, ORIGIN, at="plan#turn=3", new_run_id=FORK)
    session = world.read_stream(session_stream_id(FORK, "plan", 1))
    assert {e.turn for e in session if isinstance(e, ModelCalled | ModelResponded)} == {1, 2}
    assert [e.call_id for e in session if isinstance(e, ToolCallStarted)] == ["c1", "c2"]
    assert forked.origin.turn == 3 and forked.origin.sessions[0].copied_events == len(session)
    assert replay_run(world, FORK).state.steps["plan"].status == "running"

    _run(world)
    assert _executed(ledger) == [
        "model 3",
        f"tool {FORK} q3",
        "model 4",
        f"tool {FORK} q4",
        "model 5",
        f"step {FORK} finish",
    ]
    assert diff_runs(world, FORK, ORIGIN).same
    console = Console(record=True, width=200)
    render_report(world, FORK, console)
    assert "re-uses fetch, sub; plan turns 1-2" in console.export_text()


@pytest.mark.backends("memory", "sqlite")
def test_forks_keep_the_sub_runs_completed_before_the_fork_point(
    world: World, ledger: Path
) -> None:
    # A sub-run of a step before the fork point: the fork's sub-run too, never run again.
    _origin(world, ledger)
    origin_subs = [s.sub_run_id for s in list_sub_runs(world, ORIGIN)]
    fork_run(world, ORIGIN, at="plan", new_run_id=FORK)
    _run(world)
    executed = _executed(ledger)
    assert not [line for line in executed if " work" in line or "fetch" in line]
    assert executed.count(f"step {FORK} finish") == 1 and "model 1" in executed
    assert [s.sub_run_id for s in list_sub_runs(world, FORK)] == origin_subs

    # Sub-runs started by the kept turns of an orchestrator: kept; the later turn's: new.
    asyncio.run(run_workflow(world, proc.ORCH, {}, run_id="run_orch"))
    _executed(ledger)
    started = [s.sub_run_id for s in list_sub_runs(world, "run_orch")]
    assert len(started) == 3
    fork_run(world, "run_orch", at="fan#turn=3", new_run_id="run_orch_fork")
    _run(world, proc.ORCH, "run_orch_fork")
    subs = [s.sub_run_id for s in list_sub_runs(world, "run_orch_fork")]
    assert subs[:2] == started[:2] and subs[2] not in started
    assert _executed(ledger) == [
        "model 3",
        f"step {subs[2]} work",
        "model 4",
        "step run_orch_fork done",
    ]
    assert all(s.status == "completed" for s in list_sub_runs(world, "run_orch_fork"))


@pytest.mark.backends("memory", "sqlite")
def test_a_fork_runs_changed_code_and_input_after_its_fork_point_only(
    world: World, ledger: Path
) -> None:
    _origin(world, ledger)
    forked = fork_run(world, ORIGIN, at="finish", new_run_id=FORK, input={"topic": "dogs"})
    assert forked.origin.input_changed
    # Changed before the fork point: refused, with nothing appended.
    version = len(world.read_stream(run_stream_id(FORK)))
    with pytest.raises(WorkflowChangedError, match="first, not the fork point 'finish'"):
        _run(world, proc.FLOW_BEFORE)
    assert len(world.read_stream(run_stream_id(FORK))) == version
    assert _executed(ledger) == []

    output = _run(world, proc.FLOW_V2)
    assert _executed(ledger) == [f"step {FORK} finish", f"step {FORK} publish"]
    assert output == {"path": "publish", "topic": "dogs"}
    events = world.read_stream(run_stream_id(FORK))
    adopted = [e for e in events if isinstance(e, WorkflowAdopted)]
    assert len(adopted) == 1 and adopted[0].previous_ir_hash == proc.FLOW.ir_hash
    assert events.index(adopted[0]) == version  # before anything else was appended
    assert isinstance(events[-1], RunCompleted)
    # From there on the fork is pinned to the code it adopted, as any run is.
    with pytest.raises(WorkflowChangedError):
        _run(world, proc.FLOW)

    # An agent changed: fork at the step (it runs again), not inside it (its turns are kept).
    fork_run(world, ORIGIN, at="plan#turn=2", new_run_id="run_fork_turn")
    with pytest.raises(CapabilityDriftError):
        _run(world, proc.FLOW_PLAN_V2, "run_fork_turn")
    assert _executed(ledger) == []
    fork_run(world, ORIGIN, at="plan", new_run_id="run_fork_plan")
    assert _run(world, proc.FLOW_PLAN_V2, "run_fork_plan")["plan"] == "done, differently"  # type: ignore[index]
    executed = _executed(ledger)
    assert [line for line in executed if line.startswith("model")] == [
        f"model {t}" for t in range(1, 6)
    ]


def _boom(ctx: StepContext) -> None:
    raise RuntimeError("boom")


FAILING = Workflow(
    "fork-failing",
    steps=[task("fetch", lambda ctx: 1), task("boom", _boom, retry=RetryPolicy(max_attempts=1))],
)


@pytest.mark.backends("memory")
def test_fork_refusals_name_the_problem_and_write_nothing(world: World, ledger: Path) -> None:
    _origin(world, ledger)
    with pytest.raises(RunNotFoundError):
        fork_run(world, "run_nobody", at="fetch")
    with pytest.raises(InvalidRunIdError):
        fork_run(world, ORIGIN, at="fetch", new_run_id="../etc")
    with pytest.raises(ForkPointError, match="is not a step path"):
        fork_run(world, ORIGIN, at="fe tch")
    with pytest.raises(ForkPointError, match="is not STEP_PATH"):
        fork_run(world, ORIGIN, at="plan#turns=2")
    with pytest.raises(ForkPointError, match="branch of the parallel group"):
        fork_run(world, ORIGIN, at="check[a.py]/lint")
    with pytest.raises(
        ForkPointError,
        match=r"never reached in it\. It can be forked at a step it completed: fetch, sub,"
        r" plan \(plan#turn=1\.\.5\), finish",
    ):
        fork_run(world, ORIGIN, at="publish")
    with pytest.raises(ForkPointError, match="only an agent step has turns"):
        fork_run(world, ORIGIN, at="fetch#turn=1")
    with pytest.raises(ForkPointError, match=r"recorded 5 turn\(s\).*plan#turn=1\.\.5"):
        fork_run(world, ORIGIN, at="plan#turn=6")
    with pytest.raises(ForkError, match="input must be a mapping"):
        fork_run(world, ORIGIN, at="fetch", input=[1])  # type: ignore[arg-type]
    with pytest.raises(ForkError, match="must be a little_es World"):
        fork_run("memory://", ORIGIN, at="fetch")  # type: ignore[arg-type]
    assert not world.run_exists(FORK)
    fork_run(world, ORIGIN, at="fetch", new_run_id=FORK)
    with pytest.raises(ForkRunExistsError, match="exists already"):
        fork_run(world, ORIGIN, at="fetch", new_run_id=FORK)
    with pytest.raises(ForkRunExistsError):
        fork_run(world, ORIGIN, at="fetch", new_run_id=ORIGIN)

    with pytest.raises(RunFailedError):
        asyncio.run(run_workflow(world, FAILING, {}, run_id="run_failed"))
    with pytest.raises(ForkPointError, match=r"step 'boom' did not complete.*completed: fetch$"):
        fork_run(world, "run_failed", at="boom")
    assert fork_points(world, ORIGIN) == (
        "fetch",
        "sub",
        "plan",
        *(f"plan#turn={t}" for t in range(1, 6)),
        "finish",
    )
    # A generated fork id names its origin.
    assert fork_run(world, ORIGIN, at="sub").run_id.startswith(f"{ORIGIN}-fork-")


@pytest.mark.backends("sqlite")
def test_little_fork_on_the_command_line(world_spec: WorldSpec, world: World, ledger: Path) -> None:
    _origin(world, ledger)
    runner = CliRunner()
    done = runner.invoke(
        app,
        ["fork", ORIGIN, "--at", "plan#turn=3", "--new-run-id", FORK, "--world", world_spec.url],
    )
    assert done.exit_code == 0, done.output
    assert done.output.startswith(
        f"run {FORK}: forked from {ORIGIN} at plan#turn=3 · re-uses fetch, sub; plan turns 1-2"
    )
    assert f"little resume {FORK} --workflow" in done.output
    again = runner.invoke(
        app, ["fork", ORIGIN, "--at", "plan", "--new-run-id", FORK, "--world", world_spec.url]
    )
    assert again.exit_code == 1 and "exists already" in again.output
    bad = runner.invoke(
        app, ["fork", ORIGIN, "--at", "finish", "--input", "[1]", "--world", world_spec.url]
    )
    assert bad.exit_code == 1 and "must be a JSON object" in bad.output
    report = runner.invoke(app, ["report", FORK, "--world", world_spec.url])
    assert f"forked from {ORIGIN} at plan#turn=3" in report.output
    events = runner.invoke(app, ["events", FORK, "--world", world_spec.url])
    assert events.exit_code == 0 and "RunForked" in events.output
    verify = runner.invoke(app, ["verify", FORK, "--world", world_spec.url])
    assert verify.exit_code == 0 and f"run       {FORK}" in verify.output
    assert isinstance(world.read_stream(run_stream_id(FORK))[-1], StepStarted)


def _big(ctx: StepContext) -> str:
    proc.record(f"step {ctx.run_id} {ctx.step_path}")
    return "x" * 70_000  # stored as an artifact, not inline


def _lint(ctx: StepContext) -> str:
    proc.record(f"step {ctx.run_id} {ctx.step_path}")
    return f"{ctx.branch_value} ok"


WIDE = Workflow(
    "fork-wide",
    steps=[
        task("big", _big),
        parallel("check", branches=lambda ctx: {"a": 1, "b": 2}, step=task("lint", _lint)),
        task("last", proc._step),
    ],
)


@pytest.mark.backends("memory", "sqlite")
def test_a_forks_artifacts_are_its_own_and_a_group_forked_at_runs_its_branches_again(
    world: World, ledger: Path
) -> None:
    asyncio.run(run_workflow(world, WIDE, {}, run_id=ORIGIN))
    _executed(ledger)
    fork_run(world, ORIGIN, at="check", new_run_id=FORK)
    state = replay_run(world, FORK).state
    ref = state.steps["big"].output_ref
    assert ref is not None and ref.run_id == FORK
    _run(world, WIDE)
    assert sorted(_executed(ledger)) == [
        f"step {FORK} check[a]/lint",
        f"step {FORK} check[b]/lint",
        f"step {FORK} last",
    ]
    report = verify_world(world, FORK)
    assert report.ok and report.artifacts and all(a.run_id == FORK for a in report.artifacts)


@pytest.mark.backends("memory", "sqlite")
def test_a_fork_of_a_fork_and_the_state_of_a_fork_read_back_from_json(
    world: World, ledger: Path
) -> None:
    _origin(world, ledger)
    fork_run(world, ORIGIN, at="finish", new_run_id=FORK)
    _run(world, proc.FLOW_V2)
    _executed(ledger)
    second = fork_run(world, FORK, at="publish", new_run_id="run_fork_2")
    assert second.origin.origin_run_id == FORK
    # The copied WorkflowAdopted pins the second fork to the definition the first adopted.
    assert replay_run(world, "run_fork_2").state.ir_hash == proc.FLOW_V2.ir_hash
    _run(world, proc.FLOW_V2, "run_fork_2")
    assert _executed(ledger) == ["step run_fork_2 publish"]
    state = replay_run(world, "run_fork_2").state
    assert type(state).model_validate(state.model_dump(mode="json")) == state
    assert state.forked_from == second.origin


@pytest.mark.backends("memory")
def test_the_run_page_of_a_fork_links_its_origin(world: World, ledger: Path) -> None:
    _origin(world, ledger)
    fork_run(world, ORIGIN, at="plan#turn=2", new_run_id=FORK)
    body = run_body(run_page(world, FORK))
    assert f'<a href="/runs/{ORIGIN}">{ORIGIN}</a> at plan#turn=2' in body
    assert "forked from" not in run_body(run_page(world, ORIGIN))


@pytest.mark.backends("memory")
def test_a_fork_cancelled_before_it_ran_still_takes_changed_code_when_resumed(
    world: World, ledger: Path
) -> None:
    _origin(world, ledger)
    fork_run(world, ORIGIN, at="finish", new_run_id=FORK)
    cancel_run(world, FORK, reason="not yet")
    version = len(world.read_stream(run_stream_id(FORK)))
    with pytest.raises(RunCancelledError):
        _run(world, proc.FLOW_V2)
    assert len(world.read_stream(run_stream_id(FORK))) == version  # nothing adopted
    done = asyncio.run(run_workflow(world, proc.FLOW_V2, run_id=FORK, resume_cancelled=True))
    assert done.output == {"path": "publish", "topic": "cats"}
    assert _executed(ledger) == [f"step {FORK} finish", f"step {FORK} publish"]


@pytest.mark.backends("sqlite")
def test_little_verify_of_a_fork_finds_an_origin_that_no_longer_holds_what_was_copied(
    world_spec: WorldSpec, world: World, ledger: Path
) -> None:
    _origin(world, ledger)
    forked = fork_run(world, ORIGIN, at="finish", new_run_id=FORK)
    assert verify_world(world, FORK).ok
    assert world_spec.data_dir is not None
    conn = sqlite3.connect(world_spec.data_dir / "events.sqlite3", isolation_level=None)
    try:
        stream = run_stream_id(ORIGIN).hex
        version = forked.origin.origin_version
        (rowid, state) = conn.execute(
            "SELECT notification_id, state FROM little_es_rows"
            " WHERE originator_id = ? AND originator_version = ?",
            (stream, version),
        ).fetchone()
        # Another row in its place, as a rewrite of the origin's history would leave it:
        # its digest zeroed.
        changed = bytes(state[: 1 + LINK_SIZE]) + bytes(DIGEST_SIZE) + bytes(state[FRAME_SIZE:])
        conn.execute("UPDATE little_es_events SET state = ? WHERE rowid = ?", (changed, rowid))
    finally:
        conn.close()
    with world_spec.open() as again:
        report = verify_world(again, FORK)
    (own,) = [s for s in report.streams if s.name == FORK]
    assert own.problem is not None and "no longer holds the history it copied" in own.problem
    assert f"version {version} is not the row the fork copied" in own.problem


def test_a_fork_with_another_input_keeps_a_group_whose_branches_read_the_input(
    world: World,
) -> None:
    """The group before the fork point completed with branches from the origin's input: the
    fork keeps its result (its branches function is not asked again), and only the steps
    after the fork point see the new input. Recomputed from the new input, the branch set
    differed and every resume of the fork was refused."""
    asked: list[list[str]] = []

    def files(ctx: StepContext) -> list[str]:
        asked.append(list(ctx.input["files"]))
        return list(ctx.input["files"])

    def check(ctx: StepContext) -> str:
        return f"checked {ctx.branch_key}"

    def publish(ctx: StepContext) -> dict[str, object]:
        return {"files": list(ctx.input["files"]), "checks": dict(ctx.outputs["check"])}

    wf = Workflow(
        "fork_input_groups",
        steps=[
            parallel("check", branches=files, step=task("one", check)),
            task("publish", publish),
        ],
    )
    asyncio.run(run_workflow(world, wf, {"files": ["a", "b"]}, run_id="run_files"))
    fork_run(world, "run_files", at="publish", new_run_id="run_files_c", input={"files": ["c"]})
    asked.clear()
    result = asyncio.run(run_workflow(world, wf, run_id="run_files_c"))
    assert result.output == {"files": ["c"], "checks": {"a": "checked a", "b": "checked b"}}
    assert asked == []
    assert verify_world(world).ok
    # A fork that keeps the input still checks the group against it, as any resume does.
    fork_run(world, "run_files", at="publish", new_run_id="run_files_same")
    asyncio.run(run_workflow(world, wf, run_id="run_files_same"))
    assert asked == [["a", "b"]]


def test_an_input_that_differs_only_in_json_type_is_a_new_input(world: World) -> None:
    """1.0 and True equal 1 in Python, not to a branches function that formats them: taken
    for the origin's input, the group was recomputed from it, and the fork never resumed."""

    def parts(ctx: StepContext) -> list[str]:
        return [f"part{ctx.input['n']}"]

    def publish(ctx: StepContext) -> dict[str, object]:
        return {"n": ctx.input["n"], "checks": dict(ctx.outputs["check"])}

    wf = Workflow(
        "fork_typed_input",
        steps=[
            parallel("check", branches=parts, step=task("one", lambda ctx: ctx.branch_key)),
            task("publish", publish),
        ],
    )
    asyncio.run(run_workflow(world, wf, {"n": 1}, run_id="run_typed"))
    for n, fork_id in ((1.0, "run_typed_float"), (True, "run_typed_bool")):
        forked = fork_run(world, "run_typed", at="publish", new_run_id=fork_id, input={"n": n})
        assert forked.origin.input_changed
        result = asyncio.run(run_workflow(world, wf, run_id=fork_id))
        assert result.output == {"n": n, "checks": {"part1": "part1"}}
    same = fork_run(world, "run_typed", at="publish", new_run_id="run_typed_same", input={"n": 1})
    assert not same.origin.input_changed

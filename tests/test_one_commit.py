"""One commit per sequential step: a step's ``StepCompleted`` is committed with the next
step's write-ahead ``StepStarted`` (:mod:`little_es.durability`, "One commit per step").

What must stay true: a step's code runs only after the previous step's result and its
own ``StepStarted`` are committed; a kill between a step's return and that commit runs
only that step again; a cancel that wins the race for the stream's next version loses no
held result; a parallel branch's result is committed at once; the observer hears every
committed event once, in the log's order.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from little_es import (
    Event,
    RunCancelledError,
    StepContext,
    Workflow,
    cancel_run,
    local_world,
    parallel,
    run_workflow,
    task,
)
from little_es.events import RunCancelled, RunCompleted, StepCompleted, StepStarted
from little_es.faults import CRASH_AFTER_APPENDS, CRASH_AFTER_EVENT, CRASH_BEFORE_EVENT
from little_es.world import World
from tests._one_commit_proc import RUN_ID

pytestmark = pytest.mark.timeout(120)

_REPO = Path(__file__).resolve().parents[1]
_STEPS = 5


def _child(world_dir: Path, ledger: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("LITTLE_ES_CRASH_")}
    environ.update(env)
    environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_REPO), environ.get("PYTHONPATH")]))
    return subprocess.run(
        [
            sys.executable,
            str(_REPO / "tests" / "_one_commit_proc.py"),
            str(world_dir),
            str(ledger),
            str(_STEPS),
        ],
        env=environ,
        cwd=_REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )


def _ledger(ledger: Path) -> Counter[str]:
    if not ledger.exists():
        return Counter()
    return Counter(line.split(" ")[0] for line in ledger.read_text().splitlines())


def _log(world_dir: Path) -> list[Event]:
    with local_world(world_dir) as world:
        return world.read_run_log(RUN_ID)


def _names(events: list[Event]) -> list[str]:
    return [f"{e.wire_name}:{getattr(e, 'step_path', '')}" for e in events]


def test_n_sequential_steps_take_n_plus_two_append_transactions(tmp_path: Path) -> None:
    # RunStarted, s0's StepStarted, then each step's StepCompleted with the next record
    # (the next StepStarted, or RunCompleted): N + 2, where two commits a step made 2N + 2.
    appends = _STEPS + 2
    killed = _child(tmp_path / "a", tmp_path / "a.ledger", {CRASH_AFTER_APPENDS: str(appends)})
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    events = _log(tmp_path / "a")
    assert isinstance(events[-1], RunCompleted)  # the kill came after the last append
    assert len(events) == 2 * _STEPS + 2
    done = _child(tmp_path / "b", tmp_path / "b.ledger", {CRASH_AFTER_APPENDS: str(appends + 1)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"RESULT {_STEPS - 1} {_STEPS}"


def test_a_kill_between_a_steps_return_and_its_commit_runs_only_that_step_again(
    tmp_path: Path,
) -> None:
    world_dir, ledger = tmp_path / "w", tmp_path / "ledger"
    killed = _child(world_dir, ledger, {CRASH_BEFORE_EVENT: "StepCompleted:step_path=s2"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    # s2's code ran; neither its result nor s3's StepStarted was committed.
    assert _ledger(ledger) == Counter({"s0": 1, "s1": 1, "s2": 1})
    assert _names(_log(world_dir))[-2:] == ["StepCompleted:s1", "StepStarted:s2"]
    resumed = _child(world_dir, ledger, {})
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.strip() == f"RESULT {_STEPS - 1} {_STEPS - 2}"
    assert _ledger(ledger) == Counter({"s0": 1, "s1": 1, "s2": 2, "s3": 1, "s4": 1})


def test_a_kill_after_the_combined_commit_runs_nothing_committed_again(tmp_path: Path) -> None:
    world_dir, ledger = tmp_path / "w", tmp_path / "ledger"
    killed = _child(world_dir, ledger, {CRASH_AFTER_EVENT: "StepCompleted:step_path=s1"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    # The commit that carried s1's result carried s2's StepStarted: s2 is in flight.
    assert _names(_log(world_dir))[-2:] == ["StepCompleted:s1", "StepStarted:s2"]
    assert _ledger(ledger) == Counter({"s0": 1, "s1": 1})
    resumed = _child(world_dir, ledger, {})
    assert resumed.returncode == 0, resumed.stderr
    assert _ledger(ledger) == Counter({f"s{i}": 1 for i in range(_STEPS)})


def _stored(world: World, run_id: str) -> list[str]:
    return _names(world.read_run_log(run_id))


def test_a_steps_code_runs_after_the_previous_result_and_its_start_are_committed(
    tmp_path: Path,
) -> None:
    seen: dict[str, list[str]] = {}
    with local_world(tmp_path) as world:

        def look(ctx: StepContext) -> str:
            # Read from the database, not from the driver's fold.
            seen[ctx.step_path] = _stored(world, ctx.run_id)
            return ctx.step_path

        wf = Workflow("one-commit-look", steps=[task(f"t{i}", look) for i in range(3)])
        asyncio.run(run_workflow(world, wf, {}, run_id="run_look"))
    for i in (1, 2):
        assert seen[f"t{i}"][-2:] == [f"StepCompleted:t{i - 1}", f"StepStarted:t{i}"]


def test_a_cancel_that_wins_the_race_keeps_the_held_result(tmp_path: Path) -> None:
    ran: list[str] = []
    with local_world(tmp_path) as world:

        def first(ctx: StepContext) -> int:
            ran.append(ctx.step_path)
            return 1

        def cancels(ctx: StepContext) -> int:
            ran.append(ctx.step_path)
            # Another writer's append: the driver's next commit (this step's result
            # with the next StepStarted) loses the version check.
            cancel_run(world, ctx.run_id, reason="stop")
            return 2

        def last(ctx: StepContext) -> int:
            ran.append(ctx.step_path)
            return 3

        wf = Workflow(
            "one-commit-cancel",
            steps=[task("a", first), task("b", cancels), task("c", last)],
        )
        with pytest.raises(RunCancelledError):
            asyncio.run(run_workflow(world, wf, {}, run_id="run_cancel"))
        assert ran == ["a", "b"]
        # b's result, held when the cancel came, is committed after it; c never started.
        assert _stored(world, "run_cancel")[-3:] == [
            "StepStarted:b",
            "RunCancelled:",
            "StepCompleted:b",
        ]
        result = asyncio.run(run_workflow(world, wf, run_id="run_cancel", resume_cancelled=True))
        assert ran == ["a", "b", "c"]
        assert result.output == 3 and result.steps_executed == 1


def test_a_cancel_during_the_last_step_keeps_its_result(tmp_path: Path) -> None:
    with local_world(tmp_path) as world:

        def cancels(ctx: StepContext) -> int:
            cancel_run(world, ctx.run_id, reason="stop")
            return 2

        wf = Workflow("one-commit-cancel-last", steps=[task("a", cancels)])
        with pytest.raises(RunCancelledError):
            asyncio.run(run_workflow(world, wf, {}, run_id="run_cancel_last"))
        assert _stored(world, "run_cancel_last")[-2:] == ["RunCancelled:", "StepCompleted:a"]
        result = asyncio.run(
            run_workflow(world, wf, run_id="run_cancel_last", resume_cancelled=True)
        )
        assert result.output == 2 and result.steps_executed == 0


def test_a_parallel_branchs_result_is_committed_before_the_other_branches_finish(
    tmp_path: Path,
) -> None:
    with local_world(tmp_path) as world:
        slow_running = asyncio.Event()

        async def branch(ctx: StepContext) -> str:
            if ctx.branch_value == "slow":
                slow_running.set()
                # Waits for the fast branch's StepCompleted to be in the database: were
                # it held for the next commit (this branch's own), this would time out.
                for _ in range(500):
                    if any(
                        isinstance(e, StepCompleted) and e.step_path.startswith("g[fast]")
                        for e in world.read_run_log(ctx.run_id)
                    ):
                        return "slow saw fast"
                    await asyncio.sleep(0.01)
                raise AssertionError("the fast branch's result was not committed")
            # The fast branch finishes while the slow one runs its code: no commit of the
            # slow branch's comes between the fast one's return and the slow one's look.
            await slow_running.wait()
            return "fast"

        wf = Workflow(
            "one-commit-parallel",
            steps=[
                parallel(
                    "g",
                    branches=lambda ctx: {"fast": "fast", "slow": "slow"},
                    step=task("b", branch),
                )
            ],
        )
        result = asyncio.run(run_workflow(world, wf, {}, run_id="run_parallel"))
        assert result.output == {"fast": "fast", "slow": "slow saw fast"}


def test_the_observer_hears_every_committed_event_once_in_log_order(tmp_path: Path) -> None:
    heard: list[Event] = []
    with local_world(tmp_path) as world:
        wf = Workflow(
            "one-commit-observer",
            steps=[
                task("a", lambda ctx: 1),
                parallel("g", branches=lambda ctx: ["x", "y"], step=task("b", lambda ctx: 2)),
                task("c", lambda ctx: 3),
            ],
        )
        asyncio.run(run_workflow(world, wf, {}, run_id="run_observed", observer=heard.append))
        stored = world.read_run_log("run_observed")
    key = [(type(e), e.originator_version) for e in heard]
    assert key == [(type(e), e.originator_version) for e in stored]
    assert isinstance(heard[-1], RunCompleted)
    assert sum(isinstance(e, StepStarted) for e in heard) == 5
    assert not any(isinstance(e, RunCancelled) for e in heard)

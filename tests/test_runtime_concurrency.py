"""Exclusive progress: one run is driven by at most one process (or task) at a time.

Two real processes (``tests/_runtime_proc.py slow``) call ``run_workflow`` on
the same run at the same moment (a file barrier lines them up), on SQLite and
on PostgreSQL; the run's middle step sleeps to hold the run. Exactly one makes
progress; the other stops with ``ConcurrentRunError`` before running anything,
and the side-effect ledger shows that nothing ran twice. In-process, a second
``run_workflow`` on a run that is being driven is refused the same way.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest
from conftest import WorldSpec

from little_es.engine.local import run_workflow
from little_es.errors import ConcurrentRunError
from little_es.events import StepStarted
from little_es.faults import CRASH_AFTER_APPENDS
from little_es.workflow.authoring import Workflow, task
from little_es.workflow.context import StepContext
from little_es.world import World

pytestmark = pytest.mark.timeout(120)

_REPO = Path(__file__).resolve().parents[1]
_PROC = _REPO / "tests" / "_runtime_proc.py"
_RUN_ID = "run_proc"
_CONCURRENT_EXIT_CODE = 3
_SLEEP_S = 1.0


def _env(crash_after: int | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LITTLE_ES_CRASH_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_REPO), env.get("PYTHONPATH")]))
    if crash_after is not None:
        env[CRASH_AFTER_APPENDS] = str(crash_after)
    return env


def _argv(world_url: str, ledger: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        str(_PROC),
        "slow",
        "--world",
        world_url,
        "--ledger",
        str(ledger),
        "--sleep",
        str(_SLEEP_S),
        *extra,
    ]


def _ledger(path: Path) -> list[tuple[int, str]]:
    entries = []
    for line in path.read_text().splitlines():
        pid, _run_id, step_path, _attempt = line.split(" ")
        entries.append((int(pid), step_path))
    return entries


@pytest.mark.backends("sqlite", "postgres", "mariadb")
@pytest.mark.parametrize("start", ["resume", "fresh"])
def test_two_processes_driving_one_run_at_once_exactly_one_makes_progress(
    world_spec: WorldSpec, world: World, tmp_path: Path, start: str
) -> None:
    ledger = tmp_path / "ledger"
    first_pid = None
    if start == "resume":
        # A first process commits RunStarted and step `first`, then dies.
        crashed = subprocess.run(
            _argv(world_spec.url, ledger),
            env=_env(crash_after=3),
            cwd=_REPO,
            capture_output=True,
            timeout=60,
            check=False,
        )
        assert crashed.returncode == -9, crashed.stderr
        first_pid = _ledger(ledger)[0][0]

    procs = []
    for name in ("p1", "p2"):
        argv = _argv(
            world_spec.url,
            ledger,
            "--ready-file",
            str(tmp_path / f"{name}.ready"),
            "--go-file",
            str(tmp_path / "go"),
        )
        procs.append(
            subprocess.Popen(
                argv,
                env=_env(),
                cwd=_REPO,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    try:
        deadline = time.monotonic() + 30
        while not all((tmp_path / f"{n}.ready").exists() for n in ("p1", "p2")):
            assert time.monotonic() < deadline, "the children never got ready"
            assert all(p.poll() is None for p in procs), "a child died before the barrier"
            time.sleep(0.01)
        (tmp_path / "go").touch()
        # The loser stops at once, while the winner is still in its slow step.
        finished_first = None
        while finished_first is None:
            finished_first = next((p for p in procs if p.poll() is not None), None)
            time.sleep(0.005)
        still_running = [p for p in procs if p is not finished_first]
        assert still_running[0].poll() is None, "both children finished: they did not overlap"
        outcomes = [p.communicate(timeout=60) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()

    loser = finished_first
    winner = still_running[0]
    loser_out = outcomes[procs.index(loser)][0]
    winner_out = outcomes[procs.index(winner)][0]
    assert loser.returncode == _CONCURRENT_EXIT_CODE, outcomes[procs.index(loser)]
    assert "CONCURRENT_RUN_ERROR" in loser_out and _RUN_ID in loser_out
    assert winner.returncode == 0, outcomes[procs.index(winner)]
    result_line = next(line for line in winner_out.splitlines() if line.startswith("RESULT "))
    result = orjson.loads(result_line.removeprefix("RESULT "))
    assert result["output"] == "last"
    assert result["resumed"] is (start == "resume")
    assert result["steps_executed"] == (2 if start == "resume" else 3)

    entries = _ledger(ledger)
    assert Counter(path for _, path in entries) == {"first": 1, "slow": 1, "last": 1}
    assert loser.pid not in {pid for pid, _ in entries}
    expected_first = first_pid if start == "resume" else winner.pid
    assert dict((path, pid) for pid, path in entries) == {
        "first": expected_first,
        "slow": winner.pid,
        "last": winner.pid,
    }
    events = world.read_run_log(_RUN_ID)
    assert [e.step_path for e in events if isinstance(e, StepStarted)] == ["first", "slow", "last"]
    assert events[-1].wire_name == "RunCompleted"


async def test_a_second_run_workflow_on_a_run_in_progress_is_refused(
    world: World, world_spec: WorldSpec, world_factory: Callable[[], World]
) -> None:
    entered = asyncio.Event()
    release = asyncio.Event()
    executions: list[str] = []

    async def hold(ctx: StepContext) -> str:
        executions.append(ctx.step_path)
        entered.set()
        await release.wait()
        return "held"

    wf = Workflow("held", steps=[task("hold", hold), task("after", lambda ctx: "after")])
    first = asyncio.create_task(run_workflow(world, wf, {}, run_id="run_held"))
    await asyncio.wait_for(entered.wait(), timeout=10)
    count = len(world.read_run_log("run_held"))

    # Another world on the same storage (memory worlds cannot be shared: the same one).
    other = world_factory() if world_spec.persistent else world
    with pytest.raises(ConcurrentRunError, match="run_held"):
        await run_workflow(other, wf, {}, run_id="run_held")
    with pytest.raises(ConcurrentRunError):
        await run_workflow(world, wf, run_id="run_held")
    assert len(world.read_run_log("run_held")) == count
    assert executions == ["hold"]

    release.set()
    result = await asyncio.wait_for(first, timeout=10)
    assert result.output == "after"
    # Once the lease is released the run can be resumed again (here: it is complete).
    again = await run_workflow(other, wf, run_id="run_held")
    assert (again.output, again.steps_executed) == ("after", 0)
    assert executions == ["hold"]

"""A fork re-uses its prefix across real kills: a ledger outside the processes counts executions.

A child process runs the origin (a task, a sub-run, an agent step of five
model calls and four tool calls, a task). ``little fork`` (another process)
forks it inside the agent step at turn 3. A child resumes the fork and is
SIGKILLed right after it committed the fork's turn-4 ``harness.model.called``;
another child resumes it to the end. The ledger (one ``O_APPEND`` write, fsynced,
before each step, model call and tool call runs) shows that nothing before the
fork point ran again in either fork process (no step, no sub-run step, no model
call of turns 1-2, no tool call of those turns) and that each call after it ran
exactly once, the in-flight one included.

Real SQLite files and the real PostgreSQL server.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from little_es.diff import diff_runs
from little_es.events import RunForked
from little_es.ids import run_stream_id
from tests import _fork_proc as proc
from tests.conftest import WorldSpec

pytestmark = [pytest.mark.timeout(120), pytest.mark.backends("sqlite", "postgres")]

REPO = Path(__file__).resolve().parent.parent
CHILD = REPO / "tests" / "_fork_proc.py"


def _env(spec: WorldSpec, **extra: str) -> dict[str, str]:
    env = {
        **os.environ,
        "LITTLE_ES_WORLD": spec.url,
        "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "adapters")]),
    }
    env.pop("LITTLE_ES_CRASH_AFTER_APPENDS", None)
    env.pop("LITTLE_ES_CRASH_AFTER_EVENT", None)
    env.pop("LITTLE_ES_CRASH_BEFORE_EVENT", None)
    return {**env, **extra}


def _child(
    spec: WorldSpec, ledger: Path, run_id: str, *args: str, **env: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            *(sys.executable, str(CHILD), "fork-flow", "--world", spec.url),
            *("--ledger", str(ledger), "--run-id", run_id, *args),
        ],
        env=_env(spec, **env),
        capture_output=True,
        text=True,
        timeout=90,
    )


def _little(spec: WorldSpec, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "little_es.cli", *args],
        env=_env(spec),
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_forks_resume_killed_and_resumed_again_runs_nothing_before_the_fork_point(
    world_spec: WorldSpec, tmp_path: Path
) -> None:
    origin_ledger = tmp_path / "origin.ledger"
    done = _child(world_spec, origin_ledger, "run_origin", "--input", '{"topic": "cats"}')
    assert done.returncode == 0, done.stdout + done.stderr
    assert len(proc.ledger_lines(origin_ledger)) == 12  # 3 steps + a sub-run step + 5 + 4 calls

    forked = _little(
        world_spec, "fork", "run_origin", "--at", "plan#turn=3", "--new-run-id", "run_fork"
    )
    assert forked.returncode == 0, forked.stderr
    assert "forked from run_origin at plan#turn=3" in forked.stdout

    ledger = tmp_path / "fork.ledger"
    killed = _child(
        world_spec,
        ledger,
        "run_fork",
        LITTLE_ES_CRASH_AFTER_EVENT="harness.model.called:turn=4",
    )
    assert killed.returncode == -signal.SIGKILL, killed.stdout + killed.stderr
    assert proc.ledger_lines(ledger) == ["model 3", "tool run_fork q3"]

    resumed = _child(world_spec, ledger, "run_fork")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "RESULT" in resumed.stdout
    # Across both fork processes: only what follows the fork point, each exactly once.
    assert Counter(proc.ledger_lines(ledger)) == Counter(
        {
            "model 3": 1,
            "tool run_fork q3": 1,
            "model 4": 1,
            "tool run_fork q4": 1,
            "model 5": 1,
            "step run_fork finish": 1,
        }
    )
    report = _little(world_spec, "report", "run_fork")
    assert "forked from run_origin at plan#turn=3 · re-uses fetch, sub; plan turns 1-2" in (
        " ".join(report.stdout.split())
    ), report.stdout
    verify = _little(world_spec, "verify", "run_fork")
    assert verify.returncode == 0, verify.stdout
    with world_spec.open() as world:
        assert isinstance(world.read_stream(run_stream_id("run_fork"))[0], RunForked)
        assert diff_runs(world, "run_fork", "run_origin").same


def test_a_fork_that_adopted_changed_code_is_killed_and_resumed_with_it(
    world_spec: WorldSpec, tmp_path: Path
) -> None:
    origin_ledger = tmp_path / "origin.ledger"
    done = _child(world_spec, origin_ledger, "run_origin", "--input", '{"topic": "cats"}')
    assert done.returncode == 0, done.stdout + done.stderr
    forked = _little(
        world_spec,
        *("fork", "run_origin", "--at", "finish", "--new-run-id", "run_fork"),
        *("--input", '{"topic": "dogs"}'),
    )
    assert forked.returncode == 0, forked.stderr
    assert "with a new input" in forked.stdout

    ledger = tmp_path / "fork.ledger"
    v2 = ("--workflow-key", "fork-flow-v2")
    killed = _child(
        world_spec,
        ledger,
        "run_fork",
        *v2,
        LITTLE_ES_CRASH_AFTER_EVENT="StepCompleted:step_path=finish",
    )
    assert killed.returncode == -signal.SIGKILL, killed.stdout + killed.stderr
    resumed = _child(world_spec, ledger, "run_fork", *v2)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert '"topic":"dogs"' in resumed.stdout
    assert proc.ledger_lines(ledger) == ["step run_fork finish", "step run_fork publish"]
    # Pinned to the definition it adopted: the origin's is refused now.
    refused = _child(world_spec, ledger, "run_fork")
    assert refused.returncode == 1 and "WorkflowChangedError" in refused.stderr, refused.stderr

"""Cancel and budgets with real processes: a driver stopped from outside, and resumed.

* cancel: a child drives a three-step run whose middle step sleeps; once the
  ledger shows that step running, ``little cancel`` (another process, holding
  no lease) records ``RunCancelled``. The driver finishes the step it is in
  (its result is kept: its append lost the version check to the cancel, and it
  decided again on the stream as stored), then stops before the next one. A
  plain resume is refused; ``--force-cancelled`` runs only the last step.
* budget: a child drives an agent run with a budget of two model calls; it
  stops before the third with ``BudgetExceeded`` recorded. A second child
  resumes with a larger budget; the ledger outside both shows every model call,
  tool call and step executed exactly once.

Real SQLite files and the real PostgreSQL server.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from little_es.events import (
    BudgetExceeded,
    BudgetSet,
    RunFailed,
    RunResumed,
    StepCompleted,
    StepFailed,
)
from little_es.replay import replay_run
from tests.conftest import WorldSpec

pytestmark = [pytest.mark.timeout(120), pytest.mark.backends("sqlite", "postgres", "mariadb")]

REPO = Path(__file__).resolve().parent.parent
CHILD = REPO / "tests" / "_operate_proc.py"


def _env(spec: WorldSpec) -> dict[str, str]:
    env = {
        **os.environ,
        "LITTLE_ES_WORLD": spec.url,
        "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "adapters")]),
    }
    env.pop("LITTLE_ES_CRASH_AFTER_APPENDS", None)
    env.pop("LITTLE_ES_CRASH_AFTER_EVENT", None)
    return env


def _child(spec: WorldSpec, ledger: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(CHILD), *args, "--world", spec.url, "--ledger", str(ledger)],
        env=_env(spec),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _finish(proc: subprocess.Popen[str]) -> tuple[int, str]:
    try:
        out, _ = proc.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    return proc.returncode, out


def _little(spec: WorldSpec, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "little_es.cli", *args],
        env=_env(spec),
        capture_output=True,
        text=True,
        timeout=60,
    )


def _ledger(path: Path) -> Counter[str]:
    if not path.exists():
        return Counter()
    return Counter(line.split(" ", 1)[1] for line in path.read_text().splitlines())


def _wait_for(path: Path, entry: str, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 30
    while entry not in _ledger(path):
        if proc.poll() is not None:
            raise AssertionError(f"child ended before {entry!r}: {proc.communicate()[0]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no {entry!r} in the ledger after 30 s")
        time.sleep(0.02)


def _run_events(spec: WorldSpec, run_id: str) -> list[Any]:
    with spec.open() as world:
        stream = world.load_run(run_id).id
        return [e for e in world.read_run_log(run_id) if e.originator_id == stream]


def test_cancel_during_a_long_step_stops_before_the_next_one(
    world_spec: WorldSpec, tmp_path: Path
) -> None:
    ledger = tmp_path / "ledger"
    release = tmp_path / "release"
    driver = _child(world_spec, ledger, "slow", "--run-id", "run_cancel", "--until", str(release))
    _wait_for(ledger, "step slow", driver)
    cancelled = _little(world_spec, "cancel", "run_cancel", "--reason", "wrong ticket")
    release.touch()
    assert cancelled.returncode == 0, cancelled.stderr
    assert "recorded RunCancelled" in cancelled.stdout
    code, out = _finish(driver)
    assert code == 4, out
    assert "STOPPED RunCancelledError" in out and "wrong ticket" in out
    assert _ledger(ledger) == Counter({"step first": 1, "step slow": 1})

    events = _run_events(world_spec, "run_cancel")
    names = [type(e).__name__ for e in events]
    assert not any(isinstance(e, StepFailed | RunFailed) for e in events), names
    # The step in flight when the cancel landed keeps its result; nothing after it started.
    assert names[-2:] == ["RunCancelled", "StepCompleted"], names
    assert events[-1].step_path == "slow"
    with world_spec.open() as world:
        state = replay_run(world, "run_cancel").state
    assert state.status == "cancelled" and state.stop_reason == "wrong ticket"
    assert "last" not in state.steps
    report = _little(world_spec, "report", "run_cancel")
    assert "cancelled: wrong ticket" in report.stdout, report.stdout

    # Not resumed by accident...
    code, out = _finish(_child(world_spec, ledger, "slow", "--run-id", "run_cancel"))
    assert code == 4 and "not resumed by accident" in out, out
    assert _ledger(ledger) == Counter({"step first": 1, "step slow": 1})
    # ...but on purpose: only the step that never started runs.
    code, out = _finish(
        _child(world_spec, ledger, "slow", "--run-id", "run_cancel", "--force-cancelled")
    )
    assert code == 0, out
    assert _ledger(ledger) == Counter({"step first": 1, "step slow": 1, "step last": 1})
    events = _run_events(world_spec, "run_cancel")
    assert [type(e) for e in events].count(RunResumed) == 1
    with world_spec.open() as world:
        assert replay_run(world, "run_cancel").state.status == "completed"


def test_budget_stop_and_resume_with_a_larger_budget(world_spec: WorldSpec, tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    args = ("agent", "--run-id", "run_budget")
    code, out = _finish(_child(world_spec, ledger, *args, "--budget-calls", "2"))
    assert code == 4, out
    assert "STOPPED BudgetExceededError" in out and "2 model calls of a budget of 2" in out
    assert _ledger(ledger) == Counter(
        {"step fetch": 1, "model 1": 1, "tool q1": 1, "model 2": 1, "tool q2": 1}
    )
    with world_spec.open() as world:
        state = replay_run(world, "run_budget").state
    assert state.status == "budget_exceeded" and state.stopped_step_path == "plan"
    assert state.steps["plan"].status == "running"  # in flight, not failed
    assert state.usage.calls == 2
    events = _run_events(world_spec, "run_budget")
    assert not any(isinstance(e, StepFailed | RunFailed) for e in events)
    assert sum(isinstance(e, BudgetExceeded) for e in events) == 1

    # The same budget stops again at once, without calling anything.
    code, out = _finish(_child(world_spec, ledger, *args))
    assert code == 4 and "BudgetExceededError" in out, out
    assert sum(_ledger(ledger).values()) == 5

    code, out = _finish(_child(world_spec, ledger, *args, "--budget-calls", "10"))
    assert code == 0, out
    expected = Counter({"step fetch": 1, "step finish": 1})
    expected.update({f"model {t}": 1 for t in range(1, 6)})
    expected.update({f"tool q{t}": 1 for t in range(1, 5)})
    assert _ledger(ledger) == expected  # nothing executed twice
    events = _run_events(world_spec, "run_budget")
    budgets = [e.budget.model_calls for e in events if isinstance(e, BudgetSet)]
    assert budgets == [2, 10]
    assert [type(e) for e in events].count(RunResumed) == 2
    assert isinstance(events[-2], StepCompleted) and events[-2].step_path == "finish"
    with world_spec.open() as world:
        state = replay_run(world, "run_budget").state
    assert state.status == "completed" and state.usage.calls == 5

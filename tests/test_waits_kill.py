"""Durable waits with real processes: a run killed while it waits, signalled from another
process, resumed in a third, with nothing executed twice.

A child drives the ``waits`` workflow (``tests/_waits_proc.py``) and is killed with
SIGKILL once it committed ``RunWaiting`` for the agent's ``ask_human`` call and the
result of the batch's other tool call. ``little signal`` (another process, holding no
lease) answers; a second child resumes, the agent fast-forwards through its recorded
calls and continues, and it is killed again right after the ``review`` step's
``RunWaiting``. A second ``little signal``, and a third child completes the run. The
ledger outside the processes shows every step, model call and tool call executed
exactly once. Real SQLite files and the real PostgreSQL server.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from little_es.events import RunWaiting, SignalReceived, StepFailed
from little_es.replay import replay_run
from tests.conftest import WorldSpec

pytestmark = [pytest.mark.timeout(120), pytest.mark.backends("sqlite", "postgres")]

REPO = Path(__file__).resolve().parent.parent
CHILD = REPO / "tests" / "_waits_proc.py"
_CHILD_ARGS = (sys.executable, str(CHILD))


def _env(spec: WorldSpec, crash: str | None = None) -> dict[str, str]:
    env = {
        **os.environ,
        "LITTLE_ES_WORLD": spec.url,
        "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "adapters")]),
    }
    env.pop("LITTLE_ES_CRASH_AFTER_APPENDS", None)
    env.pop("LITTLE_ES_CRASH_AFTER_EVENT", None)
    if crash is not None:
        env["LITTLE_ES_CRASH_AFTER_EVENT"] = crash
    return env


def _drive(spec: WorldSpec, ledger: Path, crash: str | None = None) -> tuple[int, str]:
    done = subprocess.run(
        [*_CHILD_ARGS, "--world", spec.url, "--ledger", str(ledger), "--run-id", "run_wait_kill"],
        env=_env(spec, crash),
        capture_output=True,
        text=True,
        timeout=90,
        cwd=REPO,
    )
    return done.returncode, done.stdout + done.stderr


def _little(spec: WorldSpec, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "little_es.cli", *args],
        env=_env(spec),
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )


def _ledger(path: Path) -> Counter[str]:
    if not path.exists():
        return Counter()
    return Counter(line.split(" ", 1)[1] for line in path.read_text().splitlines())


def test_a_run_killed_while_waiting_resumes_after_the_signal_with_nothing_reexecuted(
    world_spec: WorldSpec, tmp_path: Path
) -> None:
    ledger = tmp_path / "ledger"
    # Killed with the question recorded (RunWaiting) and the batch's other call committed,
    # as the driver was about to exit.
    code, out = _drive(world_spec, ledger, crash="harness.tool_call.succeeded:call_id=k")
    assert code == -signal.SIGKILL, out
    assert _ledger(ledger) == Counter({"step fetch": 1, "model 1": 1, "tool lookup build": 1})

    waiting = _little(world_spec, "runs", "--waiting")
    assert waiting.returncode == 0, waiting.stderr
    assert "run_wait_kill" in waiting.stdout and "deploy to which env?" in waiting.stdout
    bad = _little(world_spec, "signal", "run_wait_kill", "human", "--data", '{"answer": 3}')
    assert bad.returncode == 1 and "does not validate" in bad.stderr, bad.stderr
    sent = _little(world_spec, "signal", "run_wait_kill", "human", "--data", '{"answer": "prod"}')
    assert sent.returncode == 0, sent.stderr
    again = _little(world_spec, "signal", "run_wait_kill", "human", "--data", '{"answer": "dev"}')
    assert again.returncode == 1 and "already" in again.stderr, again.stderr

    code, out = _drive(world_spec, ledger, crash="RunWaiting:kind=step")
    assert code == -signal.SIGKILL, out
    # Turn 1 and its tool call were answered from the log; only turn 2 was called.
    assert _ledger(ledger) == Counter(
        {"step fetch": 1, "model 1": 1, "tool lookup build": 1, "model 2": 1}
    )

    # Resumed before the signal: it stops at the wait again, executing nothing.
    code, out = _drive(world_spec, ledger)
    assert code == 3 and "WAITING" in out and "'review'" in out, out
    assert sum(_ledger(ledger).values()) == 4

    review = '{"approved": true, "reviewer": "ana"}'
    sent = _little(world_spec, "signal", "run_wait_kill", "review", "--data", review)
    assert sent.returncode == 0, sent.stderr
    code, out = _drive(world_spec, ledger)
    assert code == 0, out
    assert "RESULT" in out and "deploy to prod" in out and '"reviewer":"ana"' in out
    assert _ledger(ledger) == Counter(
        {"step fetch": 1, "model 1": 1, "tool lookup build": 1, "model 2": 1, "step publish": 1}
    )

    with world_spec.open() as world:
        events = list(world.read_run_log("run_wait_kill"))
        state = replay_run(world, "run_wait_kill").state
    assert state.status == "completed"
    assert sum(isinstance(e, RunWaiting) for e in events) == 2
    assert sum(isinstance(e, SignalReceived) for e in events) == 2
    assert not any(isinstance(e, StepFailed) for e in events)
    assert state.steps["review"].output == {"approved": True, "reviewer": "ana"}


def test_the_approval_example_asks_exits_and_continues_after_little_signal() -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "examples" / "approval.py")],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout + done.stderr
    assert out.count("(waiting)") == 2 and "exit code 0 (completed)" in out
    assert "recorded SignalReceived 'human'" in out
    assert "this duplicate was not recorded" in out
    assert "the signal is stale" in out
    assert "recorded SignalReceived 'approval'" in out
    assert "Done: 1.4.2 is live on prod." in out
    ran = out.split("what really ran, once each:")[1].split("$ little report")[0]
    rows = [line.strip().rsplit(None, 1) for line in ran.split("\n")[1:-1]]
    counts = dict(rows)
    # Each step, model call and tool call of the ledger executed once, over four processes.
    assert counts == {
        "step build": "1",
        "model turn 1": "1",
        "model turn 2": "1",
        "tool deploy(prod, 1.4.2)": "1",
        "model turn 3": "1",
    }
    assert "release v1 · completed" in out

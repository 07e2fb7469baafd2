"""Orchestrators across real process deaths: SIGKILL mid fan-out, then resume in a new process.

Each test runs ``tests/_orchestrator_proc.py`` (a scripted orchestrator that starts N
``work`` sub-runs through ``start_workflow``) with a ``LITTLE_ES_CRASH_AFTER_EVENT``
switch, so the child kills itself with SIGKILL right after a chosen commit, reads what
the log says at the crash, then runs it again without the switch. The child's model
and every sub-run step append a line per REAL execution to a ledger, so the counts
below are across both processes.

The two seed scenarios:

1. killed after the 30th of 50 ``harness.tool_call.succeeded``: the completed calls
   fast-forward, the in-flight ones are re-dispatched with their reserved sub-run
   ids, and sub-runs that crashed mid-way resume from their own logs;
2. killed right after a sub-run committed ``RunCompleted``, before the orchestrator
   recorded the call's result: the result is read from the sub-run's log and the
   sub-run does not run again.

Both run on SQLite and on MariaDB.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest

from little_es.events import SubRunReserved, ToolCallFailed, ToolCallStarted, ToolCallSucceeded
from little_es.ids import run_stream_id, session_stream_id
from little_es.orchestrator import sub_run_id_for_call
from little_es.projections import list_runs
from little_es.world import World, local_world, open_world
from tests.conftest import WorldSpec

REPO = Path(__file__).resolve().parents[1]
CHILD = REPO / "tests" / "_orchestrator_proc.py"
RUN_ID = "run_orchestrator_crash"
AGENT_STEP = "fan_out"
SUB_STEPS = ("fetch", "compute")
SESSION_ID = session_stream_id(RUN_ID, AGENT_STEP, 1)


def _call_id(i: int) -> str:
    return f"c{i:03d}"


def _sub_run_id(i: int) -> str:
    return sub_run_id_for_call(RUN_ID, str(SESSION_ID), _call_id(i))


def _expected_answer(n: int) -> dict[str, Any]:
    return {"answer": f"total={sum(10 * i + 1 for i in range(1, n + 1))} ok={n} failed=0"}


def _child(
    world: Path | str, ledger: Path, label: str, n: int, concurrency: int, **crash: str
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LITTLE_ES_CRASH_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.update(crash)
    return subprocess.run(
        [sys.executable, str(CHILD), str(world), str(ledger), label, str(n), str(concurrency)],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _outcome(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert proc.returncode == 0, proc.stderr
    result: dict[str, Any] = orjson.loads(proc.stdout.strip().splitlines()[-1])
    return result


def _ledger(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


@dataclass(frozen=True)
class _Log:
    """What the world's log says, read between the crash and the resume (or after)."""

    sub_run_of: dict[str, str]
    """Call id -> the sub_run_id recorded in its harness.tool_call.started args."""
    started: Counter[str]
    """harness.tool_call.started events per call id."""
    succeeded: dict[str, Any]
    """Call id -> recorded result, per harness.tool_call.succeeded (each once, asserted)."""
    reserved: list[str]
    """SubRunReserved sub-run ids on the orchestrator's Run stream, in order."""
    run_status: dict[str, str]
    """Sub-run id -> status of its own log ("absent" when it never started)."""
    step_status: dict[tuple[str, str], str]
    """(sub-run id, step path) -> status in the sub-run's own log."""
    versions: dict[str, int]
    """Sub-run id -> number of events on its Run stream."""


def _open(world: Path | str) -> World:
    """A data directory's world, or the world a URL names."""
    return open_world(world) if isinstance(world, str) else local_world(world)


def _read_log(world_dir: Path | str) -> _Log:
    with _open(world_dir) as w:
        session_events = w.read_stream(SESSION_ID)
        starts = [e for e in session_events if isinstance(e, ToolCallStarted)]
        successes = [e for e in session_events if isinstance(e, ToolCallSucceeded)]
        assert len({e.call_id for e in successes}) == len(successes), "a result recorded twice"
        reserved = [
            e.sub_run_id
            for e in w.read_stream(run_stream_id(RUN_ID))
            if isinstance(e, SubRunReserved)
        ]
        sub_run_of = {e.call_id: e.args["sub_run_id"] for e in starts}
        run_status: dict[str, str] = {}
        step_status: dict[tuple[str, str], str] = {}
        versions: dict[str, int] = {}
        for sub_run_id in sub_run_of.values():
            if not w.run_exists(sub_run_id):
                run_status[sub_run_id] = "absent"
                versions[sub_run_id] = 0
                continue
            fold = w.load_run(sub_run_id).fold
            run_status[sub_run_id] = fold.status
            versions[sub_run_id] = len(w.read_stream(run_stream_id(sub_run_id)))
            for path, step in fold.steps.items():
                step_status[(sub_run_id, path)] = step.status
    return _Log(
        sub_run_of=sub_run_of,
        started=Counter(e.call_id for e in starts),
        succeeded={e.call_id: e.result for e in successes},
        reserved=reserved,
        run_status=run_status,
        step_status=step_status,
        versions=versions,
    )


def _assert_resumed_exactly_once(
    n: int, crash: _Log, final: _Log, entries: list[dict[str, Any]]
) -> None:
    """The invariants both scenarios share, by counting real executions in the ledger."""
    calls = [_call_id(i) for i in range(1, n + 1)]
    # The ids were reserved (and recorded in the args) before any sub-run started,
    # and the resume reused them: one sub-run per call, never a second one.
    assert crash.sub_run_of == {_call_id(i): _sub_run_id(i) for i in range(1, n + 1)}
    assert final.sub_run_of == crash.sub_run_of
    assert crash.reserved == final.reserved
    assert sorted(final.reserved) == sorted(crash.sub_run_of.values())
    assert final.started == Counter(calls), "a call was recorded as started twice"
    # Completed calls fast-forwarded: their recorded results are untouched.
    for call, result in crash.succeeded.items():
        assert final.succeeded[call] == result
    assert sorted(final.succeeded) == calls
    for i in range(1, n + 1):
        assert final.succeeded[_call_id(i)] == {
            "sub_run_id": _sub_run_id(i),
            "status": "completed",
            "output": 10 * i + 1,
        }
    assert set(final.run_status.values()) == {"completed"}

    ran = Counter((e["label"], e["run_id"], e["step"]) for e in entries if e["kind"] == "step")
    for i in range(1, n + 1):
        sub_run_id = _sub_run_id(i)
        for step in SUB_STEPS:
            first, resume = ran[("first", sub_run_id, step)], ran[("resume", sub_run_id, step)]
            where = (sub_run_id, step, crash.step_status.get((sub_run_id, step)))
            assert first <= 1 and resume <= 1, where
            status = crash.step_status.get((sub_run_id, step))
            if status == "completed":
                assert (first, resume) == (1, 0), where  # a committed step never runs again
            elif status == "running":
                assert resume == 1, where  # in flight at the crash: at most once more
            else:
                assert (first, resume) == (0, 1), where
        if crash.run_status[sub_run_id] == "completed":
            # A completed sub-run is not executed again, and its log is not appended to.
            assert final.versions[sub_run_id] == crash.versions[sub_run_id]
    models = [(e["label"], e["turn"]) for e in entries if e["kind"] == "model"]
    assert models == [("first", 1), ("resume", 2)], models


@pytest.mark.backends("sqlite", "mariadb")
def test_killed_after_30_of_50_sub_runs_resumes_each_in_flight_one_once(
    tmp_path: Path, world_spec: WorldSpec
) -> None:
    world = tmp_path / "world" if world_spec.backend == "sqlite" else world_spec.url
    ledger = tmp_path / "ledger"
    n = 50
    first = _child(
        world,
        ledger,
        "first",
        n,
        8,
        LITTLE_ES_CRASH_AFTER_EVENT="harness.tool_call.succeeded:call_id=c030",
    )
    assert first.returncode == -signal.SIGKILL, (first.returncode, first.stderr)
    crash = _read_log(world)
    # Same work and FIFO permits: the calls finish about in order, so about 30 are done.
    assert "c030" in crash.succeeded and 30 - 8 <= len(crash.succeeded) <= 30 + 8
    assert sum(crash.started.values()) == n
    for call in crash.succeeded:
        assert crash.run_status[crash.sub_run_of[call]] == "completed"
    in_flight = [c for c in crash.sub_run_of if c not in crash.succeeded]
    statuses = Counter(crash.run_status[crash.sub_run_of[c]] for c in in_flight)
    # Some sub-runs crashed with the orchestrator (their logs stop mid-run), some had
    # only been reserved.
    assert statuses["running"] >= 1 and statuses["absent"] >= 1, statuses

    outcome = _outcome(_child(world, ledger, "resume", n, 8))
    assert outcome["output"] == _expected_answer(n)
    assert outcome["resumed"] is True
    final = _read_log(world)
    entries = _ledger(ledger)
    _assert_resumed_exactly_once(n, crash, final, entries)
    resumed_runs = {e["run_id"] for e in entries if e["label"] == "resume" and e["kind"] == "step"}
    # Only in-flight calls' sub-runs did any work after the resume.
    assert resumed_runs <= {crash.sub_run_of[c] for c in in_flight}
    with _open(world) as w:
        assert len(list_runs(w)) == n + 1  # the orchestrator and one run per call


@pytest.mark.backends("sqlite", "mariadb")
def test_sub_run_completed_before_its_result_was_recorded_is_not_run_again(
    tmp_path: Path, world_spec: WorldSpec
) -> None:
    world = tmp_path / "world" if world_spec.backend == "sqlite" else world_spec.url
    ledger = tmp_path / "ledger"
    n = 20
    target = _sub_run_id(5)
    first = _child(
        world,
        ledger,
        "first",
        n,
        4,
        LITTLE_ES_CRASH_AFTER_EVENT=f"RunCompleted:originator_id={run_stream_id(target)}",
    )
    assert first.returncode == -signal.SIGKILL, (first.returncode, first.stderr)
    crash = _read_log(world)
    assert crash.run_status[target] == "completed"  # the sub-run's log has RunCompleted
    assert crash.started["c005"] == 1 and "c005" not in crash.succeeded  # the parent's not

    outcome = _outcome(_child(world, ledger, "resume", n, 4))
    assert outcome["output"] == _expected_answer(n)
    final = _read_log(world)
    entries = _ledger(ledger)
    _assert_resumed_exactly_once(n, crash, final, entries)
    # Its output came from its log: no step of it ran again, nothing was appended to it,
    # and the orchestrator's log now has the terminal event.
    assert not [e for e in entries if e["label"] == "resume" and e.get("run_id") == target]
    assert final.versions[target] == crash.versions[target]
    assert final.succeeded["c005"] == {"sub_run_id": target, "status": "completed", "output": 51}


def test_sub_run_failed_before_its_failure_was_recorded_is_not_run_again(
    tmp_path: Path,
) -> None:
    # Its failure is read from its log, as a completed sub-run's result is: run again, its
    # failed step would get a fresh attempt, and the model another answer than it had.
    world = tmp_path / "world"
    ledger = tmp_path / "ledger"
    n = 6
    target = _sub_run_id(3)
    first = _child(
        world,
        ledger,
        "first",
        n,
        2,
        ORCHESTRATOR_FAIL_N="3",
        LITTLE_ES_CRASH_AFTER_EVENT=f"RunFailed:originator_id={run_stream_id(target)}",
    )
    assert first.returncode == -signal.SIGKILL, (first.returncode, first.stderr)
    assert _read_log(world).run_status[target] == "failed"

    env = {"ORCHESTRATOR_FAIL_N": "0"}  # fixed meanwhile: still not run again
    outcome = _outcome(_child(world, ledger, "resume", n, 2, **env))
    assert outcome["output"]["answer"].endswith(f"ok={n - 1} failed=1")
    entries = _ledger(ledger)
    ran = Counter(e["run_id"] for e in entries if e["kind"] == "step")
    assert ran[target] == 2  # its fetch and its compute, once each, before the crash
    with local_world(world) as w:
        failed = [e for e in w.read_stream(SESSION_ID) if isinstance(e, ToolCallFailed)]
    assert [(e.call_id, e.error.type) for e in failed] == [("c003", "SubRunFailedError")]

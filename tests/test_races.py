"""Eight real processes at once: racing for one run, and appending to one world.

``tests/test_runtime_concurrency.py`` has two processes race for one run and one
process refuse a second driver in-process; ``tests/test_leases.py`` has a driver lose
its lease to another. Here, with eight processes (forked by ``tests/_race_proc.py``
from one that imported everything, each opening its own world), on SQLite and on
PostgreSQL:

* eight race to start the same run, and eight race to resume the same half-done run
  (its first process SIGKILLed after step ``first`` committed): exactly one drives it;
  the seven others stop with ``ConcurrentRunError`` while it is still driving (its
  step ``hold`` waits for a file that this test creates only once the seven have
  exited), and the torture ledger (``O_APPEND`` + fsync, outside every process) shows
  each step body executed once, by the driver (``first`` by the killed process when
  resuming);
* eight different runs append at once to one SQLite file and to one PostgreSQL
  database: every run completes, every log holds exactly its events in order (none
  lost, none twice, one row per notification id), every chain verifies, nobody waits
  for ever (the child kills a process still running after its timeout, which fails
  here). The throughput (steps/s in total and per process) is printed;
  ``benchmarks/bench_concurrency.py`` measures it against a floor.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any
from uuid import UUID

import orjson
import pytest

from little_es import RunCompleted, RunStarted, StepCompleted, StepStarted, World, verify_world
from little_es.faults import CRASH_AFTER_APPENDS
from little_es.ids import run_stream_id
from tests.conftest import WorldSpec
from tests.torture.ledger import read_ledger

pytestmark = [pytest.mark.timeout(180), pytest.mark.backends("sqlite", "postgres", "mariadb")]

REPO = Path(__file__).resolve().parents[1]
PROC = REPO / "tests" / "_race_proc.py"
PROCS = 8
RUN_ID = "run_race"
WRITER_STEPS = 25
CHILD_TIMEOUT_S = 120.0


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LITTLE_ES_CRASH_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.update(extra)
    return env


def _start(spec: WorldSpec, mode: str, where: Path, *args: str, **env: str) -> Any:
    argv = [sys.executable, str(PROC), mode, "--world", spec.url, "--dir", str(where)]
    argv += ["--timeout", str(CHILD_TIMEOUT_S), *args]
    return subprocess.Popen(
        argv,
        env=_env(**env),
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(proc: Any) -> dict[str, Any]:
    try:
        out, err = proc.communicate(timeout=CHILD_TIMEOUT_S + 30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    assert proc.returncode == 0, err
    report: dict[str, Any] = orjson.loads(out.splitlines()[-1])
    return report


def _outcomes(where: Path) -> list[dict[str, Any]]:
    return [orjson.loads(p.read_bytes()) for p in sorted(where.glob("out-*.json"))]


@pytest.mark.parametrize("start", ["fresh", "resume"])
def test_eight_processes_racing_for_one_run_exactly_one_drives_it(
    world_spec: WorldSpec, world: World, tmp_path: Path, start: str
) -> None:
    ledger_path = tmp_path / "race" / "ledger"
    killed_pid = None
    if start == "resume":
        # Half done: RunStarted and step `first` committed, then SIGKILL.
        first = _start(
            world_spec, "race", tmp_path / "half", "--procs", "1", **{CRASH_AFTER_APPENDS: "3"}
        )
        (killed,) = _finish(first)["children"]
        assert killed["outcome"] == "killed" and killed["code"] == -9, killed
        killed_pid = killed["pid"]
        # The killed process kept its ledger apart; the racers append to the same file.
        ledger_path.parent.mkdir(parents=True, exist_ok=True)
        ledger_path.write_bytes((tmp_path / "half" / "ledger").read_bytes())

    release = tmp_path / "release"
    proc = _start(world_spec, "race", tmp_path / "race", "--release", str(release))
    try:
        deadline = time.monotonic() + CHILD_TIMEOUT_S
        while len(_outcomes(tmp_path / "race")) < PROCS - 1:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, _outcomes(tmp_path / "race")
            time.sleep(0.01)
        # Seven have stopped; the driver is still holding the run (and cannot finish
        # before the release file exists).
        stopped = _outcomes(tmp_path / "race")
    finally:
        release.touch()
    report = _finish(proc)

    children = report["children"]
    assert Counter(c["outcome"] for c in children) == {"concurrent": PROCS - 1, "ran": 1}
    (winner,) = (c for c in children if c["outcome"] == "ran")
    assert winner["pid"] not in {c["pid"] for c in stopped}
    assert all(c["outcome"] == "concurrent" for c in stopped)
    for loser in (c for c in children if c is not winner):
        assert loser["code"] == 3 and RUN_ID in loser["message"], loser
    assert winner["code"] == 0 and winner["status"] == "completed"
    assert winner["resumed"] is (start == "resume")
    assert winner["steps_executed"] == (2 if start == "resume" else 3)

    entries = read_ledger(ledger_path)
    executed = Counter(e.item.where for e in entries)
    assert executed == {"first": 1, "hold": 1, "last": 1}, entries
    by = {e.item.where: e.segment for e in entries}
    assert by == {
        "first": killed_pid if start == "resume" else winner["pid"],
        "hold": winner["pid"],
        "last": winner["pid"],
    }
    events = world.read_run_log(RUN_ID)
    assert [e.step_path for e in events if isinstance(e, StepStarted)] == ["first", "hold", "last"]
    assert isinstance(events[-1], RunCompleted)
    assert verify_world(world, RUN_ID).ok
    slowest = max(c["ended"] - report["go"] for c in stopped)
    print(f"{start}: {PROCS - 1} losers stopped within {slowest * 1000:.0f} ms of the start")


def test_eight_runs_appending_at_once_lose_nothing_and_duplicate_nothing(
    world_spec: WorldSpec, world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prefix = "run_writer_"
    proc = _start(
        world_spec,
        "write",
        tmp_path / "write",
        "--steps",
        str(WRITER_STEPS),
        "--run-prefix",
        prefix,
    )
    report = _finish(proc)
    children = report["children"]
    assert [c["outcome"] for c in children] == ["ran"] * PROCS, children
    assert all(c["status"] == "completed" for c in children)
    assert all(c["steps_executed"] == WRITER_STEPS and not c["resumed"] for c in children)

    paths = [f"s{k}" for k in range(WRITER_STEPS)]
    for i in range(PROCS):
        events = world.read_run_log(f"{prefix}{i}")
        assert isinstance(events[0], RunStarted) and isinstance(events[-1], RunCompleted)
        middle = events[1:-1]
        assert [type(e) for e in middle] == [StepStarted, StepCompleted] * WRITER_STEPS
        assert [e.step_path for e in middle[::2]] == paths
        assert [e.step_path for e in middle[1::2]] == paths
        assert [e.originator_version for e in events] == list(range(1, len(events) + 1))

    # Every row of the world, by notification id: each run's rows once, none of another.
    streams = {run_stream_id(f"{prefix}{i}"): i for i in range(PROCS)}
    rows: Counter[int] = Counter()
    ids: list[int] = []
    start = None
    while page := world.app.recorder.select_notifications(
        start=start, limit=1000, inclusive_of_start=start is None
    ):
        for n in page:
            ids.append(n.id)
            sid = n.originator_id if isinstance(n.originator_id, UUID) else UUID(n.originator_id)
            if sid in streams:
                rows[streams[sid]] += 1
        start = page[-1].id
    assert len(ids) == len(set(ids))
    assert rows == dict.fromkeys(range(PROCS), 2 * WRITER_STEPS + 2)
    checked = verify_world(world)
    assert checked.ok, [s for s in checked.streams if s.problem]

    began = min(c["started"] for c in children)
    ended = max(c["ended"] for c in children)
    total = PROCS * WRITER_STEPS / (ended - began)
    each = sorted(WRITER_STEPS / (c["ended"] - c["started"]) for c in children)
    with capsys.disabled():
        print(
            f"\n{world_spec.backend}: {PROCS} writers x {WRITER_STEPS} steps:"
            f" {total:,.0f} steps/s in total, per process {each[0]:,.0f}-{each[-1]:,.0f}"
            f" steps/s (median {each[len(each) // 2]:,.0f})"
        )

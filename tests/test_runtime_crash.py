"""Kill-and-resume with real processes, at every append of a run.

The child (``tests/_runtime_proc.py crash``, forked by
:class:`~little_es.testing.CrashRunner`) runs a workflow with tasks, a
parallel group, a retried step, a sub-run and a decision loop on a SQLite world
(and, at a sample of the kill points, on a MariaDB one: the states must equal
the SQLite run's).
An uninterrupted run gives the number of appends ``N`` (append transactions: a
step's ``StepCompleted`` is committed with the next record, so one may hold two
events) and the reference state.
Then, for every ``k`` in ``1..N``, a child on a fresh world is SIGKILLed right
after its ``k``-th append (``LITTLE_ES_CRASH_AFTER_APPENDS``) and another child
resumes the run to completion. The side-effect ledger the step functions write
(one line per real execution) must show that every step attempt whose terminal
event (``StepCompleted``/``StepFailed``) was committed at the kill ran exactly
once overall, that one in flight at the kill ran at most twice, and every other
exactly once; the final materialized states (run and sub-run) must equal the
uninterrupted run's, timestamps aside.

The scenarios run in a small pool of concurrent child processes to stay fast.
"""

from __future__ import annotations

import queue
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from little_es.engine.executor import sub_run_id_for
from little_es.events import Event, StepCompleted, StepFailed, StepStarted
from little_es.materialize import materialize_run_state
from little_es.pricing import price_usage_exact
from little_es.testing import ChildResult, CrashRunner
from little_es.world import open_world
from tests.conftest import (
    create_test_database,
    drop_test_database,
    mysql_database_url,
    require_mysql,
)

pytestmark = pytest.mark.timeout(240)

_REPO = Path(__file__).resolve().parents[1]
_TARGET = "tests._runtime_proc:main"
_RUN_ID = "run_proc"
_SUB_RUN_ID = sub_run_id_for(_RUN_ID, "sub")
_WORKERS = 3
# Double crashes: killed at k, then killed again 3 appends into the resume.
_SECOND_KILL_AFTER = 3
_DOUBLE_CRASH_POINTS = (4, 11, 17, 21)

_Key = tuple[str, str, int]
"""(run id, step path, attempt): one step execution."""


@dataclass(frozen=True)
class _Observed:
    """What the world and the ledger held at one moment."""

    events: int
    terminal: frozenset[_Key]
    in_flight: frozenset[_Key]
    ledger: Counter[_Key]


@dataclass(frozen=True)
class _Baseline:
    appends: int
    events: int
    states: dict[str, dict[str, Any]]
    ledger: Counter[_Key]
    output: Any


_MakeWorld = Callable[[Path], str]
"""A fresh world for one scenario (whose files go under the path): its URL."""


def _sqlite_world(root: Path) -> str:
    return f"sqlite:///{root / 'world'}"


def _child(server: CrashRunner, world: str, ledger: Path, crash_after: int | None) -> ChildResult:
    """Run one child to its end (or its kill)."""
    argv = ["crash", "--world", world, "--ledger", str(ledger)]
    return server.run(_TARGET, argv, crash_after_appends=crash_after)


@pytest.fixture(scope="module")
def servers() -> Iterator[queue.Queue[CrashRunner]]:
    """A pool of fork servers, one per concurrent scenario."""
    pool: queue.Queue[CrashRunner] = queue.Queue()
    started = [CrashRunner(pythonpath=[_REPO], cwd=_REPO) for _ in range(_WORKERS)]
    for server in started:
        pool.put(server)
    yield pool
    for server in started:
        server.close()


def _read_ledger(ledger: Path) -> Counter[_Key]:
    counts: Counter[_Key] = Counter()
    if ledger.exists():
        for line in ledger.read_text().splitlines():
            _pid, run_id, path, attempt = line.split(" ")
            counts[(run_id, path, int(attempt))] += 1
    return counts


def _logs(url: str) -> dict[str, list[Event]]:
    with open_world(url) as world:
        return {
            run_id: world.read_run_log(run_id)
            for run_id in (_RUN_ID, _SUB_RUN_ID)
            if world.run_exists(run_id)
        }


def _observe(world_dir: str, ledger: Path) -> _Observed:
    started: set[_Key] = set()
    terminal: set[_Key] = set()
    count = 0
    for run_id, events in _logs(world_dir).items():
        count += len(events)
        for e in events:
            if isinstance(e, StepStarted):
                started.add((run_id, e.step_path, e.attempt))
            elif isinstance(e, StepCompleted | StepFailed):
                terminal.add((run_id, e.step_path, e.attempt))
    return _Observed(
        events=count,
        terminal=frozenset(terminal),
        in_flight=frozenset(started - terminal),
        ledger=_read_ledger(ledger),
    )


def _states(world_dir: str) -> dict[str, dict[str, Any]]:
    timestamps = {"started_at", "updated_at", "completed_at"}
    return {
        run_id: materialize_run_state(events, pricer=price_usage_exact).model_dump(
            mode="json", exclude=timestamps
        )
        for run_id, events in _logs(world_dir).items()
    }


@pytest.fixture(scope="module")
def baseline(
    tmp_path_factory: pytest.TempPathFactory, servers: queue.Queue[CrashRunner]
) -> _Baseline:
    """The uninterrupted run: its append count, final states, ledger and output."""
    root = tmp_path_factory.mktemp("baseline")
    world_dir, ledger = _sqlite_world(root), root / "ledger"
    server = servers.get()
    try:
        result = _child(server, world_dir, ledger, None).result()
    finally:
        servers.put(server)
    assert result["resumed"] is False
    observed = _observe(world_dir, ledger)
    counts = observed.ledger
    # One line per real execution; the retried step's two attempts are two.
    assert set(counts.values()) == {1}
    assert {(p, a) for r, p, a in counts if p == "flaky"} == {("flaky", 1), ("flaky", 2)}
    assert any(r == _SUB_RUN_ID for r, _, _ in counts)
    states = _states(world_dir)
    assert states[_RUN_ID]["status"] == "completed"
    assert states[_SUB_RUN_ID]["status"] == "completed"
    # A commit holds one event, or a step's StepCompleted with the next record.
    appends = int(result["appends"])
    assert observed.events // 2 < appends < observed.events, (appends, observed.events)
    return _Baseline(appends, observed.events, states, counts, result["output"])


def _check_ledger(kills: list[_Observed], final: Counter[_Key], expected: Counter[_Key]) -> None:
    assert set(final) == set(expected), f"executions differ: {set(final) ^ set(expected)}"
    first_terminal = kills[0].terminal
    for key, count in final.items():
        if key in first_terminal:
            assert count == 1, f"{key} was committed at the kill but ran {count} times"
            assert all(k.ledger[key] == 1 for k in kills), f"{key} ran again after its commit"
        else:
            in_flight_at = sum(key in k.in_flight for k in kills)
            assert 1 <= count <= 1 + in_flight_at, (
                f"{key} ran {count} times; it was in flight at {in_flight_at} kill(s)"
            )


def _scenario(
    server: CrashRunner,
    root: Path,
    kill_points: tuple[int, ...],
    baseline: _Baseline,
    make_world: _MakeWorld,
) -> None:
    """Kill a run after each append count in ``kill_points`` (one child each), then resume."""
    world_dir, ledger = make_world(root), root / "ledger"
    kills: list[_Observed] = []
    for n, k in enumerate(kill_points):
        before = kills[-1].events if kills else 0
        proc = _child(server, world_dir, ledger, k)
        assert proc.killed, (
            f"kill point {k}: expected SIGKILL, got {proc.returncode}:\n{proc.output}"
        )
        observed = _observe(world_dir, ledger)
        # Each of the k appends committed one event, or two (a StepCompleted held
        # for the next record's commit).
        assert before + k <= observed.events <= before + 2 * k, (
            f"kill {n + 1} after {k} appends: the log holds {observed.events - before} new events"
        )
        kills.append(observed)
    result = _child(server, world_dir, ledger, None).result()
    assert result["resumed"] is True
    assert result["output"] == baseline.output
    _check_ledger(kills, _read_ledger(ledger), baseline.ledger)
    assert _states(world_dir) == baseline.states


def _run_all(
    servers: queue.Queue[CrashRunner],
    tmp_path: Path,
    scenarios: Sequence[tuple[int, ...]],
    baseline: _Baseline,
    make_world: _MakeWorld = _sqlite_world,
) -> None:
    def attempt(points: tuple[int, ...]) -> str | None:
        root = tmp_path / "-".join(map(str, points))
        root.mkdir()
        server = servers.get()
        try:
            _scenario(server, root, points, baseline, make_world)
        except AssertionError as exc:
            return f"kill points {points}: {exc}"
        finally:
            servers.put(server)
        return None

    with ThreadPoolExecutor(max_workers=_WORKERS) as pool:
        failures = [f for f in pool.map(attempt, scenarios) if f is not None]
    assert not failures, "\n\n".join(failures)


def _points(appends: int) -> Iterator[tuple[int, ...]]:
    return ((k,) for k in range(1, appends + 1))


def test_a_run_killed_after_any_append_resumes_to_the_same_state(
    servers: queue.Queue[CrashRunner], tmp_path: Path, baseline: _Baseline
) -> None:
    assert baseline.appends >= 24
    _run_all(servers, tmp_path, list(_points(baseline.appends)), baseline)


def test_a_resume_killed_again_still_converges(
    servers: queue.Queue[CrashRunner], tmp_path: Path, baseline: _Baseline
) -> None:
    points = [(k, _SECOND_KILL_AFTER) for k in _DOUBLE_CRASH_POINTS if k + 3 < baseline.appends]
    assert len(points) == len(_DOUBLE_CRASH_POINTS)
    _run_all(servers, tmp_path, points, baseline)


def test_the_crash_switch_past_the_last_append_does_not_fire(
    servers: queue.Queue[CrashRunner], tmp_path: Path, baseline: _Baseline
) -> None:
    # Proves N is the exact append count: N kills after RunCompleted, N + 1 never fires.
    server = servers.get()
    try:
        proc = _child(server, _sqlite_world(tmp_path), tmp_path / "ledger", baseline.appends + 1)
    finally:
        servers.put(server)
    assert proc.result()["output"] == baseline.output
    assert proc.result()["appends"] == baseline.appends
    assert _observe(_sqlite_world(tmp_path), tmp_path / "ledger").events == baseline.events


@pytest.fixture
def mariadb_worlds() -> Iterator[_MakeWorld]:
    """Fresh MariaDB databases, one per scenario, dropped after the test."""
    server = require_mysql()
    made: list[str] = []

    def make(root: Path) -> str:
        made.append(create_test_database(server))
        return mysql_database_url(server, made[-1])

    yield make
    for database in made:
        drop_test_database(server, database)


@pytest.mark.mariadb
def test_on_mariadb_a_run_killed_at_sampled_appends_resumes_to_the_same_state(
    servers: queue.Queue[CrashRunner],
    tmp_path: Path,
    baseline: _Baseline,
    mariadb_worlds: _MakeWorld,
) -> None:
    # Every fifth kill point, the last one, and two double kills: the whole matrix
    # runs on SQLite above; here the same workflow, killed by SIGKILL, on MariaDB.
    points = [(k,) for k in range(1, baseline.appends + 1, 5)]
    points += [(baseline.appends,), (4, _SECOND_KILL_AFTER), (21, _SECOND_KILL_AFTER)]
    _run_all(servers, tmp_path, list(dict.fromkeys(points)), baseline, mariadb_worlds)

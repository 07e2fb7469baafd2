"""The short torture run (CI), the fresh-interpreter engine, and the checker's own tests.

The long version: ``python -m tests.torture --kills 1000 --world URL``.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from little_es_temporal import DevServer

from little_es import Workflow, World, run_workflow, task
from little_es.ids import run_stream_id
from tests import _temporal_support
from tests.torture.checker import (
    LogFacts,
    RunImage,
    check_final,
    check_fork,
    check_ledger,
    check_loop,
    check_loop_view,
    check_verify,
    check_verify_cli,
    check_wait,
)
from tests.torture.child import BUG_ENV, LOOP_RERUN_CYCLE, RERUN_COMPLETED
from tests.torture.driver import (
    AFTER_WAIT,
    LEDGERED_TOP_STEPS,
    TOP_STEPS,
    AppendsKill,
    ForkServerEngine,
    SubprocessEngine,
    Summary,
    TimerKill,
    Torturer,
    torture,
)
from tests.torture.ledger import Entry, read_ledger, step_item
from tests.torture.temporal_engine import TemporalEngine
from tests.torture.workflow import APPROVAL, BUGGY_STEP, WAIT_STEP

if TYPE_CHECKING:
    from tests.conftest import WorldSpec

pytestmark = pytest.mark.torture

# One Temporal dev server for the module's Temporal tests (skipped without the binary,
# failed under CI=true).
dev_server = _temporal_support.dev_server

SHORT_KILLS = 8
SHORT_BOUNDARIES = 2
SEED = 16


@pytest.mark.backends("sqlite", "postgres")
def test_short_torture(world_spec: WorldSpec, tmp_path: Path) -> None:
    """Seeded kills (boundaries, timers, append counts): every run passes every check."""
    summary = torture(
        world_spec.url,
        kills=SHORT_KILLS,
        seed=SEED,
        boundaries=SHORT_BOUNDARIES,
        workdir=tmp_path / "torture",
    )
    print(summary.line(world_spec.url))
    assert summary.violations == []
    assert summary.kills >= SHORT_KILLS
    assert summary.resumes >= summary.kills
    # Each capability ran under kills: a loop, a fork, and every run's wait signalled.
    assert summary.loop_runs >= 1 and summary.fork_runs >= 1
    assert sum(summary.signals.values()) == summary.runs - summary.loop_runs


@pytest.mark.backends("sqlite")
def test_fresh_interpreter_per_process(world_spec: WorldSpec, tmp_path: Path) -> None:
    """The same checks with a new interpreter per process (no fork server in between)."""
    torturer = Torturer(world_spec.url, tmp_path / "torture", SubprocessEngine())
    torturer.open()
    try:
        # One kill mid-run by its own hand, one by a timer (past the imports).
        timer = TimerKill(torturer.startup_seconds + 0.05)
        report = torturer.run("torture-fresh", [AppendsKill(30), timer])
    finally:
        torturer.close()
    assert report.violations == []
    assert report.kills >= 1
    # What the final state was compared with: the whole tree, completed, artifact included.
    assert sorted(torturer.reference) == [
        "<<run>:nested/>",
        "<<run>:orchestrate/s1>",
        "<<run>:orchestrate/s2>",
        "<<run>:orchestrate/s3>",
        "<run>",
    ]
    main = torturer.reference["<run>"].state
    assert isinstance(main, dict) and main["status"] == "completed"
    steps = main["steps"]
    assert isinstance(steps, dict) and len(steps) == 21
    assert steps[WAIT_STEP] == {**steps[WAIT_STEP], "status": "completed", "output": APPROVAL}
    big = steps["big"]
    assert isinstance(big, dict) and big["output_ref"] is not None


@pytest.mark.backends("sqlite", "postgres")
def test_checker_flags_a_rerun_of_a_completed_step(world_spec: WorldSpec, tmp_path: Path) -> None:
    """The deliberate bug (``TORTURE_BUG``) runs a committed step again: it is reported."""
    torturer = Torturer(
        world_spec.url, tmp_path / "torture", ForkServerEngine(), env={BUG_ENV: RERUN_COMPLETED}
    )
    torturer.open()
    try:
        report = torturer.run("torture-bug", [AppendsKill(12)])
    finally:
        torturer.close()
    messages = [v.what for v in report.violations]
    rerun = f"step torture-bug {BUGGY_STEP} #1 was committed when process "
    assert any(m.startswith(rerun) for m in messages), messages
    assert "one more resume executed something" in messages
    # Nothing else is wrong with the run (its chains verify): the checker names what the
    # bug did, only that (a resume after the run waited ran ``prepare`` again too).
    after_wait = f"step torture-bug {BUGGY_STEP} #1 was committed before the run waited"
    assert all(
        m.startswith((rerun, after_wait)) or m == "one more resume executed something"
        for m in messages
    ), messages


@pytest.mark.backends("sqlite")
def test_checker_flags_a_loop_cycle_that_reruns_its_committed_run(
    world_spec: WorldSpec, tmp_path: Path
) -> None:
    """The loop's deliberate bug runs cycle 1's committed run's first step again: reported."""
    torturer = Torturer(
        world_spec.url,
        tmp_path / "torture",
        ForkServerEngine(),
        env={BUG_ENV: LOOP_RERUN_CYCLE},
        mode="loop",
    )
    torturer.open()
    try:
        # Killed after cycle 1's run completed (the loop makes ~45 appends).
        report = torturer.run("torture-loop-bug", [AppendsKill(30)])
    finally:
        torturer.close()
    messages = [v.what for v in report.violations]
    rerun = "step torture-loop-bug.cycle-1 fetch #1 was committed when process 0 ended"
    assert any(m.startswith(rerun) for m in messages), messages
    assert all(m.startswith(rerun) or m == "one more resume executed something" for m in messages)
    # The loop's view file, edited behind its back, no longer is its log's view.
    assert world_spec.data_dir is not None
    view = world_spec.data_dir / "outer-loops" / "torture-loop-bug.json"
    assert view.exists()
    with world_spec.open() as world:
        assert check_loop_view(world, "torture-loop-bug") == []
        view.write_bytes(view.read_bytes().replace(b'"planner_done"', b'"max_cycles"'))
        found = [v.what for v in check_loop_view(world, "torture-loop-bug")]
    assert found == ["the loop's view file disagrees with its log"]


@pytest.mark.backends("sqlite")
def test_checker_flags_a_wait_or_a_fork_that_runs_what_it_must_not(
    world_spec: WorldSpec, tmp_path: Path
) -> None:
    """Checks 8 and 10 on a real run and a real fork, given ledgers that break them."""
    engine = ForkServerEngine()
    runs = Torturer(world_spec.url, tmp_path / "torture", engine, owns_engine=False)
    runs.open()
    forks = Torturer(world_spec.url, tmp_path / "torture", engine, mode="fork", origin=runs)
    forks.open()
    try:
        report = runs.run("torture-w", [AppendsKill(20)])
        assert report.violations == [], report.violations
        fork = forks.fork("torture-w-fork", [AppendsKill(5)], origin="torture-w", at="judge@2")
        assert fork.violations == [], fork.violations
        ledger = read_ledger(runs.workdir / "torture-w.ledger")
        track = report.wait
        assert track.waited_segment is not None and track.signal_segment is not None
        good = check_wait("torture-w", runs.world, WAIT_STEP, APPROVAL, AFTER_WAIT, ledger, track)
        assert good == []
        # ``prepare`` again after the run waited; ``finish`` before the signal came.
        late = Entry(step_item("torture-w", "prepare", 1), track.waited_segment + 1)
        early = Entry(step_item("torture-w", "finish", 1), track.signal_segment - 1)
        bad = check_wait(
            "torture-w",
            runs.world,
            WAIT_STEP,
            {"approved": False},
            AFTER_WAIT,
            [late, early],
            track,
        )
        found = [v.what for v in bad]
        assert len(found) == 5, found
        assert "approve took 1 signals" not in " ".join(found)
        assert found[0].startswith("approve recorded signal data")
        assert "was committed before the run waited" in found[3]
        assert "comes after the wait and executed in process" in found[4]

        # The fork ran ``prepare`` (copied) again, and never ran ``finish`` (after judge@2).
        inherited = fork.inherited
        fork_ledger = read_ledger(forks.workdir / "torture-w-fork.ledger")
        assert (
            check_fork(
                "torture-w-fork",
                forks.world,
                "torture-w",
                "judge@2",
                inherited,
                fork_ledger,
                TOP_STEPS,
                LEDGERED_TOP_STEPS,
            )
            == []
        )
        again = Entry(step_item("torture-w-fork", "prepare", 1), 0)
        entries = [e for e in fork_ledger if e.item.where != "finish"] + [again]
        found = [
            v.what
            for v in check_fork(
                "torture-w-fork",
                forks.world,
                "torture-w",
                "judge@2",
                inherited,
                entries,
                TOP_STEPS,
                LEDGERED_TOP_STEPS,
            )
        ]
        assert found == [
            "step torture-w-fork prepare #1 is in the prefix the fork copied from torture-w and"
            " executed again in the fork (process 0)",
            "step finish (after the fork point judge@2) never executed in the fork",
        ]
    finally:
        forks.close()
        runs.close()
        engine.close()


def test_checker_flags_a_loop_that_ends_differently() -> None:
    """Check 9 on hand-made loop images: another cycle sequence, another view, an unstable one."""

    def view(decisions: list[bool], version: int) -> dict[str, Any]:
        cycles = [
            {"cycle": i + 1, "status": "done" if d else "completed", "decision": {"done": d}}
            for i, d in enumerate(decisions)
        ]
        return {"version": version, "cycles": cycles}

    want = view([False, False, True], 10)
    assert check_loop("l", want, want, want) == []
    found = [v.what for v in check_loop("l", view([False, True], 8), want, view([True], 1))]
    assert found[0].startswith("cycle sequence [")
    assert found[1].startswith("loop final state differs: at .cycles")
    assert found[2] == "two loads of the loop gave different views"


def test_checker_flags_double_execution_and_results_without_execution() -> None:
    """The ledger checks on hand-made ledgers."""
    a, b, c = (step_item("r", p, 1) for p in ("a", "b", "c"))
    facts = LogFacts(committed={a, b}, ledgered={a, b})
    entries = [Entry(a, 0), Entry(a, 0), Entry(c, 1)]
    report = check_ledger("r", entries, [{a}, {a, b}], facts)
    found = sorted(v.what for v in report.violations)
    assert found == [
        "step r a #1 executed 2 times in process 0",
        "step r b #1 has a result in the log but never executed",
        "step r c #1 executed but its result is not in the log",
    ]


def test_checker_counts_in_flight_re_executions() -> None:
    """An item run in process 0, not committed at the kill, run again in 1: one re-execution."""
    a = step_item("r", "a", 1)
    facts = LogFacts(committed={a}, ledgered={a})
    report = check_ledger("r", [Entry(a, 0), Entry(a, 1)], [set(), {a}], facts)
    assert report.violations == []
    assert report.reexecuted == 1


def test_summary_line_names_every_figure() -> None:
    """The long version's one line: runs, kills, resumes, re-executions, violations, seconds."""
    summary = Summary(
        runs=4,
        loop_runs=1,
        fork_runs=1,
        signals={"api": 1, "cli": 1, "live": 0},
        kills=3,
        resumes=4,
        reexecuted=1,
        seconds=1.5,
        engine="local-fork",
    )
    assert summary.line("postgresql://u:secret@h/db") == (
        "torture engine=local-fork world=postgresql://u:***@h/db runs=4 loop_runs=1"
        " fork_runs=1 signals=api:1,cli:1,live:0 kills=3 resumes=4"
        " reexecuted_in_flight=1 violations=0 seconds=1.5"
    )


def test_checker_flags_a_different_final_state() -> None:
    """A state, a result count or a missing run that differs from the uninterrupted run's."""
    want = {
        "<run>": RunImage("<run>", {"output": {"n": 1}}, {"StepCompleted": 2}, {"StepStarted": 2}),
        "<<run>:nested/>": RunImage("<<run>:nested/>", {}, {}, {}),
    }
    got = {"<run>": RunImage("<run>", {"output": {"n": 2}}, {"StepCompleted": 3}, {})}
    found = [v.what for v in check_final("r", got, want)]
    assert found == [
        "runs missing from the tree: ['<<run>:nested/>']",
        "<run>: final state differs: at .output.n: 2 != 1 (uninterrupted)",
        "<run>: result events {'StepCompleted': 3} != uninterrupted {'StepCompleted': 2}",
        "<run>: fewer write-ahead records than uninterrupted: {'StepStarted': (0, 2)}",
    ]


@pytest.mark.backends("sqlite", "postgres")
async def test_checker_flags_a_run_that_does_not_verify(
    world_spec: WorldSpec, world: World, world_factory: Callable[[], World]
) -> None:
    """Check 7: an edited row is a violation of the run's check and of ``little verify --all``."""
    wf = Workflow("verified", steps=[task("a", lambda ctx: 1), task("b", lambda ctx: 2)])
    await run_workflow(world, wf, {}, run_id="run_verified")
    assert check_verify(world, "run_verified") == []
    assert check_verify_cli(world_spec.url) == []

    # One payload byte changed behind the library's back, as a damaged disk would.
    stream = run_stream_id("run_verified")
    pg = world_spec.backend == "postgres"
    # Read through the view that spells out stream ids; edit the row in its table.
    mark = "%s" if pg else "?"
    table, edit_table, edit_id = (
        ("little_es_rows", "little_es_events", "notification_id")
        if pg
        else ("little_es_rows", "little_es_events", "rowid")
    )
    where = f"originator_id = {mark} AND originator_version = 2"
    key = stream if pg else stream.hex
    if pg:
        conn: Any = world_spec.connect_postgres()
    else:
        assert world_spec.data_dir is not None
        conn = sqlite3.connect(world_spec.data_dir / "events.sqlite3", isolation_level=None)
    try:
        (row_id, state) = conn.execute(
            f"SELECT notification_id, state FROM {table} WHERE {where}", (key,)
        ).fetchone()
        edited = bytearray(state)
        edited[-3] ^= 1
        conn.execute(
            f"UPDATE {edit_table} SET state = {mark} WHERE {edit_id} = {mark}",
            (bytes(edited), row_id),
        )
    finally:
        conn.close()
    found = check_verify(world_factory(), "run_verified")
    assert len(found) == 1 and found[0].what.startswith("little verify: run run_verified"), found
    cli = check_verify_cli(world_spec.url)
    assert len(cli) == 1 and cli[0].what.startswith("little verify --all exited 1"), cli


# ------------------------------------------------------------------ on Temporal

TEMPORAL_SUB_RUN_KILL = AppendsKill(58)
"""A worker's 58th append: among the orchestrator's sub-runs (child workflows), some of
their steps committed, some not (an uninterrupted run's worker makes about 90)."""


@pytest.fixture(scope="module")
def temporal_torturer(
    dev_server: DevServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Torturer]:
    """A torturer on Temporal (one dev server, a worker per process), its reference run done."""
    tmp = tmp_path_factory.mktemp("torture-temporal")
    torturer = Torturer(f"sqlite:///{tmp / 'world'}", tmp / "torture", TemporalEngine(dev_server))
    torturer.open()
    try:
        yield torturer
    finally:
        torturer.close()


@pytest.mark.temporal
@pytest.mark.timeout(300)
def test_short_torture_on_temporal(temporal_torturer: Torturer) -> None:
    """Workers killed among the sub-runs and by a timer: the run passes every check."""
    torturer = temporal_torturer
    # One kill by the worker's own hand among the sub-runs, one by a timer in the resume.
    timer = TimerKill(torturer.startup_seconds + 0.7)
    report = torturer.run("torture-temporal", [TEMPORAL_SUB_RUN_KILL, timer])
    print(report.describe())
    assert report.violations == []
    assert report.segments[0].killed
    # The orchestrator's sub-runs' steps ran on both sides of the first kill: sub-runs on
    # Temporal were what the kill interrupted, and what the checks above covered.
    sub_segments = {
        e.segment
        for e in read_ledger(torturer._ledger(report.run_id))
        if e.item.run_id != report.run_id and e.item.where in ("fetch", "compute")
    }
    assert 0 in sub_segments and max(sub_segments) >= 1, sub_segments
    assert sorted(torturer.reference) == [
        "<<run>:nested/>",
        "<<run>:orchestrate/s1>",
        "<<run>:orchestrate/s2>",
        "<<run>:orchestrate/s3>",
        "<run>",
    ]


@pytest.mark.temporal
@pytest.mark.timeout(300)
def test_checker_flags_a_rerun_of_a_completed_step_on_temporal(
    temporal_torturer: Torturer,
) -> None:
    """The deliberate bug, in a Temporal worker's process: reported as on the local engine."""
    torturer = temporal_torturer
    torturer.env = {BUG_ENV: RERUN_COMPLETED}
    try:
        report = torturer.run("torture-temporal-bug", [AppendsKill(12)])
    finally:
        torturer.env = {}
    messages = [v.what for v in report.violations]
    rerun = f"step torture-temporal-bug {BUGGY_STEP} #1 was committed when process "
    assert any(m.startswith(rerun) for m in messages), messages
    assert "one more resume executed something" in messages
    after_wait = f"step torture-temporal-bug {BUGGY_STEP} #1 was committed before the run waited"
    assert all(
        m.startswith((rerun, after_wait)) or m == "one more resume executed something"
        for m in messages
    ), messages

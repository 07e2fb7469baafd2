"""Outer loops: cycles that resume after a real kill, drift that starts a fresh cycle, the stops.

The kill tests drive the loop of :mod:`tests._outer_loop_proc` in forked
children (:class:`~little_es.testing.CrashRunner`), SIGKILLed after each of
their appends in turn, on SQLite and PostgreSQL, and resume it here.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pytest
from pydantic import BaseModel
from rich.console import Console
from typer.testing import CliRunner

from little_es import (
    ConcurrentRunError,
    EngineUnsupportedError,
    LeaseLostError,
    ModelRequest,
    ModelResponse,
    OuterLoopMismatchError,
    OuterLoopNotFoundError,
    OuterLoopRequestError,
    Planner,
    RunEngine,
    RunWaitingError,
    ScriptedModel,
    ScriptedReply,
    StepContext,
    Usage,
    Workflow,
    World,
    agent,
    cancel_run,
    list_outer_loops,
    load_outer_loop,
    loop_view,
    run_outer_loop,
    run_outer_loop_sync,
    task,
    wait_for,
)
from little_es.cli import app
from little_es.events import OuterLoopCycleAbandoned
from little_es.outer_loop import encode_view, loop_lease_id
from little_es.render import render_loop_report
from little_es.replay import replay_run
from little_es.testing import CrashRunner
from little_es.world import local_world, memory_world
from tests import _outer_loop_proc as proc
from tests.conftest import WorldSpec

_REPO = Path(__file__).resolve().parent.parent
_TARGET = "tests._outer_loop_proc:main"
_HASHES = {
    "planner_manifest_hash",
    "started_planner_manifest_hash",
    "outer_loop_context_hash",
    "old_manifest_hash",
}


@pytest.fixture(scope="module")
def runner() -> Iterator[CrashRunner]:
    with CrashRunner(pythonpath=[_REPO], cwd=_REPO, preload=["tests._outer_loop_proc"]) as r:
        yield r


def _ledger(path: Path) -> Counter[str]:
    return Counter(path.read_text().splitlines()) if path.exists() else Counter()


def _normal(view: dict[str, Any], loop_id: str) -> Any:
    """A view with the loop's own id and the hashes that depend on it taken out."""

    def clean(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items() if k not in _HASHES}
        if isinstance(value, list):
            return [clean(v) for v in value]
        if isinstance(value, str):
            return value.replace(loop_id, "LOOP")
        return value

    return clean(view)


def _resume(world: World, loop_id: str, variant: str = "v1") -> str:
    # A PostgreSQL lease (an advisory lock) is freed when the server sees its killed
    # holder's connection close, a moment after the kill: until then a resume is
    # refused, appending nothing, and trying again is safe.
    deadline = time.monotonic() + 15
    while True:
        try:
            result = run_outer_loop_sync(
                world,
                planner=proc.make_planner(variant),
                workflow=proc.improve,
                outer_loop_id=loop_id,
            )
        except ConcurrentRunError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
            continue
        return result.reason


# ------------------------------------------------------------------ the happy path


def test_a_loop_plans_runs_and_ends_when_the_planner_says_done(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OUTER_LOOP_LEDGER", str(ledger))
        with local_world(tmp_path / "w") as world:
            world.set_model_price("scripted", "planner-1", input_per_mtok=3, output_per_mtok=15)
            result = asyncio.run(
                run_outer_loop(
                    world,
                    planner=proc.make_planner(),
                    workflow=proc.improve,
                    outer_loop_id="loop_a",
                    max_cycles=5,
                    input={"goal": "score"},
                )
            )
            assert result.reason == "planner_done"
            assert [c.status for c in result.cycles] == ["completed", "completed", "done"]
            assert result.last_output == {"score": 20}
            # 3 planners x 2 calls of 1000 in / 100 out at $3 / $15 per million tokens.
            assert result.totals.calls == 6
            assert result.totals.cost_usd == pytest.approx(6 * (0.003 + 0.0015))
            loop = load_outer_loop(world, "loop_a")
            view = loop_view(world, loop)
            assert view["pending_cycle_run_id"] is None
            assert view["status"] == "completed" and view["reason"] == "planner_done"
            stored = (tmp_path / "w" / "outer-loops" / "loop_a.json").read_bytes()
            assert stored == encode_view(view)
            # The planner saw the first cycle's outcome.
            second = loop.cycles[2].started
            assert second.planner_manifest["outer_loop_context_hash"] == (
                second.outer_loop_context_hash
            )
            before = _ledger(ledger)
            version = loop.version
            again = _resume(world, "loop_a")
            assert again == "planner_done"
            assert _ledger(ledger) == before, "a finished loop runs nothing again"
            assert load_outer_loop(world, "loop_a").version == version
    assert sorted(before.values()) == [1] * len(before)
    assert before["model loop_a 1 1"] == 1 and before["step loop_a.cycle-2 score"] == 1


def test_max_cycles_ends_the_loop(tmp_path: Path) -> None:
    with memory_world() as world:
        result = run_outer_loop_sync(
            world,
            planner=proc.make_planner(),
            workflow=proc.improve,
            outer_loop_id="loop_max",
            max_cycles=1,
        )
        assert result.reason == "max_cycles"
        assert [c.status for c in result.cycles] == ["completed"]
        assert [loop.started.outer_loop_id for loop in list_outer_loops(world) if loop.started] == [
            "loop_max"
        ]


def _failing(ctx: StepContext) -> None:
    raise RuntimeError(f"cycle input {ctx.input['x']} does not work")


_FAILS = Workflow("improve", steps=[task("work", _failing)])


@pytest.mark.parametrize(
    ("policy", "reason", "cycles"), [("stop", "cycle_failed", 1), ("continue", "max_cycles", 3)]
)
def test_a_failed_cycle_stops_the_loop_or_is_shown_to_the_planner(
    policy: str, reason: str, cycles: int
) -> None:
    seen: list[list[str]] = []

    def planner(request: ModelRequest) -> ModelResponse:
        context = json.loads(str(request.messages[0].content).split("(JSON):\n", 1)[1])
        seen.append([c["status"] for c in context["cycles"]])
        return ModelResponse(
            content='{"done": false, "input": {"x": 1}}', provider="scripted", model="p"
        )

    with memory_world() as world:
        result = run_outer_loop_sync(
            world,
            planner=Planner(model=ScriptedModel(respond=planner), prompt="plan"),
            workflow=_FAILS,
            outer_loop_id=f"loop_{policy}",
            max_cycles=3,
            on_cycle_failure=policy,  # type: ignore[arg-type]
        )
    assert result.reason == reason
    assert [c.status for c in result.cycles] == ["failed"] * cycles
    assert seen == [["failed"] * n for n in range(cycles)]


def test_an_answer_that_is_not_a_decision_ends_the_loop_as_planner_failed() -> None:
    with memory_world() as world:
        result = run_outer_loop_sync(
            world,
            planner=Planner(
                model=ScriptedModel([ScriptedReply(content="I think we should try harder")]),
                prompt="plan",
            ),
            workflow=proc.improve,
            outer_loop_id="loop_bad",
            max_cycles=3,
        )
        assert result.reason == "planner_failed"
        assert [c.status for c in result.cycles] == ["failed"]
        assert not world.run_exists("loop_bad.cycle-1")


# ------------------------------------------------------------------------ budget


@pytest.mark.parametrize("priced", [True, False])
def test_the_budget_counts_the_priced_calls_only(priced: bool) -> None:
    with memory_world() as world:
        if priced:
            world.set_model_price("scripted", "planner-1", input_per_mtok=3, output_per_mtok=15)
        result = run_outer_loop_sync(
            world,
            planner=proc.make_planner(),
            workflow=proc.improve,
            outer_loop_id="loop_budget",
            max_cycles=5,
            # One planner's two calls cost $0.009: the budget is spent after cycle 1.
            budget_usd=0.005,
        )
        if priced:
            assert result.reason == "budget"
            assert [c.status for c in result.cycles] == ["completed"]
            assert result.totals.cost_usd == pytest.approx(0.009)
        else:
            assert result.reason == "planner_done"
            assert result.totals.cost_usd is None
            assert result.totals.unpriced_calls == 6
        out = _report(world, "loop_budget")
        if not priced:
            assert "6 unpriced calls not in the dollars" in out


# ------------------------------------------------------------------- refusals


def test_a_resume_with_other_settings_is_refused_and_appends_nothing(tmp_path: Path) -> None:
    with local_world(tmp_path / "w") as world:
        run_outer_loop_sync(
            world,
            planner=proc.make_planner(),
            workflow=proc.improve,
            outer_loop_id="loop_r",
            max_cycles=1,
        )
        version = load_outer_loop(world, "loop_r").version
        other = Workflow("other", steps=[task("work", proc.work)])
        with pytest.raises(OuterLoopMismatchError, match="workflow='improve'"):
            run_outer_loop_sync(
                world, planner=proc.make_planner(), workflow=other, outer_loop_id="loop_r"
            )
        with pytest.raises(OuterLoopMismatchError, match="max_cycles=1"):
            run_outer_loop_sync(
                world,
                planner=proc.make_planner(),
                workflow=proc.improve,
                outer_loop_id="loop_r",
                max_cycles=4,
            )
        assert load_outer_loop(world, "loop_r").version == version
        with pytest.raises(OuterLoopNotFoundError, match="little loops"):
            load_outer_loop(world, "loop_nope")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"planner": "me"}, "planner must be a little_es Planner"),
        ({"workflow": 3}, "workflow must be a little_es Workflow"),
        ({"max_cycles": 0}, "max_cycles must be an integer from 1 to 2\\*\\*63 - 1"),
        ({"budget_usd": float("nan")}, "budget_usd must be a positive number"),
        ({"budget_usd": -1}, "budget_usd must be a positive number"),
        ({"input": {"x": object()}}, "input"),
        ({"on_cycle_failure": "retry"}, "on_cycle_failure must be 'stop' or 'continue'"),
        ({"outer_loop_id": "x" * 101}, "at most 100"),
        ({"outer_loop_id": "no/slash"}, "run id"),
        ({"engine": "temporal"}, "engine must be a little_es RunEngine"),
    ],
)
def test_bad_arguments_are_refused_before_anything_is_written(
    kwargs: dict[str, Any], match: str
) -> None:
    args: dict[str, Any] = {
        "planner": proc.make_planner(),
        "workflow": proc.improve,
        "outer_loop_id": "loop_args",
        "max_cycles": 2,
    }
    args.update(kwargs)
    with memory_world() as world:
        with pytest.raises((OuterLoopRequestError, ValueError), match=match):
            run_outer_loop_sync(world, **args)
        assert list_outer_loops(world) == ()


class _Elsewhere(RunEngine):
    """An engine named "elsewhere", which no run of this test reaches."""

    name = "elsewhere"

    async def run(
        self, world: World, workflow: Workflow, input: Mapping[str, Any] | None, *, run_id: str
    ) -> Any:
        raise AssertionError("the loop was refused: no run starts")


def test_a_loop_whose_steps_lack_the_engine_is_refused_before_anything_is_written() -> None:
    local_only = Workflow("local_only", steps=[task("work", proc.work, engines=["local"])])
    with memory_world() as world:
        with pytest.raises(EngineUnsupportedError, match="runs on local only"):
            run_outer_loop_sync(
                world,
                planner=proc.make_planner(),
                workflow=local_only,
                outer_loop_id="loop_engine",
                max_cycles=2,
                engine=_Elsewhere(),
            )
        assert list_outer_loops(world) == ()
        assert not world.run_exists("loop_engine.cycle-1.plan")


def test_a_second_driver_of_the_same_loop_is_refused(tmp_path: Path) -> None:
    with local_world(tmp_path / "w") as world, local_world(tmp_path / "w") as other:
        refused = pytest.raises(ConcurrentRunError, match="outer loop 'loop_c' is being driven")
        with other.run_lease(loop_lease_id("loop_c")), refused:
            run_outer_loop_sync(
                world,
                planner=proc.make_planner(),
                workflow=proc.improve,
                outer_loop_id="loop_c",
                max_cycles=2,
            )
        assert list_outer_loops(world) == ()


def test_a_driver_that_lost_the_loops_lease_records_nothing_more(tmp_path: Path) -> None:
    """The lease is lost while the engine runs a cycle's run elsewhere (Temporal: no run's
    append in this process checks it meanwhile): the driver stops before its next record."""
    from little_es.engine.local import run_workflow

    class _Remote(RunEngine):
        name = "local"

        async def run(
            self, world: World, workflow: Workflow, input: Mapping[str, Any] | None, *, run_id: str
        ) -> Any:
            output = (await run_workflow(world, workflow, input, run_id=run_id)).output
            if run_id == "loop_lost.cycle-1":
                assert world.break_lease(loop_lease_id("loop_lost")) is not None
            return output

    with local_world(tmp_path / "w") as world:
        # Named as the loop, not as its lease's key (a run id of its own).
        with pytest.raises(LeaseLostError, match=r"^outer loop 'loop_lost': this process lost"):
            run_outer_loop_sync(
                world,
                planner=proc.make_planner(),
                workflow=proc.improve,
                outer_loop_id="loop_lost",
                max_cycles=3,
                engine=_Remote(),
            )
        loop = load_outer_loop(world, "loop_lost")
        # Cycle 1 planned and ran; neither its outcome nor a cycle 2 was recorded.
        assert sorted(loop.cycles) == [1] and loop.cycles[1].completed is None
        assert world.run_exists("loop_lost.cycle-1")
        assert not world.run_exists("loop_lost.cycle-2.plan")
        result = run_outer_loop_sync(
            world, planner=proc.make_planner(), workflow=proc.improve, outer_loop_id="loop_lost"
        )
        assert result.resumed and result.cycles[0].status == "completed"


def test_an_edited_view_file_is_rewritten_from_the_log(tmp_path: Path) -> None:
    with local_world(tmp_path / "w") as world:
        run_outer_loop_sync(
            world,
            planner=proc.make_planner(),
            workflow=proc.improve,
            outer_loop_id="loop_v",
            max_cycles=1,
        )
        path = tmp_path / "w" / "outer-loops" / "loop_v.json"
        path.write_text('{"status": "completed", "cycles": []}')
        _resume(world, "loop_v")
        assert path.read_bytes() == encode_view(loop_view(world, load_outer_loop(world, "loop_v")))


# ------------------------------------------------------------------- kills


def _kill_and_resume(
    runner: CrashRunner, spec: WorldSpec, world: World, tmp_path: Path, k: int
) -> tuple[bool, Counter[str], dict[str, Any]]:
    """Kill a fresh loop after its kth append, resume it in ``world``; (killed, ledger, view)."""
    loop_id = f"loop_k{k}"
    ledger = tmp_path / f"ledger-{k}"
    child = runner.run(
        _TARGET,
        [spec.url, loop_id],
        crash_after_appends=k,
        env={"OUTER_LOOP_LEDGER": str(ledger)},
    )
    if not child.killed:
        assert child.returncode == 0, child.output
        assert child.result()["reason"] == "planner_done"
    view_file = spec.data_dir / "outer-loops" / f"{loop_id}.json" if spec.data_dir else None
    if view_file is not None and view_file.exists():
        orjson.loads(view_file.read_bytes())  # always whole: temp file, fsync, rename
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OUTER_LOOP_LEDGER", str(ledger))
        assert _resume(world, loop_id) == "planner_done"
        view = loop_view(world, load_outer_loop(world, loop_id))
        if view_file is not None:
            assert view_file.read_bytes() == encode_view(view)
        before = _ledger(ledger)
        assert _resume(world, loop_id) == "planner_done"
        assert _ledger(ledger) == before, "a resume of a finished loop runs nothing"
    return child.killed, _ledger(ledger), _normal(view, loop_id)


@pytest.mark.backends("sqlite", "postgres", "mariadb")
def test_a_loop_killed_at_every_append_resumes_with_nothing_committed_done_again(
    runner: CrashRunner,
    world_spec: WorldSpec,
    world_factory: Callable[[], World],
    tmp_path: Path,
) -> None:
    world_factory().close()  # the world exists: a child's appends are the loop's own
    baseline = runner.run(
        _TARGET,
        [world_spec.url, "loop_base"],
        env={"OUTER_LOOP_LEDGER": str(tmp_path / "ledger-base")},
    )
    assert baseline.result()["reason"] == "planner_done"
    expected_ledger = Counter(
        {k.replace("loop_base", "LOOP"): v for k, v in _ledger(tmp_path / "ledger-base").items()}
    )
    assert set(expected_ledger.values()) == {1}
    base_world = world_factory()
    expected_view = _normal(
        loop_view(base_world, load_outer_loop(base_world, "loop_base")), "loop_base"
    )
    k = 0
    kills = 0
    while True:
        k += 1
        killed, ledger, view = _kill_and_resume(runner, world_spec, base_world, tmp_path, k)
        if not killed:
            break
        kills += 1
        normal = Counter({key.replace(f"loop_k{k}", "LOOP"): n for key, n in ledger.items()})
        assert set(normal) == set(expected_ledger), f"kill after append {k}"
        again = {key: n for key, n in normal.items() if n > 1}
        # At most the one call in flight at the kill ran twice.
        assert sum(n - 1 for n in again.values()) <= 1, f"kill after append {k}: {again}"
        assert view == expected_view, f"kill after append {k}"
    assert kills > 20  # every append of a 3-cycle loop (runs, sessions, the loop) was a kill


@pytest.mark.backends("sqlite")
def test_a_kill_during_the_view_write_leaves_a_whole_file_rewritten_on_resume(
    runner: CrashRunner, world_spec: WorldSpec, world_factory: Callable[[], World], tmp_path: Path
) -> None:
    world_factory().close()
    for n in (1, 3, 6):
        loop_id = f"loop_w{n}"
        child = runner.run(
            _TARGET,
            [world_spec.url, loop_id],
            env={"LITTLE_ES_CRASH_DURING_VIEW_WRITE": str(n)},
        )
        assert child.killed, child.output
        assert world_spec.data_dir is not None
        path = world_spec.data_dir / "outer-loops" / f"{loop_id}.json"
        world = world_factory()
        loop = load_outer_loop(world, loop_id)
        if n == 1:
            assert not path.exists()
        else:
            # The old view, whole, one version behind the log.
            assert orjson.loads(path.read_bytes())["version"] < loop.version
        assert _resume(world, loop_id) == "planner_done"
        assert path.read_bytes() == encode_view(loop_view(world, load_outer_loop(world, loop_id)))


# ------------------------------------------------------------------- drift


@pytest.mark.backends("sqlite", "postgres", "mariadb")
@pytest.mark.parametrize("variant", ["v1", "v2", "tools"])
def test_drift_of_the_planner_abandons_the_pending_cycle_and_starts_a_fresh_one(
    variant: str,
    runner: CrashRunner,
    world_spec: WorldSpec,
    world_factory: Callable[[], World],
    tmp_path: Path,
) -> None:
    ledger = tmp_path / "ledger"
    child = runner.run(
        _TARGET,
        [world_spec.url, "loop_d"],
        env={"OUTER_LOOP_LEDGER": str(ledger), "OUTER_LOOP_KILL_IN_CYCLE": "2"},
    )
    assert child.killed, child.output
    world = world_factory()
    assert load_outer_loop(world, "loop_d").pending_cycle_run_id == "loop_d.cycle-2"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OUTER_LOOP_LEDGER", str(ledger))
        assert _resume(world, "loop_d", variant) == "planner_done"
    loop = load_outer_loop(world, "loop_d")
    statuses = [loop.cycles[n].status for n in sorted(loop.cycles)]
    runs = _ledger(ledger)
    if variant == "v1":
        assert statuses == ["completed", "completed", "done"]
        assert runs["step loop_d.cycle-2 work"] == 2  # the one step in flight at the kill
        assert runs["model loop_d 2 2"] == 1  # its planner is not asked again
        assert not any(isinstance(e, OuterLoopCycleAbandoned) for e in loop._events)
    else:
        assert statuses == ["completed", "abandoned", "completed", "done"]
        abandoned = loop.cycles[2].abandoned
        assert abandoned is not None
        if variant == "v2":
            assert abandoned.changes == ("planner: prompt changed",)
        else:
            assert len(abandoned.changes) == 1 and "peek" in abandoned.changes[0]
        assert abandoned.old_manifest_hash != abandoned.new_manifest_hash
        # Nothing of the abandoned cycle is deleted; the fresh one ran from its planner.
        assert world.run_exists("loop_d.cycle-2") and world.run_exists("loop_d.cycle-2.plan")
        # Its unfinished run is cancelled, so nothing resumes it by accident.
        abandoned_run = replay_run(world, "loop_d.cycle-2").state
        assert abandoned_run.status == "cancelled"
        assert abandoned_run.stop_reason == "outer loop cycle 2 abandoned: its planner drifted"
        assert runs["step loop_d.cycle-2 work"] == 1
        assert runs["model loop_d 3 1"] == 1 and runs["step loop_d.cycle-3 score"] == 1
        assert runs["model loop_d 1 1"] == 1, "a completed cycle's planner is never re-called"
        out = _report(world, "loop_d")
        assert "abandoned" in out and abandoned.changes[0] in out


# ------------------------------------------------- runs that wait, stop, or are priced


class _Go(BaseModel):
    ok: bool


def _think(request: ModelRequest) -> ModelResponse:
    usage = Usage(input_tokens=500, output_tokens=50)
    return ModelResponse(content="done", usage=usage, provider="vllm", model="worker-1")


def _waiting(timeout: float | None = None) -> Workflow:
    """A cycle's workflow whose run spends on a model, then waits for the signal ``go``."""
    return Workflow(
        "improve",
        steps=[
            task("work", proc.work),
            agent("think", model=ScriptedModel(respond=_think), prompt="think"),
            wait_for("approve", signal="go", model=_Go, timeout=timeout),
        ],
    )


def _until_waiting(world: World, loop_id: str, workflow: Workflow, **settings: Any) -> str:
    """Drive the loop until a cycle's run waits; that run's id."""
    with pytest.raises(RunWaitingError) as waiting:
        run_outer_loop_sync(
            world,
            planner=proc.make_planner(),
            workflow=workflow,
            outer_loop_id=loop_id,
            **settings,
        )
    return waiting.value.run_id


def test_unlock_takes_the_leases_of_a_stuck_loop_driver(tmp_path: Path) -> None:
    """A loop's driver holds the loop's lease and those of the cycle's run it drives."""
    url = f"sqlite:///{tmp_path / 'w'}"
    with local_world(tmp_path / "w") as world:
        run_id = _until_waiting(world, "loop_stuck", _waiting(), max_cycles=2)
        with world.run_lease(loop_lease_id("loop_stuck")) as loop, world.run_lease(run_id) as run:
            shown = CliRunner().invoke(app, ["unlock", "loop_stuck", "--world", url])
            assert shown.exit_code == 1
            assert "outer loop loop_stuck: its lease is held by" in shown.stdout
            assert f"run {run_id}: its lease is held by" in shown.stdout
            taken = CliRunner().invoke(app, ["unlock", "loop_stuck", "--force", "--world", url])
            assert taken.exit_code == 0, taken.output
            assert "outer loop loop_stuck: took the lease" in taken.stdout
            for lease in (loop, run):
                with pytest.raises(LeaseLostError):
                    lease.check()


def test_a_price_recorded_meanwhile_is_not_drift_of_the_pending_cycle() -> None:
    """The dollars in the planner's context are priced when read; a price recorded for calls
    already made changes them, but not the context the pending cycle's planner was given."""
    with memory_world() as world:
        wf = _waiting()
        assert _until_waiting(world, "loop_p", wf, max_cycles=3) == "loop_p.cycle-1"
        world.signal("loop_p.cycle-1", "go", {"ok": True})
        assert _until_waiting(world, "loop_p", wf) == "loop_p.cycle-2"
        world.set_model_price(
            "vllm",
            "worker-1",
            input_per_mtok=1,
            output_per_mtok=2,
            effective_from=datetime(2020, 1, 1, tzinfo=UTC),
        )
        world.signal("loop_p.cycle-2", "go", {"ok": True})
        result = run_outer_loop_sync(
            world, planner=proc.make_planner(), workflow=wf, outer_loop_id="loop_p"
        )
        assert result.reason == "planner_done"
        assert [c.status for c in result.cycles] == ["completed", "completed", "done"]
        # The second planner saw cycle 1 unpriced; the third is given its dollars as priced now.
        seen = [
            [
                c["cost_usd"]
                for c in replay_run(world, f"loop_p.cycle-{n}.plan").state.input["context"][
                    "cycles"
                ]
            ]
            for n in (2, 3)
        ]
        assert seen == [[None], ["0.0006", "0.0006"]]


class _Killed(BaseException):
    """The process dies right after the loop recorded an abandoned cycle."""


def test_a_kill_between_the_abandon_and_the_cancel_is_made_good_by_the_next_resume(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from little_es.outer_loop import _Driver

    with memory_world() as world:
        wf = _waiting()
        _until_waiting(world, "loop_k", wf, max_cycles=3)
        world.signal("loop_k.cycle-1", "go", {"ok": True})
        assert _until_waiting(world, "loop_k", wf) == "loop_k.cycle-2"

        def die(self: Any, cycle: Any) -> None:
            raise _Killed

        with monkeypatch.context() as mp:
            mp.setattr(_Driver, "cancel_runs", die)
            with pytest.raises(_Killed):
                run_outer_loop_sync(
                    world, planner=proc.make_planner("v2"), workflow=wf, outer_loop_id="loop_k"
                )
        assert load_outer_loop(world, "loop_k").cycles[2].status == "abandoned"
        assert replay_run(world, "loop_k.cycle-2").state.status == "waiting"
        assert _until_waiting(world, "loop_k", wf) == "loop_k.cycle-3"
        abandoned = replay_run(world, "loop_k.cycle-2").state
        assert abandoned.status == "cancelled"
        assert abandoned.stop_reason == "outer loop cycle 2 abandoned: its planner drifted"


def test_a_cycle_kept_under_changed_code_is_pinned_to_it_not_abandoned_on_the_next_resume(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A planner that answered before a resume under changed code keeps its answer (paid
    for), and the cycle runs under the new code; a later resume with that same code must
    not take the start's older pin for drift (it abandoned the cycle, its committed work
    with it, and paid for a new planner)."""
    from little_es import outer_loop as outer_loop_module

    with memory_world() as world:
        wf = _waiting()
        with monkeypatch.context() as mp:
            # Killed right after the planner's run completed, before the loop recorded
            # its answer.
            finish = outer_loop_module._Driver.finish

            async def die(self: Any, workflow: Any, given: Any, run_id: str) -> Any:
                await finish(self, workflow, given, run_id)
                raise _Killed

            mp.setattr(outer_loop_module._Driver, "finish", die)
            with pytest.raises(_Killed):
                run_outer_loop_sync(
                    world,
                    planner=proc.make_planner(),
                    workflow=wf,
                    outer_loop_id="loop_r",
                    max_cycles=3,
                )
        assert replay_run(world, "loop_r.cycle-1.plan").state.status == "completed"
        # Changed code: the answer stands, the cycle's run starts, works and waits.
        v2 = proc.make_planner("v2")
        with pytest.raises(RunWaitingError):
            run_outer_loop_sync(world, planner=v2, workflow=wf, outer_loop_id="loop_r")
        repinned = load_outer_loop(world, "loop_r")
        planned = repinned.cycles[1].planned
        assert planned is not None and planned.planner_manifest_hash is not None
        (cycle,) = loop_view(world, repinned)["cycles"]  # type: ignore[misc]
        assert cycle["planner_manifest_hash"] == planned.planner_manifest_hash  # type: ignore[index]
        assert cycle["started_planner_manifest_hash"] != planned.planner_manifest_hash  # type: ignore[index]
        world.signal("loop_r.cycle-1", "go", {"ok": True})
        with pytest.raises(RunWaitingError):  # the same code again: cycle 2's run waits
            run_outer_loop_sync(world, planner=v2, workflow=wf, outer_loop_id="loop_r")
        loop = load_outer_loop(world, "loop_r")
        assert [loop.cycles[n].status for n in sorted(loop.cycles)] == ["completed", "pending"]
        assert not any(isinstance(e, OuterLoopCycleAbandoned) for e in loop._events)
        assert replay_run(world, "loop_r.cycle-1").state.steps["work"].attempts == 1


@pytest.mark.parametrize("stop", ["timed_out", "cancelled"])
@pytest.mark.parametrize("policy", ["stop", "continue"])
def test_a_cycle_run_that_stopped_for_good_is_a_failed_cycle(stop: str, policy: str) -> None:
    """A resume of a run that timed out or was cancelled stops the same way again: the
    cycle fails, and the loop goes on as ``on_cycle_failure`` says."""
    with memory_world() as world:
        wf = _waiting(timeout=0.2 if stop == "timed_out" else None)
        settings: dict[str, Any] = {"max_cycles": 3, "on_cycle_failure": policy}
        assert _until_waiting(world, "loop_s", wf, **settings) == "loop_s.cycle-1"
        if stop == "timed_out":
            time.sleep(0.3)
        else:
            cancel_run(world, "loop_s.cycle-1", reason="not needed")
        if policy == "stop":
            result = run_outer_loop_sync(
                world, planner=proc.make_planner(), workflow=wf, outer_loop_id="loop_s"
            )
            assert result.reason == "cycle_failed"
            assert [c.status for c in result.cycles] == ["failed"]
        else:
            assert _until_waiting(world, "loop_s", wf) == "loop_s.cycle-2"
            loop = load_outer_loop(world, "loop_s")
            assert loop.cycles[1].status == "failed"
            # The planner of the next cycle sees how the run ended.
            given = replay_run(world, "loop_s.cycle-2.plan").state.input
            assert [c["status"] for c in given["context"]["cycles"]] == [stop]
        assert replay_run(world, "loop_s.cycle-1").state.status == stop


def test_the_loop_functions_refuse_what_is_not_a_world() -> None:
    with pytest.raises(OuterLoopRequestError, match="run_outer_loop needs a little_es World"):
        run_outer_loop_sync(
            "sqlite:///x",  # type: ignore[arg-type]
            planner=proc.make_planner(),
            workflow=proc.improve,
            outer_loop_id="loop_w",
            max_cycles=1,
        )
    with pytest.raises(OuterLoopRequestError, match="list_outer_loops needs"):
        list_outer_loops(None)  # type: ignore[arg-type]
    with pytest.raises(OuterLoopRequestError, match="load_outer_loop needs"):
        load_outer_loop(None, "loop_w")  # type: ignore[arg-type]
    with memory_world() as world, pytest.raises(OuterLoopRequestError, match="an OuterLoop"):
        loop_view(world, "loop_w")  # type: ignore[arg-type]


# --------------------------------------------------------------------- CLI


def _report(world: World, loop_id: str) -> str:
    console = Console(record=True, width=160)
    render_loop_report(world, loop_id, console)
    return console.export_text()


def test_little_loops_report_and_replay_show_a_loop(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'w'}"
    with local_world(tmp_path / "w") as world:
        world.set_model_price("scripted", "planner-1", input_per_mtok=3, output_per_mtok=15)
        run_outer_loop_sync(
            world,
            planner=proc.make_planner(),
            workflow=proc.improve,
            outer_loop_id="loop_cli",
            max_cycles=5,
        )
    runner = CliRunner()
    loops = runner.invoke(app, ["loops", "--world", url])
    assert loops.exit_code == 0, loops.output
    assert "loop_cli" in loops.output and "2/5" in loops.output
    assert "completed (planner_done)" in loops.output and "$0.027000" in loops.output
    report = runner.invoke(app, ["report", "--loop", "loop_cli", "--world", url, "--tree"])
    assert report.exit_code == 0, report.output
    for text in ("loop_cli.cycle-1", "try x=1", "done: the score is good", "$0.009000"):
        assert text in report.output
    replay = runner.invoke(app, ["replay", "--loop", "loop_cli", "--world", url])
    assert replay.exit_code == 0, replay.output
    assert orjson.loads(replay.output) == orjson.loads(
        (tmp_path / "w" / "outer-loops" / "loop_cli.json").read_bytes()
    )
    missing = runner.invoke(app, ["report", "--loop", "nope", "--world", url])
    assert missing.exit_code == 1 and "outer loop 'nope' not found" in missing.output
    both = runner.invoke(app, ["report", "run_x", "--loop", "nope", "--world", url])
    assert both.exit_code == 2


def test_the_outer_loop_example_resumes_mid_cycle_2_and_reruns_only_the_step_in_flight() -> None:
    done = subprocess.run(
        [sys.executable, str(_REPO / "examples" / "outer_loop.py")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = {" ".join(line.split()) for line in done.stdout.splitlines()}
    for line in (
        "child exited with -9 (SIGKILL mid-cycle 2)",
        "planner of cycle 1 1 | 0",
        "planner of cycle 2 1 | 0",
        "train lr=0.03 1 | 1",
        "evaluate lr=0.03 0 | 1",
        "planner of cycle 3 0 | 1",
        "the loop ended: planner_done",
    ):
        assert line in lines, done.stdout


@pytest.mark.parametrize(
    "answer",
    [
        '{"done": false, "input": {"lr": NaN}}',
        '{"done": false, "input": {"lr": Infinity}}',
        '{"done": false, "input": {"lr": 1e400}}',
        '{"done": false, "input": {"n": 1180591620717411303424}}',
        '{"done": "yes"}',
    ],
)
def test_a_planner_answer_a_json_reader_would_misread_is_no_decision(answer: str) -> None:
    # Pydantic's parser read NaN, Infinity and 1e400 and the input recorded them as null;
    # it took "yes" for true.
    from little_es.errors import PlannerAnswerError
    from little_es.outer_loop import _read_decision
    from little_es.workflow.context import StepContext

    ctx = StepContext(run_id="L.cycle-1.plan", input={}, outputs={"plan": answer}, step_path="d")
    with pytest.raises(PlannerAnswerError, match="have it answer with JSON"):
        _read_decision(ctx)


def test_a_loop_resumed_with_the_input_it_was_started_with_is_not_refused() -> None:
    with memory_world() as world:
        wf = _waiting()
        given = {"lrs": (0.1, 0.03)}  # recorded as a list, the same JSON
        _until_waiting(world, "loop_t", wf, max_cycles=3, input=given)
        world.signal("loop_t.cycle-1", "go", {"ok": True})
        assert _until_waiting(world, "loop_t", wf, input=given) == "loop_t.cycle-2"


@pytest.mark.parametrize("taken", ["loop_f.cycle-1.plan", "loop_f.cycle-1"])
def test_a_run_of_another_workflow_at_a_cycles_run_id_is_not_the_loops(taken: str) -> None:
    # It was taken as the planner's answer or the cycle's outcome, the planner never asked.
    from little_es.engine.local import run_workflow
    from little_es.errors import OuterLoopMismatchError

    with memory_world() as world:
        other = Workflow("unrelated", steps=[task("x", lambda ctx: {"score": 10**6})])
        asyncio.run(run_workflow(world, other, {}, run_id=taken))
        with pytest.raises(OuterLoopMismatchError, match="is a run of workflow 'unrelated'"):
            run_outer_loop_sync(
                world,
                planner=proc.make_planner(),
                workflow=_waiting(),
                outer_loop_id="loop_f",
                max_cycles=2,
            )
        loop = load_outer_loop(world, "loop_f")
        assert all(c.completed is None for c in loop.cycles.values())

"""A ``Run`` snapshot names its steps' outputs by version instead of copying them.

The load reads those ``StepCompleted`` rows back from the verified stream; a
snapshot that names a row that is not that step's completion is refused as
tampered, and a snapshot written before (outputs inline) still loads.
"""

from __future__ import annotations

import asyncio
import gc
import sys
import tracemalloc
import zlib
from pathlib import Path
from typing import Any

import orjson
import pytest
from eventsourcing.persistence import StoredEvent

from little_es import Workflow, local_world, memory_world, run_workflow, task
from little_es.chain import FRAME_SIZE, frame, row_digest
from little_es.domain import Run
from little_es.errors import LogTamperedError
from little_es.events import Snapshot
from little_es.ids import run_stream_id
from little_es.materialize import materialize_run_state
from little_es.pricing import price_usage_exact
from little_es.testing.logs import RunWriter, priced
from little_es.world import World

RUN_ID = "run_snap_outputs"


def _step(ctx: Any) -> dict[str, Any]:
    return {"visit": ctx.visit, "text": "y" * 50}


def _world_with_snapshot(directory: Path) -> World:
    world = local_world(directory)
    wf = Workflow("snap-outputs", steps=[task(f"s{i}", _step) for i in range(6)])
    asyncio.run(run_workflow(world, wf, {}, run_id=RUN_ID))
    world._snapshot(world.load_run(RUN_ID))  # framed and stored as World.save stores one
    return world


def _stored_snapshot(world: World) -> tuple[int, dict[str, Any]]:
    assert world.app.snapshots is not None
    (row,) = world.app.snapshots.recorder.select_events(run_stream_id(RUN_ID))
    return row.originator_version, orjson.loads(zlib.decompress(row.state[FRAME_SIZE:]))


def _replace_snapshot(world: World, version: int, payload: dict[str, Any]) -> None:
    """Store ``payload`` as the snapshot at ``version``, framed to stand on its event."""
    assert world.app.snapshots is not None
    stream = run_stream_id(RUN_ID)
    rows = world.verified_stream(stream).rows
    data = frame(
        row_digest(rows[version - 1][2]),
        stream,
        version,
        Snapshot.wire_name,
        zlib.compress(orjson.dumps(payload)),
    )
    recorder = world.app.snapshots.recorder
    with recorder.datastore.transaction(commit=True) as cursor:
        cursor.execute("DELETE FROM stored_snapshots")
    recorder.insert_events([StoredEvent(stream, version, Snapshot.wire_name, data)])


def test_a_snapshot_holds_no_step_output_and_the_load_reads_them_back(tmp_path: Path) -> None:
    world = _world_with_snapshot(tmp_path / "w")
    version, payload = _stored_snapshot(world)
    steps = payload["state"]["steps"]
    assert all("output" not in s for s in steps.values())
    assert set(payload["state"]["outputs_at"]) == set(steps)
    loaded = world.load_run(RUN_ID)
    assert loaded.outputs_to_read() == {}
    events = world.read_stream(run_stream_id(RUN_ID))
    assert loaded.fold.freeze() == materialize_run_state(events, pricer=price_usage_exact)
    assert loaded.fold.steps["s3"].output == {"visit": 1, "text": "y" * 50}
    assert version == len(events)
    world.close()


def test_a_snapshot_naming_another_row_for_an_output_is_refused(tmp_path: Path) -> None:
    world = _world_with_snapshot(tmp_path / "w")
    version, payload = _stored_snapshot(world)
    outputs_at = payload["state"]["outputs_at"]
    outputs_at["s3"] = outputs_at["s2"]  # s2's completion, named as s3's
    _replace_snapshot(world, version, payload)
    with pytest.raises(LogTamperedError, match=r"names version \d+ as the StepCompleted of step"):
        world.load_run(RUN_ID)
    outputs_at["s3"] = version + 5  # after the snapshot: not a row before it
    _replace_snapshot(world, version, payload)
    with pytest.raises(LogTamperedError, match="which is not a row before it"):
        world.load_run(RUN_ID)
    world.close()


def test_a_snapshot_with_its_outputs_inline_still_loads(tmp_path: Path) -> None:
    # As snapshots were written before they named outputs by version.
    world = _world_with_snapshot(tmp_path / "w")
    version, payload = _stored_snapshot(world)
    events = world.read_stream(run_stream_id(RUN_ID))
    full = Run.from_stream(run_stream_id(RUN_ID), events, price_usage_exact)
    state = full.fold.freeze().model_dump(mode="json", exclude_defaults=True)
    state["gave_up_attempts"] = {}
    payload["state"] = state
    _replace_snapshot(world, version, payload)
    loaded = world.load_run(RUN_ID)
    assert loaded.fold.freeze() == full.fold.freeze()
    world.close()


def _whole_state_dump(run: Run) -> dict[str, Any]:
    """The snapshot state as it was made before it was dumped step by step: pydantic's
    dump of the whole frozen state, without each step's path and its id where it is the
    path (the stored bytes must not change)."""
    outputs_at = run.fold.output_versions()
    steps = run.fold.steps
    exclude: dict[str, Any] = {
        "steps": (
            {"__all__": {"output"}}
            if all(s.output is None or p in outputs_at for p, s in steps.items())
            else {path: {"output"} for path in outputs_at}
        )
    }
    state = run.fold.freeze().model_dump(mode="json", exclude_defaults=True, exclude=exclude)
    for path, step in state["steps"].items():
        del step["step_path"]
        if step["step_id"] == path:
            del step["step_id"]
    state["gave_up_attempts"] = run.fold.gave_up_attempts()
    state["outputs_at"] = outputs_at
    return state


def test_the_snapshot_state_is_the_dump_of_the_whole_state(world: World) -> None:
    w = RunWriter(world, "run_dump", input={"q": [1, {"k": "v"}]})
    ref = world.artifacts.put(b"blob", run_id="run_dump", step_path="fetch")
    w.task_step("fetch", {"rows": [1, 2]}, artifact_refs=[ref])
    w.task_step("route", "fetch", next_step="fetch")
    w.task_step("fetch@2", {"rows": []}, visit=2)
    w.agent_step("think", [priced(), priced()])
    w.start_step("flaky")
    w.fail_step("flaky", will_retry=True)
    w.start_step("flaky", attempt=2)
    w.fail_step("flaky", attempt=2, will_retry=False)
    w.start_step("group[a]/inner")
    w.complete_step("group[a]/inner", None)
    w.start_step("last")
    run = world.load_run("run_dump")
    assert run.snapshot_state() == _whole_state_dump(run)
    assert orjson.dumps(run.snapshot_state()) == orjson.dumps(_whole_state_dump(run))
    # An output the snapshot cannot name by version (one read from an older snapshot,
    # which held them inline) stays in it.
    run.fold.steps["fetch"].changing().output_version = 0
    assert "output" in run.snapshot_state()["steps"]["fetch"]
    assert orjson.dumps(run.snapshot_state()) == orjson.dumps(_whole_state_dump(run))


def test_a_snapshot_gives_back_each_steps_path_and_id() -> None:
    # Left out of the stored state (a path is its key, most ids are their path), put
    # back by restore: a later visit and a branch step keep an id that is not the path.
    with memory_world() as world:
        w = RunWriter(world, "run_paths")
        w.task_step("fetch", {"rows": [1]})
        w.task_step("fetch@2", {"rows": []}, visit=2)
        w.start_step("group[a]/inner")
        w.complete_step("group[a]/inner", None)
        run = world.load_run("run_paths")
    stored = orjson.loads(orjson.dumps(run.snapshot_state()))
    assert all("step_path" not in step for step in stored["steps"].values())
    assert "step_id" not in stored["steps"]["fetch"]
    assert stored["steps"]["fetch@2"]["step_id"] == "fetch"
    restored = Run("run_paths", price_usage_exact)
    restored.restore(stored)
    steps = restored.fold.freeze().steps
    originals = run.fold.freeze().steps
    assert list(steps) == list(originals)
    for path, step in steps.items():
        assert (step.step_path, step.step_id) == (path, originals[path].step_id)


@pytest.mark.skipif(sys.implementation.name != "cpython", reason="CPython's split dicts")
def test_a_snapshot_leaves_the_runs_compact_steps_as_they_were() -> None:
    n = 300
    with memory_world() as world:
        w = RunWriter(world, "run_compact_dump")
        for i in range(n):
            w.task_step(f"s{i}", {"i": i})
        run = world.load_run("run_compact_dump")
        run.fold.freeze()  # the steps' frozen views, which the run's result shares
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            run.snapshot_state()
            gc.collect()
            kept = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
    # Dumping a compact StepState itself gives it a dict of its own: 64 bytes a step.
    assert kept < 8 * n, kept

"""replay_run: a read-only, deterministic, immutable fold of one run's log."""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from uuid import UUID

import orjson
import pytest
from pydantic import BaseModel, ValidationError

from little_es.domain import HarnessSession
from little_es.engine.local import run_workflow
from little_es.errors import (
    ArtifactNotFoundError,
    EventPayloadError,
    InvalidRunIdError,
    RunNotFoundError,
    RunWaitingError,
    UnknownEventTypeError,
)
from little_es.events import SessionCompleted, SessionStarted, ToolCallStarted, utc_now
from little_es.ids import run_stream_id
from little_es.materialize import materialize_run_state
from little_es.pricing import price_usage_exact
from little_es.replay import ReplayPlanStep, ReplayResult, replay_run
from little_es.testing.logs import (
    RunWriter,
    append_raw_row,
    priced,
    unpriced,
    write_agent_run,
)
from little_es.values import Usage, UsageTotals
from little_es.workflow.authoring import Workflow, task, wait_for
from little_es.world import World

# ---------------------------------------------------------------- determinism


def test_two_replays_are_deeply_equal(world: World) -> None:
    w = write_agent_run(world, "run_idem", steps=2, calls_per_step=3, complete=False)
    ref = world.artifacts.put(b"report body", run_id="run_idem", step_path="write")
    w.task_step("write", {"pages": [1, 2]}, artifact_refs=[ref])
    first = replay_run(world, "run_idem")
    second = replay_run(world, "run_idem")
    assert first == second
    assert first.model_dump() == second.model_dump()
    assert first is not second
    assert first.state.event_count == len(world.read_run_log("run_idem"))


def test_the_plan_is_made_once_when_asked_for_and_does_not_change_equality(
    world: World,
) -> None:
    w = RunWriter(world, "run_lazy")
    w.task_step("fetch", {"rows": [1, 2]})
    w.start_step("next")
    asked, untouched = replay_run(world, "run_lazy"), replay_run(world, "run_lazy")
    # A replay holds the state; the plan is read from it, once, when first asked for.
    assert "steps" not in vars(asked) and "completed_step_paths" not in vars(asked)
    plan = asked.steps
    assert asked.steps is plan
    assert "steps" in vars(asked)
    assert [(s.step_path, s.should_run) for s in plan] == [("fetch", False), ("next", True)]
    assert (asked.completed_step_paths, asked.pending_step_paths) == (("fetch",), ("next",))
    assert asked == untouched
    assert asked.model_dump() == untouched.model_dump()
    assert "steps" in untouched.model_dump()


def test_replay_appends_nothing(world: World) -> None:
    write_agent_run(world, "run_ro", steps=1, calls_per_step=2)
    before = world.app.recorder.max_notification_id()
    replay_run(world, "run_ro")
    assert world.app.recorder.max_notification_id() == before


# ---------------------------------------------------------------- immutability


@pytest.fixture
def replayed(world: World) -> ReplayResult:
    w = RunWriter(world, "run_frozen", input={"task": {"tags": ["a"]}})
    ref = world.artifacts.put(b"\x00\x01 blob", run_id="run_frozen", step_path="collect")
    w.task_step("collect", {"items": [1, {"k": "v"}]}, artifact_refs=[ref])
    w.agent_step("think", [priced()])
    w.start_step("next")
    return replay_run(world, "run_frozen")


# Typed Any: each of these is a type error too, which is the point; here they run.
_MUTATIONS: dict[str, Callable[[Any], object]] = {
    "result field": lambda r: setattr(r, "run_id", "other"),
    "result steps": lambda r: r.steps.append(r.steps[0]),
    "completed paths": lambda r: r.completed_step_paths.append("x"),
    "state field": lambda r: setattr(r.state, "status", "completed"),
    "state steps mapping": lambda r: r.state.steps.__setitem__("x", r.state.steps["collect"]),
    "state steps delete": lambda r: r.state.steps.pop("collect"),
    "step state field": lambda r: setattr(r.state.steps["collect"], "status", "pending"),
    "step usage": lambda r: setattr(r.state.steps["think"].usage, "cost_usd", 0.0),
    "run usage": lambda r: setattr(r.state.usage, "input_tokens", 0),
    "state input": lambda r: r.state.input["task"].__setitem__("x", 1),
    "state input list": lambda r: r.state.input["task"]["tags"].append("b"),
    "visits": lambda r: r.state.visits.__setitem__("collect", 9),
    "plan step field": lambda r: setattr(r.steps[0], "should_run", True),
    "plan step output": lambda r: r.steps[0].output.__setitem__("items", []),
    "plan step output nested": lambda r: r.steps[0].output["items"][1].update(k="w"),
    "plan step output list": lambda r: r.steps[0].output["items"].append(2),
    "state step output": lambda r: r.state.steps["collect"].output.clear(),
    "artifact refs": lambda r: r.steps[0].artifact_refs.append(r.steps[0].artifact_refs[0]),
    "artifact manifest": lambda r: setattr(r.artifacts[0].manifest, "sha256", "0" * 64),
    "artifact payload": lambda r: setattr(r.artifacts[0], "payload", b"swapped"),
    "artifact bytes": lambda r: r.artifacts[0].payload.__setitem__(0, 1),
    "artifacts tuple": lambda r: r.artifacts.append(r.artifacts[0]),
}


@pytest.mark.parametrize("what", list(_MUTATIONS))
def test_every_part_of_a_result_refuses_mutation(replayed: ReplayResult, what: str) -> None:
    snapshot = replayed.model_dump()
    with pytest.raises((TypeError, AttributeError, ValidationError)):
        _MUTATIONS[what](replayed)
    assert replayed.model_dump() == snapshot


class _Answer(BaseModel):
    ok: bool
    tags: list[str]


def test_a_waits_signal_data_refuses_mutation(world: World) -> None:
    wf = Workflow("answered", steps=[wait_for("approve", model=_Answer), task("after", _one)])
    with pytest.raises(RunWaitingError):
        asyncio.run(run_workflow(world, wf, {}, run_id="run_answered"))
    world.signal("run_answered", "approve", {"ok": True, "tags": ["a"]})
    replayed = replay_run(world, "run_answered")
    data = replayed.state.waits["approve"].data
    assert data == {"ok": True, "tags": ["a"]}
    with pytest.raises(TypeError):
        data["ok"] = False  # type: ignore[index,call-overload]
    with pytest.raises(TypeError):
        data["tags"].append("b")  # type: ignore[index,call-overload,union-attr]
    assert replayed == replay_run(world, "run_answered")


def _one(ctx: Any) -> int:
    return 1


def test_the_plan_shares_the_states_outputs(replayed: ReplayResult) -> None:
    # One copy of each output in a result: a replay of a long run holds every output.
    plan = {step.step_path: step for step in replayed.steps}
    assert plan["collect"].output is replayed.state.steps["collect"].output
    assert replayed.state.steps["next"].usage == UsageTotals()
    assert replayed.state.steps["think"].usage.calls == 1


# ---------------------------------------------------------------- the plan


def test_plan_statuses_and_should_run(world: World) -> None:
    w = RunWriter(world, "run_plan")
    w.task_step("fetch", {"n": 1})
    w.start_step("retry_me")
    w.fail_step("retry_me", will_retry=True)
    w.start_step("broken")
    w.fail_step("broken", will_retry=False)
    w.agent_step("agent", [priced()], complete=False)
    result = replay_run(world, "run_plan")
    assert [(s.step_path, s.status, s.should_run) for s in result.steps] == [
        ("fetch", "completed", False),
        ("retry_me", "pending", True),
        ("broken", "failed", True),
        ("agent", "running", True),
    ]
    assert result.completed_step_paths == ("fetch",)
    assert result.pending_step_paths == ("retry_me", "broken", "agent")
    assert result.steps[0] == ReplayPlanStep(
        step_path="fetch", status="completed", should_run=False, output={"n": 1}
    )
    assert not hasattr(result.steps[0], "usage")


def test_a_step_completed_on_a_later_attempt_does_not_run_again(world: World) -> None:
    w = RunWriter(world, "run_attempts")
    w.start_step("flaky")
    w.fail_step("flaky", will_retry=True)
    w.start_step("flaky", attempt=2)
    w.complete_step("flaky", "ok", attempt=2)
    result = replay_run(world, "run_attempts")
    assert result.completed_step_paths == ("flaky",)
    assert result.state.steps["flaky"].attempts == 2


# ---------------------------------------------------------------- scope


def test_sub_run_events_are_not_in_the_parents_replay(world: World) -> None:
    parent = RunWriter(world, "run_parent")
    parent.agent_step("plan", [priced(input_tokens=10, output_tokens=1)])
    parent.start_step("delegate", kind="subworkflow")
    child = parent.sub_run("delegate", "run_parent_child")
    child.agent_step("work", [priced(input_tokens=5000, output_tokens=700)] * 3)
    child.task_step("tidy", "ok")
    child.complete("child done")
    parent.complete_step("delegate", "child done")

    result = replay_run(world, "run_parent")
    own = world.read_run_log("run_parent")
    child_streams = {world.load_run("run_parent_child").id} | {
        s.id for s in child.sessions.values()
    }
    assert not {e.originator_id for e in own} & child_streams
    assert result.state.event_count == len(own)
    assert result.state.sub_run_ids == ("run_parent_child",)
    assert list(result.state.steps) == ["plan", "delegate"]
    assert result.state.usage.input_tokens == 10
    assert result.state.usage.calls == 1

    sub = replay_run(world, "run_parent_child")
    assert sub.state.parent_run_id == "run_parent"
    assert sub.state.usage.input_tokens == 15000
    assert sub.state.status == "completed"


# ---------------------------------------------------------------- artifacts


def test_artifacts_are_hydrated_deduplicated_in_step_order(world: World) -> None:
    store = world.artifacts
    out_a = store.put(b"A" * 10, run_id="run_art", step_path="a", media_type="text/plain")
    side = store.put(b"side", run_id="run_art", step_path="a")
    out_b = store.put(b"B" * 3, run_id="run_art", step_path="b")
    w = RunWriter(world, "run_art")
    w.task_step("a", None, output_ref=out_a, artifact_refs=[side, out_a])
    w.task_step("b", None, output_ref=out_b, artifact_refs=[side])
    w.complete(output_ref=out_b)
    result = replay_run(world, "run_art")
    assert [a.manifest for a in result.artifacts] == [out_a, side, out_b]
    assert [a.payload for a in result.artifacts] == [b"A" * 10, b"side", b"B" * 3]
    assert result.steps[0].output_ref == out_a


def test_a_missing_artifact_is_refused(world: World) -> None:
    real = world.artifacts.put(b"kept", run_id="run_gone", step_path="a")
    ghost = real.model_copy(
        update={"sha256": hashlib.sha256(b"never stored").hexdigest(), "size": 12}
    )
    w = RunWriter(world, "run_gone")
    w.task_step("a", None, output_ref=ghost)
    with pytest.raises(ArtifactNotFoundError, match="run 'run_gone', step 'a'"):
        replay_run(world, "run_gone")


# ---------------------------------------------------------------- read-only on disk


def _files(data_dir: Path) -> dict[str, tuple[str, int, int]]:
    return {
        p.name: (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns, p.stat().st_size)
        for p in sorted(data_dir.glob("events.sqlite3*"))
    }


@pytest.mark.backends("sqlite")
def test_replay_leaves_the_sqlite_files_untouched(
    world_spec: Any, world_factory: Callable[[], World]
) -> None:
    writer = world_factory()
    write_agent_run(writer, "run_disk", steps=3, calls_per_step=4)
    writer.close()  # checkpoints the WAL into the database file

    world = world_factory()
    before = _files(world_spec.data_dir)
    assert {"events.sqlite3", "events.sqlite3-wal", "events.sqlite3-shm"} <= set(before)
    time.sleep(0.02)  # so that a write would show in the mtimes
    replay_run(world, "run_disk")
    replay_run(world, "run_disk")
    assert _files(world_spec.data_dir) == before


@pytest.mark.backends("sqlite")
def test_replay_with_frames_still_in_the_wal_writes_nothing(
    world_spec: Any, world_factory: Callable[[], World]
) -> None:
    world = world_factory()
    write_agent_run(world, "run_wal", steps=2, calls_per_step=3)
    replay_run(world, "run_wal")
    # A SQLite reader records a read mark in the -shm wal-index (shared memory,
    # not data) the first time it reads new WAL frames; from then on, nothing.
    before = _files(world_spec.data_dir)
    assert before["events.sqlite3-wal"][2] > 0
    time.sleep(0.02)
    replay_run(world, "run_wal")
    assert _files(world_spec.data_dir) == before


# ---------------------------------------------------------------- errors


def test_unknown_run_names_the_id_and_the_world(world: World) -> None:
    write_agent_run(world, "run_exists", steps=1, calls_per_step=1)
    with pytest.raises(RunNotFoundError) as caught:
        replay_run(world, "run_missing")
    assert caught.value.run_id == "run_missing"
    assert "'run_missing'" in str(caught.value)
    assert world.name in str(caught.value)


@pytest.mark.parametrize("bad", ["", "../etc/passwd", "a b", "x" * 129, 42])
def test_invalid_run_ids_are_refused(world: World, bad: Any) -> None:
    with pytest.raises(InvalidRunIdError):
        replay_run(world, bad)


def test_replay_needs_a_world() -> None:
    with pytest.raises(TypeError, match="World"):
        replay_run("sqlite:///.little-workflow", "run_x")  # type: ignore[arg-type]


def _append_raw(world: World, run_id: str, topic: str, payload: dict[str, Any]) -> None:
    # What a newer program, or a damaged disk, could have left in the log.
    state = {"timestamp": utc_now().isoformat(), **payload}
    append_raw_row(world, run_stream_id(run_id), topic, orjson.dumps(state))


def test_an_unresolvable_topic_names_the_topic_and_the_run(world: World) -> None:
    RunWriter(world, "run_topic").task_step("a", 1)
    _append_raw(world, "run_topic", "acme.ApprovalGranted", {"approver": "ops"})
    with pytest.raises(UnknownEventTypeError) as caught:
        replay_run(world, "run_topic")
    message = str(caught.value)
    assert "'acme.ApprovalGranted'" in message
    assert "run 'run_topic'" in message


def test_a_malformed_payload_names_the_event_and_the_field(world: World) -> None:
    RunWriter(world, "run_bad").task_step("a", 1)
    _append_raw(
        world,
        "run_bad",
        "StepCompleted",
        {"step_path": "b", "step_id": "b", "visit": "first", "attempt": 1},
    )
    with pytest.raises(EventPayloadError) as caught:
        replay_run(world, "run_bad")
    message = str(caught.value)
    assert "'StepCompleted'" in message
    assert "visit" in message
    assert "run 'run_bad'" in message


def test_a_recorded_cost_in_a_usage_payload_is_refused(world: World) -> None:
    w = RunWriter(world, "run_cost")
    session = w.agent_step("think", [unpriced()], complete=False)
    version = session.version + 1
    state = {
        "timestamp": utc_now().isoformat(),
        "turn": 2,
        "response": {
            "provider": "openai",
            "model": "gpt-4o",
            "usage": {"input_tokens": 1, "cost_usd": 99.0},
        },
    }
    assert (
        append_raw_row(world, session.id, "harness.model.responded", orjson.dumps(state)) == version
    )
    with pytest.raises(EventPayloadError, match="cost_usd"):
        replay_run(world, "run_cost")


# ------------------------------------------------- what replay decodes, and what it counts


def _interleaved_agents(world: World, run_id: str) -> RunWriter:
    """Two agent steps whose sessions write turn by turn in alternation (a parallel group)."""
    w = RunWriter(world, run_id)
    sessions = {}
    for path in ("check[a]/agent", "check[b]/agent"):
        sessions[path] = HarnessSession(run_id, path, 1)
        w.start_step(path, kind="agent", session=sessions[path])
        sessions[path].trigger(
            SessionStarted,
            run_id=run_id,
            step_path=path,
            attempt=1,
            manifest={"model": "m"},
            manifest_hash="sha256:" + "1" * 64,
        )
        world.save(sessions[path])
    calls = [priced(tool_calls=2, failed_tool_calls=1), unpriced(tool_calls=1), priced()]
    for turn, call in enumerate(calls, start=1):
        for path, session in sessions.items():
            w.model_turn(session, path, turn, call)
    return w


@pytest.mark.parametrize(
    "shape",
    ["completed", "in_flight_model_call", "in_flight_tool_call", "interleaved", "rollup_last"],
)
def test_replay_equals_the_fold_of_every_event(world: World, shape: str) -> None:
    # replay_run leaves the events the reducer only counts undecoded: its state
    # must be exactly the one folded from the whole log, decoded.
    run_id = f"run_{shape}"
    if shape == "completed":
        write_agent_run(world, run_id, steps=2, calls_per_step=3, tool_calls=2)
    elif shape == "in_flight_model_call":
        w = RunWriter(world, run_id)
        w.agent_step("a", [priced(tool_calls=1)] * 2, complete=False, end_in_flight=True)
    elif shape == "in_flight_tool_call":
        w = RunWriter(world, run_id)
        session = w.agent_step("a", [priced(tool_calls=1)], complete=False)
        session.trigger(ToolCallStarted, turn=2, call_id="c9", name="lookup", args={"q": 9})
        world.save(session)
    elif shape == "interleaved":
        _interleaved_agents(world, run_id)
    else:
        w = RunWriter(world, run_id)
        w.agent_step("a", [priced(tool_calls=1), unpriced()], complete=False)
        w.sessions["a"].trigger(SessionCompleted, usage=Usage(), turns=2, output="x")
        world.save(w.sessions["a"])
    replayed = replay_run(world, run_id).state
    assert replayed == materialize_run_state(world.read_run_log(run_id), pricer=price_usage_exact)
    assert replayed.event_count == len(world.read_run_log(run_id))
    assert replayed.updated_at == world.read_run_log(run_id)[-1].timestamp


def _session_row(world: World, session_id: UUID, topic: str, payload: dict[str, Any]) -> None:
    state = orjson.dumps({"timestamp": utc_now().isoformat(), **payload})
    append_raw_row(world, session_id, topic, state)


def test_an_unresolvable_topic_inside_a_session_is_refused(world: World) -> None:
    w = RunWriter(world, "run_session_topic")
    session = w.agent_step("a", [priced()], complete=False)
    _session_row(world, session.id, "harness.teleported", {})
    _session_row(world, session.id, "harness.model.called", {"turn": 2, "messages": []})
    with pytest.raises(UnknownEventTypeError, match=r"run 'run_session_topic'.*teleported"):
        replay_run(world, "run_session_topic")


def test_the_last_event_of_a_session_is_always_validated(world: World) -> None:
    w = RunWriter(world, "run_last_bad")
    session = w.agent_step("a", [priced()], complete=False)
    _session_row(world, session.id, "harness.tool_call.succeeded", {"call_id": 42})
    with pytest.raises(EventPayloadError, match=r"harness\.tool_call\.succeeded.*call_id"):
        replay_run(world, "run_last_bad")


def test_calls_replay_only_counts_are_validated_by_their_readers(world: World) -> None:
    # A damaged tool result in the middle of a session changes nothing replay
    # folds, so replay reports the run; reading the log in full (little events,
    # a resumed session) refuses it, naming the event and the field.
    w = RunWriter(world, "run_mid_bad")
    session = w.agent_step("a", [priced(tool_calls=1)], complete=False)
    _session_row(world, session.id, "harness.tool_call.succeeded", {"call_id": ["c1"]})
    _session_row(
        world,
        session.id,
        "harness.model.called",
        {"turn": 2, "messages": [], "conversation_hash": "h"},
    )
    state = replay_run(world, "run_mid_bad").state
    assert state.event_count == len(world.select_stored(session.id)) + len(
        world.select_stored(run_stream_id("run_mid_bad"))
    )
    with pytest.raises(EventPayloadError, match=r"harness\.tool_call\.succeeded.*call_id"):
        world.read_run_log("run_mid_bad")
    with pytest.raises(EventPayloadError, match="call_id"):
        world.load_session(session.id)

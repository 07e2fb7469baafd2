"""Hostile input at the public entry points: each refusal is a named little_es error whose
message says what to do, and appends nothing; what is accepted, a replay folds."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from typing import Any, ClassVar

import pytest
from typer.testing import CliRunner

from little_es import (
    EventPayloadError,
    InvalidRunIdError,
    LittleEsError,
    PricingError,
    RunCompleted,
    RunEvent,
    RunFailedError,
    RunNotFoundError,
    RunRequestError,
    StepCompleted,
    StepStarted,
    UnstorableEventError,
    Workflow,
    World,
    WorldConfigError,
    cancel_run,
    memory_world,
    open_world,
    register_model_price,
    replay_run,
    run_workflow,
    task,
    validate_run_id,
)
from little_es.cli import app
from little_es.world import local_world

_BAD_IDS: list[Any] = [None, 5, "", "a" * 129, "a\x00b", "a\ud800", "../x", "run id"]


class _Note(RunEvent):
    wire_name: ClassVar[str] = "test.hostile.Note"
    text: str


class _FakeDone(RunCompleted):
    wire_name: ClassVar[str] = "test.hostile.FakeDone"


def _flow(out: object = None) -> Workflow:
    return Workflow("hostile", version="1", steps=[task("a", lambda ctx: {"v": out})])


@pytest.fixture
def world() -> World:
    w = memory_world()
    asyncio.run(run_workflow(w, _flow(1), {"k": 1}, run_id="run_h"))
    return w


def _refused(world: World, exc: type[LittleEsError], call: Any, match: str) -> None:
    before = len(world.read_run_log("run_h"))
    with pytest.raises(exc, match=match):
        call()
    assert len(world.read_run_log("run_h")) == before


@pytest.mark.parametrize("bad", _BAD_IDS)
def test_a_bad_run_id_is_refused_everywhere(world: World, bad: Any) -> None:
    for call in (
        lambda: validate_run_id(bad),
        lambda: replay_run(world, bad),
        lambda: cancel_run(world, bad),
        lambda: world.record_run_event(bad, _Note, text="x"),
        lambda: asyncio.run(run_workflow(world, _flow(), {}, run_id=bad)),
    ):
        if bad is None:
            continue
        with pytest.raises(InvalidRunIdError, match="run id"):
            call()
    assert [r.run_id for r in __import__("little_es").list_runs(world)] == ["run_h"]


def test_an_unknown_run_is_not_found(world: World) -> None:
    for call in (
        lambda: replay_run(world, "run_unknown"),
        lambda: cancel_run(world, "run_unknown"),
        lambda: world.record_run_event("run_unknown", _Note, text="x"),
    ):
        with pytest.raises(RunNotFoundError, match="little runs"):
            call()
    assert not world.run_exists("run_unknown")


@pytest.mark.parametrize("protocol", [RunCompleted, StepCompleted, StepStarted, _FakeDone])
def test_the_protocol_events_cannot_be_recorded_from_outside(
    world: World, protocol: type[RunEvent]
) -> None:
    _refused(
        world,
        UnstorableEventError,
        lambda: world.record_run_event("run_h", protocol, output={"forged": True}),
        "only the runtime records it",
    )
    assert replay_run(world, "run_h").state.output == {"v": 1}


@pytest.mark.parametrize("bad", [42, None, "RunCompleted", _Note.__mro__[-1]])
def test_record_run_event_needs_an_event_class(world: World, bad: Any) -> None:
    _refused(world, UnstorableEventError, lambda: world.record_run_event("run_h", bad), "RunEvent")


@pytest.mark.parametrize(
    "text", [math.nan, 2**70, {1, 2}, object()], ids=["nan", "bigint", "set", "object"]
)
def test_an_own_event_with_a_value_json_cannot_hold_is_refused(world: World, text: Any) -> None:
    _refused(
        world, EventPayloadError, lambda: world.record_run_event("run_h", _Note, text=text), "text"
    )


def test_an_own_event_with_odd_text_is_read_back_as_written(world: World) -> None:
    world.record_run_event("run_h", _Note, text="nul\x00 and é")
    assert world.read_run_log("run_h")[-1].text == "nul\x00 and é"  # type: ignore[attr-defined]
    assert replay_run(world, "run_h").state.output == {"v": 1}


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((None, _flow(), {}), "world must be a little_es World"),
        (("world", _flow(), {}), "world must be a little_es World"),
        ((None, None, {}), "workflow must be a little_es Workflow"),
        (("w", _flow(), [1]), "input must be a mapping"),
    ],
)
def test_run_workflow_refuses_wrong_types(world: World, args: tuple[Any, ...], match: str) -> None:
    target = world if args[0] == "w" else args[0]
    with pytest.raises(RunRequestError, match=match):
        asyncio.run(run_workflow(target, args[1], args[2], run_id="run_types"))
    assert not world.run_exists("run_types")


@pytest.mark.parametrize(
    "value",
    [math.nan, math.inf, -math.inf, 2**70, "\ud800"],
    ids=["nan", "inf", "-inf", "big", "sur"],
)
def test_an_input_json_cannot_hold_starts_no_run(world: World, value: object) -> None:
    with pytest.raises(LittleEsError) as info:
        asyncio.run(run_workflow(world, _flow(), {"k": value}, run_id="run_in"))
    assert "input" in str(info.value)
    assert not world.run_exists("run_in")


@pytest.mark.parametrize(
    "out", [math.nan, 2**70, "\udc80", b"x", object()], ids=["nan", "big", "sur", "bytes", "obj"]
)
def test_an_output_json_cannot_hold_fails_the_step_and_the_log_still_folds(
    world: World, out: object
) -> None:
    with pytest.raises(RunFailedError, match="step 'a'"):
        asyncio.run(run_workflow(world, _flow(out), {}, run_id="run_out"))
    assert replay_run(world, "run_out").state.status == "failed"


@pytest.mark.parametrize("out", ["nul\x00", -0.0, 2**63 - 1, -(2**63), "é" * 10_000, [[[]]]])
def test_an_accepted_odd_output_folds_as_written(world: World, out: object) -> None:
    asyncio.run(run_workflow(world, _flow(out), {"k": out}, run_id="run_odd"))
    replay = replay_run(world, "run_odd")
    assert replay.state.output == {"v": out} and replay.input == {"k": out}


def test_a_set_is_stored_and_seen_as_the_sorted_list_a_replay_reads() -> None:
    world = memory_world()
    seen: list[object] = []
    flow = Workflow("sets", steps=[task("a", lambda ctx: seen.append(ctx.input["k"]) or {3, 1})])
    asyncio.run(run_workflow(world, flow, {"k": {2, 1}}, run_id="run_set"))
    replay = replay_run(world, "run_set")
    assert seen == [[1, 2]] and replay.input == {"k": [1, 2]} and replay.state.output == [1, 3]


@pytest.mark.parametrize(
    "price",
    [-1, math.nan, math.inf, "1", None, True, 1e300, 2_000_000],
    ids=["neg", "nan", "inf", "str", "none", "bool", "huge", "absurd"],
)
def test_a_bad_price_is_refused_and_not_recorded(world: World, price: Any) -> None:
    with pytest.raises(PricingError, match="per million tokens"):
        world.set_model_price("openai", "gpt-x", input_per_mtok=price, output_per_mtok=1)
    with pytest.raises(PricingError, match="per million tokens"):
        register_model_price("openai", "gpt-x", input_per_mtok=price, output_per_mtok=1)
    assert world.model_prices() == ()


@pytest.mark.parametrize("name", ["", "  ", "a\x00", "a\ud800", "a\nb", None, 5])
def test_a_bad_model_name_is_refused(world: World, name: Any) -> None:
    with pytest.raises(PricingError):
        world.set_model_price("openai", name, input_per_mtok=1, output_per_mtok=1)
    assert world.model_prices() == ()


# -------------------------------------------------------------------- the CLI


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "hostile_mod.py").write_text(
        "from little_es import Workflow, task\n"
        "wf = Workflow('hostile_cli', steps=[task('a', lambda ctx: 1)])\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    local_world(tmp_path / "world").close()
    return f"sqlite:///{tmp_path / 'world'}"


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["resume", "run_nope", "--workflow", "hostile_mod:wf"], "not found"),
        (["run", "hostile_mod:wf", "--input", "{bad"], "--input is not JSON"),
        (["run", "hostile_mod:wf", "--input", '{"x": NaN}'], "--input is not JSON"),
        (["run", "hostile_mod:wf", "--input", "[1]"], "must be a JSON object"),
        (["run", "hostile_mod:wf", "--run-id", "../x"], "run id"),
        (["run", "hostile_mod:nope"], "hostile_mod:nope"),
        (["cancel", "run_nope"], "not found"),
    ],
)
def test_the_cli_refuses_with_a_message_not_a_traceback(
    cli: str, args: list[str], match: str
) -> None:
    result = CliRunner().invoke(app, [*args, "--world", cli])
    assert result.exit_code != 0
    assert match in result.output and "Traceback" not in result.output
    world = local_world(cli.removeprefix("sqlite:///"))
    try:
        assert not world.run_exists("run_nope")
    finally:
        world.close()


@pytest.mark.parametrize("url", [5, b"memory://", ["memory://"]])
def test_open_world_refuses_a_url_that_is_not_a_string(url: Any) -> None:
    with pytest.raises(WorldConfigError, match="world URL is a string"):
        open_world(url)


@pytest.mark.parametrize("data_dir", [5, None, b"dir"])
def test_local_world_refuses_a_data_dir_that_is_not_a_path(data_dir: Any) -> None:
    with pytest.raises(WorldConfigError, match="data_dir must be a path"):
        local_world(data_dir)


def test_an_empty_world_url_or_data_dir_is_refused_not_taken_for_the_default(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A setting never filled in would otherwise open (and create) a world in the cwd.
    monkeypatch.chdir(tmp_path)
    for url in ("", "  "):
        with pytest.raises(WorldConfigError, match="the world URL is empty"):
            open_world(url)
    for data_dir in ("", " "):
        with pytest.raises(WorldConfigError, match="data_dir is empty"):
            local_world(data_dir)
    assert not list(tmp_path.iterdir()), "something was created in the working directory"


def test_record_run_event_appends_after_a_writer_that_got_there_first(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the run's lease, as cancel_run and signal: an append that loses the version
    race to another writer (the driver) is decided again on the reloaded stream."""
    from little_es.world import World as WorldClass

    path = tmp_path / "w"
    with local_world(path) as first:
        asyncio.run(run_workflow(first, _flow(1), {"k": 1}, run_id="run_race"))
        other = local_world(path)
        load_run = WorldClass.load_run
        raced: list[str] = []

        def load_then_another_appends(self: Any, run_id: str) -> Any:
            run = load_run(self, run_id)
            if not raced:
                raced.append(run_id)  # between this load and its save: another writer
                other.record_run_event(run_id, _Note, text="the other writer")
            return run

        monkeypatch.setattr(WorldClass, "load_run", load_then_another_appends)
        first.record_run_event("run_race", _Note, text="this writer")
        monkeypatch.undo()
        other.close()
        notes = [e.text for e in first.read_run_log("run_race") if isinstance(e, _Note)]
    assert raced and notes == ["the other writer", "this writer"]

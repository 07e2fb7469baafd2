"""Domain extension: a user's own RunEvent subclass, stored and read back by its wire name."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import pytest

from little_es.domain import Run
from little_es.errors import EventPayloadError, RunNotFoundError
from little_es.events import (
    WIRE_NAME_MAX_LENGTH,
    HarnessEvent,
    OuterLoopStarted,
    RunEvent,
    RunStarted,
    event_class_for,
    registered_wire_names,
)
from little_es.ids import run_stream_id
from little_es.materialize import materialize_run_state
from little_es.pricing import price_usage_exact
from little_es.world import World

if TYPE_CHECKING:
    from conftest import WorldSpec

_REPO = Path(__file__).resolve().parents[1]


class ApprovalRequested(RunEvent):
    """A user's domain event: someone must approve before the run goes on."""

    wire_name: ClassVar[str] = "ApprovalRequested"

    approver: str
    reason: str = ""
    amounts: tuple[int, ...] = ()


class ApprovalGranted(RunEvent):
    """A second user event, to show several interleave with the run's own events."""

    wire_name: ClassVar[str] = "ApprovalGranted"

    approver: str


class LongestNamed(RunEvent):
    """A user event whose wire name is as long as allowed, and not all ASCII."""

    wire_name: ClassVar[str] = "Approved\U0001f600".ljust(WIRE_NAME_MAX_LENGTH, "x")


def _start(world: World, run_id: str) -> None:
    run = Run(run_id, price_usage_exact)
    run.trigger(RunStarted, run_id=run_id, workflow_id="w", workflow_version="1", ir_hash="0")
    world.save(run)


def test_user_event_is_stored_and_read_back_by_wire_name(world: World) -> None:
    _start(world, "run_approval")
    requested = world.record_run_event(
        "run_approval", ApprovalRequested, approver="ops", reason="over budget", amounts=(5, 7)
    )
    granted = world.record_run_event("run_approval", ApprovalGranted, approver="ops")

    log = world.read_run_log("run_approval")

    assert [type(e) for e in log] == [RunStarted, ApprovalRequested, ApprovalGranted]
    assert log[1:] == [requested, granted]
    assert isinstance(log[1], ApprovalRequested) and log[1].amounts == (5, 7)
    assert [e.originator_version for e in log] == [1, 2, 3]
    topics = [r.topic for r in world.select_stored(run_stream_id("run_approval"))]
    assert topics == ["RunStarted", "ApprovalRequested", "ApprovalGranted"]
    assert event_class_for("ApprovalRequested") is ApprovalRequested
    assert "ApprovalRequested" in registered_wire_names()
    # The one reducer counts events it does not know, and the aggregate folds them.
    assert materialize_run_state(log, pricer=price_usage_exact).event_count == 3
    assert world.load_run("run_approval").version == 3


@pytest.mark.backends("sqlite", "postgres", "mariadb")
def test_user_event_is_read_by_another_process_that_defines_it(
    world: World, world_spec: WorldSpec
) -> None:
    _start(world, "run_approval")
    world.record_run_event("run_approval", ApprovalRequested, approver="cfo")
    reader = textwrap.dedent(
        """
        from typing import ClassVar
        from little_es.events import RunEvent
        from little_es.world import open_world

        class ApprovalRequested(RunEvent):
            wire_name: ClassVar[str] = "ApprovalRequested"
            approver: str
            reason: str = ""
            amounts: tuple[int, ...] = ()

        with open_world() as world:
            event = world.read_run_log("run_approval")[-1]
            print(type(event).__name__, event.approver)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", reader],
        env={**os.environ, "LITTLE_ES_WORLD": world_spec.url, "PYTHONPATH": str(_REPO)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["ApprovalRequested", "cfo"]


def test_user_event_fields_are_validated_at_record_time(world: World) -> None:
    _start(world, "run_approval")
    with pytest.raises(EventPayloadError, match="approver"):
        world.record_run_event("run_approval", ApprovalRequested)
    with pytest.raises(EventPayloadError, match="amounts"):
        world.record_run_event("run_approval", ApprovalRequested, approver="x", amounts=("a",))
    assert len(world.read_run_log("run_approval")) == 1


def test_user_event_needs_an_existing_run(world: World) -> None:
    with pytest.raises(RunNotFoundError, match="run_absent"):
        world.record_run_event("run_absent", ApprovalRequested, approver="ops")
    assert not world.run_exists("run_absent")


def test_only_run_events_can_go_on_a_run_stream(world: World) -> None:
    class Foreign(HarnessEvent):
        wire_name: ClassVar[str] = "test.extension.Foreign"

    _start(world, "run_approval")
    with pytest.raises(TypeError, match="is not a RunEvent"):
        world.record_run_event("run_approval", Foreign)  # type: ignore[type-var]
    with pytest.raises(TypeError, match="is not a RunEvent"):
        world.record_run_event(
            "run_approval",
            OuterLoopStarted,  # type: ignore[type-var]
            outer_loop_id="l",
            workflow_id="w",
            max_cycles=1,
        )
    assert len(world.read_run_log("run_approval")) == 1


@pytest.mark.parametrize("taken", ["ApprovalRequested", "StepCompleted", "harness.model.called"])
def test_a_duplicate_wire_name_is_refused(taken: str) -> None:
    owner = event_class_for(taken)
    assert owner is not None
    with pytest.raises(TypeError, match=f"{taken!r} is already used by .*{owner.__qualname__}"):

        class Impostor(RunEvent):
            wire_name: ClassVar[str] = taken

    assert event_class_for(taken) is owner


@pytest.mark.parametrize(
    "name",
    [
        "Appr\x00oved",
        "Appr\noved",
        "Approved\x7f",
        "Appr\x85oved",
        "Appr\ud800oved",
        "E" * (WIRE_NAME_MAX_LENGTH + 1),
        5,
    ],
    ids=["nul", "newline", "del", "c1", "surrogate", "too long", "not a string"],
)
def test_a_wire_name_no_backend_stores_alike_is_refused(name: object) -> None:
    with pytest.raises(TypeError, match=r"Odd\.wire_name"):

        class Odd(RunEvent):
            wire_name: ClassVar[str] = name  # type: ignore[assignment]

    assert all("Odd" not in c.__qualname__ for c in map(event_class_for, registered_wire_names()))


def test_the_longest_wire_name_is_stored_and_read_back(world: World) -> None:
    _start(world, "run_long_name")
    recorded = world.record_run_event("run_long_name", LongestNamed)
    assert world.read_run_log("run_long_name")[-1] == recorded
    topics = [r.topic for r in world.select_stored(run_stream_id("run_long_name"))]
    assert topics[-1] == LongestNamed.wire_name

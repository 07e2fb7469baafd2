"""A step's eventsourcing aggregates, committed with its StepCompleted: exactly-once effects.

The kill tests run the step in a child process and SIGKILL it right before and right after
the commit that holds the step's StepCompleted and its ticket's new event: either way, once
resumed, the ticket's events exist once. A concurrent change to the step's aggregate makes
the attempt a retryable failure with nothing of it written; the retry reads the aggregate
afresh.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import pytest
from eventsourcing.domain import Aggregate, event
from eventsourcing.persistence import Tracking

from little_es import (
    AggregateArgumentError,
    AggregateNotFoundError,
    RetryPolicy,
    RunFailedError,
    StepCompleted,
    StepContext,
    StepFailed,
    UnknownEventTypeError,
    Workflow,
    parallel,
    replay_run,
    run_workflow,
    task,
    verify_world,
)
from little_es.cli import app as cli_app
from little_es.ids import run_stream_id
from little_es.world import World
from tests._tickets import Ticket, triage_workflow
from tests.conftest import WorldSpec

_REPO = Path(__file__).resolve().parents[1]


def _open_ticket(world: World, subject: str = "printer on fire") -> UUID:
    unit = world.aggregates()
    ticket = unit.add(Ticket(subject=subject))
    assert world.commit_aggregates(unit) == 1
    return ticket.id


def _ticket_events(world: World, ticket_id: UUID) -> list[str]:
    return [type(e).__name__ for e in world.load_domain_stream(ticket_id).events]


def _child(
    spec: WorldSpec, run_id: str, ticket_id: UUID, **env: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            str(_REPO / "tests" / "_aggregates_proc.py"),
            spec.url,
            run_id,
            str(ticket_id),
        ],
        env={**os.environ, "PYTHONPATH": str(_REPO), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.backends("sqlite", "postgres", "mariadb")
@pytest.mark.parametrize(
    ("variable", "ticket_after_kill", "executed_on_resume"),
    [
        # Killed after the step changed the ticket, before the commit: the change is lost
        # with the process, and the resumed step makes it again from the stored version.
        ("LITTLE_ES_CRASH_BEFORE_EVENT", ["Opened"], 2),
        # Killed right after the commit: the step and its effect are stored; it is skipped.
        ("LITTLE_ES_CRASH_AFTER_EVENT", ["Opened", "Commented"], 1),
    ],
    ids=["before-commit", "after-commit"],
)
def test_a_step_killed_around_its_commit_changes_the_ticket_exactly_once(
    world_spec: WorldSpec,
    variable: str,
    ticket_after_kill: list[str],
    executed_on_resume: int,
) -> None:
    with world_spec.open() as world:
        ticket_id = _open_ticket(world)
    killed = _child(
        world_spec, "run_ticket", ticket_id, **{variable: "StepCompleted:step_path=comment"}
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    with world_spec.open() as world:
        assert _ticket_events(world, ticket_id) == ticket_after_kill
        completed = [
            e.step_path for e in world.read_run_log("run_ticket") if isinstance(e, StepCompleted)
        ]
        assert completed == ([] if len(ticket_after_kill) == 1 else ["comment"])

    resumed = _child(world_spec, "run_ticket", ticket_id)
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.split() == ["RESULT", str(executed_on_resume)]

    with world_spec.open() as world:
        assert _ticket_events(world, ticket_id) == ["Opened", "Commented", "Resolved"]
        ticket = world.aggregates().get(Ticket, ticket_id)
        assert ticket.version == 3 and ticket.status == "resolved"
        assert ticket.notes == ["looked at by run_ticket", "refund issued"]
        # The run's log folds as before, and the whole world verifies.
        replayed = replay_run(world, "run_ticket")
        assert replayed.state.status == "completed"
        assert replayed.state.steps["comment"].attempts == 1
        report = verify_world(world)
        assert report.ok, report
        kinds = {s.kind for s in report.streams}
        assert {"aggregate", "run"} <= kinds
    from typer.testing import CliRunner

    verified = CliRunner().invoke(cli_app, ["verify", "--all", "--world", world_spec.url])
    assert verified.exit_code == 0, verified.output


@pytest.mark.backends("memory", "sqlite", "postgres", "mariadb")
def test_a_concurrent_change_is_a_retryable_failure_and_the_retry_reads_afresh(
    world: World,
) -> None:
    ticket_id = _open_ticket(world)
    attempts: list[int] = []

    def comment(ctx: StepContext) -> int:
        ticket = ctx.aggregates.get(Ticket, ticket_id)
        ticket.comment(f"attempt {ctx.attempt}")
        attempts.append(ctx.attempt)
        if ctx.attempt == 1:
            # Another writer (a person in the ticket UI) comments after this step read it.
            other = world.aggregates()
            other.get(Ticket, ticket_id).comment("from the UI")
            world.commit_aggregates(other)
        return ticket.version

    workflow = Workflow(
        "conflict", steps=[task("comment", comment, retry=RetryPolicy(max_attempts=2))]
    )
    result = asyncio.run(run_workflow(world, workflow, {}, run_id="run_conflict"))

    assert attempts == [1, 2] and result.output == 3
    ticket = world.aggregates().get(Ticket, ticket_id)
    assert ticket.notes == ["from the UI", "attempt 2"]
    failed = [e for e in world.read_run_log("run_conflict") if isinstance(e, StepFailed)]
    assert len(failed) == 1 and failed[0].will_retry
    assert failed[0].error.type == "AggregateConflictError" and failed[0].error.retryable
    assert "Ticket" in failed[0].error.message
    assert replay_run(world, "run_conflict").state.steps["comment"].attempts == 2


def test_without_retries_a_conflict_fails_the_run_and_writes_nothing_of_the_step(
    world: World,
) -> None:
    ticket_id = _open_ticket(world)

    def comment(ctx: StepContext) -> None:
        ctx.aggregates.get(Ticket, ticket_id).comment("lost")
        other = world.aggregates()
        other.get(Ticket, ticket_id).comment("won")
        world.commit_aggregates(other)

    workflow = Workflow("conflict_once", steps=[task("comment", comment)])
    with pytest.raises(RunFailedError, match="AggregateConflictError"):
        asyncio.run(run_workflow(world, workflow, {}, run_id="run_conflict_once"))
    assert world.aggregates().get(Ticket, ticket_id).notes == ["won"]
    assert replay_run(world, "run_conflict_once").state.status == "failed"


def test_a_failing_step_commits_none_of_its_changes_and_a_new_aggregate_once(
    world: World,
) -> None:
    created: list[UUID] = []

    def open_and_fail(ctx: StepContext) -> str:
        ticket = ctx.aggregates.add(Ticket(subject=f"try {ctx.attempt}"))
        created.append(ticket.id)
        if ctx.attempt == 1:
            raise RuntimeError("model timed out")
        return str(ticket.id)

    workflow = Workflow(
        "opener", steps=[task("open", open_and_fail, retry=RetryPolicy(max_attempts=2))]
    )
    result = asyncio.run(run_workflow(world, workflow, {}, run_id="run_opener"))
    assert result.output == str(created[1])
    assert _ticket_events(world, created[1]) == ["Opened"]
    assert _ticket_events(world, created[0]) == []  # the failed attempt's ticket: never stored
    assert world.aggregates().get(Ticket, created[1]).subject == "try 2"


def test_the_unit_of_work_refuses_what_it_cannot_commit(world: World) -> None:
    unit = world.aggregates()
    with pytest.raises(AggregateNotFoundError, match=r"ctx\.aggregates\.add"):
        unit.get(Ticket, uuid4())
    with pytest.raises(AggregateArgumentError, match="UUID"):
        unit.get(Ticket, "not-a-uuid")  # type: ignore[arg-type]
    with pytest.raises(AggregateArgumentError, match="eventsourcing aggregate class"):
        unit.get(dict, uuid4())  # type: ignore[type-var]
    ticket_id = _open_ticket(world)

    class Invoice(Aggregate):
        pass

    with pytest.raises(AggregateArgumentError, match=r"is a Ticket, not a .*Invoice"):
        world.aggregates().get(Invoice, ticket_id)
    stored = world.aggregates().get(Ticket, ticket_id)
    with pytest.raises(AggregateArgumentError, match="new aggregate"):
        world.aggregates().add(stored)
    # A run's own stream is not a user's aggregate.
    asyncio.run(run_workflow(world, Workflow("noop", steps=[task("a", lambda ctx: 1)]), run_id="r"))
    with pytest.raises(UnknownEventTypeError, match=r"not a\s+user's aggregate"):
        world.aggregates().get(Ticket, run_stream_id("r"))
    # Outside a step attempt there is no step unit of work.
    ctx = StepContext(run_id="r", input={}, outputs={}, step_path="a")
    with pytest.raises(AggregateArgumentError, match="not available"):
        _ = ctx.aggregates


class OpenTicketsCost:
    """A read model a team builds with eventsourcing's own tools: open tickets and what the
    agents' runs that touched them cost, from one pass over the world's log."""

    def __init__(self) -> None:
        self.tickets: dict[UUID, dict[str, Any]] = {}
        self.seen: list[str] = []

    def process_event(self, event: Any, tracking: Tracking) -> None:
        self.seen.append(type(event).__qualname__)
        if isinstance(event, Ticket.Opened):
            self.tickets[event.originator_id] = {"subject": event.subject, "cost_usd": 0.0}
        elif isinstance(event, Ticket.Commented):
            self.tickets[event.originator_id]["cost_usd"] += event.cost_usd
        elif isinstance(event, Ticket.Resolved):
            self.tickets.pop(event.originator_id, None)


def test_a_projection_over_the_world_log_sees_runs_and_domain_events_in_one_order(
    world: World,
) -> None:
    first = _open_ticket(world, "first")
    second = _open_ticket(world, "second")
    asyncio.run(run_workflow(world, triage_workflow(), {"ticket_id": str(first)}, run_id="r1"))

    def comment_only(ctx: StepContext) -> None:
        ctx.aggregates.get(Ticket, second).comment("triaged", cost_usd=0.5)

    asyncio.run(
        run_workflow(world, Workflow("c", steps=[task("c", comment_only)]), {}, run_id="r2")
    )

    view = OpenTicketsCost()
    recorder, mapper = world.app.recorder, world.app.mapper
    for notification in recorder.select_notifications(start=None, limit=1000):
        view.process_event(
            mapper.to_domain_event(notification), Tracking(world.app.name, notification.id)
        )
    assert view.tickets == {second: {"subject": "second", "cost_usd": 0.5}}
    order = [n for n in view.seen if n not in ("WorldCreated", "StepStarted")]
    assert order == [
        "Ticket.Opened",
        "Ticket.Opened",
        "RunStarted",
        "StepCompleted",
        "Ticket.Commented",
        "StepCompleted",
        "Ticket.Resolved",
        "RunCompleted",
        "RunStarted",
        "StepCompleted",
        "Ticket.Commented",
        "RunCompleted",
    ]


def test_the_example_runs_and_its_ticket_is_changed_once() -> None:
    done = subprocess.run(
        [sys.executable, str(_REPO / "examples" / "domain_aggregates.py")],
        env={**os.environ, "PYTHONPATH": str(_REPO)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "exited with -9" in out
    assert "the ticket's events after the kill: ['Opened']" in out
    assert "the model was called 0 times" in out
    assert "the ticket's events: ['Opened', 'Commented']" in out
    assert "'My order arrived broken'  runs=['run_support_1']  $0.008100" in out
    assert "Where is my invoice" not in out.split("4. open tickets")[1]


@pytest.mark.backends("postgres", "mariadb")
def test_an_eventsourcing_projection_runner_follows_the_world_live(
    world: World, backend: str
) -> None:
    # eventsourcing's ProjectionRunner builds its own application from the world's settings
    # and subscribes to its log (PostgreSQL's LISTEN/NOTIFY; eventsourcing's SQLite recorder
    # has no subscriptions: read it with select_notifications as above).
    if backend == "mariadb":
        with pytest.raises(NotImplementedError):
            world.app.recorder.subscribe()
        pytest.skip(
            "eventsourcing-sqlalchemy's subscribe() is PostgreSQL-only (LISTEN/NOTIFY): a"
            " MariaDB world is read with select_notifications, as a SQLite one"
        )
    from functools import singledispatchmethod

    from eventsourcing.popo import POPOTrackingRecorder
    from eventsourcing.projection import Projection, ProjectionRunner

    from little_es.world import LittleApplication

    class View(POPOTrackingRecorder):
        def __init__(self) -> None:
            super().__init__()
            self.order: list[str] = []

    class Live(Projection[View]):
        name = "live_tickets"

        @singledispatchmethod
        def process_event(self, domain_event: Any, tracking: Tracking) -> None:
            self.view.order.append(type(domain_event).__qualname__)
            self.view.insert_tracking(tracking)

    ticket_id = _open_ticket(world)
    env = {**world.app.env, "LIVE_TICKETS_PERSISTENCE_MODULE": "eventsourcing.popo"}
    with ProjectionRunner(
        application_class=LittleApplication, projection_class=Live, view_class=View, env=env
    ) as runner:
        asyncio.run(
            run_workflow(world, triage_workflow(), {"ticket_id": str(ticket_id)}, run_id="live")
        )
        last = world.app.recorder.max_notification_id()
        assert last is not None
        runner.view.wait(world.app.name, last, timeout=10)
        order = [n for n in runner.view.order if n != "StepStarted"]
    assert order == [
        "WorldCreated",
        "Ticket.Opened",
        "RunStarted",
        "StepCompleted",
        "Ticket.Commented",
        "StepCompleted",
        "Ticket.Resolved",
        "RunCompleted",
    ]


def test_parallel_branches_change_one_aggregate_each_and_a_group_function_cannot(
    world: World,
) -> None:
    ids = {key: _open_ticket(world, key) for key in ("a", "b", "c")}

    def branches(ctx: StepContext) -> list[str]:
        return sorted(ids)

    def comment(ctx: StepContext) -> int:
        ticket = ctx.aggregates.get(Ticket, ids[ctx.branch_value])
        ticket.comment(f"branch {ctx.branch_value}")
        return ticket.version

    def touch_in_branches(ctx: StepContext) -> list[str]:
        ctx.aggregates.get(Ticket, ids["a"]).comment("lost")
        return ["a"]

    fan_out = Workflow("fan", steps=[parallel("each", branches=branches, step=task("c", comment))])
    result = asyncio.run(run_workflow(world, fan_out, {}, run_id="run_fan"))
    assert result.output == {"a": 2, "b": 2, "c": 2}
    for key, ticket_id in ids.items():
        assert world.aggregates().get(Ticket, ticket_id).notes == [f"branch {key}"]

    refused = Workflow(
        "refused", steps=[parallel("each", branches=touch_in_branches, step=task("c", comment))]
    )
    with pytest.raises(RunFailedError, match="not available"):
        asyncio.run(run_workflow(world, refused, {}, run_id="run_refused"))
    assert _ticket_events(world, ids["a"]) == ["Opened", "Commented"]


class Keeper(Aggregate):
    """Keeps any JSON document it is given (a payload from an outside API, say)."""

    @event("Kept")
    def keep(self, document: Any) -> None:
        self.document = document


def _nested(levels: int) -> Any:
    value: Any = 1
    for _ in range(levels):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("document", "match"),
    [
        ({"_type_": "uuid_hex", "_data_": "not-a-uuid"}, "would not read back"),
        (_nested(65), "nests deeper than 64"),
        (_nested(3000), "maximum recursion depth"),
    ],
    ids=["transcoder's own keys", "65 levels", "3000 levels"],
)
def test_an_aggregate_event_a_reader_could_not_read_back_fails_its_step_and_writes_nothing(
    world: World, document: Any, match: str
) -> None:
    """Refused before the commit, as the step's own failure: committed, the aggregate could
    never be read again (nor verified), and the run would fail at the next step that asks."""
    unit = world.aggregates()
    keeper_id = unit.add(Keeper()).id
    world.commit_aggregates(unit)

    def keep(ctx: StepContext) -> str:
        ctx.aggregates.get(Keeper, keeper_id).keep(document)
        return "kept"

    wf = Workflow("keeper", steps=[task("keep", keep)])
    with pytest.raises(RunFailedError, match="EventPayloadError") as failed:
        asyncio.run(run_workflow(world, wf, {}, run_id="run_keep"))
    assert match in failed.value.error.message and not failed.value.error.retryable
    assert world.aggregates().get(Keeper, keeper_id).version == 1

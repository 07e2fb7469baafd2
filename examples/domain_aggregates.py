"""A support ticket changed by an agent's run, killed between the change and its commit, resumed.

    python examples/domain_aggregates.py

1. This process opens two support tickets: ``Ticket`` is a plain eventsourcing aggregate
   (``eventsourcing.domain.Aggregate`` with ``@event`` methods), stored in the world.
2. A child process runs the ``support`` workflow on the first ticket: ``draft`` (an agent
   step, a scripted model) writes a reply, ``reply`` adds it to the ticket through
   ``ctx.aggregates``. The child is SIGKILLed after ``reply`` changed the ticket and
   right before the commit of its ``StepCompleted`` (``LITTLE_ES_CRASH_BEFORE_EVENT``):
   the change dies with the process; the ticket has its ``Opened`` event only.
3. This process resumes the run: ``draft`` is committed (its model is not called again),
   ``reply`` runs again from the ticket's stored version, and its comment is committed in
   the transaction of its ``StepCompleted``. The ticket's events exist once.
4. A second run resolves the other ticket; then a read model, "open tickets with their
   agents' cost", is built with eventsourcing's ``Projection`` over the world's log, where
   the runs' events and the tickets' events come in one order.

No network: the model is a ScriptedModel with a price recorded in the world.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
from decimal import Decimal
from functools import singledispatchmethod
from typing import Any
from uuid import UUID

from eventsourcing.domain import Aggregate, event
from eventsourcing.persistence import Tracking
from eventsourcing.popo import POPOTrackingRecorder
from eventsourcing.projection import Projection

from little_es import (
    ModelResponded,
    RunStarted,
    ScriptedModel,
    ScriptedReply,
    StepContext,
    StepStarted,
    Usage,
    Workflow,
    World,
    agent,
    configure_logging,
    local_world,
    run_workflow,
    task,
)

RUN_ID = "run_support_1"
CRASH_BEFORE = "StepCompleted:step_path=reply"


class Ticket(Aggregate):
    """A support ticket, written the way eventsourcing's documentation writes aggregates."""

    @event("Opened")
    def __init__(self, subject: str) -> None:
        self.subject = subject
        self.status = "open"
        self.comments: list[str] = []

    @event("Commented")
    def comment(self, text: str, run_id: str) -> None:
        self.comments.append(text)

    @event("Resolved")
    def resolve(self, run_id: str) -> None:
        self.status = "resolved"


def _reply(ctx: StepContext) -> dict[str, Any]:
    ticket = ctx.aggregates.get(Ticket, UUID(ctx.input["ticket_id"]))
    ticket.comment(ctx.outputs["draft"], run_id=ctx.run_id)
    return {"comments": len(ticket.comments), "version": ticket.version}


def _resolve(ctx: StepContext) -> str:
    ticket = ctx.aggregates.get(Ticket, UUID(ctx.input["ticket_id"]))
    ticket.resolve(run_id=ctx.run_id)
    return ticket.status


writer = ScriptedModel(
    responses=[
        ScriptedReply(
            content="Sorry about that: a replacement is on its way.",
            usage=Usage(input_tokens=1200, output_tokens=300),
        )
    ],
    provider="scripted",
    model_id="support-1",
)

support = Workflow(
    "support",
    steps=[
        agent("draft", model=writer, prompt="Draft a reply to the customer's ticket."),
        task("reply", _reply),
    ],
)
closing = Workflow("closing", steps=[task("resolve", _resolve)])


# ------------------------------------------------------------------ the read model


class OpenTicketsView(POPOTrackingRecorder):
    """Open tickets and the cost of the runs that worked on them, with eventsourcing's tracking."""

    def __init__(self) -> None:
        super().__init__()
        self.tickets: dict[UUID, dict[str, Any]] = {}
        self.run_of_stream: dict[UUID, str] = {}
        self.run_cost: dict[str, Decimal] = {}


class OpenTickets(Projection[OpenTicketsView]):
    """Folds the world's log: run and session streams give each run's model cost (priced as
    the world prices it), ticket events give the open tickets and the runs that touched them."""

    def __init__(self, view: OpenTicketsView, world: World) -> None:
        super().__init__(view)
        self.world = world

    @singledispatchmethod
    def process_event(self, domain_event: Any, tracking: Tracking) -> None:
        self.view.insert_tracking(tracking)

    @process_event.register
    def _(self, domain_event: RunStarted, tracking: Tracking) -> None:
        self.view.run_of_stream[domain_event.originator_id] = domain_event.run_id
        self.view.insert_tracking(tracking)

    @process_event.register
    def _(self, domain_event: StepStarted, tracking: Tracking) -> None:
        run_id = self.view.run_of_stream[domain_event.originator_id]
        if domain_event.session_id is not None:
            self.view.run_of_stream[domain_event.session_id] = run_id
        self.view.insert_tracking(tracking)

    @process_event.register
    def _(self, domain_event: ModelResponded, tracking: Tracking) -> None:
        run_id = self.view.run_of_stream[domain_event.originator_id]
        r = domain_event.response
        cost = self.world.pricer(r.provider, r.model, r.usage, domain_event.timestamp)
        self.view.run_cost[run_id] = self.view.run_cost.get(run_id, Decimal(0)) + (cost or 0)
        self.view.insert_tracking(tracking)

    @process_event.register
    def _(self, domain_event: Ticket.Opened, tracking: Tracking) -> None:
        self.view.tickets[domain_event.originator_id] = {
            "subject": domain_event.subject,
            "runs": set(),
        }
        self.view.insert_tracking(tracking)

    @process_event.register
    def _(self, domain_event: Ticket.Commented, tracking: Tracking) -> None:
        self.view.tickets[domain_event.originator_id]["runs"].add(domain_event.run_id)
        self.view.insert_tracking(tracking)

    @process_event.register
    def _(self, domain_event: Ticket.Resolved, tracking: Tracking) -> None:
        self.view.tickets.pop(domain_event.originator_id, None)
        self.view.insert_tracking(tracking)


def open_tickets_with_cost(world: World) -> OpenTicketsView:
    """Run the projection over every notification of the world's log, in their one order."""
    projection = OpenTickets(OpenTicketsView(), world)
    recorder, mapper = world.app.recorder, world.app.mapper
    start: int | None = None
    while page := recorder.select_notifications(start=start, limit=500, inclusive_of_start=False):
        for notification in page:
            projection.process_event(
                mapper.to_domain_event(notification), Tracking(world.app.name, notification.id)
            )
        start = page[-1].id
    return projection.view


# ------------------------------------------------------------------ the story


def _ticket_events(world: World, ticket_id: UUID) -> list[str]:
    return [type(e).__name__ for e in world.load_domain_stream(ticket_id).events]


def _child(world_dir: str, ticket_id: str) -> None:
    configure_logging(level="WARNING")
    with local_world(world_dir) as world:
        asyncio.run(run_workflow(world, support, {"ticket_id": ticket_id}, run_id=RUN_ID))


def main() -> None:
    configure_logging(level="WARNING")
    world_dir = tempfile.mkdtemp(prefix="little-es-tickets-")
    with local_world(world_dir) as world:
        world.set_model_price("scripted", "support-1", input_per_mtok=3.0, output_per_mtok=15.0)
        unit = world.aggregates()
        broken = unit.add(Ticket(subject="My order arrived broken"))
        late = unit.add(Ticket(subject="Where is my invoice?"))
        world.commit_aggregates(unit)
    print(f"1. opened tickets {broken.id} and {late.id} in {world_dir}")

    child = subprocess.run(
        [sys.executable, __file__, "--child", world_dir, str(broken.id)],
        env={**os.environ, "LITTLE_ES_CRASH_BEFORE_EVENT": CRASH_BEFORE},
        check=False,
    )
    killed = (
        " (SIGKILL between the ticket's change and its commit)" if child.returncode == -9 else ""
    )
    print(f"2. the child running {RUN_ID} exited with {child.returncode}{killed}")
    with local_world(world_dir) as world:
        print(f"   the ticket's events after the kill: {_ticket_events(world, broken.id)}")

        result = asyncio.run(run_workflow(world, support, run_id=RUN_ID))
        print(
            f"3. resumed: {result.steps_executed} step ran again (reply), the model was called"
            f" {writer.calls} times in this process; output {result.output}"
        )
        print(f"   the ticket's events: {_ticket_events(world, broken.id)}")

        asyncio.run(run_workflow(world, closing, {"ticket_id": str(late.id)}, run_id="run_close"))
        view = open_tickets_with_cost(world)
        print("4. open tickets with their agents' cost (an eventsourcing Projection):")
        for ticket_id, ticket in view.tickets.items():
            cost = sum((view.run_cost.get(r, Decimal(0)) for r in ticket["runs"]), Decimal(0))
            print(
                f"   {ticket_id}  {ticket['subject']!r}  runs={sorted(ticket['runs'])}  ${cost:.6f}"
            )
    print(
        f"\nInspect it: little events {RUN_ID} --world sqlite:///{world_dir}; little verify --all"
    )


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        _child(sys.argv[2], sys.argv[3])
    else:
        main()

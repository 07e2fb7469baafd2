"""A support-ticket aggregate the way eventsourcing's documentation writes one, for the tests
of step aggregates (``test_aggregates.py``, ``_aggregates_proc.py``)."""

from __future__ import annotations

from uuid import UUID

from eventsourcing.domain import Aggregate, event

from little_es import RetryPolicy, StepContext, Workflow, task


class Ticket(Aggregate):
    """A support ticket: opened, commented on by agents, resolved."""

    @event("Opened")
    def __init__(self, subject: str) -> None:
        self.subject = subject
        self.status = "open"
        self.notes: list[str] = []
        self.cost_usd = 0.0

    @event("Commented")
    def comment(self, text: str, cost_usd: float = 0.0) -> None:
        self.notes.append(text)
        self.cost_usd += cost_usd

    @event("Resolved")
    def resolve(self, note: str) -> None:
        self.status = "resolved"
        self.notes.append(note)


def comment_step(ctx: StepContext) -> dict[str, object]:
    """Comment on the run's ticket (input ``ticket_id``)."""
    ticket = ctx.aggregates.get(Ticket, UUID(ctx.input["ticket_id"]))
    ticket.comment(f"looked at by {ctx.run_id}", cost_usd=0.25)
    return {"notes": len(ticket.notes), "version": ticket.version}


def resolve_step(ctx: StepContext) -> dict[str, object]:
    """Resolve the run's ticket."""
    ticket = ctx.aggregates.get(Ticket, UUID(ctx.input["ticket_id"]))
    ticket.resolve("refund issued")
    return {"status": ticket.status, "version": ticket.version}


def triage_workflow(retries: int = 1) -> Workflow:
    """comment, then resolve: two steps that each change the ticket."""
    return Workflow(
        "ticket_triage",
        steps=[
            task("comment", comment_step, retry=RetryPolicy(max_attempts=retries)),
            task("resolve", resolve_step),
        ],
    )

"""``little unlock <run-id> [--force]``: who holds a run's lease, and taking it from a stuck holder.

A driver that is alive but stuck (stopped, deadlocked, blocked on a call that
never returns) keeps its lease, so nothing else can resume the run. Without
``--force`` the command says who holds the lease (pid and host) and exits 1
if one does; with ``--force`` it takes the lease away (SQLite: replaces the
lock file, so the holder's next check sees another inode; PostgreSQL:
terminates the server backend holding the advisory lock). The old holder
stops with :class:`~little_es.errors.LeaseLostError` at its next check,
before any further step, model call, tool call or append, and an append it
races past that check fails the stream's version check once the new driver
has appended.
"""

from __future__ import annotations

from typing import Annotated

import typer

from little_es.cli.common import RunIdArgument, WorldOption, inspection_world

__all__ = ["unlock_command"]


def unlock_command(
    run_id: RunIdArgument,
    world: WorldOption = None,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Take the lease from its holder: it stops at its next check (LeaseLostError).",
        ),
    ] = False,
) -> None:
    """Show who holds a run's lease; with --force, take it from a stuck holder."""
    with inspection_world(world) as w:
        if not force:
            holder = w.lease_holder(run_id)
            if holder is None:
                typer.echo(f"run {run_id}: no process holds its lease")
                return
            typer.echo(
                f"run {run_id}: its lease is held by {holder}; if that process is stuck,"
                f" `little unlock {run_id} --force` takes the lease from it"
            )
            raise typer.Exit(1)
        broken = w.break_lease(run_id)
        if broken is None:
            typer.echo(f"run {run_id}: no process held its lease; nothing to do")
            return
        typer.echo(
            f"run {run_id}: took the lease from {broken}; it stops with LeaseLostError before"
            " its next step, model call, tool call or append. Resume the run with"
            f" `little resume` (or run_workflow(..., run_id={run_id!r}))."
        )

"""``little unlock <run-id> [--force]``: who holds a run's leases; taking them from a stuck driver.

A driver that is alive but stuck (stopped, deadlocked, blocked on a call that
never returns) keeps its lease, so nothing else can resume the run. The leases
of a run are its own (the local engine's), those of its steps in flight
(the Temporal adapter's, one per step) and those of its sub-runs, each with
its own steps and sub-runs (a driver stuck in a sub-run it drives in its
process holds the sub-run's lease too). An outer loop's id names the loop's
lease and those of its pending cycle's planner run and run. Without ``--force`` the command says
who holds them (pid and host) and exits 1 if anyone does; with ``--force`` it
takes them away (SQLite: replaces the lock file, so the holder's next check
sees another inode; PostgreSQL: terminates the server backend holding the
advisory lock). The old holder stops with
:class:`~little_es.errors.LeaseLostError` at its next check, before any
further step, model call, tool call or append, and an append that raced past
that check fails the stream's version check once the new driver has appended.
"""

from __future__ import annotations

from typing import Annotated

import typer

from little_es.cli.common import RunIdArgument, WorldOption, inspection_world
from little_es.errors import LittleEsError
from little_es.ids import step_lease_id, validate_run_id
from little_es.outer_loop import loop_lease_id
from little_es.replay import replay_run
from little_es.world import World

__all__ = ["unlock_command"]


def _leases(world: World, run_id: str, seen: set[str] | None = None) -> list[tuple[str, str]]:
    """(what, lease id) of the run, of each of its steps in flight and of its sub-runs.

    A driver stuck in a sub-run it drives in its own process holds that sub-run's
    lease too: left to it, the resumed run would stop at the sub-run with
    ConcurrentRunError.
    """
    seen = set() if seen is None else seen
    seen.add(run_id)
    found = [(f"run {run_id}", run_id)]
    try:
        state = replay_run(world, run_id).state
    except LittleEsError:
        # No log (a run that never started), or one that cannot be read: the run's lease only.
        return found
    found.extend(
        (f"step {path} of run {run_id}", step_lease_id(run_id, path))
        for path, step in state.steps.items()
        if step.status == "running"
    )
    for sub_run_id in state.sub_run_ids:
        if sub_run_id not in seen:
            (_, own), *rest = _leases(world, sub_run_id, seen)
            found.extend([(f"sub-run {sub_run_id} of run {run_id}", own), *rest])
    return found


def _loop_leases(world: World, loop_id: str) -> list[tuple[str, str]]:
    """(what, lease id) of the outer loop ``loop_id`` and of its pending cycle's runs, if
    the world has such a loop: its driver holds the loop's lease, and those of the run it
    drives."""
    try:
        loop = world.load_outer_loop(loop_id)
    except LittleEsError:
        return []
    if loop is None or loop.started is None:
        return []
    found = [(f"outer loop {loop_id}", loop_lease_id(loop_id))]
    cycle = loop.pending_cycle
    if cycle is not None:
        for run_id in (cycle.started.planner_run_id, cycle.started.run_id):
            found.extend(_leases(world, run_id))
    return found


def unlock_command(
    run_id: RunIdArgument,
    world: WorldOption = None,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Take the leases from their holder: it stops at its next check (LeaseLostError).",
        ),
    ] = False,
) -> None:
    """Show who holds a run's leases; with --force, take them from a stuck holder."""
    validate_run_id(run_id)
    with inspection_world(world) as w:
        leases = _leases(w, run_id) + _loop_leases(w, run_id)
        if not force:
            held = [(what, w.lease_holder(lease)) for what, lease in leases]
            held = [(what, holder) for what, holder in held if holder is not None]
            if not held:
                typer.echo(f"run {run_id}: no process holds its lease")
                return
            for what, holder in held:
                typer.echo(f"{what}: its lease is held by {holder}")
            typer.echo(
                f"if that process is stuck, `little unlock {run_id} --force` takes the lease"
                " from it"
            )
            raise typer.Exit(1)
        broken = [(what, w.break_lease(lease)) for what, lease in leases]
        broken = [(what, holder) for what, holder in broken if holder is not None]
        if not broken:
            typer.echo(f"run {run_id}: no process held its lease; nothing to do")
            return
        for what, holder in broken:
            typer.echo(f"{what}: took the lease from {holder}")
        typer.echo(
            "it stops with LeaseLostError before its next step, model call, tool call or"
            f" append; resume the run with `little resume` (or run_workflow(...,"
            f" run_id={run_id!r}))"
        )

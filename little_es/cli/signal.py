"""``little signal``: send a signal to a run that waits for it (a person's answer, an approval).

``little signal <run-id> <name> --data JSON [--digest D] [--signal-id ID] [--wait WAIT_ID]``
appends ``SignalReceived`` through :meth:`~little_es.world.World.signal`, which validates
the data against the wait's pydantic model (imported by its ``module:qualname``, the
current directory importable), refuses a duplicate naming the first, and an approval
whose digest is stale. ``little runs --waiting`` lists what runs wait for. The run goes
on at its next ``little resume`` (or ``run_workflow``).
"""

from __future__ import annotations

from typing import Annotated, Any

import orjson
import typer

from little_es.cli.common import RunIdArgument, WorldOption, inspection_world
from little_es.errors import SignalDataError

__all__ = ["signal_command"]


def signal_command(
    run_id: RunIdArgument,
    name: Annotated[str, typer.Argument(help="The signal's name.", show_default=False)],
    data: Annotated[
        str, typer.Option("--data", help="The signal's data, JSON (validated by its model).")
    ] = "null",
    digest: Annotated[
        str | None,
        typer.Option(
            "--digest",
            help="The digest of the action an approval approves (little runs --waiting).",
            show_default=False,
        ),
    ] = None,
    signal_id: Annotated[
        str | None,
        typer.Option(
            "--signal-id",
            help="An id for this signal (a webhook's delivery id): sent twice, refused once.",
            show_default=False,
        ),
    ] = None,
    wait: Annotated[
        str | None,
        typer.Option(
            "--wait",
            help="The wait id, when the run waits for NAME at several places.",
            show_default=False,
        ),
    ] = None,
    world: WorldOption = None,
) -> None:
    """Send a signal to a waiting run; its next resume continues from the wait."""
    try:
        value: Any = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise SignalDataError(f"--data is not JSON: {exc}") from exc
    with inspection_world(world) as w:
        event = w.signal(run_id, name, value, digest=digest, signal_id=signal_id, wait_id=wait)
    typer.echo(
        f"run {run_id}: recorded SignalReceived {name!r} for the wait at {event.wait_id!r}"
        f" (signal id {event.signal_id})"
    )
    typer.echo(f"to continue it: little resume {run_id} --workflow ...")

"""``little signal``: send a signal to a run that waits for it (a person's answer, an approval).

``little signal <run-id> <name> --data JSON [--digest D] [--signal-id ID] [--wait WAIT_ID]``
appends ``SignalReceived`` through :meth:`~little_es.world.World.signal`, which validates
the data against the wait's pydantic model (imported by its ``module:qualname``, the
current directory importable), refuses a duplicate naming the first, and an approval
whose digest is stale. ``little runs --waiting`` lists what runs wait for. The run goes
on at its next ``little resume`` (or ``run_workflow``); with ``--temporal ADDRESS``, the
run's Temporal workflow is woken through the Temporal adapter (found through the entry
point group :data:`SIGNAL_GROUP`, so the core never imports it) and goes on by itself.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable, Coroutine
from importlib.metadata import entry_points
from pathlib import Path
from typing import Annotated, Any, cast

import typer

from little_es.cli.common import RunIdArgument, WorldOption, inspection_world, load_json
from little_es.errors import SignalDataError, WorldConfigError
from little_es.events import SignalReceived
from little_es.world import World

__all__ = ["SIGNAL_GROUP", "signal_command"]

SIGNAL_GROUP = "little_es.signals"
"""Entry points named after an engine, each a ``signal(world, run_id, name, data, options,
address, namespace)`` coroutine function that records a signal and wakes the run's driver
on that engine."""

TemporalSignal = Callable[
    [World, str, str, Any, dict[str, str | None], str, str],
    Coroutine[None, None, SignalReceived],
]


def _temporal_signal() -> TemporalSignal:
    for entry_point in entry_points(group=SIGNAL_GROUP):
        if entry_point.name == "temporal":
            try:
                return cast(TemporalSignal, entry_point.load())
            except ImportError as exc:
                raise WorldConfigError(
                    f"--temporal needs the temporal extra ({exc}):"
                    " pip install 'little-es[temporal]'"
                ) from exc
    raise WorldConfigError("--temporal needs the temporal extra: pip install 'little-es[temporal]'")


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
    temporal: Annotated[
        str | None,
        typer.Option(
            "--temporal",
            help="The run is driven on Temporal at this address: wake its workflow too.",
            show_default=False,
        ),
    ] = None,
    namespace: Annotated[str, typer.Option("--namespace", help="Temporal namespace.")] = "default",
) -> None:
    """Send a signal to a waiting run; its next resume continues from the wait."""
    try:
        value: Any = load_json(data)
    except ValueError as exc:
        raise SignalDataError(f"--data is not JSON: {exc}") from exc
    options: dict[str, str | None] = {"digest": digest, "signal_id": signal_id, "wait_id": wait}
    # The wait's model is imported by its module:qualname, from here as for `little resume`.
    if str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    with inspection_world(world) as w:
        if temporal is not None:
            event = asyncio.run(
                _temporal_signal()(w, run_id, name, value, options, temporal, namespace)
            )
        else:
            event = w.signal(run_id, name, value, **options)
    typer.echo(
        f"run {run_id}: recorded SignalReceived {name!r} for the wait at {event.wait_id!r}"
        f" (signal id {event.signal_id})"
    )
    if temporal is not None:
        typer.echo("its Temporal workflow was woken: it continues from the wait")
    else:
        typer.echo(f"to continue it: little resume {run_id} --workflow ...")

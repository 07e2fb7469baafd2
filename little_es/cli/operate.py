"""``little cancel`` and ``little diff``: stop a run from outside; compare two runs.

* ``little cancel <run-id> [--reason R] [--temporal ADDRESS]`` records
  ``RunCancelled`` (:func:`~little_es.durability.cancel_run`); the process that
  drives the run stops before its next step, model call or tool call. With
  ``--temporal`` the run's Temporal workflow is cancelled too, through the
  Temporal adapter (found through the entry point group :data:`ENGINE_GROUP`,
  so the core never imports it).
* ``little diff <run-a> <run-b> [--json]`` prints :func:`~little_es.diff.diff_runs`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from importlib.metadata import entry_points
from typing import Annotated, cast

import orjson
import typer

from little_es.cli.common import RunIdArgument, WorldOption, console, inspection_world
from little_es.diff import diff_runs
from little_es.durability import cancel_run
from little_es.errors import WorldConfigError
from little_es.events import RunCancelled
from little_es.render import render_diff
from little_es.world import World

__all__ = ["ENGINE_GROUP", "cancel_command", "diff_command"]

ENGINE_GROUP = "little_es.engines"
"""Entry points named after an engine, each a ``cancel(world, run_id, reason, address,
namespace)`` coroutine function that cancels a run driven by that engine."""

TemporalCancel = Callable[
    [World, str, str | None, str, str], Coroutine[None, None, RunCancelled | None]
]


def _temporal_cancel() -> TemporalCancel:
    for entry_point in entry_points(group=ENGINE_GROUP):
        if entry_point.name == "temporal":
            try:
                return cast(TemporalCancel, entry_point.load())
            except ImportError as exc:
                raise WorldConfigError(
                    f"--temporal needs the temporal extra ({exc}):"
                    " pip install 'little-es[temporal]'"
                ) from exc
    raise WorldConfigError("--temporal needs the temporal extra: pip install 'little-es[temporal]'")


def cancel_command(
    run_id: RunIdArgument,
    world: WorldOption = None,
    reason: Annotated[str | None, typer.Option("--reason", help="Why (kept in the log).")] = None,
    temporal: Annotated[
        str | None,
        typer.Option(
            "--temporal",
            help="The run is driven on Temporal at this address: cancel its workflow too.",
            show_default=False,
        ),
    ] = None,
    namespace: Annotated[str, typer.Option("--namespace", help="Temporal namespace.")] = "default",
) -> None:
    """Cancel a run: its driver stops before its next step, model call or tool call."""
    with inspection_world(world) as w:
        if temporal is not None:
            event: RunCancelled | None = asyncio.run(
                _temporal_cancel()(w, run_id, reason, temporal, namespace)
            )
        else:
            event = cancel_run(w, run_id, reason=reason)
    if event is None:
        typer.echo(f"run {run_id}: already cancelled; nothing recorded")
        return
    how = " (and its Temporal workflow)" if temporal is not None else ""
    typer.echo(
        f"run {run_id}: recorded RunCancelled{how}; its driver stops before its next step,"
        " model call or tool call"
    )
    typer.echo(f"to continue it later: little resume {run_id} --workflow ... --force-cancelled")


def diff_command(
    run_a: Annotated[str, typer.Argument(help="The first run (A).", show_default=False)],
    run_b: Annotated[str, typer.Argument(help="The second run (B).", show_default=False)],
    world: WorldOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the diff as JSON.")] = False,
) -> None:
    """Compare two runs step by step: status, output, model calls, tokens, cost, tool calls."""
    with inspection_world(world) as w:
        diff = diff_runs(w, run_a, run_b)
    if as_json:
        typer.echo(orjson.dumps(diff.model_dump(mode="json"), option=orjson.OPT_INDENT_2).decode())
        return
    render_diff(diff, console())

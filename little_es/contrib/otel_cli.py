"""``little trace RUN_ID``: a finished run's trace, from its log, as JSON lines (extra ``otel``).

A plugin of ``little`` (the ``little_es.cli`` entry point ``otel``): without the
OpenTelemetry SDK the command is a stand-in that says to install the extra.
"""

from __future__ import annotations

from typing import Annotated

import opentelemetry.sdk.trace  # noqa: F401  (the extra: without it `little trace` is a stand-in)
import orjson
import typer

from little_es.cli.common import RunIdArgument, WorldOption, inspection_world
from little_es.contrib.otel import run_spans, span_json

__all__ = ["register", "trace_command"]


def trace_command(
    run_id: RunIdArgument,
    world: WorldOption = None,
    sub_runs: Annotated[
        bool, typer.Option("--sub-runs/--no-sub-runs", help="Include the sub-runs' spans.")
    ] = True,
) -> None:
    """Print a run's OpenTelemetry trace, one span per line as JSON (name, trace_id, span_id,
    parent_id, kind, start, end, attributes, status).

    The spans are derived from the log (GenAI semantic conventions), with the ids a live
    ``little_es.contrib.otel.instrument`` gave them.
    """
    with inspection_world(world) as w:
        spans = run_spans(w, run_id, sub_runs=sub_runs)
    for span in spans:
        typer.echo(orjson.dumps(span_json(span)).decode())


def register(app: typer.Typer) -> None:
    """Add ``little trace`` to ``app`` (the ``little_es.cli`` entry point's hook)."""
    app.command("trace")(trace_command)

"""``little export`` and ``little import``: move a world to another backend
(:mod:`little_es.transfer`).

``little export --world A > world.jsonl`` writes the stream to stdout (or ``--output``),
so stdout carries nothing else: the progress bar and the summary go to stderr.
``little import --world B < world.jsonl`` reads stdin (or ``--input``), checks the
whole stream, appends it, and prints what it appended.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import IO, Annotated

import typer
from rich.console import Console

from little_es.cli.common import WorldOption, console, inspection_world
from little_es.render import progress_bar, render_transfer
from little_es.transfer import export_world, import_world
from little_es.world import open_world

__all__ = ["export_command", "import_command"]


def export_command(
    world: WorldOption = None,
    output: Annotated[
        Path | None,
        typer.Option(
            "--output", "-o", help="Write to this file instead of stdout.", dir_okay=False
        ),
    ] = None,
) -> None:
    """Write every stream, snapshot and artifact of a world to stdout as JSONL."""
    with inspection_world(world) as w:
        if output is None:
            try:
                with progress_bar(Console(stderr=True)) as tell:
                    counts = export_world(w, sys.stdout.buffer, progress=tell)
                sys.stdout.buffer.flush()
            except OSError as exc:  # a full disk, a closed pipe
                typer.echo(f"error: cannot write to stdout: {exc.strerror or exc}", err=True)
                raise typer.Exit(1) from None
        else:
            # Written beside it and renamed when whole, so a refused or interrupted export
            # never leaves a file that looks like one.
            partial = output.with_name(output.name + ".partial")
            try:
                try:
                    with partial.open("wb") as out, progress_bar(Console(stderr=True)) as tell:
                        counts = export_world(w, out, progress=tell)
                except BaseException:
                    with contextlib.suppress(OSError):  # its directory may not be there
                        partial.unlink(missing_ok=True)
                    raise
                partial.replace(output)
            except OSError as exc:
                typer.echo(f"error: cannot write {output}: {exc.strerror or exc}", err=True)
                raise typer.Exit(1) from None
        render_transfer(
            "exported", counts, w.name, Console(stderr=True, highlight=False, soft_wrap=True)
        )


def import_command(
    world: WorldOption = None,
    input_file: Annotated[
        Path | None,
        typer.Option(
            "--input", "-i", help="Read this file instead of stdin.", exists=True, dir_okay=False
        ),
    ] = None,
) -> None:
    """Append a `little export` stream to a world (a new one, or one without its streams)."""
    with contextlib.ExitStack() as stack:
        source: IO[bytes] = (
            stack.enter_context(input_file.open("rb"))
            if input_file is not None
            else sys.stdin.buffer
        )
        w = stack.enter_context(open_world(world))
        with progress_bar(Console(stderr=True)) as tell:
            counts = import_world(w, source, progress=tell)
        render_transfer("imported", counts, w.name, console())

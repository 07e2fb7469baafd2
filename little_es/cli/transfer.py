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
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn

from little_es.cli.common import WorldOption, console, inspection_world
from little_es.render import render_transfer
from little_es.transfer import TransferProgress, export_world, import_world
from little_es.world import open_world

__all__ = ["export_command", "import_command"]


@contextlib.contextmanager
def _progress_bar() -> Iterator[TransferProgress]:
    """A rich progress bar on stderr (never stdout, which may be the export stream)."""
    err = Console(stderr=True)
    bar = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        console=err,
        transient=True,
        disable=not err.is_terminal,
    )
    tasks: dict[str, TaskID] = {}

    def tell(what: str, done: int, total: int) -> None:
        task = tasks.get(what)
        if task is None:
            task = tasks[what] = bar.add_task(what, total=total)
        bar.update(task, completed=done, total=total)

    with bar:
        yield tell


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
    with inspection_world(world) as w, contextlib.ExitStack() as stack:
        out: IO[bytes] = (
            stack.enter_context(output.open("wb")) if output is not None else sys.stdout.buffer
        )
        with _progress_bar() as tell:
            counts = export_world(w, out, progress=tell)
        out.flush()
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
        with _progress_bar() as tell:
            counts = import_world(w, source, progress=tell)
        render_transfer("imported", counts, w.name, console())

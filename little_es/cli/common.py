"""What every ``little`` command shares: the ``--world`` option, opening a world, the console.

Command modules (here and in plugins) import from this module, never from the
package :mod:`little_es.cli`, which imports them to register their commands.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import orjson
import typer
from rich.console import Console

from little_es._strict import has_long_digit_run
from little_es.errors import WorldConfigError
from little_es.world import DEFAULT_DATA_DIR, WORLD_ENV_VAR, World, open_world

__all__ = [
    "IMPORT_ENV_VAR",
    "OptionalRunIdArgument",
    "RunIdArgument",
    "WorldOption",
    "console",
    "import_modules",
    "importable_cwd",
    "inspection_world",
    "load_json",
]

IMPORT_ENV_VAR = "LITTLE_ES_IMPORT"
"""Modules ``little`` imports before any command, space-separated (as ``--import``)."""

# Wide enough for the report table when output is not a terminal (a pipe, a test
# runner), where rich would otherwise assume 80 columns and wrap the cells.
_PIPE_WIDTH = 160

WorldOption = Annotated[
    str | None,
    typer.Option(
        "--world",
        help=(
            "World URL: sqlite:///dir, postgresql://user@host/db,"
            " mysql+pymysql://user@host/db, memory://"
            f" [default: ${WORLD_ENV_VAR}, else sqlite:///{DEFAULT_DATA_DIR}]"
        ),
        show_default=False,
    ),
]
"""The ``--world`` option every command takes."""

RunIdArgument = Annotated[str, typer.Argument(help="The run id.", show_default=False)]
"""A run id argument."""

OptionalRunIdArgument = Annotated[
    str | None, typer.Argument(help="The run id.", show_default=False)
]
"""A run id argument a command can do without (it takes another option instead)."""


@contextmanager
def inspection_world(url: str | None) -> Iterator[World]:
    """Open the world ``url`` names (see :data:`WorldOption`) for reading, and close it.

    Unlike :func:`~little_es.world.open_world`, refuses a SQLite world that does
    not exist yet instead of creating an empty one, so a mistyped ``--world``
    says so rather than reporting that no run exists.
    """
    resolved = url or os.environ.get(WORLD_ENV_VAR) or f"sqlite:///{DEFAULT_DATA_DIR}"
    if resolved.startswith("sqlite:///"):
        data_dir = Path(resolved[len("sqlite:///") :])
        if data_dir.parts and not (data_dir / "events.sqlite3").is_file():
            source = (
                "--world"
                if url
                else (f"${WORLD_ENV_VAR}" if os.environ.get(WORLD_ENV_VAR) else "the default")
            )
            raise WorldConfigError(
                f"no world at {resolved} ({source}): pass --world with the URL of an existing"
                f" world, or set {WORLD_ENV_VAR}"
            )
    world = open_world(resolved)
    try:
        yield world
    finally:
        world.close()


def load_json(text: str) -> Any:
    """``text`` (an option's value) parsed as JSON, its integers exact; ``ValueError`` if
    it is not JSON.

    orjson reads an integer beyond 64 bits as a float, so another number than the one
    given would be recorded; the standard library's parser keeps it, and the recorder
    then refuses it by name (:data:`~little_es.JSON_INT_RANGE`).
    """
    value = orjson.loads(text)
    if has_long_digit_run(text.encode()):
        value = json.loads(text)
    return value


def importable_cwd() -> None:
    """Make the current directory importable, as ``python -m`` does: the ``little`` script's
    own directory is on ``sys.path`` instead."""
    if str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))


def import_modules(names: Iterable[str]) -> None:
    """Import each module (the current directory is importable), so that the event classes
    it defines are registered before a command reads a log that holds them.

    Raises :class:`typer.BadParameter` naming the module that cannot be imported.
    """
    names = [n for n in names if n]
    if names:
        importable_cwd()
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise typer.BadParameter(
                f"cannot import module {name!r}: {exc} (give a module importable from the"
                " current directory, e.g. --import flows.events)",
                param_hint="--import",
            ) from exc


def console() -> Console:
    """The console commands print tables to: 160 columns when stdout is not a terminal."""
    out = Console(highlight=False)
    if not out.is_terminal and "COLUMNS" not in os.environ:
        out = Console(highlight=False, width=_PIPE_WIDTH)
    return out

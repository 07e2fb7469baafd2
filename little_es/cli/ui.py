"""``little ui``: serve the read-only web page of a world's runs (needs the ``ui`` extra)."""

from __future__ import annotations

from typing import Annotated

import typer

from little_es.cli.common import WorldOption, inspection_world

__all__ = ["ui_command"]


def ui_command(
    world: WorldOption = None,
    port: Annotated[
        int, typer.Option("--port", help="The port to serve on.", min=0, max=65535)
    ] = 8008,
    host: Annotated[
        str, typer.Option("--host", help="The address to serve on (local only by default).")
    ] = "127.0.0.1",
) -> None:
    """Serve a local, read-only web page of the world's runs (runs list, run pages, live view)."""
    try:
        from little_es.ui import serve
    except ImportError as exc:
        typer.echo(
            f"error: little ui needs the ui extra ({exc}): pip install 'little-es[ui]'", err=True
        )
        raise typer.Exit(1) from None
    with inspection_world(world) as w:
        typer.echo(f"little ui: http://{host}:{port}/ (world {w.name}); Ctrl-C stops it")
        serve(w, host=host, port=port)

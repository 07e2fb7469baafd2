"""``little run`` and ``little resume``: drive a workflow from the command line.

Both show the steps as they commit. Ctrl-C stops the process and leaves the run
resumable: whatever was committed stays, and ``little resume`` continues it.
"""

from __future__ import annotations

import asyncio
import importlib
import sys
from pathlib import Path
from typing import Annotated, Any

import orjson
import typer
from rich.console import Console
from rich.live import Live
from rich.table import Table

from little_es.engine.local import run_workflow
from little_es.errors import LittleEsError
from little_es.events import Event, StepCompleted, StepFailed, StepStarted
from little_es.workflow.authoring import Workflow
from little_es.world import open_world

_STATUS_STYLE = {"running": "yellow", "completed": "green", "failed": "red", "retrying": "magenta"}


class WorkflowRefError(LittleEsError, ValueError):
    """A ``module:attribute`` reference does not name a Workflow."""


def load_workflow(ref: str) -> Workflow:
    """Import ``module:attribute`` (the current directory is importable) and check it."""
    module_name, sep, attribute = ref.partition(":")
    if not sep or not module_name or not attribute:
        raise WorkflowRefError(f"--workflow {ref!r}: use module:attribute, e.g. flows.triage:wf")
    if str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise WorkflowRefError(f"cannot import module {module_name!r}: {exc}") from exc
    found = getattr(module, attribute, None)
    if not isinstance(found, Workflow):
        raise WorkflowRefError(
            f"{ref!r} is {type(found).__name__ if found is not None else 'missing'}, not a Workflow"
        )
    return found


class _StepBoard:
    """A live table of step paths and their status, fed by the runtime's observer."""

    def __init__(self) -> None:
        self.rows: dict[str, tuple[str, str]] = {}

    def observe(self, event: Event) -> None:
        if isinstance(event, StepStarted):
            self.rows[event.step_path] = ("running", f"attempt {event.attempt}")
        elif isinstance(event, StepCompleted):
            self.rows[event.step_path] = ("completed", "")
        elif isinstance(event, StepFailed):
            status = "retrying" if event.will_retry else "failed"
            self.rows[event.step_path] = (status, event.error.message[:60])

    def render(self) -> Table:
        table = Table(show_header=True, header_style="bold")
        table.add_column("step")
        table.add_column("status")
        table.add_column("")
        for path, (status, note) in self.rows.items():
            table.add_row(path, f"[{_STATUS_STYLE[status]}]{status}[/]", note)
        return table


def _drive(world_url: str | None, workflow: Workflow, input: Any, run_id: str | None) -> None:
    console = Console()
    board = _StepBoard()
    world = open_world(world_url)
    try:
        with Live(board.render(), console=console, refresh_per_second=8) as live:

            def observe(event: Event) -> None:
                board.observe(event)
                live.update(board.render())

            result = asyncio.run(
                run_workflow(world, workflow, input, run_id=run_id, observer=observe)
            )
    except KeyboardInterrupt:
        console.print(
            f"[yellow]interrupted[/]: the run is resumable with"
            f" `little resume <run-id> --workflow ...` (world {world.name})"
        )
        raise typer.Exit(130) from None
    finally:
        world.close()
    console.print(f"run [cyan]{result.run_id}[/] {result.state.status}")
    console.print_json(orjson.dumps(result.output).decode())


def register(app: typer.Typer) -> None:
    """Add ``run`` and ``resume`` to the ``little`` app."""

    @app.command("run")
    def run_command(
        workflow: Annotated[str, typer.Argument(help="module:attribute of a Workflow")],
        input: Annotated[str, typer.Option("--input", help="the run input, a JSON object")] = "{}",
        run_id: Annotated[str | None, typer.Option("--run-id", help="run id to use")] = None,
        world: Annotated[str | None, typer.Option("--world", help="world URL")] = None,
    ) -> None:
        """Start a run of a workflow (or resume it, if the run id exists)."""
        try:
            data = orjson.loads(input)
        except orjson.JSONDecodeError as exc:
            raise WorkflowRefError(f"--input is not JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise WorkflowRefError("--input must be a JSON object, e.g. '{\"ticket\": 42}'")
        _drive(world, load_workflow(workflow), data, run_id)

    @app.command("resume")
    def resume_command(
        run_id: Annotated[str, typer.Argument(help="the run to resume")],
        workflow: Annotated[
            str, typer.Option("--workflow", help="module:attribute of the run's Workflow")
        ],
        world: Annotated[str | None, typer.Option("--world", help="world URL")] = None,
    ) -> None:
        """Resume a run where its log stops."""
        _drive(world, load_workflow(workflow), None, run_id)

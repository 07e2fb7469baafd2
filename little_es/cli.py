"""The ``little`` command: inspect the runs of a world.

Commands here are read-only views of the log:

* ``little report <run-id>`` - per-step tokens and cost (:func:`render_report`);
* ``little replay <run-id> [--json]`` - what :func:`~little_es.replay.replay_run` returns;
* ``little events <run-id> [--jsonl]`` - the run's event log, in order, by wire name;
* ``little runs`` - every run, from the runs read model.

Every command takes ``--world URL`` (``sqlite:///dir``, ``postgresql://...``,
``memory://``); the default is ``$LITTLE_ES_WORLD``, else
``sqlite:///.little-workflow``. A little_es error ends the command with exit
code 1 and one line on stderr, never a traceback.

Adding commands: write a module with ``register(app: typer.Typer) -> None``
that declares its commands on ``app`` (reuse :data:`WorldOption`,
:func:`inspection_world` and :func:`render_report` as needed) and add the
module's name to :data:`COMMAND_MODULES`. Errors raised by any command,
including those, get the same one-line treatment.
"""

from __future__ import annotations

import base64
import importlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import orjson
import typer
from eventsourcing.persistence import PersistenceError
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from typer.core import TyperGroup

from little_es.errors import LittleEsError, WorldConfigError
from little_es.events import Event
from little_es.materialize import MaterializedRunState
from little_es.projections import RunSummary, list_runs
from little_es.replay import ReplayResult, read_run_state, replay_run
from little_es.values import UsageTotals
from little_es.world import DEFAULT_DATA_DIR, WORLD_ENV_VAR, World, open_world

__all__ = [
    "COMMAND_MODULES",
    "RunIdArgument",
    "WorldOption",
    "app",
    "cost_text",
    "inspection_world",
    "render_report",
]

COMMAND_MODULES: tuple[str, ...] = ("little_es.cli_run", "little_es.cli_temporal")
"""Modules whose ``register(app)`` adds their commands to ``little``."""

_ORIGINATOR_FIELDS = {"originator_id", "originator_version", "timestamp"}
_STATUS_STYLE = {
    "completed": "green",
    "running": "yellow",
    "pending": "cyan",
    "failed": "red",
}
# Wide enough for the report table when output is not a terminal (a pipe, a test
# runner), where rich would otherwise assume 80 columns and wrap the cells.
_PIPE_WIDTH = 160


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


class _LittleGroup(TyperGroup):
    """Turns little_es (and storage) errors of any command into one line and exit code 1."""

    # ``Any``: typer vendors click privately, so its Context class has no public name.
    def invoke(self, ctx: Any) -> Any:
        """Run the command; report a little_es error in one line, exit code 1."""
        try:
            return super().invoke(ctx)
        except (LittleEsError, PersistenceError) as exc:
            typer.echo(f"error: {_one_line(exc)}", err=True)
            raise typer.Exit(1) from None


app = typer.Typer(
    name="little",
    cls=_LittleGroup,
    help="Inspect (and run) durable little_es workflows.",
    no_args_is_help=True,
    add_completion=False,
    # A bug's traceback must not print local variables: they may hold a DSN's password.
    pretty_exceptions_show_locals=False,
)

WorldOption = Annotated[
    str | None,
    typer.Option(
        "--world",
        help=(
            "World URL: sqlite:///dir, postgresql://user@host/db, memory://"
            f" [default: ${WORLD_ENV_VAR}, else sqlite:///{DEFAULT_DATA_DIR}]"
        ),
        show_default=False,
    ),
]
"""The ``--world`` option every command takes."""

RunIdArgument = Annotated[str, typer.Argument(help="The run id.", show_default=False)]
"""A run id argument."""


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


def _console() -> Console:
    console = Console(highlight=False)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = Console(highlight=False, width=_PIPE_WIDTH)
    return console


def _calls(n: int) -> str:
    return f"{n} unpriced call{'' if n == 1 else 's'}"


def cost_text(usage: UsageTotals) -> str:
    """A scope's cost for display: ``-`` when every call was unpriced, else dollars.

    When only some calls were priced, the dollars cover those and the
    shortfall is shown: ``$0.004500 (+1 unpriced)``.
    """
    if usage.cost_usd is None:
        return "-"
    text = f"${usage.cost_usd:,.6f}"
    return f"{text} (+{usage.unpriced_calls} unpriced)" if usage.unpriced_calls else text


def _status(status: str) -> str:
    return f"[{_STATUS_STYLE.get(status, 'white')}]{status}[/]"


def render_report(world: World, run_id: str, console: Console) -> MaterializedRunState:
    """Print the per-step token and cost table of ``run_id`` to ``console``; return the state.

    One row per step path (status, visit, input/output/cached/reasoning
    tokens, cost or ``-`` when unpriced) and a totals row that names the
    unpriced calls, if any. Folds the log with the one reducer, like replay.
    """
    state = read_run_state(world, run_id)
    table = Table(
        title=(
            f"run [bold]{escape(run_id)}[/] · {escape(state.workflow_id or '?')}"
            f" v{escape(state.workflow_version or '?')} · {_status(state.status)}"
        ),
        box=box.SIMPLE_HEAD,
        show_footer=False,
    )
    table.add_column("step", no_wrap=True, min_width=max((len(p) for p in state.steps), default=4))
    table.add_column("status", no_wrap=True)
    table.add_column("visit", justify="right", no_wrap=True)
    for name in ("input", "output", "cached", "reasoning"):
        table.add_column(name, justify="right", no_wrap=True)
    table.add_column("cost (USD)", justify="right", no_wrap=True)
    for path, step in state.steps.items():
        u = step.usage
        table.add_row(
            escape(path),
            _status(step.status),
            str(step.visit),
            f"{u.input_tokens:,}",
            f"{u.output_tokens:,}",
            f"{u.cached_input_tokens:,}",
            f"{u.reasoning_tokens:,}",
            cost_text(u),
        )
    total = state.usage
    table.add_section()
    table.add_row(
        "[bold]total[/]",
        _calls(total.unpriced_calls) if total.unpriced_calls else "",
        "",
        f"{total.input_tokens:,}",
        f"{total.output_tokens:,}",
        f"{total.cached_input_tokens:,}",
        f"{total.reasoning_tokens:,}",
        cost_text(total),
        style="bold",
    )
    console.print(table)
    return state


@app.command("report")
def report_command(
    run_id: RunIdArgument,
    world: WorldOption = None,
    tree: Annotated[
        bool, typer.Option("--tree", help="Also show the whole tree of sub-runs with totals.")
    ] = False,
) -> None:
    """Per-step tokens and cost of a run (priced from the log, never from a recorded cost)."""
    from little_es.orchestrator import render_sub_runs, render_tree

    console = _console()
    with inspection_world(world) as w:
        render_report(w, run_id, console)
        if tree:
            render_tree(w, run_id, console)
        else:
            render_sub_runs(w, run_id, console)


def replay_json(result: ReplayResult) -> dict[str, Any]:
    """``result`` as plain JSON data; artifact payloads are base64."""
    data = result.model_dump(mode="json", exclude={"artifacts"})
    data["artifacts"] = [
        {
            "manifest": a.manifest.model_dump(mode="json"),
            "payload_base64": base64.b64encode(a.payload).decode("ascii"),
        }
        for a in result.artifacts
    ]
    return data


def _short_json(value: Any, limit: int = 60) -> str:
    text = orjson.dumps(value).decode()
    return text if len(text) <= limit else text[: limit - 1] + "…"


@app.command("replay")
def replay_command(
    run_id: RunIdArgument,
    world: WorldOption = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the whole ReplayResult as JSON.")
    ] = False,
) -> None:
    """Fold a run's log: its state, which steps would run on resume, its artifacts."""
    with inspection_world(world) as w:
        result = replay_run(w, run_id)
    if as_json:
        typer.echo(orjson.dumps(replay_json(result), option=orjson.OPT_INDENT_2).decode())
        return
    console = _console()
    state = result.state
    console.print(
        f"run [bold]{escape(result.run_id)}[/] · {escape(state.workflow_id or '?')}"
        f" v{escape(state.workflow_version or '?')} · {_status(state.status)}"
        f" · {state.event_count} events"
    )
    table = Table(box=box.SIMPLE_HEAD)
    table.add_column("step", no_wrap=True, min_width=max((len(p) for p in state.steps), default=4))
    table.add_column("status", no_wrap=True)
    table.add_column("runs on resume", no_wrap=True)
    table.add_column("output", overflow="fold")
    for step in result.steps:
        if step.output_ref is not None:
            output = (
                f"artifact {step.output_ref.artifact_id[:19]}… ({step.output_ref.size:,} bytes)"
            )
        else:
            output = _short_json(step.output)
        table.add_row(
            escape(step.step_path),
            _status(step.status),
            "yes" if step.should_run else "no",
            escape(output),
        )
    console.print(table)
    console.print(f"completed: {escape(', '.join(result.completed_step_paths) or '(none)')}")
    console.print(f"pending:   {escape(', '.join(result.pending_step_paths) or '(none)')}")
    if result.artifacts:
        console.print(f"artifacts: {len(result.artifacts)} (verified)")
        for a in result.artifacts:
            m = a.manifest
            console.print(
                f"  {m.artifact_id}  {m.size:,} bytes  {escape(m.media_type)}"
                f"  {escape(m.step_path)}"
            )


def event_json(event: Event) -> dict[str, Any]:
    """One line of ``little events --jsonl``: wire name, stream id, version, timestamp, payload."""
    payload = event.model_dump(mode="json")
    timestamp = payload["timestamp"]
    for name in _ORIGINATOR_FIELDS:
        payload.pop(name, None)
    return {
        "wire_name": type(event).wire_name,
        "stream_id": str(event.originator_id),
        "version": event.originator_version,
        "timestamp": timestamp,
        "payload": payload,
    }


@app.command("events")
def events_command(
    run_id: RunIdArgument,
    world: WorldOption = None,
    jsonl: Annotated[
        bool, typer.Option("--jsonl", help="One JSON object per line, with the payload.")
    ] = False,
) -> None:
    """A run's event log (its run stream and harness sessions), in order, by wire name."""
    with inspection_world(world) as w:
        events = w.read_run_log(run_id)
    if jsonl:
        typer.echo(b"\n".join(orjson.dumps(event_json(e)) for e in events).decode())
        return
    table = Table(box=box.SIMPLE_HEAD)
    table.add_column("#", justify="right", no_wrap=True)
    table.add_column("event", no_wrap=True)
    table.add_column("stream", no_wrap=True)
    table.add_column("version", justify="right", no_wrap=True)
    table.add_column("timestamp", no_wrap=True)
    for i, e in enumerate(events, start=1):
        table.add_row(
            str(i),
            type(e).wire_name,
            str(e.originator_id)[:8],
            str(e.originator_version),
            e.timestamp.isoformat(timespec="milliseconds"),
        )
    _console().print(table)


@app.command("runs")
def runs_command(world: WorldOption = None) -> None:
    """Every run in the world, oldest first, from the runs read model."""
    with inspection_world(world) as w:
        runs = list_runs(w)
        name = w.name
    console = _console()
    if not runs:
        console.print(f"no runs in world {escape(name)}")
        return
    table = Table(title=f"runs in {escape(name)}", box=box.SIMPLE_HEAD)
    table.add_column("run", overflow="fold")
    table.add_column("workflow", overflow="fold")
    table.add_column("status", no_wrap=True)
    table.add_column("steps", justify="right", no_wrap=True)
    table.add_column("started", no_wrap=True)
    table.add_column("updated", no_wrap=True)
    table.add_column("tokens in/out", justify="right", no_wrap=True)
    table.add_column("cost (USD)", justify="right", no_wrap=True)
    for run in runs:
        table.add_row(*_run_row(run))
    console.print(table)


def _run_row(run: RunSummary) -> tuple[str, ...]:
    def when(t: Any) -> str:
        return "" if t is None else t.strftime("%Y-%m-%d %H:%M:%S")

    u = run.usage
    return (
        escape(run.run_id)
        + (f" [dim](sub-run of {escape(run.parent_run_id)})[/]" if run.parent_run_id else ""),
        escape(f"{run.workflow_id or '?'} v{run.workflow_version or '?'}"),
        _status(run.status),
        f"{run.steps_completed}/{run.steps}",
        when(run.started_at),
        when(run.updated_at),
        f"{u.input_tokens:,}/{u.output_tokens:,}",
        cost_text(u),
    )


for _module in COMMAND_MODULES:
    importlib.import_module(_module).register(app)


if __name__ == "__main__":
    app()

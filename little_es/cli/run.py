"""``little run`` and ``little resume``: drive a workflow from the command line.

Both show the steps as they commit (:class:`~little_es.render.StepBoard`).
Ctrl-C stops the process and leaves the run resumable: whatever was committed
stays, and ``little resume`` continues it.
"""

from __future__ import annotations

import asyncio
import importlib
from typing import Annotated, Any

import orjson
import typer
from pydantic import ValidationError
from rich.console import Console
from rich.live import Live

from little_es._threads import set_max_worker_threads
from little_es.cli.common import WorldOption, importable_cwd, load_json
from little_es.engine.local import run_workflow
from little_es.errors import RunNotFoundError, RunStoppedError, RunWaitingError, WorkflowRefError
from little_es.events import Event
from little_es.render import StepBoard, escape, signal_command_text
from little_es.values import MAX_BUDGET_COUNT, Budget
from little_es.workflow.authoring import Workflow
from little_es.world import open_world

__all__ = ["WAITING_EXIT_CODE", "load_workflow", "resume_command", "run_command"]

WAITING_EXIT_CODE = 3
"""The exit code of ``little run`` / ``little resume`` when the run stopped to wait for a
signal: not a failure (0 would read as finished)."""


def load_workflow(ref: str) -> Workflow:
    """Import ``module:attribute`` (the current directory is importable) and check it."""
    module_name, sep, attribute = ref.partition(":")
    if not sep or not module_name or not attribute:
        raise WorkflowRefError(f"--workflow {ref!r}: use module:attribute, e.g. flows.triage:wf")
    importable_cwd()
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


BudgetUsd = Annotated[
    str | None,
    typer.Option("--budget-usd", help="Stop before a model call once the run spent this many USD."),
]
BudgetTokens = Annotated[
    int | None,
    typer.Option("--budget-tokens", min=0, help="... once it used this many tokens (in + out)."),
]
BudgetCalls = Annotated[
    int | None,
    typer.Option("--budget-calls", min=0, help="... once it made this many model calls."),
]
MaxWorkerThreads = Annotated[
    int | None,
    typer.Option(
        "--max-worker-threads",
        min=1,
        help="sync step functions and tools run at once (default: min(32, CPUs + 4))",
    ),
]


def _budget(usd: str | None, tokens: int | None, calls: int | None) -> Budget | None:
    if usd is None and tokens is None and calls is None:
        return None
    try:
        return Budget(usd=usd, tokens=tokens, model_calls=calls)
    except ValidationError as exc:
        options = {
            "usd": "--budget-usd",
            "tokens": "--budget-tokens",
            "model_calls": "--budget-calls",
        }
        given = {"usd": usd, "tokens": tokens, "model_calls": calls}
        problems = "; ".join(
            f"{options[str(e['loc'][0])]} {given[str(e['loc'][0])]!r}: {e['msg']}"
            for e in exc.errors(include_url=False)
        )
        raise WorkflowRefError(
            f"{problems} (--budget-usd takes a number of dollars >= 0, --budget-tokens and"
            f" --budget-calls a whole number from 0 to {MAX_BUDGET_COUNT})"
        ) from None


def _drive(
    world_url: str | None,
    workflow: Workflow,
    input: Any,
    run_id: str | None,
    *,
    budget: Budget | None = None,
    resume_cancelled: bool = False,
    must_exist: bool = False,
    max_worker_threads: int | None = None,
) -> None:
    if max_worker_threads is not None:
        set_max_worker_threads(max_worker_threads)
    console = Console()
    board = StepBoard()
    world = open_world(world_url)
    try:
        # `resume` of a mistyped id must not start a new run under it.
        if run_id is not None and world.run_exists(run_id):
            board.recorded(world.read_run_log(run_id))
        elif must_exist and run_id is not None:
            raise RunNotFoundError(run_id, world.name)
        live = Live(board.render(), console=console, refresh_per_second=8)
        try:
            with live:

                def observe(event: Event) -> None:
                    board.observe(event)
                    live.update(board.render())

                result = asyncio.run(
                    run_workflow(
                        world,
                        workflow,
                        input,
                        run_id=run_id,
                        observer=observe,
                        budget=budget,
                        resume_cancelled=resume_cancelled,
                    )
                )
        finally:
            if not console.is_terminal:
                # rich's Live ends its last frame without a newline when not on a terminal.
                console.line()
    except RunWaitingError as exc:
        # Waits for a signal: the process exits cleanly, the run goes on after the signal.
        console.print(f"[yellow]waiting[/]: {escape(str(exc))}")
        for owner in dict.fromkeys(exc.wait_run_ids or (exc.run_id,)):
            fold = world.load_run(owner).fold
            for wait in fold.waits.values():
                if wait.status == "waiting":
                    command = signal_command_text(owner, wait)
                    console.print(f"  {escape(command)}", soft_wrap=True)
        raise typer.Exit(WAITING_EXIT_CODE) from None
    except RunStoppedError as exc:
        # Stopped on purpose (cancelled, out of budget): resumable, not a failure.
        console.print(f"[yellow]stopped[/]: {escape(str(exc))}")
        raise typer.Exit(1) from None
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


def run_command(
    workflow: Annotated[str, typer.Argument(help="module:attribute of a Workflow")],
    input: Annotated[str, typer.Option("--input", help="the run input, a JSON object")] = "{}",
    run_id: Annotated[str | None, typer.Option("--run-id", help="run id to use")] = None,
    world: WorldOption = None,
    budget_usd: BudgetUsd = None,
    budget_tokens: BudgetTokens = None,
    budget_calls: BudgetCalls = None,
    max_worker_threads: MaxWorkerThreads = None,
) -> None:
    """Start a run of a workflow (or resume it, if the run id exists)."""
    try:
        data = load_json(input)
    except ValueError as exc:
        raise WorkflowRefError(f"--input is not JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise WorkflowRefError("--input must be a JSON object, e.g. '{\"ticket\": 42}'")
    budget = _budget(budget_usd, budget_tokens, budget_calls)
    _drive(
        world,
        load_workflow(workflow),
        data,
        run_id,
        budget=budget,
        max_worker_threads=max_worker_threads,
    )


def resume_command(
    run_id: Annotated[str, typer.Argument(help="the run to resume")],
    workflow: Annotated[
        str, typer.Option("--workflow", help="module:attribute of the run's Workflow")
    ],
    world: WorldOption = None,
    force_cancelled: Annotated[
        bool, typer.Option("--force-cancelled", help="Resume a run that was cancelled.")
    ] = False,
    budget_usd: BudgetUsd = None,
    budget_tokens: BudgetTokens = None,
    budget_calls: BudgetCalls = None,
    max_worker_threads: MaxWorkerThreads = None,
) -> None:
    """Resume a run where its log stops (with --budget-*: a new budget for it)."""
    budget = _budget(budget_usd, budget_tokens, budget_calls)
    _drive(
        world,
        load_workflow(workflow),
        None,
        run_id,
        budget=budget,
        resume_cancelled=force_cancelled,
        must_exist=True,
        max_worker_threads=max_worker_threads,
    )

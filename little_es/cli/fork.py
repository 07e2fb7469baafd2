"""``little fork``: start a new run from a point of another run's history.

``little fork RUN_ID --at STEP_PATH [--new-run-id ID] [--input JSON]`` writes
the fork (:func:`~little_es.fork.fork_run`) and says how to run it: ``little
resume FORK --workflow module:workflow`` re-uses every committed step, model
call and tool call before the fork point and runs from there.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from little_es.cli.common import RunIdArgument, WorldOption, inspection_world, load_json
from little_es.errors import ForkError
from little_es.fork import fork_run
from little_es.render import fork_text
from little_es.replay import replay_run

__all__ = ["fork_command"]


def _input(text: str | None) -> dict[str, Any] | None:
    if text is None:
        return None
    try:
        value = load_json(text)
    except ValueError as exc:
        raise ForkError(
            f"--input is not JSON ({exc}): pass an object such as '{{\"a\": 1}}'"
        ) from exc
    if not isinstance(value, dict):
        raise ForkError(f"--input must be a JSON object (the run input), got {text!r}")
    return value


def fork_command(
    run_id: RunIdArgument,
    at: Annotated[
        str,
        typer.Option(
            "--at",
            help="The fork point: a step the run completed (review, review@2), or a turn of"
            " an agent step (plan#turn=3); it and what follows run again.",
            show_default=False,
        ),
    ],
    world: WorldOption = None,
    new_run_id: Annotated[
        str | None,
        typer.Option(
            "--new-run-id", help="The fork's run id (default: generated).", show_default=False
        ),
    ] = None,
    input: Annotated[
        str | None,
        typer.Option(
            "--input",
            help="A new run input (JSON object) for the steps that run again.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Fork a run at a step (or a turn of an agent step): a new run that re-uses its history."""
    given = _input(input)
    with inspection_world(world) as w:
        forked = fork_run(w, run_id, at=at, new_run_id=new_run_id, input=given)
        state = replay_run(w, forked.run_id).state
    typer.echo(f"run {forked.run_id}: {fork_text(state)}")
    typer.echo(
        f"run it: little resume {forked.run_id} --workflow module:workflow (or"
        f" run_workflow(world, workflow, run_id={forked.run_id!r}))"
    )

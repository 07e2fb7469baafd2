"""One process of a torture run: run (or resume) the run ``--run-id`` of the torture workflow.

``python -m tests.torture.child --world URL --run-id ID --ledger PATH --segment K``

On success it prints one JSON line (``status``, ``resumed``, ``steps_executed``). The
driver kills it with SIGKILL (a timer, or ``LITTLE_ES_CRASH_AFTER_APPENDS`` in its
environment) and starts it again with the next segment number.

``TORTURE_BUG=rerun-completed`` is the deliberate bug the checker must catch: on resume,
the body of the step ``prepare`` runs again although its ``StepCompleted`` is in the log,
as an engine that ignored the recorded result would do.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

import orjson

from little_es import StepContext, configure_logging, open_world, replay_run, run_workflow
from tests.torture.ledger import Ledger, step_item
from tests.torture.workflow import BUGGY_STEP, RUN_INPUT, build_workflows

BUG_ENV = "TORTURE_BUG"
RERUN_COMPLETED = "rerun-completed"


def _rerun_completed_step(world_url: str, run_id: str, ledger: Ledger) -> None:
    with open_world(world_url) as world:
        if not world.run_exists(run_id):
            return
        replay = replay_run(world, run_id)
    if BUGGY_STEP not in replay.completed_step_paths:
        return
    ctx = StepContext(run_id=run_id, input=dict(RUN_INPUT), outputs={}, step_path=BUGGY_STEP)
    # What the step body does, named as the step: the ledger cannot tell it from the real one.
    ledger.append(step_item(ctx.run_id, ctx.step_path, ctx.attempt))


async def _main(world_url: str, run_id: str, ledger: Ledger) -> None:
    if os.environ.get(BUG_ENV) == RERUN_COMPLETED:
        _rerun_completed_step(world_url, run_id, ledger)
    workflow, _, _ = build_workflows(ledger, run_id)
    with open_world(world_url) as world:
        result = await run_workflow(world, workflow, dict(RUN_INPUT), run_id=run_id)
    line = {
        "status": result.state.status,
        "resumed": result.resumed,
        "steps_executed": result.steps_executed,
    }
    sys.stdout.write(orjson.dumps(line).decode() + "\n")


def main(argv: list[str] | None = None) -> None:
    """Parse the arguments and run the run once."""
    parser = argparse.ArgumentParser(prog="python -m tests.torture.child")
    parser.add_argument("--world", required=True)
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--ledger", required=True, type=Path)
    parser.add_argument("--segment", required=True, type=int)
    args = parser.parse_args(argv)
    configure_logging(json=True, level="WARNING")
    asyncio.run(_main(args.world, args.run_id, Ledger(args.ledger, args.segment)))


if __name__ == "__main__":
    main()

"""One process of a torture run: run (or resume) the run ``--run-id`` of the torture workflow.

``python -m tests.torture.child --world URL --run-id ID --ledger PATH --segment K [--loop]``

On success it prints one JSON line (``status``, ``resumed``, ``steps_executed``). A run
that stopped at its ``approve`` wait prints ``{"status": "waiting"}`` and exits
:data:`WAITING_EXIT_CODE`. With ``--loop`` it runs (or resumes) the outer loop ``ID``
of :func:`tests.torture.workflow.build_loop` instead and prints its end reason. The
driver kills it with SIGKILL (a timer, or ``LITTLE_ES_CRASH_AFTER_APPENDS`` in its
environment) and starts it again with the next segment number.

``TORTURE_BUG`` is a deliberate bug the checker must catch:

* ``rerun-completed``: on resume, the body of the step ``prepare`` runs again although
  its ``StepCompleted`` is in the log, as an engine that ignored the recorded result
  would do;
* ``loop-rerun-cycle``: on resume of a loop, the first step of cycle 1's run executes
  again although that run completed, as a loop that ignored its committed cycle would.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import orjson

from little_es import (
    ConcurrentRunError,
    RunWaitingError,
    StepContext,
    configure_logging,
    open_world,
    replay_run,
    run_outer_loop,
    run_workflow,
)
from little_es.outer_loop import cycle_run_id
from tests.torture.ledger import Ledger, step_item
from tests.torture.workflow import BUGGY_STEP, LOOP_CYCLES, RUN_INPUT, build_loop, build_workflows

BUG_ENV = "TORTURE_BUG"
RERUN_COMPLETED = "rerun-completed"
LOOP_RERUN_CYCLE = "loop-rerun-cycle"
WAITING_EXIT_CODE = 3
T = TypeVar("T")

LEASE_WAIT_S = 15.0
"""How long a loop resume tries again while PostgreSQL still holds a killed process's lease."""


async def while_leased_elsewhere(attempt: Callable[[], Awaitable[T]]) -> T:
    """``attempt()``, tried again for up to :data:`LEASE_WAIT_S` while another process holds
    the run's lease: a PostgreSQL lease (an advisory lock) is freed when the server sees the
    killed holder's connection close, a moment after the kill."""
    deadline = time.monotonic() + LEASE_WAIT_S
    while True:
        try:
            return await attempt()
        except ConcurrentRunError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.05)


def _rerun_completed_step(world_url: str, run_id: str, step: str, ledger: Ledger) -> None:
    with open_world(world_url) as world:
        if not world.run_exists(run_id):
            return
        replay = replay_run(world, run_id)
    if step not in replay.completed_step_paths:
        return
    ctx = StepContext(run_id=run_id, input=dict(RUN_INPUT), outputs={}, step_path=step)
    # What the step body does, named as the step: the ledger cannot tell it from the real one.
    ledger.append(step_item(ctx.run_id, ctx.step_path, ctx.attempt))


async def _main(world_url: str, run_id: str, ledger: Ledger) -> int:
    if os.environ.get(BUG_ENV) == RERUN_COMPLETED:
        _rerun_completed_step(world_url, run_id, BUGGY_STEP, ledger)
    workflow, _, _ = build_workflows(ledger, run_id)
    with open_world(world_url) as world:
        try:
            result = await run_workflow(world, workflow, dict(RUN_INPUT), run_id=run_id)
        except RunWaitingError:
            sys.stdout.write('{"status": "waiting"}\n')
            return WAITING_EXIT_CODE
    line = {
        "status": result.state.status,
        "resumed": result.resumed,
        "steps_executed": result.steps_executed,
    }
    sys.stdout.write(orjson.dumps(line).decode() + "\n")
    return 0


async def _loop(world_url: str, loop_id: str, ledger: Ledger) -> int:
    if os.environ.get(BUG_ENV) == LOOP_RERUN_CYCLE:
        _rerun_completed_step(world_url, cycle_run_id(loop_id, 1), "fetch", ledger)
    planner, workflow = build_loop(ledger, loop_id)
    with open_world(world_url) as world:
        result = await while_leased_elsewhere(
            lambda: run_outer_loop(
                world,
                planner=planner,
                workflow=workflow,
                outer_loop_id=loop_id,
                max_cycles=LOOP_CYCLES + 1,
                input={"goal": "torture"},
            )
        )
    sys.stdout.write(orjson.dumps({"reason": result.reason}).decode() + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments and run the run (or the loop) once; the process's exit code."""
    parser = argparse.ArgumentParser(prog="python -m tests.torture.child")
    parser.add_argument("--world", required=True)
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--ledger", required=True, type=Path)
    parser.add_argument("--segment", required=True, type=int)
    parser.add_argument("--loop", action="store_true", help="drive the outer loop RUN_ID")
    args = parser.parse_args(argv)
    configure_logging(json=True, level="WARNING")
    ledger = Ledger(args.ledger, args.segment)
    run = _loop if args.loop else _main
    return asyncio.run(run(args.world, args.run_id, ledger))


if __name__ == "__main__":
    sys.exit(main())

"""The child of the one-commit-per-step tests: runs (or resumes) a run of sequential task steps.

    python tests/_one_commit_proc.py WORLD_DIR LEDGER STEPS

Every step function first appends one line ``step_path attempt`` to the ledger (one
``O_APPEND`` write: it is in the file before the process can be killed), so the ledger
counts real executions. The tests set ``LITTLE_ES_CRASH_*`` (:mod:`little_es.faults`)
in its environment to have it SIGKILLed at a chosen append.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from little_es import StepContext, Workflow, local_world, run_workflow, task

RUN_ID = "run_one_commit"


def workflow(ledger: Path, steps: int) -> Workflow:
    """``steps`` task steps ``s0``..., each recording its execution, returning its index."""

    def make(index: int) -> object:
        def step(ctx: StepContext) -> int:
            line = f"{ctx.step_path} {ctx.attempt}\n".encode()
            fd = os.open(ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, line)
            finally:
                os.close(fd)
            return index

        return step

    return Workflow(
        "one-commit",
        steps=[task(f"s{i}", make(i), run_in_thread=False) for i in range(steps)],  # type: ignore[arg-type]
    )


def main() -> None:
    world_dir, ledger, steps = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
    with local_world(world_dir) as world:
        result = asyncio.run(run_workflow(world, workflow(ledger, steps), {}, run_id=RUN_ID))
    print(f"RESULT {result.output} {result.steps_executed}")


if __name__ == "__main__":
    main()

"""The child process of the step-aggregate kill tests: drive (or resume) one ticket-triage run.

    python tests/_aggregates_proc.py WORLD_URL RUN_ID TICKET_ID

Set ``LITTLE_ES_CRASH_BEFORE_EVENT`` or ``LITTLE_ES_CRASH_AFTER_EVENT`` in its environment
to have it SIGKILLed around a step's commit (:mod:`little_es.faults`). Prints
``RESULT <steps executed>`` when the run completes.
"""

from __future__ import annotations

import asyncio
import sys

from little_es import open_world, run_workflow
from tests._tickets import triage_workflow


def main() -> None:
    url, run_id, ticket_id = sys.argv[1:4]
    with open_world(url) as world:
        result = asyncio.run(
            run_workflow(world, triage_workflow(), {"ticket_id": ticket_id}, run_id=run_id)
        )
    print(f"RESULT {result.steps_executed}")


if __name__ == "__main__":
    main()

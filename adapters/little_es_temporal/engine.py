"""Whole runs on Temporal for callers that drive runs: :class:`TemporalEngine`.

``run_outer_loop(world, ..., engine=TemporalEngine(client, task_queue=...))``
runs each cycle's planner run and cycle run as a Temporal workflow whose id is
the run id, executed by the workers on ``task_queue``; the loop's aggregate and
manifest view are written by the caller, as with the local engine. A caller
resumed while a cycle's workflow is still running on Temporal (it crashed, the
workflow did not) waits for that workflow instead of starting another.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from temporalio.client import Client, WorkflowFailureError
from temporalio.common import WorkflowIDConflictPolicy

from little_es.durability import RunRecorder, read_output
from little_es.engine.engines import RunEngine
from little_es.errors import RunFailedError
from little_es.workflow.authoring import Workflow
from little_es.world import World
from little_es_temporal.errors import TemporalAdapterError
from little_es_temporal.models import StepTimeouts
from little_es_temporal.worker import DEFAULT_TASK_QUEUE, start_run

__all__ = ["TemporalEngine"]


class TemporalEngine(RunEngine):
    """Each run a Temporal workflow (id = run id) on ``task_queue``, through ``client``.

    The workers serving ``task_queue`` must have the runs' workflows (an outer
    loop's: its workflow and its planner's, ``planner.workflow``) and the
    caller's world.
    """

    name = "temporal"

    def __init__(
        self,
        client: Client,
        *,
        task_queue: str = DEFAULT_TASK_QUEUE,
        timeouts: StepTimeouts | None = None,
    ) -> None:
        if not isinstance(client, Client):
            raise TemporalAdapterError(
                f"client must be a temporalio Client (little_es_temporal.connect(address)), got"
                f" {type(client).__name__}"
            )
        if not isinstance(task_queue, str) or not task_queue:
            raise TemporalAdapterError(f"task_queue must be a non-empty string, got {task_queue!r}")
        if timeouts is not None and not isinstance(timeouts, StepTimeouts):
            raise TemporalAdapterError(
                f"timeouts must be a StepTimeouts, got {type(timeouts).__name__}"
            )
        self.client = client
        self.task_queue = task_queue
        self.timeouts = timeouts

    async def run(
        self, world: World, workflow: Workflow, input: Mapping[str, Any] | None, *, run_id: str
    ) -> Any:
        """Start (or join, when it is running) the run's workflow, wait for it, and return the
        output its log records."""
        handle = await start_run(
            self.client,
            workflow,
            input,
            run_id=run_id,
            task_queue=self.task_queue,
            timeouts=self.timeouts,
            world=world,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        )
        try:
            await handle.result()
        except WorkflowFailureError as exc:
            fold = _fold(world, run_id)
            if fold is not None and fold.status == "failed" and fold.error is not None:
                raise RunFailedError(run_id, fold.failed_step_path, fold.error) from exc
            raise TemporalAdapterError(
                f"run {run_id!r} stopped on Temporal without failing in its log"
                f" ({fold.status if fold is not None else 'not started'}): {exc.cause}; see the"
                " workflow in Temporal, fix the cause and resume"
            ) from exc
        fold = _fold(world, run_id)
        if fold is None or fold.status != "completed":
            raise TemporalAdapterError(
                f"run {run_id!r}: its workflow completed on Temporal but its log does not show"
                " it completed: the workers use another world than this caller"
            )
        return read_output(world, fold.output, fold.output_ref)


def _fold(world: World, run_id: str) -> Any:
    recorder = RunRecorder.load(world, run_id)
    return None if recorder is None else recorder.fold

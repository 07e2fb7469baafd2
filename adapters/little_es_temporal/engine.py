"""Whole runs on Temporal for callers that drive runs: :class:`TemporalEngine`.

``run_outer_loop(world, ..., engine=TemporalEngine(client, task_queue=...))``
runs each cycle's planner run and cycle run as a Temporal workflow whose id is
the run id, executed by the workers on ``task_queue``; the loop's aggregate and
manifest view are written by the caller, as with the local engine. A caller
resumed while a cycle's workflow is still running on Temporal (it crashed, the
workflow did not) waits for that workflow instead of starting another. A run
that waits for a signal (or one of its sub-runs) stops the caller with
``RunWaitingError``, as ``run_workflow`` does: the workflow waits on, and the
caller's next call, once the run is signalled, joins it. A run whose sub-run's child
workflow was ended outside little_es stops the caller with
:class:`~little_es_temporal.ChildWorkflowEndedError`, nothing recorded: the next call
resumes both; one whose child workflow failed by an error of its own before its log
recorded an end, with :class:`~little_es_temporal.ChildWorkflowFailedError` naming it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from temporalio.client import Client, WorkflowFailureError
from temporalio.common import WorkflowIDConflictPolicy

from little_es.durability import RunRecorder, read_output
from little_es.engine.engines import RunEngine
from little_es.engine.executor import failed_run_error, waiting_error
from little_es.errors import RunWaitingError
from little_es.workflow.authoring import Workflow
from little_es.world import World
from little_es_temporal.errors import TemporalAdapterError, refusal_error
from little_es_temporal.models import StepTimeouts
from little_es_temporal.worker import DEFAULT_TASK_QUEUE, start_run

__all__ = ["TemporalEngine"]

_WAIT_POLL_S = 0.25
"""How often a caller waiting for a workflow's result looks for a wait in the run's log
(one indexed query a run of its tree, when nothing was appended)."""


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
            await _result_unless_waiting(world, handle.result(), run_id)
        except WorkflowFailureError as exc:
            fold = _fold(world, run_id)
            if fold is not None and fold.status == "failed" and fold.error is not None:
                raise failed_run_error(run_id, fold) from exc
            refused = refusal_error(exc, run_id)
            if refused is not None:
                # The adapter's own refusal (a sub-run's child workflow ended outside
                # little_es, or failed unrecorded), or a model's provider that kept failing:
                # raised as itself, as a local run raises it.
                raise refused from exc
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


async def _result_unless_waiting(world: World, result: Any, run_id: str) -> None:
    """Await the workflow's ``result``; raise the ``RunWaitingError`` of the run, or of a
    sub-run of its tree, as soon as its log shows it waiting."""
    task = asyncio.ensure_future(result)
    watched: dict[str, RunRecorder] = {}
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=_WAIT_POLL_S)
            if done:
                task.result()
                return
            waiting = _waiting(world, run_id, watched)
            if waiting is not None:
                raise waiting
    finally:
        task.cancel()


def _waiting(world: World, run_id: str, watched: dict[str, RunRecorder]) -> RunWaitingError | None:
    pending = [run_id]
    while pending:
        current = pending.pop()
        recorder = watched.get(current)
        if recorder is None:
            recorder = RunRecorder.load(world, current)
            if recorder is None:
                continue
            watched[current] = recorder
        elif world.has_events_after(recorder.run.id, recorder.run.version):
            world.catch_up(recorder.run)
        fold = recorder.fold
        if fold.status == "waiting":
            return waiting_error(current, fold)
        pending.extend(fold.sub_run_ids)
    return None

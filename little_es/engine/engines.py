"""Where a caller that drives whole runs has each of them executed: :class:`RunEngine`.

An outer loop (:func:`~little_es.outer_loop.run_outer_loop`) drives two runs a
cycle (its planner, its workflow) and records their outcomes in its aggregate;
what runs them is its engine: :class:`LocalEngine` (``run_workflow`` in this
process, the default) or the Temporal adapter's ``TemporalEngine`` (each run a
Temporal workflow whose id is the run id, executed by the workers). The runs'
logs are the same either way, so a loop started on one engine resumes on the
other with nothing committed done again.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any

from little_es.engine.local import run_workflow
from little_es.workflow.authoring import Workflow
from little_es.world import World

__all__ = ["LocalEngine", "RunEngine"]


class RunEngine(ABC):
    """Runs (or resumes) one run of a workflow to its end, somewhere; the seam of outer loops."""

    name: str
    """The engine's name, as ``engines=[...]`` on steps and tools spells it."""

    @abstractmethod
    async def run(
        self, world: World, workflow: Workflow, input: Mapping[str, Any] | None, *, run_id: str
    ) -> Any:
        """Run ``run_id`` (start it with ``input``, or resume it from its log) to its end and
        return its output. Raises :class:`~little_es.errors.RunFailedError` when the run
        failed; what stops a run otherwise (a refusal, a cancel, a budget) propagates."""


class LocalEngine(RunEngine):
    """Each run in this process, with the local scheduler (``run_workflow``)."""

    name = "local"

    async def run(
        self, world: World, workflow: Workflow, input: Mapping[str, Any] | None, *, run_id: str
    ) -> Any:
        """``run_workflow(world, workflow, input, run_id=run_id)``; its output."""
        return (await run_workflow(world, workflow, input, run_id=run_id)).output

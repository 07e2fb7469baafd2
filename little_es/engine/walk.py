"""The IR walk: which step runs next, under which step path, and whose output is the run's.

Both engines walk a workflow with :class:`Walk`: the local scheduler
(:mod:`little_es.engine.local`) and the Temporal workflow
(``little_es_temporal.workflow``), which runs inside Temporal's workflow
sandbox. So this module is a pure function of the :class:`~little_es.workflow.ir.WorkflowIR`
and the results the engine reports: it imports only the IR, step paths and
errors, does no I/O, reads no clock and draws no random numbers.

The rules:

* steps run in list order, from the first; after the last comes ``END``;
* a decision jumps to the step id it returned (or ``END``); the target must be
  ``END`` or a top-level step of the IR;
* each top-level step counts its visits; a visit beyond the step's
  ``max_visits`` stops the walk with :class:`VisitLimitError`;
* visit ``n`` of step ``s`` runs under the path ``s`` (``n == 1``) or ``s@n``;
  branch ``k`` of a parallel group's visit under ``g[k]/b`` or ``g@n[k]/b``
  (:func:`branch_path`);
* the run's output is the output of the last non-decision step visited
  (:attr:`Walk.output_path`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import NamedTuple, TypeVar

from little_es.errors import VisitLimitError, WorkflowChangedError, WorkflowDefinitionError
from little_es.workflow.ir import END, StepIR, WorkflowIR
from little_es.workflow.paths import step_path

__all__ = ["StepVisit", "Walk", "branch_path", "gather_branches"]

T = TypeVar("T")


class StepVisit(NamedTuple):
    """One visit of a top-level step: the step's IR, its step path and its visit number."""

    step: StepIR
    path: str
    visit: int


def branch_path(group: StepIR, branch_key: str, group_visit: int) -> str:
    """The step path of branch ``branch_key`` in visit ``group_visit`` of the group ``group``."""
    inner = group.branch_step
    if inner is None:
        raise WorkflowDefinitionError(f"step {group.id!r} is a {group.kind}, not a parallel group")
    return step_path(inner.id, group_id=group.id, branch_key=branch_key, group_visit=group_visit)


class Walk:
    """One walk of a workflow's IR, from its first step to ``END``.

    :meth:`drive` runs it; :meth:`first` and :meth:`after` are its steps, for an
    engine that walks by hand.
    """

    __slots__ = ("_index", "_ir", "_run_id", "_visits", "output_path")

    def __init__(self, ir: WorkflowIR, run_id: str) -> None:
        self._ir = ir
        self._run_id = run_id
        self._index = {step.id: position for position, step in enumerate(ir.steps)}
        self._visits: dict[str, int] = {}
        self.output_path: str | None = None
        """The path of the last non-decision step visited: the run's output is its output."""

    async def drive(self, run: Callable[[StepVisit], Awaitable[object]]) -> str | None:
        """Walk to ``END``, awaiting ``run(visit)`` for each visit; return :attr:`output_path`.

        ``run`` returns, for a decision, its target (for another step anything:
        it is not looked at).
        """
        visit = self.first()
        while visit is not None:
            visit = self.after(visit, await run(visit))
        return self.output_path

    def first(self) -> StepVisit | None:
        """The first visit of the walk."""
        return self._visit(self._ir.steps[0].id)

    def after(self, done: StepVisit, target: object = None) -> StepVisit | None:
        """The visit after ``done`` (``target``: a decision's), or None at ``END``.

        Raises :class:`VisitLimitError` when that step has used its
        ``max_visits``, and :class:`~little_es.errors.WorkflowChangedError` when
        a decision's target is not a top-level step of the IR (the log and the
        IR disagree: a decision's own code is checked when it runs).
        """
        if done.step.kind == "decision":
            if target != END and (not isinstance(target, str) or target not in self._index):
                raise WorkflowChangedError(
                    f"decision {done.path!r} recorded target {target!r}, which is not a step of"
                    f" workflow {self._ir.id!r}: the log and the IR disagree"
                )
            next_id = target
        else:
            self.output_path = done.path
            position = self._index[done.step.id] + 1
            next_id = END if position == len(self._ir.steps) else self._ir.steps[position].id
        return None if next_id == END else self._visit(next_id)

    def _visit(self, step_id: str) -> StepVisit:
        step = self._ir.steps[self._index[step_id]]
        visit = self._visits.get(step_id, 0) + 1
        if visit > step.max_visits:
            raise VisitLimitError.for_step(self._run_id, step_id, visit, step.max_visits)
        self._visits[step_id] = visit
        return StepVisit(step=step, path=step_path(step_id, visit=visit), visit=visit)


async def gather_branches(
    keys: Sequence[str],
    max_concurrency: int | None,
    run: Callable[[str], Awaitable[T]],
    *,
    stops_all: Callable[[BaseException], bool] = lambda error: False,
    rank: Callable[[BaseException], int] = lambda error: 0,
) -> list[T]:
    """``run(key)`` for each branch key, at most ``max_concurrency`` at once (None: all).

    Every branch is awaited to its end before the first error is raised, so no
    branch is left running behind the group's failure; the other branches' results
    are committed meanwhile. The error of the lowest ``rank`` is raised, the first in
    key order among equals (a branch out of retries, over another's stop: the run
    must record that failure, or a resume would run the branch again; a stop, over
    another branch's wait: the run is stopped, not waiting). Except for
    an error that ``stops_all`` (a refusal: the engine must stop before it appends
    or executes anything more): the other branches are cancelled at once (those
    waiting for their turn never start, a running one is left with its call in
    flight, as a kill leaves it), awaited, and that error is raised.
    """
    limit = asyncio.Semaphore(max_concurrency or max(len(keys), 1))
    tasks: list[asyncio.Future[T]] = []
    stopping: list[BaseException] = []

    async def branch(key: str) -> T:
        try:
            async with limit:
                return await run(key)
        except Exception as exc:
            if not stopping and stops_all(exc):
                stopping.append(exc)
                # In key order, never a set's: the Temporal workflow's commands must
                # come out the same on every replay.
                me = asyncio.current_task()
                for task in tasks:
                    if task is not me and not task.done():
                        task.cancel()
            raise

    tasks.extend(asyncio.ensure_future(branch(key)) for key in keys)
    results = await asyncio.gather(*tasks, return_exceptions=True)
    if stopping:
        raise stopping[0]
    errors = [result for result in results if isinstance(result, BaseException)]
    if errors:
        # min keeps the first of equal rank; one error is raised without asking its rank.
        raise errors[0] if len(errors) == 1 else min(errors, key=rank)
    return list(results)  # type: ignore[arg-type]

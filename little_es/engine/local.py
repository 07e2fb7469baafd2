"""The local scheduler: run a workflow in-process on asyncio, resumable after any crash.

``run_workflow(world, workflow, input, run_id=...)`` starts a run, or resumes it
when the run id already has a log. It is the walk (:mod:`little_es.engine.walk`)
and the step executor (:mod:`little_es.engine.executor`) under the run's lease.
Resuming walks the workflow in the order it ran before, using the log instead
of the code for everything committed:

* a step with a committed ``StepCompleted`` is not run; its recorded output is
  used (and for a decision, its recorded target);
* visit counters are recounted from the walk, so ``review@2`` is the same path
  in every process;
* a parallel group recomputes its branch set and compares it with the recorded
  ``ParallelBranchScheduled`` before running any branch;
* the first step without a terminal event runs again with the same attempt
  number (an agent step continues its harness session, fast-forwarding every
  committed model and tool call).

Before anything runs, the restart checks of :mod:`little_es.engine.integrity`
refuse a log that the code no longer matches. A lease (:meth:`World.run_lease`)
makes sure only one process drives a run at a time.
"""

from __future__ import annotations

import asyncio
import functools
import sys
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, TypeVar
from uuid import UUID

from little_es._frozen import FrozenDict, freeze
from little_es.durability import NOTHING_READ, RunRecorder, read_output
from little_es.engine.executor import (
    Begun,
    BudgetTracker,
    Committed,
    HostedRun,
    Retry,
    RunWriter,
    StepExecutor,
    StepGuard,
    SubRunHost,
    check_engine,
    check_run_request,
    open_run,
    waiting_error,
)
from little_es.engine.walk import StepVisit, Walk, branch_path, gather_branches
from little_es.errors import (
    ConcurrencyConflictError,
    ConcurrentRunError,
    DrivenElsewhereError,
    LittleEsError,
    RunFailedError,
    RunRequestError,
    RunStoppedError,
    RuntimeIntegrityError,
    RunWaitingError,
    SubRunTimedOutError,
    VisitLimitError,
    WaitTimedOutError,
)
from little_es.events import Event
from little_es.harness.guard import current_guard
from little_es.ids import new_run_id, validate_run_id
from little_es.logging import get_logger
from little_es.materialize import COUNTED_ONLY, MaterializedRunState, RunFold
from little_es.totals import run_tree_totals
from little_es.values import Budget, ErrorInfo
from little_es.workflow.authoring import (
    BranchStep,
    ParallelStep,
    Step,
    Workflow,
)
from little_es.world import World, gc_paused

__all__ = ["RunResult", "current_run_recorder", "run_workflow"]

_log = get_logger()

T = TypeVar("T")


@dataclass(frozen=True, repr=False)
class RunResult:
    """What :func:`run_workflow` returns: the run's output and its materialized state.

    ``state`` equals ``replay_run(world, run_id).state`` (usage, cost, event
    count and all): the runtime's view of a run and replay's are the same.
    """

    run_id: str
    output: Any
    state: MaterializedRunState
    resumed: bool
    """True when the run id already had a log."""
    steps_executed: int
    """Step executions (attempts) that ran code in this call."""

    def __repr__(self) -> str:
        # Not the whole state: it can hold thousands of steps, and asyncio.run()
        # formats the repr of its main task's result as it returns (3.11).
        return (
            f"RunResult(run_id={self.run_id!r}, status={self.state.status!r},"
            f" steps={len(self.state.steps)}, resumed={self.resumed},"
            f" steps_executed={self.steps_executed})"
        )


_current_recorder: ContextVar[RunRecorder | None] = ContextVar(
    "little_es_current_recorder", default=None
)


def current_run_recorder() -> RunRecorder | None:
    """The recorder of the run whose step code is running in this context, else None.

    The local scheduler sets it around each task, decision and agent step, so a
    tool called by an agent (``start_workflow``) writes the run's own stream
    through the one object that holds its ``Run`` aggregate in memory.
    """
    return _current_recorder.get()


class _LocalWriter(RunWriter):
    """The run's one in-memory recorder: this process is its only writer (it holds the lease)."""

    def __init__(self, recorder: RunRecorder) -> None:
        super().__init__(recorder.world, recorder.run_id)
        self.recorder = recorder
        # Each output is frozen once, when the walk gets it, and the read-only view
        # handed to step contexts is extended in place while no one else holds it
        # (see set_output). Rebuilding it for every step would be O(steps) per step,
        # O(steps**2) per run; StepContext re-freezing every output, worse.
        self._view: FrozenDict[str, Any] = FrozenDict()

    def read(self) -> RunFold:
        return self.recorder.fold

    def refresh(self, unchanged: Mapping[UUID, int] = NOTHING_READ) -> RunFold:
        self.flush()
        self.recorder.refresh(unchanged)
        return self.recorder.fold

    def watched(self) -> tuple[UUID, int] | None:
        return self.recorder.watched()

    def flush(self) -> None:
        if self.recorder.holding:
            self._write(RunRecorder.flush)

    async def write(self, action: Callable[[RunRecorder], T], *, catch_up: bool = True) -> T:
        return self._write(action)

    def _write(self, action: Callable[[RunRecorder], T]) -> T:
        for attempt in range(_CONFLICT_RETRIES):
            try:
                return action(self.recorder)
            except ConcurrencyConflictError:
                # Another process appended (a RunCancelled, a user's event; it holds no
                # lease, see little_es.durability): decide again on the stream as stored.
                # A driver that lost its lease stops at the retried append's lease check.
                # What the recorder held back is triggered again on the reloaded stream.
                if attempt + 1 == _CONFLICT_RETRIES:
                    raise
                self.recorder.reload()
        raise AssertionError("unreachable")  # pragma: no cover

    def outputs(self, fold: RunFold) -> FrozenDict[str, Any]:
        return self._view

    def set_output(self, step_id: str, output: Any) -> None:
        """Show ``output`` as step ``step_id``'s to the steps that follow."""
        frozen = freeze(output)
        if _refcount(self._view) > _SOLE_HOLDER:
            # A context (or anything a step kept) still holds the view: it must keep
            # showing the outputs as they were when it was handed out, so the change
            # goes into a copy. Once the steps that saw a view are done with it, only
            # this writer holds it, and no one can see it change: CPython's own
            # ``s += t`` on a str relies on the same fact. A run whose steps keep their
            # contexts pays a copy per step, as every run did before.
            view: FrozenDict[str, Any] = FrozenDict()
            dict.update(view, self._view)  # the values are frozen already
            self._view = view
        # A later visit replaces the output in place, keeping the step's first position.
        dict.__setitem__(self._view, step_id, frozen)


def _never_sole(obj: object) -> int:
    # An interpreter without reference counts (PyPy): always copy.
    return sys.maxsize


_refcount: Callable[[object], int] = getattr(sys, "getrefcount", _never_sole)


class _SoleHolder:
    __slots__ = ("_view",)

    def __init__(self) -> None:
        self._view: FrozenDict[str, Any] = FrozenDict()

    def count(self) -> int:
        # The very expression set_output tests.
        return _refcount(self._view)


# What ``_refcount(self._view)`` gives for a view only its writer holds: measured, not
# assumed (2 on CPython 3.11, the attribute and the call's argument), since interpreters
# differ in the references they borrow instead of counting (CPython 3.14 borrows more).
_SOLE_HOLDER = _SoleHolder().count()


_CONFLICT_RETRIES = 20


class _InProcessHost(SubRunHost):
    """The local engine's :class:`SubRunHost`: a sub-run runs (or resumes) in this process."""

    def __init__(self, world: World) -> None:
        self.world = world

    async def run(self, request: HostedRun) -> Any:
        try:
            result = await run_workflow(
                self.world,
                request.workflow,
                request.input,
                run_id=request.run_id,
                _parent=(request.parent_run_id, request.parent_step_path),
            )
        except WaitTimedOutError as exc:
            raise SubRunTimedOutError(exc) from exc
        except DrivenElsewhereError:
            raise
        except ConcurrentRunError as exc:
            # The sub-run (or its own) is driven by another process: not the step's failure.
            raise DrivenElsewhereError(str(exc)) from exc
        return result.output


class _RetriesExhaustedError(Exception):
    def __init__(self, step_path: str, error: ErrorInfo) -> None:
        super().__init__(step_path)
        self.step_path = step_path
        self.error = error


class _Scheduler:
    def __init__(self, workflow: Workflow, recorder: RunRecorder) -> None:
        self.world = recorder.world
        self.workflow = workflow
        self.run_id = recorder.run_id
        self.writer = _LocalWriter(recorder)
        self.executor = StepExecutor(self.writer, workflow)
        self.executor.host = _InProcessHost(self.world)
        self.executed = 0

    async def drive(self) -> str | None:
        """Walk the workflow to END; return the path of the step whose output is the run's.

        A top-level step's ``StepCompleted`` is held back for the next record's commit
        (:mod:`little_es.durability`, "One commit per step"): the last step's is
        committed with ``RunCompleted``. A walk that ends with an error commits it
        before the error propagates: the step did complete.
        """
        try:
            return await Walk(self.workflow.ir, self.run_id).drive(self._visit)
        except BaseException:
            self._flush_quietly()
            raise

    async def complete(self, output_path: str | None) -> RunFold:
        """Commit ``RunCompleted``, with the last step's held ``StepCompleted``."""
        try:
            return await self.executor.complete_run(output_path)
        except BaseException:
            # A cancel that won the race: the held result is committed after it.
            self._flush_quietly()
            raise

    def _flush_quietly(self) -> None:
        try:
            self.writer.flush()
        except Exception as exc:
            # The error already propagating says why the run stopped; a held result
            # that is not committed (a lost lease, a failing database) is a step in
            # flight, which a resume runs again.
            _log.warning("held step result not committed", run_id=self.run_id, error=repr(exc))

    async def _visit(self, visit: StepVisit) -> Any:
        step = self.workflow.step(visit.step.id)
        result = await self._step(step, visit.path, visit.visit, top_level=True)
        self.writer.set_output(step.id, result)
        return result

    async def _step(
        self,
        step: Step,
        path: str,
        visit: int,
        branch_value: Any = None,
        *,
        top_level: bool = False,
    ) -> Any:
        if isinstance(step, ParallelStep):
            return await self._parallel(step, path, visit)
        while True:
            begun = await self.executor.begin(step, path, visit, branch_value)
            if isinstance(begun, Committed):
                return begun.output(self.world)
            self.executed += 1
            outcome = await self.executor.attempt(begun, functools.partial(self._execute, begun))
            # A branch's result is not held: other branches run code meanwhile.
            settled = await self.executor.settle(begun, outcome, hold=top_level)
            if isinstance(settled, Committed):
                return settled.output(self.world)
            if not settled.will_retry:
                raise _RetriesExhaustedError(path, settled.error) from outcome.exception
            self.writer.flush()  # nothing waits with a result held back
            await asyncio.sleep(settled.delay_s)

    async def _execute(self, begun: Begun) -> Any:
        token = _current_recorder.set(self.writer.recorder)
        try:
            return await self.executor.execute(begun)
        finally:
            _current_recorder.reset(token)

    async def _parallel(self, group: ParallelStep, path: str, visit: int) -> Any:
        plan = await self.executor.schedule_group(group, path, visit)
        while isinstance(plan, Retry):
            if not plan.will_retry:
                raise _RetriesExhaustedError(path, plan.error) from plan.cause
            self.writer.flush()  # nothing waits with a result held back
            await asyncio.sleep(plan.delay_s)
            plan = await self.executor.schedule_group(group, path, visit)
        if isinstance(plan, Committed):
            return plan.output(self.world)
        inner: BranchStep = group.step
        branch_set = plan.branch_set

        async def branch(key: str) -> Any:
            return await self._step(inner, branch_path(group.ir, key, visit), 1, branch_set[key])

        outputs = await gather_branches(
            plan.keys,
            group.max_concurrency,
            branch,
            stops_all=_is_refusal,
            rank=_branch_error_rank,
        )
        done = await self.executor.complete_group(group, path, visit, outputs, hold=True)
        return done.output(self.world)


def _is_refusal(error: BaseException) -> bool:
    return isinstance(error, RuntimeIntegrityError)


def _branch_error_rank(error: BaseException) -> int:
    # A branch out of retries is recorded as the run's failure; then a stop (a cancel, a
    # budget, a wait that timed out) is the run's outcome, whatever another branch waits
    # for; a wait is raised only when every branch that stopped waits.
    if isinstance(error, _RetriesExhaustedError):
        return 0
    return 2 if isinstance(error, RunWaitingError) else 1


async def run_workflow(
    world: World,
    workflow: Workflow,
    input: Mapping[str, Any] | None = None,
    *,
    run_id: str | None = None,
    observer: Callable[[Event], None] | None = None,
    budget: Budget | None = None,
    resume_cancelled: bool = False,
    _parent: tuple[str, str] | None = None,
) -> RunResult:
    """Run ``workflow`` to the end, or resume the run ``run_id`` where its log stops.

    A new (or no) ``run_id`` starts a run with ``input``; an existing one resumes
    it (``input`` may be omitted, and must equal the recorded one if given).
    A completed run returns its recorded result without running anything.

    Raises :class:`~little_es.engine.executor.RunFailedError` when a step fails
    with its retries exhausted (the failure is recorded; resume later), a
    :class:`~little_es.errors.RuntimeIntegrityError` when the log does not match
    the code, before or during a step (a refusal: nothing is recorded, and once
    the cause is fixed a resume continues where the run stopped), and
    :class:`~little_es.errors.ConcurrentRunError` when another process is
    driving the run.

    ``budget`` limits what the run and its sub-runs may spend on model calls
    (recorded as ``BudgetSet``; None keeps the recorded one, so a resume may
    raise it); when the next call would start past it the run stops with
    :class:`~little_es.errors.BudgetExceededError`, recorded as its outcome.
    A run cancelled by :func:`~little_es.durability.cancel_run` (``little
    cancel``) stops with :class:`~little_es.errors.RunCancelledError` before its
    next step, model call or tool call, and is resumed only with
    ``resume_cancelled=True``.

    A run that reaches a wait (``wait_for``, ``ask_human``, an approval) records
    ``RunWaiting`` and stops with :class:`~little_es.errors.RunWaitingError`: not a
    failure; send the signal (``world.signal``) and call ``run_workflow`` again to
    continue from the wait. A wait whose deadline passed first stops the run with
    :class:`~little_es.errors.WaitTimedOutError` (``WaitTimedOut``, status ``timed_out``).
    """
    problem = check_run_request(workflow, input, budget)
    if problem is None and not isinstance(world, World):
        problem = (
            f"world must be a little_es World, got {type(world).__name__}: open one with"
            " open_world(), local_world(path) or memory_world()"
        )
    if problem is not None:
        raise RunRequestError(problem)
    check_engine(workflow, "local")
    run_id = validate_run_id(run_id) if run_id is not None else new_run_id()
    with world.run_lease(run_id):
        existing = RunRecorder.load(world, run_id, observer=observer)
        recorder = open_run(
            world,
            workflow,
            run_id,
            input,
            existing,
            parent_run_id=_parent[0] if _parent else None,
            parent_step_path=_parent[1] if _parent else None,
            observer=observer,
            budget=budget,
            resume_cancelled=resume_cancelled,
        )
        resumed = existing is not None
        if recorder.fold.status == "completed":
            return _result(world, recorder.fold, resumed=True, executed=0)
        scheduler = _Scheduler(workflow, recorder)
        # A sub-run driven in this process stops with its parent, and counts its
        # model calls towards the budget over the parent (the parent step's guard).
        parent_guard = current_guard()
        inherited = (
            parent_guard.executor.budget_tracker() if isinstance(parent_guard, StepGuard) else None
        )
        scheduler.executor.parent_guard = parent_guard
        own = recorder.fold.budget
        if own is not None:
            scheduler.executor.run_budget = BudgetTracker(
                world,
                scope=f"run {run_id!r} with its sub-runs",
                budget=own,
                base=run_tree_totals(world, run_id),
                parent=inherited,
            )
        elif isinstance(parent_guard, StepGuard):
            scheduler.executor.run_budget = inherited
        log = _log.bind(run_id=run_id, workflow_id=workflow.id)
        log.info("run resumed" if resumed else "run started")
        try:
            output_path = await scheduler.drive()
        except _RetriesExhaustedError as gave_up:
            await scheduler.executor.fail_run(step_path=gave_up.step_path, error=gave_up.error)
            raise RunFailedError(run_id, gave_up.step_path, gave_up.error) from gave_up.__cause__
        except VisitLimitError as exc:
            error = ErrorInfo.from_exception(exc, retryable=False)
            await scheduler.executor.fail_run(step_path=None, error=error)
            raise
        except RunWaitingError as exc:
            log.info("run waiting", reason=str(exc))
            mine = waiting_error(run_id, scheduler.writer.read())
            if not mine.waits:
                # A sub-run driven in this process waits (its own log says for what).
                raise
            # Branches (or a batch of tool calls) may wait at once: name every open wait,
            # this run's and its sub-runs'.
            others = [
                (owner, wait)
                for owner, wait in zip(exc.wait_run_ids, exc.waits, strict=True)
                if owner != run_id
            ]
            raise RunWaitingError(
                run_id,
                mine.waits + tuple(wait for _, wait in others),
                mine.wait_run_ids + tuple(owner for owner, _ in others),
            ) from exc
        except RunStoppedError as exc:
            log.info("run stopped", reason=str(exc))
            raise
        except LittleEsError:
            raise
        fold = await scheduler.complete(output_path)
        log.info("run completed", steps_executed=scheduler.executed)
        return _result(world, fold, resumed=resumed, executed=scheduler.executed)


def _result(world: World, fold: RunFold, *, resumed: bool, executed: int) -> RunResult:
    assert fold.run_id is not None
    return RunResult(
        run_id=fold.run_id,
        output=read_output(world, fold.output, fold.output_ref),
        state=_run_state(world, fold),
        resumed=resumed,
        steps_executed=executed,
    )


def _run_state(world: World, fold: RunFold) -> MaterializedRunState:
    """The run's state as :func:`~little_es.replay.replay_run` folds it from the log.

    The scheduler's fold holds the ``Run`` stream only: the harness sessions
    are written by their own aggregates, and folding each of their events into
    it as it is recorded would cost every model and tool call. A run without
    sessions is that fold already; a run with some is folded once, at its end,
    from its whole log, the way replay reads it (the same reducer, the same
    skipped classes), so its usage, cost and event count are replay's.
    """
    if not fold.session_steps:
        return fold.freeze()
    assert fold.run_id is not None
    with gc_paused():
        # As in replay: the decoded events are freed before the collector resumes.
        return world.read_run_log_skipping(fold.run_id, COUNTED_ONLY).materialize()

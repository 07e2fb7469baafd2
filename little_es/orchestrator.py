"""Orchestrators: agents that start sub-runs of registered workflows, durable across crashes.

An *orchestrator* is an agent step with the :func:`start_workflow_tool` tool.
Each ``start_workflow`` call runs one registered workflow as a *sub-run*: a
``Run`` of its own, with its own log, resumed by its own step memoization. Two
streams are involved, and each is the truth about its own part:

* the orchestrator's log holds ``harness.tool_call.started(start_workflow,
  args={workflow_id, input, sub_run_id})`` and, on its ``Run`` stream,
  ``SubRunReserved``; then ``harness.tool_call.succeeded`` with the sub-run's
  output (or ``failed``);
* the sub-run's log holds everything the sub-run did, ending in
  ``RunCompleted``.

The sub-run id is a pure function of ``(parent run id, session id, call id)``
(:func:`sub_run_id_for_call`). The tool adds it to the call's arguments before
the harness records ``harness.tool_call.started`` (the session's
``prepare_args`` hook), and commits ``SubRunReserved`` through the step
executor of the parent's running step (its writer holds the parent's ``Run``
stream) before the sub-run starts. So a crash can never produce a second
sub-run for a call; on resume:

* a call with a recorded result fast-forwards from the orchestrator's log;
* a call in flight is invoked again with its recorded arguments, hence the
  same sub-run id: :func:`~little_es.engine.local.run_workflow` resumes
  that sub-run from its own log, or, when the sub-run had already committed
  ``RunCompleted``, returns its recorded output without running anything,
  and the orchestrator's log gets the missing ``succeeded``.

``replay_run`` of the orchestrator reads its own streams only. The sub-runs of
a run are listed by :func:`list_sub_runs` and the whole tree, each node's
totals from its own materialized state, by :func:`run_tree` (printed by
:func:`little_es.render.render_sub_runs` and :func:`little_es.render.render_tree`).

A retry of the orchestrator's step after a recorded failure is a new attempt,
hence a new harness session, whose calls start new sub-runs; a process that
merely crashed continues the same session and the same sub-runs.

The tool must be called from an agent step of an engine: the step executor's
:class:`~little_es.engine.executor.SubRunHost` runs the sub-run, in this
process with :func:`~little_es.engine.local.run_workflow`, as a child workflow
(whose id is the sub-run id) with the Temporal adapter.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

from pydantic import BaseModel, ConfigDict

from little_es.durability import RunRecorder
from little_es.engine.executor import HostedRun, StepGuard, failed_run_error
from little_es.errors import (
    OrchestratorContextError,
    RunFailedError,
    SubRunFailedError,
    ToolArgumentsError,
)
from little_es.events import SubRunReserved
from little_es.harness.guard import current_guard
from little_es.harness.tools import Tool, ToolContext
from little_es.ids import validate_run_id
from little_es.materialize import (
    COUNTED_ONLY,
    MaterializedRunState,
    RunStatus,
)
from little_es.totals import sum_usage
from little_es.values import JSONValue, UsageTotals
from little_es.workflow.authoring import Workflow
from little_es.world import World

__all__ = [
    "SUB_RUN_ID_ARG",
    "RunTree",
    "SubRunSummary",
    "list_sub_runs",
    "run_tree",
    "start_workflow_tool",
    "sub_run_id_for_call",
    "sum_usage",
]

SUB_RUN_ID_ARG = "sub_run_id"
"""The argument ``start_workflow`` adds to each call before it is recorded."""


def sub_run_id_for_call(parent_run_id: str, session_id: str, call_id: str) -> str:
    """The deterministic id of the sub-run the tool call ``call_id`` of a session starts."""
    # NUL cannot appear in any of the three, so the join is unambiguous; the
    # tag keeps these ids apart from sub_run_id_for(parent, step_path).
    joined = "\x00".join(("start_workflow", parent_run_id, session_id, call_id))
    return f"sub_{hashlib.sha256(joined.encode()).hexdigest()[:20]}"


async def _describe_start(workflow_id: str, input: dict[str, Any] | None = None) -> dict[str, Any]:
    """Start a sub-run of a workflow with an input, and wait for its result."""
    # The schema and validation of the model's arguments come from this
    # signature; _StartWorkflowTool.invoke does the work with what it returns.
    return {"workflow_id": workflow_id, "input": input or {}}


class _StartWorkflowTool(Tool):
    """``start_workflow``: the model's arguments plus a recorded ``sub_run_id``."""

    def __init__(self, workflows: Mapping[str, Workflow], max_concurrency: int) -> None:
        self._workflows = dict(workflows)
        self._max_concurrency = max_concurrency
        # Per parent run: the bound is one orchestrator's fan-out, so runs that
        # use this tool at once in one process never wait for each other's permits.
        self._limits: dict[str, tuple[asyncio.Semaphore, int]] = {}
        ids = ", ".join(sorted(self._workflows))
        super().__init__(
            _describe_start,
            name="start_workflow",
            description=(
                "Start a sub-run of one of the workflows "
                f"[{ids}] with an input object, wait for it to finish and return"
                " {sub_run_id, status, output}. Calls made in one turn run concurrently."
            ),
        )

    @property
    def workflows(self) -> Mapping[str, Workflow]:
        """The workflows the model may start, by id."""
        return dict(self._workflows)

    @property
    def max_concurrency(self) -> int:
        """How many sub-runs one parent run has running at once, at most."""
        return self._max_concurrency

    def prepare_args(self, args: dict[str, JSONValue], ctx: ToolContext) -> dict[str, JSONValue]:
        """Add the call's deterministic ``sub_run_id`` (called by the session before recording)."""
        if SUB_RUN_ID_ARG in args:
            raise ToolArgumentsError(
                f"start_workflow chooses {SUB_RUN_ID_ARG!r} itself: call it with workflow_id and"
                " input only",
                tool=self.name,
                fields=(SUB_RUN_ID_ARG,),
            )
        return {
            **args,
            SUB_RUN_ID_ARG: sub_run_id_for_call(ctx.run_id, ctx.session_id, ctx.call_id),
        }

    async def invoke(self, arguments: dict[str, JSONValue], ctx: ToolContext) -> JSONValue:
        """Reserve the recorded sub-run id on the parent's stream, then run (or resume) it.

        Returns ``{sub_run_id, status, output}``. Raises
        :class:`~little_es.harness.tools.ToolArgumentsError` for arguments that
        do not validate or name no registered workflow,
        :class:`SubRunFailedError` when the sub-run fails, and
        :class:`OrchestratorContextError` outside an agent step of the local
        runtime.
        """
        if not isinstance(arguments, dict):
            return await super().invoke(arguments, ctx)  # raises the arguments error
        args = dict(arguments)
        sub_run_id = args.pop(SUB_RUN_ID_ARG, None)
        if not isinstance(sub_run_id, str):
            raise OrchestratorContextError(
                f"start_workflow call {ctx.call_id!r} has no {SUB_RUN_ID_ARG!r} argument: call"
                " it through an agent step, whose harness session adds the id before recording"
                " the call"
            )
        validate_run_id(sub_run_id)
        request = await super().invoke(args, ctx)
        assert isinstance(request, dict)
        workflow = self._workflows.get(request["workflow_id"])
        if workflow is None:
            raise ToolArgumentsError(
                f"start_workflow: no workflow {request['workflow_id']!r}; the workflows are:"
                f" {', '.join(sorted(self._workflows))}",
                tool=self.name,
                fields=("workflow_id",),
            )
        guard = current_guard()
        executor = guard.executor if isinstance(guard, StepGuard) else None
        if executor is None or executor.run_id != ctx.run_id:
            raise OrchestratorContextError(
                f"start_workflow call {ctx.call_id!r} of run {ctx.run_id!r} is not running in an"
                " agent step of an engine (run_workflow, or a worker of little_es_temporal), so"
                " it cannot reserve the sub-run on the run's stream: put the tool on an agent()"
                " step and run the workflow with run_workflow or little_es_temporal.start_run"
            )
        # A re-dispatched call finds its reservation committed by the process
        # that crashed; reserving again would record a second sub-run.
        await executor.reserve_sub_run(
            ctx.step_path, sub_run_id=sub_run_id, workflow_id=workflow.id, call_id=ctx.call_id
        )
        recorded = RunRecorder.load(executor.world, sub_run_id)
        if recorded is not None and recorded.fold.status == "failed":
            # The call's outcome is in the sub-run's log already: the process died before
            # the call's failure was recorded. Answered from the log as a completed sub-run
            # is; run again, its failed step would get a fresh attempt. (A retried agent
            # step has a session, and so sub-run ids, of its own.)
            failed = failed_run_error(sub_run_id, recorded.fold)
            if isinstance(failed, RunFailedError):
                raise SubRunFailedError(sub_run_id, failed.step_path, failed.error) from failed
            raise failed
        request_run = HostedRun(
            sub_run_id,
            workflow,
            dict(request["input"]),
            ctx.run_id,
            ctx.step_path,
            max_concurrency=self._max_concurrency,
        )
        # Locally the semaphore is the bound. On Temporal host_run raises
        # StepSuspendedError at once (releasing the permit), so every call of the
        # turn gets through and the workflow applies the request's max_concurrency
        # to the child workflows it starts.
        async with self._limit(ctx.run_id):
            try:
                # The engine's host: in this process locally, a child workflow on Temporal.
                output: JSONValue = await executor.host_run(request_run)
            except RunFailedError as exc:
                raise SubRunFailedError(sub_run_id, exc.step_path, exc.error) from exc
        return {"sub_run_id": sub_run_id, "status": "completed", "output": output}

    @asynccontextmanager
    async def _limit(self, parent_run_id: str) -> AsyncIterator[None]:
        semaphore, users = self._limits.get(parent_run_id, (None, 0))
        if semaphore is None:
            semaphore = asyncio.Semaphore(self._max_concurrency)
        self._limits[parent_run_id] = (semaphore, users + 1)
        try:
            async with semaphore:
                yield
        finally:
            semaphore, users = self._limits[parent_run_id]
            if users == 1:
                del self._limits[parent_run_id]
            else:
                self._limits[parent_run_id] = (semaphore, users - 1)


def start_workflow_tool(workflows: Sequence[Workflow], *, max_concurrency: int = 8) -> Tool:
    """The ``start_workflow`` tool: an agent calls it to run one of ``workflows`` as a sub-run.

    The model sends ``{workflow_id, input}``; the recorded arguments also hold
    the call's ``sub_run_id``. The call returns ``{sub_run_id, status,
    output}`` once the sub-run completed, and fails (the model sees the error)
    when the sub-run fails. Calls of one turn run concurrently, at most
    ``max_concurrency`` sub-runs at once per parent run, on either engine
    (on Temporal, at most that many of the step's child workflows run at
    once). Raises
    :class:`~little_es.errors.ToolError` for an empty list, anything that is not
    a :class:`~little_es.workflow.authoring.Workflow`, two workflows with one id,
    or a ``max_concurrency`` below 1. Use the returned tool as is: re-wrapping it
    with ``tool(...)`` would drop the sub-run bookkeeping.
    """
    from little_es.errors import ToolError

    if isinstance(workflows, str | bytes) or not isinstance(workflows, Sequence) or not workflows:
        raise ToolError(
            "start_workflow_tool needs a non-empty list of Workflow objects the agent may start"
        )
    by_id: dict[str, Workflow] = {}
    for workflow in workflows:
        if not isinstance(workflow, Workflow):
            raise ToolError(
                f"start_workflow_tool: {type(workflow).__name__} is not a Workflow; build one"
                " with Workflow(id, steps=[...])"
            )
        if workflow.id in by_id:
            raise ToolError(
                f"start_workflow_tool: two workflows have the id {workflow.id!r}; the model"
                " names a workflow by its id, so each must be unique"
            )
        by_id[workflow.id] = workflow
    if isinstance(max_concurrency, bool) or not isinstance(max_concurrency, int):
        raise ToolError(f"max_concurrency must be an integer >= 1, got {max_concurrency!r}")
    if max_concurrency < 1:
        raise ToolError(f"max_concurrency must be an integer >= 1, got {max_concurrency}")
    return _StartWorkflowTool(by_id, max_concurrency)


# ------------------------------------------------------------------ the tree


class SubRunSummary(BaseModel):
    """One sub-run of a run, as ``little report`` lists it.

    ``step_path`` and ``call_id`` say what reserved it (``call_id`` is None
    for a ``subworkflow`` step). ``status`` and ``usage`` come from the
    sub-run's own materialized state; a reserved sub-run that never started
    is ``pending`` with no steps.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    sub_run_id: str
    workflow_id: str
    step_path: str
    call_id: str | None = None
    status: RunStatus = "pending"
    steps: int = 0
    steps_completed: int = 0
    usage: UsageTotals = UsageTotals()


class RunTree(BaseModel):
    """A run and, recursively, its sub-runs.

    ``usage`` is the run's own (from its own materialized state, which never
    includes a sub-run); ``total`` adds every descendant's; ``runs`` counts the
    runs in the tree, this one included.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    run_id: str
    workflow_id: str | None = None
    status: RunStatus = "pending"
    step_path: str | None = None
    """The parent's step that reserved this run (None at the root)."""
    call_id: str | None = None
    """The parent's ``start_workflow`` call that reserved this run, if one did."""
    usage: UsageTotals = UsageTotals()
    total: UsageTotals = UsageTotals()
    runs: int = 1
    children: tuple[RunTree, ...] = ()


def _read(world: World, run_id: str) -> tuple[MaterializedRunState, list[SubRunReserved]]:
    """A run's state and its reservations, from one read of its own log."""
    log = world.read_run_log_skipping(run_id, COUNTED_ONLY)
    return log.materialize(), [e for e in log.events if isinstance(e, SubRunReserved)]


def _state_or_none(world: World, run_id: str) -> tuple[MaterializedRunState, list[SubRunReserved]]:
    # A reservation is committed before its sub-run starts: a crash in
    # between leaves a reserved id with no stream, shown as pending.
    if not world.run_exists(run_id):
        return MaterializedRunState(run_id=run_id), []
    return _read(world, run_id)


def list_sub_runs(world: World, run_id: str) -> tuple[SubRunSummary, ...]:
    """The sub-runs ``run_id`` reserved, in reservation order, each with its own status and cost.

    Reads the run's own log for the reservations and each sub-run's log for
    its state. Raises :class:`~little_es.errors.InvalidRunIdError` or
    :class:`~little_es.errors.RunNotFoundError` for the run.
    """
    validate_run_id(run_id)
    _, reserved = _read(world, run_id)
    summaries = []
    for r in reserved:
        state, _ = _state_or_none(world, r.sub_run_id)
        summaries.append(
            SubRunSummary(
                sub_run_id=r.sub_run_id,
                workflow_id=r.workflow_id,
                step_path=r.step_path,
                call_id=r.call_id,
                status=state.status,
                steps=len(state.steps),
                steps_completed=sum(1 for s in state.steps.values() if s.status == "completed"),
                usage=state.usage,
            )
        )
    return tuple(summaries)


def run_tree(world: World, run_id: str) -> RunTree:
    """``run_id`` and all its sub-runs, recursively, with per-run and subtree totals.

    Each run's figures come from its own log folded by the one reducer. Raises
    :class:`~little_es.errors.InvalidRunIdError` or
    :class:`~little_es.errors.RunNotFoundError` for the root.
    """
    validate_run_id(run_id)
    state, reserved = _read(world, run_id)
    return _tree(world, state, reserved, run_id, None, {run_id})


def _tree(
    world: World,
    state: MaterializedRunState,
    reserved: Sequence[SubRunReserved],
    run_id: str,
    reservation: SubRunReserved | None,
    seen: set[str],
) -> RunTree:
    children = []
    for r in reserved:
        if r.sub_run_id in seen:
            continue  # a log naming an ancestor: shown once, never looped through
        seen.add(r.sub_run_id)
        child_state, child_reserved = _state_or_none(world, r.sub_run_id)
        children.append(_tree(world, child_state, child_reserved, r.sub_run_id, r, seen))
    return RunTree(
        run_id=run_id,
        workflow_id=state.workflow_id or (reservation.workflow_id if reservation else None),
        status=state.status,
        step_path=reservation.step_path if reservation else None,
        call_id=reservation.call_id if reservation else None,
        usage=state.usage,
        total=sum_usage([state.usage, *(c.total for c in children)]),
        runs=1 + sum(c.runs for c in children),
        children=tuple(children),
    )

"""Outer loops (the seed's Layer B): cycles of runs chosen by a planner, resumable and drift-aware.

A loop is ``plan -> run -> look at the outcome -> plan again``. Each cycle is
two ordinary runs, so Layer A resumes either one on a crash with nothing
committed done again:

* ``{outer_loop_id}.cycle-{n}.plan`` - the planner: one agent step (the
  planner's model, prompt, tools) given the loop context, and a step that reads
  its answer as a :class:`PlannerDecision`;
* ``{outer_loop_id}.cycle-{n}`` - a run of the loop's workflow with the input
  the planner chose.

The :class:`~little_es.domain.OuterLoop` aggregate records the cycles, each
with its planner manifest (model, prompt, tools, parameters, the workflow's IR
hash and ``outer_loop_context_hash``, the hash of the context the planner was
given). On resume the pending cycle's manifest is computed again: when it
differs (the code now gives the planner another prompt or tool, or runs
another workflow) the cycle is closed as abandoned and a fresh one starts.
That is the one place drift is not a refusal; a broken or forged log still is.

For people and tools that read files, a local world keeps a view of the
aggregate in ``<data_dir>/outer-loops/<outer_loop_id>.json`` (:func:`loop_view`),
written atomically after every change; it is never read as the truth.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from little_es._strict import find_problem, has_long_digit_run
from little_es.backends.base import check_leases
from little_es.domain import LoopCycle, OuterLoop
from little_es.durability import RunRecorder, cancel_run, read_output
from little_es.engine.engines import LocalEngine, RunEngine
from little_es.engine.executor import check_engine
from little_es.errors import (
    ConcurrentRunError,
    InvalidRunIdError,
    OuterLoopMismatchError,
    OuterLoopNotFoundError,
    OuterLoopRequestError,
    PlannerAnswerError,
    RunFailedError,
    RunStateError,
    VisitLimitError,
    WorkflowDefinitionError,
)
from little_es.events import (
    OuterLoopCompleted,
    OuterLoopCycleAbandoned,
    OuterLoopCycleCompleted,
    OuterLoopCyclePlanned,
    OuterLoopCycleStarted,
    OuterLoopEndReason,
    OuterLoopStarted,
)
from little_es.harness.manifest import SETTINGS_KEY, compute_manifest, manifest_changes
from little_es.harness.model import Model
from little_es.harness.tools import Tool
from little_es.ids import validate_run_id
from little_es.logging import get_logger
from little_es.totals import run_tree_totals, sum_usage
from little_es.values import JSONValue, UsageTotals
from little_es.workflow.authoring import Workflow, agent, task
from little_es.workflow.context import StepContext
from little_es.workflow.ir import RetryPolicy, canonical_json, check_plain_json
from little_es.world import World

__all__ = [
    "CycleCost",
    "CycleOutcome",
    "LoopContext",
    "OuterLoopResult",
    "Planner",
    "PlannerDecision",
    "cycle_cost",
    "list_outer_loops",
    "load_outer_loop",
    "loop_totals",
    "loop_view",
    "run_outer_loop",
    "run_outer_loop_sync",
]

_log = get_logger()

MAX_OUTER_LOOP_ID = 100
"""An outer loop id leaves room for its cycles' run ids (``.cycle-N.plan``) in 128 characters."""

PLANNER_WORKFLOW_ID = "little_es.outer_loop.planner"

_FINISHED = ("completed", "failed")
_STOPPED = ("cancelled", "timed_out", "budget_exceeded")
"""How a run of a cycle ends other than by completing or failing. A resume of it stops
the same way again, so its cycle ends failed (the planner sees the run's own status)
instead of holding the loop for ever."""


class PlannerDecision(BaseModel):
    """What a planner answers, as a JSON object: the next cycle's input, or that the loop is done.

    ``{"done": false, "input": {...}, "reason": "..."}`` runs another cycle with
    ``input``; ``{"done": true, "reason": "..."}`` ends the loop.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    done: bool
    input: dict[str, JSONValue] | None = None
    reason: str = ""

    @model_validator(mode="after")
    def _input_when_not_done(self) -> PlannerDecision:
        if not self.done and self.input is None:
            raise OuterLoopRequestError(
                "a decision that is not done must give the next cycle's input"
            )
        return self


@dataclass(frozen=True)
class CycleOutcome:
    """An earlier cycle as the planner sees it."""

    cycle: int
    run_id: str
    status: str
    output: Any
    planner_reason: str
    cost_usd: Decimal | None
    unpriced_calls: int

    def to_json(self) -> dict[str, JSONValue]:
        """Plain JSON (the cost as a decimal string, so the context hash is exact)."""
        return {
            "cycle": self.cycle,
            "run_id": self.run_id,
            "status": self.status,
            "output": self.output,
            "planner_reason": self.planner_reason,
            "cost_usd": None if self.cost_usd is None else str(self.cost_usd),
            "unpriced_calls": self.unpriced_calls,
        }


@dataclass(frozen=True)
class LoopContext:
    """What the planner of cycle ``cycle`` is given: the loop's input and the earlier outcomes."""

    outer_loop_id: str
    cycle: int
    input: Mapping[str, Any]
    cycles: tuple[CycleOutcome, ...]

    def to_json(self) -> dict[str, JSONValue]:
        """Plain JSON: what is hashed into ``outer_loop_context_hash`` and given to the planner."""
        return {
            "outer_loop_id": self.outer_loop_id,
            "cycle": self.cycle,
            "input": dict(self.input),
            "cycles": [c.to_json() for c in self.cycles],
        }

    @property
    def context_hash(self) -> str:
        """``outer_loop_context_hash``: the SHA-256 of the canonical JSON of :meth:`to_json`."""
        return hashlib.sha256(canonical_json(self.to_json())).hexdigest()


PromptFn = Callable[[LoopContext], str]


class Planner:
    """The agent that plans each cycle: a model, a prompt (text, or a function of the context).

    A text ``prompt`` is followed by the loop context as JSON; a function of
    the :class:`LoopContext` renders the whole prompt itself. The planner must
    answer with a :class:`PlannerDecision` as JSON (a fenced ```json block is
    accepted). ``retry`` retries the planner's agent step after a failed
    model call; an answer that is not a decision ends the loop
    (``planner_failed``).
    """

    def __init__(
        self,
        *,
        model: Model,
        prompt: str | PromptFn,
        tools: Sequence[Tool | Callable[..., Any]] = (),
        system: str | None = None,
        parameters: Mapping[str, Any] | None = None,
        max_turns: int = 20,
        retry: RetryPolicy | None = None,
    ) -> None:
        if isinstance(prompt, str):
            if not prompt:
                raise WorkflowDefinitionError("Planner: prompt is empty; tell the planner its task")
        elif not callable(prompt):
            raise WorkflowDefinitionError(
                "Planner: prompt must be a string or a function of the LoopContext, got"
                f" {type(prompt).__name__}"
            )
        self.prompt = prompt
        # The planner's step of the planner workflow validates model, tools, system,
        # parameters and max_turns the way any agent step does.
        self.step = agent(
            "plan",
            model=model,
            prompt=_planner_prompt,
            tools=tools,
            system=system,
            parameters=parameters,
            max_turns=max_turns,
            retry=retry,
        )
        self.workflow = Workflow(
            PLANNER_WORKFLOW_ID,
            steps=[self.step, task("decision", _read_decision)],
        )

    def render(self, context: LoopContext) -> str:
        """The prompt the planner is given for ``context``."""
        if isinstance(self.prompt, str):
            body = orjson.dumps(context.to_json(), option=orjson.OPT_INDENT_2).decode()
            return f"{self.prompt}\n\nThe loop so far (JSON):\n{body}"
        text = self.prompt(context)
        if not isinstance(text, str) or not text:
            raise WorkflowDefinitionError(
                f"Planner: the prompt function returned {type(text).__name__}, not a non-empty"
                " string"
            )
        return text

    def manifest(
        self, context: LoopContext, workflow: Workflow, *, settings: bool = True
    ) -> tuple[dict[str, JSONValue], str]:
        """The cycle's planner manifest and its hash: what a resume compares.

        ``settings=False`` leaves the model's request settings out, as a cycle started
        before they were pinned recorded it (its planner's session is checked for them
        when it resumes, if it recorded them).
        """
        step = self.step
        session, _ = compute_manifest(
            step.model,
            tuple(step.tools.values()),
            step.system,
            step.parameters,
            step.max_turns,
            prompt=self.render(context),
        )
        if not settings:
            session.pop(SETTINGS_KEY, None)
        manifest: dict[str, JSONValue] = {
            "planner": session,
            "planner_workflow_ir_hash": self.workflow.ir_hash,
            "workflow_id": workflow.id,
            "workflow_ir_hash": workflow.ir_hash,
            "outer_loop_context_hash": context.context_hash,
        }
        return manifest, hashlib.sha256(canonical_json(manifest)).hexdigest()


def _pins_settings(manifest: Mapping[str, JSONValue]) -> bool:
    """Whether a recorded planner manifest holds the planner model's request settings."""
    session = manifest.get("planner")
    return not isinstance(session, Mapping) or SETTINGS_KEY in session


def _planner_changes(old: Mapping[str, JSONValue], new: Mapping[str, JSONValue]) -> list[str]:
    """What differs between two planner manifests, in words."""
    old_session, new_session = old.get("planner"), new.get("planner")
    changes: list[str] = []
    if isinstance(old_session, Mapping) and isinstance(new_session, Mapping):
        changes += [f"planner: {c}" for c in manifest_changes(old_session, new_session)]
    if old.get("workflow_id") != new.get("workflow_id"):
        changes.append(
            f"workflow changed from {old.get('workflow_id')!r} to {new.get('workflow_id')!r}"
        )
    elif old.get("workflow_ir_hash") != new.get("workflow_ir_hash"):
        changes.append(f"workflow {new.get('workflow_id')!r} changed (its IR hash differs)")
    if old.get("outer_loop_context_hash") != new.get("outer_loop_context_hash"):
        changes.append("loop context changed")
    return changes or ["the planner manifest changed"]


def _planner_prompt(ctx: StepContext) -> str:
    prompt: str = ctx.input["prompt"]
    return prompt


def _read_decision(ctx: StepContext) -> dict[str, JSONValue]:
    """The planner's answer as a :class:`PlannerDecision` (the ``decision`` step of its run)."""
    answer = ctx.outputs["plan"]
    text = answer.strip() if isinstance(answer, str) else ""
    if text.startswith("```"):
        text = text.strip("`").removeprefix("json").strip()
    how = (
        'have it answer with JSON such as {"done": false, "input": {...}, "reason": "..."}'
        ' or {"done": true}'
    )
    try:
        # orjson, not pydantic's parser: that one reads NaN, Infinity and 1e400, which the
        # input would record as null.
        data = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise PlannerAnswerError(f"the planner's answer is not JSON ({exc}); {how}") from exc
    if has_long_digit_run(text.encode()):
        # orjson reads an integer past 64 bits as a float: another value than the answer's.
        problem = find_problem(json.loads(text), "the planner's answer", 0)
        if problem is not None:
            raise PlannerAnswerError(f"{problem}; {how}")
    try:
        # Strict: "yes" is no answer to whether the loop is done.
        decision = PlannerDecision.model_validate(data, strict=True)
    except ValidationError as exc:
        problems = "; ".join(err["msg"] for err in exc.errors(include_url=False))
        raise PlannerAnswerError(
            f"the planner's answer is not a decision ({problems}); have it answer with JSON"
            ' such as {"done": false, "input": {...}, "reason": "..."} or {"done": true}'
        ) from exc
    return decision.model_dump(mode="json")


@dataclass(frozen=True)
class OuterLoopResult:
    """How a loop ended: its reason, its cycles, what it cost."""

    outer_loop_id: str
    reason: OuterLoopEndReason
    cycles: tuple[LoopCycle, ...]
    totals: UsageTotals
    """Every planner run and cycle run of the loop with their sub-runs, summed."""
    last_output: Any
    """The output of the last cycle whose run completed, or None."""
    resumed: bool


def planner_run_id(outer_loop_id: str, cycle: int) -> str:
    """The run id of cycle ``cycle``'s planner."""
    return f"{outer_loop_id}.cycle-{cycle}.plan"


def cycle_run_id(outer_loop_id: str, cycle: int) -> str:
    """The run id of cycle ``cycle``'s run of the loop's workflow."""
    return f"{outer_loop_id}.cycle-{cycle}"


def loop_lease_id(outer_loop_id: str) -> str:
    """The lease key of the outer loop ``outer_loop_id`` (spelled as a run id), held by its
    driver (``little unlock OUTER_LOOP_ID`` shows and takes it)."""
    # Spelled as a run id, in a namespace no cycle run can take (a cycle is ``.cycle-N``).
    digest = hashlib.sha256(f"outer-loop\x00{outer_loop_id}".encode()).hexdigest()
    return f"loop-{digest[:40]}"


def validate_outer_loop_id(outer_loop_id: object) -> str:
    """``outer_loop_id`` if it is a valid run id of at most 100 characters."""
    value = validate_run_id(outer_loop_id)
    if len(value) > MAX_OUTER_LOOP_ID:
        raise InvalidRunIdError(
            f"outer loop id {value[:40]!r}... is {len(value)} characters long; at most"
            f" {MAX_OUTER_LOOP_ID} leave room for its cycles' run ids: choose a shorter one"
        )
    return value


def _run_fold_status(world: World, run_id: str) -> tuple[str | None, Any]:
    """A run's recorded status and output, or ``(None, None)`` when it never started."""
    recorder = RunRecorder.load(world, run_id)
    if recorder is None:
        return None, None
    fold = recorder.fold
    output = (
        read_output(world, fold.output, fold.output_ref) if fold.status == "completed" else None
    )
    return fold.status, output


def _tree_totals(world: World, run_ids: Sequence[str]) -> UsageTotals:
    return sum_usage([run_tree_totals(world, r) for r in run_ids if world.run_exists(r)])


def _cycle_runs(cycle: LoopCycle) -> tuple[str, ...]:
    return (cycle.started.planner_run_id, cycle.started.run_id)


def loop_totals(world: World, loop: OuterLoop, *, ended_only: bool = False) -> UsageTotals:
    """The tokens, dollars and calls of the loop's planner runs and cycle runs, with sub-runs."""
    cycles = [c for c in loop.cycles.values() if c.ended or not ended_only]
    return _tree_totals(world, [r for c in cycles for r in _cycle_runs(c)])


def _context(world: World, loop: OuterLoop, cycle: int) -> LoopContext:
    """The context of cycle ``cycle``'s planner: the outcomes of the cycles before it."""
    assert loop.started is not None
    outcomes = []
    for number, c in sorted(loop.cycles.items()):
        if number >= cycle or c.completed is None:
            continue
        run_status, output = _run_fold_status(world, c.completed.run_id)
        totals = run_tree_totals(world, c.completed.run_id)
        outcomes.append(
            CycleOutcome(
                cycle=number,
                run_id=c.completed.run_id,
                # A failed cycle whose run timed out or was cancelled says which.
                status=run_status if run_status in _STOPPED else c.completed.status,
                output=output,
                planner_reason=c.planned.reason if c.planned is not None else "",
                cost_usd=totals.cost_usd_exact,
                unpriced_calls=totals.unpriced_calls,
            )
        )
    return LoopContext(
        outer_loop_id=loop.started.outer_loop_id,
        cycle=cycle,
        input=loop.started.input,
        cycles=tuple(outcomes),
    )


def _recorded_context(given: object) -> LoopContext | None:
    """The :class:`LoopContext` whose JSON a planner run's input holds (``given["context"]``),
    or None when it holds none that reads as one."""
    data = given.get("context") if isinstance(given, Mapping) else None
    if not isinstance(data, Mapping):
        return None
    try:
        outcomes = []
        for c in data["cycles"]:
            cost = c["cost_usd"]
            outcomes.append(
                CycleOutcome(
                    cycle=c["cycle"],
                    run_id=c["run_id"],
                    status=c["status"],
                    output=c["output"],
                    planner_reason=c["planner_reason"],
                    cost_usd=None if cost is None else Decimal(cost),
                    unpriced_calls=c["unpriced_calls"],
                )
            )
        context = LoopContext(
            outer_loop_id=data["outer_loop_id"],
            cycle=data["cycle"],
            input=data["input"],
            cycles=tuple(outcomes),
        )
    except (KeyError, TypeError, ArithmeticError):
        return None
    # Exactly what the planner was given, or not that context at all.
    return context if context.to_json() == data else None


def loop_view(world: World, loop: OuterLoop) -> dict[str, JSONValue]:
    """The manifest view of ``loop``: ``outer-loops/<id>.json``, and ``little replay --loop``.

    Folded from the aggregate (and, for ``totals``, from the logs of the
    cycles that ended, which no longer change), so it is a function of the
    loop's version.
    """
    _check_world(world, "loop_view")
    if not isinstance(loop, OuterLoop):
        raise OuterLoopRequestError(
            f"loop_view needs an OuterLoop (from load_outer_loop), got {type(loop).__name__}"
        )
    started = loop.started
    if started is None:
        raise RunStateError(f"outer loop stream {loop.id} has no outer_loop.started event")
    totals = loop_totals(world, loop, ended_only=True)
    cycles: list[JSONValue] = []
    for number, c in sorted(loop.cycles.items()):
        s = c.started
        cycles.append(
            {
                "cycle": number,
                "status": c.status,
                "planner_run_id": s.planner_run_id,
                "run_id": s.run_id,
                # What the cycle goes on under: a resume under changed code may re-pin it.
                "planner_manifest_hash": c.pinned[1],
                "started_planner_manifest_hash": s.planner_manifest_hash,
                "outer_loop_context_hash": s.outer_loop_context_hash,
                "decision": (
                    None
                    if c.planned is None
                    else {"done": c.planned.done, "reason": c.planned.reason}
                ),
                "abandoned": (
                    None
                    if c.abandoned is None
                    else {
                        "old_manifest_hash": c.abandoned.old_manifest_hash,
                        "new_manifest_hash": c.abandoned.new_manifest_hash,
                        "changes": list(c.abandoned.changes),
                    }
                ),
            }
        )
    return {
        "outer_loop_id": started.outer_loop_id,
        "workflow_id": started.workflow_id,
        "version": loop.version,
        "status": "running" if loop.completed is None else "completed",
        "reason": None if loop.completed is None else loop.completed.reason,
        "max_cycles": started.max_cycles,
        "budget_usd": None if started.budget_usd is None else str(started.budget_usd),
        "on_cycle_failure": started.on_cycle_failure,
        "cycles_ended": loop.cycles_ended,
        "pending_cycle_run_id": loop.pending_cycle_run_id,
        "cycles": cycles,
        "totals": totals.model_dump(mode="json"),
    }


def encode_view(view: Mapping[str, JSONValue]) -> bytes:
    """The bytes of a manifest view file."""
    return orjson.dumps(view, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n"


def list_outer_loops(world: World) -> tuple[OuterLoop, ...]:
    """Every outer loop of ``world``, in the order they started."""
    _check_world(world, "list_outer_loops")
    return tuple(world.outer_loops())


def load_outer_loop(world: World, outer_loop_id: str) -> OuterLoop:
    """The outer loop ``outer_loop_id`` as its log tells it.

    Raises :class:`~little_es.errors.OuterLoopNotFoundError` when the world has none.
    """
    _check_world(world, "load_outer_loop")
    loop = world.load_outer_loop(validate_outer_loop_id(outer_loop_id))
    if loop is None or loop.started is None:
        raise OuterLoopNotFoundError(outer_loop_id, world.name)
    return loop


@dataclass(frozen=True)
class CycleCost:
    """What one cycle spent: its planner run and its run, each with its sub-runs."""

    planner: UsageTotals
    run: UsageTotals

    @property
    def total(self) -> UsageTotals:
        """Both, summed."""
        return sum_usage([self.planner, self.run])


def cycle_cost(world: World, cycle: LoopCycle) -> CycleCost:
    """The tokens and dollars of ``cycle`` so far, folded from its runs' logs."""
    return CycleCost(
        planner=_tree_totals(world, [cycle.started.planner_run_id]),
        run=_tree_totals(world, [cycle.started.run_id]),
    )


class _Driver:
    """Drives one loop in this process, under its lease."""

    def __init__(
        self,
        world: World,
        loop: OuterLoop,
        planner: Planner,
        workflow: Workflow,
        engine: RunEngine,
    ) -> None:
        self.world = world
        self.loop = loop
        self.planner = planner
        self.workflow = workflow
        self.engine = engine
        started = loop.started
        assert started is not None
        self.started = started
        self.log = _log.bind(outer_loop_id=started.outer_loop_id)

    def save(self) -> None:
        # A driver that lost the loop's lease appends nothing more: while an engine ran
        # a cycle's run elsewhere (Temporal), no run's append of this process checked it.
        check_leases()
        self.world.save(self.loop)
        self.world.backend.write_outer_loop_view(
            self.started.outer_loop_id, encode_view(loop_view(self.world, self.loop))
        )

    def check_view(self) -> None:
        """Rewrite the view file when it disagrees with the aggregate (a crash, an edit)."""
        loop_id = self.started.outer_loop_id
        stored = self.world.backend.read_outer_loop_view(loop_id)
        if stored is None and not self.world.backend.keeps_outer_loop_views:
            return
        expected = encode_view(loop_view(self.world, self.loop))
        if stored != expected:
            self.log.warning(
                "outer loop manifest view disagreed with the log; rewritten from the log",
                had_view=stored is not None,
                version=self.loop.version,
            )
            self.world.backend.write_outer_loop_view(loop_id, expected)

    def end(self, reason: OuterLoopEndReason) -> None:
        self.loop.trigger(OuterLoopCompleted, cycles=self.loop.cycles_ended, reason=reason)

    def stop_before_new_cycle(self) -> OuterLoopEndReason | None:
        if self.loop.cycles_ended >= self.started.max_cycles:
            return "max_cycles"
        budget = self.started.budget_usd
        if budget is not None:
            spent = loop_totals(self.world, self.loop).cost_usd_exact
            if spent is not None and spent >= budget:
                return "budget"
        return None

    def start_cycle(self) -> LoopCycle:
        number = self.loop.next_cycle
        loop_id = self.started.outer_loop_id
        context = _context(self.world, self.loop, number)
        manifest, manifest_hash = self.planner.manifest(context, self.workflow)
        self.loop.trigger(
            OuterLoopCycleStarted,
            cycle=number,
            planner_run_id=planner_run_id(loop_id, number),
            run_id=cycle_run_id(loop_id, number),
            planner_manifest=manifest,
            planner_manifest_hash=manifest_hash,
            outer_loop_context_hash=context.context_hash,
        )
        self.save()
        self.log.info("outer loop cycle started", cycle=number)
        return self.loop.cycles[number]

    def planner_context(self, cycle: LoopCycle) -> LoopContext:
        """The context ``cycle``'s planner was given, as its run's input records it; computed
        now when that run has not started.

        Not computed again once given: its dollars are priced when read, so a price
        recorded since (``set_model_price``) would change it, and the prompt rendered from
        it, though no code changed.
        """
        recorder = RunRecorder.load(self.world, cycle.started.planner_run_id)
        if recorder is not None:
            fold = recorder.fold
            recorded = _recorded_context(read_output(self.world, fold.input, fold.input_ref))
            if recorded is not None:
                return recorded
        return _context(self.world, self.loop, cycle.number)

    def drifted(self, cycle: LoopCycle) -> bool:
        """Abandon ``cycle`` (and return True) when its planner manifest is no longer the code's."""
        context = self.planner_context(cycle)
        old = cycle.started
        pinned, pinned_hash = cycle.pinned
        manifest, manifest_hash = self.planner.manifest(
            context, self.workflow, settings=_pins_settings(pinned)
        )
        if manifest_hash == pinned_hash:
            return False
        changes = _planner_changes(pinned, manifest)
        self.loop.trigger(
            OuterLoopCycleAbandoned,
            cycle=cycle.number,
            old_manifest_hash=pinned_hash,
            new_manifest_hash=manifest_hash,
            old_context_hash=old.outer_loop_context_hash,
            new_context_hash=context.context_hash,
            changes=tuple(changes),
        )
        self.save()
        self.log.warning("outer loop cycle abandoned: planner drift", cycle=cycle.number)
        self.cancel_runs(cycle)
        return True

    def cancel_runs(self, cycle: LoopCycle) -> None:
        """Cancel the unfinished runs of the abandoned ``cycle`` (never resumed by accident,
        not listed as running for ever).

        After the loop's own record, which is the truth of it: a process killed in
        between leaves them to the next one (:meth:`drive`).
        """
        for run_id in _cycle_runs(cycle):
            status, _ = _run_fold_status(self.world, run_id)
            if status is not None and status not in (*_FINISHED, *_STOPPED):
                cancel_run(
                    self.world,
                    run_id,
                    reason=f"outer loop cycle {cycle.number} abandoned: its planner drifted",
                    requested_by=f"outer loop {self.started.outer_loop_id}",
                )

    async def finish(
        self, workflow: Workflow, given: Mapping[str, Any] | None, run_id: str
    ) -> tuple[str, Any]:
        """Run (or resume) ``run_id`` to its end; its outcome (``completed`` or ``failed``)
        and output.

        A run that stopped for good (:data:`_STOPPED`) is ``failed``, found before or
        after the engine ran it (which engine raises what for it differs); any other stop
        propagates, and a resume continues. A run at that id of another workflow is not
        the loop's: :class:`~little_es.errors.OuterLoopMismatchError`, nothing recorded.
        """
        recorder = RunRecorder.load(self.world, run_id)
        found = None if recorder is None else recorder.fold.workflow_id
        if found is not None and found != workflow.id:
            raise OuterLoopMismatchError(
                f"outer loop {self.started.outer_loop_id!r}: run {run_id!r}, which the loop"
                f" names for its {'planner' if workflow is self.planner.workflow else 'cycle'},"
                f" is a run of workflow {found!r}, not {workflow.id!r}: it is not the loop's"
                " (a run started under that id by something else), and the loop takes"
                " nothing from it; run the loop under another outer_loop_id"
            )
        status, output = _run_fold_status(self.world, run_id)
        if status in _FINISHED:
            return status, output
        if status not in _STOPPED:
            try:
                return "completed", await self.engine.run(
                    self.world, workflow, given, run_id=run_id
                )
            except (RunFailedError, VisitLimitError):
                return "failed", None
            except Exception:
                if _run_fold_status(self.world, run_id)[0] not in _STOPPED:
                    raise
        self.log.warning("outer loop run stopped for good: its cycle failed", run_id=run_id)
        return "failed", None

    async def plan(self, cycle: LoopCycle) -> None:
        """Run (or resume) the cycle's planner and record its decision (or its failure)."""
        run_id = cycle.started.planner_run_id
        given = None
        if not self.world.run_exists(run_id):
            context = _context(self.world, self.loop, cycle.number)
            given = {"prompt": self.planner.render(context), "context": context.to_json()}
        status, output = await self.finish(self.planner.workflow, given, run_id)
        if status == "failed":
            self.loop.trigger(
                OuterLoopCycleCompleted, cycle=cycle.number, run_id=run_id, status="failed"
            )
            self.end("planner_failed")
            self.save()
            return
        decision = PlannerDecision.model_validate(output)
        # A planner that answered before this process, under other code (drive does not
        # abandon a cycle whose planner already answered): the cycle goes on under this
        # code, and is pinned to it, or the next resume would take that for drift.
        started = cycle.started
        manifest, manifest_hash = self.planner.manifest(
            self.planner_context(cycle),
            self.workflow,
            settings=_pins_settings(started.planner_manifest),
        )
        repinned = manifest_hash != started.planner_manifest_hash
        self.loop.trigger(
            OuterLoopCyclePlanned,
            cycle=cycle.number,
            done=decision.done,
            reason=decision.reason,
            planner_manifest=manifest if repinned else None,
            planner_manifest_hash=manifest_hash if repinned else None,
        )
        if decision.done:
            self.end("planner_done")
        self.save()

    async def run_cycle(self, cycle: LoopCycle) -> None:
        """Run (or resume) the cycle's run and record its outcome."""
        run_id = cycle.started.run_id
        given = None
        if not self.world.run_exists(run_id):
            decision_output = _run_fold_status(self.world, cycle.started.planner_run_id)[1]
            given = PlannerDecision.model_validate(decision_output).input
        status, _ = await self.finish(self.workflow, given, run_id)
        outcome: Literal["completed", "failed"] = "completed" if status == "completed" else "failed"
        self.loop.trigger(
            OuterLoopCycleCompleted, cycle=cycle.number, run_id=run_id, status=outcome
        )
        if outcome == "failed" and self.started.on_cycle_failure == "stop":
            self.end("cycle_failed")
        self.save()
        self.log.info("outer loop cycle ended", cycle=cycle.number, status=outcome)

    def phase_run_id(self, cycle: LoopCycle) -> str:
        """The run the cycle continues with: its planner until it decided, then its run."""
        return cycle.started.planner_run_id if cycle.planned is None else cycle.started.run_id

    async def drive(self) -> None:
        for abandoned in self.loop.cycles.values():
            if abandoned.abandoned is not None:
                self.cancel_runs(abandoned)
        pending = self.loop.pending_cycle
        if pending is not None:
            # Drift is looked for in the cycle this process found pending, unless what
            # it continues with already finished (then nothing of the old plan runs).
            status, _ = _run_fold_status(self.world, self.phase_run_id(pending))
            if status not in (*_FINISHED, *_STOPPED):
                self.drifted(pending)
        while self.loop.completed is None:
            cycle = self.loop.pending_cycle
            if cycle is None:
                reason = self.stop_before_new_cycle()
                if reason is not None:
                    self.end(reason)
                    self.save()
                    break
                cycle = self.start_cycle()
            if cycle.planned is None:
                await self.plan(cycle)
            else:
                await self.run_cycle(cycle)


def _check_world(world: object, what: str) -> None:
    if not isinstance(world, World):
        raise OuterLoopRequestError(
            f"{what} needs a little_es World, got {type(world).__name__}: open one with"
            " open_world(), local_world(path) or memory_world()"
        )


def _check_request(
    planner: object,
    workflow: object,
    max_cycles: object,
    budget_usd: object,
    input: object,
    on_cycle_failure: object,
) -> None:
    if not isinstance(planner, Planner):
        raise OuterLoopRequestError(
            "planner must be a little_es Planner(model=..., prompt=...), got"
            f" {type(planner).__name__}"
        )
    if not isinstance(workflow, Workflow):
        raise OuterLoopRequestError(
            f"workflow must be a little_es Workflow, got {type(workflow).__name__}: build one"
            " with Workflow(id, steps=[...])"
        )
    if max_cycles is not None and (
        isinstance(max_cycles, bool)
        or not isinstance(max_cycles, int)
        or not 1 <= max_cycles < 2**63
    ):
        # Not repr: past 4,300 digits Python refuses to print an int.
        given = (
            f"an integer of {max_cycles.bit_length()} bits"
            if isinstance(max_cycles, int) and max_cycles.bit_length() > 64
            else repr(max_cycles)
        )
        raise OuterLoopRequestError(
            f"max_cycles must be an integer from 1 to 2**63 - 1, got {given}"
        )
    if budget_usd is not None and (
        isinstance(budget_usd, bool)
        or not isinstance(budget_usd, int | float | Decimal)
        or not Decimal(str(budget_usd)).is_finite()
        or Decimal(str(budget_usd)) <= 0
    ):
        raise OuterLoopRequestError(
            f"budget_usd must be a positive number of dollars or None, got {budget_usd!r}"
        )
    if input is not None:
        if not isinstance(input, Mapping):
            raise OuterLoopRequestError(
                f"input must be a mapping (JSON object) or None, got {type(input).__name__}"
            )
        try:
            check_plain_json(dict(input), "input")
        except ValueError as exc:
            raise OuterLoopRequestError(str(exc)) from exc
    if on_cycle_failure is not None and on_cycle_failure not in ("stop", "continue"):
        raise OuterLoopRequestError(
            f"on_cycle_failure must be 'stop' or 'continue', got {on_cycle_failure!r}"
        )


def _open(
    world: World,
    loop_id: str,
    workflow: Workflow,
    max_cycles: int | None,
    budget_usd: Decimal | None,
    input: Mapping[str, Any] | None,
    on_cycle_failure: Literal["stop", "continue"] | None,
) -> tuple[OuterLoop, bool]:
    """The loop's aggregate: loaded and checked against the request, or started."""
    loop = world.load_outer_loop(loop_id)
    if loop is None or loop.started is None:
        if max_cycles is None:
            raise OuterLoopRequestError(
                f"outer loop {loop_id!r} does not exist yet: give max_cycles to start it"
            )
        loop = OuterLoop(loop_id)
        loop.trigger(
            OuterLoopStarted,
            outer_loop_id=loop_id,
            workflow_id=workflow.id,
            max_cycles=max_cycles,
            input=dict(input or {}),
            budget_usd=budget_usd,
            on_cycle_failure=on_cycle_failure or "stop",
        )
        return loop, False
    started = loop.started
    asked: list[tuple[str, object, object]] = [("workflow", workflow.id, started.workflow_id)]
    if max_cycles is not None:
        asked.append(("max_cycles", max_cycles, started.max_cycles))
    if budget_usd is not None:
        asked.append(("budget_usd", budget_usd, started.budget_usd))
    if input is not None:
        # As recorded: a tuple reads back as a list, and is the same input.
        asked.append(("input", orjson.loads(orjson.dumps(dict(input))), started.input))
    if on_cycle_failure is not None:
        asked.append(("on_cycle_failure", on_cycle_failure, started.on_cycle_failure))
    for name, given, recorded in asked:
        if given != recorded:
            raise OuterLoopMismatchError(
                f"outer loop {loop_id!r} was started with {name}={recorded!r}, not {given!r}:"
                f" resume it with the recorded value (or leave {name} out), or start another"
                " loop with a new outer_loop_id"
            )
    return loop, True


async def run_outer_loop(
    world: World,
    *,
    planner: Planner,
    workflow: Workflow,
    outer_loop_id: str,
    max_cycles: int | None = None,
    budget_usd: float | Decimal | None = None,
    input: Mapping[str, Any] | None = None,
    on_cycle_failure: Literal["stop", "continue"] | None = None,
    engine: RunEngine | None = None,
) -> OuterLoopResult:
    """Run the outer loop ``outer_loop_id`` to its end, or resume it where its log stops.

    Each cycle the ``planner`` is given the loop's ``input`` and every earlier
    cycle's outcome (status, output, cost) and answers a
    :class:`PlannerDecision`; a run of ``workflow`` then executes the input it
    chose. The loop ends, recorded in ``outer_loop.completed`` with its reason,
    when the planner says done (``planner_done``), after ``max_cycles`` cycles
    (``max_cycles``), when the cycles and planners have spent ``budget_usd``
    (``budget``: checked before each cycle starts, on the priced calls only),
    when a cycle's run fails and ``on_cycle_failure`` is ``"stop"`` (the
    default; ``"continue"`` lets the planner see the failure:
    ``cycle_failed``), or when the planner's run fails, as it does when its
    answer is not a decision (``planner_failed``).

    A resume takes the recorded settings (give them again only unchanged:
    :class:`~little_es.errors.OuterLoopMismatchError` otherwise). A pending
    cycle whose planner manifest changed is abandoned and a fresh one starts.
    Raises :class:`~little_es.errors.ConcurrentRunError` when another process
    drives the loop. A planner or cycle run that stopped for good (cancelled,
    timed out waiting for a signal, out of its own budget: a resume of it would
    stop the same way) is a failed cycle, and the planner sees the run's status;
    what stops a run otherwise (an integrity refusal, a wait for a signal)
    propagates, and a resume continues.

    ``engine`` runs each cycle's planner run and cycle run: :class:`LocalEngine`
    (the default, in this process) or ``little_es_temporal.TemporalEngine``
    (each a Temporal workflow whose id is the run id). The loop itself, its
    aggregate and its manifest view stay with the caller, so a loop started on
    one engine resumes on the other. A planner or workflow with a step or tool
    that the engine lacks is refused before anything is recorded
    (:class:`~little_es.errors.EngineUnsupportedError`).
    """
    _check_world(world, "run_outer_loop")
    _check_request(planner, workflow, max_cycles, budget_usd, input, on_cycle_failure)
    if engine is None:
        engine = LocalEngine()
    elif not isinstance(engine, RunEngine):
        raise OuterLoopRequestError(
            f"engine must be a little_es RunEngine (LocalEngine(), or"
            f" little_es_temporal.TemporalEngine(client, ...)), got {type(engine).__name__}"
        )
    check_engine(planner.workflow, engine.name)
    check_engine(workflow, engine.name)
    loop_id = validate_outer_loop_id(outer_loop_id)
    budget = None if budget_usd is None else Decimal(str(budget_usd))
    with contextlib.ExitStack() as held:
        try:
            held.enter_context(
                world.run_lease(loop_lease_id(loop_id), what=f"outer loop {loop_id!r}")
            )
        except ConcurrentRunError as exc:
            raise ConcurrentRunError(
                f"outer loop {loop_id!r} is being driven by another process: this one stopped"
                " without running anything; wait for it to finish (or kill it) and resume again"
            ) from exc
        loop, resumed = _open(world, loop_id, workflow, max_cycles, budget, input, on_cycle_failure)
        driver = _Driver(world, loop, planner, workflow, engine)
        if resumed:
            driver.check_view()
        else:
            driver.save()
        driver.log.info("outer loop resumed" if resumed else "outer loop started")
        await driver.drive()
    assert loop.completed is not None
    last_output = None
    for c in sorted(loop.cycles.values(), key=lambda c: c.number, reverse=True):
        if c.completed is not None and c.completed.status == "completed":
            last_output = _run_fold_status(world, c.completed.run_id)[1]
            break
    return OuterLoopResult(
        outer_loop_id=loop_id,
        reason=loop.completed.reason,
        cycles=tuple(loop.cycles[n] for n in sorted(loop.cycles)),
        totals=loop_totals(world, loop),
        last_output=last_output,
        resumed=resumed,
    )


def run_outer_loop_sync(
    world: World,
    *,
    planner: Planner,
    workflow: Workflow,
    outer_loop_id: str,
    max_cycles: int | None = None,
    budget_usd: float | Decimal | None = None,
    input: Mapping[str, Any] | None = None,
    on_cycle_failure: Literal["stop", "continue"] | None = None,
    engine: RunEngine | None = None,
) -> OuterLoopResult:
    """:func:`run_outer_loop` for code that is not async (it runs its own event loop)."""
    return asyncio.run(
        run_outer_loop(
            world,
            planner=planner,
            workflow=workflow,
            outer_loop_id=outer_loop_id,
            max_cycles=max_cycles,
            budget_usd=budget_usd,
            input=input,
            on_cycle_failure=on_cycle_failure,
            engine=engine,
        )
    )

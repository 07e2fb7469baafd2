"""The authoring API: build a :class:`Workflow` from steps.

::

    wf = Workflow("triage", version="1", steps=[
        task("fetch", fetch_ticket),
        agent("plan", model=model, tools=[search], prompt=plan_prompt),
        parallel("check", branches=lambda ctx: ctx.outputs["plan"]["files"],
                 step=task("lint", lint_file)),
        decision("review", choose_next, max_visits=3),
        task("publish", publish),
    ])

Steps run in list order unless a decision jumps. Every step function takes one
:class:`~little_es.workflow.context.StepContext` and may be sync or async.

A :class:`Workflow` holds two things: its IR (:attr:`Workflow.ir`, plain data,
hashed into ``RunStarted``) and the live objects the IR only names (functions,
the model, the tools), on the step objects the builders return. Definitions are
checked when they are built and :class:`~little_es.errors.WorkflowDefinitionError`
says what to fix. What a decision returns cannot be checked before it runs (the
function is opaque); the scheduler checks it with
:meth:`Workflow.check_decision_target`.
"""

from __future__ import annotations

import functools
import hashlib
import re
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

from pydantic import BaseModel, ValidationError

from little_es._compact import construct_compact
from little_es.errors import (
    InvalidBranchSetError,
    LittleEsError,
    ToolError,
    UnknownStepError,
    WorkflowDefinitionError,
)
from little_es.harness.model import Model
from little_es.harness.tools import Tool, check_engines, resolve_tools
from little_es.values import Budget
from little_es.waits import check_model, check_timeout, model_ref, schema_digest
from little_es.workflow.context import StepContext
from little_es.workflow.ir import (
    END,
    WORKFLOW_ID_PATTERN,
    WORKFLOW_VERSION_PATTERN,
    AgentSpecIR,
    AgentToolIR,
    RetryPolicy,
    StepIR,
    WaitSpecIR,
    WorkflowIR,
    check_plain_json,
)
from little_es.workflow.paths import BRANCH_KEY_PATTERN, STEP_ID_PATTERN

if TYPE_CHECKING:
    from little_es.world import World

__all__ = [
    "AgentRunner",
    "AgentStep",
    "BranchSet",
    "BranchStep",
    "BranchesFn",
    "DecisionFn",
    "DecisionStep",
    "InputFn",
    "ParallelStep",
    "PromptFn",
    "Step",
    "SubworkflowStep",
    "TaskFn",
    "TaskStep",
    "WaitStep",
    "Workflow",
    "agent",
    "decision",
    "parallel",
    "subworkflow",
    "task",
    "wait_for",
]

_STEP_ID_RE = re.compile(STEP_ID_PATTERN)
_BRANCH_KEY_RE = re.compile(BRANCH_KEY_PATTERN)
_WORKFLOW_ID_RE = re.compile(WORKFLOW_ID_PATTERN)
_WORKFLOW_VERSION_RE = re.compile(WORKFLOW_VERSION_PATTERN)

BranchSet: TypeAlias = Sequence[str | int] | Mapping[str, Any]
"""What a parallel group's ``branches`` function returns (see :meth:`ParallelStep.branch_set`)."""

TaskFn: TypeAlias = Callable[[StepContext], Any]
"""A task function: ``fn(ctx)``, sync or async, returning the step's output."""
DecisionFn: TypeAlias = Callable[[StepContext], str | Awaitable[str]]
"""A decision function: ``fn(ctx)``, sync or async, returning a step id or END."""
PromptFn: TypeAlias = Callable[[StepContext], str | Awaitable[str]]
"""An agent prompt function: ``fn(ctx)``, sync or async, returning the user prompt."""
BranchesFn: TypeAlias = Callable[[StepContext], BranchSet | Awaitable[BranchSet]]
"""A parallel group's ``branches(ctx)``, sync or async, returning its branch set."""
InputFn: TypeAlias = Callable[[StepContext], Mapping[str, Any] | Awaitable[Mapping[str, Any]]]
"""A subworkflow's ``input(ctx)``, sync or async, returning the sub-run's input."""


@dataclass(frozen=True, slots=True)
class TaskStep:
    """A step that calls ``fn(ctx)``; its return value (JSON data) is the step's output."""

    ir: StepIR
    fn: TaskFn
    engines: frozenset[str] | None = None
    """The engines the step can run on (None: every engine). Not part of the IR."""
    run_in_thread: bool = True
    """Whether a sync ``fn`` runs in a worker thread (see :func:`task`). Not part of the IR."""

    @property
    def id(self) -> str:
        """The step id."""
        return self.ir.id


class AgentRunner(Protocol):
    """Runs (or resumes) the harness session of one attempt of an agent step in place of the
    built-in model/tool loop (an integration's own agent, e.g.
    :mod:`little_es.contrib.pydantic_ai`).

    It records every model call and tool call on the session of ``(ctx.run_id, ctx.step_path,
    ctx.attempt)`` write-ahead, answers recorded calls from the log, and pins the same manifest
    the step's ``model``/``tools``/``parameters`` give; it returns the step's output.
    """

    async def __call__(self, world: World, ctx: StepContext, prompt: str) -> Any:
        """Run the attempt with the rendered ``prompt``; return the step's output."""
        ...


@dataclass(frozen=True, slots=True)
class AgentStep:
    """A step that runs a harness session: ``model`` with ``tools``, prompted by ``prompt``.

    ``prompt`` is a string or a function of the context returning one;
    ``tools`` are indexed by name, in the order given.
    """

    ir: StepIR
    model: Model
    prompt: str | PromptFn
    tools: Mapping[str, Tool]
    system: str | None
    max_turns: int
    parameters: Mapping[str, Any]
    budget: Budget | None = None
    """The step's own budget (its model calls, every attempt), besides the run's. Not part of
    the IR or the session manifest: a resume may raise it."""
    runner: AgentRunner | None = None
    """Runs the session instead of the built-in loop (None: the built-in loop). Not part of
    the IR: what it runs is pinned by ``model``, ``tools`` and ``parameters``."""

    @property
    def id(self) -> str:
        """The step id."""
        return self.ir.id


@dataclass(frozen=True, slots=True)
class SubworkflowStep:
    """A step that runs ``workflow`` as a sub-run; its output is the sub-run's result.

    ``input`` computes the sub-run's input from the context; None passes the
    run input through.
    """

    ir: StepIR
    workflow: Workflow
    input: InputFn | None

    @property
    def id(self) -> str:
        """The step id."""
        return self.ir.id


BranchStep: TypeAlias = TaskStep | AgentStep | SubworkflowStep
"""The steps a parallel group can run in each branch."""


@dataclass(frozen=True, slots=True)
class ParallelStep:
    """A group that runs ``step`` once per branch of the set ``branches(ctx)`` computes.

    Its output is a mapping of branch key to that branch's output.
    ``max_concurrency`` (None: no limit) bounds how many branches run at once.
    """

    ir: StepIR
    branches: BranchesFn
    step: BranchStep

    @property
    def id(self) -> str:
        """The step id."""
        return self.ir.id

    @property
    def max_concurrency(self) -> int | None:
        """How many branches may run at once (None: no limit)."""
        return self.ir.max_concurrency

    def branch_set(self, result: object) -> dict[str, Any]:
        """Turn what ``branches(ctx)`` returned into an ordered ``{branch key: branch value}``.

        A list (or other sequence) of strings and ints gives keys ``str(item)``
        with the item itself as value; a mapping gives its keys and values. Keys
        must be unique and match ``[A-Za-z0-9_.-]+``. An empty set is allowed
        (the group then outputs ``{}``). Raises :class:`InvalidBranchSetError`.
        """
        where = f"parallel step {self.id!r}: branches(ctx)"
        pairs: list[tuple[str, Any]] = []
        if isinstance(result, Mapping):
            for key, value in result.items():
                if not isinstance(key, str):
                    raise InvalidBranchSetError(
                        f"{where} returned a mapping with key {key!r} ({type(key).__name__}):"
                        " branch keys must be strings"
                    )
                pairs.append((key, value))
        elif isinstance(result, Sequence) and not isinstance(result, str | bytes):
            for item in result:
                if isinstance(item, bool) or not isinstance(item, str | int):
                    raise InvalidBranchSetError(
                        f"{where} returned a list containing {item!r}"
                        f" ({type(item).__name__}): list items must be strings or ints; return"
                        " a mapping {key: value} to pass other values to the branches"
                    )
                pairs.append((str(item), item))
        else:
            raise InvalidBranchSetError(
                f"{where} returned a {type(result).__name__}: return a list of branch keys"
                " or a mapping {key: value}"
            )
        branch_set: dict[str, Any] = {}
        for key, value in pairs:
            if _BRANCH_KEY_RE.fullmatch(key) is None:
                raise InvalidBranchSetError(
                    f"{where} returned branch key {key!r}: keys may only contain letters,"
                    " digits, '_', '.' and '-' (map other values to such keys)"
                )
            if key in branch_set:
                raise InvalidBranchSetError(f"{where} returned branch key {key!r} twice")
            branch_set[key] = value
        return branch_set


@dataclass(frozen=True, slots=True)
class DecisionStep:
    """A step whose ``fn(ctx)`` returns the id of the step to run next, or :data:`END`.

    Jumping back to an earlier step makes a loop; ``max_visits`` on the steps
    bounds it.
    """

    ir: StepIR
    fn: DecisionFn
    run_in_thread: bool = True
    """Whether a sync ``fn`` runs in a worker thread (see :func:`task`). Not part of the IR."""

    @property
    def id(self) -> str:
        """The step id."""
        return self.ir.id


@dataclass(frozen=True, slots=True)
class WaitStep:
    """A step that waits for signal ``signal`` (a person, another system): the run records
    ``RunWaiting`` and its driver stops; once the signal is sent (``little signal``), the
    next resume continues with the signal's data, validated by ``model``, as the output."""

    ir: StepIR
    model: type[BaseModel]

    @property
    def id(self) -> str:
        """The step id."""
        return self.ir.id

    @property
    def signal(self) -> str:
        """The name of the signal the step waits for."""
        assert self.ir.wait is not None
        return self.ir.wait.signal

    @property
    def timeout_s(self) -> float | None:
        """Seconds from ``RunWaiting`` until the wait times out (None: never)."""
        assert self.ir.wait is not None
        return self.ir.wait.timeout_s


Step: TypeAlias = TaskStep | AgentStep | ParallelStep | DecisionStep | SubworkflowStep | WaitStep
"""Any step a builder returns."""

_STEP_TYPES = (TaskStep, AgentStep, ParallelStep, DecisionStep, SubworkflowStep, WaitStep)


def _callable_ref(fn: Callable[..., Any]) -> str:
    # A partial names its function; a callable object names its class.
    target: Any = fn
    while isinstance(target, functools.partial):
        target = target.func
    qualname = getattr(target, "__qualname__", None)
    if not isinstance(qualname, str):
        qualname = type(target).__qualname__
    module = getattr(target, "__module__", None)
    if not isinstance(module, str):
        module = type(target).__module__
    # One string for every step of the same function: a long workflow is often
    # one function run under many ids.
    return sys.intern(f"{module}:{qualname}")


def _check_id(id: object, what: str = "step") -> str:
    if not isinstance(id, str) or not id:
        raise WorkflowDefinitionError(
            f"a {what} id must be a non-empty string, got {id!r}: name it like 'fetch' or"
            " 'review_2'"
        )
    if _STEP_ID_RE.fullmatch(id) is None:
        raise WorkflowDefinitionError(
            f"{what} id {id!r} is not valid: start with a letter and use only letters, digits,"
            " '_' and '-' ('[', ']', '/' and '@' are step path syntax)"
        )
    return id


def _check_fn(id: str, fn: object, label: str = "fn") -> None:
    if not callable(fn):
        raise WorkflowDefinitionError(
            f"step {id!r}: {label} must be a function (sync or async) taking a StepContext,"
            f" got {type(fn).__name__}"
        )


def _check_run_in_thread(id: str, run_in_thread: object) -> None:
    if not isinstance(run_in_thread, bool):
        raise WorkflowDefinitionError(
            f"step {id!r}: run_in_thread must be True or False, got {run_in_thread!r}"
        )


def _check_max_visits(id: str, max_visits: object) -> int:
    if not isinstance(max_visits, int) or isinstance(max_visits, bool) or max_visits < 1:
        raise WorkflowDefinitionError(
            f"step {id!r}: max_visits must be an integer >= 1 (1 = run once), got {max_visits!r}"
        )
    return max_visits


_NO_RETRY: RetryPolicy = StepIR.model_fields["retry"].default
# The sets of field names given to StepIR, one of each: pydantic gives each instance
# its own, larger than the rest of the step.
_FIELDS_SETS: dict[frozenset[str], set[str]] = {}


def _check_retry(id: str, retry: object) -> RetryPolicy:
    if retry is None:
        # Shared, as the StepIR default is: frozen, and as large as the step itself.
        return _NO_RETRY
    if not isinstance(retry, RetryPolicy):
        raise WorkflowDefinitionError(
            f"step {id!r}: retry must be a RetryPolicy (e.g. RetryPolicy(max_attempts=3)),"
            f" got {type(retry).__name__}"
        )
    return _NO_RETRY if retry == _NO_RETRY else retry


def _step_ir(**fields: Any) -> StepIR:
    # The builders check everything a user can get wrong first; this turns any
    # remaining model error into the exception the authoring API promises.
    try:
        checked = StepIR(**fields)
    except ValidationError as exc:
        raise WorkflowDefinitionError(f"step {fields.get('id')!r}: {exc}") from exc
    given = checked.__pydantic_fields_set__
    shared = _FIELDS_SETS.setdefault(frozenset(given), given)
    # The validated values, in the compact form a workflow of many steps can afford.
    return construct_compact(StepIR, shared, checked.__dict__)


def task(
    id: str,
    fn: TaskFn,
    *,
    retry: RetryPolicy | None = None,
    max_visits: int = 1,
    engines: Sequence[str] | None = None,
    run_in_thread: bool = True,
) -> TaskStep:
    """A step that runs ``fn(ctx)`` (sync or async) and records what it returns.

    ``engines`` (``["local"]``, ``["temporal"]``) declares the only engines it
    can run on: a run on another one is refused at its start.

    A sync ``fn`` runs in a worker thread, so a slow or blocking one does not
    stall the event loop (parallel branches, lease renewal, a Temporal
    activity's heartbeats). The hop costs about 0.1-0.2 ms per step, as much as
    the step's commit: ``run_in_thread=False`` calls a CPU-trivial ``fn`` (a
    few microseconds, no I/O) on the event loop instead. Changing it never
    changes what is recorded, so it is not part of the IR.
    """
    _check_id(id)
    _check_fn(id, fn)
    _check_run_in_thread(id, run_in_thread)
    ir = _step_ir(
        id=id,
        kind="task",
        ref=_callable_ref(fn),
        retry=_check_retry(id, retry),
        max_visits=_check_max_visits(id, max_visits),
    )
    try:
        declared = check_engines(f"step {id!r}", engines)
    except ToolError as exc:
        raise WorkflowDefinitionError(str(exc)) from None
    return TaskStep(ir=ir, fn=fn, engines=declared, run_in_thread=run_in_thread)


def agent(
    id: str,
    *,
    model: Model,
    prompt: str | PromptFn,
    tools: Sequence[Tool | Callable[..., Any]] = (),
    system: str | None = None,
    max_turns: int = 20,
    parameters: Mapping[str, Any] | None = None,
    retry: RetryPolicy | None = None,
    max_visits: int = 1,
    budget: Budget | None = None,
) -> AgentStep:
    """A step that runs a harness session of ``model`` with ``tools``.

    ``model`` is any object with string ``provider`` and ``model_id``
    attributes (see :class:`little_es.harness.model.Model`); ``prompt`` is the
    user prompt, a string or a function of the context (sync or async)
    returning one; ``tools`` are :class:`~little_es.harness.tools.Tool` objects
    or plain functions (wrapped with ``tool(fn)``); ``parameters`` (plain JSON)
    go to every model call; ``max_turns`` bounds the model calls. ``budget``
    limits what this step's model calls may spend (checked before each, as the
    run's budget is; not hashed into the IR, so a resume may raise it).
    """
    _check_id(id)
    provider = getattr(model, "provider", None)
    model_id = getattr(model, "model_id", None)
    if not isinstance(provider, str) or not provider:
        raise WorkflowDefinitionError(
            f"agent step {id!r}: model must have a non-empty string 'provider' attribute (a"
            f" Model such as ScriptedModel or OpenAIChatModel), got {type(model).__name__}"
        )
    if not isinstance(model_id, str) or not model_id:
        raise WorkflowDefinitionError(
            f"agent step {id!r}: model must have a non-empty string 'model_id' attribute, got"
            f" {type(model).__name__}"
        )
    if isinstance(prompt, str):
        if not prompt:
            raise WorkflowDefinitionError(
                f"agent step {id!r}: prompt is empty; give the task to the model"
            )
        prompt_ref = None
    else:
        _check_fn(id, prompt, "prompt (a string or a function of the context)")
        prompt_ref = _callable_ref(prompt)
    if system is not None and not isinstance(system, str):
        raise WorkflowDefinitionError(
            f"agent step {id!r}: system must be a string or None, got {type(system).__name__}"
        )
    if not isinstance(max_turns, int) or isinstance(max_turns, bool) or max_turns < 1:
        raise WorkflowDefinitionError(
            f"agent step {id!r}: max_turns must be an integer >= 1, got {max_turns!r}"
        )
    if parameters is not None and not isinstance(parameters, Mapping):
        raise WorkflowDefinitionError(
            f"agent step {id!r}: parameters must be a mapping such as {{'temperature': 0}},"
            f" got {type(parameters).__name__}"
        )
    params = dict(parameters or {})
    try:
        check_plain_json(params, "parameters")
    except ValueError as exc:
        raise WorkflowDefinitionError(f"agent step {id!r}: {exc}") from exc
    try:
        resolved = resolve_tools(tools)
    except LittleEsError as exc:
        raise WorkflowDefinitionError(f"agent step {id!r}: {exc}") from exc
    spec = AgentSpecIR(
        provider=provider,
        model_id=model_id,
        system_prompt_sha256=(
            None if system is None else hashlib.sha256(system.encode("utf-8")).hexdigest()
        ),
        tools=tuple(
            AgentToolIR(name=n, schema_hash=t.schema_hash, waits=t.waits)
            for n, t in resolved.items()
        ),
        parameters=params,
        max_turns=max_turns,
    )
    ir = _step_ir(
        id=id,
        kind="agent",
        ref=prompt_ref,
        agent=spec,
        retry=_check_retry(id, retry),
        max_visits=_check_max_visits(id, max_visits),
    )
    if budget is not None and not isinstance(budget, Budget):
        raise WorkflowDefinitionError(
            f"agent step {id!r}: budget must be a Budget(usd=..., tokens=..., model_calls=...),"
            f" got {type(budget).__name__}"
        )
    return AgentStep(
        ir=ir,
        model=model,
        prompt=prompt,
        tools=resolved,
        system=system,
        max_turns=max_turns,
        parameters=params,
        budget=budget,
    )


def parallel(
    id: str,
    *,
    branches: BranchesFn,
    step: BranchStep,
    max_concurrency: int | None = None,
    retry: RetryPolicy | None = None,
    max_visits: int = 1,
) -> ParallelStep:
    """A group running ``step`` once per branch of ``branches(ctx)`` (sync or async).

    ``branches`` returns a list of keys or a mapping of key to value (see
    :meth:`ParallelStep.branch_set`). ``step`` is a task, agent or subworkflow
    step; each branch runs it with its own retry policy, and ``retry`` here is
    the group's own: that of ``branches(ctx)``, whose failure is the failure of
    the group's attempt. Loops are bounded by the group's ``max_visits``, so the
    branch step keeps ``max_visits=1``.
    """
    _check_id(id)
    _check_fn(id, branches, "branches")
    if isinstance(step, ParallelStep):
        raise WorkflowDefinitionError(
            f"parallel step {id!r}: its branch step {step.id!r} is itself a parallel group;"
            " nesting is not supported, flatten it or run the inner group in a subworkflow"
        )
    if isinstance(step, DecisionStep):
        raise WorkflowDefinitionError(
            f"parallel step {id!r}: its branch step {step.id!r} is a decision; a branch step"
            " must be a task, agent or subworkflow"
        )
    if not isinstance(step, TaskStep | AgentStep | SubworkflowStep):
        raise WorkflowDefinitionError(
            f"parallel step {id!r}: step must be built with task(), agent() or subworkflow(),"
            f" got {type(step).__name__}"
        )
    if step.ir.max_visits != 1:
        raise WorkflowDefinitionError(
            f"parallel step {id!r}: branch step {step.id!r} has max_visits"
            f" {step.ir.max_visits}; a branch step runs once per group visit, set max_visits"
            " on the parallel group instead"
        )
    if step.id == id:
        raise WorkflowDefinitionError(
            f"parallel step {id!r}: its branch step has the same id; give it another one"
        )
    if max_concurrency is not None and (
        not isinstance(max_concurrency, int)
        or isinstance(max_concurrency, bool)
        or max_concurrency < 1
    ):
        raise WorkflowDefinitionError(
            f"parallel step {id!r}: max_concurrency must be an integer >= 1 or None (no"
            f" limit), got {max_concurrency!r}"
        )
    ir = _step_ir(
        id=id,
        kind="parallel",
        ref=_callable_ref(branches),
        branch_step=step.ir,
        max_concurrency=max_concurrency,
        retry=_check_retry(id, retry),
        max_visits=_check_max_visits(id, max_visits),
    )
    return ParallelStep(ir=ir, branches=branches, step=step)


def decision(
    id: str,
    fn: DecisionFn,
    *,
    max_visits: int = 1,
    retry: RetryPolicy | None = None,
    run_in_thread: bool = True,
) -> DecisionStep:
    """A step whose ``fn(ctx)`` (sync or async) returns the next step's id, or :data:`END`.

    The returned id cannot be checked here (``fn`` is opaque); the scheduler
    checks it when the decision runs (:meth:`Workflow.check_decision_target`).
    ``run_in_thread`` is as for :func:`task`.
    """
    _check_id(id)
    _check_fn(id, fn)
    _check_run_in_thread(id, run_in_thread)
    ir = _step_ir(
        id=id,
        kind="decision",
        ref=_callable_ref(fn),
        retry=_check_retry(id, retry),
        max_visits=_check_max_visits(id, max_visits),
    )
    return DecisionStep(ir=ir, fn=fn, run_in_thread=run_in_thread)


def subworkflow(
    id: str,
    workflow: Workflow,
    *,
    input: InputFn | None = None,
    retry: RetryPolicy | None = None,
    max_visits: int = 1,
) -> SubworkflowStep:
    """A step that runs ``workflow`` as a sub-run and outputs its result.

    ``input`` computes the sub-run's input from the context (sync or async);
    None passes the run input through. The IR records the child's id and
    version; the child's own hash is checked on the sub-run.
    """
    _check_id(id)
    if not isinstance(workflow, Workflow):
        raise WorkflowDefinitionError(
            f"subworkflow step {id!r}: workflow must be a Workflow, got {type(workflow).__name__}"
        )
    if input is not None:
        _check_fn(id, input, "input (a function of the context returning the sub-run input)")
    ir = _step_ir(
        id=id,
        kind="subworkflow",
        ref=None if input is None else _callable_ref(input),
        workflow_id=workflow.id,
        workflow_version=workflow.version,
        retry=_check_retry(id, retry),
        max_visits=_check_max_visits(id, max_visits),
    )
    return SubworkflowStep(ir=ir, workflow=workflow, input=input)


def wait_for(
    id: str,
    *,
    signal: str | None = None,
    model: type[BaseModel],
    timeout: float | Any | None = None,
    max_visits: int = 1,
) -> WaitStep:
    """A step that waits for signal ``signal`` (default: the step id) whose data validates
    against the pydantic ``model``; its output is that data (as JSON).

    The run records ``RunWaiting`` (the signal, the model's ``module:qualname`` and schema
    digest, the deadline ``timeout`` seconds or ``timedelta`` from then) and stops with
    :class:`~little_es.errors.RunWaitingError`; the process may exit. ``world.signal`` /
    ``little signal RUN_ID NAME --data JSON`` sends the signal; the next ``run_workflow`` /
    ``little resume`` continues from here. A deadline that passed first records
    ``WaitTimedOut`` (status ``timed_out``). On Temporal it is a workflow wait on the
    Temporal signal ``little_es.signal`` (``little signal --temporal``).
    """
    _check_id(id)
    name = id if signal is None else signal
    if not isinstance(name, str) or re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", name) is None:
        raise WorkflowDefinitionError(
            f"wait step {id!r}: signal {name!r} is not a usable name: 1-64 letters, digits,"
            " '_', '.' and '-', starting with a letter or digit"
        )
    checked = check_model(f"wait step {id!r}", model)
    spec = WaitSpecIR(
        kind="step",
        signal=name,
        model_ref=model_ref(checked),
        schema_digest=schema_digest(checked),
        timeout_s=check_timeout(f"wait step {id!r}", timeout),
    )
    ir = _step_ir(
        id=id,
        kind="wait",
        ref=spec.model_ref,
        wait=spec,
        max_visits=_check_max_visits(id, max_visits),
    )
    return WaitStep(ir=ir, model=checked)


class Workflow:
    """A workflow definition: an id, a version and steps run in order unless a decision jumps.

    Build the steps with :func:`task`, :func:`agent`, :func:`parallel`,
    :func:`decision` and :func:`subworkflow`. Step ids must be unique in the
    workflow, branch steps included. Raises
    :class:`~little_es.errors.WorkflowDefinitionError` for an invalid definition.
    """

    __slots__ = ("_by_id", "_id", "_index", "_ir", "_ir_hash", "_steps", "_version")

    def __init__(self, id: str, *, version: str = "1", steps: Sequence[Step]) -> None:
        if not isinstance(id, str) or _WORKFLOW_ID_RE.fullmatch(id) is None:
            raise WorkflowDefinitionError(
                f"workflow id {id!r} is not valid: use 1-128 letters, digits, '_', '.' and '-',"
                " starting with a letter or digit"
            )
        if not isinstance(version, str) or _WORKFLOW_VERSION_RE.fullmatch(version) is None:
            raise WorkflowDefinitionError(
                f"workflow {id!r}: version {version!r} is not valid: use a string of 1-64"
                " letters, digits, '_', '.', '+' and '-' such as '1' or '2.0.1'"
            )
        if isinstance(steps, str | bytes) or not isinstance(steps, Sequence):
            raise WorkflowDefinitionError(
                f"workflow {id!r}: steps must be a list of steps, got {type(steps).__name__}"
            )
        if not steps:
            raise WorkflowDefinitionError(
                f"workflow {id!r} has no steps: pass steps=[task(...), ...]"
            )
        by_id: dict[str, Step] = {}
        index: dict[str, int] = {}
        for position, step in enumerate(steps):
            if not isinstance(step, _STEP_TYPES):
                raise WorkflowDefinitionError(
                    f"workflow {id!r}: steps[{position}] is a {type(step).__name__}; build"
                    " steps with task(), agent(), parallel(), decision(), subworkflow() or"
                    " wait_for()"
                )
            nested: tuple[Step, ...] = (
                (step, step.step) if isinstance(step, ParallelStep) else (step,)
            )
            for s in nested:
                if s.id in by_id:
                    raise WorkflowDefinitionError(
                        f"workflow {id!r}: step id {s.id!r} is used twice (branch steps"
                        " included); step ids must be unique, rename one"
                    )
                by_id[s.id] = s
            index[step.id] = position
        self._id = id
        self._version = version
        self._steps: tuple[Step, ...] = tuple(steps)
        self._by_id = by_id
        self._index = index
        try:
            self._ir = WorkflowIR(id=id, version=version, steps=tuple(s.ir for s in steps))
        except ValidationError as exc:
            raise WorkflowDefinitionError(f"workflow {id!r}: {exc}") from exc
        self._ir_hash: str | None = None

    @property
    def id(self) -> str:
        """The workflow id."""
        return self._id

    @property
    def version(self) -> str:
        """The workflow version."""
        return self._version

    @property
    def steps(self) -> tuple[Step, ...]:
        """The top-level steps, in order (branch steps hang off their parallel group)."""
        return self._steps

    @property
    def ir(self) -> WorkflowIR:
        """The definition as plain data."""
        return self._ir

    @property
    def ir_hash(self) -> str:
        """The IR's stable hash, recorded in ``RunStarted``."""
        # Hashed once: a start or resume asks for it several times, and the IR of a
        # 1,000-step workflow takes milliseconds to serialise.
        if self._ir_hash is None:
            self._ir_hash = self._ir.ir_hash
        return self._ir_hash

    def step(self, step_id: str) -> Step:
        """The step ``step_id``, top-level or branch step; raises :class:`UnknownStepError`."""
        found = self._by_id.get(step_id)
        if found is None:
            raise UnknownStepError(
                f"workflow {self._id!r} has no step {step_id!r}; its steps are"
                f" {sorted(self._by_id)}"
            )
        return found

    def step_or_none(self, step_id: str) -> Step | None:
        """The step ``step_id``, top-level or branch step, or None."""
        return self._by_id.get(step_id)

    def index_of(self, step_id: str) -> int:
        """The position of top-level step ``step_id`` in the step list (0-based)."""
        position = self._index.get(step_id)
        if position is None:
            self.step(step_id)  # raises for an unknown id
            raise UnknownStepError(
                f"workflow {self._id!r}: {step_id!r} is a branch step of a parallel group, not"
                " a top-level step; use the group's id"
            )
        return position

    def next_step_id(self, step_id: str) -> str:
        """The top-level step after ``step_id`` in list order, or :data:`END` after the last."""
        position = self.index_of(step_id)
        if position + 1 == len(self._steps):
            return END
        return self._steps[position + 1].id

    def check_decision_target(self, decision_id: str, target: object) -> str:
        """Return ``target`` if decision ``decision_id`` may jump there: END or a top-level step id.

        Raises :class:`UnknownStepError` naming the decision otherwise.
        """
        step = self.step(decision_id)
        if not isinstance(step, DecisionStep):
            raise WorkflowDefinitionError(
                f"workflow {self._id!r}: step {decision_id!r} is a {step.ir.kind}, not a decision"
            )
        if target == END:
            return END
        if not isinstance(target, str) or target not in self._index:
            raise UnknownStepError(
                f"decision {decision_id!r} of workflow {self._id!r} returned {target!r}: return"
                f" the id of a top-level step ({', '.join(self._index)}) or END"
            )
        return target

    def __repr__(self) -> str:
        return f"Workflow({self._id!r}, version={self._version!r}, steps={list(self._index)})"

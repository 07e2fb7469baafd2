"""The workflow IR: a workflow definition as plain, JSON-serialisable data.

Every engine (the local scheduler, the Temporal adapter) interprets the same
IR, and its hash is recorded in ``RunStarted`` so a resume can refuse to carry
on under a changed definition. The IR holds no callables: the functions live
in :class:`little_es.workflow.authoring.Workflow`, and the IR only names them
(``ref``, ``module:qualname``).

The hash is sha256 of canonical JSON (orjson, sorted keys) of the model dump
with default-valued fields left out. Leaving defaults out means that a later
version of little_es adding an IR field (with a default) does not change the
hash of workflows that do not use it, so their runs stay resumable.
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from little_es._compact import ordinary_copy, prepare_compact
from little_es._strict import JSON_INT_RANGE
from little_es.workflow.paths import STEP_ID_PATTERN

__all__ = [
    "BRANCH_STEP_KINDS",
    "END",
    "WORKFLOW_ID_PATTERN",
    "WORKFLOW_VERSION_PATTERN",
    "AgentSpecIR",
    "AgentToolIR",
    "RetryPolicy",
    "StepIR",
    "StepKind",
    "WaitSpecIR",
    "WorkflowIR",
    "canonical_json",
    "check_plain_json",
]

END = "__end__"
"""What a decision returns to end the run (it can never be a step id: ids start with a letter)."""

StepKind = Literal["task", "agent", "parallel", "decision", "subworkflow", "wait"]
"""The six kinds of step (``wait``: :func:`~little_es.workflow.authoring.wait_for`)."""

BRANCH_STEP_KINDS: frozenset[str] = frozenset({"task", "agent", "subworkflow"})
"""The kinds a parallel group's branch step may have (no nested parallel, no decision)."""

WORKFLOW_ID_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}"
"""What a workflow id may look like."""

WORKFLOW_VERSION_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}"
"""What a workflow version may look like (``1``, ``2.0.1``, ``2024-05-01``, ``v3``)."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


def canonical_json(value: Any) -> bytes:
    """Canonical JSON bytes of plain JSON data: sorted keys, no whitespace (orjson)."""
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


def check_plain_json(value: Any, where: str) -> None:
    """Raise ValueError, naming ``where``, unless ``value`` is plain JSON data.

    Plain JSON: None, bool, int (within ``JSON_INT_RANGE``), finite float, str,
    lists/tuples and dicts with string keys of those.
    """
    # orjson would also accept datetimes, UUIDs, dataclasses, ... and write NaN
    # as null; the IR must round-trip exactly, so only plain JSON is allowed.
    if value is None or isinstance(value, bool | str):
        return
    if isinstance(value, int):
        if JSON_INT_RANGE[0] <= value <= JSON_INT_RANGE[1]:
            return
        raise ValueError(
            f"{where} is an integer of {value.bit_length()} bits, outside the 64-bit range of"
            " JSON values here (-2**63 to 2**64-1): use a string"
        )
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{where} is {value!r}: JSON has no NaN or infinity")
        return
    if isinstance(value, list | tuple):
        for i, item in enumerate(value):
            check_plain_json(item, f"{where}[{i}]")
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise ValueError(f"{where} has a non-string key {key!r}: JSON keys are strings")
            check_plain_json(item, f"{where}[{key!r}]")
        return
    raise ValueError(
        f"{where} is a {type(value).__name__}, which is not plain JSON: use dicts, lists,"
        " strings, numbers, booleans and None"
    )


MAX_BACKOFF_S = 365 * 86400.0
"""The longest wait between two attempts of a step: a year."""


class RetryPolicy(_Frozen):
    """How often a failing step is attempted, and how long to wait between attempts.

    ``max_attempts`` counts the first attempt: 1 (the default) means no retry.
    The wait after failed attempt ``n`` is
    ``initial_backoff_s * backoff_coefficient ** (n - 1)``, capped at
    ``max_backoff_s`` when that is set, and at :data:`MAX_BACKOFF_S` (a year) in
    any case: a longer wait is past what a timer can be set for (Temporal's
    conversion of it failed the workflow task for ever).
    """

    max_attempts: int = Field(default=1, ge=1)
    initial_backoff_s: float = Field(default=0.0, ge=0.0, le=MAX_BACKOFF_S, allow_inf_nan=False)
    backoff_coefficient: float = Field(default=2.0, ge=1.0, allow_inf_nan=False)
    max_backoff_s: float | None = Field(default=None, ge=0.0, le=MAX_BACKOFF_S, allow_inf_nan=False)

    def backoff_for(self, attempt: int) -> float:
        """Seconds to wait after failed attempt ``attempt`` (1-based) before the next one."""
        if not isinstance(attempt, int) or isinstance(attempt, bool) or attempt < 1:
            raise ValueError(f"attempt must be an integer >= 1 (1-based), got {attempt!r}")
        try:
            delay = self.initial_backoff_s * self.backoff_coefficient ** (attempt - 1)
        except OverflowError:
            delay = math.inf
        if self.max_backoff_s is not None:
            delay = min(delay, self.max_backoff_s)
        return min(delay, MAX_BACKOFF_S)


class WaitSpecIR(_Frozen):
    """What a ``wait_for`` step, an ``ask_human`` tool or an approval-gated tool waits for:
    the signal's name, the model its data validates against (``module:qualname``) and the
    digest of that model's JSON schema, and the timeout (None: none)."""

    kind: Literal["step", "ask_human", "approval"]
    signal: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
    model_ref: str = Field(min_length=1)
    schema_digest: str = Field(pattern=r"^[0-9a-f]{64}$")
    timeout_s: float | None = Field(default=None, gt=0, allow_inf_nan=False)


class AgentToolIR(_Frozen):
    """One tool of an agent step: its name and the hash of the spec the model is shown
    (and, for a tool that waits for a person, what it waits for)."""

    name: str = Field(min_length=1)
    schema_hash: str = Field(min_length=1)
    waits: WaitSpecIR | None = None


class AgentSpecIR(_Frozen):
    """The data of an agent step that the definition fixes (not the rendered prompt).

    ``system_prompt_sha256`` is the sha256 hex of the UTF-8 system prompt, or
    None without one. ``tools`` keeps the order the step lists them in, since
    that is the order the model is shown.
    """

    provider: str = Field(min_length=1)
    model_id: str = Field(min_length=1)
    system_prompt_sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    tools: tuple[AgentToolIR, ...] = ()
    parameters: dict[str, Any] = {}
    max_turns: int = Field(default=20, ge=1)

    @field_validator("parameters")
    @classmethod
    def _plain_parameters(cls, value: dict[str, Any]) -> dict[str, Any]:
        check_plain_json(value, "agent parameters")
        return value

    @field_validator("tools")
    @classmethod
    def _unique_tools(cls, value: tuple[AgentToolIR, ...]) -> tuple[AgentToolIR, ...]:
        names = [t.name for t in value]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"tool names must be unique within an agent step: {duplicates}")
        return value


class StepIR(_Frozen):
    """One step of a workflow, as data.

    ``ref`` names the step's code as ``module:qualname``: the task or decision
    function, the parallel group's
    ``branches`` function, the subworkflow's ``input`` function, the agent's
    prompt function. It is informative and part of the hash, so renaming or
    swapping the function changes the hash; it is None where there is no
    function (an agent with a literal prompt, a subworkflow fed the run input).
    A lambda is ``module:<lambda>`` (``module:outer.<locals>.<lambda>`` inside
    a function), so swapping one lambda for another in the same place leaves
    the hash unchanged; so does editing a function's body. A
    ``functools.partial`` is named by its function, a callable object by its
    class.

    Kind-specific fields: ``branch_step`` and ``max_concurrency`` (parallel),
    ``agent`` (agent), ``workflow_id`` and ``workflow_version`` (subworkflow).
    """

    id: str = Field(pattern=f"^{STEP_ID_PATTERN}$")
    kind: StepKind
    ref: str | None = None
    max_visits: int = Field(default=1, ge=1)
    # A shared instance is safe (frozen), and a plain default is what lets
    # exclude_defaults drop it from the hashed dump.
    retry: RetryPolicy = RetryPolicy()
    branch_step: StepIR | None = None
    max_concurrency: int | None = Field(default=None, ge=1)
    agent: AgentSpecIR | None = None
    workflow_id: str | None = Field(default=None, pattern=f"^{WORKFLOW_ID_PATTERN}$")
    workflow_version: str | None = Field(default=None, pattern=f"^{WORKFLOW_VERSION_PATTERN}$")
    wait: WaitSpecIR | None = None

    @model_validator(mode="after")
    def _fields_match_kind(self) -> StepIR:
        where = f"step {self.id!r} ({self.kind})"
        parallel = self.kind == "parallel"
        if parallel != (self.branch_step is not None):
            raise ValueError(f"{where}: branch_step is required for parallel steps only")
        if not parallel and self.max_concurrency is not None:
            raise ValueError(f"{where}: max_concurrency applies to parallel steps only")
        if self.branch_step is not None:
            if self.branch_step.kind not in BRANCH_STEP_KINDS:
                raise ValueError(
                    f"{where}: a branch step must be a task, agent or subworkflow, not a"
                    f" {self.branch_step.kind}"
                )
            if self.branch_step.max_visits != 1:
                raise ValueError(
                    f"{where}: branch step {self.branch_step.id!r} has max_visits"
                    f" {self.branch_step.max_visits}; set max_visits on the group instead"
                )
        if (self.kind == "agent") != (self.agent is not None):
            raise ValueError(f"{where}: agent is required for agent steps only")
        subworkflow = self.kind == "subworkflow"
        if subworkflow != (self.workflow_id is not None) or subworkflow != (
            self.workflow_version is not None
        ):
            raise ValueError(
                f"{where}: workflow_id and workflow_version are required for subworkflow steps only"
            )
        if (self.kind == "wait") != (self.wait is not None):
            raise ValueError(f"{where}: wait is required for wait steps only")
        if self.kind in ("task", "decision", "parallel") and not self.ref:
            raise ValueError(f"{where}: ref (module:qualname of its function) is required")
        return self

    def walk(self) -> tuple[StepIR, ...]:
        """This step followed by its branch step, if it has one."""
        if self.branch_step is None:
            return (self,)
        return (self, self.branch_step)


# A workflow holds one per step (see little_es.workflow.authoring).
prepare_compact(StepIR)


def _ordinary(step: StepIR) -> StepIR:
    copy = ordinary_copy(step)
    if step.branch_step is not None:
        copy.__dict__["branch_step"] = _ordinary(step.branch_step)
    return copy


class WorkflowIR(_Frozen):
    """A whole workflow definition as data; ``ir_hash`` is what ``RunStarted`` records."""

    id: str = Field(pattern=f"^{WORKFLOW_ID_PATTERN}$")
    version: str = Field(pattern=f"^{WORKFLOW_VERSION_PATTERN}$")
    steps: tuple[StepIR, ...] = Field(min_length=1)

    @field_validator("steps")
    @classmethod
    def _unique_ids(cls, steps: tuple[StepIR, ...]) -> tuple[StepIR, ...]:
        # Unique across branch steps too, so an id alone names one step.
        counts = Counter(s.id for top in steps for s in top.walk())
        duplicates = sorted(i for i, n in counts.items() if n > 1)
        if duplicates:
            raise ValueError(f"step ids must be unique in a workflow: {duplicates}")
        return steps

    def canonical_json(self) -> bytes:
        """The bytes the hash is taken of: sorted-key JSON of the dump without defaults."""
        dump = self.model_dump(mode="json", exclude={"steps"}, exclude_defaults=True)
        # The steps are dumped from ordinary copies (little_es._compact): dumped
        # themselves, the compact steps would keep 64 bytes each for as long as the
        # workflow. Same bytes.
        dump["steps"] = [
            _ordinary(step).model_dump(mode="json", exclude_defaults=True) for step in self.steps
        ]
        return canonical_json(dump)

    @property
    def ir_hash(self) -> str:
        """sha256 hex of :meth:`canonical_json`; the same in every process and hash seed."""
        return hashlib.sha256(self.canonical_json()).hexdigest()

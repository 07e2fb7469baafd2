"""The event catalogue: every fact little_es records, as frozen pydantic models.

Each concrete event class has a stable ``wire_name`` (``StepCompleted``,
``harness.model.called``, ...). The wire name is what is stored as the event's
topic, shown by ``little events`` and exported; it does not depend on the
Python module or class name, so code can be moved without rewriting history.

Five kinds of stream (aggregates, see :mod:`little_es.domain`) carry these events:

* ``Run`` - :class:`RunStarted`, :class:`StepStarted`, :class:`StepCompleted`,
  :class:`StepFailed`, :class:`ParallelBranchScheduled`,
  :class:`SubRunReserved`, :class:`RunCompleted`, :class:`RunFailed`,
  :class:`RunCancelled`, :class:`BudgetSet`, :class:`BudgetExceeded`,
  :class:`RunResumed`, :class:`RunWaiting`, :class:`SignalReceived`,
  :class:`WaitTimedOut`, :class:`RunForked`, :class:`WorkflowAdopted`, and
  user-defined subclasses of :class:`RunEvent`.
* ``HarnessSession`` (one per attempt of an agent step) - the ``harness.*``
  events.
* ``OuterLoop`` - the ``outer_loop.*`` events.
* ``PriceBook`` (one per world) - :class:`ModelPriceSet`, the prices recorded
  in the world.
* ``World`` (one per world) - :class:`WorldCreated`, the world's identity.

How an event is stored (:mod:`little_es.codec`): its fields as JSON, each
under its wire key (:data:`WIRE_KEYS`: ``"p"`` for ``step_path``, ``"t"`` for
``timestamp``..., the field's name for the others), the timestamp as
microseconds since the epoch, and without the fields at their defaults. The
reader also takes the field names and ISO timestamps that logs written before
(log format 2) hold, so those read as they were written.

Schema changes never edit stored history. Bump ``class_version`` on the class
and add a static method ``upcast_v{N}_v{N+1}(state: dict) -> None`` that turns
an old stored payload into the next shape; the codec applies them on read.
A stored payload leaves out every field at its default, so changing a field's
default is such a change too: the upcast puts the old default into a payload
that lacks the field.

A user extends the run's domain model by subclassing :class:`RunEvent`::

    class ApprovalRequested(RunEvent):
        wire_name: ClassVar[str] = "ApprovalRequested"
        approver: str

    world.record_run_event("run_42", ApprovalRequested, approver="ops")
"""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from types import MappingProxyType
from typing import Any, ClassVar, Final, Literal, Self
from uuid import UUID

from pydantic import (
    AliasChoices,
    AliasGenerator,
    ConfigDict,
    Field,
    FieldSerializationInfo,
    SerializerFunctionWrapHandler,
    field_serializer,
    field_validator,
    model_validator,
)

from little_es.values import (
    ArtifactRef,
    Budget,
    Checked,
    ErrorInfo,
    JSONValue,
    Message,
    ModelResponse,
    Usage,
)

_BY_WIRE_NAME: dict[str, type[Event]] = {}

WIRE_NAME_MAX_LENGTH = 255
"""The longest wire name: it is every row's topic, and PostgreSQL's unique index on the
topics table refuses one over about 2,700 bytes (255 characters are at most 1,020)."""


def utc_now() -> datetime:
    """The current time, timezone-aware UTC, as events record it."""
    return datetime.now(UTC)


NOT_IN_A_STREAM = UUID(int=0)
"""The ``originator_id`` of an event no stream has placed (see :class:`Event`)."""

WIRE_KEYS: Final[Mapping[str, str]] = MappingProxyType(
    {
        "timestamp": "t",
        "step_path": "p",
        "step_id": "s",
        "visit": "v",
        "attempt": "a",
        "kind": "k",
        "output": "o",
        "next_step": "n",
        "session_id": "i",
        "error": "e",
        "will_retry": "w",
        "turn": "u",
        "call_id": "c",
        "messages": "m",
        "response": "r",
        "result": "x",
        "conversation_hash": "h",
        "implied": "d",
    }
)
"""The key each of these fields is stored under, in every event class (a user's too).

Part of the stored format: a key is never given to another field. The other
fields are stored under their names. A field may not be named like one of
these keys (it would read as the field the key stands for).
"""
_WIRE_NAMES_OF_KEYS = {key: name for name, key in WIRE_KEYS.items()}

WIRE_CONTEXT: Final[Mapping[str, bool]] = MappingProxyType({"little_es.wire": True})
"""The serialisation context under which an event dumps its stored form (the codec's)."""

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def _validation_alias(name: str) -> AliasChoices | str:
    key = WIRE_KEYS.get(name)
    return AliasChoices(name, key) if key is not None else name


def _serialization_alias(name: str) -> str:
    return WIRE_KEYS.get(name, name)


class Event(Checked):
    """Base class of every stored event.

    ``originator_id`` is the stream (aggregate) id, ``originator_version`` the
    event's position in it (1-based, gapless), ``timestamp`` when it was
    recorded. Subclasses that set ``wire_name`` are registered so the codec can
    read them back; a wire name may be registered only once, and is at most
    :data:`WIRE_NAME_MAX_LENGTH` characters with no control character.

    The position is not part of an event's stored payload (the recorder keeps
    it in its own columns): :meth:`little_es.domain.Aggregate.trigger` places a
    new event and the codec places a stored one. Their defaults
    (:data:`NOT_IN_A_STREAM`, version 0) let the codec validate a payload as it
    is stored, straight from its JSON bytes; a placed event never has them.

    ``write_ahead`` marks a record committed before a call is made, which only
    says the call is in flight (``StepStarted``, ``harness.model.called``, ...).
    Losing one to a power cut costs nothing a crash does not: the call runs
    again, as it would anyway without a result. So a commit of nothing but
    write-ahead records is not fsynced; the next commit that holds a result is,
    and makes them durable with it (:mod:`little_es.durability`).

    Numbers are finite (``allow_inf_nan=False``), and a payload is serialised
    with NaN and infinities as the constants JSON does not have
    (``ser_json_inf_nan="constants"``), so the recorder sees one that slipped
    into a JSON value and refuses it instead of storing ``null``
    (:mod:`little_es._strict`).
    """

    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        allow_inf_nan=False,
        ser_json_inf_nan="constants",
        alias_generator=AliasGenerator(
            validation_alias=_validation_alias, serialization_alias=_serialization_alias
        ),
    )

    wire_name: ClassVar[str] = ""
    class_version: ClassVar[int] = 1
    write_ahead: ClassVar[bool] = False

    originator_id: UUID = NOT_IN_A_STREAM
    originator_version: int = Field(default=0, ge=0)
    timestamp: datetime

    @field_validator("timestamp", mode="before")
    @classmethod
    def _timestamp_from_the_wire(cls, value: Any) -> Any:
        # Stored as microseconds since the epoch (pydantic would read an int as seconds).
        if type(value) is int:
            try:
                return _EPOCH + value * _MICROSECOND
            except OverflowError:
                # pydantic names the field for a ValueError only, not for this.
                raise ValueError(
                    f"timestamp {value} (microseconds since 1970) is outside the years 1-9999"
                ) from None
        return value

    @field_serializer("timestamp", mode="wrap")
    def _timestamp_on_the_wire(
        self, value: datetime, handler: SerializerFunctionWrapHandler, info: FieldSerializationInfo
    ) -> Any:
        context = info.context
        if context is WIRE_CONTEXT and value.tzinfo is not None:
            return (value - _EPOCH) // _MICROSECOND
        return handler(value)

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        for field in cls.__pydantic_fields__:
            taken = _WIRE_NAMES_OF_KEYS.get(field)
            if taken is not None and taken in cls.__pydantic_fields__:
                raise TypeError(
                    f"{cls.__qualname__}.{field}: {field!r} is the key {taken!r} is stored"
                    f" under (little_es.events.WIRE_KEYS); give the field another name"
                )
        name = cls.__dict__.get("wire_name")
        if not name:
            return
        _check_wire_name(cls, name)
        existing = _BY_WIRE_NAME.get(name)
        if existing is not None and existing.__qualname__ != cls.__qualname__:
            raise TypeError(
                f"event wire name {name!r} is already used by {existing.__module__}."
                f"{existing.__qualname__}: give {cls.__qualname__} another wire_name"
            )
        _BY_WIRE_NAME[name] = cls


def _check_wire_name(cls: type[Event], name: object) -> None:
    # Refused here, when the class is defined, rather than by one backend at commit: a NUL
    # is stored by SQLite and MariaDB but not PostgreSQL, a lone surrogate by none of them.
    if not isinstance(name, str):
        raise TypeError(f"{cls.__qualname__}.wire_name must be a string, got {type(name).__name__}")
    if len(name) > WIRE_NAME_MAX_LENGTH:
        raise TypeError(
            f"{cls.__qualname__}.wire_name is {len(name)} characters long; at most"
            f" {WIRE_NAME_MAX_LENGTH} are allowed"
        )
    bad = next((c for c in name if unicodedata.category(c) in ("Cc", "Cs")), None)
    if bad is not None:
        raise TypeError(
            f"{cls.__qualname__}.wire_name {name!r} contains {bad!r} (a control character"
            " or a lone surrogate); give it a wire_name of printable characters"
        )


def event_class_for(wire_name: str) -> type[Event] | None:
    """The registered event class for ``wire_name``, or None."""
    return _BY_WIRE_NAME.get(wire_name)


def registered_wire_names() -> tuple[str, ...]:
    """Every registered wire name, sorted."""
    return tuple(sorted(_BY_WIRE_NAME))


# --------------------------------------------------------------------------- Run


StepKind = Literal["task", "agent", "parallel", "decision", "subworkflow", "wait"]


class RunEvent(Event):
    """Base class of events on a ``Run`` stream; subclass it for domain events of your own."""


class StepEvent(RunEvent):
    """Base class of the run events about one step attempt (or a group's branch set).

    ``step_id`` is not stored when it is the ``step_path`` (a top-level step's
    first visit: most steps) and is read back from it; left out when building
    one, it is the path too.
    """

    step_path: str
    step_id: str = ""

    @model_validator(mode="after")
    def _step_id_from_path(self) -> Self:
        if not self.step_id:
            # Frozen: set in place, as validation itself does.
            self.__dict__["step_id"] = self.step_path
        return self


class RunStarted(RunEvent):
    """A run began: which workflow (id, version, IR hash) with which input."""

    wire_name: ClassVar[str] = "RunStarted"

    run_id: str
    workflow_id: str
    workflow_version: str
    ir_hash: str
    input: JSONValue = None
    input_ref: ArtifactRef | None = None
    """Set instead of ``input`` when the input was too large to inline (as outputs are)."""
    parent_run_id: str | None = None
    parent_step_path: str | None = None


class StepStarted(StepEvent):
    """A step attempt is about to run (committed before the step's code runs)."""

    wire_name: ClassVar[str] = "StepStarted"
    write_ahead: ClassVar[bool] = True

    kind: StepKind = "task"
    visit: int = Field(default=1, ge=1)
    attempt: int = Field(default=1, ge=1)
    session_id: UUID | None = None
    """For agent steps: the ``HarnessSession`` stream of this attempt."""


class StepCompleted(StepEvent):
    """A step attempt finished; once committed the step never runs again."""

    wire_name: ClassVar[str] = "StepCompleted"

    visit: int = Field(default=1, ge=1)
    attempt: int = Field(default=1, ge=1)
    output: JSONValue = None
    output_ref: ArtifactRef | None = None
    """Set instead of ``output`` when the output was too large to inline."""
    artifact_refs: tuple[ArtifactRef, ...] = ()
    next_step: str | None = None
    """For decision steps: the id of the step chosen next (or the END marker)."""


class StepFailed(StepEvent):
    """A step attempt failed; ``will_retry`` says whether another attempt follows."""

    wire_name: ClassVar[str] = "StepFailed"

    visit: int = Field(ge=1)
    attempt: int = Field(ge=1)
    error: ErrorInfo
    will_retry: bool


class ParallelBranchScheduled(StepEvent):
    """A parallel group's branch set, resolved from the run's data, before any branch runs."""

    wire_name: ClassVar[str] = "ParallelBranchScheduled"
    write_ahead: ClassVar[bool] = True

    branch_keys: tuple[str, ...]


class SubRunReserved(RunEvent):
    """A sub-run id reserved (and committed) before the sub-run is started."""

    wire_name: ClassVar[str] = "SubRunReserved"
    write_ahead: ClassVar[bool] = True

    step_path: str
    sub_run_id: str
    workflow_id: str
    call_id: str | None = None


class RunCompleted(RunEvent):
    """The run finished; ``output`` is the last step's output (or ``output_ref``)."""

    wire_name: ClassVar[str] = "RunCompleted"

    output: JSONValue = None
    output_ref: ArtifactRef | None = None


class RunFailed(RunEvent):
    """The run stopped on a step whose retries were exhausted; it can be resumed."""

    wire_name: ClassVar[str] = "RunFailed"

    error: ErrorInfo
    step_path: str | None = None


class RunCancelled(RunEvent):
    """The run was cancelled (``little cancel``): its driver stops before its next step,
    model call or tool call, and the run is resumed only when asked explicitly.

    Appended by a process that does not drive the run (see
    :func:`little_es.durability.cancel_run` for why that is safe).
    """

    wire_name: ClassVar[str] = "RunCancelled"

    reason: str | None = None
    requested_by: str | None = None
    """Who asked (``pid@host`` of the cancelling process, or what the caller says)."""
    engine: Literal["local", "temporal"] = "local"
    """``temporal``: the cancellation also went through Temporal's cancel."""


class BudgetSet(RunEvent):
    """The run's budget from here on (a resume may raise it): checked before every model
    call against the totals of the run and its sub-runs."""

    wire_name: ClassVar[str] = "BudgetSet"

    budget: Budget


class BudgetExceeded(RunEvent):
    """The run stopped before a model call because a budget was spent: its own outcome,
    not a failure of the step, which stays in flight and continues on resume."""

    wire_name: ClassVar[str] = "BudgetExceeded"

    scope: str
    """``run`` (the run's budget, over it and its sub-runs) or ``step <path>`` (an agent's)."""
    spent: str
    """What was spent, against which limit, in words."""
    step_path: str | None = None
    unpriced_calls: int = Field(default=0, ge=0)


class RunResumed(RunEvent):
    """A stopped run (cancelled, or out of budget) was asked to continue."""

    wire_name: ClassVar[str] = "RunResumed"

    previous_status: str


class RunWaiting(RunEvent):
    """The run waits for a signal (a person, another system) at ``step_path``; its driver
    stops cleanly and the process may exit.

    ``model_ref`` names the pydantic model the signal's data must validate against
    (``module:qualname``) and ``schema_digest`` pins its JSON schema. For a tool call
    (``ask_human``, a tool that requires approval) ``action`` is what is asked about
    (the tool and its recorded arguments) and ``action_digest`` its digest: an approval
    naming another digest is refused as stale.
    """

    wire_name: ClassVar[str] = "RunWaiting"

    wait_id: str = Field(min_length=1)
    step_path: str
    kind: Literal["step", "ask_human", "approval"]
    signal: str = Field(min_length=1)
    model_ref: str = Field(min_length=1)
    schema_digest: str = Field(pattern=r"^[0-9a-f]{64}$")
    deadline: datetime | None = None
    action: dict[str, JSONValue] | None = None
    action_digest: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    question: str | None = None


class SignalReceived(RunEvent):
    """A signal for the wait ``wait_id``, its data validated against the wait's model.

    Appended by the process that sends it (``little signal``, ``world.signal``), not by
    the driver; a wait takes one, once. The next driver continues from the wait with
    ``data`` as the step's output (or the tool call's result).
    """

    wire_name: ClassVar[str] = "SignalReceived"

    wait_id: str = Field(min_length=1)
    signal: str = Field(min_length=1)
    data: JSONValue = None
    signal_id: str = Field(min_length=1)
    """Given by the sender (a webhook's delivery id) or made up: a second signal with the
    same id is refused, naming this one."""
    sent_by: str | None = None
    action_digest: str | None = None


class WaitTimedOut(RunEvent):
    """A wait's deadline passed before its signal came: the run's own outcome
    (status ``timed_out``), not a failure of the step."""

    wire_name: ClassVar[str] = "WaitTimedOut"

    wait_id: str = Field(min_length=1)
    step_path: str
    signal: str
    deadline: datetime


# ------------------------------------------------------------------ HarnessSession


class HarnessEvent(Event):
    """Base class of events on a ``HarnessSession`` stream."""


class SessionStarted(HarnessEvent):
    """An agent step attempt opened a session; the manifest pins what it may use."""

    wire_name: ClassVar[str] = "harness.session.started"
    write_ahead: ClassVar[bool] = True

    run_id: str
    step_path: str
    attempt: int = Field(ge=1)
    manifest: dict[str, JSONValue]
    manifest_hash: str


class ModelCalled(HarnessEvent):
    """Committed before a model call: the messages added since the previous turn.

    ``conversation_hash`` chains the whole conversation up to and including
    these messages, so a replayed conversation can be checked against it.

    Of the messages added, the first ``implied`` are not stored: the session's
    earlier events imply them (the previous turn's assistant message is its
    ``harness.model.responded``, each tool message a ``harness.tool_call``
    result), and ``messages`` holds the rest, those no earlier event holds
    (turn 1's system text and prompt). A reader rebuilds them with
    :func:`little_es.harness.session.sent_messages`; a resumed session rebuilds
    them from those events and checks them against the hash, as every turn.
    ``implied`` 0 (not stored) is the form logs written before hold, where
    ``messages`` is every message added.
    """

    wire_name: ClassVar[str] = "harness.model.called"
    write_ahead: ClassVar[bool] = True

    turn: int = Field(ge=1)
    messages: tuple[Message, ...] = ()
    conversation_hash: str
    implied: int = Field(default=0, ge=0)


class ModelResponded(HarnessEvent):
    """The model's answer to turn ``turn``, with its usage (token counts, never cost)."""

    wire_name: ClassVar[str] = "harness.model.responded"

    turn: int = Field(ge=1)
    response: ModelResponse
    step_path: str | None = None


class ToolCallStarted(HarnessEvent):
    """Committed before a tool is invoked, with the exact arguments."""

    wire_name: ClassVar[str] = "harness.tool_call.started"
    write_ahead: ClassVar[bool] = True

    turn: int = Field(ge=1)
    call_id: str
    name: str
    args: dict[str, JSONValue]


class ToolCallSucceeded(HarnessEvent):
    """A tool call returned ``result``."""

    wire_name: ClassVar[str] = "harness.tool_call.succeeded"

    call_id: str
    result: JSONValue = None


class ToolCallFailed(HarnessEvent):
    """A tool call raised; the error goes back to the model as the call's result."""

    wire_name: ClassVar[str] = "harness.tool_call.failed"

    call_id: str
    error: ErrorInfo


class SessionCompleted(HarnessEvent):
    """The session ended. ``usage`` is a rollup of its calls, never folded into totals."""

    wire_name: ClassVar[str] = "harness.session.completed"

    usage: Usage
    turns: int = Field(ge=0)
    output: JSONValue = None


# ---------------------------------------------------------------------- OuterLoop


class WorldEvent(Event):
    """Base class of events on the world's own stream."""


LOG_FORMAT_UNCHAINED: Final = 1
"""A world created before the hash chain: its older rows carry no frame."""
LOG_FORMAT_CHAINED: Final = 2
"""A world whose every row carries a chain frame (:mod:`little_es.chain`)."""
LOG_FORMAT_COMPACT: Final = 3
"""A world created by code that writes the short chain frame and wire keys; it reads and
continues rows of format 2 as they are (:mod:`little_es.chain`, :mod:`little_es.codec`)."""
LOG_FORMAT_LINKED: Final = 4
"""A world created by code that writes the 21-byte chain frame (a 4-byte link to the row
before); it reads and continues rows of formats 2 and 3 as they are (:mod:`little_es.chain`)."""


class WorldCreated(WorldEvent):
    """The world's identity, the first event it records.

    ``world_id`` is also kept outside the database where the backend can (the
    SQLite data directory's ``world.json``), so a database emptied or replaced
    under it is refused rather than taken for a new world.
    """

    wire_name: ClassVar[str] = "little_es.world.created"

    world_id: str = Field(pattern=r"^[0-9a-f]{32}$")
    log_format: Literal[1, 2, 3, 4]


class OuterLoopEvent(Event):
    """Base class of events on an ``OuterLoop`` stream (:mod:`little_es.outer_loop`)."""


OuterLoopEndReason = Literal[
    "planner_done", "max_cycles", "budget", "cycle_failed", "planner_failed"
]
"""Why an outer loop ended (:class:`OuterLoopCompleted`)."""


class OuterLoopStarted(OuterLoopEvent):
    """An outer loop began: what it runs, with what, and when it must stop."""

    wire_name: ClassVar[str] = "outer_loop.started"

    outer_loop_id: str
    workflow_id: str
    max_cycles: int = Field(ge=1)
    input: dict[str, JSONValue] = Field(default_factory=dict)
    budget_usd: Decimal | None = Field(default=None, gt=0, allow_inf_nan=False)
    on_cycle_failure: Literal["stop", "continue"] = "stop"


class OuterLoopCycleStarted(OuterLoopEvent):
    """Cycle ``cycle`` begins: its planner run, its run, and the planner manifest that pins it.

    ``planner_manifest`` is what the planner was given (model, prompt, tools,
    parameters, the cycle workflow's IR hash and ``outer_loop_context_hash``,
    the hash of the loop context); ``planner_manifest_hash`` is its digest. A
    resume recomputes both and abandons the cycle when they differ.
    """

    wire_name: ClassVar[str] = "outer_loop.cycle_started"

    cycle: int = Field(ge=1)
    planner_run_id: str = ""
    run_id: str
    planner_manifest: dict[str, JSONValue] = Field(default_factory=dict)
    planner_manifest_hash: str
    outer_loop_context_hash: str


class OuterLoopCyclePlanned(OuterLoopEvent):
    """The planner of cycle ``cycle`` answered: run the cycle, or the loop is ``done``.

    ``planner_manifest`` and its hash are set when the cycle goes on under other code
    than its start pinned: its planner answered (paid for) before a resume under
    changed code, which keeps the answer and runs the cycle under the code it has. A
    later resume looks for drift against this pin, not the start's.
    """

    wire_name: ClassVar[str] = "outer_loop.cycle_planned"

    cycle: int = Field(ge=1)
    done: bool
    reason: str = ""
    planner_manifest: dict[str, JSONValue] | None = None
    planner_manifest_hash: str | None = None


class OuterLoopCycleCompleted(OuterLoopEvent):
    """Cycle ``cycle`` ended with ``run_id`` (its run, or a failed planner's) in ``status``."""

    wire_name: ClassVar[str] = "outer_loop.cycle_completed"

    cycle: int = Field(ge=1)
    run_id: str
    status: Literal["completed", "failed"]


class OuterLoopCycleAbandoned(OuterLoopEvent):
    """Cycle ``cycle`` was closed unfinished: its planner manifest drifted before a resume.

    Its runs stay in the world as they are; the loop goes on with a fresh cycle.
    """

    wire_name: ClassVar[str] = "outer_loop.cycle_abandoned"

    cycle: int = Field(ge=1)
    old_manifest_hash: str
    new_manifest_hash: str
    old_context_hash: str
    new_context_hash: str
    changes: tuple[str, ...] = ()


class OuterLoopCompleted(OuterLoopEvent):
    """The outer loop ended after ``cycles`` finished cycles, for ``reason``."""

    wire_name: ClassVar[str] = "outer_loop.completed"

    cycles: int = Field(ge=0)
    reason: OuterLoopEndReason


# ---------------------------------------------------------------------- PriceBook


class PriceBookEvent(Event):
    """Base class of events on a world's ``PriceBook`` stream (one per world)."""


class ModelPriceSet(PriceBookEvent):
    """A model's price, in US dollars per million tokens, recorded in the world.

    It prices every call of ``model_id`` at ``provider`` (exact id, lower case)
    made at or after ``effective_from``, until a price with a later
    ``effective_from`` takes over; calls made before keep the price they had
    (:class:`little_es.pricing.RecordedPrices`). Prices are decimal strings in
    the payload, so they read back exactly.
    """

    wire_name: ClassVar[str] = "price_book.model_price_set"

    provider: str = Field(min_length=1)
    model_id: str = Field(min_length=1)
    input_per_mtok: Decimal = Field(ge=0, allow_inf_nan=False)
    output_per_mtok: Decimal = Field(ge=0, allow_inf_nan=False)
    cached_input_per_mtok: Decimal | None = Field(default=None, ge=0, allow_inf_nan=False)
    """None: cached input tokens cost the same as other input tokens."""
    reasoning_per_mtok: Decimal | None = Field(default=None, ge=0, allow_inf_nan=False)
    """None: reasoning tokens cost the same as other output tokens."""
    cache_write_per_mtok: Decimal | None = Field(default=None, ge=0, allow_inf_nan=False)
    """None: tokens written to the prompt cache cost the same as other input tokens."""
    effective_from: datetime


class Snapshot(Event):
    """The folded state of an aggregate at ``originator_version`` (snapshot store only)."""

    wire_name: ClassVar[str] = "little_es.snapshot"

    aggregate: str
    state: dict[str, JSONValue]

    @classmethod
    def take(cls, aggregate: Any) -> Snapshot:
        """eventsourcing's snapshot hook: ask the aggregate for its snapshot."""
        snapshot: Snapshot = aggregate.take_snapshot()
        return snapshot


# ------------------------------------------------------------------------ forks


class ForkedSession(Checked):
    """One harness session a fork copied: from which origin stream, up to which row."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    origin_session_id: UUID
    session_id: UUID
    """The fork's own stream (its run id's session of the same step path and attempt)."""
    origin_version: int = Field(ge=1)
    """The last origin row copied (the rows 1..origin_version are the copy's source)."""
    origin_digest: str
    """That row's own chain digest (hex; :mod:`little_es.chain`): what was copied, pinned."""
    copied_events: int = Field(ge=1)


class ForkOrigin(Checked):
    """Where a fork comes from: the origin run, the fork point, and the copied prefix."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    origin_run_id: str
    at: str
    """The fork point as asked for (``plan``, ``plan#turn=3``)."""
    step_path: str
    turn: int | None = Field(default=None, ge=1)
    """For a fork inside an agent step: the first turn that runs again."""
    origin_version: int = Field(ge=1)
    """The last row of the origin's ``Run`` stream the prefix was taken from."""
    origin_digest: str
    """That row's own chain digest (hex): the origin's history up to it, pinned."""
    copied_events: int = Field(ge=1)
    """The ``Run`` events copied after ``RunForked`` (``RunStarted`` first)."""
    sessions: tuple[ForkedSession, ...] = ()
    input_changed: bool = False
    forked_at: datetime


class RunForked(RunEvent):
    """The first event of a fork: its origin and the prefix of the origin's history it copies.

    The copied events follow it (``RunStarted`` first), with the origin's
    timestamps so that the prefix is priced and ordered as it was; the copied
    harness sessions are streams of the fork's own. Resuming the fork re-uses
    every committed step, model call and tool call of the prefix
    (:func:`little_es.fork.fork_run`).
    """

    wire_name: ClassVar[str] = "RunForked"

    run_id: str
    origin: ForkOrigin


class WorkflowAdopted(RunEvent):
    """A fork took a workflow definition other than its origin's, before it ran anything past
    its fork point; the prefix was checked against it first (see
    :func:`little_es.engine.integrity.assert_fork_prefix_matches`). From here on the run is
    pinned to this definition, as any run is to its ``RunStarted``'s."""

    wire_name: ClassVar[str] = "WorkflowAdopted"

    workflow_version: str
    ir_hash: str
    previous_workflow_version: str
    previous_ir_hash: str

"""The aggregates: ``Run``, ``HarnessSession``, ``OuterLoop`` and a world's ``PriceBook``.

An aggregate is a stream of events with a version. Commands go through
:meth:`Aggregate.trigger`, which stamps the next version, applies the event to
the aggregate's state and queues it; :meth:`little_es.world.World.save` appends
the queued events in one transaction, and a concurrent writer at the same
version loses with :class:`~little_es.errors.ConcurrencyConflictError`.

These classes satisfy eventsourcing's aggregate protocol (``id``, ``version``,
``collect_events()``), so the eventsourcing Application saves, snapshots and
reconstructs them, while their events stay frozen pydantic models.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, ClassVar, Self, TypeVar
from uuid import UUID

from pydantic import ValidationError

from little_es._strict import refuse_unvalidated
from little_es.chain import GENESIS, seed
from little_es.errors import EventPayloadError, LogTamperedError
from little_es.events import (
    Event,
    HarnessEvent,
    ModelCalled,
    ModelPriceSet,
    ModelResponded,
    OuterLoopCompleted,
    OuterLoopCycleAbandoned,
    OuterLoopCycleCompleted,
    OuterLoopCyclePlanned,
    OuterLoopCycleStarted,
    OuterLoopEvent,
    OuterLoopStarted,
    PriceBookEvent,
    RunEvent,
    SessionCompleted,
    SessionStarted,
    Snapshot,
    StepCompleted,
    ToolCallFailed,
    ToolCallStarted,
    ToolCallSucceeded,
    WorldCreated,
    WorldEvent,
    event_class_for,
    utc_now,
)
from little_es.ids import (
    outer_loop_stream_id,
    price_book_stream_id,
    run_stream_id,
    session_stream_id,
    world_stream_id,
)
from little_es.materialize import MaterializedRunState, RunFold, apply
from little_es.pricing import RecordedPrices
from little_es.values import JSONValue, Pricer, is_usage_cost_error, usage_cost_message

E = TypeVar("E", bound=Event)

# Not a field of MaterializedRunState: the attempt budget is the engine's, not the read model's.
_GAVE_UP_KEY = "gave_up_attempts"
# Not one either: where in the stream each step's output is (a snapshot does not copy them).
_OUTPUTS_AT_KEY = "outputs_at"
# A set, not a frozenset: pydantic's ``exclude`` is typed as set or mapping.
_OUTPUT: set[str] = {"output"}


class Aggregate:
    """Base class: an id, a version, state folded from events, and events not yet saved."""

    type_name: ClassVar[str] = ""
    event_base: ClassVar[type[Event]] = Event

    def __init__(self, id: UUID) -> None:
        self.id = id
        self.version = 0
        self.created_on: datetime | None = None
        self.modified_on: datetime | None = None
        self._pending: list[Event] = []
        self.chain_digest = GENESIS
        """The digest of the last stored event (:mod:`little_es.chain`): the next links to it."""
        self.chain_running = seed(id)
        """The stream's running digest after its last stored event: the next save continues it."""

    def trigger(self, event_class: type[E], **fields: Any) -> E:
        """Create the next event of this stream, apply it, and queue it for saving."""
        if not issubclass(event_class, self.event_base):
            raise TypeError(
                f"{event_class.__qualname__} is not a {self.event_base.__qualname__}:"
                f" it cannot be recorded on a {self.type_name} stream"
            )
        try:
            event = event_class(
                originator_id=self.id,
                originator_version=self.version + 1,
                timestamp=utc_now(),
                **fields,
            )
        except ValidationError as exc:
            problems = "; ".join(
                ".".join(str(p) for p in err["loc"])
                + ": "
                + (
                    usage_cost_message([str(err["loc"][-1])])
                    if is_usage_cost_error(err)
                    else err["msg"]
                )
                for err in exc.errors()
            )
            raise EventPayloadError(
                f"cannot record {event_class.wire_name or event_class.__qualname__}: {problems}"
            ) from exc
        refuse_unvalidated(event, event_class.wire_name or event_class.__qualname__)
        self.mutate(event)
        self._pending.append(event)
        return event

    def copy_in(self, source: E, **changes: Any) -> E:
        """Queue a copy of ``source``, an event of another stream, as this stream's next event.

        The copy keeps ``source``'s fields and timestamp (a copied model call is
        priced at its own time, and the copied prefix keeps its order when a
        run's streams are merged by timestamp), except ``changes``; it is
        validated as :meth:`trigger` validates. A fork's prefix is written so
        (:mod:`little_es.fork`).
        """
        event_class = type(source)
        if not isinstance(source, self.event_base):
            raise TypeError(
                f"{event_class.__qualname__} is not a {self.event_base.__qualname__}:"
                f" it cannot be copied to a {self.type_name} stream"
            )
        fields = {
            name: getattr(source, name)
            for name in event_class.model_fields
            if name not in ("originator_id", "originator_version")
        }
        fields.update(changes)
        try:
            event = event_class(
                originator_id=self.id, originator_version=self.version + 1, **fields
            )
        except ValidationError as exc:
            raise EventPayloadError(
                f"cannot copy {event_class.wire_name or event_class.__qualname__}: {exc}"
            ) from exc
        refuse_unvalidated(event, event_class.wire_name or event_class.__qualname__)
        self.mutate(event)
        self._pending.append(event)
        return event

    def mutate(self, event: Event) -> None:
        """Apply a stored or new event; versions must follow one another."""
        if isinstance(event, Snapshot):
            self.restore(event.state)
        elif event.originator_version != self.version + 1:
            raise ValueError(
                f"{self.type_name} {self.id}: event version {event.originator_version} does not"
                f" follow version {self.version}"
            )
        else:
            self.apply(event)
        if self.created_on is None:
            self.created_on = event.timestamp
        self.version = event.originator_version
        self.modified_on = event.timestamp

    def apply(self, event: Event) -> None:
        """Fold ``event`` into this aggregate's state."""
        raise NotImplementedError

    def snapshot_state(self) -> dict[str, Any]:
        """JSON-compatible state for a snapshot (``restore`` must accept it)."""
        raise NotImplementedError

    def restore(self, state: dict[str, Any]) -> None:
        """Load state written by :meth:`snapshot_state`."""
        raise NotImplementedError

    def collect_events(self) -> list[Event]:
        """Take the queued events (eventsourcing's protocol)."""
        events, self._pending = self._pending, []
        return events

    @property
    def pending_events(self) -> tuple[Event, ...]:
        """Events triggered but not yet saved."""
        return tuple(self._pending)

    @classmethod
    def from_events(cls, id: UUID, events: Iterable[Event]) -> Self:
        """Reconstruct from a stream (optionally starting with a snapshot)."""
        aggregate = cls._blank(id)
        for event in events:
            aggregate.mutate(event)
        return aggregate

    @classmethod
    def _blank(cls, id: UUID) -> Self:
        aggregate = cls.__new__(cls)
        Aggregate.__init__(aggregate, id)
        aggregate._init_state()
        return aggregate

    def _init_state(self) -> None:
        raise NotImplementedError

    def take_snapshot(self) -> Snapshot:
        """A snapshot of the current state at the current version."""
        return Snapshot(
            originator_id=self.id,
            originator_version=self.version,
            timestamp=self.modified_on or utc_now(),
            aggregate=self.type_name,
            state=self.snapshot_state(),
        )


class Run(Aggregate):
    """One run of a workflow. Its state is the reducer's fold of its own stream.

    The fold prices model calls with ``pricer``, which the world that loads or
    starts the run hands in (the reducer has no prices of its own).
    """

    type_name = "Run"
    event_base = RunEvent

    def __init__(self, run_id: str, pricer: Pricer) -> None:
        super().__init__(run_stream_id(run_id))
        self.fold = RunFold(pricer)
        self.fold.run_id = run_id
        self._outputs_at: dict[str, int] = {}

    @classmethod
    def from_stream(cls, stream_id: UUID, events: Iterable[Event], pricer: Pricer) -> Run:
        """Reconstruct a run from its stream (optionally starting with a snapshot)."""
        run = cls.__new__(cls)
        Aggregate.__init__(run, stream_id)
        run.fold = RunFold(pricer)
        run._outputs_at = {}
        for event in events:
            run.mutate(event)
        return run

    @classmethod
    def _blank(cls, id: UUID) -> Self:
        raise TypeError("a Run folds with a pricer: use Run.from_stream(stream_id, events, pricer)")

    @property
    def run_id(self) -> str | None:
        """The run id, known once ``RunStarted`` is folded (or given at creation)."""
        return self.fold.run_id

    def apply(self, event: Event) -> None:
        """Fold through the one reducer."""
        apply(self.fold, event)

    def snapshot_state(self) -> dict[str, Any]:
        """The materialized state of the run stream, as JSON, without the steps' outputs, and
        the attempts that gave up.

        A step's inline output is already in its ``StepCompleted``: the snapshot
        names that event's version instead (``outputs_at``), so that snapshots,
        taken at versions growing fourfold, do not store every output again and again;
        :meth:`outputs_to_read` says which rows a load reads them back from.
        Fields at their defaults are left out, as in event payloads
        (:mod:`little_es.codec`): most of a step's fields are (no usage, no error,
        first visit), and :meth:`restore` validates them back in; so are a step's
        path (its key) and its id where it is the path.
        """
        outputs_at = self.fold.output_versions()
        dumped = self.fold.freeze(steps=False).model_dump(mode="json", exclude_defaults=True)
        # Each step is dumped from an ordinary StepState made for it (little_es._compact),
        # not from the steps' frozen views: dumped, each view would get a dict (64 bytes,
        # kept with the run's result), and a run nobody asks for its state until it ends
        # has no views to keep while it runs. Left out: the outputs outputs_at names (a
        # long run's outputs are most of it, and a dump that held them would need them
        # all in memory once more).
        steps = {
            path: _without_path(
                path,
                step.dumpable().model_dump(
                    mode="json",
                    exclude_defaults=True,
                    exclude=_OUTPUT if path in outputs_at else None,
                ),
            )
            for path, step in self.fold.steps.items()
        }
        # In the order a dump of the whole state gives: the stored bytes are as before.
        state: dict[str, Any] = {}
        for name in MaterializedRunState.model_fields:
            if name == "steps":
                if steps:
                    state[name] = steps
            elif name in dumped:
                state[name] = dumped[name]
        state[_GAVE_UP_KEY] = self.fold.gave_up_attempts()
        state[_OUTPUTS_AT_KEY] = outputs_at
        return state

    def restore(self, state: dict[str, Any]) -> None:
        """Continue the fold from a snapshot's materialized state; the outputs it names by
        version are then :meth:`outputs_to_read` (a snapshot written before held them)."""
        fields = dict(state)
        steps = fields.get("steps")
        if isinstance(steps, dict):  # anything else fails validation below
            for path, step in steps.items():
                if isinstance(step, dict):
                    step.setdefault("step_path", path)
                    step.setdefault("step_id", step["step_path"])
        gave_up = fields.pop(_GAVE_UP_KEY, None)
        self._outputs_at = fields.pop(_OUTPUTS_AT_KEY, None) or {}
        self.fold = RunFold.from_state(
            MaterializedRunState.model_validate(fields), self.fold.pricer, gave_up
        )

    def outputs_to_read(self) -> dict[str, int]:
        """The steps whose output the snapshot just restored names by the version of its
        ``StepCompleted``, which the loader reads and hands to :meth:`read_outputs`."""
        return self._outputs_at

    def read_outputs(self, completions: Iterable[tuple[str, Event]]) -> None:
        """Put back the outputs :meth:`outputs_to_read` named: each ``(step_path, event)``
        is the stored event at the version named for that step.

        Raises :class:`~little_es.errors.LogTamperedError` when an event is not
        that step's ``StepCompleted`` (the snapshot does not belong to the stream).
        """
        for path, event in completions:
            if (
                not isinstance(event, StepCompleted)
                or event.step_path != path
                or path not in self.fold.steps
            ):
                raise LogTamperedError(
                    f"stream {self.id}: the snapshot names version {event.originator_version}"
                    f" as the StepCompleted of step {path!r}, and it is not; the snapshot was"
                    " replaced or edited: restore the world from a backup"
                )
            self.fold.set_output(path, event.output, event.originator_version)
        self._outputs_at = {}


def _without_path(path: str, step: dict[str, Any]) -> dict[str, Any]:
    """A step's dumped state without its path (its key in the snapshot) and without its id
    where that is the path: a third of a compressed snapshot, given back by restore."""
    del step["step_path"]
    if step["step_id"] == path:
        del step["step_id"]
    return step


class HarnessSession(Aggregate):
    """One attempt of an agent step: every model call and tool call it made.

    The state is the memo a resumed session fast-forwards through: responses
    by turn, tool results by call id, and the calls still in flight.
    """

    type_name = "HarnessSession"
    event_base = HarnessEvent

    def __init__(self, run_id: str, step_path: str, attempt: int) -> None:
        super().__init__(session_stream_id(run_id, step_path, attempt))
        self._init_state()

    def _init_state(self) -> None:
        self.started: SessionStarted | None = None
        self.called: dict[int, ModelCalled] = {}
        self.responses: dict[int, ModelResponded] = {}
        self.tool_calls: dict[str, ToolCallStarted] = {}
        self.tool_results: dict[str, ToolCallSucceeded | ToolCallFailed] = {}
        self.completed: SessionCompleted | None = None

    def apply(self, event: Event) -> None:
        """Index the event by turn or call id."""
        match event:
            case ModelCalled():
                self.called[event.turn] = event
            case ModelResponded():
                self.responses[event.turn] = event
            case ToolCallStarted():
                self.tool_calls[event.call_id] = event
            case ToolCallSucceeded() | ToolCallFailed():
                self.tool_results[event.call_id] = event
            case SessionStarted():
                self.started = event
            case SessionCompleted():
                self.completed = event
            case _:
                pass

    def snapshot_state(self) -> dict[str, Any]:
        """Every indexed event, as JSON."""

        def dump(e: Event) -> dict[str, Any]:
            return {"wire_name": e.wire_name, **e.model_dump(mode="json")}

        return {
            "events": [
                dump(e)
                for e in sorted(
                    [
                        *([self.started] if self.started else []),
                        *self.called.values(),
                        *self.responses.values(),
                        *self.tool_calls.values(),
                        *self.tool_results.values(),
                        *([self.completed] if self.completed else []),
                    ],
                    key=lambda e: e.originator_version,
                )
            ]
        }

    def restore(self, state: dict[str, Any]) -> None:
        """Re-index the events a snapshot holds."""
        from little_es.events import event_class_for

        self._init_state()
        for item in state["events"]:
            data = dict(item)
            cls = event_class_for(data.pop("wire_name"))
            if cls is None:  # pragma: no cover - the catalogue is fixed
                raise ValueError("unknown event in a harness session snapshot")
            self.apply(cls.model_validate(data))


@dataclass(frozen=True)
class LoopCycle:
    """One cycle of an outer loop as its events tell it."""

    started: OuterLoopCycleStarted
    planned: OuterLoopCyclePlanned | None = None
    completed: OuterLoopCycleCompleted | None = None
    abandoned: OuterLoopCycleAbandoned | None = None

    @property
    def number(self) -> int:
        """The cycle's number, from 1."""
        return self.started.cycle

    @property
    def pinned(self) -> tuple[Mapping[str, JSONValue], str]:
        """The planner manifest (and its hash) the cycle goes on under: its start's, or the
        one its plan recorded when a resume under changed code kept the planner's answer."""
        planned = self.planned
        if planned is not None and planned.planner_manifest_hash is not None:
            return planned.planner_manifest or {}, planned.planner_manifest_hash
        return self.started.planner_manifest, self.started.planner_manifest_hash

    @property
    def status(self) -> str:
        """``pending``, ``done`` (the planner ended the loop), or the outcome."""
        if self.abandoned is not None:
            return "abandoned"
        if self.completed is not None:
            return self.completed.status
        if self.planned is not None and self.planned.done:
            return "done"
        return "pending"

    @property
    def ended(self) -> bool:
        """Whether nothing more will run in this cycle."""
        return self.status != "pending"


class OuterLoop(Aggregate):
    """An outer loop: how it was started, its cycles (each a planner run and a run), its end.

    It is the truth of a loop; the manifest view (:func:`little_es.outer_loop.loop_view`)
    and the reports are folded from it.
    """

    type_name = "OuterLoop"
    event_base = OuterLoopEvent

    def __init__(self, outer_loop_id: str) -> None:
        super().__init__(outer_loop_stream_id(outer_loop_id))
        self._init_state()

    def _init_state(self) -> None:
        self.started: OuterLoopStarted | None = None
        self.cycles: dict[int, LoopCycle] = {}
        self.completed: OuterLoopCompleted | None = None
        self._events: list[OuterLoopEvent] = []

    @property
    def pending_cycle(self) -> LoopCycle | None:
        """The cycle that started and has not ended, if any (there is at most one)."""
        last = self.cycles[max(self.cycles)] if self.cycles else None
        return last if last is not None and not last.ended else None

    @property
    def pending_cycle_run_id(self) -> str | None:
        """The run of the pending cycle, if any (the seed's ``pendingCycleRunId``)."""
        pending = self.pending_cycle
        return pending.started.run_id if pending is not None else None

    @property
    def next_cycle(self) -> int:
        """The number the next cycle to start will have."""
        return max(self.cycles, default=0) + 1

    @property
    def cycles_ended(self) -> int:
        """How many cycles ran to an outcome (abandoned ones and the planner's "done" excluded)."""
        return sum(1 for c in self.cycles.values() if c.completed is not None)

    def apply(self, event: Event) -> None:
        """Track the loop's start, cycles and end."""
        assert isinstance(event, OuterLoopEvent)
        self._events.append(event)
        match event:
            case OuterLoopStarted():
                self.started = event
            case OuterLoopCycleStarted():
                self.cycles[event.cycle] = LoopCycle(started=event)
            case OuterLoopCyclePlanned():
                self.cycles[event.cycle] = replace(self.cycles[event.cycle], planned=event)
            case OuterLoopCycleCompleted():
                self.cycles[event.cycle] = replace(self.cycles[event.cycle], completed=event)
            case OuterLoopCycleAbandoned():
                self.cycles[event.cycle] = replace(self.cycles[event.cycle], abandoned=event)
            case OuterLoopCompleted():
                self.completed = event
            case _:
                pass

    def snapshot_state(self) -> dict[str, Any]:
        """The loop's events as JSON (a loop is a few events per cycle)."""
        return {
            "events": [
                {"wire_name": e.wire_name, **e.model_dump(mode="json")} for e in self._events
            ]
        }

    def restore(self, state: dict[str, Any]) -> None:
        """Load the loop's events from a snapshot."""
        self._init_state()
        for item in state["events"]:
            data = dict(item)
            cls = event_class_for(data.pop("wire_name"))
            if cls is None or not issubclass(cls, OuterLoopEvent):  # pragma: no cover
                raise ValueError("unknown event in an outer loop snapshot")
            self.apply(cls.model_validate(data))


class WorldRecord(Aggregate):
    """The world's own stream: its identity and log format (:class:`WorldCreated`)."""

    type_name = "World"
    event_base = WorldEvent

    def __init__(self) -> None:
        super().__init__(world_stream_id())
        self._init_state()

    def _init_state(self) -> None:
        self.created: WorldCreated | None = None

    def apply(self, event: Event) -> None:
        """Keep the identity."""
        if isinstance(event, WorldCreated):
            self.created = event

    def snapshot_state(self) -> dict[str, Any]:
        """Never snapshotted: the stream is a few events long."""
        raise NotImplementedError("the world stream is not snapshotted")

    def restore(self, state: dict[str, Any]) -> None:
        """Never snapshotted."""
        raise NotImplementedError("the world stream is not snapshotted")


class PriceBook(Aggregate):
    """The prices recorded in a world: one stream per world, of :class:`ModelPriceSet` events.

    Its state is a :class:`~little_es.pricing.RecordedPrices`, the first source
    a world's pricer consults. It is short (one event per price set), so it is
    never snapshotted.
    """

    type_name = "PriceBook"
    event_base = PriceBookEvent

    def __init__(self) -> None:
        super().__init__(price_book_stream_id())
        self._init_state()

    def _init_state(self) -> None:
        self.prices = RecordedPrices()

    def apply(self, event: Event) -> None:
        """Take a recorded price into the book."""
        if isinstance(event, ModelPriceSet):
            self.prices.add(event)

    def snapshot_state(self) -> dict[str, Any]:
        """Every recorded price, as JSON."""
        return {"prices": [e.model_dump(mode="json") for e in self.prices.recorded]}

    def restore(self, state: dict[str, Any]) -> None:
        """Load the recorded prices of a snapshot."""
        self._init_state()
        for item in state["prices"]:
            self.apply(ModelPriceSet.model_validate(item))

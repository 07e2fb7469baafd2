"""Domain aggregates a step changes, committed with its ``StepCompleted``: exactly-once effects.

A user's aggregates are plain eventsourcing aggregates (``eventsourcing.domain.Aggregate``
subclasses with ``@event`` methods). A step reaches them through its context::

    @task("resolve")
    def resolve(ctx: StepContext) -> dict[str, str]:
        ticket = ctx.aggregates.get(Ticket, ctx.input["ticket_id"])
        ticket.resolve(note="refund issued")
        return {"status": ticket.status}

:class:`StepAggregates` is the attempt's unit of work: ``get`` reads an aggregate from the
world (its stream's hash chain verified, as every read is) and keeps it, ``add`` takes a new
one. Nothing is written while the step runs. When it returns, the engine appends every new
event of those aggregates **in the transaction that commits the step's ``StepCompleted``**
(:meth:`little_es.world.World.save` is one transaction over several streams). So:

* killed before that commit, the changes are lost with the process; the step runs again on
  resume and reads the aggregates at their stored versions;
* killed after it, the step is committed with its effect, and is not run again;
* a step that fails commits its ``StepFailed`` and none of its changes.

Another writer that changed one of the aggregates since the step read it makes the commit lose
the streams' version check: nothing is written, and the attempt fails with
:class:`~little_es.errors.AggregateConflictError`, a retryable failure (give the step a
``RetryPolicy(max_attempts=...)``; the next attempt reads the aggregate afresh).

The events are stored the way eventsourcing stores them (topic ``module:Class.Event``, the
event's attributes as JSON with eventsourcing's UUID, Decimal and datetime transcodings,
``class_version`` upcasting), framed with the world's hash chain like every row: a user's
``eventsourcing`` projection over the world's log reads them with the runs' own events, in
one order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, TypeVar
from uuid import UUID

from eventsourcing.domain import BaseAggregate, CanMutateProtocol
from eventsourcing.persistence import (
    DatetimeAsISO,
    DecimalAsStr,
    JSONTranscoder,
    Mapper,
    StoredEvent,
    UUIDAsHex,
)
from eventsourcing.utils import resolve_topic

from little_es._strict import MAX_JSON_DEPTH, nests_deeper
from little_es.errors import (
    AggregateArgumentError,
    AggregateNotFoundError,
    EventPayloadError,
    UnknownEventTypeError,
)

__all__ = [
    "DomainStream",
    "LoadedDomainStream",
    "StepAggregates",
    "decode_domain_event",
    "encode_domain_event",
    "is_domain_topic",
]

AG = TypeVar("AG", bound=BaseAggregate[UUID])


def _transcoder() -> JSONTranscoder:
    # The transcodings eventsourcing's Application registers by default.
    transcoder = JSONTranscoder()
    transcoder.register(UUIDAsHex())
    transcoder.register(DecimalAsStr())
    transcoder.register(DatetimeAsISO())
    return transcoder


_MAPPER: Mapper[UUID] = Mapper(transcoder=_transcoder())


def is_domain_topic(topic: str) -> bool:
    """Whether a stored topic is an eventsourcing topic (``module:qualname``), not a wire name.

    The caller asks only for a topic with no registered little_es event class.
    """
    return ":" in topic


def encode_domain_event(event: Any) -> tuple[str, bytes]:
    """An eventsourcing domain event's topic and payload bytes, as eventsourcing stores them.

    Raises :class:`~little_es.errors.EventPayloadError` naming the event when an attribute is
    not JSON (nor a UUID, Decimal or datetime).
    """
    what = f"cannot record {type(event).__qualname__} of aggregate {event.originator_id}"
    try:
        stored = _MAPPER.to_stored_event(event)
    except (TypeError, ValueError, RecursionError) as exc:
        raise EventPayloadError(
            f"{what}: {exc}; give the event JSON attributes (str, int, float, bool, None, lists,"
            " dicts), UUIDs, Decimals or datetimes"
        ) from exc
    if nests_deeper(stored.state):
        raise EventPayloadError(
            f"{what}: a value nests deeper than {MAX_JSON_DEPTH} arrays and objects: flatten"
            " it, or store the deep part as a string"
        )
    try:
        # As every reader will: a dict that looks like the transcoder's own encoding of a
        # UUID, a Decimal or a datetime ({"_type_": ..., "_data_": ...}) may not decode.
        _MAPPER.to_domain_event(stored)
    except Exception as exc:
        raise EventPayloadError(
            f"{what}: it would not read back ({type(exc).__name__}: {exc}); a dict with the"
            " keys '_type_' and '_data_' is read as eventsourcing's encoding of a value:"
            " rename them"
        ) from exc
    return stored.topic, stored.state


def decode_domain_event(stream_id: UUID, version: int, topic: str, payload: bytes) -> Any:
    """The eventsourcing domain event of one stored row (its frame removed).

    Raises :class:`~little_es.errors.UnknownEventTypeError` when the topic's class cannot be
    imported, :class:`~little_es.errors.EventPayloadError` when the payload is not JSON.
    """
    try:
        resolve_topic(topic)
    except Exception as exc:
        raise UnknownEventTypeError(
            f"stored domain event {topic!r} (stream {stream_id}, version {version}): its class"
            f" cannot be imported ({exc}); import the module that defines the aggregate before"
            " reading it"
        ) from exc
    try:
        return _MAPPER.to_domain_event(StoredEvent(stream_id, version, topic, payload))
    except Exception as exc:
        raise EventPayloadError(
            f"stored domain event {topic!r} (stream {stream_id}, version {version}) cannot be"
            f" read: {exc}; the log is corrupt"
        ) from exc


def check_domain_payload(stream_id: UUID, version: int, topic: str, payload: bytes) -> None:
    """Check a stored domain event's payload is a JSON object, without importing its class
    (``little verify`` checks a world where the user's code may not be importable)."""
    try:
        state = _MAPPER.transcoder.decode(payload)
    except Exception as exc:
        raise EventPayloadError(
            f"stored domain event {topic!r} (stream {stream_id}, version {version}) is not"
            f" valid JSON: {exc}; the log is corrupt"
        ) from exc
    if not isinstance(state, dict):
        raise EventPayloadError(
            f"stored domain event {topic!r} (stream {stream_id}, version {version}) is not a"
            " JSON object; the log is corrupt"
        )


class LoadedDomainStream(NamedTuple):
    """One aggregate's stream as the world read it (its chain verified)."""

    events: Sequence[Any]
    """The decoded domain events, in version order (none for a stream with no rows)."""
    digest: bytes
    """The last row's digest: the next row's ``prev``."""
    running: Any
    """The running digest after the last row (:func:`little_es.chain.seed` for none)."""


class DomainStream:
    """An aggregate's new events ready to commit, with its stream's chain state.

    It has what :meth:`little_es.world.World.save` asks of an aggregate (``id``,
    ``version``, ``chain_digest``, ``chain_running``, ``collect_events()``). Its events are
    taken from the user's aggregate once; a commit retried after another writer appended to
    the run's own stream commits the same events.
    """

    def __init__(self, aggregate: BaseAggregate[UUID], loaded: LoadedDomainStream) -> None:
        self.aggregate = aggregate
        self.id: UUID = aggregate.id
        self.events = list(aggregate.collect_events())
        self.base_version: int = self.events[0].originator_version - 1
        """The version the step read (0 for an aggregate it added)."""
        self.version: int = aggregate.version
        self.chain_digest = loaded.digest
        self.chain_running = loaded.running

    def collect_events(self) -> list[Any]:
        """The events to commit (not cleared: a retried commit takes them again)."""
        return list(self.events)


Loader = Callable[[UUID], LoadedDomainStream]
"""Reads an aggregate's stream from the world (no events for a stream with no rows)."""


class StepAggregates:
    """One step attempt's unit of work over the user's eventsourcing aggregates.

    See the module docstring. Not shared between attempts: each attempt reads afresh.
    """

    def __init__(self, loader: Loader) -> None:
        self._loader = loader
        self._held: dict[UUID, tuple[BaseAggregate[UUID], LoadedDomainStream]] = {}

    def get(self, cls: type[AG], id: UUID) -> AG:
        """The aggregate ``id`` of class ``cls`` at its stored version (the same object for
        every ``get`` of one id in this attempt).

        Raises :class:`~little_es.errors.AggregateNotFoundError` when it has no events, and
        :class:`~little_es.errors.AggregateArgumentError` when the arguments are not an
        eventsourcing aggregate class and a UUID, or the stored aggregate is of another class.
        """
        if not (isinstance(cls, type) and issubclass(cls, BaseAggregate)):
            raise AggregateArgumentError(
                f"ctx.aggregates.get needs an eventsourcing aggregate class (a subclass of"
                f" eventsourcing.domain.Aggregate), got {cls!r}"
            )
        if not isinstance(id, UUID):
            raise AggregateArgumentError(
                f"ctx.aggregates.get needs the aggregate's id as a UUID, got"
                f" {type(id).__name__} {id!r}: pass uuid.UUID(...)"
            )
        held = self._held.get(id)
        if held is None:
            loaded = self._loader(id)
            if not loaded.events:
                raise AggregateNotFoundError(
                    f"no {cls.__qualname__} {id} in this world: create it with"
                    f" ctx.aggregates.add({cls.__qualname__}(...))"
                )
            aggregate: Any = None
            for event in loaded.events:
                if not isinstance(event, CanMutateProtocol):
                    raise AggregateArgumentError(
                        f"stream {id} holds {type(event).__qualname__}, not an eventsourcing"
                        " aggregate event"
                    )
                aggregate = event.mutate(aggregate)
            held = self._held[id] = (aggregate, loaded)
        found = held[0]
        if not isinstance(found, cls):
            raise AggregateArgumentError(
                f"aggregate {id} is a {type(found).__qualname__}, not a {cls.__qualname__}"
            )
        return found

    def add(self, aggregate: AG) -> AG:
        """Take a new aggregate (created in this step) into the step's commit; return it.

        Raises :class:`~little_es.errors.AggregateArgumentError` for anything but a new
        eventsourcing aggregate (one whose events start at version 1), or one added twice.
        """
        if not isinstance(aggregate, BaseAggregate):
            raise AggregateArgumentError(
                f"ctx.aggregates.add needs an eventsourcing aggregate (an instance of an"
                f" eventsourcing.domain.Aggregate subclass), got {type(aggregate).__name__}"
            )
        pending = aggregate.pending_events
        if not pending or pending[0].originator_version != 1:
            raise AggregateArgumentError(
                f"ctx.aggregates.add takes a new aggregate; {type(aggregate).__qualname__}"
                f" {aggregate.id} was not created here: read a stored one with"
                " ctx.aggregates.get(cls, id)"
            )
        if aggregate.id in self._held:
            if self._held[aggregate.id][0] is aggregate:
                return aggregate
            raise AggregateArgumentError(
                f"this step holds another aggregate with id {aggregate.id} already"
            )
        loaded = self._loader(aggregate.id)
        if loaded.events:
            raise AggregateArgumentError(
                f"ctx.aggregates.add: the world holds an aggregate with id {aggregate.id}"
                f" already ({len(loaded.events)} events): give the new one another id"
            )
        self._held[aggregate.id] = (aggregate, loaded)
        return aggregate

    def take_changes(self) -> tuple[DomainStream, ...]:
        """The held aggregates' new events, taken for the step's commit (once per attempt).

        Each event is encoded first, so an event that cannot be stored is the step's
        failure (:class:`~little_es.errors.EventPayloadError`) before anything is written.
        """
        streams = []
        for aggregate, loaded in self._held.values():
            if aggregate.pending_events:
                for event in aggregate.pending_events:
                    encode_domain_event(event)
                streams.append(DomainStream(aggregate, loaded))
        self._held.clear()
        return tuple(streams)

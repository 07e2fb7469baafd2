"""How events become bytes: a pydantic Mapper and an orjson Transcoder for eventsourcing.

The stored topic is the event's wire name, not its Python path. The stored
state is the event's JSON payload without ``originator_id`` and
``originator_version`` (the recorder keeps those in their own columns), its
fields under their wire keys (:data:`~little_es.events.WIRE_KEYS`), its
timestamp in microseconds since the epoch, and without the fields whose value
is their default (``null``, ``[]``, ``0``, a first visit and attempt...), nor
a step event's ``step_id`` where it is its ``step_path``: a task step's
``StepStarted`` is ``{"t":1764879300509997,"p":"s1"}``; validation fills them
in again on read. Logs written before, with field names
and ISO timestamps (``tests/fixtures/chained_log.jsonl``) or with every field
stored (``tests/fixtures/verbose_log.jsonl``), read the same. A field's default
and its wire key are therefore part of the stored format: changing one is a
schema change (see :mod:`little_es.events`). A snapshot's payload is that JSON
compressed with zlib (its first byte, 0x78, is never a JSON payload's).
Reading validates the payload against the event's schema, after upcasting an
old ``class_version``; anything that does not validate is refused with an error
that names the event and the field.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Any, cast
from uuid import UUID

import orjson
from eventsourcing.domain import DomainEventProtocol
from eventsourcing.persistence import Mapper, StoredEvent, Transcoder
from pydantic import ValidationError
from pydantic_core import PydanticSerializationError

from little_es._strict import check_snapshot_payload, check_stored_payload
from little_es.aggregates import decode_domain_event, encode_domain_event, is_domain_topic
from little_es.chain import unframe
from little_es.errors import EventPayloadError, UnknownEventTypeError, UnstorableEventError
from little_es.events import WIRE_CONTEXT, Event, Snapshot, StepEvent, event_class_for

_ZLIB = b"\x78"
# A set, not a frozenset: pydantic's ``exclude`` is typed as set or mapping.
_ORIGINATOR_FIELDS: set[str] = {"originator_id", "originator_version"}
# A step event's step_id is read back from its step_path (StepEvent) when it is left out.
_ORIGINATOR_FIELDS_AND_STEP_ID: set[str] = {*_ORIGINATOR_FIELDS, "step_id"}


class OrjsonTranscoder(Transcoder):
    """JSON bytes through orjson; payloads are already JSON-mode dumps of pydantic models."""

    def encode(self, obj: Any) -> bytes:
        """Encode a JSON-compatible object."""
        return orjson.dumps(obj)

    def decode(self, data: bytes) -> Any:
        """Decode JSON bytes."""
        return orjson.loads(data)


def _payload(event: Event, wire_name: str) -> bytes:
    """The event's JSON payload, refused unless a reader would read it back as it is.

    Serialised by pydantic straight to bytes (the same bytes as orjson over a
    JSON-mode dump, measured a little faster), NaN and infinities as the
    constants the recorder then refuses (see :mod:`little_es._strict`).
    """
    cls = type(event)
    exclude = _ORIGINATOR_FIELDS
    if isinstance(event, StepEvent) and event.step_id == event.step_path:
        exclude = _ORIGINATOR_FIELDS_AND_STEP_ID
    try:
        data = cls.__pydantic_serializer__.to_json(
            event,
            exclude=exclude,
            exclude_defaults=True,
            by_alias=True,
            context=WIRE_CONTEXT,
            warnings=False,
        )
    except PydanticSerializationError as exc:
        raise EventPayloadError(
            f"cannot record {wire_name}: a value is not JSON ({exc}): record dicts, lists,"
            " strings, numbers, booleans, None or pydantic models"
        ) from exc
    if cls is Snapshot:
        check_snapshot_payload(event, wire_name, data)
        # A snapshot's JSON repeats each step's keys: zlib makes it a seventh of that
        # (its first byte, 0x78, tells it from JSON on read).
        return zlib.compress(data, 1)
    check_stored_payload(event, wire_name, data)
    if cls.class_version > 1:
        data = b'{"class_version":%d,' % cls.class_version + data[1:]
    return data


class PydanticMapper(Mapper[UUID]):
    """Maps little_es events (frozen pydantic models) to and from eventsourcing's StoredEvent."""

    unframed_allowed = True
    """Whether a row without a chain frame is read (a world created before the chain);
    the world sets it from its record."""

    def to_stored_event(self, domain_event: DomainEventProtocol[UUID]) -> StoredEvent:
        """Serialise an event; its topic is its wire name.

        The state is the bare payload, without the chain frame that
        :meth:`little_es.world.World.save` puts around it.
        """
        if not isinstance(domain_event, Event):
            raise UnstorableEventError(
                f"cannot store {type(domain_event).__module__}.{type(domain_event).__qualname__}:"
                " a world stores little_es events only through its application; define it as"
                " a subclass of little_es.events.RunEvent (or Event) with a wire_name, save an"
                " eventsourcing aggregate through a step's ctx.aggregates (or"
                " world.aggregates()), or save it with the application it belongs to"
            )
        event = domain_event
        topic, data = self.encode_payload(event)
        return StoredEvent(
            originator_id=event.originator_id,
            originator_version=event.originator_version,
            topic=topic,
            state=data,
        )

    def encode_payload(self, event: Event) -> tuple[str, bytes]:
        """An event's topic (its wire name) and payload bytes."""
        wire_name = type(event).wire_name
        if not wire_name:
            raise UnstorableEventError(
                f"{type(event).__qualname__} has no wire_name: set"
                ' `wire_name: ClassVar[str] = "..."` on the class to make it storable'
            )
        data = _payload(event, wire_name)
        if self.compressor:
            data = self.compressor.compress(data)
        if self.cipher:
            data = self.cipher.encrypt(data)
        return wire_name, data

    def encode_any(self, event: object) -> tuple[str, bytes]:
        """:meth:`encode_payload`, or for a user's eventsourcing domain event (a step's
        aggregate, :mod:`little_es.aggregates`) its eventsourcing topic and payload."""
        if isinstance(event, Event):
            return self.encode_payload(event)
        return encode_domain_event(event)

    def to_domain_event(self, stored_event: StoredEvent) -> DomainEventProtocol[UUID]:
        """Deserialise, upcast and validate a stored event: a little_es event, or a user's
        eventsourcing domain event (:mod:`little_es.aggregates`), so an eventsourcing
        projection over the world's log reads both."""
        topic = stored_event.topic
        if event_class_for(topic) is None and is_domain_topic(topic):
            sid = stored_event.originator_id
            stream_id = sid if isinstance(sid, UUID) else UUID(sid)
            version = stored_event.originator_version
            payload = unframe(stream_id, version, topic, stored_event.state, unframed_allowed=False)
            return cast(
                DomainEventProtocol[UUID],
                decode_domain_event(stream_id, version, topic, payload),
            )
        return cast(DomainEventProtocol[UUID], self.decode(stored_event))

    def decode(self, stored: StoredEvent) -> Event:
        """Like :meth:`to_domain_event`, typed for little_es callers."""
        sid = stored.originator_id
        stream_id = sid if isinstance(sid, UUID) else UUID(sid)
        return self.decode_row(stream_id, stored.originator_version, stored.topic, stored.state)

    def decode_row(self, stream_id: UUID, version: int, topic: str, data: bytes) -> Event:
        """Deserialise, upcast and validate one stored row of stream ``stream_id``.

        The row's own digest is checked (:func:`~little_es.chain.unframe`); its
        link to the rest of its stream is not: a reader of whole streams uses
        :func:`~little_es.chain.verify_stream` and :meth:`decode_payload`.
        """
        payload = unframe(stream_id, version, topic, data, unframed_allowed=self.unframed_allowed)
        return self.decode_payload(stream_id, version, topic, payload)

    def decode_payload(self, stream_id: UUID, version: int, topic: str, data: bytes) -> Event:
        """Deserialise, upcast and validate the payload of one row (its frame removed).

        The read path's hot loop: it takes the row's columns as they come from
        the database, so a stream's rows share one ``stream_id`` object instead
        of each building its own UUID.
        """
        cls = event_class_for(topic)
        if cls is None:
            raise UnknownEventTypeError(
                f"stored event {topic!r} (stream {stream_id}, version {version}) has no"
                " registered event class: import the module that defines it before reading"
                " this log (from the command line: little --import MODULE ...)"
            )
        if self.cipher:
            data = self.cipher.decrypt(data)
        if self.compressor:
            data = self.compressor.decompress(data)
        if cls is Snapshot and data[:1] == _ZLIB:
            data = _decompressed(data, stream_id, version)
        if cls.class_version == 1:
            # A payload in the class's own schema is validated straight from its
            # JSON bytes (no intermediate dict: measured 1.3-1.4x faster to read a
            # harness-heavy log). Anything it refuses, including an old or newer
            # class_version, takes the path below, which names the problem.
            try:
                event: Event = cls.__pydantic_validator__.validate_json(data)
            except ValidationError:
                pass
            else:
                # The position comes from the row, not the payload (see Event).
                fields = event.__dict__
                fields["originator_id"] = stream_id
                fields["originator_version"] = version
                return event
        return _decode_state(cls, stream_id, version, topic, self.transcoder.decode, data)


def _decompressed(data: bytes, stream_id: UUID, version: int) -> bytes:
    try:
        return zlib.decompress(data)
    except zlib.error as exc:
        raise EventPayloadError(
            f"the stored snapshot of stream {stream_id} at version {version} does not"
            f" decompress ({exc}); the log is corrupt"
        ) from exc


def _decode_state(
    cls: type[Event],
    stream_id: UUID | str,
    version: int,
    topic: str,
    decode: Callable[[bytes], Any],
    data: bytes,
) -> Event:
    """Parse, upcast and validate a payload through a dict; every refusal names its cause."""
    try:
        state = decode(data)
    except orjson.JSONDecodeError as exc:
        raise EventPayloadError(
            f"stored event {topic!r} (stream {stream_id}, version {version}) is not valid"
            f" JSON: {exc}; the log is corrupt"
        ) from exc
    if type(state) is not dict:
        raise EventPayloadError(
            f"stored event {topic!r} (stream {stream_id}, version {version}) is not a JSON"
            " object; the log is corrupt"
        )
    if "class_version" in state or cls.class_version != 1:
        _upcast(cls, state, topic, stream_id, version)
    state["originator_id"] = stream_id
    state["originator_version"] = version
    try:
        event: Event = cls.__pydantic_validator__.validate_python(state)
    except ValidationError as exc:
        fields = ", ".join(
            ".".join(str(p) for p in err["loc"]) + f" ({err['msg']})" for err in exc.errors()
        )
        raise EventPayloadError(
            f"stored event {topic!r} (stream {stream_id}, version {version}) has a"
            f" malformed payload: {fields}"
        ) from exc
    return event


def _upcast(
    cls: type[Event], state: dict[str, Any], topic: str, stream_id: UUID | str, version: int
) -> None:
    """Bring a stored payload from its ``class_version`` up to ``cls.class_version``, in place."""
    from_version = state.pop("class_version", 1)
    if type(from_version) is not int or not 1 <= from_version <= cls.class_version:
        # A payload from newer code may mean something this code cannot tell.
        raise EventPayloadError(
            f"stored event {topic!r} (stream {stream_id}, version {version}) has"
            f" class_version {from_version!r}, but {cls.__qualname__} is at class_version"
            f" {cls.class_version}: read this log with the code that wrote it (or newer)"
        )
    while from_version < cls.class_version:
        upcast = getattr(cls, f"upcast_v{from_version}_v{from_version + 1}", None)
        if upcast is None:
            raise EventPayloadError(
                f"{cls.__qualname__} is at class_version {cls.class_version} but has no"
                f" upcast_v{from_version}_v{from_version + 1}() for a stored version"
                f" {from_version} payload: add it"
            )
        upcast(state)
        from_version += 1

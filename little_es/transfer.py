"""Moving a world: ``little export`` writes every stream of a world as JSONL, ``little import``
appends it to another world, on any backend.

The stream (format :data:`FORMAT`, version :data:`FORMAT_VERSION`) is one JSON object
per line, in this order::

    {"type": "header", "format": "little_es.world-export", "format_version": 1,
     "world_id": "…", "log_format": 4, "source": "sqlite:///…", "exported_at": "…",
     "counts": {"streams": S, "events": E, "snapshots": N, "artifacts": A}}
    {"type": "stream", "stream_id": "…", "kind": "run", "name": "run_x", "version": 12,
     "head": {"version": 12, "digest": "<hex>", "running": "<hex>"}}            S lines
    {"type": "event", "stream_id": "…", "version": 1, "topic": "RunStarted",
     "frame": "<hex of the chain frame (21 bytes; 33 in log format 3, 65 in 2), or null>",
     "payload": "<the JSON as stored>"}
                                                            E lines, in the world's log order
    {"type": "snapshot", …the fields of an event…}                                 N lines
    {"type": "artifact", "sha256": "…", "size": 123, "data": "<base64>"}          A lines
    {"type": "trailer", "counts": {…as in the header…}, "sha256": "<hex>"}

Every row travels as stored: its chain frame (:mod:`little_es.chain`) and its payload's
exact bytes (``payload_b64`` instead of ``payload`` for bytes that are not UTF-8), so the
events keep their ids, versions and timestamps and the chain still verifies on the
target. A stream's ``head`` covers every row exported. Events of the user's own classes
(``RunEvent`` subclasses, eventsourcing aggregates) travel without their classes being
importable where the world is moved: their payloads must be JSON objects. The trailer's
``sha256`` is the digest of every byte before the trailer line: a truncated stream (no
trailer), lines added, removed, changed or moved are refused.

:func:`import_world` reads the whole stream and checks it before it writes anything: the
format and version, the header's log format against the exported world's record, the
trailer, each stream's rows against their chain and head (as a read of the world does),
every payload and snapshot decoded as strictly as the readers do, every artifact the
events reference present and hashing to its address, and that the target holds none of
the streams. Then it writes the artifacts (before the events that reference them, as
every commit does) and appends every row and snapshot in one transaction. The
world's own record (:class:`~little_es.events.WorldCreated`) is taken by a target that
has none yet (it becomes the exported world); a target that has one keeps it.
"""

from __future__ import annotations

import base64
import hashlib
import io
from collections.abc import Callable, Iterator
from typing import IO, Any, Literal
from uuid import UUID

import orjson
from eventsourcing.persistence import StoredEvent
from pydantic import BaseModel, ConfigDict, ValidationError

from little_es.aggregates import check_domain_payload, is_domain_topic
from little_es.backends.base import artifact_digest
from little_es.chain import (
    Head,
    check_rows,
    feed,
    frame_size,
    is_framed,
    links,
    payload_of,
    row_digest,
    row_prev,
    seed,
    unframe,
    verify_stream,
)
from little_es.codec import PydanticMapper
from little_es.errors import (
    ArtifactIntegrityError,
    ArtifactNotFoundError,
    ConcurrencyConflictError,
    EventLogError,
    EventPayloadError,
    ExportFormatError,
    ExportTruncatedError,
    ExportVersionError,
    ImportConflictError,
    LogTamperedError,
)
from little_es.events import (
    LOG_FORMAT_LINKED,
    LOG_FORMAT_UNCHAINED,
    Event,
    RunForked,
    RunStarted,
    SessionStarted,
    WorldCreated,
    event_class_for,
    utc_now,
)
from little_es.ids import world_stream_id
from little_es.outer_loop import encode_view, loop_view
from little_es.values import ArtifactRef
from little_es.verify import artifact_refs, identify_stream
from little_es.world import World

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "TransferCounts",
    "TransferProgress",
    "export_world",
    "import_world",
]

FORMAT = "little_es.world-export"
"""The ``format`` of an export's header line."""
FORMAT_VERSION = 1
"""The format version this little_es writes and reads."""

_PAGE = 500

TransferProgress = Callable[[str, int, int], None]
"""Called as work advances: (what is being done, how much is done, of how much)."""


class TransferCounts(BaseModel):
    """What an export carries (its header's and trailer's ``counts``), or an import appended."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    streams: int = 0
    events: int = 0
    snapshots: int = 0
    artifacts: int = 0


def _ignore(what: str, done: int, total: int) -> None:
    return None


def _progress(progress: object) -> TransferProgress:
    if progress is None:
        return _ignore
    if not callable(progress):
        raise TypeError(f"progress must be a callable(what, done, total) or None, got {progress!r}")
    return progress


# ---------------------------------------------------------------------- export


class _Writer:
    """Writes lines and keeps the digest of every byte written (the trailer's ``sha256``)."""

    def __init__(self, out: IO[bytes] | IO[str]) -> None:
        self._text = isinstance(out, io.TextIOBase)
        self._out = out
        self.digest = hashlib.sha256()

    def line(self, obj: dict[str, Any]) -> None:
        data = orjson.dumps(obj) + b"\n"
        self.digest.update(data)
        if self._text:
            self._out.write(data.decode())  # type: ignore[call-overload]
        else:
            self._out.write(data)  # type: ignore[arg-type]


def _row_fields(stream_id: UUID, version: int, topic: str, data: bytes) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "stream_id": str(stream_id),
        "version": version,
        "topic": topic,
        "frame": data[: frame_size(data)].hex() if is_framed(data) else None,
    }
    payload = payload_of(data)
    try:
        fields["payload"] = payload.decode()
    except UnicodeDecodeError:
        fields["payload_b64"] = base64.b64encode(payload).decode()
    return fields


_REF_FIELDS = frozenset(ArtifactRef.model_fields)
_REF_REQUIRED = frozenset(n for n, f in ArtifactRef.model_fields.items() if f.is_required())


def _raw_refs(value: object) -> Iterator[ArtifactRef]:
    """The artifact references in the JSON of an event whose class this process has not
    imported (a user's own event): every object with the fields of an ArtifactRef, at any
    depth, that validates as one. Without them its artifacts would be left behind."""
    if isinstance(value, dict):
        keys = value.keys()
        if _REF_REQUIRED <= keys <= _REF_FIELDS:
            try:
                yield ArtifactRef.model_validate(value)
                return
            except ValidationError:
                pass
        for item in value.values():
            yield from _raw_refs(item)
    elif isinstance(value, list):
        for item in value:
            yield from _raw_refs(item)


def _row_refs(event: Event | None, payload: bytes) -> Iterator[ArtifactRef]:
    """The artifact references of one row: ``event``'s, or, for a row of a class this
    process has not imported (``event`` None), those found in its JSON."""
    if event is not None:
        yield from artifact_refs(event)
        return
    try:
        state = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return  # a user's aggregate in another encoding: nothing to find
    yield from _raw_refs(state)


def _checked(
    mapper: PydanticMapper, stream_id: UUID, version: int, topic: str, payload: bytes
) -> Event | None:
    """One row's payload decoded and validated as the readers do; None for a class of the
    user's this process has not imported.

    A user's eventsourcing aggregate's event (``module:qualname``) or own ``RunEvent`` (a wire
    name no imported class registers) need not be importable where a world is moved (the
    ``little`` command imports none of the user's code): its payload must be a JSON object,
    and its bytes are the ones its writer validated, as the chain proves. Whoever reads it
    with the class decodes it, as on the source.
    """
    if event_class_for(topic) is not None:
        return mapper.decode_payload(stream_id, version, topic, payload)
    if is_domain_topic(topic):
        check_domain_payload(stream_id, version, topic, payload)
        return None
    try:
        state = orjson.loads(payload)
    except orjson.JSONDecodeError as exc:
        raise EventPayloadError(
            f"stored event {topic!r} (stream {stream_id}, version {version}) is not valid"
            f" JSON: {exc}; the log is corrupt"
        ) from None
    if not isinstance(state, dict):
        raise EventPayloadError(
            f"stored event {topic!r} (stream {stream_id}, version {version}) is not a JSON"
            " object; the log is corrupt"
        )
    return None


def _notifications(world: World, last: int) -> Iterator[tuple[UUID, int, str, bytes]]:
    """The world's log up to notification ``last``, in order: (stream, version, topic, bytes)."""
    recorder = world.app.recorder
    start: int | None = None
    while True:
        page = recorder.select_notifications(
            start=start, limit=_PAGE, stop=last, inclusive_of_start=start is None
        )
        if not page:
            return
        for n in page:
            sid = n.originator_id
            yield (
                sid if isinstance(sid, UUID) else UUID(str(sid)),
                n.originator_version,
                n.topic,
                n.state,
            )
        if page[-1].id >= last:
            return
        start = page[-1].id


def export_world(
    world: World, out: IO[bytes] | IO[str], *, progress: TransferProgress | None = None
) -> TransferCounts:
    """Write every stream, snapshot and artifact of ``world`` to ``out`` (see the module doc).

    What the world held when the export began is exported: rows appended meanwhile are
    left for a later export. Each stream is read as the runtime reads it (its chain and
    head verified, its payloads decoded), so a damaged world is refused
    (:class:`~little_es.errors.LogTamperedError`, an
    :class:`~little_es.errors.ArtifactError`) instead of moved. ``progress`` is told
    how far it got. Returns what was written.
    """
    if not isinstance(world, World):
        raise TypeError(f"export_world needs a World (from open_world()), got {type(world)}")
    if not callable(getattr(out, "write", None)):
        raise TypeError(f"export_world writes to a file object, got {type(out).__name__}")
    tell = _progress(progress)
    last = world.app.recorder.max_notification_id() or 0
    # Pass 1: which streams, up to which version (as of ``last``), in the log's order.
    versions: dict[UUID, int] = {}
    for stream_id, version, _topic, _data in _notifications(world, last):
        versions[stream_id] = max(version, versions.get(stream_id, 0))
    # A head without rows in the log is a stream deleted whole (`little verify --all` finds
    # it): its read refuses it, rather than the export leaving it out as if it never was.
    # One that has rows by now was written after the export began (left for the next one).
    for stream_id in world.backend.stream_heads():
        if stream_id not in versions:
            world.verified_stream(stream_id)
    mapper = world.app.mapper
    assert isinstance(mapper, PydanticMapper)
    streams: list[dict[str, Any]] = []
    refs: dict[str, ArtifactRef] = {}
    snapshots: list[dict[str, Any]] = []
    world_id, log_format = None, LOG_FORMAT_LINKED
    total = len(versions)
    for done, (stream_id, upto) in enumerate(versions.items()):
        tell("checking streams", done, total)
        rows = list(world.verified_stream(stream_id).rows[:upto])
        running = seed(stream_id)
        first: Event | None = None
        for version, topic, data in rows:
            feed(running, topic, data)
            payload = payload_of(data)
            event = _checked(mapper, stream_id, version, topic, payload)
            for ref in _row_refs(event, payload):
                refs.setdefault(ref.sha256, ref)
            if event is not None:
                first = first or event
        digest = check_rows(stream_id, rows)
        kind, name = identify_stream(stream_id, first)
        if isinstance(first, WorldCreated):
            world_id, log_format = first.world_id, first.log_format
        if kind == "stream" and rows and is_domain_topic(rows[0][1]):
            kind, name = "aggregate", rows[0][1].rsplit(".", 1)[0]
        streams.append(
            {
                "type": "stream",
                "stream_id": str(stream_id),
                "kind": kind,
                "name": name,
                "version": upto,
                "head": {
                    "version": upto,
                    "digest": digest.hex(),
                    "running": running.digest().hex(),
                },
            }
        )
        if world.app.snapshots is not None and kind == "run":
            for snap in world.app.snapshots.recorder.select_events(stream_id):
                if snap.originator_version <= upto and is_framed(snap.state):
                    snapshots.append(
                        {
                            "type": "snapshot",
                            **_row_fields(
                                stream_id, snap.originator_version, snap.topic, snap.state
                            ),
                        }
                    )
    tell("checking streams", total, total)
    for done, ref in enumerate(refs.values()):
        # Read (and re-hashed) now, so a missing or corrupt artifact stops the export before
        # its first line; read again when written, so no blob is held in memory meanwhile.
        tell("checking artifacts", done, len(refs))
        world.artifacts.get(ref)
    tell("checking artifacts", len(refs), len(refs))
    counts = TransferCounts(
        streams=len(streams),
        events=sum(versions.values()),
        snapshots=len(snapshots),
        artifacts=len(refs),
    )
    writer = _Writer(out)
    writer.line(
        {
            "type": "header",
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "world_id": world_id,
            "log_format": log_format,
            "source": world.name,
            "exported_at": utc_now().isoformat(),
            "counts": counts.model_dump(),
        }
    )
    for stream in streams:
        writer.line(stream)
    written = 0
    for stream_id, version, topic, data in _notifications(world, last):
        if written % _PAGE == 0:
            tell("writing events", written, counts.events)
        writer.line({"type": "event", **_row_fields(stream_id, version, topic, data)})
        written += 1
    tell("writing events", written, counts.events)
    for line in snapshots:
        writer.line(line)
    for ref in refs.values():
        data = world.artifacts.get(ref).payload
        writer.line(
            {
                "type": "artifact",
                "sha256": ref.sha256,
                "size": len(data),
                "data": base64.b64encode(data).decode(),
            }
        )
    writer.line(
        {"type": "trailer", "counts": counts.model_dump(), "sha256": writer.digest.hexdigest()}
    )
    return counts


# ---------------------------------------------------------------------- import


class _Stream(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    type: Literal["stream"]
    stream_id: UUID
    kind: str
    name: str
    version: int
    head: dict[str, Any]


def _fail(line_no: int, what: str) -> ExportFormatError:
    return ExportFormatError(
        f"line {line_no} of the export: {what}; the file is not an unchanged `little export`"
        " stream: export the world again (nothing was imported)"
    )


def _row_of(obj: dict[str, Any], line_no: int) -> tuple[UUID, int, str, bytes]:
    try:
        stream_id = UUID(obj["stream_id"])
        version = obj["version"]
        topic = obj["topic"]
        frame = obj.get("frame")
        if "payload_b64" in obj:
            payload = base64.b64decode(obj["payload_b64"], validate=True)
        else:
            payload = obj["payload"].encode()
    except (KeyError, ValueError, TypeError, AttributeError) as exc:
        raise _fail(
            line_no, f"a row without a valid stream_id, version, topic or payload ({exc})"
        ) from None
    if not isinstance(version, int) or version < 1 or not isinstance(topic, str) or not topic:
        raise _fail(line_no, "a row's version must be a positive integer and its topic a name")
    head = b"" if frame is None else _frame_of(frame, line_no)
    return stream_id, version, topic, head + payload


def _frame_of(value: object, line_no: int) -> bytes:
    """An exported row's frame: its tag says its size (:mod:`little_es.chain`)."""
    try:
        data = bytes.fromhex(value) if isinstance(value, str) else b""
    except ValueError:
        data = b""
    if not data or frame_size(data) != len(data):
        raise _fail(line_no, "frame is not a chain frame in hex (21, 33 or 65 bytes)")
    return data


class _Parsed:
    def __init__(self) -> None:
        self.header: dict[str, Any] = {}
        self.streams: dict[UUID, _Stream] = {}
        self.events: list[tuple[UUID, int, str, bytes]] = []
        self.snapshots: list[tuple[UUID, int, str, bytes]] = []
        self.blobs: dict[str, bytes] = {}


_ORDER = ("header", "stream", "event", "snapshot", "artifact", "trailer")


def _parse(source: IO[bytes] | IO[str], tell: TransferProgress) -> _Parsed:
    parsed = _Parsed()
    digest = hashlib.sha256()
    stage = -1
    line_no = 0
    trailer: dict[str, Any] | None = None
    snapshotted: set[tuple[UUID, int]] = set()
    for raw in source:
        line_no += 1
        data = raw.encode() if isinstance(raw, str) else raw
        if trailer is not None:
            raise _fail(line_no, "a line after the trailer")
        if not data.endswith(b"\n"):
            raise ExportTruncatedError(
                f"the export ends in the middle of line {line_no}: it was cut off; export"
                " the world again (nothing was imported)"
            )
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise _fail(line_no, f"not JSON ({exc})") from None
        if not isinstance(obj, dict) or obj.get("type") not in _ORDER:
            raise _fail(line_no, f"not a line of an export (type {_type_of(obj)!r})")
        kind = obj["type"]
        rank = _ORDER.index(kind)
        if line_no == 1:
            _check_header(obj)
            parsed.header = obj
        elif rank == 0 or rank < stage:
            raise _fail(line_no, f"a {kind} line out of place (the lines were moved)")
        stage = rank
        if kind == "trailer":
            trailer = obj
            if obj.get("sha256") != digest.hexdigest():
                raise _fail(
                    line_no,
                    "the trailer's digest does not match the lines before it (lines were"
                    " changed, added, removed or moved)",
                )
            continue
        digest.update(data)
        if kind == "stream":
            try:
                stream = _Stream.model_validate(obj)
            except ValueError as exc:
                raise _fail(line_no, f"a stream line that does not validate ({exc})") from None
            if stream.version < 1:
                raise _fail(
                    line_no,
                    f"stream {stream.stream_id} declared with {stream.version} events (every"
                    " stream exported holds one or more)",
                )
            if stream.stream_id in parsed.streams:
                raise _fail(line_no, f"stream {stream.stream_id} declared twice")
            parsed.streams[stream.stream_id] = stream
        elif kind == "event":
            parsed.events.append(_row_of(obj, line_no))
            if len(parsed.events) % _PAGE == 0:
                tell("reading", len(parsed.events), _expected(parsed.header))
        elif kind == "snapshot":
            row = _row_of(obj, line_no)
            if row[:2] in snapshotted:
                raise _fail(line_no, f"a second snapshot of stream {row[0]} at version {row[1]}")
            snapshotted.add(row[:2])
            parsed.snapshots.append(row)
        elif kind == "artifact":
            sha, blob = obj.get("sha256"), obj.get("data")
            try:
                payload = base64.b64decode(blob, validate=True) if isinstance(blob, str) else None
            except ValueError:
                payload = None
            if not isinstance(sha, str) or payload is None:
                raise _fail(line_no, "an artifact line without sha256 and base64 data")
            if artifact_digest(payload) != sha:
                raise ArtifactIntegrityError(
                    f"line {line_no} of the export: artifact sha256:{sha} holds bytes that hash"
                    f" to sha256:{artifact_digest(payload)}: the file was changed; export the"
                    " world again (nothing was imported)"
                )
            parsed.blobs[sha] = payload
    if line_no == 0:
        raise ExportTruncatedError("the export is empty: no header line (nothing was imported)")
    if trailer is None:
        raise ExportTruncatedError(
            f"the export ends after line {line_no} without its trailer: it was cut off;"
            " export the world again (nothing was imported)"
        )
    counts = TransferCounts(
        streams=len(parsed.streams),
        events=len(parsed.events),
        snapshots=len(parsed.snapshots),
        artifacts=len(parsed.blobs),
    ).model_dump()
    if parsed.header.get("counts") != counts or trailer.get("counts") != counts:
        raise _fail(
            line_no,
            f"the export holds {counts}, its header says {parsed.header.get('counts')}",
        )
    return parsed


def _expected(header: dict[str, Any]) -> int:
    events = header["counts"].get("events")
    return events if isinstance(events, int) else 0


def _type_of(obj: object) -> object:
    return obj.get("type") if isinstance(obj, dict) else type(obj).__name__


def _check_header(obj: dict[str, Any]) -> None:
    if obj.get("type") != "header" or obj.get("format") != FORMAT:
        raise _fail(1, f"no {FORMAT} header (is this the output of `little export`?)")
    version = obj.get("format_version")
    if version != FORMAT_VERSION:
        raise ExportVersionError(
            f"the export is in format version {version!r}; this little_es reads version"
            f" {FORMAT_VERSION}: import it with the little_es that exported it, or export"
            " the world again with this one (nothing was imported)"
        )
    if obj.get("log_format") not in (1, 2, 3, 4) or not isinstance(obj.get("counts"), dict):
        raise _fail(1, "a header without log_format and counts")


def import_world(
    world: World, source: IO[bytes] | IO[str], *, progress: TransferProgress | None = None
) -> TransferCounts:
    """Append a :func:`export_world` stream to ``world``, all or nothing (see the module doc).

    Everything is checked before anything is written; a refusal leaves ``world``
    unchanged and raises :class:`~little_es.errors.ExportFormatError` (a malformed,
    changed or moved line; :class:`~little_es.errors.ExportTruncatedError` for a cut-off
    file, :class:`~little_es.errors.ExportVersionError` for another format version),
    :class:`~little_es.errors.LogTamperedError` (a stream whose rows do not match their
    chain), an :class:`~little_es.errors.EventLogError` (a payload that does not decode),
    :class:`~little_es.errors.ArtifactNotFoundError` (an event references an artifact
    the file does not carry) or :class:`~little_es.errors.ImportConflictError` (the
    world already holds one of the streams). Returns what was appended.
    """
    if not isinstance(world, World):
        raise TypeError(f"import_world needs a World (from open_world()), got {type(world)}")
    if not callable(getattr(source, "readline", None)):
        raise TypeError(f"import_world reads a file object, got {type(source).__name__}")
    tell = _progress(progress)
    parsed = _parse(source, tell)
    mapper = world.app.mapper
    assert isinstance(mapper, PydanticMapper)

    by_stream: dict[UUID, list[tuple[int, str, bytes]]] = {sid: [] for sid in parsed.streams}
    for stream_id, version, topic, data in parsed.events:
        rows = by_stream.get(stream_id)
        if rows is None:
            raise ExportFormatError(
                f"the export holds events of stream {stream_id}, which it does not declare:"
                " export the world again (nothing was imported)"
            )
        rows.append((version, topic, data))
    # Rows may lack a frame only where the world that reads them was made before the chain.
    # A new target becomes the exported world; a target that keeps its own record takes
    # such rows only if it is that old too (refused below, before anything is written).
    legacy = _log_format(parsed, by_stream, mapper) == LOG_FORMAT_UNCHAINED
    heads: dict[UUID, Head] = {}
    refs: dict[str, ArtifactRef] = {}
    total = len(by_stream)
    for done, (stream_id, rows) in enumerate(by_stream.items()):
        tell("checking streams", done, total)
        declared = parsed.streams[stream_id]
        head = _declared_head(declared)
        owner: str | None = None
        try:
            verify_stream(stream_id, rows, head, legacy=legacy)
            check_rows(stream_id, rows)
            if len(rows) != declared.version:
                raise LogTamperedError(
                    f"stream {stream_id} ({declared.kind} {declared.name}): the export carries"
                    f" {len(rows)} of its {declared.version} events"
                )
            first: Event | None = None
            for version, topic, data in rows:
                payload = payload_of(data)
                event = _checked(mapper, stream_id, version, topic, payload)
                if event is not None:
                    first = first or event
                    if isinstance(first, RunStarted | RunForked | SessionStarted):
                        owner = first.run_id
                for ref in _row_refs(event, payload):
                    # A reference found in the JSON of a class not imported here only
                    # says which bytes travel: its event's own checks are its class's.
                    if event is not None and owner is not None and ref.run_id != owner:
                        raise ArtifactIntegrityError(
                            f"stream {stream_id}, version {version}: references artifact"
                            f" {ref.artifact_id} made for run {ref.run_id!r}, in run {owner!r}"
                            " (a reference was copied from another run)"
                        )
                    refs.setdefault(ref.sha256, ref)
        except (EventLogError, ArtifactIntegrityError) as exc:
            raise type(exc)(
                f"in the export, {declared.kind} {declared.name}: {exc} (nothing was imported)"
            ) from exc
        kind, name = identify_stream(stream_id, first)
        if kind == "stream" and rows and is_domain_topic(rows[0][1]):
            kind, name = "aggregate", rows[0][1].rsplit(".", 1)[0]
        # Exports made before forks were told apart name a fork's stream as a stream.
        older_fork = isinstance(first, RunForked) and (declared.kind, declared.name) == (
            "stream",
            str(stream_id),
        )
        if (kind, name) != (declared.kind, declared.name) and not older_fork:
            raise ExportFormatError(
                f"the export declares stream {stream_id} as {declared.kind} {declared.name!r},"
                f" but its events are those of {kind} {name!r}: the file was changed; export"
                " the world again (nothing was imported)"
            )
        heads[stream_id] = head
    tell("checking streams", total, total)
    for sha, ref in refs.items():
        if sha not in parsed.blobs and not world.artifacts.exists(ref):
            raise ArtifactNotFoundError(
                f"artifact {ref.artifact_id} of run {ref.run_id!r}, step {ref.step_path!r} is"
                " referenced by the export but not in it: export the world again (nothing was"
                " imported)"
            )
    snapshots = _checked_snapshots(world, parsed, by_stream)

    # The target: it holds none of the streams (its own record aside, which it keeps).
    record = world_stream_id()
    keep_own_record = world.recorded
    if keep_own_record and legacy and not world.unframed_rows_allowed:
        raise ImportConflictError(
            f"the export holds rows from before the hash chain (log format 1), and world"
            f" {world.name} does not take those: import it into a new world (nothing was"
            " imported)"
        )
    held = [
        parsed.streams[sid]
        for sid in by_stream
        if not (sid == record and keep_own_record)
        and (
            world.app.recorder.select_events(sid, limit=1)
            or world.backend.stream_head(sid) is not None
        )
    ]
    if held:
        names = ", ".join(f"{s.kind} {s.name}" for s in held[:5])
        raise ImportConflictError(
            f"world {world.name} already holds {len(held)} of the exported streams ({names}"
            f"{', ...' if len(held) > 5 else ''}): nothing was imported; import into a world"
            " that holds none of them (a new one)"
        )
    stored = [
        StoredEvent(sid, version, topic, data)
        for sid, version, topic, data in parsed.events
        if not (sid == record and keep_own_record)
    ]
    if keep_own_record:
        heads.pop(record, None)
    needed = [(sha, ref) for sha, ref in refs.items() if sha in parsed.blobs]
    for done, (sha, ref) in enumerate(needed):
        tell("writing artifacts", done, len(needed))
        world.artifacts.put(
            parsed.blobs[sha], run_id=ref.run_id, step_path=ref.step_path, media_type=ref.media_type
        )
    tell("writing events", 0, len(stored))
    try:
        world.insert_imported(
            stored, heads, [StoredEvent(sid, v, t, d) for sid, v, t, d in snapshots]
        )
    except ConcurrencyConflictError as exc:
        raise ImportConflictError(
            f"world {world.name}: {exc} (another process wrote one of the exported streams"
            " while this import checked them)"
        ) from exc
    tell("writing events", len(stored), len(stored))
    if world.backend.keeps_outer_loop_views:
        for declared in parsed.streams.values():
            if declared.kind == "outer_loop":
                loop = world.load_outer_loop(declared.name)
                if loop is not None:
                    world.backend.write_outer_loop_view(
                        declared.name, encode_view(loop_view(world, loop))
                    )
    return TransferCounts(
        streams=len({s.originator_id for s in stored}),
        events=len(stored),
        snapshots=len(snapshots),
        artifacts=len(needed),
    )


def _log_format(
    parsed: _Parsed, by_stream: dict[UUID, list[tuple[int, str, bytes]]], mapper: PydanticMapper
) -> int:
    """The exported world's log format, as its record says; the header's must agree."""
    header: int = parsed.header["log_format"]
    record: Event | None = None
    rows = by_stream.get(world_stream_id())
    if rows:
        version, topic, data = rows[0]
        try:
            record = _checked(mapper, world_stream_id(), version, topic, payload_of(data))
        except EventLogError:
            return header  # the check of its stream refuses it, naming what is wrong
    elif by_stream:
        # A world records itself with its first save: one that held a stream holds its
        # record. Taken without it, a new target would record itself on its next opening
        # as a world from before the chain (its rows then free to lack a frame).
        raise ExportFormatError(
            "the export holds streams but not the exported world's own record (the stream"
            " of its WorldCreated): the file was changed; export the world again (nothing"
            " was imported)"
        )
    # An export without a record (of a world that held nothing) is written as linked.
    log_format = record.log_format if isinstance(record, WorldCreated) else LOG_FORMAT_LINKED
    if header != log_format:
        raise ExportFormatError(
            f"the export's header gives log format {header}, but the exported world is in"
            f" log format {log_format}: the file was changed; export the world again (nothing"
            " was imported)"
        )
    return log_format


def _declared_head(declared: _Stream) -> Head:
    """The head a stream line declares, its fields checked."""
    fields = declared.head

    def digest(name: str, sizes: tuple[int, ...]) -> bytes:
        value = fields.get(name)
        try:
            data = bytes.fromhex(value) if isinstance(value, str) else b""
        except ValueError:
            data = b""
        if len(data) not in sizes:
            raise ExportFormatError(
                f"the export's stream {declared.stream_id} has a head whose {name} is not"
                f" {' or '.join(map(str, sizes))} bytes of hex: the file was changed; export"
                " the world again (nothing was imported)"
            )
        return data

    if fields.get("version") != declared.version:
        raise ExportFormatError(
            f"the export's stream {declared.stream_id} declares {declared.version} events and a"
            f" head at version {fields.get('version')!r}: the file was changed; export the world"
            " again (nothing was imported)"
        )
    # A row's digest is 16 bytes (32 for a row of log format 2); the running digest is whole.
    return Head(declared.version, digest("digest", (16, 32)), digest("running", (32,)))


def _checked_snapshots(
    world: World, parsed: _Parsed, by_stream: dict[UUID, list[tuple[int, str, bytes]]]
) -> list[tuple[UUID, int, str, bytes]]:
    """The snapshots, each checked to stand on the exported event of its version and to
    decode as a load of its run reads it."""
    for stream_id, version, topic, data in parsed.snapshots:
        rows = by_stream.get(stream_id, [])
        try:
            unframe(stream_id, version, topic, data, unframed_allowed=False)
            if version > len(rows) or not links(row_digest(rows[version - 1][2]), row_prev(data)):
                raise LogTamperedError(
                    f"at version {version}, it does not stand on the exported event of that version"
                )
            world.decode_snapshot(stream_id, version, topic, data)
        except EventLogError as exc:
            raise type(exc)(
                f"in the export, the snapshot of stream {stream_id}: {exc} (nothing was imported)"
            ) from exc
    return parsed.snapshots

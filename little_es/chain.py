"""The hash chain that makes every stream tamper-evident.

Each stored row of a stream is framed::

    0x03 | link (4 bytes) | digest (16 bytes) | payload

``digest`` is the SHA-256 of ``link``, the stream id, the version, the topic
and the payload bytes as stored, cut to its first 16 bytes; ``link`` is the
first 4 bytes of the previous row's digest (of :data:`GENESIS` for version 1).
So a single row can be checked on its own (:func:`unframe`), and each row names
the one before it. Sixteen bytes of digest are as good as thirty-two against
what the chain is for (an edit must match a digest it cannot choose: 2**128
tries). Four bytes of link are enough to tell that a row does not follow the
one before it, which an edit, a splice or a partial restore leaves: the
stream's running digest (below) covers every byte of every row in full, and
the link is what checks the few rows written after it. A task step's two rows
carry 42 bytes of chain.

Rows framed before carry longer links and digests, and read, verify and link
as they were written; a stream continues from them in today's frame (a link is
the previous digest cut to its size, whatever that digest's length):

* log format 3 (:data:`FRAME_TAG_V2`): ``0x02 | prev (16) | digest (16) | payload``;
* log format 2 (:data:`FRAME_TAG_V1`): ``0x01 | prev (32) | digest (32) | payload``.

A stream read whole is checked in one pass instead (:func:`verify_stream`):
one SHA-256 over the stream id and every row's topic and stored bytes (frame
and payload), in version order, compared with the *head* the backend keeps
for the stream (its last version, its last row's digest and that running
digest; :meth:`~little_es.backends.base.Backend.stream_head`), written in the
same transaction as the rows by every commit that holds a result. An edited
payload, frame or topic, a deleted, inserted, moved or renumbered row, and
rows cut off the end all change it. Only when it differs are the rows checked
one by one, to name the version and what differs (:func:`locate_break`). The
few rows that commits of write-ahead records alone added after the head
(which a power cut may lose anyway, so they need not pay for a second table
write) are checked one by one from it, and must be write-ahead records.

One running hash costs a fraction of a digest per row (measured in
``benchmarks/bench_replay.py``), which is why the fast path does not check
every row's own digest.

What it does not do: a writer that knows this format can recompute a whole
stream and its head. The chain proves a log was not edited, truncated or
spliced by anything but a little_es writer, which is what a bad edit, a
partial restore, a stray ``DELETE`` or a damaged disk look like.

Rows written before the chain existed have no frame (their payload starts
with ``{``). A world created before it (:class:`~little_es.events.WorldCreated`
``log_format`` 1) still reads them, in front of a stream's first framed row;
their bytes enter the running digest like any row's.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any, NamedTuple
from uuid import UUID

from little_es.errors import LogTamperedError
from little_es.events import event_class_for

FRAME_TAG = 0x03
"""The first byte of a row in the frame written today."""
FRAME_TAG_V2 = 0x02
"""The first byte of a row framed with a 16-byte ``prev`` (log format 3)."""
FRAME_TAG_V1 = 0x01
"""The first byte of a row framed with whole digests (log format 2)."""
DIGEST_SIZE = 16
"""Bytes of a row's digest."""
LINK_SIZE = 4
"""Bytes of a row's link: the start of the previous row's digest."""
GENESIS = bytes(32)
"""The digest a stream's first row links to (cut to the link's size in the frame)."""
FRAME_SIZE = 1 + LINK_SIZE + DIGEST_SIZE
"""Bytes in front of the payload of a row framed today."""
# Per tag: the bytes of a row's link and of its digest.
_LAYOUTS = {FRAME_TAG: (LINK_SIZE, DIGEST_SIZE), FRAME_TAG_V2: (16, 16), FRAME_TAG_V1: (32, 32)}
_FRAME_SIZES = {tag: 1 + link + own for tag, (link, own) in _LAYOUTS.items()}
_tag = bytes((FRAME_TAG,))
_tags = frozenset(bytes((tag,)) for tag in _LAYOUTS)
_sha256 = hashlib.sha256
_topics: dict[str, bytes] = {}

Row = tuple[int, str, bytes]
"""One stored row: (version, topic, bytes)."""
Running = Any
"""A ``hashlib.sha256`` object fed with a stream's rows so far (:func:`seed`, :func:`feed`)."""


class Head(NamedTuple):
    """What a backend keeps of a stream, written with its rows."""

    version: int
    """The last version written."""
    digest: bytes
    """The last row's own digest (what the next row links to)."""
    running: bytes
    """The running digest over the whole stream (:func:`seed`, :func:`feed`)."""


def digest(
    prev: bytes, stream_id: UUID, version: int, topic: str, payload: bytes, size: int = DIGEST_SIZE
) -> bytes:
    """The digest of one row (``size`` bytes; 32 for a row of log format 2) whose frame
    records ``prev`` as its link: what its successor links to."""
    h = _sha256(prev)
    h.update(stream_id.bytes)
    h.update(version.to_bytes(8, "big"))
    h.update(topic.encode())
    h.update(b"\x00")
    h.update(payload)
    return h.digest()[:size]


def frame(prev: bytes, stream_id: UUID, version: int, topic: str, payload: bytes) -> bytes:
    """The stored bytes of a row that follows the row whose digest is ``prev``: its frame,
    then ``payload``."""
    link = prev[:LINK_SIZE]
    return b"".join((_tag, link, digest(link, stream_id, version, topic, payload), payload))


def framed(
    prev: bytes, stream_id: UUID, version: int, topic: str, payload: bytes
) -> tuple[bytes, bytes]:
    """:func:`frame` and the row's own digest (what :func:`row_digest` reads back from it):
    the writer's hot path, which links the next row to it."""
    link = prev[:LINK_SIZE]
    own = digest(link, stream_id, version, topic, payload)
    return b"".join((_tag, link, own, payload)), own


def frame_size(data: bytes) -> int:
    """Bytes of ``data``'s frame: 0 for a row without one (written before the chain)."""
    size = _FRAME_SIZES.get(data[0]) if data else None
    return size if size is not None and len(data) >= size else 0


def is_framed(data: bytes) -> bool:
    """Whether ``data`` carries a frame (rows written before the chain do not)."""
    return frame_size(data) > 0


def _split(data: bytes, size: int) -> tuple[bytes, bytes, bytes]:
    """(link, digest, payload) of a row framed in ``size`` bytes."""
    link = _LAYOUTS[data[0]][0]
    return bytes(data[1 : 1 + link]), bytes(data[1 + link : size]), data[size:]


def row_digest(data: bytes) -> bytes:
    """The digest a framed row records for itself (not recomputed)."""
    return _split(data, frame_size(data))[1]


def row_prev(data: bytes) -> bytes:
    """The link a framed row (or snapshot) records: the start of the digest it stands on."""
    return _split(data, frame_size(data))[0]


def links(prev: bytes, recorded: bytes) -> bool:
    """Whether a row whose frame records ``recorded`` as its link follows the row whose
    digest is ``prev`` (a frame records the digest cut to its link's size)."""
    return prev[: len(recorded)] == recorded


def seed(stream_id: UUID) -> Running:
    """The running digest of a stream with no rows."""
    return _sha256(b"little_es stream\x00" + stream_id.bytes)


def payload_of(data: bytes) -> bytes:
    """A stored row's payload: its bytes behind the frame (a row without one as it is)."""
    size = _FRAME_SIZES.get(data[0]) if data else None
    return data[size:] if size is not None and len(data) >= size else data


def feed(running: Running, topic: str, data: bytes) -> None:
    """Add one stored row (its topic and its bytes as stored) to a running digest."""
    topic_bytes = _topics.get(topic)
    if topic_bytes is None:
        topic_bytes = _topics.setdefault(topic, topic.encode() + b"\x00")
    running.update(topic_bytes)
    running.update(data)


def _where(stream_id: UUID, version: int, topic: str) -> str:
    return f"stream {stream_id}, version {version} ({topic!r})"


def unframe(
    stream_id: UUID, version: int, topic: str, data: bytes, *, unframed_allowed: bool = True
) -> bytes:
    """The payload of one stored row, its own digest checked; a row without a frame as it is,
    where ``unframed_allowed`` (a world created before the chain).

    For a reader that sees rows one at a time (the projections, eventsourcing's
    own readers): the link to the rest of the stream is :func:`verify_stream`'s job.
    """
    size = frame_size(data)
    if not size:
        if not unframed_allowed:
            raise LogTamperedError(
                f"{_where(stream_id, version, topic)}: the row carries no chain frame, in a"
                " world whose rows all do"
            )
        return data
    prev, recorded, payload = _split(data, size)
    if digest(prev, stream_id, version, topic, payload, len(recorded)) != recorded:
        raise LogTamperedError(
            f"{_where(stream_id, version, topic)}: the stored row does not match its own"
            " digest (its payload, topic or version was changed after it was written)"
        )
    return payload


class Verified(NamedTuple):
    """A whole stream as :func:`verify_stream` checked it."""

    rows: Sequence[Row]
    """The rows as stored, frames included (:func:`payload_of` gives a row's payload)."""
    digest: bytes
    """The last row's own digest (:data:`GENESIS` for no rows): what the next row links to."""
    running: Running
    """The running digest after the last row, for the next append to continue."""


def verify_stream(
    stream_id: UUID, rows: Sequence[Row], head: Head | None, *, legacy: bool
) -> Verified:
    """Check a whole stream (its rows from version 1, in order); return it with its digests.

    ``head`` is what the backend keeps (None: nothing written since the chain). ``legacy``
    allows rows without a frame in front of the first framed one.

    Raises :class:`~little_es.errors.LogTamperedError` naming the stream, the
    version and what differs.
    """
    running = seed(stream_id)
    update = running.update
    topics = _topics
    at_head = head.version if head is not None else 0
    running_at_head = b""
    expected = 1
    framed = False
    for version, topic, data in rows:
        if version != expected:
            raise LogTamperedError(
                f"stream {stream_id}: version {expected} is missing (the next stored row is"
                f" version {version}); rows were deleted from the log"
            )
        if data[:1] in _tags:
            framed = True
        elif not (legacy and not framed and data[:1] == b"{"):
            raise LogTamperedError(
                f"{_where(stream_id, version, topic)}: the row carries no chain frame, in a"
                " stream or world whose rows all do"
            )
        topic_bytes = topics.get(topic)
        if topic_bytes is None:
            topic_bytes = topics.setdefault(topic, topic.encode() + b"\x00")
        update(topic_bytes)
        update(data)
        if version == at_head:
            running_at_head = running.digest()
        expected += 1
    _check_head(stream_id, rows, head, running_at_head)
    # Rows after the head: write-ahead records committed since the last commit that held
    # a result (those do not move the head). Few, so checked one by one from the head.
    tail = rows[at_head:]
    last_digest = check_rows(stream_id, tail, prev=GENESIS if head is None else head.digest)
    for version, topic, data in tail:
        cls = event_class_for(topic)
        if is_framed(data) and cls is not None and not cls.write_ahead:
            raise LogTamperedError(
                f"{_where(stream_id, version, topic)}: a result after the stream's head (every"
                " commit holding a result moves the head): the row was added by something"
                " other than little_es; restore the world from a backup"
            )
    return Verified(rows, last_digest, running)


def _check_head(
    stream_id: UUID, rows: Sequence[Row], head: Head | None, running_at_head: bytes
) -> None:
    if head is None:
        return
    if head.version < 1:
        # Every head is written with the commit of a row: one before the first row was not.
        raise LogTamperedError(
            f"stream {stream_id} has a head at version {head.version}, before its first row:"
            " the heads table was edited; restore the world from a backup"
        )
    version = rows[-1][0] if rows else 0
    if version < head.version:
        raise LogTamperedError(
            f"stream {stream_id} ends at version {version} but was written up to version"
            f" {head.version}: rows were deleted from the end of the log; restore the world"
            " from a backup"
        )
    at_head = rows[head.version - 1][2]
    if running_at_head != head.running or (
        is_framed(at_head) and row_digest(at_head) != head.digest
    ):
        locate_break(stream_id, rows[: head.version], head)


def check_rows(stream_id: UUID, rows: Sequence[Row], *, prev: bytes = GENESIS) -> bytes:
    """Check every framed row's own digest and its link to the row before (``prev`` for the
    first); return the last digest (``prev`` for no rows). The thorough walk ``little verify``
    makes, the check of rows after a stream's head, and what names a break."""
    for version, topic, data in rows:
        size = frame_size(data)
        if not size:
            # A row from before the chain: only the running digest covers it.
            continue
        recorded_prev, recorded, payload = _split(data, size)
        if not links(prev, recorded_prev):
            raise LogTamperedError(
                f"{_where(stream_id, version, topic)}: the row does not follow version"
                f" {version - 1} (its link to the previous row's digest differs); a row was"
                " replaced, inserted or moved"
            )
        prev = digest(recorded_prev, stream_id, version, topic, payload, len(recorded))
        if prev != recorded:
            raise LogTamperedError(
                f"{_where(stream_id, version, topic)}: the stored row does not match its own"
                " digest (its payload, topic or version was changed after it was written)"
            )
    return prev


def locate_break(stream_id: UUID, rows: Sequence[Row], head: Head) -> None:
    """Raise the :class:`~little_es.errors.LogTamperedError` that names where a stream whose
    running digest differs from its head was changed, row by row."""
    if check_rows(stream_id, rows) != head.digest:
        raise LogTamperedError(
            f"stream {stream_id}, version {head.version}: the last row is not the one that"
            " was written (its digest differs from the stream head); restore the world from"
            " a backup"
        )
    raise LogTamperedError(
        f"stream {stream_id}: its rows do not add up to the running digest of its head;"
        " a row from before the chain was changed, or the stream was rewritten with its"
        " digests recomputed: restore the world from a backup"
    )

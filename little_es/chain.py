"""The hash chain that makes every stream tamper-evident.

Each stored row of a stream is framed::

    0x01 | prev (32 bytes) | digest (32 bytes) | payload

``digest`` is the SHA-256 of ``prev``, the stream id, the version, the topic
and the payload bytes as stored; ``prev`` is the previous row's digest
(:data:`GENESIS` for version 1). So an edited payload, topic or version no
longer matches its own digest, and a deleted, inserted or reordered row
breaks the link to its neighbour. The last row of a stream has no neighbour:
each backend keeps every stream's head (its last version and digest) in the
same transaction as the rows, so a cut-off tail is caught too
(:meth:`~little_es.backends.base.Backend.stream_head`).

What it does not do: a writer that knows this format can recompute a whole
chain. The chain proves a log was not edited, truncated or spliced by
anything but a little_es writer, which is what a bad edit, a partial
restore, a stray ``DELETE`` or a corrupt disk look like.

Rows written before the chain existed have no frame (their payload starts
with ``{``). A world created before it (:class:`~little_es.events.WorldCreated`
``log_format`` 1) still reads them, but only in front of a stream's first
framed row; the chain then starts from the digest they would have had.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from typing import NamedTuple
from uuid import UUID

from little_es.errors import LogTamperedError

FRAME_TAG = 0x01
GENESIS = bytes(32)
"""The ``prev`` of a stream's first row."""
_HEADER = 65
_tag = bytes((FRAME_TAG,))
_sha256 = hashlib.sha256


def digest(prev: bytes, stream_id: UUID, version: int, topic: str, payload: bytes) -> bytes:
    """The digest of one row: what its successor's ``prev`` and the stream head hold."""
    h = _sha256(prev)
    h.update(stream_id.bytes)
    h.update(version.to_bytes(8, "big"))
    h.update(topic.encode())
    h.update(b"\x00")
    h.update(payload)
    return h.digest()


def frame(prev: bytes, stream_id: UUID, version: int, topic: str, payload: bytes) -> bytes:
    """The stored bytes of a row: its frame, then ``payload``."""
    return b"".join((_tag, prev, digest(prev, stream_id, version, topic, payload), payload))


def is_framed(data: bytes) -> bool:
    """Whether ``data`` carries a frame (rows written before the chain do not)."""
    return len(data) >= _HEADER and data[0] == FRAME_TAG


def row_digest(data: bytes) -> bytes:
    """The digest a framed row records for itself (not recomputed)."""
    return bytes(data[33:_HEADER])


def _where(stream_id: UUID, version: int, topic: str) -> str:
    return f"stream {stream_id}, version {version} ({topic!r})"


def unframe(stream_id: UUID, version: int, topic: str, data: bytes) -> bytes:
    """The payload of one stored row, its own digest checked; a row without a frame as it is.

    For a reader that sees rows one at a time (the projections, eventsourcing's
    own readers): the link to the previous row is :func:`verify_rows`'s job.
    """
    if not is_framed(data):
        return data
    prev, recorded, payload = data[1:33], data[33:_HEADER], data[_HEADER:]
    if digest(prev, stream_id, version, topic, payload) != recorded:
        raise LogTamperedError(
            f"{_where(stream_id, version, topic)}: the stored row does not match its own"
            " digest (its payload, topic or version was changed after it was written)"
        )
    return payload


_Row = tuple[int, str, bytes]


class Verified(NamedTuple):
    """A run of rows as :func:`verify_rows` checked them."""

    rows: list[_Row]
    """``(version, topic, payload)``, frames removed."""
    digest: bytes | None
    """The last row's digest (``prev`` as given when there were no rows)."""
    chained: bool
    """Whether any row read carried a frame (else: no rows, or rows written before the chain)."""


def verify_rows(
    stream_id: UUID,
    rows: Sequence[_Row],
    *,
    after: int,
    prev: bytes | None,
    legacy: bool,
) -> Verified:
    """Check a run of rows (versions ``after + 1 ...``) and return them with bare payloads.

    ``prev`` is the digest of row ``after`` (:data:`GENESIS` when ``after`` is 0),
    or None when it is not known (a read that starts after a snapshot): then the
    first row's own digest is trusted as the start of the chain. ``legacy``
    allows rows without a frame before the first framed one.

    Raises :class:`~little_es.errors.LogTamperedError` naming the stream, the
    version and what differs: a gap in versions, an edited row, a broken link,
    or an unframed row where only framed ones may stand.
    """
    out: list[_Row] = []
    append = out.append
    chained = False
    expected = after + 1
    for version, topic, data in rows:
        if version != expected:
            raise LogTamperedError(
                f"stream {stream_id}: version {expected} is missing (the next stored row is"
                f" version {version}); rows were deleted from the log"
            )
        if data[:1] == _tag and len(data) >= _HEADER:
            stored_prev = data[1:33]
            payload = data[_HEADER:]
            if prev is not None and stored_prev != prev:
                raise LogTamperedError(
                    f"{_where(stream_id, version, topic)}: the row does not follow version"
                    f" {version - 1} (its recorded previous digest differs); a row was"
                    " replaced, inserted or moved"
                )
            own = digest(stored_prev, stream_id, version, topic, payload)
            if own != data[33:_HEADER]:
                raise LogTamperedError(
                    f"{_where(stream_id, version, topic)}: the stored row does not match its"
                    " own digest (its payload, topic or version was changed after it was"
                    " written)"
                )
            prev = own
            legacy = False
            chained = True
            append((version, topic, payload))
        elif legacy and not chained and prev is not None:
            prev = digest(prev, stream_id, version, topic, data)
            append((version, topic, data))
        else:
            raise LogTamperedError(
                f"{_where(stream_id, version, topic)}: the row carries no chain frame, in a"
                " stream or world whose rows all do"
            )
        expected += 1
    return Verified(out, prev, chained)


def check_head(
    stream_id: UUID,
    version: int,
    last: bytes | None,
    chained: bool,
    head: tuple[int, bytes] | None,
) -> None:
    """Compare a stream's last row as read (``version``, digest ``last``) with its stored head.

    ``version`` is 0 for a stream with no rows; ``chained`` says whether the
    rows read carried frames; ``head`` is None for a stream the backend keeps
    no head of (never written, or written before the chain).
    """
    if head is None:
        if chained:
            raise LogTamperedError(
                f"stream {stream_id} has chained rows up to version {version} but no head"
                " record: the world's head table was edited; restore the world from a backup"
            )
        return
    head_version, head_digest = head
    if version < head_version:
        raise LogTamperedError(
            f"stream {stream_id} ends at version {version} but was written up to version"
            f" {head_version}: rows were deleted from the end of the log; restore the world"
            " from a backup"
        )
    if version > head_version:
        raise LogTamperedError(
            f"stream {stream_id} has rows up to version {version} but was written up to"
            f" version {head_version}: rows were added to the log by something other than"
            " little_es"
        )
    if last is not None and last != head_digest:
        raise LogTamperedError(
            f"stream {stream_id}, version {version}: the last row is not the one that was"
            " written (its digest differs from the stream head); restore the world from a"
            " backup"
        )


def heads_of(rows: Iterable[tuple[UUID, int, bytes]]) -> dict[UUID, tuple[int, bytes]]:
    """The new head of each stream among framed rows being inserted (last one wins)."""
    heads: dict[UUID, tuple[int, bytes]] = {}
    for stream_id, version, data in rows:
        if is_framed(data):
            heads[stream_id] = (version, row_digest(data))
    return heads

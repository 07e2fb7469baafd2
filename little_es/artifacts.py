"""Content-addressed artifacts.

Large step outputs and files a step produces are stored once, by the sha256 of
their bytes, and events carry an :class:`ArtifactRef` instead of the bytes. The
reference is the manifest: it says which run and step produced the artifact and
what its bytes must hash to. Reading always re-hashes, so a corrupt or swapped
blob is refused, never returned.

Blobs are written (and flushed to disk) before the event that references them
is appended: a committed ``StepCompleted`` never points at bytes that are not
there.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
import threading
from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict

from little_es.errors import ArtifactIntegrityError, ArtifactNotFoundError
from little_es.ids import validate_run_id
from little_es.values import ArtifactRef

if TYPE_CHECKING:
    from psycopg_pool import ConnectionPool

_SHA256_RE = re.compile(r"[0-9a-f]{64}")


class HydratedArtifact(BaseModel):
    """An artifact's manifest together with its (verified) bytes."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    manifest: ArtifactRef
    payload: bytes


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class ArtifactStore(ABC):
    """Stores blobs by sha256. Concrete stores: file, PostgreSQL, memory."""

    def put(
        self,
        data: bytes,
        *,
        run_id: str,
        step_path: str,
        media_type: str = "application/octet-stream",
    ) -> ArtifactRef:
        """Store ``data`` durably and return its reference."""
        if not isinstance(data, bytes | bytearray | memoryview):
            raise TypeError(f"artifact data must be bytes, got {type(data).__name__}")
        data = bytes(data)
        validate_run_id(run_id)
        sha = _digest(data)
        self._write_blob(sha, data)
        return ArtifactRef(
            artifact_id=f"sha256:{sha}",
            sha256=sha,
            size=len(data),
            media_type=media_type,
            run_id=run_id,
            step_path=step_path,
        )

    def get(self, ref: ArtifactRef) -> HydratedArtifact:
        """Read and verify an artifact; raise if it is missing or its bytes do not match."""
        data = self._read_blob(ref.sha256)
        if data is None:
            raise ArtifactNotFoundError(
                f"artifact {ref.artifact_id} of run {ref.run_id!r}, step {ref.step_path!r} is"
                " missing from the artifact store: restore it from a backup of the world"
            )
        actual = _digest(data)
        if actual != ref.sha256 or len(data) != ref.size:
            raise ArtifactIntegrityError(
                f"artifact {ref.artifact_id} of run {ref.run_id!r}, step {ref.step_path!r} is"
                f" corrupt: stored bytes hash to sha256:{actual} ({len(data)} bytes), the log"
                f" records sha256:{ref.sha256} ({ref.size} bytes)"
            )
        return HydratedArtifact(manifest=ref, payload=data)

    def exists(self, ref: ArtifactRef) -> bool:
        """Whether bytes for ``ref`` are stored (without verifying them)."""
        return self._read_blob(ref.sha256) is not None

    @abstractmethod
    def _write_blob(self, sha256: str, data: bytes) -> None:
        """Store ``data`` under ``sha256`` durably; a no-op when already stored."""

    @abstractmethod
    def _read_blob(self, sha256: str) -> bytes | None:
        """The stored bytes for ``sha256``, or None."""

    def close(self) -> None:  # noqa: B027 - most stores hold nothing to release
        """Release resources held by the store."""


class MemoryArtifactStore(ArtifactStore):
    """Blobs in a dict, for ``memory_world()``."""

    def __init__(self) -> None:
        self._blobs: dict[str, bytes] = {}
        self._lock = threading.Lock()

    def _write_blob(self, sha256: str, data: bytes) -> None:
        with self._lock:
            self._blobs.setdefault(sha256, data)

    def _read_blob(self, sha256: str) -> bytes | None:
        return self._blobs.get(sha256)


class FileArtifactStore(ArtifactStore):
    """Blobs as files ``{root}/{sha[:2]}/{sha}``, written atomically and fsynced."""

    def __init__(self, root: Path) -> None:
        self._root = root
        root.mkdir(parents=True, exist_ok=True)

    def _path(self, sha256: str) -> Path:
        # The name is a hex digest we computed or validated: it cannot escape root.
        if _SHA256_RE.fullmatch(sha256) is None:
            raise ValueError(f"not a sha256 hex digest: {sha256!r}")
        return self._root / sha256[:2] / sha256

    def _write_blob(self, sha256: str, data: bytes) -> None:
        path = self._path(sha256)
        if path.exists():
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            Path(tmp).replace(path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        # The rename is durable only once the directory entry is on disk too.
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    def _read_blob(self, sha256: str) -> bytes | None:
        try:
            return self._path(sha256).read_bytes()
        except FileNotFoundError:
            return None


class PostgresArtifactStore(ArtifactStore):
    """Blobs in a table of the world's own PostgreSQL database."""

    def __init__(
        self, pool: ConnectionPool[Any], table: str = "little_es_artifacts", *, owns_pool: bool
    ) -> None:
        if re.fullmatch(r"([a-z_][a-z0-9_]*\.)?[a-z_][a-z0-9_]*", table) is None:
            raise ValueError(f"invalid artifact table name {table!r}")
        self._pool = pool
        self._table = table
        self._owns_pool = owns_pool
        with pool.connection() as conn:
            conn.execute(
                f"CREATE TABLE IF NOT EXISTS {table} (sha256 text PRIMARY KEY, data bytea NOT NULL)"
            )

    def _write_blob(self, sha256: str, data: bytes) -> None:
        with self._pool.connection() as conn:
            conn.execute(
                f"INSERT INTO {self._table} (sha256, data) VALUES (%s, %s)"
                " ON CONFLICT (sha256) DO NOTHING",
                (sha256, data),
            )

    def _read_blob(self, sha256: str) -> bytes | None:
        from psycopg.rows import tuple_row

        # Pools shared with eventsourcing hand out connections that make dict rows.
        with self._pool.connection() as conn, conn.cursor(row_factory=tuple_row) as cur:
            row = cur.execute(
                f"SELECT data FROM {self._table} WHERE sha256 = %s", (sha256,)
            ).fetchone()
        return None if row is None else bytes(row[0])

    def close(self) -> None:
        if self._owns_pool:
            self._pool.close()

"""Run leases: at most one process makes progress on a run at a time.

Optimistic concurrency alone cannot stop two processes from both executing a
step that was started but not completed (each would see it "in flight"). So a
process holds a lease on a run for as long as it drives it; a second process
that asks for the same lease is refused at once with
:class:`~little_es.errors.ConcurrentRunError`, before it runs anything. Leases
die with their holder: a killed process never leaves a run locked.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

from little_es.errors import ConcurrentRunError
from little_es.ids import run_stream_id


def _refused(run_id: str) -> ConcurrentRunError:
    return ConcurrentRunError(
        f"run {run_id!r} is being driven by another process: this one stopped without running"
        " anything; wait for it to finish (or kill it) and resume again"
    )


class RunLeases(ABC):
    """Hands out exclusive, non-blocking leases on runs."""

    @contextlib.contextmanager
    def hold(self, run_id: str) -> Iterator[None]:
        """Hold the lease on ``run_id`` for the ``with`` block, or raise ConcurrentRunError."""
        token = self._acquire(run_stream_id(run_id))
        if token is None:
            raise _refused(run_id)
        try:
            yield
        finally:
            self._release(token)

    @abstractmethod
    def _acquire(self, key: UUID) -> Any | None:
        """A release token, or None when another holder has the lease."""

    @abstractmethod
    def _release(self, token: Any) -> None:
        """Give the lease back."""


class MemoryRunLeases(RunLeases):
    """Leases within one process (``memory_world``)."""

    def __init__(self) -> None:
        self._held: set[UUID] = set()
        self._lock = threading.Lock()

    def _acquire(self, key: UUID) -> UUID | None:
        with self._lock:
            if key in self._held:
                return None
            self._held.add(key)
            return key

    def _release(self, token: UUID) -> None:
        with self._lock:
            self._held.discard(token)


class FileRunLeases(RunLeases):
    """``flock`` on one file per run; the kernel drops it when the holder dies."""

    def __init__(self, directory: Path) -> None:
        self._directory = directory
        directory.mkdir(parents=True, exist_ok=True)

    def _acquire(self, key: UUID) -> int | None:
        fd = os.open(self._directory / f"{key.hex}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        return fd

    def _release(self, token: int) -> None:
        fcntl.flock(token, fcntl.LOCK_UN)
        os.close(token)


class PostgresRunLeases(RunLeases):
    """PostgreSQL session advisory locks, one connection per held lease.

    The server releases the lock when the connection closes, which it does
    when the holding process dies.
    """

    def __init__(self, conninfo: str, *, scope: str = "public") -> None:
        self._conninfo = conninfo
        self._scope = scope.encode()

    def _acquire(self, key: UUID) -> Any | None:
        import psycopg

        conn = psycopg.connect(self._conninfo, autocommit=True)
        # Advisory locks are per database, not per schema: mix the world's schema
        # in, or worlds in two schemas of one database would lock each other's
        # runs. Keys are signed 64-bit integers.
        digest = hashlib.sha256(self._scope + b":" + key.bytes).digest()
        lock_key = int.from_bytes(digest[:8], "big", signed=True)
        try:
            row = conn.execute("SELECT pg_try_advisory_lock(%s)", (lock_key,)).fetchone()
        except BaseException:
            conn.close()
            raise
        if row is None or not row[0]:
            conn.close()
            return None
        return conn

    def _release(self, token: Any) -> None:
        token.close()

"""eventsourcing's SQLite persistence, with the fsync policy of a little_es world.

``synchronous="full"`` (the default) fsyncs the write-ahead log at every
commit: a committed event survives a killed process *and* a power cut or OS
crash. ``synchronous="normal"`` leaves the fsync to checkpoints: a committed
event still survives a killed process (it is in the WAL file), but a power cut
or OS crash can lose the last commits, so the call they recorded runs once
more on resume. It makes each commit several times cheaper (see the README's
performance table). Choose it only where losing the last moments of work to a
power cut is acceptable.
"""

from __future__ import annotations

from typing import Any, Literal

from eventsourcing.sqlite import SQLiteConnection, SQLiteConnectionPool, SQLiteFactory
from eventsourcing.utils import Environment, EnvType

Synchronous = Literal["full", "normal"]
SYNCHRONOUS_ENV = "LITTLE_ES_SQLITE_SYNCHRONOUS"


class _SQLiteConnectionPool(SQLiteConnectionPool):
    def __init__(self, *, synchronous: Synchronous, **kwargs: Any) -> None:
        self._synchronous = synchronous.upper()
        super().__init__(**kwargs)

    def _create_connection(self) -> SQLiteConnection:
        connection = super()._create_connection()
        # Per connection: SQLite does not store this pragma in the file.
        connection._sqlite_conn.execute(f"PRAGMA synchronous={self._synchronous}")
        return connection


class LittleSQLiteFactory(SQLiteFactory):
    """eventsourcing's SQLite factory, opening connections with the world's ``synchronous``."""

    def __init__(self, env: Environment | EnvType | None) -> None:
        super().__init__(env)
        synchronous = (self.env.get(SYNCHRONOUS_ENV) or "full").lower()
        if synchronous not in ("full", "normal"):
            raise ValueError(f"{SYNCHRONOUS_ENV} must be 'full' or 'normal', got {synchronous!r}")
        old = self.datastore.pool
        # No connection has been made yet: swap the pool for one that sets the pragma.
        self.datastore.pool = _SQLiteConnectionPool(
            synchronous=synchronous,  # type: ignore[arg-type]
            db_name=old.db_name,
            lock_timeout=old.lock_timeout,
        )
        old.close()

"""eventsourcing's SQLite persistence, with the fsync policy of a little_es world.

``synchronous="full"`` (the default) fsyncs the write-ahead log at every
commit that holds a result: a committed result survives a killed process
*and* a power cut or OS crash. ``synchronous="normal"`` leaves the fsync to
checkpoints: a committed event still survives a killed process (it is in the
WAL file), but a power cut or OS crash can lose the last commits, so the call
they recorded runs once more on resume. It makes each commit several times
cheaper (see the README's performance table). Choose it only where losing the
last moments of work to a power cut is acceptable.

Either way, a commit of nothing but write-ahead records (``StepStarted``,
``harness.model.called``, ...; see :attr:`little_es.events.Event.write_ahead`)
is not fsynced: the WAL is one file, written in order, so the fsync of the next
commit makes them durable with it, and until then losing them costs nothing a
crash does not.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from eventsourcing.persistence import StoredEvent
from eventsourcing.sqlite import (
    SQLiteApplicationRecorder,
    SQLiteConnection,
    SQLiteConnectionPool,
    SQLiteFactory,
)
from eventsourcing.utils import Environment, EnvType

Synchronous = Literal["full", "normal"]
SYNCHRONOUS_ENV = "LITTLE_ES_SQLITE_SYNCHRONOUS"


class _SQLiteConnectionPool(SQLiteConnectionPool):
    def __init__(self, *, synchronous: Synchronous, **kwargs: Any) -> None:
        self.synchronous = synchronous.upper()
        super().__init__(**kwargs)

    def _create_connection(self) -> SQLiteConnection:
        connection = super()._create_connection()
        # Per connection: SQLite does not store this pragma in the file.
        connection._sqlite_conn.execute(f"PRAGMA synchronous={self.synchronous}")
        return connection


class LittleSQLiteApplicationRecorder(SQLiteApplicationRecorder):
    """eventsourcing's SQLite recorder; a write-ahead-only commit is not fsynced.

    ``insert_events(..., durable=False)`` commits with ``synchronous=NORMAL``
    and then puts the connection back to the world's policy (SQLite refuses
    the pragma inside a transaction; set before it, it applies to its commit).
    """

    def insert_events(
        self, stored_events: Sequence[StoredEvent], *, durable: bool = True, **kwargs: Any
    ) -> Sequence[int] | None:
        """Insert in one transaction; fsynced per the world's policy only when ``durable``."""
        pool = self.datastore.pool
        assert isinstance(pool, _SQLiteConnectionPool)
        if durable or pool.synchronous == "NORMAL":
            return super().insert_events(stored_events, **kwargs)
        with self.datastore.get_connection(commit=True) as conn:
            conn._sqlite_conn.execute("PRAGMA synchronous=NORMAL")
            try:
                with conn.transaction(commit=True) as cursor:
                    return self._insert_events(cursor, stored_events, **kwargs)
            finally:
                conn._sqlite_conn.execute(f"PRAGMA synchronous={pool.synchronous}")


class LittleSQLiteFactory(SQLiteFactory):
    """eventsourcing's SQLite factory, opening connections with the world's ``synchronous``."""

    application_recorder_class = LittleSQLiteApplicationRecorder

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

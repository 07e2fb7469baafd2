"""eventsourcing's PostgreSQL persistence, with little_es's commit policy.

A commit of nothing but write-ahead records (``StepStarted``,
``harness.model.called``, ...; see :attr:`little_es.events.Event.write_ahead`)
runs with ``synchronous_commit`` off: it returns without waiting for the WAL
flush. The WAL is one log, flushed in order, so the next synchronous commit (one
that holds a result) makes it durable too, and until then losing it to a server
crash costs nothing a crash of the process does not: the call runs again.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from eventsourcing.persistence import StoredEvent
from eventsourcing.postgres import PostgresApplicationRecorder, PostgresFactory
from psycopg import Cursor
from psycopg.rows import DictRow


class LittlePostgresApplicationRecorder(PostgresApplicationRecorder):
    """eventsourcing's PostgreSQL recorder; write-ahead-only commits do not wait for a flush."""

    def _insert_events(
        self,
        curs: Cursor[DictRow],
        stored_events: Sequence[StoredEvent],
        *,
        durable: bool = True,
        **kwargs: Any,
    ) -> None:
        # eventsourcing's hook inside the insert's transaction, before the rows.
        if not durable:
            curs.execute("SET LOCAL synchronous_commit TO OFF")
        super()._insert_events(curs, stored_events, **kwargs)


class LittlePostgresFactory(PostgresFactory):
    """eventsourcing's PostgreSQL factory with :class:`LittlePostgresApplicationRecorder`."""

    application_recorder_class = LittlePostgresApplicationRecorder

"""The PostgreSQL backend: events, artifacts and the runs read model in one database schema.

Events go through eventsourcing's PostgreSQL persistence, blobs to a table of
the same schema, run leases are session advisory locks, and the runs read
model is three tables next to the events. Needs the ``postgres`` extra
(psycopg); only a PostgreSQL world imports this module.

The commit policy: a commit of nothing but write-ahead records
(``StepStarted``, ``harness.model.called``, ...; see
:attr:`little_es.events.Event.write_ahead`) runs with ``synchronous_commit``
off: it returns without waiting for the WAL flush. The WAL is one log, flushed
in order, so the next synchronous commit (one that holds a result) makes it
durable too, and until then losing it to a server crash costs nothing a crash
of the process does not: the call runs again.

Concurrent writers: inserts take no table lock (eventsourcing's recorder
locks the events table for each, so the writers of a database take turns);
readers of the notification log read up to a horizon no insert in flight can
fall below. :class:`LittlePostgresApplicationRecorder` says what that
guarantees and what it does not.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import select
import socket
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from typing import Any
from uuid import UUID

import psycopg
import psycopg.errors
from eventsourcing.persistence import (
    ApplicationRecorder,
    IntegrityError,
    InterfaceError,
    Notification,
    OperationalError,
    StoredEvent,
    Subscription,
    Tracking,
)
from eventsourcing.postgres import (
    PostgresAggregateRecorder,
    PostgresApplicationRecorder,
    PostgresDatastore,
    PostgresFactory,
    PostgresSubscription,
    PostgresTrackingRecorder,
)
from eventsourcing.utils import get_topic, retry
from psycopg import Cursor
from psycopg.rows import DictRow, tuple_row
from psycopg.sql import SQL, Composed, Identifier, Literal
from psycopg_pool import ConnectionPool

from little_es.backends.base import (
    EVENTS_TABLE,
    HEADS_TABLE,
    ROWS_VIEW,
    RUN_STREAMS_TABLE,
    RUNS_TABLE,
    RUNS_TRACKING_TABLE,
    STREAMS_TABLE,
    TOPICS_TABLE,
    WORLD_APPLICATION_NAME,
    ApplicationClass,
    ArtifactStore,
    Backend,
    Row,
    RunLeases,
    RunSummary,
    RunsView,
    SnapshotRows,
    StreamWatch,
    dump_state,
    dump_summary,
    keeps_eventsourcing_table,
    load_state,
    oldest_first,
)
from little_es.chain import Head
from little_es.errors import WorldConfigError
from little_es.materialize import MaterializedRunState


class PostgresBackend(Backend):
    """A world in ``schema`` (default ``public``) of one PostgreSQL database.

    ``name`` is how the world is shown (its URL without the password).
    """

    def __init__(
        self,
        app_class: ApplicationClass,
        *,
        dbname: str,
        host: str = "127.0.0.1",
        port: int = 5432,
        user: str = "postgres",
        password: str = "",
        schema: str = "",
        name: str,
    ) -> None:
        conninfo = f"dbname={dbname} host={host} port={port} user={user}" + (
            f" password={password}" if password else ""
        )
        scope = schema or "public"
        with _setup_lock(conninfo, scope):
            app = app_class(
                env={
                    "PERSISTENCE_MODULE": get_topic(LittlePostgresFactory),
                    "POSTGRES_DBNAME": dbname,
                    "POSTGRES_HOST": host,
                    "POSTGRES_PORT": str(port),
                    "POSTGRES_USER": user,
                    "POSTGRES_PASSWORD": password,
                    "POSTGRES_SCHEMA": schema,
                    # One connection kept open, up to 15 while busy: sixteen processes
                    # of a team then hold 32 of a server's 100, not 96.
                    "POSTGRES_POOL_SIZE": "1",
                    "POSTGRES_MAX_OVERFLOW": "14",
                    "POSTGRES_CONNECT_TIMEOUT": "5",
                }
            )
            factory = app.factory
            assert isinstance(factory, LittlePostgresFactory)
            datastore = factory.datastore
            table = f"{schema}.little_es_artifacts" if schema else "little_es_artifacts"
            artifacts = PostgresArtifactStore(datastore.pool, table=table, owns_pool=False)
        super().__init__(
            app=app,
            artifacts=artifacts,
            leases=PostgresRunLeases(conninfo, scope=scope),
            name=name,
        )
        self._datastore = datastore
        recorder = app.recorder
        assert isinstance(recorder, LittlePostgresApplicationRecorder)
        self._recorder = recorder

    def select_rows(self, stream_id: UUID, after: int | None) -> Sequence[Row]:
        """One stream's rows, read from the recorder's table (see :meth:`Backend.select_rows`)."""
        return self._recorder.stream_rows(stream_id, after)

    def has_events_after(self, stream_id: UUID, version: int) -> bool:
        """See :meth:`Backend.has_events_after`: one prepared statement on the table."""
        return self._recorder.has_rows_after(stream_id, version)

    def stream_head(self, stream_id: UUID) -> Head | None:
        """See :meth:`Backend.stream_head`: from the heads table."""
        recorder = self.app.recorder
        assert isinstance(recorder, LittlePostgresApplicationRecorder)
        with (
            self._datastore.get_connection() as conn,
            conn.cursor(row_factory=tuple_row) as cursor,
        ):
            cursor.execute(recorder.select_head_statement, (stream_id,), prepare=True)
            row = cursor.fetchone()
            return None if row is None else Head(row[0], bytes(row[1]), bytes(row[2]))

    def stream_heads(self) -> dict[UUID, Head]:
        """See :meth:`Backend.stream_heads`: the whole heads table."""
        recorder = self.app.recorder
        assert isinstance(recorder, LittlePostgresApplicationRecorder)
        with (
            self._datastore.get_connection() as conn,
            conn.cursor(row_factory=tuple_row) as cursor,
        ):
            cursor.execute(recorder.select_heads_statement)
            return {s: Head(v, bytes(d), bytes(r)) for s, v, d, r in cursor.fetchall()}

    def runs_view(self) -> PostgresRunsView:
        """The read model in the world's schema."""
        view = PostgresRunsView(self._datastore)
        view.create_table()
        return view


def _lock_key(namespace: bytes) -> int:
    # Advisory lock keys are signed 64-bit integers.
    return int.from_bytes(hashlib.sha256(namespace).digest()[:8], "big", signed=True)


def _quoted(name: str) -> str:
    """``name`` as a PostgreSQL quoted identifier (inside a text argument, not in SQL)."""
    return '"' + name.replace('"', '""') + '"'


@contextmanager
def _setup_lock(conninfo: str, scope: str) -> Iterator[None]:
    # Processes opening a fresh world at once would race on CREATE TABLE IF NOT
    # EXISTS, which PostgreSQL can fail on its catalog's unique index: create
    # the tables one process at a time.
    key = _lock_key(b"little_es tables:" + scope.encode())
    with psycopg.connect(conninfo, autocommit=True, connect_timeout=5) as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", (key,))
        try:
            yield
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (key,))


# --------------------------------------------------------------- eventsourcing


class LittlePostgresApplicationRecorder(PostgresApplicationRecorder):
    """eventsourcing's PostgreSQL recorder, with writers that do not queue; keeps stream heads;
    write-ahead-only commits do not wait for a flush.

    Every insert also moves the heads of its streams (``HEADS_TABLE``) in the
    same statement as the rows (no extra round trip; :meth:`insert_events`).

    **Concurrent writers.** eventsourcing's recorder takes ``LOCK TABLE ... IN
    EXCLUSIVE MODE`` for every insert and holds it until the commit is flushed,
    so that notification ids are given in commit order and a reader following
    them never passes over an id that a slower transaction commits later. That
    makes every writer of a database wait for the one before it. Here writers
    take no exclusive lock and no notify-queue lock (``NOTIFY`` serializes the
    commits of the transactions that send one): the sequence gives ids to
    concurrent transactions, which commit in any order and group their flushes.
    Each insert instead holds a *shared* transaction-level advisory lock
    (:attr:`appends_lock_key`, one per events table) from before its first id
    until it ends; shared holders never wait for one another.

    The guarantee moves to the readers: :meth:`select_notifications` and
    :meth:`max_notification_id` read only up to a *horizon*, the sequence's
    last id read before a moment at which no insert that held the lock then is
    still running (the reader takes the advisory lock exclusively and lets go
    at once, which waits for the inserts in flight and nothing else; inserts
    that start meanwhile wait behind it). Every id at or below it is committed
    or will never be (a rolled-back insert), so:

    * a reader of the notification log never misses a committed row: each row
      is read once, in notification-id order, by a reader that continues after
      the last id it read (the runs projection, ``little verify``, export,
      eventsourcing's ``Projection`` and subscriptions);
    * a stream's rows are in version order (an insert of version n+1 starts
      after version n committed, so it draws a larger id), and a transaction
      that began after another one committed has larger ids: a step's session
      rows come after the ``StepStarted`` that names the session, which the
      runs projection relies on.

    What is no longer true: the ids of one transaction need not be
    contiguous (two concurrent inserts interleave), and a reader sees a row
    only once every insert that drew a smaller id has ended (a wait of the
    length of a commit, taken only when one is in flight). The hash chain is
    per stream (:mod:`little_es.chain`), so it does not care. Subscriptions
    (:meth:`subscribe`) poll, since no insert sends a ``NOTIFY``.

    The horizon needs every writer of the table to take the shared lock before
    it draws an id: processes of an older little_es (or eventsourcing's own
    recorder, which takes the table lock instead) writing the same world while
    this version reads it could be passed over; upgrade every process of a
    world together. The sequence must keep its default ``CACHE 1`` (a cached
    range is invisible to readers).
    """

    def __init__(self, datastore: PostgresDatastore, **kwargs: Any) -> None:
        super().__init__(datastore, **kwargs)
        schema, table = datastore.schema, self.events_table_name
        heads = SQL("{schema}.{table}").format(
            schema=Identifier(schema), table=Identifier(HEADS_TABLE)
        )
        self._create_heads_statement = SQL(
            "CREATE TABLE IF NOT EXISTS {heads} (stream_id uuid PRIMARY KEY,"
            " version bigint NOT NULL, digest bytea NOT NULL, running bytea NOT NULL)"
        ).format(heads=heads)
        self.sql_create_statements.append(self._create_heads_statement)
        self.upsert_heads_statement = SQL(
            "INSERT INTO {heads} (stream_id, version, digest, running)"
            " SELECT * FROM unnest(%s::uuid[], %s::bigint[], %s::bytea[], %s::bytea[])"
            " ON CONFLICT (stream_id) DO UPDATE SET version = EXCLUDED.version,"
            " digest = EXCLUDED.digest, running = EXCLUDED.running"
        ).format(heads=heads)
        self.select_head_statement = (
            SQL("SELECT version, digest, running FROM {heads} WHERE stream_id = %s")
            .format(heads=heads)
            .as_bytes(None)
        )
        self.select_heads_statement = (
            SQL("SELECT stream_id, version, digest, running FROM {heads}")
            .format(heads=heads)
            .as_bytes(None)
        )
        self.appends_lock_key = _lock_key(f"little_es appends:{schema}.{table}".encode())
        """The advisory lock every insert holds shared (see the class docstring)."""
        self._events = SQL("{0}.{1}").format(Identifier(schema), Identifier(table))
        self._heads = heads
        self._insert_statements: dict[tuple[bool, int, int, int], bytes] = {}
        self._options_params = (f"{datastore.lock_timeout}s", self.appends_lock_key)
        self.lock_table_statements = [
            SQL("SET LOCAL lock_timeout = '{0}s'").format(datastore.lock_timeout),
            SQL("SELECT pg_advisory_xact_lock_shared({0})").format(self.appends_lock_key),
        ]
        self._last_id_statement = SQL(
            "SELECT pg_sequence_last_value(pg_get_serial_sequence({0}, 'notification_id'))"
        ).format(Literal(f"{_quoted(schema)}.{_quoted(table)}"))
        self._horizon_max_statement = self.max_notification_id_statement + SQL(
            " WHERE notification_id <= %s"
        )
        # eventsourcing's insert function, without its NOTIFY (see the class docstring).
        self.sql_create_statements[self.create_insert_function_statement_index] = SQL(
            "CREATE OR REPLACE FUNCTION {schema}.{insert_events}(events {schema}.{event}[])"
            " RETURNS SETOF bigint LANGUAGE plpgsql AS $BODY$ BEGIN RETURN QUERY"
            " INSERT INTO {schema}.{table} AS t (originator_id, originator_version, topic, state)"
            " SELECT originator_id, originator_version, topic, state FROM unnest(events)"
            " RETURNING notification_id; END; $BODY$"
        ).format(
            insert_events=Identifier(self.pg_function_name_insert_events),
            event=Identifier(self.stored_event_type_name),
            schema=Identifier(schema),
            table=Identifier(table),
        )

    def stream_rows(self, stream_id: UUID, after: int | None) -> list[Row]:
        """One stream's (version, topic, state) rows after version ``after`` (None: all of
        them), in order, without a ``StoredEvent`` each (:meth:`PostgresBackend.select_rows`)."""
        every, later = self._stream_rows_statements
        with (
            self.datastore.get_connection() as conn,
            conn.cursor(row_factory=tuple_row) as cursor,
        ):
            stream = self._stream_param(conn, stream_id)
            if after is None:
                cursor.execute(every, (stream,), prepare=True)
            else:
                cursor.execute(later, (stream, after), prepare=True)
            return self._rows_read(conn, cursor.fetchall())

    def has_rows_after(self, stream_id: UUID, version: int) -> bool:
        """Whether the stream holds a row after ``version`` (one indexed lookup)."""
        with (
            self.datastore.get_connection() as conn,
            conn.cursor(row_factory=tuple_row) as cursor,
        ):
            stream = self._stream_param(conn, stream_id)
            cursor.execute(self._next_row_statement, (stream, version), prepare=True)
            return cursor.fetchone() is not None

    # What depends on the table's layout: the statements (rendered once: psycopg renders
    # a Composed query again on every execute, about a tenth of the check before each
    # step and call, has_rows_after), the parameter that names a stream in them, the
    # rows as they read them, the columns and values of the one-statement insert
    # (_insert_statement). CompactPostgresApplicationRecorder overrides them.

    def _stream_param(self, conn: psycopg.Connection[Any], stream_id: UUID) -> Any:
        """What stands for ``stream_id`` in the statements below (here: the id itself)."""
        return stream_id

    @functools.cached_property
    def _stream_rows_statements(self) -> tuple[bytes, bytes]:
        """A stream's rows: all of them, and those after a version (the second parameter)."""
        base = SQL(
            "SELECT originator_version, topic, state FROM {events} WHERE originator_id = %s"
        ).format(events=self._events)
        return (
            (base + SQL(" ORDER BY originator_version")).as_bytes(None),
            (base + SQL(" AND originator_version > %s ORDER BY originator_version")).as_bytes(None),
        )

    @functools.cached_property
    def _next_row_statement(self) -> bytes:
        return (self._later_rows(SQL("%s"), SQL("%s")) + SQL(" LIMIT 1")).as_bytes(None)

    def _rows_read(self, conn: psycopg.Connection[Any], rows: list[tuple[Any, ...]]) -> list[Row]:
        """The (version, topic, state) rows of what :attr:`_stream_rows_statements` read."""
        return rows

    def _row_columns(self) -> tuple[SQL, tuple[str, str, str, str]]:
        """The events table's columns the insert writes, and the types of the values
        :meth:`_row_values` gives for them (catalog names: each is quoted as an identifier)."""
        return (
            SQL("originator_id, originator_version, topic, state"),
            (self.datastore.originator_id_type, "int8", "text", "bytea"),
        )

    def _row_values(
        self, conn: psycopg.Connection[Any], stored_events: Sequence[StoredEvent]
    ) -> list[tuple[Any, int, Any, bytes]]:
        """Each row's values, of the types of :meth:`_row_columns`."""
        return [(e.originator_id, e.originator_version, e.topic, e.state) for e in stored_events]

    def _row_selected(self) -> SQL | Composed:
        """What the insert writes into :meth:`_row_columns` of a row ``r`` of those values."""
        return SQL("r.i, r.v, r.t, r.s")

    def _stream_param_type(self) -> str:
        """The type of :meth:`_stream_param` (a catalog name)."""
        return self.datastore.originator_id_type

    def _later_rows(self, stream_id: SQL | Composed, version: SQL) -> Composed:
        """A query of the rows of a stream (:meth:`_stream_param`) after a version."""
        return SQL(
            "SELECT 1 FROM {events} WHERE originator_id = {stream_id}"
            " AND originator_version > {version}"
        ).format(events=self._events, stream_id=stream_id, version=version)

    def _notify_channel(self, curs: Cursor[DictRow]) -> None:
        # No NOTIFY: it would make the commits of all writers take turns. Subscriptions
        # poll instead (``_PollingSubscription``).
        pass

    def horizon(self) -> int:
        """The largest notification id up to which the log is final (0 for none yet).

        Every id at or below it is committed, or belongs to an insert that rolled back.
        """
        key = self.appends_lock_key
        # One round trip; in this order: the last id drawn, then a wait for every
        # insert that may have drawn one (they hold the lock shared) to end.
        with (
            self.datastore.get_connection() as conn,
            conn.pipeline(),
            conn.cursor() as curs,
            conn.cursor() as lock,
        ):
            curs.execute(self._last_id_statement, prepare=True)
            lock.execute(SQL("SELECT pg_advisory_lock({0})").format(key), prepare=True)
            lock.execute(SQL("SELECT pg_advisory_unlock({0})").format(key), prepare=True)
            row = curs.fetchone()
        assert row is not None
        last = row["pg_sequence_last_value"]
        return int(last) if last is not None else 0

    @retry((InterfaceError, OperationalError), max_attempts=10, wait=0.2)
    def select_notifications(
        self,
        start: int | None,
        limit: int,
        stop: int | None = None,
        topics: Sequence[str] = (),
        *,
        inclusive_of_start: bool = True,
    ) -> Sequence[Notification]:
        """eventsourcing's select, up to :meth:`horizon` (see the class docstring)."""
        horizon = self.horizon()
        if start is not None and (start > horizon or (start == horizon and not inclusive_of_start)):
            return []
        return self._select_notifications(
            start,
            limit,
            horizon if stop is None else min(stop, horizon),
            topics,
            inclusive_of_start=inclusive_of_start,
        )

    def _select_notifications(
        self,
        start: int | None,
        limit: int,
        stop: int,
        topics: Sequence[str],
        *,
        inclusive_of_start: bool,
    ) -> Sequence[Notification]:
        """The notifications of :meth:`select_notifications`, with ``stop`` at or below the
        horizon."""
        notifications: Sequence[Notification] = super().select_notifications(
            start, limit, stop=stop, topics=topics, inclusive_of_start=inclusive_of_start
        )
        return notifications

    @retry((InterfaceError, OperationalError), max_attempts=10, wait=0.2)
    def max_notification_id(self) -> int | None:
        """The largest notification id at or below :meth:`horizon`, or None for none."""
        horizon = self.horizon()
        with self.datastore.get_connection() as conn, conn.cursor() as curs:
            curs.execute(self._horizon_max_statement, (horizon,), prepare=True)
            row = curs.fetchone()
        assert row is not None
        found: int | None = row["max"]
        return found

    def subscribe(
        self, gt: int | None = None, topics: Sequence[str] = ()
    ) -> Subscription[ApplicationRecorder]:
        """A subscription that reads the log every :data:`_POLL_S` (no NOTIFY is sent)."""
        return _PollingSubscription(recorder=self, gt=gt, topics=topics)

    def _insert_stored_events(
        self,
        curs: Cursor[DictRow],
        stored_events: Sequence[StoredEvent],
        *,
        heads: Mapping[UUID, Head] | None = None,
        **kwargs: Any,
    ) -> None:
        super()._insert_stored_events(curs, stored_events, **kwargs)
        self._upsert_heads(curs, heads)

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

    def insert_events(
        self, stored_events: Sequence[StoredEvent], **kwargs: Any
    ) -> Sequence[int] | None:
        """eventsourcing's insert, in one round trip; with ``POSTGRES_ENABLE_DB_FUNCTIONS``,
        the same policy.

        The rows, the heads and the commit are one statement in autocommit (one
        round trip, one transaction): a ``WITH`` that sets the transaction's
        options and takes the appends lock, inserts the rows (one as plain
        parameters, more as four arrays, both cheaper to send than
        eventsourcing's composite type) and moves the heads. Statements are
        rendered to bytes once, so psycopg does not compose them again per
        insert. A conflicting version fails the statement, rows and heads alike.

        eventsourcing's database-function path calls its insert function in
        autocommit, outside the transaction and the hooks above: every commit
        would wait for the flush, the heads would not move, and without the
        shared appends lock a reader of notifications (the runs projection)
        could pass over rows that commit later with lower ids. Here the
        function runs in a transaction of its own with all three.

        An import's ``snapshots`` go in in the rows' transaction: the one statement
        then runs in a transaction of its own rather than in autocommit.
        """
        ids: Sequence[int] | None
        if stored_events and not self.datastore.enable_db_functions:
            ids = self._insert_in_one_statement(stored_events, **kwargs)
            return ids
        # A watch is answered by the one statement only: left unanswered here, the
        # checks it stands for make their own queries (see StreamWatch).
        kwargs.pop("watch", None)
        if self.datastore.enable_db_functions:
            ids = self._insert_through_function(stored_events, **kwargs)
        else:
            ids = super().insert_events(stored_events, **kwargs)
        return ids

    @retry((InterfaceError, OperationalError), max_attempts=10, wait=0.2)
    def _insert_in_one_statement(
        self,
        stored_events: Sequence[StoredEvent],
        *,
        durable: bool = True,
        heads: Mapping[UUID, Head] | None = None,
        watch: StreamWatch | None = None,
        snapshots: SnapshotRows | None = None,
        **_: Any,
    ) -> Sequence[int]:
        watched = list(watch.versions.items()) if watch is not None else []
        with (
            self.datastore.get_connection() as conn,
            conn.cursor(row_factory=tuple_row) as curs,
        ):
            values = self._row_values(conn, stored_events)
            params: list[Any] = [*self._options_params]
            # A few rows (most commits: a step's StepCompleted with the next StepStarted, a
            # harness call's two records) as plain parameters: psycopg dumps arrays much
            # slower.
            plain = len(values) if len(values) <= _PLAIN_ROWS else 0
            if plain:
                for row in values:
                    params += row
            else:
                params += (list(column) for column in zip(*values, strict=True))
            if heads and len(heads) == 1:
                ((stream_id, head),) = heads.items()
                params += (stream_id, *head)
            elif heads:
                params += self._heads_params(heads)
            streams = [self._stream_param(conn, sid) for sid, _ in watched]
            if len(watched) == 1:
                params += (streams[0], watched[0][1])
            elif watched:
                params += (streams, [version for _, version in watched])
            statement = self._insert_statement(
                durable,
                plain,
                0 if not heads else 1 if len(heads) == 1 else 2,
                min(len(watched), 2),
            )
            # Autocommit: the statement is its own transaction, unless snapshots go with it.
            with nullcontext() if snapshots is None else conn.transaction():
                curs.execute(statement, params, prepare=True)
                rows = curs.fetchall()
                if snapshots is not None:
                    self._insert_snapshots(conn, snapshots)
        if watch is not None:
            # One stream: whether it changed; several: the positions of those that did.
            changed = rows[0][1]
            watch.found(
                ([watched[0][0]] if changed else [])
                if len(watched) == 1
                else [watched[n - 1][0] for n in changed]
            )
        return [row[0] for row in rows]

    def _insert_statement(self, durable: bool, plain: int, heads: int, watched: int = 0) -> bytes:
        """The insert of rows (``plain`` of them as plain parameters, 0: as arrays), heads
        (0 none, 1 one, 2 several) and the read of ``watched`` streams (0 none, 1 one: a
        boolean, 2 several: the array of those changed), rendered once."""
        key = (durable, plain, heads, watched)
        found = self._insert_statements.get(key)
        if found is not None:
            return found
        # The options and the appends lock come first: every row is joined with them,
        # so they are evaluated before the first row draws its id.
        options = SQL(
            "SELECT set_config('lock_timeout', %s, true), pg_advisory_xact_lock_shared(%s)"
            if durable
            else "SELECT set_config('lock_timeout', %s, true),"
            " set_config('synchronous_commit', 'off', true), pg_advisory_xact_lock_shared(%s)"
        )
        columns, types = self._row_columns()
        i, v, t, s = (Identifier(name) for name in types)
        rows = (
            SQL("(VALUES {0}) AS r (i, v, t, s, n)").format(
                SQL(", ").join(
                    SQL("(%s::{0}, %s::{1}, %s::{2}, %s::{3}, {4})").format(i, v, t, s, Literal(n))
                    for n in range(1, plain + 1)
                )
            )
            if plain
            else SQL(
                "unnest(%s::{0}[], %s::{1}[], %s::{2}[], %s::{3}[])"
                " WITH ORDINALITY AS r (i, v, t, s, n)"
            ).format(i, v, t, s)
        )
        # Rows go in in the order given, so a stream's versions draw ascending ids.
        order = SQL("") if plain == 1 else SQL(" ORDER BY r.n")
        statement = SQL(
            "WITH options AS MATERIALIZED ({options}), inserted AS ("
            "INSERT INTO {events} ({columns})"
            " SELECT {selected} FROM options, {rows}{order} RETURNING notification_id)"
        ).format(
            options=options,
            events=self._events,
            columns=columns,
            selected=self._row_selected(),
            rows=rows,
            order=order,
        )
        if heads:
            values = (
                SQL("(VALUES (%s::uuid, %s::bigint, %s::bytea, %s::bytea)) AS h (i, v, d, r)")
                if heads == 1
                else SQL(
                    "unnest(%s::uuid[], %s::bigint[], %s::bytea[], %s::bytea[]) AS h (i, v, d, r)"
                )
            )
            statement += SQL(
                ", moved AS (INSERT INTO {heads} (stream_id, version, digest, running)"
                " SELECT h.i, h.v, h.d, h.r FROM options, {values}"
                " ON CONFLICT (stream_id) DO UPDATE SET version = EXCLUDED.version,"
                " digest = EXCLUDED.digest, running = EXCLUDED.running)"
            ).format(heads=self._heads, values=values)
        stream_type = Identifier(self._stream_param_type())
        # The watched streams are read in the statement's snapshot, as they stood when
        # this commit began: a cancel that commits meanwhile is seen one call later, as
        # one that commits just after a check's own query is.
        changed = (
            SQL("")
            if not watched
            else SQL(", EXISTS ({0})").format(
                self._later_rows(SQL("%s::{0}").format(stream_type), SQL("%s::int8"))
            )
            if watched == 1
            else SQL(
                ", ARRAY(SELECT w.n FROM unnest(%s::{0}[], %s::int8[]) WITH ORDINALITY"
                " AS w (i, v, n) WHERE EXISTS ({1}))"
            ).format(stream_type, self._later_rows(SQL("w.i"), SQL("w.v")))
        )
        statement += SQL(" SELECT notification_id{changed} FROM inserted").format(changed=changed)
        rendered = self._insert_statements[key] = statement.as_bytes(None)
        return rendered

    @retry((InterfaceError, OperationalError), max_attempts=10, wait=0.2)
    def _insert_through_function(
        self,
        stored_events: Sequence[StoredEvent],
        *,
        snapshots: SnapshotRows | None = None,
        **kwargs: Any,
    ) -> Sequence[int]:
        # As eventsourcing's own insert is retried: a dropped connection is tried again.
        rows = [
            self.construct_pg_stored_event(e.originator_id, e.originator_version, e.topic, e.state)
            for e in stored_events
        ]
        with (
            self.datastore.get_connection() as conn,
            conn.transaction(),
            conn.cursor() as curs,
        ):
            self._insert_events(curs, stored_events, **kwargs)
            if not rows:
                return []
            self._lock_table(curs)
            curs.execute(self.sql_invoke_pg_function_insert_events, (rows,), prepare=True)
            ids = [r[self.pg_function_name_insert_events] for r in curs.fetchall()]
            self._upsert_heads(curs, kwargs.get("heads"))
            if snapshots is not None:
                self._insert_snapshots(conn, snapshots)
        return ids

    @staticmethod
    def _insert_snapshots(conn: psycopg.Connection[DictRow], snapshots: SnapshotRows) -> None:
        """Insert an import's snapshots in the transaction ``conn`` is in."""
        store = snapshots.recorder
        assert isinstance(store, PostgresAggregateRecorder)
        with conn.cursor() as curs:
            store._insert_stored_events(curs, snapshots.rows)

    @staticmethod
    def _heads_params(heads: Mapping[UUID, Head]) -> list[list[Any]]:
        # Lists: psycopg sends a list as an array, a tuple as a record.
        return [list(heads), *(list(column) for column in zip(*heads.values(), strict=True))]

    def _upsert_heads(self, curs: Cursor[DictRow], heads: Mapping[UUID, Head] | None) -> None:
        if heads:
            # Another cursor: eventsourcing reads the notification ids from this one's result.
            with curs.connection.cursor() as heads_cursor:
                heads_cursor.execute(self.upsert_heads_statement, self._heads_params(heads))


_POLL_S = 0.1
"""How often a subscription reads the log for new notifications."""
_PLAIN_ROWS = 4
"""Commits of up to this many rows send them as plain parameters (one statement per count)."""


class _PollingSubscription(PostgresSubscription):
    """eventsourcing's subscription, woken every :data:`_POLL_S` instead of by NOTIFY."""

    def _listen(self) -> None:
        try:
            while not self._has_been_stopped and not self._thread_error:
                self._has_been_notified.set()
                time.sleep(_POLL_S)
        except BaseException as e:  # as eventsourcing's own listener
            if self._thread_error is None:
                self._thread_error = e
            self.stop()


class CompactPostgresApplicationRecorder(LittlePostgresApplicationRecorder):
    """The table layout of a PostgreSQL world created by this version of little_es.

    eventsourcing's table repeats the stream id (a 16-byte uuid) and the topic
    (text) in every row, and the uuid again in the primary-key index, beside a
    unique index of the notification ids: 563 B of a task step on disk at 10,000
    steps (``benchmarks/bench_pg_layout.py``). Here, as in a SQLite world's file
    (``CompactSQLiteApplicationRecorder``), a row holds integers instead, each
    standing for one stream id (``little_es_streams``) or one topic
    (``little_es_topics``), given on its first insert and never changed::

        little_es_events (notification_id bigserial, stream int, version int,
                          topic int, state bytea, PRIMARY KEY (stream, version))

    The version takes 4 bytes: a stream holds up to 2**31 - 1 events, and an
    insert past that fails with nothing written. The notification ids are indexed
    in buckets of 64 (``notification_id >> 6``): a B-tree whose keys repeat 64
    times keeps each bucket as one entry with a list of its rows (PostgreSQL's
    deduplication), about a third of a unique index's bytes. Readers of the
    notification log (:meth:`select_notifications`, :meth:`max_notification_id`)
    ask for the buckets and order by bucket, then id: an index scan that sorts 64
    rows at a time and stops at the limit. Readers see the same rows, notifications and
    ``StoredEvent`` objects as from eventsourcing's table; a row's bytes (its
    chain frame and payload) are the same in either layout.

    The integers of new stream ids and topics are given by a statement of their
    own just before the insert that first needs them, committed at once: one
    more round trip for a commit that starts a stream. A row of those tables
    that no event uses (the insert after it failed) stands for nothing. The
    insert sends stream ids and topics by name and reads their keys in its
    statement, so a row is always filed under its own names; the process keeps
    every key it has given or read only to know which names need none given.
    If the server lost a key this process knows (a failover to a replica that
    had not received its commit), the insert fails with nothing written, and
    is tried once more after the process forgets every key it knew. A read of
    a stream whose key it does not know looks the key up first (no key: the
    stream has no rows), and the names of a stream's topics come from the keys
    it knows (faster than a join with the topics table); a read between a
    failover and this process's next insert can use a stale key, which the hash
    chain refuses (``WorldIntegrityError``), never folds.

    A schema that already holds eventsourcing's table keeps it
    (:class:`LittlePostgresApplicationRecorder`; :class:`LittlePostgresFactory`
    picks the class by what the schema holds). eventsourcing's database-function
    mode (``POSTGRES_ENABLE_DB_FUNCTIONS``) applies to that table: this layout
    inserts with its one statement either way.
    """

    def __init__(self, datastore: PostgresDatastore, **kwargs: Any) -> None:
        kwargs["events_table_name"] = EVENTS_TABLE
        super().__init__(datastore, **kwargs)
        schema = Identifier(datastore.schema)
        self._streams = SQL("{0}.{1}").format(schema, Identifier(STREAMS_TABLE))
        self._topics = SQL("{0}.{1}").format(schema, Identifier(TOPICS_TABLE))
        id_type = datastore.originator_id_type
        names = {"events": self._events, "streams": self._streams, "topics": self._topics}
        self.sql_create_statements = [
            SQL(
                "CREATE TABLE IF NOT EXISTS {streams} (id serial PRIMARY KEY,"
                " stream_id {id_type} NOT NULL UNIQUE)"
            ).format(id_type=Identifier(id_type), **names),
            SQL(
                "CREATE TABLE IF NOT EXISTS {topics} (id serial PRIMARY KEY,"
                " topic text NOT NULL UNIQUE)"
            ).format(**names),
            # Packed full: rows only ever go in, mostly at the right end of each index.
            # The autovacuum settings are eventsourcing's for its events table.
            SQL(
                "CREATE TABLE IF NOT EXISTS {events} (notification_id bigserial,"
                " stream int NOT NULL, version int NOT NULL, topic int NOT NULL,"
                " state bytea NOT NULL, PRIMARY KEY (stream, version) WITH (fillfactor = 100))"
                " WITH (autovacuum_enabled = true, autovacuum_vacuum_threshold = 100000000,"
                " autovacuum_vacuum_scale_factor = 0.5, autovacuum_analyze_threshold = 1000,"
                " autovacuum_analyze_scale_factor = 0.01)"
            ).format(**names),
            SQL(
                "CREATE INDEX IF NOT EXISTS {index} ON {events} ((notification_id >> 6))"
                " WITH (fillfactor = 100)"
            ).format(index=Identifier(f"{EVENTS_TABLE}_notification_bucket"), **names),
            # For a person at the psql prompt: the rows as eventsourcing's table shows them.
            SQL(
                "CREATE OR REPLACE VIEW {view} AS SELECT e.notification_id,"
                " s.stream_id AS originator_id, e.version AS originator_version, t.topic,"
                " e.state FROM {events} e JOIN {streams} s ON s.id = e.stream"
                " JOIN {topics} t ON t.id = e.topic"
            ).format(view=SQL("{0}.{1}").format(schema, Identifier(ROWS_VIEW)), **names),
            self._create_heads_statement,
        ]
        self._stream_keys = _Keys(self._streams, "stream_id", id_type)
        self._topic_keys = _Keys(self._topics, "topic", "text")
        # A stream's rows by its key, with their topics' keys, which _rows_read spells
        # out from the keys it knows. Both measured faster than SQL doing it: a subquery
        # for the stream's key cost 0.1 ms of the check before each step and call
        # (has_rows_after), a join with the topics table 1 ms of 2,000 rows' read.
        self._stream_rows = SQL(
            "SELECT version, topic, state FROM {events} WHERE stream = %s"
        ).format(**names)
        # Notifications from a start (twice: bucket and id) to a stop, up to a limit.
        notifications = SQL(
            "SELECT e.notification_id, s.stream_id, e.version, t.topic, e.state FROM"
            " (SELECT * FROM {events} WHERE (notification_id >> 6) >= (%s::bigint >> 6)"
            " AND notification_id >= %s AND notification_id <= %s{topics_filter}"
            " ORDER BY notification_id >> 6, notification_id LIMIT %s) e"
            " JOIN {streams} s ON s.id = e.stream JOIN {topics} t ON t.id = e.topic"
            " ORDER BY e.notification_id"
        )
        every = notifications.format(topics_filter=SQL(""), **names)
        self._every_notification = every.as_bytes(None)
        self._notifications_of_topics = notifications.format(
            topics_filter=SQL(
                " AND topic = ANY(ARRAY(SELECT id FROM {topics} WHERE topic = ANY(%s)))"
            ).format(**names),
            **names,
        ).as_bytes(None)
        self._last_at_or_below = (
            SQL(
                "SELECT notification_id FROM {events} WHERE (notification_id >> 6)"
                " <= (%s::bigint >> 6) AND notification_id <= %s"
                " ORDER BY notification_id >> 6 DESC, notification_id DESC LIMIT 1"
            )
            .format(**names)
            .as_bytes(None)
        )

    @functools.cached_property
    def _stream_rows_statements(self) -> tuple[bytes, bytes]:
        return (
            (self._stream_rows + SQL(" ORDER BY version")).as_bytes(None),
            (self._stream_rows + SQL(" AND version > %s ORDER BY version")).as_bytes(None),
        )

    def _stream_param(self, conn: psycopg.Connection[Any], stream_id: UUID) -> Any:
        # 0, which no stream's key is, for a stream with no key: it has no rows.
        return self._stream_keys.key(conn, stream_id) or 0

    def _rows_read(self, conn: psycopg.Connection[Any], rows: list[tuple[Any, ...]]) -> list[Row]:
        topics = self._topic_keys.known
        try:
            return [(version, topics[topic], state) for version, topic, state in rows]
        except KeyError:  # a topic this process has not met: read its name first
            topics = self._topic_keys.names(conn, {topic for _, topic, _ in rows})
            return [(version, topics[topic], state) for version, topic, state in rows]

    def _row_columns(self) -> tuple[SQL, tuple[str, str, str, str]]:
        # The rows are sent by name and their keys read in the statement, not taken from
        # what this process knows: after a failover to a replica that had not received
        # the commit of a key, the same integer can be given to another name, and rows
        # sent with it would be filed under that name. A name with no key reads as NULL,
        # which the column refuses, failing the whole statement (see insert_events).
        return SQL("stream, version, topic, state"), (
            self.datastore.originator_id_type,
            "int4",
            "text",
            "bytea",
        )

    def _row_values(
        self, conn: psycopg.Connection[Any], stored_events: Sequence[StoredEvent]
    ) -> list[tuple[Any, int, Any, bytes]]:
        streams = self._stream_keys.give(conn, [e.originator_id for e in stored_events])
        self._topic_keys.give(conn, [e.topic for e in stored_events])
        return [
            (stream, e.originator_version, e.topic, e.state)
            for stream, e in zip(streams, stored_events, strict=True)
        ]

    def _row_selected(self) -> SQL | Composed:
        return SQL(
            "(SELECT id FROM {streams} WHERE stream_id = r.i), r.v,"
            " (SELECT id FROM {topics} WHERE topic = r.t), r.s"
        ).format(streams=self._streams, topics=self._topics)

    def _stream_param_type(self) -> str:
        return "int4"

    def _later_rows(self, stream_id: SQL | Composed, version: SQL) -> Composed:
        return SQL(
            "SELECT 1 FROM {events} WHERE stream = {stream_id} AND version > {version}"
        ).format(events=self._events, stream_id=stream_id, version=version)

    def insert_events(
        self, stored_events: Sequence[StoredEvent], **kwargs: Any
    ) -> Sequence[int] | None:
        """The one-statement insert of :meth:`LittlePostgresApplicationRecorder.insert_events`,
        in database-function mode too."""
        if not stored_events:
            return []
        ids: Sequence[int]
        try:
            ids = self._insert_in_one_statement(stored_events, **kwargs)
            return ids
        except IntegrityError as error:
            if not isinstance(error.__cause__, psycopg.errors.NotNullViolation):
                raise  # a version conflict
        # A key this process knew is not in the table (the server lost its commit: a
        # failover), and nothing was written. What it knew is forgotten, then read or
        # given again.
        self._stream_keys.forget()
        self._topic_keys.forget()
        ids = self._insert_in_one_statement(stored_events, **kwargs)
        return ids

    @retry((InterfaceError, OperationalError), max_attempts=10, wait=0.2)
    def select_events(
        self,
        originator_id: UUID | str,
        *,
        gt: int | None = None,
        lte: int | None = None,
        desc: bool = False,
        limit: int | None = None,
    ) -> Sequence[StoredEvent]:
        """eventsourcing's ``select_events`` on this layout."""
        stream_id = self._stream_keys.name(originator_id)
        statement = self._stream_rows
        params: list[Any] = [0]
        if gt is not None:
            statement += SQL(" AND version > %s")
            params.append(gt)
        if lte is not None:
            statement += SQL(" AND version <= %s")
            params.append(lte)
        statement += SQL(" ORDER BY version DESC" if desc else " ORDER BY version")
        if limit is not None:
            statement += SQL(" LIMIT %s")
            params.append(limit)
        with (
            self.datastore.get_connection() as conn,
            conn.cursor(row_factory=tuple_row) as curs,
        ):
            params[0] = self._stream_param(conn, stream_id)
            curs.execute(statement, params, prepare=True)
            return [
                StoredEvent(
                    originator_id=stream_id,
                    originator_version=version,
                    topic=topic,
                    state=bytes(state),
                )
                for version, topic, state in self._rows_read(conn, curs.fetchall())
            ]

    def _select_notifications(
        self,
        start: int | None,
        limit: int,
        stop: int,
        topics: Sequence[str],
        *,
        inclusive_of_start: bool,
    ) -> Sequence[Notification]:
        first = 1 if start is None else start if inclusive_of_start else start + 1
        params: list[Any] = [first, first, stop]
        if topics:
            params.append(list(topics))
        params.append(limit)
        with (
            self.datastore.get_connection() as conn,
            conn.cursor(row_factory=tuple_row) as curs,
        ):
            curs.execute(
                self._notifications_of_topics if topics else self._every_notification,
                params,
                prepare=True,
            )
            return [
                Notification(
                    id=notification_id,
                    originator_id=originator_id,
                    originator_version=version,
                    topic=topic,
                    state=bytes(state),
                )
                for notification_id, originator_id, version, topic, state in curs.fetchall()
            ]

    @retry((InterfaceError, OperationalError), max_attempts=10, wait=0.2)
    def max_notification_id(self) -> int | None:
        """The largest notification id at or below :meth:`horizon`, or None for none."""
        horizon = self.horizon()
        with (
            self.datastore.get_connection() as conn,
            conn.cursor(row_factory=tuple_row) as curs,
        ):
            curs.execute(self._last_at_or_below, (horizon, horizon), prepare=True)
            row = curs.fetchone()
        return None if row is None else int(row[0])


class _Keys:
    """The integers that stand for the names (stream ids or topics) of one key table.

    Kept once committed: a key is never changed or given again, unless the server
    loses the commit that gave it (see :meth:`forget`).
    """

    def __init__(self, table: Composed, column: str, type_name: str) -> None:
        self._keys: dict[Any, int] = {}
        self._names: dict[int, Any] = {}
        self._uuids = type_name == "uuid"
        names = Identifier(column)
        self._select_names = (
            SQL("SELECT id, {name} FROM {table} WHERE id = ANY(%s)")
            .format(name=names, table=table)
            .as_bytes(None)
        )
        self._select_key = (
            SQL("SELECT id, {name} FROM {table} WHERE {name} = %s")
            .format(name=names, table=table)
            .as_bytes(None)
        )
        # The names found, and those not found given a key (only those: every insert
        # draws from the key's sequence, a conflict too). Given in the names' order:
        # two writers giving the same new names wait for each other, never deadlock.
        # Committed with synchronous_commit on, whatever the server's default: a key
        # that a crash took back would be given again to another name, and the rows
        # written with it by this process (which keeps it) would read as that name's.
        self._statement = (
            SQL(
                "WITH durable AS MATERIALIZED"
                " (SELECT set_config('synchronous_commit', 'on', true)),"
                " found AS (SELECT id, {name} FROM {table} WHERE {name} = ANY(%s::{type}[])),"
                " given AS (INSERT INTO {table} ({name})"
                " SELECT n FROM durable, unnest(%s::{type}[]) AS u (n)"
                " WHERE n NOT IN (SELECT {name} FROM found) ORDER BY n"
                " ON CONFLICT ({name}) DO NOTHING"
                " RETURNING id, {name}) SELECT id, {name} FROM found"
                " UNION ALL SELECT id, {name} FROM given"
            )
            .format(name=names, table=table, type=Identifier(type_name))
            .as_bytes(None)
        )

    def name(self, value: Any) -> Any:
        """``value`` as the table holds it (a stream id may come as a string of a uuid)."""
        if self._uuids and not isinstance(value, UUID):
            return UUID(str(value))
        return value

    def give(self, conn: psycopg.Connection[Any], values: Sequence[Any]) -> list[Any]:
        """Each value by :meth:`name`, in order, once every one of them has a key: new ones
        given and committed first."""
        keys = self._keys
        named = [self.name(value) for value in values]
        missing = [n for n in dict.fromkeys(named) if n not in keys]
        # A name given by another writer's insert that commits after this statement
        # began is neither found nor given: the next round finds it.
        for _ in range(_KEY_ROUNDS):
            if not missing:
                return named
            with conn.cursor(row_factory=tuple_row) as curs:
                curs.execute(self._statement, (missing, missing), prepare=True)
                self._learn(curs.fetchall())
            missing = [n for n in missing if n not in keys]
        raise OperationalError(f"no key given for {missing!r} in {_KEY_ROUNDS} rounds")

    def key(self, conn: psycopg.Connection[Any], value: Any) -> int | None:
        """The key of one name (by :meth:`name`), or None: none is given (nothing is)."""
        name = self.name(value)
        found = self._keys.get(name)
        if found is None:
            with conn.cursor(row_factory=tuple_row) as curs:
                curs.execute(self._select_key, (name,), prepare=True)
                self._learn(curs.fetchall())
            found = self._keys.get(name)
        return found

    @property
    def known(self) -> Mapping[int, Any]:
        """The names of the keys met so far, by key."""
        return self._names

    def names(self, conn: psycopg.Connection[Any], keys: Iterable[int]) -> dict[int, Any]:
        """The name of every key in ``keys`` (by key), read from the table when new here."""
        names = self._names
        missing = [k for k in keys if k not in names]
        if missing:
            with conn.cursor(row_factory=tuple_row) as curs:
                curs.execute(self._select_names, (missing,), prepare=True)
                self._learn(curs.fetchall())
        # A row's key was committed before the row: every key read from a row is there.
        return names

    def forget(self) -> None:
        """Drop every key known here: the next use reads them from the table again."""
        self._keys.clear()
        self._names.clear()

    def _learn(self, pairs: Iterable[tuple[int, Any]]) -> None:
        for key, name in pairs:
            self._keys[name] = key
            self._names[key] = name


_KEY_ROUNDS = 10
"""How many times :class:`_Keys` asks for the keys of names before giving up."""


class LittlePostgresFactory(PostgresFactory):
    """eventsourcing's PostgreSQL factory with little_es's recorders.

    A world's application recorder is :class:`CompactPostgresApplicationRecorder`,
    except in a schema whose events are in eventsourcing's table (made by an
    earlier version of little_es; :func:`~little_es.backends.base.keeps_eventsourcing_table`
    says which layout a schema holds): that one keeps its layout
    (:class:`LittlePostgresApplicationRecorder`), since nothing rewrites stored
    rows. Any other application keeps eventsourcing's table of its own name.
    """

    application_recorder_class = CompactPostgresApplicationRecorder

    def application_recorder(self) -> ApplicationRecorder:
        """The recorder for the layout the schema holds (a new schema: the compact one)."""
        if self.env.get(self.APPLICATION_RECORDER_TOPIC):
            return super().application_recorder()
        events_table_name = (self.env.name.lower() or "stored") + "_events"
        if self.env.name == WORLD_APPLICATION_NAME and not keeps_eventsourcing_table(
            compact=self._holds(EVENTS_TABLE), eventsourcing=self._holds(events_table_name)
        ):
            return super().application_recorder()
        recorder = LittlePostgresApplicationRecorder(
            self.datastore, events_table_name=events_table_name
        )
        if self.env_create_table():
            recorder.create_table()  # the heads table, in a schema from before it
        return recorder

    def _holds(self, table: str) -> bool:
        with self.datastore.get_connection() as conn, conn.cursor(row_factory=tuple_row) as curs:
            curs.execute(
                "SELECT to_regclass(%s) IS NOT NULL",
                (f"{_quoted(self.datastore.schema)}.{_quoted(table)}",),
            )
            row = curs.fetchone()
            return bool(row and row[0])


# -------------------------------------------------------------------- artifacts


class PostgresArtifactStore(ArtifactStore):
    """Blobs in a table of the world's own PostgreSQL database."""

    driver_errors = (psycopg.Error,)

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
        # Pools shared with eventsourcing hand out connections that make dict rows.
        with self._pool.connection() as conn, conn.cursor(row_factory=tuple_row) as cur:
            row = cur.execute(
                f"SELECT data FROM {self._table} WHERE sha256 = %s", (sha256,)
            ).fetchone()
        return None if row is None else bytes(row[0])

    def close(self) -> None:
        """Close the pool if this store opened it."""
        if self._owns_pool:
            self._pool.close()


# ----------------------------------------------------------------------- leases


_HELD_LOCK = SQL(
    "SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND granted"
    " AND ((classid::bigint << 32) | objid::bigint) = %s AND objsubid = 1"
)
_LOCK_HOLDER = SQL(
    "SELECT l.pid, a.application_name, a.client_addr::text FROM pg_locks l"
    " LEFT JOIN pg_stat_activity a ON a.pid = l.pid"
    " WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1"
    " AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
    " AND ((l.classid::bigint << 32) | l.objid::bigint) = %s"
)


class _HeldLock:
    """One held advisory lock: its connection, and when it was last confirmed by a query."""

    def __init__(self, conn: psycopg.Connection[Any], lock_key: int) -> None:
        self.conn = conn
        self.lock_key = lock_key
        self.poller = select.poll()
        self.poller.register(conn.fileno(), select.POLLIN | select.POLLERR | select.POLLHUP)
        self.verified_at = time.monotonic()
        self.mutex = threading.Lock()


class PostgresRunLeases(RunLeases):
    """PostgreSQL session advisory locks, one connection per held lease.

    The server releases the lock when the connection closes, which it does
    when the holding process dies.

    Checking a lease (:meth:`_lost`) costs a ``poll`` of the lock
    connection's socket (about 1 us) every time, and a query confirming the
    lock in ``pg_locks`` (0.3-0.5 ms, a quarter of recording a model call) at
    most every :attr:`verify_interval_s`, or at once when the socket has
    something to read. A terminated backend (``pg_terminate_backend``, an idle
    timeout, a proxy closing the connection) makes the socket readable, so it
    is seen at the next check; a silent network failure is seen when TCP
    keepalive gives up on the connection (set to about 25 s here), or by the
    next confirming query.
    """

    verify_interval_s = 0.5
    """The longest time between two confirming queries of a held lock."""

    driver_errors = (psycopg.Error,)

    def __init__(self, conninfo: str, *, scope: str = "public") -> None:
        self._conninfo = conninfo
        self._scope = scope.encode()

    def _lock_key(self, key: UUID) -> int:
        # Advisory locks are per database, not per schema: mix the world's schema
        # in, or worlds in two schemas of one database would lock each other's runs.
        return _lock_key(self._scope + b":" + key.bytes)

    def _acquire(self, key: UUID) -> _HeldLock | None:
        conn = psycopg.connect(
            self._conninfo,
            autocommit=True,
            # Shown by `little unlock` (pg_stat_activity), since the pid there is the server's.
            application_name=f"little_es lease pid {os.getpid()} on {socket.gethostname()}"[:63],
            keepalives=1,
            keepalives_idle=10,
            keepalives_interval=5,
            keepalives_count=3,
        )
        lock_key = self._lock_key(key)
        try:
            row = conn.execute("SELECT pg_try_advisory_lock(%s)", (lock_key,)).fetchone()
        except BaseException:
            conn.close()
            raise
        if row is None or not row[0]:
            conn.close()
            return None
        return _HeldLock(conn, lock_key)

    def _release(self, token: _HeldLock) -> None:
        token.conn.close()

    def _lost(self, token: _HeldLock) -> str | None:
        with token.mutex:
            if token.conn.closed:
                return "its PostgreSQL connection is closed"
            now = time.monotonic()
            if not token.poller.poll(0) and now - token.verified_at < self.verify_interval_s:
                return None
            try:
                row = token.conn.execute(_HELD_LOCK, (token.lock_key,)).fetchone()
            except psycopg.Error as exc:
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc)
                return f"its PostgreSQL connection failed: {first}"
            if row is None:
                return "its PostgreSQL advisory lock is no longer held"
            token.verified_at = now
            return None

    def _holders(self, conn: psycopg.Connection[Any], key: UUID) -> list[tuple[int, str]]:
        rows = conn.execute(_LOCK_HOLDER, (self._lock_key(key),)).fetchall()
        return [
            (pid, f"{app or 'a client'} (server pid {pid}{f', from {addr}' if addr else ''})")
            for pid, app, addr in rows
        ]

    def _holder(self, key: UUID) -> str | None:
        with psycopg.connect(self._conninfo, autocommit=True, connect_timeout=5) as conn:
            holders = self._holders(conn, key)
        return holders[0][1] if holders else None

    def _break(self, key: UUID) -> str | None:
        with psycopg.connect(self._conninfo, autocommit=True, connect_timeout=5) as conn:
            holders = self._holders(conn, key)
            for pid, holder in holders:
                try:
                    conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
                except psycopg.errors.InsufficientPrivilege as exc:
                    raise WorldConfigError(
                        f"cannot take the lease from {holder}: {str(exc).strip()}; connect as"
                        " the holder's role, a member of pg_signal_backend, or a superuser"
                    ) from exc
            # The lock is released once the backend has exited, a moment after the signal.
            deadline = time.monotonic() + 10
            while holders and self._holders(conn, key) and time.monotonic() < deadline:
                time.sleep(0.02)
        return holders[0][1] if holders else None


# -------------------------------------------------------------- runs read model


class PostgresRunsView(PostgresTrackingRecorder, RunsView):
    """The runs read model in the world's PostgreSQL schema, next to its events."""

    def __init__(self, datastore: PostgresDatastore) -> None:
        super().__init__(datastore, tracking_table_name=RUNS_TRACKING_TABLE)
        schema = Identifier(datastore.schema)
        self._runs = SQL("{}.{}").format(schema, Identifier(RUNS_TABLE))
        self._streams = SQL("{}.{}").format(schema, Identifier(RUN_STREAMS_TABLE))
        self.sql_create_statements.append(
            SQL(
                "CREATE TABLE IF NOT EXISTS {} (run_id text PRIMARY KEY,"
                " summary bytea NOT NULL, state bytea NOT NULL)"
            ).format(self._runs)
        )
        self.sql_create_statements.append(
            SQL(
                "CREATE TABLE IF NOT EXISTS {} (stream_id uuid PRIMARY KEY, run_id text NOT NULL)"
            ).format(self._streams)
        )

    def runs_of_streams(self, stream_ids: Iterable[UUID]) -> dict[UUID, str]:
        """See :meth:`RunsView.runs_of_streams`."""
        ids = list(stream_ids)
        if not ids:
            return {}
        with self.datastore.transaction(commit=False) as curs:
            curs.execute(
                SQL("SELECT stream_id, run_id FROM {} WHERE stream_id = ANY(%s)").format(
                    self._streams
                ),
                (ids,),
            )
            return {row["stream_id"]: row["run_id"] for row in curs.fetchall()}

    def load_state(self, run_id: str) -> MaterializedRunState | None:
        """See :meth:`RunsView.load_state`."""
        with self.datastore.transaction(commit=False) as curs:
            curs.execute(
                SQL("SELECT state FROM {} WHERE run_id = %s").format(self._runs), (run_id,)
            )
            row = curs.fetchone()
        return None if row is None else load_state(bytes(row["state"]))

    def commit(
        self,
        states: Mapping[str, MaterializedRunState],
        streams: Mapping[UUID, str],
        tracking: Tracking,
    ) -> None:
        """See :meth:`RunsView.commit`."""
        rows = [
            (run_id, dump_summary(RunSummary.of(run_id, state)), dump_state(state))
            for run_id, state in states.items()
        ]
        with self.datastore.transaction(commit=True) as curs:
            self._insert_tracking(curs, tracking)
            curs.executemany(
                SQL(
                    "INSERT INTO {} (run_id, summary, state) VALUES (%s, %s, %s)"
                    " ON CONFLICT (run_id) DO UPDATE SET summary = excluded.summary,"
                    " state = excluded.state"
                ).format(self._runs),
                rows,
            )
            curs.executemany(
                SQL(
                    "INSERT INTO {} (stream_id, run_id) VALUES (%s, %s)"
                    " ON CONFLICT (stream_id) DO UPDATE SET run_id = excluded.run_id"
                ).format(self._streams),
                list(streams.items()),
            )

    def summaries(self) -> tuple[RunSummary, ...]:
        """See :meth:`RunsView.summaries`."""
        with self.datastore.transaction(commit=False) as curs:
            curs.execute(SQL("SELECT summary FROM {}").format(self._runs))
            rows = curs.fetchall()
        return oldest_first(RunSummary.model_validate_json(bytes(row["summary"])) for row in rows)

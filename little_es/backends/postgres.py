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

import hashlib
import os
import re
import select
import socket
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any
from uuid import UUID

import psycopg
from eventsourcing.persistence import (
    ApplicationRecorder,
    InterfaceError,
    Notification,
    OperationalError,
    StoredEvent,
    Subscription,
    Tracking,
)
from eventsourcing.postgres import (
    PostgresApplicationRecorder,
    PostgresDatastore,
    PostgresFactory,
    PostgresSubscription,
    PostgresTrackingRecorder,
)
from eventsourcing.utils import get_topic, retry
from psycopg import Cursor
from psycopg.rows import DictRow, tuple_row
from psycopg.sql import SQL, Identifier, Literal
from psycopg_pool import ConnectionPool

from little_es.backends.base import (
    HEADS_TABLE,
    RUN_STREAMS_TABLE,
    RUNS_TABLE,
    RUNS_TRACKING_TABLE,
    ApplicationClass,
    ArtifactStore,
    Backend,
    Row,
    RunLeases,
    RunSummary,
    RunsView,
    StreamWatch,
    dump_state,
    dump_summary,
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
        assert isinstance(recorder, PostgresApplicationRecorder)
        base = SQL(
            "SELECT originator_version, topic, state FROM {schema}.{table} WHERE originator_id = %s"
        ).format(
            schema=Identifier(datastore.schema),
            table=Identifier(recorder.events_table_name),
        )
        # Rendered once: psycopg renders a Composed query again on every execute (about a
        # tenth of the check before each step and call, has_events_after).
        later = base + SQL(" AND originator_version > %s ORDER BY originator_version")
        self._every = (base + SQL(" ORDER BY originator_version")).as_bytes(None)
        self._later = later.as_bytes(None)
        self._next = (later + SQL(" LIMIT 1")).as_bytes(None)

    def select_rows(self, stream_id: UUID, after: int | None) -> Sequence[Row]:
        """One stream's rows, read from the recorder's table (see :meth:`Backend.select_rows`)."""
        with (
            self._datastore.get_connection() as conn,
            conn.cursor(row_factory=tuple_row) as cursor,
        ):
            if after is None:
                cursor.execute(self._every, (stream_id,), prepare=True)
            else:
                cursor.execute(self._later, (stream_id, after), prepare=True)
            rows: list[Row] = cursor.fetchall()
            return rows

    def has_events_after(self, stream_id: UUID, version: int) -> bool:
        """See :meth:`Backend.has_events_after`: one prepared statement on the table."""
        with (
            self._datastore.get_connection() as conn,
            conn.cursor(row_factory=tuple_row) as cursor,
        ):
            cursor.execute(self._next, (stream_id, version), prepare=True)
            return cursor.fetchone() is not None

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
        self.sql_create_statements.append(
            SQL(
                "CREATE TABLE IF NOT EXISTS {heads} (stream_id uuid PRIMARY KEY,"
                " version bigint NOT NULL, digest bytea NOT NULL, running bytea NOT NULL)"
            ).format(heads=heads)
        )
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
        notifications: Sequence[Notification] = super().select_notifications(
            start,
            limit,
            stop=horizon if stop is None else min(stop, horizon),
            topics=topics,
            inclusive_of_start=inclusive_of_start,
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
        **_: Any,
    ) -> Sequence[int]:
        params: list[Any] = [*self._options_params]
        # A few rows (most commits: a step's StepCompleted with the next StepStarted, a
        # harness call's two records) as plain parameters: psycopg dumps arrays much slower.
        plain = len(stored_events) if len(stored_events) <= _PLAIN_ROWS else 0
        if plain:
            for e in stored_events:
                params += (e.originator_id, e.originator_version, e.topic, e.state)
        else:
            params += (
                [e.originator_id for e in stored_events],
                [e.originator_version for e in stored_events],
                [e.topic for e in stored_events],
                [e.state for e in stored_events],
            )
        if heads and len(heads) == 1:
            ((stream_id, head),) = heads.items()
            params += (stream_id, *head)
        elif heads:
            params += self._heads_params(heads)
        watched = list(watch.versions.items()) if watch is not None else []
        if len(watched) == 1:
            params += watched[0]
        elif watched:
            params += ([sid for sid, _ in watched], [version for _, version in watched])
        statement = self._insert_statement(
            durable,
            plain,
            0 if not heads else 1 if len(heads) == 1 else 2,
            min(len(watched), 2),
        )
        with (
            self.datastore.get_connection() as conn,
            conn.cursor(row_factory=tuple_row) as curs,
        ):
            # Autocommit: the statement is its own transaction.
            curs.execute(statement, params, prepare=True)
            rows = curs.fetchall()
        if watch is not None:
            changed = rows[0][1] if rows else []
            watch.found([watched[0][0]] if changed is True else changed or [])
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
        id_type = Identifier(self.datastore.originator_id_type)
        rows = (
            SQL("(VALUES {0}) AS r (i, v, t, s, n)").format(
                SQL(", ").join(
                    SQL("(%s::{0}, %s::bigint, %s::text, %s::bytea, {1})").format(
                        id_type, Literal(n)
                    )
                    for n in range(1, plain + 1)
                )
            )
            if plain
            else SQL(
                "unnest(%s::{0}[], %s::bigint[], %s::text[], %s::bytea[])"
                " WITH ORDINALITY AS r (i, v, t, s, n)"
            ).format(id_type)
        )
        # Rows go in in the order given, so a stream's versions draw ascending ids.
        order = SQL("") if plain == 1 else SQL(" ORDER BY r.n")
        statement = SQL(
            "WITH options AS MATERIALIZED ({options}), inserted AS ("
            "INSERT INTO {events} (originator_id, originator_version, topic, state)"
            " SELECT r.i, r.v, r.t, r.s FROM options, {rows}{order} RETURNING notification_id)"
        ).format(options=options, events=self._events, rows=rows, order=order)
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
        # The watched streams are read in the statement's snapshot, as they stood when
        # this commit began: a cancel that commits meanwhile is seen one call later, as
        # one that commits just after a check's own query is.
        changed = (
            SQL("")
            if not watched
            else SQL(
                ", EXISTS (SELECT 1 FROM {events} WHERE originator_id = %s::uuid"
                " AND originator_version > %s::bigint)"
            ).format(events=self._events)
            if watched == 1
            else SQL(
                ", ARRAY(SELECT w.i FROM unnest(%s::uuid[], %s::bigint[]) AS w (i, v)"
                " WHERE EXISTS (SELECT 1 FROM {events} e WHERE e.originator_id = w.i"
                " AND e.originator_version > w.v))"
            ).format(events=self._events)
        )
        statement += SQL(" SELECT notification_id{changed} FROM inserted").format(changed=changed)
        rendered = self._insert_statements[key] = statement.as_bytes(None)
        return rendered

    @retry((InterfaceError, OperationalError), max_attempts=10, wait=0.2)
    def _insert_through_function(
        self, stored_events: Sequence[StoredEvent], **kwargs: Any
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
        return ids

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


class LittlePostgresFactory(PostgresFactory):
    """eventsourcing's PostgreSQL factory with :class:`LittlePostgresApplicationRecorder`."""

    application_recorder_class = LittlePostgresApplicationRecorder


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

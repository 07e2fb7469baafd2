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
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any
from uuid import UUID

import psycopg
from eventsourcing.persistence import StoredEvent, Tracking
from eventsourcing.postgres import (
    PostgresApplicationRecorder,
    PostgresDatastore,
    PostgresFactory,
    PostgresTrackingRecorder,
)
from eventsourcing.utils import get_topic
from psycopg import Cursor
from psycopg.rows import DictRow, tuple_row
from psycopg.sql import SQL, Identifier
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
    dump_state,
    dump_summary,
    load_state,
    oldest_first,
)
from little_es.chain import Head
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
                    "POSTGRES_POOL_SIZE": "5",
                    "POSTGRES_MAX_OVERFLOW": "10",
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
        self._every = base + SQL(" ORDER BY originator_version")
        self._later = base + SQL(" AND originator_version > %s ORDER BY originator_version")

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
    """eventsourcing's PostgreSQL recorder; keeps stream heads; write-ahead-only commits do not
    wait for a flush.

    Every insert also moves the heads of its streams (``HEADS_TABLE``) in the
    same transaction, pipelined with the rows (no extra round trip).
    """

    def __init__(self, datastore: PostgresDatastore, **kwargs: Any) -> None:
        super().__init__(datastore, **kwargs)
        heads = SQL("{schema}.{table}").format(
            schema=Identifier(datastore.schema), table=Identifier(HEADS_TABLE)
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
        self.select_head_statement = SQL(
            "SELECT version, digest, running FROM {heads} WHERE stream_id = %s"
        ).format(heads=heads)
        self.select_heads_statement = SQL(
            "SELECT stream_id, version, digest, running FROM {heads}"
        ).format(heads=heads)

    def _insert_stored_events(
        self,
        curs: Cursor[DictRow],
        stored_events: Sequence[StoredEvent],
        *,
        heads: Mapping[UUID, Head] | None = None,
        **kwargs: Any,
    ) -> None:
        super()._insert_stored_events(curs, stored_events, **kwargs)
        if heads:
            # Lists: psycopg sends a list as an array, a tuple as a record.
            columns = [list(column) for column in zip(*heads.values(), strict=True)]
            # Another cursor: eventsourcing reads the notification ids from this one's result.
            with curs.connection.cursor() as heads_cursor:
                heads_cursor.execute(self.upsert_heads_statement, (list(heads), *columns))

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


# -------------------------------------------------------------------- artifacts


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


class PostgresRunLeases(RunLeases):
    """PostgreSQL session advisory locks, one connection per held lease.

    The server releases the lock when the connection closes, which it does
    when the holding process dies.
    """

    def __init__(self, conninfo: str, *, scope: str = "public") -> None:
        self._conninfo = conninfo
        self._scope = scope.encode()

    def _acquire(self, key: UUID) -> psycopg.Connection[Any] | None:
        conn = psycopg.connect(self._conninfo, autocommit=True)
        # Advisory locks are per database, not per schema: mix the world's schema
        # in, or worlds in two schemas of one database would lock each other's runs.
        lock_key = _lock_key(self._scope + b":" + key.bytes)
        try:
            row = conn.execute("SELECT pg_try_advisory_lock(%s)", (lock_key,)).fetchone()
        except BaseException:
            conn.close()
            raise
        if row is None or not row[0]:
            conn.close()
            return None
        return conn

    def _release(self, token: psycopg.Connection[Any]) -> None:
        token.close()


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

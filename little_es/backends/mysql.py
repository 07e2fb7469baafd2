"""The MariaDB/MySQL backend: events through eventsourcing-sqlalchemy, all in one database.

Events go through the ``eventsourcing-sqlalchemy`` extension (its factory,
datastore and recorders on a SQLAlchemy engine with the PyMySQL driver),
blobs to a table of the same database, run leases are MariaDB named locks
(``GET_LOCK``) held by a connection of their own, and the runs read model is
three tables next to the events. Needs the ``mysql`` extra; only a MariaDB or
MySQL world imports this module.

What eventsourcing-sqlalchemy does not do on MySQL, and what is done here instead:

* **Notification order.** On PostgreSQL it locks the events table for every
  insert, so notification ids are assigned in commit order; on MySQL it takes
  no lock at all, and InnoDB hands out ``AUTO_INCREMENT`` ids at insert time:
  two concurrent transactions can commit ids 11 and 10 in that order, and a
  reader of notifications (the runs projection) that saw 11 first would pass
  over 10 for good. Here every insert of the application recorder first locks
  the one row of :data:`APPEND_LOCK_TABLE` (``SELECT ... FOR UPDATE``), so all
  writers of a database commit one at a time, in id order, as on PostgreSQL.
  Ids still have gaps (a rolled-back insert consumes its ids), which every
  reader here tolerates, as with PostgreSQL sequences.
* **Row size.** Its ``state`` column is ``LargeBinary``, a ``BLOB`` (64 KiB)
  on MySQL, which would refuse a large snapshot; here it is ``LONGBLOB``.
* **Closing.** Its factory never disposes of its engine; here ``close`` does.

The commit policy: InnoDB has no per-transaction equivalent of PostgreSQL's
``synchronous_commit`` (``innodb_flush_log_at_trx_commit`` is a server-wide
setting), so a write-ahead-only commit (``durable=False``) waits for the log
flush like any other. The world is as durable as the server's settings make
it, which are read when the world is opened (:func:`server_durability`):
``innodb_flush_log_at_trx_commit=1`` and, when the binary log is on,
``sync_binlog=1`` make every commit survive a power cut. With
``synchronous="full"`` (the default) a server set otherwise is refused;
``synchronous="normal"`` accepts one that flushes its log only about once a
second (``innodb_flush_log_at_trx_commit=2``, or ``sync_binlog`` not 1): a
commit then survives a killed process, client or server, but a power cut or
OS crash can lose the last second of commits. A server that does not even
write its log at commit (``innodb_flush_log_at_trx_commit=0``) is always
refused: a crash of the server itself would lose committed results.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import select
import socket
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal
from uuid import UUID

import pymysql
from eventsourcing.persistence import IntegrityError, OperationalError, StoredEvent, Tracking
from eventsourcing.utils import get_topic
from eventsourcing_sqlalchemy.datastore import SQLAlchemyDatastore
from eventsourcing_sqlalchemy.factory import SQLAlchemyFactory
from eventsourcing_sqlalchemy.models import (  # type: ignore[attr-defined]
    SnapshotRecord,
    StoredEventRecord,
)
from eventsourcing_sqlalchemy.recorders import (
    SQLAlchemyAggregateRecorder,
    SQLAlchemyApplicationRecorder,
    SQLAlchemyProcessRecorder,
)
from sqlalchemy import Column, LargeBinary, text
from sqlalchemy.dialects.mysql import LONGBLOB
from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

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
    SnapshotRows,
    StreamWatch,
    dump_state,
    dump_summary,
    load_state,
    oldest_first,
)
from little_es.chain import Head
from little_es.errors import WorldConfigError
from little_es.materialize import MaterializedRunState

Synchronous = Literal["full", "normal"]

APPEND_LOCK_TABLE = "little_es_append_lock"
"""One row, locked by every insert of events, so they commit in notification-id order."""
ARTIFACTS_TABLE = "little_es_artifacts"
LEASE_HOLDERS_TABLE = "little_es_lease_holders"
"""Who took each named lock last (pid and host), for ``little unlock`` to show."""

ARTIFACT_CHUNK = 1 << 20
"""Blobs are stored in rows of at most this many bytes: a row is sent in one packet,
and ``max_allowed_packet`` is 16 MiB by default on MariaDB (4 MiB on older MySQL)."""


@dataclass(frozen=True)
class ServerDurability:
    """What the server's settings make of a commit (read by :func:`server_durability`)."""

    version: str
    flush_log_at_trx_commit: int
    log_bin: bool
    sync_binlog: int

    @property
    def level(self) -> Literal["full", "normal", "none"]:
        """``full``: a commit survives a power cut; ``normal``: a crash of a process only;
        ``none``: not even a crash of the server."""
        if self.flush_log_at_trx_commit == 0:
            return "none"
        if self.flush_log_at_trx_commit == 1 and (not self.log_bin or self.sync_binlog == 1):
            return "full"
        return "normal"

    def describe(self) -> str:
        """The settings, as a message shows them."""
        binlog = f"log_bin=ON, sync_binlog={self.sync_binlog}" if self.log_bin else "log_bin=OFF"
        return f"innodb_flush_log_at_trx_commit={self.flush_log_at_trx_commit}, {binlog}"


def server_durability(conn: pymysql.connections.Connection[Any]) -> ServerDurability:
    """Read the server's commit-flush settings."""
    with conn.cursor() as cur:
        cur.execute(
            "SELECT VERSION(), @@GLOBAL.innodb_flush_log_at_trx_commit, @@GLOBAL.log_bin,"
            " @@GLOBAL.sync_binlog"
        )
        row = cur.fetchone()
    assert row is not None
    return ServerDurability(str(row[0]), int(row[1]), bool(int(row[2])), int(row[3]))


def _check_durability(durability: ServerDurability, synchronous: Synchronous, name: str) -> None:
    level = durability.level
    if level == "full" or (level == "normal" and synchronous == "normal"):
        return
    if level == "none":
        raise WorldConfigError(
            f"world {name}: the server's {durability.describe()} does not write its log at"
            " commit, so a crash of the server loses committed results; set"
            " innodb_flush_log_at_trx_commit=1 (SET GLOBAL, and in the server's configuration)"
        )
    raise WorldConfigError(
        f"world {name}: the server's {durability.describe()} flushes commits to disk only"
        " about once a second, so a power cut can lose committed results; set"
        " innodb_flush_log_at_trx_commit=1 and sync_binlog=1, or accept that with"
        " ?synchronous=normal in the world's URL"
    )


@dataclass(frozen=True)
class ConnectionInfo:
    """Where the server is, and which database holds the world."""

    host: str
    port: int
    user: str
    password: str
    database: str

    def connect(self, *, database: bool = True) -> pymysql.connections.Connection[Any]:
        """A new autocommit PyMySQL connection."""
        return pymysql.connect(
            host=self.host,
            port=self.port,
            user=self.user,
            password=self.password,
            database=self.database if database else None,
            autocommit=True,
            connect_timeout=5,
        )


class MySQLBackend(Backend):
    """A world in one MariaDB (or MySQL) database, which must exist.

    ``name`` is how the world is shown (its URL without the password);
    ``synchronous`` what the server's settings must give (see the module).
    """

    def __init__(
        self,
        app_class: ApplicationClass,
        *,
        info: ConnectionInfo,
        synchronous: Synchronous = "full",
        name: str,
    ) -> None:
        try:
            setup = info.connect()
        except pymysql.err.OperationalError as exc:
            if exc.args and exc.args[0] == 1049:  # ER_BAD_DB_ERROR
                raise WorldConfigError(
                    f"world {name}: the database {info.database!r} does not exist; create it"
                    f" (CREATE DATABASE `{info.database}`) and open the world again"
                ) from exc
            raise
        try:
            self.durability = server_durability(setup)
            """The server's commit-flush settings, as read when the world was opened."""
            _check_durability(self.durability, synchronous, name)
            with _named_lock(setup, f"little_es tables:{info.database}"):
                app = app_class(
                    env={
                        "PERSISTENCE_MODULE": get_topic(LittleSQLAlchemyFactory),
                        "SQLALCHEMY_URL": _sqlalchemy_url(info),
                    }
                )
                factory = app.factory
                assert isinstance(factory, LittleSQLAlchemyFactory)
                engine = factory.datastore.engine
                assert isinstance(engine, Engine)
                artifacts = MySQLArtifactStore(engine)
                with setup.cursor() as cur:
                    cur.execute(
                        f"CREATE TABLE IF NOT EXISTS {LEASE_HOLDERS_TABLE} (lock_name"
                        " VARCHAR(64) PRIMARY KEY, connection_id BIGINT NOT NULL,"
                        " holder VARCHAR(255) NOT NULL) ENGINE=InnoDB"
                    )
                    _drop_case_folding_runs_view(cur)
        finally:
            setup.close()
        super().__init__(app=app, artifacts=artifacts, leases=MySQLRunLeases(info), name=name)
        self._engine = engine
        recorder = app.recorder
        assert isinstance(recorder, LittleSQLAlchemyApplicationRecorder)
        base = (
            f"SELECT originator_version, topic, state FROM {recorder.events_table_name}"
            " WHERE originator_id = %s"
        )
        self._every = base + " ORDER BY originator_version"
        self._later = base + " AND originator_version > %s ORDER BY originator_version"

    def _query(self, statement: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        # The driver's cursor on a pooled connection: no ORM objects per row.
        try:
            with self._engine.connect() as conn:
                return [tuple(r) for r in conn.exec_driver_sql(statement, params).fetchall()]
        except SQLAlchemyError as exc:
            # eventsourcing's error, as its recorders raise: the world turns it into a
            # WorldStorageError, never the failure of the step that was reading.
            raise OperationalError(str(exc)) from exc

    def select_rows(self, stream_id: UUID, after: int | None) -> Sequence[Row]:
        """One stream's rows, read from the recorder's table (see :meth:`Backend.select_rows`)."""
        if after is None:
            rows = self._query(self._every, (stream_id.bytes,))
        else:
            rows = self._query(self._later, (stream_id.bytes, after))
        return [(v, t, bytes(s)) for v, t, s in rows]

    def stream_head(self, stream_id: UUID) -> Head | None:
        """See :meth:`Backend.stream_head`: from the heads table."""
        rows = self._query(
            f"SELECT version, digest, running FROM {HEADS_TABLE} WHERE stream_id = %s",
            (stream_id.bytes,),
        )
        return None if not rows else Head(rows[0][0], bytes(rows[0][1]), bytes(rows[0][2]))

    def stream_heads(self) -> dict[UUID, Head]:
        """See :meth:`Backend.stream_heads`: the whole heads table."""
        rows = self._query(f"SELECT stream_id, version, digest, running FROM {HEADS_TABLE}")
        return {UUID(bytes=bytes(s)): Head(v, bytes(d), bytes(r)) for s, v, d, r in rows}

    def runs_view(self) -> MySQLRunsView:
        """The read model in the world's database."""
        view = MySQLRunsView(self._engine)
        view.create_table()
        return view


RUN_ID_COLUMN = "VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin"
"""A run id column: run ids are ASCII (:func:`little_es.ids.validate_run_id`), and
compared byte for byte, so ``Nightly`` and ``nightly`` are two runs as on the other
backends (the database's default collation ignores case)."""


def _drop_case_folding_runs_view(cur: pymysql.cursors.Cursor) -> None:
    # Worlds created before RUN_ID_COLUMN keyed the runs read model case-insensitively,
    # and may have folded two runs into one row: the model is only a projection of the
    # log, so it is dropped, recreated with RUN_ID_COLUMN, and folded again from the
    # first event. The tracking position goes first and the runs table last, so an open
    # stopped half way still finds the old runs table and finishes the job.
    cur.execute(
        "SELECT COLLATION_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA ="
        " DATABASE() AND TABLE_NAME = %s AND COLUMN_NAME = 'run_id'",
        (RUNS_TABLE,),
    )
    row = cur.fetchone()
    if row is None or row[0] == "ascii_bin":
        return
    for table in (RUNS_TRACKING_TABLE, RUN_STREAMS_TABLE, RUNS_TABLE):
        cur.execute(f"DROP TABLE IF EXISTS {table}")


def _sqlalchemy_url(info: ConnectionInfo) -> str:
    from sqlalchemy.engine import URL

    return URL.create(
        "mysql+pymysql",
        username=info.user,
        password=info.password or None,
        host=info.host,
        port=info.port,
        database=info.database,
        query={"charset": "utf8mb4"},
    ).render_as_string(hide_password=False)


def _lock_name(text_: str) -> str:
    # Named locks are server-wide (not per database) and at most 64 characters.
    return "little_es:" + hashlib.sha256(text_.encode()).hexdigest()[:48]


@contextmanager
def _named_lock(conn: pymysql.connections.Connection[Any], what: str) -> Iterator[None]:
    # Processes opening a fresh world at once would race on SQLAlchemy's
    # check-then-CREATE TABLE: create the tables one process at a time.
    name = _lock_name(what)
    with conn.cursor() as cur:
        cur.execute("SELECT GET_LOCK(%s, 60)", (name,))
        row = cur.fetchone()
        if row is None or row[0] != 1:
            raise WorldConfigError(f"timed out waiting for another process to create {what}")
        try:
            yield
        finally:
            cur.execute("SELECT RELEASE_LOCK(%s)", (name,))


# --------------------------------------------------------------- eventsourcing


class _LongStoredEventRecord(StoredEventRecord):  # type: ignore[misc]
    """eventsourcing-sqlalchemy's event row with a LONGBLOB ``state`` on MySQL."""

    __abstract__ = True
    __table_args__ = StoredEventRecord.__table_args__
    state = Column(LargeBinary().with_variant(LONGBLOB(), "mysql", "mariadb"), nullable=False)


class _LongSnapshotRecord(SnapshotRecord):  # type: ignore[misc]
    """eventsourcing-sqlalchemy's snapshot row with a LONGBLOB ``state`` on MySQL."""

    __abstract__ = True
    state = Column(LargeBinary().with_variant(LONGBLOB(), "mysql", "mariadb"), nullable=False)


class LittleSQLAlchemyDatastore(SQLAlchemyDatastore):
    """eventsourcing-sqlalchemy's datastore: LONGBLOB rows, connections recycled hourly."""

    base_stored_event_record_cls = _LongStoredEventRecord
    base_snapshot_record_cls = _LongSnapshotRecord

    def __init__(self, **kwargs: Any) -> None:
        # Pooled connections are replaced well before the server's wait_timeout (8 hours by
        # default) closes them. No ping before each use (a round trip per transaction, a
        # fifth of a write-ahead commit): as with PostgreSQL, after a restart of the server
        # the first use of each stale connection fails, and SQLAlchemy then empties the pool.
        kwargs.setdefault("pool_recycle", 3600)
        super().__init__(**kwargs)


_INSERT_BATCH_BYTES = 4 << 20
"""The most state bytes one multi-row INSERT carries (one packet: see :data:`ARTIFACT_CHUNK`)."""


class _InIdOrder(SQLAlchemyApplicationRecorder):
    """Inserts that commit in notification-id order and keep stream heads.

    Shared by the application and the process recorder of the factory (both
    write the events table). Every insert first locks the row of
    :data:`APPEND_LOCK_TABLE` (see the module), and moves the heads of its
    streams (``HEADS_TABLE``) and an import's ``snapshots`` in the same
    transaction. ``durable`` is accepted and changes nothing: InnoDB flushes
    every commit as the server is set to.

    On MariaDB 10.5 and later the rows go in as one ``INSERT ... RETURNING id``
    per 4 MiB instead of eventsourcing-sqlalchemy's ORM flush (measured: half a
    step's commit time there was the ORM's unit of work); MySQL has no
    ``RETURNING``, and keeps the extension's own insert.
    """

    def create_table(self) -> None:
        """eventsourcing-sqlalchemy's tables, the heads table and the append lock's row."""
        super().create_table()
        engine = self.datastore.engine
        assert isinstance(engine, Engine)
        with engine.begin() as conn:
            conn.exec_driver_sql(
                f"CREATE TABLE IF NOT EXISTS {HEADS_TABLE} (stream_id BINARY(16) PRIMARY KEY,"
                " version BIGINT NOT NULL, digest VARBINARY(64) NOT NULL,"
                " running VARBINARY(64) NOT NULL) ENGINE=InnoDB"
            )
            conn.exec_driver_sql(
                f"CREATE TABLE IF NOT EXISTS {APPEND_LOCK_TABLE} (id INT PRIMARY KEY) ENGINE=InnoDB"
            )
            conn.exec_driver_sql(f"INSERT IGNORE INTO {APPEND_LOCK_TABLE} VALUES (1)")

    def _lock_table(self, session: Session) -> None:
        session.execute(text(f"SELECT id FROM {APPEND_LOCK_TABLE} WHERE id = 1 FOR UPDATE"))

    def _insert_stored_events(
        self,
        session: Session,
        stored_events: Sequence[StoredEvent],
        *,
        heads: Mapping[UUID, Head] | None = None,
        durable: bool = True,
        watch: StreamWatch | None = None,
        snapshots: SnapshotRows | None = None,
        **kwargs: Any,
    ) -> Sequence[int]:
        # A watch stays unanswered: reading it here would cost the round trip the check's
        # own query costs, so the check makes that query (see StreamWatch).
        del watch
        ids: Sequence[int]
        if self._returns_ids(session):
            ids = self._insert_returning(session, stored_events)
        else:
            ids = super()._insert_stored_events(session, stored_events, **kwargs)
        if heads:
            session.execute(
                text(
                    f"INSERT INTO {HEADS_TABLE} (stream_id, version, digest, running)"
                    " VALUES (:s, :v, :d, :r) ON DUPLICATE KEY UPDATE version = VALUES(version),"
                    " digest = VALUES(digest), running = VALUES(running)"
                ),
                [
                    {"s": sid.bytes, "v": h.version, "d": h.digest, "r": h.running}
                    for sid, h in heads.items()
                ],
            )
        if snapshots is not None:
            store = snapshots.recorder
            assert isinstance(store, SQLAlchemyAggregateRecorder)
            store._insert_stored_events(session, snapshots.rows)
        return ids

    def _returns_ids(self, session: Session) -> bool:
        """Whether the server has ``INSERT ... RETURNING`` (MariaDB 10.5 and later)."""
        dialect = session.get_bind().dialect
        version = dialect.server_version_info or ()
        return bool(getattr(dialect, "is_mariadb", False)) and tuple(version[:2]) >= (10, 5)

    def _insert_returning(
        self, session: Session, stored_events: Sequence[StoredEvent]
    ) -> list[int]:
        if not stored_events:
            return []
        self._lock_table(session)
        conn = session.connection()
        ids: list[int] = []
        batch: list[StoredEvent] = []
        size = 0
        for i, event in enumerate(stored_events):
            batch.append(event)
            size += len(event.state)
            if size >= _INSERT_BATCH_BYTES or i == len(stored_events) - 1:
                rows = conn.exec_driver_sql(
                    f"INSERT INTO {self.events_table_name} (originator_id, originator_version,"
                    f" topic, state) VALUES {','.join(['(%s, %s, %s, %s)'] * len(batch))}"
                    " RETURNING id",
                    tuple(
                        value
                        for e in batch
                        for value in (
                            _uuid_bytes(e.originator_id),
                            e.originator_version,
                            e.topic,
                            e.state,
                        )
                    ),
                ).fetchall()
                # MariaDB returns the rows of one INSERT in the order of its VALUES.
                ids.extend(int(row[0]) for row in rows)
                batch, size = [], 0
        return ids


def _uuid_bytes(originator_id: UUID | str) -> bytes:
    return (originator_id if isinstance(originator_id, UUID) else UUID(str(originator_id))).bytes


class LittleSQLAlchemyApplicationRecorder(_InIdOrder):
    """eventsourcing-sqlalchemy's application recorder, inserting in id order (see the base)."""


class LittleSQLAlchemyProcessRecorder(_InIdOrder, SQLAlchemyProcessRecorder):
    """eventsourcing-sqlalchemy's process recorder, inserting in id order (see the base)."""


class LittleSQLAlchemyFactory(SQLAlchemyFactory):
    """eventsourcing-sqlalchemy's factory with the datastore and recorder above."""

    datastore_class = LittleSQLAlchemyDatastore
    application_recorder_class = LittleSQLAlchemyApplicationRecorder
    process_recorder_class = LittleSQLAlchemyProcessRecorder

    def close(self) -> None:
        """Close the engine's pooled connections (eventsourcing-sqlalchemy leaves them open)."""
        super().close()
        if isinstance(self.datastore.engine, Engine):
            self.datastore.engine.dispose()


# -------------------------------------------------------------------- artifacts


class MySQLArtifactStore(ArtifactStore):
    """Blobs in a table of the world's own database, in rows of :data:`ARTIFACT_CHUNK` bytes."""

    driver_errors = (SQLAlchemyError, pymysql.err.Error)

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        with engine.begin() as conn:
            conn.exec_driver_sql(
                f"CREATE TABLE IF NOT EXISTS {ARTIFACTS_TABLE} (sha256 CHAR(64) NOT NULL,"
                " chunk INT NOT NULL, data LONGBLOB NOT NULL, PRIMARY KEY (sha256, chunk))"
                " ENGINE=InnoDB"
            )

    def _write_blob(self, sha256: str, data: bytes) -> None:
        chunks = [data[i : i + ARTIFACT_CHUNK] for i in range(0, len(data), ARTIFACT_CHUNK)]
        # All rows in one transaction: a blob is either whole or absent.
        with self._engine.begin() as conn:
            present = conn.exec_driver_sql(
                f"SELECT 1 FROM {ARTIFACTS_TABLE} WHERE sha256 = %s AND chunk = 0", (sha256,)
            ).fetchone()
            if present is not None:
                return
            for i, chunk in enumerate(chunks or [b""]):
                conn.exec_driver_sql(
                    f"INSERT IGNORE INTO {ARTIFACTS_TABLE} (sha256, chunk, data)"
                    " VALUES (%s, %s, %s)",
                    (sha256, i, chunk),
                )

    def _read_blob(self, sha256: str) -> bytes | None:
        with self._engine.connect() as conn:
            rows = conn.exec_driver_sql(
                f"SELECT data FROM {ARTIFACTS_TABLE} WHERE sha256 = %s ORDER BY chunk", (sha256,)
            ).fetchall()
        return None if not rows else b"".join(bytes(r[0]) for r in rows)


# ----------------------------------------------------------------------- leases


class _HeldLock:
    """One held named lock: its connection, and when it was last confirmed by a query."""

    def __init__(self, conn: pymysql.connections.Connection[Any], name: str) -> None:
        self.conn = conn
        self.name = name
        self.poller = select.poll()
        sock = conn._sock  # type: ignore[attr-defined]  # PyMySQL has no public accessor
        assert sock is not None
        self.poller.register(sock.fileno(), select.POLLIN | select.POLLERR | select.POLLHUP)
        self.verified_at = time.monotonic()
        self.mutex = threading.Lock()
        self.closed = False


class MySQLRunLeases(RunLeases):
    """MariaDB named locks (``GET_LOCK``), one connection per held lease.

    The server releases a named lock when its connection closes, which it does
    when the holding process dies. Checking a lease costs a ``poll`` of the lock
    connection's socket every time, and a query confirming the lock
    (``IS_USED_LOCK``) at most every :attr:`verify_interval_s`, or at once when
    the socket has something to read (the server killed the connection:
    ``little unlock --force`` does that with ``KILL CONNECTION``).
    """

    verify_interval_s = 0.5
    """The longest time between two confirming queries of a held lock."""

    driver_errors = (pymysql.err.Error,)

    def __init__(self, info: ConnectionInfo) -> None:
        self._info = info

    def _name(self, key: UUID) -> str:
        # Named locks are server-wide: the database's name keeps worlds apart.
        return _lock_name(f"{self._info.database}:{key.hex}")

    def _acquire(self, key: UUID) -> _HeldLock | None:
        conn = self._info.connect()
        name = self._name(key)
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT GET_LOCK(%s, 0)", (name,))
                row = cur.fetchone()
                if row is None or row[0] != 1:
                    conn.close()
                    return None
                holder = f"little_es lease pid {os.getpid()} on {socket.gethostname()}"
                cur.execute(
                    f"INSERT INTO {LEASE_HOLDERS_TABLE} (lock_name, connection_id, holder)"
                    " VALUES (%s, CONNECTION_ID(), %s) ON DUPLICATE KEY UPDATE"
                    " connection_id = VALUES(connection_id), holder = VALUES(holder)",
                    (name, holder[:255]),
                )
        except BaseException:
            conn.close()
            raise
        return _HeldLock(conn, name)

    def _release(self, token: _HeldLock) -> None:
        with token.mutex:
            token.closed = True
            # Already gone, maybe: the server released the lock with it.
            with contextlib.suppress(pymysql.err.Error):
                token.conn.close()

    def _lost(self, token: _HeldLock) -> str | None:
        with token.mutex:
            if token.closed or not token.conn.open:
                return "its MariaDB connection is closed"
            now = time.monotonic()
            if not token.poller.poll(0) and now - token.verified_at < self.verify_interval_s:
                return None
            try:
                with token.conn.cursor() as cur:
                    cur.execute("SELECT IS_USED_LOCK(%s) = CONNECTION_ID()", (token.name,))
                    row = cur.fetchone()
            except pymysql.err.Error as exc:
                return f"its MariaDB connection failed: {exc}"
            if row is None or row[0] != 1:
                return "its MariaDB named lock is no longer held"
            token.verified_at = now
            return None

    def _holder_of(
        self, conn: pymysql.connections.Connection[Any], key: UUID
    ) -> tuple[int, str] | None:
        name = self._name(key)
        with conn.cursor() as cur:
            cur.execute("SELECT IS_USED_LOCK(%s)", (name,))
            row = cur.fetchone()
            if row is None or row[0] is None:
                return None
            connection_id = int(row[0])
            cur.execute(
                f"SELECT holder FROM {LEASE_HOLDERS_TABLE} WHERE lock_name = %s"
                " AND connection_id = %s",
                (name, connection_id),
            )
            found = cur.fetchone()
        who = found[0] if found is not None else "a client that has not written its pid yet"
        return connection_id, f"{who} (MariaDB connection {connection_id})"

    def _holder(self, key: UUID) -> str | None:
        conn = self._info.connect()
        try:
            held = self._holder_of(conn, key)
        finally:
            conn.close()
        return None if held is None else held[1]

    def _break(self, key: UUID) -> str | None:
        conn = self._info.connect()
        try:
            held = self._holder_of(conn, key)
            if held is None:
                return None
            connection_id, holder = held
            try:
                with conn.cursor() as cur:
                    cur.execute(f"KILL CONNECTION {connection_id:d}")
            except pymysql.err.OperationalError as exc:
                if exc.args and exc.args[0] == 1094:  # ER_NO_SUCH_THREAD: it just ended
                    return holder
                raise WorldConfigError(
                    f"cannot take the lease from {holder}: {exc}; connect as the holder's user"
                    " or one with the CONNECTION ADMIN (or SUPER) privilege"
                ) from exc
            # The lock is released once the connection is gone, a moment after the kill.
            deadline = time.monotonic() + 10
            while self._holder_of(conn, key) is not None and time.monotonic() < deadline:
                time.sleep(0.02)
            return holder
        finally:
            conn.close()


# -------------------------------------------------------------- runs read model


class MySQLRunsView(RunsView):
    """The runs read model in the world's database, next to its events."""

    def __init__(self, engine: Engine) -> None:
        super().__init__()
        self._engine = engine

    def create_table(self) -> None:
        """The model's three tables."""
        with self._engine.begin() as conn:
            conn.exec_driver_sql(
                f"CREATE TABLE IF NOT EXISTS {RUNS_TRACKING_TABLE} (application_name"
                " VARCHAR(255) PRIMARY KEY, notification_id BIGINT NOT NULL) ENGINE=InnoDB"
            )
            conn.exec_driver_sql(
                f"CREATE TABLE IF NOT EXISTS {RUNS_TABLE} (run_id {RUN_ID_COLUMN} PRIMARY KEY,"
                " summary LONGBLOB NOT NULL, state LONGBLOB NOT NULL) ENGINE=InnoDB"
            )
            conn.exec_driver_sql(
                f"CREATE TABLE IF NOT EXISTS {RUN_STREAMS_TABLE} (stream_id BINARY(16)"
                f" PRIMARY KEY, run_id {RUN_ID_COLUMN} NOT NULL) ENGINE=InnoDB"
            )

    def _insert_tracking(self, conn: Any, tracking: Tracking) -> None:
        # Locking read: a concurrent commit of the same position waits here, then fails.
        row = conn.exec_driver_sql(
            f"SELECT notification_id FROM {RUNS_TRACKING_TABLE} WHERE application_name = %s"
            " FOR UPDATE",
            (tracking.application_name,),
        ).fetchone()
        if row is not None and row[0] >= tracking.notification_id:
            raise IntegrityError(
                f"runs read model already tracks {tracking.application_name} at or after"
                f" notification {tracking.notification_id}"
            )
        try:
            conn.exec_driver_sql(
                f"INSERT INTO {RUNS_TRACKING_TABLE} (application_name, notification_id)"
                " VALUES (%s, %s) ON DUPLICATE KEY UPDATE notification_id ="
                " VALUES(notification_id)",
                (tracking.application_name, tracking.notification_id),
            )
        except Exception as exc:  # a first insert that raced another one
            raise IntegrityError(str(exc)) from exc

    def insert_tracking(self, tracking: Tracking) -> None:
        """Record ``tracking`` alone (eventsourcing's TrackingRecorder)."""
        with self._engine.begin() as conn:
            self._insert_tracking(conn, tracking)

    def max_tracking_id(self, application_name: str) -> int | None:
        """The last position recorded for ``application_name``."""
        with self._engine.connect() as conn:
            row = conn.exec_driver_sql(
                f"SELECT notification_id FROM {RUNS_TRACKING_TABLE} WHERE application_name = %s",
                (application_name,),
            ).fetchone()
        return None if row is None else int(row[0])

    def runs_of_streams(self, stream_ids: Iterable[UUID]) -> dict[UUID, str]:
        """See :meth:`RunsView.runs_of_streams`."""
        by_bytes = {s.bytes: s for s in stream_ids}
        if not by_bytes:
            return {}
        keys = list(by_bytes)
        found: dict[UUID, str] = {}
        with self._engine.connect() as conn:
            for i in range(0, len(keys), 500):
                chunk = keys[i : i + 500]
                rows = conn.exec_driver_sql(
                    f"SELECT stream_id, run_id FROM {RUN_STREAMS_TABLE}"
                    f" WHERE stream_id IN ({','.join(['%s'] * len(chunk))})",
                    tuple(chunk),
                ).fetchall()
                for stream_id, run_id in rows:
                    found[by_bytes[bytes(stream_id)]] = run_id
        return found

    def load_state(self, run_id: str) -> MaterializedRunState | None:
        """See :meth:`RunsView.load_state`."""
        with self._engine.connect() as conn:
            row = conn.exec_driver_sql(
                f"SELECT state FROM {RUNS_TABLE} WHERE run_id = %s", (run_id,)
            ).fetchone()
        return None if row is None else load_state(bytes(row[0]))

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
        with self._engine.begin() as conn:
            self._insert_tracking(conn, tracking)
            if rows:
                conn.exec_driver_sql(
                    f"INSERT INTO {RUNS_TABLE} (run_id, summary, state) VALUES (%s, %s, %s)"
                    " ON DUPLICATE KEY UPDATE summary = VALUES(summary), state = VALUES(state)",
                    rows,
                )
            if streams:
                conn.exec_driver_sql(
                    f"INSERT INTO {RUN_STREAMS_TABLE} (stream_id, run_id) VALUES (%s, %s)"
                    " ON DUPLICATE KEY UPDATE run_id = VALUES(run_id)",
                    [(s.bytes, r) for s, r in streams.items()],
                )

    def summaries(self) -> tuple[RunSummary, ...]:
        """See :meth:`RunsView.summaries`."""
        with self._engine.connect() as conn:
            rows = conn.exec_driver_sql(f"SELECT summary FROM {RUNS_TABLE}").fetchall()
        return oldest_first(RunSummary.model_validate_json(bytes(row[0])) for row in rows)

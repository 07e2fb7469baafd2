"""The SQLite backend: one SQLite file, artifact files and lock files under a data directory.

Events go to ``{data_dir}/events.sqlite3`` through eventsourcing's SQLite
persistence, blobs to ``{data_dir}/artifacts/``, run leases are ``flock``s on
files in ``{data_dir}/leases/``, and the runs read model is three tables of
the events' own file. ``{data_dir}/world.json`` holds the world's id, so an
events file emptied, deleted or swapped under a data directory with history
is refused (:class:`~little_es.errors.WorldIntegrityError`); so is a corrupt one.

The fsync policy: ``synchronous="full"`` (the default) fsyncs the write-ahead
log at every commit that holds a result: a committed result survives a killed
process *and* a power cut or OS crash. ``synchronous="normal"`` leaves the
fsync to checkpoints: a committed event still survives a killed process (it is
in the WAL file), but a power cut or OS crash can lose the last commits, so the
call they recorded runs once more on resume. It makes each commit several
times cheaper (see the README's performance table). Choose it only where losing
the last moments of work to a power cut is acceptable.

Either way, a commit of nothing but write-ahead records (``StepStarted``,
``harness.model.called``, ...; see :attr:`little_es.events.Event.write_ahead`)
is not fsynced: the WAL is one file, written in order, so the fsync of the next
commit makes them durable with it, and until then losing them costs nothing a
crash does not. With ``synchronous="full"`` the WAL's blocks are written ahead of
the commits that fsync it (:class:`_WalPreallocation`).
"""

from __future__ import annotations

import fcntl
import functools
import os
import re
import socket
import sqlite3
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal, NamedTuple, cast
from uuid import UUID

import orjson
from eventsourcing.persistence import (
    ApplicationRecorder,
    IntegrityError,
    InterfaceError,
    Notification,
    OperationalError,
    StoredEvent,
    Tracking,
)
from eventsourcing.sqlite import (
    SQLITE3_DEFAULT_LOCK_TIMEOUT,
    SQLiteAggregateRecorder,
    SQLiteApplicationRecorder,
    SQLiteConnection,
    SQLiteConnectionPool,
    SQLiteCursor,
    SQLiteDatastore,
    SQLiteFactory,
    SQLiteTrackingRecorder,
    SQLiteTransaction,
)
from eventsourcing.utils import Environment, EnvType, get_topic

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
from little_es.errors import WorldIntegrityError
from little_es.faults import during_view_write
from little_es.ids import validate_run_id
from little_es.materialize import MaterializedRunState

Synchronous = Literal["full", "normal"]
SYNCHRONOUS_ENV = "LITTLE_ES_SQLITE_SYNCHRONOUS"


class SQLiteBackend(Backend):
    """A world in the existing directory ``data_dir`` with the fsync policy ``synchronous``."""

    def __init__(
        self, app_class: ApplicationClass, data_dir: Path, *, synchronous: Synchronous = "full"
    ) -> None:
        # Resolved once: every file of the world (events, WAL, leases, artifacts, marker)
        # is then where it was when the world opened, whatever directory the process
        # changes to after (a relative path would name another world's files).
        data_dir = data_dir.resolve()
        name = f"sqlite:///{data_dir}"
        if (data_dir / MARKER_FILE).exists() and not (data_dir / "events.sqlite3").exists():
            # Refused before SQLite would create an empty file in its place.
            raise WorldIntegrityError(
                f"world {name}: {data_dir / 'events.sqlite3'} is missing from a data directory"
                f" whose {MARKER_FILE} says it holds a world; restore it from a backup"
                " (nothing was read or written; to start a new world, use a new data directory)"
            )
        with _refusing_corruption(name):
            app = app_class(
                env={
                    "PERSISTENCE_MODULE": get_topic(LittleSQLiteFactory),
                    "SQLITE_DBNAME": str(data_dir / "events.sqlite3"),
                    "SQLITE_LOCK_TIMEOUT": "30",
                    SYNCHRONOUS_ENV: synchronous,
                }
            )
        self._data_dir = data_dir
        super().__init__(
            app=app,
            artifacts=FileArtifactStore(data_dir / "artifacts"),
            leases=FileRunLeases(data_dir / "leases"),
            name=name,
        )
        recorder = app.recorder
        assert isinstance(recorder, LittleSQLiteApplicationRecorder)
        self._datastore = recorder.datastore
        self._every, self._later = recorder.select_rows_statements
        self._next = self._later + " LIMIT 1"

    def select_rows(self, stream_id: UUID, after: int | None) -> Sequence[Row]:
        """One stream's rows, read from the recorder's table (see :meth:`Backend.select_rows`)."""
        # The recorder's transaction: its pool, locking and error translation.
        with _refusing_corruption(self.name), self._datastore.transaction(commit=False) as cursor:
            raw = cursor.sqlite_cursor
            raw.row_factory = None  # plain tuples, not sqlite3.Row
            if after is None:
                raw.execute(self._every, (stream_id.hex,))
            else:
                raw.execute(self._later, (stream_id.hex, after))
            rows: list[Row] = raw.fetchall()
            return rows

    def has_events_after(self, stream_id: UUID, version: int) -> bool:
        """See :meth:`Backend.has_events_after`: one statement on a reader connection."""
        # The pool's reader as datastore.transaction takes it, but no BEGIN/ROLLBACK: in
        # autocommit one SELECT is its own read transaction and sees every commit so far.
        pool = self._datastore.pool
        conn = pool.get_connection(is_writer=False)
        try:
            row = conn._sqlite_conn.execute(self._next, (stream_id.hex, version)).fetchone()
        except Exception as exc:
            _refuse_corruption(self.name, exc)
            raise
        finally:
            pool.put_connection(conn)
        return row is not None

    def stream_head(self, stream_id: UUID) -> Head | None:
        """See :meth:`Backend.stream_head`: from the heads table."""
        with _refusing_corruption(self.name), self._datastore.transaction(commit=False) as cursor:
            raw = cursor.sqlite_cursor
            raw.row_factory = None
            raw.execute(_SELECT_HEAD, (stream_id.hex,))
            row = raw.fetchone()
            return None if row is None else Head(row[0], bytes(row[1]), bytes(row[2]))

    def stream_heads(self) -> dict[UUID, Head]:
        """See :meth:`Backend.stream_heads`: the whole heads table."""
        with _refusing_corruption(self.name), self._datastore.transaction(commit=False) as cursor:
            raw = cursor.sqlite_cursor
            raw.row_factory = None
            raw.execute(f"SELECT stream_id, version, digest, running FROM {HEADS_TABLE}")
            return {UUID(s): Head(v, bytes(d), bytes(r)) for s, v, d, r in raw.fetchall()}

    def marker(self) -> str | None:
        """The world id in ``{data_dir}/world.json``, or None when there is none."""
        path = self._data_dir / MARKER_FILE
        try:
            data = orjson.loads(path.read_bytes())
        except FileNotFoundError:
            return None
        except (OSError, orjson.JSONDecodeError) as exc:
            raise WorldIntegrityError(
                f"world {self.name}: {path} cannot be read ({exc}); it records which database"
                " belongs to this data directory: restore it from a backup"
            ) from exc
        world_id = data.get("world_id") if isinstance(data, dict) else None
        if not isinstance(world_id, str):
            raise WorldIntegrityError(
                f"world {self.name}: {path} names no world_id; restore it from a backup"
            )
        return world_id

    def write_marker(self, world_id: str) -> None:
        """Write ``{data_dir}/world.json`` atomically and durably."""
        _write_durably(
            self._data_dir / MARKER_FILE,
            orjson.dumps({"world_id": world_id, "database": "events.sqlite3"}),
        )

    keeps_outer_loop_views = True

    def _view_path(self, outer_loop_id: str) -> Path:
        # A validated run id: letters, digits and ``_ - .``, never ``..`` alone, so no escape.
        return self._data_dir / "outer-loops" / f"{validate_run_id(outer_loop_id)}.json"

    def write_outer_loop_view(self, outer_loop_id: str, data: bytes) -> None:
        """Write ``{data_dir}/outer-loops/{outer_loop_id}.json``: temp file, fsync, rename."""
        path = self._view_path(outer_loop_id)
        path.parent.mkdir(exist_ok=True)
        _write_durably(path, data, before_rename=during_view_write)

    def read_outer_loop_view(self, outer_loop_id: str) -> bytes | None:
        """The bytes of the view file, or None when there is none."""
        try:
            return self._view_path(outer_loop_id).read_bytes()
        except FileNotFoundError:
            return None

    def holds_artifacts(self) -> bool:
        """Whether ``{data_dir}/artifacts/`` holds any blob."""
        root = self._data_dir / "artifacts"
        return any(p.is_file() for sub in root.iterdir() if sub.is_dir() for p in sub.iterdir())

    def runs_view(self) -> SQLiteRunsView:
        """The read model in the events' own file."""
        view = SQLiteRunsView(self._datastore)
        view.create_table()
        return view


# --------------------------------------------------------------- eventsourcing


_STATEMENT_CACHE = 128
"""sqlite3's default: more than the distinct statements a world runs."""


_WAL_HEADER = 32
_WAL_FRAME_HEADER = 24
_WAL_AUTOCHECKPOINT = 1000
"""SQLite's default ``wal_autocheckpoint`` (pages), which little_es keeps: the WAL is
checkpointed, and then written again from its start, once it holds this many frames."""
_WAL_FIRST_GROWTH = 128 * 1024


class _WalPreallocation:
    """Keeps the WAL file's blocks written ahead of SQLite's frames, as PostgreSQL fills a
    new WAL segment with zeros before it uses it (``wal_init_zero``).

    An fsynced commit whose frames extend the WAL file costs more than one whose frames
    overwrite blocks the file already has: the fdatasync must then also journal the
    file's new size and blocks (measured on ext4 here: a bare sqlite3 commit 205-264 us
    against 127, ``benchmarks/bench_wal.py``; a world's commit of an agent call 323-372
    against 197, ``bench_peer --split``). SQLite reuses its WAL from the start after
    each checkpoint, so a world in steady use overwrites; but SQLite deletes the WAL
    when the last connection closes, and without this a new process's first 1,000
    pages of commits (some 300 steps or agent calls) would all extend it.

    :meth:`grow` is called inside a commit that fsyncs, after its first write statement,
    so this connection holds SQLite's WAL write lock: no process has written a frame past
    the file's end, nor will until the lock is released. When the file's size is not the
    one it last left (SQLite's frames went past the zeros, or the file is new), it writes
    zeros from the end, each time doubling the file, up to the size at which SQLite
    checkpoints and starts again. Zeros are never a frame to SQLite: it reads a WAL's
    frames up to the first whose salt and checksum do not match its header. And with
    SQLite's default ``journal_size_limit`` (-1, which little_es keeps), SQLite never
    truncates the file while it is in use. Neither ``ftruncate`` nor ``fallocate``
    would do: they leave a hole or an unwritten extent, whose first write journals as an
    append does (``bench_wal``: as slow as appending).
    """

    def __init__(self) -> None:
        self._wal: str | None = None  # the WAL's path, from SQLite at the first call
        self._limit = 0
        self._left = -1  # the size this last left the file at

    def grow(self, c: SQLiteCursor | sqlite3.Cursor) -> None:
        """Write zeros past the WAL's end if SQLite's frames have reached it (see above)."""
        if self._wal is None:
            self._wal, self._limit = _wal_file(c)
        if not self._wal:
            return  # a database with no file
        try:
            fd = os.open(self._wal, os.O_WRONLY)
        except OSError:
            return  # no WAL (yet), or no file descriptor to spare: the commit goes on
        try:
            # The size by lseek, not stat: on recent Linux (multigrain timestamps; seen
            # on 6.18) a stat between writes makes each following write set a
            # fine-grained mtime, an inode update that cost each fsynced commit about
            # 80 us here (bench_wal).
            size = os.lseek(fd, 0, os.SEEK_END)
            if size == self._left or size >= self._limit:
                return
            end = min(self._limit, max(2 * size, _WAL_FIRST_GROWTH))
            try:
                # Not fsynced here: this commit's own fsync, which follows, takes them.
                # Short on a disk or a file-size limit that takes only part of them.
                end = size + os.pwrite(fd, bytes(end - size), size)
            except OSError:
                # A full disk, say: the commit goes on as it would have without this,
                # and SQLite's own write reports what it finds.
                end = size
            self._left = end
        finally:
            os.close(fd)


def _wal_file(c: SQLiteCursor | sqlite3.Cursor) -> tuple[str, int]:
    """The path of the WAL of ``c``'s database and the size SQLite checkpoints it at.

    The path is SQLite's own name of the file it opened (absolute, a symlink
    resolved, as SQLite names its WAL after it), not one made from a relative path
    against a working directory that may have changed; "" for a database with no file.
    """
    c.execute("PRAGMA database_list")
    main = next((str(row[2]) for row in c.fetchall() if row[1] == "main"), "")
    c.execute("PRAGMA page_size")
    page = int(c.fetchone()[0])
    wal = f"{main}-wal" if main else ""
    return wal, _WAL_HEADER + _WAL_AUTOCHECKPOINT * (_WAL_FRAME_HEADER + page)


class _SQLiteConnectionPool(SQLiteConnectionPool):
    def __init__(self, *, synchronous: Synchronous, **kwargs: Any) -> None:
        self.synchronous = synchronous.upper()
        super().__init__(**kwargs)
        self.wal = (
            _WalPreallocation()
            if self.synchronous == "FULL" and not self.is_sqlite_memory_mode
            else None
        )
        """Grows the WAL ahead of the commits that fsync it (``synchronous=FULL``)."""

    def _create_connection(self) -> SQLiteConnection:
        # eventsourcing's connection, but with sqlite3's statement cache: eventsourcing
        # passes cached_statements=True, a cache of one statement, so each statement of a
        # commit and of the check before each step was compiled anew every time (measured:
        # 45 us for the check's join, bench_peer --only agent).
        try:
            c = sqlite3.connect(
                database=self.db_name,
                uri=True,
                check_same_thread=False,
                isolation_level=None,  # autocommit: the recorders BEGIN explicitly
                cached_statements=_STATEMENT_CACHE,
                timeout=self.lock_timeout or SQLITE3_DEFAULT_LOCK_TIMEOUT,
            )
        except (sqlite3.Error, TypeError) as e:
            raise InterfaceError(e) from e
        try:
            if not self.is_sqlite_memory_mode and not self.is_journal_mode_wal:
                self._use_wal(c)
            # Per connection: SQLite does not store this pragma in the file.
            c.execute(f"PRAGMA synchronous={self.synchronous}")
        except sqlite3.Error as e:
            c.close()
            if _is_corruption(e):
                raise  # refused by name where it surfaces (_refusing_corruption)
            # A full disk: eventsourcing's error, as for the statements that follow,
            # which the world turns into a WorldStorageError.
            raise OperationalError(e) from e
        c.row_factory = sqlite3.Row  # eventsourcing's recorders read rows by column name
        return SQLiteConnection(sqlite_conn=c, max_age=self.max_age)

    def _use_wal(self, c: sqlite3.Connection) -> None:
        """Switch the file to WAL unless it is already: once, by whichever process comes first.

        SQLite refuses a switch that meets another connection's at once
        (``SQLITE_BUSY``) instead of waiting as for a lock: processes opening a new
        world together try again, reading the mode afresh, until the lock timeout.
        """
        deadline = time.monotonic() + (self.lock_timeout or SQLITE3_DEFAULT_LOCK_TIMEOUT)
        while True:
            try:
                if c.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
                    c.execute("PRAGMA journal_mode=WAL")
                    self.journal_mode_was_changed_to_wal = True
                break
            except sqlite3.OperationalError as exc:
                if exc.sqlite_errorcode != sqlite3.SQLITE_BUSY or time.monotonic() > deadline:
                    raise
                time.sleep(0.01)
        self.is_journal_mode_wal = True


MARKER_FILE = "world.json"
_SELECT_HEAD = f"SELECT version, digest, running FROM {HEADS_TABLE} WHERE stream_id=?"
_GIVE_STREAM_KEY = (
    f"INSERT INTO {STREAMS_TABLE} (stream_id) VALUES (?) ON CONFLICT (stream_id) DO NOTHING"
)
_GIVE_TOPIC_KEY = f"INSERT INTO {TOPICS_TABLE} (topic) VALUES (?) ON CONFLICT (topic) DO NOTHING"
EVENTSOURCING_EVENTS_TABLE = "stored_events"
"""eventsourcing's events table, which files made before the compact layout hold."""
# One stream's (version, topic, state) rows in the compact layout, by its id in hex.
_SELECT_COMPACT_ROWS = (
    f"SELECT e.version, t.topic, e.state FROM {EVENTS_TABLE} e"
    f" JOIN {TOPICS_TABLE} t ON t.id = e.topic"
    f" WHERE e.stream = (SELECT id FROM {STREAMS_TABLE} WHERE stream_id = ?)"
)
_CREATE_HEADS = (
    f"CREATE TABLE IF NOT EXISTS {HEADS_TABLE} (stream_id TEXT PRIMARY KEY,"
    " version INTEGER NOT NULL, digest BLOB NOT NULL, running BLOB NOT NULL) WITHOUT ROWID"
)
_UPSERT_HEAD = (
    f"INSERT INTO {HEADS_TABLE} (stream_id, version, digest, running) VALUES (?, ?, ?, ?)"
    " ON CONFLICT (stream_id) DO UPDATE SET version=excluded.version,"
    " digest=excluded.digest, running=excluded.running"
)
# SQLite's primary result codes for a damaged file and for a file that is no database.
_CORRUPTION_CODES = frozenset({sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB})


def _is_corruption(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it was raised from) is SQLite reporting a damaged file."""
    while exc is not None:
        if isinstance(exc, sqlite3.DatabaseError) and (
            getattr(exc, "sqlite_errorcode", None) in _CORRUPTION_CODES
            or "malformed" in str(exc)
            or "not a database" in str(exc)
        ):
            return True
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    return False


@contextmanager
def _refusing_corruption(name: str) -> Iterator[None]:
    """Turn SQLite's "database disk image is malformed" into a WorldIntegrityError."""
    try:
        yield
    except Exception as exc:
        _refuse_corruption(name, exc)
        raise


def _refuse_corruption(name: str, exc: Exception) -> None:
    """Raise a WorldIntegrityError from ``exc`` when it is SQLite reporting a damaged file."""
    if _is_corruption(exc):
        raise WorldIntegrityError(
            f"world {name}: the events file is corrupt ({exc}); nothing was read or"
            " written: restore events.sqlite3 from a backup"
        ) from exc


def _write_durably(
    path: Path, data: bytes, *, before_rename: Callable[[], None] | None = None
) -> None:
    """Write ``path`` through a fsynced temporary file and a fsynced rename."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if before_rename is not None:
            before_rename()
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


class LittleSQLiteApplicationRecorder(SQLiteApplicationRecorder):
    """eventsourcing's SQLite recorder: keeps stream heads, fsyncs only durable commits.

    ``insert_events(..., durable=False)`` commits with ``synchronous=NORMAL``
    and then puts the connection back to the world's policy (SQLite refuses
    the pragma inside a transaction; set before it, it applies to its commit).
    Every insert also moves the heads of its streams (``HEADS_TABLE``), in the
    same transaction.
    """

    def construct_create_table_statements(self) -> list[str]:
        """eventsourcing's tables, and the heads table."""
        return [*super().construct_create_table_statements(), _CREATE_HEADS]

    @property
    def select_rows_statements(self) -> tuple[str, str]:
        """The (version, topic, state) rows of one stream id (hex): all of them, and those
        after a version (:meth:`SQLiteBackend.select_rows`)."""
        base = (
            f"SELECT originator_version, topic, state FROM {self.events_table_name}"
            " WHERE originator_id=? "
        )
        return (
            base + "ORDER BY originator_version",
            base + "AND originator_version>? ORDER BY originator_version",
        )

    def _insert_events(
        self,
        c: SQLiteCursor,
        stored_events: Sequence[StoredEvent],
        *,
        heads: Mapping[UUID, Head] | None = None,
        snapshots: SnapshotRows | None = None,
        **kwargs: Any,
    ) -> Sequence[int] | None:
        ids = self._insert_rows(c, stored_events, **kwargs)
        if heads:
            c.executemany(_UPSERT_HEAD, [(sid.hex, *head) for sid, head in heads.items()])
        if snapshots is not None:
            store = snapshots.recorder
            assert isinstance(store, SQLiteAggregateRecorder)
            store._insert_events(c, snapshots.rows)
        return ids

    def _insert_rows(
        self, c: SQLiteCursor, stored_events: Sequence[StoredEvent], **kwargs: Any
    ) -> Sequence[int] | None:
        """Insert the rows into the events table; their notification ids."""
        return super()._insert_events(c, stored_events, **kwargs)

    def insert_events(
        self, stored_events: Sequence[StoredEvent], *, durable: bool = True, **kwargs: Any
    ) -> Sequence[int] | None:
        """Insert in one transaction; fsynced per the world's policy only when ``durable``."""
        # _refusing_corruption spelled out: one generator-based context manager less a commit.
        try:
            return self._insert(stored_events, durable=durable, **kwargs)
        except Exception as exc:
            _refuse_corruption(self._name, exc)
            raise

    def select_notifications(self, *args: Any, **kwargs: Any) -> Any:
        """eventsourcing's, with a damaged file refused by name."""
        with _refusing_corruption(self._name):
            return super().select_notifications(*args, **kwargs)

    def max_notification_id(self) -> int:
        """eventsourcing's, with a damaged file refused by name."""
        with _refusing_corruption(self._name):
            return super().max_notification_id()

    @functools.cached_property
    def _name(self) -> str:
        # Cached: resolving the path costs filesystem calls (measured 0.1 ms an append).
        return f"sqlite:///{Path(self.datastore.pool.db_name).parent.resolve()}"

    def _insert(
        self,
        stored_events: Sequence[StoredEvent],
        *,
        durable: bool,
        watch: StreamWatch | None = None,
        **kwargs: Any,
    ) -> Sequence[int] | None:
        pool = self.datastore.pool
        assert isinstance(pool, _SQLiteConnectionPool)
        relax = not durable and pool.synchronous != "NORMAL"
        # The pool's writer connection as eventsourcing's datastore.transaction takes it
        # (its reader/writer interlock), without that call's two outer generator-based
        # context managers (about 5 us of a step's one commit). The connection's own
        # transaction still begins, commits or rolls back and maps sqlite3's errors (an
        # IntegrityError is a lost version check).
        conn = pool.get_connection(is_writer=True)
        try:
            if relax:
                conn._sqlite_conn.execute("PRAGMA synchronous=NORMAL")
            try:
                # As the connection's transaction() yields it (typed SQLiteCursor there too).
                with SQLiteTransaction(conn, commit=True) as wrapper, wrapper as cursor:
                    c = cast(SQLiteCursor, cursor)
                    ids = self._insert_events(c, stored_events, **kwargs)
                    if durable and stored_events and pool.wal is not None:
                        pool.wal.grow(c)  # under the write lock the INSERTs took
                    # Read under the write lock, which no other writer's commit passes, so
                    # what this finds is the stream as this commit leaves it.
                    changed = self._changed(c, watch) if watch is not None else ()
            finally:
                _settle(conn, pool.synchronous if relax else None)
            if watch is not None:
                watch.found(changed)
            return ids
        finally:
            pool.put_connection(conn)

    def _changed(self, c: SQLiteCursor, watch: StreamWatch) -> list[UUID]:
        """The watched streams with a row past the version given (see :class:`StreamWatch`)."""
        later = self.select_rows_statements[1] + " LIMIT 1"
        changed = []
        for sid, version in watch.versions.items():
            c.execute(later, (sid.hex, version))
            if c.fetchone() is not None:
                changed.append(sid)
        return changed


def _settle(conn: SQLiteConnection, synchronous: str | None) -> None:
    """Leave ``conn`` fit for the pool after an insert: out of its transaction, back at the
    world's ``synchronous`` level (None: never changed); or closed, so that the pool opens
    a fresh one.

    A failed COMMIT or ROLLBACK can leave the transaction open (SQLITE_BUSY, SQLITE_FULL),
    and SQLite refuses to change the level inside one: reused so, the connection would
    refuse its next BEGIN, or commit a result at NORMAL, without the fsync the world
    promises. The insert's own error, if any, is what the caller sees.
    """
    raw = conn._sqlite_conn
    try:
        if raw.in_transaction:
            raw.rollback()
        if synchronous is not None:
            raw.execute(f"PRAGMA synchronous={synchronous}")
        if not raw.in_transaction:
            return
    except sqlite3.Error:
        pass
    conn.close()


class CompactSQLiteApplicationRecorder(LittleSQLiteApplicationRecorder):
    """The table layout of a world's events file created by this version of little_es.

    eventsourcing's table repeats the stream id (32 characters of text) and the
    topic in every row and again in the primary-key index: about 140 of a task
    step's bytes on disk. Here a row holds small integers instead, each standing
    for one stream id (``little_es_streams``) or one topic (``little_es_topics``)
    given on that stream's or topic's first insert and never changed::

        little_es_events (stream INTEGER, version INTEGER, topic INTEGER, state BLOB,
                          PRIMARY KEY (stream, version))

    The rowid is the notification id, as in eventsourcing's table. Readers join
    the two small tables, so a row, a notification and a ``StoredEvent`` read back
    the same as from eventsourcing's recorder; the row's bytes (its chain frame
    and payload) are the same in either layout. A file made by an earlier version
    keeps eventsourcing's table (:class:`LittleSQLiteApplicationRecorder`;
    :class:`LittleSQLiteFactory` picks the class by what the file holds).
    """

    def __init__(self, datastore: SQLiteDatastore, events_table_name: str = EVENTS_TABLE) -> None:
        super().__init__(datastore, events_table_name)
        # The insert reads the keys by name, under its write lock: the process keeps
        # none, so none can be stale (a file restored from a backup while the process
        # has it open holds other keys for the same names, or none).
        self.insert_events_statement = (
            f"INSERT INTO {EVENTS_TABLE} (stream, version, topic, state)"
            f" SELECT s.id, ?, t.id, ? FROM {STREAMS_TABLE} s, {TOPICS_TABLE} t"
            " WHERE s.stream_id = ? AND t.topic = ? RETURNING rowid"
        )
        self.select_max_notification_id_statement = f"SELECT MAX(rowid) FROM {EVENTS_TABLE}"

    def construct_create_table_statements(self) -> list[str]:
        """The events, streams, topics and heads tables."""
        return [
            f"CREATE TABLE IF NOT EXISTS {STREAMS_TABLE} (id INTEGER PRIMARY KEY,"
            " stream_id TEXT NOT NULL UNIQUE)",
            f"CREATE TABLE IF NOT EXISTS {TOPICS_TABLE} (id INTEGER PRIMARY KEY,"
            " topic TEXT NOT NULL UNIQUE)",
            f"CREATE TABLE IF NOT EXISTS {EVENTS_TABLE} (stream INTEGER NOT NULL,"
            " version INTEGER NOT NULL, topic INTEGER NOT NULL, state BLOB NOT NULL,"
            " PRIMARY KEY (stream, version))",
            _CREATE_HEADS,
            # For a person at the sqlite3 prompt: the rows as eventsourcing's table shows them.
            f"CREATE VIEW IF NOT EXISTS {ROWS_VIEW} AS SELECT e.rowid AS notification_id,"
            " s.stream_id AS originator_id, e.version AS originator_version, t.topic, e.state"
            f" FROM {EVENTS_TABLE} e JOIN {STREAMS_TABLE} s ON s.id = e.stream"
            f" JOIN {TOPICS_TABLE} t ON t.id = e.topic",
        ]

    @property
    def select_rows_statements(self) -> tuple[str, str]:
        """See :attr:`LittleSQLiteApplicationRecorder.select_rows_statements`."""
        return (
            _SELECT_COMPACT_ROWS + " ORDER BY e.version",
            _SELECT_COMPACT_ROWS + " AND e.version > ? ORDER BY e.version",
        )

    def _insert_rows(
        self, c: SQLiteCursor, stored_events: Sequence[StoredEvent], **kwargs: Any
    ) -> Sequence[int] | None:
        """Insert the rows, each with the integers of its stream id and topic (given in
        this transaction to a stream or topic that has none yet)."""
        ids = []
        for s in stored_events:
            sid = s.originator_id
            row = (
                s.originator_version,
                s.state,
                sid.hex if isinstance(sid, UUID) else sid,
                s.topic,
            )
            c.execute(self.insert_events_statement, row)
            inserted = c.fetchone()
            if inserted is None:  # the stream or the topic has no key yet
                c.execute(_GIVE_STREAM_KEY, (row[2],))
                c.execute(_GIVE_TOPIC_KEY, (row[3],))
                c.execute(self.insert_events_statement, row)
                inserted = c.fetchone()
            ids.append(inserted[0])
        return ids

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
        statement = _SELECT_COMPACT_ROWS
        params: list[Any] = [
            originator_id.hex if isinstance(originator_id, UUID) else originator_id
        ]
        if gt is not None:
            statement += " AND e.version > ?"
            params.append(gt)
        if lte is not None:
            statement += " AND e.version <= ?"
            params.append(lte)
        statement += " ORDER BY e.version DESC" if desc else " ORDER BY e.version"
        if limit is not None:
            statement += " LIMIT ?"
            params.append(limit)
        stream = self.convert_originator_id(params[0])
        with _refusing_corruption(self._name), self.datastore.transaction(commit=False) as c:
            c.execute(statement, params)
            return [
                StoredEvent(
                    originator_id=stream,
                    originator_version=row[0],
                    topic=row[1],
                    state=row[2],
                )
                for row in c.fetchall()
            ]

    def select_notifications(
        self,
        start: int | None,
        limit: int,
        stop: int | None = None,
        topics: Sequence[str] = (),
        *,
        inclusive_of_start: bool = True,
    ) -> Sequence[Notification]:
        """eventsourcing's ``select_notifications`` on this layout."""
        statement = (
            f"SELECT e.rowid, s.stream_id, e.version, t.topic, e.state FROM {EVENTS_TABLE} e"
            f" JOIN {STREAMS_TABLE} s ON s.id = e.stream JOIN {TOPICS_TABLE} t ON t.id = e.topic"
            " WHERE 1"
        )
        params: list[Any] = []
        if start is not None:
            statement += " AND e.rowid >= ?" if inclusive_of_start else " AND e.rowid > ?"
            params.append(start)
        if stop is not None:
            statement += " AND e.rowid <= ?"
            params.append(stop)
        if topics:
            statement += f" AND t.topic IN ({','.join('?' * len(topics))})"
            params.extend(topics)
        statement += " ORDER BY e.rowid LIMIT ?"
        params.append(limit)
        with _refusing_corruption(self._name), self.datastore.transaction(commit=False) as c:
            c.execute(statement, params)
            return [
                Notification(
                    id=row[0],
                    originator_id=self.convert_originator_id(row[1]),
                    originator_version=row[2],
                    topic=row[3],
                    state=row[4],
                )
                for row in c.fetchall()
            ]


class LittleSQLiteFactory(SQLiteFactory):
    """eventsourcing's SQLite factory, opening connections with the world's ``synchronous``.

    A world's application recorder is :class:`CompactSQLiteApplicationRecorder`,
    except on a file whose events are in eventsourcing's table (made by an earlier
    version of little_es; :func:`~little_es.backends.base.keeps_eventsourcing_table`
    says which layout a file holds): that one keeps its layout
    (:class:`LittleSQLiteApplicationRecorder`), since nothing rewrites stored
    rows. Any other application on the file keeps eventsourcing's table.
    """

    application_recorder_class = CompactSQLiteApplicationRecorder

    def __init__(self, env: Environment | EnvType | None) -> None:
        super().__init__(env)
        synchronous = (self.env.get(SYNCHRONOUS_ENV) or "full").lower()
        if synchronous not in ("full", "normal"):
            raise ValueError(f"{SYNCHRONOUS_ENV} must be 'full' or 'normal', got {synchronous!r}")
        old = self.datastore.pool
        # No connection has been made yet: swap the pool for one that sets the pragma.
        # A thread waits for the writer connection as long as its holder may wait for the
        # file's lock (another process's commit, an import, a backup): not eventsourcing's
        # 5 s, which failed the second of two threads appending while the file was locked.
        self.datastore.pool = _SQLiteConnectionPool(
            synchronous=synchronous,  # type: ignore[arg-type]
            db_name=old.db_name,
            lock_timeout=old.lock_timeout,
            pool_size=old.pool_size,
            max_overflow=old.max_overflow,
            pool_timeout=max(old.pool_timeout, old.lock_timeout or SQLITE3_DEFAULT_LOCK_TIMEOUT),
            max_age=old.max_age,
            pre_ping=old.pre_ping,
        )
        old.close()

    def application_recorder(self) -> ApplicationRecorder:
        """The recorder for the layout the file holds (a new file: the compact one)."""
        if self.env.get(self.APPLICATION_RECORDER_TOPIC):
            return super().application_recorder()
        if self.env.name == WORLD_APPLICATION_NAME and not keeps_eventsourcing_table(
            compact=self._holds(EVENTS_TABLE), eventsourcing=self._holds(EVENTSOURCING_EVENTS_TABLE)
        ):
            return super().application_recorder()
        recorder = LittleSQLiteApplicationRecorder(datastore=self.datastore)
        if self.env_create_table():
            recorder.create_table()  # the heads table, on a file from before it
        return recorder

    def _holds(self, table: str) -> bool:
        with self.datastore.transaction(commit=False) as c:
            c.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (table,))
            return c.fetchone() is not None


# -------------------------------------------------------------------- artifacts

_SHA256_RE = re.compile(r"[0-9a-f]{64}")


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
        _write_durably(path, data)

    def _read_blob(self, sha256: str) -> bytes | None:
        try:
            return self._path(sha256).read_bytes()
        except FileNotFoundError:
            return None


# ----------------------------------------------------------------------- leases


class _FileLease(NamedTuple):
    fd: int
    path: Path
    name: str
    """``path`` as a string."""
    inode: tuple[int, int]
    """(st_dev, st_ino) of the file locked."""


def _inode(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino


class FileRunLeases(RunLeases):
    """``flock`` on one file per run; the kernel drops it when the holder dies.

    The lease is held while the lock file at the run's path is the file this
    process locked (same device and inode): :meth:`_break` replaces the file
    with a new one (an atomic rename), so the stuck holder's next check sees
    another inode, and a new driver locks the new file. The holder writes its
    pid and host into the file, for ``little unlock`` to show.
    """

    def __init__(self, directory: Path) -> None:
        self._directory = directory
        directory.mkdir(parents=True, exist_ok=True)

    def _path(self, key: UUID) -> Path:
        return self._directory / f"{key.hex}.lock"

    def _acquire(self, key: UUID) -> _FileLease | None:
        path = self._path(key)
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                locked = True
            except BlockingIOError:
                locked = False
            inode = _inode(os.fstat(fd))
            try:
                current = _inode(path.stat())
            except FileNotFoundError:
                current = None
            if current != inode:
                # Replaced (broken) between our open and our lock: the lease is the new file.
                os.close(fd)
                continue
            if not locked:
                os.close(fd)
                return None
            try:
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}".encode(), 0)
            except BaseException:
                os.close(fd)  # and with it the lock: a lease not taken is not held
                raise
            return _FileLease(fd, path, str(path), inode)

    def _release(self, token: _FileLease) -> None:
        fcntl.flock(token.fd, fcntl.LOCK_UN)
        os.close(token.fd)

    def _lost(self, token: _FileLease) -> str | None:
        try:
            # os.stat of a str: called before every call and append, Path.stat costs more.
            st = os.stat(token.name)  # noqa: PTH116
        except FileNotFoundError:
            return f"its lock file {token.path} was removed"
        if st.st_ino != token.inode[1] or st.st_dev != token.inode[0]:
            return f"its lock file {token.path} was replaced"
        return None

    def _probe(self, path: Path) -> str | None:
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 256, 0).decode(errors="replace").strip()
                return holder or "a process that has not written its pid yet"
            fcntl.flock(fd, fcntl.LOCK_UN)
            return None
        finally:
            os.close(fd)

    def _holder(self, key: UUID) -> str | None:
        return self._probe(self._path(key))

    def _break(self, key: UUID) -> str | None:
        path = self._path(key)
        holder = self._probe(path)
        if holder is None:
            return None
        fd, tmp = tempfile.mkstemp(dir=self._directory, prefix=".tmp-", suffix=".lock")
        os.close(fd)
        Path(tmp).chmod(0o644)
        Path(tmp).replace(path)
        return holder


# -------------------------------------------------------------- runs read model


class SQLiteRunsView(SQLiteTrackingRecorder, RunsView):
    """The runs read model in the world's SQLite file, next to its events."""

    def __init__(self, datastore: SQLiteDatastore, **kwargs: Any) -> None:
        super().__init__(datastore, **kwargs)
        # Our own tracking table, so another projection of the same world in the
        # same file cannot share (and corrupt) this one's position.
        self.insert_tracking_statement = (
            f"INSERT INTO {RUNS_TRACKING_TABLE} VALUES (:application_name, :notification_id) "
            "ON CONFLICT (application_name) DO UPDATE SET notification_id = :notification_id "
            f"WHERE {RUNS_TRACKING_TABLE}.notification_id < :notification_id "
            "RETURNING notification_id"
        )
        self.select_max_tracking_id_statement = (
            f"SELECT MAX(notification_id) FROM {RUNS_TRACKING_TABLE} WHERE application_name=?"
        )

    def construct_create_table_statements(self) -> list[str]:
        """The model's three tables."""
        return [
            f"CREATE TABLE IF NOT EXISTS {RUNS_TRACKING_TABLE} (application_name TEXT PRIMARY KEY,"
            " notification_id INTEGER) WITHOUT ROWID",
            f"CREATE TABLE IF NOT EXISTS {RUNS_TABLE} (run_id TEXT PRIMARY KEY,"
            " summary BLOB NOT NULL, state BLOB NOT NULL)",
            f"CREATE TABLE IF NOT EXISTS {RUN_STREAMS_TABLE} (stream_id TEXT PRIMARY KEY,"
            " run_id TEXT NOT NULL)",
        ]

    def create_table(self) -> None:
        """Create the tables (eventsourcing's tracking-table migration does not apply)."""
        with self.datastore.transaction(commit=True) as c:
            for statement in self.create_table_statements:
                c.execute(statement)

    def _insert_tracking(self, c: SQLiteCursor, tracking: Tracking) -> None:
        c.execute(
            self.insert_tracking_statement,
            {
                "application_name": tracking.application_name,
                "notification_id": tracking.notification_id,
            },
        )
        if c.fetchone() is None:
            raise IntegrityError(
                f"runs read model already tracks {tracking.application_name} at or after"
                f" notification {tracking.notification_id}"
            )

    def runs_of_streams(self, stream_ids: Iterable[UUID]) -> dict[UUID, str]:
        """See :meth:`RunsView.runs_of_streams`."""
        by_hex = {s.hex: s for s in stream_ids}
        if not by_hex:
            return {}
        found: dict[UUID, str] = {}
        keys = list(by_hex)
        with self.datastore.transaction(commit=False) as c:
            # Bounded by SQLite's default limit of 999 host parameters per statement.
            for i in range(0, len(keys), 500):
                chunk = keys[i : i + 500]
                c.execute(
                    f"SELECT stream_id, run_id FROM {RUN_STREAMS_TABLE}"
                    f" WHERE stream_id IN ({','.join('?' * len(chunk))})",
                    chunk,
                )
                for row in c.fetchall():
                    found[by_hex[row[0]]] = row[1]
        return found

    def load_state(self, run_id: str) -> MaterializedRunState | None:
        """See :meth:`RunsView.load_state`."""
        with self.datastore.transaction(commit=False) as c:
            c.execute(f"SELECT state FROM {RUNS_TABLE} WHERE run_id = ?", (run_id,))
            row = c.fetchone()
        return None if row is None else load_state(row[0])

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
        with self.datastore.transaction(commit=True) as c:
            self._insert_tracking(c, tracking)
            c.executemany(
                f"INSERT INTO {RUNS_TABLE} (run_id, summary, state) VALUES (?, ?, ?)"
                " ON CONFLICT (run_id) DO UPDATE SET summary = excluded.summary,"
                " state = excluded.state",
                rows,
            )
            c.executemany(
                f"INSERT OR REPLACE INTO {RUN_STREAMS_TABLE} (stream_id, run_id) VALUES (?, ?)",
                [(s.hex, r) for s, r in streams.items()],
            )

    def summaries(self) -> tuple[RunSummary, ...]:
        """See :meth:`RunsView.summaries`."""
        with self.datastore.transaction(commit=False) as c:
            c.execute(f"SELECT summary FROM {RUNS_TABLE}")
            rows = c.fetchall()
        return oldest_first(RunSummary.model_validate_json(row[0]) for row in rows)

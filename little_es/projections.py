"""The runs read model: one summary per run, kept by an eventsourcing projection.

:class:`RunsProjection` is an eventsourcing :class:`~eventsourcing.projection.Projection`
whose view (a :class:`~eventsourcing.persistence.TrackingRecorder`) holds, per
run, the :class:`~little_es.materialize.MaterializedRunState` folded by the one
reducer (:func:`little_es.materialize.apply` on a
:class:`~little_es.materialize.RunFold`) and a :class:`RunSummary` of it.
``little runs`` reads it through :func:`list_runs`.

Which events belong to a run: its own ``Run`` stream (from its ``RunStarted``
on) and the streams of the harness sessions its ``StepStarted`` events name,
exactly what :meth:`~little_es.world.World.read_run_log` reads, so the model's
totals equal ``replay_run(world, run_id).state.usage``. Sub-runs are runs of
their own. Other streams (outer loops) are skipped without being decoded.

Exactly once: each page of notifications is folded and written in one
transaction together with the position of its last notification (eventsourcing
tracking). A page that fails writes nothing, and two processes catching up at
once cannot both apply a page: the tracking insert of the second one fails and
it continues from the new position.

Catching up after downtime: :meth:`RunsProjection.catch_up` reads every
notification after the tracked position, however long ago it was written.
SQLite has no subscriptions in eventsourcing, so this polling catch-up is how
the model is updated on every backend; ``list_runs`` calls it first.

Where the model lives: in the world's own database (the SQLite file or the
PostgreSQL schema of its events, tables ``little_es_runs``,
``little_es_run_streams`` and ``little_es_runs_tracking``), so the position and
the model are updated atomically; for a memory world, in memory for as long as
the world object lives.
"""

from __future__ import annotations

import sys
import threading
import weakref
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from functools import cache
from typing import Any
from uuid import UUID

import orjson
from eventsourcing.persistence import IntegrityError, Notification, Tracking, TrackingRecorder
from eventsourcing.popo import POPOFactory, POPOTrackingRecorder
from eventsourcing.projection import Projection
from eventsourcing.sqlite import SQLiteCursor, SQLiteFactory, SQLiteTrackingRecorder
from pydantic import BaseModel, ConfigDict

from little_es.codec import PydanticMapper
from little_es.errors import EventLogError, RunsProjectionError
from little_es.events import Event, RunStarted, StepStarted
from little_es.materialize import MaterializedRunState, RunFold, RunStatus, apply
from little_es.values import UsageTotals
from little_es.world import World

__all__ = [
    "MemoryRunsView",
    "RunSummary",
    "RunsProjection",
    "RunsView",
    "SQLiteRunsView",
    "list_runs",
]

_PAGE_SIZE = 1000
_RUNS_TABLE = "little_es_runs"
_STREAMS_TABLE = "little_es_run_streams"
_TRACKING_TABLE = "little_es_runs_tracking"


class RunSummary(BaseModel):
    """One row of ``little runs``: a run's identity, status, times, totals and step counts."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    run_id: str
    workflow_id: str | None = None
    workflow_version: str | None = None
    parent_run_id: str | None = None
    status: RunStatus = "pending"
    started_at: datetime | None = None
    updated_at: datetime | None = None
    completed_at: datetime | None = None
    usage: UsageTotals = UsageTotals()
    """Tokens, cost (None when every call was unpriced) and unpriced calls, as replay folds them."""
    steps: int = 0
    steps_completed: int = 0
    steps_running: int = 0
    steps_pending: int = 0
    steps_failed: int = 0
    event_count: int = 0

    @classmethod
    def of(cls, run_id: str, state: MaterializedRunState) -> RunSummary:
        """The summary of a materialized state."""
        counts = {"completed": 0, "running": 0, "pending": 0, "failed": 0}
        for step in state.steps.values():
            counts[step.status] += 1
        return cls(
            run_id=run_id,
            workflow_id=state.workflow_id,
            workflow_version=state.workflow_version,
            parent_run_id=state.parent_run_id,
            status=state.status,
            started_at=state.started_at,
            updated_at=state.updated_at,
            completed_at=state.completed_at,
            usage=state.usage,
            steps=len(state.steps),
            steps_completed=counts["completed"],
            steps_running=counts["running"],
            steps_pending=counts["pending"],
            steps_failed=counts["failed"],
            event_count=state.event_count,
        )


# ------------------------------------------------------------------------- views


def _dump_state(state: MaterializedRunState) -> bytes:
    return orjson.dumps(state.model_dump(mode="json"))


def _load_state(data: bytes) -> MaterializedRunState:
    return MaterializedRunState.model_validate(orjson.loads(data))


def _dump_summary(summary: RunSummary) -> bytes:
    return orjson.dumps(summary.model_dump(mode="json"))


def _order(summaries: Iterable[RunSummary]) -> tuple[RunSummary, ...]:
    # Oldest first; a run whose RunStarted is not folded yet cannot exist here.
    return tuple(sorted(summaries, key=lambda s: (s.started_at is None, s.started_at, s.run_id)))


class RunsView(TrackingRecorder, ABC):
    """Where the runs read model and its tracking position are stored, atomically."""

    @abstractmethod
    def runs_of_streams(self, stream_ids: Iterable[UUID]) -> dict[UUID, str]:
        """The run each of these streams (run or session) belongs to, for those known."""

    @abstractmethod
    def load_state(self, run_id: str) -> MaterializedRunState | None:
        """The folded state of ``run_id``, or None if the model has not seen it."""

    @abstractmethod
    def commit(
        self,
        states: Mapping[str, MaterializedRunState],
        streams: Mapping[UUID, str],
        tracking: Tracking,
    ) -> None:
        """Store new states and stream owners with ``tracking``, all or nothing.

        Raises eventsourcing's :class:`~eventsourcing.persistence.IntegrityError`
        (and stores nothing) if ``tracking`` is not after the recorded position.
        """

    @abstractmethod
    def summaries(self) -> tuple[RunSummary, ...]:
        """Every run's summary, oldest first."""

    def create_table(self) -> None:
        """Create the model's tables if they are missing (in memory there is nothing to create)."""


class MemoryRunsView(POPOTrackingRecorder, RunsView):
    """The read model of a memory world, in memory."""

    def __init__(self) -> None:
        super().__init__()
        self._states: dict[str, bytes] = {}
        self._summaries: dict[str, RunSummary] = {}
        self._streams: dict[UUID, str] = {}

    def runs_of_streams(self, stream_ids: Iterable[UUID]) -> dict[UUID, str]:
        """See :meth:`RunsView.runs_of_streams`."""
        with self._database_lock:
            return {s: self._streams[s] for s in stream_ids if s in self._streams}

    def load_state(self, run_id: str) -> MaterializedRunState | None:
        """See :meth:`RunsView.load_state`."""
        with self._database_lock:
            data = self._states.get(run_id)
        # Stored serialised, like the other backends, so a caller can never alias it.
        return None if data is None else _load_state(data)

    def commit(
        self,
        states: Mapping[str, MaterializedRunState],
        streams: Mapping[UUID, str],
        tracking: Tracking,
    ) -> None:
        """See :meth:`RunsView.commit`."""
        dumped = {run_id: _dump_state(state) for run_id, state in states.items()}
        with self._database_lock:
            self._assert_tracking_uniqueness(tracking)
            self._states.update(dumped)
            self._summaries.update({r: RunSummary.of(r, s) for r, s in states.items()})
            self._streams.update(streams)
            self._insert_tracking(tracking)

    def summaries(self) -> tuple[RunSummary, ...]:
        """See :meth:`RunsView.summaries`."""
        with self._database_lock:
            return _order(self._summaries.values())


class SQLiteRunsView(SQLiteTrackingRecorder, RunsView):
    """The read model in the world's SQLite file, next to its events."""

    def __init__(self, datastore: Any, **kwargs: Any) -> None:
        super().__init__(datastore, **kwargs)
        # Our own tracking table, so another projection of the same world in the
        # same file cannot share (and corrupt) this one's position.
        self.insert_tracking_statement = (
            f"INSERT INTO {_TRACKING_TABLE} VALUES (:application_name, :notification_id) "
            "ON CONFLICT (application_name) DO UPDATE SET notification_id = :notification_id "
            f"WHERE {_TRACKING_TABLE}.notification_id < :notification_id "
            "RETURNING notification_id"
        )
        self.select_max_tracking_id_statement = (
            f"SELECT MAX(notification_id) FROM {_TRACKING_TABLE} WHERE application_name=?"
        )

    def construct_create_table_statements(self) -> list[str]:
        """The model's three tables."""
        return [
            f"CREATE TABLE IF NOT EXISTS {_TRACKING_TABLE} (application_name TEXT PRIMARY KEY,"
            " notification_id INTEGER) WITHOUT ROWID",
            f"CREATE TABLE IF NOT EXISTS {_RUNS_TABLE} (run_id TEXT PRIMARY KEY,"
            " summary BLOB NOT NULL, state BLOB NOT NULL)",
            f"CREATE TABLE IF NOT EXISTS {_STREAMS_TABLE} (stream_id TEXT PRIMARY KEY,"
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
                    f"SELECT stream_id, run_id FROM {_STREAMS_TABLE}"
                    f" WHERE stream_id IN ({','.join('?' * len(chunk))})",
                    chunk,
                )
                for row in c.fetchall():
                    found[by_hex[row[0]]] = row[1]
        return found

    def load_state(self, run_id: str) -> MaterializedRunState | None:
        """See :meth:`RunsView.load_state`."""
        with self.datastore.transaction(commit=False) as c:
            c.execute(f"SELECT state FROM {_RUNS_TABLE} WHERE run_id = ?", (run_id,))
            row = c.fetchone()
        return None if row is None else _load_state(row[0])

    def commit(
        self,
        states: Mapping[str, MaterializedRunState],
        streams: Mapping[UUID, str],
        tracking: Tracking,
    ) -> None:
        """See :meth:`RunsView.commit`."""
        rows = [
            (run_id, _dump_summary(RunSummary.of(run_id, state)), _dump_state(state))
            for run_id, state in states.items()
        ]
        with self.datastore.transaction(commit=True) as c:
            self._insert_tracking(c, tracking)
            c.executemany(
                f"INSERT INTO {_RUNS_TABLE} (run_id, summary, state) VALUES (?, ?, ?)"
                " ON CONFLICT (run_id) DO UPDATE SET summary = excluded.summary,"
                " state = excluded.state",
                rows,
            )
            c.executemany(
                f"INSERT OR REPLACE INTO {_STREAMS_TABLE} (stream_id, run_id) VALUES (?, ?)",
                [(s.hex, r) for s, r in streams.items()],
            )

    def summaries(self) -> tuple[RunSummary, ...]:
        """See :meth:`RunsView.summaries`."""
        with self.datastore.transaction(commit=False) as c:
            c.execute(f"SELECT summary FROM {_RUNS_TABLE}")
            rows = c.fetchall()
        return _order(RunSummary.model_validate_json(row[0]) for row in rows)


@cache
def _postgres_view_class() -> type[RunsView]:
    # psycopg is an optional extra (``postgres``): only a PostgreSQL world imports it.
    from eventsourcing.postgres import PostgresDatastore, PostgresTrackingRecorder
    from psycopg.sql import SQL, Identifier

    class _PostgresRunsView(PostgresTrackingRecorder, RunsView):
        """The read model in the world's PostgreSQL schema, next to its events."""

        def __init__(self, datastore: PostgresDatastore) -> None:
            super().__init__(datastore, tracking_table_name=_TRACKING_TABLE)
            schema = Identifier(datastore.schema)
            self._runs = SQL("{}.{}").format(schema, Identifier(_RUNS_TABLE))
            self._streams = SQL("{}.{}").format(schema, Identifier(_STREAMS_TABLE))
            self.sql_create_statements.append(
                SQL(
                    "CREATE TABLE IF NOT EXISTS {} (run_id text PRIMARY KEY,"
                    " summary bytea NOT NULL, state bytea NOT NULL)"
                ).format(self._runs)
            )
            self.sql_create_statements.append(
                SQL(
                    "CREATE TABLE IF NOT EXISTS {} (stream_id uuid PRIMARY KEY,"
                    " run_id text NOT NULL)"
                ).format(self._streams)
            )

        def runs_of_streams(self, stream_ids: Iterable[UUID]) -> dict[UUID, str]:
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
            with self.datastore.transaction(commit=False) as curs:
                curs.execute(
                    SQL("SELECT state FROM {} WHERE run_id = %s").format(self._runs), (run_id,)
                )
                row = curs.fetchone()
            return None if row is None else _load_state(bytes(row["state"]))

        def commit(
            self,
            states: Mapping[str, MaterializedRunState],
            streams: Mapping[UUID, str],
            tracking: Tracking,
        ) -> None:
            rows = [
                (run_id, _dump_summary(RunSummary.of(run_id, state)), _dump_state(state))
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
            with self.datastore.transaction(commit=False) as curs:
                curs.execute(SQL("SELECT summary FROM {}").format(self._runs))
                rows = curs.fetchall()
            return _order(RunSummary.model_validate_json(bytes(row["summary"])) for row in rows)

    return _PostgresRunsView


# One in-memory view per memory world, so a second RunsProjection of the same
# world (after "downtime") continues from the first one's position.
_memory_views: weakref.WeakKeyDictionary[Any, MemoryRunsView] = weakref.WeakKeyDictionary()
_memory_views_lock = threading.Lock()


def _view_for(world: World) -> RunsView:
    factory = world.app.factory
    if isinstance(factory, POPOFactory):
        with _memory_views_lock:
            view = _memory_views.get(world.app)
            if view is None:
                view = _memory_views[world.app] = MemoryRunsView()
            return view
    datastore = getattr(factory, "datastore", None)
    if isinstance(factory, SQLiteFactory):
        sqlite_view = SQLiteRunsView(datastore)
        sqlite_view.create_table()
        return sqlite_view
    # Looked up, not imported: importing psycopg would slow every SQLite-only start.
    postgres = sys.modules.get("eventsourcing.postgres")
    if postgres is not None and isinstance(factory, postgres.PostgresFactory):
        pg_view = _postgres_view_class()(datastore)  # type: ignore[call-arg]
        pg_view.create_table()
        return pg_view
    raise RunsProjectionError(
        f"world {world.name} uses {type(factory).__module__}, which has no runs read model:"
        " use a memory, SQLite or PostgreSQL world"
    )


# -------------------------------------------------------------------- projection


class RunsProjection(Projection[RunsView]):
    """Keeps the per-run read model of one world up to date. See the module docstring.

    ``RunsProjection(world).catch_up()`` applies every event written since the
    last catch-up (by any process), each exactly once; :meth:`runs` reads the
    model. :meth:`process_event` is eventsourcing's per-event entry point: on
    PostgreSQL, events from an ``eventsourcing.projection.ApplicationSubscription``
    of ``world.app`` started after :attr:`position` can be fed to it as they come.
    """

    # eventsourcing's ``topics`` stays empty (every event): a run's stream may carry
    # events of the user's own types, and they count towards the run's event_count.
    name = "little_es_runs"

    def __init__(self, world: World) -> None:
        if not isinstance(world, World):
            raise TypeError(
                f"RunsProjection needs a World (from open_world()), got {type(world).__name__}"
            )
        super().__init__(view=_view_for(world))
        self.world = world
        mapper = world.app.mapper
        assert isinstance(mapper, PydanticMapper)
        self._decode = mapper.decode
        self._upstream = world.app.name

    @property
    def position(self) -> int | None:
        """The id of the last notification applied, or None before the first."""
        return self.view.max_tracking_id(self._upstream)

    def catch_up(self) -> int:
        """Apply every notification after the tracked position; return how many were read.

        Raises :class:`RunsProjectionError` (having applied every page before
        the bad one) when an event of a run cannot be decoded.
        """
        read = 0
        recorder = self.world.app.recorder
        while True:
            position = self.position
            page = recorder.select_notifications(
                start=position, limit=_PAGE_SIZE, inclusive_of_start=position is None
            )
            if not page:
                return read
            try:
                self._apply(page, Tracking(self._upstream, page[-1].id))
            except IntegrityError as exc:
                if self.position == position:
                    raise RunsProjectionError(
                        f"runs read model of world {self.world.name}: cannot record position"
                        f" {page[-1].id}: {exc}"
                    ) from exc
                # Another process applied this page first: continue after its position.
                continue
            read += len(page)

    def process_event(self, domain_event: Any, tracking: Tracking) -> None:
        """Apply one decoded event at ``tracking``'s position (eventsourcing's protocol)."""
        if not isinstance(domain_event, Event):
            raise TypeError(f"not a little_es event: {type(domain_event).__name__}")
        self._apply([domain_event], tracking)

    def runs(self) -> tuple[RunSummary, ...]:
        """Every run in the model, oldest first (call :meth:`catch_up` first to be current)."""
        return self.view.summaries()

    def _apply(self, items: Sequence[Notification | Event], tracking: Tracking) -> None:
        owners = self.view.runs_of_streams({_stream_id(item) for item in items})
        new_owners: dict[UUID, str] = {}
        folds: dict[str, RunFold] = {}
        for item in items:
            stream = _stream_id(item)
            topic = item.topic if isinstance(item, Notification) else type(item).wire_name
            run_id = owners.get(stream)
            if run_id is None and topic != RunStarted.wire_name:
                continue
            event = item if isinstance(item, Event) else self._decode_for(item, run_id)
            if isinstance(event, RunStarted):
                run_id = owners[stream] = new_owners[stream] = event.run_id
            assert run_id is not None
            fold = folds.get(run_id)
            if fold is None:
                stored = self.view.load_state(run_id)
                pricer = self.world.pricer
                fold = folds[run_id] = (
                    RunFold(pricer) if stored is None else RunFold.from_state(stored, pricer)
                )
            apply(fold, event)
            if isinstance(event, StepStarted) and event.session_id is not None:
                owners[event.session_id] = new_owners[event.session_id] = run_id
        self.view.commit({r: f.freeze() for r, f in folds.items()}, new_owners, tracking)

    def _decode_for(self, notification: Notification, run_id: str | None) -> Event:
        try:
            return self._decode(notification)
        except EventLogError as exc:
            owner = f"run {run_id!r}" if run_id else "a new run"
            raise RunsProjectionError(
                f"runs read model of world {self.world.name}: notification {notification.id}"
                f" of {owner} cannot be read: {exc}"
            ) from exc


def _stream_id(item: Notification | Event) -> UUID:
    # eventsourcing types a notification's originator id as UUID | str; worlds use UUIDs.
    sid = item.originator_id
    return sid if isinstance(sid, UUID) else UUID(sid)


def list_runs(world: World) -> tuple[RunSummary, ...]:
    """Every run of ``world``, oldest first, from the runs read model brought up to date."""
    projection = RunsProjection(world)
    projection.catch_up()
    return projection.runs()

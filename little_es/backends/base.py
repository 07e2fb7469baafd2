"""What a World needs from a storage backend, and the seams every backend fills.

:class:`Backend` is the whole protocol. A backend gives a
:class:`~little_es.world.World`:

* ``app`` - the eventsourcing Application, opened with the backend's
  persistence settings. Its recorder's ``insert_events`` takes
  ``durable=False`` for a commit of nothing but write-ahead records
  (:attr:`~little_es.events.Event.write_ahead`), which need not wait for the
  disk; every other commit is as durable as the backend can make it. It may
  take ``watch=`` (a :class:`StreamWatch`) and answer it from the commit's own
  transaction; a recorder that ignores it loses nothing but a saved query. An
  import gives it ``snapshots=`` (:class:`SnapshotRows`), to write in the same
  transaction as the rows;
* :meth:`Backend.select_rows` - one stream's raw rows, for the read path;
* :meth:`Backend.stream_head` - a stream's last version and digest as written
  (:mod:`little_es.chain`), kept apart from its rows so a cut-off tail shows;
* :meth:`Backend.marker` - the world's id as recorded outside its database,
  where the backend has an outside;
* ``artifacts`` - an :class:`ArtifactStore`;
* ``leases`` - :class:`RunLeases`;
* :meth:`Backend.runs_view` - where the runs read model (:class:`RunsView`) lives;
* :meth:`Backend.close`.

The four built-in backends are :mod:`~little_es.backends.memory`,
:mod:`~little_es.backends.sqlite`, :mod:`~little_es.backends.postgres` and
:mod:`~little_es.backends.mysql` (MariaDB/MySQL through eventsourcing-sqlalchemy);
a new one subclasses these ABCs in a module of its own and passes
:mod:`little_es.testing.backend`.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from datetime import datetime
from typing import Any, ClassVar, NamedTuple
from uuid import UUID

import orjson
from eventsourcing.application import Application
from eventsourcing.persistence import (
    AggregateRecorder,
    PersistenceError,
    StoredEvent,
    Tracking,
    TrackingRecorder,
)
from pydantic import BaseModel, ConfigDict

from little_es.chain import Head
from little_es.errors import (
    ArtifactIntegrityError,
    ArtifactNotFoundError,
    ConcurrentRunError,
    LeaseLostError,
    WorldStorageError,
)
from little_es.ids import run_stream_id, validate_run_id
from little_es.materialize import MaterializedRunState, RunStatus
from little_es.values import ArtifactRef, HydratedArtifact, UsageTotals

WORLD_APPLICATION_NAME = "LittleEs"
"""The name of a world's eventsourcing application: the only one the factories of
this package give the compact layout's tables (:data:`EVENTS_TABLE`). Another
application that uses them keeps eventsourcing's own table, as it always had."""
HEADS_TABLE = "little_es_heads"
"""Every chained stream's last version and digest, in the world's own database."""
EVENTS_TABLE = "little_es_events"
"""The events of a SQLite or PostgreSQL world made by this version, in the compact layout:
integers for the stream id and the topic (``CompactSQLiteApplicationRecorder``,
``CompactPostgresApplicationRecorder``)."""
STREAMS_TABLE = "little_es_streams"
"""The stream ids of :data:`EVENTS_TABLE`'s rows, by the integer each row holds."""
TOPICS_TABLE = "little_es_topics"
"""The topics of :data:`EVENTS_TABLE`'s rows, by the integer each row holds."""
ROWS_VIEW = "little_es_rows"
"""A view of :data:`EVENTS_TABLE` with stream ids and topics spelled out, to read by hand."""


def keeps_eventsourcing_table(*, compact: bool, eventsourcing: bool) -> bool:
    """Whether a world's events are in eventsourcing's table rather than the compact
    layout's (:data:`EVENTS_TABLE`), given which of the two tables the database has.

    The compact table is made only where eventsourcing's is not: by this version, on
    a new world. So once it is there it is the world's, whatever is in either:
    eventsourcing's table beside it is another recorder's (eventsourcing's process
    recorder of the same factory, another application on the same SQLite file),
    and the compact table of a new world is empty until the world's first commit.
    """
    return eventsourcing and not compact


Row = tuple[int, str, bytes]
"""One stored event as the read path needs it: (version, topic, state)."""

ApplicationClass = type[Application[UUID]]
"""The Application a backend opens (the world's), constructed with ``env=`` settings."""


class StreamWatch:
    """Streams whose appends by other writers a commit looks for in its own transaction.

    A driver checks its run's stream for a foreign append (a ``RunCancelled``)
    right before each model call and batch of tool calls, and each of those
    follows the commit of its write-ahead record with nothing run in between. A
    commit given a watch reads the watched streams itself, after its rows went
    in, so the check that follows it needs no query of its own (on PostgreSQL a
    round trip per call). ``versions`` are the streams' versions as the driver
    holds them; once the insert has committed, ``unchanged`` holds those the
    commit found no row past. A recorder that does not know the watch leaves
    ``unchanged`` empty, and every check then makes its own query.
    """

    __slots__ = ("unchanged", "versions")

    def __init__(self, versions: Mapping[UUID, int]) -> None:
        self.versions: dict[UUID, int] = dict(versions)
        self.unchanged: frozenset[UUID] = frozenset()

    def found(self, changed: Iterable[UUID]) -> None:
        """Record what the commit read: ``changed`` are the streams with a row past their
        version (called by the recorder once its transaction has committed)."""
        self.unchanged = frozenset(self.versions) - frozenset(changed)

    def unchanged_at(self) -> dict[UUID, int]:
        """The streams found unchanged, each with the version it was read past."""
        return {sid: self.versions[sid] for sid in self.unchanged}


class SnapshotRows(NamedTuple):
    """Snapshots for an ``insert_events`` to write in its rows' transaction (``snapshots=``).

    An import (:meth:`~little_es.world.World.insert_imported`) moves a run's rows and
    its snapshots together: written apart, a failure between them would leave the
    rows in and the import neither done nor refused. ``recorder`` is the world's
    snapshot store, which shares the rows' database (and, in memory, their process).
    """

    recorder: AggregateRecorder
    rows: Sequence[StoredEvent]


class Backend(ABC):
    """One world's storage: its eventsourcing Application, artifacts, leases and read model.

    A subclass opens ``app`` with its own persistence settings (the
    ``PERSISTENCE_MODULE`` topic of its eventsourcing factory and that
    factory's options) and passes the pieces here. ``name`` is how the world
    is shown, a URL without its password.
    """

    def __init__(
        self,
        *,
        app: Application[UUID],
        artifacts: ArtifactStore,
        leases: RunLeases,
        name: str,
    ) -> None:
        self.app = app
        self.artifacts = artifacts
        self.leases = leases
        self.name = name

    def select_rows(self, stream_id: UUID, after: int | None) -> Sequence[Row]:
        """One stream's (version, topic, state) rows after version ``after``, in order.

        This default goes through the recorder's ``select_events``. eventsourcing
        builds a ``StoredEvent`` and a UUID for every row there, although the
        stream id is the one asked for (measured: 8 us of a row's 25 us replay
        cost), so SQL backends read their table directly instead.
        """
        rows = self.app.recorder.select_events(stream_id, gt=after)
        return [(r.originator_version, r.topic, r.state) for r in rows]

    def has_events_after(self, stream_id: UUID, version: int) -> bool:
        """Whether ``stream_id`` holds an event after ``version``: one indexed lookup.

        A driver asks it before each step and each agent call, to see an append by
        another process before it appends or executes anything. This default goes
        through the recorder's ``select_events``; SQL backends ask their table directly
        (on SQLite the recorder's transaction and ``StoredEvent`` cost about 100 us of
        an agent call's recording overhead, measured with ``benchmarks.bench_peer``).
        """
        return bool(self.app.recorder.select_events(stream_id, gt=version, limit=1))

    @abstractmethod
    def stream_head(self, stream_id: UUID) -> Head | None:
        """What was last written to ``stream_id`` (:class:`~little_es.chain.Head`), or None.

        The recorder writes heads in the same transaction as the rows (the
        ``heads`` argument of its ``insert_events``, given by every commit that
        holds a result), in a table of their own (:data:`HEADS_TABLE`), so rows
        deleted or edited behind the world's back no longer match it. None for
        a stream with no such commit since the chain.
        """

    @abstractmethod
    def stream_heads(self) -> dict[UUID, Head]:
        """Every stream's head (see :meth:`stream_head`), for ``little verify --all``."""

    def marker(self) -> str | None:
        """The world id recorded outside the database, or None (none recorded, or no outside)."""
        return None

    def write_marker(self, world_id: str) -> None:  # noqa: B027 - most backends have no outside
        """Record the world id outside the database, where the backend has an outside."""

    def holds_artifacts(self) -> bool:
        """Whether the artifact store holds blobs outside the database (the world has history)."""
        return False

    keeps_outer_loop_views: bool = False
    """Whether the backend keeps a file view of each outer loop (:mod:`little_es.outer_loop`)."""

    def write_outer_loop_view(self, outer_loop_id: str, data: bytes) -> None:  # noqa: B027
        """Replace the view of ``outer_loop_id`` atomically, where the backend keeps views.

        Most backends keep none (the CLI serves the view from the log); the
        SQLite one keeps ``{data_dir}/outer-loops/{outer_loop_id}.json``.
        """

    def read_outer_loop_view(self, outer_loop_id: str) -> bytes | None:
        """The stored view of ``outer_loop_id``, or None (no view kept or none written)."""
        return None

    @abstractmethod
    def runs_view(self) -> RunsView:
        """The runs read model of this world, its tables created if they were missing."""

    def close(self) -> None:
        """Close database connections and the artifact store."""
        self.app.close()
        self.artifacts.close()


# -------------------------------------------------------------------- artifacts


def artifact_digest(data: bytes) -> str:
    """The content address of ``data``: its sha256, in hex."""
    return hashlib.sha256(data).hexdigest()


class ArtifactStore(ABC):
    """Content-addressed blobs: stored once by the sha256 of their bytes, re-hashed on every read.

    Events carry an :class:`~little_es.values.ArtifactRef` instead of the
    bytes. A blob is written (and flushed to disk) before the event that
    references it is appended, so a committed ``StepCompleted`` never points
    at bytes that are not there; a corrupt or swapped blob is refused, never
    returned. A store implements :meth:`_write_blob` and :meth:`_read_blob`, and names
    its driver's errors in :attr:`driver_errors`.
    """

    driver_errors: ClassVar[tuple[type[Exception], ...]] = ()
    """The errors of the store's database driver: a write failing with one of them (or an
    ``OSError``, or eventsourcing's persistence errors) is a
    :class:`~little_es.errors.WorldStorageError`, never the failure of the step writing."""

    def put(
        self,
        data: bytes,
        *,
        run_id: str,
        step_path: str,
        media_type: str = "application/octet-stream",
    ) -> ArtifactRef:
        """Store ``data`` durably and return its reference."""
        if not isinstance(data, bytes | bytearray | memoryview):
            raise TypeError(f"artifact data must be bytes, got {type(data).__name__}")
        data = bytes(data)
        validate_run_id(run_id)
        sha = artifact_digest(data)
        failures: tuple[type[Exception], ...] = (OSError, PersistenceError, *self.driver_errors)
        try:
            self._write_blob(sha, data)
        except failures as exc:
            # The store failing is not the failure of the step whose output this is.
            raise WorldStorageError(
                f"the artifact store could not write {len(data):,} bytes for run {run_id!r},"
                f" step {step_path!r}: {exc}. Nothing referencing them was recorded: free"
                " space where the world's artifacts are stored (or bring their database"
                " back), then resume the run"
            ) from exc
        return ArtifactRef(
            artifact_id=f"sha256:{sha}",
            sha256=sha,
            size=len(data),
            media_type=media_type,
            run_id=run_id,
            step_path=step_path,
        )

    def get(self, ref: ArtifactRef) -> HydratedArtifact:
        """Read and verify an artifact; raise if it is missing or its bytes do not match."""
        data = self._read_blob(ref.sha256)
        if data is None:
            raise ArtifactNotFoundError(
                f"artifact {ref.artifact_id} of run {ref.run_id!r}, step {ref.step_path!r} is"
                " missing from the artifact store: restore it from a backup of the world"
            )
        actual = artifact_digest(data)
        if actual != ref.sha256 or len(data) != ref.size:
            raise ArtifactIntegrityError(
                f"artifact {ref.artifact_id} of run {ref.run_id!r}, step {ref.step_path!r} is"
                f" corrupt: stored bytes hash to sha256:{actual} ({len(data)} bytes), the log"
                f" records sha256:{ref.sha256} ({ref.size} bytes)"
            )
        return HydratedArtifact(manifest=ref, payload=data)

    def exists(self, ref: ArtifactRef) -> bool:
        """Whether bytes for ``ref`` are stored (without verifying them)."""
        return self._read_blob(ref.sha256) is not None

    @abstractmethod
    def _write_blob(self, sha256: str, data: bytes) -> None:
        """Store ``data`` under ``sha256`` durably; a no-op when already stored."""

    @abstractmethod
    def _read_blob(self, sha256: str) -> bytes | None:
        """The stored bytes for ``sha256``, or None."""

    def close(self) -> None:  # noqa: B027 - most stores hold nothing to release
        """Release resources held by the store."""


# ----------------------------------------------------------------------- leases


def _refused(run_id: str) -> ConcurrentRunError:
    return ConcurrentRunError(
        f"run {run_id!r} is being driven by another process: this one stopped without running"
        " anything; wait for it to finish (or kill it) and resume again"
    )


class Lease:
    """A run's lease, held by this process: what :meth:`RunLeases.hold` yields.

    :meth:`check` confirms, cheaply, that it is still held: a lease can be lost
    while its holder lives (a PostgreSQL connection closed by an idle timeout,
    a proxy or ``little unlock --force``; a SQLite lock file removed or
    replaced), and a second process may then take the run. The engines check
    every lease of the current context (:func:`check_leases`) before each
    step, model call and tool call, and before each append.
    """

    __slots__ = ("_lost", "_released", "run_id", "what")

    def __init__(
        self, run_id: str, lost: Callable[[], str | None], what: str | None = None
    ) -> None:
        self.run_id = run_id
        self.what = what or f"run {run_id!r}"
        """What holds it, as its errors name it (``run 'x'``, ``outer loop 'y'``)."""
        self._lost = lost
        self._released = False

    def check(self) -> None:
        """Return if the lease is still held; raise :class:`~little_es.errors.LeaseLostError`."""
        reason = "it was released by its holder" if self._released else self._lost()
        if reason is not None:
            raise LeaseLostError(
                f"{self.what}: this process lost its lease ({reason}) and stopped"
                " before running anything more; another process may be driving the run:"
                " resume it (in one process) once that one has stopped"
            )


_GUARDING: ContextVar[tuple[Lease, ...]] = ContextVar("little_es_leases", default=())


def check_leases() -> None:
    """Check every lease held around the running code (the run's, a parent run's, a step's).

    Raises :class:`~little_es.errors.LeaseLostError` if one was lost. Outside
    any lease (a harness session run on its own), it checks nothing. A tool or
    step that is about to do something long or costly may call it too.
    """
    for lease in _GUARDING.get():
        lease.check()


class RunLeases(ABC):
    """Exclusive, non-blocking leases on runs: at most one process makes progress on a run.

    Optimistic concurrency alone cannot stop two processes from both executing
    a step that was started but not completed (each would see it "in
    flight"). So a process holds a lease on a run for as long as it drives it;
    a second process that asks for the same lease is refused at once with
    :class:`~little_es.errors.ConcurrentRunError`, before it runs anything.
    Leases die with their holder: a killed process never leaves a run locked.
    A live holder can lose its lease; it learns so from :meth:`Lease.check`.
    """

    driver_errors: ClassVar[tuple[type[Exception], ...]] = ()
    """The errors of the leases' database driver: taking, reading or breaking a lease
    failing with one of them (or an ``OSError``) is a
    :class:`~little_es.errors.WorldStorageError`, as the world's own reads are."""

    @contextlib.contextmanager
    def _storage(self, doing: str, run_id: str) -> Iterator[None]:
        failures: tuple[type[Exception], ...] = (OSError, *self.driver_errors)
        try:
            yield
        except failures as exc:
            said = " ".join(str(exc).split()) or type(exc).__name__
            raise WorldStorageError(
                f"could not {doing} the lease on run {run_id!r}: {said}. Nothing ran and"
                " nothing was recorded: check that the world's database is up and reachable"
                " (for SQLite, that its data directory's leases folder can be written), then"
                " try again"
            ) from exc

    @contextlib.contextmanager
    def hold(self, run_id: str, *, what: str | None = None) -> Iterator[Lease]:
        """Hold the lease on ``run_id`` for the ``with`` block, or raise ConcurrentRunError.

        ``what`` names the holder in the errors of a lost lease (default ``run 'run_id'``).

        Inside the block, :func:`check_leases` checks it: in this context and
        what copies it (asyncio tasks, ``asyncio.to_thread``), not in a plain
        ``threading.Thread``, which starts with an empty context.
        """
        with self._storage("take", run_id):
            token = self._acquire(run_stream_id(run_id))
        if token is None:
            raise _refused(run_id)
        lease = Lease(run_id, functools.partial(self._lost, token), what)
        _GUARDING.set((*_GUARDING.get(), lease))
        try:
            yield lease
        finally:
            lease._released = True
            # Not ContextVar.reset: the block may end in another context than it began.
            _GUARDING.set(tuple(held for held in _GUARDING.get() if held is not lease))
            self._release(token)

    def holder(self, run_id: str) -> str | None:
        """Who holds the lease on ``run_id`` (a description), or None when it is free."""
        with self._storage("read", run_id):
            return self._holder(run_stream_id(run_id))

    def break_lease(self, run_id: str) -> str | None:
        """Take the lease on ``run_id`` away from its holder; who held it, or None if nobody.

        For a driver that is alive but stuck: it keeps running what it was
        running, but its next :meth:`Lease.check` raises
        :class:`~little_es.errors.LeaseLostError`, and any append it still
        makes after a new driver appended fails the stream's version check.
        """
        with self._storage("break", run_id):
            return self._break(run_stream_id(run_id))

    @abstractmethod
    def _acquire(self, key: UUID) -> Any | None:
        """A release token, or None when another holder has the lease."""

    @abstractmethod
    def _release(self, token: Any) -> None:
        """Give the lease back."""

    @abstractmethod
    def _lost(self, token: Any) -> str | None:
        """Why the lease ``token`` is no longer held, or None while it is. Called often: cheap."""

    @abstractmethod
    def _holder(self, key: UUID) -> str | None:
        """A description of the lease's holder, or None when nobody holds it."""

    @abstractmethod
    def _break(self, key: UUID) -> str | None:
        """Make the holder lose the lease (its description), or None when nobody held it."""


# -------------------------------------------------------------- runs read model

RUNS_TABLE = "little_es_runs"
RUN_STREAMS_TABLE = "little_es_run_streams"
RUNS_TRACKING_TABLE = "little_es_runs_tracking"
"""The runs read model's tables, in the world's own database (see :mod:`little_es.projections`)."""


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


def dump_state(state: MaterializedRunState) -> bytes:
    """A folded state as the read model stores it."""
    return orjson.dumps(state.model_dump(mode="json"))


def load_state(data: bytes) -> MaterializedRunState:
    """A folded state from the read model's bytes."""
    return MaterializedRunState.model_validate(orjson.loads(data))


def dump_summary(summary: RunSummary) -> bytes:
    """A summary as the read model stores it."""
    return orjson.dumps(summary.model_dump(mode="json"))


def oldest_first(summaries: Iterable[RunSummary]) -> tuple[RunSummary, ...]:
    """Summaries ordered by start time, then run id."""
    # A run whose RunStarted is not folded yet cannot exist here.
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

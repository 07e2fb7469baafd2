"""The runs read model: one summary per run, kept by an eventsourcing projection.

:class:`RunsProjection` is an eventsourcing :class:`~eventsourcing.projection.Projection`
whose view (the :class:`~little_es.backends.base.RunsView` of the world's
backend, an eventsourcing :class:`~eventsourcing.persistence.TrackingRecorder`)
holds, per run, the :class:`~little_es.materialize.MaterializedRunState` folded
by the one reducer (:func:`little_es.materialize.apply` on a
:class:`~little_es.materialize.RunFold`) and a
:class:`~little_es.backends.base.RunSummary` of it.
``little runs`` reads it through :func:`list_runs`.

Which events belong to a run: its own ``Run`` stream (from its ``RunStarted``
on, a fork's from its ``RunForked``) and the streams of the harness sessions
its ``StepStarted`` events name, exactly what
:meth:`~little_es.world.World.read_run_log` reads, so the model's totals equal
``replay_run(world, run_id).state.usage``. Sub-runs are runs of their own.
Other streams (outer loops) are skipped without being decoded.

Exactly once: each page of notifications is folded and written in one
transaction together with the position of its last notification (eventsourcing
tracking). A page that fails writes nothing, and two processes catching up at
once cannot both apply a page: the tracking insert of the second one fails and
it continues from the new position.

The chain, row by row: the page's rows of every stream the model folds are
checked before it is written, each against its own digest, the row before it
(in the page, or the stored row it follows) and the stream's head (a row cut
off the end of a stream is missing behind a head that names it). So a row
deleted, moved or edited behind the world's back stops the catch-up with
:class:`~little_es.errors.LogTamperedError` and the model stays at the page
before, as ``replay_run`` refuses the run; once the log is restored, the next
catch-up folds it. What takes a whole stream to see (a head edited on its own)
is left to the reads that take one: resume, ``replay_run``, ``little verify``.

Catching up after downtime: :meth:`RunsProjection.catch_up` reads every
notification after the tracked position, however long ago it was written.
SQLite has no subscriptions in eventsourcing, so this polling catch-up is how
the model is updated on every backend; ``list_runs`` calls it first.

Where the model lives (the backend's ``runs_view()``): in the world's own
database (the SQLite file or the PostgreSQL schema of its events, tables
``little_es_runs``, ``little_es_run_streams`` and ``little_es_runs_tracking``),
so the position and the model are updated atomically; for a memory world, in
memory for as long as the world object lives.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from uuid import UUID

from eventsourcing.persistence import IntegrityError, Notification, Tracking
from eventsourcing.projection import Projection

from little_es.backends.base import RunSummary, RunsView
from little_es.chain import GENESIS, Row, check_rows, is_framed, row_digest
from little_es.codec import PydanticMapper
from little_es.errors import EventLogError, LogTamperedError, RunsProjectionError
from little_es.events import Event, RunForked, RunStarted, StepStarted
from little_es.materialize import RunFold, WaitState, apply
from little_es.world import World

__all__ = [
    "RunsProjection",
    "list_runs",
    "list_waits",
]

_PAGE_SIZE = 1000
_OPENERS = frozenset({RunStarted.wire_name, RunForked.wire_name})


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
        super().__init__(view=world.backend.runs_view())
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
        rows: dict[UUID, list[Row]] = {}
        for item in items:
            stream = _stream_id(item)
            topic = item.topic if isinstance(item, Notification) else type(item).wire_name
            run_id = owners.get(stream)
            # A run's stream opens with its RunStarted, a fork's with its RunForked.
            if run_id is None and topic not in _OPENERS:
                continue
            if isinstance(item, Notification):
                rows.setdefault(stream, []).append(
                    (item.originator_version or 0, topic, item.state)
                )
            event = item if isinstance(item, Event) else self._decode_for(item, run_id)
            if isinstance(event, RunStarted | RunForked):
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
        for stream, stream_rows in rows.items():
            self._check_chain(stream, stream_rows)
        self.view.commit({r: f.freeze() for r, f in folds.items()}, new_owners, tracking)

    def _check_chain(self, stream: UUID, rows: Sequence[Row]) -> None:
        """Refuse the page unless ``rows`` (one stream's, in order) follow the stored row
        before the first and reach the stream's head (see the module)."""
        first = rows[0][0]
        prev = GENESIS
        if first > 1:
            before = self.world.app.recorder.select_events(stream, gt=first - 2, lte=first - 1)
            if not before:
                raise self._tampered(
                    f"stream {stream}: version {first - 1} is missing (the next stored row is"
                    f" version {first}); rows were deleted from the log"
                )
            if is_framed(before[0].state):
                # (A row from before the chain is followed by one that links to GENESIS.)
                prev = row_digest(before[0].state)
        try:
            check_rows(stream, rows, prev=prev)
        except LogTamperedError as exc:
            raise self._tampered(str(exc)) from exc
        last = rows[-1][0]
        head = self.world.backend.stream_head(stream)
        # Rows and head are committed together: a head past the last row read names rows
        # that must be stored after it (written since this page was read), or were cut off.
        if (
            head is not None
            and head.version > last
            and not self.world.has_events_after(stream, last)
        ):
            raise self._tampered(
                f"stream {stream} ends at version {last} but was written up to version"
                f" {head.version}: rows were deleted from the end of the log"
            )

    def _tampered(self, what: str) -> LogTamperedError:
        return LogTamperedError(
            f"runs read model of world {self.world.name}: {what}; nothing of this page was"
            " folded: restore the world from a backup (`little verify --all` names every"
            " break)"
        )

    def _decode_for(self, notification: Notification, run_id: str | None) -> Event:
        try:
            return self._decode(notification)
        except LogTamperedError as exc:
            raise self._tampered(str(exc)) from exc
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


def list_waits(world: World) -> tuple[tuple[str, WaitState], ...]:
    """``(run_id, wait)`` of every open wait (``RunWaiting`` without its signal) of every
    waiting run of ``world`` (``little runs --waiting``), from the runs read model."""
    projection = RunsProjection(world)
    projection.catch_up()
    found: list[tuple[str, WaitState]] = []
    for run in projection.runs():
        if run.status != "waiting":
            continue
        state = projection.view.load_state(run.run_id)
        if state is None:
            continue
        found.extend((run.run_id, w) for w in state.waits.values() if w.status == "waiting")
    return tuple(found)

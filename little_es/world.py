"""A World is where runs live: an eventsourcing Application on a storage backend.

The World is the facade: it writes (one transaction per save, snapshots at
versions growing fourfold) and reads (streams, a run's merged log, aggregates) through
one :class:`~little_es.backends.base.Backend`, which holds the storage: the
eventsourcing recorders, artifacts, leases and the runs read model. The
functions here open one from arguments or a URL:

* :func:`local_world` - one SQLite file and content-addressed artifact files
  under a data directory (the embedded default, ``.little-workflow``);
* :func:`postgres_world` - eventsourcing's PostgreSQL recorder, artifacts in
  the same database;
* :func:`mysql_world` - eventsourcing-sqlalchemy on MariaDB or MySQL,
  artifacts in the same database;
* :func:`memory_world` - in-process, for tests;
* :func:`open_world` - any of them from a URL (``sqlite:///path/to/dir``,
  ``postgresql://...``, ``mysql+pymysql://...``, ``memory://``), or from
  ``LITTLE_ES_WORLD``.

The world only ever inserts events. No code path updates or deletes one.
"""

from __future__ import annotations

import gc
import heapq
import logging
import os
import random
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from datetime import UTC, datetime
from decimal import Decimal
from operator import attrgetter
from pathlib import Path
from types import TracebackType
from typing import Any, ClassVar, Literal, NamedTuple, TypeVar
from urllib.parse import parse_qs, unquote, urlsplit
from uuid import UUID, uuid4

import orjson
from eventsourcing.application import Application
from eventsourcing.persistence import IntegrityError, PersistenceError, StoredEvent
from eventsourcing.utils import Environment, EnvType, get_topic

from little_es.aggregates import (
    DomainStream,
    LoadedDomainStream,
    StepAggregates,
    check_domain_payload,
    decode_domain_event,
    is_domain_topic,
)
from little_es.backends.base import (
    WORLD_APPLICATION_NAME,
    Backend,
    Lease,
    SnapshotRows,
    StreamWatch,
    check_leases,
)
from little_es.backends.memory import MemoryBackend
from little_es.backends.sqlite import SQLiteBackend, Synchronous
from little_es.chain import (
    Head,
    Row,
    Running,
    Verified,
    feed,
    frame,
    framed,
    is_framed,
    links,
    payload_of,
    row_digest,
    row_prev,
    seed,
    verify_stream,
)
from little_es.codec import OrjsonTranscoder, PydanticMapper
from little_es.domain import Aggregate, HarnessSession, OuterLoop, PriceBook, Run, WorldRecord
from little_es.errors import (
    AggregateArgumentError,
    AggregateConflictError,
    ConcurrencyConflictError,
    EventLogError,
    EventPayloadError,
    LogTamperedError,
    NoSuchWaitError,
    PricingError,
    RunNotFoundError,
    SignalConsumedError,
    SignalDataError,
    SignalError,
    StaleApprovalError,
    UnknownEventTypeError,
    UnstorableEventError,
    WorldConfigError,
    WorldIntegrityError,
    WorldStorageError,
)
from little_es.events import (
    LOG_FORMAT_LINKED,
    LOG_FORMAT_UNCHAINED,
    Event,
    ModelPriceSet,
    OuterLoopStarted,
    RunEvent,
    SignalReceived,
    Snapshot,
    StepStarted,
    WorldCreated,
    event_class_for,
    utc_now,
)
from little_es.faults import after_append, before_append
from little_es.ids import (
    outer_loop_stream_id,
    price_book_stream_id,
    run_stream_id,
    validate_run_id,
    world_stream_id,
)
from little_es.materialize import MaterializedRunState, WaitState, materialize_run_state
from little_es.pricing import (
    checked_at,
    checked_price,
    normalized_model_key,
    price_usage_picodollars,
)
from little_es.values import Pricer, Usage
from little_es.waits import import_model, validate_signal_data

WORLD_ENV_VAR = "LITTLE_ES_WORLD"
DEFAULT_DATA_DIR = ".little-workflow"

A = TypeVar("A", bound=Aggregate)
E = TypeVar("E", bound=RunEvent)

RUN_SNAPSHOT_INTERVAL = 1000
"""A ``Run`` is snapshotted at this many events, then at 4, 16, 64... times as many.

A snapshot holds the whole folded state, so it costs as much as the run is
long: at a fixed interval their total cost would grow with the square of the
run's length, at versions growing by a factor it stays proportional to it
(4/3 of the last snapshot's size at a factor of 4, twice it at 2), while a
load reads at most the last three quarters of the stream after its snapshot
(half at 2). A factor of 4 takes a third less space than 2; the resumes of
1,000 and 10,000 steps that ``benchmarks/bench_peer.py`` and ``bench_memory.py``
time (at 1,800 and 18,000 events) load from the same snapshot either way. Measured with
``benchmarks/bench_snapshots.py`` (README, "Performance"). A ``HarnessSession``
is not snapshotted: its state is every event it recorded, and loading that
from a snapshot measured no faster than from the events themselves.
"""


EVENTSOURCING_VARIABLES = frozenset(
    {
        # eventsourcing.application.Application
        "AGGREGATE_CACHE_MAXSIZE",
        "AGGREGATE_CACHE_FASTFORWARD",
        "AGGREGATE_CACHE_FASTFORWARD_SKIPPING",
        "DEEPCOPY_FROM_AGGREGATE_CACHE",
        "IS_SNAPSHOTTING_ENABLED",
        # eventsourcing.persistence: the factory, codec and recorder classes
        "PERSISTENCE_MODULE",
        "INFRASTRUCTURE_FACTORY",
        "FACTORY_TOPIC",
        "MAPPER_TOPIC",
        "TRANSCODER_TOPIC",
        "CIPHER_TOPIC",
        "CIPHER_KEY",
        "COMPRESSOR_TOPIC",
        "APPLICATION_RECORDER_TOPIC",
        "TRACKING_RECORDER_TOPIC",
        "PROCESS_RECORDER_TOPIC",
        "CREATE_TABLE",
        "SINGLE_ROW_TRACKING",
        "ORIGINATOR_ID_TYPE",
        # eventsourcing.sqlite
        "SQLITE_DBNAME",
        "SQLITE_LOCK_TIMEOUT",
        # eventsourcing.postgres
        "POSTGRES_DBNAME",
        "POSTGRES_HOST",
        "POSTGRES_PORT",
        "POSTGRES_USER",
        "POSTGRES_PASSWORD",
        "POSTGRES_GET_PASSWORD_TOPIC",
        "POSTGRES_CONNECT_TIMEOUT",
        "POSTGRES_CONN_MAX_AGE",
        "POSTGRES_PRE_PING",
        "POSTGRES_MAX_WAITING",
        "POSTGRES_LOCK_TIMEOUT",
        "POSTGRES_POOL_SIZE",
        "POSTGRES_MAX_OVERFLOW",
        "POSTGRES_IDLE_IN_TRANSACTION_SESSION_TIMEOUT",
        "POSTGRES_SCHEMA",
        "POSTGRES_ENABLE_DB_FUNCTIONS",
        # eventsourcing_sqlalchemy
        "SQLALCHEMY_URL",
        "SQLALCHEMY_AUTOFLUSH",
        "SQLALCHEMY_CONNECTION_CREATOR_TOPIC",
        "SQLALCHEMY_SCOPED_SESSION_TOPIC",
        "SQLALCHEMY_SCHEMA",
    }
)
"""The settings eventsourcing (9.5's source) and eventsourcing-sqlalchemy (1.0's) read from an
application's environment.

eventsourcing merges ``os.environ`` over every application's settings, and
reads each one first as ``{APP NAME}_{SETTING}``. A world's application does
not read the process environment at all (:meth:`LittleApplication.construct_env`):
a team that configures its own eventsourcing applications with these
variables in the same process changes nothing of a world (its database, its
codec, its commit policy). Spelt for the world's application
(``LITTLEES_...``), they are refused by name instead of ignored.
"""


class LittleApplication(Application[UUID]):
    """The eventsourcing Application behind every world (pydantic mapper, orjson bytes)."""

    name = WORLD_APPLICATION_NAME
    env: ClassVar[dict[str, str]] = {
        "MAPPER_TOPIC": get_topic(PydanticMapper),
        "TRANSCODER_TOPIC": get_topic(OrjsonTranscoder),
    }
    # World.save frames and stores snapshots itself (World._snapshot); the intervals
    # make eventsourcing open the snapshot store they go to.
    snapshot_class = Snapshot
    snapshotting_intervals: ClassVar[dict[type[Any], int]] = {Run: RUN_SNAPSHOT_INTERVAL}
    """First snapshot version per aggregate class; later ones double it (World.save)."""

    def construct_env(self, name: str, env: EnvType | None = None) -> Environment:
        """The class's settings and the backend's (``env``), never the process environment.

        eventsourcing's own merges ``os.environ`` in between, so a
        ``TRANSCODER_TOPIC``, ``CIPHER_KEY``, ``POSTGRES_ENABLE_DB_FUNCTIONS``
        or ``SQLITE_DBNAME`` meant for another application of the process
        would change this world's codec, commit policy or database. Raises
        :class:`~little_es.errors.WorldConfigError` for a setting spelt for
        this application (``LITTLEES_TRANSCODER_TOPIC``...), which can only
        have been meant for it.
        """
        prefix = name.upper() + "_"
        aimed = sorted(
            key
            for key in os.environ
            if key.startswith(prefix) and key[len(prefix) :] in EVENTSOURCING_VARIABLES
        )
        if aimed:
            raise WorldConfigError(
                f"the environment sets {', '.join(aimed)}: eventsourcing settings of little_es's"
                " own application, which a world does not take from the environment (its"
                " database, codec and commit policy are little_es's); unset"
                f" {'it' if len(aimed) == 1 else 'them'} and choose the world with its URL"
                " (sqlite:///dir, postgresql://..., memory://)"
            )
        settings = dict(type(self).env)
        settings["IS_SNAPSHOTTING_ENABLED"] = "y"
        settings.update(env or {})
        return Environment(name, settings)


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while a long log is decoded and folded.

    Decoding allocates many small objects that all stay alive and form no
    cycles; each pass of the collector would rescan all of them (measured: it
    doubled replay's time).
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


_timestamp = attrgetter("timestamp")

_HEAD_REREADS = 5
"""How often a stream whose head is ahead of its rows is read again before it is refused."""

# How the databases say a write found no space: SQLite, PostgreSQL, MariaDB, the OS.
_FULL_DISK = ("disk is full", "no space left", "could not extend", "table is full", "disk full")


def _reached_mark(version: int, saved: int, interval: int) -> bool:
    """Whether versions ``version - saved + 1 .. version`` include ``interval * 4**k``."""
    multiples = version // interval
    if multiples == 0:
        return False
    last_mark = interval << 2 * ((multiples.bit_length() - 1) // 2)
    return last_mark > version - saved


class RunLog(NamedTuple):
    """A run's log as :meth:`World.read_run_log_skipping` read it."""

    events: list[Event]
    """The decoded events, merged by timestamp as :meth:`World.read_run_log` orders them."""
    skipped: int
    """How many events were left undecoded."""
    pricer: Pricer
    """The pricer of the world that read it."""

    def materialize(self) -> MaterializedRunState:
        """The run's state: the decoded events folded, the skipped ones counted.

        Equal to the fold of the whole log when the skipped events are of
        classes the reducer only counts (:data:`~little_es.materialize.COUNTED_ONLY`).
        """
        return materialize_run_state(self.events, pricer=self.pricer, skipped=self.skipped)


def merge_by_timestamp(streams: list[list[Event]]) -> list[Event]:
    """Streams (each in version order) merged by timestamp; ties: earlier stream, then version.

    ``heapq.merge`` breaks ties by input order and keeps each input's own order,
    so a bare timestamp key gives exactly that order without building a key
    tuple per event (measured: half the time of ``(timestamp, rank, version)``).
    """
    if len(streams) == 1:
        return streams[0]
    return list(heapq.merge(*streams, key=_timestamp))


def merge_run_log(
    run_events: list[Event], sessions: Sequence[list[Event]], named: Mapping[UUID, datetime]
) -> list[Event]:
    """A run's stream merged with its sessions' streams: by timestamp, each session
    after the ``StepStarted`` that names it (``named``: the timestamp of the first one
    naming each session).

    A session's events are written after that ``StepStarted`` (write-ahead), but
    not always by the same clock: a process resuming the step, or a Temporal
    worker on another machine, may be behind the one that recorded it. Ordered
    by timestamp alone, the session's events would come before its step exists,
    and the reducer could not count their usage to the step (its budget would
    then be spent again on resume). Such a session's events that are stamped
    before its ``StepStarted`` are ordered as if stamped with it, which keeps
    the order the log was written in.
    """
    behind = {
        events[0].originator_id: named[events[0].originator_id]
        for events in sessions
        if events and events[0].timestamp < named.get(events[0].originator_id, _LONG_AGO)
    }
    streams = [run_events, *sessions]
    if not behind:
        return merge_by_timestamp(streams)

    def key(e: Event) -> datetime:
        started = behind.get(e.originator_id)
        return e.timestamp if started is None or e.timestamp >= started else started

    # Ties go to the earlier stream: the run's, so its StepStarted comes first.
    return list(heapq.merge(*streams, key=key))


class _RecordedElsewhereError(Exception):
    """A new world's first save lost the race to record the world (see :meth:`World.save`)."""


_LONG_AGO = datetime.min.replace(tzinfo=UTC)
_SET_PRICE_ATTEMPTS = 3


class _BookPricer:
    """A world's pricer: its price book, then this process's overrides, then genai-prices.

    The book is read when the first call is priced, and read again whenever a
    call to price was made after the last read began:
    a price set by any process before a call is then in the book that prices
    it. A call made before the last read needs no read: a price recorded since
    is effective from its own recording (or the moment it names), so it can
    only be one set with an ``effective_from`` in the past.
    """

    __slots__ = ("_book", "_fresh_until", "_lock", "_pusd", "_world")

    def __init__(self, world: World) -> None:
        self._world = world
        self._lock = threading.RLock()
        self._reset()

    def _reset(self) -> None:
        self._book = PriceBook()
        self._fresh_until = _LONG_AGO
        self._pusd: Callable[[str, str, Usage, datetime], int | None] = price_usage_picodollars

    def _took(self, book: PriceBook) -> None:
        # An empty book (the usual case) prices straight from the lookup: one call less per call.
        self._pusd = book.prices.picodollars if book.prices.recorded else price_usage_picodollars

    def __call__(self, provider: str, model_id: str, usage: Usage, at: datetime) -> Decimal | None:
        self._check_fresh(at)
        return self._book.prices(provider, model_id, usage, at)

    def picodollars(self, provider: str, model_id: str, usage: Usage, at: datetime) -> int | None:
        """The cost in integer picodollars, as the reducer sums it (a ``PicodollarPricer``)."""
        # _check_fresh inlined for the usual case: the reducer calls this once per model call.
        fresh = self._fresh_until
        try:
            stale = at.tzinfo is not fresh.tzinfo or at >= fresh
        except (AttributeError, TypeError):
            stale = True  # no datetime: refused by _check_fresh
        if stale:
            self._check_fresh(at)
        return self._pusd(provider, model_id, usage, at)

    def _check_fresh(self, at: datetime) -> None:
        checked_at(at)
        fresh = self._fresh_until
        if at.tzinfo is not fresh.tzinfo:
            # Aware datetimes with distinct tzinfo objects compare ten times slower (both
            # offsets are asked for); a log's decoded timestamps share one, so convert once.
            fresh = self._fresh_until = fresh.astimezone(at.tzinfo)
        if at >= fresh:
            self.refresh()

    def refresh(self) -> PriceBook:
        """The book with every price recorded so far.

        Loaded whole, as every stream is read: its chain is verified from the
        first event, and the aggregate can append after its last one.
        """
        with self._lock:
            started = utc_now()
            book = self._world.load_price_book() or PriceBook()
            self._book = book
            self._took(book)
            self._fresh_until = started
            return book

    def set(self, **fields: object) -> ModelPriceSet:
        with self._lock:
            for attempt in range(1, _SET_PRICE_ATTEMPTS + 1):
                book = self.refresh()
                event = book.trigger(ModelPriceSet, **fields)
                try:
                    self._world.save(book)
                except ConcurrencyConflictError:
                    # Another process recorded a price first: read the book afresh and retry.
                    self._reset()
                    if attempt == _SET_PRICE_ATTEMPTS:
                        raise
                    continue
                self._took(book)
                return event
        raise AssertionError("unreachable")  # pragma: no cover


_FOREIGN_APPEND_ATTEMPTS = 50
"""How often an append without the run's lease (a signal, an event of your own) is decided
again on the reloaded stream after another writer appended first."""


def _after_conflict(attempt: int) -> None:
    # A driver of fast steps commits more often than a whole run can be reloaded: retried at
    # once, an append can lose to its next commit again and again (1 of 150 lost 50 times
    # to a driver of 400 trivial steps). A random pause that grows by 2 ms an attempt (to
    # at most 100 ms) outlasts such a burst, and costs nothing when nobody else appends.
    time.sleep(random.uniform(0, 0.002 * min(attempt + 1, 50)))


_HEX = re.compile(r"[0-9a-f]+")


def _hostname() -> str:
    return socket.gethostname()


def _wait_for_signal(
    run_id: str,
    status: str,
    waits: dict[str, WaitState],
    name: str,
    wait_id: str | None,
    digest: str | None,
    signal_id: str | None,
) -> WaitState:
    """The open wait a signal ``name`` is for, or the refusal that says why there is none."""
    if signal_id is not None:
        for wait in waits.values():
            if wait.signal_id == signal_id:
                raise SignalConsumedError(
                    f"run {run_id!r}: signal id {signal_id!r} was recorded already, for signal"
                    f" {wait.signal!r} at step {wait.step_path!r} ({_signalled(wait)}): a"
                    " signal is taken once; nothing was recorded"
                )
    named = [
        w for w in waits.values() if w.signal == name and (wait_id is None or w.wait_id == wait_id)
    ]
    open_waits = [w for w in named if w.status == "waiting"]
    if status == "cancelled":
        raise NoSuchWaitError(f"run {run_id!r} is cancelled: it takes no signal")
    if status == "timed_out":
        # Stopped for good (no resume continues it), though another of its waits is open.
        late = [
            f"{w.signal!r} at step {w.step_path!r}"
            for w in waits.values()
            if w.status == "timed_out"
        ]
        raise NoSuchWaitError(
            f"run {run_id!r} is timed_out (its wait for signal {', '.join(late) or '?'} timed"
            " out): it takes no signal; fork or re-run it to try again"
        )
    if not open_waits:
        taken = [w for w in named if w.status == "signalled"]
        if taken:
            first = taken[-1]
            raise SignalConsumedError(
                f"run {run_id!r}: the wait for signal {name!r} at step {first.step_path!r} took"
                f" signal {first.signal_id} already ({_signalled(first)}): a wait takes one"
                " signal, once; this duplicate was not recorded"
            )
        timed_out = [w for w in named if w.status == "timed_out"]
        if timed_out:
            raise NoSuchWaitError(
                f"run {run_id!r}: the wait for signal {name!r} at step"
                f" {timed_out[-1].step_path!r} timed out; it takes no signal"
            )
        if wait_id is not None and any(w.status == "waiting" for w in waits.values()):
            ids = sorted(w.wait_id for w in waits.values() if w.status == "waiting")
            raise NoSuchWaitError(
                f"run {run_id!r} has no open wait {wait_id!r} for signal {name!r}; its open"
                f" waits are {', '.join(map(repr, ids))}: `little runs --waiting` lists them"
            )
        waiting = sorted({w.signal for w in waits.values() if w.status == "waiting"})
        raise NoSuchWaitError(
            f"run {run_id!r} (status {status}) does not wait for signal {name!r}"
            + (f"; it waits for {', '.join(map(repr, waiting))}" if waiting else "")
            + ": `little runs --waiting` lists what runs wait for"
        )
    if digest is not None:
        matching = [
            w
            for w in open_waits
            if w.action_digest is not None and w.action_digest.startswith(digest)
        ]
        if not matching:
            asked = open_waits[0]
            what = (
                f"{asked.action_digest} ({_action_text(asked.action)})"
                if asked.action_digest is not None
                else "no action digest"
            )
            raise StaleApprovalError(
                f"run {run_id!r}: signal {name!r} names digest {digest}, but the run waits at"
                f" step {asked.step_path!r} with {what}: the signal is stale (it approves"
                " another action); nothing was recorded"
            )
        open_waits = matching
    elif any(w.kind == "approval" for w in open_waits):
        asked = next(w for w in open_waits if w.kind == "approval")
        raise SignalDataError(
            f"run {run_id!r}: signal {name!r} approves an action, so it must name what it"
            f" approves: --digest {asked.action_digest} (digest=...) for"
            f" {_action_text(asked.action)}"
        )
    if len(open_waits) > 1:
        raise SignalError(
            f"run {run_id!r} waits for signal {name!r} at {len(open_waits)} places ("
            + ", ".join(w.wait_id for w in open_waits)
            + "): name one with wait_id=... (little signal --wait)"
        )
    wait = open_waits[0]
    if wait.deadline is not None and utc_now() >= wait.deadline:
        raise NoSuchWaitError(
            f"run {run_id!r}: the wait for signal {name!r} at step {wait.step_path!r} timed"
            f" out at {wait.deadline.isoformat()}; it takes no signal (its next resume records"
            " the timeout)"
        )
    return wait


def _signalled(wait: WaitState) -> str:
    at = wait.signalled_at.isoformat() if wait.signalled_at is not None else "?"
    return f"sent at {at} by {wait.signalled_by or '?'}"


def _action_text(action: object) -> str:
    if isinstance(action, dict):
        args = orjson.dumps(action.get("args"), option=orjson.OPT_SORT_KEYS).decode()
        return f"{action.get('tool')}({args})"
    return "?"


def _check_own_run_event(event_class: object) -> None:
    """Refuse, before anything is appended, a class that is not the caller's own RunEvent.

    The protocol's events (``StepCompleted``, ``RunCompleted``, ...) and any
    subclass of one are folded by the reducer as the protocol itself: appended
    from outside they would complete, fail or rewind a run no driver ran.
    """
    if not isinstance(event_class, type) or not issubclass(event_class, RunEvent):
        raise UnstorableEventError(
            f"{getattr(event_class, '__qualname__', repr(event_class))} is not a RunEvent:"
            " record_run_event takes an event class of your own; declare"
            " `class MyEvent(RunEvent)` with a wire_name and pass the class"
        )
    protocol = next(
        (
            c
            for c in event_class.__mro__
            if c.__module__ == RunEvent.__module__ and issubclass(c, RunEvent) and c is not RunEvent
        ),
        None,
    )
    if protocol is not None:
        raise UnstorableEventError(
            f"{event_class.__qualname__} is the library's protocol event {protocol.__qualname__}"
            " (or derives from it): only the runtime records it. Subclass RunEvent directly"
            " for an event of your own"
        )


_log = logging.getLogger("little_es.world")


class World:
    """Runs' event logs and artifacts in one place. Use as a context manager to close it.

    Open one with the functions below, or as ``World(backend)`` on a
    :class:`~little_es.backends.base.Backend` opened with :class:`LittleApplication`.
    """

    def __init__(self, backend: Backend, *, pricer: Pricer | None = None) -> None:
        app = backend.app
        assert isinstance(app, LittleApplication)
        self.backend = backend
        self.app = app
        self._book_pricer = _BookPricer(self)
        self.pricer: Pricer = self._book_pricer if pricer is None else pricer
        """Prices the model calls of every run this world folds (loads, replays, projects).

        By default: the prices recorded in this world (:meth:`set_model_price`),
        then this process's :func:`~little_es.pricing.register_model_price`
        overrides, then genai-prices, each at the call's timestamp. A pricer
        given to the constructor replaces all three."""
        self._blanks: dict[type[Aggregate], Callable[[UUID], Any]] = {
            Run: lambda sid: Run.from_stream(sid, (), self.pricer),
            HarnessSession: lambda sid: HarnessSession.from_events(sid, ()),
            OuterLoop: lambda sid: OuterLoop.from_events(sid, ()),
            WorldRecord: lambda sid: WorldRecord.from_events(sid, ()),
            PriceBook: lambda sid: PriceBook.from_events(sid, ()),
        }
        self.artifacts = backend.artifacts
        self.leases = backend.leases
        self.name = backend.name
        mapper = app.mapper
        assert isinstance(mapper, PydanticMapper)
        self._mapper = mapper
        self._select = backend.select_rows
        # The world's own stream is always chained; its record says whether others may not be.
        self._legacy = False
        self._unrecorded = False
        self._listeners: list[Callable[[Sequence[Event]], None]] = []
        self._legacy = self._open_record()
        # The one-row readers (the projections) refuse an unframed row as a whole read does.
        self._mapper.unframed_allowed = self._legacy

    def _open_record(self) -> bool:
        """Check the world is the one its backend remembers; return whether unframed rows may stand.

        Rows without a chain frame may stand in a world created before the
        chain. Raises :class:`WorldIntegrityError` when the database has lost
        the history the backend remembers outside it. A new world is recorded
        with its first save (:meth:`save`): opening one writes nothing.
        """
        # The marker first: it is written once the record is committed, so a marker read
        # here has its record in the read after it (another process may be making the
        # world's first commit right now).
        outside = self.backend.marker()
        record = self._load(WorldRecord, world_stream_id())
        if record is not None and record.created is not None:
            world_id = record.created.world_id
            if outside is None:
                self.backend.write_marker(world_id)
            elif outside != world_id:
                raise WorldIntegrityError(
                    f"world {self.name}: its database is world {world_id}, but it was opened"
                    f" where world {outside} lives: the database was replaced by another"
                    " world's; put the right one back (nothing was read or written)"
                )
            return record.created.log_format == LOG_FORMAT_UNCHAINED
        if outside is not None:
            raise WorldIntegrityError(
                f"world {self.name}: this is world {outside}, but its database holds no record"
                " of it: the database was emptied, deleted or replaced; restore it from a"
                " backup (nothing was read or written; to start a new world, use a new data"
                " directory)"
            )
        if not self.app.recorder.max_notification_id():
            if self.backend.holds_artifacts():
                raise WorldIntegrityError(
                    f"world {self.name}: its database is empty but its artifact store holds"
                    " artifacts of earlier runs: the database was emptied, deleted or replaced;"
                    " restore it from a backup (nothing was read or written). If this world"
                    " never held a run (its first run stopped before its first commit),"
                    " remove its artifacts and open it again"
                )
            self._unrecorded = True
            return False
        # A world created before worlds recorded themselves: record it now, as such.
        try:
            self.save(self._new_record(LOG_FORMAT_UNCHAINED))
        except ConcurrencyConflictError:
            # Another process opened it at the same moment and recorded it first.
            return self._open_record()
        return True

    def ensure_recorded(self) -> None:
        """Record a new world now, as its first save would, before anything is stored beside
        its database (an artifact).

        An artifact store that holds something while the database holds no record is what
        an emptied database leaves, which opening refuses (:meth:`_open_record`): a
        process opening the world between a first run's artifact and its first commit
        would be refused too.
        """
        if self._unrecorded:
            self.save(self._new_record(LOG_FORMAT_LINKED))

    def _new_record(self, log_format: Literal[1, 4]) -> WorldRecord:
        record = WorldRecord()
        record.trigger(WorldCreated, world_id=uuid4().hex, log_format=log_format)
        return record

    def __repr__(self) -> str:
        return f"World({self.name})"

    def __enter__(self) -> World:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close database connections and the artifact store."""
        self.backend.close()

    # ------------------------------------------------------------------ writing

    def save(self, *aggregates: Aggregate | DomainStream, watch: StreamWatch | None = None) -> None:
        """Append every aggregate's pending events in one transaction.

        A :class:`~little_es.aggregates.DomainStream` carries a user's eventsourcing
        aggregate's new events, committed with the step's ``StepCompleted``.
        With ``watch``, the transaction also reads the watched streams for rows past
        the versions given (:class:`~little_es.backends.base.StreamWatch`).

        Each row is framed with the stream's hash chain (:mod:`little_es.chain`).
        The commit is fsynced unless it holds only write-ahead records
        (:attr:`~little_es.events.Event.write_ahead`). Raises
        :class:`ConcurrencyConflictError` (and appends nothing) when another
        writer got to one of these streams first.
        """
        if self._unrecorded and not any(isinstance(a, WorldRecord) for a in aggregates):
            # A new world's first save records the world in the same transaction.
            aggregates = (self._new_record(LOG_FORMAT_LINKED), *aggregates)
        batches: list[tuple[Aggregate | DomainStream, list[Any]]] = [
            (a, a.collect_events()) for a in aggregates
        ]
        stored: list[StoredEvent] = []
        heads: dict[UUID, tuple[Head, Running]] = {}
        encode = self._mapper.encode_any
        for aggregate, events in batches:
            if not events:
                continue
            prev = aggregate.chain_digest
            running = aggregate.chain_running.copy()
            stream_id = aggregate.id
            for event in events:
                topic, payload = encode(event)
                version = event.originator_version
                data, prev = framed(prev, stream_id, version, topic, payload)
                feed(running, topic, data)
                stored.append(StoredEvent(stream_id, version, topic, data))
            heads[aggregate.id] = (Head(aggregate.version, prev, running.digest()), running)
        if not stored:
            return
        pending = [e for _, events in batches for e in events]
        # A user's domain event (no write_ahead flag) is a result, like the StepCompleted
        # it is committed with.
        durable = not all(getattr(type(e), "write_ahead", False) for e in pending)
        before_append(pending)
        try:
            self._insert(stored, durable, heads, aggregates, watch)
        except _RecordedElsewhereError:
            # Another world object or process recorded this new world first.
            self._unrecorded = False
            self._legacy = self._open_record()
            record_id = world_stream_id()
            batches = [(a, e) for a, e in batches if a.id != record_id]
            heads.pop(record_id, None)
            stored = [s for s in stored if s.originator_id != record_id]
            self._insert(stored, durable, heads, tuple(a for a, _ in batches), watch)
        for aggregate, _ in batches:
            if aggregate.id in heads:
                head, running = heads[aggregate.id]
                aggregate.chain_digest, aggregate.chain_running = head.digest, running
            if isinstance(aggregate, WorldRecord) and aggregate.created is not None:
                self._unrecorded = False
                self.backend.write_marker(aggregate.created.world_id)
        self._take_snapshots(batches)
        after_append(pending)
        self._notify(pending)

    def add_listener(self, listener: Callable[[Sequence[Event]], None]) -> Callable[[], None]:
        """Call ``listener`` with the events of each commit of this world object, after it.

        Returns a function that removes it. A listener is an observer (the spans of
        :mod:`little_es.contrib.otel`): it runs in the committing thread, after the
        commit, so nothing it does can undo or delay what was recorded; an exception it
        raises is logged (``little_es.world``, with its traceback) and goes no further.
        Commits of other world objects or processes are not seen: the log is where
        they are (``read_run_log``).
        """
        self._listeners.append(listener)

        def remove() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)

        return remove

    def _notify(self, events: Sequence[Event]) -> None:
        for listener in tuple(self._listeners):
            try:
                listener(events)
            except Exception:
                _log.exception(
                    "world %s: listener %r failed on a commit of %d events; the commit stands",
                    self.name,
                    listener,
                    len(events),
                )

    def _insert(
        self,
        stored: list[StoredEvent],
        durable: bool,
        heads: dict[UUID, tuple[Head, Running]],
        aggregates: Sequence[Aggregate | DomainStream],
        watch: StreamWatch | None = None,
    ) -> None:
        try:
            # The heads move with the commits that hold a result: a commit of write-ahead
            # records alone, which a power cut may lose anyway, saves a second table write.
            moved = {sid: head for sid, (head, _) in heads.items()} if durable else {}
            # The keyword only when asked for: a recorder that predates the watch sees
            # every other commit as before.
            if watch is None:
                self.app.recorder.insert_events(stored, durable=durable, heads=moved)
            else:
                self.app.recorder.insert_events(stored, durable=durable, heads=moved, watch=watch)
        except IntegrityError as exc:
            if self._unrecorded and self._load(WorldRecord, world_stream_id()) is not None:
                raise _RecordedElsewhereError from exc
            ids = ", ".join(f"{type(a).__name__} {a.id}" for a in aggregates)
            raise ConcurrencyConflictError(
                f"another writer appended to {ids} first; nothing was written: reload and retry"
            ) from exc
        except PersistenceError as exc:
            raise self._storage_error("commit", exc) from exc

    def insert_imported(
        self,
        stored: Sequence[StoredEvent],
        heads: dict[UUID, Head],
        snapshots: Sequence[StoredEvent] = (),
    ) -> None:
        """Append rows framed elsewhere (:mod:`little_es.transfer`), as stored, in one transaction.

        The rows keep their ids, versions, timestamps and chain frames, and the
        streams take ``heads``; the caller has verified every stream. ``snapshots``
        (a cache of the fold) go in in the same transaction. Raises
        :class:`ConcurrencyConflictError` (and writes nothing) when one of the
        streams got a row, or a snapshot, meanwhile. When the rows hold the world's
        own record, this world becomes the world they recorded.
        """
        if not stored:
            return
        extra: dict[str, SnapshotRows] = {}
        if snapshots and self.app.snapshots is not None:
            extra["snapshots"] = SnapshotRows(self.app.snapshots.recorder, list(snapshots))
        try:
            self.app.recorder.insert_events(list(stored), durable=True, heads=heads, **extra)
        except IntegrityError as exc:
            raise ConcurrencyConflictError(
                "another writer appended to one of the imported streams, or stored a snapshot"
                " of one, first; nothing was imported"
            ) from exc
        if any(row.originator_id == world_stream_id() for row in stored):
            self._unrecorded = False
            self._legacy = self._open_record()
            self._mapper.unframed_allowed = self._legacy

    @property
    def unframed_rows_allowed(self) -> bool:
        """Whether rows without a chain frame may stand (a world created before the chain)."""
        return self._legacy

    @property
    def recorded(self) -> bool:
        """Whether the world has recorded itself (its first save did; opening writes nothing)."""
        return not self._unrecorded

    def verified_stream(self, stream_id: UUID) -> Verified:
        """One whole stream's rows as stored, its chain and head verified, as every read does."""
        return self._verified(stream_id)

    def _take_snapshots(self, batches: list[tuple[Aggregate | DomainStream, list[Any]]]) -> None:
        """Snapshot each aggregate whose save reached ``interval * 4**k`` events (see
        :data:`RUN_SNAPSHOT_INTERVAL`)."""
        # eventsourcing's Application.save would reload the aggregate from the
        # store to snapshot it; the one in hand is at the version just saved.
        if self.app.snapshots is None:
            return
        for aggregate, events in batches:
            interval = self.app.snapshotting_intervals.get(type(aggregate))
            if (
                interval
                and events
                and isinstance(aggregate, Aggregate)
                and _reached_mark(aggregate.version, len(events), interval)
            ):
                self._snapshot(aggregate)

    def _snapshot(self, aggregate: Aggregate) -> None:
        """Store a snapshot framed like a row that links to the event it stands for, so a
        load can tell it belongs to the stream it is read with."""
        assert self.app.snapshots is not None
        snapshot = aggregate.take_snapshot()
        version = snapshot.originator_version
        topic, payload = self._mapper.encode_payload(snapshot)
        # The state and its bytes are each as large as the run: free each one as soon
        # as the next is made, or a long run's peak memory is several copies of it.
        del snapshot
        data = frame(aggregate.chain_digest, aggregate.id, version, topic, payload)
        del payload
        self.app.snapshots.recorder.insert_events([StoredEvent(aggregate.id, version, topic, data)])

    def set_model_price(
        self,
        provider: str,
        model_id: str,
        *,
        input_per_mtok: float | Decimal,
        output_per_mtok: float | Decimal,
        cached_input_per_mtok: float | Decimal | None = None,
        reasoning_per_mtok: float | Decimal | None = None,
        cache_write_per_mtok: float | Decimal | None = None,
        effective_from: datetime | None = None,
    ) -> ModelPriceSet:
        """Record a model's price (USD per million tokens) in this world, for every process.

        Appends a :class:`~little_es.events.ModelPriceSet` to the world's price
        book. It prices the calls of ``model_id`` at ``provider`` (exact id,
        case-insensitive) made from ``effective_from`` (default: now) on, in
        every fold of every process (``little report``, replays, the runs read
        model), before any :func:`~little_es.pricing.register_model_price`
        override or genai-prices; calls made earlier keep their price. Pass an
        ``effective_from`` in the past to price calls already recorded (the runs
        read model keeps the figures it folded before; ``little report`` and
        replays fold afresh). Returns the recorded event.

        Raises :class:`~little_es.errors.PricingError` for an empty name, a
        price that is negative or not a finite number, or a naive ``effective_from``.
        """
        key = normalized_model_key(provider, model_id)
        if effective_from is not None and not isinstance(effective_from, datetime):
            raise PricingError(
                f"effective_from must be a timezone-aware datetime or None, got"
                f" {type(effective_from).__name__}: e.g. datetime(2025, 1, 1, tzinfo=UTC)"
            )
        if effective_from is not None and effective_from.utcoffset() is None:
            raise PricingError(
                f"effective_from must be timezone-aware, got {effective_from!r}:"
                " pass e.g. datetime(2026, 1, 1, tzinfo=UTC)"
            )
        return self._book_pricer.set(
            provider=key[0],
            model_id=key[1],
            input_per_mtok=checked_price("input_per_mtok", input_per_mtok),
            output_per_mtok=checked_price("output_per_mtok", output_per_mtok),
            cached_input_per_mtok=None
            if cached_input_per_mtok is None
            else checked_price("cached_input_per_mtok", cached_input_per_mtok),
            reasoning_per_mtok=None
            if reasoning_per_mtok is None
            else checked_price("reasoning_per_mtok", reasoning_per_mtok),
            cache_write_per_mtok=None
            if cache_write_per_mtok is None
            else checked_price("cache_write_per_mtok", cache_write_per_mtok),
            effective_from=utc_now() if effective_from is None else effective_from.astimezone(UTC),
        )

    def model_prices(self) -> tuple[ModelPriceSet, ...]:
        """Every price recorded in this world (:meth:`set_model_price`), in the order recorded."""
        return tuple(self._book_pricer.refresh().prices.recorded)

    def record_run_event(self, run_id: str, event_class: type[E], **fields: Any) -> E:
        """Append one event of your own (a :class:`RunEvent` subclass) to a run's stream.

        Inside a driver (a step, a tool) its lease is checked first, as before
        every append the runtime makes: one that lost it records nothing. Safe from
        any process without the run's lease, as :func:`~little_es.durability.cancel_run`
        is: when another writer (the driver) appended first, the event is appended
        again after what it appended (:mod:`little_es.durability`).
        """
        # The run id (and that the run exists) first, as every entry point checks it.
        loaded = [self.load_run(run_id)]
        _check_own_run_event(event_class)

        def decide() -> tuple[Run, E]:
            run = loaded.pop() if loaded else self.load_run(run_id)
            event = run.trigger(event_class, **fields)
            check_leases()
            return run, event

        return self._append_without_lease(decide)

    def _append_without_lease(self, decide: Callable[[], tuple[Run, E]]) -> E:
        """Save the run ``decide()`` loaded and appended to; when another writer (the driver)
        appended first, ``decide()`` again on the stream as it is now (the protocol of
        :mod:`little_es.durability` for writers without the run's lease)."""
        for attempt in range(_FOREIGN_APPEND_ATTEMPTS):
            run, event = decide()
            try:
                self.save(run)
            except ConcurrencyConflictError:
                if attempt + 1 == _FOREIGN_APPEND_ATTEMPTS:
                    raise
                _after_conflict(attempt)
                continue
            return event
        raise AssertionError("unreachable")  # pragma: no cover

    def signal(
        self,
        run_id: str,
        name: str,
        data: Any = None,
        *,
        digest: str | None = None,
        signal_id: str | None = None,
        sent_by: str | None = None,
        wait_id: str | None = None,
    ) -> SignalReceived:
        """Send signal ``name`` with ``data`` to the run ``run_id``, which waits for it
        (``RunWaiting``); return the recorded ``SignalReceived``.

        The next driver of the run (``run_workflow``, ``little resume``) continues from
        the wait with the data as the step's output (an ``ask_human`` call's result; an
        approval lets its tool run or, declined, fails the call). Run from any process:
        it takes no lease and is safe under the stream's optimistic concurrency.

        Refused, with nothing recorded (a :class:`~little_es.errors.SignalError`):
        data that does not validate against the wait's pydantic model
        (:class:`~little_es.errors.SignalDataError`), a run that does not wait for
        ``name`` (:class:`~little_es.errors.NoSuchWaitError`), a duplicate (the wait
        took a signal already, or ``signal_id`` was used:
        :class:`~little_es.errors.SignalConsumedError`, naming the first), and an
        approval whose ``digest`` is not that of the action
        the run waits to have approved (:class:`~little_es.errors.StaleApprovalError`;
        an approval must name it, a prefix of at least 12 hex digits will do; ``little
        runs --waiting`` shows it). ``wait_id`` picks one of several waits of one name.
        """
        validate_run_id(run_id)
        if not isinstance(name, str) or not name:
            raise SignalError(f"signal name must be a non-empty string, got {name!r}")
        for label, value in (("digest", digest), ("signal_id", signal_id), ("sent_by", sent_by)):
            if value is not None and (not isinstance(value, str) or not value):
                raise SignalError(f"{label} must be a non-empty string or None, got {value!r}")
        if digest is not None:
            digest = digest.lower()  # as sha256 digests are written, whoever copied it
        if digest is not None and (len(digest) < 12 or not _HEX.fullmatch(digest)):
            raise StaleApprovalError(
                f"digest {digest!r} is not a digest: give the action digest the run waits for"
                " (64 hex digits, or a prefix of at least 12), as `little runs --waiting` shows"
            )
        where = f"run {run_id!r} signal {name!r}"

        def decide() -> tuple[Run, SignalReceived]:
            # Again after another writer appended: a second signal for the wait is then
            # refused as a duplicate.
            nonlocal where
            run = self.load_run(run_id)
            wait = _wait_for_signal(
                run_id, run.fold.status, run.fold.waits, name, wait_id, digest, signal_id
            )
            where = f"run {run_id!r} signal {name!r} (step {wait.step_path!r})"
            clean = validate_signal_data(
                where, import_model(wait.model_ref), wait.schema_digest, data
            )
            event = run.trigger(
                SignalReceived,
                wait_id=wait.wait_id,
                signal=name,
                data=clean,
                signal_id=signal_id or uuid4().hex,
                sent_by=sent_by or f"pid {os.getpid()} on {_hostname()}",
                action_digest=wait.action_digest,
            )
            return run, event

        try:
            return self._append_without_lease(decide)
        except EventPayloadError as exc:
            # Valid for the model, not for the log (NaN, infinities): refused, unrecorded.
            raise SignalDataError(f"{where}: {exc}") from exc

    def aggregates(self) -> StepAggregates:
        """A unit of work over your eventsourcing aggregates outside a step (a step has
        ``ctx.aggregates``): ``get``, ``add``, then :meth:`commit_aggregates`."""
        return StepAggregates(self.load_domain_stream)

    def commit_aggregates(self, unit: StepAggregates) -> int:
        """Append the new events of the aggregates ``unit`` holds, in one transaction; return
        how many. Raises :class:`~little_es.errors.AggregateConflictError` (nothing written)
        when another writer changed one of them since it was read."""
        if not isinstance(unit, StepAggregates):
            raise AggregateArgumentError(
                f"commit_aggregates needs the unit from world.aggregates(), got"
                f" {type(unit).__name__}"
            )
        changes = unit.take_changes()
        try:
            self.save(*changes)
        except ConcurrencyConflictError:
            raise AggregateConflictError(
                "another writer changed "
                + ", ".join(f"{type(c.aggregate).__qualname__} {c.id}" for c in changes)
                + " first; nothing was written: read them again and retry"
            ) from None
        return sum(len(c.events) for c in changes)

    # ------------------------------------------------------------------ reading

    def read_stream(self, stream_id: UUID, *, after: int | None = None) -> list[Event]:
        """Every event of one stream (after version ``after``), in order, its chain verified."""
        with gc_paused():
            events, _ = self._read_stream(stream_id, frozenset(), after=after or 0)
            return events

    def read_known_events(self, stream_id: UUID) -> tuple[list[Event], tuple[str, ...]]:
        """:meth:`read_stream` of a stream that may hold events of a class this process has
        not imported (``little verify`` run without the user's modules).

        The whole chain and head are verified as every read verifies them; the
        events of a registered class are decoded and returned; the others are
        left undecoded, and their topics returned in the order first met. A
        reader that folds the stream must use :meth:`read_stream`, which refuses
        them.
        """
        with gc_paused():
            events: list[Event] = []
            unknown: dict[str, None] = {}
            for version, topic, state in self._verified(stream_id).rows:
                if event_class_for(topic) is None:
                    unknown[topic] = None
                else:
                    events.append(
                        self._mapper.decode_payload(stream_id, version, topic, payload_of(state))
                    )
            return events, tuple(unknown)

    def _verified(self, stream_id: UUID) -> Verified:
        """A whole stream, its chain and head verified (:func:`~little_es.chain.verify_stream`).

        The rows are read before the head, which is written in the same
        transaction as the rows it covers, so the head can only be as far as
        the rows or further. Further means a writer committed between the two
        reads, or rows were deleted: the two are read again until they agree
        or stop changing, and only rows that stay missing are a cut-off tail.
        """
        try:
            rows = self._select(stream_id, None)
            head = self.backend.stream_head(stream_id)
            for _ in range(_HEAD_REREADS):
                if head is None or (rows[-1][0] if rows else 0) >= head.version:
                    break
                again = self._select(stream_id, None)
                head_again = self.backend.stream_head(stream_id)
                if head_again == head and len(again) == len(rows):
                    break
                rows, head = again, head_again
        except PersistenceError as exc:
            raise self._storage_error("read", exc) from exc
        return verify_stream(stream_id, rows, head, legacy=self._legacy)

    def _read_stream(
        self, stream_id: UUID, skip: frozenset[type[Event]], *, after: int = 0
    ) -> tuple[list[Event], int]:
        """The stream's events after version ``after``, leaving those of a class in ``skip``
        undecoded (never the last).

        The whole stream is verified, from its first row. Returns the decoded
        events and how many were skipped. An unknown topic is never skipped, so
        it is refused all the same.
        """
        rows = self._verified(stream_id).rows[after:]
        decode = self._mapper.decode_payload
        if not skip or not rows:
            return [decode(stream_id, v, topic, payload_of(state)) for v, topic, state in rows], 0
        # By topic: an unknown topic is never in the set, so it is decoded (and refused).
        skipped_topics = {cls.wire_name for cls in skip}
        *body, (last_version, last_topic, last_state) = rows
        events = [
            decode(stream_id, v, topic, payload_of(state))
            for v, topic, state in body
            if topic not in skipped_topics
        ]
        events.append(decode(stream_id, last_version, last_topic, payload_of(last_state)))
        return events, len(rows) - len(events)

    def load_domain_stream(self, stream_id: UUID) -> LoadedDomainStream:
        """A user's eventsourcing aggregate's stream (:mod:`little_es.aggregates`): its domain
        events decoded (none when it has no rows) and its chain verified, as every read is.

        Raises :class:`~little_es.errors.UnknownEventTypeError` for a stream of little_es's
        own events (a run, a session): those are not a user's aggregates.
        """
        with gc_paused():
            checked = self._verified(stream_id)
            events = []
            for version, topic, data in checked.rows:
                if not is_domain_topic(topic) or event_class_for(topic) is not None:
                    raise UnknownEventTypeError(
                        f"stream {stream_id} holds little_es's own {topic!r} events, not a"
                        " user's aggregate: use another aggregate id"
                    )
                events.append(decode_domain_event(stream_id, version, topic, payload_of(data)))
            running = checked.running if checked.rows else seed(stream_id)
            return LoadedDomainStream(events, checked.digest, running)

    def check_domain_stream(self, stream_id: UUID) -> None:
        """Verify a user's aggregate's stream (its chain and head, each payload a JSON
        object) without importing the user's classes: ``little verify``'s check."""
        for version, topic, data in self._verified(stream_id).rows:
            check_domain_payload(stream_id, version, topic, payload_of(data))

    def has_events_after(self, stream_id: UUID, version: int) -> bool:
        """Whether the stream holds an event after ``version``: one indexed query, no read of
        the stream (a driver asks it before each step and call, to see a foreign append)."""
        try:
            return self.backend.has_events_after(stream_id, version)
        except PersistenceError as exc:
            raise self._storage_error("read", exc) from exc

    def _storage_error(self, failed: str, exc: PersistenceError) -> WorldStorageError:
        """What to raise for the database's failure ``exc`` of a read or a commit (``failed``):
        never the step's failure (see :class:`~little_es.errors.WorldStorageError`)."""
        said = " ".join(str(exc).split()) or type(exc).__name__
        lowered = said.lower()
        if any(s in lowered for s in _FULL_DISK):
            hint = "free disk space where the world is stored"
        elif "locked" in lowered or "lock timeout" in lowered:
            hint = (
                "another process held the database's write lock for too long (a backup, an"
                " import, an open sqlite3 shell?): let it finish"
            )
        elif "i/o error" in lowered:
            hint = (
                "check the disk where the world is stored (space, quotas, a file size limit,"
                " errors in the system log)"
            )
        else:
            hint = "check that the database is up and reachable"
        what = (
            "a commit (its records may or may not be in the log)"
            if failed == "commit"
            else "a read"
        )
        return WorldStorageError(
            f"world {self.name}: the database failed {what}: {said}. Nothing more ran, and"
            " nothing was recorded as failed: the step or call under way stays in flight."
            f" To go on, {hint}, then resume the run (run_workflow with the same run id):"
            " it continues from what the log holds"
        )

    def select_stored(self, stream_id: UUID) -> Sequence[StoredEvent]:
        """The raw stored rows of one stream (for exports and benchmarks)."""
        return self.app.recorder.select_events(stream_id)

    def run_exists(self, run_id: str) -> bool:
        """Whether ``run_id`` has a ``Run`` stream in this world.

        Raises :class:`LogTamperedError` for a run whose rows are gone while its
        head says they were written: it existed, and must not be taken for new.
        """
        stream_id = run_stream_id(run_id)
        try:
            if self.app.recorder.select_events(stream_id, limit=1):
                return True
            head = self.backend.stream_head(stream_id)
        except PersistenceError as exc:
            raise self._storage_error("read", exc) from exc
        if head is not None:
            verify_stream(stream_id, (), head, legacy=self._legacy)  # raises: rows deleted
        return False

    def read_run_log(self, run_id: str) -> list[Event]:
        """The run's event log: its ``Run`` stream merged with its harness sessions' streams.

        Ordered by timestamp (ties: the run stream first, then stream version),
        each session after the ``StepStarted`` that names it (:func:`merge_run_log`).
        Sub-runs are other runs and are never read here.
        """
        return self.read_run_log_skipping(run_id, frozenset()).events

    def read_run_log_skipping(self, run_id: str, skip: frozenset[type[Event]]) -> RunLog:
        """:meth:`read_run_log`, leaving harness events of a class in ``skip`` undecoded.

        For a reader that does not need them (:func:`~little_es.replay.replay_run`
        folds with a reducer that only counts them): the rest of the log, in
        the same order, and how many were skipped. The run stream and each
        stream's last event are always decoded; an unknown topic is still refused.
        """
        validate_run_id(run_id)
        # Paused for the merge too: it keeps every decoded event alive.
        with gc_paused():
            try:
                run_events, _ = self._read_stream(run_stream_id(run_id), frozenset())
                if not run_events:
                    raise RunNotFoundError(run_id, self.name)
                named: dict[UUID, datetime] = {}
                for e in run_events:
                    if isinstance(e, StepStarted) and e.session_id is not None:
                        named.setdefault(e.session_id, e.timestamp)
                sessions = []
                skipped = 0
                for session_id in named:
                    events, n = self._read_stream(session_id, skip)
                    sessions.append(events)
                    skipped += n
            except EventLogError as exc:
                raise type(exc)(f"run {run_id!r} in world {self.name}: {exc}") from exc
            return RunLog(merge_run_log(run_events, sessions, named), skipped, self.pricer)

    def load_run(self, run_id: str) -> Run:
        """The ``Run`` aggregate (from its latest snapshot and later events)."""
        found = self._load(Run, run_stream_id(run_id))
        if found is None:
            raise RunNotFoundError(run_id, self.name)
        return found

    def load_session(self, session_id: UUID) -> HarnessSession | None:
        """A harness session, or None if it was never started."""
        return self._load(HarnessSession, session_id)

    def load_price_book(self) -> PriceBook | None:
        """The prices recorded in this world, or None before the first."""
        return self._load(PriceBook, price_book_stream_id())

    def load_outer_loop(self, outer_loop_id: str) -> OuterLoop | None:
        """An outer loop, or None."""
        return self._load(OuterLoop, outer_loop_stream_id(outer_loop_id))

    def outer_loops(self) -> Iterator[OuterLoop]:
        """Every outer loop of the world, in the order they started."""
        recorder = self.app.recorder
        start: int | None = None
        while page := recorder.select_notifications(
            start=start,
            limit=500,
            topics=[OuterLoopStarted.wire_name],
            inclusive_of_start=start is None,
        ):
            for notification in page:
                sid = notification.originator_id
                loop = self._load(OuterLoop, sid if isinstance(sid, UUID) else UUID(str(sid)))
                if loop is not None:
                    yield loop
            start = page[-1].id

    def _load(self, cls: type[A], stream_id: UUID) -> A | None:
        """The aggregate folded from its latest snapshot (if any) and later events, verified.

        The whole stream is read and verified either way (its raw rows: only
        those after the snapshot are decoded). A snapshot stands for the event
        at its version: its frame's ``prev`` must be that event's digest.
        """
        with gc_paused():
            checked = self._verified(stream_id)
            rows = checked.rows
            if not rows:
                return None
            aggregate: A = self._blanks[cls](stream_id)
            snapshot = self._latest_snapshot(stream_id, checked)
            decode = self._mapper.decode_payload
            if snapshot is not None:
                aggregate.mutate(snapshot)
                if isinstance(aggregate, Run):
                    self._read_snapshot_outputs(aggregate, snapshot, rows)
                rows = rows[snapshot.originator_version :]
            for version, topic, data in rows:
                aggregate.mutate(decode(stream_id, version, topic, payload_of(data)))
            aggregate.chain_digest = checked.digest
            aggregate.chain_running = checked.running
            return aggregate

    def catch_up(self, aggregate: Aggregate) -> None:
        """Fold into ``aggregate`` the events appended to its stream since its version.

        The whole stream is verified, as by every read, and the aggregate takes
        its chain digests, so its next save links to the stored end of the stream.
        """
        with gc_paused():
            checked = self._verified(aggregate.id)
            decode = self._mapper.decode_payload
            for version, topic, data in checked.rows[aggregate.version :]:
                aggregate.mutate(decode(aggregate.id, version, topic, payload_of(data)))
            aggregate.chain_digest = checked.digest
            aggregate.chain_running = checked.running

    def _read_snapshot_outputs(self, run: Run, snapshot: Snapshot, rows: Sequence[Row]) -> None:
        """Read back the outputs ``snapshot`` names by version from the verified ``rows``
        before it (a snapshot does not copy them: :meth:`Run.snapshot_state`)."""
        named = run.outputs_to_read()
        at = snapshot.originator_version
        decode = self._mapper.decode_payload
        completions: list[tuple[str, Event]] = []
        for path, version in named.items() if isinstance(named, dict) else ():
            if type(version) is not int or not 1 <= version <= at:
                raise LogTamperedError(
                    f"stream {run.id}: the snapshot at version {at} names version {version!r}"
                    f" for the output of step {path!r}, which is not a row before it; the"
                    " snapshot was replaced or edited: restore the world from a backup"
                )
            _, topic, data = rows[version - 1]
            completions.append((path, decode(run.id, version, topic, payload_of(data))))
        run.read_outputs(completions)

    def decode_snapshot(self, stream_id: UUID, version: int, topic: str, data: bytes) -> Snapshot:
        """One framed row of the snapshot store decoded and validated as a load reads it."""
        event = self._mapper.decode_row(stream_id, version, topic, data)
        if not isinstance(event, Snapshot):
            raise EventPayloadError(
                f"stream {stream_id}: the snapshot at version {version} holds a {topic!r}"
                " event, not a snapshot; the snapshot was replaced or edited: restore the world"
                " from a backup"
            )
        return event

    def _latest_snapshot(self, stream_id: UUID, checked: Verified) -> Snapshot | None:
        """The latest snapshot of a verified stream, checked to stand on it; None without one.

        A snapshot stored before the chain has no frame: it is passed over (a
        snapshot is a cache of the fold, the events are the record).
        """
        if self.app.snapshots is None:
            return None
        found = self.app.snapshots.recorder.select_events(stream_id, desc=True, limit=1)
        if not found or not is_framed(found[0].state):
            return None
        row = found[0]
        version = row.originator_version
        event = self.decode_snapshot(stream_id, version, row.topic, row.state)
        if version > len(checked.rows):
            # Taken after the rows were read (by a concurrent writer): fold from the events.
            return None
        stood_on = checked.rows[version - 1][2]
        if not is_framed(stood_on) or not links(row_digest(stood_on), row_prev(row.state)):
            raise LogTamperedError(
                f"stream {stream_id}: the snapshot at version {version} does not stand on the"
                " stored event of that version (their digests differ); the snapshot was"
                " replaced or edited: restore the world from a backup"
            )
        return event

    def run_lease(self, run_id: str, *, what: str | None = None) -> AbstractContextManager[Lease]:
        """Hold the exclusive lease on ``run_id`` (:class:`~little_es.backends.base.RunLeases`);
        ``what`` names the holder in the errors of a lost lease (default ``run 'run_id'``)."""
        return self.leases.hold(validate_run_id(run_id), what=what)

    def lease_holder(self, run_id: str) -> str | None:
        """Who holds the lease on ``run_id`` (pid and host), or None when no process does."""
        return self.leases.holder(validate_run_id(run_id))

    def break_lease(self, run_id: str) -> str | None:
        """Take the lease on ``run_id`` from a stuck holder (``little unlock --force``).

        Returns who held it, or None when nobody did. See
        :meth:`~little_es.backends.base.RunLeases.break_lease`.
        """
        return self.leases.break_lease(validate_run_id(run_id))


# ---------------------------------------------------------------------- opening


def memory_world() -> World:
    """A world in this process's memory, gone when it exits. For tests."""
    return World(MemoryBackend(LittleApplication))


def local_world(
    data_dir: str | os.PathLike[str] = DEFAULT_DATA_DIR, *, synchronous: Synchronous = "full"
) -> World:
    """The embedded world: ``{data_dir}/events.sqlite3`` plus ``{data_dir}/artifacts/``.

    ``synchronous`` is the fsync policy (:mod:`little_es.backends.sqlite`):
    ``"full"`` survives power cuts, ``"normal"`` survives killed processes only
    and commits several times faster.
    """
    if synchronous not in ("full", "normal"):
        raise WorldConfigError(
            f"synchronous must be 'full' or 'normal', got {synchronous!r}"
            " (see little_es.backends.sqlite)"
        )
    if not isinstance(data_dir, str | os.PathLike):
        raise WorldConfigError(
            f"data_dir must be a path (str or pathlib.Path), got {type(data_dir).__name__}:"
            " pass the world's directory, e.g. local_world('.little-workflow')"
        )
    if not str(data_dir).strip():
        raise WorldConfigError(
            "data_dir is empty: pass the world's directory, e.g. local_world('.little-workflow')"
        )
    root = Path(data_dir)
    if "\x00" in str(root):
        raise WorldConfigError("data_dir contains a NUL byte")
    if root.exists() and not root.is_dir():
        raise WorldConfigError(f"data_dir {str(root)!r} exists and is not a directory")
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise WorldConfigError(f"cannot create data_dir {str(root)!r}: {exc}") from exc
    try:
        backend = SQLiteBackend(LittleApplication, root, synchronous=synchronous)
    except PersistenceError as exc:
        hint = (
            "free disk space there"
            if any(s in str(exc).lower() for s in _FULL_DISK)
            else "check the directory's permissions and disk"
        )
        raise WorldConfigError(
            f"cannot open SQLite world sqlite:///{root.resolve()}: {exc}: {hint}"
        ) from exc
    return World(backend)


def postgres_world(dsn: str, *, schema: str = "") -> World:
    """A world in a PostgreSQL database (``postgresql://user:pw@host:port/dbname``)."""
    parts = urlsplit(dsn)
    if parts.scheme not in ("postgresql", "postgres"):
        raise WorldConfigError(f"not a postgresql:// URL: {_redact(dsn)}")
    dbname = unquote(parts.path.lstrip("/"))
    if not dbname:
        raise WorldConfigError(f"the URL names no database: {_redact(dsn)} (add /dbname)")
    query = parse_qs(parts.query)
    schema = schema or query.get("schema", [""])[0]
    if schema and re.fullmatch(r"[a-z_][a-z0-9_]*", schema) is None:
        raise WorldConfigError(f"invalid schema name {schema!r}")
    try:
        # Here, not at the top: psycopg is an optional extra, and importing it
        # would slow every start of a SQLite-only process.
        from little_es.backends.postgres import PostgresBackend

        backend = PostgresBackend(
            LittleApplication,
            dbname=dbname,
            host=parts.hostname or "127.0.0.1",
            port=parts.port or 5432,
            user=unquote(parts.username or "postgres"),
            password=unquote(parts.password or ""),
            schema=schema,
            name=_redact(dsn),
        )
    except Exception as exc:
        raise WorldConfigError(f"cannot open PostgreSQL world {_redact(dsn)}: {exc}") from exc
    return World(backend)


MYSQL_SCHEMES = ("mysql+pymysql", "mariadb+pymysql")


def mysql_world(url: str) -> World:
    """A world in a MariaDB or MySQL database (``mysql+pymysql://user:pw@host:port/dbname``).

    The database must exist. ``?synchronous=normal`` accepts a server whose
    settings flush commits only about once a second (see
    :mod:`little_es.backends.mysql`); by default such a server is refused.
    """
    if not isinstance(url, str):
        raise WorldConfigError(f"a world URL is a string, got {type(url).__name__}")
    parts = urlsplit(url)
    if parts.scheme not in MYSQL_SCHEMES:
        raise WorldConfigError(
            f"not a mysql+pymysql:// URL: {_redact(url)} (use mysql+pymysql://user@host/dbname)"
        )
    database = unquote(parts.path.lstrip("/"))
    if not database:
        raise WorldConfigError(f"the URL names no database: {_redact(url)} (add /dbname)")
    if re.fullmatch(r"[A-Za-z0-9_$]{1,64}", database) is None:
        raise WorldConfigError(
            f"invalid database name {database!r}: letters, digits, _ and $, at most 64"
        )
    options = parse_qs(parts.query)
    unknown = sorted(set(options) - {"synchronous"})
    if unknown:
        raise WorldConfigError(f"unknown mysql+pymysql:// URL options {unknown}: only synchronous")
    synchronous = options.get("synchronous", ["full"])[0]
    if synchronous not in ("full", "normal"):
        raise WorldConfigError(
            f"synchronous must be 'full' or 'normal', got {synchronous!r}"
            " (see little_es.backends.mysql)"
        )
    try:
        # Here, not at the top: SQLAlchemy and PyMySQL are an optional extra.
        from little_es.backends.mysql import ConnectionInfo, MySQLBackend
    except ImportError as exc:
        raise WorldConfigError(
            f"cannot open MySQL world {_redact(url)}: {exc}; install little-es[mysql]"
        ) from exc
    try:
        backend = MySQLBackend(
            LittleApplication,
            info=ConnectionInfo(
                host=parts.hostname or "127.0.0.1",
                port=parts.port or 3306,
                user=unquote(parts.username or "root"),
                password=unquote(parts.password or ""),
                database=database,
            ),
            synchronous=synchronous,  # type: ignore[arg-type]
            name=_redact(url),
        )
    except WorldConfigError:
        raise
    except Exception as exc:
        raise WorldConfigError(f"cannot open MySQL world {_redact(url)}: {exc}") from exc
    return World(backend)


def open_world(url: str | None = None) -> World:
    """Open the world a URL names; with no URL, ``$LITTLE_ES_WORLD`` or ``./.little-workflow``.

    ``sqlite:///relative/dir``, ``sqlite:////absolute/dir`` (``?synchronous=normal``
    for :func:`local_world`'s option), ``postgresql://...``,
    ``mysql+pymysql://...`` (:func:`mysql_world`), ``memory://``.
    """
    if url is not None and not isinstance(url, str):
        raise WorldConfigError(
            f"a world URL is a string, got {type(url).__name__}: pass e.g."
            " 'sqlite:///path/to/dir', 'postgresql://...' or 'memory://'"
        )
    if url is not None and not url.strip():
        # Most likely a setting that was never filled in: not the default world, silently.
        raise WorldConfigError(
            "the world URL is empty: pass e.g. 'sqlite:///path/to/dir', or None for"
            f" ${WORLD_ENV_VAR} (else {DEFAULT_DATA_DIR!r})"
        )
    url = url or os.environ.get(WORLD_ENV_VAR) or f"sqlite:///{DEFAULT_DATA_DIR}"
    if url.startswith("memory:"):
        return memory_world()
    if url.startswith("sqlite:///"):
        path, _, query = url[len("sqlite:///") :].partition("?")
        if not path:
            raise WorldConfigError("sqlite:/// URL names no directory: use sqlite:///path/to/dir")
        options = parse_qs(query)
        unknown = sorted(set(options) - {"synchronous"})
        if unknown:
            raise WorldConfigError(f"unknown sqlite:/// URL options {unknown}: only synchronous")
        synchronous = options.get("synchronous", ["full"])[0]
        return local_world(path, synchronous=synchronous)  # type: ignore[arg-type]
    if url.startswith(("postgresql://", "postgres://")):
        return postgres_world(url)
    if url.startswith(tuple(f"{scheme}://" for scheme in MYSQL_SCHEMES)):
        return mysql_world(url)
    raise WorldConfigError(
        f"unknown world URL {_redact(url)!r}: use sqlite:///dir, postgresql://...,"
        " mysql+pymysql://..., or memory://"
    )


def _redact(url: str) -> str:
    return re.sub(r"://([^:/@]+):[^@]*@", r"://\1:***@", url)

"""``little verify``: walk a world's streams and artifacts and say what holds.

:func:`verify_world` reads every stream of one run (its run stream, harness
sessions and sub-runs, recursively) or of the whole world (every stream in the
log, and every head the backend keeps), the way the runtime and replay read
them: the hash chain and the head of each stream (:mod:`little_es.chain`),
every payload decoded and validated, every artifact an event references
re-hashed and checked to belong to the run that references it. Nothing is
written. A stream holding events of a class the process has not imported (a
user's :class:`~little_es.events.RunEvent`, its module not imported) is not
called broken: its chain, head and rows are checked and the rest of its events
decoded, and the report says which were not (``little --import MODULE verify``).
Resume and :func:`~little_es.replay.replay_run` make the same checks
on the streams they read; this is how to check a world before trusting it, or
to find which streams a refusal came from.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from uuid import UUID

from pydantic import BaseModel, ConfigDict

from little_es.aggregates import is_domain_topic
from little_es.chain import check_rows, is_framed, row_digest
from little_es.codec import PydanticMapper
from little_es.errors import (
    ArtifactError,
    EventLogError,
    RunNotFoundError,
    UnknownEventTypeError,
)
from little_es.events import (
    Event,
    ModelPriceSet,
    OuterLoopStarted,
    RunForked,
    RunStarted,
    SessionStarted,
    StepStarted,
    SubRunReserved,
    WorldCreated,
    event_class_for,
)
from little_es.ids import run_stream_id, validate_run_id
from little_es.values import ArtifactRef
from little_es.world import World

__all__ = ["ArtifactCheck", "StreamCheck", "VerifyReport", "verify_world"]


class StreamCheck(BaseModel):
    """One stream as :func:`verify_world` found it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    stream_id: UUID
    kind: str
    """``run``, ``session``, ``outer_loop``, ``world``, ``prices``, ``aggregate`` (a user's
    eventsourcing aggregate, :mod:`little_es.aggregates`) or ``stream``."""
    name: str
    """The run id, ``run_id/step_path#attempt`` of a session, the loop id, an aggregate's
    class topic, or the stream id."""
    events: int
    """How many rows it has."""
    problem: str | None = None
    """What does not hold (None: the stream holds)."""
    undecoded: tuple[str, ...] = ()
    """The topics of the events this process could not decode: their classes are not
    imported (the chain, the head and every row's digest were still checked)."""


class ArtifactCheck(BaseModel):
    """One artifact reference as :func:`verify_world` found it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    artifact_id: str
    run_id: str
    step_path: str
    size: int
    problem: str | None = None


class VerifyReport(BaseModel):
    """What :func:`verify_world` checked, and what did not hold."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    world: str
    streams: tuple[StreamCheck, ...]
    artifacts: tuple[ArtifactCheck, ...]

    @property
    def ok(self) -> bool:
        """Whether every stream and every artifact holds, and every event was decoded."""
        return self.problems == 0 and self.undecoded == 0

    @property
    def undecoded(self) -> int:
        """How many streams hold events this process could not decode (their classes not
        imported), their chains holding: not known to be broken, nor fully checked."""
        return sum(s.problem is None and bool(s.undecoded) for s in self.streams)

    @property
    def problems(self) -> int:
        """How many streams and artifacts do not hold."""
        return sum(s.problem is not None for s in self.streams) + sum(
            a.problem is not None for a in self.artifacts
        )


def verify_world(
    world: World,
    run_id: str | None = None,
    *,
    progress: Callable[[int, int], None] | None = None,
) -> VerifyReport:
    """Check one run (with its sessions and sub-runs) or, without ``run_id``, the whole world.

    Raises :class:`~little_es.errors.RunNotFoundError` when ``run_id`` has no
    stream and no head in the world; every other finding is in the report.
    ``progress``, when given, is called with (streams checked, streams to check)
    as a whole-world check goes (``little verify --all`` shows it as a bar).
    """
    if not isinstance(world, World):
        raise TypeError(
            f"verify_world needs a World (from open_world()), got {type(world).__name__}"
        )
    if progress is not None and not callable(progress):
        raise TypeError(f"progress must be a callable(done, total), got {progress!r}")
    checker = _Checker(world, progress)
    if run_id is None:
        checker.check_all()
    else:
        validate_run_id(run_id)
        stream = run_stream_id(run_id)
        if (
            not world.backend.select_rows(stream, None)
            and world.backend.stream_head(stream) is None
        ):
            raise RunNotFoundError(run_id, world.name)
        checker.check_run(run_id)
    return VerifyReport(
        world=world.name,
        streams=tuple(checker.streams.values()),
        artifacts=tuple(checker.artifacts.values()),
    )


class _Checker:
    def __init__(self, world: World, progress: Callable[[int, int], None] | None) -> None:
        self.world = world
        self.progress = progress
        self.streams: dict[UUID, StreamCheck] = {}
        self.artifacts: dict[tuple[str, str, str], ArtifactCheck] = {}

    def check_all(self) -> None:
        in_log = dict.fromkeys(_streams_in_log(self.world))
        # A head without rows is a stream deleted whole: check those too.
        headed = [s for s in self.world.backend.stream_heads() if s not in in_log]
        every = [*in_log, *headed]
        for done, stream_id in enumerate(every, start=1):
            self.check_stream(stream_id, owner=None)
            if self.progress is not None:
                self.progress(done, len(every))

    def check_run(self, run_id: str) -> None:
        events = self.check_stream(run_stream_id(run_id), owner=run_id)
        if events and isinstance(events[0], RunForked):
            self._check_fork(events[0])
        for event in events:
            if isinstance(event, StepStarted) and event.session_id is not None:
                self.check_stream(event.session_id, owner=run_id)
            # A sub-run reserved but never started has no stream.
            elif isinstance(event, SubRunReserved) and _exists(
                self.world, run_stream_id(event.sub_run_id)
            ):
                self.check_run(event.sub_run_id)

    def _check_fork(self, forked: RunForked) -> None:
        """A fork's copied prefix is still the origin's history: the origin's rows it was
        copied from carry the digests ``RunForked`` pinned (an origin since edited, or
        replaced, no longer does). An origin that is not in this world is not checked."""
        origin = forked.origin
        pinned = [
            (run_stream_id(origin.origin_run_id), origin.origin_version, origin.origin_digest)
        ]
        pinned += [
            (s.origin_session_id, s.origin_version, s.origin_digest) for s in origin.sessions
        ]
        if not _exists(self.world, pinned[0][0]):
            return
        problems = []
        for stream_id, version, expected in pinned:
            rows = self.world.backend.select_rows(stream_id, None)
            found = rows[version - 1][2] if len(rows) >= version else None
            actual = row_digest(found).hex() if found is not None and is_framed(found) else ""
            if found is None or (expected and actual != expected):
                problems.append(
                    f"origin stream {stream_id} version {version} is not the row the fork"
                    f" copied (digest {expected[:12] or '-'}, now {actual[:12] or 'missing'})"
                )
        if problems:
            own = run_stream_id(forked.run_id)
            check = self.streams[own]
            self.streams[own] = check.model_copy(
                update={
                    "problem": f"a fork of {origin.origin_run_id!r} at {origin.at!r} whose"
                    " origin no longer holds the history it copied: " + "; ".join(problems)
                }
            )

    def check_stream(self, stream_id: UUID, *, owner: str | None) -> list[Event]:
        """Read one stream as the runtime would; record what holds. Returns its events."""
        if stream_id in self.streams:
            return []
        rows = self.world.backend.select_rows(stream_id, None)
        count = len(rows)
        if rows and event_class_for(rows[0][1]) is None and is_domain_topic(rows[0][1]):
            self._check_domain_stream(stream_id, rows[0][1], count)
            return []
        undecoded: tuple[str, ...] = ()
        try:
            try:
                events = self.world.read_stream(stream_id)
            except UnknownEventTypeError:
                # Not a break: the stream is checked as far as this process can read it.
                events, undecoded = self.world.read_known_events(stream_id)
            # Beyond what a read checks: every row's own digest and link, frames included.
            check_rows(stream_id, self.world.backend.select_rows(stream_id, None))
            if not undecoded and events and isinstance(events[0], RunStarted | RunForked):
                # Loaded as a resume loads it, so its latest snapshot is checked too.
                self.world.load_run(events[0].run_id)
        except EventLogError as exc:
            kind, name = identify_stream(stream_id, self._first_event(stream_id))
            self.streams[stream_id] = StreamCheck(
                stream_id=stream_id,
                kind=kind,
                name=name,
                events=count,
                problem=" ".join(str(exc).split()),
            )
            return []
        kind, name = identify_stream(stream_id, events[0] if events else None)
        self.streams[stream_id] = StreamCheck(
            stream_id=stream_id, kind=kind, name=name, events=count, undecoded=undecoded
        )
        run_id = owner or _run_of(events)
        for event in events:
            for ref in artifact_refs(event):
                self._check_artifact(ref, run_id)
        return events

    def _check_domain_stream(self, stream_id: UUID, first_topic: str, count: int) -> None:
        """A user's aggregate: its chain, head and rows checked, each payload a JSON object
        (its classes are the user's, and need not be importable here)."""
        problem = None
        try:
            self.world.check_domain_stream(stream_id)
            check_rows(stream_id, self.world.backend.select_rows(stream_id, None))
        except EventLogError as exc:
            problem = " ".join(str(exc).split())
        self.streams[stream_id] = StreamCheck(
            stream_id=stream_id,
            kind="aggregate",
            name=first_topic.rsplit(".", 1)[0],
            events=count,
            problem=problem,
        )

    def _first_event(self, stream_id: UUID) -> Event | None:
        """The stream's first event, if it can be read: it names a broken stream."""
        rows = self.world.backend.select_rows(stream_id, None)
        if not rows:
            return None
        version, topic, data = rows[0]
        mapper = self.world.app.mapper
        assert isinstance(mapper, PydanticMapper)
        try:
            return mapper.decode_row(stream_id, version, topic, data)
        except EventLogError:
            return None

    def _check_artifact(self, ref: ArtifactRef, run_id: str | None) -> None:
        key = (ref.sha256, ref.run_id, ref.step_path)
        if key in self.artifacts:
            return
        problem: str | None = None
        if run_id is not None and ref.run_id != run_id:
            problem = (
                f"referenced by run {run_id!r} but made for run {ref.run_id!r}: a reference"
                " was copied from another run"
            )
        else:
            try:
                self.world.artifacts.get(ref)
            except ArtifactError as exc:
                problem = " ".join(str(exc).split())
        self.artifacts[key] = ArtifactCheck(
            artifact_id=ref.artifact_id,
            run_id=ref.run_id,
            step_path=ref.step_path,
            size=ref.size,
            problem=problem,
        )


def _exists(world: World, stream_id: UUID) -> bool:
    """Whether the stream has rows, or a head that says it had."""
    return bool(world.backend.select_rows(stream_id, None)) or (
        world.backend.stream_head(stream_id) is not None
    )


def _streams_in_log(world: World) -> Iterator[UUID]:
    """Every stream id with a row in the log, in the order of their first rows."""
    recorder = world.app.recorder
    start: int | None = None
    seen: set[UUID] = set()
    while page := recorder.select_notifications(
        start=start, limit=1000, inclusive_of_start=start is None
    ):
        for n in page:
            sid = n.originator_id
            stream_id = sid if isinstance(sid, UUID) else UUID(sid)
            if stream_id not in seen:
                seen.add(stream_id)
                yield stream_id
        start = page[-1].id


def identify_stream(stream_id: UUID, first: Event | None) -> tuple[str, str]:
    """What a stream is and its name, by its first event (as `little verify` and
    `little export` show it): ``("run", run_id)`` for a run or a fork, and so on;
    ``("stream", its id)`` for a stream none of little_es's first events begins."""
    if isinstance(first, RunStarted | RunForked):
        return "run", first.run_id
    if isinstance(first, SessionStarted):
        return "session", f"{first.run_id}/{first.step_path}#{first.attempt}"
    if isinstance(first, OuterLoopStarted):
        return "outer_loop", first.outer_loop_id
    if isinstance(first, WorldCreated):
        return "world", first.world_id
    if isinstance(first, ModelPriceSet):
        return "prices", "price book"
    return "stream", str(stream_id)


def _run_of(events: list[Event]) -> str | None:
    first = events[0] if events else None
    if isinstance(first, RunStarted | RunForked | SessionStarted):
        return first.run_id
    return None


def artifact_refs(event: Event) -> Iterator[ArtifactRef]:
    """Every artifact reference among an event's fields (for the checks of a world, and of
    what moves with it: :mod:`little_es.transfer`)."""
    for name in type(event).model_fields:
        value = getattr(event, name)
        if isinstance(value, ArtifactRef):
            yield value
        elif isinstance(value, tuple):
            yield from (v for v in value if isinstance(v, ArtifactRef))

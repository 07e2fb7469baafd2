"""The conformance suite of a storage backend: TestCases a backend's tests subclass.

A backend (:mod:`little_es.backends`) passes these cases:

* :class:`BackendTestCase` - the World on it: events round trip with their
  types, a run's log merges its sessions, concurrency conflicts write nothing,
  snapshots at versions growing fourfold, artifacts verified on read, leases (and
  their checks once broken), bad run
  ids refused, durability across close and reopen, insert-only storage;
* eventsourcing's own recorder cases (:mod:`eventsourcing.tests.persistence`)
  run on the World's recorders: :class:`EventRecorderTestCase` (and
  :class:`WriteAheadEventRecorderTestCase`, the same with every insert
  ``durable=False``), :class:`SnapshotRecorderTestCase`,
  :class:`RunsViewTestCase` (the runs read model is a tracking recorder) and
  :class:`ProcessRecorderTestCase` (the process recorder the World's factory
  makes);
* eventsourcing's example application (:mod:`eventsourcing.tests.application`)
  on the World's factory: :class:`ExampleApplicationTestCase`.

They are :class:`unittest.TestCase` classes, like eventsourcing's: they run
under ``unittest`` and pytest alike, need no test runner that little_es does
not depend on, and extend eventsourcing's cases rather than wrap them (install
the ``testing`` extra: eventsourcing's test module imports its cipher). Every
case gets its worlds from one abstract hook, :meth:`WorldTestCase.make_world`,
so a backend's tests are one storage class that makes fresh storage per test
plus one line per case::

    from little_es.testing import backend as conformance

    class MyStorage(conformance.WorldTestCase):
        def setUp(self) -> None:
            super().setUp()
            ...  # fresh, empty storage for this test (and addCleanup to remove it)

        def make_world(self) -> World:
            return World(MyBackend(LittleApplication, ...))

    class TestMyWorld(MyStorage, conformance.BackendTestCase): ...
    class TestMyEventRecorder(MyStorage, conformance.EventRecorderTestCase): ...

Import the module rather than its classes, so the test runner does not collect
the abstract cases themselves. Hooks a backend may fill in to run more of
:class:`BackendTestCase` (each test that needs one is skipped without it):
:attr:`~BackendTestCase.persistent`, :attr:`~BackendTestCase.answers_watch`,
:meth:`~BackendTestCase.world_url`,
:meth:`~BackendTestCase.corrupt_artifact`, :meth:`~BackendTestCase.trap_mutations`.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from typing import Any, ClassVar
from unittest import TestCase, mock
from uuid import UUID

from eventsourcing.application import Application
from eventsourcing.domain import Aggregate as EventsourcingAggregate
from eventsourcing.persistence import (
    AggregateRecorder,
    ApplicationRecorder,
    ProcessRecorder,
    TrackingRecorder,
)
from eventsourcing.tests import application, persistence

from little_es.backends.base import StreamWatch, check_leases
from little_es.domain import HarnessSession, Run
from little_es.errors import (
    ArtifactIntegrityError,
    ArtifactNotFoundError,
    ConcurrencyConflictError,
    ConcurrentRunError,
    InvalidRunIdError,
    LeaseLostError,
    RunNotFoundError,
)
from little_es.events import (
    ModelCalled,
    ModelResponded,
    ParallelBranchScheduled,
    RunCompleted,
    RunEvent,
    RunStarted,
    SessionCompleted,
    SessionStarted,
    Snapshot,
    StepCompleted,
    StepFailed,
    StepStarted,
    SubRunReserved,
    ToolCallFailed,
    ToolCallStarted,
    ToolCallSucceeded,
)
from little_es.ids import run_stream_id, session_stream_id
from little_es.materialize import materialize_run_state
from little_es.pricing import price_usage_exact
from little_es.values import ArtifactRef, ErrorInfo, Message, ModelResponse, ToolCall, Usage
from little_es.verify import verify_world
from little_es.world import LittleApplication, World

__all__ = [
    "BackendTestCase",
    "EventRecorderTestCase",
    "ExampleApplicationTestCase",
    "ProcessRecorderTestCase",
    "RunsViewTestCase",
    "SnapshotRecorderTestCase",
    "WorldTestCase",
    "WriteAheadEventRecorderTestCase",
    "small_snapshot_intervals",
]

# --------------------------------------------------------------------- builders


def _start_run(run_id: str, *, parent_run_id: str | None = None) -> Run:
    run = Run(run_id, price_usage_exact)
    run.trigger(
        RunStarted,
        run_id=run_id,
        workflow_id="triage",
        workflow_version="3",
        ir_hash="f" * 64,
        input={"ticket": 42, "tags": ["a", "b"], "nested": {"x": 1.5, "text": "héllo ✓ 🚀"}},
        parent_run_id=parent_run_id,
    )
    return run


_Each = Callable[[HarnessSession], None]


def _nothing(session: HarnessSession) -> None:
    """The default ``each``: leave the events queued."""


def _turn(
    session: HarnessSession, turn: int, *, tool_fails: bool = False, each: _Each = _nothing
) -> None:
    """One model call that asks for one tool, and the tool's outcome.

    ``each`` runs after every event (pass ``world.save`` to write ahead one at a time).
    """
    call_id = f"c{turn}"
    session.trigger(
        ModelCalled,
        turn=turn,
        messages=(Message(role="user", content=f"question {turn}: " + "lorem ipsum " * 10),),
        conversation_hash=f"{turn:064x}",
    )
    each(session)
    session.trigger(
        ModelResponded,
        turn=turn,
        response=ModelResponse(
            content=f"answer {turn}",
            tool_calls=(ToolCall(id=call_id, name="lookup", arguments={"q": [turn, "x"]}),),
            usage=Usage(input_tokens=100 + turn, output_tokens=20, cached_input_tokens=5),
            provider="openai",
            model="gpt-4o-mini",
        ),
    )
    each(session)
    session.trigger(ToolCallStarted, turn=turn, call_id=call_id, name="lookup", args={"q": turn})
    each(session)
    if tool_fails:
        session.trigger(
            ToolCallFailed,
            call_id=call_id,
            error=ErrorInfo(type="TimeoutError", message="slow", retryable=True),
        )
    else:
        session.trigger(ToolCallSucceeded, call_id=call_id, result={"rows": [turn, turn + 1]})
    each(session)


def _agent_step(
    run: Run, step_path: str, *, turns: int = 2, attempt: int = 1, each: _Each = _nothing
) -> HarnessSession:
    """Start an agent step on ``run`` and drive its session to completion.

    Nothing of the run is saved; ``each`` runs after every session event.
    """
    assert run.run_id is not None
    session = HarnessSession(run.run_id, step_path, attempt)
    run.trigger(
        StepStarted,
        step_path=step_path,
        step_id=step_path.split("/")[-1],
        kind="agent",
        visit=1,
        attempt=attempt,
        session_id=session.id,
    )
    session.trigger(
        SessionStarted,
        run_id=run.run_id,
        step_path=step_path,
        attempt=attempt,
        manifest={"model": "gpt-4o-mini", "tools": ["lookup"]},
        manifest_hash="a" * 64,
    )
    each(session)
    for turn in range(1, turns + 1):
        _turn(session, turn, tool_fails=turn == 2, each=each)
    session.trigger(
        SessionCompleted, usage=Usage(input_tokens=1, output_tokens=2), turns=turns, output="done"
    )
    each(session)
    run.trigger(
        StepCompleted,
        step_path=step_path,
        step_id=step_path.split("/")[-1],
        visit=1,
        attempt=attempt,
        output={"answer": "done", "score": 0.25},
    )
    return session


def _task_steps(run: Run, count: int, *, prefix: str = "t") -> None:
    """``count`` task steps, with a retried failure, a parallel group and a sub-run."""
    for i in range(count):
        path = f"{prefix}{i}"
        run.trigger(StepStarted, step_path=path, step_id=path, kind="task", visit=1, attempt=1)
        if i % 3 == 1:
            run.trigger(
                StepFailed,
                step_path=path,
                step_id=path,
                visit=1,
                attempt=1,
                error=ErrorInfo(type="ValueError", message=f"bad {i}"),
                will_retry=True,
            )
            run.trigger(StepStarted, step_path=path, step_id=path, kind="task", visit=1, attempt=2)
        if i % 4 == 2:
            run.trigger(
                ParallelBranchScheduled, step_path=path, step_id=path, branch_keys=("k1", "k2")
            )
        if i % 5 == 3:
            run.trigger(SubRunReserved, step_path=path, sub_run_id=f"sub_{i}", workflow_id="child")
        run.trigger(
            StepCompleted,
            step_path=path,
            step_id=path,
            visit=1,
            attempt=2 if i % 3 == 1 else 1,
            output={"i": i},
            next_step=f"{prefix}{i + 1}" if i % 2 else None,
        )


def _session_view(session: HarnessSession | None) -> tuple[Any, ...]:
    """Everything a HarnessSession's state holds, comparable with ==."""
    assert session is not None
    return (
        session.id,
        session.version,
        session.started,
        session.called,
        session.responses,
        session.tool_calls,
        session.tool_results,
        session.completed,
    )


def _entry_points(world: World, run_id: str) -> dict[str, Callable[[], object]]:
    """Every way a run id gets into a world."""
    return {
        "read_run_log": lambda: world.read_run_log(run_id),
        "load_run": lambda: world.load_run(run_id),
        "run_exists": lambda: world.run_exists(run_id),
        "record_run_event": lambda: world.record_run_event(run_id, StepStarted),
        "run_lease": lambda: world.run_lease(run_id).__enter__(),
        "artifacts.put": lambda: world.artifacts.put(b"x", run_id=run_id, step_path="s"),
        "Run": lambda: Run(run_id, price_usage_exact),
        "HarnessSession": lambda: HarnessSession(run_id, "s", 1),
    }


async def _check_in_task() -> str:
    await asyncio.sleep(0)
    try:
        check_leases()
    except LeaseLostError as exc:
        return type(exc).__name__
    return "held"


def _marks_reached(saved_versions: list[int], interval: int) -> list[int]:
    """The versions of the saves (after the first) that reached ``interval * 4**k`` events."""
    marks = [interval << 2 * k for k in range(16)]
    return [v for before, v in pairwise(saved_versions) if any(before < m <= v for m in marks)]


def small_snapshot_intervals() -> AbstractContextManager[Any]:
    """Snapshot Runs every 4 and HarnessSessions every 5 events in worlds opened inside.

    Whether a world has a snapshot store is decided when it is opened: open it
    inside the ``with`` block.
    """
    return mock.patch.dict(LittleApplication.snapshotting_intervals, {Run: 4, HarnessSession: 5})


_HOLD_LEASE = textwrap.dedent(
    """
    import sys, time
    from little_es.world import open_world
    world = open_world()
    with world.run_lease(sys.argv[1]):
        print("held", flush=True)
        time.sleep(120)
    """
)


class _LeaseNote(RunEvent):
    """A user's own run event: the stale lease holder's attempt to record one is refused."""

    wire_name: ClassVar[str] = "little_es.testing.LeaseNote"
    note: str


# ------------------------------------------------------------------------ cases


class WorldTestCase(TestCase, ABC):
    """The hook every case here opens its worlds with."""

    @abstractmethod
    def make_world(self) -> World:
        """Open a World on this test's storage (the caller closes it).

        Each test starts on fresh, empty storage (make it in ``setUp``); every
        call during one test opens another World on that same storage, which
        sees what earlier ones wrote unless the backend is not
        :attr:`BackendTestCase.persistent`.
        """

    def open_world(self) -> World:
        """:meth:`make_world`, closed when the test ends."""
        world = self.make_world()
        self.addCleanup(world.close)
        return world


class BackendTestCase(WorldTestCase):
    """A World on the backend keeps every promise of :mod:`little_es.world`."""

    persistent: ClassVar[bool] = True
    """Whether a world opened again sees what an earlier one wrote (False: the
    tests of durability across a close are skipped)."""

    answers_watch: ClassVar[bool] = True
    """Whether the backend's commits answer a :class:`~little_es.backends.base.StreamWatch`
    (False: it leaves ``unchanged`` empty, and only that nothing is wrongly reported
    unchanged is tested)."""

    apart_from_other_applications: ClassVar[bool] = True
    """Whether another eventsourcing application that uses the world's factory writes
    tables of its own (False: it shares the world's, as every application on an
    SQLite file in eventsourcing's layout shares eventsourcing's table; only that the
    world keeps its layout and its log is tested)."""

    _world: World | None = None

    exercised_events = 0
    """How many events :meth:`full_exercise` stored (for :meth:`trap_mutations` to check)."""

    @property
    def world(self) -> World:
        """The test's first world, opened on first use."""
        if self._world is None:
            self._world = self.open_world()
        return self._world

    # -------------------------------------------------------------- hooks

    def world_url(self) -> str | None:
        """A URL :func:`~little_es.world.open_world` opens on this test's storage, or None.

        The lease test that kills its holder opens it in a child process.
        """
        return None

    def corrupt_artifact(self, world: World, ref: ArtifactRef, data: bytes) -> None:
        """Overwrite the stored bytes of ``ref`` with ``data`` behind the store's back."""
        self.skipTest("the backend's tests do not say how to corrupt a stored artifact")

    def trap_mutations(self) -> AbstractContextManager[None]:
        """Make the test fail if anything updates or deletes stored events inside the block.

        Either refuse such statements (a trigger that raises) or record them and
        fail on leaving the block; also check there that events and snapshots
        were inserted at all.
        """
        self.skipTest("the backend's tests do not say how to watch its storage for mutations")

    def _require_persistent(self) -> None:
        if not self.persistent:
            self.skipTest("the backend keeps nothing across a close")

    # --------------------------------------------------------- round trip

    def test_events_round_trip_with_their_types(self) -> None:
        world = self.world
        run = _start_run("run_roundtrip")
        session = _agent_step(run, "plan/draft", turns=3)
        ref = world.artifacts.put(b"report", run_id="run_roundtrip", step_path="plan/draft")
        run.trigger(
            StepStarted, step_path="publish", step_id="publish", kind="task", visit=1, attempt=1
        )
        run.trigger(
            StepCompleted,
            step_path="publish",
            step_id="publish",
            visit=1,
            attempt=1,
            output_ref=ref,
            artifact_refs=(ref,),
        )
        run.trigger(ParallelBranchScheduled, step_path="fan", step_id="fan", branch_keys=("x", "y"))
        run.trigger(RunCompleted, output={"ok": True})
        written_run, written_session = run.pending_events, session.pending_events

        world.save(run, session)

        read_run = world.read_stream(run.id)
        read_session = world.read_stream(session.id)
        self.assertEqual(read_run, list(written_run))
        self.assertEqual(read_session, list(written_session))
        self.assertEqual([type(e) for e in read_run], [type(e) for e in written_run])
        for event in [*read_run, *read_session]:
            self.assertIsNotNone(event.timestamp.tzinfo)
            self.assertEqual(event.timestamp.utcoffset(), timedelta(0))
            self.assertIsInstance(event.originator_id, UUID)
        started = next(e for e in read_run if isinstance(e, StepStarted) and e.kind == "agent")
        self.assertIsInstance(started.session_id, UUID)
        self.assertEqual(started.session_id, session.id)
        called = next(e for e in read_session if isinstance(e, ModelCalled))
        self.assertIsInstance(called.messages, tuple)
        self.assertIsInstance(called.messages[0], Message)
        responded = next(e for e in read_session if isinstance(e, ModelResponded))
        self.assertIsInstance(responded.response, ModelResponse)
        self.assertIsInstance(responded.response.tool_calls, tuple)
        self.assertEqual(responded.response.tool_calls[0].arguments, {"q": [1, "x"]})
        self.assertEqual(
            responded.response.usage,
            Usage(input_tokens=101, output_tokens=20, cached_input_tokens=5),
        )
        completed = next(e for e in read_run if isinstance(e, StepCompleted) and e.output_ref)
        self.assertEqual(completed.output_ref, ref)
        self.assertEqual(completed.artifact_refs, (ref,))
        self.assertIsInstance(completed.artifact_refs, tuple)
        branches = next(e for e in read_run if isinstance(e, ParallelBranchScheduled))
        self.assertEqual(branches.branch_keys, ("x", "y"))
        first = read_run[0]
        assert isinstance(first, RunStarted)
        self.assertEqual(first.input["nested"]["text"], "héllo ✓ 🚀")

    def test_read_stream_after_version(self) -> None:
        world = self.world
        run = _start_run("run_after")
        _task_steps(run, 3)
        world.save(run)
        everything = world.read_stream(run.id)
        self.assertEqual(world.read_stream(run.id, after=2), everything[2:])
        self.assertEqual(world.read_stream(run.id, after=len(everything)), [])

    def test_has_events_after_sees_the_stream_end_and_another_worlds_append(self) -> None:
        """The check a driver makes before each step and call (a foreign append stops it)."""
        world = self.world
        run = _start_run("run_has_after")
        _task_steps(run, 2)
        world.save(run)
        last = run.version
        self.assertTrue(world.has_events_after(run.id, 0))
        self.assertTrue(world.has_events_after(run.id, last - 1))
        self.assertFalse(world.has_events_after(run.id, last))
        self.assertFalse(world.has_events_after(run_stream_id("run_never_written"), 0))
        if not self.persistent:
            return
        other = self.open_world()
        theirs = other.load_run("run_has_after")
        theirs.trigger(StepStarted, step_path="z", step_id="z", kind="task", visit=1, attempt=1)
        other.save(theirs)
        self.assertTrue(world.has_events_after(run.id, last))
        self.assertFalse(world.has_events_after(run.id, last + 1))

    def test_a_commit_reads_the_watched_streams_for_the_check_after_it(self) -> None:
        """A watched stream is reported unchanged only when no row lies past its version."""
        world = self.world
        run = _start_run("run_watched")
        world.save(run)
        last = run.version
        never = run_stream_id("run_watched_never_written")

        def commit_watching(versions: dict[UUID, int]) -> frozenset[UUID]:
            other = _start_run(f"run_watching_{len(versions)}_{time.monotonic_ns()}")
            watch = StreamWatch(versions)
            world.save(other, watch=watch)
            return watch.unchanged

        quiet = commit_watching({run.id: last, never: 0})
        behind = commit_watching({run.id: last - 1})
        if self.answers_watch:
            self.assertEqual(quiet, {run.id, never})
        self.assertEqual(behind, frozenset())
        # Another writer's append past the version: never reported unchanged.
        writer = self.open_world() if self.persistent else world
        theirs = writer.load_run("run_watched")
        theirs.trigger(StepStarted, step_path="z", step_id="z", kind="task", visit=1, attempt=1)
        writer.save(theirs)
        after = commit_watching({run.id: last, never: 0})
        self.assertNotIn(run.id, after)
        if self.answers_watch:
            self.assertEqual(after, {never})
        # A commit that fails its version check reports nothing.
        stale = world.load_run("run_watched")
        fresh = writer.load_run("run_watched")
        _task_steps(fresh, 1, prefix="w")
        writer.save(fresh)
        _task_steps(stale, 1, prefix="s")
        watch = StreamWatch({never: 0})
        with self.assertRaises(ConcurrencyConflictError):
            world.save(stale, watch=watch)
        self.assertEqual(watch.unchanged, frozenset())

    def test_timestamps_are_recorded_in_utc(self) -> None:
        before = datetime.now(UTC)
        self.world.save(_start_run("run_clock"))
        [event] = self.world.read_stream(run_stream_id("run_clock"))
        self.assertLessEqual(before, event.timestamp)
        self.assertLessEqual(event.timestamp, datetime.now(UTC))

    # ------------------------------------------------------------ run log

    def test_read_run_log_merges_sessions_and_never_another_run(self) -> None:
        world = self.world
        parent = _start_run("run_parent")
        first = _agent_step(parent, "a", turns=2)
        parent.trigger(SubRunReserved, step_path="b", sub_run_id="run_child", workflow_id="child")
        world.save(parent, first)
        second = _agent_step(parent, "c", turns=1)
        world.save(parent, second)

        child = _start_run("run_child", parent_run_id="run_parent")
        child_session = _agent_step(child, "a", turns=2)
        world.save(child, child_session)
        stranger = _start_run("run_stranger")
        world.save(stranger)

        log = world.read_run_log("run_parent")

        expected = [
            *world.read_stream(parent.id),
            *world.read_stream(first.id),
            *world.read_stream(second.id),
        ]
        self.assertEqual(
            {(e.originator_id, e.originator_version) for e in log},
            {(e.originator_id, e.originator_version) for e in expected},
        )
        self.assertEqual(len(log), len(expected))
        self.assertEqual({e.originator_id for e in log}, {parent.id, first.id, second.id})
        self.assertNotIn(child.id, {e.originator_id for e in log})
        self.assertNotIn(child_session.id, {e.originator_id for e in log})
        timestamps = [e.timestamp for e in log]
        self.assertEqual(timestamps, sorted(timestamps))
        for stream_id in (parent.id, first.id, second.id):
            versions = [e.originator_version for e in log if e.originator_id == stream_id]
            self.assertEqual(versions, list(range(1, len(versions) + 1)))
        # The child's log is its own, and does not reach back into the parent.
        child_log = world.read_run_log("run_child")
        self.assertEqual({e.originator_id for e in child_log}, {child.id, child_session.id})

    def test_unknown_run_is_reported(self) -> None:
        world = self.world
        self.assertFalse(world.run_exists("run_nobody"))
        with self.assertRaisesRegex(RunNotFoundError, "run_nobody"):
            world.read_run_log("run_nobody")
        with self.assertRaisesRegex(RunNotFoundError, "run_nobody"):
            world.load_run("run_nobody")
        self.assertIsNone(world.load_session(session_stream_id("run_nobody", "a", 1)))
        self.assertIsNone(world.load_outer_loop("loop_nobody"))
        world.save(_start_run("run_somebody"))
        self.assertTrue(world.run_exists("run_somebody"))

    # ----------------------------------------------- optimistic concurrency

    def test_second_writer_at_the_same_version_conflicts_and_writes_nothing(self) -> None:
        world = self.world
        world.save(_start_run("run_race"))
        mine = world.load_run("run_race")
        theirs = world.load_run("run_race")
        mine.trigger(StepStarted, step_path="a", step_id="a", kind="task", visit=1, attempt=1)
        world.save(mine)
        theirs.trigger(StepStarted, step_path="b", step_id="b", kind="task", visit=1, attempt=1)
        theirs.trigger(StepStarted, step_path="c", step_id="c", kind="task", visit=1, attempt=1)

        with self.assertRaisesRegex(ConcurrencyConflictError, "reload and retry"):
            world.save(theirs)

        stored = world.read_stream(run_stream_id("run_race"))
        self.assertEqual([type(e) for e in stored], [RunStarted, StepStarted])
        assert isinstance(stored[1], StepStarted)
        self.assertEqual(stored[1].step_path, "a")
        # The loser reloads and retries on top of the winner.
        retry = world.load_run("run_race")
        retry.trigger(StepStarted, step_path="b", step_id="b", kind="task", visit=1, attempt=1)
        world.save(retry)
        self.assertEqual(len(world.read_stream(run_stream_id("run_race"))), 3)

    def _check_multi_aggregate_save_is_atomic(self, *, stale_first: bool) -> None:
        world = self.world
        run = _start_run("run_atomic")
        session = HarnessSession("run_atomic", "a", 1)
        session.trigger(
            SessionStarted,
            run_id="run_atomic",
            step_path="a",
            attempt=1,
            manifest={},
            manifest_hash="h",
        )
        world.save(run, session)
        stale_session = world.load_session(session.id)
        assert stale_session is not None
        winner = world.load_session(session.id)
        assert winner is not None
        _turn(winner, 1)
        world.save(winner)

        fresh_run = world.load_run("run_atomic")
        fresh_run.trigger(StepStarted, step_path="a", step_id="a", kind="agent", visit=1, attempt=1)
        _turn(stale_session, 1)
        pair = (stale_session, fresh_run) if stale_first else (fresh_run, stale_session)

        with self.assertRaises(ConcurrencyConflictError):
            world.save(*pair)

        self.assertEqual([type(e) for e in world.read_stream(run.id)], [RunStarted])
        self.assertEqual(len(world.read_stream(session.id)), 1 + 4)

    def test_an_aggregate_caught_up_with_another_writers_events_keeps_the_chain(self) -> None:
        """World.catch_up folds what another world appended and takes its chain digests, so
        the next save links to the stored end of the stream (the Temporal run cache's path)."""
        self._require_persistent()
        world, other = self.open_world(), self.open_world()
        world.save(_start_run("run_catch_up"))
        mine = world.load_run("run_catch_up")
        theirs = other.load_run("run_catch_up")
        theirs.trigger(StepStarted, step_path="a", step_id="a", kind="task", visit=1, attempt=1)
        other.save(theirs)
        world.catch_up(mine)
        self.assertEqual(mine.version, 2)
        mine.trigger(StepCompleted, step_path="a", step_id="a", visit=1, attempt=1, output=1)
        world.save(mine)
        stored = other.read_stream(run_stream_id("run_catch_up"))
        self.assertEqual([e.originator_version for e in stored], [1, 2, 3])

    def test_a_commit_between_reading_rows_and_head_is_not_taken_for_a_cut_tail(self) -> None:
        """A stream is read rows first, head second; a writer that commits in between leaves
        the head ahead of the rows read, and the read tries again instead of refusing."""
        self._require_persistent()
        world, other = self.open_world(), self.open_world()
        world.save(_start_run("run_between"))
        real_select = world._select
        raced: list[bool] = []

        def select(stream_id: UUID, after: int | None) -> Any:
            rows = real_select(stream_id, after)
            if not raced:
                raced.append(True)
                run = other.load_run("run_between")
                run.trigger(
                    StepStarted, step_path="a", step_id="a", kind="task", visit=1, attempt=1
                )
                other.save(run)
            return rows

        self.enterContext(mock.patch.object(world, "_select", select))
        self.assertEqual(len(world.read_stream(run_stream_id("run_between"))), 2)
        self.assertEqual(raced, [True])

    def test_multi_aggregate_save_is_atomic_stale_first(self) -> None:
        self._check_multi_aggregate_save_is_atomic(stale_first=True)

    def test_multi_aggregate_save_is_atomic_stale_last(self) -> None:
        self._check_multi_aggregate_save_is_atomic(stale_first=False)

    def test_multi_aggregate_save_commits_all(self) -> None:
        world = self.world
        run = _start_run("run_both")
        session = _agent_step(run, "a")
        world.save(run, session)
        self.assertEqual(world.load_run("run_both").version, 3)
        loaded = world.load_session(session.id)
        assert loaded is not None
        self.assertEqual(loaded.version, 10)
        self.assertEqual(len(world.read_stream(session.id)), 10)

    # ---------------------------------------------------------- snapshots

    def _snapshot_versions(self, world: World, stream_id: UUID) -> list[int]:
        assert world.app.snapshots is not None
        rows = world.app.snapshots.recorder.select_events(stream_id)
        self.assertLessEqual({r.topic for r in rows}, {Snapshot.wire_name})
        return [r.originator_version for r in rows]

    def _spy_decodes(self, world: World) -> dict[UUID, list[int]]:
        """Record the versions of each stream's events a load decodes (snapshots aside)."""
        mapper = world._mapper
        real_decode = mapper.decode_payload
        decoded: dict[UUID, list[int]] = {}

        def decode(stream_id: UUID, version: int, topic: str, data: bytes) -> Any:
            if topic != Snapshot.wire_name:
                decoded.setdefault(stream_id, []).append(version)
            return real_decode(stream_id, version, topic, data)

        self.enterContext(mock.patch.object(mapper, "decode_payload", decode))
        return decoded

    def test_snapshots_are_written_and_loads_equal_a_full_fold(self) -> None:
        run_interval, session_interval = 4, 5
        self.enterContext(small_snapshot_intervals())
        world = self.open_world()  # opened after the intervals are set: they pick the store
        run = _start_run("run_snap")
        world.save(run)
        session = HarnessSession("run_snap", "agent", 1)
        run.trigger(
            StepStarted,
            step_path="agent",
            step_id="agent",
            kind="agent",
            visit=1,
            attempt=1,
            session_id=session.id,
        )
        session.trigger(
            SessionStarted,
            run_id="run_snap",
            step_path="agent",
            attempt=1,
            manifest={},
            manifest_hash="h",
        )
        saved_at: dict[UUID, list[int]] = {run.id: [], session.id: []}

        def save(*aggregates: Run | HarnessSession) -> None:
            world.save(*aggregates)
            for a in aggregates:
                saved_at[a.id].append(a.version)

        save(run, session)
        # Harness events are written ahead one or two at a time, as the runtime does.
        for turn in range(1, 6):
            _turn(session, turn, tool_fails=turn == 3, each=save)
        _task_steps(run, 7)
        save(run)

        run_events = world.read_stream(run.id)
        session_events = world.read_stream(session.id)
        self.assertGreater(len(run_events), 3 * run_interval)
        self.assertGreater(len(session_events), 3 * session_interval)
        run_snaps = self._snapshot_versions(world, run.id)
        session_snaps = self._snapshot_versions(world, session.id)
        # One at each save that reached interval * 4**k events, at the version saved.
        self.assertEqual(run_snaps, _marks_reached([1, *saved_at[run.id]], run_interval))
        self.assertEqual(run_snaps, [len(run_events)])
        self.assertEqual(
            session_snaps, _marks_reached([0, *saved_at[session.id]], session_interval)
        )
        self.assertEqual(session_snaps, [5, 20])
        # A load decodes at most the last three quarters of the stream, after its snapshot
        # (it reads and verifies the whole stream's rows).
        self.assertGreaterEqual(session_snaps[-1], len(session_events) / 4)

        decoded = self._spy_decodes(world)
        loaded_run = world.load_run("run_snap")
        loaded_session = world.load_session(session.id)
        # A run's snapshot names its steps' outputs by the version of their StepCompleted
        # instead of copying them: the load decodes those rows, and nothing else before it.
        output_at: dict[str, int | None] = {}
        for event in run_events:
            if isinstance(event, StepCompleted):
                output_at[event.step_path] = (
                    event.originator_version if event.output is not None else None
                )
        named = sorted(v for v in output_at.values() if v is not None)
        self.assertTrue(named)
        self.assertEqual(sorted(decoded.get(run.id, [])), named)
        self.assertEqual(
            decoded[session.id], list(range(session_snaps[-1] + 1, len(session_events) + 1))
        )

        self.assertEqual(loaded_run.version, len(run_events))
        self.assertEqual(loaded_run.run_id, "run_snap")
        self.assertEqual(
            loaded_run.fold.freeze(), materialize_run_state(run_events, pricer=price_usage_exact)
        )
        self.assertEqual(loaded_run.fold.freeze(), run.fold.freeze())
        folded_session = HarnessSession.from_events(session.id, session_events)
        self.assertEqual(_session_view(loaded_session), _session_view(folded_session))
        self.assertEqual(_session_view(loaded_session), _session_view(session))

        # An aggregate restored from a snapshot keeps writing at the right version.
        assert loaded_session is not None
        _turn(loaded_session, 6)
        loaded_run.trigger(RunCompleted, output=None)
        world.save(loaded_run, loaded_session)
        self.assertEqual(
            world.load_run("run_snap").fold.freeze(),
            materialize_run_state(world.read_stream(run.id), pricer=price_usage_exact),
        )
        self.assertEqual(
            _session_view(world.load_session(session.id)),
            _session_view(HarnessSession.from_events(session.id, world.read_stream(session.id))),
        )

    def test_batch_save_reaching_several_marks_snapshots_once_at_its_version(self) -> None:
        self.enterContext(small_snapshot_intervals())
        world = self.open_world()
        run = _start_run("run_batch")
        _task_steps(run, 9)
        world.save(run)
        count = len(world.read_stream(run.id))
        self.assertGreater(count, 4 * 4)
        self.assertEqual(self._snapshot_versions(world, run.id), [count])
        self.assertEqual(world.load_run("run_batch").fold.freeze(), run.fold.freeze())

    # ---------------------------------------------------------- artifacts

    def test_artifact_put_get_exists(self) -> None:
        artifacts = self.world.artifacts
        data = b"\x00binary\xffpayload" * 100
        ref = artifacts.put(data, run_id="run_art", step_path="a/b", media_type="text/plain")
        self.assertEqual(ref.sha256, hashlib.sha256(data).hexdigest())
        self.assertEqual(ref.artifact_id, f"sha256:{ref.sha256}")
        self.assertEqual(
            (ref.size, ref.media_type, ref.run_id, ref.step_path),
            (len(data), "text/plain", "run_art", "a/b"),
        )
        self.assertTrue(artifacts.exists(ref))
        hydrated = artifacts.get(ref)
        self.assertEqual(hydrated.payload, data)
        self.assertEqual(hydrated.manifest, ref)
        self.assertEqual(
            artifacts.put(data, run_id="run_art", step_path="a/b", media_type="text/plain"), ref
        )

    def test_tampered_artifact_is_refused(self) -> None:
        world = self.world
        ref = world.artifacts.put(b"the real bytes", run_id="run_art", step_path="s")
        self.corrupt_artifact(world, ref, b"the evil bytes")
        self.assertTrue(world.artifacts.exists(ref))
        with self.assertRaisesRegex(ArtifactIntegrityError, r"run_art.*'s'.*corrupt"):
            world.artifacts.get(ref)

    def test_missing_artifact_is_reported(self) -> None:
        data = b"never stored here"
        sha = hashlib.sha256(data).hexdigest()
        ref = ArtifactRef(
            artifact_id=f"sha256:{sha}", sha256=sha, size=len(data), run_id="run_art", step_path="s"
        )
        self.assertFalse(self.world.artifacts.exists(ref))
        with self.assertRaisesRegex(ArtifactNotFoundError, r"run_art.*missing"):
            self.world.artifacts.get(ref)

    # ------------------------------------------------------------- leases

    def test_second_lease_on_a_run_is_refused_until_released(self) -> None:
        world = self.world
        with world.run_lease("run_lease"):
            with (
                self.assertRaisesRegex(ConcurrentRunError, "run_lease"),
                world.run_lease("run_lease"),
            ):
                self.fail("a second holder got the lease")
            with world.run_lease("run_other"):
                pass
        with world.run_lease("run_lease"):
            pass

    def test_lease_is_released_when_the_block_raises(self) -> None:
        with self.assertRaises(RuntimeError), self.world.run_lease("run_lease"):
            raise RuntimeError("step crashed")
        with self.world.run_lease("run_lease"):
            pass

    def test_lease_excludes_another_world_on_the_same_storage(self) -> None:
        self._require_persistent()
        world, other = self.world, self.open_world()
        with (
            world.run_lease("run_lease"),
            self.assertRaises(ConcurrentRunError),
            other.run_lease("run_lease"),
        ):
            self.fail("a second world got the lease")
        with other.run_lease("run_lease"):
            pass

    def test_lease_dies_with_a_killed_holder(self) -> None:
        self._require_persistent()
        url = self.world_url()
        if url is None:
            self.skipTest("the backend's tests name no URL a child process can open")
        world = self.world
        env = {
            **os.environ,
            "LITTLE_ES_WORLD": url,
            # The child imports what this process imports.
            "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
        }
        holder = subprocess.Popen(
            [sys.executable, "-c", _HOLD_LEASE, "run_lease"],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert holder.stdout is not None
            self.assertEqual(holder.stdout.readline().strip(), "held")
            with self.assertRaises(ConcurrentRunError), world.run_lease("run_lease"):
                self.fail("got a lease another process holds")
        finally:
            holder.send_signal(signal.SIGKILL)
            holder.wait(timeout=30)
            if holder.stdout is not None:
                holder.stdout.close()
        # A database server notices the dead client's connection a moment later.
        deadline = time.monotonic() + 20
        while True:
            try:
                with world.run_lease("run_lease"):
                    break
            except ConcurrentRunError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def test_a_broken_lease_fails_its_check_and_a_new_holder_takes_the_run(self) -> None:
        world = self.world
        other = self.open_world() if self.persistent else world
        self.assertIsNone(other.break_lease("run_lease"), "nobody held it")
        self.assertIsNone(other.lease_holder("run_lease"))
        check_leases()  # outside every lease: nothing to check
        stale_block = world.run_lease("run_lease")
        lease = stale_block.__enter__()
        lease.check()
        check_leases()
        self.assertIsNotNone(other.lease_holder("run_lease"))
        self.assertIsNotNone(other.break_lease("run_lease"))
        with self.assertRaisesRegex(LeaseLostError, "run_lease"):
            lease.check()
        with self.assertRaisesRegex(LeaseLostError, "run_lease"):
            check_leases()
        # An event of the user's own, recorded by the stale holder, is refused too.
        world.save(_start_run("run_lease"))
        with self.assertRaises(LeaseLostError):
            world.record_run_event("run_lease", _LeaseNote, note="stale")
        self.assertEqual(len(world.read_stream(run_stream_id("run_lease"))), 1)
        with other.run_lease("run_lease") as taken:
            taken.check()
            with self.assertRaises(LeaseLostError):
                lease.check()
            # The stale holder stops and gives back what it held: not the new lease.
            stale_block.__exit__(None, None, None)
            taken.check()
            self.assertIsNotNone(other.lease_holder("run_lease"))
            with (
                self.assertRaises(ConcurrentRunError),
                world.run_lease("run_lease"),
            ):
                self.fail("the stale holder got the lease back")
        self.assertIsNone(other.lease_holder("run_lease"))
        with world.run_lease("run_lease") as again:
            again.check()
        with self.assertRaisesRegex(LeaseLostError, "released"):
            again.check()

    def test_a_lease_is_checked_in_the_tasks_of_its_holder_only(self) -> None:
        world = self.world

        async def main() -> tuple[str, str]:
            with world.run_lease("run_lease"):
                inside = asyncio.create_task(_check_in_task())
                world.break_lease("run_lease")
                held_by_task = await inside
            # The block is over: this context no longer holds (or checks) the lease.
            check_leases()
            return held_by_task, "checked nothing"

        self.assertEqual(asyncio.run(main()), ("LeaseLostError", "checked nothing"))

    # ------------------------------------------------------------ bad ids

    def test_bad_run_ids_are_refused_by_every_entry_point(self) -> None:
        for bad in ["../etc/passwd", "a/b", "", "x" * 200, "nul\x00byte"]:
            for name, call in _entry_points(self.world, bad).items():
                with (
                    self.subTest(run_id=bad, entry_point=name),
                    self.assertRaises(InvalidRunIdError),
                ):
                    call()

    # --------------------------------------------------------- durability

    def test_everything_survives_close_and_reopen(self) -> None:
        self._require_persistent()
        self.enterContext(small_snapshot_intervals())
        world = self.open_world()
        run = _start_run("run_durable")
        session = _agent_step(run, "a", turns=3)
        ref = world.artifacts.put(b"kept", run_id="run_durable", step_path="a")
        world.save(run, session)
        run_events, session_events = world.read_stream(run.id), world.read_stream(session.id)
        log = world.read_run_log("run_durable")
        world.close()

        reopened = self.open_world()
        self.assertEqual(reopened.read_stream(run.id), run_events)
        self.assertEqual(reopened.read_stream(session.id), session_events)
        self.assertEqual(reopened.read_run_log("run_durable"), log)
        self.assertEqual(reopened.load_run("run_durable").fold.freeze(), run.fold.freeze())
        self.assertEqual(_session_view(reopened.load_session(session.id)), _session_view(session))
        self.assertEqual(reopened.artifacts.get(ref).payload, b"kept")
        # And it keeps going where the first world stopped.
        more = reopened.load_run("run_durable")
        more.trigger(RunCompleted, output="fin")
        reopened.save(more)
        self.assertEqual(len(reopened.read_stream(run.id)), len(run_events) + 1)

    def test_other_recorders_of_the_factory_leave_the_worlds_log_alone(self) -> None:
        """Tables that eventsourcing's process recorder of the world's factory makes, and
        the events of another application that uses the factory, change nothing of the
        world: opened again, it keeps its layout and reads all of its log and nothing
        of the other's."""
        self._require_persistent()
        world = self.open_world()
        recorder_class = type(world.app.recorder)
        # Before the world's first commit: a new world's tables are empty until then.
        env = {k: v for k, v in world.app.env.items() if k not in _CODEC_SETTINGS}
        beside = _BesideApplication(env=env)
        try:
            beside.save(_BesideNote("kept apart"))
        finally:
            beside.close()
        # A second process opening the world now writes where the first does.
        self.assertIs(type(self.open_world().app.recorder), recorder_class)
        run = _start_run("run_beside")
        world.save(run)
        run_events = world.read_stream(run.id)
        world.app.factory.process_recorder()  # its tables, made as eventsourcing makes them
        world.close()

        reopened = self.open_world()
        self.assertIs(type(reopened.app.recorder), recorder_class)
        self.assertEqual(reopened.read_stream(run.id), run_events)
        if self.apart_from_other_applications:
            topics = {n.topic for n in reopened.app.recorder.select_notifications(None, 1000)}
            self.assertFalse({t for t in topics if "Beside" in t}, topics)
            report = verify_world(reopened)
            self.assertTrue(report.ok, report)

    # --------------------------------------------- insert-only: never UPDATE/DELETE

    def full_exercise(self) -> int:
        """Drive worlds through every write path, reopening once; return the events stored."""
        world = self.make_world()
        try:
            run = _start_run("run_full")
            world.save(run)
            for step in range(3):
                _agent_step(run, f"agent{step}", turns=3, each=world.save)
                world.save(run)
            _task_steps(run, 8)
            world.save(run)
            stale = world.load_run("run_full")
            winner = world.load_run("run_full")
            winner.trigger(StepStarted, step_path="z", step_id="z", kind="task", visit=1, attempt=1)
            world.save(winner)
            stale.trigger(StepStarted, step_path="y", step_id="y", kind="task", visit=1, attempt=1)
            with self.assertRaises(ConcurrencyConflictError):
                world.save(stale)
            ref = world.artifacts.put(b"blob", run_id="run_full", step_path="z")
            world.artifacts.put(b"blob", run_id="run_full", step_path="z")
            with world.run_lease("run_full"):
                world.artifacts.get(ref)
            world.read_run_log("run_full")
        finally:
            world.close()

        again = self.make_world()
        try:
            resumed = again.load_run("run_full")
            resumed.trigger(RunCompleted, output=None)
            again.save(resumed)
            self.exercised_events = len(again.read_run_log("run_full"))
            return self.exercised_events
        finally:
            again.close()

    def test_never_updates_or_deletes_events(self) -> None:
        self._require_persistent()
        self.enterContext(small_snapshot_intervals())
        with self.trap_mutations():
            total = self.full_exercise()
        self.assertGreater(total, 50)


class EventRecorderTestCase(persistence.ApplicationRecorderTestCase[Any], WorldTestCase):
    """eventsourcing's application recorder case, on the recorder of a World on the backend."""

    durable: ClassVar[bool] = True
    """The ``durable`` every insert of the case passes (World.save passes False for a
    commit of write-ahead records alone)."""

    def create_recorder(self) -> ApplicationRecorder:
        """The event recorder of a new World on this test's storage."""
        recorder = self.open_world().app.recorder
        assert isinstance(recorder, ApplicationRecorder)
        if not self.durable:
            insert = functools.partial(recorder.insert_events, durable=False)
            self.enterContext(mock.patch.object(recorder, "insert_events", insert))
        return recorder

    def test_concurrent_no_conflicts(self, initial_position: int = 0) -> None:
        """eventsourcing's case, then a wait for the reader threads it leaves running."""
        before = set(threading.enumerate())
        try:
            super().test_concurrent_no_conflicts(initial_position)
        finally:
            # They stop at their next poll; the world must not be closed (nor its
            # files removed) under them, which can crash SQLite. Threads are named
            # after their target; a pool's own threads live until it closes.
            for thread in set(threading.enumerate()) - before:
                if thread.name.endswith("(read_continuously)"):
                    thread.join(timeout=30)


class WriteAheadEventRecorderTestCase(EventRecorderTestCase):
    """:class:`EventRecorderTestCase` with every insert a write-ahead one (``durable=False``)."""

    durable = False


class SnapshotRecorderTestCase(persistence.AggregateRecorderTestCase, WorldTestCase):
    """eventsourcing's aggregate recorder case, on the snapshot recorder of a World."""

    def create_recorder(self) -> AggregateRecorder:
        """The snapshot recorder of a new World on this test's storage."""
        snapshots = self.open_world().app.snapshots
        assert snapshots is not None, "LittleApplication snapshots Runs: a World has snapshots"
        return snapshots.recorder


class RunsViewTestCase(persistence.TrackingRecorderTestCase, WorldTestCase):
    """eventsourcing's tracking recorder case, on the backend's runs read model."""

    def create_recorder(self) -> TrackingRecorder:
        """The runs view of a new World on this test's storage."""
        return self.open_world().backend.runs_view()


class ProcessRecorderTestCase(persistence.ProcessRecorderTestCase, WorldTestCase):
    """eventsourcing's process recorder case, on the process recorder of the World's factory.

    A World writes no tracked events itself; the factory a backend gives it
    makes process recorders for eventsourcing applications that use it (with
    the backend's connections and commit policy), and they must hold too.
    """

    def create_recorder(self) -> ProcessRecorder:
        """A process recorder of the factory of a new World on this test's storage."""
        return self.open_world().app.factory.process_recorder()


_CODEC_SETTINGS = frozenset({"MAPPER_TOPIC", "TRANSCODER_TOPIC", "IS_SNAPSHOTTING_ENABLED"})


class ExampleApplicationTestCase(application.ExampleApplicationTestCase, WorldTestCase):
    """eventsourcing's example application (bank accounts) with ``PERSISTENCE_MODULE`` set to
    the World's factory, and that factory's other settings, in the process environment.

    It keeps its own codec (eventsourcing's JSON transcoder): what is tried is
    the factory, its recorders and their commit policy under an application
    that is not little_es's.
    """

    def example_env(self) -> dict[str, str]:
        """The environment of the example application: the World's factory settings."""
        world = self.open_world()
        return {k: v for k, v in world.app.env.items() if k not in _CODEC_SETTINGS}

    def test_example_application(self) -> None:
        """eventsourcing's test, with the factory settings in ``os.environ`` (read from there)."""
        env = self.example_env()
        self.expected_factory_topic = env["PERSISTENCE_MODULE"]
        self.assertTrue(self.expected_factory_topic.startswith("little_es."), env)
        with mock.patch.dict(os.environ, env):
            super().test_example_application()


class _BesideNote(EventsourcingAggregate):
    """An aggregate of an application other than the world's (:class:`_BesideApplication`)."""

    def __init__(self, text: str) -> None:
        self.text = text


class _BesideApplication(Application[UUID]):
    """An eventsourcing application that uses the world's factory and settings."""

"""The driver: start a run in a child process, SIGKILL it, resume it until it completes, check.

Kills come from a seeded :class:`random.Random`: a timer (``SIGKILL`` after a random
delay) or ``LITTLE_ES_CRASH_AFTER_APPENDS=N`` (the child kills itself right after its Nth
append), and, in :func:`torture`, first one run per append boundary ``N = 1, 2, ...``
of an uninterrupted run (all of them, or a seeded sample). After each process the driver reads
what the logs hold (what is committed); after the run completes it runs
:mod:`tests.torture.checker` and one more resume that must change nothing.

The run stops at its ``approve`` wait (the child exits
:data:`~tests.torture.child.WAITING_EXIT_CODE`): once the log says it waits, the
driver draws how the signal comes - ``World.signal`` or ``little signal`` between two
processes, or ``World.signal`` from a thread a seeded moment into the next process
(which may be killed, or stop at the wait again) - and goes on resuming.

A :class:`Torturer` has a mode: ``run`` (the torture workflow), ``loop`` (the outer
loop of :func:`tests.torture.workflow.build_loop`, each process driving the loop) or
``fork`` (a fork of a completed ``run`` at a seeded fork point, written by the driver
with ``fork_run`` and then resumed under kills like a run).

The engine that starts a child is a seam (:class:`Engine`): :class:`SubprocessEngine`
(a fresh interpreter per process) and :class:`ForkServerEngine` (forked from one that
has imported everything, several times cheaper) run the local scheduler;
:class:`tests.torture.temporal_engine.TemporalEngine` starts children that drive the run
on a Temporal worker.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

import orjson

from little_es import World, fork_points, fork_run, open_world, replay_run
from little_es.outer_loop import validate_outer_loop_id
from tests.torture.checker import (
    JSON,
    RunImage,
    Violation,
    WaitTrack,
    _names,
    canonical_runs,
    canonical_tree,
    check_final,
    check_fork,
    check_ledger,
    check_loop,
    check_loop_view,
    check_verify,
    check_verify_cli,
    check_wait,
    event_counts,
    fork_image,
    log_facts,
    loop_image,
    loop_run_ids,
    tree_run_ids,
)
from tests.torture.child import BUG_ENV, WAITING_EXIT_CODE
from tests.torture.ledger import Entry, Item, read_ledger
from tests.torture.workflow import APPROVAL, SIGNAL_ID, WAIT_STEP

Mode = Literal["run", "loop", "fork"]
MODES: tuple[Mode, ...] = ("loop", "fork", "run")
"""The order :func:`torture` takes the modes in for its random runs."""
TOP_STEPS = (
    "prepare",
    "flaky",
    "fan",
    "refine",
    "judge",
    "research",
    "orchestrate",
    "nested",
    "big",
    WAIT_STEP,
    "finish",
)
"""The torture workflow's top-level steps, in order."""
LEDGERED_TOP_STEPS = frozenset({"prepare", "flaky", "refine", "judge", "big", "finish"})
"""Of those, the task and decision steps (ledgered under their own step path)."""
AFTER_WAIT = ("finish",)
SIGNAL_HOWS = ("api", "cli", "live")
SIGNAL_WEIGHTS = (0.45, 0.15, 0.40)

REPO = Path(__file__).resolve().parents[2]
CRASH_AFTER_APPENDS = "LITTLE_ES_CRASH_AFTER_APPENDS"
CHILD_TIMEOUT_S = 120.0
MAX_CLEAN_RESUMES = 3
"""Resumes without a planned kill before a run that does not complete is a violation."""


class Process(Protocol):
    """A started child process."""

    def wait(self, kill_after: float) -> tuple[int, bool]:
        """Wait for it to exit, SIGKILLing it if it still runs after ``kill_after`` seconds.

        Returns its exit code (negative: the signal) and whether the kill was the
        engine's. Only the process's parent kills it, and before reaping it, so the
        signal cannot reach another process that reused the pid.
        """
        ...

    def output(self) -> str:
        """What it wrote to stdout and stderr (once it exited)."""
        ...


class Engine(Protocol):
    """How a child process that runs (or resumes) one run is started.

    The engines here run the local scheduler; an engine on Temporal starts a child that
    drives the run on a Temporal worker, and is closed with its worker.
    """

    name: str

    def start(self, argv: list[str], env: dict[str, str], out: Path) -> Process:
        """Start ``python -m tests.torture.child ARGV`` with exactly ``env``."""
        ...

    def close(self) -> None:
        """Stop whatever the engine started for itself."""
        ...


class _Popen:
    def __init__(self, proc: subprocess.Popen[bytes], out: Path) -> None:
        self._proc = proc
        self._out = out

    def wait(self, kill_after: float) -> tuple[int, bool]:
        try:
            return self._proc.wait(kill_after), False
        except subprocess.TimeoutExpired:
            # Popen.send_signal does nothing once the process is reaped.
            self._proc.send_signal(signal.SIGKILL)
            return self._proc.wait(), True

    def output(self) -> str:
        return self._out.read_text(errors="replace")


@dataclass
class SubprocessEngine:
    """The local scheduler in a fresh interpreter per process: ``python -m tests.torture.child``."""

    name: str = "local"

    def start(self, argv: list[str], env: dict[str, str], out: Path) -> Process:
        """Start the child."""
        with out.open("wb") as sink:
            proc = subprocess.Popen(
                [sys.executable, "-m", "tests.torture.child", *argv],
                cwd=REPO,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=subprocess.STDOUT,
            )
        return _Popen(proc, out)

    def close(self) -> None:
        """Nothing to stop."""


class _Forked:
    def __init__(self, server: ForkServerEngine, pid: int, out: Path) -> None:
        self._server = server
        self._pid = pid
        self._out = out

    def wait(self, kill_after: float) -> tuple[int, bool]:
        self._server.send({"op": "wait", "pid": self._pid, "kill_after": kill_after})
        reply = self._server.receive()
        return int(reply["code"]), bool(reply["killed"])

    def output(self) -> str:
        return self._out.read_text(errors="replace")


@dataclass
class ForkServerEngine:
    """The local scheduler in processes forked from :mod:`tests.torture.forkserver`.

    Several times cheaper per process than :class:`SubprocessEngine` (no imports); one
    process at a time.
    """

    name: str = "local-fork"
    _server: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)

    def _proc(self) -> subprocess.Popen[bytes]:
        if self._server is None:
            env = {k: v for k, v in os.environ.items() if not k.startswith("LITTLE_ES_CRASH_")}
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
            self._server = subprocess.Popen(
                [sys.executable, "-m", "tests.torture.forkserver"],
                cwd=REPO,
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
            )
        return self._server

    def send(self, request: dict[str, object]) -> None:
        """Send one request line."""
        stdin = self._proc().stdin
        assert stdin is not None
        stdin.write(orjson.dumps(request) + b"\n")
        stdin.flush()

    def receive(self) -> dict[str, int]:
        """The next reply line."""
        stdout = self._proc().stdout
        assert stdout is not None
        line = stdout.readline()
        if not line:
            raise ChildFailedError("the fork server exited")
        reply: dict[str, int] = orjson.loads(line)
        return reply

    def start(self, argv: list[str], env: dict[str, str], out: Path) -> Process:
        """Fork the child."""
        self.send({"op": "spawn", "argv": argv, "env": env, "out": str(out)})
        reply = self.receive()
        return _Forked(self, int(reply["pid"]), out)

    def close(self) -> None:
        """Stop the fork server."""
        if self._server is not None:
            assert self._server.stdin is not None
            self._server.stdin.close()
            self._server.wait(10)
            self._server = None


@dataclass(frozen=True)
class TimerKill:
    """SIGKILL the child this many seconds after it started."""

    seconds: float

    def __str__(self) -> str:
        return f"timer {self.seconds:.3f}s"


@dataclass(frozen=True)
class AppendsKill:
    """The child kills itself right after its Nth append (``LITTLE_ES_CRASH_AFTER_APPENDS``)."""

    appends: int

    def __str__(self) -> str:
        return f"after {self.appends} appends"


Kill = TimerKill | AppendsKill
KillKind = Literal["timer", "appends"]
"""A kill whose moment is drawn when its process starts (:meth:`Torturer.draw`)."""


@dataclass(frozen=True)
class Segment:
    """One process of a run: how it was meant to die, and whether it did."""

    index: int
    kill: Kill | None
    killed: bool
    seconds: float
    waiting: bool = False
    """It exited because the run waits for a signal."""


@dataclass
class RunReport:
    """One torture run: its processes, the violations found, the re-executed in-flight items."""

    run_id: str
    mode: Mode = "run"
    segments: list[Segment] = field(default_factory=list)
    violations: list[Violation] = field(default_factory=list)
    reexecuted: int = 0
    wait: WaitTrack = field(default_factory=WaitTrack)
    fork: str = ""
    """For a fork: ``origin@point``."""
    inherited: set[Item] = field(default_factory=set)
    """For a fork: what its tree held committed when it was written."""

    @property
    def kills(self) -> int:
        """Processes that died by SIGKILL."""
        return sum(s.killed for s in self.segments)

    @property
    def resumes(self) -> int:
        """Processes after the first (the final no-op resume not counted)."""
        return max(0, len(self.segments) - 1)

    def describe(self) -> str:
        """The run's kill plan, to reproduce it."""
        plan = ", ".join(
            f"{s.index}:{s.kill or 'none'}"
            f"{' (killed)' if s.killed else ''}{' (waiting)' if s.waiting else ''}"
            for s in self.segments
        )
        extra = ""
        if self.wait.how:
            extra += f" signal={self.wait.how}@{self.wait.signal_segment}"
        if self.fork:
            extra += f" fork={self.fork}"
        return f"{self.mode} {self.run_id} [{plan}]{extra}"


class ChildFailedError(RuntimeError):
    """A child exited with an error of its own (not a planned kill)."""


@dataclass
class Torturer:
    """Runs torture runs of one world, each checked against one uninterrupted run.

    ``mode`` (see the module): ``run`` and ``loop`` run their own uninterrupted
    reference; ``fork`` takes ``origin``'s (a ``run`` torturer: a fork of a completed
    run must end as the run did) and forks runs of it.
    """

    world_url: str
    workdir: Path
    engine: Engine = field(default_factory=SubprocessEngine)
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment of every child (``TORTURE_BUG`` for the checker's own test)."""
    rng: random.Random = field(default_factory=lambda: random.Random(0))
    mode: Mode = "run"
    origin: Torturer | None = None
    """For ``fork``: the ``run`` torturer whose completed runs are forked."""
    owns_engine: bool = True
    shares: Torturer | None = None
    """Read the world through this torturer's (opened) world: one connection pool."""
    world: World = field(init=False)
    reference: dict[str, RunImage] = field(init=False, default_factory=dict)
    reference_loop: JSON = field(init=False, default=None)
    reference_seconds: float = field(init=False, default=1.0)
    reference_events: int = field(init=False, default=1)
    startup_seconds: float = field(init=False, default=0.0)
    completed_runs: list[str] = field(init=False, default_factory=list)
    """Runs of this torturer that completed with no violation (what a fork may fork)."""
    _reference_appends: int | None = field(init=False, default=None)
    _reference_run_id: str = field(init=False, default="")

    def __post_init__(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)

    def _ledger(self, run_id: str) -> Path:
        return self.workdir / f"{run_id}.ledger"

    def _spawn(self, run_id: str, segment: int, kill: Kill | None) -> Segment:
        env = {k: v for k, v in os.environ.items() if not k.startswith("LITTLE_ES_CRASH_")}
        env.pop(BUG_ENV, None)
        env.update(self.env)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        if isinstance(kill, AppendsKill):
            env[CRASH_AFTER_APPENDS] = str(kill.appends)
        argv = [
            "--world",
            self.world_url,
            "--run-id",
            run_id,
            "--ledger",
            str(self._ledger(run_id)),
            "--segment",
            str(segment),
        ]
        if self.mode == "loop":
            argv.append("--loop")
        out = self.workdir / f"{run_id}.{segment}.out"
        proc = self.engine.start(argv, env, out)
        # After start: a fork server's first start waits for its own imports.
        started = time.monotonic()
        timer = isinstance(kill, TimerKill)
        code, ours = proc.wait(kill.seconds if isinstance(kill, TimerKill) else CHILD_TIMEOUT_S)
        if ours and not timer:
            raise ChildFailedError(f"{run_id} process {segment} hung: {proc.output()[-4000:]}")
        seconds = time.monotonic() - started
        if code not in (0, WAITING_EXIT_CODE, -signal.SIGKILL):
            raise ChildFailedError(
                f"{run_id} process {segment} exited {code}: {proc.output()[-4000:]}"
            )
        waiting = code == WAITING_EXIT_CODE
        return Segment(segment, kill, code == -signal.SIGKILL, seconds, waiting)

    def _complete(self, run_id: str, first: int = 0) -> float:
        """Run ``run_id`` with no kill to its end, signalling its wait; the seconds it took."""
        seconds = 0.0
        for index in range(first, first + 2 + MAX_CLEAN_RESUMES):
            seg = self._spawn(run_id, index, None)
            seconds += seg.seconds
            if not seg.waiting:
                return seconds
            self.signal(run_id, "api")
        raise ChildFailedError(f"{run_id} kept waiting after its signal")

    def open(self) -> None:
        """Run the uninterrupted reference run and open the world the checks read."""
        self.world = self.shares.world if self.shares is not None else open_world(self.world_url)
        if self.mode == "fork":
            assert self.origin is not None, "a fork torturer forks runs of a run torturer"
            origin = self.origin
            self.reference = origin.reference
            self.reference_seconds = origin.reference_seconds
            self.reference_events = origin.reference_events
            self.startup_seconds = origin.startup_seconds
            self._reference_appends = origin.reference_appends
            return
        run_id = f"torture-{self.mode}-ref-{os.getpid()}-{time.time_ns() % 10**9}"
        self.reference_seconds = self._complete(run_id)
        violations: list[Violation] = []
        self.reference = self.images(run_id, violations)
        if self.mode == "loop":
            self.reference_loop = self._loop_image(run_id)
        if violations:
            raise AssertionError(f"the uninterrupted run fails its own checks: {violations}")
        self.reference_events = self._events(run_id)
        # A resume of a completed run is all startup: imports, opening the world, replay.
        self.startup_seconds = self._spawn(run_id, 9, None).seconds
        self._reference_run_id = run_id
        self.completed_runs.append(run_id)

    def _loop_image(self, loop_id: str) -> JSON:
        loop = self.world.load_outer_loop(loop_id)
        assert loop is not None, f"outer loop {loop_id} has no log"
        return loop_image(self.world, loop, loop_id)

    def tree(self, run_id: str) -> list[str]:
        """The runs a torture run consists of: the run's tree, or the loop's runs' trees."""
        if self.mode != "loop":
            return tree_run_ids(self.world, run_id)
        loop = self.world.load_outer_loop(validate_outer_loop_id(run_id))
        return [] if loop is None else loop_run_ids(self.world, loop)

    def images(self, run_id: str, violations: list[Violation]) -> dict[str, RunImage]:
        """The final state of every run of the torture run (:func:`canonical_runs`)."""
        if self.mode == "run":
            return canonical_tree(self.world, run_id, violations)
        run_ids = self.tree(run_id)
        if self.mode == "loop":
            roots = {r: r.replace(run_id, "<loop>") for r in run_ids}
            # The planners' context names the loop by its id.
            roots[run_id] = "<loop>"
        else:
            # The fork's kept sub-runs are its origin's: their parent is the origin.
            forked = replay_run(self.world, run_id).state.forked_from
            roots = {run_id: "<run>"}
            if forked is not None:
                roots[forked.origin_run_id] = "<run>"
        names = _names(self.world, run_ids, roots)
        return canonical_runs(self.world, run_ids, names, violations)

    @property
    def reference_appends(self) -> int:
        """How many appends an uninterrupted run makes: the last N a kill after N hits.

        Found by bisection (a few killed runs) the first time it is asked for (a loop's:
        its events).
        """
        if self._reference_appends is None and self.mode == "loop":
            # No boundary runs of a loop: its events bound its appends (each save is one
            # append of one or a few events), cheaper than a bisection.
            self._reference_appends = self.reference_events
        if self._reference_appends is None:
            self._reference_appends = self._count_appends(self._reference_run_id)
        return self._reference_appends

    def _count_appends(self, reference: str) -> int:
        lo, hi = 1, self.reference_events
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self._spawn(f"{reference}-probe{mid}", 0, AppendsKill(mid)).killed:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def _events(self, run_id: str) -> int:
        return sum(self.event_counts(run_id).values())

    def event_counts(self, run_id: str) -> dict[str, int]:
        """How many events each run of the torture run holds (and the loop's own stream)."""
        counts = event_counts(self.world, self.tree(run_id))
        if self.mode == "loop":
            loop = self.world.load_outer_loop(validate_outer_loop_id(run_id))
            counts["<loop>"] = 0 if loop is None else loop.version
        return counts

    def draw(self, kind: KillKind, run_id: str) -> Kill:
        """The moment of a kill of ``kind`` for the next process of ``run_id``.

        A timer is drawn from half the startup time to the whole time of an
        uninterrupted run (so a few land before the first append); an append count from
        1 to the appends the run has still to make, estimated from the events it has
        still to record.
        """
        if kind == "timer":
            return TimerKill(self.rng.uniform(self.startup_seconds / 2, self.reference_seconds))
        left = max(0.0, 1 - self._events(run_id) / self.reference_events)
        return AppendsKill(self.rng.randint(1, max(1, round(self.reference_appends * left))))

    def close(self) -> None:
        """Close the world and the engine (each when it is this torturer's)."""
        if self.shares is None:
            self.world.close()
        if self.owns_engine:
            self.engine.close()

    def committed(self, run_id: str) -> set[Item]:
        """What the logs of ``run_id``'s runs hold now."""
        return log_facts(self.world, self.tree(run_id)).committed

    def waiting(self, run_id: str) -> bool:
        """Whether the log says the run waits at its ``approve`` step, unsignalled."""
        if self.mode == "loop" or not self.world.run_exists(run_id):
            return False
        wait = replay_run(self.world, run_id).state.waits.get(WAIT_STEP)
        return wait is not None and wait.status == "waiting"

    def _signalled(self, run_id: str) -> bool:
        wait = replay_run(self.world, run_id).state.waits.get(WAIT_STEP)
        return wait is not None and wait.status == "signalled"

    def signal(self, run_id: str, how: str) -> None:
        """Send the ``approve`` signal: ``World.signal`` (``api``, ``live``), ``little signal``."""
        if how == "cli":
            _little_signal(self.world_url, run_id)
            return
        with open_world(self.world_url) as world:
            world.signal(
                run_id, WAIT_STEP, dict(APPROVAL), signal_id=SIGNAL_ID, sent_by="torture driver"
            )

    def run(self, run_id: str, kills: Sequence[Kill | KillKind]) -> RunReport:
        """One torture run: a process per kill in ``kills``, then resumes until it completes.

        A process that completes before its kill ends the planned kills. Then the
        checks, and one more resume that must record nothing and execute nothing. A
        process that fails by itself (an exception, not a kill) is a violation too.
        """
        report = RunReport(run_id, self.mode)
        try:
            self._run(report, kills)
        except ChildFailedError as exc:
            report.violations.append(Violation(run_id, str(exc)))
        return report

    def fork(
        self,
        fork_id: str,
        kills: Sequence[Kill | KillKind],
        *,
        origin: str | None = None,
        at: str | None = None,
    ) -> RunReport:
        """One torture run of a fork: fork a completed run at a seeded point, then :meth:`run`.

        The origin is drawn from the last completed runs of :attr:`origin` (or given), the
        point from its fork points (or given).
        """
        assert self.mode == "fork" and self.origin is not None
        origin = origin or self.rng.choice(self.origin.completed_runs[-5:])
        at = at or self.rng.choice(fork_points(self.world, origin))
        fork_run(self.world, origin, at=at, new_run_id=fork_id)
        inherited = self.committed(fork_id)
        report = RunReport(fork_id, self.mode, fork=f"{origin}@{at}", inherited=inherited)
        try:
            entries = self._run(report, kills)
        except ChildFailedError as exc:
            report.violations.append(Violation(fork_id, str(exc)))
            return report
        report.violations.extend(
            check_fork(
                fork_id, self.world, origin, at, inherited, entries, TOP_STEPS, LEDGERED_TOP_STEPS
            )
        )
        return report

    def _run(self, report: RunReport, kills: Sequence[Kill | KillKind]) -> list[Entry]:
        run_id = report.run_id
        committed_after: list[set[Item]] = []
        inherited = self.committed(run_id) if self.mode == "fork" else set()
        plan: list[Kill | KillKind] = list(kills)
        track = report.wait
        if self.mode == "fork" and not self.waiting(run_id) and self._signalled(run_id):
            # Forked after the wait: the prefix holds its signal, which the fork keeps.
            track.waited_segment, track.signal_segment = -1, 0
            track.committed_before = inherited
        live: _LiveSignal | None = None
        while True:
            if len(report.segments) >= len(kills) + MAX_CLEAN_RESUMES + 2:
                report.violations.append(
                    Violation(run_id, f"did not complete: {report.describe()}")
                )
                return []
            planned = plan.pop(0) if plan else None
            kill = self.draw(planned, run_id) if isinstance(planned, str) else planned
            index = len(report.segments)
            if track.how == "live" and track.signal_segment is None:
                delay = self.rng.uniform(0, max(0.05, 1.5 * self.startup_seconds))
                live = _LiveSignal(self, run_id, delay)
                track.signal_segment = index
            seg = self._spawn(run_id, index, kill)
            report.segments.append(seg)
            if live is not None:
                error = live.join()
                if error:
                    report.violations.append(Violation(run_id, f"live signal failed: {error}"))
                live = None
            committed_after.append(self.committed(run_id))
            if track.waited_segment is None and self.waiting(run_id):
                track.waited_segment = index
                track.committed_before = committed_after[-1]
                track.how = self.rng.choices(SIGNAL_HOWS, SIGNAL_WEIGHTS)[0]
                if track.how != "live":
                    self.signal(run_id, track.how)
                    track.signal_segment = index + 1
            if not seg.killed and not seg.waiting:
                break
        run_ids = self.tree(run_id)
        final = log_facts(self.world, run_ids)
        final.ledgered -= inherited
        # A loop's planner runs and cycle runs all complete (its cycles do not fail).
        for rid in run_ids if self.mode == "loop" else [run_id]:
            state = self.world_state(rid)
            if state != "completed":
                report.violations.append(Violation(rid, f"ended {state}, not completed"))
        ledger = read_ledger(self._ledger(run_id))
        checked = check_ledger(run_id, ledger, committed_after, final)
        report.violations.extend(checked.violations)
        report.reexecuted = checked.reexecuted
        images = self.images(run_id, report.violations)
        if self.mode == "fork":
            images = fork_image(images)
        report.violations.extend(check_final(run_id, images, self.reference))
        for rid in run_ids if self.mode == "loop" else [run_id]:
            report.violations.extend(check_verify(self.world, rid))
        if self.mode == "loop":
            got = self._loop_image(run_id)
            again = self._loop_image(run_id)
            report.violations.extend(check_loop(run_id, got, self.reference_loop, again))
            report.violations.extend(check_loop_view(self.world, run_id))
        else:
            report.violations.extend(
                check_wait(run_id, self.world, WAIT_STEP, APPROVAL, AFTER_WAIT, ledger, track)
            )
        before = self.event_counts(run_id)
        self._spawn(run_id, len(report.segments), None)
        after = self.event_counts(run_id)
        if after != before:
            report.violations.append(
                Violation(run_id, f"one more resume recorded events: {before} -> {after}")
            )
        if len(read_ledger(self._ledger(run_id))) != len(ledger):
            report.violations.append(Violation(run_id, "one more resume executed something"))
        if not report.violations:
            self.completed_runs.append(run_id)
        return ledger

    def world_state(self, run_id: str) -> str:
        """The status the run's log says."""
        return replay_run(self.world, run_id).state.status


class _LiveSignal:
    """``World.signal`` from a thread (its own world), ``delay`` seconds from now."""

    def __init__(self, torturer: Torturer, run_id: str, delay: float) -> None:
        self._error = ""
        self._thread = threading.Thread(
            target=self._send, args=(torturer, run_id, delay), daemon=True
        )
        self._thread.start()

    def _send(self, torturer: Torturer, run_id: str, delay: float) -> None:
        time.sleep(delay)
        try:
            torturer.signal(run_id, "live")
        except Exception as exc:  # reported as a violation by the driver
            self._error = f"{type(exc).__name__}: {exc}"

    def join(self) -> str:
        """Wait for the signal to be sent; what went wrong, or ``""``."""
        self._thread.join(CHILD_TIMEOUT_S)
        return self._error or ("still sending" if self._thread.is_alive() else "")


def _little_signal(world_url: str, run_id: str) -> None:
    """``little signal RUN approve --data JSON --signal-id ID``, as a user would send it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LITTLE_ES_CRASH_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    data = orjson.dumps(dict(APPROVAL)).decode()
    argv = [sys.executable, "-m", "little_es.cli", "signal", run_id, WAIT_STEP]
    argv += ["--data", data, "--signal-id", SIGNAL_ID, "--world", world_url]
    done = subprocess.run(
        argv,
        env=env,
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT_S,
        check=False,
    )
    if done.returncode != 0:
        tail = (done.stdout + done.stderr)[-2000:]
        raise ChildFailedError(f"little signal {run_id} exited {done.returncode}: {tail}")


@dataclass
class Summary:
    """The totals of :func:`torture`."""

    runs: int = 0
    loop_runs: int = 0
    fork_runs: int = 0
    signals: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SIGNAL_HOWS, 0))
    """Waits signalled, by how the signal came (``api``, ``cli``, ``live``)."""
    kills: int = 0
    resumes: int = 0
    reexecuted: int = 0
    violations: list[str] = field(default_factory=list)
    seconds: float = 0.0
    engine: str = ""

    def line(self, world_url: str) -> str:
        """The one summary line."""
        signals = ",".join(f"{how}:{n}" for how, n in self.signals.items())
        return (
            f"torture engine={self.engine} world={_redact(world_url)} runs={self.runs}"
            f" loop_runs={self.loop_runs} fork_runs={self.fork_runs} signals={signals}"
            f" kills={self.kills} resumes={self.resumes}"
            f" reexecuted_in_flight={self.reexecuted} violations={len(self.violations)}"
            f" seconds={self.seconds:.1f}"
        )

    def add(self, report: RunReport) -> None:
        """Count one run."""
        self.runs += 1
        self.loop_runs += report.mode == "loop"
        self.fork_runs += report.mode == "fork"
        if report.wait.how:
            self.signals[report.wait.how] += 1
        self.kills += report.kills
        self.resumes += report.resumes
        self.reexecuted += report.reexecuted
        self.violations.extend(f"{v} (plan: {report.describe()})" for v in report.violations)


def _redact(url: str) -> str:
    head, sep, tail = url.partition("@")
    if sep and ":" in head.split("//", 1)[-1]:
        return head.rsplit(":", 1)[0] + ":***@" + tail
    return url


def random_kills(rng: random.Random, max_kills: int) -> list[KillKind]:
    """One to ``max_kills`` kills, each a timer or an append count, drawn from ``rng``."""
    return ["timer" if rng.random() < 0.5 else "appends" for _ in range(rng.randint(1, max_kills))]


def torture(
    world_url: str,
    *,
    kills: int,
    seed: int,
    boundaries: int | None = None,
    engine: Engine | None = None,
    workdir: Path | None = None,
    log: bool = False,
) -> Summary:
    """Kill runs of the torture workflow until ``kills`` processes died, checking each run.

    First one run per append boundary: killed after its 1st append, its 2nd, ... its
    last (``boundaries=None``), or after ``boundaries`` of them drawn from ``seed`` (the
    first and the last among them; 0: none). Then runs with one to four seeded random
    kills each, in turn of an outer loop, a fork of a completed run and a run, until
    ``kills`` processes died and each mode ran at least once.
    """
    started = time.monotonic()
    rng = random.Random(seed)
    engine = engine or ForkServerEngine()
    summary = Summary(engine=engine.name)
    with tempfile.TemporaryDirectory(prefix="little-es-torture-") as tmp:
        work = workdir or Path(tmp)
        torturer = Torturer(world_url, work, engine, rng=rng)
        torturers: dict[Mode, Torturer] = {"run": torturer}
        try:
            torturer.open()
            prefix = f"torture-{seed}-{os.getpid()}-{time.time_ns() % 10**6}"
            for boundary in _boundaries(rng, torturer, boundaries):
                if summary.kills >= kills:
                    break
                report = torturer.run(f"{prefix}-n{boundary:04d}", [AppendsKill(boundary)])
                summary.add(report)
                _log(log, report)
                if not report.segments or not report.segments[0].killed:
                    # Concurrent steps can group their commits differently from one run
                    # to the next: this run made fewer appends than the bisected one.
                    break
            torturers["loop"] = Torturer(
                world_url, work, engine, rng=rng, mode="loop", owns_engine=False, shares=torturer
            )
            torturers["loop"].open()
            torturers["fork"] = Torturer(
                world_url,
                work,
                engine,
                rng=rng,
                mode="fork",
                origin=torturer,
                owns_engine=False,
                shares=torturer,
            )
            torturers["fork"].open()
            i = 0
            seen: set[Mode] = set()
            while summary.kills < kills or len(seen) < len(MODES):
                mode = MODES[i % len(MODES)]
                i += 1
                plan = random_kills(rng, max(1, min(4, kills - summary.kills)))
                name = f"{prefix}-{mode[0]}{i:04d}"
                t = torturers[mode]
                report = t.fork(name, plan) if mode == "fork" else t.run(name, plan)
                seen.add(mode)
                summary.add(report)
                _log(log, report)
            # Once per invocation (a fresh interpreter costs a second or two): every
            # stream of the world, the reference and probe runs included.
            summary.violations.extend(str(v) for v in check_verify_cli(world_url))
        finally:
            for t in reversed(torturers.values()):
                if hasattr(t, "world"):
                    t.close()
    summary.seconds = time.monotonic() - started
    return summary


def _boundaries(rng: random.Random, torturer: Torturer, sample: int | None) -> list[int]:
    if sample == 0:
        return []
    every = list(range(1, torturer.reference_appends + 1))
    if sample is None or sample >= len(every):
        return every
    inner = rng.sample(every[1:-1], max(0, sample - 2))
    return sorted({every[0], every[-1], *inner})


def _log(enabled: bool, report: RunReport) -> None:
    if enabled:
        status = f"{len(report.violations)} violation(s)" if report.violations else "ok"
        print(f"  {report.describe()}: {status}", file=sys.stderr, flush=True)
        for v in report.violations:
            print(f"    {v}", file=sys.stderr, flush=True)

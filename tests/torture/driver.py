"""The driver: start a run in a child process, SIGKILL it, resume it until it completes, check.

Kills come from a seeded :class:`random.Random`: a timer (``SIGKILL`` after a random
delay) or ``LITTLE_ES_CRASH_AFTER_APPENDS=N`` (the child kills itself right after its Nth
append), and, in :func:`torture`, first one run per append boundary ``N = 1, 2, ...``
of an uninterrupted run (all of them, or a seeded sample). After each process the driver reads
what the logs hold (what is committed); after the run completes it runs
:mod:`tests.torture.checker` and one more resume that must change nothing.

The engine that starts a child is a seam (:class:`Engine`): :class:`SubprocessEngine`
(a fresh interpreter per process) and :class:`ForkServerEngine` (forked from one that
has imported everything, several times cheaper) run the local scheduler; an engine on
Temporal starts children that drive the run on a worker.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

import orjson

from little_es import World, open_world, replay_run
from tests.torture.checker import (
    RunImage,
    Violation,
    canonical_tree,
    check_final,
    check_ledger,
    check_verify,
    check_verify_cli,
    event_counts,
    log_facts,
    tree_run_ids,
)
from tests.torture.child import BUG_ENV
from tests.torture.ledger import Item, read_ledger

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


@dataclass
class RunReport:
    """One torture run: its processes, the violations found, the re-executed in-flight items."""

    run_id: str
    segments: list[Segment] = field(default_factory=list)
    violations: list[Violation] = field(default_factory=list)
    reexecuted: int = 0

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
            f"{s.index}:{s.kill or 'none'}{' (killed)' if s.killed else ''}" for s in self.segments
        )
        return f"{self.run_id} [{plan}]"


class ChildFailedError(RuntimeError):
    """A child exited with an error of its own (not a planned kill)."""


@dataclass
class Torturer:
    """Runs torture runs of one world, each checked against one uninterrupted run."""

    world_url: str
    workdir: Path
    engine: Engine = field(default_factory=SubprocessEngine)
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment of every child (``TORTURE_BUG`` for the checker's own test)."""
    rng: random.Random = field(default_factory=lambda: random.Random(0))
    world: World = field(init=False)
    reference: dict[str, RunImage] = field(init=False, default_factory=dict)
    reference_seconds: float = field(init=False, default=1.0)
    reference_events: int = field(init=False, default=1)
    startup_seconds: float = field(init=False, default=0.0)
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
        out = self.workdir / f"{run_id}.{segment}.out"
        proc = self.engine.start(argv, env, out)
        # After start: a fork server's first start waits for its own imports.
        started = time.monotonic()
        timer = isinstance(kill, TimerKill)
        code, ours = proc.wait(kill.seconds if isinstance(kill, TimerKill) else CHILD_TIMEOUT_S)
        if ours and not timer:
            raise ChildFailedError(f"{run_id} process {segment} hung: {proc.output()[-4000:]}")
        seconds = time.monotonic() - started
        if code not in (0, -signal.SIGKILL):
            raise ChildFailedError(
                f"{run_id} process {segment} exited {code}: {proc.output()[-4000:]}"
            )
        return Segment(segment, kill, code == -signal.SIGKILL, seconds)

    def open(self) -> None:
        """Run the uninterrupted reference run and open the world the checks read."""
        run_id = f"torture-ref-{os.getpid()}-{time.time_ns() % 10**9}"
        seg = self._spawn(run_id, 0, None)
        self.reference_seconds = seg.seconds
        self.world = open_world(self.world_url)
        violations: list[Violation] = []
        self.reference = canonical_tree(self.world, run_id, violations)
        if violations:
            raise AssertionError(f"the uninterrupted run fails its own checks: {violations}")
        self.reference_events = self._events(run_id)
        # A resume of a completed run is all startup: imports, opening the world, replay.
        self.startup_seconds = self._spawn(run_id, 1, None).seconds
        self._reference_run_id = run_id

    @property
    def reference_appends(self) -> int:
        """How many appends an uninterrupted run makes: the last N a kill after N hits.

        Found by bisection (a few killed runs) the first time it is asked for.
        """
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
        if not self.world.run_exists(run_id):
            return 0
        return sum(event_counts(self.world, tree_run_ids(self.world, run_id)).values())

    def draw(self, kind: KillKind, run_id: str) -> Kill:
        """The moment of a kill of ``kind`` for the next process of ``run_id``.

        A timer is drawn from half the startup time to the whole time of an
        uninterrupted run (so a few land before the first append); an append count from
        1 to the appends the run has still to make, estimated from the events it has
        still to record.
        """
        if kind == "timer":
            return TimerKill(self.rng.uniform(self.startup_seconds / 2, self.reference_seconds))
        left = 1 - self._events(run_id) / self.reference_events
        return AppendsKill(self.rng.randint(1, max(1, round(self.reference_appends * left))))

    def close(self) -> None:
        """Close the world and the engine."""
        self.world.close()
        self.engine.close()

    def committed(self, run_id: str) -> set[Item]:
        """What the logs of ``run_id``'s tree hold now."""
        return log_facts(self.world, tree_run_ids(self.world, run_id)).committed

    def run(self, run_id: str, kills: Sequence[Kill | KillKind]) -> RunReport:
        """One torture run: a process per kill in ``kills``, then resumes until it completes.

        A process that completes before its kill ends the planned kills. Then the
        checks, and one more resume that must record nothing and execute nothing. A
        process that fails by itself (an exception, not a kill) is a violation too.
        """
        report = RunReport(run_id)
        try:
            self._run(report, kills)
        except ChildFailedError as exc:
            report.violations.append(Violation(run_id, str(exc)))
        return report

    def _run(self, report: RunReport, kills: Sequence[Kill | KillKind]) -> None:
        run_id = report.run_id
        committed_after: list[set[Item]] = []
        plan: list[Kill | KillKind] = list(kills)
        completed = False
        while not completed:
            if len(report.segments) >= len(kills) + MAX_CLEAN_RESUMES:
                report.violations.append(
                    Violation(run_id, f"did not complete: {report.describe()}")
                )
                return
            planned = plan.pop(0) if plan else None
            kill = self.draw(planned, run_id) if isinstance(planned, str) else planned
            seg = self._spawn(run_id, len(report.segments), kill)
            report.segments.append(seg)
            committed_after.append(self.committed(run_id))
            if not seg.killed:
                completed = True
        run_ids = tree_run_ids(self.world, run_id)
        final = log_facts(self.world, run_ids)
        state = self.world_state(run_id)
        if state != "completed":
            report.violations.append(Violation(run_id, f"ended {state}, not completed"))
        ledger = read_ledger(self._ledger(run_id))
        checked = check_ledger(run_id, ledger, committed_after, final)
        report.violations.extend(checked.violations)
        report.reexecuted = checked.reexecuted
        images = canonical_tree(self.world, run_id, report.violations)
        report.violations.extend(check_final(run_id, images, self.reference))
        report.violations.extend(check_verify(self.world, run_id))
        before = event_counts(self.world, run_ids)
        self._spawn(run_id, len(report.segments), None)
        after = event_counts(self.world, tree_run_ids(self.world, run_id))
        if after != before:
            report.violations.append(
                Violation(run_id, f"one more resume recorded events: {before} -> {after}")
            )
        if len(read_ledger(self._ledger(run_id))) != len(ledger):
            report.violations.append(Violation(run_id, "one more resume executed something"))

    def world_state(self, run_id: str) -> str:
        """The status the run's log says."""
        return replay_run(self.world, run_id).state.status


@dataclass
class Summary:
    """The totals of :func:`torture`."""

    runs: int = 0
    kills: int = 0
    resumes: int = 0
    reexecuted: int = 0
    violations: list[str] = field(default_factory=list)
    seconds: float = 0.0
    engine: str = ""

    def line(self, world_url: str) -> str:
        """The one summary line."""
        return (
            f"torture engine={self.engine} world={_redact(world_url)} runs={self.runs}"
            f" kills={self.kills} resumes={self.resumes}"
            f" reexecuted_in_flight={self.reexecuted} violations={len(self.violations)}"
            f" seconds={self.seconds:.1f}"
        )

    def add(self, report: RunReport) -> None:
        """Count one run."""
        self.runs += 1
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
    kills each.
    """
    started = time.monotonic()
    rng = random.Random(seed)
    engine = engine or ForkServerEngine()
    summary = Summary(engine=engine.name)
    with tempfile.TemporaryDirectory(prefix="little-es-torture-") as tmp:
        torturer = Torturer(world_url, workdir or Path(tmp), engine, rng=rng)
        torturer.open()
        try:
            prefix = f"torture-{seed}-{os.getpid()}-{time.time_ns() % 10**6}"
            for boundary in _boundaries(rng, torturer, boundaries):
                if summary.kills >= kills:
                    break
                report = torturer.run(f"{prefix}-n{boundary:04d}", [AppendsKill(boundary)])
                summary.add(report)
                _log(log, report)
                if not report.segments[0].killed:
                    # Concurrent steps can group their commits differently from one run
                    # to the next: this run made fewer appends than the bisected one.
                    break
            i = 0
            while summary.kills < kills:
                i += 1
                plan = random_kills(rng, min(4, kills - summary.kills))
                report = torturer.run(f"{prefix}-r{i:04d}", plan)
                summary.add(report)
                _log(log, report)
            # Once per invocation (a fresh interpreter costs a second or two): every
            # stream of the world, the reference and probe runs included.
            summary.violations.extend(str(v) for v in check_verify_cli(world_url))
        finally:
            torturer.close()
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

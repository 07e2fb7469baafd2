"""Several real processes driving runs at one moment: the concurrency tests' and benchmark's child.

    python tests/_race_proc.py race --world URL --dir D --procs 8 --run-id R [--release F]
    python tests/_race_proc.py write --world URL --dir D --procs 8 --steps S [--run-prefix P]

One process imports everything, then forks ``--procs`` children (real processes, each
opening its own world after the fork: no connection, lock or thread is shared), so
eight processes cost one interpreter start. Every child opens its world, says it is
ready (``D/ready-<i>``) and waits; once all are ready this process releases them at
once (``D/go``), waits for them (SIGKILLing any still running after ``--timeout``
seconds: a deadlock is an outcome, not a hung test) and prints one JSON line:
``{"go": T, "children": [outcome, ...]}``, every time from ``time.monotonic()``
(one clock for every process of the machine).

* ``race``: every child calls ``run_workflow`` on the same run ``--run-id`` of
  :data:`RACE_WORKFLOW` (``first``, ``hold``, ``last``). ``hold`` waits until the file
  ``--release`` exists, so the child that drives the run holds it for as long as the
  caller wants: the others must have stopped with ``ConcurrentRunError`` meanwhile.
  Every step body first appends a line to the torture ledger ``D/ledger``
  (``O_APPEND`` + fsync; its segment is the child's pid). With
  ``LITTLE_ES_CRASH_AFTER_APPENDS`` in the environment a child kills itself after
  that many appends (a half-done run to race on).
* ``write``: child ``i`` runs its own run ``<prefix><i>`` of ``--steps`` trivial task
  steps (:func:`writer_workflow`), all of them appending to one world at once.

An outcome: ``i``, ``pid``, ``code`` (exit code; negative: the signal), ``outcome``
(``ran``, ``concurrent``, ``error``, ``killed`` or ``hung``), ``message``,
``steps_executed``, ``resumed``, ``status``, ``started`` and ``ended``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import orjson

_REPO = Path(__file__).resolve().parents[1]
if str(_REPO) not in sys.path:
    sys.path.insert(0, str(_REPO))

from little_es import (  # noqa: E402
    ConcurrentRunError,
    StepContext,
    Workflow,
    World,
    open_world,
    run_workflow,
    task,
)
from tests.torture.ledger import Ledger, step_item  # noqa: E402

RACE_INPUT = {"race": True}
HOLD_TIMEOUT_S = 120.0
"""How long ``hold`` waits for its release file before it fails (a test gone wrong)."""

_ledger: Ledger | None = None
_release: Path | None = None


def _record(ctx: StepContext) -> None:
    if _ledger is not None:
        _ledger.append(step_item(ctx.run_id, ctx.step_path, ctx.attempt))


def _first(ctx: StepContext) -> str:
    _record(ctx)
    return "first"


async def _hold(ctx: StepContext) -> str:
    _record(ctx)
    deadline = time.monotonic() + HOLD_TIMEOUT_S
    while _release is not None and not _release.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{_release} never appeared")
        await asyncio.sleep(0.005)
    return "held"


def _last(ctx: StepContext) -> str:
    _record(ctx)
    return "last"


RACE_WORKFLOW = Workflow(
    "race", steps=[task("first", _first), task("hold", _hold), task("last", _last)]
)
"""Three steps; ``hold`` keeps the run driven until the release file exists."""


async def _trivial(ctx: StepContext) -> dict[str, int]:
    return {"visit": ctx.visit}


def writer_workflow(steps: int) -> Workflow:
    """``steps`` trivial async task steps, ``s0`` ... (the runtime's cost per step, no work)."""
    return Workflow("writer", steps=[task(f"s{k}", _trivial) for k in range(steps)])


def _wait_for(path: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"gave up waiting for {path}")
        time.sleep(0.002)


def _child(i: int, args: argparse.Namespace) -> dict[str, Any]:
    """One child's life after the fork: open, line up, drive, say how it went."""
    global _ledger, _release
    outcome: dict[str, Any] = {"i": i, "pid": os.getpid(), "outcome": "error", "message": ""}
    world: World = open_world(args.world)
    try:
        (args.dir / f"ready-{i}").touch()
        _wait_for(args.dir / "go", 60.0)
        outcome["started"] = time.monotonic()
        cpu = time.process_time()
        try:
            if args.mode == "race":
                _ledger = Ledger(args.dir / "ledger", os.getpid())
                _release = args.release
                result = asyncio.run(
                    run_workflow(world, RACE_WORKFLOW, RACE_INPUT, run_id=args.run_id)
                )
            else:
                workflow = writer_workflow(args.steps)
                run_id = f"{args.run_prefix}{i}"
                result = asyncio.run(run_workflow(world, workflow, {}, run_id=run_id))
        except ConcurrentRunError as exc:
            outcome.update(outcome="concurrent", message=str(exc))
        else:
            outcome.update(
                outcome="ran",
                steps_executed=result.steps_executed,
                resumed=result.resumed,
                status=result.state.status,
            )
        outcome["ended"] = time.monotonic()
        # This process's CPU (every thread's), for the client's cost per step.
        outcome["cpu_s"] = time.process_time() - cpu
    finally:
        world.close()
    return outcome


def _fork(i: int, args: argparse.Namespace) -> int:
    pid = os.fork()
    if pid:
        return pid
    code = 0
    try:
        try:
            outcome = _child(i, args)
        except BaseException as exc:
            outcome = {
                "i": i,
                "pid": os.getpid(),
                "outcome": "error",
                "message": f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}",
            }
        code = {"ran": 0, "concurrent": 3}.get(outcome["outcome"], 1)
        tmp = args.dir / f".out-{i}"
        tmp.write_bytes(orjson.dumps(outcome))
        tmp.replace(args.dir / f"out-{i}.json")
    finally:
        # No atexit handlers, no flushing of the parent's buffers: this is a fork.
        os._exit(code)


def main(argv: list[str]) -> int:
    """Fork the children, release them together, wait, print what each did."""
    parser = argparse.ArgumentParser(prog="tests/_race_proc.py")
    parser.add_argument("mode", choices=("race", "write"))
    parser.add_argument("--world", required=True)
    parser.add_argument("--dir", required=True, type=Path)
    parser.add_argument("--procs", type=int, default=8)
    parser.add_argument("--run-id", default="run_race")
    parser.add_argument("--release", type=Path)
    parser.add_argument("--steps", type=int, default=25)
    parser.add_argument("--run-prefix", default="run_writer_")
    parser.add_argument("--timeout", type=float, default=120.0)
    args = parser.parse_args(argv)
    args.dir.mkdir(parents=True, exist_ok=True)
    (args.dir / "go").unlink(missing_ok=True)
    pids = {_fork(i, args): i for i in range(args.procs)}
    codes: dict[int, int] = {}

    def reap(block: bool) -> None:
        for pid in [p for p in pids if p not in codes]:
            done, status = os.waitpid(pid, 0 if block else os.WNOHANG)
            if done:
                codes[pid] = os.waitstatus_to_exitcode(status)

    deadline = time.monotonic() + args.timeout
    while not all((args.dir / f"ready-{i}").exists() for i in range(args.procs)):
        reap(block=False)
        if codes or time.monotonic() > deadline:
            break  # a child died (or hangs) before the barrier: release the others
        time.sleep(0.002)
    go = time.monotonic()
    (args.dir / "go").touch()
    while len(codes) < len(pids) and time.monotonic() < deadline:
        reap(block=False)
        time.sleep(0.002)
    hung = [pid for pid in pids if pid not in codes]
    for pid in hung:
        # Our own children, not reaped yet: the pid cannot belong to another process.
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    reap(block=True)
    children = []
    for pid, i in sorted(pids.items(), key=lambda kv: kv[1]):
        out = args.dir / f"out-{i}.json"
        outcome = orjson.loads(out.read_bytes()) if out.exists() else {"i": i, "pid": pid}
        outcome["code"] = codes[pid]
        if pid in hung:
            outcome["outcome"] = "hung"
        elif not out.exists():
            outcome["outcome"] = "killed" if codes[pid] < 0 else "error"
        children.append(outcome)
    sys.stdout.write(orjson.dumps({"go": go, "children": children}).decode() + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

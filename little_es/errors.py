"""The exception hierarchy of little_es.

Every error a user can meet derives from :class:`LittleEsError`, and each one's
message says what happened and what to do about it.
"""

from __future__ import annotations


class LittleEsError(Exception):
    """Base class of every little_es error."""


class InvalidRunIdError(LittleEsError, ValueError):
    """A run id is not a string of 1-128 letters, digits, ``_``, ``-`` or ``.``."""


class WorldConfigError(LittleEsError, ValueError):
    """A world URL or data directory cannot be used."""


class RunNotFoundError(LittleEsError, LookupError):
    """No run with this id exists in the world."""

    def __init__(self, run_id: str, world: str) -> None:
        self.run_id = run_id
        self.world = world
        super().__init__(
            f"run {run_id!r} not found in world {world}: check the run id (`little runs` lists"
            " them) and the world (--world or LITTLE_ES_WORLD)"
        )


class EventLogError(LittleEsError):
    """A stored event cannot be read: unknown type, malformed payload, or tampered log."""


class UnknownEventTypeError(EventLogError, LookupError):
    """A stored event names an event type (topic) that no loaded class registers."""


class EventPayloadError(EventLogError, ValueError):
    """A stored or new event's payload does not validate against its schema."""


class ConcurrencyConflictError(LittleEsError):
    """Another writer appended to the same stream first (optimistic concurrency)."""


class ConcurrentRunError(ConcurrencyConflictError):
    """Another process is making progress on this run; this one stopped without running anything."""


class ArtifactError(LittleEsError):
    """An artifact is missing, or its bytes do not match its recorded sha256."""


class ArtifactNotFoundError(ArtifactError, LookupError):
    """No artifact with this id is stored."""


class ArtifactIntegrityError(ArtifactError):
    """An artifact's stored bytes do not hash to the sha256 its reference records."""


class WorkflowDefinitionError(LittleEsError, ValueError):
    """A workflow definition is invalid (duplicate step ids, unknown jump target, ...)."""


class StepExecutionError(LittleEsError):
    """A step failed and its retries are exhausted; the run is recorded as failed."""


class RuntimeIntegrityError(LittleEsError):
    """The log and the code disagree; resuming would not be a faithful continuation.

    Raised by the restart checks before anything is scheduled. Subclasses name
    which check failed; each message names the run, the step and what differed.
    """


class WorkflowChangedError(RuntimeIntegrityError):
    """The workflow definition's IR hash differs from the one recorded at ``RunStarted``."""


class ArtifactMismatchError(RuntimeIntegrityError):
    """A completed step's artifact is missing, corrupt, foreign, or disagrees with its output."""


class ParallelReplayMismatchError(RuntimeIntegrityError):
    """A parallel group's recomputed branch set differs from the recorded one."""


class CapabilityDriftError(RuntimeIntegrityError):
    """An agent step's harness manifest (model, prompt, tools, ...) changed since it started."""


class ModelError(LittleEsError):
    """A model provider call failed. ``retryable`` says whether trying again can help."""

    def __init__(
        self, message: str, *, retryable: bool, provider: str = "", status: int | None = None
    ) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.provider = provider
        self.status = status


class ToolError(LittleEsError):
    """A tool's arguments did not validate, or the model named a tool that does not exist."""

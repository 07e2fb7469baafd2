"""Durable waits: what a run waits for (a person, another system), and how a signal is checked.

A run waits at a ``wait_for`` step, at an agent's ``ask_human`` tool call, and
before a tool declared ``tool(..., requires_approval=True)`` runs. Each wait has:

* a ``wait_id``, unique in the run and the same in every process: the step
  path for a ``wait_for`` step, ``{step_path}#{attempt}:{call_id}`` for a tool
  call (the agent's session and call are fixed by the log);
* a signal name and a pydantic model the signal's data must validate against,
  named by ``module:qualname`` (so ``little signal``, which does not load the
  workflow, imports it) and pinned by the digest of its JSON schema;
* an optional timeout, recorded as a deadline;
* for a tool call, the action it asks about: the tool's name and its
  canonical arguments, and their digest (:func:`action_digest`). A signal
  naming another digest is stale and refused.

This module holds only data and pure checks; the driver records ``RunWaiting``
(:mod:`little_es.engine.executor`) and :meth:`little_es.world.World.signal`
appends ``SignalReceived``.
"""

from __future__ import annotations

import hashlib
import importlib
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, ValidationError

from little_es.errors import SignalDataError, WorkflowDefinitionError

__all__ = [
    "Approval",
    "HumanAnswer",
    "WaitKind",
    "WaitRequest",
    "action_digest",
    "check_model",
    "check_timeout",
    "import_model",
    "model_ref",
    "schema_digest",
    "tool_wait_id",
    "validate_signal_data",
]

WaitKind = Literal["step", "ask_human", "approval"]
"""What waits: a ``wait_for`` step, an ``ask_human`` call, or a tool that needs approval."""


class HumanAnswer(BaseModel):
    """The default answer model of ``ask_human``: what the person answered."""

    model_config = ConfigDict(extra="forbid")

    answer: str


class Approval(BaseModel):
    """The signal a tool declared ``requires_approval=True`` waits for."""

    model_config = ConfigDict(extra="forbid")

    approved: bool
    comment: str | None = None


def model_ref(model: type[BaseModel]) -> str:
    """``module:qualname`` of a pydantic model class, as :func:`import_model` reads it."""
    return f"{model.__module__}:{model.__qualname__}"


def schema_digest(model: type[BaseModel]) -> str:
    """sha256 hex of the canonical JSON (sorted keys) of the model's JSON schema."""
    schema = model.model_json_schema()
    return hashlib.sha256(orjson.dumps(schema, option=orjson.OPT_SORT_KEYS)).hexdigest()


def action_digest(tool_name: str, args: Any) -> str:
    """sha256 hex of the canonical JSON of ``{"tool": name, "args": args}``: what an approval
    approves. The arguments are the recorded ones, so every process computes the same."""
    canonical = orjson.dumps({"tool": tool_name, "args": args}, option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(canonical).hexdigest()


def tool_wait_id(step_path: str, attempt: int, call_id: str) -> str:
    """The wait id of a tool call that waits (``ask_human``, an approval)."""
    return f"{step_path}#{attempt}:{call_id}"


MAX_TIMEOUT_SECONDS = 100 * 365.25 * 86400
"""The longest wait timeout: 100 years."""


def check_timeout(what: str, timeout: object) -> float | None:
    """``timeout`` (seconds, or a ``timedelta``) as seconds > 0, or None; raises
    :class:`~little_es.errors.WorkflowDefinitionError` for anything else."""
    if timeout is None:
        return None
    if isinstance(timeout, timedelta):
        timeout = timeout.total_seconds()
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
        raise WorkflowDefinitionError(
            f"{what}: timeout must be a number of seconds > 0 or a timedelta, got {timeout!r}"
        )
    if timeout == float("inf"):
        raise WorkflowDefinitionError(f"{what}: timeout must be finite (None: no timeout)")
    if timeout > MAX_TIMEOUT_SECONDS:
        # The deadline is a date: far enough out, it is past the last one a datetime holds.
        raise WorkflowDefinitionError(
            f"{what}: timeout must be at most {MAX_TIMEOUT_SECONDS:,.0f} seconds (100 years),"
            f" got {timeout!r}; None waits with no deadline"
        )
    return float(timeout)


def check_model(what: str, model: object) -> type[BaseModel]:
    """``model`` if it is a pydantic model class importable by its ``module:qualname``."""
    if not isinstance(model, type) or not issubclass(model, BaseModel):
        raise WorkflowDefinitionError(
            f"{what}: model must be a pydantic model class (class Answer(BaseModel): ...),"
            f" got {model!r}"
        )
    if "<locals>" in model.__qualname__:
        raise WorkflowDefinitionError(
            f"{what}: model {model.__qualname__} is defined inside a function; define it at"
            " module level so `little signal` can import it to validate a signal"
        )
    return model


def import_model(ref: str) -> type[BaseModel]:
    """The pydantic model class ``module:qualname`` names; raises
    :class:`~little_es.errors.SignalDataError` when it cannot be imported (``little
    signal`` makes the current directory importable first, as ``little resume`` does)."""
    module_name, _, qualname = ref.partition(":")
    try:
        found: Any = importlib.import_module(module_name)
        for part in qualname.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError, ValueError) as exc:
        if module_name == "__main__":
            # The script that ran the workflow defined it: no other program can import it.
            raise SignalDataError(
                f"the signal's model {ref} was defined in the script that ran the workflow,"
                " which no other program can import: send the signal with world.signal(...)"
                " from that script, or move the model to a module both can import"
            ) from exc
        raise SignalDataError(
            f"the signal's model {ref} cannot be imported here ({exc}): send the signal from"
            " where the workflow's code is importable (its directory, or PYTHONPATH)"
        ) from exc
    if not isinstance(found, type) or not issubclass(found, BaseModel):
        raise SignalDataError(f"the signal's model {ref} is not a pydantic model class")
    return found


def validate_signal_data(
    where: str, model: type[BaseModel], recorded_digest: str, data: object
) -> dict[str, Any]:
    """``data`` validated by ``model`` and dumped to JSON data; raises
    :class:`~little_es.errors.SignalDataError` when the model's schema is not the recorded
    one, or the data does not validate."""
    found = schema_digest(model)
    if found != recorded_digest:
        raise SignalDataError(
            f"{where}: the model {model_ref(model)} has changed since the run started waiting"
            f" (schema digest {found[:12]}, recorded {recorded_digest[:12]}): send the signal"
            " with the code the run waits under"
        )
    try:
        validated = model.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '(data)'}: {e['msg']}"
            for e in exc.errors(include_url=False)
        )
        raise SignalDataError(
            f"{where}: the data does not validate against {model_ref(model)}: {problems}."
            " Nothing was recorded; send data that matches the model"
        ) from None
    dumped: dict[str, Any] = validated.model_dump(mode="json")
    return dumped


@dataclass(frozen=True, slots=True)
class WaitRequest:
    """A wait the driver is about to record (``RunWaiting``), or finds recorded."""

    wait_id: str
    step_path: str
    kind: WaitKind
    signal: str
    model: type[BaseModel]
    timeout_s: float | None = None
    action: dict[str, Any] | None = None
    """For a tool call: ``{"tool": name, "args": recorded arguments}``."""
    question: str | None = None

    @property
    def action_digest(self) -> str | None:
        """The digest of :attr:`action` (None without one)."""
        if self.action is None:
            return None
        return action_digest(self.action["tool"], self.action["args"])

"""Run ids: user-visible strings, validated, mapped to aggregate UUIDs.

A run id is chosen by the user (``run_triage_42``) or generated. It is checked
before anything touches disk, so it can never smuggle a path (``../etc``) or a
NUL byte into a file name or a query. Stream ids are uuid5 of the run id, so the
same run id always names the same streams, in every process and backend.
"""

from __future__ import annotations

import hashlib
import re
import uuid

from little_es.errors import InvalidRunIdError

RUN_ID_MAX_LENGTH = 128
_RUN_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*")

# Fixed forever: changing it would orphan every stored stream.
_NAMESPACE = uuid.UUID("5b0a9d4e-7c1f-5d2a-9e3b-1f6c8a4d2e70")


def validate_run_id(run_id: object) -> str:
    """Return ``run_id`` if it is a valid run id, else raise :class:`InvalidRunIdError`.

    Valid: a string of 1 to 128 characters, letters, digits, ``_``, ``-`` and
    ``.``, starting with a letter or digit.
    """
    if not isinstance(run_id, str):
        raise InvalidRunIdError(
            f"run id must be a string, got {type(run_id).__name__}: pass a string such as"
            " 'run_triage_42'"
        )
    if not run_id:
        raise InvalidRunIdError("run id must not be empty: pass a string such as 'run_triage_42'")
    if len(run_id) > RUN_ID_MAX_LENGTH:
        raise InvalidRunIdError(
            f"run id is {len(run_id)} characters long; at most {RUN_ID_MAX_LENGTH} are allowed"
        )
    if _RUN_ID_RE.fullmatch(run_id) is None:
        raise InvalidRunIdError(
            f"run id {run_id!r} may only contain letters, digits, '_', '-' and '.', and must"
            " start with a letter or digit"
        )
    return run_id


def new_run_id(prefix: str = "run") -> str:
    """A fresh random run id, ``{prefix}_{12 hex digits}``."""
    return validate_run_id(f"{prefix}_{uuid.uuid4().hex[:12]}")


def run_stream_id(run_id: str) -> uuid.UUID:
    """The UUID of the ``Run`` aggregate (stream) for ``run_id``."""
    return uuid.uuid5(_NAMESPACE, "run:" + validate_run_id(run_id))


def session_stream_id(run_id: str, step_path: str, attempt: int) -> uuid.UUID:
    """The UUID of the ``HarnessSession`` of one attempt of an agent step.

    Deterministic, so a resumed process finds the session the crashed one
    started for the same attempt and continues it instead of opening another.
    """
    return uuid.uuid5(_NAMESPACE, f"session:{validate_run_id(run_id)}:{step_path}:{attempt}")


def world_stream_id() -> uuid.UUID:
    """The UUID of the world's own stream (:class:`~little_es.events.WorldCreated`)."""
    return uuid.uuid5(_NAMESPACE, "world")


def outer_loop_stream_id(outer_loop_id: str) -> uuid.UUID:
    """The UUID of the ``OuterLoop`` aggregate for ``outer_loop_id`` (validated like a run id)."""
    return uuid.uuid5(_NAMESPACE, "outer_loop:" + validate_run_id(outer_loop_id))


def step_lease_id(run_id: str, step_path: str) -> str:
    """The lease key of one step (spelled as a run id), held while an engine runs that step.

    The Temporal adapter takes it around every step activity, so two attempts of
    one step never run at once; ``little unlock RUN_ID --force`` breaks the
    leases of a run's steps in flight with the run's own.
    """
    digest = hashlib.sha256(f"{validate_run_id(run_id)}\x00{step_path}".encode()).hexdigest()
    return f"step-{digest[:40]}"


def price_book_stream_id() -> uuid.UUID:
    """The UUID of the world's one ``PriceBook`` aggregate (the prices recorded in the world)."""
    return uuid.uuid5(_NAMESPACE, "price_book")

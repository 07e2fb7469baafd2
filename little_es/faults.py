"""Fault injection for crash tests: kill this process right after a chosen append.

Set one of these environment variables in the process under test (they are
read once, when the first world of the process saves):

``LITTLE_ES_CRASH_AFTER_APPENDS=N``
    SIGKILL the process right after its Nth successful append transaction.

``LITTLE_ES_CRASH_AFTER_EVENT=wire_name[:field=value[,field=value...]]``
    SIGKILL right after the append that committed the first event with this
    wire name whose fields match, e.g. ``harness.model.called:turn=3`` or
    ``harness.tool_call.started:call_id=c42`` or ``StepCompleted:step_path=fetch``.
    Everything that append committed is in the log: on the local engine a
    sequential step's ``StepCompleted`` is committed with the next step's
    ``StepStarted`` (:mod:`little_es.durability`, "One commit per step").

``LITTLE_ES_CRASH_DURING_VIEW_WRITE=N``
    SIGKILL during the Nth write of an outer loop's view file, after its
    temporary file is written and before it replaces the old view.

``LITTLE_ES_CRASH_BEFORE_EVENT=wire_name[:field=value[,field=value...]]``
    SIGKILL right *before* the append that would commit the first such event:
    e.g. ``StepCompleted:step_path=resolve`` kills a step after its code ran (and
    changed its aggregates, :mod:`little_es.aggregates`) but before its commit,
    and so before the next step's ``StepStarted`` committed with it.

Both count and match per append transaction, which may hold several events
(:func:`appends`).

The kill is a real ``SIGKILL``: no ``finally`` block, no atexit handler and no
buffered write of this process runs after it, exactly like a crash.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

CRASH_AFTER_APPENDS = "LITTLE_ES_CRASH_AFTER_APPENDS"
CRASH_AFTER_EVENT = "LITTLE_ES_CRASH_AFTER_EVENT"
CRASH_BEFORE_EVENT = "LITTLE_ES_CRASH_BEFORE_EVENT"
CRASH_DURING_VIEW_WRITE = "LITTLE_ES_CRASH_DURING_VIEW_WRITE"

_view_writes = 0
_appends = 0


@dataclass
class _Plan:
    after_appends: int | None
    wire_name: str | None
    fields: dict[str, str]
    appends: int = 0


def _parse(variable: str, spec: str | None) -> tuple[str | None, dict[str, str]]:
    fields: dict[str, str] = {}
    wire_name = None
    if spec:
        wire_name, _, rest = spec.partition(":")
        for pair in filter(None, rest.split(",")):
            key, sep, value = pair.partition("=")
            if not sep:
                raise ValueError(f"{variable}: expected field=value, got {pair!r}")
            fields[key.strip()] = value.strip()
    return wire_name, fields


@cache
def _plan() -> _Plan | None:
    appends = os.environ.get(CRASH_AFTER_APPENDS)
    spec = os.environ.get(CRASH_AFTER_EVENT)
    if not appends and not spec:
        return None
    wire_name, fields = _parse(CRASH_AFTER_EVENT, spec)
    return _Plan(int(appends) if appends else None, wire_name, fields)


@cache
def _before_plan() -> _Plan | None:
    spec = os.environ.get(CRASH_BEFORE_EVENT)
    if not spec:
        return None
    wire_name, fields = _parse(CRASH_BEFORE_EVENT, spec)
    return _Plan(None, wire_name, fields)


def _matches(plan: _Plan, event: object) -> bool:
    # A user's eventsourcing domain event (little_es.aggregates) has no wire name.
    if getattr(event, "wire_name", None) != plan.wire_name:
        return False
    return all(str(getattr(event, k, None)) == v for k, v in plan.fields.items())


def before_append(events: Sequence[object]) -> None:
    """Called by the world before each append; kills the process if planned."""
    plan = _before_plan()
    if plan is not None and any(_matches(plan, e) for e in events):
        os.kill(os.getpid(), signal.SIGKILL)


def appends() -> int:
    """The append transactions this process committed so far (its worlds' together).

    What ``LITTLE_ES_CRASH_AFTER_APPENDS`` counts: a crash test reads it from an
    uninterrupted run to know every kill point (a commit may hold several events).
    """
    return _appends


def after_append(events: Sequence[object]) -> None:
    """Called by the world after each committed append; kills the process if planned."""
    global _appends
    _appends += 1
    plan = _plan()
    if plan is None:
        return
    plan.appends += 1
    if plan.after_appends is not None and plan.appends >= plan.after_appends:
        os.kill(os.getpid(), signal.SIGKILL)
    if plan.wire_name is not None and any(_matches(plan, e) for e in events):
        os.kill(os.getpid(), signal.SIGKILL)


def during_view_write() -> None:
    """Called by a backend between writing a view's temporary file and renaming it."""
    global _view_writes
    planned = os.environ.get(CRASH_DURING_VIEW_WRITE)
    if not planned:
        return
    _view_writes += 1
    if _view_writes >= int(planned):
        os.kill(os.getpid(), signal.SIGKILL)

"""The harness session manifest: what an agent step attempt may use, pinned when it starts.

A session's manifest records the model (provider and model id), the sha256 of
the system prompt, each tool's name and schema hash, the parameters and
``max_turns``: the data of :class:`~little_es.workflow.ir.AgentSpecIR` (the one
description of an agent step), with the tools sorted by name. Their order is
not the manifest's to check: the workflow's IR keeps it (the model is shown the
tools in that order), so a resume of a run whose agent's tools were reordered
is refused by the IR hash first (:class:`~little_es.errors.WorkflowChangedError`).
It also records ``prompt_sha256``, the sha256 of
the prompt the session was given (for a prompt function, the text it
rendered). ``manifest_hash`` is the sha256 of its canonical JSON (orjson,
sorted keys).

On resume the manifest is computed again from the code and compared with the
*body* recorded in ``harness.session.started``, after the body is checked
against its recorded hash: any difference means the recorded calls were made
by a different agent (or the log was edited), so continuing would not be a
faithful continuation, and :class:`~little_es.errors.CapabilityDriftError`
says exactly what changed. The restart check over a whole run is
:func:`little_es.engine.integrity.assert_harness_manifest_consistent`.

``request_settings`` holds what the model sends with every request besides the
conversation and the tools (a model's ``request_settings``: the provider
adapters' ``parameters``, Anthropic's ``max_tokens``, a Pydantic AI agent's
model settings and output schema; ``{}`` for a model that has none). Sessions
started before it was pinned have no such key, and it is then not compared
(every session started since has it).

Sessions started before the prompt was pinned have no ``prompt_sha256``: a
missing key means "not recorded", and the prompt is then not compared from the
manifest (the conversation's hash chain still refuses a changed prompt, as
:class:`~little_es.errors.ConversationDivergedError`, before any call). The
same holds the other way round: a check that cannot render a prompt function
(the restart check, which has no step context) leaves the key out, and the
session's own check compares it when the step resumes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any
from uuid import UUID

import orjson
from pydantic import ValidationError

from little_es.errors import CapabilityDriftError, RuntimeIntegrityError, SessionInputError
from little_es.events import SessionStarted
from little_es.harness.model import Model
from little_es.harness.tools import Tool, resolve_tools
from little_es.ids import session_stream_id
from little_es.values import JSONValue
from little_es.workflow.ir import AgentSpecIR, AgentToolIR, canonical_json
from little_es.world import World

__all__ = [
    "PROMPT_KEY",
    "SETTINGS_KEY",
    "assert_session_manifest_consistent",
    "check_manifest",
    "compute_manifest",
    "manifest_changes",
    "read_session_started",
]

PROMPT_KEY = "prompt_sha256"
"""The manifest key of the prompt's sha256; absent means "not recorded" (see the module)."""

SETTINGS_KEY = "request_settings"
"""The manifest key of the model's request settings; absent means "not recorded": a
session started before it was pinned (see the module)."""


def compute_manifest(
    model: Model,
    tools: Sequence[Tool],
    system: str | None,
    parameters: Mapping[str, Any] | None,
    max_turns: int,
    prompt: str | None = None,
) -> tuple[dict[str, JSONValue], str]:
    """The manifest of a session with these inputs, and its hash.

    ``prompt`` is the text the session is given (a prompt function's rendered
    text); None leaves :data:`PROMPT_KEY` out, for a caller that cannot render it.

    Raises :class:`SessionInputError` when an input cannot be pinned (a model
    without a provider or model id, a non-string system prompt, parameters
    that are not plain JSON, ``max_turns`` below 1) and
    :class:`~little_es.errors.ToolError` when two tools share a name.
    """
    provider = getattr(model, "provider", None)
    model_id = getattr(model, "model_id", None)
    if not isinstance(provider, str) or not provider:
        raise SessionInputError(
            f"model must have a non-empty string 'provider' (a Model such as ScriptedModel),"
            f" got {type(model).__name__}"
        )
    if not isinstance(model_id, str) or not model_id:
        raise SessionInputError(
            f"model must have a non-empty string 'model_id', got {type(model).__name__}"
        )
    if system is not None and not isinstance(system, str):
        raise SessionInputError(f"system must be a string or None, got {type(system).__name__}")
    if prompt is not None and not isinstance(prompt, str):
        raise SessionInputError(f"prompt must be a string or None, got {type(prompt).__name__}")
    if isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1:
        raise SessionInputError(f"max_turns must be an integer >= 1, got {max_turns!r}")
    if parameters is not None and not isinstance(parameters, Mapping):
        raise SessionInputError(
            "parameters must be a mapping such as {'temperature': 0}, got"
            f" {type(parameters).__name__}"
        )
    resolved = resolve_tools(tools)
    try:
        spec = AgentSpecIR(
            provider=provider,
            model_id=model_id,
            system_prompt_sha256=None if system is None else _sha256(system.encode("utf-8")),
            tools=tuple(
                AgentToolIR(
                    name=name, schema_hash=resolved[name].schema_hash, waits=resolved[name].waits
                )
                for name in sorted(resolved)
            ),
            parameters=dict(parameters or {}),
            max_turns=max_turns,
        )
    except ValidationError as exc:
        problems = "; ".join(err["msg"] for err in exc.errors(include_url=False))
        raise SessionInputError(f"the session's inputs cannot be pinned: {problems}") from exc
    manifest: dict[str, JSONValue] = spec.model_dump(mode="json")
    tool_entries = manifest["tools"]
    assert isinstance(tool_entries, list)
    for entry in tool_entries:
        # A tool that waits for nobody has the manifest it had before durable waits
        # existed, so sessions recorded then resume; one that waits pins what for.
        if isinstance(entry, dict) and entry.get("waits") is None:
            entry.pop("waits", None)
    if prompt is not None:
        # Not in AgentSpecIR: the IR (and its hash) describes the code, and a prompt
        # function's text is only known when the step runs.
        manifest[PROMPT_KEY] = _sha256(prompt.encode("utf-8"))
    # Not in AgentSpecIR either: the IR hash of a workflow whose model has settings would
    # change, and refuse every run recorded before they were pinned.
    manifest[SETTINGS_KEY] = _request_settings(model)
    return manifest, _sha256(canonical_json(manifest))


def _request_settings(model: Model) -> JSONValue:
    settings = getattr(model, "request_settings", None)
    if settings is None:
        return {}
    if not isinstance(settings, Mapping):
        raise SessionInputError(
            f"{type(model).__name__}.request_settings must be a mapping of JSON values, got"
            f" {type(settings).__name__}"
        )
    try:
        return orjson.loads(orjson.dumps(dict(settings), option=orjson.OPT_SORT_KEYS))
    except TypeError as exc:
        raise SessionInputError(
            f"{type(model).__name__}.request_settings must be JSON values ({exc})"
        ) from exc


def check_manifest(
    started: SessionStarted, manifest: Mapping[str, JSONValue], manifest_hash: str | None = None
) -> None:
    """Raise :class:`~little_es.errors.CapabilityDriftError` unless ``manifest`` was recorded.

    The recorded body must hash to the recorded ``manifest_hash`` (else the log
    was altered), and must equal ``manifest``, the one computed from the code
    now; :data:`PROMPT_KEY` is compared only when both hold it (see the
    module). ``manifest_hash`` is not needed: the bodies are compared, and it
    is accepted for callers that have it. The error names the run, the step
    path, the attempt and every change (``tool 'search' added``,
    ``model_id changed from 'a' to 'b'``, ``prompt changed``, ...).
    """
    recorded = started.manifest
    where = f"run {started.run_id!r} step {started.step_path!r} (attempt {started.attempt})"
    recorded_hash = _sha256(canonical_json(dict(recorded)))
    if recorded_hash != started.manifest_hash:
        raise CapabilityDriftError(
            f"{where}: the manifest recorded in harness.session.started hashes to"
            f" {recorded_hash}, not to its recorded manifest_hash {started.manifest_hash}:"
            " the log was altered since the session started; restore it from a backup"
        )
    old, new = _comparable(recorded, manifest)
    if old == new:
        return
    changes = manifest_changes(old, new) or [
        f"manifest changed from {dict(old)!r} to {dict(new)!r}"
    ]
    raise CapabilityDriftError(
        f"{where}: the agent changed since its harness session started: {'; '.join(changes)}."
        " The recorded model and tool calls were made by the old agent, so resuming would not"
        " be a faithful continuation: restore the original model (and its settings), system"
        " prompt, prompt, tools, parameters and max_turns to resume this run, or start a new"
        " run"
    )


def _comparable(
    recorded: Mapping[str, JSONValue], manifest: Mapping[str, JSONValue]
) -> tuple[Mapping[str, JSONValue], Mapping[str, JSONValue]]:
    # The prompt is compared when both sides pinned it: an old session did not
    # record it, and a restart check cannot render a prompt function. The request
    # settings, when the session recorded them: every session started since does.
    unpinned = set()
    if (PROMPT_KEY in recorded) != (PROMPT_KEY in manifest):
        unpinned.add(PROMPT_KEY)
    if SETTINGS_KEY not in recorded:
        unpinned.add(SETTINGS_KEY)
    if not unpinned:
        return recorded, manifest
    return (
        {k: v for k, v in recorded.items() if k not in unpinned},
        {k: v for k, v in manifest.items() if k not in unpinned},
    )


def assert_session_manifest_consistent(
    world: World,
    *,
    run_id: str,
    step_path: str,
    attempt: int,
    model: Model,
    tools: Sequence[Tool],
    system: str | None = None,
    parameters: Mapping[str, Any] | None = None,
    max_turns: int = 20,
    prompt: str | None = None,
) -> None:
    """Before resuming an agent step: check its recorded session against the current agent.

    Does nothing when the attempt never started a session. Otherwise raises
    :class:`~little_es.errors.CapabilityDriftError` naming what changed. Reads
    only the session's first event, however long the session is. ``prompt``
    None leaves the prompt unchecked (see :func:`compute_manifest`).
    """
    started = read_session_started(world, session_stream_id(run_id, step_path, attempt))
    if started is None:
        return
    manifest, _ = compute_manifest(model, tools, system, parameters, max_turns, prompt)
    check_manifest(started, manifest)


def read_session_started(world: World, session_id: UUID) -> SessionStarted | None:
    """The first event of a harness session, or None when it never started.

    Raises :class:`~little_es.errors.RuntimeIntegrityError` when the stream does
    not begin with ``harness.session.started``.
    """
    stored = world.app.recorder.select_events(session_id, limit=1)
    if not stored:
        return None
    first = world.app.mapper.to_domain_event(stored[0])
    if not isinstance(first, SessionStarted):
        raise RuntimeIntegrityError(
            f"harness session {session_id} does not begin with harness.session.started but"
            f" with {type(first).__name__}: the log is not one little_es wrote"
        )
    return first


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def manifest_changes(old: Mapping[str, JSONValue], new: Mapping[str, JSONValue]) -> list[str]:
    """What differs between two session manifests, in words ("prompt changed", "tool 'x' added")."""
    changes: list[str] = []
    for key in ("provider", "model_id", "max_turns"):
        if old.get(key) != new.get(key):
            changes.append(f"{key} changed from {old.get(key)!r} to {new.get(key)!r}")
    old_system, new_system = old.get("system_prompt_sha256"), new.get("system_prompt_sha256")
    if old_system != new_system:
        if old_system is None:
            changes.append("system prompt added")
        elif new_system is None:
            changes.append("system prompt removed")
        else:
            changes.append("system prompt changed")
    if old.get(PROMPT_KEY) != new.get(PROMPT_KEY):
        changes.append("prompt changed")
    changes += _tool_changes(old.get("tools"), new.get("tools"))
    changes += _parameter_changes(old.get("parameters"), new.get("parameters"))
    changes += [
        c.replace("parameter ", "request setting ", 1)
        for c in _parameter_changes(old.get(SETTINGS_KEY), new.get(SETTINGS_KEY))
    ]
    known = {
        SETTINGS_KEY,
        "provider",
        "model_id",
        "max_turns",
        "system_prompt_sha256",
        PROMPT_KEY,
        "tools",
        "parameters",
    }
    for key in sorted((set(old) | set(new)) - known):
        if old.get(key) != new.get(key):
            changes.append(f"{key} changed from {old.get(key)!r} to {new.get(key)!r}")
    return changes


def _tool_changes(old: JSONValue, new: JSONValue) -> list[str]:
    def by_name(tools: JSONValue) -> dict[str, JSONValue]:
        return {t["name"]: t.get("schema_hash") for t in tools or () if isinstance(t, dict)}

    before, after = by_name(old), by_name(new)
    changes = [f"tool {n!r} added" for n in sorted(after.keys() - before.keys())]
    changes += [f"tool {n!r} removed" for n in sorted(before.keys() - after.keys())]
    changes += [
        f"tool {n!r} schema changed"
        for n in sorted(before.keys() & after.keys())
        if before[n] != after[n]
    ]
    return changes


def _parameter_changes(old: JSONValue, new: JSONValue) -> list[str]:
    before = old if isinstance(old, dict) else {}
    after = new if isinstance(new, dict) else {}
    changes = [f"parameter {k!r} added" for k in sorted(after.keys() - before.keys())]
    changes += [f"parameter {k!r} removed" for k in sorted(before.keys() - after.keys())]
    changes += [
        f"parameter {k!r} changed from {before[k]!r} to {after[k]!r}"
        for k in sorted(before.keys() & after.keys())
        if before[k] != after[k]
    ]
    return changes

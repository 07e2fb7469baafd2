"""OpenTelemetry traces of runs, derived from their event logs (extra ``otel``).

A run's trace is a fold of its log, as its state is: one span per run, per step
attempt, per agent session, per model call and per tool call, with the start and
end times of the events that opened and closed them, and the attributes of the
OpenTelemetry GenAI semantic conventions (``gen_ai.operation.name``,
``gen_ai.provider.name``, ``gen_ai.request.model``, ``gen_ai.response.model``,
``gen_ai.usage.input_tokens``, ``gen_ai.usage.output_tokens``,
``gen_ai.tool.name``, ``gen_ai.tool.call.id``, ...)::

    run triage                      little_es.run.id, little_es.workflow.id
      step fetch                    little_es.step.path, .kind, .visit, .attempt
      step plan
        invoke_agent plan           gen_ai.operation.name=invoke_agent, gen_ai.agent.name
          chat planner-1            gen_ai.operation.name=chat, usage, models
          execute_tool search_code  gen_ai.operation.name=execute_tool, tool name, call id
      step check
        step check[reset]/lint      (a parallel branch, under its group)

Trace and span ids are digests of what the log names (the root run's id; the
run id, step path, visit and attempt; the session and the turn or tool call
id), never random: exporting a run twice, the spans emitted live while it ran,
and the trace of a run killed and resumed in another process all carry the same
ids. A sub-run's spans are in its root run's trace, its run span under the
parent's step (under the orchestrator's tool call when it was started by one).

* :func:`run_spans` - the spans of a run (and its sub-runs) from the log, as
  :class:`SpanData`; needs no OpenTelemetry package (``little trace`` prints them).
* :func:`export_run` - hand them to a tracer provider's span processors.
* :func:`instrument` - emit spans live: each one as the event that closes it commits.

The spans go to the provider's span processors' ``on_end`` as finished
``ReadableSpan`` objects (the SDK's own type, so every exporter takes them);
they are built here rather than through a tracer because a tracer draws span ids
from its id generator, and these ids come from the log. ``on_start`` is not
called (a span is built finished) and the provider's sampler is not consulted: a
trace derived from a log is exported whole.

Live spans and a resumed run: a process that first sees a run mid-way (a
resume) reads the run's log once and emits only the spans closed by its own
commits from then on; a span whose closing event committed in a process that
died before emitting it is in the log, and :func:`export_run` (``little trace``)
has it. A run that stops (failed, cancelled, out of budget) and is resumed later
emits its run span at each stop, with one id and the later end; the export holds
the last. A span still open when the log ends is exported (not emitted live),
ending at the log's last event, with ``little_es.span.open = true``.
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Literal
from uuid import UUID

from little_es.errors import MissingExtraError, RunNotFoundError
from little_es.events import (
    BudgetExceeded,
    Event,
    HarnessEvent,
    ModelCalled,
    ModelResponded,
    RunCancelled,
    RunCompleted,
    RunEvent,
    RunFailed,
    RunForked,
    RunResumed,
    RunStarted,
    SessionCompleted,
    SessionStarted,
    StepCompleted,
    StepFailed,
    StepStarted,
    SubRunReserved,
    ToolCallFailed,
    ToolCallStarted,
    ToolCallSucceeded,
    WaitTimedOut,
)
from little_es.ids import run_stream_id
from little_es.world import World, merge_by_timestamp

__all__ = [
    "SpanData",
    "export_run",
    "instrument",
    "run_spans",
    "span_json",
    "trace_id_of",
]

AttributeValue = str | bool | int | float | tuple[str, ...]
SpanStatus = Literal["unset", "error"]
SpanKindName = Literal["internal", "client"]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_BRANCH = re.compile(r"\[[^\]]*\]$")
_SCOPE = "little_es"


@dataclass(frozen=True)
class SpanData:
    """One span of a run's trace, as the log says (ids are ints, as OpenTelemetry's are)."""

    name: str
    trace_id: int
    span_id: int
    parent_id: int | None
    start: datetime
    end: datetime
    attributes: Mapping[str, AttributeValue]
    kind: SpanKindName = "internal"
    status: SpanStatus = "unset"
    status_description: str | None = None


def _digest(bits: int, *parts: object) -> int:
    text = "\x1f".join(str(p) for p in parts)
    value = int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[: bits // 8], "big")
    # All-zero ids are invalid in OpenTelemetry; a digest of zero is as good as impossible.
    return value or 1


def _trace_id(root_run_id: str) -> int:
    return _digest(128, "little_es.trace", root_run_id)


def trace_id_of(run_id: str) -> str:
    """The trace id (32 hex digits) of the root run ``run_id``'s trace.

    A sub-run's spans are in its root run's trace: pass the root's id.
    """
    return f"{_trace_id(run_id):032x}"


def _run_span_id(run_id: str) -> int:
    return _digest(64, "run", run_id)


def _step_span_id(run_id: str, key: tuple[str, int, int]) -> int:
    return _digest(64, "step", run_id, *key)


def _session_span_id(session_id: UUID) -> int:
    return _digest(64, "session", session_id)


def _model_span_id(session_id: UUID, turn: int) -> int:
    return _digest(64, "chat", session_id, turn)


def _tool_span_id(session_id: UUID, call_id: str) -> int:
    return _digest(64, "tool", session_id, call_id)


@dataclass
class _Open:
    name: str
    span_id: int
    parent_id: int | None
    start: datetime
    attributes: dict[str, AttributeValue]
    kind: SpanKindName = "internal"
    owner: tuple[str, int, int] | None = None
    """The step attempt a session's span (or a call's) belongs to: closed with it at the latest."""

    def close(
        self, end: datetime, trace_id: int, status: SpanStatus = "unset", why: str | None = None
    ) -> SpanData:
        return SpanData(
            name=self.name,
            trace_id=trace_id,
            span_id=self.span_id,
            parent_id=self.parent_id,
            start=self.start,
            end=max(end, self.start),
            attributes=dict(self.attributes),
            kind=self.kind,
            status=status,
            status_description=why,
        )


Closed = tuple[SpanData, tuple[UUID, int] | None]
"""A span and the event that closed it (stream, version); None: open when the log ended."""


@dataclass
class _RunTrace:
    """The fold of one run's log into spans: feed events in log order, take what they close."""

    run_id: str
    trace_id: int
    parent_id: int | None
    run: _Open | None = None
    steps: dict[tuple[str, int, int], _Open] = field(default_factory=dict)
    latest_step: dict[str, tuple[str, int, int]] = field(default_factory=dict)
    step_of_session: dict[UUID, tuple[str, int, int]] = field(default_factory=dict)
    sessions: dict[UUID, _Open] = field(default_factory=dict)
    requested: dict[UUID, tuple[str, str]] = field(default_factory=dict)
    calls: dict[tuple[UUID, object], _Open] = field(default_factory=dict)
    done: set[int] = field(default_factory=set)
    last: datetime | None = None
    forked_from: str | None = None
    stopped: bool = False
    """Whether the run's last word is a stop (completed, failed, ...): its span is closed."""

    def feed(self, event: Event) -> list[Closed]:
        """The spans ``event`` closes (a closing event of a span already closed closes nothing)."""
        self.last = event.timestamp if self.last is None else max(self.last, event.timestamp)
        at = (event.originator_id, event.originator_version)
        if isinstance(event, RunEvent):
            return self._run_event(event, at)
        if isinstance(event, HarnessEvent):
            return self._harness_event(event, at)
        return []

    def _run_event(self, event: RunEvent, at: tuple[UUID, int]) -> list[Closed]:
        ts = event.timestamp
        if isinstance(event, RunStarted):
            if self.run is None:
                attributes: dict[str, AttributeValue] = {
                    "little_es.run.id": self.run_id,
                    "little_es.workflow.id": event.workflow_id,
                    "little_es.workflow.version": event.workflow_version,
                }
                if event.parent_run_id is not None:
                    attributes["little_es.parent_run.id"] = event.parent_run_id
                if self.forked_from is not None:
                    attributes["little_es.fork.origin_run.id"] = self.forked_from
                self.run = _Open(
                    f"run {event.workflow_id}",
                    _run_span_id(self.run_id),
                    self.parent_id,
                    ts,
                    attributes,
                )
            return []
        if isinstance(event, RunForked):
            # A fork's first event, before the RunStarted it copies.
            self.forked_from = event.origin.origin_run_id
            return []
        if isinstance(event, StepStarted | RunResumed):
            # A stopped run going on: its span is open again, until its next stop.
            self.stopped = False
        if isinstance(event, StepStarted):
            key = (event.step_path, event.visit, event.attempt)
            span_id = _step_span_id(self.run_id, key)
            if key in self.steps or span_id in self.done:
                return []
            group = event.step_path.rpartition("/")[0]
            parent = self.latest_step.get(_BRANCH.sub("", group)) if group else None
            self.steps[key] = _Open(
                f"step {event.step_path}",
                span_id,
                _step_span_id(self.run_id, parent) if parent else _run_span_id(self.run_id),
                ts,
                {
                    "little_es.run.id": self.run_id,
                    "little_es.step.path": event.step_path,
                    "little_es.step.id": event.step_id,
                    "little_es.step.kind": event.kind,
                    "little_es.step.visit": event.visit,
                    "little_es.step.attempt": event.attempt,
                },
            )
            self.latest_step[event.step_path] = key
            if event.session_id is not None:
                self.step_of_session[event.session_id] = key
            return []
        if isinstance(event, StepCompleted | StepFailed):
            key = (event.step_path, event.visit, event.attempt)
            failed = event.error if isinstance(event, StepFailed) else None
            closed = self._close_owned(key, ts, at, failed is not None)
            step = self.steps.pop(key, None)
            if step is None:
                return closed
            self.done.add(step.span_id)
            if isinstance(event, StepFailed):
                step.attributes["error.type"] = event.error.type
                step.attributes["little_es.step.will_retry"] = event.will_retry
                return [*closed, (step.close(ts, self.trace_id, "error", event.error.message), at)]
            return [*closed, (step.close(ts, self.trace_id), at)]
        if isinstance(
            event, RunCompleted | RunFailed | RunCancelled | BudgetExceeded | WaitTimedOut
        ):
            return self._stop(event, at)
        return []

    def _stop(self, event: RunEvent, at: tuple[UUID, int]) -> list[Closed]:
        if self.run is None:
            return []
        status: SpanStatus = "unset"
        why: str | None = None
        outcome = "completed"
        if isinstance(event, RunFailed):
            status, why, outcome = "error", event.error.message, "failed"
            self.run.attributes["error.type"] = event.error.type
        elif isinstance(event, RunCancelled):
            outcome = "cancelled"
        elif isinstance(event, BudgetExceeded):
            status, why, outcome = "error", f"budget exceeded: {event.spent}", "budget_exceeded"
        elif isinstance(event, WaitTimedOut):
            status, why, outcome = "error", f"wait {event.wait_id} timed out", "timed_out"
        self.run.attributes["little_es.run.status"] = outcome
        self.stopped = True
        # Not added to ``done``: a run resumed after it stopped closes its span again, later.
        return [(self.run.close(event.timestamp, self.trace_id, status, why), at)]

    def _close_owned(
        self, key: tuple[str, int, int], ts: datetime, at: tuple[UUID, int], failed: bool
    ) -> list[Closed]:
        """Close what a step attempt left open (a failed agent's session and its call)."""
        closed: list[Closed] = []
        status: SpanStatus = "error" if failed else "unset"
        why = "the step ended first" if failed else None
        spans = [self.calls.pop(k) for k, s in list(self.calls.items()) if s.owner == key]
        spans += [self.sessions.pop(k) for k, s in list(self.sessions.items()) if s.owner == key]
        for span in spans:
            self.done.add(span.span_id)
            closed.append((span.close(ts, self.trace_id, status, why), at))
        return closed

    def _gen_ai(self, session_id: UUID) -> dict[str, AttributeValue]:
        provider, model = self.requested.get(session_id, ("", ""))
        attributes: dict[str, AttributeValue] = {}
        if provider:
            attributes["gen_ai.provider.name"] = provider
            attributes["gen_ai.system"] = provider
        if model:
            attributes["gen_ai.request.model"] = model
        return attributes

    def _harness_event(self, event: HarnessEvent, at: tuple[UUID, int]) -> list[Closed]:
        sid = event.originator_id
        ts = event.timestamp
        owner = self.step_of_session.get(sid)
        if isinstance(event, SessionStarted):
            span_id = _session_span_id(sid)
            if sid in self.sessions or span_id in self.done:
                return []
            provider = event.manifest.get("provider")
            model = event.manifest.get("model_id")
            self.requested[sid] = (
                provider if isinstance(provider, str) else "",
                model if isinstance(model, str) else "",
            )
            self.sessions[sid] = _Open(
                f"invoke_agent {event.step_path}",
                span_id,
                _step_span_id(self.run_id, owner) if owner else _run_span_id(self.run_id),
                ts,
                {
                    "gen_ai.operation.name": "invoke_agent",
                    "gen_ai.agent.name": event.step_path,
                    **self._gen_ai(sid),
                    "little_es.run.id": self.run_id,
                    "little_es.session.id": str(sid),
                    "little_es.step.path": event.step_path,
                    "little_es.step.attempt": event.attempt,
                },
                owner=owner,
            )
            return []
        if isinstance(event, ModelCalled):
            self._open_call(
                (sid, event.turn),
                _model_span_id(sid, event.turn),
                "chat",
                ts,
                {"little_es.turn": event.turn},
                owner,
                "client",
            )
            return []
        if isinstance(event, ModelResponded):
            key = (sid, event.turn)
            if key not in self.calls:
                # A call whose write-ahead record is missing still gets its span.
                self._open_call(
                    key, _model_span_id(sid, event.turn), "chat", ts, {}, owner, "client"
                )
            span = self.calls.pop(key, None)
            if span is None:
                return []
            response = event.response
            usage = response.usage
            span.name = f"chat {response.model}"
            span.attributes.update(
                {
                    "gen_ai.provider.name": response.provider,
                    "gen_ai.system": response.provider,
                    "gen_ai.response.model": response.model,
                    "gen_ai.usage.input_tokens": usage.input_tokens,
                    "gen_ai.usage.output_tokens": usage.output_tokens,
                    "gen_ai.usage.cache_read.input_tokens": usage.cached_input_tokens,
                    "gen_ai.usage.cache_creation.input_tokens": usage.cache_write_tokens,
                    "little_es.usage.reasoning_tokens": usage.reasoning_tokens,
                }
            )
            span.attributes.setdefault("gen_ai.request.model", response.model)
            self.done.add(span.span_id)
            return [(span.close(ts, self.trace_id), at)]
        if isinstance(event, ToolCallStarted):
            self._open_call(
                (sid, event.call_id),
                _tool_span_id(sid, event.call_id),
                f"execute_tool {event.name}",
                ts,
                {
                    "gen_ai.operation.name": "execute_tool",
                    "gen_ai.tool.name": event.name,
                    "gen_ai.tool.call.id": event.call_id,
                    "gen_ai.tool.type": "function",
                    "little_es.turn": event.turn,
                },
                owner,
                "internal",
                chat=False,
            )
            return []
        if isinstance(event, ToolCallSucceeded | ToolCallFailed):
            span = self.calls.pop((sid, event.call_id), None)
            if span is None:
                return []
            self.done.add(span.span_id)
            if isinstance(event, ToolCallFailed):
                span.attributes["error.type"] = event.error.type
                return [(span.close(ts, self.trace_id, "error", event.error.message), at)]
            return [(span.close(ts, self.trace_id), at)]
        if isinstance(event, SessionCompleted):
            session = self.sessions.pop(sid, None)
            if session is None:
                return []
            self.done.add(session.span_id)
            session.attributes["little_es.session.turns"] = event.turns
            return [(session.close(ts, self.trace_id), at)]
        return []

    def _open_call(
        self,
        key: tuple[UUID, object],
        span_id: int,
        name: str,
        ts: datetime,
        attributes: dict[str, AttributeValue],
        owner: tuple[str, int, int] | None,
        kind: SpanKindName,
        *,
        chat: bool = True,
    ) -> None:
        # A resumed session records the in-flight call's write-ahead record again: one span.
        if key in self.calls or span_id in self.done:
            return
        sid = key[0]
        if chat:
            attributes = {"gen_ai.operation.name": "chat", **self._gen_ai(sid), **attributes}
            model = attributes.get("gen_ai.request.model")
            name = f"chat {model}" if model else "chat"
        session = self.sessions.get(sid)
        parent = session.span_id if session is not None else _session_span_id(sid)
        attributes.setdefault("little_es.run.id", self.run_id)
        self.calls[key] = _Open(name, span_id, parent, ts, attributes, kind, owner)

    def still_open(self) -> list[Closed]:
        """Spans the log leaves open, ending at its last event (children first)."""
        if self.last is None:
            return []
        spans = [*self.calls.values(), *self.sessions.values(), *self.steps.values()]
        if self.run is not None and not self.stopped:
            spans.append(self.run)
        out: list[Closed] = []
        for span in spans:
            closed = span.close(self.last, self.trace_id)
            attributes = {**closed.attributes, "little_es.span.open": True}
            out.append((replace(closed, attributes=attributes), None))
        return out


def _first_run_event(world: World, run_id: str) -> RunStarted | RunForked:
    events = world.read_stream(run_stream_id(run_id))
    if not events:
        raise RunNotFoundError(run_id, world.name)
    for event in events:
        if isinstance(event, RunStarted):
            return event
    first = events[0]
    assert isinstance(first, RunForked)
    return first


def _lineage(world: World, run_id: str) -> tuple[int, int | None]:
    """The run's trace id and its run span's parent: the root's trace, the parent's step."""
    seen: set[str] = set()
    started = _first_run_event(world, run_id)
    parent_run = started.parent_run_id if isinstance(started, RunStarted) else None
    if parent_run is None:
        return _trace_id(run_id), None
    parent_span: int = _run_span_id(parent_run)
    latest: dict[str, StepStarted] = {}
    for event in world.read_stream(run_stream_id(parent_run)):
        if isinstance(event, StepStarted):
            latest[event.step_path] = event
        elif isinstance(event, SubRunReserved) and event.sub_run_id == run_id:
            step = latest.get(event.step_path)
            if step is not None:
                if event.call_id is not None and step.session_id is not None:
                    parent_span = _tool_span_id(step.session_id, event.call_id)
                else:
                    key = (step.step_path, step.visit, step.attempt)
                    parent_span = _step_span_id(parent_run, key)
            break
    # Walk up to the root for the trace id; a cycle (a hand-made log) stops at itself.
    root = parent_run
    while root not in seen:
        seen.add(root)
        up = _first_run_event(world, root)
        above = up.parent_run_id if isinstance(up, RunStarted) else None
        if above is None:
            break
        root = above
    return _trace_id(root), parent_span


def _run_trace(world: World, run_id: str) -> tuple[_RunTrace, list[Event]]:
    events = world.read_run_log(run_id)
    trace_id, parent_id = _lineage(world, run_id)
    return _RunTrace(run_id, trace_id, parent_id), events


def run_spans(world: World, run_id: str, *, sub_runs: bool = True) -> list[SpanData]:
    """The spans of run ``run_id`` from its log, in the order they close; with its sub-runs'
    (theirs after its own) unless ``sub_runs`` is False.

    Raises :class:`~little_es.errors.RunNotFoundError` when the world has no such run.
    """
    out: list[SpanData] = []
    pending = [run_id]
    visited: set[str] = set()
    while pending:
        current = pending.pop(0)
        if current in visited:
            continue
        visited.add(current)
        trace, events = _run_trace(world, current)
        closed: dict[int, SpanData] = {}
        for event in events:
            for span, _ in trace.feed(event):
                # A run stopped and resumed closes its span again: the last close holds.
                closed.pop(span.span_id, None)
                closed[span.span_id] = span
            if (
                sub_runs
                and isinstance(event, SubRunReserved)
                and world.run_exists(event.sub_run_id)
            ):
                # Reserved and never started (a crash in between): no run, no spans.
                pending.append(event.sub_run_id)
        for span, _ in trace.still_open():
            closed.pop(span.span_id, None)
            closed[span.span_id] = span
        out.extend(closed.values())
    return out


def _ns(at: datetime) -> int:
    return (at - _EPOCH) // _MICROSECOND * 1000


_MICROSECOND = datetime(1970, 1, 1, 0, 0, 0, 1, tzinfo=UTC) - _EPOCH


def span_json(span: SpanData) -> dict[str, Any]:
    """``span`` as one JSON object (hex ids, ISO times): what ``little trace`` prints."""
    return {
        "name": span.name,
        "trace_id": f"{span.trace_id:032x}",
        "span_id": f"{span.span_id:016x}",
        "parent_id": None if span.parent_id is None else f"{span.parent_id:016x}",
        "kind": span.kind,
        "start": span.start.isoformat(),
        "end": span.end.isoformat(),
        "attributes": {
            k: list(v) if isinstance(v, tuple) else v for k, v in span.attributes.items()
        },
        "status": {"code": span.status, "description": span.status_description},
    }


# ------------------------------------------------------------------ the SDK side


def _sdk() -> Any:
    try:
        from opentelemetry.sdk import trace as sdk_trace
    except ImportError as exc:
        raise MissingExtraError(
            f"little_es.contrib.otel needs the OpenTelemetry SDK ({exc}):"
            " pip install 'little-es[otel]'"
        ) from None
    return sdk_trace


def _provider(tracer_provider: object | None) -> Any:
    """The SDK tracer provider to emit to, or None when no SDK provider is configured."""
    sdk_trace = _sdk()
    if tracer_provider is None:
        from opentelemetry import trace

        tracer_provider = trace.get_tracer_provider()
    if isinstance(tracer_provider, sdk_trace.TracerProvider):
        return tracer_provider
    return None


def _emit(provider: Any, spans: Sequence[SpanData]) -> None:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

    scope = InstrumentationScope(_SCOPE)
    # The SDK has no public way to hand a finished span to its processors; this is the
    # multi-processor every span a tracer ends goes through.
    processor = provider._active_span_processor
    flags = trace.TraceFlags(trace.TraceFlags.SAMPLED)
    for span in spans:
        context = trace.SpanContext(span.trace_id, span.span_id, is_remote=False, trace_flags=flags)
        parent = (
            None
            if span.parent_id is None
            else trace.SpanContext(
                span.trace_id, span.parent_id, is_remote=False, trace_flags=flags
            )
        )
        status = (
            trace.Status(trace.StatusCode.ERROR, span.status_description)
            if span.status == "error"
            else trace.Status(trace.StatusCode.UNSET)
        )
        processor.on_end(
            ReadableSpan(
                name=span.name,
                context=context,
                parent=parent,
                resource=provider.resource,
                attributes=dict(span.attributes),
                kind=trace.SpanKind.CLIENT if span.kind == "client" else trace.SpanKind.INTERNAL,
                status=status,
                start_time=_ns(span.start),
                end_time=_ns(span.end),
                instrumentation_scope=scope,
            )
        )


def export_run(
    world: World, run_id: str, tracer_provider: object | None = None, *, sub_runs: bool = True
) -> list[SpanData]:
    """Emit the spans of run ``run_id`` (:func:`run_spans`) to ``tracer_provider`` (default:
    the global one) and return them; emits nothing when that is not an SDK provider.

    Raises :class:`~little_es.errors.MissingExtraError` without the SDK.
    """
    provider = _provider(tracer_provider)
    spans = run_spans(world, run_id, sub_runs=sub_runs)
    if provider is not None:
        _emit(provider, spans)
    return spans


class _Live:
    """The listener :func:`instrument` registers: one fold per run this world object commits to."""

    def __init__(self, world: World, tracer_provider: object | None) -> None:
        self.world = world
        self.tracer_provider = tracer_provider
        self.runs: dict[UUID, _RunTrace] = {}
        self.run_of_session: dict[UUID, UUID] = {}
        self.lock = threading.Lock()

    def __call__(self, events: Sequence[Event]) -> None:
        provider = _provider(self.tracer_provider)
        with self.lock:
            if provider is None:
                # No SDK configured (yet): forget, and read the log again once there is one.
                self.runs.clear()
                return
            spans = self._closed(events)
        if spans:
            _emit(provider, spans)

    def _closed(self, events: Sequence[Event]) -> list[SpanData]:
        by_run: dict[UUID, dict[UUID, list[Event]]] = {}
        for event in events:
            if isinstance(event, RunEvent):
                run = event.originator_id
            elif isinstance(event, HarnessEvent):
                run = self._run_of(event)
            else:
                continue
            by_run.setdefault(run, {}).setdefault(event.originator_id, []).append(event)
        spans: list[SpanData] = []
        committed = {(e.originator_id, e.originator_version) for e in events}
        for run, streams in by_run.items():
            trace = self.runs.get(run)
            if trace is None:
                spans += self._catch_up(run, streams, committed)
                continue
            # The order the log is read in: the run's stream first, then its sessions'.
            ordered = [streams.pop(run, [])]
            ordered += list(streams.values())
            for event in merge_by_timestamp([s for s in ordered if s]):
                spans += [span for span, _ in trace.feed(event)]
            self._learn(run, trace)
        return spans

    def _run_of(self, event: HarnessEvent) -> UUID:
        sid = event.originator_id
        run = self.run_of_session.get(sid)
        if run is None:
            if isinstance(event, SessionStarted):
                started = event
            else:
                first = self.world.read_stream(sid)[0]
                assert isinstance(first, SessionStarted)
                started = first
            run = run_stream_id(started.run_id)
            self.run_of_session[sid] = run
        return run

    def _catch_up(
        self, run: UUID, streams: dict[UUID, list[Event]], committed: set[tuple[UUID, int]]
    ) -> list[SpanData]:
        """A run first seen by this process: fold its log, emit what this commit closed."""
        named = [
            e
            for events in streams.values()
            for e in events
            if isinstance(e, RunStarted | RunForked)
        ]
        if named:
            run_id = named[0].run_id
        else:
            first = self.world.read_stream(run)[0]
            assert isinstance(first, RunStarted | RunForked)
            run_id = first.run_id
        trace, events = _run_trace(self.world, run_id)
        spans = [span for event in events for span, at in trace.feed(event) if at in committed]
        self.runs[run] = trace
        self._learn(run, trace)
        return spans

    def _learn(self, run: UUID, trace: _RunTrace) -> None:
        for sid in trace.step_of_session:
            self.run_of_session.setdefault(sid, run)


def instrument(world: World, tracer_provider: object | None = None) -> Callable[[], None]:
    """Emit the spans of every run ``world`` drives to ``tracer_provider`` (default: the
    global one, looked up at each commit), each as the event closing it commits.

    Returns a function that stops it. Nothing is emitted while the provider is not an SDK
    one. The spans are those :func:`run_spans` derives from the log, with the same ids.
    Raises :class:`~little_es.errors.MissingExtraError` without the SDK.
    """
    _sdk()
    return world.add_listener(_Live(world, tracer_provider))

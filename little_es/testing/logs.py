"""Log builders: write realistic run logs into a world, the way the runtime and the harness do.

Tests of readers (a report, a projection of your own, a replay check) build
logs through the real aggregates
(:class:`~little_es.domain.Run`, :class:`~little_es.domain.HarnessSession`) and
save them to a real world, so what they read back went through the codec and
the recorder like production events.

Events are saved in write-ahead order by default: ``StepStarted`` before the
session's events, each model call before its response, ``StepCompleted`` last,
which is also the order of the world's notification log.

::

    w = RunWriter(world, "run_1", input={"ticket": 7})
    w.agent_step("plan", [priced(), unpriced(tool_calls=2)])
    w.task_step("publish", {"ok": True})
    w.complete({"ok": True})

To test what a reader does with a row no little_es event class would write
(an unknown topic, a malformed payload, an old ``class_version``),
:func:`append_raw_row` appends one with a payload of your choosing, framed and
linked into the stream's hash chain as a writer would: the readers' own
checks meet it, not the chain's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from eventsourcing.persistence import StoredEvent

from little_es.chain import (
    GENESIS,
    Head,
    feed,
    frame,
    is_framed,
    row_digest,
    seed,
)
from little_es.domain import HarnessSession, Run
from little_es.events import (
    ModelCalled,
    ModelResponded,
    RunCompleted,
    RunFailed,
    RunStarted,
    SessionCompleted,
    SessionStarted,
    StepCompleted,
    StepFailed,
    StepKind,
    StepStarted,
    SubRunReserved,
    ToolCallFailed,
    ToolCallStarted,
    ToolCallSucceeded,
)
from little_es.values import ArtifactRef, ErrorInfo, Message, ModelResponse, ToolCall, Usage
from little_es.world import World


def append_raw_row(world: World, stream_id: UUID, topic: str, payload: bytes) -> int:
    """Append a row with these topic and payload bytes at the end of ``stream_id``.

    The row is framed and linked to the stream's last row the way
    :meth:`~little_es.world.World.save` does, so it reads as written by a
    little_es writer (a newer program, or a buggy one). Returns its version.
    """
    rows = world.backend.select_rows(stream_id, None)
    prev = row_digest(rows[-1][2]) if rows and is_framed(rows[-1][2]) else GENESIS
    running = seed(stream_id)
    for _, old_topic, old_data in rows:
        feed(running, old_topic, old_data)
    version = len(rows) + 1
    data = frame(prev, stream_id, version, topic, payload)
    feed(running, topic, data)
    head = Head(version, row_digest(data), running.digest())
    world.app.recorder.insert_events(
        [StoredEvent(stream_id, version, topic, data)], heads={stream_id: head}
    )
    return version


PRICED = ("openai", "gpt-4o")
"""A model genai-prices knows."""
UNPRICED = ("scripted", "scripted-model")
"""A model no price registry knows."""


@dataclass(frozen=True)
class Call:
    """One model call of an agent step: who answers, and the usage it reports."""

    provider: str = PRICED[0]
    model: str = PRICED[1]
    input_tokens: int = 1000
    output_tokens: int = 200
    cached_input_tokens: int = 0
    reasoning_tokens: int = 0
    cache_write_tokens: int = 0
    tool_calls: int = 0
    """How many tool calls this turn asks for (each is started and succeeds)."""
    failed_tool_calls: int = 0
    """How many of those fail instead."""
    step_path_on_event: bool = True
    """Whether ``harness.model.responded`` names its step path."""

    @property
    def usage(self) -> Usage:
        """The usage the response reports."""
        return Usage(
            input_tokens=self.input_tokens,
            output_tokens=self.output_tokens,
            cached_input_tokens=self.cached_input_tokens,
            reasoning_tokens=self.reasoning_tokens,
            cache_write_tokens=self.cache_write_tokens,
        )


def priced(**kw: Any) -> Call:
    """A call to a model genai-prices knows."""
    return Call(provider=PRICED[0], model=PRICED[1], **kw)


def unpriced(**kw: Any) -> Call:
    """A call to a model no price registry knows."""
    return Call(provider=UNPRICED[0], model=UNPRICED[1], **kw)


class RunWriter:
    """Records one run's events into ``world`` through the real aggregates.

    Each method commits its events at once (``autosave=False`` keeps them
    pending until :meth:`flush`). Step ids, hashes and manifests are fixed
    placeholders: the log is valid for every reader, not a real workflow's.
    """

    def __init__(
        self,
        world: World,
        run_id: str,
        *,
        workflow_id: str = "wf",
        workflow_version: str = "1",
        input: Any = None,
        parent_run_id: str | None = None,
        parent_step_path: str | None = None,
        autosave: bool = True,
    ) -> None:
        self.world = world
        self.run_id = run_id
        self.autosave = autosave
        self.run = Run(run_id, world.pricer)
        self.sessions: dict[str, HarnessSession] = {}
        self.run.trigger(
            RunStarted,
            run_id=run_id,
            workflow_id=workflow_id,
            workflow_version=workflow_version,
            ir_hash="sha256:" + "0" * 64,
            input=input,
            parent_run_id=parent_run_id,
            parent_step_path=parent_step_path,
        )
        self._save(self.run)

    def _save(self, *aggregates: Run | HarnessSession) -> None:
        if self.autosave:
            self.world.save(*aggregates)

    def flush(self) -> None:
        """Save whatever is still pending (when ``autosave`` is off)."""
        self.world.save(self.run, *self.sessions.values())

    # ------------------------------------------------------------------ steps

    def start_step(
        self,
        step_path: str,
        *,
        kind: StepKind = "task",
        visit: int = 1,
        attempt: int = 1,
        session: HarnessSession | None = None,
    ) -> None:
        """Commit ``StepStarted``."""
        self.run.trigger(
            StepStarted,
            step_path=step_path,
            step_id=step_path.split("/")[-1].split("@")[0],
            kind=kind,
            visit=visit,
            attempt=attempt,
            session_id=None if session is None else session.id,
        )
        self._save(self.run)

    def complete_step(
        self,
        step_path: str,
        output: Any = None,
        *,
        visit: int = 1,
        attempt: int = 1,
        output_ref: ArtifactRef | None = None,
        artifact_refs: Sequence[ArtifactRef] = (),
        next_step: str | None = None,
    ) -> None:
        """Commit ``StepCompleted``."""
        self.run.trigger(
            StepCompleted,
            step_path=step_path,
            step_id=step_path.split("/")[-1].split("@")[0],
            visit=visit,
            attempt=attempt,
            output=output,
            output_ref=output_ref,
            artifact_refs=tuple(artifact_refs),
            next_step=next_step,
        )
        self._save(self.run)

    def fail_step(
        self, step_path: str, *, attempt: int = 1, will_retry: bool = False, message: str = "boom"
    ) -> None:
        """Commit ``StepFailed``."""
        self.run.trigger(
            StepFailed,
            step_path=step_path,
            step_id=step_path.split("/")[-1].split("@")[0],
            visit=1,
            attempt=attempt,
            error=ErrorInfo(type="RuntimeError", message=message),
            will_retry=will_retry,
        )
        self._save(self.run)

    def task_step(self, step_path: str, output: Any = None, **complete: Any) -> None:
        """A task step that started and completed."""
        self.start_step(step_path, visit=complete.get("visit", 1))
        self.complete_step(step_path, output, **complete)

    def agent_step(
        self,
        step_path: str,
        calls: Sequence[Call],
        *,
        attempt: int = 1,
        complete: bool = True,
        output: Any = "done",
        session_completed_usage: Usage | None = None,
        end_in_flight: bool = False,
    ) -> HarnessSession:
        """An agent step: a session with one turn per call, its tool calls, then completion.

        ``complete=False`` leaves the step running (crashed mid-session);
        ``end_in_flight`` then also leaves a last ``harness.model.called`` with no
        response. ``session_completed_usage`` is recorded as the session's
        rollup (which the reducer must ignore); by default the true sum.
        """
        session = HarnessSession(self.run_id, step_path, attempt)
        self.sessions[step_path] = session
        self.start_step(step_path, kind="agent", attempt=attempt, session=session)
        session.trigger(
            SessionStarted,
            run_id=self.run_id,
            step_path=step_path,
            attempt=attempt,
            manifest={"model": "m", "tools": []},
            manifest_hash="sha256:" + "1" * 64,
        )
        self._save(session)
        total = Usage()
        for turn, call in enumerate(calls, start=1):
            self.model_turn(session, step_path, turn, call)
            total = Usage(
                input_tokens=total.input_tokens + call.input_tokens,
                output_tokens=total.output_tokens + call.output_tokens,
                cached_input_tokens=total.cached_input_tokens + call.cached_input_tokens,
                reasoning_tokens=total.reasoning_tokens + call.reasoning_tokens,
                cache_write_tokens=total.cache_write_tokens + call.cache_write_tokens,
            )
        if not complete:
            if end_in_flight:
                session.trigger(
                    ModelCalled,
                    turn=len(calls) + 1,
                    messages=(Message(role="user", content="go on"),),
                    conversation_hash=f"h{len(calls) + 1}",
                )
                self._save(session)
            return session
        session.trigger(
            SessionCompleted,
            usage=session_completed_usage or total,
            turns=len(calls),
            output=output,
        )
        self._save(session)
        self.complete_step(step_path, output, attempt=attempt)
        return session

    def model_turn(self, session: HarnessSession, step_path: str, turn: int, call: Call) -> None:
        """One turn: ``model.called``, ``model.responded``, then its tool calls."""
        session.trigger(
            ModelCalled,
            turn=turn,
            messages=(Message(role="user", content=f"turn {turn}"),),
            conversation_hash=f"h{turn}",
        )
        self._save(session)
        tool_calls = tuple(
            ToolCall(id=f"c{turn}_{i}", name="lookup", arguments={"q": i})
            for i in range(call.tool_calls)
        )
        session.trigger(
            ModelResponded,
            turn=turn,
            response=ModelResponse(
                content=None if tool_calls else f"answer {turn}",
                tool_calls=tool_calls,
                usage=call.usage,
                provider=call.provider,
                model=call.model,
            ),
            step_path=step_path if call.step_path_on_event else None,
        )
        self._save(session)
        for i, tc in enumerate(tool_calls):
            session.trigger(
                ToolCallStarted, turn=turn, call_id=tc.id, name=tc.name, args=tc.arguments
            )
            self._save(session)
            if i < call.failed_tool_calls:
                session.trigger(
                    ToolCallFailed,
                    call_id=tc.id,
                    error=ErrorInfo(type="ToolError", message="nope"),
                )
            else:
                session.trigger(ToolCallSucceeded, call_id=tc.id, result={"hits": i})
            self._save(session)

    # ------------------------------------------------------------------- runs

    def sub_run(self, step_path: str, sub_run_id: str, **kw: Any) -> RunWriter:
        """Reserve ``sub_run_id`` in this run and start the sub-run's own ``Run`` stream."""
        self.run.trigger(
            SubRunReserved, step_path=step_path, sub_run_id=sub_run_id, workflow_id="child"
        )
        self._save(self.run)
        return RunWriter(
            self.world,
            sub_run_id,
            workflow_id="child",
            parent_run_id=self.run_id,
            parent_step_path=step_path,
            autosave=self.autosave,
            **kw,
        )

    def complete(self, output: Any = None, *, output_ref: ArtifactRef | None = None) -> None:
        """Commit ``RunCompleted``."""
        self.run.trigger(RunCompleted, output=output, output_ref=output_ref)
        self._save(self.run)

    def fail(self, step_path: str | None = None, message: str = "boom") -> None:
        """Commit ``RunFailed``."""
        self.run.trigger(
            RunFailed, error=ErrorInfo(type="RuntimeError", message=message), step_path=step_path
        )
        self._save(self.run)


def write_agent_run(
    world: World,
    run_id: str,
    *,
    steps: int = 2,
    calls_per_step: int = 3,
    call: Call | None = None,
    tool_calls: int = 1,
    complete: bool = True,
) -> RunWriter:
    """A run of ``steps`` agent steps (``agent_1``, ...), ``calls_per_step`` model calls each."""
    w = RunWriter(world, run_id, input={"task": "triage"})
    base = call or Call(tool_calls=tool_calls)
    for i in range(1, steps + 1):
        w.agent_step(f"agent_{i}", [base] * calls_per_step, output={"step": i})
    if complete:
        w.complete({"result": "ok"})
    return w

"""Agent harness sessions: the model/tool loop, recorded write-ahead and memoized per call.

:func:`run_agent_session` runs one attempt of an agent step. Every model call
and tool call goes through the session's ``HarnessSession`` stream:

* ``harness.model.called`` (the messages added since the previous call, and a
  hash chain over the whole conversation) is committed *before* the model is
  called, ``harness.model.responded`` after. Only the messages no earlier event
  of the session holds are stored (turn 1's system text and prompt): a later
  turn's are the previous response's assistant message and its tool results,
  which ``implied`` counts and the session rebuilds from those events
  (:func:`sent_messages`);
* ``harness.tool_call.started`` for every call of a response is committed
  *before* any of them runs; the calls then run concurrently and each
  ``succeeded``/``failed`` is committed as it finishes;
* ``harness.session.completed`` (usage rollup, turns, output) ends it.

Events between which nothing runs share one transaction, since a commit
(an fsync on SQLite) is the main cost of recording: ``session.started`` with
turn 1's ``model.called`` (write-ahead records only: not fsynced, see
:mod:`little_es.durability`); a response with its tool calls' starts (or with
``session.completed``); the last result of a turn's tool calls with the next
``model.called``. The log's order and content are the same either way.

The same loop resumes a crashed session. The session id is derived from
``(run_id, step_path, attempt)``, so a process that restarts finds the session
and continues it. Each call is looked up in the recorded session first: a model
call with a recorded response and a tool call with a recorded result are
answered from the log (and the conversation rebuilt from them is checked
against the recorded hash chain, so an edited response or tool result is a
:class:`~little_es.errors.ConversationDivergedError` before anything is
appended or called); only the call that was in flight at the crash is made
again, with the same messages or the same arguments. Before each append (so
before each model call and each batch of tool calls, which follow the commit
of their write-ahead records) the process confirms it still holds the run's
lease (:func:`~little_es.backends.base.check_leases`): one that lost it stops
with :class:`~little_es.errors.LeaseLostError` before calling anything more.
A call is made at most once per process that resumes; a crash between invoking a tool and recording
its result can repeat that one call, which is what
:attr:`~little_es.harness.tools.ToolContext.idempotency_key` is for.

A tool may complete its arguments before the call is recorded: if it has a
``prepare_args(args, ctx) -> args`` method, the session calls it once, when it
records the call's ``harness.tool_call.started``, and records (and invokes the
tool with) what it returns. It may only add arguments, must be deterministic
in ``args`` and ``ctx``, and is never called for a recorded call: a resumed
call gets the recorded arguments. ``start_workflow`` uses it to put the
sub-run id it reserves in the recorded arguments.

Failures: a tool that raises, an unknown tool name and invalid arguments are
recorded as ``harness.tool_call.failed`` and shown to the model. A retryable
:class:`~little_es.errors.ModelError` is retried in place, the same turn of the
same session, by the agent step's retry policy
(:func:`~little_es.harness.model.call_model`); past those tries the run stops
(:class:`~little_es.errors.ModelUnavailableError`) with the turn's
``harness.model.called`` left without a response, as a crash leaves it. One that
is not retryable propagates the same way and fails the attempt for good: a retry
after a recorded ``StepFailed`` is a new attempt, hence a new session, which would
make every call again. A resume (after a crash or a stop) continues the same
attempt and re-invokes the model for that turn.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any
from uuid import UUID

import orjson
from pydantic import BaseModel, ConfigDict

from little_es._strict import check_json_value
from little_es.backends.base import StreamWatch, check_leases
from little_es.domain import HarnessSession
from little_es.errors import (
    ApprovalDeniedError,
    ConcurrencyConflictError,
    ConversationDivergedError,
    DrivenElsewhereError,
    RunStoppedError,
    RuntimeIntegrityError,
    RunWaitingError,
    SessionInputError,
    StepSuspendedError,
    ToolError,
    TurnLimitExceededError,
    WaitTimedOutError,
    WorldStorageError,
)
from little_es.events import (
    Event,
    ModelCalled,
    ModelResponded,
    SessionCompleted,
    SessionStarted,
    ToolCallFailed,
    ToolCallStarted,
    ToolCallSucceeded,
)
from little_es.harness.guard import SignalWaiter, current_guard
from little_es.harness.manifest import check_manifest, compute_manifest
from little_es.harness.model import Model, call_model
from little_es.harness.tools import Tool, ToolContext, resolve_tools, unparsed_arguments_error
from little_es.ids import session_stream_id, validate_run_id
from little_es.logging import get_logger
from little_es.values import (
    ErrorInfo,
    JSONValue,
    Message,
    ModelRequest,
    ModelResponse,
    ToolCall,
    Usage,
)
from little_es.waits import Approval, WaitRequest, tool_wait_id
from little_es.workflow.ir import RetryPolicy
from little_es.world import World

__all__ = [
    "SessionInputError",
    "SessionOutcome",
    "conversation_hash",
    "implied_messages",
    "run_agent_session",
    "sent_messages",
]

# Marks an argument the model sent that the recorded arguments lack.
_MISSING = object()


class SessionOutcome(BaseModel):
    """What one agent session produced, and how many calls this process really made.

    ``model_calls_made`` / ``tool_calls_made`` count live calls in this
    process (a tool call refused for an unknown name or invalid arguments
    counts: it was resolved live); ``replayed_model_calls`` /
    ``replayed_tool_calls`` count calls answered from the log.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    session_id: UUID
    output: str | None
    conversation: tuple[Message, ...]
    turns: int
    usage: Usage
    model_calls_made: int
    tool_calls_made: int
    replayed_model_calls: int
    replayed_tool_calls: int


def conversation_hash(previous: str, messages: Sequence[Message]) -> str:
    """Extend the conversation hash chain ``previous`` (``""`` at the start) by ``messages``.

    Each message adds ``h = sha256(h + canonical JSON of the message)``, with
    canonical JSON being orjson with sorted keys of the message's JSON dump.
    """
    h = previous
    for message in messages:
        data = orjson.dumps(message.model_dump(mode="json"), option=orjson.OPT_SORT_KEYS)
        h = hashlib.sha256(h.encode() + data).hexdigest()
    return h


def sent_messages(events: Iterable[Event]) -> dict[int, tuple[Message, ...]]:
    """The messages each recorded model call of a session added to the conversation, by turn.

    ``events`` are the session's, in stream order. A ``harness.model.called``
    that stores its messages gives them as stored; one whose messages are
    ``implied`` gets them rebuilt from the session's earlier events, as a
    resumed session rebuilds them: the previous turn's assistant message, then
    one tool message per call of that turn, in the response's order. Raises
    :class:`ConversationDivergedError` when those events are missing or are not
    as many messages as the call says.
    """
    used: set[str] = set()
    responses: dict[int, ModelResponse] = {}
    call_ids: dict[int, list[str]] = {}
    results: dict[str, ToolCallSucceeded | ToolCallFailed] = {}
    sent: dict[int, tuple[Message, ...]] = {}
    for event in events:
        match event:
            case ModelResponded():
                responses[event.turn] = event.response
                call_ids[event.turn] = [
                    _unique_call_id(used, c.id, event.turn) for c in event.response.tool_calls
                ]
            case ToolCallSucceeded() | ToolCallFailed():
                results[event.call_id] = event
            case ModelCalled() if event.implied == 0:
                sent[event.turn] = event.messages
            case ModelCalled():
                sent[event.turn] = (
                    *_implied(event, responses, call_ids, results),
                    *event.messages,
                )
            case _:
                pass
    return sent


def implied_messages(session: HarnessSession, turn: int) -> list[Message]:
    """The messages a ``harness.model.called`` of ``turn`` may leave ``implied``: those that
    :func:`sent_messages` rebuilds from the session's earlier events (the previous
    response's assistant message, then a tool message per call of it with a result).

    For a recorder of its own (:mod:`little_es.contrib.pydantic_ai`): it stores a turn's
    messages in the implied form only when they begin with exactly these, so a reader
    rebuilds what was sent.
    """
    used: set[str] = set()
    call_ids: dict[int, list[str]] = {}
    # In turn order, which is the stream's: the ids are given as sent_messages gives them.
    for t in sorted(t for t in session.responses if t < turn):
        calls = session.responses[t].response.tool_calls
        call_ids[t] = [_unique_call_id(used, c.id, t) for c in calls]
    responses = {t: r.response for t, r in session.responses.items()}
    return _rebuilt(turn, responses, call_ids, session.tool_results)


def _rebuilt(
    turn: int,
    responses: Mapping[int, ModelResponse],
    call_ids: Mapping[int, list[str]],
    results: Mapping[str, ToolCallSucceeded | ToolCallFailed],
) -> list[Message]:
    previous = responses.get(turn - 1)
    rebuilt: list[Message] = []
    if previous is not None:
        rebuilt.append(previous.as_message())
        for call, call_id in zip(previous.tool_calls, call_ids[turn - 1], strict=True):
            result = results.get(call_id)
            if result is None:
                break
            rebuilt.append(_tool_message(call, result))
    return rebuilt


def _implied(
    called: ModelCalled,
    responses: Mapping[int, ModelResponse],
    call_ids: Mapping[int, list[str]],
    results: Mapping[str, ToolCallSucceeded | ToolCallFailed],
) -> list[Message]:
    rebuilt = _rebuilt(called.turn, responses, call_ids, results)
    if len(rebuilt) != called.implied:
        raise ConversationDivergedError(
            f"harness session {called.originator_id} turn {called.turn}: its"
            f" harness.model.called leaves {called.implied} messages to the session's earlier"
            f" events, which hold {len(rebuilt)}: the log is not one little_es wrote"
        )
    return rebuilt


def save_session(world: World, session: HarnessSession, watch: StreamWatch | None) -> None:
    """Commit what ``session`` holds (``watch``: see :meth:`World.save`).

    A session another process appended to first has two drivers (one that lost its
    lease, whose commit had passed its check): a stop with
    :class:`~little_es.errors.DrivenElsewhereError`, not the step's failure, which
    would start a new session that makes every call again.
    """
    try:
        world.save(session, watch=watch)
    except DrivenElsewhereError:
        raise
    except ConcurrencyConflictError as exc:
        raise DrivenElsewhereError(
            f"harness session {session.id}: another process appended to it first, so it"
            " drives the same step; this one stopped with nothing more recorded: make sure"
            " one process drives the run, then resume it"
        ) from exc


async def run_agent_session(
    world: World,
    *,
    run_id: str,
    step_path: str,
    attempt: int,
    model: Model,
    tools: Sequence[Tool],
    prompt: str,
    system: str | None = None,
    parameters: Mapping[str, Any] | None = None,
    max_turns: int = 20,
    retry: RetryPolicy | None = None,
) -> SessionOutcome:
    """Run (or resume) the harness session of one attempt of an agent step.

    Starts the session if ``(run_id, step_path, attempt)`` has none, else
    checks its manifest and fast-forwards through its recorded calls. Returns
    the final assistant content and the whole conversation. Raises
    :class:`SessionInputError` or :class:`~little_es.errors.InvalidRunIdError`
    for unusable arguments, :class:`~little_es.errors.CapabilityDriftError`
    when the agent or its prompt changed since the session started (before any
    call is made),
    :class:`ConversationDivergedError` when the rebuilt conversation disagrees
    with the log, :class:`TurnLimitExceededError` after ``max_turns`` model
    calls without a final answer, and lets the model's
    :class:`~little_es.errors.ModelError` and
    :class:`~little_es.errors.ConcurrencyConflictError` propagate. A retryable
    ``ModelError`` is first retried in place by ``retry`` (the agent step's policy,
    see :func:`~little_es.harness.model.call_model`).
    """
    validate_run_id(run_id)
    if retry is not None and not isinstance(retry, RetryPolicy):
        raise SessionInputError(f"retry must be a RetryPolicy or None, got {type(retry).__name__}")
    if not isinstance(step_path, str) or not step_path:
        raise SessionInputError(f"step_path must be a non-empty string, got {step_path!r}")
    if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 1:
        raise SessionInputError(f"attempt must be an integer >= 1, got {attempt!r}")
    if not isinstance(prompt, str) or not prompt:
        raise SessionInputError("prompt must be a non-empty string: give the task to the model")
    if not callable(getattr(model, "complete", None)):
        raise SessionInputError(
            f"model must have an async complete(request) method, got {type(model).__name__}"
        )
    manifest, manifest_hash = compute_manifest(model, tools, system, parameters, max_turns, prompt)
    session_id = session_stream_id(run_id, step_path, attempt)
    session = world.load_session(session_id)
    if session is None:
        session = HarnessSession(run_id, step_path, attempt)
        session.trigger(
            SessionStarted,
            run_id=run_id,
            step_path=step_path,
            attempt=attempt,
            manifest=manifest,
            manifest_hash=manifest_hash,
        )
        # Not saved alone: it is committed with turn 1's harness.model.called.
    elif session.started is None:
        raise ConversationDivergedError(
            f"run {run_id!r} step {step_path!r} (attempt {attempt}): harness session"
            f" {session_id} has events but no harness.session.started: the log is not one"
            " little_es wrote"
        )
    else:
        # Before any call: a changed prompt (or agent) is drift, not a diverged turn.
        check_manifest(session.started, manifest)
    initial = [Message(role="user", content=prompt)]
    if system is not None:
        initial.insert(0, Message(role="system", content=system))
    loop = _SessionLoop(
        world,
        session,
        run_id=run_id,
        step_path=step_path,
        attempt=attempt,
        model=model,
        tools=resolve_tools(tools),
        parameters=dict(manifest["parameters"]),
        max_turns=max_turns,
        retry=retry,
        conversation=initial,
    )
    return await loop.run()


class _SessionLoop:
    """The turn loop of one session; every call is looked up in the session before it is made."""

    def __init__(
        self,
        world: World,
        session: HarnessSession,
        *,
        run_id: str,
        step_path: str,
        attempt: int,
        model: Model,
        tools: Mapping[str, Tool],
        parameters: dict[str, Any],
        max_turns: int,
        retry: RetryPolicy | None,
        conversation: list[Message],
    ) -> None:
        self.world = world
        self.session = session
        self.run_id = run_id
        self.step_path = step_path
        self.attempt = attempt
        self.model = model
        self.tools = tools
        self.tool_specs = tuple(t.spec for t in tools.values())
        self.parameters = parameters
        self.max_turns = max_turns
        self.retry = retry
        self.conversation = conversation
        self.session_id = str(session.id)
        self.used_call_ids: set[str] = set()
        self._running = 0
        self._suspended: list[StepSuspendedError] = []
        self._waiting: list[RunWaitingError | WaitTimedOutError] = []
        self._stopped: list[RunStoppedError] = []
        self.model_calls_made = 0
        self.tool_calls_made = 0
        self.replayed_model_calls = 0
        self.replayed_tool_calls = 0

    def _save(self, *, checked_next: bool = False) -> None:
        """Commit what the session holds; with ``checked_next`` (the guard's check of the
        call this commit records comes right after it, in this task) the commit also
        reads the run's stream for that check (``CallGuard.watch``)."""
        # A driver that lost its lease appends nothing more (the version check
        # fences the moment between this check and the commit), and since every
        # model call and batch of tool calls follows the save of its write-ahead
        # record, calls nothing more either.
        check_leases()
        guard = current_guard() if checked_next else None
        save_session(self.world, self.session, None if guard is None else guard.watch())

    def _where(self, turn: int) -> str:
        return f"run {self.run_id!r} step {self.step_path!r} (attempt {self.attempt}) turn {turn}"

    async def run(self) -> SessionOutcome:
        session = self.session
        if session.version > 1:
            get_logger(
                run_id=self.run_id,
                step_path=self.step_path,
                session_id=self.session_id,
                attempt=self.attempt,
            ).info(
                "harness.session.replaying",
                recorded_turns=len(session.called),
                completed=session.completed is not None,
            )
        h = ""
        sent = 0
        usages: list[Usage] = []
        for turn in range(1, self.max_turns + 1):
            new = self.conversation[sent:]
            h = conversation_hash(h, new)
            sent = len(self.conversation)
            called = session.called.get(turn)
            if called is None:
                if turn == 1:
                    session.trigger(ModelCalled, turn=1, messages=tuple(new), conversation_hash=h)
                else:
                    # Every message since turn 1 is the previous response and its tool
                    # results, which their own events hold: rebuilt, not stored twice.
                    session.trigger(ModelCalled, turn=turn, implied=len(new), conversation_hash=h)
            elif (
                called.conversation_hash != h
                or called.implied + len(called.messages) != len(new)
                or (turn == 1 and called.implied)
            ):
                raise ConversationDivergedError(
                    f"{self._where(turn)}: the rebuilt conversation does not match the one"
                    " recorded in harness.model.called (its hash chain or message count"
                    " differs): the prompt or the"
                    " recorded history (a response or a tool result) changed since the session"
                    " started; resume with the original prompt, or start a new run"
                )
            # Committed before the model is called, in one transaction with what
            # nothing ran between: SessionStarted, or the previous turn's last result.
            self._save(checked_next=turn not in session.responses)
            response = await self._response(turn)
            usages.append(response.usage)
            self.conversation.append(response.as_message())
            if not response.tool_calls:
                return self._complete(turn, response, _sum_usage(usages))
            if turn == self.max_turns:
                self._save()
                raise TurnLimitExceededError(
                    f"{self._where(turn)}: the model still asked for tools"
                    f" ({', '.join(c.name for c in response.tool_calls)}) after max_turns="
                    f"{self.max_turns} model calls; tell the model when to stop, or give the"
                    " agent a higher max_turns in a new run (this run's agent cannot change: a"
                    " resume with another max_turns is refused as drift)"
                )
            await self._tool_calls(turn, response.tool_calls)
        raise AssertionError("unreachable: the last turn returns or raises")  # pragma: no cover

    async def _response(self, turn: int) -> ModelResponse:
        recorded = self.session.responses.get(turn)
        if recorded is not None:
            self.replayed_model_calls += 1
            return recorded.response
        # Built without re-validating: every part is an already validated value object.
        request = ModelRequest.model_construct(
            messages=tuple(self.conversation), tools=self.tool_specs, parameters=self.parameters
        )
        # The lease was checked by the save of this turn's harness.model.called,
        # the commit just before this call. A cancelled run, or one whose budget
        # is spent, stops here with the call in flight: it is made on resume.
        guard = current_guard()

        async def send() -> ModelResponse:
            self.model_calls_made += 1
            return await self.model.complete(request)

        response = await call_model(
            send, run_id=self.run_id, step_path=self.step_path, retry=self.retry
        )
        if not isinstance(response, ModelResponse):
            raise SessionInputError(
                f"{self._where(turn)}: {type(self.model).__name__}.complete returned"
                f" {type(response).__name__}, not a ModelResponse"
            )
        # Saved by the caller with what follows it: the tool calls' starts, or
        # the session's completion.
        responded = self.session.trigger(
            ModelResponded, turn=turn, response=response, step_path=self.step_path
        )
        if guard is not None:
            guard.model_responded(response, responded.timestamp)
        return response

    async def _tool_calls(self, turn: int, calls: tuple[ToolCall, ...]) -> None:
        session = self.session
        call_ids = [_unique_call_id(self.used_call_ids, call.id, turn) for call in calls]
        for call_id, call in zip(call_ids, calls, strict=True):
            started = session.tool_calls.get(call_id)
            if started is not None and (
                started.turn != turn
                or started.name != call.name
                or not self._args_match(started.args, call)
            ):
                raise ConversationDivergedError(
                    f"{self._where(turn)}: recorded tool call {call_id!r} ({started.name}) does"
                    f" not match the recorded response's call ({call.name}): the log is"
                    " inconsistent"
                )
        unstarted = [
            (call_id, call)
            for call_id, call in zip(call_ids, calls, strict=True)
            if call_id not in session.tool_calls
        ]
        for call_id, call in unstarted:
            args, refused = self._prepared_args(call_id, call)
            session.trigger(ToolCallStarted, turn=turn, call_id=call_id, name=call.name, args=args)
            if refused is not None:
                self.tool_calls_made += 1
                session.trigger(ToolCallFailed, call_id=call_id, error=refused)
        pending = [session.tool_calls[c] for c in call_ids if c not in session.tool_results]
        # The response and every start in one transaction, before any tool runs.
        self._save(checked_next=bool(pending))
        self.replayed_tool_calls += len(call_ids) - len(pending)
        self._running = len(pending)
        guard = current_guard()
        if pending and guard is not None:
            # The starts are committed: a stop leaves the calls in flight, run on resume.
            guard.before_tool_calls(self.step_path)
        if pending:
            tasks = [asyncio.ensure_future(self._invoke(started)) for started in pending]
            try:
                await asyncio.gather(*tasks)
            except BaseException:
                # Calls still running must not record results after the session gave up.
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                raise
        if self._stopped:
            # The others' results are committed, the stopped calls stay in flight.
            stopped, self._stopped, self._waiting = self._stopped, [], []
            self._suspended = []
            self._save()
            raise stopped[0]
        if self._waiting:
            # Calls that wait for a person stay in flight (their RunWaiting is committed);
            # the others' results are committed here, so a resume re-runs none of them.
            waiting, self._waiting = self._waiting, []
            self._save()
            raise _merged(waiting)
        if self._suspended:
            # Every call of the batch had its go: those that finished are committed
            # here, the suspended ones stay in flight and the engine hosts all their
            # sub-runs at once before the attempt runs again.
            suspended, self._suspended = self._suspended, []
            self._save()
            raise StepSuspendedError(tuple(run for s in suspended for run in s.runs))
        for call_id, call in zip(call_ids, calls, strict=True):
            self.conversation.append(_tool_message(call, session.tool_results[call_id]))

    def _tool_context(self, call_id: str) -> ToolContext:
        return ToolContext(
            run_id=self.run_id,
            session_id=self.session_id,
            call_id=call_id,
            step_path=self.step_path,
        )

    def _prepared_args(
        self, call_id: str, call: ToolCall
    ) -> tuple[dict[str, JSONValue], ErrorInfo | None]:
        """The arguments to record for a new call, and the error if the tool's hook refused it
        (or the model's arguments could not be read)."""
        if call.unparsed_arguments is not None:
            return call.arguments, ErrorInfo.from_exception(unparsed_arguments_error(call))
        prepare = getattr(self.tools.get(call.name), "prepare_args", None)
        if prepare is None:
            return call.arguments, None
        try:
            prepared = prepare(dict(call.arguments), self._tool_context(call_id))
            if not isinstance(prepared, dict):
                raise ToolError(
                    f"tool {call.name!r}: prepare_args returned {type(prepared).__name__},"
                    " not a dict of arguments"
                )
            # Exactly what a replay reads back; a value that is not JSON fails the call here.
            data = orjson.dumps(prepared)
            args: dict[str, JSONValue] = orjson.loads(data)
            check_json_value(f"tool {call.name!r} prepared arguments", prepared, data, args)
            if any(args.get(k, _MISSING) != v for k, v in call.arguments.items()):
                raise ToolError(
                    f"tool {call.name!r}: prepare_args changed or removed an argument the model"
                    " sent; it may only add arguments"
                )
        except Exception as exc:
            # Recorded as the call's failure, with the model's own arguments.
            return call.arguments, ErrorInfo.from_exception(exc)
        return args, None

    def _args_match(self, recorded: Mapping[str, JSONValue], call: ToolCall) -> bool:
        """Whether recorded arguments are the model's, or those a ``prepare_args`` extended."""
        if recorded == call.arguments:
            return True
        if getattr(self.tools.get(call.name), "prepare_args", None) is None:
            return False
        return all(recorded.get(k, _MISSING) == v for k, v in call.arguments.items())

    async def _invoke(self, started: ToolCallStarted) -> None:
        tool = self.tools.get(started.name)
        # The lease was checked by the save of the batch's tool_call.started
        # records, the commit just before the calls start.
        self.tool_calls_made += 1
        try:
            if tool is None:
                raise ToolError(
                    f"no tool named {started.name!r}; the tools are:"
                    f" {', '.join(sorted(self.tools)) or 'none'}"
                )
            if tool.waits is not None:
                result = await self._after_wait(tool, started)
            else:
                result = await tool.invoke(dict(started.args), self._tool_context(started.call_id))
        except (RunWaitingError, WaitTimedOutError) as exc:
            # Waits for a signal: no result, the call stays in flight; the batch's other
            # calls finish and are committed before the run stops.
            self._waiting.append(exc)
            self._running -= 1
            return
        except RunStoppedError as exc:
            # A stop (a sub-run cancelled or out of budget): not the tool's failure, and
            # nothing is recorded for the call, which stays in flight. The batch's other
            # calls go on to their own next check, as a wait lets them: cut off, a model
            # call in flight in one of their sub-runs would be paid again on resume.
            self._stopped.append(exc)
            self._running -= 1
            return
        except (RuntimeIntegrityError, WorldStorageError, DrivenElsewhereError):
            # A refusal (a sub-run whose log disagrees with its code), the world's
            # database failing a sub-run's records, or a sub-run another process drives:
            # not the tool's failure to show the model, nothing is recorded for the
            # call, which stays in flight.
            self._running -= 1
            raise
        except StepSuspendedError as exc:
            # Its sub-run runs elsewhere: no result yet, the call stays in flight.
            self._suspended.append(exc)
            self._running -= 1
            return
        except Exception as exc:
            self.session.trigger(
                ToolCallFailed, call_id=started.call_id, error=ErrorInfo.from_exception(exc)
            )
        else:
            self.session.trigger(ToolCallSucceeded, call_id=started.call_id, result=result)
        self._running -= 1
        # Each result is committed as it finishes, except the last of the batch:
        # nothing runs between it and the next turn's harness.model.called, so
        # it rides in that transaction (one commit, often one fsync, per turn saved).
        if self._running:
            self._save()

    async def _after_wait(self, tool: Tool, started: ToolCallStarted) -> JSONValue:
        """The result of a call that waits for a signal: ``ask_human``'s answer, or an
        approved tool's own result (a declined one raises :class:`ApprovalDeniedError`)."""
        spec, model = tool.waits, tool.wait_model
        assert spec is not None and model is not None
        args = dict(started.args)
        # Invalid arguments fail the call at once: nobody is asked about a call that
        # cannot run.
        tool.check_arguments(args)
        guard = current_guard()
        if not isinstance(guard, SignalWaiter):
            raise ToolError(
                f"tool {tool.name!r} waits for a person, which needs a run: use it in an"
                " agent step of a workflow (run_workflow), not in a session on its own"
            )
        question = args.get("question") if spec.kind == "ask_human" else None
        data = await guard.await_signal(
            WaitRequest(
                wait_id=tool_wait_id(self.step_path, self.attempt, started.call_id),
                step_path=self.step_path,
                kind=spec.kind,
                signal=spec.signal,
                model=model,
                timeout_s=spec.timeout_s,
                action={"tool": started.name, "args": args},
                question=question if isinstance(question, str) else None,
            )
        )
        if spec.kind == "ask_human":
            answer: JSONValue = data
            return answer
        approval = Approval.model_validate(data)
        if not approval.approved:
            raise ApprovalDeniedError(
                f"a person declined the call {started.name}({orjson.dumps(args).decode()})"
                + (f": {approval.comment}" if approval.comment else "")
                + "; do not make it again unchanged"
            )
        return await tool.invoke(args, self._tool_context(started.call_id))

    def _complete(self, turn: int, response: ModelResponse, usage: Usage) -> SessionOutcome:
        completed = self.session.completed
        if completed is None:
            self.session.trigger(SessionCompleted, usage=usage, turns=turn, output=response.content)
            self._save()
        elif completed.turns != turn:
            raise ConversationDivergedError(
                f"{self._where(turn)}: the session is recorded completed after"
                f" {completed.turns} turns but its log ends at turn {turn}: the log is"
                " inconsistent"
            )
        return SessionOutcome(
            session_id=self.session.id,
            output=response.content,
            conversation=tuple(self.conversation),
            turns=turn,
            usage=usage,
            model_calls_made=self.model_calls_made,
            tool_calls_made=self.tool_calls_made,
            replayed_model_calls=self.replayed_model_calls,
            replayed_tool_calls=self.replayed_tool_calls,
        )


def _unique_call_id(used: set[str], model_call_id: str, turn: int) -> str:
    # Some models reuse ids across turns (call_0 every turn); the recorded id
    # must name one call of the session, and must be the same on every resume
    # (and in sent_messages, which pairs calls with their results the same way).
    call_id = model_call_id
    n = 1
    while call_id in used:
        call_id = f"{model_call_id}#t{turn}" if n == 1 else f"{model_call_id}#t{turn}.{n}"
        n += 1
    used.add(call_id)
    return call_id


def _merged(stops: Sequence[RunWaitingError | WaitTimedOutError]) -> RunStoppedError:
    """One stop for a batch whose calls stopped: a timeout wins, else every wait is named."""
    for stop in stops:
        if isinstance(stop, WaitTimedOutError):
            return stop
    waiting = [stop for stop in stops if isinstance(stop, RunWaitingError)]
    waits = tuple(w for stop in waiting for w in stop.waits)
    owners = tuple(owner for stop in waiting for owner in stop.wait_run_ids)
    return RunWaitingError(stops[0].run_id, waits, owners)


def _sum_usage(usages: Sequence[Usage]) -> Usage:
    # Summed once at the end: building a Usage runs its validators.
    return Usage(
        input_tokens=sum(u.input_tokens for u in usages),
        output_tokens=sum(u.output_tokens for u in usages),
        cached_input_tokens=sum(u.cached_input_tokens for u in usages),
        reasoning_tokens=sum(u.reasoning_tokens for u in usages),
        cache_write_tokens=sum(u.cache_write_tokens for u in usages),
    )


def _tool_message(call: ToolCall, result: ToolCallSucceeded | ToolCallFailed) -> Message:
    # The conversation keeps the model's own call id, so the tool message
    # answers the call the assistant message names, whatever id was recorded.
    if isinstance(result, ToolCallFailed):
        content = f"error: {result.error.type}: {result.error.message}"
    elif isinstance(result.result, str):
        content = result.result
    else:
        content = orjson.dumps(result.result, option=orjson.OPT_SORT_KEYS).decode()
    return Message(role="tool", content=content, tool_call_id=call.id, name=call.name)

"""The write-ahead durability protocol, and the one place that writes ``Run`` events.

The rules, which every engine (the local scheduler, the Temporal adapter) follows
by calling :class:`RunRecorder`:

1. ``RunStarted`` is committed before the first step runs.
2. ``StepStarted`` is committed before a step's code runs; a step whose
   ``StepStarted`` has no terminal event is *in flight* and runs again on resume
   with the same attempt number (for an agent step: the same harness session,
   which fast-forwards; see :mod:`little_es.harness.session`).
3. ``StepCompleted`` (the output, or an :class:`~little_es.values.ArtifactRef`
   when the output is large, whose bytes are stored first) is committed once the
   step returns, before anything can read it (on the local engine in the commit
   of the run's next record: "One commit per step" below). Once committed the
   step never runs again.
4. ``StepFailed`` records each failed attempt and whether another follows;
   ``RunFailed`` records that retries ran out (a failed run can be resumed).
5. ``ParallelBranchScheduled`` is committed before any branch of a group runs,
   ``SubRunReserved`` before a sub-run starts.

Each ``commit`` is one transaction; a process that loses the race for a
stream's next version stops with :class:`~little_es.errors.ConcurrencyConflictError`.
Before each, the process confirms it still holds the run's lease
(:func:`~little_es.backends.base.check_leases`), and stops with
:class:`~little_es.errors.LeaseLostError` if it lost it.

Appends by a process that does not drive the run (:func:`cancel_run`, a user's
:meth:`~little_es.world.World.record_run_event`) are safe under the stream's
optimistic concurrency, without the run's lease. Such a writer loads the
stream, appends at the next version and, if the driver appended first, fails
the version check and tries again on the reloaded stream: the two never both
take one version. The driver, for its part, either sees the foreign event
before its next step, model call or tool call (:meth:`RunRecorder.refresh`:
one indexed query for a row past its own version, which for an agent's call
the commit of its write-ahead record makes in its own transaction:
:class:`~little_es.backends.base.StreamWatch`), or its next append fails
the version check; it then reloads the stream and decides again on what it
holds (a ``RunCancelled`` makes it stop, a user's event changes nothing). That
retry cannot let a driver that lost its lease go on: the only other writer
that takes versions from it is a driver that took the lease first, and the
retried append checks the lease again, so it stops with
:class:`~little_es.errors.LeaseLostError`.

What a power cut may take: a commit that holds a result (``StepCompleted``,
``StepFailed``, ``RunStarted``...) is fsynced before the engine goes on (on
SQLite with ``synchronous="full"``, the default; always on PostgreSQL; on
MariaDB/MySQL as the server's settings say, which the world checks when it
opens: :mod:`little_es.backends.mysql`). A commit of nothing but write-ahead
records (``StepStarted``, ``ParallelBranchScheduled``, ``SubRunReserved``, and
the harness's ``harness.session.started``, ``harness.model.called`` and
``harness.tool_call.started``) is not (on MariaDB/MySQL it is: InnoDB flushes
every commit alike): such a record only says that a call is in flight, and
losing it makes that call run again on resume, which a crash before the call's
result makes happen anyway. Logs are written in order, so the fsync of the
next result makes every earlier record durable with it, and a killed process
loses no committed record at all (see
:attr:`~little_es.events.Event.write_ahead`).

One commit per step: the local engine holds back a top-level step's
``StepCompleted`` (:meth:`RunRecorder.step_completed` with ``hold``: triggered,
so the run's fold shows the step completed, but not saved) and commits it in
the transaction of the run's next record: the next step's write-ahead
``StepStarted`` (or a group's), ``RunCompleted``, ``StepFailed``... So a
sequential step costs one fsynced commit, not two. The write-ahead guarantee
holds because nothing can act on the held result before that commit: between
a step's return and the next record the engine runs no user code and does not
wait (it only walks to the next step), and it commits what it holds
(:meth:`RunRecorder.flush`) before any code could run or the process could
wait or stop: before a step's code (every attempt), a group's
``branches(ctx)``, a retry's backoff, a look for other writers' appends
(:meth:`RunRecorder.refresh`) and whenever the walk ends with an error. The
next step's code, the only reader of the result, runs after the commit that
carries both records, and ``StepStarted`` is still committed before its step's
code. A crash before that commit loses the result of a step whose code
returned, which is the crash before ``StepCompleted`` every step risks anyway:
the step is in flight and runs again as the same attempt on resume; a crash
after it finds both. A commit that loses the version check to another writer
(a ``RunCancelled``) reloads the stream and triggers the held events again on
it, after the other writer's (:meth:`RunRecorder.reload`), so a held result is
never dropped: it is committed after the cancel, as a ``StepCompleted`` that
loses its own race to a cancel is. Not held: a ``StepCompleted`` with the
step's domain-aggregate changes (they are committed with it, exactly when it
is), a parallel branch's (other branches run their code meanwhile, and a
branch's result must not wait for theirs), and every one the Temporal adapter
writes: it writes from activities, and an event held in one would be lost at
the activity's boundary, as the next record is written by another activity,
maybe on another worker.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from types import MappingProxyType
from typing import Any, Literal
from uuid import UUID

import orjson
from pydantic import BaseModel

from little_es._frozen import freeze
from little_es._strict import check_json_value, refuse_problem
from little_es.aggregates import DomainStream
from little_es.backends.base import check_leases
from little_es.domain import Run
from little_es.errors import (
    ConcurrencyConflictError,
    ConcurrentRunError,
    OutputNotSerializableError,
    RunNotFoundError,
    RunStateError,
)
from little_es.events import (
    BudgetExceeded,
    BudgetSet,
    Event,
    ParallelBranchScheduled,
    RunCancelled,
    RunCompleted,
    RunFailed,
    RunResumed,
    RunStarted,
    RunWaiting,
    StepCompleted,
    StepFailed,
    StepKind,
    StepStarted,
    SubRunReserved,
    WaitTimedOut,
    WorkflowAdopted,
)
from little_es.materialize import RunFold, WaitState
from little_es.values import ArtifactRef, Budget, ErrorInfo
from little_es.waits import WaitRequest, model_ref, schema_digest
from little_es.world import World

NOTHING_READ: Mapping[UUID, int] = MappingProxyType({})
"""``refresh``'s default ``unchanged``: no commit read the run's stream for the check."""

OUTPUT_INLINE_LIMIT = 64 * 1024
"""Outputs (and run inputs) whose JSON is larger than this many bytes are stored as artifacts."""

OUTPUT_MEDIA_TYPE = "application/json"


def _default(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, set | frozenset):
        return sorted(value, key=repr)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


INPUT_PATH = "<input>"
"""The ``step_path`` that names the run input (in messages, and in its artifact)."""

RUN_OUTPUT_PATH = "<run>"
"""The ``step_path`` that names the run's output (in messages, and in its artifact)."""


def _what(step_path: str) -> str:
    if step_path == INPUT_PATH:
        return "the run input"
    if step_path == RUN_OUTPUT_PATH:
        return "the run output"
    return f"step {step_path!r} output"


def _encode(step_path: str, value: Any) -> tuple[bytes, Any]:
    """The JSON bytes of an output (pydantic models are dumped) and the value they read back as.

    Refused with :class:`~little_es.errors.EventPayloadError` when a reader
    would not read back what was given (NaN, infinities, nesting beyond
    :data:`~little_es.MAX_JSON_DEPTH`), with
    :class:`~little_es.errors.OutputNotSerializableError` when it is not JSON at all.
    """
    what = _what(step_path)
    try:
        data = orjson.dumps(value, default=_default)
    except TypeError as exc:
        # orjson gives up beyond 254 levels: say so as for any value too deep.
        refuse_problem(what, value)
        raise OutputNotSerializableError(
            f"{what} cannot be stored as JSON ({exc}): return dicts, lists, strings,"
            " numbers, booleans, None or pydantic models"
        ) from exc
    read_back = orjson.loads(data)
    check_json_value(what, value, data, read_back)
    return data, read_back


def checked_output(step_path: str, value: Any) -> tuple[bytes, Any]:
    """The JSON bytes of a step output and the value they read back as, checked as
    :func:`_encode`: what :meth:`RunRecorder.step_completed` takes as ``encoded``."""
    return _encode(step_path, value)


def encode_output(step_path: str, value: Any) -> bytes:
    """The JSON bytes of a step output (pydantic models are dumped), checked as :func:`_encode`."""
    return _encode(step_path, value)[0]


def normalize_output(step_path: str, value: Any) -> Any:
    """The output exactly as a replay will read it back (tuples become lists, models dicts)."""
    return _encode(step_path, value)[1]


class RunRecorder:
    """Writes one run's ``Run`` stream, following the protocol above.

    ``fold`` is the run's live state, kept by the one reducer as events are
    triggered. ``observer`` (optional) sees every committed event.
    """

    def __init__(
        self,
        world: World,
        run: Run,
        *,
        observer: Callable[[Event], None] | None = None,
    ) -> None:
        self.world = world
        self.run = run
        self._observer = observer
        # Triggered on ``run`` (its fold shows them) and saved by the next commit:
        # the class and fields of each, to trigger it again on a reloaded stream.
        self._held: list[tuple[type[Event], dict[str, Any], Event]] = []

    @property
    def run_id(self) -> str:
        """The run id."""
        run_id = self.run.run_id
        assert run_id is not None
        return run_id

    @property
    def fold(self) -> RunFold:
        """The live state of the run stream."""
        return self.run.fold

    @classmethod
    def load(
        cls, world: World, run_id: str, *, observer: Callable[[Event], None] | None = None
    ) -> RunRecorder | None:
        """The recorder of an existing run, or None when the run was never started."""
        try:
            run = world.load_run(run_id)
        except RunNotFoundError:
            return None
        return cls(world, run, observer=observer)

    @classmethod
    def start(
        cls,
        world: World,
        *,
        run_id: str,
        workflow_id: str,
        workflow_version: str,
        ir_hash: str,
        input: Any,
        parent_run_id: str | None = None,
        parent_step_path: str | None = None,
        observer: Callable[[Event], None] | None = None,
    ) -> RunRecorder:
        """Commit ``RunStarted`` for a new run (a large input by reference, like outputs)."""
        recorder = cls(world, Run(run_id, world.pricer), observer=observer)
        inline, input_ref = recorder._store_output(INPUT_PATH, input)
        recorder._commit(
            RunStarted,
            run_id=run_id,
            workflow_id=workflow_id,
            workflow_version=workflow_version,
            ir_hash=ir_hash,
            input=None if input_ref is not None else inline,
            input_ref=input_ref,
            parent_run_id=parent_run_id,
            parent_step_path=parent_step_path,
        )
        return recorder

    def refresh(self, unchanged: Mapping[UUID, int] = NOTHING_READ) -> bool:
        """Fold what another process appended to the run's stream since this recorder's
        version (a ``RunCancelled``, a user's event); return whether there was anything.

        Costs one indexed query when nothing was appended; the stream is read
        (and verified) only when something was. No query at all when ``unchanged``
        says the commit just before found nothing past this very version
        (:class:`~little_es.backends.base.StreamWatch`).
        """
        # The stream's stored version is the aggregate's only once nothing is held.
        self.flush()
        if unchanged.get(self.run.id) == self.run.version:
            return False
        if not self.world.has_events_after(self.run.id, self.run.version):
            return False
        self.world.catch_up(self.run)
        return True

    def watched(self) -> tuple[UUID, int] | None:
        """The run's stream and the version a commit may read it past for :meth:`refresh`
        (:class:`~little_es.backends.base.StreamWatch`); None while events are held, whose
        commit moves the stored version first."""
        return None if self._held else (self.run.id, self.run.version)

    def reload(self) -> None:
        """Load the run's stream afresh, after an append of this recorder lost the version
        check (its aggregate may hold the event that was not saved).

        The events it holds (:meth:`step_completed` with ``hold``) are triggered again on
        the fresh stream, after what the other writer appended: still held, they are
        saved by the next commit. Unless the other writer completed the same step: only
        another driver of the run does that (one that lost its lease, whose commit had
        passed its lease check), and this driver's walk went on with its own result, so
        it stops with :class:`~little_es.errors.ConcurrentRunError`, holding nothing; a
        resume continues from the log.
        """
        self.run = self.world.load_run(self.run_id)
        held, self._held = self._held, []
        for event_class, fields, _ in held:
            done = self.run.fold.steps.get(fields.get("step_path", ""))
            if event_class is StepCompleted and done is not None and done.status == "completed":
                raise ConcurrentRunError(
                    f"run {self.run_id!r}: step {fields['step_path']!r} was recorded by another"
                    " process while this one drove the run (a driver that lost its lease, whose"
                    " commit had passed its check); this one stopped without recording its own"
                    " result: make sure only one process drives the run, then resume it"
                )
        for event_class, fields, _ in held:
            self._held.append((event_class, fields, self.run.trigger(event_class, **fields)))

    @property
    def holding(self) -> bool:
        """Whether an event is triggered and not yet committed (see :meth:`flush`)."""
        return bool(self._held)

    def flush(self) -> None:
        """Commit the events held back (a ``StepCompleted`` with ``hold``), if any."""
        if self._held:
            check_leases()
            self._save(())

    def _store_output(
        self, step_path: str, output: Any, encoded: tuple[bytes, Any] | None = None
    ) -> tuple[Any, ArtifactRef | None]:
        """The output as read back from JSON, and its artifact when too large to inline.

        ``encoded`` is :func:`checked_output` of this very output, when the caller has it.
        """
        data, read_back = _encode(step_path, output) if encoded is None else encoded
        output_ref = None
        if len(data) > OUTPUT_INLINE_LIMIT:
            self.world.ensure_recorded()
            output_ref = self.world.artifacts.put(
                data, run_id=self.run_id, step_path=step_path, media_type=OUTPUT_MEDIA_TYPE
            )
        return read_back, output_ref

    def _commit(
        self,
        event_class: type[Event],
        *,
        also: Sequence[DomainStream] = (),
        hold: bool = False,
        **fields: Any,
    ) -> None:
        # A driver that lost its lease appends nothing more (the version check
        # fences the moment between this check and the commit).
        check_leases()
        event = self.run.trigger(event_class, **fields)
        if hold:
            self._held.append((event_class, fields, event))
            return
        self._save(also, event)

    def _save(self, also: Sequence[DomainStream], event: Event | None = None) -> None:
        # One transaction for the held events and the new one (eventsourcing saves
        # every pending event of the aggregate); the observer hears of each once it
        # is committed, in the log's order.
        self.world.save(self.run, *also)
        held, self._held = self._held, []
        if self._observer is not None:
            for _, _, committed in held:
                self._observer(committed)
            if event is not None:
                self._observer(event)

    def step_started(
        self,
        step_path: str,
        *,
        step_id: str,
        kind: StepKind,
        visit: int,
        attempt: int,
        session_id: UUID | None = None,
    ) -> None:
        """Commit ``StepStarted``: from here on the step is in flight."""
        self._commit(
            StepStarted,
            step_path=step_path,
            step_id=step_id,
            kind=kind,
            visit=visit,
            attempt=attempt,
            session_id=session_id,
        )

    def step_completed(
        self,
        step_path: str,
        *,
        step_id: str,
        visit: int,
        attempt: int,
        output: Any,
        artifact_refs: Sequence[ArtifactRef] = (),
        next_step: str | None = None,
        aggregates: Sequence[DomainStream] = (),
        hold: bool = False,
        encoded: tuple[bytes, Any] | None = None,
    ) -> Any:
        """Commit ``StepCompleted``; return the output as a replay will read it back.

        An output whose JSON exceeds :data:`OUTPUT_INLINE_LIMIT` is stored as an
        artifact first and the event holds its reference. ``aggregates`` are the
        new events of the step's domain aggregates (:mod:`little_es.aggregates`),
        appended in the same transaction: the step's effect on them is committed
        exactly when the step is.

        With ``hold`` (ignored with ``aggregates``) the event is triggered (the fold shows
        the step completed) and committed by this recorder's next commit, or by
        :meth:`flush`: see "One commit per step" in this module. ``encoded`` is
        :func:`checked_output` of ``output`` when the caller checked it already (the
        executor does, to tell a step's unstorable output from a failure to record it).
        """
        read_back, output_ref = self._store_output(step_path, output, encoded)
        # Frozen once: the event, the fold, its view and the outputs later steps see
        # share this one copy.
        inline = freeze(read_back)
        self._commit(
            StepCompleted,
            step_path=step_path,
            step_id=step_id,
            visit=visit,
            attempt=attempt,
            output=None if output_ref is not None else inline,
            output_ref=output_ref,
            artifact_refs=tuple(artifact_refs),
            next_step=next_step,
            also=aggregates,
            # The step's aggregate changes are committed with it, never held.
            hold=hold and not aggregates,
        )
        return inline

    def step_failed(
        self,
        step_path: str,
        *,
        step_id: str,
        visit: int,
        attempt: int,
        error: ErrorInfo,
        will_retry: bool,
    ) -> None:
        """Commit ``StepFailed`` for one attempt."""
        self._commit(
            StepFailed,
            step_path=step_path,
            step_id=step_id,
            visit=visit,
            attempt=attempt,
            error=error,
            will_retry=will_retry,
        )

    def branches_scheduled(
        self, step_path: str, *, step_id: str, branch_keys: Sequence[str]
    ) -> None:
        """Commit a parallel group's branch set before any branch runs."""
        self._commit(
            ParallelBranchScheduled,
            step_path=step_path,
            step_id=step_id,
            branch_keys=tuple(branch_keys),
        )

    def sub_run_reserved(
        self, step_path: str, *, sub_run_id: str, workflow_id: str, call_id: str | None = None
    ) -> None:
        """Commit a sub-run's id before the sub-run is started."""
        self._commit(
            SubRunReserved,
            step_path=step_path,
            sub_run_id=sub_run_id,
            workflow_id=workflow_id,
            call_id=call_id,
        )

    def run_completed(self, output: Any) -> None:
        """Commit ``RunCompleted`` (large outputs by reference, like step outputs)."""
        inline, output_ref = self._store_output(RUN_OUTPUT_PATH, output)
        self._commit(
            RunCompleted, output=None if output_ref is not None else inline, output_ref=output_ref
        )

    def run_failed(self, error: ErrorInfo, *, step_path: str | None) -> None:
        """Commit ``RunFailed``: retries ran out; the run may be resumed later."""
        self._commit(RunFailed, error=error, step_path=step_path)

    def budget_set(self, budget: Budget) -> None:
        """Commit ``BudgetSet``: the run's budget from here on."""
        self._commit(BudgetSet, budget=budget)

    def budget_exceeded(
        self, *, scope: str, spent: str, step_path: str | None, unpriced_calls: int
    ) -> None:
        """Commit ``BudgetExceeded``: the run stopped before a model call, out of budget."""
        self._commit(
            BudgetExceeded,
            scope=scope,
            spent=spent,
            step_path=step_path,
            unpriced_calls=unpriced_calls,
        )

    def workflow_adopted(self, *, workflow_version: str, ir_hash: str) -> None:
        """Commit ``WorkflowAdopted``: a fork takes a definition other than its origin's (its
        prefix checked against it first, :func:`~little_es.engine.integrity.fork_adopts`)."""
        self._commit(
            WorkflowAdopted,
            workflow_version=workflow_version,
            ir_hash=ir_hash,
            previous_workflow_version=self.fold.workflow_version or "",
            previous_ir_hash=self.fold.ir_hash or "",
        )

    def run_waiting(self, request: WaitRequest, deadline: datetime | None) -> WaitState:
        """Commit ``RunWaiting``: the run waits for ``request``'s signal; return the wait."""
        self._commit(
            RunWaiting,
            wait_id=request.wait_id,
            step_path=request.step_path,
            kind=request.kind,
            signal=request.signal,
            model_ref=model_ref(request.model),
            schema_digest=schema_digest(request.model),
            deadline=deadline,
            action=request.action,
            action_digest=request.action_digest,
            question=request.question,
        )
        return self.fold.waits[request.wait_id]

    def wait_timed_out(self, wait: WaitState) -> None:
        """Commit ``WaitTimedOut``: ``wait``'s deadline passed before its signal came."""
        assert wait.deadline is not None
        self._commit(
            WaitTimedOut,
            wait_id=wait.wait_id,
            step_path=wait.step_path,
            signal=wait.signal,
            deadline=wait.deadline,
        )

    def run_resumed(self) -> None:
        """Commit ``RunResumed``: a cancelled or out-of-budget run continues."""
        self._commit(RunResumed, previous_status=self.fold.status)


_CANCEL_ATTEMPTS = 50


def cancel_run(
    world: World,
    run_id: str,
    *,
    reason: str | None = None,
    requested_by: str | None = None,
    engine: Literal["local", "temporal"] = "local",
) -> RunCancelled | None:
    """Record ``RunCancelled`` on ``run_id``; its driver stops before its next step, model call
    or tool call, and the run is resumed only when asked (``resume_cancelled=True``).

    Run from any process: it does not take the run's lease (the driver holds it)
    and is safe under the stream's optimistic concurrency (see this module).
    Returns the event, or None when the run was cancelled already (nothing is
    appended twice). Raises :class:`~little_es.errors.RunNotFoundError` for a run
    that never started and :class:`~little_es.errors.RunStateError` for a
    completed or timed-out one (there is nothing left to stop).
    """
    who = requested_by or f"pid {os.getpid()} on {socket.gethostname()}"
    for attempt in range(_CANCEL_ATTEMPTS):
        recorder = RunRecorder.load(world, run_id)
        if recorder is None:
            raise RunNotFoundError(run_id, world.name)
        status = recorder.fold.status
        if status == "cancelled":
            return None
        if status == "completed":
            raise RunStateError(f"run {run_id!r} is completed: there is nothing to cancel")
        if status == "timed_out":
            # Stopped for good: a cancel, then a resume, would read as a run going on.
            raise RunStateError(
                f"run {run_id!r} is timed_out (a wait's deadline passed): it is stopped for"
                " good and there is nothing to cancel; fork or re-run it to try again"
            )
        try:
            event = recorder.run.trigger(
                RunCancelled, reason=reason, requested_by=who, engine=engine
            )
            world.save(recorder.run)
        except ConcurrencyConflictError:
            # The driver appended first: cancel on the stream as it is now.
            if attempt + 1 == _CANCEL_ATTEMPTS:
                raise
            continue
        return event
    raise AssertionError("unreachable")  # pragma: no cover


def read_output(world: World, output: Any, output_ref: ArtifactRef | None) -> Any:
    """A committed output: inline, or read (and verified) from its artifact."""
    if output_ref is None:
        return output
    return orjson.loads(world.artifacts.get(output_ref).payload)

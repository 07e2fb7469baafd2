"""The local scheduler in-process: order, loops, parallel groups, retries, resume, restart checks.

Every test runs real workflows through :func:`run_workflow` on real worlds (the
``world`` fixture: memory, SQLite and PostgreSQL) and checks what the step
functions saw and did (a ledger they append to) against what the log records.

A run is stopped in-process by raising :class:`_Stop`, a ``BaseException``
that the runtime does not treat as a step failure: like a crash, it leaves the
step in flight with no terminal event, and the next ``run_workflow`` on the
same run id resumes it.
"""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar, cast

import orjson
import pytest
from conftest import WorldSpec

from little_es import set_max_worker_threads
from little_es._threads import DEFAULT_MAX_WORKER_THREADS
from little_es.backends.memory import MemoryArtifactStore
from little_es.domain import Run
from little_es.durability import OUTPUT_INLINE_LIMIT
from little_es.engine.executor import sub_run_id_for
from little_es.engine.local import RunResult, run_workflow
from little_es.errors import (
    ArtifactMismatchError,
    InvalidRunIdError,
    ParallelReplayMismatchError,
    RunFailedError,
    RunInputMismatchError,
    VisitLimitError,
    WorkflowChangedError,
)
from little_es.events import (
    Event,
    ModelCalled,
    RunCompleted,
    RunFailed,
    RunStarted,
    StepCompleted,
    StepFailed,
    StepStarted,
    SubRunReserved,
)
from little_es.harness.model import ScriptedModel, ScriptedReply
from little_es.materialize import materialize_run_state
from little_es.pricing import price_usage_exact
from little_es.values import ArtifactRef
from little_es.workflow.authoring import (
    Workflow,
    agent,
    decision,
    parallel,
    subworkflow,
    task,
)
from little_es.workflow.context import StepContext
from little_es.workflow.ir import END, RetryPolicy
from little_es.world import World

pytestmark = pytest.mark.timeout(60)

T = TypeVar("T")


class _Stop(BaseException):
    """Raised by a step to stop the run mid-way, like a crash (no terminal event)."""


class _Ledger:
    """What the step functions really executed: ``(step_path, attempt)`` in order."""

    def __init__(self) -> None:
        self.entries: list[tuple[str, int]] = []
        self._lock = threading.Lock()

    def record(self, ctx: StepContext) -> None:
        with self._lock:
            self.entries.append((ctx.step_path, ctx.attempt))

    @property
    def paths(self) -> list[str]:
        return [path for path, _ in self.entries]

    def count(self, path: str) -> int:
        return self.paths.count(path)

    def attempts(self, path: str) -> list[int]:
        return [attempt for p, attempt in self.entries if p == path]


@pytest.fixture
def ledger() -> _Ledger:
    """An empty ledger for this test's step functions."""
    return _Ledger()


@pytest.fixture
def reopen(
    world: World, world_spec: WorldSpec, world_factory: Callable[[], World]
) -> Callable[[], World]:
    """A world to resume on: a freshly opened one on the same storage (memory: the same one)."""
    if world_spec.persistent:
        return world_factory
    return lambda: world


def _log(world: World, run_id: str) -> list[Event]:
    return world.read_run_log(run_id)


def _of(events: list[Event], cls: type[T]) -> list[T]:
    return [e for e in events if isinstance(e, cls)]


def _recording(ledger: _Ledger, value: Any = None) -> Callable[[StepContext], Any]:
    """A sync step function that records its execution and returns ``value`` (or its path)."""

    def step(ctx: StepContext) -> Any:
        ledger.record(ctx)
        return ctx.step_path if value is None else value

    return step


# ------------------------------------------------------------------ order, loops


async def test_steps_run_in_list_order_and_the_last_output_is_the_run_output(
    world: World, ledger: _Ledger
) -> None:
    def last(ctx: StepContext) -> dict[str, Any]:
        ledger.record(ctx)
        return {"a": ctx.outputs["a"], "b": ctx.outputs["b"]}

    wf = Workflow(
        "order",
        steps=[task("a", _recording(ledger, 1)), task("b", _recording(ledger, 2)), task("c", last)],
    )
    result = await run_workflow(world, wf, {"q": 1}, run_id="run_order")

    assert ledger.paths == ["a", "b", "c"]
    assert result.output == {"a": 1, "b": 2}
    assert (result.run_id, result.resumed, result.steps_executed) == ("run_order", False, 3)
    events = _log(world, "run_order")
    assert [(e.wire_name, getattr(e, "step_path", None)) for e in events] == [
        ("RunStarted", None),
        ("StepStarted", "a"),
        ("StepCompleted", "a"),
        ("StepStarted", "b"),
        ("StepCompleted", "b"),
        ("StepStarted", "c"),
        ("StepCompleted", "c"),
        ("RunCompleted", None),
    ]
    started = _of(events, RunStarted)[0]
    assert (started.workflow_id, started.ir_hash, started.input) == ("order", wf.ir_hash, {"q": 1})
    # The runtime's live state is the reducer's fold of the stored log.
    assert result.state == materialize_run_state(events, pricer=price_usage_exact)
    assert result.state.status == "completed"
    assert {p: s.status for p, s in result.state.steps.items()} == dict.fromkeys(
        ["a", "b", "c"], "completed"
    )


async def test_a_new_run_gets_a_fresh_id_and_the_observer_sees_every_committed_event(
    world: World,
) -> None:
    seen: list[Event] = []
    wf = Workflow("obs", steps=[task("a", lambda ctx: 1)])
    result = await run_workflow(world, wf, observer=seen.append)
    assert result.run_id
    assert seen == _log(world, result.run_id)
    assert result.state.input == {}


async def test_run_workflow_validates_its_arguments(world: World) -> None:
    wf = Workflow("args", steps=[task("a", lambda ctx: 1)])
    with pytest.raises(TypeError, match="Workflow"):
        await run_workflow(world, "not a workflow", {})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="mapping"):
        await run_workflow(world, wf, ["not", "a", "mapping"])  # type: ignore[arg-type]
    with pytest.raises(InvalidRunIdError):
        await run_workflow(world, wf, {}, run_id="../etc/passwd")


async def test_a_decision_loop_records_one_path_and_one_visit_per_pass(
    world: World, ledger: _Ledger
) -> None:
    visits: list[tuple[str, int]] = []
    drafts_seen: list[Any] = []

    def draft(ctx: StepContext) -> dict[str, int]:
        ledger.record(ctx)
        visits.append((ctx.step_id, ctx.visit))
        return {"version": ctx.visit}

    def review(ctx: StepContext) -> str:
        ledger.record(ctx)
        visits.append((ctx.step_id, ctx.visit))
        drafts_seen.append(ctx.outputs["draft"]["version"])
        return "draft" if ctx.visit < 3 else "publish"

    wf = Workflow(
        "loop",
        steps=[
            task("draft", draft, max_visits=3),
            decision("review", review, max_visits=3),
            task("publish", _recording(ledger, "published")),
        ],
    )
    result = await run_workflow(world, wf, {}, run_id="run_loop")

    assert ledger.paths == [
        "draft",
        "review",
        "draft@2",
        "review@2",
        "draft@3",
        "review@3",
        "publish",
    ]
    assert visits == [
        ("draft", 1),
        ("review", 1),
        ("draft", 2),
        ("review", 2),
        ("draft", 3),
        ("review", 3),
    ]
    # outputs holds each step's latest committed output.
    assert drafts_seen == [1, 2, 3]
    assert dict(result.state.visits) == {"draft": 3, "review": 3, "publish": 1}
    assert result.state.pending_decision_target == "publish"
    completed = {e.step_path: e for e in _of(_log(world, "run_loop"), StepCompleted)}
    assert [completed[p].next_step for p in ("review", "review@2", "review@3")] == [
        "draft",
        "draft",
        "publish",
    ]
    assert completed["draft@2"].visit == 2
    # A decision's output is its target; the run output is the last non-decision output.
    assert completed["review@3"].output == "publish"
    assert result.output == "published"


async def test_a_decision_returning_end_ends_the_run(world: World, ledger: _Ledger) -> None:
    wf = Workflow(
        "end",
        steps=[
            task("a", _recording(ledger, "a-out")),
            decision("stop", lambda ctx: END),
            task("never", _recording(ledger)),
        ],
    )
    result = await run_workflow(world, wf, {}, run_id="run_end")
    assert ledger.paths == ["a"]
    assert result.output == "a-out"
    assert result.state.pending_decision_target == END


async def test_a_loop_past_max_visits_fails_the_run_with_visit_limit_error(
    world: World, ledger: _Ledger
) -> None:
    wf = Workflow(
        "runaway",
        steps=[
            task("draft", _recording(ledger), max_visits=2),
            decision("review", lambda ctx: "draft", max_visits=5),
        ],
    )
    with pytest.raises(VisitLimitError, match="max_visits=2") as raised:
        await run_workflow(world, wf, {}, run_id="run_runaway")
    assert "run_runaway" in str(raised.value)
    assert ledger.paths == ["draft", "draft@2"]
    events = _log(world, "run_runaway")
    assert isinstance(events[-1], RunFailed)
    assert events[-1].error.type == "VisitLimitError"
    assert events[-1].error.retryable is False
    state = materialize_run_state(events, pricer=price_usage_exact)
    assert state.status == "failed"
    assert state.error is not None and state.error.type == "VisitLimitError"
    assert dict(state.visits) == {"draft": 2, "review": 2}


# ---------------------------------------------------------------- parallel groups


async def test_a_parallel_group_runs_each_branch_under_its_own_path(
    world: World, ledger: _Ledger
) -> None:
    seen: dict[str, tuple[str | None, str | None, Any]] = {}

    def lint(ctx: StepContext) -> str:
        ledger.record(ctx)
        seen[ctx.step_path] = (ctx.group_id, ctx.branch_key, ctx.branch_value)
        return f"lint:{ctx.branch_value}"

    def after(ctx: StepContext) -> Any:
        return dict(ctx.outputs["check"])

    wf = Workflow(
        "par",
        steps=[
            task("fetch", lambda ctx: {"files": ["a.py", "b.py", "c.py"]}),
            parallel(
                "check", branches=lambda ctx: ctx.outputs["fetch"]["files"], step=task("lint", lint)
            ),
            task("after", after),
        ],
    )
    result = await run_workflow(world, wf, {}, run_id="run_par")

    paths = ["check[a.py]/lint", "check[b.py]/lint", "check[c.py]/lint"]
    assert sorted(ledger.paths) == paths
    assert seen["check[b.py]/lint"] == ("check", "b.py", "b.py")
    group_output = {"a.py": "lint:a.py", "b.py": "lint:b.py", "c.py": "lint:c.py"}
    assert result.output == group_output
    assert list(result.output) == ["a.py", "b.py", "c.py"]
    assert dict(result.state.parallel_groups) == {"check": ("a.py", "b.py", "c.py")}
    events = _log(world, "run_par")
    names = [(e.wire_name, getattr(e, "step_path", None)) for e in events]
    scheduled = names.index(("ParallelBranchScheduled", "check"))
    assert scheduled < min(names.index(("StepStarted", p)) for p in paths)
    group_done = names.index(("StepCompleted", "check"))
    assert group_done > max(names.index(("StepCompleted", p)) for p in paths)
    assert (
        next(e for e in _of(events, StepCompleted) if e.step_path == "check").output == group_output
    )
    assert all(result.state.visits[p] == 1 for p in paths)


async def test_a_branch_set_may_be_a_mapping_or_empty(world: World) -> None:
    wf = Workflow(
        "par-map",
        steps=[
            parallel(
                "square",
                branches=lambda ctx: {"x": {"n": 2}, "y": {"n": 3}},
                step=task("sq", lambda ctx: ctx.branch_value["n"] ** 2),
            ),
            parallel("none", branches=lambda ctx: [], step=task("nothing", lambda ctx: 0)),
            task("out", lambda ctx: {"square": ctx.outputs["square"], "none": ctx.outputs["none"]}),
        ],
    )
    result = await run_workflow(world, wf, {}, run_id="run_par_map")
    assert result.output == {"square": {"x": 4, "y": 9}, "none": {}}
    assert dict(result.state.parallel_groups) == {"square": ("x", "y"), "none": ()}


async def test_a_parallel_group_in_a_loop_counts_its_visits_in_branch_paths(
    world: World, ledger: _Ledger
) -> None:
    wf = Workflow(
        "par-loop",
        steps=[
            parallel(
                "check",
                branches=lambda ctx: ["a", "b"],
                step=task("lint", _recording(ledger, 1)),
                max_visits=2,
            ),
            decision("again", lambda ctx: "check" if ctx.visit == 1 else END, max_visits=2),
        ],
    )
    result = await run_workflow(world, wf, {}, run_id="run_par_loop")
    assert sorted(ledger.paths) == [
        "check@2[a]/lint",
        "check@2[b]/lint",
        "check[a]/lint",
        "check[b]/lint",
    ]
    assert dict(result.state.parallel_groups) == {"check": ("a", "b"), "check@2": ("a", "b")}
    assert result.state.visits["check"] == 2


@pytest.mark.parametrize("limit", [None, 1, 2, 4])
async def test_max_concurrency_bounds_how_many_branches_run_at_once(
    world: World, limit: int | None
) -> None:
    running = 0
    peak = 0

    async def slow(ctx: StepContext) -> str:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.02)
        running -= 1
        return ctx.branch_key or ""

    keys = [f"k{i}" for i in range(6)]
    wf = Workflow(
        "par-limit",
        steps=[
            parallel(
                "fan", branches=lambda ctx: keys, step=task("work", slow), max_concurrency=limit
            )
        ],
    )
    result = await run_workflow(world, wf, {}, run_id="run_par_limit")
    assert peak == (limit or len(keys))
    assert result.output == {k: k for k in keys}


@pytest.mark.backends("memory")
async def test_sync_branches_run_concurrently_within_the_limit(world: World) -> None:
    lock = threading.Lock()
    running = 0
    peak = 0

    def blocking(ctx: StepContext) -> int:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        time.sleep(0.15)
        with lock:
            running -= 1
        return 1

    wf = Workflow(
        "par-sync",
        steps=[
            parallel(
                "fan",
                branches=lambda ctx: ["a", "b", "c", "d"],
                step=task("work", blocking),
                max_concurrency=2,
            )
        ],
    )
    started = time.monotonic()
    await run_workflow(world, wf, {}, run_id="run_par_sync")
    elapsed = time.monotonic() - started
    # Two blocking functions ran at once (they do not block the event loop), never three.
    assert peak == 2
    assert elapsed >= 0.3  # four 0.15 s branches, two at a time


@pytest.mark.backends("memory")
async def test_set_max_worker_threads_lets_that_many_sync_branches_run_at_once(
    world: World,
) -> None:
    # Every branch waits for all the others: over the default limit, the first ones would
    # hold every worker thread while the rest waited for one, and the barrier would break.
    width = DEFAULT_MAX_WORKER_THREADS + 2
    together = threading.Barrier(width, timeout=10)

    def meet(ctx: StepContext) -> Any:
        together.wait()
        return ctx.branch_value

    wf = Workflow(
        "par-wide",
        steps=[
            parallel(
                "fan",
                branches=lambda ctx: {str(i): i for i in range(width)},
                step=task("meet", meet),
            )
        ],
    )
    previous = set_max_worker_threads(width)
    try:
        result = await run_workflow(world, wf, {}, run_id="run_par_wide")
    finally:
        set_max_worker_threads(previous)
    assert result.output == {str(i): i for i in range(width)}


# ------------------------------------------------------------- step functions


async def _async_double(ctx: StepContext) -> int:
    await asyncio.sleep(0)
    return int(ctx.input["n"]) * 2


class _AsyncCallable:
    async def __call__(self, ctx: StepContext) -> str:
        await asyncio.sleep(0)
        return "object"


@pytest.mark.backends("memory")
async def test_sync_and_async_step_functions(world: World) -> None:
    def returns_coroutine(ctx: StepContext) -> Coroutine[Any, Any, int]:
        return _async_double(ctx)

    async def async_decision(ctx: StepContext) -> str:
        await asyncio.sleep(0)
        return "collect"

    wf = Workflow(
        "kinds",
        steps=[
            task("sync", lambda ctx: int(ctx.input["n"]) + 1),
            task("async_fn", _async_double),
            task("coroutine", returns_coroutine),
            task("partial", functools.partial(_async_double)),
            task("callable", _AsyncCallable()),
            decision("choose", async_decision),
            task("collect", lambda ctx: dict(ctx.outputs)),
        ],
    )
    result = await run_workflow(world, wf, {"n": 5}, run_id="run_kinds")
    assert result.output == {
        "sync": 6,
        "async_fn": 10,
        "coroutine": 10,
        "partial": 10,
        "callable": "object",
        "choose": "collect",
    }


@pytest.mark.backends("memory")
async def test_run_in_thread_false_calls_a_sync_fn_on_the_event_loop(world: World) -> None:
    loop_thread = threading.get_ident()
    threads: dict[str, int] = {}

    def where(ctx: StepContext) -> str:
        threads[ctx.step_path] = threading.get_ident()
        return ctx.step_path

    def route(ctx: StepContext) -> str:
        threads[ctx.step_path] = threading.get_ident()
        return END

    wf = Workflow(
        "threads",
        steps=[
            task("hop", where),
            task("inline", where, run_in_thread=False),
            decision("route", route, run_in_thread=False),
        ],
    )
    result = await run_workflow(world, wf, {}, run_id="run_threads")
    assert result.steps_executed == 3
    assert threads["hop"] != loop_thread
    assert threads["inline"] == loop_thread
    assert threads["route"] == loop_thread


async def test_step_context_holds_the_run_data_and_the_execution(world: World) -> None:
    contexts: dict[str, StepContext] = {}
    refusals: list[str] = []

    def keep(ctx: StepContext) -> Any:
        contexts[ctx.step_path] = ctx

        def change_input() -> None:
            cast(dict[str, Any], ctx.input)["topic"] = "other"

        def change_output() -> None:
            ctx.outputs["first"]["items"].append(4)

        if ctx.step_path == "second":
            for change in (change_input, change_output):
                try:
                    change()
                except TypeError as exc:
                    refusals.append(str(exc))
        return {"items": [1, 2, 3]} if ctx.step_id == "first" else ctx.branch_value

    wf = Workflow(
        "ctx",
        steps=[
            task("first", keep),
            task("second", keep),
            parallel("group", branches=lambda ctx: {"k": {"v": 1}}, step=task("inner", keep)),
        ],
    )
    await run_workflow(world, wf, {"topic": "durability"}, run_id="run_ctx")

    first, second, inner = contexts["first"], contexts["second"], contexts["group[k]/inner"]
    assert first.run_id == "run_ctx"
    assert first.input == {"topic": "durability"}
    assert dict(first.outputs) == {}
    assert dict(second.outputs) == {"first": {"items": [1, 2, 3]}}
    assert (second.step_path, second.step_id, second.visit, second.attempt) == (
        "second",
        "second",
        1,
        1,
    )
    assert second.idempotency_key == "run_ctx:second"
    assert second.branch_value is None and second.group_id is None
    assert (inner.step_id, inner.group_id, inner.branch_key, inner.branch_value) == (
        "inner",
        "group",
        "k",
        {"v": 1},
    )
    assert inner.idempotency_key == "run_ctx:group[k]/inner"
    assert "second" in inner.outputs
    # The recorded input and outputs are read-only for steps.
    assert len(refusals) == 2
    assert all("read-only" in r for r in refusals)


async def test_an_in_flight_step_reruns_with_the_same_attempt_and_idempotency_key(
    world: World, reopen: Callable[[], World]
) -> None:
    keys: list[tuple[str, int]] = []
    stop = True

    def charge(ctx: StepContext) -> str:
        keys.append((ctx.idempotency_key, ctx.attempt))
        if stop:
            raise _Stop
        return "charged"

    wf = Workflow("idem", steps=[task("charge", charge, retry=RetryPolicy(max_attempts=3))])
    with pytest.raises(_Stop):
        await run_workflow(world, wf, {}, run_id="run_idem")
    stop = False
    result = await run_workflow(reopen(), wf, run_id="run_idem")
    assert keys == [("run_idem:charge", 1), ("run_idem:charge", 1)]
    assert result.resumed and result.output == "charged"
    started = _of(_log(world, "run_idem"), StepStarted)
    # The crashed attempt is continued, not recorded as a new one.
    assert [(e.step_path, e.attempt) for e in started] == [("charge", 1)]


# ------------------------------------------------------------------ retries


async def test_retries_record_each_attempt_and_wait_the_backoff(
    world: World, ledger: _Ledger
) -> None:
    keys: set[str] = set()

    def flaky(ctx: StepContext) -> str:
        ledger.record(ctx)
        keys.add(ctx.idempotency_key)
        if ctx.attempt < 3:
            raise ConnectionError(f"attempt {ctx.attempt} failed")
        return "ok"

    policy = RetryPolicy(max_attempts=3, initial_backoff_s=0.05, backoff_coefficient=2.0)
    wf = Workflow("retry", steps=[task("flaky", flaky, retry=policy)])
    started = time.monotonic()
    result = await run_workflow(world, wf, {}, run_id="run_retry")
    elapsed = time.monotonic() - started

    assert result.output == "ok"
    assert ledger.attempts("flaky") == [1, 2, 3]
    assert keys == {"run_retry:flaky"}
    assert result.steps_executed == 3
    # 0.05 s after attempt 1, then 0.1 s after attempt 2.
    assert elapsed >= 0.15
    events = _log(world, "run_retry")
    assert [e.attempt for e in _of(events, StepStarted)] == [1, 2, 3]
    failed = _of(events, StepFailed)
    assert [(f.attempt, f.will_retry) for f in failed] == [(1, True), (2, True)]
    assert failed[0].error.type == "ConnectionError"
    assert failed[0].error.message == "attempt 1 failed"
    step = result.state.steps["flaky"]
    assert (step.status, step.attempts, step.error) == ("completed", 3, None)


async def test_exhausted_retries_fail_the_run_and_a_resume_after_the_fix_continues(
    world: World, reopen: Callable[[], World], ledger: _Ledger
) -> None:
    broken = True

    def fragile(ctx: StepContext) -> str:
        ledger.record(ctx)
        if broken:
            raise ValueError("the upstream API rejected the request")
        return "fixed"

    wf = Workflow(
        "fail",
        steps=[
            task("prepare", _recording(ledger, "prepared")),
            task("fragile", fragile, retry=RetryPolicy(max_attempts=2)),
            task("finish", _recording(ledger, "finished")),
        ],
    )
    with pytest.raises(RunFailedError) as raised:
        await run_workflow(world, wf, {"x": 1}, run_id="run_fail")
    error = raised.value
    assert (error.run_id, error.step_path) == ("run_fail", "fragile")
    assert error.error.type == "ValueError"
    assert "resume" in str(error) and "run_fail" in str(error)
    assert isinstance(error.__cause__, ValueError)
    events = _log(world, "run_fail")
    assert [(f.attempt, f.will_retry) for f in _of(events, StepFailed)] == [(1, True), (2, False)]
    assert isinstance(events[-1], RunFailed)
    assert events[-1].step_path == "fragile"
    state = materialize_run_state(events, pricer=price_usage_exact)
    assert (state.status, state.failed_step_path) == ("failed", "fragile")
    assert state.steps["fragile"].status == "failed"
    assert "finish" not in ledger.paths

    broken = False
    result = await run_workflow(reopen(), wf, run_id="run_fail")
    assert (result.run_id, result.resumed, result.output) == ("run_fail", True, "finished")
    # Only the failed step (a new attempt, with a fresh budget) and what follows it ran.
    assert result.steps_executed == 2
    assert ledger.count("prepare") == 1
    assert ledger.attempts("fragile") == [1, 2, 3]
    assert ledger.count("finish") == 1
    assert result.state.status == "completed"
    assert result.state.error is None


async def test_an_attempt_in_flight_after_a_resume_keeps_the_fresh_budget(
    world: World, reopen: Callable[[], World], ledger: _Ledger
) -> None:
    # Attempts 1-2 fail and the run gives up; the resume's attempt 3 crashes in
    # flight; the next resume continues attempt 3 within the budget that began
    # after attempt 2 (attempts 3 and 4), not within the first one (1 and 2).
    crash_at = 3

    def fragile(ctx: StepContext) -> str:
        ledger.record(ctx)
        if ctx.attempt == crash_at:
            raise _Stop
        if ctx.attempt < 4:
            raise ConnectionError(f"attempt {ctx.attempt} failed")
        return "done"

    wf = Workflow(
        "budget",
        steps=[task("fragile", fragile, retry=RetryPolicy(max_attempts=2, initial_backoff_s=0))],
    )
    with pytest.raises(RunFailedError):
        await run_workflow(world, wf, {}, run_id="run_budget")
    with pytest.raises(_Stop):
        await run_workflow(reopen(), wf, run_id="run_budget")
    crash_at = 0
    result = await run_workflow(reopen(), wf, run_id="run_budget")
    assert result.output == "done"
    assert ledger.attempts("fragile") == [1, 2, 3, 3, 4]
    failed = _of(_log(world, "run_budget"), StepFailed)
    assert [(f.attempt, f.will_retry) for f in failed] == [(1, True), (2, False), (3, True)]
    # The budget survives a snapshot of the run, which the read model does not show.
    run = reopen().load_run("run_budget")
    restored = Run("run_budget", price_usage_exact)
    restored.restore(run.snapshot_state())
    # The snapshot names the output's StepCompleted instead of copying it; a load reads it.
    stream = reopen().read_stream(run.id)
    restored.read_outputs((p, stream[v - 1]) for p, v in restored.outputs_to_read().items())
    assert restored.fold.steps["fragile"].gave_up_attempt == 2
    assert restored.fold.freeze() == run.fold.freeze()


async def test_a_failed_branch_fails_the_run_and_only_it_runs_again_on_resume(
    world: World, reopen: Callable[[], World], ledger: _Ledger
) -> None:
    broken = {"b"}

    def lint(ctx: StepContext) -> str:
        ledger.record(ctx)
        if ctx.branch_key in broken:
            raise RuntimeError(f"cannot lint {ctx.branch_key}")
        return f"ok:{ctx.branch_key}"

    wf = Workflow(
        "branch-fail",
        steps=[parallel("check", branches=lambda ctx: ["a", "b", "c"], step=task("lint", lint))],
    )
    with pytest.raises(RunFailedError) as raised:
        await run_workflow(world, wf, {}, run_id="run_branch_fail")
    assert raised.value.step_path == "check[b]/lint"
    state = materialize_run_state(_log(world, "run_branch_fail"), pricer=price_usage_exact)
    assert state.status == "failed"
    assert {p: s.status for p, s in state.steps.items()} == {
        "check": "running",
        "check[a]/lint": "completed",
        "check[b]/lint": "failed",
        "check[c]/lint": "completed",
    }
    broken.clear()
    result = await run_workflow(reopen(), wf, run_id="run_branch_fail")
    assert result.output == {"a": "ok:a", "b": "ok:b", "c": "ok:c"}
    assert ledger.attempts("check[b]/lint") == [1, 2]
    assert ledger.count("check[a]/lint") == ledger.count("check[c]/lint") == 1
    assert result.steps_executed == 1


async def test_a_failed_sub_run_fails_the_parent_and_both_resume_after_the_fix(
    world: World, reopen: Callable[[], World], ledger: _Ledger
) -> None:
    broken = True

    def fragile(ctx: StepContext) -> str:
        ledger.record(ctx)
        if broken:
            raise ValueError("the sub-run's step failed")
        return "child done"

    child = Workflow(
        "child-fail", steps=[task("ok", _recording(ledger, 1)), task("fragile", fragile)]
    )
    parent = Workflow("parent-fail", steps=[subworkflow("sub", child)])
    with pytest.raises(RunFailedError) as raised:
        await run_workflow(world, parent, {}, run_id="run_parent_fail")
    assert raised.value.step_path == "sub"
    assert raised.value.error.type == "RunFailedError"
    sub_id = sub_run_id_for("run_parent_fail", "sub")
    assert materialize_run_state(_log(world, sub_id), pricer=price_usage_exact).status == "failed"

    broken = False
    result = await run_workflow(reopen(), parent, run_id="run_parent_fail")
    assert result.output == "child done"
    # The sub-run resumed (same id, nothing reserved twice), its completed step did not rerun.
    assert ledger.count("ok") == 1
    assert ledger.attempts("fragile") == [1, 2]
    assert len(_of(_log(world, "run_parent_fail"), SubRunReserved)) == 1
    assert (
        materialize_run_state(_log(world, sub_id), pricer=price_usage_exact).status == "completed"
    )


async def test_an_error_marked_not_retryable_is_not_retried(world: World, ledger: _Ledger) -> None:
    class RejectedError(Exception):
        retryable = False

    def reject(ctx: StepContext) -> None:
        ledger.record(ctx)
        raise RejectedError("invalid card")

    wf = Workflow("noretry", steps=[task("pay", reject, retry=RetryPolicy(max_attempts=5))])
    with pytest.raises(RunFailedError) as raised:
        await run_workflow(world, wf, {}, run_id="run_noretry")
    assert raised.value.error.retryable is False
    assert ledger.attempts("pay") == [1]
    failed = _of(_log(world, "run_noretry"), StepFailed)
    assert [(f.attempt, f.will_retry) for f in failed] == [(1, False)]


@pytest.mark.parametrize("fault", ["not_json", "unknown_target"])
async def test_a_bad_output_or_decision_target_is_recorded_as_the_step_failure(
    world: World, fault: str
) -> None:
    wf = Workflow(
        "bad",
        steps=[
            task("produce", lambda ctx: object() if fault == "not_json" else "fine"),
            decision("route", lambda ctx: "nowhere" if fault == "unknown_target" else END),
        ],
    )
    with pytest.raises(RunFailedError) as raised:
        await run_workflow(world, wf, {}, run_id="run_bad")
    path, error_type = {
        "not_json": ("produce", "OutputNotSerializableError"),
        "unknown_target": ("route", "UnknownStepError"),
    }[fault]
    assert (raised.value.step_path, raised.value.error.type) == (path, error_type)
    events = _log(world, "run_bad")
    failed = _of(events, StepFailed)
    assert [(f.step_path, f.will_retry) for f in failed] == [(path, False)]
    assert isinstance(events[-1], RunFailed)
    assert materialize_run_state(events, pricer=price_usage_exact).steps[path].status == "failed"


# ------------------------------------------------------------- large outputs


def _big(seed: str) -> dict[str, str]:
    return {"blob": seed * (OUTPUT_INLINE_LIMIT // len(seed) + 100)}


async def test_a_large_output_is_stored_as_an_artifact_and_read_back_on_resume(
    world: World, reopen: Callable[[], World], ledger: _Ledger
) -> None:
    stop = True
    seen: list[int] = []

    def produce(ctx: StepContext) -> dict[str, str]:
        ledger.record(ctx)
        return _big("abc")

    def consume(ctx: StepContext) -> dict[str, str]:
        ledger.record(ctx)
        seen.append(len(ctx.outputs["produce"]["blob"]))
        if stop:
            raise _Stop
        return _big("xyz")

    wf = Workflow("big", steps=[task("produce", produce), task("consume", consume)])
    with pytest.raises(_Stop):
        await run_workflow(world, wf, {}, run_id="run_big")
    produced = next(
        e for e in _of(_log(world, "run_big"), StepCompleted) if e.step_path == "produce"
    )
    assert produced.output is None
    ref = produced.output_ref
    assert ref is not None
    assert (ref.run_id, ref.step_path, ref.media_type) == ("run_big", "produce", "application/json")
    assert ref.size > OUTPUT_INLINE_LIMIT
    assert orjson.loads(world.artifacts.get(ref).payload) == _big("abc")

    stop = False
    result = await run_workflow(reopen(), wf, run_id="run_big")
    assert ledger.count("produce") == 1
    assert seen == [len(_big("abc")["blob"])] * 2
    assert result.output == _big("xyz")
    completed = _of(_log(world, "run_big"), RunCompleted)[0]
    assert completed.output is None and completed.output_ref is not None
    assert result.state.steps["consume"].output_ref is not None
    # A completed run's large output is read back from its artifact too.
    again = await run_workflow(reopen(), wf, run_id="run_big")
    assert (again.output, again.steps_executed) == (_big("xyz"), 0)


# ----------------------------------------------------------- restart checks


def _stopping_workflow(
    workflow_id: str = "checked", *, extra_step: bool = False, version: str = "1"
) -> tuple[Workflow, dict[str, bool]]:
    """``prepare`` then ``work`` (which stops the run while ``flags['stop']``)."""
    flags = {"stop": True}

    def work(ctx: StepContext) -> str:
        if flags["stop"]:
            raise _Stop
        return "worked"

    steps = [task("prepare", lambda ctx: _big("p")), task("work", work)]
    if extra_step:
        steps.append(task("audit", lambda ctx: "audited"))
    return Workflow(workflow_id, version=version, steps=steps), flags


async def test_a_changed_workflow_is_refused_on_resume(world: World) -> None:
    wf, _ = _stopping_workflow()
    with pytest.raises(_Stop):
        await run_workflow(world, wf, {}, run_id="run_changed")
    before = len(_log(world, "run_changed"))

    changed, _ = _stopping_workflow(extra_step=True)
    assert changed.ir_hash != wf.ir_hash
    with pytest.raises(WorkflowChangedError, match="run_changed") as raised:
        await run_workflow(world, changed, run_id="run_changed")
    assert wf.ir_hash in str(raised.value) and changed.ir_hash in str(raised.value)
    bumped, _ = _stopping_workflow(version="2")
    with pytest.raises(WorkflowChangedError, match="version"):
        await run_workflow(world, bumped, run_id="run_changed")
    other, _ = _stopping_workflow("another")
    with pytest.raises(WorkflowChangedError, match="another"):
        await run_workflow(world, other, run_id="run_changed")
    assert len(_log(world, "run_changed")) == before


def _damage_artifact(world: World, world_spec: WorldSpec, ref: ArtifactRef, how: str) -> None:
    """Replace (``tamper``) or delete (``delete``) an artifact's stored bytes."""
    forged = orjson.dumps({"blob": "forged"})
    if world_spec.backend == "memory":
        store = world.artifacts
        assert isinstance(store, MemoryArtifactStore)
        if how == "tamper":
            store._blobs[ref.sha256] = forged
        else:
            del store._blobs[ref.sha256]
    elif world_spec.backend == "sqlite":
        assert world_spec.data_dir is not None
        path = world_spec.data_dir / "artifacts" / ref.sha256[:2] / ref.sha256
        assert path.exists()
        if how == "tamper":
            path.write_bytes(forged)
        else:
            path.unlink()
    elif world_spec.backend == "mariadb":
        with world_spec.connect_mysql() as conn, conn.cursor() as cur:
            if how == "tamper":
                cur.execute(
                    "UPDATE little_es_artifacts SET data = %s WHERE sha256 = %s AND chunk = 0",
                    (forged, ref.sha256),
                )
            else:
                cur.execute("DELETE FROM little_es_artifacts WHERE sha256 = %s", (ref.sha256,))
            assert cur.rowcount == 1
    else:
        with world_spec.connect_postgres() as conn:
            if how == "tamper":
                conn.execute(
                    "UPDATE little_es_artifacts SET data = %s WHERE sha256 = %s",
                    (forged, ref.sha256),
                )
            else:
                conn.execute("DELETE FROM little_es_artifacts WHERE sha256 = %s", (ref.sha256,))


@pytest.mark.parametrize("how", ["tamper", "delete"])
async def test_a_damaged_artifact_of_a_completed_step_is_refused_on_resume(
    world: World, world_spec: WorldSpec, how: str
) -> None:
    wf, flags = _stopping_workflow()
    with pytest.raises(_Stop):
        await run_workflow(world, wf, {}, run_id="run_damaged")
    ref = next(e for e in _of(_log(world, "run_damaged"), StepCompleted)).output_ref
    assert ref is not None
    _damage_artifact(world, world_spec, ref, how)
    before = len(_log(world, "run_damaged"))

    flags["stop"] = False
    with pytest.raises(ArtifactMismatchError) as raised:
        await run_workflow(world, wf, run_id="run_damaged")
    message = str(raised.value)
    assert "run_damaged" in message and "'prepare'" in message
    assert ("corrupt" if how == "tamper" else "missing") in message
    assert len(_log(world, "run_damaged")) == before


async def test_a_damaged_artifact_is_refused_even_when_the_run_completed(
    world: World, world_spec: WorldSpec
) -> None:
    wf, flags = _stopping_workflow()
    flags["stop"] = False
    await run_workflow(world, wf, {}, run_id="run_damaged_done")
    ref = next(e for e in _of(_log(world, "run_damaged_done"), StepCompleted)).output_ref
    assert ref is not None
    _damage_artifact(world, world_spec, ref, "tamper")
    with pytest.raises(ArtifactMismatchError, match="run_damaged_done"):
        await run_workflow(world, wf, run_id="run_damaged_done")


def _group_workflow(keys: list[str], stop_at: set[str], ledger: _Ledger) -> Workflow:
    """A parallel group over ``keys``; the branches in ``stop_at`` stop the run."""

    async def lint(ctx: StepContext) -> str:
        ledger.record(ctx)
        await asyncio.sleep(0)
        if ctx.branch_key in stop_at:
            raise _Stop
        return f"ok:{ctx.branch_key}"

    def files(ctx: StepContext) -> list[str]:
        return keys

    return Workflow("group", steps=[parallel("check", branches=files, step=task("lint", lint))])


async def test_a_changed_branch_set_is_refused_on_resume(
    world: World, reopen: Callable[[], World], ledger: _Ledger
) -> None:
    stop_at = {"b"}
    wf = _group_workflow(["a", "b", "c"], stop_at, ledger)
    with pytest.raises(_Stop):
        await run_workflow(world, wf, {}, run_id="run_branches")
    state = materialize_run_state(_log(world, "run_branches"), pricer=price_usage_exact)
    assert state.steps["check[b]/lint"].status == "running"
    assert state.steps["check"].status == "running"

    # Same code (same IR hash), but the data the branches function reads changed.
    changed = _group_workflow(["a", "b", "d"], stop_at, ledger)
    assert changed.ir_hash == wf.ir_hash
    before = len(_log(world, "run_branches"))
    with pytest.raises(ParallelReplayMismatchError) as raised:
        await run_workflow(reopen(), changed, run_id="run_branches")
    message = str(raised.value)
    assert "run_branches" in message and "'check'" in message
    assert "new branches ['d']" in message and "missing branches ['c']" in message
    reordered = _group_workflow(["c", "b", "a"], stop_at, ledger)
    with pytest.raises(ParallelReplayMismatchError, match="order"):
        await run_workflow(reopen(), reordered, run_id="run_branches")
    assert len(_log(world, "run_branches")) == before

    stop_at.clear()
    result = await run_workflow(reopen(), wf, run_id="run_branches")
    assert result.output == {"a": "ok:a", "b": "ok:b", "c": "ok:c"}
    # The completed branches did not run again; the in-flight one did.
    assert sorted(ledger.paths) == sorted(
        ["check[a]/lint", "check[b]/lint", "check[c]/lint", "check[b]/lint"]
    )


async def test_a_changed_branch_set_of_a_completed_group_is_refused_on_resume(
    world: World, ledger: _Ledger
) -> None:
    keys = ["a", "b"]
    flags = {"stop": True}

    def after(ctx: StepContext) -> Any:
        if flags["stop"]:
            raise _Stop
        return dict(ctx.outputs["check"])

    def files(ctx: StepContext) -> list[str]:
        return keys

    wf = Workflow(
        "group-done",
        steps=[
            parallel("check", branches=files, step=task("lint", _recording(ledger, "ok"))),
            task("after", after),
        ],
    )
    with pytest.raises(_Stop):
        await run_workflow(world, wf, {}, run_id="run_group_done")
    assert (
        materialize_run_state(_log(world, "run_group_done"), pricer=price_usage_exact)
        .steps["check"]
        .status
        == "completed"
    )
    flags["stop"] = False
    keys.append("c")
    with pytest.raises(ParallelReplayMismatchError, match="new branches"):
        await run_workflow(world, wf, run_id="run_group_done")
    keys.remove("c")
    result = await run_workflow(world, wf, run_id="run_group_done")
    assert result.output == {"a": "ok", "b": "ok"}
    assert sorted(ledger.paths) == ["check[a]/lint", "check[b]/lint"]


async def test_a_different_input_on_resume_is_refused(world: World) -> None:
    wf, flags = _stopping_workflow()
    with pytest.raises(_Stop):
        await run_workflow(world, wf, {"ticket": 1}, run_id="run_input")
    with pytest.raises(RunInputMismatchError, match="run_input"):
        await run_workflow(world, wf, {"ticket": 2}, run_id="run_input")
    flags["stop"] = False
    # The same input, or none, resumes.
    result = await run_workflow(world, wf, {"ticket": 1}, run_id="run_input")
    assert result.resumed and result.state.input == {"ticket": 1}


async def test_resuming_a_completed_run_returns_its_result_and_runs_nothing(
    world: World, reopen: Callable[[], World], ledger: _Ledger
) -> None:
    wf = Workflow(
        "done", steps=[task("a", _recording(ledger, {"n": 1})), task("b", _recording(ledger, [2]))]
    )
    first = await run_workflow(world, wf, {"k": "v"}, run_id="run_done")
    count = len(_log(world, "run_done"))
    again: RunResult = await run_workflow(reopen(), wf, run_id="run_done")
    assert (again.output, again.steps_executed, again.resumed) == ([2], 0, True)
    assert again.state == first.state
    assert ledger.paths == ["a", "b"]
    assert len(_log(world, "run_done")) == count


# ------------------------------------------------------------------ sub-runs


@pytest.mark.parametrize("stop_in", ["child", "parent"])
async def test_a_subworkflow_is_its_own_run_and_is_not_rerun_on_resume(
    world: World, reopen: Callable[[], World], ledger: _Ledger, stop_in: str
) -> None:
    flags = {"stop": True}

    def child_second(ctx: StepContext) -> dict[str, Any]:
        ledger.record(ctx)
        if stop_in == "child" and flags["stop"]:
            raise _Stop
        return {"sum": ctx.outputs["first"] + ctx.input["n"]}

    def parent_last(ctx: StepContext) -> Any:
        ledger.record(ctx)
        if stop_in == "parent" and flags["stop"]:
            raise _Stop
        return ctx.outputs["sub"]

    def child_first(ctx: StepContext) -> int:
        ledger.record(ctx)
        return 10

    child = Workflow("child", steps=[task("first", child_first), task("second", child_second)])
    parent = Workflow(
        "parent",
        steps=[
            task("prepare", _recording(ledger, 5)),
            subworkflow("sub", child, input=lambda ctx: {"n": ctx.outputs["prepare"]}),
            task("last", parent_last),
        ],
    )
    with pytest.raises(_Stop):
        await run_workflow(world, parent, {}, run_id="run_parent")
    sub_id = sub_run_id_for("run_parent", "sub")
    assert sub_id != "run_parent"
    reserved = _of(_log(world, "run_parent"), SubRunReserved)
    assert [(r.step_path, r.sub_run_id, r.workflow_id) for r in reserved] == [
        ("sub", sub_id, "child")
    ]
    child_log = _log(world, sub_id)
    child_started = _of(child_log, RunStarted)[0]
    assert (child_started.parent_run_id, child_started.parent_step_path) == ("run_parent", "sub")
    assert (child_started.workflow_id, child_started.input) == ("child", {"n": 5})
    # The parent's log holds none of the sub-run's events.
    parent_streams = {e.originator_id for e in _log(world, "run_parent")}
    assert parent_streams.isdisjoint({e.originator_id for e in child_log})
    child_events_before = len(child_log)

    flags["stop"] = False
    result = await run_workflow(reopen(), parent, run_id="run_parent")
    assert result.output == {"sum": 15}
    assert result.state.sub_run_ids == (sub_id,)
    assert ledger.count("prepare") == 1
    assert ledger.count("first") == 1
    assert ledger.count("second") == (2 if stop_in == "child" else 1)
    assert ledger.count("last") == (2 if stop_in == "parent" else 1)
    assert len(_of(_log(world, "run_parent"), SubRunReserved)) == 1
    child_state = materialize_run_state(_log(world, sub_id), pricer=price_usage_exact)
    assert (child_state.status, child_state.output) == ("completed", {"sum": 15})
    assert child_state.parent_run_id == "run_parent"
    if stop_in == "parent":
        # The completed sub-run was not touched by the resume.
        assert len(_log(world, sub_id)) == child_events_before


# --------------------------------------------------------------- agent steps


@pytest.mark.backends("memory", "sqlite")
async def test_an_agent_step_runs_a_harness_session_and_is_not_rerun_on_resume(
    world: World, reopen: Callable[[], World]
) -> None:
    model = ScriptedModel([ScriptedReply(content="plan: fix the bug")])
    flags = {"stop": True}

    def after(ctx: StepContext) -> Any:
        if flags["stop"]:
            raise _Stop
        return ctx.outputs["plan"]

    wf = Workflow(
        "agentic",
        steps=[
            agent("plan", model=model, prompt=lambda ctx: f"plan for {ctx.input['ticket']}"),
            task("after", after),
        ],
    )
    with pytest.raises(_Stop):
        await run_workflow(world, wf, {"ticket": "T-1"}, run_id="run_agent")
    assert model.calls == 1
    events = _log(world, "run_agent")
    started = next(e for e in _of(events, StepStarted) if e.step_path == "plan")
    assert started.kind == "agent" and started.session_id is not None
    called = _of(events, ModelCalled)
    assert len(called) == 1 and called[0].originator_id == started.session_id

    flags["stop"] = False
    result = await run_workflow(reopen(), wf, run_id="run_agent")
    assert result.output == "plan: fix the bug"
    assert model.calls == 1


class _UnprintableError(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no words for it")


@pytest.mark.parametrize("kind", ["huge message", "str() raises"])
def test_a_step_failure_is_recorded_whatever_its_exception_prints(world: World, kind: str) -> None:
    """A message is cut to MAX_ERROR_MESSAGE characters (every failed attempt records it, and
    Temporal refuses a failure of a few megabytes); an exception whose str() raises is
    described by its type: either way the failure is the step's, recorded as any other."""
    from little_es.errors import RunFailedError
    from little_es.events import RunFailed, StepFailed
    from little_es.values import MAX_ERROR_MESSAGE

    def fails(ctx: StepContext) -> None:
        if kind == "huge message":
            raise ValueError("x" * 2_500_000)
        raise _UnprintableError

    wf = Workflow("fails_oddly", steps=[task("odd", fails)])
    with pytest.raises(RunFailedError):
        asyncio.run(run_workflow(world, wf, {}, run_id="run_odd_error"))
    log = world.read_run_log("run_odd_error")
    (failed,) = [e for e in log if isinstance(e, StepFailed)]
    assert any(isinstance(e, RunFailed) for e in log)
    if kind == "huge message":
        assert failed.error.type == "ValueError"
        assert failed.error.message.startswith("x" * MAX_ERROR_MESSAGE + "… [2,483,616 more")
    else:
        assert failed.error.type == "_UnprintableError"
        assert failed.error.message == "(_UnprintableError whose str() raised RuntimeError)"

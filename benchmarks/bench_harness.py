"""Harness session benchmark: recording overhead, fast-forward cost, log bytes per turn.

Run from the repository root::

    .venv/bin/python -m benchmarks.bench_harness
    .venv/bin/python -m benchmarks.bench_harness --postgres ""   # SQLite only

What it measures, all in one process and one run:

* **Recording overhead** per model call and per tool call, on SQLite and
  PostgreSQL, under the run's lease as ``run_workflow`` holds it (its check
  before every call and append included; ``--no-lease`` leaves it out): a
  scripted session of ``--turns`` turns, each calling ``k`` tools, through
  :func:`run_agent_session`, against the same loop with no recording (same
  model, same tools, same request building). The extra time per turn is
  ``model + k * tool``; measured at ``k = 1`` and ``k = 5`` it gives both.
  Medians over ``--repeats`` sessions.
* **Fast-forward** per replayed call: ``run_agent_session`` on a completed
  session (every call answered from the log) minus loading the session, per
  replayed model or tool call; and loading the session, per event.
* **Event-log bytes per turn** for a 200-turn session whose conversation
  grows every turn: the stored bytes of each turn's events at turns 10, 50,
  100 and 200, next to the size of the prompt the model is sent at that turn.

PostgreSQL runs in a fresh schema of ``--postgres`` (default
``postgresql://postgres@127.0.0.1:5432/test``), dropped afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import shutil
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import orjson

from benchmarks.figures import Figures, add_json_option, reporting
from little_es import (
    HarnessSession,
    Message,
    ModelRequest,
    ScriptedModel,
    ScriptedReply,
    Tool,
    ToolCall,
    ToolCallStarted,
    ToolContext,
    Usage,
    World,
    configure_logging,
    local_world,
    memory_world,
    postgres_world,
    run_agent_session,
    tool,
)
from little_es.backends.sqlite import Synchronous
from little_es.ids import session_stream_id

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/test"
STEP = "agent"
_HOLD_LEASE = True
"""Whether the recording overhead is measured under a held run lease (``--no-lease``: not)."""
SYSTEM = "You are a benchmark."
PROMPT = "Run the benchmark."


async def _echo(text: str, ctx: ToolContext) -> dict[str, Any]:
    """Echo the text."""
    return {"echo": text, "call": ctx.call_id}


ECHO = tool(_echo, name="echo")


def _model(turns: int, calls_per_turn: int, filler: str = "ok") -> ScriptedModel:
    """``turns`` turns of ``calls_per_turn`` echo calls each, then an answer."""

    def respond(request: ModelRequest) -> ScriptedReply:
        turn = 1 + sum(1 for m in request.messages if m.role == "assistant")
        usage = Usage(input_tokens=100, output_tokens=10)
        if turn > turns:
            return ScriptedReply(content="done", usage=usage)
        calls = tuple(
            ToolCall(id=f"t{turn}c{i}", name="echo", arguments={"text": filler})
            for i in range(calls_per_turn)
        )
        return ScriptedReply(content=f"turn {turn} {filler}", tool_calls=calls, usage=usage)

    return ScriptedModel(respond=respond, provider="bench", model_id="bench-1")


async def _recorded(world: World, run_id: str, model: ScriptedModel, max_turns: int) -> None:
    await run_agent_session(
        world,
        run_id=run_id,
        step_path=STEP,
        attempt=1,
        model=model,
        tools=[ECHO],
        prompt=PROMPT,
        system=SYSTEM,
        max_turns=max_turns,
    )


async def _bare(model: ScriptedModel, tools: list[Tool], max_turns: int) -> None:
    """The same loop as a session, with nothing recorded: the baseline."""
    by_name = {t.name: t for t in tools}
    specs = tuple(t.spec for t in tools)
    conversation = [Message(role="system", content=SYSTEM), Message(role="user", content=PROMPT)]
    for _ in range(max_turns):
        request = ModelRequest.model_construct(
            messages=tuple(conversation), tools=specs, parameters={}
        )
        response = await model.complete(request)
        conversation.append(response.as_message())
        if not response.tool_calls:
            return
        results = await asyncio.gather(
            *(
                by_name[c.name].invoke(
                    dict(c.arguments),
                    ToolContext(run_id="bare", session_id="bare", call_id=c.id, step_path=STEP),
                )
                for c in response.tool_calls
            )
        )
        for call, result in zip(response.tool_calls, results, strict=True):
            content = orjson.dumps(result, option=orjson.OPT_SORT_KEYS).decode()
            conversation.append(
                Message(role="tool", content=content, tool_call_id=call.id, name=call.name)
            )


async def _timed(fn: Callable[[], Awaitable[None]]) -> float:
    # Collect first, so one run does not pay for the garbage of the previous ones.
    gc.collect()
    start = time.perf_counter()
    await fn()
    return time.perf_counter() - start


async def recording_overhead(
    world: World, turns: int, repeats: int
) -> tuple[float, float, float, float]:
    """Median extra seconds per model call, and per tool call, that recording costs.

    Also the medians of one turn with one tool call, recorded and bare (the baseline).
    """
    per_turn: dict[int, list[float]] = {1: [], 5: []}
    recorded_1: list[float] = []
    bare_1: list[float] = []
    for _ in range(repeats):
        for k, overheads in per_turn.items():
            run_id = f"bench_{uuid.uuid4().hex[:12]}"
            # As run_workflow does: the session runs under the run's lease, checked
            # before every model call, tool call and append (taken outside the timing).
            with world.run_lease(run_id) if _HOLD_LEASE else nullcontext():
                rec = await _timed(lambda: _recorded(world, run_id, _model(turns, k), turns + 1))  # noqa: B023
            bare = await _timed(lambda: _bare(_model(turns, k), [ECHO], turns + 1))  # noqa: B023
            overheads.append((rec - bare) / turns)
            if k == 1:
                recorded_1.append(rec / turns)
                bare_1.append(bare / turns)
    # A turn costs model + k * tool: two values of k give both.
    one, five = statistics.median(per_turn[1]), statistics.median(per_turn[5])
    tool_call = (five - one) / 4
    return one - tool_call, tool_call, statistics.median(recorded_1), statistics.median(bare_1)


async def fast_forward(world: World, turns: int, repeats: int) -> tuple[float, float, int, int]:
    """Median seconds per replayed call and to load per event; replayed calls; events.

    Resumes a completed session, so every call is answered from the log; the
    time spent loading the session inside that same resume is measured apart.
    """
    run_id = f"bench_{uuid.uuid4().hex[:12]}"
    await _recorded(world, run_id, _model(turns, 2), turns + 1)
    session_id = session_stream_id(run_id, STEP, 1)
    events = len(world.read_stream(session_id))
    calls = (turns + 1) + 2 * turns
    load_session = world.load_session
    loading = 0.0

    def timed_load(stream_id: uuid.UUID) -> HarnessSession | None:
        nonlocal loading
        start = time.perf_counter()
        try:
            return load_session(stream_id)
        finally:
            loading = time.perf_counter() - start

    world.load_session = timed_load  # type: ignore[method-assign, assignment]
    walks, loads = [], []
    try:
        for _ in range(repeats):
            total = await _timed(lambda: _recorded(world, run_id, _model(turns, 2), turns + 1))
            walks.append((total - loading) / calls)
            loads.append(loading / events)
    finally:
        world.load_session = load_session  # type: ignore[method-assign]
    return statistics.median(walks), statistics.median(loads), calls, events


async def bytes_per_turn(world: World, turns: int) -> dict[int, tuple[int, int]]:
    """Per turn: (stored bytes of the turn's events, bytes of the prompt sent that turn)."""
    run_id = f"bench_{uuid.uuid4().hex[:12]}"
    model = _model(turns, 1, filler="x" * 200)
    await _recorded(world, run_id, model, turns + 1)
    session_id = session_stream_id(run_id, STEP, 1)
    events = world.read_stream(session_id)
    turn_of_call = {e.call_id: e.turn for e in events if isinstance(e, ToolCallStarted)}
    stored: dict[int, int] = {}
    for row, event in zip(world.select_stored(session_id), events, strict=True):
        turn = getattr(event, "turn", None) or turn_of_call.get(getattr(event, "call_id", ""))
        if turn is not None:
            stored[turn] = stored.get(turn, 0) + len(row.state)
    prompts = [
        len(orjson.dumps([m.model_dump(mode="json") for m in r.messages])) for r in model.requests
    ]
    return {t: (stored[t], prompts[t - 1]) for t in stored}


@contextmanager
def _sqlite_world(synchronous: Synchronous = "full") -> Iterator[World]:
    root = Path(tempfile.mkdtemp(prefix="bench_harness_"))
    try:
        with local_world(root, synchronous=synchronous) as world:
            yield world
    finally:
        shutil.rmtree(root, ignore_errors=True)


@contextmanager
def _postgres_world(dsn: str) -> Iterator[World]:
    import psycopg

    schema = f"bench_harness_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    try:
        with postgres_world(dsn, schema=schema) as world:
            yield world
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:9.1f} µs"


async def _backend(
    name: str, world: World, turns: int, repeats: int, figures: Figures, short: str
) -> None:
    # Warm up: imports, prepared statements, tables.
    await _recorded(world, f"bench_warm_{uuid.uuid4().hex[:8]}", _model(3, 1), 4)
    model_call, tool_call, turn, bare = await recording_overhead(world, turns, repeats)
    per_call, per_event, calls, events = await fast_forward(world, turns, repeats)
    print(f"{name}")
    print(f"  recording overhead per model call  {_us(model_call)}")
    print(f"  recording overhead per tool call   {_us(tool_call)}")
    print(f"  fast-forward per replayed call     {_us(per_call)}  over {calls} calls")
    print(f"  loading the session, per event     {_us(per_event)}  over {events} events")
    lease = "under the run's lease" if _HOLD_LEASE else "without a lease"
    figures.add(
        f"{short}: harness recording overhead per model call, {lease}", model_call * 1e6, "µs"
    )
    figures.add(
        f"{short}: harness recording overhead per tool call, {lease}", tool_call * 1e6, "µs"
    )
    figures.add(
        f"{short}: a harness turn with one tool call, recorded, {lease}",
        turn * 1e6,
        "µs",
        baseline=bare * 1e6,
        baseline_what="the same loop with no recording",
    )
    figures.add(f"{short}: fast-forward per replayed call on resume", per_call * 1e6, "µs")


async def _main(args: argparse.Namespace, figures: Figures) -> None:
    print(f"{args.turns} turns per timed session, medians of {args.repeats} sessions")
    t, r = args.turns, args.repeats
    with memory_world() as world:
        await _backend(
            "memory (no I/O: the library's own CPU cost)", world, t, r, figures, "memory"
        )
    with _sqlite_world() as world:
        await _backend("sqlite (local_world, fsync per commit)", world, t, r, figures, "sqlite")
        sizes = await bytes_per_turn(world, 200)
    with _sqlite_world("normal") as world:
        normal = 'sqlite synchronous="normal"'
        await _backend('sqlite, local_world(synchronous="normal")', world, t, r, figures, normal)
    if args.postgres:
        with _postgres_world(args.postgres) as world:
            await _backend("postgres (fresh schema)", world, t, r, figures, "postgres")
    base = sizes[10][0]
    print("event-log bytes per turn, 200 tool-using turns with a growing conversation:")
    for turn in (10, 50, 100, 200):
        stored, prompt = sizes[turn]
        print(
            f"  turn {turn:3}: {stored:6} bytes logged ({(stored - base) / base:+.1%} vs turn 10),"
            f" prompt sent {prompt:7} bytes"
        )
    worst = max(abs(sizes[t][0] - base) / base for t in range(10, 201))
    print(f"  largest deviation from turn 10 over turns 10-200: {worst:.1%}")
    figures.add(
        f"event-log bytes of turn 200 of a 200-turn session, growing conversation"
        f" (its prompt: {sizes[200][1]:,} B; turn 10's: {sizes[10][1]:,} B)",
        sizes[200][0],
        "B",
        baseline=base,
        baseline_what="event-log bytes of turn 10",
    )


def main() -> None:
    """Parse the options and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=30, help="turns per timed session")
    parser.add_argument("--repeats", type=int, default=9, help="sessions per median")
    parser.add_argument(
        "--postgres", default=DEFAULT_DSN, help="PostgreSQL URL ('' to skip PostgreSQL)"
    )
    parser.add_argument(
        "--no-lease",
        action="store_true",
        help="record without holding the run's lease (so without its checks)",
    )
    add_json_option(parser)
    args = parser.parse_args()
    global _HOLD_LEASE
    _HOLD_LEASE = not args.no_lease
    configure_logging(level="WARNING")
    with reporting("bench_harness", args.json) as figures:
        asyncio.run(_main(args, figures))


if __name__ == "__main__":
    main()

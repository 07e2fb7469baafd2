"""How fast ``replay_run`` folds a long log, against the raw cost of reading it.

Builds one run of about 100,000 events in a SQLite world (a few agent steps,
almost all of it harness events: model called/responded, tool call
started/succeeded), then measures, best of ``--repeat``:

* raw: ``SELECT`` of the run's rows (the run stream and its sessions) with
  ``sqlite3`` plus ``orjson.loads`` of every payload, no validation, no fold;
* replay: ``replay_run(world, run_id)``: read the rows, decode and validate
  with pydantic every event the reducer folds (the run stream, each session's
  ``harness.session.started`` and ``harness.model.responded``, and each
  stream's last event), count the others without decoding them, merge the
  streams, fold with the reducer, freeze;
* for comparison, ``World.read_run_log``: every event decoded and validated.

Targets: replay >= 100,000 events/s and replay/raw <= 2.5.

    .venv/bin/python benchmarks/bench_replay.py [--events 100000] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import pstats
import sqlite3
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from uuid import UUID

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.figures import Figures, add_json_option, reporting
from little_es import (
    HarnessSession,
    Message,
    ModelCalled,
    ModelResponded,
    ModelResponse,
    Run,
    RunCompleted,
    RunStarted,
    SessionCompleted,
    SessionStarted,
    StepCompleted,
    StepStarted,
    ToolCall,
    ToolCallStarted,
    ToolCallSucceeded,
    Usage,
    World,
    local_world,
    materialize_run_state,
    replay_run,
)
from little_es.chain import FRAME_SIZE, payload_of, verify_stream
from little_es.codec import PydanticMapper
from little_es.materialize import COUNTED_ONLY
from little_es.pricing import price_usage_exact
from little_es.world import RUN_SNAPSHOT_INTERVAL, merge_by_timestamp

RUN_ID = "run_bench_replay"
_BATCH = 2000


def build(world: World, events: int, steps: int) -> int:
    """Write a run of about ``events`` events in ``steps`` agent steps; return the exact count.

    Session snapshots are switched off while writing: a ``HarnessSession``
    snapshot holds every event of the session, so taking one at every
    interval makes writing a 25,000-event session quadratic; replay reads
    streams from their first event, never from a snapshot.
    """
    # A ClassVar of the application, overridden on this instance only.
    setattr(world.app, "snapshotting_intervals", {Run: RUN_SNAPSHOT_INTERVAL})  # noqa: B010
    run = Run(RUN_ID, price_usage_exact)
    run.trigger(
        RunStarted,
        run_id=RUN_ID,
        workflow_id="bench",
        workflow_version="1",
        ir_hash="sha256:" + "0" * 64,
        input={"task": "benchmark"},
    )
    world.save(run)
    written = 1
    turns_per_step = max(1, (events - 1 - steps * 4) // (steps * 4))
    for s in range(1, steps + 1):
        path = f"agent_{s}"
        session = HarnessSession(RUN_ID, path, 1)
        run.trigger(
            StepStarted,
            step_path=path,
            step_id=path,
            kind="agent",
            visit=1,
            attempt=1,
            session_id=session.id,
        )
        world.save(run)
        session.trigger(
            SessionStarted,
            run_id=RUN_ID,
            step_path=path,
            attempt=1,
            manifest={"model": "gpt-4o", "tools": ["lookup"]},
            manifest_hash="sha256:" + "1" * 64,
        )
        pending = 1
        for turn in range(1, turns_per_step + 1):
            call = ToolCall(id=f"c{turn}", name="lookup", arguments={"query": f"q{turn}"})
            session.trigger(
                ModelCalled,
                turn=turn,
                messages=(Message(role="tool", content=f"result {turn - 1}", tool_call_id="c"),),
                conversation_hash=f"sha256:{turn:064x}",
            )
            session.trigger(
                ModelResponded,
                turn=turn,
                step_path=path,
                response=ModelResponse(
                    tool_calls=(call,),
                    provider="openai",
                    model="gpt-4o",
                    usage=Usage(
                        input_tokens=1200 + turn, output_tokens=80, cached_input_tokens=1024
                    ),
                ),
            )
            session.trigger(
                ToolCallStarted, turn=turn, call_id=call.id, name=call.name, args=call.arguments
            )
            session.trigger(ToolCallSucceeded, call_id=call.id, result={"hits": [turn, turn + 1]})
            pending += 4
            if pending >= _BATCH:
                world.save(session)
                written += pending
                pending = 0
        session.trigger(SessionCompleted, usage=Usage(), turns=turns_per_step, output="done")
        world.save(session)
        written += pending + 1
        run.trigger(StepCompleted, step_path=path, step_id=path, visit=1, attempt=1, output="done")
        world.save(run)
        written += 2
    run.trigger(RunCompleted, output="done")
    world.save(run)
    return written + 1


def stream_ids(world: World) -> list[UUID]:
    """The run stream and its sessions' streams: the rows replay reads."""
    run = world.load_run(RUN_ID)
    return [run.id] + [sid for s in run.fold.steps.values() for sid in s.session_ids]


def raw_read(db: Path, streams: list[UUID]) -> int:
    """SELECT the run's rows and orjson.loads each payload; return how many."""
    conn = sqlite3.connect(db)
    try:
        n = 0
        loads = orjson.loads
        for stream in streams:
            rows = conn.execute(
                "SELECT originator_version, topic, state FROM little_es_rows"
                " WHERE originator_id = ? ORDER BY originator_version",
                (stream.hex,),
            ).fetchall()
            # The floor parses the payload behind each row's chain frame, unverified.
            for _version, _topic, state in rows:
                loads(state[FRAME_SIZE:])
            n += len(rows)
        return n
    finally:
        conn.close()


def best_of(repeat: int, fn: Callable[[], object]) -> tuple[float, float]:
    """The fastest of ``repeat`` calls: (wall seconds, CPU seconds of this process)."""
    wall, cpu = [], []
    for _ in range(repeat):
        w0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - w0)
        cpu.append(time.process_time() - c0)
    return min(wall), min(cpu)


def stages(world: World, streams: list[UUID], repeat: int) -> dict[str, float]:
    """CPU seconds of each stage of replay_run, done one after the other (GC paused)."""
    mapper = world.app.mapper
    assert isinstance(mapper, PydanticMapper)
    counted_only = {cls.wire_name for cls in COUNTED_ONLY}
    best: dict[str, float] = {}

    def clock(name: str, t0: float) -> float:
        now = time.process_time()
        best[name] = min(best.get(name, float("inf")), now - t0)
        return now

    gc.disable()
    try:
        for _ in range(repeat):
            t = time.process_time()
            rows = [world._select(s, None) for s in streams]
            t = clock("select (World._select)", t)
            checked = [
                verify_stream(s, r, world.backend.stream_head(s), legacy=False).rows
                for s, r in zip(streams, rows, strict=True)
            ]
            t = clock("verify hash chain + head", t)
            decoded = [
                [
                    mapper.decode_payload(s, v, topic, payload_of(data))
                    for i, (v, topic, data) in enumerate(stream_rows)
                    if topic not in counted_only or i == len(stream_rows) - 1
                ]
                for s, stream_rows in zip(streams, checked, strict=True)
            ]
            t = clock("decode + validate the folded rows", t)
            log = merge_by_timestamp(decoded)
            t = clock("merge streams", t)
            materialize_run_state(log, pricer=world.pricer)
            clock("fold + freeze (reducer)", t)
            del rows, checked, decoded, log
    finally:
        gc.enable()
    return best


def main() -> None:
    """Build, measure, print."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--profile", action="store_true", help="cProfile one replay_run")
    add_json_option(parser)
    args = parser.parse_args()
    with reporting("bench_replay", args.json) as figures:
        _main(args, figures)


def _main(args: argparse.Namespace, figures: Figures) -> None:
    with tempfile.TemporaryDirectory() as tmp, local_world(tmp) as world:
        t0 = time.perf_counter()
        n = build(world, args.events, args.steps)
        print(f"built {n} events in {time.perf_counter() - t0:.1f}s")
        db = Path(tmp) / "events.sqlite3"
        streams = stream_ids(world)

        result = replay_run(world, RUN_ID)
        assert result.state.event_count == n, (result.state.event_count, n)
        assert raw_read(db, streams) == n

        raw_wall, raw_cpu = best_of(args.repeat, lambda: raw_read(db, streams))
        rep_wall, rep_cpu = best_of(args.repeat, lambda: replay_run(world, RUN_ID))
        full_wall, full_cpu = best_of(args.repeat, lambda: world.read_run_log(RUN_ID))
        folded = sum(1 for e in world.read_run_log(RUN_ID) if type(e) not in COUNTED_ONLY)
        print(f"best of {args.repeat}          wall s    events/s     CPU s    events/s")
        for label, wall, cpu in (
            ("raw SELECT + loads", raw_wall, raw_cpu),
            ("replay_run        ", rep_wall, rep_cpu),
            ("read_run_log      ", full_wall, full_cpu),
        ):
            print(f"{label}  {wall:8.3f}  {n / wall:10,.0f}  {cpu:8.3f}  {n / cpu:10,.0f}")
        print(
            f"ratio replay/raw:   {rep_wall / raw_wall:8.2f}              {rep_cpu / raw_cpu:8.2f}"
            "    (target <= 2.5)"
        )
        print(
            f"replay >= 100,000 events/s: wall {'met' if n / rep_wall >= 100_000 else 'NOT met'},"
            f" CPU {'met' if n / rep_cpu >= 100_000 else 'NOT met'}"
        )
        print(
            f"replay_run decodes and validates the {folded:,} events the reducer folds (and each"
            f" stream's last); the other {n - folded:,} it counts without decoding."
        )
        print(f"read_run_log (every event decoded and validated) / raw: {full_wall / raw_wall:.2f}")
        raw_what = "raw SELECT + orjson.loads of all the run's rows"
        figures.add(
            f"replay_run of a {n:,}-event run (mostly harness events), SQLite: decodes the"
            f" {folded:,} events it folds, counts the rest, verifies every chain",
            n / rep_wall,
            "ev/s",
            baseline=n / raw_wall,
            baseline_what=raw_what,
        )
        figures.add(
            "reading that run's whole log, every event decoded and validated (little events)",
            n / full_wall,
            "ev/s",
            baseline=n / raw_wall,
            baseline_what=raw_what,
        )
        print("where replay's time goes (CPU, best of each stage):")
        timed = stages(world, streams, args.repeat)
        for name, seconds in timed.items():
            print(f"  {name:34s} {seconds:7.3f}s  {seconds / n * 1e6:6.2f} us/event")
        chain = timed.get("verify hash chain + head")
        if chain is not None:
            figures.add(
                "the hash chain on read: replay_run's stage 'verify hash chain + head', per row",
                chain / n * 1e6,
                "µs",
                baseline=sum(timed.values()) / n * 1e6,
                baseline_what="all of replay_run's stages, per row (ratio: the chain's share)",
            )
        scale = "raw SELECT + loads, for scale"
        print(f"  {scale:34s} {raw_cpu:7.3f}s  {raw_cpu / n * 1e6:6.2f} us/event")

        if args.profile:
            profiler = cProfile.Profile()
            profiler.runcall(replay_run, world, RUN_ID)
            pstats.Stats(profiler).sort_stats("tottime").print_stats(20)


if __name__ == "__main__":
    main()

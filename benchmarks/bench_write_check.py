"""What the recorder's write check costs per event (see ``little_es/_strict.py``).

Serialises the realistic harness mix of ``bench_storage.py`` (model calls and
responses of a few hundred bytes, some tool calls) with the mapper
``World.save`` uses, with the check and, in the same run, with the check
replaced by nothing; and builds the events through ``Aggregate.trigger`` (which
looks for unvalidated value objects) with and without that look. Best of
``--repeat`` passes, alternating.

    .venv/bin/python -m benchmarks.bench_write_check [--events 5000] [--repeat 15]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import little_es.codec as codec
import little_es.domain as domain
from benchmarks.bench_storage import add_turn, open_session
from benchmarks.figures import Figures, add_json_option, reporting
from little_es.codec import OrjsonTranscoder, PydanticMapper


def _best(passes: int, timed: Callable[[], float]) -> float:
    return min(timed() for _ in range(passes))


def main() -> None:
    """Print the per-event figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=5000)
    parser.add_argument("--repeat", type=int, default=15)
    add_json_option(parser)
    args = parser.parse_args()
    with reporting("bench_write_check", args.json) as report:
        _main(args, report)


def _main(args: argparse.Namespace, report: Figures) -> None:
    session = open_session("run_bench_write_check", "a")
    turn = 1
    while len(session.pending_events) < args.events:
        add_turn(session, turn)
        turn += 1
    events = session.collect_events()
    mapper = PydanticMapper(transcoder=OrjsonTranscoder())
    checked_store: Any = codec.check_stored_payload
    checked_trigger: Any = domain.refuse_unvalidated

    def store() -> float:
        start = time.perf_counter()
        for event in events:
            mapper.to_stored_event(event)
        return (time.perf_counter() - start) / len(events)

    def build() -> float:
        fresh = open_session("run_bench_write_check_b", "a")
        start = time.perf_counter()
        for t in range(1, turn):
            add_turn(fresh, t)
        return (time.perf_counter() - start) / len(fresh.pending_events)

    figures: dict[str, list[float]] = {k: [] for k in ("store", "store0", "build", "build0")}
    for _ in range(args.repeat):
        codec.check_stored_payload = checked_store
        domain.refuse_unvalidated = checked_trigger
        figures["store"].append(store())
        figures["build"].append(build())
        codec.check_stored_payload = lambda *a: None  # type: ignore[assignment]
        domain.refuse_unvalidated = lambda *a: None  # type: ignore[assignment]
        figures["store0"].append(store())
        figures["build0"].append(build())
    codec.check_stored_payload = checked_store
    domain.refuse_unvalidated = checked_trigger
    best = {k: min(v) * 1e6 for k, v in figures.items()}
    print(f"{len(events)} events of the bench_storage mix, best of {args.repeat} passes")
    print(
        f"  serialise for storage (to_stored_event): {best['store']:.2f} µs with the check,"
        f" {best['store0']:.2f} µs without: +{best['store'] - best['store0']:.2f} µs"
    )
    print(
        f"  build through trigger:                   {best['build']:.2f} µs with the look,"
        f" {best['build0']:.2f} µs without: +{best['build'] - best['build0']:.2f} µs"
    )
    report.add(
        "the recorder's write check: to_stored_event per event of the harness mix, with it",
        best["store"],
        "µs",
        baseline=best["store0"],
        baseline_what="the same mapper with the check replaced by nothing",
    )
    report.add(
        "the look for unvalidated objects: building an event through trigger, with it",
        best["build"],
        "µs",
        baseline=best["build0"],
        baseline_what="the same without the look",
    )


if __name__ == "__main__":
    main()

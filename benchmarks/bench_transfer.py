"""What moving a world costs per event (``little export`` / ``little import``, see
``little_es/transfer.py``).

Writes ``--runs`` agent runs (``little_es.testing.logs``) into a SQLite world, then,
best of ``--repeat`` passes: exports it to memory, beside a plain read of the same
log (every notification, as the export's own passes read it); and imports the export
into a fresh SQLite world, beside appending the same rows to a fresh world in one
``insert_events`` with no checks at all (what the import adds is its checks).

    .venv/bin/python -m benchmarks.bench_transfer [--runs 20] [--repeat 3]
"""

from __future__ import annotations

import argparse
import io
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from eventsourcing.persistence import StoredEvent

from benchmarks.figures import Figures, add_json_option, reporting
from little_es.testing.logs import write_agent_run
from little_es.transfer import export_world, import_world
from little_es.world import local_world


def main() -> None:
    """Print the per-event figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=3)
    add_json_option(parser)
    args = parser.parse_args()
    with reporting("bench_transfer", args.json) as report:
        _main(args, report)


def _main(args: argparse.Namespace, report: Figures) -> None:
    root = Path(tempfile.mkdtemp(prefix="bench-transfer-"))
    with local_world(root / "source", synchronous="normal") as world:
        for i in range(args.runs):
            write_agent_run(world, f"run_{i}", steps=10, calls_per_step=20)
        last = world.app.recorder.max_notification_id()
        rows = [
            StoredEvent(n.originator_id, n.originator_version, n.topic, n.state)
            for n in world.app.recorder.select_notifications(start=None, limit=last)
        ]
        exports, reads, imports, inserts = [], [], [], []
        data = b""
        for _ in range(args.repeat):
            start = time.perf_counter()
            world.app.recorder.select_notifications(start=None, limit=last)
            reads.append(time.perf_counter() - start)
            out = io.BytesIO()
            start = time.perf_counter()
            counts = export_world(world, out)
            exports.append(time.perf_counter() - start)
            data = out.getvalue()
    for i in range(args.repeat):
        with local_world(root / f"import-{i}") as target:
            start = time.perf_counter()
            import_world(target, io.BytesIO(data))
            imports.append(time.perf_counter() - start)
        with local_world(root / f"insert-{i}") as target:
            start = time.perf_counter()
            target.app.recorder.insert_events(rows, durable=True, heads={})
            inserts.append(time.perf_counter() - start)
    n = counts.events
    per = {k: min(v) / n * 1e6 for k, v in (("e", exports), ("r", reads), ("i", imports))}
    per["n"] = min(inserts) / n * 1e6
    print(
        f"{n} events in {counts.streams} streams ({len(data) / 1e6:.1f} MB of JSONL),"
        f" best of {args.repeat}"
    )
    print(f"  export: {per['e']:.1f} µs/event; a plain read of the log: {per['r']:.1f} µs")
    print(f"  import: {per['i']:.1f} µs/event; the same rows inserted unchecked: {per['n']:.1f} µs")
    report.add(
        "little export of a SQLite world of agent runs, per event",
        per["e"],
        "µs",
        baseline=per["r"],
        baseline_what="one read of the same log (select_notifications)",
    )
    report.add(
        "little import into a new SQLite world (every check, one transaction), per event",
        per["i"],
        "µs",
        baseline=per["n"],
        baseline_what="the same rows appended in one insert_events, unchecked",
    )


if __name__ == "__main__":
    main()

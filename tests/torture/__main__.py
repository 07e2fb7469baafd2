"""``python -m tests.torture --kills 1000 --world URL [--seed S]``: the long torture run.

Prints one summary line (runs, of them outer loops and forks, signals by how they were
sent, kills, resumes, re-executed in-flight items, violations, seconds) and every
violation below it; exits 1 if there is any.
"""

from __future__ import annotations

import argparse
import os
import sys

from tests.torture.driver import Engine, ForkServerEngine, SubprocessEngine, torture


def main(argv: list[str] | None = None) -> int:
    """Run the torture and print its summary."""
    parser = argparse.ArgumentParser(prog="python -m tests.torture")
    parser.add_argument("--kills", type=int, default=1000)
    parser.add_argument(
        "--world",
        default=os.environ.get("LITTLE_ES_WORLD"),
        help="sqlite:///DIR or postgresql://...?schema=NAME (default: $LITTLE_ES_WORLD)",
    )
    parser.add_argument("--seed", type=int, default=16)
    parser.add_argument(
        "--no-enumerate",
        action="store_true",
        help="only seeded random kills, not one run per append boundary first",
    )
    parser.add_argument(
        "--engine",
        choices=("fork", "subprocess", "temporal"),
        default="fork",
        help="fork each process from a fork server (default), start a fresh interpreter, or"
        " run each process as a Temporal worker driving the run (one dev server for all)",
    )
    parser.add_argument("--verbose", "-v", action="store_true", help="one line per run")
    args = parser.parse_args(argv)
    if not args.world:
        parser.error("give --world URL (or set LITTLE_ES_WORLD)")
    engine: Engine
    if args.engine == "temporal":
        # Imported here: the local engines do not need temporalio.
        from tests.torture.temporal_engine import TemporalEngine

        engine = TemporalEngine()
    else:
        engine = ForkServerEngine() if args.engine == "fork" else SubprocessEngine()
    try:
        summary = torture(
            args.world,
            kills=args.kills,
            seed=args.seed,
            boundaries=0 if args.no_enumerate else None,
            engine=engine,
            log=args.verbose,
        )
    finally:
        # torture() closes it too, but not when its reference run fails: no dev server left.
        engine.close()
    print(summary.line(args.world))
    for v in summary.violations:
        print(f"violation: {v}")
    return 1 if summary.violations else 0


if __name__ == "__main__":
    sys.exit(main())

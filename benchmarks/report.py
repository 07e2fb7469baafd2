"""Run every benchmark and the torture suite, and write one markdown table of what they measured.

Run from the repository root::

    .venv/bin/python -m benchmarks.report --quick --out report.md   # a few minutes
    .venv/bin/python -m benchmarks.report                           # the benchmarks' own sizes

Every ``benchmarks/bench_*.py`` runs in a subprocess of its own, one after the other
(so none measures beside another), with ``--json`` (see :mod:`benchmarks.figures`);
``--quick`` passes each the smaller sizes of :data:`QUICK`. Then a short
``python -m tests.torture`` (``--kills``, on a fresh SQLite world) gives its summary
line. The table has one row per figure: what it is, its value, the baseline measured
in the same run, their ratio (the figure's cost over the baseline's) and the command
that measured it. A benchmark that fails is run once more; one that fails twice is
named under the table, and the exit code is 1 (as it is when the torture run finds a
violation).
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.figures import Figure, Figures, parse  # noqa: E402

QUICK: dict[str, list[str]] = {
    "bench_concurrency": ["--steps", "25"],
    "bench_harness": ["--turns", "10", "--repeats", "3"],
    "bench_memory": ["--sizes", "1000", "--repeat", "1"],
    "bench_leases": ["--checks", "500", "--repeats", "5"],
    "bench_operate": ["--checks", "500", "--repeats", "3", "--sub-runs", "20"],
    "bench_orchestrator": ["--sizes", "50,200", "--repeat", "2"],
    "bench_peer": ["--quick"],
    "bench_pg_layout": ["--steps", "5000"],
    "bench_replay": ["--events", "20000", "--repeat", "3"],
    "bench_runtime": ["--steps", "300", "--repeat", "2"],
    "bench_snapshots": ["--events", "5000", "--loads", "3"],
    "bench_storage": ["--events", "20000", "--single", "100", "--repeat", "2"],
    "bench_temporal": ["--steps", "10", "--repeat", "3"],
    "bench_transfer": ["--runs", "3", "--repeat", "2"],
    "bench_wal": ["--commits", "200", "--repeat", "2"],
    "bench_write_check": ["--events", "2000", "--repeat", "5"],
}
"""Each benchmark's smaller sizes for ``--quick`` (a benchmark not named runs as it is)."""

BENCH_TIMEOUT_S = 3600.0
HEADER = "| what | value | baseline, measured in the same run | ratio | command |"


@dataclass(frozen=True)
class Result:
    """One benchmark's figures and the command that measured them (or why it failed).

    ``error`` with figures: the first run failed so, and these are from the second.
    """

    name: str
    command: list[str]
    figures: Figures | None
    error: str = ""


def run_twice_if_failed(name: str, args: Sequence[str]) -> Result:
    """:func:`run_benchmark`, and once more if it fails (a server that starts slowly)."""
    first = run_benchmark(name, args)
    if first.figures is not None:
        return first
    second = run_benchmark(name, args)
    if second.figures is None:
        return second
    return Result(name, second.command, second.figures, first.error)


def benchmarks() -> list[str]:
    """Every benchmark in ``benchmarks/``, by module name."""
    return sorted(p.stem for p in (REPO / "benchmarks").glob("bench_*.py"))


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LITTLE_ES_CRASH_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


def run_benchmark(name: str, args: Sequence[str], *, log: bool = True) -> Result:
    """Run one benchmark with ``--json``; its figures (its own text goes to our stderr)."""
    command = [sys.executable, "-m", f"benchmarks.{name}", *args]
    started = time.monotonic()
    if log:
        print(f"running {_shown(command)}", file=sys.stderr, flush=True)
    try:
        done = subprocess.run(
            [*command, "--json"],
            cwd=REPO,
            env=_env(),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=BENCH_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return Result(name, command, None, f"did not end within {BENCH_TIMEOUT_S:.0f} s")
    if log:
        sys.stderr.write(done.stderr)
        print(f"  {name}: {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
    if done.returncode != 0:
        said = done.stderr.strip().splitlines()[-1:] or ["no output"]
        return Result(name, command, None, f"exit code {done.returncode}: {said[0]}")
    try:
        return Result(name, command, parse(done.stdout))
    except ValueError as exc:
        return Result(name, command, None, str(exc))


def run_torture(kills: int, seed: int) -> tuple[str, list[str]]:
    """A short ``python -m tests.torture`` on a fresh SQLite world: its summary line."""
    with tempfile.TemporaryDirectory(prefix="little-es-report-") as tmp:
        world = f"sqlite:///{tmp}/world"
        command = [sys.executable, "-m", "tests.torture", "--kills", str(kills)]
        command += ["--seed", str(seed), "--world", world]
        print(f"running {_shown(command)}", file=sys.stderr, flush=True)
        done = subprocess.run(
            command, cwd=REPO, env=_env(), capture_output=True, text=True, check=False
        )
        lines = done.stdout.strip().splitlines()
        line = next((x for x in lines if x.startswith("torture ")), "")
        if not line:
            line = f"torture failed (exit code {done.returncode}): {done.stderr.strip()[-500:]}"
        # The temporary directory means nothing to a reader.
        return line.replace(world, "sqlite:///$TMP/world"), [*command[:-1], _TORTURE_WORLD]


# ------------------------------------------------------------------ the table


def format_value(value: float, unit: str) -> str:
    """A value with its unit, to three significant digits (whole numbers in full)."""
    return f"{_number(value)} {unit}"


def _number(value: float) -> str:
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


_TORTURE_WORLD = "sqlite:///$(mktemp -d)/world"
"""The torture run's world as the table shows it: a new temporary directory, which the
reader's shell makes."""


def _shown(command: Sequence[str]) -> str:
    """The command as a reader types it: ``python``, not this interpreter's path."""
    shown = shlex.join(["python", *command[1:]])
    # In double quotes, not shlex's single ones: the shell must run the mktemp.
    return shown.replace(shlex.quote(_TORTURE_WORLD), f'"{_TORTURE_WORLD}"')


def _ratio(ratio: float) -> str:
    return f"{ratio:,.0f}" if ratio >= 100 else f"{ratio:.2f}"


def row(figure: Figure, command: Sequence[str]) -> str:
    """One table row."""
    baseline = ""
    if figure.baseline is not None:
        baseline = format_value(figure.baseline, figure.unit)
        if figure.baseline_what:
            baseline += f": {figure.baseline_what}"
    ratio = "" if figure.ratio is None else f"\N{MULTIPLICATION SIGN}{_ratio(figure.ratio)}"
    cells = [figure.figure, format_value(figure.value, figure.unit), baseline, ratio]
    return "| " + " | ".join(_cell(c) for c in cells) + f" | `{_shown(command)}` |"


def assemble(results: Sequence[Result], torture: tuple[str, Sequence[str]] | None = None) -> str:
    """The markdown: the table, the benchmarks that failed, the torture summary line."""
    lines = [HEADER, "|---|---|---|---|---|"]
    for result in results:
        if result.figures is not None:
            lines.extend(row(f, result.command) for f in result.figures.figures)
    failed = [r for r in results if r.figures is None]
    retried = [r for r in results if r.figures is not None and r.error]
    if failed or retried:
        lines.append("")
        lines.extend(f"* {r.name} failed ({_shown(r.command)}): {r.error}" for r in failed)
        lines.extend(
            f"* {r.name} failed once ({r.error}); its figures are from a second run"
            for r in retried
        )
    if torture is not None:
        line, command = torture
        lines += ["", f"The torture suite (`{_shown(command)}`):", "", "```", line, "```"]
    return "\n".join(lines) + "\n"


def machine() -> str:
    """What the figures were measured on, in one line."""
    return (
        f"{time.strftime('%Y-%m-%d', time.gmtime())}, {os.cpu_count()} cores,"
        f" Python {platform.python_version()}, SQLite {sqlite3.sqlite_version}"
    )


def main(argv: list[str] | None = None) -> int:
    """Run the benchmarks and the torture suite, write the table."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes: a few minutes")
    parser.add_argument("--out", type=Path, help="write the markdown here (default: stdout)")
    parser.add_argument("--kills", type=int, default=20, help="kills of the torture run")
    parser.add_argument("--seed", type=int, default=16, help="the torture run's seed")
    parser.add_argument(
        "--only", default="", help="comma-separated benchmark names (default: all of them)"
    )
    args = parser.parse_args(argv)
    names = benchmarks()
    if args.only:
        wanted = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = sorted(set(wanted) - set(names))
        if unknown:
            parser.error(f"no such benchmark: {unknown}; there are {names}")
        names = wanted
    started = time.monotonic()
    results = [run_twice_if_failed(n, QUICK.get(n, []) if args.quick else []) for n in names]
    torture = run_torture(args.kills, args.seed) if args.kills > 0 else None
    text = f"Measured {machine()}.\n\n" + assemble(results, torture)
    if args.out is not None:
        args.out.write_text(text)
    else:
        sys.stdout.write(text)
    print(f"report: {time.monotonic() - started:.0f} s", file=sys.stderr)
    failed = any(r.figures is None for r in results)
    return 1 if failed or (torture is not None and " violations=0 " not in torture[0]) else 0


if __name__ == "__main__":
    raise SystemExit(main())

"""A benchmark's figures in machine-readable form: what ``--json`` prints, ``report.py`` reads.

Every ``bench_*.py`` takes ``--json``: it measures exactly what it measures without it,
its usual text goes to stderr, and stdout gets one line ``BENCH_FIGURES {...}``::

    {"benchmark": "bench_storage", "figures": [
        {"figure": "sqlite: read back a 100,000-event stream ...", "value": 119938.0,
         "unit": "ev/s", "baseline": 245640.0, "baseline_what": "raw SELECT + orjson.loads",
         "ratio": 2.05}, ...]}

``baseline`` is measured in the same run (None where a figure has none), and
``ratio`` is the figure's cost over the baseline's: 1.0 is as fast as the baseline,
2.0 twice its cost (for a time, value / baseline; for a rate, baseline / value).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field

import orjson

PREFIX = "BENCH_FIGURES "
"""What starts the one stdout line of ``--json``."""


def is_rate(unit: str) -> bool:
    """Whether a larger value is better (``ev/s``, ``steps/s``...)."""
    return unit.endswith("/s")


def cost_ratio(value: float, baseline: float, unit: str) -> float | None:
    """The figure's cost over the baseline's (see the module docstring)."""
    if value <= 0 or baseline <= 0:
        return None
    return baseline / value if is_rate(unit) else value / baseline


@dataclass(frozen=True)
class Figure:
    """One measured figure, with its baseline from the same run."""

    figure: str
    value: float
    unit: str
    baseline: float | None = None
    baseline_what: str = ""
    ratio: float | None = None


@dataclass
class Figures:
    """The figures of one benchmark run."""

    benchmark: str
    figures: list[Figure] = field(default_factory=list)

    def add(
        self,
        figure: str,
        value: float,
        unit: str,
        *,
        baseline: float | None = None,
        baseline_what: str = "",
        ratio: float | None = None,
    ) -> None:
        """Add one figure; ``ratio`` defaults to :func:`cost_ratio` of value and baseline."""
        if ratio is None and baseline is not None:
            ratio = cost_ratio(value, baseline, unit)
        self.figures.append(Figure(figure, value, unit, baseline, baseline_what, ratio))

    def line(self) -> str:
        """The ``--json`` line."""
        body = {"benchmark": self.benchmark, "figures": [asdict(f) for f in self.figures]}
        return PREFIX + orjson.dumps(body).decode()


def add_json_option(parser: argparse.ArgumentParser) -> None:
    """The ``--json`` option every benchmark takes."""
    parser.add_argument(
        "--json",
        action="store_true",
        help="print the figures as one JSON line on stdout (the usual text goes to stderr)",
    )


@contextlib.contextmanager
def reporting(benchmark: str, as_json: bool) -> Iterator[Figures]:
    """Collect a benchmark's figures; with ``as_json``, print them as the one stdout line.

    While it runs, the benchmark's own prints go to stderr, so stdout holds the line alone.
    """
    figures = Figures(benchmark)
    if not as_json:
        yield figures
        return
    stdout = sys.stdout
    with contextlib.redirect_stdout(sys.stderr):
        yield figures
    stdout.write(figures.line() + "\n")
    stdout.flush()


def parse(output: str) -> Figures:
    """The figures in a benchmark's ``--json`` stdout."""
    for line in reversed(output.splitlines()):
        if line.startswith(PREFIX):
            body = orjson.loads(line[len(PREFIX) :])
            return Figures(body["benchmark"], [Figure(**f) for f in body["figures"]])
    raise ValueError(f"no {PREFIX.strip()} line in the output: {output[-2000:]!r}")

"""``benchmarks/report.py`` assembles its table from a real benchmark's ``--json`` output.

The benchmark runs for real (``bench_write_check`` at a tiny size, in a subprocess, as
the report runs every benchmark), so a change to a benchmark's output, to
``benchmarks/figures.py`` or to the table breaks here, not on the day the README's
performance table is regenerated.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.figures import Figure, Figures, cost_ratio
from benchmarks.report import (
    _TORTURE_WORLD,
    HEADER,
    QUICK,
    Result,
    assemble,
    benchmarks,
    run_benchmark,
)

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parents[1]


def test_the_table_is_assembled_from_a_real_benchmark_run() -> None:
    result = run_benchmark("bench_write_check", ["--events", "50", "--repeat", "1"], log=False)
    assert result.figures is not None, result.error
    figures = result.figures.figures
    assert [f.unit for f in figures] == ["µs", "µs"]
    assert all(f.value > 0 and f.baseline is not None and f.baseline > 0 for f in figures)
    assert all(f.ratio == pytest.approx(f.value / f.baseline) for f in figures if f.baseline)

    failed = Result("bench_x", ["python", "-m", "benchmarks.bench_x"], None, "exit code 1: boom")
    torture = ("torture engine=local-fork runs=1 violations=0", ["python", "-m", "tests.torture"])
    table = assemble([result, failed], torture).splitlines()
    assert table[0] == HEADER
    rows = [line for line in table[2:] if line.startswith("| ")]
    assert len(rows) == len(figures)
    first = rows[0].split(" | ")
    assert first[0] == f"| {figures[0].figure}"
    assert first[1].endswith(" µs") and first[2].endswith(figures[0].baseline_what)
    assert first[3] == f"\N{MULTIPLICATION SIGN}{figures[0].ratio:.2f}"
    assert first[4] == "`python -m benchmarks.bench_write_check --events 50 --repeat 1` |"
    assert "* bench_x failed (python -m benchmarks.bench_x): exit code 1: boom" in table
    assert table[-2:] == ["torture engine=local-fork runs=1 violations=0", "```"]


def test_a_rate_ratio_is_the_baseline_over_the_figure() -> None:
    """A ratio is always the figure's cost over the baseline's: rates invert."""
    assert cost_ratio(50.0, 100.0, "ev/s") == 2.0
    assert cost_ratio(2.0, 1.0, "ms") == 2.0
    figures = Figures("b")
    figures.add("slow reader", 100.0, "steps/s", baseline=400.0, baseline_what="floor")
    assert figures.figures == [Figure("slow reader", 100.0, "steps/s", 400.0, "floor", 4.0)]


def test_every_benchmark_reports_json_and_has_a_quick_size() -> None:
    """``report.py`` runs every ``bench_*.py`` with ``--json`` (and ``--quick`` sizes)."""
    names = benchmarks()
    assert "bench_concurrency" in names and "bench_storage" in names
    for name in names:
        source = (REPO / "benchmarks" / f"{name}.py").read_text()
        assert "add_json_option(parser)" in source and "reporting(" in source, name
    assert sorted(QUICK) == names


def test_the_torture_command_shown_makes_its_own_directory() -> None:
    # A reader pastes it into a shell: the world's directory must come from mktemp, not
    # be a literal "$TMP" directory made where they stand.
    line, command = "torture violations=0", ["python", "-m", "tests.torture", "--world"]
    table = assemble([], (line, [*command, _TORTURE_WORLD]))
    assert '--world "sqlite:///$(mktemp -d)/world"`' in table

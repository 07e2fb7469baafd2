"""What ``little`` prints, read as a new user reads it: paths, headers, widths, progress."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from little_es.cli import app
from little_es.verify import verify_world
from little_es.world import local_world

_FLOW = """
from pathlib import Path
from little_es import Workflow, parallel, task

LEDGER = Path(__file__).with_name("ledger.txt")

def _note(ctx):
    with LEDGER.open("a") as f:
        f.write(ctx.step_path + "\\n")
    return {"path": ctx.step_path}

wf = Workflow("checks", steps=[
    task("fetch", lambda ctx: {"files": ["a.py", "b.py"]}),
    parallel("check", branches=lambda ctx: ctx.outputs["fetch"]["files"], step=task("lint", _note)),
])
"""

LONG_RUN_ID = "run_nightly_checks_of_the_monorepo_2026_12_04_0600"


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "checks_flow.py").write_text(textwrap.dedent(_FLOW))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    # Each test imports its own copy, whose ledger is in its own directory.
    monkeypatch.delitem(sys.modules, "checks_flow", raising=False)
    return tmp_path


def _invoke(*args: str, columns: int = 110) -> str:
    result = CliRunner().invoke(app, list(args), env={"COLUMNS": str(columns)})
    assert result.exit_code == 0, result.output
    return result.output


def _table_rows(output: str) -> dict[str, list[str]]:
    """The live table's body rows: step path -> the other cells."""
    rows: dict[str, list[str]] = {}
    for line in output.splitlines():
        line = line.strip()
        cells = [c.strip() for c in line[1:-1].split("│")]
        if line.startswith("│") and len(cells) == 3:
            rows[cells[0]] = cells[1:]
    return rows


def test_run_shows_each_branch_under_its_key_and_every_column_has_a_header(
    project: Path,
) -> None:
    url = f"sqlite:///{project / 'world'}"
    output = _invoke("run", "checks_flow:wf", "--run-id", "run_1", "--world", url)
    rows = _table_rows(output)
    assert rows["check[a.py]/lint"] == ["completed", ""]
    assert rows["check[b.py]/lint"] == ["completed", ""]
    assert "check/lint" not in rows
    header = next(line for line in output.splitlines() if "step" in line and "status" in line)
    assert [c.strip() for c in header.strip()[1:-1].split("┃")] == ["step", "status", "note"]
    # The live table ends on its own line: the summary does not run into its border.
    assert any(line.startswith("run run_1 completed") for line in output.splitlines())


def test_resume_of_a_completed_run_shows_what_is_recorded_and_runs_nothing(
    project: Path,
) -> None:
    url = f"sqlite:///{project / 'world'}"
    _invoke("run", "checks_flow:wf", "--run-id", "run_1", "--world", url)
    before = (project / "ledger.txt").read_text()

    output = _invoke("resume", "run_1", "--workflow", "checks_flow:wf", "--world", url)
    assert (project / "ledger.txt").read_text() == before
    assert _table_rows(output) == {
        "fetch": ["completed", "recorded"],
        "check": ["completed", "recorded"],
        "check[a.py]/lint": ["completed", "recorded"],
        "check[b.py]/lint": ["completed", "recorded"],
    }


@pytest.mark.parametrize("columns", [110, 80, 40])
def test_runs_never_wraps_or_cuts_a_run_id(project: Path, columns: int) -> None:
    url = f"sqlite:///{project / 'world'}"
    _invoke("run", "checks_flow:wf", "--run-id", LONG_RUN_ID, "--world", url)
    _invoke("run", "checks_flow:wf", "--run-id", "run_2", "--world", url)

    output = _invoke("runs", "--world", url, columns=columns)
    lines = output.splitlines()
    assert sum(LONG_RUN_ID in line for line in lines) == 1, output
    assert sum(" run_2 " in line for line in lines) == 1, output
    assert "…" not in next(line for line in lines if LONG_RUN_ID in line)
    if columns == 110:
        # What gives way first is whole columns, and the status stays.
        assert "completed" in next(line for line in lines if LONG_RUN_ID in line)
        assert all(len(line) <= columns for line in lines)


def test_runs_shows_how_long_each_run_took(project: Path) -> None:
    url = f"sqlite:///{project / 'world'}"
    _invoke("run", "checks_flow:wf", "--run-id", "run_1", "--world", url)
    output = _invoke("runs", "--world", url, columns=200)
    header = next(line for line in output.splitlines() if " run " in f" {line} ")
    assert header.split() == [
        "run", "workflow", "status", "steps", "started", "took", "tokens", "in/out", "cost", "(USD)"
    ]  # fmt: skip
    row = next(line for line in output.splitlines() if "run_1" in line)
    assert row.split()[7].endswith("s"), row


def test_verify_reports_progress_over_every_stream(project: Path) -> None:
    url = f"sqlite:///{project / 'world'}"
    _invoke("run", "checks_flow:wf", "--run-id", "run_1", "--world", url)
    _invoke("run", "checks_flow:wf", "--run-id", "run_2", "--world", url)
    seen: list[tuple[int, int]] = []
    world = local_world(project / "world")
    try:
        report = verify_world(world, progress=lambda done, total: seen.append((done, total)))
    finally:
        world.close()
    total = len(report.streams)
    assert total >= 2
    assert seen == [(done, total) for done in range(1, total + 1)]


def test_verify_progress_must_be_callable(project: Path) -> None:
    world = local_world(project / "world")
    try:
        with pytest.raises(TypeError, match="progress must be a callable"):
            verify_world(world, progress=3)  # type: ignore[arg-type]
    finally:
        world.close()


def test_verify_all_keeps_stdout_for_the_report(project: Path) -> None:
    url = f"sqlite:///{project / 'world'}"
    _invoke("run", "checks_flow:wf", "--run-id", "run_1", "--world", url)
    result = CliRunner().invoke(app, ["verify", "--all", "--world", url])
    assert result.exit_code == 0, result.output
    assert "verifying streams" not in result.stdout
    assert result.stdout.rstrip().splitlines()[-1].startswith("ok")


def test_text_from_the_log_cannot_drive_the_terminal_nor_is_markup() -> None:
    """A cancel reason, a planner's reason, a model's question: text a log holds may carry
    escape sequences (clear the screen, retitle the window) or bidi overrides; shown as
    ``\\u001b``, as ``little replay`` shows them. And a diff of two workflows' runs shows the
    second one in bold, not the markup that says so."""
    import asyncio

    from rich.console import Console

    from little_es import Workflow, cancel_run, memory_world, run_workflow, task, wait_for
    from little_es.diff import diff_runs
    from little_es.errors import RunWaitingError
    from little_es.render import escape, render_diff, render_report
    from tests.test_waits import Decision

    assert escape("a\x1b[2J\u202e [bold]b[/]\tc\nd") == "a\\u001b[2J\\u202e \\[bold]b\\[/]\tc\nd"
    world = memory_world()
    waits = Workflow("waits", steps=[wait_for("approve", model=Decision)])
    with pytest.raises(RunWaitingError):
        asyncio.run(run_workflow(world, waits, {}, run_id="run_cancelled"))
    cancel_run(world, "run_cancelled", reason="note \x1b[2J\x1b]0;TITLE\x07 done")
    asyncio.run(run_workflow(world, Workflow("other", steps=[task("a", lambda c: 1)]), run_id="r2"))
    console = Console(record=True, width=200, force_terminal=True)
    render_report(world, "run_cancelled", console)
    render_diff(diff_runs(world, "run_cancelled", "r2"), console)
    shown = console.export_text(styles=False)
    assert "\x1b" not in shown and "\x07" not in shown
    assert "note \\u001b[2J\\u001b]0;TITLE\\u0007 done" in shown
    # A cancelled run takes no signal: its report gives no command that would be refused.
    assert "little signal" not in shown
    assert "[bold]" not in shown and "waits → other" in shown


def test_an_error_line_that_quotes_a_log_sends_no_escape_sequence() -> None:
    # A message may quote a log's text (a cancel reason, a topic): printed as \u001b.
    from little_es.cli import _one_line

    assert _one_line(RuntimeError("stop \x1b[2J\n  now")) == "stop \\u001b[2J now"

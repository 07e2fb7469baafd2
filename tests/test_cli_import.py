"""``little --import MODULE``: a world holding a user's own event reads from the command line.

Every ``little`` here is a process of its own, started in a project directory
that holds the module defining the event class: the test process must not
have the class registered, or the commands would read the log without it.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

_EVENTS = textwrap.dedent(
    """
    from typing import ClassVar
    from little_es import RunEvent

    class ImportedApproval(RunEvent):
        wire_name: ClassVar[str] = "ImportedApproval"
        approver: str
    """
)

_MAKE_WORLD = textwrap.dedent(
    """
    import asyncio
    from little_es import Workflow, open_world, run_workflow, task
    from approvals import ImportedApproval

    wf = Workflow("wf", version="1", steps=[task("hello", lambda ctx: {"ok": 1})])
    world = open_world("sqlite:///data")
    asyncio.run(run_workflow(world, wf, {}, run_id="run_imp"))
    world.record_run_event("run_imp", ImportedApproval, approver="ops")
    world.close()
    """
)


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("project")
    (root / "approvals.py").write_text(_EVENTS)
    (root / "make_world.py").write_text(_MAKE_WORLD)
    subprocess.run([sys.executable, "make_world.py"], cwd=root, check=True, timeout=60)
    return root


def _little(
    cwd: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "little_es.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "300", **(env or {})},
    )


def test_a_command_says_to_import_the_class_and_reads_the_log_once_it_is(project: Path) -> None:
    without = _little(project, "events", "run_imp", "--world", "sqlite:///data")
    assert without.returncode == 1
    assert "'ImportedApproval'" in without.stderr
    assert "little --import MODULE" in without.stderr

    flag = _little(
        project, "--import", "approvals", "events", "run_imp", "--world", "sqlite:///data"
    )
    assert flag.returncode == 0, flag.stderr
    assert "ImportedApproval" in flag.stdout

    env = _little(
        project, "runs", "--world", "sqlite:///data", env={"LITTLE_ES_IMPORT": "approvals"}
    )
    assert env.returncode == 0, env.stderr
    assert "run_imp" in env.stdout and "completed" in env.stdout


def test_verify_without_the_class_checks_the_chain_and_calls_nothing_broken(
    project: Path,
) -> None:
    unread = _little(project, "verify", "run_imp", "--world", "sqlite:///data")
    # Not fully checked, so not a pass; but not a tamper alarm either.
    assert unread.returncode == 1
    assert "BROKEN" not in unread.stdout
    assert "UNREAD" in unread.stdout
    assert "ImportedApproval" in unread.stdout
    assert "little --import MODULE" in unread.stdout

    checked = _little(
        project, "--import", "approvals", "verify", "--all", "--world", "sqlite:///data"
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "every chain and artifact holds" in checked.stdout


def test_verify_without_the_class_still_finds_its_row_edited(project: Path, tmp_path: Path) -> None:
    edited = tmp_path / "edited"
    edited.mkdir()
    (edited / "approvals.py").write_text(_EVENTS)
    data = edited / "data"
    data.mkdir()
    source = sqlite3.connect(project / "data" / "events.sqlite3")
    target = sqlite3.connect(data / "events.sqlite3")
    source.backup(target)
    source.close()
    (row_id, state) = target.execute(
        "SELECT rowid, state FROM little_es_events ORDER BY rowid DESC LIMIT 1"
    ).fetchone()
    assert b'"ops"' in state
    target.execute(
        "UPDATE little_es_events SET state = ? WHERE rowid = ?",
        (state.replace(b'"ops"', b'"dev"'), row_id),
    )
    target.commit()
    target.close()

    found = _little(edited, "verify", "run_imp", "--world", "sqlite:///data")
    assert found.returncode == 1
    assert "BROKEN" in found.stdout
    assert "does not match its own digest" in found.stdout


def test_a_module_that_cannot_be_imported_is_a_usage_error(project: Path) -> None:
    bad = _little(project, "--import", "no_such_module", "runs", "--world", "sqlite:///data")
    assert bad.returncode == 2
    assert "cannot import module 'no_such_module'" in bad.stderr

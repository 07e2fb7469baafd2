"""Commands from entry points: ``little worker`` comes from the Temporal adapter.

The core never imports the adapter: the ``little_es.cli`` entry point group
names its ``register``, loaded when ``little`` lists its commands or is asked
for one it does not have. Without the extra, the command still exists and
fails in one line that says what to install.
"""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import entry_points

from typer.testing import CliRunner

from little_es.cli import OPTIONAL_COMMANDS, PLUGIN_GROUP, app

# Runs the CLI in a process where the Temporal SDK cannot be imported.
_WITHOUT_TEMPORAL = """
import sys
sys.modules["temporalio"] = None
from little_es.cli import app
app()
"""


def _without_temporal(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _WITHOUT_TEMPORAL, *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


def test_the_temporal_adapter_is_an_entry_point_of_the_cli_group() -> None:
    found = {ep.name: ep.value for ep in entry_points(group=PLUGIN_GROUP)}
    assert found["temporal"] == "little_es_temporal.cli:register"
    assert OPTIONAL_COMMANDS["worker"] == "temporal"


def test_help_lists_every_command_including_the_worker() -> None:
    result = CliRunner().invoke(app, ["--help"])
    assert result.exit_code == 0, result.output
    for command in ("report", "replay", "events", "runs", "run", "resume", "unlock", "worker"):
        assert f" {command} " in result.stdout, command
    worker = CliRunner().invoke(app, ["worker", "--help"])
    assert worker.exit_code == 0, worker.output
    assert "--task-queue" in worker.stdout


def test_an_inspection_command_does_not_import_the_adapter() -> None:
    code = (
        "import sys\nfrom little_es.cli import app\n"
        "try:\n    app(['runs', '--world', 'memory://'])\nexcept SystemExit:\n    pass\n"
        "print('temporal' if 'little_es_temporal' in sys.modules else 'core only')"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=60
    )
    assert done.stdout.splitlines()[-1] == "core only", done.stdout + done.stderr


def test_without_the_extra_the_worker_fails_in_one_line_naming_the_install() -> None:
    done = _without_temporal("worker", "flows:wf", "--address", "127.0.0.1:1")
    assert done.returncode == 1
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("error: little worker needs the temporal extra")
    assert lines[0].endswith("pip install 'little-es[temporal]'")
    helped = _without_temporal("--help")
    assert helped.returncode == 0, helped.stderr
    assert "worker" in helped.stdout and "Not available" in helped.stdout

"""``little run`` and ``little resume``: a workflow module driven from the command line."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from little_es import max_worker_threads, set_max_worker_threads
from little_es._threads import DEFAULT_MAX_WORKER_THREADS
from little_es.cli import app
from little_es.replay import replay_run
from little_es.world import local_world

_FLOW = """
from pathlib import Path
from little_es import Workflow, task

LEDGER = Path(__file__).with_name("ledger.txt")

def _note(ctx):
    with LEDGER.open("a") as f:
        f.write(ctx.step_path + "\\n")

def fetch(ctx):
    _note(ctx)
    return {"ticket": ctx.input["ticket"]}

def publish(ctx):
    _note(ctx)
    if Path(__file__).with_name("broken").exists():
        raise RuntimeError("publisher down")
    return {"published": ctx.outputs["fetch"]["ticket"]}

wf = Workflow("cli_flow", steps=[task("fetch", fetch), task("publish", publish)])
not_a_workflow = 42
"""


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "cli_flow_mod.py").write_text(textwrap.dedent(_FLOW))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def _ledger(project: Path) -> list[str]:
    return (project / "ledger.txt").read_text().splitlines()


def test_run_then_resume_after_a_failure(project: Path) -> None:
    url = f"sqlite:///{project / 'world'}"
    (project / "broken").touch()
    failed = CliRunner().invoke(
        app,
        [
            "run",
            "cli_flow_mod:wf",
            "--input",
            '{"ticket": 7}',
            "--run-id",
            "run_cli_1",
            "--world",
            url,
        ],
    )
    assert failed.exit_code == 1
    assert "publisher down" in failed.output and "Traceback" not in failed.output

    (project / "broken").unlink()
    resumed = CliRunner().invoke(
        app, ["resume", "run_cli_1", "--workflow", "cli_flow_mod:wf", "--world", url]
    )
    assert resumed.exit_code == 0, resumed.output
    assert '"published": 7' in resumed.output
    assert _ledger(project) == ["fetch", "publish", "publish"]
    with local_world(project / "world") as world:
        assert replay_run(world, "run_cli_1").state.status == "completed"


_WIDE_FLOW = """
import threading
from little_es import Workflow, parallel, task
from little_es._threads import DEFAULT_MAX_WORKER_THREADS

WIDTH = DEFAULT_MAX_WORKER_THREADS + 2
TOGETHER = threading.Barrier(WIDTH, timeout=10)

def meet(ctx):
    TOGETHER.wait()  # every branch waits for all the others: each needs a thread of its own
    return ctx.branch_value

def keys(ctx):
    return {str(i): i for i in range(WIDTH)}

wf = Workflow("cli_wide", steps=[parallel("fan", branches=keys, step=task("meet", meet))])
"""


@pytest.fixture
def limit_restored() -> Iterator[None]:
    before = max_worker_threads()
    yield
    set_max_worker_threads(before)


@pytest.mark.usefixtures("limit_restored")
def test_max_worker_threads_lets_that_many_sync_steps_run_at_once(project: Path) -> None:
    (project / "cli_wide_mod.py").write_text(textwrap.dedent(_WIDE_FLOW))
    width = DEFAULT_MAX_WORKER_THREADS + 2
    url = f"sqlite:///{project / 'world'}"
    result = CliRunner().invoke(
        app,
        [
            "run",
            "cli_wide_mod:wf",
            "--run-id",
            "run_wide",
            "--world",
            url,
            "--max-worker-threads",
            str(width),
        ],
    )
    assert result.exit_code == 0, result.output
    assert max_worker_threads() == width
    with local_world(project / "world") as world:
        assert replay_run(world, "run_wide").state.output == {str(i): i for i in range(width)}
    refused = CliRunner().invoke(
        app, ["resume", "run_wide", "--workflow", "cli_wide_mod:wf", "--max-worker-threads", "0"]
    )
    assert refused.exit_code == 2
    assert "--max-worker-threads" in refused.output


@pytest.mark.parametrize(
    ("ref", "message"),
    [
        ("cli_flow_mod", "use module:attribute"),
        ("no_such_module:wf", "cannot import module 'no_such_module'"),
        ("cli_flow_mod:not_a_workflow", "is int, not a Workflow"),
        ("cli_flow_mod:missing", "is missing, not a Workflow"),
    ],
)
def test_bad_workflow_references_exit_1_with_one_line(
    project: Path, ref: str, message: str
) -> None:
    result = CliRunner().invoke(app, ["run", ref, "--world", "memory://"])
    assert result.exit_code == 1
    assert message in result.output
    assert "Traceback" not in result.output


def test_bad_input_exits_1(project: Path) -> None:
    for given, message in (("{nope", "--input is not JSON"), ("[1]", "must be a JSON object")):
        result = CliRunner().invoke(app, ["run", "cli_flow_mod:wf", "--input", given])
        assert result.exit_code == 1
        assert message in result.output


def test_an_integer_beyond_64_bits_in_the_input_is_refused_not_rounded(project: Path) -> None:
    # orjson alone would read it as the float 1.2345678901234568e+29 and record that.
    given = '{"order": 123456789012345678901234567890}'
    result = CliRunner().invoke(
        app, ["run", "cli_flow_mod:wf", "--input", given, "--world", "memory://"]
    )
    assert result.exit_code == 1
    assert "input.order is an integer of 97 bits" in result.output
    assert "Traceback" not in result.output


def _as_from_a_terminal() -> None:
    """In the child before exec: SIGINT handled and unblocked, as in a shell.

    An ignored or blocked signal is inherited across exec; in a long test process
    something (an earlier test's event loop or worker) may have left SIGINT so, and
    the child then never sees the Ctrl-C (seen in CI, in some test orders)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def test_ctrl_c_leaves_a_resumable_run(project: Path) -> None:
    (project / "slow_mod.py").write_text(
        textwrap.dedent(
            """
            import asyncio
            from little_es import Workflow, task
            def first(ctx):
                return 1
            async def slow(ctx):
                print("SLOW STARTED", flush=True)
                await asyncio.sleep(60)
            def last(ctx):
                return "done"
            steps = [task("first", first), task("slow", slow), task("last", last)]
            wf = Workflow("slow", steps=steps)
            """
        )
    )
    url = f"sqlite:///{project / 'world'}"
    env = {**os.environ, "PYTHONPATH": f"{project}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "little_es.cli",
            "run",
            "slow_mod:wf",
            "--run-id",
            "run_int",
            "--world",
            url,
        ],
        cwd=project,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=_as_from_a_terminal,
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        if "SLOW STARTED" in line:
            break
    proc.send_signal(signal.SIGINT)  # as Ctrl-C sends
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, out
    assert "resumable" in out
    with local_world(project / "world") as world:
        replay = replay_run(world, "run_int")
    assert replay.completed_step_paths == ("first",)
    assert replay.pending_step_paths == ("slow",)

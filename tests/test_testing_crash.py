"""little_es.testing's crash runner, used as a user's test would use it.

The workflow lives in a module of the test's own directory; the runner kills
its run right after the chosen append (a real SIGKILL, in a forked child) and
another child resumes it.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

from little_es.testing import CrashRunner
from little_es.world import local_world

_FLOW = """
import os
from little_es import Workflow, task

def _step(name):
    def run(ctx):
        with open(os.environ["FLOW_LEDGER"], "a") as f:
            f.write(name + "\\n")
        return ctx.input["n"] + len(name)
    return run

wf = Workflow("user_flow", steps=[task(n, _step(n)) for n in ("one", "two", "three")])
"""


def test_a_users_workflow_is_killed_after_an_append_and_resumed(tmp_path: Path) -> None:
    (tmp_path / "user_flows.py").write_text(textwrap.dedent(_FLOW))
    ledger = tmp_path / "ledger"
    url = f"sqlite:///{tmp_path / 'world'}"
    env = {"FLOW_LEDGER": str(ledger)}
    with CrashRunner(pythonpath=[tmp_path], cwd=tmp_path) as runner:
        # RunStarted, StepStarted one, StepCompleted one, StepStarted two: killed there.
        killed = runner.run_workflow(
            "user_flows:wf",
            world=url,
            run_id="run_user",
            input={"n": 1},
            crash_after_appends=4,
            env=env,
        )
        assert killed.killed, killed.output
        with local_world(tmp_path / "world") as world:
            assert [e.wire_name for e in world.read_run_log("run_user")][-1] == "StepStarted"
        done = runner.run_workflow("user_flows:wf", world=url, run_id="run_user", env=env)
    result = done.result()
    assert result["resumed"] is True
    assert result["output"] == 6
    ran = ledger.read_text().splitlines()
    assert ran.count("one") == 1
    # ``two`` was in flight at the kill (started, not committed): it ran at most twice.
    assert ran.count("two") in (1, 2)
    assert ran.count("three") == 1


def test_a_kill_by_event_and_a_plain_run(tmp_path: Path) -> None:
    (tmp_path / "user_flows.py").write_text(textwrap.dedent(_FLOW))
    url = f"sqlite:///{tmp_path / 'world'}"
    env = {"FLOW_LEDGER": str(tmp_path / "ledger")}
    with CrashRunner(pythonpath=[tmp_path], cwd=tmp_path) as runner:
        killed = runner.run_workflow(
            "user_flows:wf",
            world=url,
            run_id="run_event",
            input={"n": 0},
            crash_after_event="StepCompleted:step_path=two",
            env=env,
        )
        assert killed.killed
        done = runner.run_workflow("user_flows:wf", world=url, run_id="run_event", env=env)
        assert done.result()["steps_executed"] == 1
        fresh = runner.run_workflow(
            "user_flows:wf", world=url, run_id="run_plain", input={"n": 2}, env=env
        )
    # Five commits: RunStarted, one's StepStarted, then each step's StepCompleted with
    # the next StepStarted (the last's with RunCompleted).
    assert fresh.result() == {"output": 7, "steps_executed": 3, "resumed": False, "appends": 5}


def test_a_target_that_cannot_be_imported_fails_its_run_not_the_runner(tmp_path: Path) -> None:
    (tmp_path / "user_flows.py").write_text(textwrap.dedent(_FLOW))
    with CrashRunner(pythonpath=[tmp_path], cwd=tmp_path) as runner:
        missing = runner.run("no_such_module:main")
        assert missing.returncode == 1 and not missing.killed
        assert "No module named 'no_such_module'" in missing.output
        bad_ref = runner.run_workflow(
            "user_flows:nope", world=f"sqlite:///{tmp_path / 'w'}", run_id="run_x", input={}
        )
        assert bad_ref.returncode == 1
        assert "is missing, not a Workflow" in bad_ref.output
        ok = runner.run_workflow(
            "user_flows:wf",
            world=f"sqlite:///{tmp_path / 'w'}",
            run_id="run_x",
            input={"n": 0},
            env={"FLOW_LEDGER": str(tmp_path / "ledger")},
        )
    assert ok.result()["output"] == 5

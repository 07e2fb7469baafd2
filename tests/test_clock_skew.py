"""A session stamped by a clock behind the one that recorded its step still counts to that step.

Three real processes share one SQLite world (:mod:`tests._skew_proc`): the
first, its clock an hour ahead, records the agent step's ``StepStarted`` and is
killed; the second, on the real clock, runs two model calls of the session
and is killed; the third resumes. Every event of the session is stamped before
the ``StepStarted`` that names it. Read by timestamp alone, the session came
before its step, the step's two calls were counted to the run but not to the
step, and the third process spent the step's budget of 3 calls again (5 calls).
"""

from __future__ import annotations

from pathlib import Path

from little_es.errors import BudgetExceededError
from little_es.events import ModelResponded, StepStarted
from little_es.projections import list_runs
from little_es.replay import replay_run
from little_es.testing import CrashRunner
from little_es.world import open_world

_REPO = Path(__file__).resolve().parent.parent
_WORKFLOW = "tests._skew_proc:WORKFLOW"
_RUN = "run_skew"


def test_a_session_stamped_before_its_step_counts_to_it_and_its_budget(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'world'}"
    with CrashRunner(pythonpath=[_REPO], cwd=_REPO) as runner:
        ahead = runner.run_workflow(
            _WORKFLOW,
            world=url,
            run_id=_RUN,
            input={},
            crash_after_event="StepStarted:step_path=ask",
            env={"SKEW_S": "3600"},
        )
        assert ahead.killed, ahead.output
        two_calls = runner.run_workflow(
            _WORKFLOW, world=url, run_id=_RUN, crash_after_event="harness.model.responded:turn=2"
        )
        assert two_calls.killed, two_calls.output
        last = runner.run_workflow(_WORKFLOW, world=url, run_id=_RUN)
    assert BudgetExceededError.__name__ in last.output, last.output

    with open_world(url) as world:
        log = world.read_run_log(_RUN)
        started = next(e for e in log if isinstance(e, StepStarted) and e.step_path == "ask")
        calls = [e for e in log if isinstance(e, ModelResponded)]
        # The setting holds: every call is stamped before its step started.
        assert calls and all(c.timestamp < started.timestamp for c in calls)
        assert len(calls) == 3
        # ... and is read after it, so the step owns what the run owns.
        assert log.index(started) < log.index(calls[0])
        state = replay_run(world, _RUN).state
        assert state.steps["ask"].usage == state.usage
        assert state.usage.calls == 3
        (summary,) = list_runs(world)
        assert summary.usage == state.usage

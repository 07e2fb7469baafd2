"""Durable waits in one process: wait_for steps, ask_human, approval-gated tools, signals.

What is recorded when a run waits, what a signal must be to be taken, that it is taken
once, and that a timeout is its own outcome. On Temporal: ``test_temporal_waits.py``; the
kill test, with real processes: ``test_waits_kill.py``.
"""

# No `from __future__ import annotations`: the test tools' hints must stay real objects.
import asyncio
import time
from datetime import timedelta
from typing import Any

import pytest
from pydantic import BaseModel
from rich.console import Console
from typer.testing import CliRunner

from little_es import (
    ApprovalDeniedError,
    NoSuchWaitError,
    RunCancelledError,
    RunFailedError,
    RunNotFoundError,
    RunStateError,
    RunWaitingError,
    SignalConsumedError,
    SignalDataError,
    SignalError,
    StaleApprovalError,
    ToolError,
    WaitTimedOutError,
    WorkflowChangedError,
    WorkflowDefinitionError,
    ask_human,
    cancel_run,
    list_waits,
    subworkflow,
    wait_for,
)
from little_es.cli import app
from little_es.engine.local import run_workflow
from little_es.events import (
    RunFailed,
    RunWaiting,
    SignalReceived,
    StepFailed,
    ToolCallFailed,
    ToolCallSucceeded,
    WaitTimedOut,
)
from little_es.harness.model import ScriptedModel, ScriptedReply
from little_es.harness.tools import ToolContext, tool
from little_es.render import STATUS_STYLES, StepBoard, render_report
from little_es.replay import replay_run
from little_es.ui.html import _CSS_COLOURS
from little_es.values import ToolCall
from little_es.waits import action_digest, schema_digest
from little_es.workflow.authoring import Workflow, agent, parallel, task
from little_es.workflow.context import StepContext
from little_es.world import World

pytestmark = pytest.mark.backends("memory", "sqlite")


class Decision(BaseModel):
    approved: bool
    note: str = ""


class Measure(BaseModel):
    value: float


class OtherDecision(BaseModel):
    approved: bool
    reviewer: str


executed: list[str] = []


def _fetch(ctx: StepContext) -> dict[str, Any]:
    executed.append("fetch")
    return {"ticket": 42}


def _publish(ctx: StepContext) -> dict[str, Any]:
    executed.append("publish")
    return {"decision": ctx.outputs["review"], "ticket": ctx.outputs["fetch"]["ticket"]}


def _flow(timeout: float | None = 3600, model: type[BaseModel] = Decision) -> Workflow:
    return Workflow(
        "approve",
        steps=[
            task("fetch", _fetch),
            wait_for("review", signal="review", model=model, timeout=timeout),
            task("publish", _publish),
        ],
    )


def _run(world: World, wf: Workflow, run_id: str, input: Any = None) -> Any:
    return asyncio.run(run_workflow(world, wf, input, run_id=run_id))


def _events(world: World, run_id: str) -> list[Any]:
    return list(world.read_run_log(run_id))


@pytest.fixture(autouse=True)
def _fresh_ledger() -> None:
    executed.clear()


def test_a_wait_step_records_what_it_waits_for_and_the_driver_stops_cleanly(
    world: World,
) -> None:
    with pytest.raises(RunWaitingError) as stopped:
        _run(world, _flow(), "run_w", {"x": 1})
    assert stopped.value.waits == (("review", "review", "review"),)
    assert "little signal run_w review --data JSON" in str(stopped.value)
    events = _events(world, "run_w")
    waiting = [e for e in events if isinstance(e, RunWaiting)]
    assert len(waiting) == 1
    (w,) = waiting
    assert (w.signal, w.step_path, w.kind) == ("review", "review", "step")
    assert w.model_ref.endswith(":Decision")
    assert w.schema_digest == schema_digest(Decision)
    assert w.deadline is not None and 3590 < (w.deadline - w.timestamp).total_seconds() <= 3600
    assert not any(isinstance(e, StepFailed) for e in events)
    state = replay_run(world, "run_w").state
    assert state.status == "waiting"
    assert state.steps["review"].status == "running"
    assert state.waits["review"].status == "waiting"

    # A resume before the signal appends nothing and stops at the same wait again.
    before = len(_events(world, "run_w"))
    with pytest.raises(RunWaitingError):
        _run(world, _flow(), "run_w")
    assert len(_events(world, "run_w")) == before
    assert executed == ["fetch"]


def test_a_signal_resumes_the_run_with_its_data_as_the_steps_output(world: World) -> None:
    with pytest.raises(RunWaitingError):
        _run(world, _flow(), "run_s")
    event = world.signal("run_s", "review", {"approved": True}, sent_by="ops@example")
    assert isinstance(event, SignalReceived)
    assert event.data == {"approved": True, "note": ""}  # validated and dumped by the model
    assert replay_run(world, "run_s").state.status == "running"
    result = _run(world, _flow(), "run_s")
    assert result.state.status == "completed"
    assert result.output == {"decision": {"approved": True, "note": ""}, "ticket": 42}
    assert result.state.steps["review"].output == {"approved": True, "note": ""}
    # fetch ran once, before the wait; nothing ran twice.
    assert executed == ["fetch", "publish"]
    assert result.state == replay_run(world, "run_s").state
    assert [w.signalled_by for w in result.state.waits.values()] == ["ops@example"]


def test_a_signal_that_does_not_validate_is_refused_with_nothing_recorded(world: World) -> None:
    with pytest.raises(RunWaitingError):
        _run(world, _flow(), "run_v")
    before = len(_events(world, "run_v"))
    with pytest.raises(SignalDataError, match=r"approved: Input should be a valid boolean"):
        world.signal("run_v", "review", {"approved": "maybe"})
    with pytest.raises(SignalDataError, match="does not validate"):
        world.signal("run_v", "review", {"approved": True, "extra": 1} | {"note": 3})
    with pytest.raises(NoSuchWaitError, match=r"does not wait for signal 'deploy'.*'review'"):
        world.signal("run_v", "deploy", {"approved": True})
    with pytest.raises(RunNotFoundError):
        world.signal("run_nowhere", "review", {"approved": True})
    with pytest.raises(SignalError):
        world.signal("run_v", "", {"approved": True})

    assert len(_events(world, "run_v")) == before
    assert replay_run(world, "run_v").state.status == "waiting"


def test_a_signal_is_taken_once_and_a_duplicate_names_the_first(world: World) -> None:
    with pytest.raises(RunWaitingError):
        _run(world, _flow(), "run_d")
    first = world.signal("run_d", "review", {"approved": True}, signal_id="delivery-1")
    before = len(_events(world, "run_d"))
    # A double click: the wait took a signal already.
    with pytest.raises(SignalConsumedError, match="took signal delivery-1 already"):
        world.signal("run_d", "review", {"approved": False})
    # A retried webhook with the same delivery id.
    with pytest.raises(SignalConsumedError, match="signal id 'delivery-1' was recorded already"):
        world.signal("run_d", "review", {"approved": True}, signal_id="delivery-1")
    assert len(_events(world, "run_d")) == before
    result = _run(world, _flow(), "run_d")
    assert result.output["decision"] == first.data
    # After the run went on, the wait still refuses a late duplicate.
    with pytest.raises(SignalConsumedError):
        world.signal("run_d", "review", {"approved": False})
    assert executed == ["fetch", "publish"]


def test_a_timeout_records_its_own_outcome_and_closes_the_wait(world: World) -> None:
    with pytest.raises(RunWaitingError):
        _run(world, _flow(timeout=0.2), "run_t")
    time.sleep(0.3)
    with pytest.raises(NoSuchWaitError, match="timed out"):
        world.signal("run_t", "review", {"approved": True})
    with pytest.raises(WaitTimedOutError, match="timed out at"):
        _run(world, _flow(timeout=0.2), "run_t")
    events = _events(world, "run_t")
    assert [type(e) for e in events if isinstance(e, WaitTimedOut)] == [WaitTimedOut]
    assert not any(isinstance(e, StepFailed) for e in events)
    state = replay_run(world, "run_t").state
    assert state.status == "timed_out" and state.stopped_step_path == "review"
    assert "timed out" in (state.stop_reason or "")
    # It stays so: a resume is refused with nothing appended, and no signal is taken.
    with pytest.raises(WaitTimedOutError):
        _run(world, _flow(timeout=0.2), "run_t")
    assert len(_events(world, "run_t")) == len(events)
    with pytest.raises(NoSuchWaitError, match="timed out"):
        world.signal("run_t", "review", {"approved": True})
    # Nor cancelled: a cancel and a resume_cancelled=True once turned it `running` for good,
    # each resume stopping at the timed-out wait.
    with pytest.raises(RunStateError, match=r"timed_out .*nothing to cancel"):
        cancel_run(world, "run_t")
    assert len(_events(world, "run_t")) == len(events)
    with pytest.raises(WaitTimedOutError):
        _run_cancelled(world, _flow(timeout=0.2), "run_t")
    assert replay_run(world, "run_t").state.status == "timed_out"
    assert executed == ["fetch"]


def _run_cancelled(world: World, wf: Workflow, run_id: str) -> Any:
    return asyncio.run(run_workflow(world, wf, None, run_id=run_id, resume_cancelled=True))


def test_the_report_and_the_step_board_say_what_a_run_waits_for(world: World) -> None:
    board = StepBoard()
    with pytest.raises(RunWaitingError):
        asyncio.run(run_workflow(world, _flow(), None, run_id="run_r", observer=board.observe))
    assert board.rows["review"] == ("waiting", "for signal review")
    out = Console(width=200, record=True)
    render_report(world, "run_r", out)
    text = out.export_text()
    assert "waiting" in text.splitlines()[0]
    assert "waiting in step review for signal review (until " in text
    assert "little signal run_r review --data JSON" in text
    # The web page draws every status in a colour it knows.
    assert {STATUS_STYLES[s] for s in ("waiting", "timed_out")} <= set(_CSS_COLOURS)


def test_the_wait_is_part_of_the_workflow_definition(world: World) -> None:
    assert _flow().ir_hash != _flow(model=OtherDecision).ir_hash
    assert _flow(timeout=10).ir_hash != _flow(timeout=20).ir_hash
    with pytest.raises(RunWaitingError):
        _run(world, _flow(), "run_c")
    with pytest.raises(WorkflowChangedError):
        _run(world, _flow(model=OtherDecision), "run_c")


def test_wait_for_refuses_what_it_cannot_wait_for() -> None:
    class Local(BaseModel):
        ok: bool

    with pytest.raises(WorkflowDefinitionError, match="pydantic model"):
        wait_for("w", model=dict)  # type: ignore[arg-type]
    with pytest.raises(WorkflowDefinitionError, match="inside a function"):
        wait_for("w", model=Local)
    with pytest.raises(WorkflowDefinitionError, match="timeout"):
        wait_for("w", model=Decision, timeout=-1)
    # A deadline past the last date a datetime holds would fail the step when it waits.
    for far in (1e13, 1e300, timedelta(days=999_999_999)):
        with pytest.raises(WorkflowDefinitionError, match=r"at most 3,155,760,000 seconds"):
            wait_for("w", model=Decision, timeout=far)
    assert wait_for("w", model=Decision, timeout=timedelta(days=365 * 99)).ir.wait is not None
    with pytest.raises(WorkflowDefinitionError, match="signal"):
        wait_for("w", signal="no spaces", model=Decision)
    with pytest.raises(WorkflowDefinitionError):
        parallel("g", branches=lambda ctx: ["a"], step=wait_for("w", model=Decision))  # type: ignore[arg-type]


def test_a_cancelled_waiting_run_takes_no_signal(world: World) -> None:
    with pytest.raises(RunWaitingError):
        _run(world, _flow(), "run_x")
    cancel_run(world, "run_x", reason="not needed")
    with pytest.raises(NoSuchWaitError, match="cancelled"):
        world.signal("run_x", "review", {"approved": True})


# ------------------------------------------------------------------ agents


deployed: list[str] = []


@tool(requires_approval=True)
def deploy(env: str) -> str:
    """Deploy the build to ``env``."""
    deployed.append(env)
    return f"deployed to {env}"


@tool
def lookup(key: str) -> str:
    """Look a key up."""
    deployed.append(f"lookup {key}")
    return f"value of {key}"


def _agent_flow(model: ScriptedModel) -> Workflow:
    return Workflow(
        "ops",
        steps=[agent("ops", model=model, prompt="ship it", tools=[ask_human(), deploy, lookup])],
    )


def _ops_model() -> ScriptedModel:
    return ScriptedModel(
        [
            ScriptedReply(
                tool_calls=(
                    ToolCall(id="q", name="ask_human", arguments={"question": "which env?"}),
                    ToolCall(id="l", name="lookup", arguments={"key": "build"}),
                )
            ),
            ScriptedReply(tool_calls=(ToolCall(id="d", name="deploy", arguments={"env": "prod"}),)),
            ScriptedReply(content="shipped"),
        ]
    )


def test_ask_human_stops_the_agent_and_the_answer_is_the_calls_result(world: World) -> None:
    deployed.clear()
    model = _ops_model()
    with pytest.raises(RunWaitingError) as stopped:
        _run(world, _agent_flow(model), "run_a")
    assert [w[0] for w in stopped.value.waits] == ["human"]
    (waiting,) = [e for e in _events(world, "run_a") if isinstance(e, RunWaiting)]
    assert waiting.kind == "ask_human" and waiting.question == "which env?"
    assert waiting.wait_id == "ops#1:q"
    assert waiting.action == {"tool": "ask_human", "args": {"question": "which env?"}}
    assert waiting.action_digest == action_digest("ask_human", {"question": "which env?"})
    # The other call of the batch finished and is committed: it is not run again.
    assert deployed == ["lookup build"]
    assert model.calls == 1

    world.signal("run_a", "human", {"answer": "prod"})
    with pytest.raises(RunWaitingError) as again:
        _run(world, _agent_flow(model), "run_a")
    # The answer went to the model; now deploy waits for its approval.
    assert [w[0] for w in again.value.waits] == ["approval"]
    assert model.calls == 2
    second_request = model.requests[-1]
    answer = [m for m in second_request.messages if m.role == "tool" and m.name == "ask_human"]
    assert answer[0].content == '{"answer":"prod"}'
    assert deployed == ["lookup build"]

    digest = action_digest("deploy", {"env": "prod"})
    assert [w.action_digest for _, w in list_waits(world) if w.kind == "approval"] == [digest]
    world.signal("run_a", "approval", {"approved": True}, digest=digest[:12])
    result = _run(world, _agent_flow(model), "run_a")
    assert result.output == "shipped"
    assert deployed == ["lookup build", "prod"]
    assert model.calls == 3
    succeeded = [e for e in _events(world, "run_a") if isinstance(e, ToolCallSucceeded)]
    assert [e.call_id for e in succeeded] == ["l", "q", "d"]
    assert result.state == replay_run(world, "run_a").state


def test_an_approval_is_bound_to_the_digest_of_what_it_approves(world: World) -> None:
    deployed.clear()
    model = ScriptedModel(
        [
            ScriptedReply(tool_calls=(ToolCall(id="d", name="deploy", arguments={"env": "prod"}),)),
            ScriptedReply(content="gave up"),
        ]
    )
    wf = _agent_flow(model)
    with pytest.raises(RunWaitingError):
        _run(world, wf, "run_p")
    before = len(_events(world, "run_p"))
    with pytest.raises(SignalDataError, match="must name what it approves: --digest"):
        world.signal("run_p", "approval", {"approved": True})
    stale = action_digest("deploy", {"env": "staging"})
    with pytest.raises(StaleApprovalError, match="stale"):
        world.signal("run_p", "approval", {"approved": True}, digest=stale)
    with pytest.raises(StaleApprovalError, match="not a digest"):
        world.signal("run_p", "approval", {"approved": True}, digest="abc")
    assert len(_events(world, "run_p")) == before
    # Declined: the tool never runs, the model is told, and the agent goes on.
    digest = action_digest("deploy", {"env": "prod"})
    # Hex digits in either case: a digest copied in upper case is the same digest.
    world.signal(
        "run_p", "approval", {"approved": False, "comment": "freeze"}, digest=digest.upper()
    )
    result = _run(world, wf, "run_p")
    assert result.output == "gave up" and deployed == []
    (failed,) = [e for e in _events(world, "run_p") if isinstance(e, ToolCallFailed)]
    assert failed.error.type == ApprovalDeniedError.__name__
    assert "freeze" in failed.error.message


def test_invalid_arguments_fail_the_call_without_asking_anyone(world: World) -> None:
    deployed.clear()
    model = ScriptedModel(
        [
            ScriptedReply(tool_calls=(ToolCall(id="d", name="deploy", arguments={"env": 3}),)),
            ScriptedReply(content="fixed nothing"),
        ]
    )
    result = _run(world, _agent_flow(model), "run_i")
    assert result.output == "fixed nothing"
    assert not any(isinstance(e, RunWaiting) for e in _events(world, "run_i"))


# ------------------------------------------------------------------ the command line


def test_little_runs_waiting_little_signal_and_little_resume(
    world: World, world_spec: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not world_spec.persistent:
        pytest.skip("the command opens the world afresh")
    runner = CliRunner()
    url = world_spec.url
    started = runner.invoke(
        app, ["run", "tests.test_waits:CLI_FLOW", "--run-id", "run_c", "--world", url]
    )
    assert started.exit_code == 3, started.output
    assert "waiting" in started.output
    assert "little signal run_c review --data JSON" in started.output
    listed = runner.invoke(app, ["runs", "--waiting", "--world", url])
    assert listed.exit_code == 0, listed.output
    assert "run_c" in listed.output and "review" in listed.output and "Decision" in listed.output
    bad = runner.invoke(
        app, ["signal", "run_c", "review", "--data", '{"approved": 1.5}', "--world", url]
    )
    assert bad.exit_code == 1 and "does not validate" in bad.output
    sent = runner.invoke(
        app, ["signal", "run_c", "review", "--data", '{"approved": true}', "--world", url]
    )
    assert sent.exit_code == 0, sent.output
    assert "recorded SignalReceived 'review'" in sent.output
    twice = runner.invoke(
        app, ["signal", "run_c", "review", "--data", '{"approved": true}', "--world", url]
    )
    assert twice.exit_code == 1 and "already" in twice.output
    empty = runner.invoke(app, ["runs", "--waiting", "--world", url])
    assert "no run waits" in empty.output
    resumed = runner.invoke(
        app, ["resume", "run_c", "--workflow", "tests.test_waits:CLI_FLOW", "--world", url]
    )
    assert resumed.exit_code == 0, resumed.output
    assert "completed" in resumed.output


CLI_FLOW = _flow()


# ------------------------------------------------------------------ branches, sub-runs, cancels


def _asker(question: str) -> ScriptedModel:
    return ScriptedModel(
        [
            ScriptedReply(
                tool_calls=(ToolCall(id="q", name="ask_human", arguments={"question": question}),)
            ),
            ScriptedReply(content="thanks"),
        ]
    )


def test_parallel_branches_wait_each_for_its_own_signal(world: World) -> None:
    model = ScriptedModel(
        respond=lambda request: (
            ScriptedReply(content="thanks")
            if any(m.role == "tool" for m in request.messages)
            else ScriptedReply(
                tool_calls=(
                    ToolCall(
                        id="q",
                        name="ask_human",
                        arguments={"question": request.messages[-1].content},
                    ),
                )
            )
        )
    )
    wf = Workflow(
        "fan",
        steps=[
            parallel(
                "ask",
                branches=lambda ctx: ["a", "b"],
                step=agent(
                    "one",
                    model=model,
                    prompt=lambda ctx: f"ask {ctx.branch_value}",
                    tools=[ask_human()],
                ),
            )
        ],
    )
    with pytest.raises(RunWaitingError) as stopped:
        _run(world, wf, "run_fan")
    assert sorted(w[1] for w in stopped.value.waits) == ["ask[a]/one", "ask[b]/one"]
    with pytest.raises(SignalError, match="at 2 places"):
        world.signal("run_fan", "human", {"answer": "x"})
    with pytest.raises(NoSuchWaitError, match="no open wait 'zzz' for signal 'human'; its open"):
        world.signal("run_fan", "human", {"answer": "x"}, wait_id="zzz")
    world.signal("run_fan", "human", {"answer": "for a"}, wait_id="ask[a]/one#1:q")
    assert replay_run(world, "run_fan").state.status == "waiting"  # b still waits
    with pytest.raises(RunWaitingError) as again:
        _run(world, wf, "run_fan")
    assert [w[1] for w in again.value.waits] == ["ask[b]/one"]
    world.signal("run_fan", "human", {"answer": "for b"})
    result = _run(world, wf, "run_fan")
    assert result.output == {"a": "thanks", "b": "thanks"}
    assert model.calls == 4


def test_a_sub_run_that_waits_stops_its_parent_and_both_continue(world: World) -> None:
    from little_es.workflow.authoring import subworkflow

    child = _flow()
    parent = Workflow("parent", steps=[subworkflow("approval", child)])
    with pytest.raises(RunWaitingError) as stopped:
        _run(world, parent, "run_parent")
    sub_run_id = stopped.value.run_id
    assert sub_run_id != "run_parent"
    assert [r for r, _ in list_waits(world)] == [sub_run_id]
    world.signal(sub_run_id, "review", {"approved": True})
    result = _run(world, parent, "run_parent")
    assert result.state.status == "completed"
    assert result.output["decision"] == {"approved": True, "note": ""}
    assert executed == ["fetch", "publish"]


def test_a_waiting_run_cancelled_then_resumed_still_waits(world: World) -> None:
    with pytest.raises(RunWaitingError):
        _run(world, _flow(), "run_cw")
    cancel_run(world, "run_cw")
    with pytest.raises(RunWaitingError):
        asyncio.run(run_workflow(world, _flow(), run_id="run_cw", resume_cancelled=True))
    assert replay_run(world, "run_cw").state.status == "waiting"
    world.signal("run_cw", "review", {"approved": False})
    assert _run(world, _flow(), "run_cw").output["decision"]["approved"] is False


@tool(requires_approval=True, approval_timeout=0.2)
def hurry(env: str) -> str:
    """Deploy, if someone approves within a moment."""
    deployed.append(f"hurry {env}")
    return "done"


def test_an_approval_that_does_not_come_in_time_times_out(world: World) -> None:
    deployed.clear()
    model = ScriptedModel(
        [ScriptedReply(tool_calls=(ToolCall(id="h", name="hurry", arguments={"env": "prod"}),))]
    )
    wf = Workflow("late", steps=[agent("ops", model=model, prompt="go", tools=[hurry])])
    with pytest.raises(RunWaitingError):
        _run(world, wf, "run_late")
    time.sleep(0.3)
    with pytest.raises(WaitTimedOutError, match="signal 'approval' timed out"):
        _run(world, wf, "run_late")
    state = replay_run(world, "run_late").state
    assert state.status == "timed_out" and deployed == [] and model.calls == 1
    assert state.steps["ops"].status == "running"  # stopped, not failed


def test_a_timed_out_run_takes_no_signal_for_another_of_its_waits(world: World) -> None:
    # One turn asks for two approvals, one with a deadline: once it passed, the run is
    # timed_out for good, and the other approval, still open, was taken all the same.
    deployed.clear()
    model = ScriptedModel(
        [
            ScriptedReply(
                tool_calls=(
                    ToolCall(id="h", name="hurry", arguments={"env": "prod"}),
                    ToolCall(id="d", name="deploy", arguments={"env": "staging"}),
                )
            ),
            ScriptedReply(content="done"),
        ]
    )
    wf = Workflow("late2", steps=[agent("ops", model=model, prompt="go", tools=[hurry, deploy])])
    with pytest.raises(RunWaitingError):
        _run(world, wf, "run_late2")
    time.sleep(0.3)
    with pytest.raises(WaitTimedOutError):
        _run(world, wf, "run_late2")
    state = replay_run(world, "run_late2").state
    assert state.status == "timed_out"
    assert state.waits["ops#1:d"].status == "waiting"
    events = _events(world, "run_late2")
    digest = state.waits["ops#1:d"].action_digest
    with pytest.raises(NoSuchWaitError, match=r"is timed_out .*it takes no signal"):
        world.signal("run_late2", "approval", {"approved": True}, digest=digest)
    assert len(_events(world, "run_late2")) == len(events)
    assert deployed == [] and model.calls == 1


def test_a_signal_cannot_be_recorded_around_its_checks(world: World) -> None:
    from little_es import UnstorableEventError

    with pytest.raises(RunWaitingError):
        _run(world, _flow(), "run_b")
    for event_class in (SignalReceived, RunWaiting, WaitTimedOut):
        with pytest.raises(UnstorableEventError, match="protocol event"):
            world.record_run_event("run_b", event_class, wait_id="review", signal="review")
    with pytest.raises(ToolError, match="requires_approval must be True or False"):
        tool(lookup.fn, requires_approval="yes")  # type: ignore[call-overload]
    with pytest.raises(ToolError, match="approval_timeout needs requires_approval"):
        tool(lookup.fn, approval_timeout=5)
    with pytest.raises(ToolError, match="timeout"):
        ask_human(timeout=0)


def test_a_session_pins_what_its_tools_wait_for_and_others_keep_their_manifest() -> None:
    from little_es.harness.manifest import compute_manifest

    model = _ops_model()
    manifest, _ = compute_manifest(model, [lookup, deploy, ask_human()], None, None, 20)
    tools = {t["name"]: t for t in manifest["tools"]}  # type: ignore[union-attr,index]
    assert "waits" not in tools["lookup"]  # as before durable waits: old sessions resume
    assert tools["deploy"]["waits"]["kind"] == "approval"  # type: ignore[index]
    assert tools["ask_human"]["waits"]["signal"] == "human"  # type: ignore[index]


def test_the_web_page_of_a_waiting_run_says_what_it_waits_for(world: World) -> None:
    from little_es.ui.html import run_body
    from little_es.ui.pages import run_page, runs_list

    deployed.clear()
    with pytest.raises(RunWaitingError):
        _run(world, _agent_flow(_ops_model()), "run_web")
    body = run_body(run_page(world, "run_web"))
    assert 'class="waiting">waiting in step ops for signal human' in body
    assert "which env?" in body
    assert "little signal run_web human --data" in body
    assert [r.run_id for r in runs_list(world, "waiting")] == ["run_web"]


def test_data_the_model_takes_but_json_cannot_hold_is_refused_unrecorded(world: World) -> None:
    wf = Workflow("measure", steps=[wait_for("m", model=Measure)])
    with pytest.raises(RunWaitingError):
        _run(world, wf, "run_m")
    before = len(_events(world, "run_m"))
    for bad in (float("nan"), float("inf"), "1e999"):
        with pytest.raises(SignalDataError, match="JSON cannot hold"):
            world.signal("run_m", "m", {"value": bad})
    assert len(_events(world, "run_m")) == before
    world.signal("run_m", "m", {"value": "2.5"})
    assert _run(world, wf, "run_m").output == {"value": 2.5}


def test_a_model_of_the_script_that_ran_the_workflow_says_where_to_send_the_signal() -> None:
    from little_es.errors import SignalDataError
    from little_es.waits import import_model

    with pytest.raises(SignalDataError, match=r"with world\.signal\(\.\.\.\) from that script"):
        import_model("__main__:Answer")
    with pytest.raises(SignalDataError, match="cannot be imported here"):
        import_model("no_such_module_here:Answer")


_CHILD_WAITS = Workflow("child_waits", steps=[wait_for("go", model=Decision, timeout=0.2)])


def test_a_sub_run_whose_wait_timed_out_is_its_parent_steps_failure(world: World) -> None:
    """Every resume of the sub-run stops the same way: as a stop, it would hold the parent's
    step in flight for ever; as the step's failure, the run ends (a retry policy, or an
    orchestrator's model, decides what comes next)."""
    parent = Workflow("parent_of_waits", steps=[subworkflow("sub", _CHILD_WAITS)])
    with pytest.raises(RunWaitingError):
        _run(world, parent, "run_parent_w", {})
    time.sleep(0.3)
    with pytest.raises(RunFailedError, match="SubRunTimedOutError") as failed:
        _run(world, parent, "run_parent_w")
    (sub_run,) = replay_run(world, "run_parent_w").state.sub_run_ids
    assert replay_run(world, sub_run).state.status == "timed_out"
    error = failed.value.error
    assert error.type == "SubRunTimedOutError" and not error.retryable
    assert f"run {sub_run!r} stopped at step 'go': its wait for signal" in error.message
    state = replay_run(world, "run_parent_w").state
    assert state.status == "failed" and state.steps["sub"].status == "failed"


def _check(ctx: StepContext) -> str:
    if ctx.input["key"] == "bad":
        raise ValueError("bad branch")
    return "checked"


@pytest.mark.parametrize("keys", [["ok", "bad"], ["bad", "ok"]])
def test_a_branch_out_of_retries_fails_the_run_though_another_waits(
    world: World, keys: list[str]
) -> None:
    # A group with one branch waiting and one failed for good fails the run, in either
    # key order: taken for a waiting run, a resume after the signal ran the failed
    # branch again, unasked.
    child = Workflow(
        "checked_gate",
        steps=[task("check", _check), wait_for("gate", model=Decision)],
    )
    wf = Workflow(
        "gated_group",
        steps=[
            parallel(
                "g",
                branches=lambda ctx: {k: k for k in keys},
                step=subworkflow("each", child, input=lambda ctx: {"key": ctx.branch_value}),
            )
        ],
    )
    with pytest.raises(RunFailedError, match="g\\[bad\\]/each"):
        _run(world, wf, "run_gated_group")
    state = replay_run(world, "run_gated_group").state
    assert state.status == "failed" and state.failed_step_path == "g[bad]/each"
    assert sum(isinstance(e, RunFailed) for e in _events(world, "run_gated_group")) == 1


@pytest.mark.parametrize("keys", [["wait", "stop"], ["stop", "wait"]])
def test_a_branch_that_stops_the_run_stops_it_though_another_waits(
    world: World, keys: list[str]
) -> None:
    # One branch cancels the run and stops at its next model call while the other waits
    # for an approval: the run is cancelled, in either key order. With the waiting branch
    # first in key order the driver stopped with RunWaitingError ("send the signal, then
    # resume"), for a run that takes no signal.
    deployed.clear()

    @tool
    def stop_run(ctx: ToolContext) -> str:
        """Cancel the run, as another process would."""
        cancel_run(world, ctx.run_id, reason="enough")
        return "cancelled"

    def respond(request: Any) -> ScriptedReply:
        first = next(m.content for m in request.messages if m.role == "user")
        turn = sum(1 for m in request.messages if m.role == "assistant")
        name = "deploy" if first == "wait" else "stop_run"
        args = {"env": "prod"} if name == "deploy" else {}
        return ScriptedReply(tool_calls=(ToolCall(id=f"c{turn}", name=name, arguments=args),))

    wf = Workflow(
        "stop_or_wait",
        steps=[
            parallel(
                "g",
                branches=lambda ctx: list(keys),
                step=agent(
                    "one",
                    model=ScriptedModel(respond=respond),
                    prompt=lambda ctx: ctx.branch_key,
                    tools=[deploy, stop_run],
                ),
            )
        ],
    )
    with pytest.raises(RunCancelledError, match="enough"):
        _run(world, wf, "run_stop_or_wait")
    state = replay_run(world, "run_stop_or_wait").state
    assert state.status == "cancelled" and deployed == []

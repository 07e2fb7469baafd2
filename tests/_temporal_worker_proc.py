"""The workflows of the Temporal tests, and a subprocess that serves them (or runs one locally).

Run as a script (the tests put the repository root and ``adapters`` on ``PYTHONPATH``)::

    python tests/_temporal_worker_proc.py worker --address HOST:PORT --task-queue Q \
        --world URL --ledger FILE [--sticky-timeout S]
    python tests/_temporal_worker_proc.py local --world URL --ledger FILE \
        --workflow NAME --run-id ID --input JSON

``worker`` serves every workflow of :data:`WORKFLOWS` on a Temporal task queue
until SIGTERM, printing ``READY`` once it polls. ``local`` runs (or resumes)
one run with the local scheduler and prints ``RESULT <json output>``.

Every step function, model call and tool call first appends one JSON line to
the ledger (``{"pid", "kind", "run_id", "what"}``) with a single ``O_APPEND``
write, so the line is in the file before the process can be killed and the
ledger counts real invocations across processes. With
``LITTLE_ES_TEST_CRASH_IN_TURN=N`` in its environment, the process SIGKILLs
itself inside the model call of turn ``N``, after the ledger line: a crash in
the middle of an agent step, with that call in flight.

The workflows are defined at module level so that the tests, which import this
module as ``_temporal_worker_proc``, and the subprocess, which re-imports it
under that name, build the same IR (its ``ref`` fields name
``module:qualname``).
"""

# No `from __future__ import annotations`: the tools' hints must stay real objects.
import argparse
import asyncio
import os
import re
import signal
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import orjson

from little_es.harness.model import ScriptedModel, ScriptedReply
from little_es.harness.tools import ToolContext, tool
from little_es.orchestrator import start_workflow_tool
from little_es.values import ModelRequest, ToolCall, Usage
from little_es.workflow.authoring import Workflow, agent, decision, parallel, subworkflow, task
from little_es.workflow.context import StepContext
from little_es.workflow.ir import END, RetryPolicy
from tests._outer_loop_proc import improve, make_planner

LEDGER_ENV = "LITTLE_ES_TEST_LEDGER"
CRASH_IN_TURN_ENV = "LITTLE_ES_TEST_CRASH_IN_TURN"
READY = "READY"
RESULT_PREFIX = "RESULT "


def _ledger(kind: str, run_id: str, what: Any) -> None:
    path = os.environ.get(LEDGER_ENV)
    if not path:
        return
    line = orjson.dumps({"pid": os.getpid(), "kind": kind, "run_id": run_id, "what": what})
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line + b"\n")
    finally:
        os.close(fd)


def read_ledger(path: Path) -> list[dict[str, Any]]:
    """Every ledger line, in order."""
    if not path.exists():
        return []
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line]


# ------------------------------------------------------------------ the agent


def _turns_asked(request: ModelRequest) -> int:
    for message in request.messages:
        if message.role == "user" and message.content:
            found = re.search(r"in (\d+) turns", message.content)
            if found:
                return int(found.group(1))
    return 3


def _respond(request: ModelRequest) -> ScriptedReply:
    turn = 1 + sum(1 for m in request.messages if m.role == "assistant")
    # The run id is not in the request; the conversation's first line names it.
    _ledger("model", _run_of(request), turn)
    if os.environ.get(CRASH_IN_TURN_ENV) == str(turn):
        os.kill(os.getpid(), signal.SIGKILL)
    usage = Usage(input_tokens=100 * turn, output_tokens=10)
    if turn < _turns_asked(request):
        return ScriptedReply(
            content=f"turn {turn}: looking up",
            tool_calls=(ToolCall(id=f"c{turn}", name="lookup", arguments={"q": f"q{turn}"}),),
            usage=usage,
        )
    return ScriptedReply(content=f"found after {turn} turns", usage=usage)


def _run_of(request: ModelRequest) -> str:
    for message in request.messages:
        if message.role == "user" and message.content:
            found = re.search(r"\[run (\S+)\]", message.content)
            if found:
                return found.group(1)
    return "?"


MODEL = ScriptedModel(respond=_respond, provider="openai", model_id="gpt-4o-mini")
"""A priced model id, so reports show dollars; every invocation is in the ledger."""


async def lookup(q: str, ctx: ToolContext) -> str:
    """Look a query up."""
    _ledger("tool", ctx.run_id, ctx.call_id)
    await asyncio.sleep(0)
    return f"result for {q}"


LOOKUP = tool(lookup)


def research_prompt(ctx: StepContext) -> str:
    """The agent's prompt: the topic and how many turns the scripted model takes."""
    return f"[run {ctx.run_id}] Research {ctx.input['topic']} in {ctx.input['turns']} turns."


def prepare(ctx: StepContext) -> dict[str, Any]:
    """The first step: normalise the topic."""
    _ledger("task", ctx.run_id, ctx.step_path)
    return {"topic": str(ctx.input["topic"]).strip().lower()}


def summarize(ctx: StepContext) -> dict[str, Any]:
    """The last step: wrap the agent's answer."""
    _ledger("task", ctx.run_id, ctx.step_path)
    return {"topic": ctx.outputs["prepare"]["topic"], "answer": ctx.outputs["research"]}


AGENT_WORKFLOW = Workflow(
    "t_agent",
    version="1",
    steps=[
        task("prepare", prepare),
        agent(
            "research",
            model=MODEL,
            tools=[LOOKUP],
            prompt=research_prompt,
            system="You are a careful researcher.",
            max_turns=500,
        ),
        task("summarize", summarize),
    ],
)
"""prepare -> research (``input["turns"]`` turns, one tool call each) -> summarize."""


# ------------------------------------------------------------ plain steps, gated


def step_a(ctx: StepContext) -> str:
    """Record and return."""
    _ledger("task", ctx.run_id, ctx.step_path)
    return "a"


def step_b(ctx: StepContext) -> str:
    """Record and return."""
    _ledger("task", ctx.run_id, ctx.step_path)
    return str(ctx.outputs["a"]) + "b"


async def step_gated(ctx: StepContext) -> str:
    """Record, then wait (cancellably) until the file ``input["gate"]`` exists."""
    _ledger("task", ctx.run_id, ctx.step_path)
    gate = Path(ctx.input["gate"])
    while not gate.exists():
        await asyncio.sleep(0.05)
    return str(ctx.outputs["b"]) + "c"


GATED_WORKFLOW = Workflow(
    "t_gated",
    version="1",
    steps=[task("a", step_a), task("b", step_b), task("c", step_gated)],
)
"""a -> b -> c, where c waits for the file named by ``input["gate"]``."""


# ------------------------------------------------------------ every kind of step


def fetch(ctx: StepContext) -> dict[str, Any]:
    """The files to check."""
    _ledger("task", ctx.run_id, ctx.step_path)
    return {"files": list(ctx.input["files"])}


def flaky(ctx: StepContext) -> str:
    """Fails on its first attempt (deterministically), succeeds on the second."""
    _ledger("task", ctx.run_id, f"{ctx.step_path}#{ctx.attempt}")
    if ctx.attempt == 1:
        raise RuntimeError("transient: first attempt always fails")
    return f"ok on attempt {ctx.attempt}"


def lint(ctx: StepContext) -> dict[str, Any]:
    """One parallel branch."""
    _ledger("task", ctx.run_id, ctx.step_path)
    return {"file": ctx.branch_value, "issues": len(str(ctx.branch_value)) % 3}


def files(ctx: StepContext) -> list[str]:
    """The branch set: the fetched files."""
    return list(ctx.outputs["fetch"]["files"])


def child_step(ctx: StepContext) -> dict[str, Any]:
    """The sub-workflow's only step."""
    _ledger("task", ctx.run_id, ctx.step_path)
    return {"child_saw": dict(ctx.input)}


CHILD_WORKFLOW = Workflow("t_child", version="1", steps=[task("inner", child_step)])


def child_input(ctx: StepContext) -> dict[str, Any]:
    """The sub-run's input."""
    return {"issues": sum(v["issues"] for v in ctx.outputs["check"].values()), "visit": ctx.visit}


def again(ctx: StepContext) -> str:
    """Loop back to the check once, then end."""
    _ledger("task", ctx.run_id, ctx.step_path)
    return "check" if ctx.visit == 1 else END


def big(ctx: StepContext) -> dict[str, Any]:
    """An output far larger than Temporal should carry (stored as an artifact)."""
    _ledger("task", ctx.run_id, ctx.step_path)
    return {"blob": "x" * 100_000}


MIXED_WORKFLOW = Workflow(
    "t_mixed",
    version="1",
    steps=[
        task("fetch", fetch),
        task("flaky", flaky, retry=RetryPolicy(max_attempts=3, initial_backoff_s=0.05)),
        task("big", big),
        parallel("check", branches=files, step=task("lint", lint), max_concurrency=1, max_visits=2),
        subworkflow("sub", CHILD_WORKFLOW, input=child_input, max_visits=2),
        agent("research", model=MODEL, tools=[LOOKUP], prompt=research_prompt, max_visits=2),
        decision("again", again, max_visits=2),
    ],
)
"""Every kind of step: a retry, a large output, a parallel group, a sub-run, an agent, a loop."""


def always_fails(ctx: StepContext) -> str:
    """Fails every attempt."""
    _ledger("task", ctx.run_id, f"{ctx.step_path}#{ctx.attempt}")
    raise ValueError("this step always fails")


FAILING_WORKFLOW = Workflow(
    "t_failing",
    version="1",
    steps=[
        task("a", step_a),
        task("doomed", always_fails, retry=RetryPolicy(max_attempts=2, initial_backoff_s=0.01)),
    ],
)
"""a -> doomed, which gives up after two attempts: the run fails."""


FAILING_PARENT_WORKFLOW = Workflow(
    "t_failing_parent",
    version="1",
    steps=[
        task("a", step_a),
        subworkflow(
            "sub", FAILING_WORKFLOW, retry=RetryPolicy(max_attempts=2, initial_backoff_s=0.01)
        ),
    ],
)
"""a -> a sub-run of :data:`FAILING_WORKFLOW`, retried once: the sub-run and the run fail."""


def forever(ctx: StepContext) -> str:
    """Always loop back."""
    _ledger("task", ctx.run_id, ctx.step_path)
    return "a"


LOOPING_WORKFLOW = Workflow(
    "t_looping",
    version="1",
    steps=[task("a", step_a, max_visits=2), decision("loop", forever, max_visits=5)],
)
"""a <-> loop, until a's third visit exceeds its max_visits: the run fails."""


def no_branches(ctx: StepContext) -> list[str]:
    """A branches function that fails."""
    raise ValueError("the branch set cannot be computed")


def nowhere(ctx: StepContext) -> str:
    """A decision returning a step id the workflow does not have."""
    return "nowhere"


BAD_WORKFLOWS = (
    Workflow(
        "t_bad_branches",
        version="1",
        steps=[task("a", step_a), parallel("check", branches=no_branches, step=task("b", lint))],
    ),
    Workflow("t_bad_target", version="1", steps=[task("a", step_a), decision("route", nowhere)]),
)
"""Workflows whose parallel group's branches function fails / whose decision jumps nowhere."""


# ------------------------------------------------------------ an orchestrator

CRASH_IN_ITEM_ENV = "LITTLE_ES_TEST_CRASH_IN_ITEM"


async def item(ctx: StepContext) -> dict[str, Any]:
    """A sub-run's only step; with ``LITTLE_ES_TEST_CRASH_IN_ITEM=n`` item n kills the process,
    a second after the others started (so they finish first)."""
    _ledger("item", ctx.run_id, ctx.input["n"])
    if os.environ.get(CRASH_IN_ITEM_ENV) == str(ctx.input["n"]):
        await asyncio.sleep(1.0)
        os.kill(os.getpid(), signal.SIGKILL)
    return {"n": ctx.input["n"], "squared": ctx.input["n"] ** 2}


ITEM_WORKFLOW = Workflow("t_item", version="1", steps=[task("work", item)])


def _orchestrate(request: ModelRequest) -> ScriptedReply:
    turn = 1 + sum(1 for m in request.messages if m.role == "assistant")
    _ledger("model", _run_of(request), turn)
    if turn == 1:
        found = re.search(r"Fan out (\d+)", request.messages[-1].content or "")
        count = int(found.group(1)) if found else 1
        calls = tuple(
            ToolCall(
                id=f"w{i}",
                name="start_workflow",
                arguments={"workflow_id": "t_item", "input": {"n": i}},
            )
            for i in range(count)
        )
        return ScriptedReply(content="fanning out", tool_calls=calls)
    results = [m.content for m in request.messages if m.role == "tool"]
    return ScriptedReply(content=f"{len(results)} sub-runs: " + " | ".join(map(str, results)))


def orchestrate_prompt(ctx: StepContext) -> str:
    """How many sub-runs to start."""
    return f"[run {ctx.run_id}] Fan out {ctx.input['count']}"


ORCHESTRATOR_WORKFLOW = Workflow(
    "t_orchestrator",
    version="1",
    steps=[
        agent(
            "plan",
            model=ScriptedModel(respond=_orchestrate, provider="openai", model_id="gpt-4o-mini"),
            tools=[start_workflow_tool([ITEM_WORKFLOW], max_concurrency=1)],
            prompt=orchestrate_prompt,
        )
    ],
)
"""An agent that starts ``input["count"]`` sub-runs of :data:`ITEM_WORKFLOW` in one turn
(one at a time on the local engine, as child workflows on Temporal), then sums them up."""


def fan_items(ctx: StepContext) -> dict[str, int]:
    """One branch per item: ``input["count"]`` of them."""
    return {str(n): n for n in range(int(ctx.input["count"]))}


def fan_item_input(ctx: StepContext) -> dict[str, Any]:
    """A branch's sub-run input: its item number."""
    return {"n": ctx.branch_value}


FAN_WORKFLOW = Workflow(
    "t_fan",
    version="1",
    steps=[
        parallel(
            "fan",
            branches=fan_items,
            step=subworkflow("one", ITEM_WORKFLOW, input=fan_item_input),
        )
    ],
)
"""A parallel group of ``input["count"]`` subworkflow steps, each a sub-run of
:data:`ITEM_WORKFLOW` (a child workflow on Temporal)."""


LOOP_WORKFLOW = improve
"""The cycles' workflow of the outer-loop tests' loop (``tests/_outer_loop_proc.py``)."""
LOOP_PLANNER_WORKFLOW = make_planner("v1").workflow
"""That loop's planner's workflow: the workers run each cycle's two runs."""

WORKFLOWS: dict[str, Workflow] = {
    w.id: w
    for w in (
        LOOP_WORKFLOW,
        LOOP_PLANNER_WORKFLOW,
        AGENT_WORKFLOW,
        GATED_WORKFLOW,
        MIXED_WORKFLOW,
        FAILING_WORKFLOW,
        FAILING_PARENT_WORKFLOW,
        LOOPING_WORKFLOW,
        *BAD_WORKFLOWS,
        ORCHESTRATOR_WORKFLOW,
        FAN_WORKFLOW,
    )
}


# ---------------------------------------------------------------- entry points


async def _serve(args: argparse.Namespace) -> None:
    from little_es_temporal import connect, create_worker

    from little_es.world import open_world

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    with open_world(args.world) as world:
        client = await connect(args.address)
        worker = create_worker(
            client,
            world,
            workflows=list(WORKFLOWS.values()),
            task_queue=args.task_queue,
            sticky_queue_schedule_to_start_timeout=timedelta(seconds=args.sticky_timeout),
            identity=f"test-worker-{os.getpid()}",
        )
        async with worker:
            sys.stdout.write(READY + "\n")
            sys.stdout.flush()
            await stop.wait()


async def _local(args: argparse.Namespace) -> None:
    from little_es.engine.local import run_workflow
    from little_es.world import open_world

    with open_world(args.world) as world:
        result = await run_workflow(
            world, WORKFLOWS[args.workflow], orjson.loads(args.input), run_id=args.run_id
        )
    sys.stdout.write(RESULT_PREFIX + orjson.dumps(result.output).decode() + "\n")


def main(argv: list[str]) -> None:
    """Parse ``argv`` and run the ``worker`` or ``local`` command."""
    parser = argparse.ArgumentParser(prog="_temporal_worker_proc")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("worker")
    serve.add_argument("--address", required=True)
    serve.add_argument("--task-queue", required=True)
    serve.add_argument("--world", required=True)
    serve.add_argument("--ledger", required=True)
    serve.add_argument("--sticky-timeout", type=float, default=1.0)
    local = sub.add_parser("local")
    local.add_argument("--world", required=True)
    local.add_argument("--ledger", required=True)
    local.add_argument("--workflow", required=True, choices=sorted(WORKFLOWS))
    local.add_argument("--run-id", required=True)
    local.add_argument("--input", default="{}")
    args = parser.parse_args(argv)
    os.environ[LEDGER_ENV] = args.ledger
    asyncio.run(_serve(args) if args.command == "worker" else _local(args))


if __name__ == "__main__":
    # Re-import under the module's own name: the workflows' IR names their
    # functions as module:qualname, and the tests import this module by name.
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import _temporal_worker_proc

    _temporal_worker_proc.main(sys.argv[1:])

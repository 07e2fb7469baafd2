"""The mixed workflow the torture suite kills, built around one ledger.

``torture`` (the run under test), in order:

* ``prepare`` - a task;
* ``flaky`` - a task whose first attempt fails (``RetryPolicy(max_attempts=2)``), so a
  recorded ``StepFailed`` is something a resume must not run again either;
* ``fan`` - a parallel group of six ``work`` branches, at most two at once;
* ``refine`` / ``judge`` - a decision loop: ``judge`` jumps back to ``refine`` until its
  third visit;
* ``research`` - an agent step (a priced model) making three tool calls in its first turn
  (run concurrently) and two in its second;
* ``orchestrate`` - an orchestrator agent starting three ``torture_sub`` sub-runs through
  ``start_workflow``, at most two at once;
* ``nested`` - a subworkflow step running ``torture_nested``;
* ``big`` - a task whose output (80 KiB) is stored as an artifact;
* ``approve`` - a ``wait_for`` step: the run stops (the child exits, see
  :data:`tests.torture.child.WAITING_EXIT_CODE`) until the driver signals it
  (:data:`APPROVAL`), through ``World.signal`` or ``little signal``;
* ``finish`` - a task gathering the outputs.

Every step body, model call and tool call appends its :class:`~tests.torture.ledger.Item`
to the ledger before it returns (a failing attempt: before it raises); the async ones
then yield for a few milliseconds, so that kills find items that ran but whose result
is not committed yet (the ones a resume must execute again, once). Nothing here
depends on the run id, so two runs of it end in the same state but for their ids.

``torture_loop`` (:func:`build_loop`) is the outer loop of the suite: a planner
(:class:`LedgeredPlanner`, one model call per cycle) that runs ``torture_sub`` with
``{"n": 1}``, then ``{"n": 2}``, and says done in the third cycle.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Mapping

import orjson
from pydantic import BaseModel, ConfigDict

from little_es import (
    Model,
    ModelRequest,
    ModelResponse,
    Planner,
    RetryPolicy,
    ScriptedModel,
    ScriptedReply,
    StepContext,
    Tool,
    ToolCall,
    ToolContext,
    Usage,
    Workflow,
    agent,
    decision,
    parallel,
    start_workflow_tool,
    subworkflow,
    task,
    tool,
    wait_for,
)
from tests.torture.ledger import Ledger, model_item, step_item, tool_item

WORKFLOW_ID = "torture"
SUB_WORKFLOW_ID = "torture_sub"
NESTED_WORKFLOW_ID = "torture_nested"
RUN_INPUT: Mapping[str, object] = {"branches": 6, "sub_runs": 3}
BIG_OUTPUT_BYTES = 80 * 1024
"""Over the 64 KiB above which a step output is stored as an artifact."""
WAIT_STEP = "approve"
"""The ``wait_for`` step; its signal has the same name."""
SIGNAL_ID = "torture-approve"
"""The id every signal of the suite is sent with (the state records it)."""
LOOP_CYCLES = 3
"""The torture loop's cycles: two runs, and the planner says done in the third."""
BUGGY_STEP = "prepare"
"""The step the deliberate bug of :mod:`tests.torture.child` runs again after it completed."""

JSONDict = dict[str, object]


class TortureApproval(BaseModel):
    """The data of the ``approve`` signal (importable, so ``little signal`` validates it)."""

    model_config = ConfigDict(extra="forbid")

    approved: bool
    by: str


APPROVAL: Mapping[str, object] = {"approved": True, "by": "torture driver"}
"""What the driver signals, and so the ``approve`` step's output."""


def _turn(request: ModelRequest) -> int:
    return 1 + sum(1 for m in request.messages if m.role == "assistant")


def _tool_results(request: ModelRequest) -> list[object]:
    return [orjson.loads(m.content or "null") for m in request.messages if m.role == "tool"]


class LedgeredModel:
    """A :class:`~little_es.Model` that appends each real call to the ledger, then answers.

    It names its calls by (run id, agent step path, turn): the model protocol does not
    tell a model its session, and the checker maps sessions to steps from the log.
    """

    def __init__(self, inner: ScriptedModel, ledger: Ledger, run_id: str, step_path: str) -> None:
        self._inner = inner
        self._ledger = ledger
        self._run_id = run_id
        self._step_path = step_path

    @property
    def provider(self) -> str:
        """The wrapped model's provider."""
        return self._inner.provider

    @property
    def model_id(self) -> str:
        """The wrapped model's id."""
        return self._inner.model_id

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """The scripted answer, after its ledger line is durable."""
        response = await self._inner.complete(request)
        self._ledger.append(model_item(self._run_id, self._step_path, _turn(request)))
        await asyncio.sleep(0.002)
        return response


def _research_reply(request: ModelRequest) -> ScriptedReply:
    turn = _turn(request)
    usage = Usage(input_tokens=1000 * turn, output_tokens=50 + turn, cached_input_tokens=100)
    calls: tuple[ToolCall, ...]
    if turn == 1:
        calls = (
            ToolCall(id="r1", name="lookup", arguments={"key": "alpha"}),
            ToolCall(id="r2", name="lookup", arguments={"key": "beta"}),
            ToolCall(id="r3", name="measure", arguments={"n": 3}),
        )
        return ScriptedReply(tool_calls=calls, usage=usage)
    if turn == 2:
        calls = (
            ToolCall(id="r4", name="lookup", arguments={"key": "gamma"}),
            ToolCall(id="r5", name="measure", arguments={"n": 5}),
        )
        return ScriptedReply(tool_calls=calls, usage=usage)
    return ScriptedReply(content=orjson.dumps(_tool_results(request)).decode(), usage=usage)


def _orchestrate_reply(request: ModelRequest) -> ScriptedReply:
    turn = _turn(request)
    usage = Usage(input_tokens=300 * turn, output_tokens=20)
    if turn == 1:
        calls = tuple(
            ToolCall(
                id=f"s{i}",
                name="start_workflow",
                arguments={"workflow_id": SUB_WORKFLOW_ID, "input": {"n": i}},
            )
            for i in range(1, 4)
        )
        return ScriptedReply(tool_calls=calls, usage=usage)
    # The sub-run ids in the results depend on the run id: keep only the outputs.
    outputs = [r.get("output") if isinstance(r, dict) else r for r in _tool_results(request)]
    return ScriptedReply(content=orjson.dumps(sorted(map(str, outputs))).decode(), usage=usage)


def _tools(ledger: Ledger) -> list[Tool]:
    @tool
    async def lookup(key: str, ctx: ToolContext) -> JSONDict:
        """Look a key up."""
        ledger.append(tool_item(ctx.run_id, ctx.session_id, ctx.call_id))
        await asyncio.sleep(0.002)
        return {"key": key, "value": hashlib.sha256(key.encode()).hexdigest()[:12]}

    @tool
    async def measure(n: int, ctx: ToolContext) -> JSONDict:
        """Measure something n big."""
        ledger.append(tool_item(ctx.run_id, ctx.session_id, ctx.call_id))
        await asyncio.sleep(0.002)
        return {"n": n, "square": n * n}

    return [lookup, measure]


def _step(ledger: Ledger, ctx: StepContext) -> None:
    ledger.append(step_item(ctx.run_id, ctx.step_path, ctx.attempt))


def build_workflows(ledger: Ledger, run_id: str) -> tuple[Workflow, Workflow, Workflow]:
    """``(torture, torture_sub, torture_nested)``, each body writing to ``ledger``.

    ``run_id`` is the run the models are built for (only their ledger lines name it).
    """

    async def fetch(ctx: StepContext) -> JSONDict:
        _step(ledger, ctx)
        await asyncio.sleep(0.002)
        return {"value": 10 * int(ctx.input["n"])}

    async def compute(ctx: StepContext) -> int:
        _step(ledger, ctx)
        await asyncio.sleep(0.002)
        return int(ctx.outputs["fetch"]["value"]) + 1

    sub = Workflow(
        SUB_WORKFLOW_ID, version="1", steps=[task("fetch", fetch), task("compute", compute)]
    )

    def alpha(ctx: StepContext) -> JSONDict:
        _step(ledger, ctx)
        return {"alpha": ctx.input["seed"]}

    async def beta(ctx: StepContext) -> JSONDict:
        _step(ledger, ctx)
        await asyncio.sleep(0.002)
        return {"beta": int(ctx.outputs["alpha"]["alpha"]) * 2}

    nested = Workflow(
        NESTED_WORKFLOW_ID, version="1", steps=[task("alpha", alpha), task("beta", beta)]
    )

    def prepare(ctx: StepContext) -> JSONDict:
        _step(ledger, ctx)
        return {"keys": [f"b{i}" for i in range(int(ctx.input["branches"]))]}

    def flaky(ctx: StepContext) -> JSONDict:
        _step(ledger, ctx)
        if ctx.attempt == 1:
            raise RuntimeError("the first attempt of flaky always fails")
        return {"attempt": ctx.attempt}

    def branches(ctx: StepContext) -> list[str]:
        return list(ctx.outputs["prepare"]["keys"])

    async def work(ctx: StepContext) -> JSONDict:
        _step(ledger, ctx)
        await asyncio.sleep(0.003)
        return {"branch": ctx.branch_key, "len": len(str(ctx.branch_key))}

    def refine(ctx: StepContext) -> JSONDict:
        _step(ledger, ctx)
        return {"visit": ctx.visit}

    def judge(ctx: StepContext) -> str:
        _step(ledger, ctx)
        return "refine" if ctx.visit < 3 else "research"

    def big(ctx: StepContext) -> JSONDict:
        _step(ledger, ctx)
        chunk = hashlib.sha256(b"torture").hexdigest()
        return {"blob": (chunk * (BIG_OUTPUT_BYTES // len(chunk) + 1))[:BIG_OUTPUT_BYTES]}

    def finish(ctx: StepContext) -> JSONDict:
        _step(ledger, ctx)
        out = ctx.outputs
        return {
            "fan": sorted(out["fan"]),
            "refine": out["refine"]["visit"],
            "research": out["research"],
            "orchestrate": out["orchestrate"],
            "nested": out["nested"],
            "big": len(out["big"]["blob"]),
            "approve": out[WAIT_STEP],
        }

    research_model = ScriptedModel(
        respond=_research_reply, provider="openai", model_id="gpt-4o-mini"
    )
    orchestrator_model = ScriptedModel(
        respond=_orchestrate_reply, provider="openai", model_id="gpt-4o-mini"
    )
    research: Model = LedgeredModel(research_model, ledger, run_id, "research")
    orchestrator: Model = LedgeredModel(orchestrator_model, ledger, run_id, "orchestrate")

    main = Workflow(
        WORKFLOW_ID,
        version="1",
        steps=[
            task("prepare", prepare),
            task("flaky", flaky, retry=RetryPolicy(max_attempts=2, initial_backoff_s=0.01)),
            parallel("fan", branches=branches, step=task("work", work), max_concurrency=2),
            task("refine", refine, max_visits=3),
            decision("judge", judge, max_visits=3),
            agent(
                "research",
                model=research,
                tools=_tools(ledger),
                prompt="Look up alpha, beta and gamma, measure 3 and 5, report.",
                max_turns=5,
            ),
            agent(
                "orchestrate",
                model=orchestrator,
                tools=[start_workflow_tool([sub], max_concurrency=2)],
                prompt="Start three torture_sub sub-runs and report their outputs.",
                max_turns=3,
            ),
            subworkflow("nested", nested, input=lambda ctx: {"seed": 21}),
            task("big", big),
            wait_for(WAIT_STEP, model=TortureApproval),
            task("finish", finish),
        ],
    )
    return main, sub, nested


def _loop_context(request: ModelRequest) -> dict[str, object]:
    text = next(str(m.content) for m in request.messages if m.role == "user")
    context: dict[str, object] = orjson.loads(text.split("(JSON):\n", 1)[1])
    return context


class LedgeredPlanner:
    """The torture loop's planner model: one call per cycle, ledgered as its planner run's.

    The planner run's id is read from the loop context in the prompt (one model serves
    every cycle of the loop); the answer depends on the completed cycles only.
    """

    provider = "openai"
    model_id = "gpt-4o-mini"

    def __init__(self, ledger: Ledger) -> None:
        self._ledger = ledger

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """The decision for the cycle the prompt's context names."""
        context = _loop_context(request)
        cycle = int(str(context["cycle"]))
        planner_run = f"{context['outer_loop_id']}.cycle-{cycle}.plan"
        cycles = context["cycles"]
        assert isinstance(cycles, list)
        done = sum(1 for c in cycles if isinstance(c, dict) and c.get("status") == "completed")
        body: JSONDict
        if done >= LOOP_CYCLES - 1:
            body = {"done": True, "reason": f"{done} cycles are enough"}
        else:
            body = {"done": False, "input": {"n": done + 1}, "reason": f"try n={done + 1}"}
        self._ledger.append(model_item(planner_run, "plan", _turn(request)))
        await asyncio.sleep(0.002)
        return ModelResponse(
            content=orjson.dumps(body).decode(),
            usage=Usage(input_tokens=400, output_tokens=30),
            provider=self.provider,
            model=self.model_id,
        )


def build_loop(ledger: Ledger, run_id: str) -> tuple[Planner, Workflow]:
    """The torture loop's planner and cycle workflow (``torture_sub``), writing to ``ledger``."""
    _, sub, _ = build_workflows(ledger, run_id)
    planner = Planner(model=LedgeredPlanner(ledger), prompt="Plan the next torture_sub cycle.")
    return planner, sub

"""The workflow of ``tests/fixtures/verbose_log.jsonl``: a world written before payloads
left out the fields at their defaults (every field of every event stored, ``null`` and
``[]`` included).

The fixture was written once, by the code of that time, with ``PYTHONPATH=.:tests python
-c 'import _verbose_log as v, asyncio, pathlib; asyncio.run(v.write(pathlib.Path("OUT")))'``
and ``little export --world sqlite:///OUT`` (imported as ``_verbose_log``, as the tests
import it: the module's name is part of the workflow's IR hash); it is kept as it is so
that a change to the codec that would stop today's readers from reading such a log fails
CI. Never regenerate it with newer
code: it would then test nothing. ``tests/fixtures/chained_log.jsonl`` was written the
same way by the code of log format 2 (commit 03df795: field names, ISO timestamps, the
65-byte chain frame), and ``tests/fixtures/compact_log.jsonl`` by the code of log format 3
in eventsourcing's SQLite table layout (commit e1c70af), whose data directory (its
``events.sqlite3`` and ``world.json``) is kept too, as ``tests/fixtures/sqlite_world/``.

Two runs: ``run_verbose_done`` completed; ``run_verbose_half`` failed at ``publish``
(:data:`PUBLISH_FAILS` was set), so a resume runs ``publish`` alone. :data:`CALLS`
counts each step's and tool's real invocations in this process,
``MODEL.calls`` the model's.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from pathlib import Path
from typing import Any

from little_es import END, RetryPolicy, Workflow, agent, decision, parallel, task
from little_es.harness.model import ScriptedModel, ScriptedReply
from little_es.harness.tools import tool
from little_es.values import ToolCall, Usage

DONE_RUN = "run_verbose_done"
HALF_RUN = "run_verbose_half"

CALLS: Counter[str] = Counter()
PUBLISH_FAILS = {"on": False}


def fetch(ctx: Any) -> dict[str, Any]:
    CALLS["fetch"] += 1
    return {"ticket": ctx.input["ticket"], "title": "disk full"}


def lookup(key: str) -> str:
    """Look a key up."""
    CALLS["lookup"] += 1
    return f"value of {key}"


def lint(ctx: Any) -> dict[str, Any]:
    CALLS[f"lint:{ctx.step_path}"] += 1
    return {"path": ctx.step_path, "ok": True}


def review(ctx: Any) -> str:
    CALLS[f"review@{ctx.visit}"] += 1
    return "review" if ctx.visit == 1 else "publish"


def publish(ctx: Any) -> dict[str, Any]:
    CALLS["publish"] += 1
    if PUBLISH_FAILS["on"]:
        raise RuntimeError("the publisher is down")
    return {"published": ctx.outputs["fetch"]["ticket"]}


def finish(ctx: Any) -> str:
    CALLS["finish"] += 1
    return END


MODEL = ScriptedModel(
    responses=[
        ScriptedReply(
            content="looking up",
            tool_calls=(ToolCall(id="c1", name="lookup", arguments={"key": "disk"}),),
            usage=Usage(input_tokens=12, output_tokens=3),
        ),
        ScriptedReply(content="plan: free space", usage=Usage(input_tokens=30, output_tokens=4)),
    ],
    provider="scripted",
    model_id="verbose-1",
)

WORKFLOW = Workflow(
    "verbose_log",
    version="1",
    steps=[
        task("fetch", fetch),
        agent("plan", model=MODEL, prompt="plan the fix", tools=[tool(lookup)]),
        parallel("check", branches=lambda ctx: ["a.py", "b.py"], step=task("lint", lint)),
        decision("review", review, max_visits=2),
        task("publish", publish, retry=RetryPolicy(max_attempts=1)),
        decision("finish", finish),
    ],
)


async def write(directory: Path) -> None:
    from little_es import local_world, run_workflow
    from little_es.errors import RunFailedError

    world = local_world(directory)
    await run_workflow(world, WORKFLOW, {"ticket": 7}, run_id=DONE_RUN)
    PUBLISH_FAILS["on"] = True
    with contextlib.suppress(RunFailedError):
        await run_workflow(world, WORKFLOW, {"ticket": 8}, run_id=HALF_RUN)
    world.close()

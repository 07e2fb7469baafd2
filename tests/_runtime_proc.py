"""Subprocess entry point for the runtime's crash and concurrency tests.

Run as a script (the tests put the repository root on ``PYTHONPATH``)::

    python tests/_runtime_proc.py crash --world sqlite:///DIR --ledger FILE
    python tests/_runtime_proc.py slow --world URL --ledger FILE --sleep 1.5 \
        --ready-file R --go-file G
    python tests/_runtime_proc.py serve

``serve`` is a fork server for tests that start many children: it imports
everything once, then for each JSON request line on stdin
(``{"argv": [...], "crash_after": N or null, "output": path}``) forks a child
process that runs ``main(argv)`` with its stdout and stderr in ``output``, waits
for it, and answers with a JSON line ``{"pid": ..., "returncode": ...}``
(negative: killed by that signal, as with :mod:`subprocess`). Each child is a
real process that starts with nothing but the imported modules, so killing it
is a real crash; only the ~0.7 s of imports per child is saved.

It runs (or resumes) the run :data:`RUN_ID` of one workflow and prints one line
``RESULT {"output": ..., "steps_executed": ..., "resumed": ...}``; when another
process holds the run it prints ``CONCURRENT_RUN_ERROR <message>`` and exits
with :data:`CONCURRENT_EXIT_CODE`. Set ``LITTLE_ES_CRASH_AFTER_APPENDS=N`` in
its environment to have it SIGKILLed right after its Nth append.

Every step function first appends one line ``pid run_id step_path attempt`` to
the ledger (one ``O_APPEND`` write: it is in the file before the process can be
killed, and lines of concurrent processes never interleave), so the ledger
counts real executions, which the tests compare with the log.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

import orjson

from little_es.engine.local import run_workflow
from little_es.errors import ConcurrentRunError
from little_es.faults import CRASH_AFTER_APPENDS
from little_es.workflow.authoring import Workflow, decision, parallel, subworkflow, task
from little_es.workflow.context import StepContext
from little_es.workflow.ir import RetryPolicy
from little_es.world import open_world

RUN_ID = "run_proc"
"""The run every invocation drives."""

INPUT = {"files": ["a.py", "b.py", "c.py"]}
"""The run input of both workflows."""

CONCURRENT_EXIT_CODE = 3
"""The exit code when another process holds the run."""

RESULT_PREFIX = "RESULT "
"""Starts the line that reports a finished run."""

CONCURRENT_MARKER = "CONCURRENT_RUN_ERROR"
"""Starts the line that reports a refusal because another process holds the run."""

_ledger: Path | None = None
_sleep_s = 0.0


def _record(ctx: StepContext) -> None:
    assert _ledger is not None
    line = f"{os.getpid()} {ctx.run_id} {ctx.step_path} {ctx.attempt}\n".encode()
    fd = os.open(_ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


# ------------------------------------------------------------ the crash workflow


def _fetch(ctx: StepContext) -> dict[str, Any]:
    _record(ctx)
    return {"files": list(ctx.input["files"])}


async def _lint(ctx: StepContext) -> str:
    _record(ctx)
    await asyncio.sleep(0)
    return f"ok:{ctx.branch_value}"


def _flaky(ctx: StepContext) -> int:
    _record(ctx)
    if ctx.attempt == 1:
        raise RuntimeError("the first attempt always fails")
    return ctx.attempt


def _prep(ctx: StepContext) -> int:
    _record(ctx)
    return int(ctx.input["n"]) * 10


def _finish(ctx: StepContext) -> dict[str, Any]:
    _record(ctx)
    return {"total": ctx.outputs["prep"] + 1}


def _sub_input(ctx: StepContext) -> dict[str, Any]:
    return {"n": len(ctx.outputs["check"])}


def _draft(ctx: StepContext) -> dict[str, Any]:
    _record(ctx)
    return {"draft": ctx.visit}


def _review(ctx: StepContext) -> str:
    _record(ctx)
    return "draft" if ctx.visit < 2 else "publish"


def _publish(ctx: StepContext) -> dict[str, Any]:
    _record(ctx)
    return {
        "draft": ctx.outputs["draft"]["draft"],
        "lint": dict(ctx.outputs["check"]),
        "flaky": ctx.outputs["flaky"],
        "sub": ctx.outputs["sub"],
    }


def _files(ctx: StepContext) -> list[str]:
    return list(ctx.outputs["fetch"]["files"])


CHILD = Workflow("proc-child", steps=[task("prep", _prep), task("finish", _finish)])
"""The sub-workflow of the crash workflow."""

CRASH_WORKFLOW = Workflow(
    "proc-crash",
    steps=[
        task("fetch", _fetch),
        parallel("check", branches=_files, step=task("lint", _lint), max_concurrency=2),
        task("flaky", _flaky, retry=RetryPolicy(max_attempts=2)),
        subworkflow("sub", CHILD, input=_sub_input),
        task("draft", _draft, max_visits=2),
        decision("review", _review, max_visits=2),
        task("publish", _publish),
    ],
)
"""Tasks, a parallel group, a retried step, a sub-run and a decision loop."""


# ------------------------------------------------------------- the slow workflow


def _first(ctx: StepContext) -> str:
    _record(ctx)
    return "first"


def _slow(ctx: StepContext) -> str:
    _record(ctx)
    time.sleep(_sleep_s)
    return "slow"


def _last(ctx: StepContext) -> str:
    _record(ctx)
    return "last"


SLOW_WORKFLOW = Workflow(
    "proc-slow", steps=[task("first", _first), task("slow", _slow), task("last", _last)]
)
"""Three steps; the middle one sleeps ``--sleep`` seconds to hold the run."""

_WORKFLOWS = {"crash": CRASH_WORKFLOW, "slow": SLOW_WORKFLOW}


def _wait_for(path: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"gave up waiting for {path}")
        time.sleep(0.005)


def _serve() -> int:
    """The fork server loop (see the module docstring); returns at end of input."""
    for line in sys.stdin:
        request = orjson.loads(line)
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:  # the child: never return into the server loop
            code = 1
            try:
                os.environ.pop(CRASH_AFTER_APPENDS, None)
                if request["crash_after"] is not None:
                    os.environ[CRASH_AFTER_APPENDS] = str(request["crash_after"])
                fd = os.open(request["output"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                os.dup2(fd, 1)
                os.dup2(fd, 2)
                os.close(fd)
                code = main(list(request["argv"]))
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
            except BaseException:
                import traceback

                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        reply = {"pid": pid, "returncode": os.waitstatus_to_exitcode(status)}
        sys.stdout.write(orjson.dumps(reply).decode() + "\n")
        sys.stdout.flush()
    return 0


def main(argv: list[str]) -> int:
    """Parse ``argv``, drive the run, print the outcome; return the exit code."""
    global _ledger, _sleep_s
    parser = argparse.ArgumentParser()
    parser.add_argument("workflow", choices=sorted(_WORKFLOWS))
    parser.add_argument("--world", required=True)
    parser.add_argument("--ledger", required=True, type=Path)
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--ready-file", type=Path)
    parser.add_argument("--go-file", type=Path)
    args = parser.parse_args(argv)
    _ledger = args.ledger
    _sleep_s = args.sleep
    with open_world(args.world) as world:
        if args.ready_file is not None:
            # A barrier, so that two processes call run_workflow at the same moment.
            args.ready_file.touch()
            assert args.go_file is not None
            _wait_for(args.go_file, 30.0)
        try:
            result = asyncio.run(
                run_workflow(world, _WORKFLOWS[args.workflow], INPUT, run_id=RUN_ID)
            )
        except ConcurrentRunError as exc:
            print(CONCURRENT_MARKER, exc, flush=True)
            return CONCURRENT_EXIT_CODE
    summary = {
        "output": result.output,
        "steps_executed": result.steps_executed,
        "resumed": result.resumed,
    }
    print(RESULT_PREFIX + orjson.dumps(summary).decode(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_serve() if sys.argv[1:] == ["serve"] else main(sys.argv[1:]))

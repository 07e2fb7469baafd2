"""Crash runner: kill a workflow for real at an append boundary, then resume it.

A crash test runs the code under test in a child process that is SIGKILLed
right after its Nth committed append (or the append of a chosen event, see
:mod:`little_es.faults`), then resumes the run in another child and checks the
log, the state and the side effects. :class:`CrashRunner` makes that cheap:

::

    with CrashRunner(pythonpath=[project_dir]) as runner:
        killed = runner.run_workflow(
            "flows:triage", world=url, run_id="run_1", input={"n": 1}, crash_after_appends=4
        )
        assert killed.killed
        done = runner.run_workflow("flows:triage", world=url, run_id="run_1")
        assert done.result()["resumed"] is True

It starts one *fork server* (``python -m little_es.testing serve``): a
process that imports everything once and then, for each request, forks a
fresh child, which runs a target function with its stdout and stderr in a
file, and reports how it ended. Each child is a real process that starts with
nothing but the imported modules, so killing it is a real crash: no
``finally`` block, no atexit handler and no buffered write runs after it. Only
the imports (~0.7 s per child) are saved.

A target is ``module:function`` where ``function(argv: list[str]) -> int``
returns the exit code. :func:`workflow_main` is the target
:meth:`CrashRunner.run_workflow` uses: it runs (or resumes) one run of a
workflow and prints its outcome in one line (:func:`drive`).

The fork server needs ``os.fork`` (Linux, macOS).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import os
import signal
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, cast

import orjson

from little_es.cli.run import load_workflow
from little_es.engine.local import run_workflow
from little_es.errors import ConcurrentRunError
from little_es.faults import CRASH_AFTER_APPENDS, CRASH_AFTER_EVENT, appends
from little_es.values import JSONValue
from little_es.workflow.authoring import Workflow
from little_es.world import World, open_world

__all__ = [
    "CONCURRENT_EXIT_CODE",
    "CONCURRENT_MARKER",
    "RESULT_PREFIX",
    "ChildResult",
    "CrashRunner",
    "drive",
    "main",
    "serve",
    "workflow_main",
]

RESULT_PREFIX = "RESULT "
"""Starts the line :func:`drive` prints for a finished run."""

CONCURRENT_MARKER = "CONCURRENT_RUN_ERROR"
"""Starts the line :func:`drive` prints when another process holds the run."""

CONCURRENT_EXIT_CODE = 3
"""The exit code of :func:`drive` when another process holds the run."""

_CRASH_VARIABLES = (CRASH_AFTER_APPENDS, CRASH_AFTER_EVENT)


@dataclass(frozen=True)
class ChildResult:
    """How one child process ended, and what it printed."""

    pid: int
    returncode: int
    """The exit code; negative when a signal killed it (``-9``: SIGKILL), as in subprocess."""
    output: str
    """Its stdout and stderr, interleaved."""

    @property
    def killed(self) -> bool:
        """Whether the child was SIGKILLed (the planned crash, when one was asked for)."""
        return self.returncode == -signal.SIGKILL

    def result(self) -> dict[str, Any]:
        """The outcome :func:`drive` printed: ``{"output", "steps_executed", "resumed",
        "appends"}``.

        Raises :class:`AssertionError`, with the child's output, unless the
        child exited 0 and printed exactly one result line.
        """
        if self.returncode != 0:
            raise AssertionError(f"child failed ({self.returncode}):\n{self.output}")
        lines = [line for line in self.output.splitlines() if line.startswith(RESULT_PREFIX)]
        if len(lines) != 1:
            raise AssertionError(f"expected one {RESULT_PREFIX!r} line:\n{self.output}")
        return cast(dict[str, Any], orjson.loads(lines[0].removeprefix(RESULT_PREFIX)))


class CrashRunner:
    """A fork server and the client that sends it one child to run at a time.

    ``pythonpath`` entries are put in front of ``PYTHONPATH`` (where the
    targets and their workflows are imported from), ``cwd`` is the server's
    working directory, ``env`` is added to its environment (the
    ``LITTLE_ES_CRASH_*`` variables of this process are not passed on), and
    ``preload`` modules are imported before the first fork. A runner is not
    thread-safe: use one per thread, as a pool.
    """

    def __init__(
        self,
        *,
        pythonpath: Sequence[str | Path] = (),
        cwd: str | Path | None = None,
        env: Mapping[str, str] | None = None,
        preload: Sequence[str] = (),
    ) -> None:
        environ = {k: v for k, v in os.environ.items() if k not in _CRASH_VARIABLES}
        environ.update(env or {})
        paths = [str(p) for p in pythonpath]
        environ["PYTHONPATH"] = os.pathsep.join(filter(None, [*paths, environ.get("PYTHONPATH")]))
        self._outputs = tempfile.TemporaryDirectory(prefix="little-es-crash-")
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "little_es.testing", "serve", *preload],
            env=environ,
            cwd=cwd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self._seq = 0

    def run(
        self,
        target: str,
        argv: Sequence[str] = (),
        *,
        crash_after_appends: int | None = None,
        crash_after_event: str | None = None,
        env: Mapping[str, str] | None = None,
        output: str | Path | None = None,
    ) -> ChildResult:
        """Run ``target(argv)`` in a fresh child, to its end or its planned kill.

        ``crash_after_appends`` / ``crash_after_event`` set the fault switches
        of :mod:`little_es.faults` in the child; ``env`` adds variables to its
        environment. Its output goes to ``output`` (default: a file of the
        runner's own temporary directory) and is returned.
        """
        stdin, stdout = self._proc.stdin, self._proc.stdout
        if stdin is None or stdout is None or self._proc.poll() is not None:
            raise RuntimeError("the fork server is not running")
        self._seq += 1
        out = Path(output) if output is not None else Path(self._outputs.name) / f"{self._seq}.out"
        child_env = dict(env or {})
        if crash_after_appends is not None:
            child_env[CRASH_AFTER_APPENDS] = str(crash_after_appends)
        if crash_after_event is not None:
            child_env[CRASH_AFTER_EVENT] = crash_after_event
        request = {"target": target, "argv": list(argv), "env": child_env, "output": str(out)}
        stdin.write(orjson.dumps(request).decode() + "\n")
        stdin.flush()
        reply = stdout.readline()
        if not reply:
            raise RuntimeError("the fork server died")
        answer = orjson.loads(reply)
        text = out.read_text() if out.exists() else ""
        return ChildResult(int(answer["pid"]), int(answer["returncode"]), text)

    def run_workflow(
        self,
        workflow: str,
        *,
        world: str,
        run_id: str,
        input: JSONValue = None,
        crash_after_appends: int | None = None,
        crash_after_event: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> ChildResult:
        """Run (or resume) ``run_id`` of the workflow ``module:attribute`` in the world ``world``.

        The child runs :func:`workflow_main`; :meth:`ChildResult.result` reads
        its outcome. Pass ``input`` only to start the run (a resume reads it
        from the log).
        """
        argv = ["--workflow", workflow, "--world", world, "--run-id", run_id]
        if input is not None:
            argv += ["--input", orjson.dumps(input).decode()]
        return self.run(
            "little_es.testing.crash:workflow_main",
            argv,
            crash_after_appends=crash_after_appends,
            crash_after_event=crash_after_event,
            env=env,
        )

    def close(self) -> None:
        """End the server (it exits at the end of its input) and wait for it."""
        if self._proc.stdin is not None and not self._proc.stdin.closed:
            self._proc.stdin.close()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        if self._proc.stdout is not None:
            self._proc.stdout.close()
        self._outputs.cleanup()

    def __enter__(self) -> CrashRunner:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def drive(world: World, workflow: Workflow, input: JSONValue, run_id: str) -> int:
    """Run (or resume) ``run_id`` of ``workflow`` and print its outcome in one line.

    Prints ``RESULT {"output": ..., "steps_executed": ..., "resumed": ..., "appends": ...}``
    (``appends``: the append transactions the process committed, :func:`little_es.faults.appends`,
    the kill points of ``crash_after_appends``) and
    returns 0; when another process holds the run, prints
    ``CONCURRENT_RUN_ERROR <message>`` and returns :data:`CONCURRENT_EXIT_CODE`.
    Any other error propagates.
    """
    try:
        result = asyncio.run(run_workflow(world, workflow, input, run_id=run_id))
    except ConcurrentRunError as exc:
        print(CONCURRENT_MARKER, exc, flush=True)
        return CONCURRENT_EXIT_CODE
    summary = {
        "output": result.output,
        "steps_executed": result.steps_executed,
        "resumed": result.resumed,
        "appends": appends(),
    }
    print(RESULT_PREFIX + orjson.dumps(summary).decode(), flush=True)
    return 0


def workflow_main(argv: list[str]) -> int:
    """``--workflow module:attribute --world URL --run-id ID [--input JSON]``: :func:`drive` it."""
    parser = argparse.ArgumentParser(prog="little_es.testing.crash:workflow_main")
    parser.add_argument("--workflow", required=True)
    parser.add_argument("--world", required=True)
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--input", default=None)
    args = parser.parse_args(argv)
    workflow = load_workflow(args.workflow)
    data = None if args.input is None else orjson.loads(args.input)
    with open_world(args.world) as world:
        return drive(world, workflow, data, args.run_id)


def _target(ref: str) -> Callable[[list[str]], int]:
    module_name, _, attribute = ref.partition(":")
    function = getattr(importlib.import_module(module_name), attribute)
    return cast(Callable[[list[str]], int], function)


def _child(request: Mapping[str, Any], target: Callable[[list[str]], int]) -> None:
    """The forked child: run the target with the request's environment; never return."""
    code = 1
    try:
        for name in _CRASH_VARIABLES:
            os.environ.pop(name, None)
        os.environ.update(request["env"])
        fd = os.open(request["output"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        code = target(list(request["argv"]))
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def serve(preload: Sequence[str] = ()) -> int:
    """The fork server loop: one JSON request per line on stdin, one JSON reply per line.

    A request is ``{"target": "module:function", "argv": [...], "env": {...},
    "output": path}``; the reply ``{"pid": ..., "returncode": ...}``. The
    target's module is imported here, before the fork, so later children
    start with it; a target that cannot be imported is answered with
    ``{"pid": 0, "returncode": 1}`` and its traceback in the output file.
    Returns 0 at the end of the input.
    """
    for name in preload:
        importlib.import_module(name)
    targets: dict[str, Callable[[list[str]], int]] = {}
    for line in sys.stdin:
        request = orjson.loads(line)
        ref = request["target"]
        if ref not in targets:
            try:
                targets[ref] = _target(ref)
            except Exception:
                # A target that cannot be imported fails its request, not the server.
                Path(request["output"]).write_text(traceback.format_exc())
                sys.stdout.write(orjson.dumps({"pid": 0, "returncode": 1}).decode() + "\n")
                sys.stdout.flush()
                continue
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            _child(request, targets[ref])
        _, status = os.waitpid(pid, 0)
        reply = {"pid": pid, "returncode": os.waitstatus_to_exitcode(status)}
        sys.stdout.write(orjson.dumps(reply).decode() + "\n")
        sys.stdout.flush()
    return 0


def main(argv: list[str]) -> int:
    """``python -m little_es.testing serve [MODULE ...]`` or ``run MODULE:FUNCTION [ARG ...]``.

    ``serve`` is the fork server (:func:`serve`, preloading the modules);
    ``run`` runs one target in this process (no fork), for a test that needs
    two children at once.
    """
    if argv[:1] == ["serve"]:
        return serve(argv[1:])
    if len(argv) >= 2 and argv[0] == "run":
        return _target(argv[1])(argv[2:])
    print(
        "usage: python -m little_es.testing serve [MODULE ...]\n"
        "       python -m little_es.testing run MODULE:FUNCTION [ARG ...]",
        file=sys.stderr,
    )
    return 2

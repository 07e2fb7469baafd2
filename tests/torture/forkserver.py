"""A fork server: one interpreter that has imported everything forks each torture process.

A fresh interpreter spends ~0.6 s importing before the run does anything (~0.15 s of
work): forking a process that has already imported :mod:`tests.torture.child` makes a
kill several times cheaper, so more of them fit in the same time. The forked process is
a process of its own like any other: it opens its own world, writes its own log, and
dies by a real SIGKILL. Nothing in this process opens a world or saves an event, so
nothing of the kind is inherited (``LITTLE_ES_CRASH_*`` is read at a process's first
save, after the fork).

Protocol, one JSON object per line on stdin, one reply per line on stdout:
``{"op": "spawn", "argv": [...], "env": {...}, "out": PATH}`` -> ``{"pid": N}`` (the
child's stdout and stderr go to PATH); ``{"op": "wait", "pid": N, "kill_after": S}`` ->
``{"code": C, "killed": K}``: the exit code (negative: killed by signal ``-C``), the
child SIGKILLed here if it still ran after S seconds (``K``). The kill comes from the
parent, before it reaps the child, so it cannot hit a process that reused the pid.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import traceback

import orjson

from tests.torture import child


def _run_child(argv: list[str], env: dict[str, str], out: str) -> None:
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    os.environ.clear()
    os.environ.update(env)
    code = 0
    try:
        code = child.main(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


def _wait(pid: int, kill_after: float) -> tuple[int, bool]:
    pidfd = os.pidfd_open(pid)
    try:
        ready, _, _ = select.select([pidfd], [], [], kill_after)
    finally:
        os.close(pidfd)
    killed = not ready
    if killed:
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), killed


def main() -> None:
    """Serve spawn and wait requests until stdin closes."""
    requests = sys.stdin.buffer
    replies = sys.stdout.buffer
    for line in requests:
        request = orjson.loads(line)
        if request["op"] == "spawn":
            replies.flush()
            pid = os.fork()
            if pid == 0:
                _run_child(list(request["argv"]), dict(request["env"]), str(request["out"]))
            reply: dict[str, int] = {"pid": pid}
        else:
            code, killed = _wait(int(request["pid"]), float(request["kill_after"]))
            reply = {"code": code, "killed": int(killed)}
        replies.write(orjson.dumps(reply) + b"\n")
        replies.flush()


if __name__ == "__main__":
    main()

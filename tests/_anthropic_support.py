"""A local Anthropic Messages server for the Anthropic tests, and the workflow they run.

The server speaks ``POST /v1/messages`` and answers by turn (one more than the
assistant messages in the request), so a resumed agent asking for turn 2 again gets
turn 2's answer again, and it counts every request it receives per turn: a test can
tell which requests a resume re-sent. With ``hold_turn`` set it receives that turn's
request and never answers it (the test kills the client while it is in flight).
Replies queued in ``replies`` (status, body) are sent first, whatever the turn.

The workflow (``python tests/_anthropic_support.py WORLD_DIR BASE_URL LEDGER``, run by
the kill tests as a child process): one agent step over :class:`AnthropicModel`; turn 1
calls ``lookup`` (``toolu_1``) and ``add`` (``toolu_2``) in parallel, turn 2 calls ``add``
(``toolu_3``), turn 3 answers. Turn 1 writes the prompt cache, turns 2 and 3 read it.
Each real tool invocation appends a line to LEDGER (O_APPEND + fsync) before it returns.
"""

# No `from __future__ import annotations`: the tools' hints must stay real objects.

import json
import os
import sys
import threading
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from little_es import Workflow, agent, tool
from little_es.contrib.anthropic import AnthropicModel
from little_es.harness.tools import ToolContext

RUN_ID = "run_anthropic_kill"
# Priced by genai-prices (claude-3-5-haiku: cache reads, cache writes and input apart).
MODEL = "claude-3-5-haiku-20241022"
API_KEY = "sk-ant-local-test"


def _tool_use(call_id: str, name: str, **args: Any) -> dict[str, Any]:
    return {"type": "tool_use", "id": call_id, "name": name, "input": args}


def script(turn: int) -> tuple[list[dict[str, Any]], str]:
    """The content blocks and stop reason of ``turn``."""
    if turn == 1:
        return [
            {"type": "text", "text": "Looking both up."},
            _tool_use("toolu_1", "lookup", key="alpha"),
            _tool_use("toolu_2", "add", a=1, b=2),
        ], "tool_use"
    if turn == 2:
        return [_tool_use("toolu_3", "add", a=40, b=2)], "tool_use"
    return [{"type": "text", "text": "alpha is 1, 40 + 2 = 42"}], "end_turn"


def usage(turn: int) -> dict[str, Any]:
    """The usage of ``turn``, as Anthropic reports it (cache tokens outside input_tokens)."""
    return {
        "input_tokens": 50 * turn,
        "output_tokens": 10 * turn,
        # Turn 1 writes the 2,000-token prefix to the cache; later turns read it.
        "cache_creation_input_tokens": 2000 if turn == 1 else 0,
        "cache_read_input_tokens": 0 if turn == 1 else 2000,
    }


def message(turn: int, model: str) -> dict[str, Any]:
    """The whole Messages API answer of ``turn``."""
    content, stop = script(turn)
    return {
        "id": f"msg_{turn:03d}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": usage(turn),
    }


@dataclass
class MessagesServer:
    """A Messages endpoint on 127.0.0.1 answering :func:`script` by turn."""

    base_url: str = ""
    hold_turn: int | None = None
    replies: list[tuple[int, dict[str, Any] | bytes]] = field(default_factory=list)
    requests: Counter[int] = field(default_factory=Counter)
    received: list[tuple[str, dict[str, str], dict[str, Any]]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    release: threading.Event = field(default_factory=threading.Event)

    def count(self, turn: int) -> int:
        """How many requests for ``turn`` arrived."""
        with self.lock:
            return self.requests[turn]


def start_server(state: MessagesServer) -> ThreadingHTTPServer:
    """Serve ``state`` on a free port of 127.0.0.1 in a daemon thread; sets ``base_url``."""

    class Handler(BaseHTTPRequestHandler):
        # HTTP/1.0: every connection closes after its response.
        protocol_version = "HTTP/1.0"

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            body = json.loads(self.rfile.read(length))
            turn = 1 + sum(1 for m in body.get("messages", []) if m["role"] == "assistant")
            with state.lock:
                state.requests[turn] += 1
                state.received.append(
                    (self.path, {k.lower(): v for k, v in self.headers.items()}, body)
                )
                queued = state.replies.pop(0) if state.replies else None
            if queued is None and state.hold_turn == turn:
                # In flight until the test kills the client (or the server stops).
                state.release.wait(30)
                return
            if queued is None and self.path != "/v1/messages":
                queued = (404, _error("not_found_error", f"no route {self.path}"))
            status, payload = queued or (200, message(turn, body["model"]))
            # Bytes are sent as they are: a proxy's page that says it is JSON.
            data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
    ).start()
    # The Anthropic client appends /v1/messages itself.
    state.base_url = f"http://127.0.0.1:{server.server_address[1]}"
    return server


def _error(kind: str, text: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": kind, "message": text}}


def error_body(status: int) -> dict[str, Any]:
    """The error body Anthropic sends with ``status``."""
    kinds = {
        400: "invalid_request_error",
        401: "authentication_error",
        403: "permission_error",
        404: "not_found_error",
        413: "request_too_large",
        429: "rate_limit_error",
        500: "api_error",
        529: "overloaded_error",
    }
    return _error(kinds.get(status, "api_error"), f"refused with {status}")


def append_line(path: Path, entry: dict[str, Any]) -> None:
    """One JSON line, appended with O_APPEND and fsynced before returning."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(entry, sort_keys=True) + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def build(model: AnthropicModel, ledger: Path) -> Workflow:
    """The workflow: one agent step over ``model``, with two tools writing to ``ledger``."""

    def lookup(key: str, ctx: ToolContext) -> int:
        """Look a key up."""
        append_line(ledger, {"tool": "lookup", "call": ctx.call_id, "pid": os.getpid()})
        return {"alpha": 1, "beta": 2}.get(key, 0)

    def add(a: int, b: int, ctx: ToolContext) -> int:
        """Add two numbers."""
        append_line(ledger, {"tool": "add", "call": ctx.call_id, "pid": os.getpid()})
        return a + b

    return Workflow(
        "anthropic_kill",
        steps=[
            agent(
                "solve",
                model=model,
                prompt="What is alpha, and 40 + 2?",
                system="Answer with the tools' results.",
                tools=[tool(lookup), tool(add)],
                parameters={"cache_control": {"type": "ephemeral"}},
            )
        ],
    )


async def run(world_dir: str, base_url: str, ledger: str) -> dict[str, Any]:
    """Run (or resume) the workflow; the run's outcome and totals."""
    from little_es import local_world, run_workflow

    model = AnthropicModel(MODEL, base_url=base_url, api_key=API_KEY, max_tokens=1024)
    try:
        with local_world(world_dir) as world:
            result = await run_workflow(world, build(model, Path(ledger)), run_id=RUN_ID)
    finally:
        await model.aclose()
    totals = result.state.usage
    return {
        "status": result.state.status,
        "output": result.output,
        "usage": totals.model_dump(mode="json", exclude={"cost_usd"}),
    }


def main(argv: list[str]) -> int:
    """Run (or resume) the workflow; print its outcome as one JSON line."""
    import asyncio

    print(json.dumps(asyncio.run(run(*argv)), sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

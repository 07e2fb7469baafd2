"""A local chat-completions server for the Pydantic AI tests, and the workflow they run.

The server answers by turn (one more than the assistant messages in the request), so a
resumed agent asking for turn 2 again gets turn 2's answer again, and it counts every
request it receives per turn: a test can tell which requests a resume re-sent. With
``hold_turn`` set it receives that turn's request and never answers it (the test kills
the client while the request is in flight).

The workflow (``python tests/_pydantic_ai_support.py WORLD_DIR BASE_URL LEDGER``, run by
the kill tests as a child process): one Pydantic AI agent step, turn 1 calls ``lookup``
(``c1``) and ``add`` (``c2``) in parallel, turn 2 calls ``add`` (``c3``), turn 3 gives the
structured output through Pydantic AI's output tool. Each real tool invocation appends a
line to LEDGER (O_APPEND + fsync) before it returns.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic_ai import Agent, RunContext
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

from little_es import Workflow
from little_es.contrib.pydantic_ai import pydantic_ai_step

RUN_ID = "run_pydantic_ai_kill"
MODEL = "gpt-4o-mini"


def _call(call_id: str, name: str, **args: Any) -> dict[str, Any]:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(args)},
    }


def script(turn: int, tools: list[str]) -> dict[str, Any]:
    """The assistant message of ``turn``; ``tools`` names the request's tools."""
    if turn == 1:
        return {
            "role": "assistant",
            "content": None,
            "tool_calls": [_call("c1", "lookup", key="alpha"), _call("c2", "add", a=1, b=2)],
        }
    if turn == 2:
        return {"role": "assistant", "content": None, "tool_calls": [_call("c3", "add", a=40, b=2)]}
    final = next(t for t in tools if t.startswith("final_result"))
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [_call("c4", final, answer=42, summary="alpha is 1, 40 + 2 = 42")],
    }


@dataclass
class ChatServer:
    """A chat-completions endpoint on 127.0.0.1 answering :func:`script` by turn."""

    base_url: str = ""
    hold_turn: int | None = None
    status_for_turn: dict[int, int] = field(default_factory=dict)
    """An HTTP error status to answer a turn's requests with (an OpenAI error body)."""
    rate_limited: dict[int, int] = field(default_factory=dict)
    """How many of a turn's first requests to answer with a 429."""
    requests: Counter[int] = field(default_factory=Counter)
    bodies: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    release: threading.Event = field(default_factory=threading.Event)

    def count(self, turn: int) -> int:
        """How many requests for ``turn`` arrived."""
        with self.lock:
            return self.requests[turn]


def start_server(state: ChatServer) -> ThreadingHTTPServer:
    """Serve ``state`` on a free port of 127.0.0.1 in a daemon thread; sets ``base_url``."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            body = json.loads(self.rfile.read(length))
            turn = 1 + sum(1 for m in body["messages"] if m["role"] == "assistant")
            with state.lock:
                state.requests[turn] += 1
                state.bodies.append(body)
            if state.hold_turn == turn:
                # In flight until the test kills the client (or the server stops).
                state.release.wait(30)
                return
            status = state.status_for_turn.get(turn)
            if state.requests[turn] <= state.rate_limited.get(turn, 0):
                status = 429
            if status is not None:
                error = {"error": {"message": "context_length_exceeded", "type": "invalid"}}
                data = json.dumps(error).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                # Said, not only done: a client that retries must not reuse the socket.
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(data)
                return
            tools = [t["function"]["name"] for t in body.get("tools", [])]
            payload = {
                "id": f"chatcmpl-{turn}",
                "object": "chat.completion",
                "created": 1_700_000_000,
                "model": body["model"],
                "choices": [
                    {"index": 0, "message": script(turn, tools), "finish_reason": "tool_calls"}
                ],
                "usage": {
                    "prompt_tokens": 100 * turn,
                    "completion_tokens": 10 * turn,
                    "total_tokens": 110 * turn,
                },
            }
            data = json.dumps(payload).encode()
            self.send_response(200)
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
    state.base_url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    return server


class Answer(BaseModel):
    """The agent's structured output."""

    answer: int
    summary: str


def append_line(path: Path, entry: dict[str, Any]) -> None:
    """One JSON line, appended with O_APPEND and fsynced before returning."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(entry, sort_keys=True) + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def build(base_url: str, ledger: Path, *, system_prompt: bool = False) -> Any:
    """The workflow: one Pydantic AI agent step over the server at ``base_url``.

    Its agent has ``instructions``, which Pydantic AI sends with every request, or with
    ``system_prompt`` the same text as a system prompt, sent in the first request only.
    """
    provider = OpenAIProvider(base_url=base_url, api_key="test-key")
    text = "Answer with the tools' results."
    agent = Agent(
        OpenAIChatModel(MODEL, provider=provider),
        output_type=Answer,
        name="calculator",
        **({"system_prompt": text} if system_prompt else {"instructions": text}),
    )

    @agent.tool
    def lookup(ctx: RunContext[None], key: str) -> int:
        """Look a key up."""
        append_line(ledger, {"tool": "lookup", "call": ctx.tool_call_id, "pid": os.getpid()})
        return {"alpha": 1, "beta": 2}.get(key, 0)

    @agent.tool
    def add(ctx: RunContext[None], a: int, b: int) -> int:
        """Add two numbers."""
        append_line(ledger, {"tool": "add", "call": ctx.tool_call_id, "pid": os.getpid()})
        return a + b

    return Workflow(
        "pydantic_ai_kill",
        steps=[pydantic_ai_step("solve", agent, prompt="What is alpha, and 40 + 2?")],
    )


def main(argv: list[str]) -> int:
    """Run (or resume) the workflow; print the run's output as one JSON line."""
    import asyncio

    from little_es import local_world, run_workflow

    world_dir, base_url, ledger = argv
    world = local_world(world_dir)
    result = asyncio.run(run_workflow(world, build(base_url, Path(ledger)), run_id=RUN_ID))
    usage = result.state.usage
    print(
        json.dumps(
            {
                "status": result.state.status,
                "output": result.output,
                "input_tokens": usage.input_tokens,
                "output_tokens": usage.output_tokens,
                "calls": usage.calls,
            },
            sort_keys=True,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""A Claude agent step killed mid-request and resumed, offline, against a local Messages server.

    python examples/anthropic_agent.py          (needs ``little-es[anthropic]``)

The server (started and stopped here, on 127.0.0.1) speaks Anthropic's Messages
protocol; the agent reaches it through the official ``anthropic`` client
(``AnthropicModel(base_url=...)``).

1. A child process runs the workflow. Turn 1 asks for two tools (and writes 2,000
   prompt tokens to the cache); while the request of turn 2 is in flight, the
   child is killed with SIGKILL.
2. This process resumes the run: turn 1's answer and both tool results come from
   the log, only turn 2's request is sent again, then turn 3 answers.
3. It prints the requests the server received per turn and the run's report: the
   cache reads and writes are counted apart and priced at Claude 3.5 Haiku's rates
   from genai-prices.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from rich.console import Console

from little_es import Workflow, agent, local_world, run_workflow, tool
from little_es.contrib.anthropic import AnthropicModel
from little_es.render import render_report

RUN_ID = "run_claude_42"
MODEL = "claude-3-5-haiku-20241022"
REQUESTS: Counter[int] = Counter()
HOLD = threading.Event()  # set: the server holds turn 2's request without answering


def _answer(turn: int, model: str) -> dict[str, Any]:
    if turn == 1:
        content: list[dict[str, Any]] = [
            {"type": "tool_use", "id": "toolu_1", "name": "search", "input": {"q": "reset"}},
            {"type": "tool_use", "id": "toolu_2", "name": "read", "input": {"path": "auth.py"}},
        ]
    elif turn == 2:
        content = [{"type": "tool_use", "id": "toolu_3", "name": "read", "input": {"path": "a.py"}}]
    else:
        content = [{"type": "text", "text": "Invalidate the old session in auth.py."}]
    return {
        "id": f"msg_{turn}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": "end_turn" if turn == 3 else "tool_use",
        "stop_sequence": None,
        # Anthropic's input_tokens leave out the cache: turn 1 writes it, later turns read it.
        "usage": {
            "input_tokens": 120 * turn,
            "output_tokens": 40,
            "cache_creation_input_tokens": 2000 if turn == 1 else 0,
            "cache_read_input_tokens": 0 if turn == 1 else 2000,
        },
    }


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        turn = 1 + sum(1 for m in body["messages"] if m["role"] == "assistant")
        REQUESTS[turn] += 1
        if turn == 2 and HOLD.is_set():
            time.sleep(30)  # in flight until the client dies
            return
        data = json.dumps(_answer(turn, body["model"])).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@tool
def search(q: str) -> list[str]:
    """Search the code base."""
    return ["auth.py", "a.py"]


@tool
def read(path: str) -> str:
    """Read a file."""
    return f"# {path}"


def workflow(model: AnthropicModel) -> Workflow:
    return Workflow(
        "claude_fix",
        steps=[
            agent(
                "plan",
                model=model,
                tools=[search, read],
                system="You are a careful engineer.",
                prompt="Plan a fix for: login fails after password reset",
                # Ask Anthropic to cache the prompt prefix (automatic prompt caching).
                parameters={"cache_control": {"type": "ephemeral"}},
            )
        ],
    )


async def _run(world_dir: str, base_url: str) -> Any:
    model = AnthropicModel(MODEL, base_url=base_url, api_key="local", max_tokens=1024)
    try:
        with local_world(world_dir) as world:
            return await run_workflow(world, workflow(model), run_id=RUN_ID)
    finally:
        await model.aclose()


def main() -> None:
    console = Console(width=110)
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base_url = f"http://127.0.0.1:{server.server_address[1]}"
    world_dir = tempfile.mkdtemp(prefix="little-es-claude-")
    try:
        console.print(f"[bold]1.[/] running {RUN_ID} in a child process against {base_url}")
        HOLD.set()
        child = subprocess.Popen([sys.executable, __file__, "--child", world_dir, base_url])
        deadline = time.monotonic() + 60
        while not REQUESTS[2] and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        child.send_signal(signal.SIGKILL)
        child.wait()
        HOLD.clear()
        console.print(f"   turn 2's request in flight: child killed (exit {child.returncode})")

        console.print(f"[bold]2.[/] resuming {RUN_ID} in this process")
        result = asyncio.run(_run(world_dir, base_url))
        console.print(f"   resumed={result.resumed}, output={result.output!r}")
        sent = ", ".join(f"turn {t}: {n}" for t, n in sorted(REQUESTS.items()))
        console.print(f"   requests the server received: {sent}")

        console.print(f"[bold]3.[/] little report {RUN_ID}")
        with local_world(world_dir) as world:
            render_report(world, RUN_ID, console)
    finally:
        server.shutdown()
        server.server_close()
    console.print(f"Inspect it yourself: little report {RUN_ID} --world sqlite:///{world_dir}")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        asyncio.run(_run(sys.argv[2], sys.argv[3]))
    else:
        main()

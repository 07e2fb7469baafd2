"""A Pydantic AI agent run as a little_es step, offline, against a local chat-completions server.

Run: ``.venv/bin/python examples/pydantic_ai_agent.py`` (needs ``little-es[pydantic-ai]``).
The server (started and stopped here) speaks the OpenAI chat-completions protocol; the
agent reaches it through Pydantic AI's own ``OpenAIProvider(base_url=...)``. Run it twice:
the second run resumes the recorded run and sends no request.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from pydantic import BaseModel
from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

from little_es import Workflow, local_world, run_workflow
from little_es.contrib.pydantic_ai import pydantic_ai_step

SENT: list[int] = []


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        turn = 1 + sum(1 for m in body["messages"] if m["role"] == "assistant")
        SENT.append(turn)
        if turn == 1:
            call = {"name": "add", "arguments": json.dumps({"a": 40, "b": 2})}
        else:
            final = next(
                t["function"]["name"] for t in body["tools"] if "final" in t["function"]["name"]
            )
            call = {"name": final, "arguments": json.dumps({"answer": 42})}
        reply = {
            "id": "x",
            "object": "chat.completion",
            "created": 0,
            "model": body["model"],
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "tool_calls",
                    "message": {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [{"id": f"c{turn}", "type": "function", "function": call}],
                    },
                }
            ],
            "usage": {"prompt_tokens": 120, "completion_tokens": 12, "total_tokens": 132},
        }
        data = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass


class Answer(BaseModel):
    answer: int


async def main() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base_url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    provider = OpenAIProvider(base_url=base_url, api_key="local")
    agent = Agent(OpenAIChatModel("gpt-4o-mini", provider=provider), output_type=Answer)

    @agent.tool_plain
    def add(a: int, b: int) -> int:
        """Add two numbers."""
        return a + b

    wf = Workflow("pai_example", steps=[pydantic_ai_step("solve", agent, prompt="40 + 2?")])
    with tempfile.TemporaryDirectory() as tmp:
        world = local_world(tmp)
        for label in ("run", "resume"):
            result = await run_workflow(world, wf, run_id="run_pai_example")
            usage = result.state.usage
            print(
                f"{label}: output={result.output} requests_sent={len(SENT)}"
                f" tokens={usage.input_tokens}+{usage.output_tokens} calls={usage.calls}"
                f" cost_usd={usage.cost_usd}"
            )
    server.shutdown()
    server.server_close()


if __name__ == "__main__":
    asyncio.run(main())

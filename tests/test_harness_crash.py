"""Harness sessions across real process deaths: SIGKILL mid-session, then resume in a new process.

Each test runs ``tests/_agent_proc.py`` (a scripted 5-turn agent session on a
local world) with a ``LITTLE_ES_CRASH_AFTER_*`` switch, so the child kills
itself with SIGKILL right after a chosen append, then runs it again without
the switch. The child's model and tools append a line per REAL invocation to a
ledger file, so the counts below are across both processes. The two targeted
kills run on SQLite and on MariaDB (the ``world`` fixture's URL).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import orjson
import pytest

from little_es.events import Event, ModelCalled, ToolCallStarted
from little_es.ids import session_stream_id
from little_es.world import local_world, open_world
from tests.conftest import WorldSpec

REPO = Path(__file__).resolve().parents[1]
CHILD = REPO / "tests" / "_agent_proc.py"
RUN_ID = "run_crash_agent"
STEP_PATH = "agent"
ALL_CALLS = ["c1", "c2", "c3", "c42", "c5", "c6"]
TOOL_ARGS = {
    "c1": {"key": "alpha"},
    "c2": {"key": "beta"},
    "c3": {"a": 1, "b": 2},
    "c42": {"a": 40, "b": 2},
    "c5": {"key": "gamma"},
    "c6": {"a": 3, "b": 4},
}


def _child(
    world: Path, ledger: Path, label: str, url: str | None = None, **crash: str
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LITTLE_ES_CRASH_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.update(crash)
    return subprocess.run(
        [sys.executable, str(CHILD), str(world), str(ledger), label, *([url] if url else [])],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _killed(proc: subprocess.CompletedProcess[str]) -> bool:
    return proc.returncode == -signal.SIGKILL


def _outcome(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert proc.returncode == 0, proc.stderr
    result: dict[str, Any] = orjson.loads(proc.stdout.strip().splitlines()[-1])
    return result


def _ledger(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def _model_turns(entries: Sequence[dict[str, Any]], label: str) -> list[int]:
    return [e["turn"] for e in entries if e["kind"] == "model" and e["label"] == label]


def _tool_calls(entries: Sequence[dict[str, Any]], label: str) -> list[str]:
    return sorted(e["call_id"] for e in entries if e["kind"] == "tool" and e["label"] == label)


def _session_events(world: Path, url: str | None) -> list[Event]:
    with local_world(world) if url is None else open_world(url) as w:
        return w.read_stream(session_stream_id(RUN_ID, STEP_PATH, 1))


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """The conversation of the uninterrupted session, as the child wrote it."""
    root = tmp_path_factory.mktemp("reference")
    outcome = _outcome(_child(root / "world", root / "ledger", "only"))
    assert outcome["output"] == "done: 42" and outcome["model_calls_made"] == 5
    return (root / "world" / "conversation.json").read_bytes()


@pytest.mark.backends("sqlite", "mariadb")
def test_killed_after_model_called_turn_3_resumes_with_only_turn_3_called(
    tmp_path: Path, reference: bytes, world_spec: WorldSpec
) -> None:
    world, ledger = tmp_path / "world", tmp_path / "ledger"
    url = None if world_spec.backend == "sqlite" else world_spec.url
    first = _child(
        world, ledger, "first", url, LITTLE_ES_CRASH_AFTER_EVENT="harness.model.called:turn=3"
    )
    assert _killed(first), (first.returncode, first.stderr)
    entries = _ledger(ledger)
    assert _model_turns(entries, "first") == [1, 2]  # turn 3 was recorded, never called
    assert _tool_calls(entries, "first") == ["c1", "c2", "c3"]

    outcome = _outcome(_child(world, ledger, "resume", url))
    entries = _ledger(ledger)
    # Turns 1-2 replay from the log; turn 3 is called exactly once, then the rest.
    assert _model_turns(entries, "resume") == [3, 4, 5]
    assert _tool_calls(entries, "resume") == ["c42", "c5", "c6"]
    assert outcome["model_calls_made"] == 3 and outcome["replayed_model_calls"] == 2
    assert outcome["tool_calls_made"] == 3 and outcome["replayed_tool_calls"] == 3
    events = _session_events(world, url)
    assert [e.turn for e in events if isinstance(e, ModelCalled)] == [1, 2, 3, 4, 5]
    assert (world / "conversation.json").read_bytes() == reference


@pytest.mark.backends("sqlite", "mariadb")
def test_killed_after_tool_call_c42_started_reruns_only_c42_with_the_same_args(
    tmp_path: Path, reference: bytes, world_spec: WorldSpec
) -> None:
    world, ledger = tmp_path / "world", tmp_path / "ledger"
    url = None if world_spec.backend == "sqlite" else world_spec.url
    first = _child(
        world,
        ledger,
        "first",
        url,
        LITTLE_ES_CRASH_AFTER_EVENT="harness.tool_call.started:call_id=c42",
    )
    assert _killed(first), (first.returncode, first.stderr)
    entries = _ledger(ledger)
    assert _model_turns(entries, "first") == [1, 2, 3]
    assert _tool_calls(entries, "first") == ["c1", "c2", "c3"]  # c42 recorded, not invoked

    outcome = _outcome(_child(world, ledger, "resume", url))
    entries = _ledger(ledger)
    assert _model_turns(entries, "resume") == [4, 5]
    assert _tool_calls(entries, "resume") == ["c42", "c5", "c6"]
    c42 = [e for e in entries if e.get("call_id") == "c42"]
    assert [(e["label"], e["args"]) for e in c42] == [("resume", {"a": 40, "b": 2})]
    assert outcome["replayed_model_calls"] == 3 and outcome["replayed_tool_calls"] == 3
    assert outcome["model_calls_made"] == 2 and outcome["tool_calls_made"] == 3
    started = [e.call_id for e in _session_events(world, url) if isinstance(e, ToolCallStarted)]
    assert started == ALL_CALLS  # no second harness.tool_call.started for c42
    assert (world / "conversation.json").read_bytes() == reference


@pytest.mark.slow
def test_killed_at_every_append_boundary_resumes_to_the_same_bytes(
    tmp_path: Path, reference: bytes
) -> None:
    def crash_and_resume(k: int) -> tuple[int, bool, bytes, list[dict[str, Any]]]:
        world, ledger = tmp_path / f"k{k}", tmp_path / f"k{k}.ledger"
        first = _child(world, ledger, "first", LITTLE_ES_CRASH_AFTER_APPENDS=str(k))
        killed = _killed(first)
        if killed:
            _outcome(_child(world, ledger, "resume"))
        else:
            assert first.returncode == 0, first.stderr
        return k, killed, (world / "conversation.json").read_bytes(), _ledger(ledger)

    # Crash after append 1, 2, ... until a run gets through uninterrupted: then
    # every append transaction of the session has been a crash point.
    workers = max(2, os.cpu_count() or 2)
    results: list[tuple[int, bool, bytes, list[dict[str, Any]]]] = []
    with ThreadPoolExecutor(max_workers=workers) as pool:
        while all(killed for _, killed, _, _ in results):
            start = len(results) + 1
            results += pool.map(crash_and_resume, range(start, start + workers))
    appends = min(k for k, killed, _, _ in results if not killed) - 1
    assert appends >= 10, appends  # the scenario really has that many crash points

    for k, killed, data, entries in results:
        assert killed == (k <= appends), k
        assert data == reference, f"crash after append {k}: the conversation differs"
        # The kill lands right after an append: no model call is ever in flight then,
        # so each turn was called once. A tool call can be: its parallel sibling's
        # result was the append that killed the process. That one call, and only
        # it, ran once in each process, with the same arguments.
        model_turns = sorted(e["turn"] for e in entries if e["kind"] == "model")
        assert model_turns == [1, 2, 3, 4, 5], (k, model_turns)
        tools = [e for e in entries if e["kind"] == "tool"]
        assert sorted({e["call_id"] for e in tools}) == sorted(ALL_CALLS), k
        for label in ("first", "resume"):
            ran = [e["call_id"] for e in tools if e["label"] == label]
            assert len(ran) == len(set(ran)), (k, label, ran)
        assert len(tools) - len(ALL_CALLS) <= 1, (k, tools)
        for e in tools:
            assert e["args"] == TOOL_ARGS[e["call_id"]], (k, e)

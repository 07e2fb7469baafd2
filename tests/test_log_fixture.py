"""Logs written by earlier code still read, resume and verify.

Exports of worlds written by the workflow of :mod:`tests._verbose_log`, each by the
code of its time, kept as they are:

* ``tests/fixtures/verbose_log.jsonl``: before payloads left out their defaults (every
  field of every event stored, ``null`` and ``[]`` included);
* ``tests/fixtures/chained_log.jsonl``: log format 2, by the code before wire keys (field
  names, ISO timestamps, the 65-byte chain frame with whole digests);
* ``tests/fixtures/compact_log.jsonl``: log format 3, by the code of commit e1c70af (wire
  keys, integer timestamps, the 33-byte frame);

and ``tests/fixtures/sqlite_world/``, the data directory that last export was made from:
an events file in eventsourcing's table layout (``stored_events``, the stream id and
topic spelled out in every row), which a world keeps when it opens such a file.

Today's code imports each export (chains checked) or opens the directory, folds it,
resumes its failed run without running anything committed again, and appends to it in
today's form; the mixed world verifies.

``tests/fixtures/agent_log.jsonl`` (:mod:`tests._agent_log`) holds agent sessions of log
format 3 as the code of e1c70af stored them: each ``harness.model.called`` with the
assistant message and tool results again, each ``harness.model.responded`` with its
provider and model. A session killed mid-turn resumes from it calling only what was in
flight, and continues in the compact form (messages implied); a tool result edited in
that form is refused before anything runs.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import shutil
import sqlite3
import uuid
from pathlib import Path
from typing import Any

import _agent_log
import orjson
import pytest
from _verbose_log import CALLS, DONE_RUN, HALF_RUN, MODEL, PUBLISH_FAILS, WORKFLOW

from little_es import (
    export_world,
    import_world,
    local_world,
    replay_run,
    run_workflow,
    verify_world,
)
from little_es.chain import FRAME_SIZE, GENESIS, feed, frame, payload_of, row_digest, seed
from little_es.errors import ConversationDivergedError
from little_es.events import Event, ModelCalled, ModelResponded
from little_es.harness.session import conversation_hash, sent_messages
from little_es.ids import session_stream_id

FIXTURES = Path(__file__).parent / "fixtures"
FIXTURE = FIXTURES / "verbose_log.jsonl"
CHAINED = FIXTURES / "chained_log.jsonl"
COMPACT = FIXTURES / "compact_log.jsonl"
SQLITE_WORLD = FIXTURES / "sqlite_world"
AGENT_LOG = FIXTURES / "agent_log.jsonl"


@pytest.fixture(
    params=[FIXTURE, CHAINED, COMPACT, SQLITE_WORLD],
    ids=["verbose", "chained", "compact", "sqlite-world"],
)
def world_dir(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    directory = tmp_path / "world"
    if request.param.is_dir():
        shutil.copytree(request.param, directory)
    else:
        world = local_world(directory)
        with request.param.open("rb") as source:
            import_world(world, source)
        world.close()
    CALLS.clear()
    PUBLISH_FAILS["on"] = False
    return directory


def _tables(directory: Path) -> set[str]:
    with contextlib.closing(sqlite3.connect(directory / "events.sqlite3")) as conn:
        rows = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        return {r[0] for r in rows}


def _payloads(directory: Path, topic: str) -> list[bytes]:
    # The layout the file holds: eventsourcing's table, or today's with its view.
    table = "stored_events" if "stored_events" in _tables(directory) else "little_es_rows"
    with contextlib.closing(sqlite3.connect(directory / "events.sqlite3")) as conn:
        rows = conn.execute(f"SELECT state FROM {table} WHERE topic = ?", (topic,))
        return [bytes(r[0]) for r in rows]


def test_the_fixtures_are_in_their_forms(tmp_path: Path) -> None:
    # If these fail, a fixture was regenerated with newer code and tests nothing.
    text = FIXTURE.read_text()
    assert "output_ref" in text and "session_id" in text and "artifact_refs" in text
    chained = CHAINED.read_text()
    assert '\\"step_path\\":' in chained and '\\"timestamp\\":\\"2026-' in chained
    assert '"output_ref"' not in chained and '"frame":"01' in chained
    assert '"frame":"02' not in chained
    compact = COMPACT.read_text()
    assert '"log_format":3' in compact and '\\"p\\":' in compact and '"frame":"02' in compact
    # Read from a copy: opening the WAL-mode file in place would leave files beside it.
    shutil.copytree(SQLITE_WORLD, tmp_path / "copy")
    assert _tables(tmp_path / "copy") == {"stored_events", "stored_snapshots", "little_es_heads"}


def test_a_verbose_log_folds_as_it_was_written(world_dir: Path) -> None:
    world = local_world(world_dir)
    done = replay_run(world, DONE_RUN).state
    half = replay_run(world, HALF_RUN).state
    world.close()
    assert (done.status, half.status) == ("completed", "failed")
    assert done.steps["fetch"].output == {"ticket": 7, "title": "disk full"}
    assert done.steps["publish"].output == {"published": 7}
    assert done.steps["review@2"].visit == 2
    assert done.steps["finish"].next_step is not None
    assert done.steps["check[a.py]/lint"].step_id == "lint"
    assert (done.usage.input_tokens, done.usage.output_tokens) == (42, 7)
    # Written before Usage had cache_write_tokens: it folds as no cache writes.
    assert b"cache_write_tokens" not in FIXTURE.read_bytes()
    assert done.usage.cache_write_tokens == 0
    assert done.steps["plan"].usage.input_tokens == 42
    assert done.steps["plan"].usage.cache_write_tokens == 0
    assert half.failed_step_path == "publish"
    assert half.steps["publish"].status == "failed"


async def test_a_verbose_log_resumes_without_running_anything_committed(
    world_dir: Path,
) -> None:
    world = local_world(world_dir)
    model_calls = MODEL.calls
    resumed = await run_workflow(world, WORKFLOW, {"ticket": 8}, run_id=HALF_RUN)
    again = await run_workflow(world, WORKFLOW, {"ticket": 7}, run_id=DONE_RUN)
    assert resumed.state.status == again.state.status == "completed"
    assert (resumed.steps_executed, again.steps_executed) == (2, 0)
    assert dict(CALLS) == {"publish": 1, "finish": 1}
    assert MODEL.calls == model_calls
    report = verify_world(world)
    world.close()
    assert report.ok, report
    # What was appended is in today's form: the 21-byte frame, wire keys, no field at its
    # default on the wire.
    newest = _payloads(world_dir, "StepCompleted")[-1]
    assert newest[:1] == b"\x03"
    assert b"null" not in newest and b"artifact_refs" not in newest
    assert b'"p":"finish"' in newest and b"step_path" not in newest


async def test_a_file_in_eventsourcings_layout_keeps_it(tmp_path: Path) -> None:
    # Nothing rewrites stored rows: a world opened on an older file appends to its table.
    directory = tmp_path / "world"
    shutil.copytree(SQLITE_WORLD, directory)
    before = len(_payloads(directory, "StepCompleted"))
    CALLS.clear()
    PUBLISH_FAILS["on"] = False
    with local_world(directory) as world:
        await run_workflow(world, WORKFLOW, {"ticket": 8}, run_id=HALF_RUN)
        assert verify_world(world).ok
    assert len(_payloads(directory, "StepCompleted")) == before + 2
    assert not {"little_es_events", "little_es_streams"} & _tables(directory)


# ------------------------------------------------------------ agent sessions of format 3


@pytest.fixture
def agent_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "world"
    world = local_world(directory)
    with AGENT_LOG.open("rb") as source:
        import_world(world, source)
    world.close()
    _agent_log.CALLS.clear()
    _agent_log.KILL["turn"] = None
    return directory


def _session_payloads(directory: Path, run_id: str) -> dict[tuple[str, int], dict[str, Any]]:
    """The session's stored payloads by (topic, turn), from the world's own rows."""
    world = local_world(directory)
    try:
        rows = world.select_stored(session_stream_id(run_id, "plan", 1))
        out: dict[tuple[str, int], dict[str, Any]] = {}
        for row in rows:
            payload = orjson.loads(payload_of(bytes(row.state)))
            out[(row.topic, payload.get("u", 0))] = payload
        return out
    finally:
        world.close()


def _session_events(directory: Path, run_id: str) -> list[Event]:
    world = local_world(directory)
    try:
        return world.read_stream(session_stream_id(run_id, "plan", 1))
    finally:
        world.close()


def test_the_agent_fixture_is_in_its_form() -> None:
    # If this fails, the fixture was regenerated with newer code and tests nothing.
    lines = [orjson.loads(line) for line in AGENT_LOG.read_bytes().splitlines()]
    called = [orjson.loads(x["payload"]) for x in lines if x.get("topic") == ModelCalled.wire_name]
    responded = [
        orjson.loads(x["payload"]) for x in lines if x.get("topic") == ModelResponded.wire_name
    ]
    assert len(called) == 4 + 3 and len(responded) == 4 + 2
    assert all("m" in c and "d" not in c for c in called)
    assert any(c["u"] == 2 and c["m"][0]["role"] == "assistant" for c in called)
    assert all("provider" in r["r"] and "model" in r["r"] for r in responded)


def test_an_agent_log_of_format_3_reads_as_written(agent_dir: Path) -> None:
    world = local_world(agent_dir)
    done = replay_run(world, _agent_log.DONE_RUN).state
    world.close()
    assert done.status == "completed"
    assert (done.usage.input_tokens, done.usage.output_tokens, done.usage.calls) == (100, 10, 4)
    events = _session_events(agent_dir, _agent_log.DONE_RUN)
    responses = {e.turn: e.response for e in events if isinstance(e, ModelResponded)}
    assert [(r.provider, r.model) for r in responses.values()] == [
        ("scripted", "agent-log-1"),
        ("scripted", "agent-log-1-0925"),
        ("scripted", "agent-log-1"),
        ("scripted", "agent-log-1"),
    ]
    # Every message stored, as written; they chain to the recorded hashes.
    called = [e for e in events if isinstance(e, ModelCalled)]
    sent = sent_messages(events)
    h = ""
    for c in called:
        assert c.implied == 0 and sent[c.turn] == c.messages
        h = conversation_hash(h, c.messages)
        assert c.conversation_hash == h
    assert [m.role for m in sent[2]] == ["assistant", "tool", "tool"]


async def test_an_agent_log_of_format_3_resumes_calling_only_what_was_in_flight(
    agent_dir: Path,
) -> None:
    world = local_world(agent_dir)
    requests = len(_agent_log.MODEL.requests)
    resumed = await run_workflow(world, _agent_log.WORKFLOW, {}, run_id=_agent_log.HALF_RUN)
    again = await run_workflow(world, _agent_log.WORKFLOW, {}, run_id=_agent_log.DONE_RUN)
    assert resumed.state.status == again.state.status == "completed"
    # Turn 3's model call was in flight; turns 1-2 and their tools are answered from the log.
    assert dict(_agent_log.CALLS) == {"model:3": 1, "fail:read-only": 1, "model:4": 1}
    assert resumed.state.usage == again.state.usage
    report = verify_world(world)
    world.close()
    assert report.ok, report

    # What was appended is in the compact form, beside the rows of the old one.
    payloads = _session_payloads(agent_dir, _agent_log.HALF_RUN)
    assert "m" in payloads[("harness.model.called", 3)]
    turn_4 = payloads[("harness.model.called", 4)]
    assert "m" not in turn_4 and turn_4["d"] == 2  # turn 3's answer and its tool's failure
    turn_3 = payloads[("harness.model.responded", 3)]
    assert (turn_3["r"]["provider"], turn_3["r"]["model"]) == ("scripted", "agent-log-1")

    # The mixed session reads back whole: the last request is every message it sent.
    events = _session_events(agent_dir, _agent_log.HALF_RUN)
    sent = sent_messages(events)
    last = _agent_log.MODEL.requests[requests:][-1]
    assert sent[1] + sent[2] + sent[3] + sent[4] == last.messages
    assert [m.role for m in sent[4]] == ["assistant", "tool"]
    assert sent[4][1].content == "error: RuntimeError: cannot: read-only"
    responses = [e.response for e in events if isinstance(e, ModelResponded)]
    assert [r.model for r in responses] == [
        "agent-log-1",
        "agent-log-1-0925",
        "agent-log-1",
        "agent-log-1",
    ]


def _edited_world(
    directory: Path, tmp_path: Path, stream_id: uuid.UUID, old: str, new: str
) -> Path:
    """A copy of the world at ``directory`` whose stream has ``old`` replaced by ``new`` in its
    payloads, every frame and the head recomputed (as a writer that knows the format could):
    the chain cannot tell, the session's own checks must."""
    world = local_world(directory)
    out = io.BytesIO()
    export_world(world, out)
    world.close()
    lines = [orjson.loads(line) for line in out.getvalue().splitlines()]
    sid = str(stream_id)
    prev, running = GENESIS, seed(stream_id)
    edited = 0
    for line in lines:
        if line["type"] == "event" and line["stream_id"] == sid:
            if old in line["payload"]:
                edited += 1
            payload = line["payload"].replace(old, new).encode()
            line["payload"] = payload.decode()
            data = frame(prev, stream_id, line["version"], line["topic"], payload)
            line["frame"] = data[:FRAME_SIZE].hex()
            feed(running, line["topic"], data)
            prev = row_digest(data)
    assert edited == 1
    stream = next(x for x in lines if x["type"] == "stream" and x["stream_id"] == sid)
    stream["head"] = {**stream["head"], "digest": prev.hex(), "running": running.digest().hex()}
    body = b"".join(orjson.dumps(line) + b"\n" for line in lines[:-1])
    trailer = dict(lines[-1])
    trailer["sha256"] = hashlib.sha256(body).hexdigest()
    target = tmp_path / "edited"
    copy = local_world(target)
    import_world(copy, io.BytesIO(body + orjson.dumps(trailer) + b"\n"))
    copy.close()
    return target


@pytest.mark.parametrize(
    ("old", "new", "turn"),
    [
        # Turn 3's tool failure, which turn 4's compact harness.model.called implies.
        ("cannot: read-only", "cannot: read-write", 4),
        # Turn 3's response (its assistant message, implied the same way).
        ('"arguments":{"reason":"read-only"}', '"arguments":{"reason":"read-write"}', 3),
        # How many messages turn 4 leaves to the earlier events.
        ('"d":2', '"d":1', 4),
    ],
    ids=["tool failure", "response", "implied count"],
)
async def test_an_edited_implied_message_is_refused_before_anything_runs(
    agent_dir: Path, tmp_path: Path, old: str, new: str, turn: int
) -> None:
    # Resumed and killed again inside turn 4's model call: that turn's harness.model.called
    # is compact (it implies turn 3's answer and its tool's failure), beside the old form
    # of turns 1-3.
    world = local_world(agent_dir)
    _agent_log.KILL["turn"] = 4
    with pytest.raises(_agent_log.Killed):
        await run_workflow(world, _agent_log.WORKFLOW, {}, run_id=_agent_log.HALF_RUN)
    _agent_log.KILL["turn"] = None
    world.close()
    session_id = session_stream_id(_agent_log.HALF_RUN, "plan", 1)
    target = _edited_world(agent_dir, tmp_path, session_id, old, new)
    _agent_log.CALLS.clear()
    world = local_world(target)
    rows = len(world.select_stored(session_id))
    for _ in range(2):  # refused every time, nothing appended, nothing called
        with pytest.raises(ConversationDivergedError, match=rf"turn {turn}"):
            await run_workflow(world, _agent_log.WORKFLOW, {}, run_id=_agent_log.HALF_RUN)
        assert len(world.select_stored(session_id)) == rows
    world.close()
    assert dict(_agent_log.CALLS) == {}
    # The log as it was (a backup) resumes, calling only turn 4's model.
    world = local_world(agent_dir)
    done = await run_workflow(world, _agent_log.WORKFLOW, {}, run_id=_agent_log.HALF_RUN)
    world.close()
    assert done.state.status == "completed" and dict(_agent_log.CALLS) == {"model:4": 1}

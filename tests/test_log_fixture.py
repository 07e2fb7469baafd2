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
"""

from __future__ import annotations

import contextlib
import shutil
import sqlite3
from pathlib import Path

import pytest
from _verbose_log import CALLS, DONE_RUN, HALF_RUN, MODEL, PUBLISH_FAILS, WORKFLOW

from little_es import import_world, local_world, replay_run, run_workflow, verify_world

FIXTURES = Path(__file__).parent / "fixtures"
FIXTURE = FIXTURES / "verbose_log.jsonl"
CHAINED = FIXTURES / "chained_log.jsonl"
COMPACT = FIXTURES / "compact_log.jsonl"
SQLITE_WORLD = FIXTURES / "sqlite_world"


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

"""Run ids: validated before anything touches disk, mapped to stable stream UUIDs."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest

from little_es.domain import HarnessSession, OuterLoop, Run
from little_es.errors import InvalidRunIdError
from little_es.events import RunStarted, StepStarted
from little_es.ids import (
    RUN_ID_MAX_LENGTH,
    new_run_id,
    outer_loop_stream_id,
    run_stream_id,
    session_stream_id,
    validate_run_id,
)
from little_es.pricing import price_usage_exact
from little_es.world import World, local_world

_REPO = Path(__file__).resolve().parents[1]

BAD_IDS: list[Any] = [
    "../etc/passwd",
    "a/b",
    "a\\b",
    "",
    "x" * 200,
    "x" * (RUN_ID_MAX_LENGTH + 1),
    "nul\x00byte",
    "\x00",
    ".hidden",
    "-rf",
    "_x",
    "a b",
    "run\n",
    "ün",
    "run:1",
    None,
    5,
    b"x",
    3.0,
    ["run_1"],
]
GOOD_IDS = ["run_triage_42", "a", "9", "A.b-c_1", "run.v1.2", "x" * RUN_ID_MAX_LENGTH]


@pytest.mark.parametrize("bad", BAD_IDS, ids=repr)
def test_bad_run_id_is_refused_with_a_named_value_error(bad: Any) -> None:
    with pytest.raises(InvalidRunIdError) as info:
        validate_run_id(bad)
    assert isinstance(info.value, ValueError)
    assert "run id" in str(info.value)


def _listing(root: Path) -> dict[str, int]:
    return {
        str(p.relative_to(root)): p.stat().st_size if p.is_file() else -1
        for p in sorted(root.rglob("*"))
        if not p.name.endswith(("-shm", "-wal"))
    }


def _entry_points(world: World, bad: Any) -> list[Callable[[], object]]:
    return [
        lambda: world.read_run_log(bad),
        lambda: world.load_run(bad),
        lambda: world.run_exists(bad),
        lambda: world.load_outer_loop(bad),
        lambda: world.record_run_event(bad, StepStarted),
        lambda: world.run_lease(bad),
        lambda: world.artifacts.put(b"bytes", run_id=bad, step_path="s"),
        lambda: Run(bad, price_usage_exact),
        lambda: HarnessSession(bad, "s", 1),
        lambda: OuterLoop(bad),
        lambda: run_stream_id(bad),
        lambda: session_stream_id(bad, "s", 1),
        lambda: outer_loop_stream_id(bad),
    ]


@pytest.mark.parametrize("bad", BAD_IDS, ids=repr)
def test_bad_run_id_is_refused_before_anything_touches_disk(tmp_path: Path, bad: Any) -> None:
    with local_world(tmp_path / "world") as world:
        before = _listing(tmp_path)
        for call in _entry_points(world, bad):
            with pytest.raises(InvalidRunIdError):
                call()
        assert _listing(tmp_path) == before
        assert list((tmp_path / "world" / "artifacts").iterdir()) == []
        assert list((tmp_path / "world" / "leases").iterdir()) == []
    conn = sqlite3.connect(tmp_path / "world" / "events.sqlite3")
    try:
        assert conn.execute("SELECT count(*) FROM little_es_events").fetchone() == (0,)
    finally:
        conn.close()


@pytest.mark.parametrize("good", GOOD_IDS)
def test_valid_run_ids_are_accepted_and_usable(tmp_path: Path, good: str) -> None:
    assert validate_run_id(good) == good
    with local_world(tmp_path / "world") as world:
        run = Run(good, price_usage_exact)
        run.trigger(RunStarted, run_id=good, workflow_id="w", workflow_version="1", ir_hash="0")
        world.save(run)
        with world.run_lease(good):
            ref = world.artifacts.put(b"x", run_id=good, step_path="s")
        assert world.artifacts.get(ref).manifest.run_id == good
        [event] = world.read_run_log(good)
        assert isinstance(event, RunStarted) and event.run_id == good
        assert world.load_run(good).run_id == good


def test_new_run_ids_are_valid_and_fresh() -> None:
    ids = {new_run_id() for _ in range(100)}
    assert len(ids) == 100
    assert all(validate_run_id(i) == i and i.startswith("run_") for i in ids)
    assert new_run_id("triage").startswith("triage_")
    with pytest.raises(InvalidRunIdError):
        new_run_id("../x")


def test_stream_ids_are_distinct_per_kind_step_and_attempt() -> None:
    ids = [
        run_stream_id("run_1"),
        outer_loop_stream_id("run_1"),
        session_stream_id("run_1", "a", 1),
        session_stream_id("run_1", "a", 2),
        session_stream_id("run_1", "b", 1),
        session_stream_id("run_2", "a", 1),
        run_stream_id("run_2"),
    ]
    assert len(set(ids)) == len(ids)
    assert all(isinstance(i, UUID) and i.version == 5 for i in ids)


_GOLDEN = {
    "run": "5410858f-3d01-5b7b-9f6b-3f8251f5a3a2",
    "session": "77b2f453-ea06-5d8c-8a70-7251fd9c26d2",
    "outer_loop": "4ab6e3e2-fefe-5033-b98a-8119cc2e2b54",
}
_PRINT_IDS = (
    "from little_es.ids import outer_loop_stream_id, run_stream_id, session_stream_id\n"
    "print(run_stream_id('run_triage_42'))\n"
    "print(session_stream_id('run_triage_42', 'plan/draft', 2))\n"
    "print(outer_loop_stream_id('loop_7'))\n"
)


def test_uuid5_mapping_is_stable_across_processes_and_releases() -> None:
    here = [
        str(run_stream_id("run_triage_42")),
        str(session_stream_id("run_triage_42", "plan/draft", 2)),
        str(outer_loop_stream_id("loop_7")),
    ]
    # Pinned: a change here would orphan every stream already stored.
    assert here == [_GOLDEN["run"], _GOLDEN["session"], _GOLDEN["outer_loop"]]
    for seed in ("0", "12345"):
        out = subprocess.run(
            [sys.executable, "-c", _PRINT_IDS],
            env={**os.environ, "PYTHONPATH": str(_REPO), "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )
        assert out.stdout.split() == here

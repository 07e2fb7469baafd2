"""A local world writes its WAL's blocks ahead of SQLite's frames (``_WalPreallocation``).

An fsynced commit that extends the WAL file costs more than one that overwrites
blocks it already has; SQLite deletes the WAL when a world closes, so a new
process's commits would all extend it. The world writes zeros past the WAL's
end, doubling, up to the size at which SQLite checkpoints and starts over. What
must hold: the zeros are never read as frames (a world killed with a padded WAL
reopens with every commit), the growth stops at that size, a write the disk
refuses leaves the commit to SQLite, and ``synchronous="normal"`` (no fsync a
commit) leaves the WAL alone.
"""

from __future__ import annotations

import asyncio
import errno
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from little_es import (
    RunNotFoundError,
    StepContext,
    Workflow,
    local_world,
    replay_run,
    run_workflow,
    task,
    verify_world,
)
from little_es.backends.sqlite import _WAL_AUTOCHECKPOINT, _WAL_FIRST_GROWTH

REPO = Path(__file__).resolve().parents[1]
_FRAME = 24 + 4096  # a WAL frame of a 4 KiB page, SQLite's default page size
_LIMIT = 32 + _WAL_AUTOCHECKPOINT * _FRAME


def _out(ctx: StepContext) -> dict[str, object]:
    return {"i": ctx.step_path, "payload": "x" * 100}


def _steps(n: int) -> Workflow:
    return Workflow("wal", version="1", steps=[task(f"s{i}", _out) for i in range(n)])


def _wal(data_dir: Path) -> Path:
    return data_dir / "events.sqlite3-wal"


def _zero_tail(path: Path) -> int:
    """How many bytes at the end of the file are zeros."""
    data = path.read_bytes()
    return len(data) - len(data.rstrip(b"\0"))


def test_the_wal_is_written_ahead_of_the_frames_while_the_world_is_open(tmp_path: Path) -> None:
    with local_world(tmp_path) as world:
        asyncio.run(run_workflow(world, _steps(5), {}, run_id="run_wal"))
        wal = _wal(tmp_path)
        size = wal.stat().st_size
        assert size >= _WAL_FIRST_GROWTH
        # Past SQLite's last frame: zeros, at least a frame's worth.
        assert _zero_tail(wal) >= _FRAME


def test_the_growth_stops_at_the_size_sqlite_checkpoints_at(tmp_path: Path) -> None:
    with local_world(tmp_path) as world:
        asyncio.run(run_workflow(world, _steps(500), {}, run_id="run_wal"))
        size = _wal(tmp_path).stat().st_size
    # Grown to the autocheckpoint size, and past it only by the frames of a commit
    # that began below it (SQLite checkpoints after the commit that crosses it).
    assert _LIMIT <= size <= _LIMIT + 8 * _FRAME


_KILLED_CHILD = textwrap.dedent(
    """
    import asyncio, os, sys
    from little_es import local_world, run_workflow
    from tests.test_sqlite_wal import _steps

    world = local_world(sys.argv[1])
    asyncio.run(run_workflow(world, _steps(40), {}, run_id="run_wal"))
    # Gone without closing the world: SQLite neither checkpoints nor deletes the WAL.
    os._exit(0)
    """
)


def test_a_world_left_with_a_padded_wal_reopens_with_every_commit(tmp_path: Path) -> None:
    data_dir = tmp_path / "world"
    script = tmp_path / "child.py"
    script.write_text(_KILLED_CHILD)
    subprocess.run(
        [sys.executable, str(script), str(data_dir)],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        check=True,
        timeout=120,
    )
    wal = _wal(data_dir)
    assert wal.stat().st_size >= _WAL_FIRST_GROWTH and _zero_tail(wal) > 0
    # All the run's events are in that WAL, none in the main file yet.
    with local_world(data_dir) as world:
        state = replay_run(world, "run_wal").state
        assert state.status == "completed"
        assert [s.status for s in state.steps.values()] == ["completed"] * 40
        assert verify_world(world).ok
        # SQLite writes on after the last frame it found, not after the zeros.
        asyncio.run(run_workflow(world, _steps(5), {}, run_id="run_after"))
    with local_world(data_dir) as world:
        for run_id in ("run_wal", "run_after"):
            assert replay_run(world, run_id).state.status == "completed"
        assert verify_world(world).ok


def test_a_wal_of_nothing_but_zeros_opens_as_an_empty_one(tmp_path: Path) -> None:
    # What a crash leaves between a new WAL's zeros and the commit's first frame.
    with local_world(tmp_path) as world:
        asyncio.run(run_workflow(world, _steps(3), {}, run_id="run_wal"))
    assert not _wal(tmp_path).exists()  # checkpointed and deleted by the close
    _wal(tmp_path).write_bytes(bytes(_WAL_FIRST_GROWTH))
    with local_world(tmp_path) as world:
        assert replay_run(world, "run_wal").state.status == "completed"
        asyncio.run(run_workflow(world, _steps(3), {}, run_id="run_after"))
    with local_world(tmp_path) as world:
        assert replay_run(world, "run_after").state.status == "completed"
        assert verify_world(world).ok


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="names the WAL's fd by /proc")
def test_a_write_the_disk_refuses_leaves_the_commit_to_sqlite(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pwrite = os.pwrite

    def refuse(fd: int, data: bytes, offset: int) -> int:
        if Path(f"/proc/self/fd/{fd}").readlink().name.endswith("-wal"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return pwrite(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", refuse)
    with local_world(tmp_path) as world:
        result = asyncio.run(run_workflow(world, _steps(5), {}, run_id="run_wal"))
        assert result.state.status == "completed"
        assert _zero_tail(_wal(tmp_path)) < _FRAME  # nothing written past SQLite's frames
    with local_world(tmp_path) as world:
        assert replay_run(world, "run_wal").state.status == "completed"


def test_a_wal_that_cannot_be_opened_leaves_the_commit_to_sqlite(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_open = os.open

    def no_fds(path: str, flags: int, *args: int) -> int:
        if str(path).endswith("-wal"):
            raise OSError(errno.EMFILE, "Too many open files")
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", no_fds)
    with local_world(tmp_path) as world:
        result = asyncio.run(run_workflow(world, _steps(5), {}, run_id="run_wal"))
        assert result.state.status == "completed"
        assert _zero_tail(_wal(tmp_path)) < _FRAME


def test_a_world_opened_by_a_relative_path_keeps_to_its_files_after_a_chdir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Another world at the same relative path under the directory changed to: its WAL,
    # which a path looked up anew would find, must not take this world's zeros.
    here, there = tmp_path / "here", tmp_path / "there"
    here.mkdir()
    there.mkdir()
    monkeypatch.chdir(here)
    with local_world("w") as world, local_world(there / "w", synchronous="normal") as other:
        asyncio.run(run_workflow(world, _steps(3), {}, run_id="run_here"))
        asyncio.run(run_workflow(other, _steps(3), {}, run_id="run_there"))
        other_wal = _wal(there / "w").read_bytes()
        other_files = sorted((there / "w").rglob("*"))
        monkeypatch.chdir(there)
        asyncio.run(run_workflow(world, _steps(40), {}, run_id="run_after"))
        assert _wal(there / "w").read_bytes() == other_wal
        assert sorted((there / "w").rglob("*")) == other_files  # its leases, artifacts
        assert _zero_tail(_wal(here / "w")) >= _FRAME
        assert replay_run(world, "run_after").state.status == "completed"
    with local_world(there / "w") as other:
        assert replay_run(other, "run_there").state.status == "completed"
        with pytest.raises(RunNotFoundError):
            other.read_run_log("run_after")
        assert verify_world(other).ok
    with local_world(here / "w") as world:
        assert verify_world(world).ok


def test_the_wal_grown_is_the_one_sqlite_writes_through_a_symlink(tmp_path: Path) -> None:
    # SQLite names the WAL after the file a symlinked events file points to.
    data_dir, elsewhere = tmp_path / "world", tmp_path / "elsewhere"
    data_dir.mkdir()
    elsewhere.mkdir()
    (data_dir / "events.sqlite3").symlink_to(elsewhere / "events.sqlite3")
    with local_world(data_dir) as world:
        asyncio.run(run_workflow(world, _steps(5), {}, run_id="run_wal"))
        assert not _wal(data_dir).exists()
        assert _zero_tail(_wal(elsewhere)) >= _FRAME


def test_normal_synchronous_leaves_the_wal_alone(tmp_path: Path) -> None:
    with local_world(tmp_path, synchronous="normal") as world:
        asyncio.run(run_workflow(world, _steps(5), {}, run_id="run_wal"))
        wal = _wal(tmp_path)
        assert (wal.stat().st_size - 32) % _FRAME == 0
        assert _zero_tail(wal) < _FRAME

"""The fsync policy of a local world: FULL by default, NORMAL on request."""

from __future__ import annotations

from pathlib import Path

import pytest

from little_es import WorldConfigError, local_world, open_world
from little_es.world import World

_LEVELS = {1: "normal", 2: "full"}


def _pragma(world: World) -> str:
    datastore = world.app.recorder.datastore  # type: ignore[attr-defined]
    with datastore.transaction(commit=False) as cursor:
        cursor.execute("PRAGMA synchronous")
        return _LEVELS[cursor.fetchone()[0]]


def test_full_by_default(tmp_path: Path) -> None:
    with local_world(tmp_path) as world:
        assert _pragma(world) == "full"


@pytest.mark.parametrize("mode", ["full", "normal"])
def test_chosen_in_code_or_url(tmp_path: Path, mode: str) -> None:
    with local_world(tmp_path / "a", synchronous=mode) as world:  # type: ignore[arg-type]
        assert _pragma(world) == mode
    with open_world(f"sqlite:///{tmp_path / 'b'}?synchronous={mode}") as world:
        assert _pragma(world) == mode


def test_bad_values_are_refused(tmp_path: Path) -> None:
    with pytest.raises(WorldConfigError, match="'full' or 'normal'"):
        local_world(tmp_path, synchronous="off")  # type: ignore[arg-type]
    with pytest.raises(WorldConfigError, match="only synchronous"):
        open_world(f"sqlite:///{tmp_path}?fsync=no")

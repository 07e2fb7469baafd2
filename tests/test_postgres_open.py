"""Several processes opening one fresh PostgreSQL or MariaDB world at the same moment."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import WorldSpec

_OPEN = """
import sys, time
from pathlib import Path
from little_es import open_world
go = Path(sys.argv[2])
while not go.exists():
    time.sleep(0.005)
with open_world(sys.argv[1]) as world:
    print("OPENED", world.run_exists("run_x"))
"""


@pytest.mark.backends("postgres", "mariadb")
def test_processes_opening_a_fresh_world_at_once_all_succeed(
    world_spec: WorldSpec, tmp_path: Path
) -> None:
    go = tmp_path / "go"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _OPEN, world_spec.url, str(go)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    go.touch()
    results = [p.communicate(timeout=120) for p in procs]
    for proc, (out, err) in zip(procs, results, strict=True):
        assert proc.returncode == 0, err
        assert "OPENED False" in out

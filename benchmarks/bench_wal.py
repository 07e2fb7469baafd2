"""What a WAL written ahead saves a commit, on bare sqlite3 and on a plain file.

A world writes zeros past its WAL's end before the commits that fsync it
(``_WalPreallocation`` in ``little_es/backends/sqlite.py``). This measures why,
without little_es in the way, each figure a median of ``--commits`` commits in a
fresh directory, the variants interleaved over ``--repeat`` rounds:

1. a sqlite3 commit (WAL, ``synchronous=FULL``; one row into a table with a primary
   key and one heads-row upsert, as a world's task step writes) on a fresh WAL,
   against one grown first: by ``_WalPreallocation`` before each commit, and by an
   earlier cycle of SQLite's own frames (1,100 commits, then a checkpoint);
2. the same with a ``stat`` of the WAL before each commit (what ``grow`` avoids
   by reading the size with ``lseek``), against ``grow`` alone;
3. a 12 KiB ``pwrite`` + ``fdatasync`` (three WAL frames) to a plain file:
   appending, into space made by ``ftruncate`` or ``fallocate``, and into zeros
   written (and fsynced) before.

    .venv/bin/python -m benchmarks.bench_wal [--commits 300] [--repeat 3] [--json]
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.figures import Figures, add_json_option, reporting
from little_es.backends.sqlite import _WalPreallocation

_WRITE = 3 * (24 + 4096)
"""Three WAL frames of 4 KiB pages: what a world's task step writes a commit."""


def _sqlite_commits(root: Path, mode: str, commits: int) -> float:
    """Median seconds of a commit on a fresh file; ``mode`` says how its WAL is grown."""
    directory = Path(tempfile.mkdtemp(dir=root))
    path = directory / "x.sqlite3"
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("CREATE TABLE t (s INT, v INT, b BLOB, PRIMARY KEY (s, v))")
        conn.execute("CREATE TABLE h (s INT PRIMARY KEY, v INT) WITHOUT ROWID")
        wal = _WalPreallocation()

        def commit(stream: int, i: int) -> None:
            conn.execute("BEGIN")
            conn.execute("INSERT INTO t VALUES (?, ?, ?)", (stream, i, b"x" * 300))
            conn.execute(
                "INSERT INTO h VALUES (?, ?) ON CONFLICT (s) DO UPDATE SET v = excluded.v",
                (stream, i),
            )
            if mode in ("grown", "grown+stat"):
                wal.grow(conn.cursor())
            if mode == "grown+stat":
                Path(f"{path}-wal").stat()
            conn.execute("COMMIT")

        if mode == "cycled":
            for i in range(1100):
                commit(1, i)
        times = []
        for i in range(commits):
            t0 = time.perf_counter()
            commit(2, i)
            times.append(time.perf_counter() - t0)
        return statistics.median(times)
    finally:
        conn.close()
        shutil.rmtree(directory)


def _file_writes(root: Path, mode: str, commits: int) -> float:
    """Median seconds of a write + fdatasync to a fresh file made ready as ``mode`` says."""
    path = root / f"plain-{mode}"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        size = _WRITE * commits
        if mode == "zeros":
            os.pwrite(fd, bytes(size), 0)
        elif mode == "ftruncate":
            os.ftruncate(fd, size)
        elif mode == "fallocate":
            os.posix_fallocate(fd, 0, size)
        os.fdatasync(fd)
        data = b"a" * _WRITE
        times = []
        for i in range(commits):
            t0 = time.perf_counter()
            os.pwrite(fd, data, i * _WRITE)
            os.fdatasync(fd)
            times.append(time.perf_counter() - t0)
        return statistics.median(times)
    finally:
        os.close(fd)
        path.unlink()


def main() -> None:
    """Print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--commits", type=int, default=300)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=None, help="where (default: a temp dir)")
    add_json_option(parser)
    args = parser.parse_args()
    with reporting("bench_wal", args.json) as report:
        _main(args, report)


def _main(args: argparse.Namespace, report: Figures) -> None:
    cases: dict[str, Callable[[Path], float]] = {}
    for mode in ("fresh", "grown", "cycled", "grown+stat"):
        cases[f"sqlite {mode}"] = functools.partial(
            _sqlite_commits, mode=mode, commits=args.commits
        )
    for mode in ("append", "ftruncate", "fallocate", "zeros"):
        cases[f"file {mode}"] = functools.partial(_file_writes, mode=mode, commits=args.commits)
    times: dict[str, list[float]] = {name: [] for name in cases}
    with tempfile.TemporaryDirectory(prefix="bench-wal-", dir=args.dir) as tmp:
        for _ in range(args.repeat):
            for name, case in cases.items():
                times[name].append(case(Path(tmp)))
    us = {name: statistics.median(xs) * 1e6 for name, xs in times.items()}
    for name, value in us.items():
        print(f"  {name:20} {value:7.1f} µs")
    what = f"median of {args.commits}, {args.repeat} rounds"
    step = "one row + a heads upsert, WAL, synchronous=FULL"
    for mode, how in (
        ("grown", "grown ahead by _WalPreallocation"),
        ("cycled", "grown by an earlier cycle of its own frames"),
    ):
        report.add(
            f"sqlite3 commit ({step}) on a WAL {how}, {what}",
            us[f"sqlite {mode}"],
            "µs",
            baseline=us["sqlite fresh"],
            baseline_what="the same on a fresh WAL (each commit extends it)",
        )
    report.add(
        f"sqlite3 commit on a grown WAL with a stat of the WAL before each, {what}",
        us["sqlite grown+stat"],
        "µs",
        baseline=us["sqlite grown"],
        baseline_what="without the stat",
    )
    for mode in ("ftruncate", "fallocate", "zeros"):
        report.add(
            f"12 KiB pwrite + fdatasync into a plain file's space made by {mode}, {what}",
            us[f"file {mode}"],
            "µs",
            baseline=us["file append"],
            baseline_what="the same appending",
        )


if __name__ == "__main__":
    main()

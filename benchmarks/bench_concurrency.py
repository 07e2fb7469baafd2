"""Several processes appending to one world at once: total steps/s against a plain-INSERT floor.

Run from the repository root::

    .venv/bin/python -m benchmarks.bench_concurrency
    .venv/bin/python -m benchmarks.bench_concurrency --writers 1,2,4,8,16 --steps 100 \
        --backends sqlite,postgres

For each backend and each number of writers N (``--writers``), in a fresh world (a
temporary SQLite file; a fresh PostgreSQL schema, dropped afterwards):

* **little_es**: N processes (``tests/_race_proc.py write``: forked from one that imported
  everything, released together once each opened its world) each run their own run of
  ``--steps`` trivial task steps with ``run_workflow``; the figure is the total steps/s,
  N x steps over the time from the first process's start to the last one's end (and the
  slowest and fastest process's own steps/s);
* **floor**: N processes (forked the same way) each do, per step, the commit the
  runtime's log does at least: one transaction, fsynced (SQLite ``synchronous=FULL``,
  WAL; PostgreSQL's default commit), of two ``INSERT`` s, rows as large as that world's
  ``StepCompleted`` and ``StepStarted`` rows (the local engine commits a step's
  ``StepCompleted`` with the next step's ``StepStarted``). Plain ``sqlite3`` /
  ``psycopg``, one table with the same unique (stream, version) key, no chain, no
  heads, no reads. ``Client CPU per step`` is the CPU time of the one-writer
  processes (every thread) over their steps.

The ratio is floor / little_es steps/s: how many times the floor's cost a step costs
when N processes write at once; "x N=1" is little_es's total over its total with the
first ``--writers`` count (one writer by default). With ``--repeat R`` each pair
(little_es, then the floor) is measured R times, alternating, and the best of each is
shown: on a shared machine, the run least slowed by others.

The PostgreSQL curve of the README::

    .venv/bin/python -m benchmarks.bench_concurrency --backends postgres \
        --writers 1,2,4,8,16 --steps 200 --repeat 3
"""

from __future__ import annotations

import argparse
import os
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import psycopg
from psycopg import sql

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.figures import add_json_option, reporting  # noqa: E402
from little_es import open_world  # noqa: E402

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/test"
RACE_PROC = REPO / "tests" / "_race_proc.py"
TIMEOUT_S = 600.0
STEP_TOPICS = ("StepStarted", "StepCompleted")


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LITTLE_ES_CRASH_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


def _throughput(children: list[dict[str, Any]], steps: int) -> dict[str, float]:
    began = min(c["started"] for c in children)
    ended = max(c["ended"] for c in children)
    each = sorted(steps / (c["ended"] - c["started"]) for c in children)
    return {
        "total": len(children) * steps / (ended - began),
        "slowest": each[0],
        "fastest": each[-1],
        "cpu_ms": statistics.mean(c["cpu_s"] for c in children) / steps * 1000,
    }


def run_little_es(world_url: str, writers: int, steps: int, workdir: Path) -> dict[str, float]:
    """N writer processes of ``tests/_race_proc.py write``; their steps/s.

    The world is created first, by this process: what is measured is appending, not
    several processes creating one world at once.
    """
    with open_world(world_url):
        pass
    argv = [sys.executable, str(RACE_PROC), "write", "--world", world_url, "--dir", str(workdir)]
    argv += ["--procs", str(writers), "--steps", str(steps), "--timeout", str(TIMEOUT_S)]
    done = subprocess.run(
        argv, env=_env(), cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT_S + 60
    )
    if done.returncode != 0:
        raise RuntimeError(f"the writers failed: {done.stderr[-4000:]}")
    children = orjson.loads(done.stdout.splitlines()[-1])["children"]
    bad = [c for c in children if c.get("outcome") != "ran" or c.get("status") != "completed"]
    if bad:
        raise RuntimeError(f"writers did not complete: {bad}")
    return _throughput(children, steps)


# ------------------------------------------------------------------ the floor


def _fork_all(writers: int, work: Callable[[int], None], workdir: Path) -> list[dict[str, Any]]:
    """Fork ``writers`` children, release them together, wait; their start and end times."""
    workdir.mkdir(parents=True, exist_ok=True)
    go = workdir / "go"
    pids = []
    for i in range(writers):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                (workdir / f"ready-{i}").touch()
                while not go.exists():
                    time.sleep(0.001)
                started, cpu = time.monotonic(), time.process_time()
                work(i)
                ended, cpu = time.monotonic(), time.process_time() - cpu
                (workdir / f"out-{i}.json").write_bytes(
                    orjson.dumps({"started": started, "ended": ended, "cpu_s": cpu})
                )
                code = 0
            finally:
                os._exit(code)
        pids.append(pid)
    deadline = time.monotonic() + TIMEOUT_S
    while not all((workdir / f"ready-{i}").exists() for i in range(writers)):
        if time.monotonic() > deadline:
            break
        time.sleep(0.001)
    go.touch()
    failed = []
    for pid in pids:
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)  # our own child, not reaped yet
            time.sleep(0.002)
        if os.waitstatus_to_exitcode(status) != 0:
            failed.append(pid)
    if failed:
        raise RuntimeError(f"floor writers failed: {failed}")
    return [orjson.loads((workdir / f"out-{i}.json").read_bytes()) for i in range(writers)]


def _rows(sizes: dict[str, int]) -> list[tuple[str, bytes]]:
    """The two rows of a step's one commit: (topic, payload of the same size)."""
    return [(t, b"x" * sizes[t]) for t in STEP_TOPICS]


def sqlite_floor(path: Path, writers: int, steps: int, sizes: dict[str, int]) -> dict[str, float]:
    """N processes, per step one fsynced COMMIT of two plain INSERTs into one WAL-mode
    SQLite file."""
    setup = sqlite3.connect(path, isolation_level=None)
    setup.execute("PRAGMA journal_mode=WAL")
    setup.execute(
        "CREATE TABLE rows (id INTEGER PRIMARY KEY, stream TEXT, version INTEGER,"
        " topic TEXT, state BLOB, UNIQUE (stream, version))"
    )
    setup.close()
    rows = _rows(sizes)

    def work(i: int) -> None:
        conn = sqlite3.connect(path, isolation_level=None, timeout=TIMEOUT_S)
        conn.execute("PRAGMA synchronous=FULL")
        stream = uuid.uuid4().hex
        version = 0
        for _ in range(steps):
            conn.execute("BEGIN IMMEDIATE")
            for topic, state in rows:
                version += 1
                conn.execute(
                    "INSERT INTO rows (stream, version, topic, state) VALUES (?, ?, ?, ?)",
                    (stream, version, topic, state),
                )
            conn.execute("COMMIT")
        conn.close()

    children = _fork_all(writers, work, path.parent / f"floor-{writers}")
    return _throughput(children, steps)


def postgres_floor(
    dsn: str, schema: str, writers: int, steps: int, sizes: dict[str, int]
) -> dict[str, float]:
    """N processes, per step one COMMIT of two plain INSERTs into one PostgreSQL table."""
    table = sql.Identifier(schema, f"floor_{writers}")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "CREATE TABLE {} (id BIGSERIAL PRIMARY KEY, stream UUID, version INTEGER,"
                " topic TEXT, state BYTEA, UNIQUE (stream, version))"
            ).format(table)
        )
    insert = sql.SQL("INSERT INTO {} (stream, version, topic, state) VALUES (%s, %s, %s, %s)")
    rows = _rows(sizes)

    def work(i: int) -> None:
        with psycopg.connect(dsn) as conn:
            stream = uuid.uuid4()
            version = 0
            for _ in range(steps):
                with conn.transaction():
                    for topic, state in rows:
                        version += 1
                        conn.execute(insert.format(table), (stream, version, topic, state))

    with tempfile.TemporaryDirectory(prefix="bench-concurrency-floor-") as tmp:
        children = _fork_all(writers, work, Path(tmp))
    return _throughput(children, steps)


# ------------------------------------------------------------------ sizes


def _sqlite_sizes(data_dir: Path) -> dict[str, int]:
    conn = sqlite3.connect(data_dir / "events.sqlite3")
    try:
        found = conn.execute(
            "SELECT topic, avg(length(state)) FROM little_es_rows GROUP BY topic"
        ).fetchall()
    finally:
        conn.close()
    return {t: round(n) for t, n in found if t in STEP_TOPICS}


def _postgres_sizes(dsn: str, schema: str) -> dict[str, int]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        found = conn.execute(
            sql.SQL("SELECT topic, avg(length(state)) FROM {} GROUP BY topic").format(
                sql.Identifier(schema, "little_es_rows")
            )
        ).fetchall()
    return {str(t): round(float(n)) for t, n in found if t in STEP_TOPICS}


# ------------------------------------------------------------------ main


def measure_sqlite(writers: int, steps: int) -> tuple[dict[str, float], dict[str, float], Any]:
    """little_es and the floor, N writers, fresh files."""
    with tempfile.TemporaryDirectory(prefix="bench-concurrency-") as tmp:
        data_dir = Path(tmp) / "world"
        ours = run_little_es(f"sqlite:///{data_dir}", writers, steps, Path(tmp) / "run")
        sizes = _sqlite_sizes(data_dir)
        floor = sqlite_floor(Path(tmp) / "floor.sqlite3", writers, steps, sizes)
    return ours, floor, sizes


def measure_postgres(
    dsn: str, writers: int, steps: int
) -> tuple[dict[str, float], dict[str, float], Any]:
    """little_es and the floor, N writers, a fresh schema."""
    schema = f"bench_concurrency_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    try:
        sep = "&" if "?" in dsn else "?"
        with tempfile.TemporaryDirectory(prefix="bench-concurrency-") as tmp:
            ours = run_little_es(f"{dsn}{sep}schema={schema}", writers, steps, Path(tmp))
        sizes = _postgres_sizes(dsn, schema)
        floor = postgres_floor(dsn, schema, writers, steps, sizes)
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))
    return ours, floor, sizes


def main(argv: list[str] | None = None) -> int:
    """Parse the options, measure every backend and writer count, print the table."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--writers", default="1,2,4,8,16", help="comma-separated process counts")
    parser.add_argument("--steps", type=int, default=100, help="task steps per writer")
    parser.add_argument("--backends", default="sqlite,postgres", help="comma-separated")
    parser.add_argument(
        "--repeat", type=int, default=1, help="measure each pair this many times, keep the best"
    )
    parser.add_argument(
        "--dsn",
        default=os.environ.get("LITTLE_ES_TEST_POSTGRES_DSN", DEFAULT_DSN),
        help="PostgreSQL server (a schema is created and dropped)",
    )
    add_json_option(parser)
    args = parser.parse_args(argv)
    counts = [int(n) for n in args.writers.split(",")]
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    if (
        set(backends) - {"sqlite", "postgres"}
        or min(counts) < 1
        or args.steps < 1
        or args.repeat < 1
    ):
        parser.error("backends: sqlite,postgres; --writers >= 1; --steps >= 1; --repeat >= 1")
    with reporting("bench_concurrency", args.json) as figures:
        print(f"{args.steps} trivial task steps per writer, each writer its own run and process")
        head = f"{'backend':8} {'writers':>7} | {'little_es steps/s':>17} {'(per process)':>15} |"
        head += f" {'floor steps/s':>13} {'(per process)':>15} | {'ratio':>5} | {'x N=1':>5}"
        print(head)
        print("-" * len(head))
        for backend in backends:
            one: float | None = None
            for n in counts:
                ours, floor, sizes = _best_of(args.repeat, backend, args.dsn, n, args.steps)
                ratio = floor["total"] / ours["total"]
                one = ours["total"] if one is None else one
                print(
                    f"{backend:8} {n:7} | {ours['total']:17,.0f}"
                    f" {_span(ours):>15} | {floor['total']:13,.0f} {_span(floor):>15} |"
                    f" {ratio:5.2f} | {ours['total'] / one:5.2f}"
                )
                procs = f"{n} process{'es' if n > 1 else ''}"
                if n == 1:
                    # The client's own cost, where no other writer shares the cores.
                    print(
                        f"{backend:8} client CPU per step, 1 process: {ours['cpu_ms']:.3f} ms"
                        f" (floor {floor['cpu_ms']:.3f} ms)"
                    )
                    figures.add(
                        f"{backend}: CPU per task step in the process driving the run"
                        f" (1 process, {args.steps} steps)",
                        ours["cpu_ms"],
                        "ms",
                        baseline=floor["cpu_ms"],
                        baseline_what="the floor's process making the same commits",
                    )
                figures.add(
                    f"{backend}: {procs} at once, each driving its own run of {args.steps}"
                    f" trivial task steps: in total (each process: {_span(ours)} steps/s)",
                    ours["total"],
                    "steps/s",
                    baseline=floor["total"],
                    baseline_what=(
                        f"{procs} making the same commit of plain INSERTs of rows of the same"
                        f" size ({sizes['StepCompleted']} B and {sizes['StepStarted']} B,"
                        " fsynced), one a step"
                    ),
                )
        print(
            "floor: per step one fsynced COMMIT of two INSERTs, rows the size of StepCompleted"
            " and StepStarted; ratio = floor / little_es"
        )
    return 0


def _best_of(
    repeat: int, backend: str, dsn: str, writers: int, steps: int
) -> tuple[dict[str, float], dict[str, float], Any]:
    """The best little_es and the best floor of ``repeat`` alternating measurements."""
    best: tuple[dict[str, float], dict[str, float], Any] | None = None
    for _ in range(repeat):
        if backend == "sqlite":
            ours, floor, sizes = measure_sqlite(writers, steps)
        else:
            ours, floor, sizes = measure_postgres(dsn, writers, steps)
        if best is None:
            best = ours, floor, sizes
        else:
            best = (
                max(best[0], ours, key=lambda t: t["total"]),
                max(best[1], floor, key=lambda t: t["total"]),
                sizes,
            )
    assert best is not None
    return best


def _span(t: dict[str, float]) -> str:
    return f"{t['slowest']:,.0f}-{t['fastest']:,.0f}"


if __name__ == "__main__":
    raise SystemExit(main())

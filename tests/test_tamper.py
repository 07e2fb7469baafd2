"""The tamper matrix: each way of editing a log behind little_es's back, on a completed run and
on a run killed mid agent step, on SQLite, PostgreSQL and MariaDB.

Every case ends in a named :class:`RuntimeIntegrityError` before anything is appended or
executed (row counts and the ledger unchanged); once the original rows are restored (a
backup put back) the run completes, and every step, model call and tool call of the whole
history ran exactly once, counted by a ledger file outside the processes.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import _temporal_worker_proc as proc
import orjson
import pytest
from conftest import (
    WorldSpec,
    create_test_database,
    create_test_schema,
    drop_test_database,
    drop_test_schema,
    mysql_database_url,
    require_mysql,
    require_postgres,
    with_query,
)

from little_es.backends.base import HEADS_TABLE
from little_es.engine.local import run_workflow
from little_es.errors import LogTamperedError, RuntimeIntegrityError, WorldIntegrityError
from little_es.faults import CRASH_AFTER_EVENT
from little_es.ids import run_stream_id
from little_es.world import local_world

_REPO = Path(__file__).resolve().parent.parent
_INPUT = {"topic": "Tides", "turns": 4}
_RUN = "run_tamper"

# (id, stream, version, topic, state): one stored row, with its position in the table.
_StoredRow = tuple[int, str, int, str, bytes]


class _Db:
    """The world's tables, edited straight through the database driver, as a person could."""

    def __init__(self, spec: WorldSpec) -> None:
        self.spec = spec
        self.pg = spec.backend == "postgres"
        self.my = spec.backend == "mariadb"
        self.sqlite = not (self.pg or self.my)
        self.id_column = {"postgres": "notification_id", "mariadb": "id"}.get(
            spec.backend, "notification_id"
        )
        self.mark = "%s" if self.pg or self.my else "?"
        # eventsourcing's name on MariaDB (the table is named after the application); on
        # SQLite and PostgreSQL, the view that spells out the compact layout's stream ids
        # and topics. Edits of the compact layout go to its table, rows by their id there.
        self.compact = not self.my
        self.table = "little_es_rows" if self.compact else "littlees_events"
        self.row_id = "rowid" if self.sqlite else "notification_id"

    def _connect(self) -> Any:
        if self.pg:
            return self.spec.connect_postgres()
        if self.my:
            return _MySQLConnection(self.spec)
        assert self.spec.data_dir is not None
        return sqlite3.connect(self.spec.data_dir / "events.sqlite3", isolation_level=None)

    def run(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        conn = self._connect()
        try:
            cursor = conn.execute(sql.replace("?", self.mark), params)
            return list(cursor.fetchall()) if cursor.description else []
        finally:
            conn.close()

    def rows(self) -> list[_StoredRow]:
        found = self.run(
            f"SELECT {self.id_column}, originator_id, originator_version, topic, state"
            f" FROM {self.table} ORDER BY {self.id_column}"
        )
        # MariaDB's ids are BINARY(16): kept as bytes, as stream() gives them.
        return [(i, s if self.my else str(s), v, t, bytes(d)) for i, s, v, t, d in found]

    def stream(self, run_id: str) -> Any:
        sid = run_stream_id(run_id)
        return str(sid) if self.pg else sid.bytes if self.my else sid.hex

    def set_state(self, row_id: int, state: bytes) -> None:
        if self.compact:
            self.run(
                f"UPDATE little_es_events SET state = ? WHERE {self.row_id} = ?", state, row_id
            )
        else:
            self.run(f"UPDATE {self.table} SET state = ? WHERE {self.id_column} = ?", state, row_id)

    def set_topic(self, row_id: int, topic: str) -> None:
        if self.compact:
            self.run(_NEW_TOPIC, topic)
            self.run(
                "UPDATE little_es_events SET topic ="
                f" (SELECT id FROM little_es_topics WHERE topic = ?) WHERE {self.row_id} = ?",
                topic,
                row_id,
            )
        else:
            self.run(f"UPDATE {self.table} SET topic = ? WHERE {self.id_column} = ?", topic, row_id)

    def delete(self, condition: str, *params: Any) -> None:
        if self.compact:
            self.run(
                f"DELETE FROM little_es_events WHERE {self.row_id} IN"
                f" (SELECT notification_id FROM little_es_rows WHERE {condition})",
                *params,
            )
        else:
            self.run(f"DELETE FROM {self.table} WHERE {condition}", *params)

    def insert(self, stream: str, version: int, topic: str, state: bytes) -> None:
        if self.compact:
            self.run(_NEW_TOPIC, topic)
            self.run(
                "INSERT INTO little_es_events (stream, version, topic, state) VALUES"
                " ((SELECT id FROM little_es_streams WHERE stream_id = ?), ?,"
                " (SELECT id FROM little_es_topics WHERE topic = ?), ?)",
                stream,
                version,
                topic,
                state,
            )
            return
        self.run(
            f"INSERT INTO {self.table} (originator_id, originator_version, topic, state)"
            " VALUES (?, ?, ?, ?)",
            stream,
            version,
            topic,
            state,
        )

    def backup(self) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
        heads = self.run(f"SELECT stream_id, version, digest, running FROM {HEADS_TABLE}")
        return self.run(f"SELECT {self._columns} FROM {self._events_table}"), heads

    @property
    def _events_table(self) -> str:
        return "little_es_events" if self.compact else self.table

    @property
    def _columns(self) -> str:
        if self.compact:
            return f"{self.row_id}, stream, version, topic, state"
        return f"{self.id_column}, originator_id, originator_version, topic, state"

    def restore(self, backup: tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]) -> None:
        """Put a backup back: the tables as they were, row ids included."""
        events, heads = backup
        conn = self._connect()
        try:
            conn.execute(f"DELETE FROM {self._events_table}")
            conn.execute(f"DELETE FROM {HEADS_TABLE}")
            for row in events:
                conn.execute(
                    f"INSERT INTO {self._events_table} ({self._columns})"
                    f" VALUES (?, ?, ?, ?, ?)".replace("?", self.mark),
                    row,
                )
            for row in heads:
                conn.execute(
                    f"INSERT INTO {HEADS_TABLE} VALUES (?, ?, ?, ?)".replace("?", self.mark), row
                )
        finally:
            conn.close()


_NEW_TOPIC = "INSERT INTO little_es_topics (topic) VALUES (?) ON CONFLICT (topic) DO NOTHING"


class _MySQLConnection:
    """A PyMySQL connection with the ``execute`` of sqlite3's and psycopg's connections."""

    def __init__(self, spec: WorldSpec) -> None:
        self._conn = spec.connect_mysql()

    def execute(self, sql: str, params: Any = ()) -> Any:
        cursor = self._conn.cursor()
        cursor.execute(sql, params)
        return cursor

    def close(self) -> None:
        self._conn.close()


def _ledger_counts(path: Path) -> Counter[tuple[str, str]]:
    return Counter((e["kind"], str(e["what"])) for e in proc.read_ledger(path))


# ----------------------------------------------------------------------- the cases


def _first(db: _Db, topic: str, nth: int = 0) -> _StoredRow:
    return [r for r in db.rows() if r[3] == topic][nth]


def _edit(topic: str, old: bytes, new: bytes, nth: int = 0) -> Callable[[_Db], None]:
    def tamper(db: _Db) -> None:
        row = _first(db, topic, nth)
        assert old in row[4], (topic, row[4])
        db.set_state(row[0], row[4].replace(old, new))

    return tamper


def _delete_middle_session_row(db: _Db) -> None:
    row = _first(db, "harness.tool_call.started")
    db.delete(f"{db.id_column} = ?", row[0])


def _unknown_topic(db: _Db) -> None:
    db.set_topic(_first(db, "harness.tool_call.succeeded")[0], "harness.teleported")


def _run_stream_gap(db: _Db) -> None:
    db.delete("originator_id = ? AND originator_version = 2", db.stream(_RUN))


def _forged_step_completed(db: _Db) -> None:
    # A StepCompleted for the in-flight agent step, as a naive forger writes it: bare JSON.
    stream = db.stream(_RUN)
    version = 1 + max(r[2] for r in db.rows() if r[1] == stream)
    payload = {
        "timestamp": "2026-01-01T00:00:00Z",
        "step_path": "research",
        "step_id": "research",
        "visit": 1,
        "attempt": 1,
        "output": "forged answer",
    }
    db.insert(stream, version, "StepCompleted", orjson.dumps(payload))


def _copied_step_completed(db: _Db) -> None:
    # A framed StepCompleted copied from another step, renumbered to the next version.
    stream = db.stream(_RUN)
    version = 1 + max(r[2] for r in db.rows() if r[1] == stream)
    db.insert(stream, version, "StepCompleted", _first(db, "StepCompleted")[4])


def _delete_last_third(db: _Db) -> None:
    rows = db.rows()
    db.delete(f"{db.id_column} > ?", rows[len(rows) * 2 // 3][0])


def _empty_events(db: _Db) -> None:
    db.delete("1 = 1")


_FORGED_REF = b'"output_ref":' + orjson.dumps(
    {
        "artifact_id": "sha256:" + "ab" * 32,
        "sha256": "ab" * 32,
        "size": 17,
        "media_type": "application/json",
        "run_id": _RUN,
        "step_path": "prepare",
    }
)


@dataclass(frozen=True)
class Case:
    name: str
    tamper: Callable[[_Db], None]
    states: tuple[str, ...] = ("completed", "half")
    error: type[RuntimeIntegrityError] = LogTamperedError


CASES = [
    Case(
        "model response edited",
        _edit("harness.model.responded", b"turn 1: looking up", b"turn 1: forged!!!!"),
    ),
    Case(
        "tool result edited",
        _edit("harness.tool_call.succeeded", b"result for q1", b"result for qX"),
    ),
    Case("session row deleted", _delete_middle_session_row),
    Case("unknown topic in a session", _unknown_topic),
    Case(
        "manifest body edited",
        _edit("harness.session.started", b'"max_turns":500', b'"max_turns":501'),
    ),
    Case("row deleted mid run stream", _run_stream_gap),
    Case("inline step output edited", _edit("StepCompleted", b'"tides"', b'"tidex"')),
    Case(
        "artifact reference written into a step's output",
        # A field at its default is not stored: the forged reference is added.
        _edit("StepCompleted", b'"o":', _FORGED_REF + b',"o":'),
    ),
    Case(
        "run output edited", _edit("RunCompleted", b"found after", b"faked after"), ("completed",)
    ),
    Case("forged StepCompleted (bare JSON)", _forged_step_completed, ("half",)),
    Case("forged StepCompleted (copied frame)", _copied_step_completed, ("half",)),
    Case("last third of the rows deleted", _delete_last_third),
    Case("events table emptied", _empty_events),
]


# ----------------------------------------------------------------------- the states


@dataclass
class _Pristine:
    spec: WorldSpec
    backup: tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]
    ledger: bytes


def _make_state(spec: WorldSpec, state: str, ledger: Path) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(_REPO), str(_REPO / "tests"), str(_REPO / "adapters")]),
        proc.LEDGER_ENV: str(ledger),
    }
    if state == "half":
        env[CRASH_AFTER_EVENT] = "harness.model.called:turn=3"
    done = subprocess.run(
        [
            *(sys.executable, "-m", "_temporal_worker_proc", "local", "--world", spec.url),
            *("--ledger", str(ledger), "--workflow", proc.AGENT_WORKFLOW.id, "--run-id", _RUN),
            *("--input", orjson.dumps(_INPUT).decode()),
        ],
        env=env,
        capture_output=True,
        timeout=120,
    )
    expected = -signal.SIGKILL if state == "half" else 0
    assert done.returncode == expected, done.stderr.decode()


@pytest.fixture(
    scope="module",
    params=[
        "sqlite",
        pytest.param("postgres", marks=pytest.mark.postgres),
        pytest.param("mariadb", marks=pytest.mark.mariadb),
    ],
)
def pristine(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, _Pristine]]:
    """Per backend, for the whole module: a world with the completed run and one with the
    half run, each with a backup of its tables and of its ledger. Each test restores the
    state it needs into its world."""
    schemas: list[str] = []
    databases: list[str] = []
    dsn = require_postgres() if request.param == "postgres" else ""
    server = require_mysql() if request.param == "mariadb" else ""
    found: dict[str, _Pristine] = {}
    try:
        for state in ("completed", "half"):
            if request.param == "sqlite":
                data_dir = tmp_path_factory.mktemp(state) / "world"
                spec = WorldSpec("sqlite", f"sqlite:///{data_dir}", data_dir=data_dir)
            elif request.param == "mariadb":
                databases.append(create_test_database(server))
                url = mysql_database_url(server, databases[-1])
                spec = WorldSpec("mariadb", url, dsn=server, database=databases[-1])
            else:
                schemas.append(create_test_schema(dsn))
                url = with_query(dsn, "schema", schemas[-1])
                spec = WorldSpec("postgres", url, dsn=dsn, schema=schemas[-1])
            ledger = tmp_path_factory.mktemp("ledger") / "ledger.jsonl"
            _make_state(spec, state, ledger)
            found[state] = _Pristine(spec, _Db(spec).backup(), ledger.read_bytes())
        yield found
    finally:
        for schema in schemas:
            drop_test_schema(dsn, schema)
        for database in databases:
            drop_test_database(server, database)


@pytest.mark.parametrize(
    ("case", "state"),
    [pytest.param(c, s, id=f"{c.name}-{s}") for c in CASES for s in c.states],
)
def test_a_tampered_log_is_refused_and_the_restored_one_resumes(
    case: Case,
    state: str,
    pristine: dict[str, _Pristine],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    start = pristine[state]
    db = _Db(start.spec)
    db.restore(start.backup)
    ledger = tmp_path / "ledger.jsonl"
    ledger.write_bytes(start.ledger)
    monkeypatch.setenv(proc.LEDGER_ENV, str(ledger))

    case.tamper(db)
    rows, heads = (len(t) for t in db.backup())
    with pytest.raises(case.error) as refused:
        _resume(start.spec)
    assert "stream" in str(refused.value)
    assert (len(db.backup()[0]), len(db.backup()[1])) == (rows, heads), "something was appended"
    assert ledger.read_bytes() == start.ledger, "something was executed"

    db.restore(start.backup)
    output = _resume(start.spec)
    assert output == {"topic": "tides", "answer": "found after 4 turns"}
    counts = _ledger_counts(ledger)
    assert counts and set(counts.values()) == {1}, f"re-executed: {counts}"
    assert counts[("model", "4")] == 1 and counts[("task", "summarize")] == 1


def _resume(spec: WorldSpec) -> Any:
    with spec.open() as world:
        result = asyncio.run(run_workflow(world, proc.AGENT_WORKFLOW, _INPUT, run_id=_RUN))
    return result.output


# ------------------------------------------------------------ the world itself (SQLite)


def _completed_world(tmp_path: Path, name: str = "world") -> Path:
    data_dir = tmp_path / name
    spec = WorldSpec("sqlite", f"sqlite:///{data_dir}", data_dir=data_dir)
    _make_state(spec, "completed", tmp_path / f"{name}.ledger")
    return data_dir


def test_a_deleted_events_file_is_refused_not_taken_for_a_new_world(tmp_path: Path) -> None:
    data_dir = _completed_world(tmp_path)
    (data_dir / "events.sqlite3").unlink()
    for suffix in ("-wal", "-shm"):
        (data_dir / f"events.sqlite3{suffix}").unlink(missing_ok=True)
    with pytest.raises(WorldIntegrityError, match=r"events\.sqlite3 is missing"):
        local_world(data_dir)
    assert not (data_dir / "events.sqlite3").exists()


def test_a_data_directory_with_artifacts_but_no_events_or_marker_is_refused(
    tmp_path: Path,
) -> None:
    data_dir = _completed_world(tmp_path)
    with local_world(data_dir) as world:
        world.artifacts.put(b"x" * 100, run_id=_RUN, step_path="prepare")
    for name in ("events.sqlite3", "events.sqlite3-wal", "events.sqlite3-shm", "world.json"):
        (data_dir / name).unlink(missing_ok=True)
    with pytest.raises(WorldIntegrityError, match="artifact store holds artifacts"):
        local_world(data_dir)


def test_a_run_whose_rows_are_gone_is_not_taken_for_one_that_never_existed(
    tmp_path: Path,
) -> None:
    data_dir = _completed_world(tmp_path)
    conn = sqlite3.connect(data_dir / "events.sqlite3")
    with conn:
        conn.execute(
            "DELETE FROM little_es_events WHERE stream ="
            " (SELECT id FROM little_es_streams WHERE stream_id = ?)",
            (run_stream_id(_RUN).hex,),
        )
    conn.close()
    with local_world(data_dir) as world:
        assert not world.run_exists("run_never_started")
        with pytest.raises(LogTamperedError, match="rows were deleted"):
            world.run_exists(_RUN)


def test_an_emptied_database_is_refused(tmp_path: Path) -> None:
    data_dir = _completed_world(tmp_path)
    conn = sqlite3.connect(data_dir / "events.sqlite3")
    with conn:
        conn.execute("DELETE FROM little_es_events")
        conn.execute(f"DELETE FROM {HEADS_TABLE}")
    conn.close()
    with pytest.raises(WorldIntegrityError, match="emptied, deleted or replaced"):
        local_world(data_dir)


def test_another_worlds_database_is_refused(tmp_path: Path) -> None:
    mine = _completed_world(tmp_path, "mine")
    theirs = _completed_world(tmp_path, "theirs")
    shutil.copy(theirs / "events.sqlite3", mine / "events.sqlite3")
    with pytest.raises(WorldIntegrityError, match="replaced by another world's"):
        local_world(mine)


def test_a_truncated_database_file_is_a_world_integrity_error(tmp_path: Path) -> None:
    data_dir = _completed_world(tmp_path)
    path = data_dir / "events.sqlite3"
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    with path.open("r+b") as f:
        f.truncate(path.stat().st_size // 2)
    with pytest.raises(WorldIntegrityError, match="corrupt"), local_world(data_dir) as world:
        world.read_run_log(_RUN)


def test_a_garbage_database_file_is_a_world_integrity_error(tmp_path: Path) -> None:
    data_dir = _completed_world(tmp_path)
    (data_dir / "events.sqlite3").write_bytes(b"not a database at all" * 1000)
    with pytest.raises(WorldIntegrityError, match="corrupt"):
        local_world(data_dir)


# ------------------------------------------------------------------- little verify


def test_little_verify_says_what_holds_and_exits_1_on_a_break(tmp_path: Path) -> None:
    data_dir = _completed_world(tmp_path)
    url = f"sqlite:///{data_dir}"

    def verify(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "little_es.cli", "verify", *args, "--world", url],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "COLUMNS": "200"},
        )

    clean = verify(_RUN)
    assert clean.returncode == 0, clean.stderr
    assert "ok: 2 streams, 0 artifacts, every chain and artifact holds" in clean.stdout
    assert "run_tamper" in clean.stdout and "run_tamper/research#1" in clean.stdout
    everything = verify("--all")
    assert everything.returncode == 0 and "ok: 3 streams" in everything.stdout

    spec = WorldSpec("sqlite", url, data_dir=data_dir)
    _edit("harness.tool_call.succeeded", b"result for q1", b"result for qX")(_Db(spec))
    broken = verify("--all")
    assert broken.returncode == 1, broken.stdout
    assert "BROKEN: 1 of 3 streams, 0 artifacts do not hold" in broken.stdout
    assert "does not match its own digest" in broken.stdout
    assert "session" in broken.stdout and "run_tamper/research#1" in broken.stdout
    assert verify(_RUN).returncode == 1
    both = verify(_RUN, "--all")
    assert both.returncode == 2 and "RUN_ID or --all" in both.stderr

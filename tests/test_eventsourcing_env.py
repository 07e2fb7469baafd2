"""eventsourcing's own environment variables change nothing of a world.

eventsourcing merges ``os.environ`` over every application's settings (and
reads each setting first as ``{APP NAME}_{SETTING}``). A team that already
runs eventsourcing applications in the same process configures them with
``PERSISTENCE_MODULE``, ``TRANSCODER_TOPIC``, ``CIPHER_KEY``,
``POSTGRES_ENABLE_DB_FUNCTIONS``... Per variable, the decision:

* spelt plainly (``TRANSCODER_TOPIC``), it is meant for the team's own
  applications: a world ignores it, little_es's choice wins (its database, its
  codec, its commit policy, its snapshots and cache);
* spelt for little_es's application (``LITTLEES_TRANSCODER_TOPIC``), it can
  only have been meant for a world: ``WorldConfigError`` names it (a world does
  not take eventsourcing settings from the environment).

Each variable of eventsourcing 9.5's source (and eventsourcing-sqlalchemy 1.0's,
the MariaDB backend's extension) is set to a value that would
change something if it were read (the table below; a test reads eventsourcing's
source and fails on a variable the table misses), and what a world is made
of is compared with a world opened without it, on every backend it concerns.

The write-ahead commit policy is a recorder's, and the recorder honours it
in eventsourcing's database-function mode too (``POSTGRES_ENABLE_DB_FUNCTIONS=y``,
set on the factory): measured on the real server in both modes.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit
from uuid import uuid4

import eventsourcing
import eventsourcing_sqlalchemy
import orjson
import psycopg
import pytest
from eventsourcing.application import Application
from eventsourcing.persistence import StoredEvent
from eventsourcing.utils import Environment

from little_es.backends.postgres import LittlePostgresApplicationRecorder, LittlePostgresFactory
from little_es.chain import GENESIS, Head, frame, payload_of
from little_es.domain import Run
from little_es.errors import WorldConfigError
from little_es.events import RunStarted, StepCompleted, StepStarted
from little_es.ids import run_stream_id
from little_es.world import (
    EVENTSOURCING_VARIABLES,
    LittleApplication,
    World,
    local_world,
    memory_world,
    postgres_world,
)
from tests.conftest import (
    WorldSpec,
    create_test_database,
    create_test_schema,
    drop_test_database,
    drop_test_schema,
    mysql_database_url,
    require_mysql,
    require_postgres,
)

ROOT = Path(__file__).resolve().parents[1]


def refusing_password() -> str:
    """A POSTGRES_GET_PASSWORD_TOPIC target: a world that called it would fail to connect."""
    raise RuntimeError("POSTGRES_GET_PASSWORD_TOPIC was read")


_AES_KEY = "6lVh4H7GXQKAchnWjvG1bg=="  # 16 random bytes, base64: a valid AESCipher key

# What each variable is set to: a value that changes something if eventsourcing reads it.
HOSTILE: dict[str, str] = {
    "AGGREGATE_CACHE_MAXSIZE": "10",
    "AGGREGATE_CACHE_FASTFORWARD": "n",
    "AGGREGATE_CACHE_FASTFORWARD_SKIPPING": "y",
    "DEEPCOPY_FROM_AGGREGATE_CACHE": "n",
    "IS_SNAPSHOTTING_ENABLED": "n",
    "PERSISTENCE_MODULE": "eventsourcing.popo",
    "INFRASTRUCTURE_FACTORY": "eventsourcing.popo",
    "FACTORY_TOPIC": "eventsourcing.popo",
    "MAPPER_TOPIC": "eventsourcing.persistence:Mapper",
    "TRANSCODER_TOPIC": "eventsourcing.persistence:JSONTranscoder",
    "CIPHER_TOPIC": "eventsourcing.cipher:AESCipher",
    "CIPHER_KEY": _AES_KEY,
    "COMPRESSOR_TOPIC": "zlib",
    "APPLICATION_RECORDER_TOPIC": "eventsourcing.sqlite:SQLiteApplicationRecorder",
    "TRACKING_RECORDER_TOPIC": "eventsourcing.sqlite:SQLiteTrackingRecorder",
    "PROCESS_RECORDER_TOPIC": "eventsourcing.sqlite:SQLiteProcessRecorder",
    "CREATE_TABLE": "n",
    "SINGLE_ROW_TRACKING": "n",
    "ORIGINATOR_ID_TYPE": "text",
    "SQLITE_DBNAME": ":memory:",
    "SQLITE_LOCK_TIMEOUT": "1",
    "POSTGRES_DBNAME": "little_es_no_such_db",
    "POSTGRES_HOST": "/nonexistent-socket-dir",
    "POSTGRES_PORT": "1",
    "POSTGRES_USER": "little_es_no_such_user",
    "POSTGRES_PASSWORD": "wrong",
    "POSTGRES_GET_PASSWORD_TOPIC": f"{__name__}:refusing_password",
    "POSTGRES_CONNECT_TIMEOUT": "1",
    "POSTGRES_CONN_MAX_AGE": "0.01",
    "POSTGRES_PRE_PING": "y",
    "POSTGRES_MAX_WAITING": "1",
    "POSTGRES_LOCK_TIMEOUT": "1",
    "POSTGRES_POOL_SIZE": "1",
    "POSTGRES_MAX_OVERFLOW": "0",
    "POSTGRES_IDLE_IN_TRANSACTION_SESSION_TIMEOUT": "0.01",
    "POSTGRES_SCHEMA": "public",
    "POSTGRES_ENABLE_DB_FUNCTIONS": "y",
    # eventsourcing-sqlalchemy (the MariaDB/MySQL backend's extension)
    "SQLALCHEMY_URL": "sqlite:///:memory:",
    "SQLALCHEMY_AUTOFLUSH": "n",
    "SQLALCHEMY_CONNECTION_CREATOR_TOPIC": f"{__name__}:refusing_password",
    "SQLALCHEMY_SCOPED_SESSION_TOPIC": f"{__name__}:refusing_password",
    "SQLALCHEMY_SCHEMA": "little_es_no_such_schema",
}

PASSED_BY_EVERY_BACKEND = {"PERSISTENCE_MODULE"}
"""Given by every backend to its application: it won over the environment already."""

# Read by eventsourcing outside any application's settings, at import or class definition.
PROCESS_WIDE = {
    "TZINFO_TOPIC",  # eventsourcing.domain's timestamps' zone: little_es stamps its own, in UTC
    "EVENTSOURCING_DISABLE_REDEFINITION_CHECK",  # a check of eventsourcing's aggregate classes
    "SPHINX_BUILD",  # eventsourcing's documentation build
}


def _variables_eventsourcing_reads() -> set[str]:
    """Every environment variable named in eventsourcing's source (its tests left out), and in
    eventsourcing-sqlalchemy's."""
    sources = [
        p.read_text()
        for root in (
            Path(eventsourcing.__file__).parent,
            Path(eventsourcing_sqlalchemy.__file__).parent,
        )
        for p in root.rglob("*.py")
        if "tests" not in p.relative_to(root).parts
    ]
    text = "\n".join(sources)
    # Setting names are class constants (POSTGRES_HOST = "POSTGRES_HOST") read as self.X.
    constants = dict(
        re.findall(r"^\s+([A-Z][A-Z0-9_]+)\s*=\s*\(?\s*\"([A-Z][A-Z0-9_]+)\"", text, re.M)
    )
    module_constants = dict(
        re.findall(r"^([A-Z][A-Z0-9_]+)\s*=\s*\"([A-Z][A-Z0-9_]+)\"", text, re.M)
    )
    found: set[str] = set()
    for attr in re.findall(r"env\.get\(\s*(?:self|cls)\.([A-Z][A-Z0-9_]+)", text):
        found.add(constants[attr])
    found.update(re.findall(r"env\.get\(\s*\"([A-Z][A-Z0-9_]+)\"", text))
    found.update(re.findall(r"getenv\(\s*\"([A-Z][A-Z0-9_]+)\"", text))
    found.update(re.findall(r"\"([A-Z][A-Z0-9_]+)\"\s+(?:not\s+)?in\s+os\.environ", text))
    for name in re.findall(r"\b([A-Z][A-Z0-9_]+)\s+(?:not\s+)?in\s+os\.environ", text):
        found.add(module_constants.get(name, name))
    # Setting names built by a factory (f"APP_{KEY}") are the constants above.
    found.update(v for k, v in constants.items() if k == v and _read_somewhere(k, text))
    return found


def _read_somewhere(attr: str, text: str) -> bool:
    return re.search(rf"\.(?:{attr})\b", text) is not None


def test_the_table_covers_every_variable_eventsourcing_reads() -> None:
    read = _variables_eventsourcing_reads()
    assert read >= {"PERSISTENCE_MODULE", "POSTGRES_ENABLE_DB_FUNCTIONS", "CIPHER_KEY"}
    assert read - PROCESS_WIDE == set(EVENTSOURCING_VARIABLES)
    assert set(HOSTILE) == set(EVENTSOURCING_VARIABLES)


# ------------------------------------------------------------------ the facts


def _facts(world: World) -> dict[str, Any]:
    """What a world's eventsourcing application is made of, as eventsourcing configured it."""
    app = world.app
    facts: dict[str, Any] = {
        "settings": {key: app.env.get(key) for key in sorted(EVENTSOURCING_VARIABLES)},
        "factory": type(app.factory),
        "mapper": type(app.mapper),
        "transcoder": type(app.mapper.transcoder),
        "cipher": app.mapper.cipher,
        "compressor": app.mapper.compressor,
        "recorder": type(app.recorder),
        "snapshots": None if app.snapshots is None else type(app.snapshots.recorder),
        "cache": app.repository.cache,
        "fastforward": app.repository.fastforward,
        "fastforward_skipping": app.repository.fastforward_skipping,
        "deepcopy_from_cache": app.repository.deepcopy_from_cache,
        "runs_view": type(world.backend.runs_view()),
    }
    datastore = getattr(app.factory, "datastore", None)
    if datastore is not None:
        for key, value in vars(datastore).items():
            if value is None or isinstance(value, str | int | float | bool):
                facts[f"datastore.{key}"] = value
        engine = getattr(datastore, "engine", None)
        if engine is not None:  # eventsourcing-sqlalchemy's
            facts["engine.url"] = str(engine.url)
            facts["engine.pool"] = (type(engine.pool), engine.pool.size())
            maker = getattr(datastore, "session_maker", None)
            kw = {} if maker is None else {k: v for k, v in maker.kw.items() if k != "bind"}
            facts["session.kw"] = kw
        pool = getattr(datastore, "pool", None)
        for key in ("min_size", "max_size", "max_waiting", "max_lifetime", "timeout"):
            if hasattr(pool, key):
                facts[f"pool.{key}"] = getattr(pool, key)
        for key in ("db_name", "synchronous", "_lock_timeout"):
            if hasattr(pool, key):
                facts[f"pool.{key}"] = getattr(pool, key)
        kwargs = getattr(pool, "kwargs", None)
        if kwargs is not None:
            facts["pool.kwargs"] = {k: v for k, v in kwargs.items() if k != "row_factory"}
            facts["pool.password_func"] = getattr(pool, "_get_password_func", None)
    return facts


def _write_a_step(world: World, run_id: str) -> None:
    """A result commit, a write-ahead commit and another result commit."""
    run = Run(run_id, world.pricer)
    run.trigger(RunStarted, run_id=run_id, workflow_id="w", workflow_version="1", ir_hash="0")
    world.save(run)
    run.trigger(StepStarted, step_path="s", step_id="s", kind="task", visit=1, attempt=1)
    world.save(run)
    run.trigger(StepCompleted, step_path="s", step_id="s", visit=1, attempt=1, output={"n": 1})
    world.save(run)


def _assert_stored_as_little_es_stores(world: World, run_id: str) -> None:
    """The run reads back; its rows are chain-framed JSON (no cipher, no compression)."""
    events = world.read_stream(run_stream_id(run_id))
    assert [e.wire_name for e in events] == ["RunStarted", "StepStarted", "StepCompleted"]
    rows = world.backend.select_rows(run_stream_id(run_id), None)
    assert [topic for _, topic, _ in rows] == ["RunStarted", "StepStarted", "StepCompleted"]
    for _, _, state in rows:
        assert isinstance(orjson.loads(payload_of(bytes(state))), dict)


# The codec, snapshot and cache settings are the application's, whatever its factory:
# memory and SQLite show them. Those of a factory or a recorder are tried on each.
ON_POSTGRES_TOO = {
    "PERSISTENCE_MODULE",
    "INFRASTRUCTURE_FACTORY",
    "FACTORY_TOPIC",
    "APPLICATION_RECORDER_TOPIC",
    "TRACKING_RECORDER_TOPIC",
    "PROCESS_RECORDER_TOPIC",
    "CREATE_TABLE",
    "SINGLE_ROW_TRACKING",
    "ORIGINATOR_ID_TYPE",
}
POSTGRES_CASES = sorted(n for n in HOSTILE if n.startswith("POSTGRES_") or n in ON_POSTGRES_TOO)
MYSQL_CASES = sorted(n for n in HOSTILE if n.startswith("SQLALCHEMY_") or n in ON_POSTGRES_TOO)
LOCAL_CASES = [
    pytest.param(name, backend, id=f"{name}-{backend}")
    for name in sorted(HOSTILE)
    if not name.startswith(("POSTGRES_", "SQLALCHEMY_"))
    for backend in (("sqlite",) if name.startswith("SQLITE_") else ("memory", "sqlite"))
]


@pytest.fixture
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> WorldSpec:
    """Fresh storage on the backend of the case."""
    if request.param == "memory":
        return WorldSpec("memory", "memory://")
    return WorldSpec("sqlite", "", data_dir=tmp_path / "world")


@pytest.fixture(scope="module")
def postgres_schema() -> Iterator[WorldSpec]:
    """One schema for the PostgreSQL cases (each writes runs of its own), dropped after them."""
    dsn = require_postgres()
    schema = create_test_schema(dsn)
    try:
        yield WorldSpec("postgres", "", dsn=dsn, schema=schema)
    finally:
        drop_test_schema(dsn, schema)


@pytest.fixture(scope="module")
def mysql_database() -> Iterator[WorldSpec]:
    """One database for the MariaDB cases (each writes runs of its own), dropped after them."""
    server = require_mysql()
    database = create_test_database(server)
    try:
        url = mysql_database_url(server, database)
        yield WorldSpec("mariadb", url, dsn=server, database=database)
    finally:
        drop_test_database(server, database)


def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in os.environ.keys() & (EVENTSOURCING_VARIABLES | {f"LITTLEES_{n}" for n in HOSTILE}):
        monkeypatch.delenv(name)


def _check_variable(variable: str, storage: WorldSpec, monkeypatch: pytest.MonkeyPatch) -> None:
    """Open, write and read a world with ``variable`` set, and compare it with one without."""
    with storage.open() as world:
        baseline = _facts(world)
        _write_a_step(world, f"run_before_{variable}")
    monkeypatch.setenv(variable, HOSTILE[variable])
    with storage.open() as world:
        facts = _facts(world)
        assert facts == baseline, {k: v for k, v in facts.items() if baseline.get(k) != v}
        _write_a_step(world, f"run_during_{variable}")
        _assert_stored_as_little_es_stores(world, f"run_during_{variable}")
        if storage.persistent:
            _assert_stored_as_little_es_stores(world, f"run_before_{variable}")


@pytest.mark.parametrize(("variable", "storage"), LOCAL_CASES, indirect=["storage"])
def test_a_plain_eventsourcing_variable_changes_nothing_of_a_world(
    variable: str, storage: WorldSpec, monkeypatch: pytest.MonkeyPatch
) -> None:
    _clean_environment(monkeypatch)
    _check_variable(variable, storage, monkeypatch)


@pytest.mark.postgres
@pytest.mark.parametrize("variable", POSTGRES_CASES)
def test_a_plain_eventsourcing_variable_changes_nothing_of_a_postgres_world(
    variable: str, postgres_schema: WorldSpec, monkeypatch: pytest.MonkeyPatch
) -> None:
    _clean_environment(monkeypatch)
    _check_variable(variable, postgres_schema, monkeypatch)


@pytest.mark.mariadb
@pytest.mark.parametrize("variable", MYSQL_CASES)
def test_a_plain_eventsourcing_variable_changes_nothing_of_a_mysql_world(
    variable: str, mysql_database: WorldSpec, monkeypatch: pytest.MonkeyPatch
) -> None:
    _clean_environment(monkeypatch)
    _check_variable(variable, mysql_database, monkeypatch)


@pytest.mark.parametrize(
    "variable",
    # Not those the backends pass themselves: they won over the environment already.
    sorted(n for n in HOSTILE if n not in PASSED_BY_EVERY_BACKEND and "SQL" not in n),
)
def test_the_comparison_sees_a_variable_that_is_read(
    variable: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # With eventsourcing's own merge of os.environ put back, each variable shows
    # in the facts the test above compares (or makes the world fail to open).
    _clean_environment(monkeypatch)
    with memory_world() as world:
        baseline = _facts(world)
    monkeypatch.setattr(LittleApplication, "construct_env", Application.construct_env)
    monkeypatch.setenv(variable, HOSTILE[variable])
    try:
        world = memory_world()
    except Exception:
        return
    with world:
        assert _facts(world) != baseline


@pytest.mark.parametrize("variable", sorted(HOSTILE))
def test_a_variable_spelt_for_little_es_is_refused_by_name(
    variable: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _clean_environment(monkeypatch)
    monkeypatch.setenv(f"LITTLEES_{variable}", HOSTILE[variable])
    with pytest.raises(WorldConfigError, match=f"LITTLEES_{variable}.*unset it"):
        local_world(tmp_path / "world")
    assert not (tmp_path / "world" / "events.sqlite3").exists()


def test_memory_and_postgres_refuse_a_variable_spelt_for_little_es(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _clean_environment(monkeypatch)
    monkeypatch.setenv("LITTLEES_TRANSCODER_TOPIC", HOSTILE["TRANSCODER_TOPIC"])
    with pytest.raises(WorldConfigError, match="LITTLEES_TRANSCODER_TOPIC"):
        memory_world()
    dsn = require_postgres()
    with pytest.raises(WorldConfigError, match=r"LITTLEES_TRANSCODER_TOPIC.*unset it"):
        postgres_world(dsn)


# ------------------------------------------------- processes: the CLI, import time


def _little(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "little_es.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )


def test_the_cli_under_a_team_s_eventsourcing_environment(tmp_path: Path) -> None:
    data_dir = tmp_path / "world"
    with local_world(data_dir) as world:
        _write_a_step(world, "run_cli")
    base = {k: v for k, v in os.environ.items() if k not in HOSTILE}
    sqlite_env = {k: v for k, v in HOSTILE.items() if not k.startswith("POSTGRES_")}
    done = _little(["report", "run_cli", "--world", f"sqlite:///{data_dir}"], base | sqlite_env)
    assert done.returncode == 0, done.stderr
    assert "run_cli" in done.stdout
    refused = _little(
        ["report", "run_cli", "--world", f"sqlite:///{data_dir}"],
        base | {"LITTLEES_CIPHER_KEY": _AES_KEY},
    )
    assert refused.returncode != 0
    assert "LITTLEES_CIPHER_KEY" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr


_TZ_SCRIPT = textwrap.dedent(
    """
    import sys
    from datetime import timedelta
    import eventsourcing.domain
    from little_es.domain import Run
    from little_es.events import RunStarted
    from little_es.ids import run_stream_id
    from little_es.world import local_world

    # The variable took effect in eventsourcing...
    assert eventsourcing.domain.TZINFO.utcoffset(None) != timedelta(0)
    with local_world(sys.argv[1]) as world:
        run = Run("run_tz", world.pricer)
        run.trigger(RunStarted, run_id="run_tz", workflow_id="w", workflow_version="1",
                    ir_hash="0")
        world.save(run)
        (event,) = world.read_stream(run_stream_id("run_tz"))
    # ...and not in little_es, which stamps its events itself, in UTC.
    assert event.timestamp.utcoffset() == timedelta(0), event.timestamp
    print("utc")
    """
)


def test_process_wide_variables_leave_timestamps_in_utc(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in HOSTILE} | {
        "TZINFO_TOPIC": "datetime:timezone.max",
        "EVENTSOURCING_DISABLE_REDEFINITION_CHECK": "y",
    }
    done = subprocess.run(
        [sys.executable, "-c", _TZ_SCRIPT, str(tmp_path / "world")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "utc"


# ------------------------------------- the commit policy in both PostgreSQL modes


@pytest.fixture
def postgres_recorder(request: pytest.FixtureRequest) -> Iterator[Callable[[], Any]]:
    """Opens LittlePostgresApplicationRecorders on a fresh schema, in the mode of the param."""
    dsn = require_postgres()
    schema = create_test_schema(dsn)
    parts = urlsplit(dsn)
    factories: list[LittlePostgresFactory] = []

    def open_recorder() -> LittlePostgresApplicationRecorder:
        env = Environment(
            "LittleEs",
            {
                "POSTGRES_DBNAME": parts.path.lstrip("/"),
                "POSTGRES_HOST": parts.hostname or "127.0.0.1",
                "POSTGRES_PORT": str(parts.port or 5432),
                "POSTGRES_USER": parts.username or "postgres",
                "POSTGRES_PASSWORD": parts.password or "",
                "POSTGRES_SCHEMA": schema,
                "POSTGRES_ENABLE_DB_FUNCTIONS": request.param,
            },
        )
        factory = LittlePostgresFactory(env)
        factories.append(factory)
        recorder = factory.application_recorder()
        assert isinstance(recorder, LittlePostgresApplicationRecorder)
        assert recorder.datastore.enable_db_functions is (request.param == "y")
        return recorder

    try:
        yield open_recorder
    finally:
        for factory in factories:
            factory.close()
        drop_test_schema(dsn, schema)


def _lsns() -> tuple[int, int]:
    with psycopg.connect(require_postgres(), autocommit=True) as conn:
        row = conn.execute(
            "SELECT pg_current_wal_insert_lsn() - '0/0', pg_current_wal_flush_lsn() - '0/0'"
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def _stored(stream: Any, version: int, prev: bytes) -> StoredEvent:
    payload = orjson.dumps({"n": version})
    return StoredEvent(stream, version, "t", frame(prev, stream, version, "t", payload))


MODES = [pytest.param("n", id="insert-statements"), pytest.param("y", id="db-functions")]


@pytest.mark.postgres
@pytest.mark.parametrize("postgres_recorder", MODES, indirect=True)
def test_postgres_write_ahead_commits_do_not_wait_for_the_flush_in_both_modes(
    postgres_recorder: Callable[[], LittlePostgresApplicationRecorder],
) -> None:
    recorder = postgres_recorder()
    stream = uuid4()
    unflushed = 0
    for version in range(1, 11):
        ids = recorder.insert_events([_stored(stream, version, GENESIS)], durable=False)
        assert ids is not None and len(ids) == 1
        inserted, flushed = _lsns()
        unflushed += flushed < inserted
    # The WAL writer flushes on its own every 200 ms: a commit that did not wait
    # is seen unflushed right after it, almost always.
    assert unflushed > 0
    assert [e.originator_version for e in recorder.select_events(stream)] == list(range(1, 11))


@pytest.mark.postgres
@pytest.mark.parametrize("postgres_recorder", MODES, indirect=True)
def test_postgres_durable_commits_flush_and_move_the_heads_in_both_modes(
    postgres_recorder: Callable[[], LittlePostgresApplicationRecorder],
) -> None:
    recorder = postgres_recorder()
    stream = uuid4()
    for version in range(1, 11):
        recorder.insert_events([_stored(stream, version, GENESIS)], durable=False)
        written_ahead, _ = _lsns()
        head = Head(version, bytes([version]) * 32, bytes([version]) * 32)
        recorder.insert_events(
            [_stored(stream, version + 100, GENESIS)], heads={stream: head}, durable=True
        )
        _, flushed = _lsns()
        assert flushed >= written_ahead
        with recorder.datastore.get_connection() as conn, conn.cursor() as cursor:
            cursor.execute(recorder.select_head_statement, (stream,))
            row = cursor.fetchone()
        assert row is not None
        assert (row["version"], bytes(row["digest"])) == (version, head.digest)


@pytest.mark.postgres
@pytest.mark.parametrize("postgres_recorder", MODES, indirect=True)
def test_postgres_a_conflicting_insert_writes_nothing_in_both_modes(
    postgres_recorder: Callable[[], LittlePostgresApplicationRecorder],
) -> None:
    from eventsourcing.persistence import IntegrityError

    recorder = postgres_recorder()
    stream = uuid4()
    recorder.insert_events([_stored(stream, 1, GENESIS)])
    head = Head(2, b"\x02" * 32, b"\x02" * 32)
    with pytest.raises(IntegrityError):
        recorder.insert_events(
            [_stored(stream, 2, GENESIS), _stored(stream, 1, GENESIS)], heads={stream: head}
        )
    assert [e.originator_version for e in recorder.select_events(stream)] == [1]
    with recorder.datastore.get_connection() as conn, conn.cursor() as cursor:
        cursor.execute(recorder.select_head_statement, (stream,))
        assert cursor.fetchone() is None

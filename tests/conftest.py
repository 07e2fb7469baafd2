"""Shared fixtures: one world per storage backend, so one suite runs against all of them.

Fixtures
--------
``backend``
    The backend name, ``"memory"``, ``"sqlite"``, ``"postgres"`` or ``"mariadb"``. Any test that
    (indirectly) uses it runs once per backend. Restrict a test with
    ``@pytest.mark.backends("sqlite", "postgres")``.
``world_spec``
    A :class:`WorldSpec`: fresh, isolated storage for this test (a temporary data
    directory, a PostgreSQL schema or a MariaDB database created for the test and
    dropped after it)
    and the URL that names it, for ``open_world()`` or a subprocess's
    ``LITTLE_ES_WORLD``.
``world``
    An open :class:`~little_es.world.World` on ``world_spec``, closed after the test.
``world_factory``
    A callable that opens another ``World`` on the same storage (to prove
    durability across close/reopen); every world it opens is closed after the test.

A world decides when it is opened whether it has a snapshot store, so a test
that changes ``LittleApplication.snapshotting_intervals`` (with
``monkeypatch.setitem``) should open its world with ``world_factory`` after the
change rather than take the ``world`` fixture.

PostgreSQL comes from ``$LITTLE_ES_TEST_POSTGRES_DSN`` (default
``postgresql://postgres@127.0.0.1:5432/test``). When the server does not answer,
postgres tests are skipped, except under ``CI=true`` where they fail: CI must
not pass by skipping its PostgreSQL coverage. The unittest-style conformance
cases of ``test_backends.py`` use the same helpers (:func:`postgres_problem`,
:func:`create_test_schema`, :func:`drop_test_schema`) to the same effect.

MariaDB (or MySQL) likewise comes from ``$LITTLE_ES_TEST_MYSQL_URL`` (default
``mysql+pymysql://root@127.0.0.1:3306/test``; the server, not the database, is
what counts: each test gets a database of its own), with :func:`mysql_problem`,
:func:`create_test_database` and :func:`drop_test_database`.

Adding a backend to this suite is one branch of :func:`world_spec` (fresh
storage and its URL) and one of :meth:`WorldSpec.open` (the factory).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

import psycopg
import pymysql
import pytest
from psycopg import sql

from little_es.world import World, local_world, memory_world, mysql_world, postgres_world

POSTGRES_DSN_ENV_VAR = "LITTLE_ES_TEST_POSTGRES_DSN"
DEFAULT_POSTGRES_DSN = "postgresql://postgres@127.0.0.1:5432/test"
MYSQL_URL_ENV_VAR = "LITTLE_ES_TEST_MYSQL_URL"
DEFAULT_MYSQL_URL = "mysql+pymysql://root@127.0.0.1:3306/test"
ALL_BACKENDS = ("memory", "sqlite", "postgres", "mariadb")
PERSISTENT_BACKENDS = ("sqlite", "postgres", "mariadb")
_SERVER_MARKS = {"postgres": pytest.mark.postgres, "mariadb": pytest.mark.mariadb}

_postgres_problem: dict[str, str | None] = {}
_mysql_problem: dict[str, str | None] = {}


def pytest_configure(config: pytest.Config) -> None:
    """Register the ``backends`` marker."""
    config.addinivalue_line(
        "markers",
        "backends(*names): run a test using the `backend` fixture only on these backends"
        f" (of {', '.join(ALL_BACKENDS)})",
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrise ``backend`` over every backend, or over those ``@backends(...)`` names."""
    if "backend" not in metafunc.fixturenames:
        return
    marker = metafunc.definition.get_closest_marker("backends")
    names = tuple(marker.args) if marker is not None else ALL_BACKENDS
    unknown = sorted(set(names) - set(ALL_BACKENDS))
    if unknown:
        raise pytest.UsageError(
            f"{metafunc.definition.nodeid}: unknown backend(s) {unknown}; use {ALL_BACKENDS}"
        )
    metafunc.parametrize(
        "backend",
        [
            pytest.param(n, id=n, marks=[_SERVER_MARKS[n]] if n in _SERVER_MARKS else [])
            for n in names
        ],
    )


def postgres_dsn() -> str:
    """The DSN of the test PostgreSQL server (``$LITTLE_ES_TEST_POSTGRES_DSN`` or the default)."""
    return os.environ.get(POSTGRES_DSN_ENV_VAR) or DEFAULT_POSTGRES_DSN


def postgres_problem() -> str | None:
    """Why the test PostgreSQL server cannot be used (skip, or fail under CI=true), or None."""
    dsn = postgres_dsn()
    if dsn not in _postgres_problem:
        try:
            with psycopg.connect(dsn, connect_timeout=3) as conn:
                conn.execute("SELECT 1")
            _postgres_problem[dsn] = None
        except psycopg.Error as exc:
            _postgres_problem[dsn] = f"{type(exc).__name__}: {exc}".strip()
    problem = _postgres_problem[dsn]
    if problem is None:
        return None
    return f"PostgreSQL not reachable at {dsn} ({problem}); set {POSTGRES_DSN_ENV_VAR}"


def postgres_required_in_ci() -> bool:
    """Whether an unreachable PostgreSQL fails the tests instead of skipping them."""
    return os.environ.get("CI", "").lower() == "true"


def require_postgres() -> str:
    """Return the test DSN; skip the test if the server does not answer (fail under CI=true)."""
    reason = postgres_problem()
    if reason is not None:
        if postgres_required_in_ci():
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    return postgres_dsn()


def create_test_schema(dsn: str) -> str:
    """Create a fresh schema for one test and return its name."""
    schema = f"little_es_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    return schema


def drop_test_schema(dsn: str, schema: str) -> None:
    """Drop a test's schema and everything in it."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        # A world a test left open must not make the teardown hang forever.
        conn.execute("SET lock_timeout = '10s'")
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def mysql_url() -> str:
    """The URL of the test MariaDB server (``$LITTLE_ES_TEST_MYSQL_URL`` or the default)."""
    return os.environ.get(MYSQL_URL_ENV_VAR) or DEFAULT_MYSQL_URL


def _mysql_connect(url: str, database: str | None = None) -> pymysql.connections.Connection[Any]:
    parts = urlsplit(url)
    return pymysql.connect(
        host=parts.hostname or "127.0.0.1",
        port=parts.port or 3306,
        user=unquote(parts.username or "root"),
        password=unquote(parts.password or ""),
        database=database,
        autocommit=True,
        connect_timeout=3,
    )


def mysql_problem() -> str | None:
    """Why the test MariaDB server cannot be used (skip, or fail under CI=true), or None."""
    url = mysql_url()
    if url not in _mysql_problem:
        try:
            with _mysql_connect(url) as conn, conn.cursor() as cur:
                cur.execute("SELECT 1")
            _mysql_problem[url] = None
        except pymysql.err.Error as exc:
            _mysql_problem[url] = f"{type(exc).__name__}: {exc}".strip()
    problem = _mysql_problem[url]
    if problem is None:
        return None
    return f"MariaDB not reachable at {url} ({problem}); set {MYSQL_URL_ENV_VAR}"


def require_mysql() -> str:
    """Return the test server's URL; skip the test if it does not answer (fail under CI=true)."""
    reason = mysql_problem()
    if reason is not None:
        if postgres_required_in_ci():
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    return mysql_url()


def create_test_database(url: str) -> str:
    """Create a fresh database for one test on the server of ``url`` and return its name."""
    database = f"little_es_test_{uuid.uuid4().hex[:12]}"
    with _mysql_connect(url) as conn, conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE `{database}`")
    return database


def drop_test_database(url: str, database: str) -> None:
    """Drop a test's database and everything in it."""
    with _mysql_connect(url) as conn, conn.cursor() as cur:
        # A world a test left open must not make the teardown hang forever.
        cur.execute("SET SESSION lock_wait_timeout = 10")
        cur.execute(f"DROP DATABASE IF EXISTS `{database}`")


def mysql_database_url(url: str, database: str) -> str:
    """``url`` (a server's) naming ``database``."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{database}"))


@dataclass(frozen=True)
class WorldSpec:
    """Where one test's world lives.

    ``url`` is accepted by :func:`little_es.world.open_world` (and so by
    ``LITTLE_ES_WORLD`` in a subprocess). ``persistent`` is False for memory
    worlds: each :meth:`open` of those is a new, empty world.
    """

    backend: str
    url: str
    data_dir: Path | None = None
    """The sqlite data directory (None for other backends)."""
    dsn: str | None = None
    """The PostgreSQL DSN without the schema, or the MariaDB server's URL (None otherwise)."""
    schema: str | None = None
    """The PostgreSQL schema of this test (None for other backends)."""
    database: str | None = None
    """The MariaDB database of this test (None for other backends)."""

    @property
    def persistent(self) -> bool:
        """Whether a world opened again on this spec sees what an earlier one wrote."""
        return self.backend != "memory"

    def open(self) -> World:
        """Open a world on this storage (the caller closes it)."""
        if self.backend == "memory":
            return memory_world()
        if self.backend == "sqlite":
            assert self.data_dir is not None
            return local_world(self.data_dir)
        if self.backend == "mariadb":
            return mysql_world(self.url)
        assert self.dsn is not None and self.schema is not None
        return postgres_world(self.dsn, schema=self.schema)

    def connect_postgres(self) -> psycopg.Connection[tuple[object, ...]]:
        """An autocommit psycopg connection whose search_path is this test's schema."""
        assert self.dsn is not None and self.schema is not None
        conn = psycopg.connect(self.dsn, autocommit=True)
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(self.schema)))
        return conn

    def connect_mysql(self) -> pymysql.connections.Connection[Any]:
        """An autocommit PyMySQL connection to this test's MariaDB database."""
        assert self.database is not None
        return _mysql_connect(self.url, self.database)


def with_query(dsn: str, key: str, value: str) -> str:
    """``dsn`` with one more query parameter."""
    return f"{dsn}{'&' if '?' in dsn else '?'}{key}={value}"


@pytest.fixture
def world_spec(backend: str, tmp_path: Path) -> Iterator[WorldSpec]:
    """Fresh storage for this test on ``backend``; a PostgreSQL schema is dropped afterwards."""
    if backend == "memory":
        yield WorldSpec("memory", "memory://")
        return
    if backend == "sqlite":
        data_dir = tmp_path / "world"
        yield WorldSpec("sqlite", f"sqlite:///{data_dir}", data_dir=data_dir)
        return
    if backend == "mariadb":
        server = require_mysql()
        database = create_test_database(server)
        try:
            yield WorldSpec(
                "mariadb",
                mysql_database_url(server, database),
                dsn=server,
                database=database,
            )
        finally:
            drop_test_database(server, database)
        return
    dsn = require_postgres()
    schema = create_test_schema(dsn)
    try:
        yield WorldSpec("postgres", with_query(dsn, "schema", schema), dsn=dsn, schema=schema)
    finally:
        drop_test_schema(dsn, schema)


@pytest.fixture
def world_factory(world_spec: WorldSpec) -> Iterator[Callable[[], World]]:
    """Open (more) worlds on this test's storage; all of them are closed after the test."""
    opened: list[World] = []

    def open_another() -> World:
        w = world_spec.open()
        opened.append(w)
        return w

    yield open_another
    for w in reversed(opened):
        w.close()


@pytest.fixture
def world(world_factory: Callable[[], World]) -> World:
    """An open world on this test's storage, closed after the test."""
    return world_factory()

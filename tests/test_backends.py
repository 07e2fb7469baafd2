"""The backend conformance suite on every built-in backend, and what is particular to each.

:mod:`little_es.testing.backend` holds the suite; here each backend gets one
storage mixin (fresh storage per test, and how to open a world on it) and one
subclass per conformance case, plus the hooks that need to know how the
backend stores things (corrupting an artifact, watching for mutations).
PostgreSQL cases are skipped when the server does not answer, and fail under
``CI=true`` (as ``conftest.py`` does for the ``world`` fixture).
"""

from __future__ import annotations

import functools
import re
import sqlite3
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest import TestCase, mock
from urllib.parse import urlsplit

import psycopg
import pytest
from eventsourcing.persistence import (
    AggregateRecorder,
    ApplicationRecorder,
    ProcessRecorder,
    TrackingRecorder,
)
from eventsourcing.popo import POPOAggregateRecorder, POPOProcessRecorder, POPOTrackingRecorder
from eventsourcing.postgres import (
    PostgresAggregateRecorder,
    PostgresProcessRecorder,
    PostgresTrackingRecorder,
)
from eventsourcing.sqlite import (
    SQLiteAggregateRecorder,
    SQLiteProcessRecorder,
    SQLiteTrackingRecorder,
)
from eventsourcing.tests import persistence
from eventsourcing.utils import Environment, get_topic
from psycopg import sql

from little_es.backends.memory import (
    LittlePOPOApplicationRecorder,
    LittlePOPOFactory,
    MemoryArtifactStore,
)
from little_es.backends.postgres import LittlePostgresApplicationRecorder, LittlePostgresFactory
from little_es.backends.sqlite import (
    SYNCHRONOUS_ENV,
    FileArtifactStore,
    LittleSQLiteApplicationRecorder,
    LittleSQLiteFactory,
)
from little_es.testing import backend as conformance
from little_es.values import ArtifactRef
from little_es.world import World, local_world, memory_world, postgres_world
from tests.conftest import (
    create_test_schema,
    drop_test_schema,
    postgres_dsn,
    postgres_problem,
    postgres_required_in_ci,
    with_query,
)

_MUTATION = re.compile(r"\b(UPDATE|DELETE|REPLACE|DROP|TRUNCATE|ALTER)\b", re.IGNORECASE)

# ------------------------------------------------------------------------ memory


class MemoryStorage(conformance.WorldTestCase):
    """A new memory world each time: nothing survives a close."""

    def make_world(self) -> World:
        """A fresh memory world."""
        return memory_world()


class TestMemoryWorld(MemoryStorage, conformance.BackendTestCase):
    persistent = False

    def corrupt_artifact(self, world: World, ref: ArtifactRef, data: bytes) -> None:
        assert isinstance(world.artifacts, MemoryArtifactStore)
        world.artifacts._blobs[ref.sha256] = data


class TestMemoryEventRecorder(MemoryStorage, conformance.EventRecorderTestCase):
    pass


class TestMemoryWriteAheadEventRecorder(MemoryStorage, conformance.WriteAheadEventRecorderTestCase):
    pass


class TestMemorySnapshotRecorder(MemoryStorage, conformance.SnapshotRecorderTestCase):
    pass


class TestMemoryRunsView(MemoryStorage, conformance.RunsViewTestCase):
    pass


class TestMemoryProcessRecorder(MemoryStorage, conformance.ProcessRecorderTestCase):
    pass


class TestMemoryExampleApplication(MemoryStorage, conformance.ExampleApplicationTestCase):
    pass


class _POPOTrackingSubclass(POPOTrackingRecorder):
    pass


class TestMemoryFactory(persistence.InfrastructureFactoryTestCase[LittlePOPOFactory]):
    """eventsourcing's factory case on little_es's in-memory factory (stream heads)."""

    def setUp(self) -> None:
        self.env = Environment("TestCase")
        self.env["PERSISTENCE_MODULE"] = get_topic(LittlePOPOFactory)
        super().setUp()

    def expected_factory_class(self) -> type[LittlePOPOFactory]:
        return LittlePOPOFactory

    def expected_aggregate_recorder_class(self) -> type[AggregateRecorder]:
        return POPOAggregateRecorder

    def expected_application_recorder_class(self) -> type[ApplicationRecorder]:
        return LittlePOPOApplicationRecorder

    def expected_tracking_recorder_class(self) -> type[TrackingRecorder]:
        return POPOTrackingRecorder

    def tracking_recorder_subclass(self) -> type[TrackingRecorder]:
        return _POPOTrackingSubclass

    def expected_process_recorder_class(self) -> type[ProcessRecorder]:
        return POPOProcessRecorder


# ------------------------------------------------------------------------ SQLite


class SQLiteStorage(conformance.WorldTestCase):
    """A data directory of its own per test."""

    def setUp(self) -> None:
        super().setUp()
        self.data_dir = Path(self.enterContext(tempfile.TemporaryDirectory())) / "world"

    def make_world(self) -> World:
        """A local world on this test's data directory."""
        return local_world(self.data_dir)


class TestSQLiteWorld(SQLiteStorage, conformance.BackendTestCase):
    def world_url(self) -> str:
        return f"sqlite:///{self.data_dir}"

    def corrupt_artifact(self, world: World, ref: ArtifactRef, data: bytes) -> None:
        assert isinstance(world.artifacts, FileArtifactStore)
        path = self.data_dir / "artifacts" / ref.sha256[:2] / ref.sha256
        assert path.is_file()
        path.write_bytes(data)

    @contextmanager
    def trap_mutations(self) -> Iterator[None]:
        statements: list[str] = []
        real_connect = sqlite3.connect

        def traced_connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
            conn: sqlite3.Connection = real_connect(*args, **kwargs)
            conn.set_trace_callback(statements.append)
            return conn

        with mock.patch.object(sqlite3, "connect", traced_connect):
            yield
        on_events = [s for s in statements if re.search(r"stored_(events|snapshots)", s)]
        inserts = [s.lstrip().upper() for s in on_events]
        assert any(s.startswith("INSERT INTO STORED_EVENTS") for s in inserts)
        assert any(s.startswith("INSERT INTO STORED_SNAPSHOTS") for s in inserts)
        self.assertEqual([s for s in on_events if _MUTATION.search(s)], [])


class TestSQLiteEventRecorder(SQLiteStorage, conformance.EventRecorderTestCase):
    pass


class TestSQLiteWriteAheadEventRecorder(SQLiteStorage, conformance.WriteAheadEventRecorderTestCase):
    pass


class TestSQLiteSnapshotRecorder(SQLiteStorage, conformance.SnapshotRecorderTestCase):
    pass


class TestSQLiteRunsView(SQLiteStorage, conformance.RunsViewTestCase):
    pass


class TestSQLiteProcessRecorder(SQLiteStorage, conformance.ProcessRecorderTestCase):
    pass


class TestSQLiteExampleApplication(SQLiteStorage, conformance.ExampleApplicationTestCase):
    pass


class _TrackingSubclass(SQLiteTrackingRecorder):
    pass


class TestSQLiteFactory(persistence.InfrastructureFactoryTestCase[LittleSQLiteFactory]):
    """eventsourcing's factory case on little_es's SQLite factory (the world's fsync policy)."""

    def setUp(self) -> None:
        self.env = Environment("TestCase")
        self.env["PERSISTENCE_MODULE"] = get_topic(LittleSQLiteFactory)
        self.env["SQLITE_DBNAME"] = ":memory:"
        self.env[SYNCHRONOUS_ENV] = "full"
        super().setUp()

    def expected_factory_class(self) -> type[LittleSQLiteFactory]:
        return LittleSQLiteFactory

    def expected_aggregate_recorder_class(self) -> type[AggregateRecorder]:
        return SQLiteAggregateRecorder

    def expected_application_recorder_class(self) -> type[ApplicationRecorder]:
        return LittleSQLiteApplicationRecorder

    def expected_tracking_recorder_class(self) -> type[TrackingRecorder]:
        return SQLiteTrackingRecorder

    def tracking_recorder_subclass(self) -> type[TrackingRecorder]:
        return _TrackingSubclass

    def expected_process_recorder_class(self) -> type[ProcessRecorder]:
        return SQLiteProcessRecorder


# -------------------------------------------------------------------- PostgreSQL


def _fresh_postgres_schema(case: TestCase) -> tuple[str, str]:
    """The test server's DSN and a schema for ``case``, dropped after it (or skip, or fail)."""
    reason = postgres_problem()
    if reason is not None:
        if postgres_required_in_ci():
            case.fail(reason)
        case.skipTest(reason)
    dsn = postgres_dsn()
    schema = create_test_schema(dsn)
    case.addCleanup(drop_test_schema, dsn, schema)
    return dsn, schema


class PostgresStorage(conformance.WorldTestCase):
    """A schema of its own per test, dropped after it."""

    def setUp(self) -> None:
        super().setUp()
        self.dsn, self.schema = _fresh_postgres_schema(self)

    def make_world(self) -> World:
        """A PostgreSQL world in this test's schema."""
        return postgres_world(self.dsn, schema=self.schema)

    def connect(self) -> psycopg.Connection[tuple[Any, ...]]:
        """An autocommit connection whose search_path is this test's schema."""
        conn = psycopg.connect(self.dsn, autocommit=True)
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(self.schema)))
        return conn


@pytest.mark.postgres
class TestPostgresWorld(PostgresStorage, conformance.BackendTestCase):
    def world_url(self) -> str:
        return with_query(self.dsn, "schema", self.schema)

    def corrupt_artifact(self, world: World, ref: ArtifactRef, data: bytes) -> None:
        with self.connect() as conn:
            cur = conn.execute(
                "UPDATE little_es_artifacts SET data = %s WHERE sha256 = %s", (data, ref.sha256)
            )
            self.assertEqual(cur.rowcount, 1)

    @contextmanager
    def trap_mutations(self) -> Iterator[None]:
        # Create the tables, then make every UPDATE, DELETE or TRUNCATE on them
        # raise, even one that would match no row (statement-level triggers).
        self.make_world().close()
        with self.connect() as conn:
            conn.execute(
                "CREATE FUNCTION little_es_refuse() RETURNS trigger LANGUAGE plpgsql AS $$"
                " BEGIN RAISE EXCEPTION 'little_es test: % on % is forbidden', TG_OP,"
                " TG_TABLE_NAME; END $$"
            )
            for table in ("littlees_events", "littlees_snapshots"):
                conn.execute(
                    f"CREATE TRIGGER refuse_mutation BEFORE UPDATE OR DELETE OR TRUNCATE ON {table}"
                    " FOR EACH STATEMENT EXECUTE FUNCTION little_es_refuse()"
                )
        yield
        with self.connect() as conn:
            count = conn.execute("SELECT count(*) FROM littlees_events").fetchone()
            snaps = conn.execute("SELECT count(*) FROM littlees_snapshots").fetchone()
            assert (
                count is not None
                and isinstance(count[0], int)
                and count[0] >= self.exercised_events > 50
            )
            assert snaps is not None and isinstance(snaps[0], int) and snaps[0] > 0
            # The trap itself works: a no-op DELETE is refused.
            with self.assertRaisesRegex(psycopg.errors.RaiseException, "DELETE on littlees_events"):
                conn.execute("DELETE FROM littlees_events WHERE false")

    def test_postgres_leases_are_scoped_to_the_worlds_schema(self) -> None:
        other_schema = f"{self.schema}_b"
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(other_schema)))
        self.addCleanup(drop_test_schema, self.dsn, other_schema)
        with (
            postgres_world(self.dsn, schema=other_schema) as neighbour,
            self.world.run_lease("run_lease"),
            neighbour.run_lease("run_lease"),
        ):
            pass

    def test_postgres_lease_closes_its_connection_when_the_lock_query_fails(self) -> None:
        world = self.world
        opened: list[psycopg.Connection[Any]] = []
        real_connect = psycopg.connect

        def connect(*args: Any, **kwargs: Any) -> psycopg.Connection[Any]:
            opened.append(real_connect(*args, **kwargs))
            return opened[-1]

        def execute(*args: Any, **kwargs: Any) -> Any:
            raise psycopg.OperationalError("the server went away")

        with (
            mock.patch.object(psycopg, "connect", connect),
            mock.patch.object(psycopg.Connection, "execute", execute),
            self.assertRaisesRegex(psycopg.OperationalError, "went away"),
        ):
            world.run_lease("run_lease_fails").__enter__()
        self.assertEqual(len(opened), 1)
        self.assertTrue(opened[0].closed)
        with world.run_lease("run_lease_fails"):
            pass


@pytest.mark.postgres
class TestPostgresEventRecorder(PostgresStorage, conformance.EventRecorderTestCase):
    pass


@pytest.mark.postgres
class TestPostgresWriteAheadEventRecorder(
    PostgresStorage, conformance.WriteAheadEventRecorderTestCase
):
    pass


@pytest.mark.postgres
class TestPostgresSnapshotRecorder(PostgresStorage, conformance.SnapshotRecorderTestCase):
    pass


@pytest.mark.postgres
class TestPostgresRunsView(PostgresStorage, conformance.RunsViewTestCase):
    pass


@pytest.mark.postgres
class TestPostgresProcessRecorder(PostgresStorage, conformance.ProcessRecorderTestCase):
    pass


@pytest.mark.postgres
class TestPostgresExampleApplication(PostgresStorage, conformance.ExampleApplicationTestCase):
    pass


# eventsourcing's database-function mode (POSTGRES_ENABLE_DB_FUNCTIONS): a World does
# not take it from the environment, but the recorder of its factory keeps little_es's
# commit policy and heads in that mode too, for an application that sets it.


def _postgres_factory_env(dsn: str, schema: str) -> dict[str, str]:
    parts = urlsplit(dsn)
    return {
        "PERSISTENCE_MODULE": get_topic(LittlePostgresFactory),
        "POSTGRES_DBNAME": parts.path.lstrip("/"),
        "POSTGRES_HOST": parts.hostname or "127.0.0.1",
        "POSTGRES_PORT": str(parts.port or 5432),
        "POSTGRES_USER": parts.username or "postgres",
        "POSTGRES_PASSWORD": parts.password or "",
        "POSTGRES_SCHEMA": schema,
        "POSTGRES_ENABLE_DB_FUNCTIONS": "y",
    }


class _DbFunctionsRecorder(PostgresStorage):
    """The recorder of a factory in database-function mode (a mixin of the cases below)."""

    durable: bool

    def create_recorder(self) -> ApplicationRecorder:
        factory = LittlePostgresFactory(
            Environment("LittleEs", _postgres_factory_env(self.dsn, self.schema))
        )
        self.addCleanup(factory.close)
        recorder = factory.application_recorder()
        assert isinstance(recorder, LittlePostgresApplicationRecorder)
        assert recorder.datastore.enable_db_functions
        if not self.durable:
            insert = functools.partial(recorder.insert_events, durable=False)
            self.enterContext(mock.patch.object(recorder, "insert_events", insert))
        return recorder


@pytest.mark.postgres
class TestPostgresDbFunctionsEventRecorder(_DbFunctionsRecorder, conformance.EventRecorderTestCase):
    pass


@pytest.mark.postgres
class TestPostgresDbFunctionsWriteAheadEventRecorder(
    _DbFunctionsRecorder, conformance.WriteAheadEventRecorderTestCase
):
    pass


@pytest.mark.postgres
class TestPostgresDbFunctionsExampleApplication(
    PostgresStorage, conformance.ExampleApplicationTestCase
):
    def example_env(self) -> dict[str, str]:
        return _postgres_factory_env(self.dsn, self.schema)


class _PostgresTrackingSubclass(PostgresTrackingRecorder):
    pass


@pytest.mark.postgres
class TestPostgresFactory(persistence.InfrastructureFactoryTestCase[LittlePostgresFactory]):
    """eventsourcing's factory case on little_es's PostgreSQL factory (write-ahead commits)."""

    def setUp(self) -> None:
        # The schema first: the factory case's setUp constructs the factory from env.
        dsn, schema = _fresh_postgres_schema(self)
        parts = urlsplit(dsn)
        self.env = Environment("TestCase")
        self.env["PERSISTENCE_MODULE"] = get_topic(LittlePostgresFactory)
        self.env["POSTGRES_DBNAME"] = parts.path.lstrip("/")
        self.env["POSTGRES_HOST"] = parts.hostname or "127.0.0.1"
        self.env["POSTGRES_PORT"] = str(parts.port or 5432)
        self.env["POSTGRES_USER"] = parts.username or "postgres"
        self.env["POSTGRES_PASSWORD"] = parts.password or ""
        self.env["POSTGRES_SCHEMA"] = schema
        super().setUp()

    def expected_factory_class(self) -> type[LittlePostgresFactory]:
        return LittlePostgresFactory

    def expected_aggregate_recorder_class(self) -> type[AggregateRecorder]:
        return PostgresAggregateRecorder

    def expected_application_recorder_class(self) -> type[ApplicationRecorder]:
        return LittlePostgresApplicationRecorder

    def expected_tracking_recorder_class(self) -> type[TrackingRecorder]:
        return PostgresTrackingRecorder

    def tracking_recorder_subclass(self) -> type[TrackingRecorder]:
        return _PostgresTrackingSubclass

    def expected_process_recorder_class(self) -> type[ProcessRecorder]:
        return PostgresProcessRecorder

"""The backend conformance suite on every built-in backend, and what is particular to each.

:mod:`little_es.testing.backend` holds the suite; here each backend gets one
storage mixin (fresh storage per test, and how to open a world on it) and one
subclass per conformance case, plus the hooks that need to know how the
backend stores things (corrupting an artifact, watching for mutations).
PostgreSQL and MariaDB cases are skipped when the server does not answer, and
fail under ``CI=true`` (as ``conftest.py`` does for the ``world`` fixture).
"""

from __future__ import annotations

import contextlib
import functools
import re
import sqlite3
import tempfile
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest import TestCase, mock
from urllib.parse import urlsplit

import psycopg
import pymysql
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
from eventsourcing_sqlalchemy.recorders import (
    SQLAlchemyAggregateRecorder,
    SQLAlchemyTrackingRecorder,
)
from psycopg import sql

from little_es.backends.base import WORLD_APPLICATION_NAME, keeps_eventsourcing_table
from little_es.backends.memory import (
    LittlePOPOApplicationRecorder,
    LittlePOPOFactory,
    MemoryArtifactStore,
)
from little_es.backends.mysql import (
    LittleSQLAlchemyApplicationRecorder,
    LittleSQLAlchemyFactory,
    LittleSQLAlchemyProcessRecorder,
    MySQLBackend,
)
from little_es.backends.postgres import (
    CompactPostgresApplicationRecorder,
    LittlePostgresApplicationRecorder,
    LittlePostgresFactory,
)
from little_es.backends.sqlite import (
    SYNCHRONOUS_ENV,
    CompactSQLiteApplicationRecorder,
    FileArtifactStore,
    LittleSQLiteApplicationRecorder,
    LittleSQLiteFactory,
)
from little_es.errors import WorldStorageError
from little_es.events import StepCompleted, StepStarted
from little_es.testing import backend as conformance
from little_es.values import ArtifactRef
from little_es.world import World, local_world, memory_world, mysql_world, postgres_world
from tests.conftest import (
    create_test_database,
    create_test_schema,
    drop_test_database,
    drop_test_schema,
    mysql_database_url,
    mysql_problem,
    mysql_url,
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


@pytest.mark.parametrize(
    ("compact", "eventsourcing", "kept"),
    [
        (False, False, False),  # a new world
        (False, True, True),  # made by an earlier version
        (True, False, False),
        (True, True, False),  # another recorder made eventsourcing's table beside it
    ],
)
def test_the_layout_is_the_compact_one_wherever_its_table_is(
    compact: bool, eventsourcing: bool, kept: bool
) -> None:
    assert keeps_eventsourcing_table(compact=compact, eventsourcing=eventsourcing) is kept


class SQLiteStorage(conformance.WorldTestCase):
    """A data directory of its own per test."""

    def setUp(self) -> None:
        super().setUp()
        self.data_dir = Path(self.enterContext(tempfile.TemporaryDirectory())) / "world"

    def make_world(self) -> World:
        """A local world on this test's data directory."""
        return local_world(self.data_dir)


class SQLiteEventsourcingLayoutStorage(SQLiteStorage):
    """A data directory whose events file holds eventsourcing's table, as files made by
    versions before the compact layout do: the world keeps that layout."""

    def make_world(self) -> World:
        """A local world on a file that already has eventsourcing's events table."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with contextlib.closing(sqlite3.connect(self.data_dir / "events.sqlite3")) as conn:
            conn.execute(_EVENTSOURCING_EVENTS_TABLE)
        world = local_world(self.data_dir)
        assert type(world.app.recorder) is LittleSQLiteApplicationRecorder
        return world


# What eventsourcing 9's SQLite application recorder creates.
_EVENTSOURCING_EVENTS_TABLE = (
    "CREATE TABLE IF NOT EXISTS stored_events (originator_id TEXT, originator_version INTEGER,"
    " topic TEXT, state BLOB, PRIMARY KEY (originator_id, originator_version))"
)


class TestSQLiteWorld(SQLiteStorage, conformance.BackendTestCase):
    # What every append inserts into, and nothing may update or delete.
    event_tables = ("little_es_events", "little_es_streams", "stored_snapshots")

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
        on_events = [s for s in statements if re.search("|".join(self.event_tables), s)]
        inserts = [s.lstrip().upper() for s in on_events]
        for table in self.event_tables:
            assert any(s.startswith(f"INSERT INTO {table.upper()}") for s in inserts), table
        self.assertEqual([s for s in on_events if _MUTATION.search(s)], [])


class TestSQLiteEventsourcingLayoutWorld(SQLiteEventsourcingLayoutStorage, TestSQLiteWorld):
    event_tables = ("stored_events", "stored_snapshots")
    apart_from_other_applications = False


class TestSQLiteEventRecorder(SQLiteStorage, conformance.EventRecorderTestCase):
    pass


class TestSQLiteEventsourcingLayoutEventRecorder(
    SQLiteEventsourcingLayoutStorage, conformance.EventRecorderTestCase
):
    pass


class TestSQLiteEventsourcingLayoutWriteAheadEventRecorder(
    SQLiteEventsourcingLayoutStorage, conformance.WriteAheadEventRecorderTestCase
):
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
    """eventsourcing's factory case on little_es's SQLite factory (the world's fsync policy),
    for the world's application: the one it gives the compact layout."""

    def setUp(self) -> None:
        self.env = Environment(WORLD_APPLICATION_NAME)
        self.env["PERSISTENCE_MODULE"] = get_topic(LittleSQLiteFactory)
        self.env["SQLITE_DBNAME"] = ":memory:"
        self.env[SYNCHRONOUS_ENV] = "full"
        super().setUp()

    def expected_factory_class(self) -> type[LittleSQLiteFactory]:
        return LittleSQLiteFactory

    def expected_aggregate_recorder_class(self) -> type[AggregateRecorder]:
        return SQLiteAggregateRecorder

    def expected_application_recorder_class(self) -> type[ApplicationRecorder]:
        return CompactSQLiteApplicationRecorder

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


class PostgresEventsourcingLayoutStorage(PostgresStorage):
    """A schema that holds eventsourcing's events table, as schemas made by versions before
    the compact layout do: the world keeps that layout."""

    def make_world(self) -> World:
        """A PostgreSQL world in a schema that already has eventsourcing's events table."""
        with self.connect() as conn:
            conn.execute(_EVENTSOURCING_POSTGRES_EVENTS_TABLE)
        world = postgres_world(self.dsn, schema=self.schema)
        assert type(world.app.recorder) is LittlePostgresApplicationRecorder
        return world


# What eventsourcing 9's PostgreSQL application recorder creates (for the app LittleEs).
_EVENTSOURCING_POSTGRES_EVENTS_TABLE = (
    "CREATE TABLE IF NOT EXISTS littlees_events (originator_id uuid NOT NULL,"
    " originator_version bigint NOT NULL, topic text, state bytea, notification_id bigserial,"
    " PRIMARY KEY (originator_id, originator_version))"
)


@pytest.mark.postgres
class TestPostgresWorld(PostgresStorage, conformance.BackendTestCase):
    # What every append inserts into, and nothing may update or delete.
    event_tables = ("little_es_events", "little_es_streams", "little_es_topics")

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
            for table in (*self.event_tables, "littlees_snapshots"):
                conn.execute(
                    f"CREATE TRIGGER refuse_mutation BEFORE UPDATE OR DELETE OR TRUNCATE ON {table}"
                    " FOR EACH STATEMENT EXECUTE FUNCTION little_es_refuse()"
                )
        yield
        with self.connect() as conn:
            count = conn.execute(f"SELECT count(*) FROM {self.event_tables[0]}").fetchone()
            snaps = conn.execute("SELECT count(*) FROM littlees_snapshots").fetchone()
            assert (
                count is not None
                and isinstance(count[0], int)
                and count[0] >= self.exercised_events > 50
            )
            assert snaps is not None and isinstance(snaps[0], int) and snaps[0] > 0
            # The trap itself works: a no-op DELETE is refused.
            table = self.event_tables[0]
            with self.assertRaisesRegex(psycopg.errors.RaiseException, f"DELETE on {table}"):
                conn.execute(f"DELETE FROM {table} WHERE false")

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
            self.assertRaisesRegex(
                WorldStorageError, "could not take the lease on run 'run_lease_fails': .*went away"
            ),
        ):
            world.run_lease("run_lease_fails").__enter__()
        self.assertEqual(len(opened), 1)
        self.assertTrue(opened[0].closed)
        with world.run_lease("run_lease_fails"):
            pass


@pytest.mark.postgres
class TestPostgresEventsourcingLayoutWorld(PostgresEventsourcingLayoutStorage, TestPostgresWorld):
    event_tables = ("littlees_events",)


@pytest.mark.postgres
class TestPostgresEventRecorder(PostgresStorage, conformance.EventRecorderTestCase):
    pass


@pytest.mark.postgres
class TestPostgresEventsourcingLayoutEventRecorder(
    PostgresEventsourcingLayoutStorage, conformance.EventRecorderTestCase
):
    pass


@pytest.mark.postgres
class TestPostgresEventsourcingLayoutWriteAheadEventRecorder(
    PostgresEventsourcingLayoutStorage, conformance.WriteAheadEventRecorderTestCase
):
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
# commit policy and heads in that mode too, for an application that sets it. The mode
# applies to eventsourcing's table (the compact layout has one insert either way).


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
        "APPLICATION_RECORDER_TOPIC": get_topic(LittlePostgresApplicationRecorder),
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
        assert type(recorder) is LittlePostgresApplicationRecorder
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
    """eventsourcing's factory case on little_es's PostgreSQL factory (write-ahead commits),
    for the world's application: the one it gives the compact layout."""

    def setUp(self) -> None:
        # The schema first: the factory case's setUp constructs the factory from env.
        dsn, schema = _fresh_postgres_schema(self)
        parts = urlsplit(dsn)
        self.env = Environment(WORLD_APPLICATION_NAME)
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
        return CompactPostgresApplicationRecorder

    def expected_tracking_recorder_class(self) -> type[TrackingRecorder]:
        return PostgresTrackingRecorder

    def tracking_recorder_subclass(self) -> type[TrackingRecorder]:
        return _PostgresTrackingSubclass

    def expected_process_recorder_class(self) -> type[ProcessRecorder]:
        return PostgresProcessRecorder


# ----------------------------------------------------------------------- MariaDB


def _fresh_mysql_database(case: TestCase) -> tuple[str, str]:
    """The test server's URL and a database for ``case``, dropped after it (or skip, or fail)."""
    reason = mysql_problem()
    if reason is not None:
        if postgres_required_in_ci():
            case.fail(reason)
        case.skipTest(reason)
    server = mysql_url()
    database = create_test_database(server)
    case.addCleanup(drop_test_database, server, database)
    return server, database


class MySQLStorage(conformance.WorldTestCase):
    """A database of its own per test, dropped after it."""

    def setUp(self) -> None:
        super().setUp()
        self.server, self.database = _fresh_mysql_database(self)
        self.url = mysql_database_url(self.server, self.database)

    def make_world(self) -> World:
        """A MariaDB world in this test's database."""
        return mysql_world(self.url)

    def connect(self) -> pymysql.connections.Connection[Any]:
        """An autocommit connection to this test's database."""
        parts = urlsplit(self.server)
        return pymysql.connect(
            host=parts.hostname or "127.0.0.1",
            port=parts.port or 3306,
            user=parts.username or "root",
            password=parts.password or "",
            database=self.database,
            autocommit=True,
        )


@pytest.mark.mariadb
class TestMySQLWorld(MySQLStorage, conformance.BackendTestCase):
    answers_watch = False  # each check makes its own query (see mysql._insert_stored_events)

    def world_url(self) -> str:
        return self.url

    def corrupt_artifact(self, world: World, ref: ArtifactRef, data: bytes) -> None:
        with self.connect() as conn, conn.cursor() as cur:
            cur.execute(
                "UPDATE little_es_artifacts SET data = %s WHERE sha256 = %s AND chunk = 0",
                (data, ref.sha256),
            )
            self.assertEqual(cur.rowcount, 1)

    @contextmanager
    def trap_mutations(self) -> Iterator[None]:
        # Create the tables, then make every UPDATE or DELETE on them raise (MariaDB
        # triggers are per row; TRUNCATE fires none, and the world issues none).
        self.make_world().close()
        with self.connect() as conn, conn.cursor() as cur:
            for table in ("littlees_events", "littlees_snapshots"):
                for op in ("UPDATE", "DELETE"):
                    cur.execute(
                        f"CREATE TRIGGER refuse_{op.lower()}_{table} BEFORE {op} ON {table}"
                        " FOR EACH ROW SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT ="
                        f" 'little_es test: {op} on {table} is forbidden'"
                    )
        yield
        with self.connect() as conn, conn.cursor() as cur:
            cur.execute("SELECT count(*) FROM littlees_events")
            count = cur.fetchone()
            cur.execute("SELECT count(*) FROM littlees_snapshots")
            snaps = cur.fetchone()
            assert count is not None and count[0] >= self.exercised_events > 50
            assert snaps is not None and snaps[0] > 0
            # The trap itself works: a DELETE is refused.
            with self.assertRaisesRegex(pymysql.err.OperationalError, "DELETE on littlees_events"):
                cur.execute("DELETE FROM littlees_events LIMIT 1")

    def test_mysql_leases_are_scoped_to_the_worlds_database(self) -> None:
        server, other = _fresh_mysql_database(self)
        with (
            mysql_world(mysql_database_url(server, other)) as neighbour,
            self.world.run_lease("run_lease"),
            neighbour.run_lease("run_lease"),
        ):
            pass

    def test_mysql_appends_commit_in_notification_id_order(self) -> None:
        # A writer holding an uncommitted id (here: a raw insert that took the append lock
        # first, as every insert of the backend does) makes the next append wait, so no
        # reader of notifications sees a later id committed before an earlier one.
        world = self.world
        world.save(conformance._start_run("run_first"))
        appended = threading.Event()

        def append() -> None:
            world.save(conformance._start_run("run_second"))
            appended.set()

        with self.connect() as conn, conn.cursor() as cur:
            conn.begin()
            cur.execute("SELECT id FROM little_es_append_lock WHERE id = 1 FOR UPDATE")
            cur.execute(
                "INSERT INTO littlees_events (originator_id, originator_version, topic, state)"
                " VALUES (%s, 1, 'early', 'uncommitted')",
                (uuid.uuid4().bytes,),
            )
            cur.execute("SELECT LAST_INSERT_ID()")
            row = cur.fetchone()
            assert row is not None
            early = int(row[0])
            writer = threading.Thread(target=append)
            writer.start()
            try:
                self.assertFalse(
                    appended.wait(1.0), "an append committed while an earlier id was uncommitted"
                )
            finally:
                conn.commit()
                writer.join(timeout=60)
        self.assertTrue(appended.is_set())
        later = world.app.recorder.select_notifications(start=early, limit=10)
        self.assertEqual(later[0].id, early)
        self.assertGreater(later[1].id, early)
        self.assertEqual(later[1].topic, "RunStarted")

    def test_mysql_big_snapshot_and_artifact_round_trip(self) -> None:
        # Above BLOB's 64 KiB (the column is LONGBLOB) and above one artifact chunk.
        world = self.world
        data = bytes(range(256)) * (3 * 4096 + 7)
        ref = world.artifacts.put(data, run_id="run_big", step_path="s")
        self.assertEqual(world.artifacts.get(ref).payload, data)
        run = conformance._start_run("run_big")
        for i in range(40):
            run.trigger(
                StepStarted, step_path=f"s{i}", step_id=f"s{i}", kind="task", visit=1, attempt=1
            )
            run.trigger(
                StepCompleted,
                step_path=f"s{i}",
                step_id=f"s{i}",
                visit=1,
                attempt=1,
                output={"text": "x" * 4000},
            )
        world.save(run)
        world._snapshot(run)
        self.assertEqual(self.open_world().load_run("run_big").fold.freeze(), run.fold.freeze())

    def test_mysql_reports_the_servers_durability(self) -> None:
        backend = self.world.backend
        assert isinstance(backend, MySQLBackend)
        with self.connect() as conn, conn.cursor() as cur:
            cur.execute("SELECT @@GLOBAL.innodb_flush_log_at_trx_commit, @@GLOBAL.sync_binlog")
            row = cur.fetchone()
        assert row is not None
        self.assertEqual(
            (backend.durability.flush_log_at_trx_commit, backend.durability.sync_binlog),
            (int(row[0]), int(row[1])),
        )


@pytest.mark.mariadb
class TestMySQLEventRecorder(MySQLStorage, conformance.EventRecorderTestCase):
    pass


@pytest.mark.mariadb
class TestMySQLWriteAheadEventRecorder(MySQLStorage, conformance.WriteAheadEventRecorderTestCase):
    pass


@pytest.mark.mariadb
class TestMySQLSnapshotRecorder(MySQLStorage, conformance.SnapshotRecorderTestCase):
    pass


@pytest.mark.mariadb
class TestMySQLRunsView(MySQLStorage, conformance.RunsViewTestCase):
    pass


@pytest.mark.mariadb
class TestMySQLProcessRecorder(MySQLStorage, conformance.ProcessRecorderTestCase):
    pass


@pytest.mark.mariadb
class TestMySQLExampleApplication(MySQLStorage, conformance.ExampleApplicationTestCase):
    pass


@pytest.mark.mariadb
class TestMySQLNonInterleavingNotificationIds(
    MySQLStorage, persistence.NonInterleavingNotificationIDsBaseCase
):
    """Two concurrent inserts of 1000 events each get ids in two runs, not interleaved."""

    insert_num = 200

    def create_recorder(self) -> ApplicationRecorder:
        recorder = self.open_world().app.recorder
        assert isinstance(recorder, ApplicationRecorder)
        return recorder


class _ExtensionsInsert(LittleSQLAlchemyApplicationRecorder):
    """The recorder on its MySQL path: eventsourcing-sqlalchemy's own ORM insert (no RETURNING)."""

    def _returns_ids(self, session: Any) -> bool:
        return False


class _ExtensionsInsertFactory(LittleSQLAlchemyFactory):
    application_recorder_class = _ExtensionsInsert


class _ExtensionsInsertRecorder(MySQLStorage):
    """The application recorder of a factory on the MySQL insert path (a mixin)."""

    durable: bool = True

    def create_recorder(self) -> ApplicationRecorder:
        factory = _ExtensionsInsertFactory(Environment("LittleEs", {"SQLALCHEMY_URL": self.url}))
        self.addCleanup(factory.close)
        recorder = factory.application_recorder()
        assert isinstance(recorder, _ExtensionsInsert)
        return recorder


@pytest.mark.mariadb
class TestMySQLExtensionsInsertEventRecorder(
    _ExtensionsInsertRecorder, conformance.EventRecorderTestCase
):
    pass


@pytest.mark.mariadb
class TestMySQLExtensionsInsertNonInterleaving(
    _ExtensionsInsertRecorder, persistence.NonInterleavingNotificationIDsBaseCase
):
    insert_num = 200


class _SQLAlchemyTrackingSubclass(SQLAlchemyTrackingRecorder):
    pass


@pytest.mark.mariadb
class TestMySQLFactory(persistence.InfrastructureFactoryTestCase[LittleSQLAlchemyFactory]):
    """eventsourcing's factory case on little_es's SQLAlchemy factory (LONGBLOB, id order)."""

    def setUp(self) -> None:
        server, database = _fresh_mysql_database(self)
        self.env = Environment("TestCase")
        self.env["PERSISTENCE_MODULE"] = get_topic(LittleSQLAlchemyFactory)
        self.env["SQLALCHEMY_URL"] = mysql_database_url(server, database)
        super().setUp()

    def tearDown(self) -> None:
        super().tearDown()
        self.factory.close()

    def expected_factory_class(self) -> type[LittleSQLAlchemyFactory]:
        return LittleSQLAlchemyFactory

    def expected_aggregate_recorder_class(self) -> type[AggregateRecorder]:
        return SQLAlchemyAggregateRecorder

    def expected_application_recorder_class(self) -> type[ApplicationRecorder]:
        return LittleSQLAlchemyApplicationRecorder

    def expected_tracking_recorder_class(self) -> type[TrackingRecorder]:
        return SQLAlchemyTrackingRecorder

    def tracking_recorder_subclass(self) -> type[TrackingRecorder]:
        return _SQLAlchemyTrackingSubclass

    def expected_process_recorder_class(self) -> type[ProcessRecorder]:
        return LittleSQLAlchemyProcessRecorder

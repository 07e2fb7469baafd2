"""Opening a MariaDB/MySQL world: its URL, and the server durability it requires."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from conftest import WorldSpec, mysql_database_url, require_mysql

from little_es import WorldConfigError, mysql_world, open_world
from little_es.backends.mysql import MySQLBackend, ServerDurability, _check_durability

_FULL = ServerDurability("10.11", flush_log_at_trx_commit=1, log_bin=False, sync_binlog=0)
_BINLOG_SYNCED = ServerDurability("10.11", flush_log_at_trx_commit=1, log_bin=True, sync_binlog=1)
_BINLOG_LAZY = ServerDurability("10.11", flush_log_at_trx_commit=1, log_bin=True, sync_binlog=0)
_LOG_LAZY = ServerDurability("10.11", flush_log_at_trx_commit=2, log_bin=False, sync_binlog=0)
_NO_LOG = ServerDurability("10.11", flush_log_at_trx_commit=0, log_bin=False, sync_binlog=1)


@pytest.mark.parametrize(
    ("settings", "level"),
    [
        (_FULL, "full"),
        (_BINLOG_SYNCED, "full"),
        (_BINLOG_LAZY, "normal"),
        (_LOG_LAZY, "normal"),
        (_NO_LOG, "none"),
    ],
)
def test_what_the_servers_settings_give(settings: ServerDurability, level: str) -> None:
    assert settings.level == level


def test_a_server_that_flushes_lazily_is_refused_unless_the_url_accepts_it() -> None:
    for settings in (_FULL, _BINLOG_SYNCED):
        _check_durability(settings, "full", "w")
    for settings in (_BINLOG_LAZY, _LOG_LAZY):
        with pytest.raises(WorldConfigError, match=r"power cut.*\?synchronous=normal"):
            _check_durability(settings, "full", "w")
        _check_durability(settings, "normal", "w")
    for synchronous in ("full", "normal"):
        with pytest.raises(WorldConfigError, match="innodb_flush_log_at_trx_commit=1"):
            _check_durability(_NO_LOG, synchronous, "w")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("mysql+pymysql://root@127.0.0.1:3306", "names no database"),
        ("mysql+pymysql://root@127.0.0.1:3306/a-b", "invalid database name"),
        ("mysql+pymysql://root@127.0.0.1/db?fsync=no", "only synchronous"),
        ("mysql+pymysql://root@127.0.0.1/db?synchronous=off", "'full' or 'normal'"),
    ],
)
def test_bad_urls_are_refused_before_connecting(url: str, message: str) -> None:
    with pytest.raises(WorldConfigError, match=message):
        open_world(url)


@pytest.mark.mariadb
def test_a_missing_database_is_refused_with_what_to_do() -> None:
    missing = f"little_es_missing_{uuid.uuid4().hex[:8]}"
    url = mysql_database_url(require_mysql(), missing)
    with pytest.raises(WorldConfigError, match=rf"CREATE DATABASE `{missing}`"):
        mysql_world(url)


@pytest.mark.backends("mariadb")
def test_the_world_reports_the_settings_it_was_opened_on(world_spec: WorldSpec) -> None:
    url = world_spec.url
    for suffix in ("", "?synchronous=normal"):
        with open_world(url + suffix) as world:
            backend = world.backend
            assert isinstance(backend, MySQLBackend)
            assert backend.durability.level in ("full", "normal")
            assert world.backend.name == url + suffix


def test_a_process_without_a_mysql_world_imports_neither_sqlalchemy_nor_pymysql(
    tmp_path: Path,
) -> None:
    # The extra is optional, and importing SQLAlchemy would slow every start of the CLI.
    code = (
        "import sys; from little_es import open_world\n"
        f"open_world('sqlite:///{tmp_path / 'w'}').close()\n"
        "print(sorted(m for m in ('sqlalchemy', 'pymysql', 'eventsourcing_sqlalchemy')"
        " if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"

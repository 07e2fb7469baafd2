"""Tests of little_es.logging: what configure_logging writes to stderr."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import structlog

from little_es.errors import LittleEsError, LoggingConfigError
from little_es.logging import configure_logging, get_logger

_REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _isolated_logging(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test starts from unconfigured structlog with no LITTLE_ES_LOG_* set, and ends there."""
    monkeypatch.delenv("LITTLE_ES_LOG_JSON", raising=False)
    monkeypatch.delenv("LITTLE_ES_LOG_LEVEL", raising=False)
    structlog.reset_defaults()
    structlog.contextvars.clear_contextvars()
    yield
    structlog.reset_defaults()
    structlog.contextvars.clear_contextvars()


def _json_lines(text: str) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in text.splitlines() if line.strip()]


class _FakeTerminal(io.StringIO):
    """A stderr that says it is a terminal."""

    def isatty(self) -> bool:
        return True


def test_json_lines_carry_the_bound_context(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging(json=True)
    log = get_logger(run_id="run_abc", step_path="plan/draft", session_id="s-1", attempt=2)

    log.info("step started", tokens=12)

    captured = capsys.readouterr()
    assert captured.out == ""
    [entry] = _json_lines(captured.err)
    assert entry["event"] == "step started"
    assert entry["level"] == "info"
    assert entry["run_id"] == "run_abc"
    assert entry["step_path"] == "plan/draft"
    assert entry["session_id"] == "s-1"
    assert entry["attempt"] == 2
    assert entry["tokens"] == 12
    assert entry["timestamp"].endswith("Z")


def test_later_bindings_and_contextvars_are_merged(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging(json=True)
    structlog.contextvars.bind_contextvars(run_id="run_ctx")

    get_logger(step_path="a").bind(session_id="s-2").warning("slow tool")

    [entry] = _json_lines(capsys.readouterr().err)
    assert (entry["run_id"], entry["step_path"], entry["session_id"]) == ("run_ctx", "a", "s-2")
    assert entry["level"] == "warning"


def test_a_module_level_logger_follows_a_later_configuration(
    capsys: pytest.CaptureFixture[str],
) -> None:
    log = get_logger(run_id="early")  # as a library module does at import time

    configure_logging(json=True)
    log.info("first")
    configure_logging(json=True, level="ERROR")
    log.info("second")

    assert [e["event"] for e in _json_lines(capsys.readouterr().err)] == ["first"]


def test_level_filters_lower_entries(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging(json=True, level="warning")
    log = get_logger(run_id="r")

    log.debug("d")
    log.info("i")
    log.warning("w")
    log.error("e")

    assert [e["event"] for e in _json_lines(capsys.readouterr().err)] == ["w", "e"]


def test_default_level_is_info(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging(json=True)
    log = get_logger()

    log.debug("d")
    log.info("i")

    assert [e["event"] for e in _json_lines(capsys.readouterr().err)] == ["i"]


def test_level_comes_from_the_environment(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LITTLE_ES_LOG_LEVEL", "DEBUG")
    configure_logging(json=True)

    get_logger().debug("d")

    assert [e["event"] for e in _json_lines(capsys.readouterr().err)] == ["d"]


def test_an_explicit_level_wins_over_the_environment(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LITTLE_ES_LOG_LEVEL", "DEBUG")
    configure_logging(json=True, level="ERROR")

    get_logger().warning("w")

    assert capsys.readouterr().err == ""


def test_json_is_the_default_when_stderr_is_not_a_terminal(
    capsys: pytest.CaptureFixture[str],
) -> None:
    configure_logging()

    get_logger(run_id="r").info("hello")

    [entry] = _json_lines(capsys.readouterr().err)
    assert entry["event"] == "hello"


def test_console_format_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    terminal = _FakeTerminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    configure_logging()

    get_logger(run_id="run_tty").info("hello")

    text = terminal.getvalue()
    assert "hello" in text and "run_tty" in text
    with pytest.raises(orjson.JSONDecodeError):
        orjson.loads(text)


def test_environment_selects_json_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    terminal = _FakeTerminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    monkeypatch.setenv("LITTLE_ES_LOG_JSON", "1")
    configure_logging()

    get_logger(run_id="r").info("hello")

    [entry] = _json_lines(terminal.getvalue())
    assert entry["run_id"] == "r"


def test_environment_selects_console_off_a_terminal(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LITTLE_ES_LOG_JSON", "0")
    configure_logging()

    get_logger(run_id="r").info("hello")

    err = capsys.readouterr().err
    assert "hello" in err
    with pytest.raises(orjson.JSONDecodeError):
        orjson.loads(err)


def test_explicit_json_false_wins_over_the_environment(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LITTLE_ES_LOG_JSON", "1")
    configure_logging(json=False)

    get_logger().info("hello")

    err = capsys.readouterr().err
    assert "hello" in err
    with pytest.raises(orjson.JSONDecodeError):
        orjson.loads(err)


def test_exceptions_are_structured_without_locals(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging(json=True)
    secret = "sk-do-not-log"
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        get_logger(run_id="r").exception("step failed", key_len=len(secret))

    err = capsys.readouterr().err
    [entry] = _json_lines(err)
    assert entry["exception"][0]["exc_type"] == "RuntimeError"
    assert entry["exception"][0]["exc_value"] == "boom"
    assert secret not in err


def test_values_orjson_cannot_encode_are_rendered_not_dropped(
    capsys: pytest.CaptureFixture[str],
) -> None:
    configure_logging(json=True)

    get_logger().info("odd", path=Path("/tmp/x"), ids={1, 2})

    [entry] = _json_lines(capsys.readouterr().err)
    assert "/tmp/x" in entry["path"]
    assert "1" in entry["ids"]


@pytest.mark.parametrize(
    ("kwargs", "env", "match"),
    [
        ({"level": "LOUD"}, {}, "level must be one of DEBUG"),
        ({}, {"LITTLE_ES_LOG_LEVEL": "verbose"}, "LITTLE_ES_LOG_LEVEL must be one of"),
        ({}, {"LITTLE_ES_LOG_JSON": "maybe"}, "LITTLE_ES_LOG_JSON must be 1"),
        ({"json": "yes"}, {}, "json must be True, False or None"),
    ],
)
def test_bad_settings_are_refused(
    monkeypatch: pytest.MonkeyPatch, kwargs: dict[str, Any], env: dict[str, str], match: str
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)

    with pytest.raises(LoggingConfigError, match=match):
        configure_logging(**kwargs)

    assert not structlog.is_configured()
    assert issubclass(LoggingConfigError, LittleEsError)
    assert issubclass(LoggingConfigError, ValueError)


def test_importing_the_library_configures_nothing() -> None:
    script = textwrap.dedent(
        """
        import logging
        import structlog

        handlers_before = list(logging.getLogger().handlers)
        import little_es.logging
        import little_es.pricing

        little_es.logging.get_logger(run_id="r")
        assert not structlog.is_configured()
        assert logging.getLogger().handlers == handlers_before
        print("ok")
        """
    )
    env = {**os.environ, "PYTHONPATH": str(_REPO)}

    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=_REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert done.returncode == 0, done.stderr + done.stdout
    assert done.stdout.strip() == "ok"


def test_library_logs_stay_quiet_below_warning_until_configured() -> None:
    import subprocess
    import sys

    code = (
        "from little_es.logging import get_logger\n"
        "log = get_logger(run_id='r1')\n"
        "log.info('progress line')\n"
        "log.warning('something odd')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    out = done.stdout + done.stderr
    assert "progress line" not in out
    assert "something odd" in out and "r1" in out


def test_an_unconfigured_warning_goes_to_stderr_never_stdout() -> None:
    """A library writes nothing to stdout of its own accord: with structlog unconfigured a
    warning goes through the standard library's ``little_es`` logger (to stderr, by its
    last-resort handler), and lower levels are dropped."""
    script = (
        "from little_es.logging import get_logger\n"
        "get_logger(run_id='run_quiet').warning('step failed', attempt=2)\n"
        "get_logger().info('progress')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(_REPO)},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    assert "step failed run_id='run_quiet' attempt=2" in done.stderr
    assert "progress" not in done.stderr

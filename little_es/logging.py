"""Structured logging for little_es, on structlog.

Library modules log through :func:`get_logger`, binding the context keys the
project uses everywhere: ``run_id``, ``step_path``, ``session_id`` and
``attempt``. Context bound with ``structlog.contextvars.bind_contextvars`` is
merged in too.

Importing little_es configures nothing: logging is set up only when the
application (or the ``little`` CLI) calls :func:`configure_logging`. Until
then, or if the application configures structlog itself, little_es' log
entries follow whatever structlog configuration is in effect. Standard-library
loggers (eventsourcing's, temporalio's, ...) are left to the application.
"""

from __future__ import annotations

import logging as _stdlib_logging
import os
import sys
from typing import Any, Final, TextIO, cast

import orjson
import structlog
from structlog.typing import FilteringBoundLogger, Processor

from little_es.errors import LoggingConfigError

__all__ = ["LibraryLogger", "configure_logging", "get_logger"]

_LEVELS: Final = {
    "DEBUG": _stdlib_logging.DEBUG,
    "INFO": _stdlib_logging.INFO,
    "WARNING": _stdlib_logging.WARNING,
    "ERROR": _stdlib_logging.ERROR,
    "CRITICAL": _stdlib_logging.CRITICAL,
}
_TRUE: Final = frozenset({"1", "true", "yes", "on"})
_FALSE: Final = frozenset({"", "0", "false", "no", "off"})

_stdlib_logger = _stdlib_logging.getLogger("little_es")

_JSON_ENV: Final = "LITTLE_ES_LOG_JSON"
_LEVEL_ENV: Final = "LITTLE_ES_LOG_LEVEL"


class LibraryLogger:
    """The logger library modules use: structlog's, but quiet until logging is configured.

    An application that never configures logging finds nothing of little_es'
    on its stdout: warnings and errors go to the standard library's
    ``little_es`` logger (stderr, unless the application routes it), the rest
    is dropped. Once
    :func:`configure_logging` (or the application's own ``structlog.configure``)
    has run, every entry follows that configuration.
    """

    __slots__ = ("_bound",)

    def __init__(self, bound: dict[str, Any]) -> None:
        self._bound = bound

    def bind(self, **more: Any) -> LibraryLogger:
        """A logger with more context bound."""
        return LibraryLogger({**self._bound, **more})

    def _emit(self, level: int, method: str, event: str, kw: dict[str, Any]) -> None:
        if not structlog.is_configured():
            # structlog's default prints to stdout, which belongs to the application. A
            # warning goes where a library's goes: the standard library's "little_es"
            # logger, whose last-resort handler writes it to stderr.
            if level >= _stdlib_logging.WARNING:
                fields = " ".join(f"{k}={v!r}" for k, v in {**self._bound, **kw}.items())
                _stdlib_logger.log(level, f"{event} {fields}".rstrip())
            return
        logger: FilteringBoundLogger = structlog.get_logger(**self._bound)
        getattr(logger, method)(event, **kw)

    def debug(self, event: str, **kw: Any) -> None:
        """Log at DEBUG."""
        self._emit(_stdlib_logging.DEBUG, "debug", event, kw)

    def info(self, event: str, **kw: Any) -> None:
        """Log at INFO."""
        self._emit(_stdlib_logging.INFO, "info", event, kw)

    def warning(self, event: str, **kw: Any) -> None:
        """Log at WARNING."""
        self._emit(_stdlib_logging.WARNING, "warning", event, kw)

    def error(self, event: str, **kw: Any) -> None:
        """Log at ERROR."""
        self._emit(_stdlib_logging.ERROR, "error", event, kw)

    def exception(self, event: str, **kw: Any) -> None:
        """Log at ERROR with the current exception."""
        self._emit(_stdlib_logging.ERROR, "exception", event, kw)


def get_logger(**bound: Any) -> LibraryLogger:
    """Return a logger with ``bound`` as its context (``run_id``, ``step_path``, ...).

    It is resolved against the structlog configuration in effect when it logs,
    so a module-level ``log = get_logger()`` picks up a later
    :func:`configure_logging`.
    """
    return LibraryLogger(dict(bound))


def configure_logging(*, json: bool | None = None, level: str | None = None) -> None:
    """Configure structlog to write little_es' (and the application's) structlog entries to stderr.

    ``json=True`` writes one JSON object per line (rendered with orjson);
    ``json=False`` writes the human console format. ``None`` reads
    ``LITTLE_ES_LOG_JSON`` (``1``/``0``) and, if that is unset, picks the
    console format when stderr is a terminal and JSON otherwise.

    ``level`` is the minimum level (``DEBUG``, ``INFO``, ``WARNING``, ``ERROR``,
    ``CRITICAL``, any case); ``None`` reads ``LITTLE_ES_LOG_LEVEL`` and defaults
    to ``INFO``. Entries below it cost a no-op call.

    Calling it again replaces the previous configuration. Raises
    :class:`LoggingConfigError` for an unknown level or environment value.
    """
    if json is not None and not isinstance(json, bool):
        raise LoggingConfigError(f"json must be True, False or None, got {json!r}")
    levelno = _level_from(level)
    as_json = _json_from(json)

    processors: list[Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.StackInfoRenderer(),
    ]
    if as_json:
        processors += [
            # Locals stay out of log lines: they can hold API keys and whole prompts.
            structlog.processors.ExceptionRenderer(
                structlog.tracebacks.ExceptionDictTransformer(show_locals=False)
            ),
            structlog.processors.JSONRenderer(serializer=_orjson_dumps),
        ]
    else:
        processors += [
            structlog.dev.set_exc_info,
            structlog.dev.ConsoleRenderer(
                colors=_stderr_is_tty(),
                exception_formatter=structlog.dev.RichTracebackFormatter(show_locals=False),
            ),
        ]

    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(levelno),
        context_class=dict,
        logger_factory=structlog.PrintLoggerFactory(file=cast(TextIO, _Stderr())),
        # Not cached, so a later configure_logging reaches loggers already in use.
        cache_logger_on_first_use=False,
    )


def _level_from(level: str | None) -> int:
    source = "level"
    if level is None:
        level, source = os.environ.get(_LEVEL_ENV) or "INFO", _LEVEL_ENV
    if not isinstance(level, str) or level.strip().upper() not in _LEVELS:
        raise LoggingConfigError(
            f"{source} must be one of {', '.join(_LEVELS)} (any case), got {level!r}"
        )
    return _LEVELS[level.strip().upper()]


def _json_from(json: bool | None) -> bool:
    if json is not None:
        return json
    raw = os.environ.get(_JSON_ENV)
    if raw is None:
        return not _stderr_is_tty()
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise LoggingConfigError(
        f"{_JSON_ENV} must be 1 (JSON lines) or 0 (console format), got {raw!r}"
    )


def _stderr_is_tty() -> bool:
    isatty = getattr(sys.stderr, "isatty", None)
    return bool(isatty and isatty())


def _orjson_dumps(obj: Any, **kwargs: Any) -> str:
    # JSONRenderer passes `default=` for values orjson cannot encode itself.
    return orjson.dumps(obj, default=kwargs.get("default"), option=orjson.OPT_NON_STR_KEYS).decode()


class _Stderr:
    """Writes to whatever ``sys.stderr`` is at write time, so later redirections are honoured."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()

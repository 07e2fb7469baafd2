"""The ledger: one line per real execution, written outside the process under test.

Each line is written with ``O_APPEND`` and fsynced before the step body, model call or
tool call returns, so a SIGKILL right after the return cannot lose it. A line names the
item that executed (:class:`Item`) and the process (``segment``: 0 for the first process
of a run, 1 for the first resume, ...).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import orjson

ItemKind = Literal["step", "model", "tool"]


@dataclass(frozen=True, order=True)
class Item:
    """Something whose result the log records, as the ledger and the log both name it.

    ``step``: ``(run id, step path, attempt)``; ``model``: ``(run id, agent step path,
    turn)`` (the model cannot know its session; the checker maps each session to its
    step); ``tool``: ``(run id, session id, call id)``.
    """

    kind: ItemKind
    run_id: str
    where: str
    n: str

    def __str__(self) -> str:
        return f"{self.kind} {self.run_id} {self.where} #{self.n}"


def step_item(run_id: str, step_path: str, attempt: int) -> Item:
    """The item of one attempt of one step."""
    return Item("step", run_id, step_path, str(attempt))


def model_item(run_id: str, step_path: str, turn: int) -> Item:
    """The item of one model call of an agent step."""
    return Item("model", run_id, step_path, str(turn))


def tool_item(run_id: str, session_id: str, call_id: str) -> Item:
    """The item of one tool call of a harness session."""
    return Item("tool", run_id, session_id, call_id)


@dataclass(frozen=True)
class Entry:
    """One ledger line: an item and the process (segment) that executed it."""

    item: Item
    segment: int


class Ledger:
    """Appends :class:`Entry` lines to a file, each durable before :meth:`append` returns."""

    def __init__(self, path: Path, segment: int) -> None:
        self.path = path
        self.segment = segment

    def append(self, item: Item) -> None:
        """Write one line for ``item`` and fsync it."""
        line = orjson.dumps(
            {
                "seg": self.segment,
                "kind": item.kind,
                "run": item.run_id,
                "where": item.where,
                "n": item.n,
            }
        )
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            # One write() of one line: O_APPEND makes it land whole at the end.
            os.write(fd, line + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)


def read_ledger(path: Path) -> list[Entry]:
    """Every line of the ledger at ``path`` (none if it does not exist)."""
    if not path.exists():
        return []
    entries: list[Entry] = []
    for raw in path.read_bytes().splitlines():
        d = orjson.loads(raw)
        entries.append(
            Entry(Item(d["kind"], str(d["run"]), str(d["where"]), str(d["n"])), int(d["seg"]))
        )
    return entries

"""Moving a world: ``little export`` / ``little import`` (:mod:`little_es.transfer`).

One source world (SQLite) is built once: a run killed mid-run by a real SIGKILL
(``tests/_runtime_proc.py``, one step attempt in flight, a failed attempt and completed
steps committed), a completed run with an artifact, a failed run, an orchestrator with
its sub-runs, an outer loop, a price and a user's eventsourcing aggregate. It is
exported with the real CLI, imported into a fresh SQLite world and into PostgreSQL
(a schema of its own), and checked there: ``little verify --all`` passes, every run
replays to the state it has on the source, and a resume of the killed run executes no
step whose result the source committed (the step functions' ledger, written outside
the process, counts executions). Hostile files are refused by name, with the target
unchanged.
"""

# No `from __future__ import annotations`: the orchestrator's test tool keeps real hints.
import asyncio
import base64
import hashlib
import io
import os
import shutil
import sqlite3
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import orjson
import pytest
from eventsourcing.persistence import StoredEvent

from little_es import (
    ArtifactIntegrityError,
    ArtifactNotFoundError,
    EventPayloadError,
    ExportFormatError,
    ExportTruncatedError,
    ExportVersionError,
    ImportConflictError,
    LogTamperedError,
    RunEvent,
    RunFailedError,
    export_world,
    fork_run,
    import_world,
)
from little_es.chain import (
    FRAME_SIZE,
    GENESIS,
    LINK_SIZE,
    Head,
    feed,
    frame,
    row_digest,
    seed,
    verify_stream,
)
from little_es.domain import Run
from little_es.engine.local import run_workflow
from little_es.events import StepCompleted, StepFailed, StepStarted
from little_es.harness.model import ScriptedModel, ScriptedReply
from little_es.ids import run_stream_id
from little_es.orchestrator import start_workflow_tool
from little_es.outer_loop import encode_view, loop_view, run_outer_loop_sync
from little_es.projections import list_runs
from little_es.replay import replay_run
from little_es.testing import CrashRunner
from little_es.values import ArtifactRef, ModelRequest, ToolCall, Usage
from little_es.verify import verify_world
from little_es.workflow.authoring import Workflow, agent, task
from little_es.workflow.context import StepContext
from little_es.workflow.ir import RetryPolicy
from little_es.world import LittleApplication, World, local_world, memory_world, open_world
from tests import _outer_loop_proc as loop_proc
from tests._tickets import Ticket
from tests.conftest import PERSISTENT_BACKENDS, WorldSpec

pytestmark = pytest.mark.timeout(240)

_REPO = Path(__file__).resolve().parents[1]
_KILLED = "run_proc"
_KILL_AT = "StepStarted:step_path=flaky,attempt=2"
"""The kill, right after this append: fetch and the lint branches completed, flaky's first
attempt failed (recorded), its second in flight."""

_Key = tuple[str, str, int]


def _little(
    *args: str, stdin: bytes | None = None, tty: bool = False
) -> "subprocess.CompletedProcess[bytes]":
    env = {**os.environ, "PYTHONPATH": str(_REPO)}
    env.pop("LITTLE_ES_WORLD", None)
    if tty:
        # rich draws its progress bar only on a terminal; this makes stderr count as one.
        env["TTY_COMPATIBLE"] = "1"
    return subprocess.run(
        [sys.executable, "-m", "little_es.cli", *args],
        input=stdin,
        capture_output=True,
        env=env,
        cwd=_REPO,
        timeout=120,
        check=False,
    )


def run_workflow_sync(world: World, workflow: Workflow, input: Any, *, run_id: str) -> Any:
    return asyncio.run(run_workflow(world, workflow, input, run_id=run_id))


def _ledger(path: Path) -> Counter[_Key]:
    counts: Counter[_Key] = Counter()
    if path.exists():
        for line in path.read_text().splitlines():
            _pid, run_id, step_path, attempt = line.split(" ")
            counts[(run_id, step_path, int(attempt))] += 1
    return counts


def _big(ctx: StepContext) -> str:
    return "artifact " * 20_000


def _boom(ctx: StepContext) -> None:
    raise RuntimeError("this step always fails")


def _double(ctx: StepContext) -> int:
    return int(ctx.input["n"]) * 2


def _orchestrator() -> Workflow:
    calls = tuple(
        ToolCall(
            id=f"c{n}",
            name="start_workflow",
            arguments={"workflow_id": "work", "input": {"n": n}},
        )
        for n in (1, 2)
    )

    def respond(request: ModelRequest) -> ScriptedReply:
        if not any(m.role == "assistant" for m in request.messages):
            return ScriptedReply(tool_calls=calls, usage=Usage(input_tokens=100, output_tokens=10))
        return ScriptedReply(content="done", usage=Usage(input_tokens=200, output_tokens=5))

    model = ScriptedModel(respond=respond, provider="scripted", model_id="orch-1")
    tool = start_workflow_tool([Workflow("work", steps=[task("compute", _double)])])
    return Workflow("orchestrate", steps=[agent("fan_out", model=model, tools=[tool], prompt="go")])


@dataclass(frozen=True)
class Source:
    url: str
    export: bytes
    """What `little export` printed on stdout."""
    stderr: str
    replays: dict[str, Any]
    committed: frozenset[_Key]
    """(run, step, attempt) whose StepCompleted/StepFailed the killed run had committed."""
    in_flight: frozenset[_Key]


def _build_source(root: Path) -> tuple[str, frozenset[_Key], frozenset[_Key]]:
    data_dir = root / "source"
    url = f"sqlite:///{data_dir}"
    with CrashRunner(pythonpath=[_REPO], cwd=_REPO) as server:
        killed = server.run(
            "tests._runtime_proc:main",
            ["crash", "--world", url, "--ledger", str(root / "source-ledger")],
            crash_after_event=_KILL_AT,
        )
    assert killed.returncode == -9, killed.output
    with local_world(data_dir) as world:
        started, terminal = set(), set()
        for e in world.read_run_log(_KILLED):
            if isinstance(e, StepStarted):
                started.add((_KILLED, e.step_path, e.attempt))
            elif isinstance(e, StepCompleted | StepFailed):
                terminal.add((_KILLED, e.step_path, e.attempt))
        assert (_KILLED, "flaky", 2) in started - terminal
        assert (_KILLED, "flaky", 1) in terminal
        run_workflow_sync(
            world,
            Workflow("done", steps=[task("big", _big), task("small", _double)]),
            {"n": 4},
            run_id="run_done",
        )
        with pytest.raises(RunFailedError):
            run_workflow_sync(
                world,
                Workflow("fails", steps=[task("boom", _boom, retry=RetryPolicy(max_attempts=1))]),
                {},
                run_id="run_failed",
            )
        assert run_workflow_sync(world, _orchestrator(), {}, run_id="run_orch").output == "done"
        run_outer_loop_sync(
            world,
            planner=loop_proc.make_planner(),
            workflow=loop_proc.improve,
            outer_loop_id="loop_a",
            max_cycles=1,
        )
        world.set_model_price("scripted", "orch-1", input_per_mtok=2, output_per_mtok=10)
        unit = world.aggregates()
        unit.add(Ticket(subject="exported"))
        world.commit_aggregates(unit)
    return url, frozenset(terminal), frozenset(started - terminal)


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Source:
    root = tmp_path_factory.mktemp("transfer")
    url, committed, in_flight = _build_source(root)
    done = _little("export", "--world", url, tty=True)
    assert done.returncode == 0, done.stderr.decode()
    with open_world(url) as world:
        replays = {s.run_id: replay_run(world, s.run_id) for s in list_runs(world)}
    assert {"run_proc", "run_done", "run_failed", "run_orch", "loop_a.cycle-1"} <= set(replays)
    assert sum(r.state.parent_run_id == "run_orch" for r in replays.values()) == 2
    return Source(url, done.stdout, done.stderr.decode(), replays, committed, in_flight)


def test_the_export_is_jsonl_on_stdout_and_the_progress_bar_on_stderr(source: Source) -> None:
    lines = [orjson.loads(line) for line in source.export.splitlines()]
    assert lines[0]["type"] == "header" and lines[-1]["type"] == "trailer"
    assert lines[0]["format"] == "little_es.world-export" and lines[0]["format_version"] == 1
    kinds = Counter(line["type"] for line in lines)
    assert kinds["event"] == lines[0]["counts"]["events"] > 0
    assert kinds["artifact"] == lines[0]["counts"]["artifacts"] >= 1
    streams = {line["kind"] for line in lines if line["type"] == "stream"}
    assert {"world", "run", "session", "outer_loop", "prices", "aggregate"} <= streams
    # Nothing but the stream on stdout; the bar and the summary went to stderr.
    assert "checking streams" in source.stderr
    summary = f"exported {len(streams) and lines[0]['counts']['streams']} streams"
    assert summary in source.stderr and b"checking streams" not in source.export


@pytest.mark.backends(*PERSISTENT_BACKENDS)
def test_a_world_moved_verifies_replays_equal_and_a_resume_reruns_nothing_committed(
    source: Source, world_spec: WorldSpec, tmp_path: Path
) -> None:
    # Every persistent backend of the conformance fixtures: a new one is covered by its fixture.
    url = world_spec.url
    done = _little("import", "--world", url, stdin=source.export)
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.decode().startswith("imported ")
    verified = _little("verify", "--all", "--world", url)
    assert verified.returncode == 0, verified.stdout.decode()
    with open_world(url) as world:
        assert {s.run_id for s in list_runs(world)} == set(source.replays)
        for run_id, replay in source.replays.items():
            assert replay_run(world, run_id) == replay, run_id
        loop = world.load_outer_loop("loop_a")
        assert loop is not None and loop.completed is not None
        if world.backend.keeps_outer_loop_views:
            assert world.backend.read_outer_loop_view("loop_a") == encode_view(
                loop_view(world, loop)
            )
    ledger = tmp_path / "target-ledger"
    with CrashRunner(pythonpath=[_REPO], cwd=_REPO) as server:
        resumed = server.run(
            "tests._runtime_proc:main", ["crash", "--world", url, "--ledger", str(ledger)]
        )
    assert resumed.returncode == 0, resumed.output
    assert "RESULT" in resumed.output
    ran = _ledger(ledger)
    assert not set(ran) & source.committed, "a step committed on the source ran again"
    assert source.in_flight <= set(ran)
    with open_world(url) as world:
        assert replay_run(world, _KILLED).state.status == "completed"
    assert _little("verify", "--all", "--world", url).returncode == 0


class Approved(RunEvent):
    """A user's own event on a run: it travels like the runtime's."""

    wire_name: ClassVar[str] = "test_transfer.Approved"
    approver: str


class Attached(RunEvent):
    """A user's own event holding an artifact: its bytes must move with it."""

    wire_name: ClassVar[str] = "test_transfer.Attached"
    files: tuple[ArtifactRef, ...]


class Noted(RunEvent):
    """A user's own event that mentions, in its data, an artifact of another run."""

    wire_name: ClassVar[str] = "test_transfer.Noted"
    about: dict[str, Any]


def _log_order(world: World) -> list[tuple[str, int]]:
    return [
        (str(n.originator_id), n.originator_version)
        for n in world.app.recorder.select_notifications(start=None, limit=10_000)
    ]


def test_a_memory_world_moves_to_sqlite_in_the_order_of_its_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = io.BytesIO()
    with memory_world() as world:
        run_workflow_sync(world, Workflow("done", steps=[task("big", _big)]), {}, run_id="run_mem")
        run_workflow_sync(
            world, Workflow("two", steps=[task("a", _double)]), {"n": 2}, run_id="two"
        )
        world.record_run_event("run_mem", Approved, approver="ops")
        counts = export_world(world, out)
        before = {run_id: replay_run(world, run_id) for run_id in ("run_mem", "two")}
        order = _log_order(world)
    assert counts.artifacts == 1
    with local_world(tmp_path / "b") as target:
        assert import_world(target, io.BytesIO(out.getvalue())) == counts
    with local_world(tmp_path / "b") as target:
        assert {run_id: replay_run(target, run_id) for run_id in before} == before
        # The world's log keeps its order: a user's projection sees the same sequence.
        assert _log_order(target) == order
        assert [e.approver for e in target.read_run_log("run_mem") if isinstance(e, Approved)] == [
            "ops"
        ]
        # In this process: `little verify` elsewhere could not import the test's own event.
        assert verify_world(target).ok
    assert capsys.readouterr().out == "", "the library writes nothing to stdout"


def test_a_target_with_streams_of_its_own_keeps_them_and_its_identity(
    source: Source, tmp_path: Path
) -> None:
    with local_world(tmp_path / "t") as target:
        run_workflow_sync(
            target, Workflow("own", steps=[task("a", _double)]), {"n": 1}, run_id="own"
        )
        world_id = _world_id(target)
        import_world(target, io.BytesIO(source.export))
        assert _world_id(target) == world_id
        assert {"own", "run_done"} <= {s.run_id for s in list_runs(target)}
    assert _little("verify", "--all", "--world", f"sqlite:///{tmp_path / 't'}").returncode == 0


def _world_id(world: World) -> str:
    from little_es.domain import WorldRecord
    from little_es.ids import world_stream_id

    record = world._load(WorldRecord, world_stream_id())
    assert record is not None and record.created is not None
    return record.created.world_id


# ------------------------------------------------------------------ hostile input


def _lines(data: bytes) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in data.splitlines()]


def _join(lines: list[dict[str, Any]], *, reseal: bool = True) -> bytes:
    """Lines back into a file; ``reseal`` recomputes the trailer's digest over them."""
    body = b"".join(orjson.dumps(line) + b"\n" for line in lines[:-1])
    trailer = dict(lines[-1])
    if reseal:
        trailer["sha256"] = hashlib.sha256(body).hexdigest()
    return body + orjson.dumps(trailer) + b"\n"


def _tamper_payload(data: bytes, *, reseal: bool = True) -> bytes:
    lines = _lines(data)
    for line in lines:
        if line["type"] == "event" and line["topic"] == "StepCompleted":
            line["payload"] = line["payload"].replace('"p":"', '"p":"x', 1)
            break
    return _join(lines, reseal=reseal)


def _drop_artifact(data: bytes) -> bytes:
    lines = [line for line in _lines(data) if line["type"] != "artifact"]
    for line in (lines[0], lines[-1]):
        line["counts"] = {**line["counts"], "artifacts": 0}
    return _join(lines)


def _change_artifact(data: bytes) -> bytes:
    lines = _lines(data)
    blob = next(line for line in lines if line["type"] == "artifact")
    blob["data"] = base64.b64encode(b"other bytes").decode()
    return _join(lines)


def _rename_stream(data: bytes) -> bytes:
    lines = _lines(data)
    stream = next(line for line in lines if line["type"] == "stream" and line["kind"] == "run")
    stream["name"] = "someone_else"
    return _join(lines)


def _rechain(lines: list[dict[str, Any]], stream_id: str, edit: Callable[[str], str]) -> None:
    """Edit every payload of one stream and recompute its frames and head, as a writer that
    knows the format could: the chain cannot tell, the import's other checks must."""
    sid = uuid.UUID(stream_id)
    prev, running = GENESIS, seed(sid)
    for line in lines:
        if line["type"] == "event" and line["stream_id"] == stream_id:
            payload = edit(line["payload"]).encode()
            line["payload"] = payload.decode()
            data = frame(prev, sid, line["version"], line["topic"], payload)
            line["frame"] = data[:FRAME_SIZE].hex()
            feed(running, line["topic"], data)
            prev = row_digest(data)
    stream = next(x for x in lines if x["type"] == "stream" and x["stream_id"] == stream_id)
    stream["head"] = {**stream["head"], "digest": prev.hex(), "running": running.digest().hex()}


def _copy_artifact_ref(data: bytes) -> bytes:
    lines = _lines(data)
    stream = next(x for x in lines if x["type"] == "stream" and x["name"] == "run_done")
    _rechain(
        lines,
        stream["stream_id"],
        lambda p: (
            p.replace('"run_id":"run_done"', '"run_id":"run_failed"')
            if '"output_ref":{' in p
            else p
        ),
    )
    return _join(lines)


def _swap_events(data: bytes) -> bytes:
    lines = _lines(data)
    first = next(i for i, line in enumerate(lines) if line["type"] == "event")
    other = next(
        i
        for i in range(first + 1, len(lines))
        if lines[i]["type"] == "event" and lines[i]["stream_id"] != lines[first]["stream_id"]
    )
    lines[first], lines[other] = lines[other], lines[first]
    return _join(lines, reseal=False)


def _bad_json(data: bytes) -> bytes:
    raw = data.splitlines(keepends=True)
    raw[3] = raw[3][:20] + b"\n"
    return b"".join(raw)


def _version_2(data: bytes) -> bytes:
    lines = _lines(data)
    lines[0]["format_version"] = 2
    return _join(lines)


def _skip_event(data: bytes) -> bytes:
    lines = _lines(data)
    index = next(
        i for i, line in enumerate(lines) if line["type"] == "event" and line["version"] == 2
    )
    del lines[index]
    for line in (lines[0], lines[-1]):
        line["counts"] = {**line["counts"], "events": line["counts"]["events"] - 1}
    return _join(lines)


def _drop_world_record(data: bytes) -> bytes:
    """The world's own record removed, counts and trailer fixed: a new target would open as
    a world from before the chain (its rows then free to lack a frame)."""
    lines = _lines(data)
    record = next(x for x in lines if x["type"] == "stream" and x["kind"] == "world")
    lines = [x for x in lines if x.get("stream_id") != record["stream_id"]]
    dropped = {"streams": 1, "events": record["version"]}
    for line in (lines[0], lines[-1]):
        line["counts"] = {k: n - dropped.get(k, 0) for k, n in line["counts"].items()}
    return _join(lines)


HOSTILE: dict[str, tuple[Callable[[bytes], bytes], type[Exception], str]] = {
    "cut in the middle": (lambda d: d[: len(d) // 2], ExportTruncatedError, "cut off"),
    "trailer missing": (
        lambda d: d[: d.rstrip(b"\n").rfind(b"\n") + 1],
        ExportTruncatedError,
        "without its trailer",
    ),
    "bad json line": (_bad_json, ExportFormatError, "line 4"),
    "wrong format version": (_version_2, ExportVersionError, "format version 2"),
    "tampered payload, trailer resealed": (_tamper_payload, LogTamperedError, "does not match"),
    "tampered payload": (
        lambda d: _tamper_payload(d, reseal=False),
        ExportFormatError,
        "digest",
    ),
    "event removed, counts fixed": (_skip_event, LogTamperedError, "missing"),
    "lines moved": (_swap_events, ExportFormatError, "moved"),
    "artifact missing": (_drop_artifact, ArtifactNotFoundError, "not in it"),
    "artifact changed, trailer resealed": (_change_artifact, ArtifactIntegrityError, "hash"),
    "artifact reference copied, chain recomputed": (
        _copy_artifact_ref,
        ArtifactIntegrityError,
        "copied from another run",
    ),
    "stream renamed, trailer resealed": (_rename_stream, ExportFormatError, "declares stream"),
    "world record removed, trailer resealed": (
        _drop_world_record,
        ExportFormatError,
        "not the exported world's own record",
    ),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_input_is_refused_by_name_and_the_target_is_unchanged(
    source: Source, case: str, tmp_path: Path
) -> None:
    spoil, error, words = HOSTILE[case]
    data_dir = tmp_path / "target"
    with local_world(data_dir) as target:
        with pytest.raises(error, match=words) as raised:
            import_world(target, io.BytesIO(spoil(source.export)))
        assert "nothing was imported" in str(raised.value)
        assert not target.app.recorder.max_notification_id()
    assert not any(p.is_file() for p in (data_dir / "artifacts").rglob("*"))
    # Nothing was left behind that would stop the whole file from being imported.
    with local_world(data_dir) as target:
        import_world(target, io.BytesIO(source.export))


def test_importing_streams_the_target_holds_is_refused_and_nothing_is_written(
    source: Source, tmp_path: Path
) -> None:
    with local_world(tmp_path / "t") as target:
        import_world(target, io.BytesIO(source.export))
        before = target.app.recorder.max_notification_id()
        with pytest.raises(ImportConflictError, match="already holds"):
            import_world(target, io.BytesIO(source.export))
        assert target.app.recorder.max_notification_id() == before
    done = _little("import", "--world", f"sqlite:///{tmp_path / 't'}", stdin=source.export)
    assert done.returncode == 1
    assert done.stderr.decode().startswith("error: world sqlite:///")


def test_a_refused_file_reaches_the_cli_as_one_line(source: Source, tmp_path: Path) -> None:
    done = _little(
        "import",
        "--world",
        f"sqlite:///{tmp_path / 't'}",
        stdin=source.export[: len(source.export) // 3],
    )
    assert done.returncode == 1
    assert done.stderr.decode().count("\n") == 1 and "cut off" in done.stderr.decode()


def test_the_export_functions_refuse_what_is_not_a_world_or_a_file() -> None:
    with pytest.raises(TypeError, match="World"):
        export_world("sqlite:///x", io.BytesIO())  # type: ignore[arg-type]
    with memory_world() as world, pytest.raises(TypeError, match="file object"):
        import_world(world, b"{}")  # type: ignore[arg-type]
    with memory_world() as world:
        for call in (export_world, import_world):
            with pytest.raises(TypeError, match="progress must be a callable"):
                call(world, io.BytesIO(), progress=5)  # type: ignore[arg-type]


def test_a_tampered_source_is_refused_and_nothing_reaches_stdout(
    source: Source, tmp_path: Path
) -> None:
    data_dir = tmp_path / "copy"
    shutil.copytree(Path(source.url.removeprefix("sqlite:///")), data_dir)
    conn = sqlite3.connect(data_dir / "events.sqlite3")
    with conn:
        rowid, state = conn.execute(
            "SELECT notification_id, state FROM little_es_rows"
            " WHERE topic = 'StepCompleted' LIMIT 1"
        ).fetchone()
        conn.execute(
            "UPDATE little_es_events SET state = ? WHERE rowid = ?",
            (bytes(state).replace(b'"p":"', b'"p":"x', 1), rowid),
        )
    conn.close()
    done = _little("export", "--world", f"sqlite:///{data_dir}")
    assert done.returncode == 1
    assert done.stdout == b""
    assert "does not match its own digest" in done.stderr.decode()
    to_file = _little("export", "--world", f"sqlite:///{data_dir}", "-o", str(tmp_path / "x"))
    assert to_file.returncode == 1
    assert not list(tmp_path.glob("x*")), "a refused export leaves no file behind"


def test_a_source_whose_run_was_deleted_whole_is_refused_not_moved_without_it(
    source: Source, tmp_path: Path
) -> None:
    """Its rows are gone, its head remains (`little verify --all` finds it): an export that
    left it out would give a target that verifies clean and never had the run."""
    data_dir = tmp_path / "copy"
    shutil.copytree(Path(source.url.removeprefix("sqlite:///")), data_dir)
    conn = sqlite3.connect(data_dir / "events.sqlite3")
    with conn:
        conn.execute(
            "DELETE FROM little_es_events WHERE stream ="
            " (SELECT id FROM little_es_streams WHERE stream_id = ?)",
            (run_stream_id("run_done").hex,),
        )
    conn.close()
    with local_world(data_dir) as world, pytest.raises(LogTamperedError, match="were deleted"):
        export_world(world, io.BytesIO())
    done = _little("export", "--world", f"sqlite:///{data_dir}")
    assert done.returncode == 1
    assert done.stdout == b""


def test_an_export_to_a_path_that_cannot_be_written_exits_1_with_one_line(
    tmp_path: Path,
) -> None:
    local_world(tmp_path / "w").close()
    (tmp_path / "a-file").write_text("not a directory")
    for where in (tmp_path / "missing" / "x.jsonl", tmp_path / "a-file" / "x.jsonl"):
        done = _little("export", "--world", f"sqlite:///{tmp_path / 'w'}", "-o", str(where))
        assert done.returncode == 1
        assert done.stderr.decode().startswith(f"error: cannot write {where}: ")
        assert "Traceback" not in done.stderr.decode()


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_an_export_to_a_stdout_that_cannot_be_written_exits_1_with_one_line(
    source: Source,
) -> None:
    env = {**os.environ, "PYTHONPATH": str(_REPO)}
    env.pop("LITTLE_ES_WORLD", None)
    with Path("/dev/full").open("wb") as full:
        done = subprocess.run(
            [sys.executable, "-m", "little_es.cli", "export", "--world", source.url],
            stdout=full,
            stderr=subprocess.PIPE,
            env=env,
            cwd=_REPO,
            timeout=120,
            check=False,
        )
    assert done.returncode == 1
    assert done.stderr.decode() == "error: cannot write to stdout: No space left on device\n"


def test_snapshots_travel_and_stand_on_their_events(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(LittleApplication.snapshotting_intervals, Run, 4)
    steps = [task(f"s{i}", _double) for i in range(4)]
    out = io.BytesIO()
    with local_world(tmp_path / "a") as world:
        run_workflow_sync(world, Workflow("long", steps=steps), {"n": 1}, run_id="run_long")
        counts = export_world(world, out)
        before = replay_run(world, "run_long")
    assert counts.snapshots >= 1
    lines = _lines(out.getvalue())
    with local_world(tmp_path / "b") as target:
        assert import_world(target, io.BytesIO(out.getvalue())).snapshots == counts.snapshots
        assert target.app.snapshots is not None
        assert target.app.snapshots.recorder.select_events(run_stream_id("run_long"))
        assert replay_run(target, "run_long") == before
        assert target.load_run("run_long").version == before.state.event_count
    # A snapshot that does not stand on the event of its version is refused.
    snapshot = next(line for line in lines if line["type"] == "snapshot")
    link_end = 2 + 2 * LINK_SIZE
    snapshot["frame"] = snapshot["frame"][:2] + "00" * LINK_SIZE + snapshot["frame"][link_end:]
    with local_world(tmp_path / "c") as target:
        with pytest.raises(LogTamperedError, match="snapshot"):
            import_world(target, io.BytesIO(_join(lines)))
        assert not target.app.recorder.max_notification_id()


def test_the_cli_reads_and_writes_files_too(source: Source, tmp_path: Path) -> None:
    target = f"sqlite:///{tmp_path / 'target'}"
    assert _little("import", "--world", target, stdin=source.export).returncode == 0
    again = tmp_path / "again.jsonl"
    done = _little("export", "--world", target, "--output", str(again))
    assert done.returncode == 0 and done.stdout == b""
    moved = tmp_path / "moved"
    assert _little("import", "--world", f"sqlite:///{moved}", "--input", str(again)).returncode == 0
    with open_world(f"sqlite:///{moved}") as world:
        for run_id, replay in source.replays.items():
            assert replay_run(world, run_id) == replay, run_id


def test_a_users_own_events_move_with_the_cli_which_cannot_import_their_class(
    tmp_path: Path,
) -> None:
    source_dir, target_dir = tmp_path / "a", tmp_path / "b"
    with local_world(source_dir) as world:
        run_workflow_sync(world, Workflow("own", steps=[task("a", _double)]), {"n": 1}, run_id="r")
        world.record_run_event("r", Approved, approver="ops")
        # Referenced by nothing but the user's event, which the cli cannot decode.
        blob = world.artifacts.put(b"a user's file " * 100, run_id="r", step_path="a")
        world.record_run_event("r", Attached, files=(blob,))
        # Found in the JSON too, and not refused as a reference copied from another run:
        # the user's event is the user's to check, and the class's readers may check it.
        report = world.artifacts.put(b"a report " * 100, run_id="r_other", step_path="make")
        world.record_run_event("r", Noted, about={"report": report.model_dump(mode="json")})
        before = replay_run(world, "r")
    exported = _little("export", "--world", f"sqlite:///{source_dir}")
    assert exported.returncode == 0, exported.stderr.decode()
    assert b"test_transfer.Approved" in exported.stdout
    imported = _little("import", "--world", f"sqlite:///{target_dir}", stdin=exported.stdout)
    assert imported.returncode == 0, imported.stderr.decode()
    assert b" 2 artifacts " in imported.stdout, imported.stdout
    with local_world(target_dir) as target:
        assert [e.approver for e in target.read_run_log("r") if isinstance(e, Approved)] == ["ops"]
        assert replay_run(target, "r") == before
        assert verify_world(target).ok
        assert target.artifacts.get(blob).payload == b"a user's file " * 100
        assert target.artifacts.get(report).payload == b"a report " * 100


# ------------------------------------------------- snapshots, forks, stream lines, header


def _snapshotted_export(root: Path, monkeypatch: pytest.MonkeyPatch) -> bytes:
    """A world whose run has snapshots (at 4 and 16 events), exported."""
    monkeypatch.setitem(LittleApplication.snapshotting_intervals, Run, 4)
    out = io.BytesIO()
    with local_world(root) as world:
        steps = [task(f"s{i}", _double) for i in range(8)]
        run_workflow_sync(world, Workflow("long", steps=steps), {"n": 1}, run_id="run_long")
        assert export_world(world, out).snapshots >= 2
    return out.getvalue()


def _payload(line: dict[str, Any]) -> bytes:
    if "payload_b64" in line:
        return base64.b64decode(line["payload_b64"])
    return str(line["payload"]).encode()


def _recounted(lines: list[dict[str, Any]]) -> bytes:
    """Lines back into a file, the header's and trailer's counts made to match them."""
    kinds = Counter(line["type"] for line in lines)
    counts = {kind: kinds[kind[:-1]] for kind in ("streams", "events", "snapshots", "artifacts")}
    lines[0]["counts"] = lines[-1]["counts"] = counts
    return _join(lines)


def test_a_snapshot_line_repeated_is_refused_by_its_line_before_anything_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    export = _snapshotted_export(tmp_path / "a", monkeypatch)
    lines = _lines(export)
    first = next(i for i, line in enumerate(lines) if line["type"] == "snapshot")
    # Once next to itself, once after the other snapshots: both are the same snapshot twice.
    for at in (first + 1, len(lines) - 1):
        spoiled = [*lines[:at], dict(lines[first]), *lines[at:]]
        with local_world(tmp_path / "b") as target:
            with pytest.raises(ExportFormatError, match=f"line {at + 1} .*second snapshot"):
                import_world(target, io.BytesIO(_recounted(spoiled)))
            assert not target.app.recorder.max_notification_id()
    with local_world(tmp_path / "b") as target:
        import_world(target, io.BytesIO(export))
        assert verify_world(target).ok


def test_an_import_writes_its_rows_and_snapshots_in_one_transaction(
    world_factory: Callable[[], World], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every backend: the target already holds one of the exported snapshots (its store's
    # own key refuses the import's), so the import's commit fails, and must leave nothing.
    export = _snapshotted_export(tmp_path / "a", monkeypatch)
    snapshot = next(line for line in _lines(export) if line["type"] == "snapshot")
    target = world_factory()
    assert target.app.snapshots is not None
    target.app.snapshots.recorder.insert_events(
        [
            StoredEvent(
                uuid.UUID(snapshot["stream_id"]),
                snapshot["version"],
                snapshot["topic"],
                bytes.fromhex(snapshot["frame"]) + _payload(snapshot),
            )
        ]
    )
    with pytest.raises(ImportConflictError, match="nothing was imported"):
        import_world(target, io.BytesIO(export))
    assert not target.app.recorder.max_notification_id()
    assert not target.recorded
    assert target.backend.stream_head(run_stream_id("run_long")) is None
    assert world_factory().backend.stream_heads() == {}


def test_the_snapshots_imported_are_those_exported_on_every_backend(
    world_factory: Callable[[], World], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    export = _snapshotted_export(tmp_path / "a", monkeypatch)
    exported = [
        (line["version"], bytes.fromhex(line["frame"]) + _payload(line))
        for line in _lines(export)
        if line["type"] == "snapshot"
    ]
    target = world_factory()
    assert import_world(target, io.BytesIO(export)).snapshots == len(exported)
    assert target.app.snapshots is not None
    stored = target.app.snapshots.recorder.select_events(run_stream_id("run_long"))
    assert [(s.originator_version, s.state) for s in stored] == exported
    assert target.load_run("run_long").version == replay_run(target, "run_long").state.event_count


def _reframed(line: dict[str, Any], topic: str, payload: bytes) -> None:
    """Give a snapshot line another topic and payload, its frame made to match them."""
    link = bytes.fromhex(line["frame"])[1 : 1 + LINK_SIZE]
    data = frame(link, uuid.UUID(line["stream_id"]), line["version"], topic, payload)
    line.pop("payload_b64", None)
    line.update(frame=data[:FRAME_SIZE].hex(), topic=topic, payload=payload.decode())


@pytest.mark.parametrize("case", ["not a snapshot's payload", "another event"])
def test_a_snapshot_a_load_would_refuse_is_refused_before_anything_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    lines = _lines(_snapshotted_export(tmp_path / "a", monkeypatch))
    snapshot = next(line for line in lines if line["type"] == "snapshot")
    if case == "another event":
        started = next(line for line in lines if line.get("topic") == "RunStarted")
        _reframed(snapshot, "RunStarted", started["payload"].encode())
        words = "holds a 'RunStarted' event, not a snapshot"
    else:
        _reframed(snapshot, snapshot["topic"], b'{"not": "a snapshot"}')
        words = "malformed payload"
    with local_world(tmp_path / "b") as target:
        with pytest.raises(EventPayloadError, match=words) as raised:
            import_world(target, io.BytesIO(_join(lines)))
        assert "the snapshot of stream" in str(raised.value)
        assert not target.app.recorder.max_notification_id()


@pytest.mark.parametrize("version", [0, -1])
def test_a_stream_line_of_no_events_is_refused_by_its_line(
    source: Source, tmp_path: Path, version: int
) -> None:
    lines = _lines(source.export)
    empty = {**lines[1], "stream_id": str(uuid.uuid4()), "kind": "stream", "version": version}
    empty["head"] = {**empty["head"], "version": version}
    empty["name"] = empty["stream_id"]
    spoiled = [lines[0], lines[1], empty, *lines[2:]]
    with local_world(tmp_path / "t") as target:
        with pytest.raises(ExportFormatError, match=f"line 3 .*declared with {version} events"):
            import_world(target, io.BytesIO(_recounted(spoiled)))
        assert not target.app.recorder.max_notification_id()


def test_a_head_before_the_first_row_is_tampering() -> None:
    stream = uuid.uuid4()
    for version in (0, -1):
        with pytest.raises(LogTamperedError, match=f"head at version {version}"):
            verify_stream(stream, [], Head(version, bytes(16), seed(stream).digest()), legacy=False)


def test_a_header_that_claims_another_log_format_is_refused(source: Source, tmp_path: Path) -> None:
    # The header says the world predates the chain, and a run's rows lose their frames (its
    # running digest recomputed): a world in log format 4, as its record says, refuses them.
    lines = _lines(source.export)
    lines[0]["log_format"] = 1
    run = next(line for line in lines if line["type"] == "stream" and line["name"] == "run_done")
    running = seed(uuid.UUID(run["stream_id"]))
    for line in lines:
        if line["type"] == "event" and line["stream_id"] == run["stream_id"]:
            line["frame"] = None
            feed(running, line["topic"], line["payload"].encode())
    run["head"]["running"] = running.digest().hex()
    with local_world(tmp_path / "t") as target:
        with pytest.raises(ExportFormatError, match="header gives log format 1, but the expo"):
            import_world(target, io.BytesIO(_join(lines)))
        assert not target.app.recorder.max_notification_id()


def test_a_fork_moves_as_a_run_with_its_snapshots(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(LittleApplication.snapshotting_intervals, Run, 4)
    workflow = Workflow("long", steps=[task(f"s{i}", _double) for i in range(4)])
    out = io.BytesIO()
    with local_world(tmp_path / "a") as world:
        run_workflow_sync(world, workflow, {"n": 1}, run_id="run_long")
        fork_run(world, "run_long", at="s3", new_run_id="run_fork")
        run_workflow_sync(world, workflow, None, run_id="run_fork")
        export_world(world, out)
        before = replay_run(world, "run_fork")
    lines = _lines(out.getvalue())
    fork = str(run_stream_id("run_fork"))
    declared = next(line for line in lines if line.get("stream_id") == fork)
    assert (declared["kind"], declared["name"]) == ("run", "run_fork")
    assert any(line["type"] == "snapshot" and line["stream_id"] == fork for line in lines)
    with local_world(tmp_path / "b") as target:
        import_world(target, io.BytesIO(out.getvalue()))
        assert replay_run(target, "run_fork") == before
        assert verify_world(target).ok


def test_an_export_from_before_forks_were_runs_still_imports(tmp_path: Path) -> None:
    # Written by the exporter of e4e5229: a fork's stream is declared as a plain stream.
    fixture = Path(__file__).with_name("fixtures") / "export_with_fork_v1.jsonl"
    with local_world(tmp_path / "world") as world, fixture.open("rb") as f:
        imported = import_world(world, f)
        assert (imported.streams, imported.events) == (3, 14)
        assert replay_run(world, "r1_fork").state.forked_from is not None

"""OpenTelemetry traces of runs (``little_es.contrib.otel``, ``little trace``).

The spans are derived from the log, so the trace of the main example's run
(``examples/kill_resume.py``) is checked span by span against the log's own
figures; exported twice, emitted live, and after a kill and a resume in another
process, it carries the same ids. The SDK's in-memory exporter receives them.
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import os
import subprocess
import sys
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

import orjson
import pytest
from typer.testing import CliRunner

from little_es import RetryPolicy, StepContext, Workflow, run_workflow, subworkflow, task
from little_es.cli import app
from little_es.contrib.otel import export_run, instrument, run_spans, span_json, trace_id_of
from little_es.events import Event, RunEvent
from little_es.replay import replay_run
from little_es.world import local_world, memory_world

if os.environ.get("CI", "").lower() != "true":
    pytest.importorskip("opentelemetry.sdk", reason="the otel extra is not installed")

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "kill_resume.py"
RUN_ID = "run_triage_42"


def _example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("kill_resume_otel", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LITTLE_ES_CRASH_")}
    return {**env, **extra}


def _child(world_dir: Path, ledger: Path, **env: str) -> int:
    # The example's own child entry point: every process runs the workflow from the same
    # module (``__main__`` of the example file), so the resume sees the IR hash it started.
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), "--child", str(world_dir)],
        env=_env(TRIAGE_LEDGER=str(ledger), **env),
        check=False,
        timeout=120,
    )
    return done.returncode


def _ns(at: datetime) -> int:
    """OpenTelemetry's time of ``at``: nanoseconds since the epoch (events keep microseconds)."""
    return (at - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1) * 1000


def _collector() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def _attr(span: ReadableSpan, name: str) -> Any:
    return (span.attributes or {})[name]


def _key(span: ReadableSpan) -> tuple[Any, ...]:
    context = span.context
    assert context is not None
    return (
        span.name,
        context.trace_id,
        context.span_id,
        None if span.parent is None else span.parent.span_id,
        span.start_time,
        span.end_time,
        tuple(sorted(dict(span.attributes or {}).items())),
        span.status.status_code,
        span.kind,
    )


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A world where the main example's run ran to its end, in one process."""
    base = tmp_path_factory.mktemp("otel-finished")
    world_dir = base / "world"
    with local_world(world_dir) as world:
        world.set_model_price("scripted", "planner-1", input_per_mtok=3.0, output_per_mtok=15.0)
    assert _child(world_dir, base / "ledger") == 0
    return world_dir


def test_the_example_runs_trace_has_its_steps_calls_and_token_totals(finished: Path) -> None:
    provider, exporter = _collector()
    with local_world(finished) as world:
        returned = export_run(world, RUN_ID, provider)
        totals = replay_run(world, RUN_ID).state.usage
    spans = exporter.get_finished_spans()
    assert len(spans) == len(returned) == 21
    by_id = {s.context.span_id: s for s in spans if s.context is not None}
    names = sorted(s.name for s in spans)
    assert names.count("chat planner-1") == 4
    assert names.count("execute_tool read_file") == 3
    assert names.count("execute_tool search_code") == 1
    for name in ("run triage", "step fetch", "step plan", "invoke_agent plan", "step draft@2"):
        assert name in names

    (root,) = [s for s in spans if s.parent is None]
    assert root.name == "run triage"
    assert root.attributes is not None and root.attributes["little_es.run.status"] == "completed"
    assert {s.context.trace_id for s in spans if s.context} == {int(trace_id_of(RUN_ID), 16)}

    def parent(span: ReadableSpan) -> str:
        assert span.parent is not None
        return by_id[span.parent.span_id].name

    for span in spans:
        if span.parent is None:
            continue
        if span.name.startswith(("chat ", "execute_tool ")):
            assert parent(span) == "invoke_agent plan"
        elif span.name == "invoke_agent plan":
            assert parent(span) == "step plan"
        elif span.name.startswith("step check["):
            assert parent(span) == "step check"
        else:
            assert parent(span) == "run triage", span.name
        # A child lies within its parent.
        outer = by_id[span.parent.span_id]
        assert outer.start_time is not None and span.start_time is not None
        assert outer.end_time is not None and span.end_time is not None
        assert outer.start_time <= span.start_time <= span.end_time <= outer.end_time

    chats = [s for s in spans if s.name.startswith("chat ")]
    for chat in chats:
        attributes = chat.attributes or {}
        assert chat.kind is SpanKind.CLIENT
        assert attributes["gen_ai.operation.name"] == "chat"
        assert attributes["gen_ai.provider.name"] == attributes["gen_ai.system"] == "scripted"
        assert attributes["gen_ai.request.model"] == "planner-1"
        assert attributes["gen_ai.response.model"] == "planner-1"
    assert sorted(_attr(c, "little_es.turn") for c in chats) == [1, 2, 3, 4]
    assert sum(_attr(c, "gen_ai.usage.input_tokens") for c in chats) == totals.input_tokens
    assert sum(_attr(c, "gen_ai.usage.output_tokens") for c in chats) == totals.output_tokens
    assert (
        sum(_attr(c, "gen_ai.usage.cache_read.input_tokens") for c in chats)
        == totals.cached_input_tokens
    )
    assert (
        sum(_attr(c, "gen_ai.usage.cache_creation.input_tokens") for c in chats)
        == totals.cache_write_tokens
    )
    assert totals.input_tokens > 0 and totals.output_tokens > 0

    tools = [s for s in spans if s.name.startswith("execute_tool ")]
    assert sorted(_attr(s, "gen_ai.tool.call.id") for s in tools) == ["c1", "c2", "c3", "c4"]
    for span in tools:
        attributes = span.attributes or {}
        assert attributes["gen_ai.operation.name"] == "execute_tool"
        assert span.name == f"execute_tool {_attr(span, 'gen_ai.tool.name')}"
    assert all(s.status.status_code is StatusCode.UNSET for s in spans)


def test_exporting_twice_gives_the_same_ids_and_times(finished: Path) -> None:
    first, second = _collector(), _collector()
    with local_world(finished) as world:
        export_run(world, RUN_ID, first[0])
        export_run(world, RUN_ID, second[0])
    one = sorted(_key(s) for s in first[1].get_finished_spans())
    two = sorted(_key(s) for s in second[1].get_finished_spans())
    assert one == two and len(one) == 21


def test_live_spans_equal_the_exported_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRIAGE_LEDGER", str(tmp_path / "ledger"))
    example = _example()
    live, live_spans = _collector()
    with local_world(tmp_path / "world") as world:
        stop = instrument(world, live)
        asyncio.run(run_workflow(world, example.triage, {"ticket": 42}, run_id="run_live"))
        stop()
        exported, exported_spans = _collector()
        export_run(world, "run_live", exported)
    emitted = [_key(s) for s in live_spans.get_finished_spans()]
    assert len(emitted) == len(set(emitted)) == 21
    assert sorted(emitted) == sorted(_key(s) for s in exported_spans.get_finished_spans())
    # Emitted as they closed: the run's span last, a step's after its calls.
    names = [s.name for s in live_spans.get_finished_spans()]
    assert names[-1] == "run triage"
    assert names.index("invoke_agent plan") < names.index("step plan")


def test_a_killed_and_resumed_run_has_the_trace_of_an_uninterrupted_one(
    finished: Path, tmp_path: Path
) -> None:
    world_dir = tmp_path / "world"
    killed = _child(
        world_dir, tmp_path / "ledger", LITTLE_ES_CRASH_AFTER_EVENT="harness.model.called:turn=3"
    )
    assert killed == -9, "the child was to be killed by SIGKILL mid agent step"
    with local_world(world_dir) as world:
        partial = run_spans(world, RUN_ID)
    # Killed in turn 3: that call, the session, its step and the run are still open.
    still_open = sorted(s.name for s in partial if s.attributes.get("little_es.span.open"))
    assert still_open == ["chat planner-1", "invoke_agent plan", "run triage", "step plan"]
    assert _child(world_dir, tmp_path / "ledger") == 0

    def shape(spans: Sequence[Any]) -> list[tuple[Any, ...]]:
        return sorted(
            (s.name, s.trace_id, s.span_id, s.parent_id, sorted(s.attributes.items()), s.status)
            for s in spans
        )

    with local_world(world_dir) as resumed, local_world(finished) as uninterrupted:
        assert shape(run_spans(resumed, RUN_ID)) == shape(run_spans(uninterrupted, RUN_ID))
        # Tokens, not dollars: only the uninterrupted run's world has the model's price.
        again = replay_run(resumed, RUN_ID).state.usage
        once = replay_run(uninterrupted, RUN_ID).state.usage
        assert (again.input_tokens, again.output_tokens, again.calls) == (
            once.input_tokens,
            once.output_tokens,
            once.calls,
        )


_ATTEMPTS: list[int] = []


def _flaky(ctx: StepContext) -> str:
    _ATTEMPTS.append(ctx.attempt)
    if ctx.attempt == 1:
        raise RuntimeError("first attempt fails")
    return "ok"


def _leaf(ctx: StepContext) -> dict[str, str]:
    return {"leaf": "done"}


LEAF = Workflow("leafy", steps=[task("leaf", _leaf)])
PARENT = Workflow(
    "parent",
    steps=[
        task("flaky", _flaky, retry=RetryPolicy(max_attempts=2)),
        subworkflow("sub", LEAF),
    ],
)


def test_a_sub_run_is_in_its_parents_trace_under_its_step_and_a_retry_is_an_error_span() -> None:
    world = memory_world()
    live, live_spans = _collector()
    stop = instrument(world, live)
    asyncio.run(run_workflow(world, PARENT, {"x": 1}, run_id="run_parent"))
    stop()
    spans = run_spans(world, "run_parent")
    by_name = {s.name: s for s in spans}
    assert {s.trace_id for s in spans} == {int(trace_id_of("run_parent"), 16)}
    assert by_name["run leafy"].parent_id == by_name["step sub"].span_id
    assert by_name["step leaf"].parent_id == by_name["run leafy"].span_id
    failed = [s for s in spans if s.name == "step flaky" and s.status == "error"]
    assert len(failed) == 1 and failed[0].status_description == "first attempt fails"
    assert failed[0].attributes["error.type"] == "RuntimeError"
    assert len([s for s in spans if s.name == "step flaky"]) == 2
    # The child run's spans, emitted live as it ran, have the ids the export gives them.
    emitted = {
        (s.name, s.context.span_id, s.parent.span_id if s.parent else None)
        for s in live_spans.get_finished_spans()
        if s.context is not None
    }
    assert emitted == {(s.name, s.span_id, s.parent_id) for s in spans}
    own = run_spans(world, "run_parent", sub_runs=False)
    assert {s.attributes["little_es.run.id"] for s in own} == {"run_parent"}
    assert own == [s for s in spans if s.attributes["little_es.run.id"] == "run_parent"]


def test_a_failing_listener_is_logged_and_the_run_completes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    world = memory_world()
    seen: list[Sequence[Event]] = []

    def broken(events: Sequence[Event]) -> None:
        raise RuntimeError("listener bug")

    remove_broken = world.add_listener(broken)
    world.add_listener(seen.append)
    with caplog.at_level(logging.ERROR, logger="little_es.world"):
        result = asyncio.run(run_workflow(world, LEAF, {}, run_id="run_listened"))
    assert result.output == {"leaf": "done"}
    failures = [r for r in caplog.records if r.name == "little_es.world"]
    assert failures and all("listener" in r.getMessage() for r in failures)
    assert failures[0].exc_info is not None and "listener bug" in str(failures[0].exc_info[1])
    # The listener after the broken one saw every commit, in order.
    wire = [type(e).wire_name for batch in seen for e in batch if isinstance(e, RunEvent)]
    assert wire[0] == "RunStarted" and wire[-1] == "RunCompleted"
    assert len(wire) == len(world.read_run_log("run_listened"))
    remove_broken()
    caplog.clear()
    with caplog.at_level(logging.ERROR, logger="little_es.world"):
        asyncio.run(run_workflow(world, LEAF, {}, run_id="run_quiet"))
    assert not [r for r in caplog.records if r.name == "little_es.world"]


def test_little_trace_prints_one_json_span_per_line(finished: Path) -> None:
    done = CliRunner().invoke(app, ["trace", RUN_ID, "--world", f"sqlite:///{finished}"])
    assert done.exit_code == 0, done.output
    lines = [orjson.loads(line) for line in done.stdout.splitlines()]
    with local_world(finished) as world:
        assert lines == [span_json(s) for s in run_spans(world, RUN_ID)]
    assert len(lines) == 21
    assert {line["trace_id"] for line in lines} == {trace_id_of(RUN_ID)}
    root = [line for line in lines if line["parent_id"] is None]
    assert [r["name"] for r in root] == ["run triage"]
    chat = next(line for line in lines if line["name"].startswith("chat "))
    assert set(chat) == {
        "name",
        "trace_id",
        "span_id",
        "parent_id",
        "kind",
        "start",
        "end",
        "attributes",
        "status",
    }
    assert chat["attributes"]["gen_ai.usage.input_tokens"] > 0


def test_little_trace_of_a_missing_run_fails_in_one_line(finished: Path) -> None:
    done = CliRunner().invoke(app, ["trace", "run_nope", "--world", f"sqlite:///{finished}"])
    assert done.exit_code == 1
    assert done.stdout == ""
    assert done.stderr.startswith("error: run 'run_nope' not found")


def test_without_the_sdk_little_trace_says_which_extra_to_install() -> None:
    code = (
        "import sys\nsys.modules['opentelemetry.sdk'] = None\nfrom little_es.cli import app\napp()"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, "trace", RUN_ID, "--world", "memory://"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 1
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("error: little trace needs the otel extra")
    assert lines[0].endswith("pip install 'little-es[otel]'")


def test_an_orchestrators_sub_runs_nest_under_their_start_workflow_calls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ORCHESTRATOR_LEDGER", str(tmp_path / "ledger"))
    spec = importlib.util.spec_from_file_location(
        "orchestrator_otel", ROOT / "examples" / "orchestrator.py"
    )
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    world = memory_world()
    live, live_spans = _collector()
    stop = instrument(world, live)
    asyncio.run(run_workflow(world, example.review_repo, {}, run_id="run_review_repo"))
    stop()
    spans = run_spans(world, "run_review_repo")
    by_id = {s.span_id: s for s in spans}
    assert {s.trace_id for s in spans} == {int(trace_id_of("run_review_repo"), 16)}
    sub_runs = [s for s in spans if s.name == "run review_file"]
    assert len(sub_runs) == len(example.FILES)
    calls = set()
    for run in sub_runs:
        assert run.parent_id is not None
        call = by_id[run.parent_id]
        assert call.name == "execute_tool start_workflow"
        calls.add(call.attributes["gen_ai.tool.call.id"])
        assert call.start <= run.start and run.end <= call.end
    assert len(calls) == len(example.FILES)
    emitted = sorted(
        (s.name, s.context.span_id, s.parent.span_id if s.parent else None)
        for s in live_spans.get_finished_spans()
        if s.context is not None
    )
    assert emitted == sorted((s.name, s.span_id, s.parent_id) for s in spans)


# Resumes the example's killed run as its own child does (the workflow from the example's
# `__main__`, so the IR hash is the one it started with), its world instrumented: prints
# the spans that process emitted, one JSON array per line.
_RESUME_INSTRUMENTED = """
import runpy, sys
import orjson
import little_es
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from little_es.contrib.otel import instrument

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
opened = little_es.local_world

def local_world(data_dir):
    world = opened(data_dir)
    instrument(world, provider)
    return world

little_es.local_world = local_world
example, world_dir = sys.argv[1], sys.argv[2]
sys.argv = [example, "--child", world_dir]
runpy.run_path(example, run_name="__main__")
for s in exporter.get_finished_spans():
    print(orjson.dumps([s.name, s.context.span_id, s.parent.span_id if s.parent else None,
                        s.start_time, s.end_time]).decode())
"""


def test_a_resumed_run_emits_live_the_spans_its_own_commits_close(tmp_path: Path) -> None:
    world_dir = tmp_path / "world"
    killed = _child(
        world_dir, tmp_path / "ledger", LITTLE_ES_CRASH_AFTER_EVENT="harness.model.called:turn=3"
    )
    assert killed == -9
    with local_world(world_dir) as world:
        before = {
            s.span_id for s in run_spans(world, RUN_ID) if "little_es.span.open" not in s.attributes
        }
    done = subprocess.run(
        [sys.executable, "-c", _RESUME_INSTRUMENTED, str(EXAMPLE), str(world_dir)],
        env=_env(TRIAGE_LEDGER=str(tmp_path / "ledger")),
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    emitted = [tuple(orjson.loads(line)) for line in done.stdout.splitlines()]
    with local_world(world_dir) as world:
        spans = run_spans(world, RUN_ID)
    # Every span the resume closed, once, with the export's ids and times; none of those
    # the killed process had closed before it died.
    expected = sorted(
        (s.name, s.span_id, s.parent_id, s.start, s.end) for s in spans if s.span_id not in before
    )
    assert len(emitted) == len(set(emitted)) == len(expected) > 0
    assert sorted(emitted) == sorted((n, i, p, _ns(a), _ns(b)) for n, i, p, a, b in expected)
    assert {"run triage", "invoke_agent plan", "chat planner-1"} <= {e[0] for e in emitted}


def test_without_a_configured_sdk_provider_instrument_emits_nothing_and_breaks_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The global provider is the API's proxy until an application sets an SDK one.
    from opentelemetry import trace

    assert not isinstance(trace.get_tracer_provider(), TracerProvider)
    world = memory_world()
    stop = instrument(world)
    with caplog.at_level(logging.ERROR, logger="little_es.world"):
        result = asyncio.run(run_workflow(world, LEAF, {}, run_id="run_untraced"))
    stop()
    assert result.output == {"leaf": "done"}
    assert not [r for r in caplog.records if r.name == "little_es.world"]
    # The export, given a provider, has the run's spans all the same.
    provider, exporter = _collector()
    assert len(export_run(world, "run_untraced", provider)) == 2
    assert sorted(s.name for s in exporter.get_finished_spans()) == ["run leafy", "step leaf"]

"""The inspection commands of ``little``: report, replay, events, runs."""

from __future__ import annotations

import base64
from pathlib import Path

import orjson
import pytest
from typer.testing import CliRunner, Result

from little_es.cli import app
from little_es.cli.inspection import replay_json
from little_es.pricing import price_usage
from little_es.render import cost_text
from little_es.replay import replay_run
from little_es.testing.logs import RunWriter, priced, unpriced
from little_es.world import World, local_world


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    """A SQLite world with a run mixing priced and unpriced calls, and an artifact."""
    root = tmp_path / "world"
    with local_world(root) as world:
        w = RunWriter(world, "run_cli", input={"ticket": 7})
        w.agent_step("plan", [priced(), unpriced()])
        w.agent_step("ask", [unpriced()])
        ref = world.artifacts.put(b"\xffbinary", run_id="run_cli", step_path="write")
        w.task_step("write", None, output_ref=ref)
        w.start_step("publish")
        RunWriter(world, "run_other").task_step("only", 1)
    return root


@pytest.fixture
def url(data_dir: Path) -> str:
    return f"sqlite:///{data_dir}"


def _world(data_dir: Path) -> World:
    return local_world(data_dir)


def _run(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(app, list(args), env=env)


def test_report_shows_dashes_and_unpriced_calls(url: str, data_dir: Path) -> None:
    result = _run("report", "run_cli", "--world", url)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    ask = next(line for line in lines if " ask " in line)
    assert ask.split()[-1] == "-"
    assert "2 unpriced calls" in next(line for line in lines if "total" in line)
    plan_cost = price_usage("openai", "gpt-4o", priced().usage)
    assert plan_cost is not None
    plan = next(line for line in lines if " plan " in line)
    assert f"${plan_cost:,.6f} (+1 unpriced)" in plan
    assert plan.split()[3:5] == ["2,000", "400"]
    write = next(line for line in lines if " write " in line)
    assert "completed" in write and "$0.000000" in write
    assert "publish" in result.stdout


def test_report_totals_without_unpriced_calls(url: str) -> None:
    result = _run("report", "run_other", "--world", url)
    assert result.exit_code == 0, result.output
    assert "unpriced" not in result.stdout
    assert "total" in result.stdout


def test_cost_text() -> None:
    from little_es.values import UsageTotals

    assert cost_text(UsageTotals()) == "$0.000000"
    # Priced, under half a millionth of a dollar: not shown as free.
    assert cost_text(UsageTotals(cost_usd=2e-7, calls=1)) == "<$0.000001"
    assert cost_text(UsageTotals(cost_usd=6e-7, calls=1)) == "$0.000001"
    assert cost_text(UsageTotals(cost_usd=None, unpriced_calls=2, calls=2)) == "-"
    assert (
        cost_text(UsageTotals(cost_usd=1.5, unpriced_calls=1, calls=3)) == "$1.500000 (+1 unpriced)"
    )


def test_events_jsonl_is_the_log_in_order(url: str, data_dir: Path) -> None:
    result = _run("events", "run_cli", "--world", url, "--jsonl")
    assert result.exit_code == 0, result.output
    rows = [orjson.loads(line) for line in result.stdout.splitlines()]
    with _world(data_dir) as world:
        log = world.read_run_log("run_cli")
    assert [r["wire_name"] for r in rows] == [e.wire_name for e in log]
    assert [(r["stream_id"], r["version"]) for r in rows] == [
        (str(e.originator_id), e.originator_version) for e in log
    ]
    assert rows[0]["wire_name"] == "RunStarted"
    assert rows[0]["payload"]["input"] == {"ticket": 7}
    assert set(rows[0]) == {"wire_name", "stream_id", "version", "timestamp", "payload"}
    assert "originator_id" not in rows[0]["payload"]
    assert "harness.model.responded" in [r["wire_name"] for r in rows]


def test_events_table_lists_wire_names(url: str) -> None:
    result = _run("events", "run_cli", "--world", url)
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert out.index("RunStarted") < out.index("harness.session.started")
    assert out.index("harness.model.called") < out.index("harness.model.responded")


def test_replay_json_parses_and_matches_replay_run(url: str, data_dir: Path) -> None:
    result = _run("replay", "run_cli", "--world", url, "--json")
    assert result.exit_code == 0, result.output
    data = orjson.loads(result.stdout)
    with _world(data_dir) as world:
        expected = replay_json(replay_run(world, "run_cli"))
    assert data == orjson.loads(orjson.dumps(expected))
    assert data["completed_step_paths"] == ["plan", "ask", "write"]
    assert data["pending_step_paths"] == ["publish"]
    assert base64.b64decode(data["artifacts"][0]["payload_base64"]) == b"\xffbinary"
    assert data["state"]["usage"]["unpriced_calls"] == 2


def test_replay_table(url: str) -> None:
    result = _run("replay", "run_cli", "--world", url)
    assert result.exit_code == 0, result.output
    assert "pending:   publish" in result.stdout
    assert "artifacts: 1 (verified)" in result.stdout


def test_runs_lists_every_run(url: str) -> None:
    result = _run("runs", "--world", url)
    assert result.exit_code == 0, result.output
    assert "run_cli" in result.stdout and "run_other" in result.stdout
    assert "(+2 unpriced)" in result.stdout
    assert result.stdout.index("run_cli") < result.stdout.index("run_other")


def test_the_world_comes_from_the_environment(url: str) -> None:
    result = _run("runs", env={"LITTLE_ES_WORLD": url})
    assert result.exit_code == 0, result.output
    assert "run_cli" in result.stdout


def _assert_one_error_line(result: Result, *fragments: str) -> None:
    assert result.exit_code == 1
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    assert "Traceback" not in result.output
    for fragment in fragments:
        assert fragment in lines[0]


@pytest.mark.parametrize("command", ["report", "replay", "events"])
def test_unknown_run_is_one_line_and_exit_1(url: str, command: str) -> None:
    _assert_one_error_line(_run(command, "run_nope", "--world", url), "'run_nope'", url)


def test_invalid_run_id_is_one_line_and_exit_1(url: str) -> None:
    _assert_one_error_line(_run("report", "../../etc", "--world", url), "run id")


def test_a_world_that_does_not_exist_is_one_line_and_exit_1(tmp_path: Path) -> None:
    missing = f"sqlite:///{tmp_path / 'nowhere'}"
    _assert_one_error_line(_run("runs", "--world", missing), "no world at", missing)
    assert not (tmp_path / "nowhere").exists()


def test_an_unknown_world_scheme_is_one_line_and_exit_1() -> None:
    _assert_one_error_line(_run("runs", "--world", "redis://localhost"), "unknown world URL")


def test_commands_of_other_modules_get_the_same_error_handling() -> None:
    # ``little run`` lives in little_es.cli.run; its errors go through the same group.
    _assert_one_error_line(_run("run", "not-a-module-reference"), "module:attribute")

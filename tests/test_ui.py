"""``little ui`` in a real browser: Debian's Chromium, headless, driven by Playwright.

The world holds the kill-and-resume example's run: its child process is killed by
SIGKILL in the planner's third model call (as ``examples/kill_resume.py`` does), the
page is opened on the killed run, and the run is resumed while the page is open, so
the live view has to follow it to the end without a reload. A second run carries
HTML in its input, which must be shown as text and never run. An outer loop of
``tests/_outer_loop_proc.py`` is killed in its second cycle and resumed with another
planner prompt, so its page shows a cycle abandoned for drift.

Chromium is ``/usr/bin/chromium`` (``.ci/run`` installs it); without it the browser
test is skipped, except under ``CI=true`` where it fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import uvicorn

from little_es import (
    Planner,
    RetryPolicy,
    ScriptedModel,
    ScriptedReply,
    StepContext,
    Workflow,
    local_world,
    memory_world,
    run_outer_loop_sync,
    run_workflow,
    subworkflow,
    task,
)
from little_es.errors import OuterLoopNotFoundError
from little_es.outer_loop import loop_totals
from little_es.totals import run_tree_totals
from little_es.ui import create_app
from little_es.ui.html import loop_body, loops_body, run_body
from little_es.ui.pages import loop_page, loops_list, run_page, runs_list
from little_es.world import World
from tests import _outer_loop_proc as loop_proc

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "kill_resume.py"
CHROMIUM = Path("/usr/bin/chromium")
XSS = '<img src=x onerror="window.__xss=1"><script>window.__xss=2</script>'


def _example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("kill_resume_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("LITTLE_ES_CRASH_")}


@pytest.fixture
def killed_world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, ModuleType]:
    """A world whose ``run_triage_42`` was killed mid agent step, and a finished run of HTML."""
    world_dir = tmp_path / "world"
    monkeypatch.setenv("TRIAGE_LEDGER", str(tmp_path / "ledger.txt"))
    example = _example()
    with local_world(world_dir) as world:
        world.set_model_price("scripted", "planner-1", input_per_mtok=3.0, output_per_mtok=15.0)
        asyncio.run(run_workflow(world, example.triage, {"ticket": XSS}, run_id="run_html"))
    child = subprocess.run(
        [sys.executable, str(EXAMPLE), "--child", str(world_dir)],
        env={**_env(), "LITTLE_ES_CRASH_AFTER_EVENT": "harness.model.called:turn=3"},
        check=False,
        timeout=60,
    )
    assert child.returncode == -9, "the child was to be killed by SIGKILL mid agent step"
    return world_dir, example


@pytest.fixture
def drifted_loop(killed_world: tuple[Path, ModuleType], tmp_path: Path) -> str:
    """Outer loop ``loop_d`` in the world: killed in cycle 2, resumed with the v2 prompt,
    so cycle 2 is abandoned for drift and cycles 3 (run) and 4 (done) follow."""
    url = f"sqlite:///{killed_world[0]}"
    ledger = {"OUTER_LOOP_LEDGER": str(tmp_path / "loop-ledger")}
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            f"from tests._outer_loop_proc import main; main({[url, 'loop_d']!r})",
        ],
        cwd=ROOT,
        env={**_env(), **ledger, "OUTER_LOOP_KILL_IN_CYCLE": "2"},
        check=False,
        timeout=60,
    )
    assert child.returncode == -9, "the loop's child was to be killed by SIGKILL in cycle 2"
    with pytest.MonkeyPatch.context() as mp, local_world(killed_world[0]) as world:
        mp.setenv("OUTER_LOOP_LEDGER", ledger["OUTER_LOOP_LEDGER"])
        result = run_outer_loop_sync(
            world,
            planner=loop_proc.make_planner("v2"),
            workflow=loop_proc.improve,
            outer_loop_id="loop_d",
        )
    assert result.reason == "planner_done"
    return "loop_d"


@contextlib.contextmanager
def _served(world: World) -> Iterator[str]:
    """The app over ``world`` served by uvicorn in a thread on a free port; its base URL.
    Stopped (and joined) after."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    srv = uvicorn.Server(uvicorn.Config(create_app(world), log_level="warning", access_log=False))
    thread = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not srv.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the server did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        srv.should_exit = True
        thread.join(10)
        sock.close()
        assert not thread.is_alive()


@pytest.fixture
def server(killed_world: tuple[Path, ModuleType]) -> Iterator[tuple[str, World]]:
    """The app over the killed world, served (see :func:`_served`)."""
    world = local_world(killed_world[0])
    try:
        with _served(world) as base:
            yield base, world
    finally:
        world.close()


def _chromium() -> str:
    if not CHROMIUM.exists():
        reason = f"{CHROMIUM} is missing: apt-get install -y chromium (.ci/run does)"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    return str(CHROMIUM)


def test_the_ui_in_chromium(
    drifted_loop: str,
    server: tuple[str, World],
    killed_world: tuple[Path, ModuleType],
    tmp_path: Path,
) -> None:
    from playwright.sync_api import expect, sync_playwright

    executable = _chromium()
    base, _ = server
    world_dir = killed_world[0]
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})

            # The runs list: the killed run still says running; the filters pick runs out.
            page.goto(base + "/")
            killed = page.locator('tr.run[data-run-id="run_triage_42"]')
            expect(killed).to_contain_text("triage v1")
            expect(killed.locator(".badge")).to_have_text("running")
            expect(page.locator('tr.run[data-run-id="run_html"] .badge')).to_have_text("completed")
            page.goto(base + "/?status=failed")
            expect(page.locator("tr.run")).to_have_count(0)
            page.goto(base + "/?status=running")
            # The killed run; the outer loop's abandoned cycle run was cancelled.
            expect(page.locator("tr.run")).to_have_count(1)
            expect(page.locator('tr.run[data-run-id="loop_d.cycle-2"]')).to_have_count(0)

            # The killed run's page: fetch done, the planner stopped in turn 3.
            page.click('a[href="/runs/run_triage_42"]')
            expect(page.locator("h1")).to_have_text("run run_triage_42")
            attempts = page.locator("#timeline tr.attempt")
            expect(attempts.nth(0)).to_have_attribute("data-outcome", "completed")
            expect(page.locator('tr.attempt[data-step="plan"]')).to_have_attribute(
                "data-outcome", "running"
            )
            turns = page.locator('section.session[data-step="plan"] tr.turn')
            expect(turns).to_have_count(3)
            expect(turns.nth(2)).to_contain_text("(no answer recorded)")
            page.evaluate("window.__same_page = true")

            # Resumed by another process while the page is open (the example's child again,
            # without the crash switch): the live view follows it to the end.
            resumed = subprocess.run(
                [sys.executable, str(EXAMPLE), "--child", str(world_dir)],
                env=_env(),
                check=False,
                timeout=60,
            )
            assert resumed.returncode == 0
            expect(page.locator("#run")).to_have_attribute(
                "data-status", "completed", timeout=10000
            )
            assert page.evaluate("window.__same_page") is True, "the page was reloaded"
            expect(page.locator('tr.attempt[data-step="publish"]')).to_have_attribute(
                "data-outcome", "completed"
            )
            for branch in ("reset", "session", "login"):
                expect(page.locator(f'tr.attempt[data-step="check[{branch}]/lint"]')).to_have_count(
                    1
                )
            expect(page.locator('tr.attempt[data-step="draft@2"]')).to_have_count(1)
            expect(page.locator("#timeline")).to_contain_text("parallel: reset, session, login")
            expect(page.locator(".facts")).to_contain_text("$0.045000")

            # The agent's turns: each model call priced alone, arguments and results expandable.
            expect(turns).to_have_count(4)
            expect(turns.nth(0)).to_contain_text("scripted/planner-1")
            expect(turns.nth(0)).to_contain_text("$0.005850")  # 1,200 in x $3 + 150 out x $15
            first = turns.nth(0).locator("details.model-call")
            first.locator("summary").click()
            expect(first).to_contain_text("Plan a fix for: Login fails after password reset")
            call = turns.nth(2).locator("details.model-call")
            call.locator("summary").click()
            expect(call).to_contain_text("# auth/session.py")  # the tool results of turn 2
            tool = turns.nth(2).locator("details.tool-call")
            expect(tool.locator("summary")).to_contain_text("read_file")
            tool.locator("summary").click()
            expect(tool).to_contain_text('"path": "web/login.py"')
            expect(tool).to_contain_text("# web/login.py")
            expect(page.locator("#sub-runs")).to_contain_text("run_triage_42")
            shot = tmp_path / "run_page.png"
            page.screenshot(path=str(shot), full_page=True)
            assert shot.stat().st_size > 10_000
            artifacts = os.environ.get("LITTLE_ES_UI_SCREENSHOT")
            if artifacts:
                shutil.copy(shot, artifacts)

            # User data is text on the page, never markup that runs.
            page.goto(base + "/runs/run_html")
            page.locator("#out-0 summary").click()
            expect(page.locator("#out-0 pre")).to_contain_text("<script>window.__xss=2</script>")
            assert page.evaluate("window.__xss") is None
            expect(page.locator("#run img")).to_have_count(0)

            # The outer loops, from the navigation bar: the list, then the drifted loop.
            page.click('header a[href="/loops"]')
            row = page.locator(f'tr.loop[data-loop-id="{drifted_loop}"]')
            expect(row).to_contain_text("improve")
            expect(row.locator(".cycles")).to_have_text("2/5")
            expect(row).to_contain_text("planner_done")
            expect(row.locator(".cost")).to_have_text("$0.036000")  # 4 planners x 2 calls
            row.locator("a").click()
            expect(page.locator("h1")).to_have_text("outer loop loop_d")
            cycles = page.locator("#cycles tr.cycle")
            expect(cycles).to_have_count(4)
            statuses = ["completed", "abandoned", "completed", "done"]
            for n, status in enumerate(statuses, 1):
                expect(cycles.nth(n - 1)).to_have_attribute("data-status", status)
            abandoned = page.locator('tr.cycle[data-cycle="2"]')
            expect(abandoned.locator(".changes")).to_have_text("planner: prompt changed")
            expect(abandoned.locator(".decision")).to_have_text("try x=2")  # before the drift
            expect(abandoned.locator(".planner-cost")).to_have_text("$0.009000")
            expect(page.locator('tr.cycle[data-cycle="3"] .decision')).to_have_text("try x=2")
            expect(page.locator('tr.cycle[data-cycle="4"] .decision')).to_have_text(
                "done: the score is good"
            )
            # A "done" cycle's run never started: its id is shown, not linked.
            expect(page.locator('tr.cycle[data-cycle="4"] .cycle-run a')).to_have_count(0)
            expect(page.locator("#loop-total")).to_contain_text("$0.036000")
            expect(page.locator("#pending")).to_have_count(0)
            shot = tmp_path / "loop_page.png"
            page.screenshot(path=str(shot), full_page=True)
            assert shot.stat().st_size > 10_000
            if artifacts:
                shutil.copy(shot, Path(artifacts).with_name("loop_page.png"))
            page.click('tr.cycle[data-cycle="2"] .cycle-run a')
            expect(page.locator("h1")).to_have_text("run loop_d.cycle-2")
            expect(page.locator('tr.attempt[data-step="work"]')).to_have_attribute(
                "data-outcome", "running"
            )
            page.go_back()
            page.click('tr.cycle[data-cycle="3"] .planner-run a')
            expect(page.locator("h1")).to_have_text("run loop_d.cycle-3.plan")
            missing = page.goto(base + "/loops/no_such_loop")
            assert missing is not None and missing.status == 404
            expect(page.locator(".error")).to_contain_text("not found")
        finally:
            browser.close()


def test_little_ui_serves_the_world(killed_world: tuple[Path, ModuleType]) -> None:
    # The command itself, as a user starts it: a real process on a free port, then stopped.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"sqlite:///{killed_world[0]}"
    proc = subprocess.Popen(
        [str(Path(sys.executable).parent / "little"), "ui", "--world", url, "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2) as r:
                    body = r.read().decode()
                break
            except OSError:
                assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
                assert time.monotonic() < deadline, "little ui did not answer"
                time.sleep(0.1)
        assert re.search(r'data-run-id="run_triage_42"', body)
        assert "<script>window.__xss" not in body
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/runs/run_html") as r:
            assert b'"status":"completed"' in r.read()
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/runs/no_such_run")
            raise AssertionError("a missing run was served")
        except urllib.error.HTTPError as exc:
            assert exc.code == 404
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=10)
    assert f"http://127.0.0.1:{port}/" in out


_FLAKY_CALLS: list[int] = []


def _flaky(ctx: StepContext) -> str:
    _FLAKY_CALLS.append(ctx.attempt)
    if ctx.attempt == 1:
        raise RuntimeError("<b>first attempt</b> fails")
    return "ok"


def _leaf(ctx: StepContext) -> dict[str, str]:
    return {"leaf": "done"}


CHILD = Workflow("leafy", steps=[task("leaf", _leaf)])
PARENT = Workflow(
    "parent",
    steps=[
        task("flaky", _flaky, retry=RetryPolicy(max_attempts=2)),
        subworkflow("sub", CHILD),
    ],
)


def test_a_run_page_shows_retries_and_the_sub_run_tree() -> None:
    # Without a browser: the run page's HTML of a retried step and a sub-run.
    world = memory_world()
    asyncio.run(run_workflow(world, PARENT, {"x": 1}, run_id="run_parent"))
    page = run_page(world, "run_parent")
    (child_id,) = page.state.sub_run_ids
    body = run_body(page)
    flaky = [a for a in page.attempts if a.step_path == "flaky"]
    assert [(a.attempt, a.outcome) for a in flaky] == [(1, "retrying"), (2, "completed")]
    assert 'data-step="flaky" data-outcome="retrying"' in body
    assert "&lt;b&gt;first attempt&lt;/b&gt; fails" in body and "<b>first attempt" not in body
    assert f'class="sub-run" href="/runs/{child_id}"' in body and "subtree 2 runs" in body
    assert page.tree_total == run_tree_totals(world, "run_parent")
    assert [r.run_id for r in runs_list(world, "completed")] == [child_id, "run_parent"]
    assert runs_list(world, "failed") == ()
    with pytest.raises(ValueError, match="unknown filter"):
        runs_list(world, "nope")


def _xss_planner() -> Planner:
    # A planner whose reason is markup: the loop page must show it as text.
    decision = json.dumps({"done": False, "input": {"x": 1}, "reason": XSS})
    return Planner(model=ScriptedModel([ScriptedReply(content=decision)]), prompt="plan")


def test_the_loop_pages_show_a_pending_cycle_unpriced_calls_and_escape_reasons() -> None:
    # Without a browser: a loop stopped by max_cycles, unpriced, with markup in a reason;
    # and a loop whose cycle has started and not ended.
    world = memory_world()
    run_outer_loop_sync(
        world,
        planner=_xss_planner(),
        workflow=loop_proc.improve,
        outer_loop_id="loop_x",
        max_cycles=1,
    )
    (row,) = loops_list(world)
    listed = loops_body([row])
    assert 'data-loop-id="loop_x"' in listed and ">1/1<" in listed and "max_cycles" in listed
    assert "1 unpriced" in listed and ">-" in listed
    body = loop_body(loop_page(world, "loop_x"))
    assert XSS not in body and "&lt;script&gt;window.__xss=2&lt;/script&gt;" in body
    assert "1 unpriced calls not in the dollars" in body
    assert 'href="/runs/loop_x.cycle-1.plan"' in body and 'href="/runs/loop_x.cycle-1"' in body
    assert loop_page(world, "loop_x").totals == loop_totals(world, world.load_outer_loop("loop_x"))

    def stop(ctx: StepContext) -> None:
        raise KeyboardInterrupt  # the process stops mid cycle: the cycle stays pending

    halted = Workflow("improve", steps=[task("work", stop)])
    with pytest.raises(KeyboardInterrupt):
        run_outer_loop_sync(
            world, planner=_xss_planner(), workflow=halted, outer_loop_id="loop_p", max_cycles=3
        )
    pending = loop_body(loop_page(world, "loop_p"))
    assert 'data-cycle="1" data-status="pending"' in pending
    assert '<p id="pending">pending cycle run: <a href="/runs/loop_p.cycle-1">' in pending
    assert [r.loop.started.outer_loop_id for r in loops_list(world) if r.loop.started] == [
        "loop_p",
        "loop_x",
    ]
    with pytest.raises(OuterLoopNotFoundError):
        loop_page(world, "loop_none")


def test_a_port_outside_the_tcp_range_is_refused_by_the_cli() -> None:
    from typer.testing import CliRunner

    from little_es.cli import app

    for port in ("65536", "-1"):
        result = CliRunner().invoke(app, ["ui", "--world", "memory://", "--port", port])
        assert result.exit_code == 2, result.output
        assert "--port" in result.output


def _fetch(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_artifacts_and_an_unreadable_log_are_shown_not_null_or_a_bare_500(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A run input and output stored as artifacts show as such (they showed ``null``); a log
    the server cannot read (an event type it did not import) is a page that says so, as
    ``little runs`` says it in one line, not a bare 500 with a traceback."""
    import orjson

    from little_es import memory_world
    from little_es.durability import OUTPUT_INLINE_LIMIT
    from little_es.events import utc_now
    from little_es.ids import run_stream_id
    from little_es.testing.logs import append_raw_row

    world = memory_world()
    big = {"text": "x" * (OUTPUT_INLINE_LIMIT + 1)}
    wf = Workflow("big_io", steps=[task("echo", lambda ctx: dict(ctx.input))])
    asyncio.run(run_workflow(world, wf, big, run_id="run_big"))
    with _served(world) as base:
        status, body = _fetch(base + "/runs/run_big")
        assert status == 200
        assert body.count("artifact sha256:") >= 3  # the input, the output, the step's
        assert "<pre>null</pre>" not in body
        state = orjson.dumps({"timestamp": utc_now().isoformat()})
        append_raw_row(world, run_stream_id("run_big"), "acme.FromTheFuture", state)
        for path in ("/runs/run_big", "/"):
            status, body = _fetch(base + path)
            assert status == 500 and "acme.FromTheFuture" in body, (path, body[:300])
    assert "Traceback" not in caplog.text

"""Every rich table and tree little_es prints, in one place.

The ``little`` command prints through these functions, and so can a program or
an example: each takes the data (or the world and a run id) and a
:class:`rich.console.Console`, prints, and returns what it printed from.

* :func:`render_report` - a run's per-step tokens and cost (``little report``);
* :func:`render_sub_runs` - the table of a run's sub-runs;
* :func:`render_tree` - a run and all its sub-runs as a tree, with totals
  (``little report --tree``);
* :func:`render_replay` - what :func:`~little_es.replay.replay_run` returns
  (``little replay``);
* :func:`render_events` - a run's event log by wire name (``little events``);
* :func:`render_runs` - the runs of a world (``little runs``);
* :func:`render_verify` - what :func:`~little_es.verify.verify_world` found
  (``little verify``);
* :func:`render_transfer` - what ``little export`` wrote or ``little import`` appended;
  :func:`progress_bar` - their progress, on stderr;
* :func:`render_prices` - the prices recorded in a world (``little prices list``);
* :func:`render_diff` - two runs side by side, step by step (``little diff``);
* :func:`render_loops` - the outer loops of a world (``little loops``);
* :func:`render_loop_report` - an outer loop's cycles with their decisions and
  cost (``little report --loop``);
* :class:`StepBoard` - the live table of steps ``little run`` shows.

Statuses are coloured from one table, :data:`STATUS_STYLES`; costs are shown by
:func:`cost_text`.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from types import MappingProxyType
from typing import Any

import orjson
from rich import box
from rich.console import Console, ConsoleDimensions, ConsoleOptions
from rich.markup import escape as _escape_markup
from rich.measure import Measurement
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn
from rich.segment import Segments
from rich.table import Table
from rich.tree import Tree

from little_es.backends.base import RunSummary
from little_es.diff import JsonChange, RunDiff, StepDiff, ToolCallSummary
from little_es.domain import LoopCycle, OuterLoop
from little_es.events import (
    BudgetExceeded,
    Event,
    ModelPriceSet,
    RunCancelled,
    RunWaiting,
    StepCompleted,
    StepFailed,
    StepStarted,
    WaitTimedOut,
)
from little_es.materialize import MaterializedRunState, WaitState
from little_es.orchestrator import RunTree, SubRunSummary, list_sub_runs, run_tree, sum_usage
from little_es.outer_loop import cycle_cost, list_outer_loops, load_outer_loop, loop_totals
from little_es.replay import ReplayResult, read_run_state
from little_es.transfer import TransferCounts, TransferProgress
from little_es.values import ArtifactRef, Budget, UsageTotals
from little_es.verify import VerifyReport
from little_es.world import World

__all__ = [
    "STATUS_STYLES",
    "StepBoard",
    "budget_text",
    "cost_text",
    "decision_text",
    "fork_text",
    "progress_bar",
    "render_diff",
    "render_events",
    "render_loop_report",
    "render_loops",
    "render_prices",
    "render_replay",
    "render_report",
    "render_runs",
    "render_sub_runs",
    "render_transfer",
    "render_tree",
    "status_text",
]


# C0 and C1 controls but tab and newline (an escape sequence from a log's text would
# drive the reader's terminal: clear it, retitle it), and the bidi overrides (which
# reorder how text reads).
_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """``text`` with its control characters shown as ``\\uXXXX`` instead of sent to the
    terminal (text in a log may come from a model); for plain output, as an error line."""
    return _CONTROLS.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def escape(text: str) -> str:
    """``text`` for a rich console: :func:`printable`, its markup escaped. Every piece of a
    run's data this module prints goes through it."""
    return _escape_markup(printable(text))


STATUS_STYLES: Mapping[str, str] = MappingProxyType(
    {
        "completed": "green",
        "running": "yellow",
        "pending": "cyan",
        "failed": "red",
        "retrying": "magenta",
        "cancelled": "bright_black",
        "budget_exceeded": "dark_orange",
        "abandoned": "bright_black",
        "waiting": "blue",
        "timed_out": "dark_orange",
        "done": "green",
    }
)
"""The rich style of each run and step status; any other status is shown in white."""


def status_text(status: str) -> str:
    """``status`` as rich markup, in its colour from :data:`STATUS_STYLES`."""
    return f"[{STATUS_STYLES.get(status, 'white')}]{status}[/]"


def cost_text(usage: UsageTotals) -> str:
    """A scope's cost for display: ``-`` when every call was unpriced, else dollars.

    When only some calls were priced, the dollars cover those and the
    shortfall is shown: ``$0.004500 (+1 unpriced)``.
    """
    if usage.cost_usd is None:
        return "-"
    # A cost too small for six decimals is still not free.
    text = "<$0.000001" if 0 < usage.cost_usd < 5e-7 else f"${usage.cost_usd:,.6f}"
    return f"{text} (+{usage.unpriced_calls} unpriced)" if usage.unpriced_calls else text


def budget_text(budget: Budget) -> str:
    """A budget's limits in words: ``$0.50, 20,000 tokens, 30 model calls`` (``none``: no limit)."""
    parts = []
    if budget.usd is not None:
        parts.append(f"${budget.usd}")
    if budget.tokens is not None:
        parts.append(f"{budget.tokens:,} tokens")
    if budget.model_calls is not None:
        parts.append(f"{budget.model_calls:,} model calls")
    return ", ".join(parts) or "none"


def _calls(n: int) -> str:
    return f"{n} unpriced call{'' if n == 1 else 's'}"


def _tokens(u: UsageTotals) -> str:
    return f"{u.input_tokens:,} in / {u.output_tokens:,} out"


def _run_title(run_id: str, state: MaterializedRunState) -> str:
    return (
        f"run [bold]{escape(run_id)}[/] · {escape(state.workflow_id or '?')}"
        f" v{escape(state.workflow_version or '?')} · {status_text(state.status)}"
    )


def fork_text(state: MaterializedRunState) -> str:
    """Where a fork comes from, in one line (plain text): its origin, fork point, what it
    re-uses and the pinned position of the copied prefix; ``""`` for a run that is no fork."""
    origin = state.forked_from
    if origin is None:
        return ""
    # The steps are in the order the log first names them: the prefix's come before the
    # fork point's.
    kept: list[str] = []
    for path, step in state.steps.items():
        if path == origin.step_path:
            break
        if step.status == "completed" and "/" not in path:
            kept.append(path)
    parts = [", ".join(kept)] if kept else []
    if origin.turn is not None and origin.turn > 1:
        turns = "turn 1" if origin.turn == 2 else f"turns 1-{origin.turn - 1}"
        parts.append(f"{origin.step_path} {turns}")
    kept_text = "; ".join(parts) or "nothing"
    session_events = sum(s.copied_events for s in origin.sessions)
    digest = f", digest {origin.origin_digest[:12]}" if origin.origin_digest else ""
    changed = " · with a new input" if origin.input_changed else ""
    return (
        f"forked from {origin.origin_run_id} at {origin.at}{changed} · re-uses {kept_text}"
        f" · copied {origin.copied_events} run events (origin version"
        f" {origin.origin_version}{digest}) and {session_events} session events"
    )


def render_report(world: World, run_id: str, console: Console) -> MaterializedRunState:
    """Print the per-step token and cost table of ``run_id`` to ``console``; return the state.

    One row per step path (status, visit, input/output/cached/reasoning
    tokens, cost or ``-`` when unpriced) and a totals row that names the
    unpriced calls, if any; a "cache write" column when the run wrote to a
    prompt cache. Folds the log with the one reducer, like replay.
    """
    state = read_run_state(world, run_id)
    # Only some providers report cache writes: the column appears when there is one.
    writes = state.usage.cache_write_tokens > 0
    table = Table(title=_run_title(run_id, state), box=box.SIMPLE_HEAD, show_footer=False)
    table.add_column("step", no_wrap=True, min_width=max((len(p) for p in state.steps), default=4))
    table.add_column("status", no_wrap=True)
    table.add_column("visit", justify="right", no_wrap=True)
    for name in ("input", "output", "cached", "reasoning", *(("cache write",) if writes else ())):
        table.add_column(name, justify="right", no_wrap=True)
    table.add_column("cost (USD)", justify="right", no_wrap=True)
    for path, step in state.steps.items():
        u = step.usage
        table.add_row(
            escape(path),
            status_text(step.status),
            str(step.visit),
            f"{u.input_tokens:,}",
            f"{u.output_tokens:,}",
            f"{u.cached_input_tokens:,}",
            f"{u.reasoning_tokens:,}",
            *((f"{u.cache_write_tokens:,}",) if writes else ()),
            cost_text(u),
        )
    total = state.usage
    table.add_section()
    table.add_row(
        "[bold]total[/]",
        _calls(total.unpriced_calls) if total.unpriced_calls else "",
        "",
        f"{total.input_tokens:,}",
        f"{total.output_tokens:,}",
        f"{total.cached_input_tokens:,}",
        f"{total.reasoning_tokens:,}",
        *((f"{total.cache_write_tokens:,}",) if writes else ()),
        cost_text(total),
        style="bold",
    )
    console.print(table)
    if state.forked_from is not None:
        console.print(escape(fork_text(state)))
    if state.budget is not None:
        console.print(f"budget (with sub-runs): {escape(budget_text(state.budget))}")
    if state.status == "cancelled":
        why = f": {escape(state.stop_reason)}" if state.stop_reason else ""
        console.print(
            f"{status_text('cancelled')}{why} · resume with `little resume {escape(run_id)}"
            " --force-cancelled`"
        )
    elif state.status == "budget_exceeded":
        at = f" in step {escape(state.stopped_step_path)}" if state.stopped_step_path else ""
        console.print(
            f"{status_text('budget_exceeded')}{at}: {escape(state.stop_reason or '')} · resume"
            " with a larger budget"
        )
    elif state.status == "timed_out":
        at = f" in step {escape(state.stopped_step_path)}" if state.stopped_step_path else ""
        console.print(f"{status_text('timed_out')}{at}: {escape(state.stop_reason or '')}")
    for wait in state.waits.values():
        # A cancelled run takes no signal: no command that would be refused.
        if wait.status == "waiting" and state.status != "cancelled":
            console.print(
                f"{status_text('waiting')} in step {escape(wait.step_path)} for signal"
                f" {escape(wait.signal)}"
                + (f" (until {_when(wait.deadline)})" if wait.deadline else "")
                + f": {escape(signal_command_text(run_id, wait))}",
                soft_wrap=True,
            )
    return state


def render_sub_runs(world: World, run_id: str, console: Console) -> tuple[SubRunSummary, ...]:
    """Print the table of ``run_id``'s sub-runs (status, steps, tokens, cost); return them.

    Prints nothing for a run without sub-runs, so ``little report`` can call it
    after :func:`render_report` for every run.
    """
    summaries = list_sub_runs(world, run_id)
    if not summaries:
        return summaries
    table = Table(title=f"sub-runs of [bold]{escape(run_id)}[/]", box=box.SIMPLE_HEAD)
    table.add_column("sub-run", overflow="fold")
    table.add_column("workflow", overflow="fold")
    table.add_column("started by", overflow="fold")
    table.add_column("status", no_wrap=True)
    table.add_column("steps", justify="right", no_wrap=True)
    table.add_column("tokens in/out", justify="right", no_wrap=True)
    table.add_column("cost (USD)", justify="right", no_wrap=True)
    for s in summaries:
        table.add_row(
            escape(s.sub_run_id),
            escape(s.workflow_id),
            escape(s.step_path + (f" call {s.call_id}" if s.call_id else "")),
            status_text(s.status),
            f"{s.steps_completed}/{s.steps}",
            f"{s.usage.input_tokens:,}/{s.usage.output_tokens:,}",
            cost_text(s.usage),
        )
    total = sum_usage([s.usage for s in summaries])
    table.add_section()
    done = sum(1 for s in summaries if s.status == "completed")
    table.add_row(
        f"[bold]{len(summaries)} sub-runs[/]",
        "",
        "",
        f"{done} completed",
        "",
        f"{total.input_tokens:,}/{total.output_tokens:,}",
        cost_text(total),
        style="bold",
    )
    console.print(table)
    return summaries


def _walk(tree: RunTree) -> Iterator[RunTree]:
    yield tree
    for child in tree.children:
        yield from _walk(child)


def render_tree(world: World, run_id: str, console: Console) -> RunTree:
    """Print ``run_id`` and its sub-runs as a tree, with each run's and the whole tree's totals.

    Each node shows its status, its own tokens and cost and, when it has
    sub-runs, its subtree's total. Returns the
    :class:`~little_es.orchestrator.RunTree`.
    """
    tree = run_tree(world, run_id)

    def label(node: RunTree) -> str:
        origin = f" [dim]({escape(node.step_path or '')}" if node.step_path else ""
        if origin:
            origin += f" call {escape(node.call_id)})[/]" if node.call_id else ")[/]"
        text = (
            f"[bold]{escape(node.run_id)}[/] · {escape(node.workflow_id or '?')} ·"
            f" {status_text(node.status)}{origin} · {_tokens(node.usage)}"
            f" · {cost_text(node.usage)}"
        )
        if node.children:
            text += (
                f" · [bold]subtree {node.runs} runs: {_tokens(node.total)} ·"
                f" {cost_text(node.total)}[/]"
            )
        return text

    def add(parent: Tree, node: RunTree) -> None:
        branch = parent.add(label(node))
        for child in node.children:
            add(branch, child)

    root = Tree(label(tree))
    for child in tree.children:
        add(root, child)
    console.print(root)
    statuses: dict[str, int] = {}
    for node in _walk(tree):
        statuses[node.status] = statuses.get(node.status, 0) + 1
    counts = ", ".join(f"{n} {status}" for status, n in sorted(statuses.items()))
    console.print(
        f"[bold]total[/]: {tree.runs} runs ({counts}) · {_tokens(tree.total)}"
        f" · {cost_text(tree.total)}"
    )
    return tree


def _short_json(value: Any, limit: int = 60) -> str:
    text = orjson.dumps(value).decode()
    return text if len(text) <= limit else text[: limit - 1] + "…"


def render_replay(result: ReplayResult, console: Console) -> None:
    """Print a :class:`~little_es.replay.ReplayResult`: its steps, what runs on resume, artifacts.

    One row per step (status, whether it runs on resume, its output shortened,
    or the artifact holding it), then the completed and pending step paths and
    the verified artifacts.
    """
    state = result.state
    console.print(f"{_run_title(result.run_id, state)} · {state.event_count} events")
    table = Table(box=box.SIMPLE_HEAD)
    table.add_column("step", no_wrap=True, min_width=max((len(p) for p in state.steps), default=4))
    table.add_column("status", no_wrap=True)
    table.add_column("runs on resume", no_wrap=True)
    table.add_column("output", overflow="fold")
    for step in result.steps:
        if step.output_ref is not None:
            output = artifact_text(step.output_ref)
        else:
            output = _short_json(step.output)
        table.add_row(
            escape(step.step_path),
            status_text(step.status),
            "yes" if step.should_run else "no",
            escape(output),
        )
    console.print(table)
    console.print(f"completed: {escape(', '.join(result.completed_step_paths) or '(none)')}")
    console.print(f"pending:   {escape(', '.join(result.pending_step_paths) or '(none)')}")
    if result.artifacts:
        console.print(f"artifacts: {len(result.artifacts)} (verified)")
        for a in result.artifacts:
            m = a.manifest
            console.print(
                f"  {m.artifact_id}  {m.size:,} bytes  {escape(m.media_type)}"
                f"  {escape(m.step_path)}"
            )


def render_events(events: Sequence[Event], console: Console) -> None:
    """Print a run's event log in order: wire name, stream (short), version, timestamp."""
    table = Table(box=box.SIMPLE_HEAD)
    table.add_column("#", justify="right", no_wrap=True)
    table.add_column("event", no_wrap=True)
    table.add_column("stream", no_wrap=True)
    table.add_column("version", justify="right", no_wrap=True)
    table.add_column("timestamp", no_wrap=True)
    for i, e in enumerate(events, start=1):
        table.add_row(
            str(i),
            type(e).wire_name,
            str(e.originator_id)[:8],
            str(e.originator_version),
            e.timestamp.isoformat(timespec="milliseconds"),
        )
    console.print(table)


def _when(t: datetime | None) -> str:
    return "" if t is None else t.strftime("%Y-%m-%d %H:%M:%S")


def _took(run: RunSummary) -> str:
    """How long the run has taken so far: from its first event to its last."""
    if run.started_at is None or run.updated_at is None:
        return ""
    seconds = max(0.0, (run.updated_at - run.started_at).total_seconds())
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def _run_row(run: RunSummary) -> tuple[str, ...]:
    u = run.usage
    return (
        escape(run.run_id)
        + (f"\n[dim]sub-run of {escape(run.parent_run_id)}[/]" if run.parent_run_id else ""),
        escape(f"{run.workflow_id or '?'} v{run.workflow_version or '?'}"),
        status_text(run.status),
        f"{run.steps_completed}/{run.steps}",
        _when(run.started_at),
        _took(run),
        f"{u.input_tokens:,}/{u.output_tokens:,}",
        cost_text(u),
    )


_RUN_COLUMNS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("run", {"no_wrap": True}),
    ("workflow", {"no_wrap": True}),
    ("status", {"no_wrap": True}),
    ("steps", {"justify": "right", "no_wrap": True}),
    ("started", {"no_wrap": True}),
    ("took", {"justify": "right", "no_wrap": True}),
    ("tokens in/out", {"justify": "right", "no_wrap": True}),
    ("cost (USD)", {"justify": "right", "no_wrap": True}),
)
_UNBOUNDED = ConsoleOptions(
    size=ConsoleDimensions(10_000, 25),
    legacy_windows=False,
    min_width=1,
    max_width=10_000,
    is_terminal=False,
    encoding="utf-8",
    max_height=25,
)
"""Options to measure a table's natural width with (a console's own are capped at its width)."""
# Given up, in this order, when the table is wider than the terminal.
_RUN_COLUMNS_TO_DROP = ("started", "tokens in/out", "took", "workflow")


def render_runs(runs: Sequence[RunSummary], world_name: str, console: Console) -> None:
    """Print the runs of the world ``world_name`` (status, steps, times, tokens, cost).

    Prints one line saying so when there are none. A run id is never wrapped or cut,
    so it can be copied into the next command: on a narrow terminal whole columns
    are left out instead (started, tokens, took, workflow, in that order), and
    the rest is printed wider than the terminal if even that does not fit.
    """
    if not runs:
        console.print(f"no runs in world {escape(world_name)}")
        return
    rows = [_run_row(run) for run in runs]
    shown = [name for name, _ in _RUN_COLUMNS]
    table = _runs_table(world_name, rows, shown)
    for name in _RUN_COLUMNS_TO_DROP:
        if _natural_width(console, table) <= console.width:
            break
        shown.remove(name)
        table = _runs_table(world_name, rows, shown)
    # Still too wide: printed wider than the terminal rather than cutting a run id.
    width = _natural_width(console, table)
    if width <= console.width:
        console.print(table)
    else:
        lines = console.render(table, console.options.update_width(width))
        console.print(Segments(lines), crop=False, soft_wrap=True)


def _natural_width(console: Console, table: Table) -> int:
    return Measurement.get(console, _UNBOUNDED, table).maximum


def _runs_table(world_name: str, rows: list[tuple[str, ...]], shown: list[str]) -> Table:
    table = Table(title=f"runs in {escape(world_name)}", box=box.SIMPLE_HEAD)
    keep = [i for i, (name, _) in enumerate(_RUN_COLUMNS) if name in shown]
    for i in keep:
        name, options = _RUN_COLUMNS[i]
        table.add_column(name, **options)
    for row in rows:
        table.add_row(*(row[i] for i in keep))
    return table


def render_verify(report: VerifyReport, console: Console) -> None:
    """Print each stream and artifact checked, what does not hold, and a last line that sums up."""
    table = Table(title=f"verify {escape(report.world)}", box=box.SIMPLE_HEAD)
    table.add_column("", no_wrap=True)
    table.add_column("kind", no_wrap=True)
    table.add_column("name", overflow="fold")
    table.add_column("rows", justify="right", no_wrap=True)
    table.add_column("problem", overflow="fold")
    for stream in report.streams:
        unread = stream.problem is None and bool(stream.undecoded)
        table.add_row(
            "[yellow]UNREAD[/]" if unread else _held(stream.problem),
            stream.kind,
            escape(stream.name),
            str(stream.events),
            escape(
                stream.problem
                or (
                    "chain holds; not decoded, no class imported for: "
                    + ", ".join(stream.undecoded)
                    if unread
                    else ""
                )
            ),
        )
    for artifact in report.artifacts:
        table.add_row(
            _held(artifact.problem),
            "artifact",
            escape(f"{artifact.artifact_id[:19]}… of {artifact.run_id}/{artifact.step_path}"),
            f"{artifact.size} B",
            escape(artifact.problem or ""),
        )
    console.print(table)
    streams, artifacts = len(report.streams), len(report.artifacts)
    checked = f"{_count(streams, 'stream')}, {_count(artifacts, 'artifact')}"
    if report.ok:
        console.print(f"[green]ok[/]: {checked}, every chain and artifact holds")
    elif report.problems:
        console.print(f"[red]BROKEN[/]: {report.problems} of {checked} do not hold")
    else:
        console.print(
            f"[yellow]UNREAD[/]: {report.undecoded} of {checked} hold events of a class"
            " not imported here; their chains hold, their payloads were not checked:"
            " import the modules that define them (little --import MODULE verify ...)"
        )


@contextmanager
def progress_bar(console: Console) -> Iterator[TransferProgress]:
    """A progress bar on ``console`` while the block runs, fed by what it is told
    (a :data:`~little_es.transfer.TransferProgress`); drawn only on a terminal."""
    bar = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        console=console,
        transient=True,
        disable=not console.is_terminal,
    )
    tasks: dict[str, TaskID] = {}

    def tell(what: str, done: int, total: int) -> None:
        task = tasks.get(what)
        if task is None:
            task = tasks[what] = bar.add_task(what, total=total)
        bar.update(task, completed=done, total=total)

    with bar:
        yield tell


def render_transfer(verb: str, counts: TransferCounts, world: str, console: Console) -> None:
    """One line: what ``little export`` wrote or ``little import`` appended, and where."""
    console.print(
        f"{verb} {_count(counts.streams, 'stream')}, {_count(counts.events, 'event')},"
        f" {_count(counts.snapshots, 'snapshot')}, {_count(counts.artifacts, 'artifact')}"
        f" {'from' if verb == 'exported' else 'into'} {escape(world)}",
        soft_wrap=True,
    )


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _held(problem: str | None) -> str:
    return "[green]ok[/]" if problem is None else "[red]BROKEN[/]"


def render_prices(prices: Sequence[ModelPriceSet], world_name: str, console: Console) -> None:
    """Print the prices recorded in the world ``world_name``, in the order they were recorded.

    Prints one line saying so when there are none. ``=`` in the cached, cache
    write or reasoning column: those tokens cost the same as the other input or
    output tokens. The cache write column appears when a price sets one.
    """
    if not prices:
        console.print(f"no prices recorded in world {escape(world_name)}")
        return
    table = Table(
        title=f"prices in {escape(world_name)} (USD per million tokens)", box=box.SIMPLE_HEAD
    )
    table.add_column("provider", overflow="fold")
    table.add_column("model", overflow="fold")
    table.add_column("input", justify="right", no_wrap=True)
    table.add_column("cached input", justify="right", no_wrap=True)
    writes = any(p.cache_write_per_mtok is not None for p in prices)
    if writes:
        table.add_column("cache write", justify="right", no_wrap=True)
    table.add_column("output", justify="right", no_wrap=True)
    table.add_column("reasoning", justify="right", no_wrap=True)
    table.add_column("effective from", no_wrap=True)
    for p in prices:
        table.add_row(
            escape(p.provider),
            escape(p.model_id),
            f"{p.input_per_mtok:f}",
            "=" if p.cached_input_per_mtok is None else f"{p.cached_input_per_mtok:f}",
            *(
                ("=" if p.cache_write_per_mtok is None else f"{p.cache_write_per_mtok:f}",)
                if writes
                else ()
            ),
            f"{p.output_per_mtok:f}",
            "=" if p.reasoning_per_mtok is None else f"{p.reasoning_per_mtok:f}",
            p.effective_from.isoformat(timespec="seconds"),
        )
    console.print(table)


def _change_text(change: JsonChange) -> str:
    if change.kind == "added":
        return f"{change.path}: (none) → {_short_json(change.b, 50)}"
    if change.kind == "removed":
        return f"{change.path}: {_short_json(change.a, 50)} → (none)"
    return f"{change.path}: {_short_json(change.a, 50)} → {_short_json(change.b, 50)}"


def artifact_text(ref: ArtifactRef) -> str:
    """How a value stored as an artifact (too large to inline) is shown in its place."""
    return f"artifact {ref.artifact_id[:19]}… ({ref.size:,} bytes)"


def _both(a: str, b: str) -> str:
    return a if a == b else f"{a} → [bold]{b}[/]"


def _tools_text(calls: Sequence[ToolCallSummary]) -> str:
    if not calls:
        return "-"
    names: dict[str, int] = {}
    for call in calls:
        names[call.name] = names.get(call.name, 0) + 1
    return ", ".join(f"{n} {name}" if n > 1 else name for name, n in names.items())


def _step_status(status: str | None) -> str:
    return "(none)" if status is None else status


def _diff_row(step: StepDiff) -> tuple[str, ...]:
    a, b = step.usage_a, step.usage_b
    if step.status_a is None or step.status_b is None:
        output = "-"
    elif step.output_changes:
        n = len(step.output_changes)
        output = f"[bold]{n} change{'' if n == 1 else 's'}[/]"
    else:
        output = "same"
    tools = (
        _tools_text(step.tool_calls_a)
        if step.tool_calls_a == step.tool_calls_b
        else f"{_tools_text(step.tool_calls_a)} → [bold]{_tools_text(step.tool_calls_b)}[/]"
    )
    return (
        ("  " if step.same else "[yellow]≠[/] ") + escape(step.step_path),
        _both(_step_status(step.status_a), _step_status(step.status_b)),
        output,
        _both(str(a.calls), str(b.calls)),
        _both(f"{a.input_tokens:,}/{a.output_tokens:,}", f"{b.input_tokens:,}/{b.output_tokens:,}"),
        _both(cost_text(a), cost_text(b)),
        tools,
    )


def render_diff(diff: RunDiff, console: Console) -> RunDiff:
    """Print two runs side by side: per step, status, output, model calls, tokens, cost and
    tool calls (``A → B`` where they differ, ``≠`` on a step that differs), then each
    differing output value by its JSON path. Returns ``diff``."""
    title = (
        f"diff [bold]{escape(diff.run_a)}[/] → [bold]{escape(diff.run_b)}[/] ·"
        f" {_both(escape(diff.workflow_a or '?'), escape(diff.workflow_b or '?'))} ·"
        f" {_both(status_text(diff.status_a), status_text(diff.status_b))}"
    )
    table = Table(title=title, box=box.SIMPLE_HEAD)
    table.add_column("step", no_wrap=True)
    table.add_column("status", no_wrap=True)
    table.add_column("output", no_wrap=True)
    table.add_column("model calls", justify="right", no_wrap=True)
    table.add_column("tokens in/out", justify="right", no_wrap=True)
    table.add_column("cost (USD)", justify="right", no_wrap=True)
    table.add_column("tool calls", overflow="fold")
    for step in diff.steps:
        table.add_row(*_diff_row(step))
    table.add_section()
    total = StepDiff(
        step_path="total",
        status_a=diff.status_a,
        status_b=diff.status_b,
        output_changes=diff.output_changes,
        usage_a=diff.usage_a,
        usage_b=diff.usage_b,
        tool_calls_a=tuple(c for s in diff.steps for c in s.tool_calls_a),
        tool_calls_b=tuple(c for s in diff.steps for c in s.tool_calls_b),
    )
    table.add_row(*_diff_row(total), style="bold")
    console.print(table)
    changed = [(s.step_path, s.output_changes) for s in diff.steps if s.output_changes]
    if diff.output_changes:
        changed.append(("the run", diff.output_changes))
    for path, changes in changed:
        console.print(f"[bold]{escape(path)}[/] output:")
        for change in changes:
            console.print(f"  {escape(_change_text(change))}")
    differing = sum(1 for s in diff.steps if not s.same)
    console.print(
        "same: every step has the same status, output, model calls and tool calls"
        if diff.same
        else f"{differing} of {len(diff.steps)} steps differ"
    )
    return diff


class StepBoard:
    """A live table of step paths and their status, fed with the events a run commits.

    Pass :meth:`observe` as ``run_workflow``'s ``observer`` and show
    :meth:`render` in a :class:`rich.live.Live`, as ``little run`` does.
    """

    def __init__(self) -> None:
        self.rows: dict[str, tuple[str, str]] = {}
        """Each step path's status and a note (the attempt, or the error)."""

    def observe(self, event: Event) -> None:
        """Update the row of the step ``event`` is about (other events are ignored)."""
        if isinstance(event, StepStarted):
            self.rows[event.step_path] = ("running", f"attempt {event.attempt}")
        elif isinstance(event, StepCompleted):
            self.rows[event.step_path] = ("completed", "")
        elif isinstance(event, StepFailed):
            status = "retrying" if event.will_retry else "failed"
            self.rows[event.step_path] = (status, event.error.message[:60])
        elif isinstance(event, BudgetExceeded) and event.step_path is not None:
            self.rows[event.step_path] = ("budget_exceeded", event.spent[:60])
        elif isinstance(event, RunCancelled):
            for path, (status, _) in self.rows.items():
                if status == "running":
                    self.rows[path] = ("cancelled", (event.reason or "")[:60])
        elif isinstance(event, RunWaiting):
            self.rows[event.step_path] = ("waiting", f"for signal {event.signal}"[:60])
        elif isinstance(event, WaitTimedOut):
            self.rows[event.step_path] = ("timed_out", f"signal {event.signal}"[:60])

    def recorded(self, events: Sequence[Event]) -> None:
        """Show what a run's log already holds, before this process drives it on: the
        steps it committed are marked ``recorded`` (they will not run again)."""
        for event in events:
            self.observe(event)
        for path, (status, note) in self.rows.items():
            self.rows[path] = (status, "recorded" if status == "completed" else note)

    def render(self) -> Table:
        """The table as it stands: one row per step seen so far."""
        table = Table(show_header=True, header_style="bold")
        table.add_column("step")
        table.add_column("status")
        table.add_column("note")
        for path, (status, note) in self.rows.items():
            # A branch's path holds its key in brackets, which rich would take for markup.
            table.add_row(escape(path), status_text(status), escape(note))
        return table


def decision_text(cycle: LoopCycle) -> str:
    """A cycle's planner decision in words (plain text, not markup): the reason it gave,
    ``done: ...``, ``(planning)`` before it answered, or ``abandoned: `` and what drifted."""
    if cycle.abandoned is not None:
        return "abandoned: " + "; ".join(cycle.abandoned.changes)
    if cycle.planned is None:
        return "(planning)"
    if cycle.planned.done:
        return f"done: {cycle.planned.reason}" if cycle.planned.reason else "done"
    return cycle.planned.reason or "run"


def _loop_status(loop: OuterLoop) -> str:
    if loop.completed is None:
        return status_text("running")
    return status_text("completed") + f" [dim]({escape(loop.completed.reason)})[/]"


def render_loops(world: World, console: Console) -> tuple[OuterLoop, ...]:
    """Print the outer loops of ``world``: id, workflow, cycles, status, cost (``little loops``)."""
    loops = list_outer_loops(world)
    if not loops:
        console.print(f"no outer loops in world {escape(world.name)}")
        return loops
    table = Table(title=f"outer loops in {escape(world.name)}", box=box.SIMPLE_HEAD)
    table.add_column("outer loop", overflow="fold")
    table.add_column("workflow", overflow="fold")
    table.add_column("cycles", justify="right", no_wrap=True)
    table.add_column("status", no_wrap=True)
    table.add_column("started", no_wrap=True)
    table.add_column("cost (USD)", justify="right", no_wrap=True)
    for loop in loops:
        started = loop.started
        assert started is not None
        table.add_row(
            escape(started.outer_loop_id),
            escape(started.workflow_id),
            f"{loop.cycles_ended}/{started.max_cycles}",
            _loop_status(loop),
            _when(loop.created_on),
            cost_text(loop_totals(world, loop)),
        )
    console.print(table)
    return loops


def render_loop_report(
    world: World, outer_loop_id: str, console: Console, *, tree: bool = False
) -> OuterLoop:
    """Print an outer loop's cycles: runs, status, planner decision, cost (``report --loop``).

    ``tree`` adds each cycle's run tree with totals. Costs are priced from the
    runs' logs; an abandoned cycle's runs are shown and counted too.
    """
    loop = load_outer_loop(world, outer_loop_id)
    started = loop.started
    assert started is not None
    limits = f"max {started.max_cycles} cycles"
    if started.budget_usd is not None:
        limits += f", budget ${started.budget_usd}"
    console.print(
        f"outer loop [bold]{escape(started.outer_loop_id)}[/] · {escape(started.workflow_id)}"
        f" · {_loop_status(loop)} · {limits}"
    )
    table = Table(box=box.SIMPLE_HEAD)
    table.add_column("cycle", justify="right", no_wrap=True)
    table.add_column("run", overflow="fold")
    table.add_column("status", no_wrap=True)
    table.add_column("planner decision", overflow="fold")
    table.add_column("planner", justify="right", no_wrap=True)
    table.add_column("run cost", justify="right", no_wrap=True)
    for number in sorted(loop.cycles):
        cycle = loop.cycles[number]
        cost = cycle_cost(world, cycle)
        table.add_row(
            str(number),
            escape(cycle.started.run_id),
            status_text(cycle.status),
            escape(decision_text(cycle)),
            cost_text(cost.planner),
            cost_text(cost.run),
        )
    console.print(table)
    totals = loop_totals(world, loop)
    line = f"total: {_tokens(totals)} tokens · {cost_text(totals)}"
    if totals.unpriced_calls:
        line += f" · {_calls(totals.unpriced_calls)} not in the dollars"
    console.print(line)
    if loop.pending_cycle_run_id is not None:
        console.print(f"pending cycle run: {escape(loop.pending_cycle_run_id)}")
    if tree:
        for number in sorted(loop.cycles):
            run_id = loop.cycles[number].started.run_id
            if world.run_exists(run_id):
                render_tree(world, run_id, console)
    return loop


def signal_command_text(run_id: str, wait: WaitState) -> str:
    """The ``little signal`` command that answers ``wait`` (its data left to fill in)."""
    digest = (
        f" --digest {wait.action_digest[:16]}"
        if wait.kind == "approval" and wait.action_digest
        else ""
    )
    example = {
        "approval": """'{"approved": true}'""",
        "ask_human": """'{"answer": "..."}'"""
        if wait.model_ref.endswith(":HumanAnswer")
        else "JSON",
    }.get(wait.kind, "JSON")
    return f"little signal {run_id} {wait.signal} --data {example}{digest}"


def _asked(wait: WaitState) -> str:
    if wait.question:
        return wait.question
    if isinstance(wait.action, Mapping):
        args = orjson.dumps(wait.action.get("args"), option=orjson.OPT_SORT_KEYS).decode()
        return f"{wait.action.get('tool')}({args})"
    return ""


def render_waits(waits: Sequence[tuple[str, WaitState]], world_name: str, console: Console) -> None:
    """Print the open waits of the world's runs (``little runs --waiting``): what each run
    waits for, since when, until when, and the command that sends the signal."""
    if not waits:
        console.print(f"no run waits in world {escape(world_name)}")
        return
    table = Table(title=f"waiting runs in {escape(world_name)}", box=box.SIMPLE_HEAD)
    table.add_column("run", no_wrap=True)
    table.add_column("step", no_wrap=True)
    table.add_column("signal", no_wrap=True)
    table.add_column("kind", no_wrap=True)
    table.add_column("asks", overflow="fold", ratio=1)
    table.add_column("since", no_wrap=True)
    table.add_column("deadline", no_wrap=True)
    for run_id, wait in waits:
        table.add_row(
            escape(run_id),
            escape(wait.step_path),
            escape(wait.signal),
            wait.kind,
            escape(_asked(wait)),
            _when(wait.since),
            _when(wait.deadline) or "-",
        )
    console.print(table)
    for run_id, wait in waits:
        model = wait.model_ref.rpartition(":")[2]
        digest = f", action digest {wait.action_digest}" if wait.action_digest else ""
        console.print(
            f"{escape(run_id)} {escape(wait.step_path)}: data {escape(model)}{digest}",
            soft_wrap=True,
            highlight=False,
        )
        console.print(f"  {escape(signal_command_text(run_id, wait))}", soft_wrap=True)

"""The HTML of ``little ui``: server-rendered pages with a little CSS and JS, no build step.

Every value from the log is user data (run ids, step outputs, what a model was
sent, tool arguments and results) and goes through :func:`esc` before it is
written into a page; nothing from a run is ever put in a script. Figures are
written the way the CLI writes them (:func:`~little_es.render.cost_text`,
:func:`~little_es.render.budget_text`), and statuses take their colour from
:data:`~little_es.render.STATUS_STYLES`.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any
from urllib.parse import quote

import orjson

from little_es.backends.base import RunSummary
from little_es.domain import OuterLoop
from little_es.orchestrator import RunTree
from little_es.render import (
    STATUS_STYLES,
    artifact_text,
    budget_text,
    cost_text,
    decision_text,
    signal_command_text,
)
from little_es.ui.pages import RUN_FILTERS, LoopPage, LoopRow, ModelCall, RunPage, ToolCallView
from little_es.values import ArtifactRef, UsageTotals

__all__ = [
    "NavLink",
    "document",
    "duration_text",
    "error_body",
    "esc",
    "loop_body",
    "loops_body",
    "run_body",
    "run_document_body",
    "runs_body",
]

NavLink = tuple[str, str]
"""``(href, title)`` of an entry of the page's navigation bar."""

# The rich colour names of STATUS_STYLES, as CSS colours readable on white.
_CSS_COLOURS = {
    "green": "#1a7f37",
    "yellow": "#9a6700",
    "cyan": "#0969da",
    "red": "#cf222e",
    "magenta": "#8250df",
    "bright_black": "#6e7781",
    "dark_orange": "#bc4c00",
    "blue": "#0550ae",
    "white": "#57606a",
}

_CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:0;color:#1f2328;background:#fff}
header{background:#24292f;color:#fff;padding:8px 16px;display:flex;gap:16px;align-items:center}
header a{color:#fff;text-decoration:none}header .world{color:#8c959f;margin-left:auto}
main{padding:12px 16px;max-width:1400px}
table{border-collapse:collapse;width:100%;margin:8px 0 16px}
th,td{text-align:left;padding:4px 8px;border-bottom:1px solid #d0d7de;vertical-align:top}
th{background:#f6f8fa;font-weight:600}td.n,th.n{text-align:right;white-space:nowrap}
.badge{display:inline-block;padding:0 6px;border-radius:10px;color:#fff;font-size:12px}
.filters a{margin-right:10px}.filters a.on{font-weight:700}
.muted{color:#6e7781}.branch{padding-left:24px}
.bar{position:relative;height:14px;min-width:200px;background:#f6f8fa}
.bar span{position:absolute;top:2px;height:10px;border-radius:2px}
pre{background:#f6f8fa;padding:6px;margin:4px 0;white-space:pre-wrap;word-break:break-word;
max-height:400px;overflow:auto}
details summary{cursor:pointer}.facts span{margin-right:18px}
h2{font-size:17px;margin:18px 0 6px}h3{font-size:15px;margin:12px 0 4px}
ul.tree{list-style:none;padding-left:18px}
"""

# The live view: poll the run's status (a small JSON endpoint read through the runs
# projection) and, when its event count changes, swap in the freshly rendered page body.
# Open <details> stay open across the swap.
_LIVE_JS = """
(function(){
  const root=document.getElementById('run');if(!root)return;
  const id=root.dataset.runId;let count=root.dataset.eventCount;
  const enc=encodeURIComponent(id);
  async function tick(){
    try{
      const r=await fetch('/api/runs/'+enc);
      if(r.ok){
        const s=await r.json();
        if(String(s.event_count)!==count){
          const open=[...root.querySelectorAll('details[open]')].map(d=>d.id);
          const p=await fetch('/runs/'+enc+'?part=body');
          if(p.ok){
            root.innerHTML=await p.text();count=String(s.event_count);
            root.dataset.eventCount=count;root.dataset.status=s.status;
            for(const o of open){const d=document.getElementById(o);if(d)d.open=true;}
          }
        }
        if(s.status==='completed'){return;}
      }
    }catch(e){}
    setTimeout(tick,1000);
  }
  setTimeout(tick,1000);
})();
"""


def esc(value: object) -> str:
    """``value`` as text safe inside HTML (element content or a quoted attribute)."""
    return html.escape(str(value), quote=True)


def _json(value: Any) -> str:
    text = orjson.dumps(value, option=orjson.OPT_INDENT_2, default=str).decode()
    return f"<pre>{esc(text)}</pre>"


def _value(value: Any, ref: ArtifactRef | None) -> str:
    """A run's input or output: the JSON, or the artifact that holds it when too large."""
    return f"<p>{esc(artifact_text(ref))}</p>" if ref is not None else _json(value)


def _short(value: Any, limit: int = 80) -> str:
    text = orjson.dumps(value, default=str).decode()
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _badge(status: str) -> str:
    colour = _CSS_COLOURS.get(STATUS_STYLES.get(status, "white"), _CSS_COLOURS["white"])
    return (
        f'<span class="badge status-{esc(status)}" style="background:{colour}">{esc(status)}</span>'
    )


def _when(t: datetime | None) -> str:
    return "" if t is None else esc(t.strftime("%Y-%m-%d %H:%M:%S"))


def duration_text(start: datetime | None, end: datetime | None) -> str:
    """``end - start`` for people: ``12 ms``, ``3.40 s``, ``2 min 05 s``; empty if unknown."""
    if start is None or end is None:
        return ""
    seconds = (end - start).total_seconds()
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.2f} s"
    minutes, rest = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {rest:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def _tokens(u: UsageTotals) -> str:
    return f"{u.input_tokens:,} / {u.output_tokens:,}"


def _run_href(run_id: str) -> str:
    return "/runs/" + quote(run_id, safe="")


def _loop_href(outer_loop_id: str) -> str:
    return "/loops/" + quote(outer_loop_id, safe="")


def _run_link(run_id: str, exists: bool) -> str:
    """A link to a run's page, or the id alone (greyed) when the run has no log yet."""
    if not exists:
        return f'<span class="muted">{esc(run_id)}</span>'
    return f'<a href="{esc(_run_href(run_id))}">{esc(run_id)}</a>'


def document(
    title: str, body: str, *, world: str, nav: Sequence[NavLink], live: bool = False
) -> str:
    """A whole page: the navigation bar (``nav``), ``body`` (HTML already escaped), and the
    live view's script when ``live``."""
    links = "".join(f'<a href="{esc(href)}">{esc(name)}</a>' for href, name in nav)
    script = f"<script>{_LIVE_JS}</script>" if live else ""
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        f"<title>{esc(title)} · little ui</title><style>{_CSS}</style></head><body>"
        f'<header><strong>little ui</strong>{links}<span class="world">{esc(world)}</span>'
        f"</header><main>{body}</main>{script}</body></html>"
    )


def error_body(message: str) -> str:
    """The body of a page that could not be shown (no such run, a bad filter)."""
    return f'<h1>Not found</h1><p class="error">{esc(message)}</p><p><a href="/">all runs</a></p>'


def runs_body(runs: Sequence[RunSummary], active: str | None) -> str:
    """The runs list: one row per run, newest first, with the filter links above it."""
    links = [("", "all")] + [(name, name) for name in RUN_FILTERS]
    filters = " ".join(
        f'<a class="{"on" if (name or None) == active else ""}"'
        f' href="/{"?status=" + esc(name) if name else ""}">{esc(title)}</a>'
        for name, title in links
    )
    rows = []
    for run in runs:
        parent = (
            f' <span class="muted">sub-run of <a href="{esc(_run_href(run.parent_run_id))}">'
            f"{esc(run.parent_run_id)}</a></span>"
            if run.parent_run_id
            else ""
        )
        end = run.completed_at or run.updated_at
        rows.append(
            f'<tr class="run" data-run-id="{esc(run.run_id)}">'
            f'<td><a href="{esc(_run_href(run.run_id))}">{esc(run.run_id)}</a>{parent}</td>'
            f"<td>{esc(run.workflow_id or '?')} v{esc(run.workflow_version or '?')}</td>"
            f"<td>{_badge(run.status)}</td>"
            f'<td class="n">{run.steps_completed}/{run.steps}</td>'
            f"<td>{_when(run.started_at)}</td>"
            f'<td class="n">{esc(duration_text(run.started_at, end))}</td>'
            f'<td class="n">{esc(_tokens(run.usage))}</td>'
            f'<td class="n">{esc(cost_text(run.usage))}</td></tr>'
        )
    table = (
        "<table id=runs><thead><tr><th>run</th><th>workflow</th><th>status</th>"
        '<th class="n">steps</th><th>started</th><th class="n">duration</th>'
        '<th class="n">tokens in / out</th><th class="n">cost (USD)</th></tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table>"
        if rows
        else '<p class="muted">no runs</p>'
    )
    return f'<h1>Runs</h1><p class="filters">{filters}</p>{table}'


def _timeline(page: RunPage) -> str:
    attempts = page.attempts
    state = page.state
    if not attempts:
        return '<p class="muted">no step has started</p>'
    t0 = state.started_at or attempts[0].started_at
    ends = [a.ended_at or a.started_at for a in attempts]
    t1 = max([*ends, state.updated_at or t0])
    span = max((t1 - t0).total_seconds(), 1e-6)
    last_attempt = {a.step_path: i for i, a in enumerate(attempts)}
    groups = state.parallel_groups
    sub_runs: dict[str, list[str]] = {}
    for child in page.tree.children:
        if child.step_path is not None:
            sub_runs.setdefault(child.step_path, []).append(child.run_id)
    rows = []
    for i, a in enumerate(attempts):
        end = a.ended_at or state.updated_at or a.started_at
        left = (a.started_at - t0).total_seconds() / span * 100
        width = max((end - a.started_at).total_seconds() / span * 100, 0.4)
        status = {"retrying": "retrying", "running": "running"}.get(a.outcome, a.outcome)
        colour = _CSS_COLOURS[STATUS_STYLES.get(status, "white")]
        step = state.steps.get(a.step_path)
        usage = step.usage if step is not None and last_attempt[a.step_path] == i else None
        branch = " branch" if "[" in a.step_path else ""
        extra = ""
        if a.step_path in groups:
            keys = ", ".join(groups[a.step_path])
            extra += f' <span class="muted">parallel: {esc(keys)}</span>'
        for sub_run_id in sub_runs.get(a.step_path, ()) if last_attempt[a.step_path] == i else ():
            extra += (
                f' <span class="muted">sub-run</span> <a class="sub-run"'
                f' href="{esc(_run_href(sub_run_id))}">{esc(sub_run_id)}</a>'
            )
        if a.error is not None:
            extra += (
                f'<details id="err-{i}"><summary>{esc(a.error.type)}</summary>'
                f"<pre>{esc(a.error.message)}</pre></details>"
            )
        if a.output_ref is not None:
            extra += f' <span class="muted">output: {esc(artifact_text(a.output_ref))}</span>'
        elif a.outcome == "completed" and a.output is not None:
            extra += (
                f'<details id="out-{i}"><summary>output <span class="muted">'
                f"{esc(_short(a.output, 60))}</span></summary>{_json(a.output)}</details>"
            )
        rows.append(
            f'<tr class="attempt" data-step="{esc(a.step_path)}" data-outcome="{esc(a.outcome)}">'
            f'<td class="{branch.strip()}">{esc(a.step_path)}{extra}</td>'
            f"<td>{esc(a.kind)}</td><td class=n>{a.visit}</td><td class=n>{a.attempt}</td>"
            f"<td>{_badge(status)}</td>"
            f'<td class="n">+{esc(duration_text(t0, a.started_at) or "0 ms")}</td>'
            f'<td class="n">{esc(duration_text(a.started_at, a.ended_at))}</td>'
            f'<td class="n">{esc(_tokens(usage)) if usage and usage.calls else ""}</td>'
            f'<td class="n">{esc(cost_text(usage)) if usage and usage.calls else ""}</td>'
            f'<td><div class="bar"><span style="left:{left:.2f}%;width:{width:.2f}%;'
            f'background:{colour}"></span></div></td></tr>'
        )
    return (
        "<table id=timeline><thead><tr><th>step</th><th>kind</th><th class=n>visit</th>"
        "<th class=n>attempt</th><th>outcome</th><th class=n>started</th>"
        '<th class="n">took</th><th class="n">tokens in / out</th><th class="n">cost</th>'
        f"<th>timeline</th></tr></thead><tbody>{''.join(rows)}</tbody></table>"
    )


def _tool_call(t: ToolCallView, anchor: str) -> str:
    if t.error is not None:
        outcome = f"<p>error {esc(t.error.type)}</p><pre>{esc(t.error.message)}</pre>"
    elif t.ended_at is None:
        outcome = '<p class="muted">no result recorded (running, or stopped here)</p>'
    else:
        outcome = f"<p>result</p>{_json(t.result)}"
    took = duration_text(t.started_at, t.ended_at)
    return (
        f'<details class="tool-call" id="{esc(anchor)}"><summary>tool <b>{esc(t.name)}</b>'
        f'({esc(_short(t.args, 60))}) <span class="muted">{esc(took)}</span></summary>'
        f"<p>arguments</p>{_json(t.args)}{outcome}</details>"
    )


def _turn(call: ModelCall, anchor: str) -> str:
    r = call.response
    model = f"{r.provider}/{r.model}" if r is not None else "(no answer recorded)"
    again = f' <span class="muted">called {call.calls} times</span>' if call.calls > 1 else ""
    answer = ""
    if r is not None and r.content is not None:
        answer = f"<p>answer</p><pre>{esc(r.content)}</pre>"
    if r is not None and r.tool_calls:
        asked = [c.model_dump(mode="json", exclude_none=True) for c in r.tool_calls]
        answer += f"<p>tool calls asked for</p>{_json(asked)}"
    messages = [m.model_dump(mode="json", exclude_defaults=True) for m in call.messages]
    tools = "".join(_tool_call(t, f"{anchor}-t{j}") for j, t in enumerate(call.tool_calls))
    u = call.usage
    return (
        f'<tr class="turn"><td class=n>{call.turn}</td><td>{esc(model)}{again}</td>'
        f'<td class="n">{esc(duration_text(call.called_at, call.responded_at))}</td>'
        f'<td class="n">{esc(_tokens(u))}</td>'
        f'<td class="n">{u.cached_input_tokens:,} / {u.cache_write_tokens:,}</td>'
        f'<td class="n">{esc(cost_text(u)) if u.calls else ""}</td><td>'
        f'<details class="model-call" id="{esc(anchor)}"><summary>model call: '
        f"{len(call.messages)} new messages sent</summary>{_json(messages)}{answer}</details>"
        f"{tools}</td></tr>"
    )


def _sessions(page: RunPage) -> str:
    parts = []
    for n, s in enumerate(page.sessions.values()):
        turns = "".join(_turn(c, f"s{n}-turn{c.turn}") for c in s.turns)
        parts.append(
            f'<section class="session" data-step="{esc(s.step_path)}">'
            f"<h3>agent {esc(s.step_path)} · attempt {s.attempt}"
            f' <span class="muted">session {esc(str(s.session_id)[:8])}</span></h3>'
            "<table><thead><tr><th class=n>turn</th><th>model</th><th class=n>took</th>"
            '<th class="n">tokens in / out</th><th class="n">cache read / written</th>'
            '<th class="n">cost</th>'
            f"<th>calls</th></tr></thead><tbody>{turns}</tbody></table></section>"
        )
    return "".join(parts)


def _tree(tree: RunTree) -> str:
    def node(t: RunTree) -> str:
        origin = f' <span class="muted">({esc(t.step_path)})</span>' if t.step_path else ""
        sub = (
            f" · <b>subtree {t.runs} runs: {esc(_tokens(t.total))} · {esc(cost_text(t.total))}</b>"
            if t.children
            else ""
        )
        kids = "".join(node(c) for c in t.children)
        return (
            f'<li><a href="{esc(_run_href(t.run_id))}">{esc(t.run_id)}</a>'
            f" · {esc(t.workflow_id or '?')} · {_badge(t.status)}{origin}"
            f" · {esc(_tokens(t.usage))} · {esc(cost_text(t.usage))}{sub}"
            f"{'<ul class=tree>' + kids + '</ul>' if kids else ''}</li>"
        )

    return f'<ul class="tree" id="sub-runs">{node(tree)}</ul>'


def _facts(items: Iterable[tuple[str, str]]) -> str:
    return (
        '<p class="facts">'
        + "".join(f'<span>{esc(k)}: <b class="fact">{v}</b></span>' for k, v in items)
        + "</p>"
    )


def run_body(page: RunPage) -> str:
    """The inside of a run page's ``#run`` element: what the live view swaps in."""
    s = page.state
    end = s.completed_at or s.updated_at
    facts = [
        ("status", _badge(s.status)),
        ("workflow", esc(f"{s.workflow_id or '?'} v{s.workflow_version or '?'}")),
        ("started", _when(s.started_at)),
        ("duration", esc(duration_text(s.started_at, end))),
        ("events", f"{s.event_count:,}"),
        ("tokens in / out", esc(_tokens(s.usage))),
        ("cost", esc(cost_text(s.usage))),
    ]
    if page.tree.children:
        facts.append(
            ("with sub-runs", esc(f"{_tokens(page.tree_total)} · {cost_text(page.tree_total)}"))
        )
    if s.budget is not None:
        facts.append(("budget", esc(budget_text(s.budget))))
    if s.parent_run_id:
        facts.append(
            (
                "sub-run of",
                f'<a href="{esc(_run_href(s.parent_run_id))}">{esc(s.parent_run_id)}</a>',
            )
        )
    if s.forked_from is not None:
        origin = s.forked_from
        facts.append(
            (
                "forked from",
                f'<a href="{esc(_run_href(origin.origin_run_id))}">{esc(origin.origin_run_id)}'
                f"</a> at {esc(origin.at)}",
            )
        )
    notes = ""
    if s.error is not None:
        at = f" in step {esc(s.failed_step_path)}" if s.failed_step_path else ""
        notes += f'<p class="error">failed{at}: {esc(s.error.type)}: {esc(s.error.message)}</p>'
    if s.stop_reason:
        notes += f"<p>stopped: {esc(s.stop_reason)}</p>"
    for wait in s.waits.values():
        # A cancelled run takes no signal: no command that would be refused.
        if wait.status == "waiting" and s.status != "cancelled":
            until = f" until {esc(wait.deadline.isoformat())}" if wait.deadline else ""
            asks = f": {esc(wait.question)}" if wait.question else ""
            notes += (
                f'<p class="waiting">waiting in step {esc(wait.step_path)} for signal'
                f" {esc(wait.signal)}{until}{asks} · <code>"
                f"{esc(signal_command_text(page.run_id, wait))}</code></p>"
            )
    io = f'<details id="run-input"><summary>input</summary>{_value(s.input, s.input_ref)}</details>'
    if s.status == "completed":
        io += (
            f'<details id="run-output"><summary>output</summary>'
            f"{_value(s.output, s.output_ref)}</details>"
        )
    sessions = _sessions(page)
    return (
        f"<h1>run {esc(page.run_id)}</h1>{_facts(facts)}{notes}{io}"
        f"<h2>Steps</h2>{_timeline(page)}"
        + (f"<h2>Agent sessions</h2>{sessions}" if sessions else "")
        + f"<h2>Sub-run tree</h2>{_tree(page.tree)}"
    )


def run_document_body(page: RunPage) -> str:
    """The run page's body: :func:`run_body` in the element the live view updates."""
    return (
        f'<div id="run" data-run-id="{esc(page.run_id)}"'
        f' data-event-count="{page.state.event_count}" data-status="{esc(page.state.status)}">'
        f"{run_body(page)}</div>"
    )


def _loop_status(loop: OuterLoop) -> str:
    if loop.completed is None:
        return _badge("running")
    return f'{_badge("completed")} <span class="muted reason">{esc(loop.completed.reason)}</span>'


def _with_unpriced(u: UsageTotals) -> str:
    """The cost, and when some calls had no price, how many (which the dollars leave out)."""
    text = esc(cost_text(u))
    if u.unpriced_calls:
        text += f' <span class="muted unpriced">{u.unpriced_calls:,} unpriced</span>'
    return text


def loops_body(rows: Sequence[LoopRow]) -> str:
    """The outer loops list: one row per loop, newest first."""
    trs = []
    for row in rows:
        started = row.loop.started
        assert started is not None  # load_outer_loop and the world's list keep only started loops
        trs.append(
            f'<tr class="loop" data-loop-id="{esc(started.outer_loop_id)}">'
            f'<td><a href="{esc(_loop_href(started.outer_loop_id))}">'
            f"{esc(started.outer_loop_id)}</a></td><td>{esc(started.workflow_id)}</td>"
            f'<td class="n cycles">{row.loop.cycles_ended}/{started.max_cycles}</td>'
            f"<td>{_loop_status(row.loop)}</td><td>{_when(row.loop.created_on)}</td>"
            f'<td class="n">{esc(_tokens(row.totals))}</td>'
            f'<td class="n cost">{_with_unpriced(row.totals)}</td></tr>'
        )
    table = (
        "<table id=loops><thead><tr><th>outer loop</th><th>workflow</th>"
        '<th class="n">cycles ended / max</th><th>status</th><th>started</th>'
        '<th class="n">tokens in / out</th><th class="n">cost (USD)</th></tr></thead>'
        f"<tbody>{''.join(trs)}</tbody></table>"
        if trs
        else '<p class="muted">no outer loops</p>'
    )
    return f"<h1>Outer loops</h1>{table}"


def loop_body(page: LoopPage) -> str:
    """An outer loop's page: its settings, one row per cycle, the totals."""
    loop = page.loop
    started = loop.started
    assert started is not None
    facts = [
        ("status", _loop_status(loop)),
        ("workflow", esc(started.workflow_id)),
        ("cycles ended", esc(f"{loop.cycles_ended}/{started.max_cycles}")),
        ("on cycle failure", esc(started.on_cycle_failure)),
    ]
    if started.budget_usd is not None:
        facts.append(("budget", esc(f"${started.budget_usd}")))
    facts.append(("started", _when(loop.created_on)))
    rows = []
    for view in page.cycles:
        c = view.cycle
        s = c.started
        note = ""
        # An abandoned cycle's changes are under its status; its decision cell keeps what
        # the planner had decided before the drift.
        decision = decision_text(replace(c, abandoned=None)) if c.planned else decision_text(c)
        if c.abandoned is not None:
            changes = "".join(f"<li>{esc(change)}</li>" for change in c.abandoned.changes)
            note = f'<ul class="changes">{changes}</ul>'
        rows.append(
            f'<tr class="cycle" data-cycle="{c.number}" data-status="{esc(c.status)}">'
            f'<td class="n">{c.number}</td><td>{_badge(c.status)}{note}</td>'
            f'<td class="planner-run">{_run_link(s.planner_run_id, view.planner_run_exists)}</td>'
            f'<td class="cycle-run">{_run_link(s.run_id, view.run_exists)}</td>'
            f'<td class="decision">{esc(decision)}</td>'
            f'<td class="n planner-cost">{_with_unpriced(view.cost.planner)}</td>'
            f'<td class="n run-cost">{_with_unpriced(view.cost.run)}</td></tr>'
        )
    table = (
        '<table id="cycles"><thead><tr><th class="n">cycle</th><th>status</th>'
        "<th>planner run</th><th>cycle run</th><th>planner decision</th>"
        '<th class="n">planner cost</th><th class="n">run cost</th></tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table>"
        if rows
        else '<p class="muted">no cycle has started</p>'
    )
    t = page.totals
    total = f"{_tokens(t)} tokens · {cost_text(t)}"
    if t.unpriced_calls:
        total += f" · {t.unpriced_calls:,} unpriced calls not in the dollars"
    pending = ""
    if loop.pending_cycle_run_id is not None:
        pending_exists = any(
            v.run_exists for v in page.cycles if v.cycle.started.run_id == loop.pending_cycle_run_id
        )
        pending = (
            f'<p id="pending">pending cycle run: '
            f"{_run_link(loop.pending_cycle_run_id, pending_exists)}</p>"
        )
    return (
        f"<h1>outer loop {esc(started.outer_loop_id)}</h1>{_facts(facts)}"
        f"<h2>Cycles</h2>{table}"
        f'<p id="loop-total">total (abandoned cycles included): <b>{esc(total)}</b></p>{pending}'
    )

"""The read-only commands of ``little``: views of a world's log.

* ``little report <run-id> [--tree]`` - per-step tokens and cost, then the
  sub-runs (or the whole tree of them);
* ``little replay <run-id> [--json]`` - what :func:`~little_es.replay.replay_run` returns;
* ``little events <run-id> [--jsonl]`` - the run's event log, in order, by wire name;
* ``little runs`` - every run, from the runs read model;
* ``little loops`` - every outer loop; ``little report --loop ID`` and
  ``little replay --loop ID`` show one;
* ``little verify [<run-id> | --all]`` - every stream's hash chain and every
  artifact of a run or of the world; exit code 1 when anything does not hold.

The tables are printed by :mod:`little_es.render`; the JSON forms are built here.
"""

from __future__ import annotations

import base64
from typing import Annotated, Any

import orjson
import typer
from rich.console import Console

from little_es.cli.common import (
    OptionalRunIdArgument,
    RunIdArgument,
    WorldOption,
    console,
    inspection_world,
)
from little_es.events import Event
from little_es.outer_loop import encode_view, load_outer_loop, loop_view
from little_es.projections import list_runs, list_waits
from little_es.render import (
    progress_bar,
    render_events,
    render_loop_report,
    render_loops,
    render_replay,
    render_report,
    render_runs,
    render_sub_runs,
    render_tree,
    render_verify,
    render_waits,
)
from little_es.replay import ReplayResult, replay_run
from little_es.verify import verify_world

__all__ = [
    "event_json",
    "events_command",
    "loops_command",
    "replay_command",
    "replay_json",
    "report_command",
    "runs_command",
    "verify_command",
]

_ORIGINATOR_FIELDS = {"originator_id", "originator_version", "timestamp"}


_LoopOption = Annotated[
    str | None,
    typer.Option("--loop", help="An outer loop id, instead of a run id.", show_default=False),
]


def _one_of(run_id: str | None, loop: str | None) -> None:
    if (run_id is None) == (loop is None):
        raise typer.BadParameter("give a run id or --loop OUTER_LOOP_ID (one of them)")


def report_command(
    run_id: OptionalRunIdArgument = None,
    world: WorldOption = None,
    tree: Annotated[
        bool, typer.Option("--tree", help="Also show the whole tree of sub-runs with totals.")
    ] = False,
    loop: _LoopOption = None,
) -> None:
    """Per-step tokens and cost of a run, or per cycle of an outer loop (``--loop``).

    Priced from the log, never from a recorded cost.
    """
    _one_of(run_id, loop)
    out = console()
    with inspection_world(world) as w:
        if loop is not None:
            render_loop_report(w, loop, out, tree=tree)
            return
        assert run_id is not None
        render_report(w, run_id, out)
        if tree:
            render_tree(w, run_id, out)
        else:
            render_sub_runs(w, run_id, out)


def replay_json(result: ReplayResult) -> dict[str, Any]:
    """``result`` as plain JSON data; artifact payloads are base64."""
    data = result.model_dump(mode="json", exclude={"artifacts"})
    data["artifacts"] = [
        {
            "manifest": a.manifest.model_dump(mode="json"),
            "payload_base64": base64.b64encode(a.payload).decode("ascii"),
        }
        for a in result.artifacts
    ]
    return data


def replay_command(
    run_id: OptionalRunIdArgument = None,
    world: WorldOption = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the whole ReplayResult as JSON.")
    ] = False,
    loop: _LoopOption = None,
) -> None:
    """Fold a run's log: its state, which steps would run on resume, its artifacts.

    With ``--loop``, print the folded state of an outer loop as JSON (the same
    view a local world keeps in ``outer-loops/<id>.json``).
    """
    _one_of(run_id, loop)
    with inspection_world(world) as w:
        if loop is not None:
            typer.echo(encode_view(loop_view(w, load_outer_loop(w, loop))).decode(), nl=False)
            return
        assert run_id is not None
        result = replay_run(w, run_id)
    if as_json:
        typer.echo(orjson.dumps(replay_json(result), option=orjson.OPT_INDENT_2).decode())
        return
    render_replay(result, console())


def event_json(event: Event) -> dict[str, Any]:
    """One line of ``little events --jsonl``: wire name, stream id, version, timestamp, payload."""
    payload = event.model_dump(mode="json")
    timestamp = payload["timestamp"]
    for name in _ORIGINATOR_FIELDS:
        payload.pop(name, None)
    return {
        "wire_name": type(event).wire_name,
        "stream_id": str(event.originator_id),
        "version": event.originator_version,
        "timestamp": timestamp,
        "payload": payload,
    }


def events_command(
    run_id: RunIdArgument,
    world: WorldOption = None,
    jsonl: Annotated[
        bool, typer.Option("--jsonl", help="One JSON object per line, with the payload.")
    ] = False,
) -> None:
    """A run's event log (its run stream and harness sessions), in order, by wire name."""
    with inspection_world(world) as w:
        events = w.read_run_log(run_id)
    if jsonl:
        typer.echo(b"\n".join(orjson.dumps(event_json(e)) for e in events).decode())
        return
    render_events(events, console())


def loops_command(world: WorldOption = None) -> None:
    """Every outer loop in the world: id, workflow, cycles, status, cost."""
    with inspection_world(world) as w:
        render_loops(w, console())


def runs_command(
    world: WorldOption = None,
    waiting: Annotated[
        bool,
        typer.Option("--waiting", help="Only the runs that wait for a signal, and for what."),
    ] = False,
) -> None:
    """Every run in the world, oldest first, from the runs read model."""
    with inspection_world(world) as w:
        name = w.name
        if waiting:
            render_waits(list_waits(w), name, console())
            return
        runs = list_runs(w)
    render_runs(runs, name, console())


def verify_command(
    run_id: Annotated[
        str | None, typer.Argument(help="The run to check (with its sessions and sub-runs).")
    ] = None,
    world: WorldOption = None,
    all_streams: Annotated[
        bool, typer.Option("--all", help="Check every stream and artifact of the world.")
    ] = False,
) -> None:
    """Check the hash chains, heads and artifacts of a run or the world; exit 1 on any break
    (or any event of a class not imported: see little --import)."""
    if (run_id is None) == (not all_streams):
        raise typer.BadParameter("give a RUN_ID or --all (not both)")
    with inspection_world(world) as w:
        if run_id is None:
            with progress_bar(Console(stderr=True)) as tell:
                report = verify_world(
                    w, progress=lambda done, total: tell("verifying streams", done, total)
                )
        else:
            report = verify_world(w, run_id)
    render_verify(report, console())
    if not report.ok:
        raise typer.Exit(1)

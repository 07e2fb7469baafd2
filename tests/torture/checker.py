"""What must hold after a torture run completed, read from its log and its ledger.

"Committed" is read from the log, after each process of the run ended (killed or not):

* a step attempt: its ``StepCompleted`` or ``StepFailed``;
* a model call: its ``harness.model.responded`` (the session's ``harness.session.started``
  names the run and the step);
* a tool call: its ``harness.tool_call.succeeded`` or ``.failed``.

The checks (each failure is one :class:`Violation`):

1. nothing executed in a process after it was committed by an earlier one;
2. nothing executed twice in one process (so an in-flight item re-executes at most once
   per kill);
3. every result the log holds was executed (a ledger line is behind it), and everything
   the ledger says was executed has its result in the log;
4. the final state of the run and of each sub-run equals the uninterrupted run's (see
   :func:`canonical_tree` for what is normalised and why), and each run holds the same
   result events as the uninterrupted run's, and at least its write-ahead records;
5. ``replay_run`` of every run and sub-run succeeds and two calls are equal;
6. one more resume is a no-op: no event, no ledger line (checked by the driver with
   :func:`event_counts`);
7. ``little verify`` holds: :func:`check_verify` (``verify_world`` of the run, its
   sessions, sub-runs and artifacts) after every run, and :func:`check_verify_cli` (the
   real ``little verify --all`` in a subprocess, every stream of the world) once per
   torture invocation.

Per capability (the driver runs each as runs of their own):

8. a wait (:func:`check_wait`): the ``approve`` wait took exactly one signal, with the
   signalled data, which is the step's output; nothing committed before the run first
   waited executed again after it; nothing after the wait executed before the signal;
9. an outer loop (:func:`check_loop`): checks 1-3 and 5 over every planner run and
   cycle run (so a cycle's committed steps never execute again), the cycle sequence and
   the loop's final state (:func:`loop_image`) equal the uninterrupted loop's, each
   of its runs' final state equals the uninterrupted loop's run of that cycle, and a
   local world's view file of the loop is the view of its log (:func:`check_loop_view`);
10. a fork (:func:`check_fork`): nothing of the prefix the fork copied from its origin
    executes in the fork, every top-level step from the fork point on executes in it,
    its final state is the uninterrupted run's (but for ``forked_from``), and replay of it
    is deterministic (check 5).

Still to come: sub-runs driven by Temporal.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from little_es import (
    LittleEsError,
    ModelResponded,
    OuterLoop,
    RunStarted,
    SessionStarted,
    SignalReceived,
    StepCompleted,
    StepFailed,
    StepStarted,
    SubRunReserved,
    ToolCallFailed,
    ToolCallStarted,
    ToolCallSucceeded,
    World,
    replay_run,
    verify_world,
)
from little_es.outer_loop import PLANNER_WORKFLOW_ID, encode_view, loop_view
from tests.torture.ledger import Entry, Item, model_item, step_item, tool_item

LEDGERED_STEP_KINDS = frozenset({"task", "decision"})
"""Step kinds whose body is the workflow's own code (the others run the engine's)."""
UNLEDGERED_TOOLS = frozenset({"start_workflow"})
"""Tools that are the library's own: the sub-runs they start are checked instead."""
UNLEDGERED_STEPS = frozenset({(PLANNER_WORKFLOW_ID, "decision")})
"""(workflow id, step path) of task steps whose body is the library's own (a loop's
planner reading its answer)."""

JSON = None | bool | int | float | str | list["JSON"] | dict[str, "JSON"]


@dataclass(frozen=True)
class Violation:
    """One broken guarantee, said so that it can be reproduced."""

    run_id: str
    what: str

    def __str__(self) -> str:
        return f"{self.run_id}: {self.what}"


def tree_run_ids(world: World, run_id: str) -> list[str]:
    """``run_id`` and its sub-runs (reserved and started), depth first."""
    found: list[str] = []
    todo = [run_id]
    while todo:
        current = todo.pop()
        if current in found or not world.run_exists(current):
            continue
        found.append(current)
        todo.extend(
            e.sub_run_id
            for e in reversed(world.read_run_log(current))
            if isinstance(e, SubRunReserved)
        )
    return found


@dataclass
class LogFacts:
    """What the logs of a run tree say has a committed result."""

    committed: set[Item] = field(default_factory=set)
    ledgered: set[Item] = field(default_factory=set)
    """The committed items whose execution must have a ledger line."""


def log_facts(world: World, run_ids: Iterable[str]) -> LogFacts:
    """The committed items of the runs ``run_ids``."""
    facts = LogFacts()
    for run_id in run_ids:
        events = world.read_run_log(run_id)
        workflow_id = next((e.workflow_id for e in events if isinstance(e, RunStarted)), "")
        sessions: dict[str, SessionStarted] = {
            str(e.originator_id): e for e in events if isinstance(e, SessionStarted)
        }
        kinds = {(e.step_path, e.attempt): e.kind for e in events if isinstance(e, StepStarted)}
        tools = {
            (str(e.originator_id), e.call_id): e.name
            for e in events
            if isinstance(e, ToolCallStarted)
        }
        for e in events:
            if isinstance(e, StepCompleted | StepFailed):
                item = step_item(run_id, e.step_path, e.attempt)
                facts.committed.add(item)
                if (
                    kinds.get((e.step_path, e.attempt)) in LEDGERED_STEP_KINDS
                    and (workflow_id, e.step_path) not in UNLEDGERED_STEPS
                ):
                    facts.ledgered.add(item)
            elif isinstance(e, ModelResponded):
                session = sessions[str(e.originator_id)]
                item = model_item(session.run_id, session.step_path, e.turn)
                facts.committed.add(item)
                facts.ledgered.add(item)
            elif isinstance(e, ToolCallSucceeded | ToolCallFailed):
                session = sessions[str(e.originator_id)]
                item = tool_item(session.run_id, str(e.originator_id), e.call_id)
                facts.committed.add(item)
                if tools.get((str(e.originator_id), e.call_id)) not in UNLEDGERED_TOOLS:
                    facts.ledgered.add(item)
    return facts


def event_counts(world: World, run_ids: Iterable[str]) -> dict[str, int]:
    """How many events each run's log holds."""
    return {run_id: len(world.read_run_log(run_id)) for run_id in run_ids}


@dataclass
class LedgerReport:
    """The ledger checks of one run: violations, and how many in-flight items re-ran."""

    violations: list[Violation]
    reexecuted: int


def check_ledger(
    run_id: str,
    entries: Sequence[Entry],
    committed_after: Sequence[set[Item]],
    final: LogFacts,
) -> LedgerReport:
    """Checks 1-3: ``committed_after[s]`` is what the log held when process ``s`` ended."""
    violations: list[Violation] = []
    per_segment = Counter((e.item, e.segment) for e in entries)
    for (item, segment), n in sorted(per_segment.items()):
        if n > 1:
            violations.append(Violation(run_id, f"{item} executed {n} times in process {segment}"))
    for entry in entries:
        s = entry.segment
        if s >= 1 and s - 1 < len(committed_after) and entry.item in committed_after[s - 1]:
            violations.append(
                Violation(
                    run_id,
                    f"{entry.item} was committed when process {s - 1} ended and executed"
                    f" again in process {s}",
                )
            )
    executed = {e.item for e in entries}
    for item in sorted(final.ledgered - executed):
        violations.append(Violation(run_id, f"{item} has a result in the log but never executed"))
    for item in sorted(executed - final.committed):
        violations.append(Violation(run_id, f"{item} executed but its result is not in the log"))
    segments: dict[Item, set[int]] = {}
    for e in entries:
        segments.setdefault(e.item, set()).add(e.segment)
    reexecuted = sum(len(s) - 1 for s in segments.values())
    return LedgerReport(violations, reexecuted)


# ------------------------------------------------------------------ little verify

VERIFY_TIMEOUT_S = 300.0
"""Bound on ``little verify --all``: a world of a 1,000-kill torture is tens of thousands
of rows, read in a few seconds; a hang is a violation, not a stuck suite."""


def check_verify(world: World, run_id: str) -> list[Violation]:
    """Check 7, per run: every stream and artifact of the run's tree holds."""
    try:
        report = verify_world(world, run_id)
    except LittleEsError as exc:
        return [Violation(run_id, f"little verify failed: {type(exc).__name__}: {exc}")]
    found = [
        Violation(run_id, f"little verify: {s.kind} {s.name} ({s.stream_id}): {s.problem}")
        for s in report.streams
        if s.problem is not None
    ]
    found.extend(
        Violation(run_id, f"little verify: artifact {a.artifact_id} of {a.step_path}: {a.problem}")
        for a in report.artifacts
        if a.problem is not None
    )
    return found


def check_verify_cli(world_url: str) -> list[Violation]:
    """Check 7, once per torture invocation: the real ``little verify --all`` exits 0.

    Run as a user would (a fresh interpreter, the CLI's own world URL parsing), so a
    break that only the command sees (its rendering, its exit code) is caught too.
    """
    repo = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if not k.startswith("LITTLE_ES_CRASH_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(repo), env.get("PYTHONPATH")]))
    argv = [sys.executable, "-m", "little_es.cli", "verify", "--all", "--world", world_url]
    try:
        done = subprocess.run(
            argv,
            env=env,
            cwd=repo,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=VERIFY_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return [Violation("<world>", f"little verify --all did not end in {VERIFY_TIMEOUT_S}s")]
    if done.returncode == 0:
        return []
    tail = (done.stdout + done.stderr)[-4000:]
    return [Violation("<world>", f"little verify --all exited {done.returncode}: {tail}")]


# ------------------------------------------------------------------ the final state

VOLATILE_STATE_FIELDS = ("started_at", "updated_at", "completed_at", "event_count")
VOLATILE_WAIT_FIELDS = ("since", "signalled_at", "signalled_by")
"""Fields of a wait that differ between two runs: the clock's, and who sent the signal
(``little signal`` names its process)."""
"""Fields of a run's state that legitimately differ between two runs of one workflow:
the timestamps are the clock's, and ``event_count`` also counts the write-ahead records
an in-flight item re-records when it re-executes (its results are compared apart, by
type, in :func:`check_final`)."""


@dataclass(frozen=True)
class RunImage:
    """One run of a tree with its ids replaced by names that do not depend on the run id."""

    name: str
    state: JSON
    results: Mapping[str, int]
    """How many events of each result (non-write-ahead) type the log holds."""
    write_ahead: Mapping[str, int]
    """How many write-ahead records of each type the log holds."""


def _names(
    world: World, run_ids: Sequence[str], roots: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Each run id and session id of a tree -> a name made of step paths and call ids.

    Sub-run ids are derived from the parent run id (and the session id and the call id),
    session ids from the run id, the step path and the attempt: naming each by what it
    was derived from makes two trees of one workflow comparable. ``roots`` names the
    runs that are no one's sub-run (default: the first of ``run_ids`` is ``<run>``).
    """
    names = dict(roots) if roots is not None else {run_ids[0]: "<run>"}
    for run_id in run_ids:
        parent = names[run_id]
        for e in world.read_run_log(run_id):
            if isinstance(e, SubRunReserved):
                names[e.sub_run_id] = f"<{parent}:{e.step_path}/{e.call_id or ''}>"
            elif isinstance(e, SessionStarted):
                names[str(e.originator_id)] = f"<session {parent}:{e.step_path}#{e.attempt}>"
    return names


def _rename(value: JSON, names: Mapping[str, str]) -> JSON:
    if isinstance(value, str):
        for raw, name in names.items():
            if raw in value:
                value = value.replace(raw, name)
        return value
    if isinstance(value, list):
        return [_rename(v, names) for v in value]
    if isinstance(value, dict):
        return {_rename_key(k, names): _rename(v, names) for k, v in value.items()}
    return value


def _rename_key(key: str, names: Mapping[str, str]) -> str:
    renamed = _rename(key, names)
    assert isinstance(renamed, str)
    return renamed


def canonical_tree(world: World, run_id: str, violations: list[Violation]) -> dict[str, RunImage]:
    """Every run of the tree of ``run_id``, by name (:func:`canonical_runs`)."""
    run_ids = tree_run_ids(world, run_id)
    return canonical_runs(world, run_ids, _names(world, run_ids), violations)


def canonical_runs(
    world: World, run_ids: Sequence[str], names: Mapping[str, str], violations: list[Violation]
) -> dict[str, RunImage]:
    """The runs ``run_ids`` (named by ``names``, :func:`_names`), by name, as :class:`RunImage`.

    Check 5 runs here: each run is replayed twice, and a failure or a difference is a
    violation. The state is ``replay_run(...).state`` without
    :data:`VOLATILE_STATE_FIELDS` (and :data:`VOLATILE_WAIT_FIELDS` of each wait), with
    run and session ids renamed and the sub-run ids sorted (sub-runs started
    concurrently are reserved in any order).
    """
    images: dict[str, RunImage] = {}
    for rid in run_ids:
        try:
            first = replay_run(world, rid)
            second = replay_run(world, rid)
        except LittleEsError as exc:
            violations.append(Violation(rid, f"replay_run failed: {type(exc).__name__}: {exc}"))
            continue
        if first != second:
            violations.append(Violation(rid, "two replay_run calls gave different results"))
        dumped = first.state.model_dump(mode="json")
        for key in VOLATILE_STATE_FIELDS:
            dumped.pop(key, None)
        for wait in (dumped.get("waits") or {}).values():
            for key in VOLATILE_WAIT_FIELDS:
                wait.pop(key, None)
        state = _rename(dumped, names)
        assert isinstance(state, dict)
        subs = state.get("sub_run_ids")
        if isinstance(subs, list):
            state["sub_run_ids"] = [*sorted(map(str, subs))]
        results: Counter[str] = Counter()
        write_ahead: Counter[str] = Counter()
        for e in world.read_run_log(rid):
            (write_ahead if type(e).write_ahead else results)[e.wire_name] += 1
        images[names[rid]] = RunImage(names[rid], state, dict(results), dict(write_ahead))
    return images


def check_final(
    run_id: str, actual: Mapping[str, RunImage], expected: Mapping[str, RunImage]
) -> list[Violation]:
    """Check 4: the tree of ``run_id`` against the uninterrupted run's."""
    violations: list[Violation] = []
    missing = sorted(set(expected) - set(actual))
    extra = sorted(set(actual) - set(expected))
    if missing:
        violations.append(Violation(run_id, f"runs missing from the tree: {missing}"))
    if extra:
        violations.append(Violation(run_id, f"runs in the tree that should not be: {extra}"))
    for name in sorted(set(actual) & set(expected)):
        got, want = actual[name], expected[name]
        if got.state != want.state:
            violations.append(
                Violation(run_id, f"{name}: final state differs: {_diff(got.state, want.state)}")
            )
        if got.results != want.results:
            violations.append(
                Violation(
                    run_id,
                    f"{name}: result events {dict(got.results)}"
                    f" != uninterrupted {dict(want.results)}",
                )
            )
        short = {
            k: (got.write_ahead.get(k, 0), n)
            for k, n in want.write_ahead.items()
            if got.write_ahead.get(k, 0) < n
        }
        if short:
            violations.append(
                Violation(run_id, f"{name}: fewer write-ahead records than uninterrupted: {short}")
            )
    return violations


def _diff(got: JSON, want: JSON, path: str = "") -> str:
    """The first place where two JSON values differ, for a readable violation."""
    if isinstance(got, dict) and isinstance(want, dict):
        for key in sorted(set(got) | set(want)):
            if (key in got) != (key in want):
                return (
                    f"at {path}.{key}: only in the {'run' if key in got else 'uninterrupted run'}"
                )
            if got.get(key) != want.get(key):
                return _diff(got.get(key), want.get(key), f"{path}.{key}")
    if isinstance(got, list) and isinstance(want, list) and len(got) == len(want):
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            if g != w:
                return _diff(g, w, f"{path}[{i}]")
    return f"at {path or '.'}: {_short(got)} != {_short(want)} (uninterrupted)"


def _short(value: JSON) -> str:
    text = repr(value)
    return text if len(text) <= 200 else text[:200] + "..."


# ------------------------------------------------------------------ waits


@dataclass
class WaitTrack:
    """What the driver saw of a run's wait: when it first waited, when it was signalled."""

    waited_segment: int | None = None
    """The process after which the log first said the run waits."""
    committed_before: set[Item] = field(default_factory=set)
    """What the log held then: everything before the wait."""
    signal_segment: int | None = None
    """The first process that could see the signal (it was sent before or during it)."""
    how: str = ""
    """``api`` (``World.signal`` between processes), ``cli`` (``little signal`` between
    processes), ``live`` (``World.signal`` from a thread while a process runs)."""


def check_wait(
    run_id: str,
    world: World,
    wait_step: str,
    signalled: Mapping[str, object],
    after_wait: Sequence[str],
    entries: Sequence[Entry],
    track: WaitTrack,
) -> list[Violation]:
    """Check 8: the wait ``wait_step`` of ``run_id`` resolved once with ``signalled``.

    ``after_wait`` are the step paths after the wait: none of them may have executed in
    a process that ended before the signal was sent.
    """
    violations: list[Violation] = []
    if track.waited_segment is None or track.signal_segment is None:
        return [Violation(run_id, f"the run never waited at {wait_step} (or was never signalled)")]
    signals = [
        e
        for e in world.read_run_log(run_id)
        if isinstance(e, SignalReceived) and e.wait_id == wait_step
    ]
    if len(signals) != 1:
        violations.append(Violation(run_id, f"{wait_step} took {len(signals)} signals, not 1"))
    for e in signals:
        if e.data != signalled:
            violations.append(
                Violation(run_id, f"{wait_step} recorded signal data {e.data} != {signalled}")
            )
    state = replay_run(world, run_id).state
    wait = state.waits.get(wait_step)
    if wait is None or wait.status != "signalled" or wait.data != signalled:
        got = None if wait is None else (wait.status, wait.data)
        violations.append(Violation(run_id, f"wait {wait_step} ended {got}, not signalled"))
    step = state.steps.get(wait_step)
    if step is None or step.status != "completed" or step.output != signalled:
        got = None if step is None else (step.status, step.output)
        violations.append(Violation(run_id, f"step {wait_step} ended {got}, not {signalled}"))
    for entry in entries:
        if entry.segment > track.waited_segment and entry.item in track.committed_before:
            violations.append(
                Violation(
                    run_id,
                    f"{entry.item} was committed before the run waited (process"
                    f" {track.waited_segment}) and executed again in process {entry.segment}",
                )
            )
        if (
            entry.item.kind == "step"
            and entry.item.run_id == run_id
            and entry.item.where in after_wait
            and entry.segment < track.signal_segment
        ):
            violations.append(
                Violation(
                    run_id,
                    f"{entry.item} comes after the wait and executed in process"
                    f" {entry.segment}, before the signal ({track.how}, seen from process"
                    f" {track.signal_segment})",
                )
            )
    return violations


# ------------------------------------------------------------------ forks


def fork_image(images: Mapping[str, RunImage]) -> dict[str, RunImage]:
    """A fork's tree as the uninterrupted run's: without ``forked_from`` and ``RunForked``.

    The rest of a fork's state and result events must be those of a run that never
    stopped: the copied prefix holds the origin's results, and the fork the rest.
    """
    out: dict[str, RunImage] = {}
    for name, image in images.items():
        state = image.state
        results = dict(image.results)
        if name == "<run>" and isinstance(state, dict):
            state = {**state, "forked_from": None}
            results.pop("RunForked", None)
        out[name] = RunImage(name, state, results, image.write_ahead)
    return out


def check_fork(
    fork_id: str,
    world: World,
    origin: str,
    at: str,
    inherited: set[Item],
    entries: Sequence[Entry],
    top_steps: Sequence[str],
    ledgered_steps: Collection[str],
) -> list[Violation]:
    """Check 10: the fork ``fork_id`` of ``origin`` at ``at``.

    ``inherited`` is what the fork's tree held committed when it was written (the copied
    prefix, and the origin's sub-runs it kept); ``top_steps`` are the workflow's
    top-level steps in order, ``ledgered_steps`` those whose bodies write the ledger
    under their own path.
    """
    violations: list[Violation] = []
    forked = replay_run(world, fork_id).state.forked_from
    if forked is None or forked.origin_run_id != origin or forked.at != at:
        violations.append(Violation(fork_id, f"forked_from is {forked}, not {origin!r} at {at!r}"))
    for entry in entries:
        if entry.item in inherited:
            violations.append(
                Violation(
                    fork_id,
                    f"{entry.item} is in the prefix the fork copied from {origin} and executed"
                    f" again in the fork (process {entry.segment})",
                )
            )
    path = at.split("#", 1)[0]
    base = path.split("@", 1)[0]
    ran = {e.item.where for e in entries if e.item.kind == "step" and e.item.run_id == fork_id}
    if base in top_steps:
        if base in ledgered_steps and "#" not in at and path not in ran:
            violations.append(Violation(fork_id, f"the fork point {at} never executed in the fork"))
        for step in top_steps[top_steps.index(base) + 1 :]:
            if step in ledgered_steps and not any(w.split("@", 1)[0] == step for w in ran):
                violations.append(
                    Violation(
                        fork_id,
                        f"step {step} (after the fork point {at}) never executed in the fork",
                    )
                )
    return violations


# ------------------------------------------------------------------ outer loops

LOOP_HASHES = frozenset(
    {
        "planner_manifest_hash",
        "started_planner_manifest_hash",
        "outer_loop_context_hash",
        "old_manifest_hash",
    }
)
"""Hashes of a loop's view that hash the loop's own id (in the planner's context)."""


def loop_run_ids(world: World, loop: OuterLoop) -> list[str]:
    """Every planner run and cycle run of ``loop`` that exists, with their sub-runs."""
    found: list[str] = []
    for number in sorted(loop.cycles):
        started = loop.cycles[number].started
        for run_id in (started.planner_run_id, started.run_id):
            found.extend(r for r in tree_run_ids(world, run_id) if r not in found)
    return found


def loop_image(world: World, loop: OuterLoop, loop_id: str) -> JSON:
    """The loop's view (:func:`~little_es.loop_view`), its id renamed, its id's hashes out."""

    def clean(value: JSON) -> JSON:
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items() if k not in LOOP_HASHES}
        if isinstance(value, list):
            return [clean(v) for v in value]
        if isinstance(value, str):
            return value.replace(loop_id, "<loop>")
        return value

    view: JSON = loop_view(world, loop)  # type: ignore[assignment]
    return clean(view)


def loop_cycles(image: JSON) -> list[JSON]:
    """The cycle sequence of a :func:`loop_image`: each cycle's number, status and decision."""
    assert isinstance(image, dict)
    cycles = image.get("cycles")
    assert isinstance(cycles, list)
    return [
        {k: c.get(k) for k in ("cycle", "status", "decision")}
        for c in cycles
        if isinstance(c, dict)
    ]


def check_loop(loop_id: str, got: JSON, want: JSON, again: JSON) -> list[Violation]:
    """Check 9: the loop's cycles and view against the uninterrupted loop's, and stable."""
    violations: list[Violation] = []
    if loop_cycles(got) != loop_cycles(want):
        violations.append(
            Violation(
                loop_id,
                f"cycle sequence {loop_cycles(got)} != uninterrupted {loop_cycles(want)}",
            )
        )
    if got != want:
        violations.append(Violation(loop_id, f"loop final state differs: {_diff(got, want)}"))
    if again != got:
        violations.append(Violation(loop_id, "two loads of the loop gave different views"))
    return violations


def check_loop_view(world: World, loop_id: str) -> list[Violation]:
    """Check 9, the file: a local world's ``outer-loops/<id>.json`` is the log's view."""
    stored = world.backend.read_outer_loop_view(loop_id)
    if stored is None and not world.backend.keeps_outer_loop_views:
        return []
    loop = world.load_outer_loop(loop_id)
    if loop is None:
        return [Violation(loop_id, "the outer loop has no log")]
    if stored != encode_view(loop_view(world, loop)):
        had = "disagrees with" if stored is not None else "is missing for"
        return [Violation(loop_id, f"the loop's view file {had} its log")]
    return []

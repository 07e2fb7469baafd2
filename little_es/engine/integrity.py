"""The restart checks run before a resumed run schedules anything.

If the log is intact and consistent with the code, replaying it can stand in
for the original run; if not, the runtime refuses to proceed and says what
differs. Every check raises a :class:`~little_es.errors.RuntimeIntegrityError`
subclass whose message names the run, the step and the difference.

Both engines run :func:`run_restart_checks` before they resume a run, and
:func:`assert_completed_parallel_replay_matches_input` when the walk reaches a
parallel group.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from little_es.durability import INPUT_PATH
from little_es.engine.walk import Walk
from little_es.errors import (
    ArtifactError,
    ArtifactMismatchError,
    ParallelReplayMismatchError,
    RunInputMismatchError,
    VisitLimitError,
    WorkflowChangedError,
)
from little_es.events import BudgetSet, RunCancelled, RunResumed
from little_es.harness.manifest import check_manifest, compute_manifest, read_session_started
from little_es.ids import run_stream_id
from little_es.materialize import RunFold
from little_es.values import ArtifactRef
from little_es.workflow.authoring import AgentStep, Workflow
from little_es.world import World

__all__ = [
    "assert_completed_parallel_replay_matches_input",
    "assert_completed_step_artifacts_valid",
    "assert_fork_prefix_matches",
    "assert_harness_manifest_consistent",
    "assert_run_input_unchanged",
    "assert_workflow_unchanged",
    "fork_adopts",
    "run_restart_checks",
]


def assert_workflow_unchanged(
    run_id: str, fold: RunFold, *, workflow_id: str, workflow_version: str, ir_hash: str
) -> None:
    """The workflow resuming the run is the one that started it (id, version, IR hash)."""
    if fold.workflow_id != workflow_id:
        raise WorkflowChangedError(
            f"run {run_id!r} was started by workflow {fold.workflow_id!r}, not {workflow_id!r}:"
            " resume it with the workflow that started it"
        )
    if fold.ir_hash != ir_hash:
        raise WorkflowChangedError(
            f"run {run_id!r}: workflow {workflow_id!r} changed since the run started (IR hash"
            f" {fold.ir_hash} at version {fold.workflow_version!r}, now {ir_hash} at version"
            f" {workflow_version!r}): resume with the original definition, or start a new run"
        )


def assert_harness_manifest_consistent(
    world: World, run_id: str, fold: RunFold, workflow: Workflow
) -> None:
    """The seed's restart check: every recorded harness session of the run still matches.

    For each agent step attempt with a committed ``harness.session.started``
    (completed or not), recompute the manifest from the workflow's current
    agent step and compare it with the recorded body (and the body with its
    recorded hash); raise :class:`~little_es.errors.CapabilityDriftError`
    naming what changed. A string prompt is compared here; a prompt function
    needs the step's context to render, so its text is compared by the
    session's own check when the step resumes (a completed step never renders
    it again).
    """
    for path, step in fold.steps.items():
        if step.kind != "agent" or not step.session_ids:
            continue
        agent = workflow.step_or_none(step.step_id)
        if not isinstance(agent, AgentStep):
            continue  # a removed or re-kinded step: the IR hash check refuses it
        manifest, _ = compute_manifest(
            agent.model,
            tuple(agent.tools.values()),
            agent.system,
            agent.parameters,
            agent.max_turns,
            agent.prompt if isinstance(agent.prompt, str) else None,
        )
        for session_id in step.session_ids:
            started = read_session_started(world, session_id)
            if started is not None and started.run_id == run_id and started.step_path == path:
                check_manifest(started, manifest)


def assert_run_input_unchanged(
    world: World, run_id: str, fold: RunFold, input: Mapping[str, Any] | None
) -> None:
    """The input's artifact (a large input) is this run's and intact; an input given on
    resume equals the recorded one."""
    recorded = fold.input
    if fold.input_ref is not None:
        payload = _check_ref(world, run_id, INPUT_PATH, fold.input_ref, "input artifact")
        try:
            recorded = orjson.loads(payload)
        except orjson.JSONDecodeError as exc:
            raise ArtifactMismatchError(
                f"run {run_id!r}: input artifact {fold.input_ref.artifact_id} is not the JSON"
                f" input it should hold: {exc}"
            ) from exc
    if input is not None and orjson.loads(orjson.dumps(input)) != recorded:
        raise RunInputMismatchError(
            f"run {run_id!r} started with input {_shown(recorded)}, and resume was asked for"
            f" with {_shown(input)}: pass the same input (or none) to resume, or use a new run id"
        )


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 200 else text[:200] + "…"


def _check_ref(world: World, run_id: str, step_path: str, ref: ArtifactRef, role: str) -> bytes:
    if ref.run_id != run_id:
        raise ArtifactMismatchError(
            f"run {run_id!r}, step {step_path!r}: {role} {ref.artifact_id} belongs to run"
            f" {ref.run_id!r}, not to this run"
        )
    if ref.step_path != step_path:
        raise ArtifactMismatchError(
            f"run {run_id!r}, step {step_path!r}: {role} {ref.artifact_id} was recorded for step"
            f" {ref.step_path!r}"
        )
    try:
        return world.artifacts.get(ref).payload
    except ArtifactError as exc:
        raise ArtifactMismatchError(f"run {run_id!r}, step {step_path!r}: {exc}") from exc


def assert_completed_step_artifacts_valid(world: World, run_id: str, fold: RunFold) -> None:
    """Every completed step's artifacts exist, hash correctly, belong to this run and step,
    and an output stored by reference is the JSON the step returned."""
    for path, step in fold.steps.items():
        if step.status != "completed":
            continue
        for ref in step.artifact_refs:
            _check_ref(world, run_id, path, ref, "artifact")
        if step.output_ref is not None:
            payload = _check_ref(world, run_id, path, step.output_ref, "output artifact")
            if step.output is not None:
                raise ArtifactMismatchError(
                    f"run {run_id!r}, step {path!r}: the output is recorded both inline and"
                    f" as artifact {step.output_ref.artifact_id}"
                )
            try:
                orjson.loads(payload)
            except orjson.JSONDecodeError as exc:
                raise ArtifactMismatchError(
                    f"run {run_id!r}, step {path!r}: output artifact"
                    f" {step.output_ref.artifact_id} is not the JSON output it should hold: {exc}"
                ) from exc


def assert_completed_parallel_replay_matches_input(
    run_id: str, step_path: str, recorded: Sequence[str], recomputed: Sequence[str]
) -> None:
    """A parallel group's recomputed branch keys equal the recorded ``ParallelBranchScheduled``."""
    if tuple(recorded) != tuple(recomputed):
        added = [k for k in recomputed if k not in recorded]
        missing = [k for k in recorded if k not in recomputed]
        detail = []
        if added:
            detail.append(f"new branches {added}")
        if missing:
            detail.append(f"missing branches {missing}")
        if not detail:
            detail.append(f"order {list(recorded)} became {list(recomputed)}")
        raise ParallelReplayMismatchError(
            f"run {run_id!r}, parallel group {step_path!r}: the branch set recomputed from the"
            f" run's data differs from the recorded one ({'; '.join(detail)}): the branches"
            " function or the data it reads changed; resume with the original code"
        )


_NOTHING_RAN = (RunCancelled, RunResumed, BudgetSet)
"""What may follow a fork's prefix before it adopts another definition: nothing that ran."""


def fork_adopts(world: World, run_id: str, fold: RunFold, version: int, workflow: Workflow) -> bool:
    """Whether the fork ``fold`` describes takes ``workflow`` although its origin ran another
    definition: a fork may run changed code after its fork point, once, before it ran
    anything (its ``Run`` stream at ``version`` holds the prefix alone, or with only a
    cancel, a resume or a budget after it, and its copied sessions the copies alone).
    The prefix is then checked against ``workflow`` (:func:`assert_fork_prefix_matches`)
    instead of the IR hash, and the engine records ``WorkflowAdopted``; from there on
    the fork is pinned to it as any run is."""
    origin = fold.forked_from
    if origin is None or fold.workflow_id != workflow.id or fold.ir_hash == workflow.ir_hash:
        return False
    prefix = origin.copied_events + 1
    if version != prefix and not all(
        isinstance(e, _NOTHING_RAN) for e in world.read_stream(run_stream_id(run_id), after=prefix)
    ):
        return False
    for copied in origin.sessions:
        session = world.load_session(copied.session_id)
        if session is None or session.version != copied.copied_events:
            return False
    return True


def assert_fork_prefix_matches(run_id: str, fold: RunFold, workflow: Workflow) -> None:
    """A fork's copied prefix is what ``workflow`` walks to its fork point.

    The walk of ``workflow`` over the recorded outputs and decisions must visit
    every completed step of the prefix, each of the same kind, and reach the fork
    point as its first step that did not complete: a definition that changed
    only after the fork point. (An agent step of the prefix is also held to
    its recorded manifest, by :func:`assert_harness_manifest_consistent`.)
    Raises :class:`~little_es.errors.WorkflowChangedError` naming the first
    difference.
    """
    origin = fold.forked_from
    assert origin is not None
    where = (
        f"run {run_id!r} is a fork of {origin.origin_run_id!r} at {origin.at!r}, and workflow"
        f" {workflow.id!r} as given"
    )
    fix = "change only the steps from the fork point on, or fork the origin at an earlier step"
    walk = Walk(workflow.ir, run_id)
    seen: set[str] = set()
    try:
        visit = walk.first()
        while visit is not None:
            step = fold.steps.get(visit.path)
            if step is None or step.status != "completed":
                break
            if step.kind != visit.step.kind:
                raise WorkflowChangedError(
                    f"{where} has step {visit.path!r} as a {visit.step.kind} step, which the"
                    f" copied prefix ran as a {step.kind} step: {fix}"
                )
            seen.add(visit.path)
            visit = walk.after(visit, step.next_step if visit.step.kind == "decision" else None)
    except VisitLimitError as exc:
        raise WorkflowChangedError(
            f"{where} does not walk the copied prefix ({exc}): {fix}"
        ) from exc
    reached = visit.path if visit is not None else None
    if reached != origin.step_path:
        first = f"step {reached!r}" if reached is not None else "nothing (its walk ends)"
        raise WorkflowChangedError(
            f"{where} would run {first} first, not the fork point {origin.step_path!r}: the"
            f" workflow changed before the fork point; {fix}"
        )
    lost = [
        path
        for path, step in fold.steps.items()
        if step.status == "completed" and "/" not in path and path not in seen
    ]
    if lost:
        raise WorkflowChangedError(
            f"{where} no longer walks the copied prefix's steps {lost} before the fork point: {fix}"
        )


def run_restart_checks(
    world: World,
    run_id: str,
    fold: RunFold,
    workflow: Workflow,
    input: Mapping[str, Any] | None,
    *,
    adopting: bool = False,
) -> None:
    """Every restart check, in the order both engines run them before resuming ``run_id``.

    ``workflow`` is the workflow asked to resume it and ``input`` the input
    given for the resume (None: the recorded one).
    The harness manifest check goes first, so that a changed agent is named
    precisely (the IR hash covers the same fields but can only say "changed").
    Parallel groups are checked as the walk reaches them, where their branch
    set can be recomputed from the run's data. ``adopting`` (a fork that takes a
    changed workflow, :func:`fork_adopts`): its prefix is checked against the
    workflow's walk instead of the IR hash.
    """
    assert_harness_manifest_consistent(world, run_id, fold, workflow)
    if adopting:
        assert_fork_prefix_matches(run_id, fold, workflow)
    else:
        assert_workflow_unchanged(
            run_id,
            fold,
            workflow_id=workflow.id,
            workflow_version=workflow.version,
            ir_hash=workflow.ir_hash,
        )
    assert_run_input_unchanged(world, run_id, fold, input)
    assert_completed_step_artifacts_valid(world, run_id, fold)

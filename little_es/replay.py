"""``replay_run``: a run's state and resume plan, folded from its log and nothing else.

Replay is read-only and pure. It reads the requested run's event log (its
``Run`` stream and the harness sessions that run started, never a sub-run's
stream), folds it with :func:`little_es.materialize.materialize_run_state` (the
same reducer the runtime uses: there is no second implementation), and hydrates
the artifacts the run's steps reference, verifying each one's sha256. It never
appends an event, calls a model or a tool, or touches the network.

Every event the result is folded from is decoded and validated. The bulk of a
long log is what each model call was sent and each tool call's arguments and
result (``harness.model.called``, ``harness.tool_call.*``), which the reducer
only counts (:data:`~little_es.materialize.COUNTED_ONLY`): replay counts those
rows without decoding them (an unknown topic is still refused). A resumed session
decodes and validates them, and checks the conversation's hash chain;
``little events`` shows them.

Two calls on an unchanged log return deeply equal results, and every part of a
result is immutable: frozen models, tuples and read-only mappings, so mutating
any of it raises.
"""

from __future__ import annotations

from functools import cached_property
from typing import Literal

import orjson
from pydantic import BaseModel, ConfigDict, computed_field

from little_es._compact import construct_compact, prepare_compact
from little_es._frozen import freeze
from little_es.ids import validate_run_id
from little_es.materialize import COUNTED_ONLY, MaterializedRunState
from little_es.values import ArtifactRef, HydratedArtifact, JSONValue
from little_es.world import World, gc_paused

__all__ = ["ReplayPlanStep", "ReplayResult", "read_run_state", "replay_run"]

PlanStatus = Literal["completed", "pending", "running", "failed"]


class ReplayPlanStep(BaseModel):
    """How one step path is scheduled on resume.

    A scheduling view only: it deliberately carries no usage. Per-step tokens
    and dollars are on ``ReplayResult.state.steps[step_path].usage``.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    step_path: str
    status: PlanStatus
    should_run: bool
    """False exactly when ``status`` is ``completed``: a committed step never runs again."""
    output: JSONValue = None
    output_ref: ArtifactRef | None = None
    artifact_refs: tuple[ArtifactRef, ...] = ()


# A replay holds one per step path.
prepare_compact(ReplayPlanStep)


class ReplayResult(BaseModel):
    """What :func:`replay_run` returns: the materialized state and the resume plan."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    run_id: str
    state: MaterializedRunState
    """The reducer's state, including the harness usage totals (run and per step)."""
    artifacts: tuple[HydratedArtifact, ...]
    """Every artifact the run references (its input ref, then output refs and artifact
    refs, step by step, then the run's own output ref), verified and deduplicated."""

    @computed_field  # type: ignore[prop-decorator]
    @cached_property
    def steps(self) -> tuple[ReplayPlanStep, ...]:
        """One per step path the log names, in the order the steps were first started."""
        # The plan is made when first asked for: all of it is in ``state.steps``, and a
        # replay of a long run that never looks at it would hold a second object per
        # step (~150 bytes) and its paths once more, for nothing.
        return tuple(
            # The state is validated and frozen already: the plan shares its outputs
            # rather than holding a validated copy of each.
            construct_compact(
                ReplayPlanStep,
                _PLAN_FIELDS,
                {
                    "step_path": path,
                    "status": step.status,
                    "should_run": step.status != "completed",
                    "output": step.output,
                    "output_ref": step.output_ref,
                    "artifact_refs": step.artifact_refs,
                },
            )
            for path, step in self.state.steps.items()
        )

    @computed_field  # type: ignore[prop-decorator]
    @cached_property
    def completed_step_paths(self) -> tuple[str, ...]:
        """Step paths with a committed ``StepCompleted``: they do not run again."""
        return tuple(p for p, step in self.state.steps.items() if step.status == "completed")

    @computed_field  # type: ignore[prop-decorator]
    @cached_property
    def pending_step_paths(self) -> tuple[str, ...]:
        """Step paths that run on resume (pending, running or failed)."""
        return tuple(p for p, step in self.state.steps.items() if step.status != "completed")

    @property
    def input(self) -> JSONValue:
        """The run input: ``state.input``, or read from its artifact when it was too large to
        inline (``state.input_ref``); deeply read-only."""
        ref = self.state.input_ref
        if ref is None:
            return self.state.input
        payload = next(a.payload for a in self.artifacts if a.manifest == ref)
        return freeze(orjson.loads(payload))


_PLAN_FIELDS = set(ReplayPlanStep.model_fields)


def replay_run(world: World, run_id: str) -> ReplayResult:
    """Fold ``run_id``'s log in ``world`` into a :class:`ReplayResult`.

    Raises :class:`~little_es.errors.InvalidRunIdError` for a malformed id,
    :class:`~little_es.errors.RunNotFoundError` when the world has no such run,
    an :class:`~little_es.errors.EventLogError` naming the run, the event and
    the field when a stored event cannot be read, and an
    :class:`~little_es.errors.ArtifactError` when a referenced artifact is
    missing or does not hash to its recorded sha256.
    """
    if not isinstance(world, World):
        raise TypeError(f"replay_run needs a World (from open_world()), got {type(world).__name__}")
    state = read_run_state(world, run_id)
    return ReplayResult(run_id=run_id, state=state, artifacts=_hydrate(world, state))


def read_run_state(world: World, run_id: str) -> MaterializedRunState:
    """The state :func:`replay_run` folds from the run's log, without the plan and artifacts.

    Raises what :func:`replay_run` raises for the id and the log.
    """
    validate_run_id(run_id)
    with gc_paused():
        # The decoded events are freed before the collector resumes: alive
        # then, they would all be scanned by its next pass.
        return world.read_run_log_skipping(run_id, COUNTED_ONLY).materialize()


def _hydrate(world: World, state: MaterializedRunState) -> tuple[HydratedArtifact, ...]:
    refs: dict[ArtifactRef, None] = {}
    if state.input_ref is not None:
        refs[state.input_ref] = None
    for step in state.steps.values():
        if step.output_ref is not None:
            refs[step.output_ref] = None
        refs.update(dict.fromkeys(step.artifact_refs))
    if state.output_ref is not None:
        refs[state.output_ref] = None
    return tuple(world.artifacts.get(ref) for ref in refs)

"""What a step function receives: :class:`StepContext`, and the read-only views it hands out.

The run input and the outputs of earlier steps are recorded in the log. If a
step could change them in place, the running process would see data the log
does not hold, and a resumed process (which reads them back from the log)
would behave differently. So the context deep-freezes them (see
:mod:`little_es._frozen`); a step may return frozen values as (part of) its output.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from little_es._frozen import freeze
from little_es.aggregates import StepAggregates
from little_es.errors import AggregateArgumentError
from little_es.ids import validate_run_id
from little_es.workflow.paths import StepPathParts, parse_step_path

__all__ = ["StepContext"]


@dataclass(frozen=True, slots=True)
class StepContext:
    """Everything a step function may read about the run and about its own execution.

    ``input`` is the run input and ``outputs`` maps each completed step id to
    its latest committed output (for a parallel group: a mapping of branch key
    to that branch's output); both are deep-frozen (see the module docstring).
    ``step_path`` names this execution (see :mod:`little_es.workflow.paths`);
    ``step_id``, ``visit``, ``group_id``, ``branch_key`` and ``group_visit`` are
    read from it. ``attempt`` is 1-based and grows only with retries after a
    recorded failure. ``branch_value`` is the value of this parallel branch
    (None outside a branch). ``aggregates`` is the attempt's unit of work over the
    user's eventsourcing aggregates (:mod:`little_es.aggregates`), whose changes are
    committed with the step's ``StepCompleted``.
    """

    run_id: str
    input: Mapping[str, Any]
    outputs: Mapping[str, Any]
    step_path: str
    attempt: int = 1
    branch_value: Any = None
    domain_aggregates: StepAggregates | None = field(default=None, repr=False, compare=False)
    """The engine's unit of work behind :attr:`aggregates` (None: not available here)."""
    _parts: StepPathParts = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        validate_run_id(self.run_id)
        if not isinstance(self.input, Mapping):
            raise TypeError(
                f"StepContext input must be a mapping (the run input), got"
                f" {type(self.input).__name__}"
            )
        if not isinstance(self.outputs, Mapping):
            raise TypeError(
                f"StepContext outputs must be a mapping of step id to output, got"
                f" {type(self.outputs).__name__}"
            )
        attempt = self.attempt
        if not isinstance(attempt, int) or isinstance(attempt, bool) or attempt < 1:
            raise ValueError(f"StepContext attempt must be an integer >= 1, got {attempt!r}")
        parts = parse_step_path(self.step_path)
        if parts.group_id is None and self.branch_value is not None:
            raise ValueError(
                f"step {self.step_path!r} is not inside a parallel branch, so it has no"
                " branch_value: leave it None"
            )
        # Frozen dataclass: the only way to store the derived fields is past __setattr__.
        object.__setattr__(self, "_parts", parts)
        object.__setattr__(self, "input", freeze(self.input))
        object.__setattr__(self, "outputs", freeze(self.outputs))
        object.__setattr__(self, "branch_value", freeze(self.branch_value))

    @property
    def aggregates(self) -> StepAggregates:
        """The step's eventsourcing aggregates: ``get(cls, id)``, ``add(new)``; what the step
        changes is committed with its ``StepCompleted``, exactly once
        (:mod:`little_es.aggregates`).

        Raises :class:`~little_es.errors.AggregateArgumentError` for a context the engine
        did not build for a step attempt (a group's ``branches(ctx)``, a hand-built context).
        """
        if self.domain_aggregates is None:
            raise AggregateArgumentError(
                f"ctx.aggregates is not available to {self.step_path!r} here: only a task,"
                " decision or agent step's code (and an agent's prompt function) changes"
                " aggregates, committed with its StepCompleted; not a parallel group's"
                " branches(ctx) nor a subworkflow step's input(ctx)"
            )
        return self.domain_aggregates

    @property
    def step_id(self) -> str:
        """The id of the step being run (the branch step's id inside a parallel branch)."""
        return self._parts.step_id

    @property
    def visit(self) -> int:
        """Which visit of this step this is, 1-based (decisions jumping back add visits)."""
        return self._parts.visit

    @property
    def group_id(self) -> str | None:
        """The enclosing parallel group's id inside a branch, else None."""
        return self._parts.group_id

    @property
    def branch_key(self) -> str | None:
        """This parallel branch's key inside a branch, else None."""
        return self._parts.branch_key

    @property
    def group_visit(self) -> int:
        """Which visit of the enclosing parallel group this is (1 outside a branch)."""
        return self._parts.group_visit

    @property
    def idempotency_key(self) -> str:
        """``f"{run_id}:{step_path}"``: a key for deduplicating external side effects.

        It is the same for every attempt of this step execution and in every
        process that resumes the run, so a side effect keyed by it (a payment,
        an email, a ticket comment) happens once even when the step runs again
        after a crash or a retry. A later visit (``review@2``) gets a new key.
        """
        return f"{self.run_id}:{self.step_path}"

"""Step paths: the names under which a run records each step execution.

A step path names one visit of one step, in one place of the workflow. It is
what ``StepStarted``/``StepCompleted`` carry, what replay reports, and (with
the run id) the step's idempotency key, so it must be the same in every process
and on every resume. The grammar::

    path   := [group "/"] local
    group  := STEP_ID ["@" VISIT] "[" BRANCH_KEY "]"
    local  := STEP_ID ["@" VISIT]
    VISIT  := an integer >= 2, no leading zeros

    STEP_ID    := [A-Za-z][A-Za-z0-9_-]*
    BRANCH_KEY := [A-Za-z0-9_.-]+

Examples: ``review`` (first visit), ``review@2`` (second visit, after a decision
jumped back), ``check[a.py]/lint`` (the branch step ``lint`` in branch ``a.py``
of the parallel group ``check``), ``check@2[a.py]/lint`` (the same branch in the
group's second visit).

The first visit is written without ``@1``, and ``@1`` is refused when parsing,
so every step execution has exactly one path and ``parse_step_path`` and
:func:`step_path` are inverses. Step ids cannot contain ``[``, ``]``, ``/`` or
``@``, which is why the authoring API restricts them.
"""

from __future__ import annotations

import functools
import re

from pydantic import BaseModel, ConfigDict, model_validator

from little_es.errors import InvalidStepPathError

__all__ = [
    "BRANCH_KEY_PATTERN",
    "STEP_ID_PATTERN",
    "StepPathParts",
    "parse_step_path",
    "step_path",
    "visit_key",
]

STEP_ID_PATTERN = r"[A-Za-z][A-Za-z0-9_-]*"
"""What a step id may look like (no path syntax characters ``[ ] / @``)."""

BRANCH_KEY_PATTERN = r"[A-Za-z0-9_.-]+"
"""What a parallel branch key may look like."""

_STEP_ID_RE = re.compile(STEP_ID_PATTERN)
_BRANCH_KEY_RE = re.compile(BRANCH_KEY_PATTERN)
_PATH_RE = re.compile(
    rf"(?:(?P<group>{STEP_ID_PATTERN})(?:@(?P<group_visit>[1-9][0-9]*))?"
    rf"\[(?P<key>{BRANCH_KEY_PATTERN})\]/)?"
    rf"(?P<step>{STEP_ID_PATTERN})(?:@(?P<visit>[1-9][0-9]*))?"
)


class StepPathParts(BaseModel):
    """The parts of a step path; ``group_id``/``branch_key`` are set only inside a parallel branch.

    ``visit`` is the step's own visit (1-based); ``group_visit`` is the visit of
    the enclosing parallel group, always 1 outside a branch.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    step_id: str
    visit: int = 1
    group_id: str | None = None
    branch_key: str | None = None
    group_visit: int = 1

    @model_validator(mode="after")
    def _spellable(self) -> StepPathParts:
        self.path  # noqa: B018  (building the path is the validation)
        return self

    @property
    def path(self) -> str:
        """The step path these parts spell (the inverse of :func:`parse_step_path`)."""
        return step_path(
            self.step_id,
            visit=self.visit,
            group_id=self.group_id,
            branch_key=self.branch_key,
            group_visit=self.group_visit,
        )

    @property
    def branch_path(self) -> str:
        """``group_id[branch_key]`` inside a parallel branch, ``""`` at the top level.

        Visit counters are left out: it names the place, not the visit.
        """
        if self.group_id is None:
            return ""
        return f"{self.group_id}[{self.branch_key}]"


def _check_visit(value: object, label: str) -> int:
    # bool is an int subclass; True as a visit number is always a caller bug.
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InvalidStepPathError(f"{label} must be an integer >= 1 (1-based), got {value!r}")
    return value


def _check_step_id(value: object, label: str) -> str:
    if not isinstance(value, str) or _STEP_ID_RE.fullmatch(value) is None:
        raise InvalidStepPathError(
            f"{label} {value!r} is not a valid step id: use a letter followed by letters,"
            " digits, '_' or '-'"
        )
    return value


def step_path(
    step_id: str,
    *,
    visit: int = 1,
    group_id: str | None = None,
    branch_key: str | None = None,
    group_visit: int = 1,
) -> str:
    """Build the step path of one step execution.

    >>> step_path("review"), step_path("review", visit=2)
    ('review', 'review@2')
    >>> step_path("lint", group_id="check", branch_key="a.py", group_visit=2)
    'check@2[a.py]/lint'

    Give ``group_id`` and ``branch_key`` together for a step inside a parallel
    branch, neither at the top level. Raises :class:`InvalidStepPathError` for
    parts the grammar cannot spell.
    """
    _check_step_id(step_id, "step id")
    _check_visit(visit, "visit")
    _check_visit(group_visit, "group_visit")
    local = step_id if visit == 1 else f"{step_id}@{visit}"
    if group_id is None and branch_key is None:
        if group_visit != 1:
            raise InvalidStepPathError(
                f"group_visit={group_visit} given for top-level step {step_id!r}: pass"
                " group_id and branch_key too, or leave group_visit at 1"
            )
        return local
    if group_id is None or branch_key is None:
        raise InvalidStepPathError(
            f"step {step_id!r}: group_id and branch_key go together (a step inside a parallel"
            f" branch needs both), got group_id={group_id!r}, branch_key={branch_key!r}"
        )
    _check_step_id(group_id, "group id")
    if not isinstance(branch_key, str) or _BRANCH_KEY_RE.fullmatch(branch_key) is None:
        raise InvalidStepPathError(
            f"branch key {branch_key!r} is not valid: use letters, digits, '_', '.' or '-'"
        )
    group = group_id if group_visit == 1 else f"{group_id}@{group_visit}"
    return f"{group}[{branch_key}]/{local}"


def parse_step_path(path: str) -> StepPathParts:
    """Split a step path into its parts; ``parse_step_path(p).path == p`` for every valid ``p``.

    Raises :class:`InvalidStepPathError` when ``path`` does not follow the
    grammar in this module's docstring, including a non-canonical ``@1``.
    """
    if not isinstance(path, str):
        raise InvalidStepPathError(f"a step path must be a string, got {type(path).__name__}")
    return _parse(path)


@functools.lru_cache(maxsize=128)
def _parse(path: str) -> StepPathParts:
    # Cached: a step's path is parsed for its context and again when its StepCompleted is
    # folded (its visit counter), some 5 us each; the two are a few steps apart at most, so
    # a small cache serves them (each entry is ~800 B, kept after the run). The parts are
    # frozen, so one instance can be handed out twice; a path that is refused raises each
    # time (nothing is cached).
    match = _PATH_RE.fullmatch(path)
    if match is None:
        raise InvalidStepPathError(
            f"{path!r} is not a step path: expected 'step', 'step@N', 'group[key]/step' or"
            " 'group@N[key]/step' with N >= 2"
        )
    visit = int(match["visit"] or 1)
    group_visit = int(match["group_visit"] or 1)
    if match["visit"] == "1" or match["group_visit"] == "1":
        raise InvalidStepPathError(
            f"{path!r} is not canonical: the first visit is written without '@1'"
        )
    return StepPathParts(
        step_id=match["step"],
        visit=visit,
        group_id=match["group"],
        branch_key=match["key"],
        group_visit=group_visit,
    )


def visit_key(path: str) -> tuple[str, str]:
    """The ``(step_id, branch_path)`` pair under which visits of a step are counted.

    All visit counters are dropped, so every visit of the same step in the same
    place shares a key: ``visit_key("review@3") == ("review", "")`` and
    ``visit_key("check@2[a.py]/lint") == ("lint", "check[a.py]")``.
    """
    parts = parse_step_path(path)
    return parts.step_id, parts.branch_path

"""``diff_runs``: what two runs did differently, step by step (``little diff RUN_A RUN_B``).

Made for two runs of one workflow (yesterday's and today's, before and after a
prompt change) and for a fork against its origin. Each run is folded from its
own log by the one reducer, as ``replay_run`` folds it; the harness sessions
are read for the tool calls. Per step path (in the order the steps first ran
in either run): the status in each run, a structural diff of the outputs (the
JSON path of each value that differs), the model calls with their tokens and
dollars, and the tool calls. Read-only, like replay.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal
from uuid import UUID

from pydantic import BaseModel, ConfigDict

from little_es.durability import read_output
from little_es.events import StepStarted, ToolCallFailed, ToolCallStarted, ToolCallSucceeded
from little_es.ids import validate_run_id
from little_es.materialize import MaterializedRunState
from little_es.values import JSONValue, UsageTotals
from little_es.world import World

__all__ = ["JsonChange", "RunDiff", "StepDiff", "ToolCallSummary", "diff_runs", "json_diff"]

_MAX_CHANGES = 200


class JsonChange(BaseModel):
    """One difference between two JSON values, at ``path`` (``$.files[2].name``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    path: str
    kind: Literal["changed", "added", "removed"]
    """``added``: only in B; ``removed``: only in A; ``changed``: in both, different."""
    a: JSONValue = None
    b: JSONValue = None


class ToolCallSummary(BaseModel):
    """One tool call of a step: its name, arguments and whether it succeeded."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    args: dict[str, JSONValue]
    ok: bool | None
    """None: in flight (no result recorded)."""


class StepDiff(BaseModel):
    """One step path in both runs (a status of None: the run has no such step)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    step_path: str
    status_a: str | None
    status_b: str | None
    output_changes: tuple[JsonChange, ...] = ()
    usage_a: UsageTotals = UsageTotals()
    usage_b: UsageTotals = UsageTotals()
    tool_calls_a: tuple[ToolCallSummary, ...] = ()
    tool_calls_b: tuple[ToolCallSummary, ...] = ()

    @property
    def same(self) -> bool:
        """Same status, output, model-call count and tokens, and the same tool calls."""
        return (
            self.status_a == self.status_b
            and not self.output_changes
            and _calls_and_tokens(self.usage_a) == _calls_and_tokens(self.usage_b)
            and self.tool_calls_a == self.tool_calls_b
        )


class RunDiff(BaseModel):
    """What :func:`diff_runs` returns: the two runs side by side, and their steps."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    run_a: str
    run_b: str
    workflow_a: str | None
    workflow_b: str | None
    status_a: str
    status_b: str
    output_changes: tuple[JsonChange, ...]
    usage_a: UsageTotals
    usage_b: UsageTotals
    steps: tuple[StepDiff, ...]

    @property
    def same(self) -> bool:
        """Whether the runs did the same: status, output and every step."""
        return (
            self.status_a == self.status_b
            and not self.output_changes
            and all(s.same for s in self.steps)
        )


def _calls_and_tokens(u: UsageTotals) -> tuple[int, int, int]:
    return u.calls, u.input_tokens, u.output_tokens


def _key(path: str, key: str) -> str:
    return f"{path}.{key}" if key.isidentifier() else f"{path}[{key!r}]"


def json_diff(a: Any, b: Any, path: str = "$", limit: int = _MAX_CHANGES) -> list[JsonChange]:
    """The differences between two JSON values, object keys and array items compared one by
    one (at most ``limit``; objects' keys in A's order, then B's new ones)."""
    changes: list[JsonChange] = []

    def walk(x: Any, y: Any, at: str) -> None:
        if len(changes) >= limit:
            return
        if isinstance(x, Mapping) and isinstance(y, Mapping):
            for key in x:
                if key in y:
                    walk(x[key], y[key], _key(at, str(key)))
                else:
                    changes.append(JsonChange(path=_key(at, str(key)), kind="removed", a=x[key]))
            for key in y:
                if key not in x:
                    changes.append(JsonChange(path=_key(at, str(key)), kind="added", b=y[key]))
            return
        if _is_array(x) and _is_array(y):
            for i in range(max(len(x), len(y))):
                where = f"{at}[{i}]"
                if i >= len(y):
                    changes.append(JsonChange(path=where, kind="removed", a=x[i]))
                elif i >= len(x):
                    changes.append(JsonChange(path=where, kind="added", b=y[i]))
                else:
                    walk(x[i], y[i], where)
            return
        if x != y or type(x) is not type(y):
            changes.append(JsonChange(path=at, kind="changed", a=x, b=y))

    walk(a, b, path)
    return changes[:limit]


def _is_array(value: Any) -> bool:
    return isinstance(value, Sequence) and not isinstance(value, str | bytes)


def _read(
    world: World, run_id: str
) -> tuple[MaterializedRunState, dict[str, list[ToolCallSummary]]]:
    validate_run_id(run_id)
    read = world.read_run_log_skipping(run_id, frozenset())
    log, state = read.events, read.materialize()
    step_of: dict[UUID, str] = {
        e.session_id: e.step_path
        for e in log
        if isinstance(e, StepStarted) and e.session_id is not None
    }
    starts: dict[tuple[UUID, str], ToolCallStarted] = {}
    results: dict[tuple[UUID, str], bool] = {}
    for e in log:
        if isinstance(e, ToolCallStarted):
            starts[(e.originator_id, e.call_id)] = e
        elif isinstance(e, ToolCallSucceeded | ToolCallFailed):
            results[(e.originator_id, e.call_id)] = isinstance(e, ToolCallSucceeded)
    calls: dict[str, list[ToolCallSummary]] = {}
    for key, started in starts.items():
        path = step_of.get(key[0])
        if path is not None:
            calls.setdefault(path, []).append(
                ToolCallSummary(name=started.name, args=dict(started.args), ok=results.get(key))
            )
    return state, calls


def _output(world: World, state: MaterializedRunState, path: str | None) -> Any:
    if path is None:
        return read_output(world, state.output, state.output_ref)
    step = state.steps.get(path)
    if step is None or step.status != "completed":
        return None
    return read_output(world, step.output, step.output_ref)


def diff_runs(world: World, run_a: str, run_b: str) -> RunDiff:
    """Compare run ``run_a`` with run ``run_b`` of ``world``, step by step (see the module).

    Raises :class:`~little_es.errors.InvalidRunIdError` or
    :class:`~little_es.errors.RunNotFoundError` for either id, and what
    ``replay_run`` raises for a log that cannot be read; :class:`TypeError` for a ``world``
    that is not a :class:`~little_es.world.World`.
    """
    if not isinstance(world, World):
        raise TypeError(f"diff_runs needs a World (from open_world()), got {type(world).__name__}")
    state_a, calls_a = _read(world, run_a)
    state_b, calls_b = _read(world, run_b)
    paths = list(dict.fromkeys([*state_a.steps, *state_b.steps]))
    steps = []
    for path in paths:
        a, b = state_a.steps.get(path), state_b.steps.get(path)
        steps.append(
            StepDiff(
                step_path=path,
                status_a=a.status if a is not None else None,
                status_b=b.status if b is not None else None,
                # A step only one run has differs by its status, not as an output of null.
                output_changes=(
                    tuple(json_diff(_output(world, state_a, path), _output(world, state_b, path)))
                    if a is not None and b is not None
                    else ()
                ),
                usage_a=a.usage if a is not None else UsageTotals(),
                usage_b=b.usage if b is not None else UsageTotals(),
                tool_calls_a=tuple(calls_a.get(path, ())),
                tool_calls_b=tuple(calls_b.get(path, ())),
            )
        )
    return RunDiff(
        run_a=run_a,
        run_b=run_b,
        workflow_a=state_a.workflow_id,
        workflow_b=state_b.workflow_id,
        status_a=state_a.status,
        status_b=state_b.status,
        output_changes=tuple(
            json_diff(_output(world, state_a, None), _output(world, state_b, None))
        ),
        usage_a=state_a.usage,
        usage_b=state_b.usage,
        steps=tuple(steps),
    )

"""What is written can always be read: the recorder refuses what a reader could not read back.

Every path that records a value (run input, step output, tool arguments and results, model
responses, events of your own) refuses NaN, infinities, integers outside ``JSON_INT_RANGE``,
values nested deeper than ``MAX_JSON_DEPTH`` and objects pydantic did not validate
(``model_construct``), naming the field, with nothing unreadable appended; and whatever is
accepted reads back equal through ``replay_run`` and the decoded log.
"""

from __future__ import annotations

import asyncio
import enum
import math
from collections import deque
from collections.abc import Callable
from decimal import Decimal
from typing import Any, ClassVar

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from little_es import (
    MAX_JSON_DEPTH,
    ArtifactMismatchError,
    EventPayloadError,
    ModelRequest,
    ModelResponse,
    RunEvent,
    RunFailedError,
    StepCompleted,
    StepFailed,
    ToolCall,
    ToolCallFailed,
    ToolCallStarted,
    ToolCallSucceeded,
    Usage,
    Workflow,
    World,
    agent,
    local_world,
    memory_world,
    replay_run,
    run_workflow,
    task,
    tool,
)
from little_es._strict import JSON_INT_RANGE, has_long_digit_run, nests_deeper
from little_es.events import ModelResponded, RunStarted
from little_es.ids import run_stream_id
from tests.conftest import WorldSpec


def nested(levels: int, leaf: Any = 1) -> Any:
    value = leaf
    for _ in range(levels):
        value = [value]
    return value


def run(world: World, steps: list[Any], run_id: str, input: Any = None) -> Any:
    wf = Workflow(f"wf_{run_id}", version="1", steps=steps)
    return asyncio.run(run_workflow(world, wf, input or {}, run_id=run_id))


def rows(world: World, run_id: str) -> int:
    return len(world.select_stored(run_stream_id(run_id)))


class FixedModel:
    """A model that answers each turn with the next of ``answers`` (built by the test)."""

    provider = "fixed"
    model_id = "fixed-1"

    def __init__(self, answers: list[Callable[[], ModelResponse]]) -> None:
        self.answers = answers
        self.calls = 0

    async def complete(self, request: ModelRequest) -> ModelResponse:
        answer = self.answers[min(self.calls, len(self.answers) - 1)]
        self.calls += 1
        return answer()


def done() -> ModelResponse:
    return ModelResponse(content="done", provider="fixed", model="fixed-1")


# ------------------------------------------------------------------ the depth limit


def test_orjson_parses_exactly_1024_levels_which_the_depth_check_relies_on() -> None:
    orjson.loads(b"[" * 1024 + b"]" * 1024)
    with pytest.raises(orjson.JSONDecodeError):
        orjson.loads(b"[" * 1025 + b"]" * 1025)


@pytest.mark.parametrize("depth", [1, 2, 63, 64, 65, 100, 500, 1100])
def test_nests_deeper_is_exact_and_not_fooled_by_brackets_in_strings(depth: int) -> None:
    # Innermost an object whose string holds brackets (which do not nest).
    data = b"[" * (depth - 1) + b'{"k":"[[[[{{{{]]"}' + b"]" * (depth - 1)
    assert nests_deeper(data) is (depth > MAX_JSON_DEPTH)


@pytest.mark.parametrize("levels", [MAX_JSON_DEPTH + 1, 250, 300])
def test_an_output_nested_too_deep_is_a_step_failure_and_the_log_stays_readable(
    world: World, levels: int
) -> None:
    with pytest.raises(RunFailedError, match="nests deeper than 64"):
        run(world, [task("deep", lambda ctx: nested(levels))], "run_deep")
    log = world.read_run_log("run_deep")
    failed = [e for e in log if isinstance(e, StepFailed)]
    assert failed and failed[0].error.type == "EventPayloadError"
    assert replay_run(world, "run_deep").state.status == "failed"


def test_an_output_nested_exactly_to_the_limit_reads_back() -> None:
    world = memory_world()
    result = run(world, [task("deep", lambda ctx: nested(MAX_JSON_DEPTH))], "run_at_limit")
    assert result.output == nested(MAX_JSON_DEPTH)
    assert replay_run(world, "run_at_limit").steps[0].output == nested(MAX_JSON_DEPTH)
    # And a resume folds it again (the RecursionError of issue 13 was here).
    assert run(world, [task("deep", lambda ctx: nested(MAX_JSON_DEPTH))], "run_at_limit").resumed


def test_a_snapshot_of_a_run_holding_a_value_at_the_limit_is_recorded(tmp_path: Any) -> None:
    # The snapshot nests the value inside the run's state, deeper than the limit of values.
    with local_world(tmp_path / "w") as world:
        run(world, [task("deep", lambda ctx: nested(MAX_JSON_DEPTH))], "run_snap")
        loaded = world.load_run("run_snap")
        world._snapshot(loaded)  # framed and stored as World.save stores one
    with local_world(tmp_path / "w") as world:
        decoded: list[str] = []
        real = world._mapper.decode_payload

        def decode(stream_id: Any, version: int, topic: str, data: bytes) -> Any:
            decoded.append(topic)
            return real(stream_id, version, topic, data)

        world._mapper.decode_payload = decode  # type: ignore[method-assign]
        assert world.load_run("run_snap").fold.steps["deep"].output == nested(MAX_JSON_DEPTH)
        # The step's output is read from its StepCompleted (a snapshot names it); the run's
        # output, the same value, is nested inside the snapshot.
        assert decoded == ["little_es.snapshot", "StepCompleted"], "not loaded from the snapshot"
        assert world.load_run("run_snap").fold.output == nested(MAX_JSON_DEPTH)


# ------------------------------------------------------------------ NaN and infinities


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_non_finite_run_input_is_refused_before_anything_is_written(bad: float) -> None:
    world = memory_world()
    with pytest.raises(EventPayloadError, match=r"the run input\.x\.0 is"):
        run(world, [task("a", lambda ctx: 1)], "run_nan_in", {"x": [bad]})
    assert not world.run_exists("run_nan_in")


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_non_finite_step_output_is_refused_naming_the_field(bad: float) -> None:
    world = memory_world()
    with pytest.raises(RunFailedError, match=r"step 'a' output\.score is"):
        run(world, [task("a", lambda ctx: {"score": bad})], "run_nan_out")
    assert not any(isinstance(e, StepCompleted) for e in world.read_run_log("run_nan_out"))


def test_a_non_finite_tool_result_is_the_calls_failure_shown_to_the_model() -> None:
    @tool
    def measure() -> dict[str, float]:
        """Measure."""
        return {"ratio": math.inf}

    def call_measure() -> ModelResponse:
        return ModelResponse(
            tool_calls=(ToolCall(id="c1", name="measure"),), provider="fixed", model="fixed-1"
        )

    model = FixedModel([call_measure, done])
    world = memory_world()
    run(world, [agent("ask", model=model, tools=[measure], prompt="go")], "run_tool_inf")
    failed = [e for e in world.read_run_log("run_tool_inf") if isinstance(e, ToolCallFailed)]
    assert len(failed) == 1
    assert failed[0].error.type == "EventPayloadError"
    assert "tool 'measure' result.ratio is inf" in failed[0].error.message


def test_a_non_finite_argument_from_the_model_is_refused_when_recorded() -> None:
    @tool
    def look(x: float) -> str:
        """Look."""
        return "seen"

    def nan_args() -> ModelResponse:
        return ModelResponse(
            tool_calls=(ToolCall(id="c1", name="look", arguments={"x": math.nan}),),
            provider="fixed",
            model="fixed-1",
        )

    world = memory_world()
    step = agent("ask", model=FixedModel([nan_args]), tools=[look], prompt="go")
    with pytest.raises(RunFailedError, match=r"tool_calls\.0\.arguments\.x is nan"):
        run(world, [step], "run_args_nan")
    replay_run(world, "run_args_nan")
    assert not any(isinstance(e, ToolCallStarted) for e in world.read_run_log("run_args_nan"))


class Scored(RunEvent):
    wire_name: ClassVar[str] = "test.strict.scored"

    score: float
    detail: dict[str, Any] = {}


def test_a_non_finite_field_of_your_own_event_is_refused() -> None:
    world = memory_world()
    run(world, [task("a", lambda ctx: 1)], "run_own")
    before = rows(world, "run_own")
    with pytest.raises(EventPayloadError, match="score"):
        world.record_run_event("run_own", Scored, score=math.nan)
    with pytest.raises(EventPayloadError, match=r"detail\.deep\.0 is -inf"):
        world.record_run_event("run_own", Scored, score=1.0, detail={"deep": [-math.inf]})
    assert rows(world, "run_own") == before
    world.record_run_event("run_own", Scored, score=0.5, detail={"ok": [1.5]})
    assert replay_run(world, "run_own").state.event_count == before + 1


# ------------------------------------------------------------------ integers


def test_the_integer_range_is_orjsons_which_reads_hashes_and_prints_values() -> None:
    least, greatest = JSON_INT_RANGE
    for n in (least, greatest):
        assert orjson.loads(orjson.dumps(n)) == n
    for n in (least - 1, greatest + 1):
        with pytest.raises(TypeError):
            orjson.dumps(n)


@pytest.mark.parametrize(
    ("data", "long"),
    [
        (b'{"n":123456789012345678}', False),
        (b'{"n":1234567890123456789}', True),
        (b'{"n":-9223372036854775809,"s":"x"}', True),
        (b'{"a":1234567890,"b":1234567890}', False),
        (b'"1234567890 1234567890"', False),
        (b"", False),
    ],
)
def test_a_run_of_nineteen_digits_is_found_in_the_bytes(data: bytes, long: bool) -> None:
    assert has_long_digit_run(data) is long


@pytest.mark.parametrize(
    "bad", [JSON_INT_RANGE[1] + 1, JSON_INT_RANGE[0] - 1, 10**5000], ids=["over", "under", "huge"]
)
def test_an_integer_outside_the_range_is_refused_naming_the_field(bad: int) -> None:
    world = memory_world()
    with pytest.raises(RunFailedError, match=r"step 'a' output\.n\.0 is an integer of \d+ bits"):
        run(world, [task("a", lambda ctx: {"n": [bad]})], "run_big_out")
    assert not any(isinstance(e, StepCompleted) for e in world.read_run_log("run_big_out"))
    with pytest.raises(EventPayloadError, match=r"the run input\.n is an integer"):
        run(world, [task("a", lambda ctx: 1)], "run_big_in", {"n": bad})
    assert not world.run_exists("run_big_in")
    before = rows(world, "run_big_out")
    with pytest.raises(EventPayloadError, match=r"detail\.n is an integer .* send it as a string"):
        world.record_run_event("run_big_out", Scored, score=1.0, detail={"n": bad})
    assert rows(world, "run_big_out") == before
    replay_run(world, "run_big_out")


def test_the_integers_at_the_ends_of_the_range_are_recorded_and_read_back() -> None:
    world = memory_world()
    ends = list(JSON_INT_RANGE)
    result = run(world, [task("a", lambda ctx: {"n": ends})], "run_ends", {"n": ends})
    assert result.output == {"n": ends}
    world.record_run_event("run_ends", Scored, score=1.0, detail={"n": ends})
    replayed = replay_run(world, "run_ends")
    assert replayed.input == {"n": ends} and replayed.steps[0].output == {"n": ends}
    noted = next(e for e in world.read_run_log("run_ends") if isinstance(e, Scored))
    assert noted.detail == {"n": ends}


def test_a_huge_integer_in_the_models_arguments_is_refused_before_its_response_is_recorded() -> (
    None
):
    @tool
    def look(n: int) -> str:
        """Look."""
        return "seen"

    def huge_args() -> ModelResponse:
        return ModelResponse(
            tool_calls=(ToolCall(id="c1", name="look", arguments={"n": 2**70}),),
            provider="fixed",
            model="fixed-1",
        )

    world = memory_world()
    step = agent("ask", model=FixedModel([huge_args]), tools=[look], prompt="go")
    with pytest.raises(RunFailedError, match=r"tool_calls\.0\.arguments\.n is an integer of 71"):
        run(world, [step], "run_args_big")
    replay_run(world, "run_args_big")
    log = world.read_run_log("run_args_big")
    assert not any(isinstance(e, ModelResponded | ToolCallStarted) for e in log)


# ------------------------------------------------------------------ JSON data


@pytest.mark.parametrize(
    ("bad", "said"),
    [
        ({1: "int", "1": "str"}, "value has the key 1, a int"),  # pydantic wrote both as "1"
        ({None: 1}, "value has the key None"),
        ({"price": Decimal("1.10")}, r"value\.price is a Decimal"),
        ({"tags": {"a", "b"}}, r"value\.tags is a set"),
        ({"raw": b"x"}, r"value\.raw is a bytes"),
    ],
    ids=["int-key", "none-key", "decimal", "set", "bytes"],
)
def test_a_value_of_your_own_event_that_is_not_json_data_is_refused(bad: Any, said: str) -> None:
    world = memory_world()
    run(world, [task("a", lambda ctx: 1)], "run_not_json")
    before = rows(world, "run_not_json")
    # A field typed dict[str, ...] has pydantic refuse the keys; one typed Any, nothing did.
    with pytest.raises(EventPayloadError, match=said):
        world.record_run_event("run_not_json", Noted, value=bad)
    assert rows(world, "run_not_json") == before
    # What JSON reads back on purpose otherwise (a tuple as a list, a model as an object),
    # and what orjson alone refuses but pydantic writes as it is (a str subclass as a key).
    kind = enum.StrEnum("Kind", ["a"])
    world.record_run_event(
        "run_not_json",
        Noted,
        value={"t": (1, 2), "who": Person(name="ops"), "by": {kind.a: deque([1])}},
    )
    assert replay_run(world, "run_not_json").state.event_count == before + 1


def test_tool_arguments_that_are_not_json_data_are_refused_before_the_tool_runs() -> None:
    ran: list[Any] = []

    @tool
    def look(cfg: dict[str, str]) -> str:
        """Look."""
        ran.append(cfg)
        return "seen"

    def int_keys() -> ModelResponse:
        call = ToolCall(id="c1", name="look", arguments={"cfg": {1: "int", "1": "str"}})
        return ModelResponse(tool_calls=(call,), provider="fixed", model="fixed-1")

    world = memory_world()
    step = agent("ask", model=FixedModel([int_keys]), tools=[look], prompt="go")
    with pytest.raises(RunFailedError, match=r"tool_calls\.0\.arguments\.cfg has the key 1"):
        run(world, [step], "run_args_keys")
    assert ran == []
    log = world.read_run_log("run_args_keys")
    assert not any(isinstance(e, ModelResponded | ToolCallStarted) for e in log)


class Person(BaseModel):
    name: str


class Approved(RunEvent):
    wire_name: ClassVar[str] = "test.strict.approved"

    by: Person


def test_an_unvalidated_model_of_your_own_in_your_event_is_refused() -> None:
    world = memory_world()
    run(world, [task("a", lambda ctx: 1)], "run_approved")
    before = rows(world, "run_approved")
    with pytest.raises(EventPayloadError, match=r"by\.name: Field required"):
        world.record_run_event("run_approved", Approved, by=Person.model_construct())
    assert rows(world, "run_approved") == before
    world.record_run_event("run_approved", Approved, by=Person(name="ops"))
    assert replay_run(world, "run_approved").state.event_count == before + 1


# ------------------------------------------------------------------ model_construct


def _agent_answering(answer: Callable[[], ModelResponse]) -> Any:
    return agent("ask", model=FixedModel([answer]), prompt="go")


@pytest.mark.parametrize(
    ("answer", "match"),
    [
        (
            lambda: ModelResponse.model_construct(content="hi", provider="fixed"),
            r"response\.model: Field required",
        ),
        (
            lambda: ModelResponse.model_construct(
                tool_calls=(ToolCall(id="c", name="t"), ToolCall(id="c", name="t")),
                provider="fixed",
                model="fixed-1",
            ),
            "tool call ids must be unique",
        ),
        (
            lambda: ModelResponse(
                content="hi",
                usage=Usage.model_construct(input_tokens=3, cost_usd=0.25),
                provider="fixed",
                model="fixed-1",
            ),
            r"response\.usage: usage must not carry a cost \(cost_usd\)",
        ),
        (
            lambda: ModelResponse.model_construct(
                content="hi",
                usage={"input_tokens": 3, "cost_usd": 0.25},
                provider="fixed",
                model="fixed-1",
            ),
            r"usage must not carry a cost \(cost_usd\)",
        ),
        (
            lambda: ModelResponse(content="hi", provider="fixed", model="fixed-1").model_copy(
                update={"model": ""}
            ),
            r"response\.model: String should have at least 1 character",
        ),
    ],
    ids=["missing model", "duplicate call ids", "smuggled cost", "cost in a dict", "model_copy"],
)
def test_an_unvalidated_model_response_is_refused_and_the_run_stays_readable(
    world: World, answer: Callable[[], ModelResponse], match: str
) -> None:
    with pytest.raises(RunFailedError, match=match):
        run(world, [_agent_answering(answer)], "run_constructed")
    log = world.read_run_log("run_constructed")
    assert not any(isinstance(e, ModelResponded) for e in log)
    assert replay_run(world, "run_constructed").state.status == "failed"


class RichResponse(ModelResponse):
    raw: str = ""


def test_a_response_of_a_subclass_whose_fields_would_be_dropped_is_refused() -> None:
    world = memory_world()

    def rich() -> ModelResponse:
        return RichResponse(content="hi", provider="fixed", model="fixed-1", raw="{...}")

    with pytest.raises(RunFailedError, match=r"response is a RichResponse, whose fields raw"):
        run(world, [_agent_answering(rich)], "run_rich")
    assert not any(isinstance(e, ModelResponded) for e in world.read_run_log("run_rich"))


def test_a_validated_copy_and_a_plain_response_are_recorded() -> None:
    world = memory_world()

    def copied() -> ModelResponse:
        return ModelResponse.model_validate(
            ModelResponse(content="hi", provider="fixed", model="fixed-1").model_dump()
        )

    run(world, [_agent_answering(copied)], "run_fine")
    assert replay_run(world, "run_fine").state.status == "completed"


def test_the_unchecked_mark_is_not_a_field() -> None:
    made = Usage.model_construct(input_tokens=1, cost_usd=0.5)
    assert made == Usage(input_tokens=1)
    assert made.model_dump() == Usage(input_tokens=1).model_dump()
    assert "cost_usd" not in made.model_dump_json()


# ------------------------------------------------------------------ large inputs


def test_a_large_run_input_is_stored_as_an_artifact_and_hydrated(
    world_factory: Callable[[], World], world_spec: WorldSpec
) -> None:
    big = {"blob": "x" * 200_000, "n": 1}
    steps = [task("size", lambda ctx: len(ctx.input["blob"]))]
    world = world_factory()
    result = run(world, steps, "run_big", big)
    assert result.output == 200_000
    started = world.select_stored(run_stream_id("run_big"))[0]
    assert len(started.state) < 2_000
    replayed = replay_run(world, "run_big")
    assert replayed.state.input is None and replayed.state.input_ref is not None
    assert replayed.input == big
    assert replayed.state.input_ref in [a.manifest for a in replayed.artifacts]
    assert result.state == replayed.state
    event = world.read_run_log("run_big")[0]
    assert isinstance(event, RunStarted) and event.input_ref is not None
    again = run(world_factory() if world_spec.persistent else world, steps, "run_big", big)
    assert again.resumed and again.output == 200_000


def test_a_large_input_whose_artifact_is_lost_is_refused_on_resume(tmp_path: Any) -> None:
    big = {"blob": "y" * 100_000}
    steps = [task("one", lambda ctx: 1), task("two", lambda ctx: ctx.input["blob"][:3])]
    with local_world(tmp_path / "w") as world:
        run(world, steps[:1], "run_lost", big)
        ref = replay_run(world, "run_lost").state.input_ref
        assert ref is not None
    for path in (tmp_path / "w" / "artifacts").rglob("*"):
        if path.is_file():
            path.write_bytes(b"changed")
    with local_world(tmp_path / "w") as world, pytest.raises(ArtifactMismatchError, match="input"):
        run(world, steps[:1], "run_lost", big)


# ------------------------------------------------------------------ every path, random values

_finite = st.floats(allow_nan=False, allow_infinity=False)
_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=JSON_INT_RANGE[0], max_value=JSON_INT_RANGE[1])
    | _finite
    | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=12,
)
_bad_leaf = st.sampled_from(
    [
        math.nan,
        math.inf,
        -math.inf,
        nested(MAX_JSON_DEPTH + 1),
        JSON_INT_RANGE[1] + 1,
        JSON_INT_RANGE[0] - 1,
        10**5000,
    ]
)


_PATHS = ["input", "output", "model response", "tool result", "event"]


class Noted(RunEvent):
    wire_name: ClassVar[str] = "test.strict.noted"

    value: Any = None


def _through_every_path(value: Any, bad: Any = None, bad_path: str | None = None) -> None:
    """Record ``value`` as the run input, a step output, tool arguments (in the model's
    response) and result, and a field of an event of our own, then read it all back.

    ``bad`` goes instead into ``bad_path``, which must refuse it with EventPayloadError,
    recording nothing unreadable.
    """
    world = memory_world()

    def at(path: str) -> Any:
        return bad if path == bad_path else value

    @tool
    def echo(v: Any = None) -> Any:
        """Echo."""
        return at("tool result")

    def call_echo() -> ModelResponse:
        return ModelResponse(
            tool_calls=(ToolCall(id="c1", name="echo", arguments={"v": at("model response")}),),
            provider="fixed",
            model="fixed-1",
        )

    steps = [
        task("out", lambda ctx: at("output")),
        agent("ask", model=FixedModel([call_echo, done]), tools=[echo], prompt="go"),
    ]
    normal = orjson.loads(orjson.dumps(value))
    if bad_path == "input":
        with pytest.raises(EventPayloadError, match="the run input"):
            run(world, steps, "run_prop", {"v": at("input")})
        assert not world.run_exists("run_prop")
        return
    if bad_path in ("output", "model response"):
        with pytest.raises(RunFailedError, match="EventPayloadError"):
            run(world, steps, "run_prop", {"v": value})
        assert replay_run(world, "run_prop").state.status == "failed"
        assert world.read_run_log("run_prop")
        return
    result = run(world, steps, "run_prop", {"v": value})
    replayed = replay_run(world, "run_prop")
    assert replayed.input == {"v": normal}
    assert replayed.steps[0].output == normal
    assert result.state == replayed.state
    log = world.read_run_log("run_prop")
    assert next(e for e in log if isinstance(e, ToolCallStarted)).args == {"v": normal}
    responded = next(e for e in log if isinstance(e, ModelResponded))
    assert responded.response.tool_calls[0].arguments == {"v": normal}
    if bad_path == "tool result":
        failed = next(e for e in log if isinstance(e, ToolCallFailed))
        assert failed.error.type == "EventPayloadError"
    else:
        assert next(e for e in log if isinstance(e, ToolCallSucceeded)).result == normal
    count = replayed.state.event_count
    if bad_path == "event":
        with pytest.raises(EventPayloadError):
            world.record_run_event("run_prop", Noted, value=bad)
        assert replay_run(world, "run_prop").state.event_count == count
        return
    world.record_run_event("run_prop", Noted, value=value)
    noted = [e for e in world.read_run_log("run_prop") if isinstance(e, Noted)]
    assert noted[0].value == normal
    assert replay_run(world, "run_prop").state.event_count == count + 1


_fast = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_fast
@given(_json)
def test_random_json_values_read_back_through_every_path(value: Any) -> None:
    _through_every_path(value)


@_fast
@given(_json, _bad_leaf, st.booleans(), st.sampled_from(_PATHS))
def test_nan_infinity_or_too_deep_is_refused_on_every_path(
    value: Any, leaf: Any, inside: bool, path: str
) -> None:
    bad = {"v": value, "bad": [leaf]} if inside else leaf
    _through_every_path(value, bad, path)


_SNAPSHOT_TS = b'"2024-01-01T00:00:00Z"'


@pytest.mark.parametrize(
    "state",
    [
        b'{"steps":{"a":{"output":{"x":[1,2]}}},"event_count":3}',
        b'{"steps":{"a":NaN},"n":Infinity}',
        b"[1]",
        b'{"steps":[1,{"a":2}],"n":null}',
        b'{"s":' + b"[" * 300 + b"]" * 300 + b"}",
        b'{"s":{"a":' + b"[" * 250 + b"]" * 250 + b"}}",
        b'{"s":"\\ud800"}',
        b'{"s":{"a":123456789012345678901234567890,"a":1e400}}',
        b'{"s":{"a":1}',
    ],
)
def test_a_snapshot_payload_is_refused_exactly_as_a_snapshot_reader_refuses_it(
    state: bytes,
) -> None:
    from pydantic import ValidationError

    from little_es._strict import check_snapshot_payload
    from little_es.errors import EventPayloadError
    from little_es.events import Snapshot

    data = b'{"aggregate":"Run","timestamp":' + _SNAPSHOT_TS + b',"state":' + state + b"}"
    snapshot = Snapshot.model_construct(aggregate="Run", state={})
    try:
        Snapshot.model_validate_json(data)
    except ValidationError:
        with pytest.raises(EventPayloadError, match="would not read back"):
            check_snapshot_payload(snapshot, "little_es.snapshot", data)
    else:
        check_snapshot_payload(snapshot, "little_es.snapshot", data)


def test_a_token_count_past_max_tokens_is_refused_so_that_sums_stay_in_range() -> None:
    """Each call's count is refused past MAX_TOKENS, before it is recorded: a session's sum
    of such counts (``harness.session.completed``) then always fits the JSON range."""
    from pydantic import ValidationError

    from little_es.values import MAX_TOKENS

    Usage(input_tokens=MAX_TOKENS, output_tokens=MAX_TOKENS)
    for field in ("input_tokens", "output_tokens", "cached_input_tokens", "reasoning_tokens"):
        with pytest.raises(ValidationError, match="less than or equal to 9007199254740992"):
            Usage(**{field: MAX_TOKENS + 1})
    assert JSON_INT_RANGE[1] > MAX_TOKENS * 2**10

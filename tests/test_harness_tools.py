"""Tools: schemas from type hints, validation, sync/async invocation, context, stable hashes."""

# No `from __future__ import annotations` here: some tools are defined inside
# tests, and their hints must not be strings naming local classes.
import asyncio
import enum
import hashlib
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Annotated, Any, Literal

import orjson
import pytest
from pydantic import BaseModel, Field

from little_es.errors import ToolArgumentsError, ToolError
from little_es.harness.tools import Tool, ToolContext, resolve_tools, tool
from little_es.values import ToolSpec

CTX = ToolContext(run_id="run-1", session_id="sess-1", call_id="c1", step_path="plan/search")


class Unit(enum.Enum):
    """Temperature unit."""

    CELSIUS = "celsius"
    FAHRENHEIT = "fahrenheit"


class Place(BaseModel):
    """Where to look."""

    city: str
    country: str = "FR"


@tool
def forecast(
    place: Place,
    days: Annotated[int, Field(ge=1, le=7, description="How many days ahead.")],
    unit: Unit = Unit.CELSIUS,
    detail: Literal["short", "long"] = "short",
    note: str | None = None,
) -> dict[str, Any]:
    """Forecast the weather for a place.

    This second paragraph is not part of the description.
    """
    return {"city": place.city, "days": days, "unit": unit.value, "detail": detail, "note": note}


def test_schema_required_optional_nested_and_enums() -> None:
    spec = forecast.spec
    assert isinstance(spec, ToolSpec)
    assert spec.name == "forecast"
    assert spec.description == "Forecast the weather for a place."
    schema = spec.parameters
    assert schema["type"] == "object"
    assert schema["additionalProperties"] is False
    assert "title" not in schema
    assert schema["required"] == ["place", "days"]
    props = schema["properties"]
    assert list(props) == ["place", "days", "unit", "detail", "note"]
    assert props["days"]["type"] == "integer"
    assert props["days"]["description"] == "How many days ahead."
    assert (props["days"]["minimum"], props["days"]["maximum"]) == (1, 7)
    assert props["detail"]["enum"] == ["short", "long"]
    assert props["detail"]["default"] == "short"
    assert props["place"] == {"$ref": "#/$defs/Place"}
    assert schema["$defs"]["Place"]["required"] == ["city"]
    assert schema["$defs"]["Unit"]["enum"] == ["celsius", "fahrenheit"]
    assert props["unit"]["default"] == "celsius"
    assert props["note"]["default"] is None


def test_context_parameter_is_injected_not_described() -> None:
    seen: list[ToolContext] = []

    def remember(query: str, whatever_name: ToolContext) -> str:
        """Remember a query."""
        seen.append(whatever_name)
        return query.upper()

    wrapped = tool(remember)
    assert list(wrapped.spec.parameters["properties"]) == ["query"]
    assert wrapped.spec.parameters["required"] == ["query"]
    assert asyncio.run(wrapped.invoke({"query": "abc"}, CTX)) == "ABC"
    assert seen == [CTX]


def test_idempotency_key_is_unique_to_run_session_and_call() -> None:
    same = ToolContext(run_id="run-1", session_id="sess-1", call_id="c1", step_path="elsewhere")
    assert same.idempotency_key == CTX.idempotency_key
    assert len(CTX.idempotency_key) == 64
    others = {
        ToolContext(run_id="run-2", session_id="sess-1", call_id="c1", step_path="p"),
        ToolContext(run_id="run-1", session_id="sess-2", call_id="c1", step_path="p"),
        ToolContext(run_id="run-1", session_id="sess-1", call_id="c2", step_path="p"),
        # The parts must not just be concatenated: ("run-1s", "ess-1") is another call.
        ToolContext(run_id="run-1s", session_id="ess-1", call_id="c1", step_path="p"),
    }
    keys = {ctx.idempotency_key for ctx in others}
    assert len(keys) == 4
    assert CTX.idempotency_key not in keys
    with pytest.raises(ValueError):
        ToolContext(run_id="", session_id="s", call_id="c", step_path="p")


async def test_invoke_validates_and_converts_arguments() -> None:
    result = await forecast.invoke(
        {"place": {"city": "Lyon"}, "days": "3", "unit": "fahrenheit"}, CTX
    )
    assert result == {
        "city": "Lyon",
        "days": 3,
        "unit": "fahrenheit",
        "detail": "short",
        "note": None,
    }


@pytest.mark.parametrize(
    ("arguments", "field", "why"),
    [
        ({"place": {"city": "Lyon"}}, "days", "Field required"),
        ({"place": {"city": "Lyon"}, "days": 9}, "days", "less than or equal to 7"),
        ({"place": {"city": "Lyon"}, "days": "soon"}, "days", "valid integer"),
        ({"place": {"country": "FR"}, "days": 1}, "place.city", "Field required"),
        ({"place": {"city": "Lyon"}, "days": 1, "detail": "huge"}, "detail", "'short' or 'long'"),
        ({"place": {"city": "Lyon"}, "days": 1, "unit": "kelvin"}, "unit", "celsius"),
        ({"place": {"city": "Lyon"}, "days": 1, "colour": "red"}, "colour", "Extra inputs"),
    ],
)
async def test_validation_errors_name_the_tool_and_field(
    arguments: dict[str, Any], field: str, why: str
) -> None:
    with pytest.raises(ToolArgumentsError) as info:
        await forecast.invoke(arguments, CTX)
    error = info.value
    assert isinstance(error, ToolError)
    assert error.tool == "forecast"
    assert error.fields == (field,)
    assert f"tool 'forecast' got invalid arguments: {field}:" in str(error)
    assert why in str(error)


async def test_arguments_must_be_an_object() -> None:
    with pytest.raises(ToolArgumentsError, match="must be a JSON object, got list"):
        await forecast.invoke(["Lyon"], CTX)  # type: ignore[arg-type]
    with pytest.raises(ToolError, match="needs a ToolContext"):
        await forecast.invoke({}, {"run_id": "r"})  # type: ignore[arg-type]


async def test_sync_tools_run_in_a_worker_thread_async_tools_on_the_loop() -> None:
    loop_thread = threading.get_ident()
    threads: dict[str, int] = {}

    @tool
    def blocking(x: int) -> int:
        """Block."""
        threads["sync"] = threading.get_ident()
        return x + 1

    @tool
    async def awaiting(x: int, ctx: ToolContext) -> dict[str, Any]:
        """Await."""
        await asyncio.sleep(0)
        threads["async"] = threading.get_ident()
        return {"x": x * 2, "call": ctx.call_id}

    assert await blocking.invoke({"x": 1}, CTX) == 2
    assert await awaiting.invoke({"x": 4}, CTX) == {"x": 8, "call": "c1"}
    assert threads["sync"] != loop_thread
    assert threads["async"] == loop_thread


async def test_each_invoke_runs_the_function_once_and_failures_do_not_run_it() -> None:
    calls: list[int] = []

    @tool
    def count(n: int) -> int:
        """Count calls."""
        calls.append(n)
        return len(calls)

    assert await count.invoke({"n": 1}, CTX) == 1
    assert await count.invoke({"n": 2}, CTX) == 2
    with pytest.raises(ToolArgumentsError):
        await count.invoke({"n": "two"}, CTX)
    assert calls == [1, 2]


async def test_function_exceptions_propagate_unchanged() -> None:
    class BoomError(RuntimeError):
        pass

    @tool
    async def explode() -> None:
        """Explode."""
        raise BoomError("kaboom")

    with pytest.raises(BoomError, match="kaboom"):
        await explode.invoke({}, CTX)


async def test_results_read_back_as_json() -> None:
    @tool
    def structured() -> Any:
        """Return a mix of JSON-able values."""
        return {"place": Place(city="Nice"), "pair": (1, 2), "nested": [Place(city="Pau")]}

    assert await structured.invoke({}, CTX) == {
        "place": {"city": "Nice", "country": "FR"},
        "pair": [1, 2],
        "nested": [{"city": "Pau", "country": "FR"}],
    }

    @tool
    def model_result() -> Place:
        """Return a pydantic model."""
        return Place(city="Metz", country="FR")

    assert await model_result.invoke({}, CTX) == {"city": "Metz", "country": "FR"}


@pytest.mark.parametrize("value", [{1, 2}, object(), {1: "int key"}])
async def test_non_json_results_are_refused(value: Any) -> None:
    @tool
    def bad() -> Any:
        """Return something that is not JSON."""
        return value

    with pytest.raises(ToolError, match="tool 'bad' returned a value that is not JSON") as info:
        await bad.invoke({}, CTX)
    assert "return str, int" in str(info.value)


def test_schema_hash_is_sha256_of_canonical_spec() -> None:
    canonical = orjson.dumps(forecast.spec.model_dump(mode="json"), option=orjson.OPT_SORT_KEYS)
    assert canonical.startswith(b'{"description":"Forecast the weather for a place.","name":')
    assert forecast.schema_hash == hashlib.sha256(canonical).hexdigest()
    renamed = tool(forecast, name="forecast2")
    redescribed = tool(forecast, description="Other words.")
    assert len({forecast.schema_hash, renamed.schema_hash, redescribed.schema_hash}) == 3
    assert tool(forecast).schema_hash == forecast.schema_hash


def test_schema_hash_is_the_same_in_another_process() -> None:
    tests_dir = Path(__file__).resolve().parent
    code = (
        "import sys; sys.path[:0] = [sys.argv[1], sys.argv[2]];"
        " from test_harness_tools import forecast; print(forecast.schema_hash)"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run(
        [sys.executable, "-c", code, str(tests_dir), str(tests_dir.parent)],
        capture_output=True,
        text=True,
        check=True,
        env=env,
        timeout=60,
    )
    assert out.stdout.strip() == forecast.schema_hash


def test_spec_is_a_copy() -> None:
    forecast.spec.parameters["properties"].clear()
    assert "place" in forecast.spec.parameters["properties"]


def test_decorator_forms_and_direct_calls() -> None:
    @tool(name="add_numbers", description="Add two numbers.")
    def add(a: int, b: int = 0) -> int:
        return a + b

    assert isinstance(add, Tool)
    assert (add.name, add.description) == ("add_numbers", "Add two numbers.")
    assert add(2, 3) == 5  # the function is still callable as itself
    assert add.fn(1) == 1

    def undocumented(x: str) -> str:
        return x

    assert tool(undocumented).description == ""


async def test_reserved_and_keyword_only_parameter_names_work() -> None:
    @tool
    def odd_names(json: str, model_config: int, *, copy: bool = False) -> list[Any]:
        """Parameters whose names pydantic models reserve."""
        return [json, model_config, copy]

    assert list(odd_names.spec.parameters["properties"]) == ["json", "model_config", "copy"]
    assert await odd_names.invoke({"json": "j", "model_config": 2, "copy": True}, CTX) == [
        "j",
        2,
        True,
    ]


def test_functions_that_cannot_be_described_are_refused() -> None:
    def variadic(*args: int) -> None:
        """Variadic."""

    def untyped(x) -> None:  # type: ignore[no-untyped-def]
        """Untyped."""

    with pytest.raises(ToolError, match=r"takes \*args"):
        tool(variadic)
    with pytest.raises(ToolError, match="parameter 'x' has no type hint"):
        tool(untyped)
    with pytest.raises(ToolError, match="tool name '<lambda>' is not usable"):
        tool(lambda: None)
    with pytest.raises(ToolError, match="tool name 'has space' is not usable"):
        tool(untyped, name="has space")
    with pytest.raises(ToolError, match="built from a function"):
        tool(42)  # type: ignore[call-overload]


def test_resolve_tools_wraps_functions_and_refuses_duplicates() -> None:
    def lookup(key: str) -> str:
        """Look a key up."""
        return key

    resolved = resolve_tools([forecast, lookup])
    assert list(resolved) == ["forecast", "lookup"]
    assert resolved["forecast"] is forecast
    assert isinstance(resolved["lookup"], Tool)
    assert resolved["lookup"].description == "Look a key up."

    with pytest.raises(ToolError, match="two tools are named 'lookup'"):
        resolve_tools([lookup, tool(forecast, name="lookup")])
    with pytest.raises(ToolError, match="must be a list"):
        resolve_tools(lookup)  # type: ignore[arg-type]
    assert resolve_tools([]) == {}

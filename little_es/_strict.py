"""What is written can always be read: the checks the recorder makes before anything is stored.

A reader validates every stored event against its schema, folds its JSON
values and freezes them (:mod:`little_es._frozen`, recursively). So the
recorder refuses, with :class:`~little_es.errors.EventPayloadError` naming the
field, what a reader could not read back as it was written:

* a payload that does not validate as the reader validates it (a value object
  built with ``model_construct`` or ``model_copy(update=...)``, which pydantic
  does not validate, is validated again in full);
* a field given to ``model_construct`` that is not in the schema (such as a
  ``cost_usd`` on a :class:`~little_es.values.Usage`), which pydantic drops;
* NaN, Infinity and -Infinity, which JSON cannot hold (they would be read back
  as ``null``);
* an integer outside :data:`JSON_INT_RANGE`, the 64-bit range of every JSON tool
  little_es reads and hashes values with (orjson's): a bigger one would be
  stored, then break the conversation hash of an agent, the ``little`` CLI's
  JSON, or (past 4,300 digits) the reader itself;
* a JSON value nested deeper than :data:`MAX_JSON_DEPTH` arrays and objects;
* in a field typed as JSON data (``JSONValue``, ``dict[str, JSONValue]``), anything
  orjson would not write as it is: a dict key that is not a string (pydantic would
  write ``1`` and ``"1"`` as one key, losing a value), a ``Decimal``, a set, bytes.

The check costs a few microseconds per event when the event was built by
validation (``Aggregate.trigger`` builds every event so): a few byte searches of
the payload the recorder just produced and a look at the nested value objects.
Only a payload that may hold a problem (an unvalidated object, ``NaN`` or
``Infinity`` in its bytes, more brackets than the depth limit, a run of 19
digits) is walked and validated again with the reader's own validator.
"""

from __future__ import annotations

import math
import threading
import types
import typing
from collections import deque
from collections.abc import Mapping
from decimal import Decimal
from typing import Annotated, Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, PlainValidator, ValidationError
from pydantic_core import PydanticSerializationError

from little_es.errors import EventPayloadError
from little_es.events import Snapshot
from little_es.values import (
    UNCHECKED_KEY,
    Checked,
    Usage,
    is_usage_cost_error,
    usage_cost_message,
)

MAX_JSON_DEPTH = 64
"""How deep a JSON value (a run input, a step output, tool arguments or a tool
result, a field of an event of your own) may nest arrays and objects: ``[[1]]``
is 2 deep. Deeper values are refused before anything is recorded: a reader
folds and freezes values recursively, and a value nested a few hundred levels
deep could be written but never read back."""

# orjson refuses to parse more than 1024 nested levels; wrapped in this many
# arrays, a document parses exactly when it nests at most MAX_JSON_DEPTH levels
# (tests/test_strict.py pins orjson's limit).
_ORJSON_PARSE_DEPTH = 1024
_PAD_OPEN = b"[" * (_ORJSON_PARSE_DEPTH - MAX_JSON_DEPTH)
_PAD_CLOSE = b"]" * (_ORJSON_PARSE_DEPTH - MAX_JSON_DEPTH)

JSON_INT_RANGE = (-(2**63), 2**64 - 1)
"""The least and the greatest integer a JSON value may hold (orjson's range). Wider
ones are refused before anything is recorded: send them as strings."""
_INT_MIN, _INT_MAX = JSON_INT_RANGE
# Every integer outside the range has 19 digits or more (-2**63 - 1 has 19), and so
# has its JSON; the payload's bytes with each digit made "0" and every other byte a
# space hold a run of 19 zeros exactly when the payload holds a run of 19 digits (one
# C pass, no regex).
_DIGITS_AS_ZEROS = bytes(0x30 if 0x30 <= b <= 0x39 else 0x20 for b in range(256))
_LONG_DIGIT_RUN = b"0" * 19


def has_long_digit_run(data: bytes) -> bool:
    """Whether ``data`` holds 19 digits in a row (an integer outside
    :data:`JSON_INT_RANGE` does; so may a long fraction or a string)."""
    return _LONG_DIGIT_RUN in data.translate(_DIGITS_AS_ZEROS)


def nests_deeper(data: bytes) -> bool:
    """Whether the JSON document ``data`` nests more than :data:`MAX_JSON_DEPTH` levels."""
    # Fewer brackets than the limit cannot nest deeper: most payloads stop here.
    if data.count(b"[") + data.count(b"{") <= MAX_JSON_DEPTH:
        return False
    try:
        orjson.loads(_PAD_OPEN + data + _PAD_CLOSE)
    except orjson.JSONDecodeError:
        return True
    return False


# ------------------------------------------------------------------ JSON values


def check_json_value(where: str, value: Any, data: bytes, read_back: Any) -> None:
    """Refuse ``value`` when its JSON ``data`` (read back as ``read_back``) is not it.

    ``where`` names the value (``step 'plan' output``). NaN and infinities
    (orjson writes ``null``) and nesting beyond :data:`MAX_JSON_DEPTH` are
    refused; a difference JSON makes on purpose (a tuple read back as a list, a
    pydantic model as a dict) is not.
    """
    if read_back == value and not nests_deeper(data):
        return
    refuse_problem(where, value)


def refuse_problem(where: str, value: Any) -> None:
    """Raise :class:`~little_es.errors.EventPayloadError` naming the first thing in ``value``
    (named ``where``) that a reader could not read back, if there is one."""
    problem = find_problem(value, where, 0)
    if problem is not None:
        raise EventPayloadError(problem)


def _shortened(path: str) -> str:
    """A long path's first and last parts (a value 65 levels deep has a 65-part path)."""
    parts = path.split(".")
    if len(parts) <= 8:
        return path
    return ".".join([*parts[:4], "…", *parts[-3:]])


def find_problem(value: Any, path: str, depth: int) -> str | None:
    """The first thing in ``value`` (at ``path``) that a reader could not read back, or None.

    ``depth`` is how many arrays and objects enclose it within its field; a
    value object (a pydantic model) starts each of its fields at 0.
    """
    kind = type(value)
    if kind is str or kind is bool or value is None:
        return None
    if isinstance(value, int):
        if _INT_MIN <= value <= _INT_MAX:
            return None
        # Not its digits: past 4,300 of them, Python refuses to print an int.
        return (
            f"{path} is an integer of {value.bit_length()} bits, outside the 64-bit range"
            " JSON values are read and hashed with here (-2**63 to 2**64-1): send it as a"
            " string instead"
        )
    if isinstance(value, float):
        if math.isfinite(value):
            return None
        return (
            f"{path} is {value!r}, which JSON cannot hold: send a finite number, a string"
            " or None instead"
        )
    if isinstance(value, BaseModel):
        return _model_problem(value, path)
    if isinstance(value, Mapping):
        items: Any = value.items()
    elif isinstance(value, list | tuple | set | frozenset):
        items = enumerate(value)
    else:
        return None
    if depth >= MAX_JSON_DEPTH:
        return (
            f"{_shortened(path)} nests deeper than {MAX_JSON_DEPTH} arrays and objects:"
            " flatten it, or store the deep part as a string"
        )
    for key, item in items:
        found = find_problem(item, f"{path}.{key}" if path else str(key), depth + 1)
        if found is not None:
            return found
    return None


def _model_problem(model: BaseModel, path: str) -> str | None:
    fields = type(model).__pydantic_fields__
    own = model.__dict__
    unknown = [k for k in own.get(UNCHECKED_KEY, ()) if k not in fields]
    unknown += [k for k in own if k not in fields and k != UNCHECKED_KEY and k not in unknown]
    if unknown:
        where = f"{path}." if path else ""
        cost = [k for k in unknown if "cost" in k.lower()]
        if cost and isinstance(model, Usage):
            return f"{where.rstrip('.') or 'usage'}: {usage_cost_message(cost)}"
        names = ", ".join(f"{where}{k}" for k in sorted(unknown))
        return (
            f"{names} {'is' if len(unknown) == 1 else 'are'} not a field of"
            f" {type(model).__qualname__} and would be dropped: build it with"
            f" {type(model).__qualname__}(...), which validates, and leave the field out"
        )
    for name in fields:
        if name in own:
            found = find_problem(own[name], f"{path}.{name}" if path else name, 0)
            if found is not None:
                return found
    return None


# ------------------------------------------------------------------ events


def check_stored_payload(model: BaseModel, label: str, data: bytes) -> None:
    """Refuse ``model`` (an event, ``label`` its wire name) unless ``data`` reads back as it.

    ``data`` is the JSON payload just serialised from it with NaN and
    infinities written as the constants ``NaN``/``Infinity`` (so that they show
    in the bytes: a reader would refuse them, or read ``null``).
    """
    # The common case inline (measured: each call saved is a tenth of the check).
    if (
        b"NaN" not in data
        and b"Infinity" not in data
        and not has_long_digit_run(data)
        and (data.count(b"[") + data.count(b"{") <= MAX_JSON_DEPTH or not nests_deeper(data))
        and _validated(model)
        and json_field_problem(model, "") is None
    ):
        return
    problem = (
        find_problem(model, "", 0) or _dropped_by_schema(model, "") or json_field_problem(model, "")
    )
    if problem is not None:
        raise EventPayloadError(f"cannot record {label}: {problem}")
    check_snapshot_payload(model, label, data)


def check_snapshot_payload(model: BaseModel, label: str, data: bytes) -> None:
    """Refuse a payload (a snapshot's, or any once its values are checked) unless ``data``
    validates as the reader validates it.

    A snapshot holds a fold of events already checked, nested inside the
    state's own structure: the depth limit of values does not apply to it as a
    whole, and it is rare (at versions growing fourfold), so it is only validated.
    """
    cls = _SnapshotCheck if type(model) is Snapshot else type(model)
    try:
        cls.__pydantic_validator__.validate_json(data)
    except ValidationError as exc:
        raise EventPayloadError(
            f"cannot record {label}: the payload would not read back: {describe(exc)}"
        ) from exc


def _discard(value: object) -> None:
    return None


_Discarded = Annotated[Any, PlainValidator(_discard)]


class _SnapshotCheck(Snapshot):
    """A :class:`~little_es.events.Snapshot` validator that accepts exactly what Snapshot's
    does (its state's values are any JSON) but keeps none of the state it reads.

    Validated as a Snapshot, a run's snapshot would be built whole beside the state it was
    just serialised from: at a long run's snapshot, the largest part of its peak memory.
    Here each value of the state, and each entry of a state value that is an object (a
    run's steps), is read and dropped in turn.
    """

    # pydantic's cache of the strings it reads would keep thousands of step paths of a
    # state that is dropped at once.
    model_config = ConfigDict(cache_strings=False)

    state: dict[
        str, Annotated[dict[str, _Discarded] | _Discarded, Field(union_mode="left_to_right")]
    ]


def refuse_unvalidated(event: BaseModel, label: str) -> None:
    """Check a new event in full right away if it holds an object pydantic did not validate.

    Called before the event is applied to its aggregate, whose fold reads the
    event's values (a ``usage`` given as a dict would fail there first, with a
    bare ``AttributeError``). Events built by validation pass at the cost of
    a look at their value objects; the recorder checks every event again.
    """
    if _validated(event):
        return
    try:
        data = type(event).__pydantic_serializer__.to_json(event, warnings=False)
    except PydanticSerializationError as exc:
        problem = find_problem(event, "", 0)
        raise EventPayloadError(f"cannot record {label}: {problem or exc}") from exc
    check_stored_payload(event, label, data)


def describe(exc: ValidationError) -> str:
    """Every field a validation error names, with why (cost fields explained)."""
    return "; ".join(
        ".".join(str(p) for p in err["loc"])
        + ": "
        + (usage_cost_message([str(err["loc"][-1])]) if is_usage_cost_error(err) else err["msg"])
        for err in exc.errors()
    )


def json_field_problem(model: BaseModel, path: str) -> str | None:
    """The first field typed as JSON data, in ``model`` or a value object in it, whose value
    orjson would not write as it is (see the module), or None."""
    own = model.__dict__
    json_fields, holders = _json_plan(type(model))
    for name in json_fields:
        value = own.get(name)
        if value is None or type(value) in _SCALARS:
            continue
        try:
            orjson.dumps(value, default=_dumped_model)
        except TypeError:
            # orjson refuses more than a reader would misread (a str subclass as a key, a
            # numpy float, a deque): the walk says whether this is what would be lost.
            where = f"{path}.{name}" if path else name
            found = _not_json(value, where)
            if found is not None:
                return found
    for name in holders:
        value = own.get(name)
        where = f"{path}.{name}" if path else name
        if type(value) is tuple:
            for index, item in enumerate(value):
                if isinstance(item, BaseModel):
                    found = json_field_problem(item, f"{where}.{index}")
                    if found is not None:
                        return found
        elif isinstance(value, BaseModel):
            found = json_field_problem(value, where)
            if found is not None:
                return found
    return None


_NOT_JSON = (Decimal, bytes, bytearray, memoryview, set, frozenset, complex)


def _not_json(value: Any, path: str) -> str | None:
    """What in ``value`` (at ``path``) pydantic would write as something else than it is: a
    key that is not a string, a Decimal, bytes, a set; None when it writes all as it is."""
    if isinstance(value, _NOT_JSON):
        return (
            f"{path} is a {type(value).__qualname__}, which is not JSON data: convert it (a"
            " string, a number, a list) before recording it"
        )
    if isinstance(value, BaseModel):
        return None
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                return (
                    f"{path} has the key {key!r}, a {type(key).__qualname__}: JSON object keys"
                    " are strings (pydantic would write 1 and '1' as one key, and lose a"
                    " value): give it string keys"
                )
            found = _not_json(item, f"{path}.{key}")
            if found is not None:
                return found
    elif isinstance(value, list | tuple | deque):
        for index, item in enumerate(value):
            found = _not_json(item, f"{path}.{index}")
            if found is not None:
                return found
    return None


def _dumped_model(value: Any) -> Any:
    # A pydantic model in a JSON field is written as its JSON object, as pydantic does.
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    raise TypeError(f"Type is not JSON serializable: {type(value).__qualname__}")


_JsonPlan = tuple[tuple[str, ...], tuple[str, ...]]
_JSON_PLANS: dict[type[BaseModel], _JsonPlan] = {}
_BUILDING = threading.local()


def _json_plan(cls: type[BaseModel]) -> _JsonPlan:
    """The fields of ``cls`` typed as JSON data, and those holding value objects that have
    such fields (followed; the others are not)."""
    found = _JSON_PLANS.get(cls)
    if found is None:
        building = _BUILDING.__dict__.setdefault("classes", set())
        if cls in building:
            return ((), ())  # a model that holds itself: followed once
        building.add(cls)
        try:
            fields = cls.__pydantic_fields__.items()
            found = (
                tuple(name for name, field in fields if _holds_any(field.annotation)),
                tuple(name for name, field in fields if _holds_json_models(field.annotation)),
            )
        finally:
            building.discard(cls)
        # Published whole: another thread never sees a plan still being built.
        _JSON_PLANS[cls] = found
    return found


def _holds_any(annotation: Any) -> bool:
    # A bare dict, list or object takes any value, as Any does.
    if annotation is Any or annotation in (dict, list, object):
        return True
    return any(_holds_any(arg) for arg in typing.get_args(annotation))


def _holds_json_models(annotation: Any) -> bool:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return any(_json_plan(annotation))
    return any(_holds_json_models(arg) for arg in typing.get_args(annotation))


def _dropped_by_schema(model: BaseModel, path: str) -> str | None:
    """A value object of a subclass of its field's class whose own fields the field's schema
    would drop when serialised (pydantic serialises by the declared class), or None."""
    plan = _PLANS.get(type(model)) or _plan(type(model)) or ()
    for name, expected in plan:
        value = model.__dict__.get(name)
        for item in value if type(value) is tuple else (value,):
            if not isinstance(item, BaseModel):
                continue
            where = f"{path}.{name}" if path else name
            extra = sorted(set(type(item).__pydantic_fields__) - set(expected.__pydantic_fields__))
            if extra and isinstance(item, expected):
                return (
                    f"{where} is a {type(item).__qualname__}, whose fields {', '.join(extra)}"
                    f" are not in {expected.__qualname__} and would be dropped: record them"
                    " in a field of their own"
                )
            found = _dropped_by_schema(item, where)
            if found is not None:
                return found
    return None


_Plan = tuple[tuple[str, type[BaseModel]], ...] | None
_PLANS: dict[type[BaseModel], _Plan] = {}


def _validated(model: BaseModel) -> bool:
    """Whether ``model`` and every value object in it were built by validation, as declared."""
    own = model.__dict__
    if UNCHECKED_KEY in own:
        return False
    cls = type(model)
    plan = _PLANS.get(cls, _UNPLANNED)
    if plan is _UNPLANNED:
        plan = _PLANS[cls] = _plan(cls)
    if not plan:
        return plan is not None
    for name, expected in plan:
        value = own.get(name, _UNPLANNED)
        if value is None:
            continue
        if type(value) is tuple:
            for item in value:
                if type(item) is not expected or not _validated(item):
                    return False
        elif type(value) is not expected or not _validated(value):
            return False
    return True


_UNPLANNED: Any = object()
_SCALARS = frozenset({str, int, float, bool, bytes, type(None)})


def _plan(cls: type[BaseModel]) -> _Plan:
    """The fields of ``cls`` that hold value objects, with their class; None when a field's
    type is one this fast check does not follow (the event is then always checked in full)."""
    plan: list[tuple[str, type[BaseModel]]] = []
    for name, field in cls.__pydantic_fields__.items():
        found = _model_in(field.annotation)
        if found is None:
            return None
        if found is not _NO_MODEL:
            plan.append((name, found))
    return tuple(plan)


_NO_MODEL: Any = object()


def _model_in(annotation: Any) -> Any:
    """The one model class ``annotation`` may hold (as ``X``, ``X | None``, ``tuple[X, ...]``),
    ``_NO_MODEL`` when it holds none, None when it is something else."""
    if annotation is Any or annotation in _SCALARS:
        return _NO_MODEL
    origin = typing.get_origin(annotation)
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if origin is typing.Union or origin is types.UnionType:
        if len(args) == 1:
            return _model_in(args[0])
        return _NO_MODEL if all(_model_in(a) is _NO_MODEL for a in args) else None
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        return _model_in(args[0])
    if origin is typing.Literal:
        return _NO_MODEL
    if origin in (dict, Mapping) and len(args) == 2 and args[0] is str:
        return _NO_MODEL if _model_in(args[1]) is _NO_MODEL else None
    if origin in (tuple, list) and all(_model_in(a) is _NO_MODEL for a in args):
        return _NO_MODEL
    if isinstance(annotation, type):
        if issubclass(annotation, BaseModel):
            # Only a Checked model says whether it was validated; another is checked in full.
            return annotation if issubclass(annotation, Checked) else None
        # UUID, datetime, enums...: validated into themselves, no object inside.
        return _NO_MODEL
    return None

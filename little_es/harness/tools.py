"""Tools a model can call: plain Python functions with validated, schema-described arguments.

``tool(fn)`` (or the bare decorator ``@tool``) turns a sync or async function
into a :class:`Tool`. Its arguments are described to the model by the JSON
schema of a pydantic model built from the function's type hints, and the same
model validates what the model sends back. A parameter annotated
:class:`ToolContext` is filled in by the harness and never shown to the model.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import re
from collections.abc import Callable, Sequence
from typing import Any, overload

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from little_es._strict import check_json_value, find_problem, has_long_digit_run, refuse_problem
from little_es._threads import run_in_worker
from little_es.errors import LittleEsError, ToolArgumentsError, ToolError
from little_es.values import JSONValue, ToolCall, ToolSpec
from little_es.waits import (
    Approval,
    HumanAnswer,
    check_model,
    check_timeout,
    model_ref,
    schema_digest,
)
from little_es.workflow.ir import WaitSpecIR

__all__ = [
    "ENGINES",
    "Tool",
    "ToolContext",
    "ask_human",
    "check_engines",
    "read_arguments",
    "resolve_tools",
    "tool",
    "unparsed_arguments_error",
]

# What OpenAI-compatible APIs accept as a function name.
_NAME_PATTERN = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class ToolContext(BaseModel):
    """What the harness tells a tool about the call it is running.

    ``idempotency_key`` is derived from ``(run_id, session_id, call_id)`` only,
    so it is the same every time one call is executed: a tool with side
    effects passes it to the outside world (an ``Idempotency-Key`` header, a
    unique column) to dedupe the one re-execution a crash between invoking the
    tool and recording its result can cause.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    run_id: str = Field(min_length=1)
    session_id: str = Field(min_length=1)
    call_id: str = Field(min_length=1)
    step_path: str = Field(min_length=1)

    @property
    def idempotency_key(self) -> str:
        """A 64-hex-digit key unique to this run, session and call id."""
        # NUL cannot appear in ids, so the join is unambiguous.
        joined = "\0".join((self.run_id, self.session_id, self.call_id))
        return hashlib.sha256(joined.encode()).hexdigest()


ENGINES = ("local", "temporal")
"""The engines a tool or step may declare with ``engines=[...]``."""


def check_engines(what: str, engines: object) -> frozenset[str] | None:
    """``engines`` as a set of known engine names (None: every engine); raises
    :class:`~little_es.errors.ToolError` for anything else."""
    if engines is None:
        return None
    if isinstance(engines, str | bytes) or not isinstance(engines, Sequence | frozenset | set):
        raise ToolError(f"{what}: engines must be a list of {list(ENGINES)}, got {engines!r}")
    unknown = [e for e in engines if e not in ENGINES]
    if unknown or not engines:
        raise ToolError(
            f"{what}: engines must be a non-empty list of {list(ENGINES)}, got {list(engines)!r}"
        )
    return frozenset(engines)


class Tool:
    """A function a model can call, with its name, description and argument schema.

    Build one with :func:`tool`. Calling the tool object directly calls the
    function unchanged; the harness uses :meth:`invoke`, which validates.
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        engines: Sequence[str] | None = None,
        requires_approval: bool = False,
        approval_timeout: float | Any | None = None,
        _waits: tuple[WaitSpecIR, type[BaseModel]] | None = None,
    ) -> None:
        if isinstance(fn, Tool):
            if _waits is None and not requires_approval and fn._waits is not None:
                # A renamed ask_human (or approval-gated tool) still waits.
                assert fn._wait_model is not None
                _waits = (fn._waits, fn._wait_model)
            # Re-wrapping a tool (to rename it, say) describes its function again.
            fn = fn.fn
        if not callable(fn):
            raise ToolError(f"a tool must be built from a function, got {type(fn).__name__}")
        tool_name = name if name is not None else getattr(fn, "__name__", None)
        if not isinstance(tool_name, str) or not _NAME_PATTERN.match(tool_name):
            raise ToolError(
                f"tool name {tool_name!r} is not usable: give name= of 1-64 letters, digits,"
                " '_' or '-'"
            )
        if description is None:
            description = _first_paragraph(inspect.getdoc(fn))
        elif not isinstance(description, str):
            raise ToolError(f"tool {tool_name!r} description must be a string")
        self._fn = fn
        self._name = tool_name
        # Not part of the spec or its hash: where a tool can run is no part of what
        # the model is told, and declaring it must not invalidate recorded sessions.
        self._engines = check_engines(f"tool {tool_name!r}", engines)
        self._is_async = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
            type(fn).__call__
        )
        self._params, self._context_params, self._arguments_model, schema = _arguments_model(
            fn, tool_name
        )
        if not isinstance(requires_approval, bool):
            raise ToolError(f"tool {tool_name!r}: requires_approval must be True or False")
        self._wait_model: type[BaseModel] | None = None
        self._waits: WaitSpecIR | None = None
        if _waits is not None:
            self._waits, self._wait_model = _waits
        elif requires_approval:
            try:
                timeout_s = check_timeout(f"tool {tool_name!r}", approval_timeout)
            except LittleEsError as exc:
                raise ToolError(str(exc)) from None
            self._wait_model = Approval
            self._waits = WaitSpecIR(
                kind="approval",
                signal="approval",
                model_ref=model_ref(Approval),
                schema_digest=schema_digest(Approval),
                timeout_s=timeout_s,
            )
        elif approval_timeout is not None:
            raise ToolError(f"tool {tool_name!r}: approval_timeout needs requires_approval=True")
        self._spec = ToolSpec(name=tool_name, description=description, parameters=schema)
        canonical = orjson.dumps(self._spec.model_dump(mode="json"), option=orjson.OPT_SORT_KEYS)
        self._schema_hash = hashlib.sha256(canonical).hexdigest()

    @property
    def name(self) -> str:
        """The name the model calls the tool by."""
        return self._name

    @property
    def engines(self) -> frozenset[str] | None:
        """The engines the tool can run on (None: every engine); a run on another one is
        refused at its start with :class:`~little_es.errors.EngineUnsupportedError`."""
        return self._engines

    @property
    def waits(self) -> WaitSpecIR | None:
        """What a call of the tool waits for before it runs (an approval, or ``ask_human``'s
        answer), or None. Part of the agent step's IR."""
        return self._waits

    @property
    def wait_model(self) -> type[BaseModel] | None:
        """The pydantic model the signal a call waits for validates against, or None."""
        return self._wait_model

    def check_arguments(self, arguments: dict[str, JSONValue]) -> None:
        """Raise :class:`ToolArgumentsError` when ``arguments`` do not validate (a call that
        waits for approval is refused before a person is asked)."""
        try:
            self._arguments_model.model_validate(arguments)
        except ValidationError as exc:
            raise _arguments_error(self._name, exc) from exc

    @property
    def description(self) -> str:
        """What the model is told the tool does."""
        return self._spec.description

    @property
    def fn(self) -> Callable[..., Any]:
        """The wrapped function."""
        return self._fn

    @property
    def spec(self) -> ToolSpec:
        """The name, description and JSON schema the model is given (a fresh copy)."""
        return self._spec.model_copy(deep=True)

    @property
    def schema_hash(self) -> str:
        """sha256 hex of the spec's canonical JSON (sorted keys, no whitespace)."""
        return self._schema_hash

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the wrapped function directly, without validation."""
        return self._fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"Tool(name={self._name!r}, schema_hash={self._schema_hash[:12]!r})"

    async def invoke(self, arguments: dict[str, JSONValue], ctx: ToolContext) -> JSONValue:
        """Validate ``arguments``, run the function and return its JSON result.

        Sync functions run in a worker thread, async ones are awaited. Raises
        :class:`ToolArgumentsError` when the arguments do not validate and
        :class:`~little_es.errors.ToolError` when the result is not JSON;
        exceptions raised by the function itself propagate unchanged.
        The result is returned as it reads back from JSON (tuples become lists,
        pydantic models dicts), so a live call and a replayed one agree.
        """
        if not isinstance(ctx, ToolContext):
            raise ToolError(f"tool {self._name!r} needs a ToolContext, got {type(ctx).__name__}")
        if not isinstance(arguments, dict):
            raise ToolArgumentsError(
                f"tool {self._name!r} arguments must be a JSON object,"
                f" got {type(arguments).__name__}",
                tool=self._name,
                fields=("",),
            )
        try:
            validated = self._arguments_model.model_validate(arguments)
        except ValidationError as exc:
            raise _arguments_error(self._name, exc) from exc
        args: list[Any] = []
        kwargs: dict[str, Any] = {}
        for param in self._params:
            if param.name in self._context_params:
                value: Any = ctx
            else:
                value = getattr(validated, _field_name(param.name))
            if param.kind is inspect.Parameter.KEYWORD_ONLY:
                kwargs[param.name] = value
            else:
                args.append(value)
        if self._is_async:
            result = await self._fn(*args, **kwargs)
        else:
            result = await run_in_worker(self._fn, *args, **kwargs)
            if inspect.isawaitable(result):
                result = await result
        return _to_json(self._name, result)


@overload
def tool(
    fn: Callable[..., Any],
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    engines: Sequence[str] | None = None,
    requires_approval: bool = False,
    approval_timeout: float | Any | None = None,
) -> Tool: ...


@overload
def tool(
    fn: None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    engines: Sequence[str] | None = None,
    requires_approval: bool = False,
    approval_timeout: float | Any | None = None,
) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    engines: Sequence[str] | None = None,
    requires_approval: bool = False,
    approval_timeout: float | Any | None = None,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Make a :class:`Tool` from ``fn``: ``tool(fn)``, ``@tool`` or ``@tool(name=...)``.

    The name defaults to the function's name and the description to the first
    paragraph of its docstring. Every parameter needs a type hint (use
    ``Annotated[int, Field(description=...)]`` to describe one); ``*args`` and
    ``**kwargs`` are refused. Raises :class:`~little_es.errors.ToolError` when
    the function cannot be described. ``engines`` (``["local"]``, ``["temporal"]``)
    declares the only engines the tool can run on: a run of a workflow using it on
    another engine is refused at its start, before anything is recorded.

    ``requires_approval=True`` gates every call: before the tool runs, the run records
    ``RunWaiting`` for signal ``approval`` with the digest of the tool's name and
    arguments, and stops; ``little signal RUN_ID approval --data '{"approved": true}'
    --digest D`` lets the call run on the next resume, ``{"approved": false, "comment":
    ...}`` fails it (the model is told). ``approval_timeout`` (seconds or a timedelta)
    bounds the wait.
    """
    kw: dict[str, Any] = dict(
        name=name,
        description=description,
        engines=engines,
        requires_approval=requires_approval,
        approval_timeout=approval_timeout,
    )
    if fn is None:
        return lambda f: Tool(f, **kw)
    return Tool(fn, **kw)


def ask_human(
    *,
    signal: str = "human",
    model: type[BaseModel] = HumanAnswer,
    timeout: float | Any | None = None,
    name: str = "ask_human",
    description: str | None = None,
) -> Tool:
    """A tool an agent calls to ask a person ``question`` and wait for the answer.

    A call records ``RunWaiting`` (signal ``signal``, the ``question``, the digest of the
    call) and the run stops; the process may exit. ``little signal RUN_ID human --data
    '{"answer": "..."}'`` answers (validated against ``model``, :class:`HumanAnswer` by
    default), and the next resume gives the data to the model as the call's result: the
    session fast-forwards through its recorded calls and continues.
    """
    if not isinstance(signal, str) or not signal:
        raise ToolError(f"ask_human: signal must be a non-empty string, got {signal!r}")
    try:
        checked = check_model("ask_human", model)
        timeout_s = check_timeout("ask_human", timeout)
    except LittleEsError as exc:
        raise ToolError(str(exc)) from None

    def ask(question: str) -> None:
        """Ask a person a question and wait for the answer (the run pauses until they reply)."""
        raise ToolError("ask_human is answered by a signal, never called")  # pragma: no cover

    try:
        spec = WaitSpecIR(
            kind="ask_human",
            signal=signal,
            model_ref=model_ref(checked),
            schema_digest=schema_digest(checked),
            timeout_s=timeout_s,
        )
    except ValidationError as exc:
        raise ToolError(f"ask_human: signal {signal!r} is not a usable name ({exc})") from None
    return Tool(ask, name=name, description=description, _waits=(spec, checked))


def resolve_tools(tools: Sequence[Tool | Callable[..., Any]]) -> dict[str, Tool]:
    """Index ``tools`` by name, wrapping plain functions with :func:`tool`.

    Raises :class:`~little_es.errors.ToolError` when two tools share a name.
    """
    if isinstance(tools, str | bytes) or not isinstance(tools, Sequence):
        raise ToolError(f"tools must be a list of tools or functions, got {type(tools).__name__}")
    resolved: dict[str, Tool] = {}
    for item in tools:
        wrapped = item if isinstance(item, Tool) else tool(item)
        if wrapped.name in resolved:
            raise ToolError(
                f"two tools are named {wrapped.name!r}: give one of them another name"
                " with tool(fn, name=...)"
            )
        resolved[wrapped.name] = wrapped
    return resolved


def _first_paragraph(doc: str | None) -> str:
    if not doc:
        return ""
    return " ".join(doc.strip().split("\n\n", 1)[0].split())


def _field_name(param_name: str) -> str:
    # Parameters are stored under a prefixed field name and exposed under an
    # alias, so that names pydantic reserves (json, copy, _private, model_*)
    # still work as argument names.
    return f"arg_{param_name}"


def _arguments_model(
    fn: Callable[..., Any], tool_name: str
) -> tuple[tuple[inspect.Parameter, ...], frozenset[str], type[BaseModel], dict[str, JSONValue]]:
    try:
        signature = inspect.signature(fn, eval_str=True)
    except NameError as exc:
        raise ToolError(
            f"tool {tool_name!r} has a type hint that cannot be resolved ({exc}): define the"
            " types it names at module level"
        ) from exc
    except (TypeError, ValueError) as exc:
        raise ToolError(f"tool {tool_name!r} has no inspectable signature ({exc})") from exc
    fields: dict[str, Any] = {}
    context_params: set[str] = set()
    for param in signature.parameters.values():
        if param.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            raise ToolError(
                f"tool {tool_name!r} takes *{param.name}: a model can only send named"
                " arguments, declare each one"
            )
        if param.annotation is ToolContext:
            context_params.add(param.name)
            continue
        if param.annotation is inspect.Parameter.empty:
            raise ToolError(
                f"tool {tool_name!r} parameter {param.name!r} has no type hint: annotate it"
                " so the model is told its type and the arguments can be validated"
            )
        default = (
            Field(alias=param.name)
            if param.default is inspect.Parameter.empty
            else Field(default=param.default, alias=param.name)
        )
        fields[_field_name(param.name)] = (param.annotation, default)
    try:
        model = create_model(
            f"{tool_name}_arguments",
            __config__=ConfigDict(extra="forbid", protected_namespaces=()),
            **fields,
        )
        schema = model.model_json_schema()
    except Exception as exc:
        raise ToolError(
            f"tool {tool_name!r} arguments cannot be described as JSON schema ({exc}):"
            " use JSON-friendly types (str, int, float, bool, list, dict, Literal, Enum,"
            " pydantic models)"
        ) from exc
    # The top-level title is the generated class name, noise for the model.
    schema.pop("title", None)
    return tuple(signature.parameters.values()), frozenset(context_params), model, schema


def read_arguments(tool_name: str, text: str) -> dict[str, JSONValue] | str:
    """The arguments a model sent as JSON text (a provider's wire form), or why they
    cannot be read as it meant them.

    Empty text is no arguments (some servers send ``""`` for a tool without
    parameters). A provider records a call whose text cannot be read as
    ``ToolCall(arguments={}, unparsed_arguments=text)``: the call then fails with
    :class:`ToolArgumentsError` and the model is told (:func:`unparsed_arguments_error`),
    as for arguments that do not validate, rather than the whole answer, already
    paid for, being thrown away.
    """
    if not text.strip():
        return {}
    try:
        decoded = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        return f"tool call {tool_name!r} has arguments that are not valid JSON ({exc})"
    if not isinstance(decoded, dict):
        return f"tool call {tool_name!r} has arguments that are not a JSON object"
    if has_long_digit_run(text.encode()):
        # orjson reads an integer past 64 bits as a float: another value than the model's.
        problem = find_problem(json.loads(text), f"tool call {tool_name!r} arguments", 0)
        if problem is not None:
            return problem
    arguments: dict[str, JSONValue] = decoded
    return arguments


def unparsed_arguments_error(call: ToolCall) -> ToolArgumentsError:
    """The failure of a call whose arguments the model sent as text that cannot be read
    (:attr:`~little_es.values.ToolCall.unparsed_arguments`), told to the model."""
    text = call.unparsed_arguments or ""
    problem = read_arguments(call.name, text)
    why = problem if isinstance(problem, str) else f"tool call {call.name!r} was not read"
    return ToolArgumentsError(
        f"{why}: {text[:2000]!r}. Send the arguments again as one JSON object that matches"
        " the tool's schema",
        tool=call.name,
        fields=("",),
    )


def _arguments_error(tool_name: str, exc: ValidationError) -> ToolArgumentsError:
    problems: list[str] = []
    fields: list[str] = []
    for error in exc.errors(include_url=False):
        field = ".".join(str(part) for part in error["loc"])
        fields.append(field)
        problems.append(f"{field or '(arguments)'}: {error['msg']}")
    return ToolArgumentsError(
        f"tool {tool_name!r} got invalid arguments: {'; '.join(problems)}."
        " Send arguments that match the tool's schema",
        tool=tool_name,
        fields=tuple(dict.fromkeys(fields)),
    )


def _pydantic_default(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    raise TypeError(f"Type is not JSON serializable: {type(value).__name__}")


def _to_json(tool_name: str, result: Any) -> JSONValue:
    """The result as it reads back from JSON; NaN, infinities and nesting beyond
    :data:`~little_es.MAX_JSON_DEPTH` are refused with ``EventPayloadError``."""
    what = f"tool {tool_name!r} result"
    try:
        data = orjson.dumps(result, default=_pydantic_default)
    except TypeError as exc:
        refuse_problem(what, result)
        raise ToolError(
            f"tool {tool_name!r} returned a value that is not JSON ({exc}): return str, int,"
            " float, bool, None, lists and dicts with string keys of those, or a pydantic model"
        ) from exc
    read_back = orjson.loads(data)
    check_json_value(what, result, data, read_back)
    return read_back

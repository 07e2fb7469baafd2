"""Deeply immutable JSON values, for results handed to users (``replay_run``)."""

from __future__ import annotations

from typing import Any, NoReturn


class FrozenDict(dict[Any, Any]):
    """A ``dict`` that refuses every mutation.

    A dict subclass (not a MappingProxyType) so that pydantic, orjson and
    ``json`` serialise it as the plain object it is, and it compares equal to one.
    """

    __slots__ = ()

    def _refuse(self, *_: object, **__: object) -> NoReturn:
        raise TypeError("this mapping is read-only: it is part of an immutable result")

    __setitem__ = _refuse
    __delitem__ = _refuse
    __ior__ = _refuse  # type: ignore[assignment]
    clear = _refuse
    pop = _refuse
    popitem = _refuse
    setdefault = _refuse
    update = _refuse

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(tuple(sorted(self.items(), key=repr)))

    def __reduce__(self) -> tuple[Any, ...]:
        return (FrozenDict, (dict(self),))


def freeze_json(value: Any) -> Any:
    """Return ``value`` with every dict made a FrozenDict and every list a tuple, recursively."""
    if isinstance(value, dict):
        return FrozenDict({k: freeze_json(v) for k, v in value.items()})
    if isinstance(value, list | tuple):
        return tuple(freeze_json(v) for v in value)
    return value

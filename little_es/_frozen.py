"""Deeply read-only JSON-like values.

The run input and step outputs handed to step code, and every value of a
``replay_run`` result, are deep-frozen: dicts become :class:`FrozenDict`,
lists :class:`FrozenList`, sets ``frozenset``. Both are subclasses of
``dict``/``list``, so equality, ``isinstance`` checks, ``json``, orjson and
pydantic serialisation keep working, while every mutation raises ``TypeError``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, NoReturn, SupportsIndex, TypeVar

_K = TypeVar("_K")
_V = TypeVar("_V")


def _read_only(name: str) -> NoReturn:
    raise TypeError(
        f"{name} is read-only: the run input and step outputs are recorded in the log; copy it"
        " (dict(x), list(x)) and change the copy"
    )


# The outputs of a long run repeat the same few keys step after step, and each decoded
# output has its own copy of every one of them: frozen mappings share one. Not
# sys.intern: its table never shrinks, and a mapping keyed by ids would leave it as
# large as the most such keys ever alive. Emptied when full, so it keeps up with the
# keys in use and holds a few tens of KB at most.
_SHARED_KEYS: dict[str, str] = {}
_SHARED_KEYS_MAX = 1024
_SHARED_KEY_MAX_LEN = 40


def _shared_key(key: str) -> str:
    found = _SHARED_KEYS.get(key)
    if found is not None:
        return found
    if len(key) <= _SHARED_KEY_MAX_LEN:
        if len(_SHARED_KEYS) >= _SHARED_KEYS_MAX:
            _SHARED_KEYS.clear()
        _SHARED_KEYS[key] = key
    return key


class FrozenDict(dict[_K, _V]):
    """A ``dict`` that refuses changes; its values are frozen with :func:`freeze`."""

    __slots__ = ()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__()
        source = dict(*args, **kwargs)
        for key, value in source.items():
            if type(key) is str:
                key = _shared_key(key)
            dict.__setitem__(self, key, freeze(value))

    def __setitem__(self, key: _K, value: _V) -> NoReturn:
        _read_only("this mapping")

    def __delitem__(self, key: _K) -> NoReturn:
        _read_only("this mapping")

    def __ior__(self, other: Any) -> NoReturn:  # type: ignore[misc]
        _read_only("this mapping")

    def clear(self) -> NoReturn:
        """Refused: the mapping is read-only."""
        _read_only("this mapping")

    def pop(self, *args: Any) -> NoReturn:
        """Refused: the mapping is read-only."""
        _read_only("this mapping")

    def popitem(self) -> NoReturn:
        """Refused: the mapping is read-only."""
        _read_only("this mapping")

    def setdefault(self, *args: Any) -> NoReturn:
        """Refused: the mapping is read-only."""
        _read_only("this mapping")

    def update(self, *args: Any, **kwargs: Any) -> NoReturn:
        """Refused: the mapping is read-only."""
        _read_only("this mapping")

    def __reduce__(self) -> tuple[Any, ...]:
        # copy/deepcopy/pickle would otherwise rebuild it item by item through
        # the refused __setitem__.
        return (type(self), (dict(self),))

    def __repr__(self) -> str:
        return f"FrozenDict({dict.__repr__(self)})"


class FrozenList(list[_V]):
    """A ``list`` that refuses changes; its items are frozen with :func:`freeze`."""

    __slots__ = ()

    def __init__(self, items: Iterable[_V] = ()) -> None:
        super().__init__(freeze(item) for item in items)

    def __setitem__(self, index: Any, value: Any) -> NoReturn:
        _read_only("this list")

    def __delitem__(self, index: Any) -> NoReturn:
        _read_only("this list")

    def __iadd__(self, other: Any) -> NoReturn:  # type: ignore[misc]
        _read_only("this list")

    def __imul__(self, other: Any) -> NoReturn:  # type: ignore[misc]
        _read_only("this list")

    def append(self, item: _V) -> NoReturn:
        """Refused: the list is read-only."""
        _read_only("this list")

    def extend(self, items: Iterable[_V]) -> NoReturn:
        """Refused: the list is read-only."""
        _read_only("this list")

    def insert(self, index: SupportsIndex, item: _V) -> NoReturn:
        """Refused: the list is read-only."""
        _read_only("this list")

    def pop(self, index: SupportsIndex = -1) -> NoReturn:
        """Refused: the list is read-only."""
        _read_only("this list")

    def remove(self, item: _V) -> NoReturn:
        """Refused: the list is read-only."""
        _read_only("this list")

    def clear(self) -> NoReturn:
        """Refused: the list is read-only."""
        _read_only("this list")

    def sort(self, *args: Any, **kwargs: Any) -> NoReturn:
        """Refused: the list is read-only (``sorted(x)`` gives a sorted copy)."""
        _read_only("this list")

    def reverse(self) -> NoReturn:
        """Refused: the list is read-only (``list(reversed(x))`` gives a reversed copy)."""
        _read_only("this list")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (list(self),))

    def __repr__(self) -> str:
        return f"FrozenList({list.__repr__(self)})"


def freeze(value: Any) -> Any:
    """A deep read-only copy of ``value``; already-frozen containers are returned as they are.

    dict (and any Mapping) -> :class:`FrozenDict`, list -> :class:`FrozenList`,
    tuple -> tuple of frozen items, set -> ``frozenset``; everything else is
    returned unchanged.
    """
    if isinstance(value, FrozenDict | FrozenList | str | bytes | int | float | frozenset):
        return value
    if value is None:
        return None
    if isinstance(value, Mapping):
        return FrozenDict(value)
    if isinstance(value, list):
        return FrozenList(value)
    if isinstance(value, tuple) and type(value) is tuple:
        return tuple(freeze(item) for item in value)
    if isinstance(value, set):
        return frozenset(value)
    return value

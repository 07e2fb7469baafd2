"""Compact instances of the frozen pydantic models a long run holds one of per step.

pydantic gives every instance its own ``__dict__``: a 13-field model costs about
550 bytes before its values, most of it the dict's hash table. CPython can keep
an instance's attributes instead as a bare array of values whose keys live once
on the class (a "split" dict), a third of the size; it does so when the
attributes are set one by one, in the same order, on an instance without a dict
of its own. :func:`construct_compact` builds instances so. They are ordinary instances
of their class (equal, dumped, copied, pickled and hashed as any other); where
the interpreter does not split them, they are as large as before, never larger.

The class learns its keys from the first instances it sees, and stops learning
after a few dozen instances were made without: :func:`prepare_compact` must run right
after the class is defined, before any instance is made.

pydantic dumps, copies and compares a model through its ``__dict__``, and asking a
compact instance for it gives the instance a dict of its own (64 bytes), kept as
long as the instance: :func:`ordinary_copy` is what to dump instead where a long
run's many instances are dumped (snapshots, the workflow's hash).
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel

M = TypeVar("M", bound=BaseModel)

_setattr = object.__setattr__


def prepare_compact(cls: type[BaseModel]) -> None:
    """Teach ``cls`` its field names, in order, so that :func:`construct_compact` can split them."""
    if cls.__pydantic_post_init__ or cls.__private_attributes__ or cls.__pydantic_root_model__:
        raise TypeError(f"{cls.__name__}: only plain models can be built compact")
    first = cls.__new__(cls)
    for name in cls.__pydantic_fields__:
        _setattr(first, name, None)


def construct_compact(cls: type[M], fields_set: set[str], values: dict[str, Any]) -> M:
    """An instance of ``cls`` holding ``values``, trusted and already validated.

    ``values`` must give every field; ``fields_set`` is shared, never copied
    (pydantic copies it before it changes it, in ``model_copy``).
    """
    made = cls.__new__(cls)
    for name in cls.__pydantic_fields__:
        _setattr(made, name, values[name])
    _setattr(made, "__pydantic_fields_set__", fields_set)
    _setattr(made, "__pydantic_extra__", None)
    _setattr(made, "__pydantic_private__", None)
    return made


def construct_ordinary(cls: type[M], fields_set: set[str], values: dict[str, Any]) -> M:
    """An ordinary instance of ``cls`` (with a ``__dict__`` of its own) holding ``values``,
    trusted as in :func:`construct_compact`; ``values`` becomes its ``__dict__``."""
    made = cls.__new__(cls)
    _setattr(made, "__dict__", values)
    _setattr(made, "__pydantic_fields_set__", fields_set)
    _setattr(made, "__pydantic_extra__", None)
    _setattr(made, "__pydantic_private__", None)
    return made


def ordinary_copy(made: M) -> M:
    """An ordinary instance equal to ``made``, to dump."""
    cls = type(made)
    values = {name: getattr(made, name) for name in cls.__pydantic_fields__}
    return construct_ordinary(cls, made.__pydantic_fields_set__, values)

"""`register_pytree_dataclass` / `register_pytree_namedtuple`: let compile_automap walk user types.

Tracing and calls flatten inputs with torch's pytree utilities; these decorators register a
class so its tensor fields become leaves named after the field (`args.0.weight`, ...).
"""

from __future__ import annotations

import dataclasses
from typing import TypeVar

from torch.utils import _pytree as pytree

from .errors import ArgumentError

T = TypeVar("T", bound=type)


def register_pytree_dataclass(cls: T) -> T:
    """Register a @dataclass: its fields (in declaration order) are the children."""
    if not dataclasses.is_dataclass(cls):
        raise ArgumentError(f"register_pytree_dataclass takes a @dataclass class, got {cls!r}")
    names = [f.name for f in dataclasses.fields(cls)]
    pytree.register_pytree_node(
        cls,
        lambda obj: ([getattr(obj, n) for n in names], None),
        lambda children, _: cls(**dict(zip(names, children))),
        flatten_with_keys_fn=lambda obj: ([(pytree.GetAttrKey(n), getattr(obj, n)) for n in names], None),
        serialized_type_name=f"{cls.__module__}.{cls.__qualname__}",
    )
    return cls


def register_pytree_namedtuple(cls: T) -> T:
    """Register a NamedTuple class (torch treats plain namedtuples as tuples; this names the
    leaves after the fields)."""
    if not (issubclass(cls, tuple) and hasattr(cls, "_fields")):
        raise ArgumentError(f"register_pytree_namedtuple takes a NamedTuple class, got {cls!r}")
    names = list(cls._fields)
    pytree.register_pytree_node(
        cls,
        lambda obj: (list(obj), None),
        lambda children, _: cls(*children),
        flatten_with_keys_fn=lambda obj: ([(pytree.GetAttrKey(n), v) for n, v in zip(names, obj)], None),
        serialized_type_name=f"{cls.__module__}.{cls.__qualname__}",
    )
    return cls

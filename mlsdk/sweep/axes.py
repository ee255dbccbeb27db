"""Axes of a sweep: which chip keys each one sets, and the value each key takes at a point.

A key is a dotted YAML path of the base chip (`transfers.dram_to_l2bm.modes.individual.src_lw_per_cycle`);
`*` stands for every key of a mapping, `[i]` for a list item. A value is written as it should
appear in the YAML, or as a factor of the base value (`x0.5`, `x2`): factors keep an integer
key an integer when the product is whole, so `levels.Group.count: [x0.5]` gives 2, not 2.0.
Paths are resolved against the base once, when the sweep starts: a typo is the SPEC's error
(with its line), not a failure of every point.
"""

from __future__ import annotations

import copy
import math
import re
from dataclasses import dataclass
from typing import Any

from hwdesc.source import KeyPath, key_path_text

from ..errors import SweepSpecError
from .spec import LinkedAxis, LoadedSpec, Value

_CHUNK = re.compile(r"([^.\[\]\s]+)((?:\[\d+\])*)")


@dataclass(frozen=True)
class Factor:
    """A value written `x<number>`: that multiple of the base value of each key."""

    times: float

    def __str__(self) -> str:
        return f"x{self.times:g}"


@dataclass(frozen=True)
class Axis:
    name: str
    keys: tuple[KeyPath, ...]  # resolved against the base: every key exists there
    values: tuple[Value | Factor, ...]

    @staticmethod
    def column(value: Value | Factor) -> Value:
        """What the results table shows for a value: the number written, the factor for factors."""
        return value.times if isinstance(value, Factor) else value


def parse_path(text: str) -> tuple[str | int, ...]:
    """`a.b[2].c` -> ('a', 'b', 2, 'c'); SweepSpecError (not located) if it is not a dotted path."""
    parts: list[str | int] = []
    for chunk in text.split("."):
        m = _CHUNK.fullmatch(chunk)
        if m is None:
            raise SweepSpecError(f"{text!r} is not a dotted YAML path (a.b.c, a.b[0], a.*.c)")
        parts.append(m.group(1))
        parts.extend(int(i) for i in re.findall(r"\[(\d+)\]", m.group(2)))
    return tuple(parts)


def parse_value(value: Value) -> Value | Factor:
    if isinstance(value, str) and re.fullmatch(r"x\s*[-+0-9.eE]+", value):
        try:
            return Factor(float(value[1:]))
        except ValueError:
            pass
    return value


def resolve_axes(loaded: LoadedSpec, base: dict[str, Any]) -> list[Axis]:
    """The SPEC's axes against the base chip's data; SweepSpecError (SPEC file:line) for a path
    the base lacks, a wildcard that matches nothing, or a factor of a value that is not a number."""
    axes = []
    for name, given in loaded.spec.axes.items():
        texts, values = (given.paths, given.values) if isinstance(given, LinkedAxis) else ([name], given)
        where = ("axes", name)
        keys: list[KeyPath] = []
        for text in texts:
            try:
                pattern = parse_path(text)
            except SweepSpecError as e:
                loaded.fail(where, str(e))
            found = expand(base, pattern)
            if isinstance(found, str):
                loaded.fail(where, f"{text}: {found}")
            keys.extend(found)
        parsed = tuple(parse_value(v) for v in values)
        for key in keys:
            current = lookup(base, key)
            if isinstance(current, (dict, list)):
                loaded.fail(where, f"{key_path_text(key)} is a {'mapping' if isinstance(current, dict) else 'list'} "
                                   "in the base chip; an axis sets single values")
            if any(isinstance(v, Factor) for v in parsed) and not is_number(current):
                loaded.fail(where, f"{key_path_text(key)} is {current!r} in the base chip; a factor (x...) "
                                   "multiplies a number")
        shown = [Axis.column(v) for v in parsed]  # x2 and 2 would be one column value
        for i, v in enumerate(shown):
            if v in shown[:i]:
                loaded.fail(where, f"the value {values[i]!r} is given twice (as {values[shown.index(v)]!r}); "
                                   "each value of an axis names one point")
        axes.append(Axis(name, tuple(dict.fromkeys(keys)), parsed))
    taken: dict[KeyPath, str] = {}
    for axis in axes:
        for key in axis.keys:
            if key in taken:
                loaded.fail(("axes", axis.name), f"{key_path_text(key)} is also set by axis {taken[key]!r}; "
                                                 "an axis per key")
            taken[key] = axis.name
    return axes


def expand(data: Any, pattern: tuple[str | int, ...]) -> list[KeyPath] | str:
    """The key paths `pattern` matches in `data`, or why it matches none."""
    paths: list[KeyPath] = [()]
    for depth, part in enumerate(pattern):
        nxt: list[KeyPath] = []
        for path in paths:
            node = lookup(data, path)
            if part == "*":
                if isinstance(node, dict):
                    nxt.extend((*path, k) for k in node)
            elif isinstance(part, int):
                if isinstance(node, list) and part < len(node):
                    nxt.append((*path, part))
            elif isinstance(node, dict) and part in node:
                nxt.append((*path, part))
        if not nxt:
            where = key_path_text(pattern[:depth]) or "the top level"
            node = lookup(data, paths[0]) if len(paths) == 1 else None
            keys = f" (keys there: {', '.join(map(str, node))})" if isinstance(node, dict) else ""
            return f"the base chip has no {part!r} under {where}{keys}"
        paths = nxt
    return paths


def lookup(data: Any, path: KeyPath) -> Any:
    for part in path:
        data = data[part]
    return data


def apply(base: dict[str, Any], settings: list[tuple[Axis, Value | Factor]]) -> dict[str, Any]:
    """A copy of the base data with every axis key set to its value at this point."""
    data = copy.deepcopy(base)
    for axis, value in settings:
        for key in axis.keys:
            parent = lookup(data, key[:-1])
            parent[key[-1]] = scaled(parent[key[-1]], value)
    return data


def scaled(current: Any, value: Value | Factor) -> Any:
    if not isinstance(value, Factor):
        return value
    product = current * value.times
    if isinstance(current, int) and not isinstance(current, bool) and math.isclose(product, round(product)):
        return int(round(product))  # 100 x1.1 is 110, not 110.00000000000001
    return product


def is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)

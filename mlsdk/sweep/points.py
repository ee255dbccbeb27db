"""Points of a sweep: which combinations of axis values run, and the chip each one describes.

A point is numbered by its place in the grid (the first axis slowest, as in `itertools.product`),
whether the grid is run whole or sampled, so a point keeps its number when the sample grows.
Its chip is the base description with the point's values written in, validated like any YAML
file: a value the simulator cannot serve makes the point invalid (reported with the YAML path
and the reason, as `hw validate` would say it, but with no file), not the sweep.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, NoReturn

import numpy as np

import hwdesc
from hwdesc import HwDesc, HwDescError
from hwdesc.source import Document, KeyPath

from .axes import Axis, Factor, apply
from .spec import RandomSample, Value

MAX_GRID = 1_000_000  # past this, a grid is refused: draw a random sample of it instead


@dataclass
class Point:
    index: int  # place in the grid
    settings: list[tuple[Axis, Value | Factor]] = field(repr=False)
    hw: HwDesc | None = None  # None when the values do not describe a valid chip
    error: str | None = None  # why not

    @property
    def values(self) -> dict[str, Value]:
        """Axis name -> what the results table shows (the value, or the factor)."""
        return {axis.name: axis.column(value) for axis, value in self.settings}

    @property
    def label(self) -> str:
        return ", ".join(f"{axis.name}={value}" for axis, value in self.settings)


def grid_size(axes: list[Axis]) -> int:
    return math.prod(len(a.values) for a in axes)


def chosen(axes: list[Axis], sample: str | RandomSample, fail: Callable[[KeyPath, str], NoReturn]) -> list[int]:
    """The grid indices that run: all of them, or a seeded sample without repeats; `fail`
    reports a grid too large to run whole."""
    size = grid_size(axes)
    if isinstance(sample, RandomSample):
        n = min(sample.random, size)
        return sorted(int(i) for i in np.random.default_rng(sample.seed).choice(size, n, replace=False))
    if size > MAX_GRID:
        fail(("axes",), f"the grid has {size:,} points (more than {MAX_GRID:,}); draw a sample of it: "
                        "sample: {random: N, seed: 0}")
    return list(range(size))


def settings_at(axes: list[Axis], index: int) -> list[tuple[Axis, Value | Factor]]:
    """The value of each axis at grid index `index` (mixed radix, the last axis fastest)."""
    out = []
    for axis in reversed(axes):
        index, i = divmod(index, len(axis.values))
        out.append((axis, axis.values[i]))
    return out[::-1]


def derive(base: HwDesc, base_data: dict[str, Any], axes: list[Axis], index: int) -> Point:
    """The point at grid index `index` with its chip (or the reason it has none)."""
    point = Point(index, settings_at(axes, index))
    data = apply(base_data, point.settings)
    data["name"] = f"{base.name}[{point.label}]"
    try:
        point.hw = hwdesc.from_document(Document(data=data, locations={}, provenance={}))
    except HwDescError as e:
        point.error = str(e)
    return point


def base_data(base: HwDesc) -> dict[str, Any]:
    """The base chip as the plain data a variant is derived from (every field written out, lists
    as lists, so that axes can name their items)."""
    return base.model_dump(mode="json")


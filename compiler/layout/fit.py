"""Fitting PFN notation to a numeric element -> location map.

The compiler computes some placements numerically (the DRAM image that plain block transfers
turn into an LM layout is a composition of the transfer modes' data patterns). A layout string
is still what users and IOSpecs read, so `fit_layout` recovers the factors: per dimension, from
the minor end, each digit's step must move exactly one target (an axis coordinate, the address
or W), and the fitted layout must reproduce every element's location, or there is none.
"""

from __future__ import annotations

from math import prod

import numpy as np

from hwdesc import HwDesc

from ..errors import LayoutError
from .layout import ADDRESS, Broadcast, Factor, Layout
from .placement import Placement


def fit_layout(shape: tuple[int, ...], targets: dict[str | None, np.ndarray], hw: HwDesc, memory: str, dtype: str,
               broadcast: tuple[Broadcast, ...] = ()) -> Layout:
    """The layout placing element e (flat, row-major) at targets[axis][e] on every target.

    `targets` maps an axis name (None for the address, "W" for the element in the long word) to
    the coordinate of every element; the map must be linear in mixed-radix digits of each
    dimension. Raises LayoutError when no layout reproduces it."""
    names = list(targets)
    values = np.stack([np.asarray(targets[n], dtype=np.int64).ravel() for n in names])
    if values[:, 0].any():
        raise LayoutError(f"element 0 is not at the origin ({dict(zip(names, values[:, 0].tolist()))})")
    strides = [prod(shape[d + 1:]) for d in range(len(shape))]
    dims = []
    for d, extent in enumerate(shape):
        dims.append(_fit_dim(values[:, np.arange(extent) * strides[d]], names, extent, d))
    layout = Layout.of(dims, shape, broadcast)
    try:
        placement = Placement(layout, hw, memory, dtype)
    except LayoutError as e:
        raise LayoutError(f"fitted layout {layout} is not legal: {e}") from None
    loc = placement.locate(first_copy_only=True)
    got = {None: loc.lw, "W": loc.w, **loc.coords}
    for n, row in zip(names, values):
        if not np.array_equal(got[n] if n in got else np.zeros_like(row), row):
            raise LayoutError(f"no layout reproduces the map: {layout} misplaces {n or 'the address'}")
    return layout


def _fit_dim(values: np.ndarray, names: list, extent: int, d: int) -> list[Factor]:
    """Factors of one dimension, major to minor, from the locations of its indices 0..extent-1."""
    factors: list[Factor] = []
    unit = 1
    while unit < extent:
        step = values[:, unit]
        moved = np.flatnonzero(step)
        if len(moved) != 1 or step[moved[0]] < 0:
            raise LayoutError(f"dimension {d}: index {unit} moves {dict(zip(names, step.tolist()))}; a digit must "
                              f"move exactly one target forward")
        size = 2
        while size * unit < extent and np.array_equal(values[:, size * unit], size * step):
            size += 1
        size = min(size, -(-extent // unit))
        target = names[moved[0]]
        factors.insert(0, Factor(size, ADDRESS if target is None else target, int(step[moved[0]])))
        unit *= size
    return factors or [Factor(1, ADDRESS, 1)]

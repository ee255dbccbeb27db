"""Reshaping a layout: the same placement read with another shape (no data moves).

An unpadded layout is a list of mixed-radix digits of the flat (row-major) index, split into
dimensions; a reshape splits the same digit list at other places, cutting a factor in two
where a new dimension boundary falls inside it. Padded layouts, or boundaries that do not
divide a factor, cannot be reshaped in place; the caller then gathers into a new layout.
"""

from __future__ import annotations

from .layout import ADDRESS, Factor, Layout


def reshape_layout(layout: Layout, shape: tuple[int, ...]) -> Layout | None:
    if layout.extents != layout.shape:
        return None
    digits = [f for dim in layout.dims for f in dim if f.size > 1]
    dims: list[list[Factor]] = []
    for size in reversed(shape):
        need, dim = size, []
        while need > 1:
            if not digits:
                return None
            f = digits.pop()
            if need % f.size == 0:
                dim.insert(0, f)
                need //= f.size
            elif f.size % need == 0:
                dim.insert(0, Factor(need, f.axis, f.stride))
                digits.append(Factor(f.size // need, f.axis, f.stride * need))
                need = 1
            else:
                return None
        dims.insert(0, dim or [Factor(1, ADDRESS, 1)])
    if digits:
        return None
    # size-1 factors carried which axes the layout names (that decides broadcast): keep them
    named = {f.axis for dim in layout.dims for f in dim if f.axis is not None}
    kept = {f.axis for dim in dims for f in dim if f.axis is not None}
    extra = [Factor(1, axis, 1) for axis in sorted(named - kept, key=str)]
    if extra:
        dims[0] = dims[0] + extra
    return Layout.of(dims, tuple(shape), layout.broadcast)

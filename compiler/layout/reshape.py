"""Reshaping a layout: the same placement read with another shape (no data moves).

An unpadded layout is a list of mixed-radix digits of the flat (row-major) index, split into
dimensions; a reshape splits the same digit list at other places, cutting a factor in two
where a new dimension boundary falls inside it. A reshape that only adds or drops dimensions of
size 1 keeps every other dimension's factors as they are, padded or not. Other reshapes of padded
layouts, or boundaries that do not divide a factor, cannot be made in place; the caller then
gathers into a new layout.
"""

from __future__ import annotations

from .layout import ADDRESS, Factor, Layout


def reshape_layout(layout: Layout, shape: tuple[int, ...]) -> Layout | None:
    if [n for n in layout.shape if n != 1] == [n for n in shape if n != 1]:
        return _unit_dims_changed(layout, shape)
    if layout.extents != layout.shape:
        return _around_padding(layout, shape)
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
    return _with_named_axes(layout, dims, shape)


def _around_padding(layout: Layout, shape: tuple[int, ...]) -> Layout | None:
    """A reshape of a padded layout that keeps its leading and trailing dimensions as they are
    (padding included) and regroups those between them, which must be unpadded: a product's
    (B*T, N) output, N padded to the lanes, read as (B, T, N). None otherwise."""
    old = layout.shape
    tail = 0
    while tail < min(len(old), len(shape)) and old[-1 - tail] == shape[-1 - tail]:
        tail += 1
    head = 0
    while head < min(len(old), len(shape)) - tail and old[head] == shape[head]:
        head += 1
    inner = range(head, len(old) - tail)
    if not inner or any(layout.extents[i] != old[i] for i in inner):
        return None
    middle = reshape_layout(Layout.of([layout.dims[i] for i in inner], tuple(old[i] for i in inner)),
                            tuple(shape[head:len(shape) - tail]))
    if middle is None:
        return None
    dims = [list(d) for d in layout.dims[:head]] + [list(d) for d in middle.dims] + \
        [list(d) for d in layout.dims[len(old) - tail:]]
    return _with_named_axes(layout, dims, shape)


def _unit_dims_changed(layout: Layout, shape: tuple[int, ...]) -> Layout | None:
    """`layout` read with dimensions of size 1 added or dropped (an embedding's (V, D) table read
    as (1, V, D)): every other dimension keeps its factors, padding included. A size-1 dimension
    whose factors span several positions (padded) must stay one; None when it cannot."""
    old, dims = list(zip(layout.shape, layout.dims)), []
    padded = lambda dim: any(f.size > 1 for f in dim)  # noqa: E731
    i = 0
    for n in shape:
        while i < len(old) and old[i][0] == 1 and old[i][0] != n and not padded(old[i][1]):
            i += 1  # a unit dimension dropped
        if i < len(old) and old[i][0] == n:
            dims.append(list(old[i][1]))
            i += 1
        elif n == 1:
            dims.append([Factor(1, ADDRESS, 1)])  # a unit dimension added
        else:
            return None
    if any(size != 1 or padded(dim) for size, dim in old[i:]):
        return None
    return _with_named_axes(layout, dims, shape)


def _with_named_axes(layout: Layout, dims: list[list[Factor]], shape: tuple[int, ...]) -> Layout:
    """The reshaped layout; size-1 factors carried which axes the layout names (that decides
    broadcast): those the new dimensions lost are kept on the first."""
    named = {f.axis for dim in layout.dims for f in dim if f.axis is not None}
    kept = {f.axis for dim in dims for f in dim if f.axis is not None}
    extra = [Factor(1, axis, 1) for axis in sorted(named - kept, key=str)]
    if extra:
        dims[0] = dims[0] + extra
    return Layout.of(dims, tuple(shape), layout.broadcast)

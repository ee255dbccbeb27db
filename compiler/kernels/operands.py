"""An operand's LM layout derived from the layout an operation iterates in (torch broadcasting).

A kernel iterates in one LM layout (its output's for element-wise ops); each tensor operand is
laid out by dropping the factors of the dimensions it broadcasts over: their hardware axes become
copies, their W factor makes the value fill every lane, their address factors vanish. `per_pe`
gives each factor's element stride inside a PE, which the VOP loops walk.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

from ..errors import CompileError, LayoutError
from ..layout import ADDRESS, TIME_AXIS, W_AXIS, Broadcast, Factor, Layout
from ..layout.layout import spread


@dataclass(frozen=True)
class Restricted:
    """An operand's layout derived from the layout an op iterates in."""

    layout: Layout
    source: tuple[int | None, ...]  # for each factor of the op's layout (flattened), the operand's factor


def flat_factors(layout: Layout) -> list[tuple[int, Factor]]:
    return [(d, f) for d, dim in enumerate(layout.dims) for f in dim]


def restrict(layout: Layout, in_shape: tuple[int, ...]) -> Restricted:
    """The layout of an operand of shape `in_shape` broadcast (torch rules) to `layout.shape`.

    Factors of broadcast dimensions are dropped: their hardware axes become replicated, their W
    factor becomes `B@[W]` (the value in every lane), their address and Time factors vanish; the
    remaining address factors are renumbered densely, keeping their order, and so are the Time
    factors (slices numbered 0, 2 of 3 were staged as if dense: adaptive max pooling's indices
    on mini read another channel's slice)."""
    out_shape = layout.shape
    offset = len(out_shape) - len(in_shape)
    if offset < 0:
        raise CompileError(f"an operand of shape {in_shape} does not broadcast to {out_shape}")
    keep_dim = []
    for d in range(len(out_shape)):
        k = d - offset
        keep_dim.append(k >= 0 and in_shape[k] == out_shape[d])
        if k >= 0 and in_shape[k] not in (1, out_shape[d]):
            raise CompileError(f"an operand of shape {in_shape} does not broadcast to {out_shape}")
    factors = flat_factors(layout)
    new_stride = {}
    for kind in (None, TIME_AXIS):  # address and Time factors each renumbered densely, in their order
        kept = sorted((i for i, (d, f) in enumerate(factors) if keep_dim[d] and f.axis == kind),
                      key=lambda i: factors[i][1].stride)
        acc = 1
        for i in kept:
            new_stride[i] = acc
            acc *= factors[i][1].size
    dims: list[list[Factor]] = [[] for _ in in_shape]
    position: list[tuple[int, int] | None] = []  # (operand dim, index in it) of each factor
    dropped_w = False
    for i, (d, f) in enumerate(factors):
        k = d - offset
        if not keep_dim[d]:
            position.append(None)
            dropped_w |= f.axis == W_AXIS
            continue
        dims[k].append(Factor(f.size, f.axis, new_stride[i]) if i in new_stride else f)
        position.append((k, len(dims[k]) - 1))
    first = [sum(len(dims[j]) or 1 for j in range(k)) for k in range(len(in_shape))]
    source = tuple(None if p is None else first[p[0]] + p[1] for p in position)
    dims = [dim or [Factor(1, ADDRESS, 1)] for dim in dims]
    broadcast = _replicas_after_drop(layout, [f for d, f in factors if not keep_dim[d]], dims)
    if dropped_w:
        broadcast += (Broadcast(W_AXIS),)
    return Restricted(Layout.of(dims, in_shape, broadcast), tuple(source))


def _replicas_after_drop(layout: Layout, dropped: list[Factor], kept: list[list[Factor]]) -> tuple[Broadcast, ...]:
    """`B@` items of an operand whose broadcast dimensions' factors were dropped. An axis no kept
    factor places is replicated everywhere (implicitly); one that kept factors still place is
    replicated over the positions the dropped factors (and any copies) used, as a sized item."""
    placed = {f.axis for dim in kept for f in dim if f.axis not in (ADDRESS, W_AXIS, TIME_AXIS) and f.size > 1}
    offsets: dict[str, set[int]] = {}
    for f in dropped:
        if f.axis in placed:
            offsets[f.axis] = spread(offsets.get(f.axis, {0}), f.size, f.stride)
    out = []
    for b in layout.broadcast:
        if b.axis in offsets and layout.adds_copies(b):
            offsets[b.axis] = spread(offsets[b.axis], b.size, b.stride)
        elif b.axis in placed or not layout.adds_copies(b):
            out.append(b)  # (copies on an axis nothing places any more: every position, implicitly)
    for axis, positions in offsets.items():
        ordered = sorted(positions)
        step = ordered[1] if len(ordered) > 1 else 1
        if ordered != list(range(0, len(ordered) * step, step)):
            raise LayoutError(f"broadcasting {layout} leaves {axis} copies at positions {ordered}, which no B@ item "
                              f"describes (they are not evenly spaced)")
        out.append(Broadcast(axis, len(ordered), step))
    return tuple(out)


def per_pe(layout: Layout, epl: int) -> list[tuple[int, int]]:
    """(size, element stride) of every factor within one PE and one time slice: address factors
    move stride * epl elements, W factors their stride, hardware-axis and Time factors nothing."""
    out = []
    for _, f in flat_factors(layout):
        if f.axis is None:
            out.append((f.size, f.stride * epl))
        elif f.axis == W_AXIS:
            out.append((f.size, f.stride))
        else:
            out.append((f.size, 0))
    return out


def slice_count(layout: Layout) -> int:
    return prod(f.size for _, f in flat_factors(layout) if f.axis == TIME_AXIS)


def operand_slice(iteration: Layout, operand: Restricted, t: int) -> int:
    """The time slice of an operand that iteration slice `t` reads: each of the iteration's Time
    digits of `t` that the operand keeps, at the operand's stride for it."""
    factors = flat_factors(iteration)
    mine = flat_factors(operand.layout)
    index = 0
    for k, (_, f) in enumerate(factors):
        if f.axis != TIME_AXIS or operand.source[k] is None:
            continue
        digit = (t // f.stride) % f.size
        index += digit * mine[operand.source[k]][1].stride
    return index

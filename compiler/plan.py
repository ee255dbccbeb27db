"""Layout decisions: which LM layout an operation computes in, and what that implies for its
operands (broadcasting), its slices (tensors larger than LM) and its loops.

Choices come from the chip's candidate layouts (compiler.layout.candidates) and are kept only if
the staging chain can feed them (compiler.transfer.staging); a producer's layout is reused by
its consumers when it fits, so values move between kernels by plain block copies.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import Callable

from hwdesc import HwDesc

from .errors import CompileError, LayoutError
from .layout import ADDRESS, TIME_AXIS, W_AXIS, Broadcast, Factor, Layout, Placement
from .layout.layout import spread
from .layout.candidates import candidates
from .transfer.staging import stage

LM = "LM0"


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
    factor becomes `B@[W]` (the value in every lane), their address factors vanish; the remaining
    address factors are renumbered densely, keeping their order."""
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
    kept_addr = sorted((i for i, (d, f) in enumerate(factors) if keep_dim[d] and f.axis is None),
                       key=lambda i: factors[i][1].stride)
    new_stride, acc = {}, 1
    for i in kept_addr:
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
        dims[k].append(Factor(f.size, f.axis, new_stride[i]) if f.axis is None else f)
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


def time_sliced(layout: Layout, slices: int) -> Layout:
    """`layout` for dim 0 cut into `slices` time slices (the slice index outermost)."""
    if slices == 1:
        return layout
    dims = [list(d) for d in layout.dims]
    dims[0] = [Factor(slices, TIME_AXIS, 1)] + dims[0]
    shape = (layout.shape[0] * slices,) + layout.shape[1:]
    return Layout.of(dims, shape, layout.broadcast)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def choose(shape: tuple[int, ...], dtype: str, hw: HwDesc, *, budget_lw: int, for_upload: bool = True,
           prefer: list[Layout] | None = None, accept: Callable[[Layout], bool] | None = None) -> Layout:
    """An LM layout for a tensor: one of `prefer` if it fits and stages, else the best candidate,
    time-sliced along dimension 0 if the whole tensor is larger than `budget_lw` per PE. `accept`
    may veto layouts (an op whose operands could not be staged in the layouts they imply)."""
    ok = accept or (lambda layout: True)
    for layout in prefer or []:
        if layout.shape == tuple(shape) and _usable(layout, hw, dtype, budget_lw, for_upload) and ok(layout):
            return layout
    shape = tuple(shape) or (1,)
    for slices in _divisors(shape[0]):
        sub = (shape[0] // slices,) + shape[1:]
        try:
            found = candidates(sub, dtype, hw, LM)
        except LayoutError:
            continue
        for c in found:
            layout = time_sliced(c.layout, slices)
            if _usable(layout, hw, dtype, budget_lw, for_upload) and ok(layout):
                return layout
    raise CompileError(f"no LM layout of a {dtype} tensor of shape {shape} fits {budget_lw} long words per PE "
                       f"on {hw.name}")


def _usable(layout: Layout, hw: HwDesc, dtype: str, budget_lw: int, for_upload: bool) -> bool:
    try:
        p = Placement(layout, hw, LM, dtype, check_capacity=False)
        if p.slice_span > budget_lw:
            return False
        st = stage(p)
    except LayoutError:
        return False
    return not (for_upload and (st.pe_mode == "broadcast" or st.fitted is None))


def stageable(layout: Layout, hw: HwDesc, dtype: str) -> bool:
    try:
        stage(Placement(layout, hw, LM, dtype, check_capacity=False))
        return True
    except LayoutError:
        return False

"""LM layouts that spread a tensor of any shape over the chip's PEs, padding where sizes do not divide.

Every static shape gets layouts: 0-d and size-1 tensors, odd and prime sizes included. Each
hardware axis (leaf to root: PE, MAB, L1B, L2B on MN-Core 2) is given to the dimension with the
most elements left, taking a divisor of the axis' positions (so that the layout's digits split
evenly at every transfer chunk, see compiler.transfer.staging) that holds what is left, or the
whole axis; the dimension is padded up to a multiple. Lanes (W) pack the last dimension (or
another one), or are broadcast. Variants differ in where the axes sit inside their dimension:
blocked (axes major: each PE holds a contiguous run) or cyclic (axes minor).

Layouts larger than an LM budget are cut into time slices: the dimension with the most address
positions gets an outermost `Time` factor.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import ceil, prod

from hwdesc import HwDesc

from .layout import TIME_AXIS, W_AXIS, Broadcast, Factor, Layout


def _divisor_at_least(size: int, need: int) -> int:
    """The smallest divisor of `size` that is >= need, or `size` itself."""
    for d in range(1, size + 1):
        if size % d == 0 and d >= need:
            return d
    return size


@dataclass(frozen=True)
class Spread:
    """A recipe for one layout: the lane dimension (or None: lanes broadcast), axis order style,
    and which dimension each hardware axis prefers when two have as many elements left."""

    pack: int | None
    cyclic: bool
    inner_first: bool = True
    leaf_dims: tuple[int, ...] | None = None  # dims the leaf axis (PE) may take (those every operand has)
    unit_follows_leaf: bool = False  # the axis above the leaf (MAB) goes to the leaf's dimension or nowhere
    root_first: bool = False  # give the root axes (Groups, L2Bs) their positions first: spreads DRAM traffic


def spread(shape: tuple[int, ...], epl: int, axes: dict[str, int], recipe: Spread,
           budget_lw: int | None = None) -> Layout:
    """One padded LM layout of `shape` (see the module doc)."""
    shape = shape or (1,)
    rank = len(shape)
    remaining = list(shape)
    w = 1
    if recipe.pack is not None and epl > 1:
        w = epl
        remaining[recipe.pack] = ceil(shape[recipe.pack] / epl)
    placed: list[list[Factor]] = [[] for _ in shape]
    names = list(axes)
    leaf, unit = names[-1], names[-2] if len(names) > 1 else None
    leaf_dim = None
    sequence = list(axes.items()) if recipe.root_first else list(reversed(list(axes.items())))
    if recipe.root_first:  # the leaf still goes first when it is restricted to some dims
        sequence = sequence[-1:] + sequence[:-1] if recipe.leaf_dims is not None else sequence
    for name, size in sequence:  # leaf to root, or root to leaf
        order = list(range(rank - 1, -1, -1) if recipe.inner_first else range(rank))
        if name == leaf and recipe.leaf_dims is not None:
            order = [d for d in order if d in recipe.leaf_dims] or order
        if name == unit and recipe.unit_follows_leaf:
            order = [leaf_dim] if leaf_dim is not None else []
        if not order:
            continue
        dim = max(order, key=lambda d: remaining[d])
        if name == leaf:
            leaf_dim = dim
        if remaining[dim] <= 1 or size <= 1:
            continue
        take = _divisor_at_least(size, min(remaining[dim], size))
        placed[dim].insert(0, Factor(take, name, 1))
        remaining[dim] = ceil(remaining[dim] / take)
    if not any(f.axis == leaf for dim in placed for f in dim):  # the PE axis is always placed (size 1 when
        placed[rank - 1].append(Factor(1, leaf, 1))  # nothing is left for it): a staging mode exists then
    root = names[0]
    if root != leaf and not any(f.axis == root for dim in placed for f in dim):
        placed[0].insert(0, Factor(1, root, 1))  # a small tensor on the first Group only: no copy in every DRAM
    time: list[int] = [1] * rank
    while budget_lw is not None and prod(remaining) > budget_lw:  # time slices, outermost dimension first:
        dim = next(d for d in range(rank) if remaining[d] > 1)  # each slice a block of whole rows
        per = max(1, budget_lw // max(1, prod(remaining) // remaining[dim]))
        slices = ceil(remaining[dim] / per)
        time[dim] *= slices
        remaining[dim] = ceil(remaining[dim] / slices)
    time_strides = [prod(time[d + 1:]) for d in range(rank)]  # slice index: row-major over the dims
    strides = [prod(remaining[d + 1:]) for d in range(rank)]
    dims = []
    for d in range(rank):
        address = [Factor(remaining[d], None, strides[d])] if remaining[d] > 1 else []
        lanes = [Factor(w, W_AXIS, 1)] if d == recipe.pack and w > 1 else []
        head = [Factor(time[d], TIME_AXIS, time_strides[d])] if time[d] > 1 else []
        body = address + placed[d] if recipe.cyclic else placed[d] + address
        dims.append(head + body + lanes or [Factor(1, None, 1)])
    broadcast = () if w > 1 or epl == 1 else (Broadcast(W_AXIS),)
    return Layout.of(dims, shape, broadcast)


def recipes(shape: tuple[int, ...], epl: int, leaf_dims: tuple[int, ...] | None = None) -> list[Spread]:
    """The recipes worth trying for a shape: lanes on the last dimension first, then on other
    dimensions that fill whole long words, then broadcast lanes; blocked before cyclic. With
    `leaf_dims`, the PE axis goes to one of those dimensions (the ones every operand of an
    element-wise op has: an operand broadcast along the PE axis but not along the MAB axis could
    not be staged)."""
    shape = shape or (1,)
    rank = len(shape)
    packs: list[int | None] = []
    if shape[-1] > 1:
        packs.append(rank - 1)
    packs += [d for d in range(rank - 1) if shape[d] % epl == 0 and shape[d] > 1]
    if not packs or shape[-1] < epl:
        packs.append(None)
    out = []
    for pack in packs:
        for cyclic in (False, True):
            out.append(Spread(pack, cyclic, True, leaf_dims))
            out.append(Spread(pack, cyclic, False, leaf_dims))
            if leaf_dims is not None:  # operands without the PE's dimension lose the MAB's too: broadcast
                out.append(Spread(pack, cyclic, True, None, True))
                out.append(Spread(pack, cyclic, False, None, True))
        out.insert(min(1, len(out)), Spread(pack, False, True, leaf_dims, False, True))
    return out


def lane_runs_recipe(dim: int, cyclic: bool) -> Spread:
    """The recipe of `lane_runs`: lanes on `dim`, the PE axis on it and the MAB axis after it."""
    return Spread(dim, cyclic, True, (dim,), True)


def lane_runs(shape: tuple[int, ...], epl: int, axes: dict[str, int], dim: int, budget_lw: int | None = None
              ) -> list[Layout]:
    """Layouts with lanes on `dim` and that dim's long words on the innermost axes (the PEs, then
    the MABs), whose order a DRAM image keeps (within a chunk of long words dealt to one L1B): a
    tensor stored channels-last (a convolution's output) stages into them, and a window copying
    the channels (pooling, a convolution's im2col) gathers from their images, in runs of a
    pixel's channels rather than one long word an MV. Blocked (the axes outermost) and cyclic
    (the address outermost), the latter first when the dim has more long words than those axes
    hold: its address digit then varies slowest, and consecutive long words stay on consecutive
    PEs (a consumer offers the first wish it can make)."""
    names = list(axes)
    held = prod(axes[a] for a in names[-2:])  # the PE axis and the one above it (the MAB)
    found = []
    for cyclic in ((True, False) if ceil(shape[dim] / epl) > held else (False, True)):
        layout = spread(shape, epl, axes, lane_runs_recipe(dim, cyclic), budget_lw)
        if layout not in found:
            found.append(layout)
    return found


def lm_layouts(shape: tuple[int, ...], dtype: str, hw: HwDesc, budget_lw: int | None = None,
               leaf_dims: tuple[int, ...] | None = None) -> list[Layout]:
    """Distinct padded LM layouts of a tensor, best guess first."""
    epl = hw.elements_per_lw(dtype)
    seen: list[Layout] = []
    for r in recipes(tuple(shape), epl, leaf_dims):
        layout = spread(tuple(shape), epl, hw.axes, r, budget_lw)
        if layout not in seen:
            seen.append(layout)
    return seen


def time_sliced(layout: Layout, budget_lw: int, epl: int) -> Layout | None:
    """`layout` cut into time slices of at most `budget_lw` long words per PE: the outermost address
    factor of some dimension becomes (Time, address). A factor that is its dimension's outermost may
    be padded; any other must divide. None when no cut fits."""
    span = _span(layout)
    if span <= budget_lw:
        return layout
    best = None
    for d, dim in enumerate(layout.dims):
        for k, f in enumerate(dim):
            if f.axis is not None or f.size == 1 or any(g.axis == TIME_AXIS for g in dim):
                continue
            outermost = all(g.size == 1 for g in dim[:k])
            for t in range(2, f.size + 1):
                per = ceil(f.size / t)
                if not outermost and f.size % t:
                    continue
                new_span = _span_with(layout, d, k, per)
                if new_span <= budget_lw:
                    cand = (t * per - f.size, t, d, k, per)
                    if best is None or cand < best:
                        best = cand
                    break
    if best is None:
        return None
    _, t, d, k, per = best
    dims = [list(dim) for dim in layout.dims]
    f = dims[d][k]
    # the new slices go outside the layout's own (another dim's Time factor of a reduction's
    # layout): numbered from 1 they overlapped them ("factors 2_Time:1, 2_Time:1 overlap")
    outside = max((g.size * g.stride for _, g in layout.factors if g.axis == TIME_AXIS), default=1)
    dims[d][k:k + 1] = [Factor(t, TIME_AXIS, outside), Factor(per, None, f.stride)]
    return Layout.of(dims, layout.shape, layout.broadcast)


def _span(layout: Layout) -> int:
    return sum((f.size - 1) * f.stride for _, f in layout.factors if f.axis is None) + 1


def _span_with(layout: Layout, d: int, k: int, size: int) -> int:
    total = 1
    for dd, dim in enumerate(layout.dims):
        for kk, f in enumerate(dim):
            if f.axis is None:
                total += ((size if (dd, kk) == (d, k) else f.size) - 1) * f.stride
    return total

"""Reductions (sum, max, min, product over dimensions), inside each PE.

The input is laid out so that reduced dimensions never cross PEs: kept dimensions are spread over
the chip's axes (padded where sizes do not divide), reduced ones are address digits (and lanes,
when they fill them). A VOP accumulates along them (the output's element stride is 0 on reduced
digits) after the output is set to the reduction's identity. When the lanes were reduced, lane 0
holds the result, which is copied to the other lanes: the result's layout is broadcast over W, as
its consumers (which broadcast it against the input) read it. When even one kept element's
reduced block is too large for LM, the reduced dimensions are cut into time slices that
accumulate into the same result.

A reduction whose kept part is small and reduced part large (a loss over a whole batch) would run
on a few PEs only: compiler.planner.rewrite splits it into a partial reduction over many PEs and
a final one over the partials.
"""

from __future__ import annotations

from itertools import product
from math import ceil, prod

from ..ir import Node, Value, reduction_identity
from ..layout import TIME_AXIS, W_AXIS, Factor, Layout, has_lanes, lane_dims
from ..layout.spread import Spread, lane_runs_recipe, spread
from .base import Kernel, Operand, device_dtype, fill_lanes
from .context import Arena, EmitContext, Ref
from .loops import Operand as LoopOperand
from .loops import emit_vops, nest
from .movement import window_copies
from .operands import per_pe, restrict, slice_count

VOP = {"sum": "add", "max": "max", "min": "min", "prod": "mul"}


def identity(op: str, dtype: str) -> float | int:
    """The reduction's start in a device dtype (bool is float32 0.0 / 1.0 on the device)."""
    return reduction_identity(op, dtype)


def reduction_layout(shape: tuple[int, ...], dims: tuple[int, ...], dtype: str, hw, budget_lw: int,
                     pack_reduced: bool, cyclic: bool = False, even: bool = False, lanes_on: int | None = None
                     ) -> Layout | None:
    """A layout of the input with the reduced dims inside each PE: kept dims spread over the axes
    (from `spread`, time-sliced when their share is too large), reduced dims as the innermost
    address digits (lanes on the last reduced dim when `pack_reduced` and it fills them, else on
    kept dim `lanes_on`, by default the last kept dim that fills them). When one
    kept element's reduced block alone exceeds the budget, the reduced dims are time-sliced
    instead, and the kept part is cut into slices of one long word per PE (with `even`, into
    slices that divide a dim where a few more than the fewest do: `_slice_count`). None when
    neither works."""
    epl = hw.elements_per_lw(dtype)
    kept = [d for d in range(len(shape)) if d not in dims]
    last = dims[-1]
    if pack_reduced and (epl == 1 or shape[last] % epl):
        return None
    kept_shape = tuple(shape[d] for d in kept) or (1,)
    pack = None
    filling = [k for k, d in enumerate(kept) if shape[d] >= epl]  # (a size-1 kept dim fills no lanes)
    if not pack_reduced and lanes_on is not None:
        pack = kept.index(lanes_on)
    elif not pack_reduced and filling:
        pack = filling[-1]
    block = prod(shape[d] for d in dims)
    reduced_lw = block // (epl if pack_reduced else 1)
    slice_reduced = 2 * reduced_lw > budget_lw
    # when the reduced block is sliced, each PE holds one long word of kept elements per slice
    # (the kept dims sliced in time too when they need more)
    # lanes on a dim a window copies: its long words on the PEs and MABs too, whose order the DRAM
    # image keeps (movement.wishes), so that the window's source arrives in runs
    recipe = lane_runs_recipe(pack, cyclic) if lanes_on is not None else Spread(pack, cyclic)
    outer = spread(kept_shape, epl, hw.axes, recipe,
                   1 if slice_reduced else max(1, budget_lw // max(1, reduced_lw)))
    if slice_reduced and prod(f.size for _, f in outer.factors if f.axis is None) > 1:
        return None
    kept_slices = prod(f.size for _, f in outer.factors if f.axis == TIME_AXIS)
    dims_out: list[list[Factor]] = [[] for _ in shape]
    stride = 1
    for d in reversed(dims):
        n = shape[d]
        if pack_reduced and d == last:
            dims_out[d] = [Factor(n // epl, None, stride), Factor(epl, W_AXIS, 1)]
            stride *= n // epl
        else:
            dims_out[d] = [Factor(n, None, stride)]
            stride *= n
    if slice_reduced:
        stride = _slice_reduced(dims_out, dims, stride, budget_lw, kept_slices, even)
    for k, d in enumerate(kept):
        dims_out[d] = [Factor(f.size, f.axis, f.stride * stride) if f.axis is None else f for f in outer.dims[k]]
    if not kept:  # nothing kept: the result lives on the PEs the (size-1) axis factors name
        dims_out[dims[0]] = [f for _, f in outer.factors if f.axis not in (None, W_AXIS)] + dims_out[dims[0]]
    broadcast = tuple(b for b in outer.broadcast if not (pack_reduced and b.axis == W_AXIS))
    return Layout.of([dim or [Factor(1, None, 1)] for dim in dims_out], shape, broadcast)


def _slice_reduced(dims_out: list[list[Factor]], dims: tuple[int, ...], block: int, budget: int, kept_slices: int,
                   even: bool) -> int:
    """Cut the outermost reduced dim's digit into time slices (Time, rest) so that a slice's block
    fits half the budget; when one element of it alone exceeds the whole budget, cut it to one
    element a slice and go on inward (an inner dim is cut only once every outer one is one
    element a slice, so no outer digit's stride counts the inner dim's full size). Slice numbers
    compose as ReduceKernel.emit counts them (kept slice + kept_slices x reduced slice, the outer
    reduced dims' slices slowest). Returns the long words of a slice."""
    time_stride, half = kept_slices, budget // 2
    for k, d in enumerate(dims):
        if block <= (half if k == 0 else budget):
            break
        f = dims_out[d][0]
        below = block // f.size
        t = _slice_count(f.size, max(1, half // max(1, below)), even)
        if t > 1:
            rest = ceil(f.size / t)
            dims_out[d][0:1] = [Factor(t, TIME_AXIS, time_stride), Factor(rest, None, f.stride)]
            time_stride *= t
            block = below * rest
    return block


def _slice_count(size: int, per: int, even: bool) -> int:
    """Slices of a digit of `size` holding at most `per` each: the fewest, or with `even` up to
    twice as many when that many divide the size evenly. An even cut keeps the source's blocks
    whole, so the input may arrive by block copies rather than a gather into padded slices
    (4,096 rows in 4 slices of 1,024 rather than 3 padded ones of 1,376), but more slices cost
    more steps (512 rows on mini: 4 x 128, 25,450 cycles, against 3 x 171, 21,706): the planner
    times both."""
    fewest = ceil(size / per)
    if not even:
        return fewest
    return next((t for t in range(fewest, min(size, 2 * fewest) + 1) if size % t == 0), fewest)


class ReduceKernel(Kernel):
    def __init__(self, node: Node, layout: Layout) -> None:
        self.node, self.nodes = node, (node,)
        self.layout = layout
        x = node.args[0]
        self.x = x
        self.dims = node.attrs["dims"] or tuple(range(x.rank))
        self.pads = {x: identity(node.op, device_dtype(x))}
        shape = x.shape or (1,)
        self.kept_shape = tuple(1 if d in self.dims else s for d, s in enumerate(shape))
        self.result = _placed(restrict(layout, self.kept_shape), layout, self.dims)
        self.out_layout = self.result.layout if node.attrs["keepdim"] or not x.shape else _squeeze(
            self.result.layout, self.dims, node.out.shape)

    def reads(self) -> dict[Value, Layout]:
        return {self.x: self.layout}

    def writes(self) -> dict[Value, Layout]:
        return {self.node.out: self.out_layout}

    def key(self, refs: dict[Value, Ref]) -> tuple:
        r = refs[self.x]
        return ("reduce", self.node.op, self.dims, str(self.layout), str(r.placement.layout), device_dtype(self.x))

    def emit(self, ctx: EmitContext, refs: dict[Value, Ref]) -> None:
        x, out = self.x, self.node.out
        dtype = device_dtype(x)
        op = self.node.op
        src = Operand(x, restrict(self.layout, x.shape or (1,)), dtype)
        res = Operand(out, self.result, dtype)
        arena = Arena(ctx.hw)
        src.memory, src.word = arena.alloc(src.words(ctx))
        # each step reads the running result with the input: another memory (one pattern per memory)
        res.memory, res.word = arena.alloc(res.words(ctx), avoid={src.memory}, strict=True)
        epl = ctx.hw.elements_per_lw(dtype)
        sizes = [n for n, _ in per_pe(self.layout, epl)]
        in_op, out_op = src.loop(ctx), res.loop(ctx)
        own = per_pe(self.result.layout, epl)
        hazard = ctx.hw.hazards["lm_write_to_read"]
        kept_slices = slice_count(self.result.layout)
        total = slice_count(self.layout)
        reduced_slices = total // max(1, kept_slices)
        out_placement = ctx.lm_placement(self.out_layout, device_dtype(out))
        for kept_t, reduced_t in product(range(kept_slices), range(reduced_slices)):
            t = kept_t + kept_slices * reduced_t  # the input's slice (reduction_layout's numbering)
            first, last = reduced_t == 0, reduced_t == reduced_slices - 1
            ctx.download(refs[x], src.placement(ctx), memory=src.memory, word=src.word, slice_index=t,
                         pad=self.pads[x])
            if first:
                loops, (st,) = nest([n for n, _ in own], [s for _, s in own])
                emit_vops(ctx.b, "copy", dtype, loops, LoopOperand(out_op.memory, out_op.base, st), identity(op, dtype))
                ctx.b.nop(hazard)
            loops, (in_st, out_st) = nest(sizes, list(in_op.strides), list(out_op.strides))
            dst = LoopOperand(out_op.memory, out_op.base, out_st)
            emit_vops(ctx.b, VOP[op], dtype, loops, dst, dst, LoopOperand(in_op.memory, in_op.base, in_st))
            if not last:
                ctx.b.nop(hazard)
                continue
            if not has_lanes(self.result.layout) and epl > 1:  # lane 0 computed (or the lanes summed into
                ctx.b.nop(hazard)  # it): the result in every lane, as a layout without lanes holds it
                fill_lanes(ctx, res.memory, out_op.base, ctx.lm_placement(self.result.layout, dtype).slice_span, dtype)
            ctx.b.nop(hazard)
            ctx.upload(out_placement, refs[out], memory=res.memory, word=res.word, slice_index=kept_t)


def _placed(result, layout: Layout, dims: tuple[int, ...]):
    """The result's layout keeps the input's size-1 axis factors of reduced dims whose axis no
    kept dim places: a result on one PE (or in one L2B) is placed there, not broadcast over that
    level. They join the first kept dim, so a squeezed result keeps them too. (A layout that
    names no factor of a level is replicated over it: a training step's bias gradient, summed
    from rows held in one L2B beside columns over MABs and PEs, was read from all four Groups'
    DRAMs, three of which held none of it.)"""
    from .operands import Restricted
    r = result.layout
    placed = {f.axis for _, f in r.factors}
    units: list[Factor] = []
    for d, f in layout.factors:
        if d in dims and f.axis not in (None, W_AXIS, TIME_AXIS) and f.axis not in placed:
            placed.add(f.axis)
            units.append(Factor(1, f.axis, 1))
    if not units:
        return result
    kept = [d for d in range(r.rank) if d not in dims] or [0]
    at_dim = [list(d) for d in r.dims]
    at_dim[kept[0]] = units + at_dim[kept[0]]
    moved = len(units)
    before = sum(len(r.dims[d]) for d in range(kept[0]))  # factors ahead of the kept dim's keep their index
    return Restricted(Layout.of(at_dim, r.shape, r.broadcast),
                      tuple(None if s is None else (s if s < before else s + moved) for s in result.source))


def _squeeze(layout: Layout, dims: tuple[int, ...], shape: tuple[int, ...]) -> Layout:
    """Drop the reduced (size-1) dimensions of a keepdim layout."""
    kept = [d for d in range(layout.rank) if d not in dims]
    factors = [layout.dims[d] for d in kept] or [[Factor(1, None, 1)]]
    if not kept:  # a 0-d result keeps the axes the reduced dims placed (size 1 each)
        units = [Factor(1, f.axis, 1) for d in range(layout.rank) for f in layout.dims[d] if f.axis is not None]
        factors = [units or [Factor(1, None, 1)]]
    return Layout.of(factors, shape or (1,), layout.broadcast)


def plan(node: Node, planner) -> list[Kernel]:
    x = node.args[0]
    shape = x.shape or (1,)
    dims = node.attrs["dims"] or tuple(range(len(shape)))
    dtype = device_dtype(x)
    budget = planner.budget(2, together=2)
    found: list[Layout] = []
    lanes = _window_lanes(node, tuple(dims), planner)
    recipes = [(even, False, cyclic, lanes) for even in (False, True) for cyclic in (False, True)] \
        if lanes is not None else []
    recipes += [(even, pack, cyclic, None) for even, pack, cyclic in product((False, True), (True, False), (False, True))]
    for even, pack, cyclic, lanes_on in recipes:  # even cuts last (wishes)
        layout = reduction_layout(shape, tuple(dims), dtype, planner.hw, budget, pack, cyclic, even, lanes_on)
        if layout is not None and layout not in found:
            found.append(layout)
    ref = planner.refs.get(x)
    if ref is not None and ref.lm is not None and in_pe(ref.lm, dims):
        found.insert(0, ref.lm)
    return [ReduceKernel(node, layout) for layout in found]


def _window_lanes(node: Node, dims: tuple[int, ...], planner) -> int | None:
    """The kept dim of the reduction's input x to put in the lanes when x is a window (pooling
    patches) of a placed tensor whose lanes hold a dim the window copies unchanged (channels), and
    nothing else reads x (a training step's max-pool compares the patches with their maximum for
    its indices, in layouts of its own): each long word of the patches is then a long word of the
    source, gathered in runs as long as the source keeps them together (movement.wishes). Packing
    the last kept dim instead (a pooling's output columns, read with the window's stride) makes
    every long word a gather of its own."""
    x = node.args[0]
    window = x.producer
    ref = planner.refs.get(window.args[0]) if window is not None and window.kind == "window" else None
    if ref is None or any(u is not node for u in planner.users.get(x, [])):
        return None
    lanes = lane_dims(ref.placement.layout)
    copied = [d for d, src in window_copies(window).items() if src in lanes and d not in dims]
    return copied[0] if len(lanes) == 1 and copied else None


def in_pe(layout: Layout, dims) -> bool:
    """Whether `layout` keeps the reduced dims inside each PE, none of them padded in the lanes:
    a long word holding elements and padding of a reduced dim arrives whole, and its padding
    (whatever the producer computed there) would join the reduction."""
    lanes_padded = any(f.axis == W_AXIS for d, f in layout.factors if d in dims and layout.extents[d] != layout.shape[d])
    return not lanes_padded and all(f.axis in (None, W_AXIS) or f.size == 1 for d, f in layout.factors if d in dims)


def local_runs(layout: Layout, dim: int) -> list[int]:
    """Lengths of the runs of consecutive elements of `dim` that `layout` keeps together in each PE
    at once, shortest first: the products of the dim's innermost factors that are address digits
    or lanes (a product's columns lie in runs of its tile's columns per PE, in long words of
    consecutive columns). A reduction reads such runs where they lie (`in_pe`)."""
    runs, run = [], 1
    for f in reversed(layout.dims[dim]):
        if f.axis not in (None, W_AXIS):
            break
        run *= f.size
        if f.size > 1:
            runs.append(run)
    return runs


def wishes(user: Node, v: Value, planner) -> list[Layout]:
    """The layouts the reduction would stage its input from by block copies: its producer can
    compute it there."""
    return [k.layout for k in plan(user, planner)[:2]] if v is user.args[0] else []

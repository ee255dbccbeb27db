"""A reduction over the PEs of each L1B (or L2B), by the PE stream's reducing transfers.

The second step of a two-step reduction (compiler.planner.search `plan_reduce`: a partial
over the runs each PE holds, then a total over the partials) finds its input spread over the
PEs: a product's output keeps its columns in the tiles of the MABs and PEs, so the partial row
maxima and sums of a softmax or a cross-entropy over them lie one per PE of an L1B, at the same
address. Reduced inside the PEs, they first had to be relaid so that a row's partials share a
PE: a lane-moving relayout through the Data Engines (a linear layer's cross-entropy step, 256
rows of 64 partials: 116,754 cycles per reduction, four of them).

The chip reduces across PEs on the way up instead (transfers.pe_to_l1bm.modes.reduce, SDM
`l1bmr`): L1BM long word q receives the reduction over the L1B's MABs of long word q div P of
PE q mod P of each MAB (P PEs a MAB). So each PE sends its span, the L1BM holds P partial
results per long word of the span, a broadcast brings them back to every PE, and P - 1 VOPs fold
them. Partials over the L1Bs of an L2B too (a wider product, or a smaller chip's) go one hop
further, reduced over the L1Bs into L2BM (transfers.l1bm_to_l2bm.modes.reduce, `l2bmr`) and
broadcast back down both hops. The result is in every PE the partials were spread over; its
layout places it on the first of them (`reduce._placed`), from which the upload reads it.

Taken when the reduced dims lie exactly on the MAB and PE axes, or the L1B, MAB and PE axes
(every one of them under an L1B or L2B, no padding), the kept dims on the others, in one time
slice, for sum, max and min of float32 (the ops and dtypes the reducing transfers have).
"""

from __future__ import annotations

from sim.isa import DType

from ..errors import CompileError
from ..ir import Node, Value
from ..layout import TIME_AXIS, W_AXIS, Layout
from . import reduce
from .base import Operand, device_dtype
from .context import Arena, EmitContext, Ref
from .loops import Operand as LoopOperand
from .loops import emit_vops, nest
from .operands import flat_factors, restrict
from .reduce import VOP, ReduceKernel

REDUCING = {"sum": "add", "max": "max", "min": "min"}  # reduction -> the transfer's op


def across_pes(layout: Layout, dims: tuple[int, ...], chain, op: str, dtype: str) -> bool:
    """Whether a reduction of `op` over `dims` of a tensor in LM `layout` can run as reducing
    transfers over the PEs of each L1B (and the L1Bs of each L2B; see the module docstring)."""
    kept_shape = tuple(1 if d in dims else n for d, n in enumerate(layout.shape))
    return _spread_over_pes(layout, dims, chain, op, dtype) and not _padded(layout, dims) and \
        _address_digits(restrict(layout, kept_shape).layout) == _address_digits(layout)  # long word r of a
    # PE's span is the result's long word r


def _spread_over_pes(layout: Layout, dims: tuple[int, ...], chain, op: str, dtype: str) -> bool:
    """Whether `dims` of `layout` lie exactly on the MAB and PE axes (or the L1B, MAB and PE axes)
    and the kept dims elsewhere, in one time slice, for an op and dtype the reducing transfers have."""
    if op not in REDUCING or dtype != "float32":
        return False
    in_l1 = [(chain.unit_axis, chain.pes_per_l1 // chain.pes_per_unit), (chain.pe_axis, chain.pes_per_unit)]
    reduced = sorted((str(f.axis), f.size) for d, f in layout.factors if d in dims and f.size > 1)
    if reduced not in (sorted(in_l1), sorted([*in_l1, (chain.l1_axis, chain.l1_per_l2)])):
        return False
    kept_on_pes = any(str(f.axis) in dict(reduced) and f.size > 1 for d, f in layout.factors if d not in dims)
    sliced = any(f.axis == TIME_AXIS and f.size > 1 for _, f in layout.factors)
    return not (kept_on_pes or sliced)


def _padded(layout: Layout, dims: tuple[int, ...]) -> bool:
    return any(layout.extents[d] != layout.shape[d] for d in dims)


def reduces_where_it_lies(user: Node, v: Value, ref: Ref, planner) -> bool:
    """Whether reduction `user` reads its input `v`, stored as `ref`, where it lies: across the
    PEs as it is, or in two steps (`search.plan_reduce`: over the runs each PE holds, then across
    the PEs, the partials one per PE at one address). An estimate for the producer's choice (the
    reduction's own candidates are timed when it is planned): a product whose columns spread over
    the L2Bs left each of a cross-entropy's row reductions a lane-moving relayout of the whole
    product (256 x 512 on MN-Core 2: 146,242 cycles each, against 2,082 + 1,142 in two steps)."""
    lm = ref.lm
    if user.kind != "reduce" or v is not user.args[0] or lm is None or not v.shape:
        return False
    dims = tuple(user.attrs["dims"] or range(v.rank))
    chain, dtype = planner.ctx.chain, device_dtype(v)
    if across_pes(lm, dims, chain, user.op, dtype):
        return True
    partials = [[f for f in factors if d not in dims or f.axis not in (None, W_AXIS)]  # the first step's
                for d, factors in enumerate(lm.dims)]  # results: the reduced dims' in-PE digits gone
    return not _padded(lm, dims) and _spread_over_pes(Layout.of(partials), dims, chain, user.op, dtype)


def transit_room(ctx: EmitContext, over_l1bs: bool) -> int:
    """Long words of L1BM (and L2BM, when the partials span the L1Bs) a piece may take."""
    return min(ctx.transit.l1_room, ctx.transit.l2_room) if over_l1bs else ctx.transit.l1_room


def _address_digits(layout: Layout) -> list[tuple[int, int]]:
    return [(f.size, f.stride) for _, f in flat_factors(layout) if f.axis is None and f.size > 1]


class AcrossPesReduceKernel(ReduceKernel):
    """The reduction of a tensor laid out with the reduced dims over the MABs and PEs of each L1B
    (and the L1Bs of each L2B), read where it lies."""

    def key(self, refs: dict[Value, Ref]) -> tuple:
        return ("across PEs", *super().key(refs))

    def emit(self, ctx: EmitContext, refs: dict[Value, Ref]) -> None:
        x, out = self.x, self.node.out
        dtype = device_dtype(x)
        chain, hw, b = ctx.chain, ctx.hw, ctx.b
        pes, epl, wpl = chain.pes_per_unit, hw.elements_per_lw(dtype), ctx.params.words_per_lw
        src = Operand(x, restrict(self.layout, x.shape or (1,)), dtype)
        res = Operand(out, self.result, dtype)
        span = src.placement(ctx).slice_span  # long words each PE holds (the result's too)
        over_l1bs = any(f.axis == chain.l1_axis and f.size > 1 for d, f in self.layout.factors if d in self.dims)
        # the download is over (its transfers waited for) and the upload not begun: the transit's
        # L1BM and L2BM buffers are free; the span goes through them in pieces they hold
        room = transit_room(ctx, over_l1bs) // pes
        if room < 1:
            raise CompileError(f"internal: the transit buffers hold no piece of a reduction across {pes} PEs")
        piece = min(span, room)
        arena = Arena(hw)
        src.memory, src.word = arena.alloc(src.words(ctx))
        gathered, at = arena.alloc(pes * piece * wpl, avoid={src.memory})
        res.memory, res.word = arena.alloc(res.words(ctx), avoid={gathered}, strict=True)
        ctx.download(refs[x], src.placement(ctx), memory=src.memory, word=src.word, pad=self.pads[x])
        lm_hazard = hw.hazards["lm_write_to_read"]
        b.nop(lm_hazard)
        l1, l2, red = ctx.transit.l1[0], ctx.transit.l2[0], REDUCING[self.node.op]
        per_word = ctx.params.elements_per_word(DType[dtype])
        for first in range(0, span, piece):
            count = min(piece, span - first)
            n = pes * count
            b.xfer("reduce", "up", chain.l1, l1, src.memory, src.word + first * wpl, n, red=red, dtype=dtype)
            b.nop(hw.hazards["l1bm_reduce_to_read"])
            if over_l1bs:
                b.nop(max(0, hw.hazards["l1bm_write_to_l2bm_read"] - hw.hazards["l1bm_reduce_to_read"]))
                b.xfer("reduce", "up", chain.l2, l2, chain.l1, l1, n, red=red, dtype=dtype)
                b.nop(hw.hazards["l2bm_to_l1bm_read"])
                b.xfer("broadcast", "down", chain.l2, l2, chain.l1, l1, n)
                b.nop(hw.hazards["l2bm_to_l1bm_read"])
            b.xfer("broadcast", "down", chain.l1, l1, gathered, at, n)
            b.nop(lm_hazard)
            loops, (out_st, in_st) = nest([count, epl], [epl, 1], [pes * epl, 1])
            dst = LoopOperand(res.memory, (res.word + first * wpl) * per_word, out_st)
            for pe in range(pes):  # long word q of the gathered: the reduction of PE q mod P's long word q div P
                part = LoopOperand(gathered, at * per_word + pe * epl, in_st)
                if pe == 0:
                    emit_vops(b, "copy", dtype, loops, dst, part)
                else:
                    emit_vops(b, VOP[self.node.op], dtype, loops, dst, dst, part)
                b.nop(lm_hazard)
        ctx.upload(ctx.lm_placement(self.out_layout, device_dtype(out)), refs[out], memory=res.memory, word=res.word)


def plan(node: Node, planner) -> list[ReduceKernel]:
    """A reduction's candidates (`reduce.plan`), led by the one across the PEs where its input,
    placed already, lies so."""
    kernels = reduce.plan(node, planner)
    x = node.args[0]
    ref = planner.refs.get(x)
    dims = tuple(node.attrs["dims"] or range(max(1, x.rank)))
    if ref is not None and ref.lm is not None and across_pes(ref.lm, dims, planner.ctx.chain, node.op,
                                                             device_dtype(x)):
        kernels.insert(0, AcrossPesReduceKernel(node, ref.lm))
    return kernels

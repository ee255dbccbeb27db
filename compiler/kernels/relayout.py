"""Relayouts: any stored layout of a tensor into any other, on the device.

When no element has to change its lane, the Data Engines gather long words (transfer.gather).
Otherwise the PEs move the lanes, in two passes that each stage, shuffle with VOPs and upload:

1. unpack: the source is staged into an LM layout whose lanes match its own (so the staging is
   a long-word gather), and every element is copied into a long word of its own, into every lane;
   that is uploaded (the source's elements now sit alone in their long words);
2. pack: the target LM layout's unpacked form (each element alone in its long word, any lane) is
   gathered from that by the Data Engines (no lane moves any more), the PEs pack the lanes, and
   the target layout is uploaded as its image.

A copy whose target's padding lanes must hold zeros (a product's operand, whose padding the MAU
sums) while no element moves its lane goes through the PEs in one pass instead: staged as it is,
a select against a mask of ones zeroes the padding lanes, and it goes up as the target's image.

The same kernel serves movement nodes whose element maps move lanes (a transpose of the packed
dimension, a window along it) and plain copies (an output in a buffer of its own, or in a
constrained layout).
"""

from __future__ import annotations

import numpy as np
import torch

from ..errors import CompileError
from ..ir import Node, Value
from ..layout import W_AXIS, Broadcast, Factor, Layout, Placement, has_lanes, lane_padding_dims, lanes_innermost
from ..layout.spread import Spread, spread, time_sliced
from ..transfer.gather import LaneMismatch, gather_runs, lw_sources
from ..transfer.staging import stage, stored_staging
from .base import Kernel, device_dtype
from .context import Arena, EmitContext, Ref, lane_compatible
from .loops import Operand as LoopOperand
from .loops import emit_vops, nest
from .operands import per_pe, slice_count
from .transposer import emit_through_registers


def unpacked(layout: Layout) -> Layout:
    """The layout with its lanes made the innermost address digit and every lane a copy: each
    element alone in a long word, in every lane."""
    w = [(d, k) for d, dim in enumerate(layout.dims) for k, f in enumerate(dim) if f.axis == W_AXIS and f.size > 1]
    if not w:
        return layout
    (wd, wk), = w
    n = layout.dims[wd][wk].size
    dims = [[Factor(f.size, f.axis, f.stride * n) if f.axis is None else f for f in dim] for dim in layout.dims]
    dims[wd][wk] = Factor(n, None, 1)
    return Layout.of(dims, layout.shape, tuple(b for b in layout.broadcast if b.axis != W_AXIS) + (Broadcast(W_AXIS),))


def lane_matched(p: Placement, budget_lw: int) -> Layout:
    """An LM layout of p's tensor whose staging image keeps p's lanes (so that it stages from p
    by a long-word gather)."""
    layout, shape = p.layout, p.layout.shape
    epl = p.epl
    w = [(d, k, f) for d, dim in enumerate(layout.dims) for k, f in enumerate(dim) if f.axis == W_AXIS]
    if not w:
        return spread(shape, epl, p.hw.axes, Spread(None, False), budget_lw)
    (d, k, f), = w
    if epl % f.size == 0 and lanes_innermost(layout):  # fewer lanes than fit (a half cast from float32's
        return spread(shape, f.size, p.hw.axes, Spread(d, False), budget_lw)  # layout): the same few
    raise CompileError(f"cannot relay a tensor stored as {layout} on the device: its lanes are not the innermost "
                       f"digit of one dimension")


def _shuffle(ctx: EmitContext, src: Layout, dst: Layout, src_at: tuple[str, int], dst_at: tuple[str, int],
             dtype: str, lanes: tuple[int, ...]) -> None:
    """VOP copies between two layouts with the same factors in the same order (one of them
    unpacked): element for element, into each lane offset of `lanes` (all copies of the target)."""
    epl = ctx.hw.elements_per_lw(dtype)
    a, b = per_pe(src, epl), per_pe(dst, epl)
    sizes = [n for n, _ in a]
    loops, (d_st, s_st) = nest(sizes, [s for _, s in b], [s for _, s in a])
    per_word = ctx.params.elements_per_word(__import__("sim").DType[dtype])
    for lane in lanes:
        emit_vops(ctx.b, "copy", dtype, loops, LoopOperand(dst_at[0], dst_at[1] * per_word + lane, d_st),
                  LoopOperand(src_at[0], src_at[1] * per_word, s_st))


def _pass_budget(ctx: EmitContext, epl: int) -> int:
    """Long words per PE of a layout's slice such that a pass holds it and its unpacked form
    (epl times larger), each region in one PE memory (regions start aligned, as in the planner)."""
    capacities = sorted(ctx.hw.memory_lw(m) for m in ctx.chain.scratch)
    align = max(1, ctx.hw.long_word_bytes // ctx.hw.word_bytes)

    def fits(lw: int) -> bool:
        rest = list(capacities)
        big = next((k for k, c in enumerate(rest) if c >= epl * lw + align), None)  # smallest that holds it
        if big is None:
            return False
        rest[big] -= epl * lw + align
        return max(rest) >= lw + align
    low, high = 1, max(1, sum(capacities) // (1 + epl))
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if fits(mid) else (low, mid - 1)
    return low


def _uploadable(ctx: EmitContext, layout: Layout, dtype: str) -> bool:
    """An LM layout the PEs can upload (one that is not broadcast over every PE of an L1B)."""
    return stage(ctx.lm_placement(layout, dtype)).pe_mode != "broadcast"


class RelayoutKernel(Kernel):
    """`out` (a copy of `source`, or of a movement node's output) stored as the image of `layout`,
    or in `target` when one is given."""

    def __init__(self, source: Value, layout: Layout | None, *, target: Placement | None = None,
                 index: np.ndarray | None = None, node: Node | None = None, zero_pad: bool = False) -> None:
        self.zero_pad = zero_pad  # the target's padding must hold zeros (`_gathered`)
        self.source = source
        self.layout = layout
        self.target = target
        self.index = index
        self.node = node
        self.out = node.out if node is not None else Value(f"{source.name}_relaid", source.shape, source.dtype)
        self.nodes = (node,) if node is not None else ()
        self.pads = {}

    @property
    def label(self) -> str:
        return self.node.label if self.node is not None else f"relayout {self.source.name}"

    @staticmethod
    def of_movement(node: Node, layout: Layout) -> "RelayoutKernel":
        from .movement import source_maps
        (parts,) = source_maps(node)[:1]
        if len(node.outputs) != 1 or len(parts) != 1:
            raise CompileError(f"{node.kind} moves lanes of several tensors; not supported")
        (source, index), = parts
        return RelayoutKernel(source, layout, index=index, node=node)

    @staticmethod
    def copy(v: Value, ref: Ref, target: Placement) -> "RelayoutKernel":
        return RelayoutKernel(v, None, target=target)

    def reads(self) -> dict[Value, Layout]:
        return {}

    def least_cycles(self, ctx: EmitContext, refs: dict[Value, Ref]) -> float:
        """When no lane moves, the copy is the Data Engines' gather alone: its MVs (one per run of
        long words) take at least `gather_mv_cycles` each. (A copy whose lanes move goes through
        the PEs: 0, not bounded here.) ResNet-18's compile at 224x224 emitted relayouts of a
        million instructions for its consumers' wishes, to learn they cost millions of cycles."""
        target = refs[self.out].placement
        if not self._gathered(target):
            return 0.0
        return (gather_runs(target, refs[self.source].placement, self.index) or 0) * ctx.gather_mv_cycles()

    def _gathered(self, target: Placement) -> bool:
        """Whether the Data Engines may make the copy (when its lanes stay put): always, unless the
        target's padding must hold zeros and some long word of it holds elements and padding side
        by side (that long word would arrive whole, with whatever the source's padding lanes
        held). Padding in long words of its own is written from the zero buffer: a registered
        7x7 stem weight padded from 3 to 4 channels took 625,076 cycles through the PEs, element
        by element."""
        return not self.zero_pad or not lane_padding_dims(target.layout, target.epl)

    def key(self, refs: dict[Value, Ref]) -> tuple | None:
        if self.index is not None:
            return None  # a movement node's map: not worth hashing
        src, out = refs[self.source], refs[self.out]  # the LM layouts guide a transpose (kernels.transposer)
        return ("relayout", str(src.placement.layout), str(out.placement.layout), src.placement.dtype,
                str(self.layout), self.zero_pad, str(src.lm), str(out.lm))

    def sources(self) -> list[Value]:
        return [self.source]

    def writes(self) -> dict[Value, Layout]:
        return {self.out: self.layout} if self.layout is not None else {}

    def output_refs(self, ctx: EmitContext, symbols: dict[Value, str]) -> dict[Value, Ref]:
        if self.layout is None:
            return {}
        return super().output_refs(ctx, symbols)

    def emit(self, ctx: EmitContext, refs: dict[Value, Ref]) -> None:
        src, out = refs[self.source], refs[self.out]
        dtype = device_dtype(self.source)
        target = out.placement
        try:  # no lane moves: the Data Engines alone
            if self._gathered(target):
                sources = lw_sources(target, src.placement, self.index)
                ctx.gather(sources.zero_holes() if self.zero_pad else sources, out, [src], self._pad())
                return
        except LaneMismatch:
            pass
        if self.zero_pad and self._zero_lanes_in_passing(ctx, src, out, dtype):
            return
        order = self._order()
        if order is not None and not self.zero_pad and \
                emit_through_registers(ctx, src, out, dtype, order, self.out.name):
            return
        budget = _pass_budget(ctx, ctx.hw.elements_per_lw(dtype))
        spread_ref = self._unpack(ctx, src, dtype, budget)
        packed = self.layout if self.layout is not None and _uploadable(ctx, self.layout, dtype) else \
            lane_matched(target, budget)  # then gathered into the target by the Data Engines
        packed = time_sliced(packed, budget, ctx.hw.elements_per_lw(dtype)) or packed
        image = stage(ctx.lm_placement(packed, dtype)).dram
        image_ref = out if image.same_placement(target) else ctx.buffer("temp", image, f"{self.out.name}_packed")
        self._pack(ctx, spread_ref, packed, image_ref, dtype)
        if image_ref is not out:
            ctx.gather(lw_sources(target, image), out, [image_ref])

    def _zero_lanes_in_passing(self, ctx: EmitContext, src: Ref, out: Ref, dtype: str) -> bool:
        """A copy into a target whose padding lanes must hold zeros, where no element changes its
        lane: slice by slice of the target's LM layout, the source is staged by the Data Engines
        (padding lanes arrive with their long words, holding what they hold), a mask of ones is
        staged beside it (a constant stored as the same image, its padding zero as every upload's),
        a select keeps the elements and zeroes the rest, and the slice goes up as the target's
        image. False where this does not apply (lanes move, a layout the PEs cannot upload, a
        slice and its mask that do not fit two PE memories, a type without a select): the copy
        then goes through the PEs element by element, which took 17,497,460 cycles for the one-hot
        (16, 50257) of an embedding lookup, its K padded by one lane, before its product."""
        if self.layout is None or self.index is not None or dtype not in ("float32", "int32") \
                or "select" not in ctx.hw.pe_ops or not _uploadable(ctx, self.layout, dtype):
            return False
        lm = ctx.lm_placement(self.layout, dtype)
        if not stage(lm).dram.same_placement(out.placement) or not lane_compatible(out.placement, src.placement):
            return False
        words = lm.slice_span * ctx.params.words_per_lw
        arena = Arena(ctx.hw)
        try:
            data = arena.alloc(words)
            mask = arena.alloc(words, avoid={data[0]}, strict=True)  # a select reads each memory once
        except CompileError:
            return False
        ones = ctx.buffer("const", out.placement, f"{self.out.name}_elements", lm=self.layout,
                          data=torch.ones(self.out.shape, dtype=torch.int32 if dtype == "int32" else torch.float32))
        plain = stored_staging(lm, src.placement) is not None
        for t in range(slice_count(self.layout)):
            ctx.download(src, lm, memory=data[0], word=data[1], slice_index=t, pad=None if plain else 0)
            ctx.download(ones, lm, memory=mask[0], word=mask[1], slice_index=t)
            ctx.b.vop("select", dtype, 1, words, (*data, 0, 1), (*mask, 0, 1), (*data, 0, 1), 0)
            ctx.b.nop(ctx.hw.hazards["lm_write_to_read"])
            ctx.upload(lm, out, memory=data[0], word=data[1], slice_index=t)
        return True

    def _order(self) -> tuple[int, ...] | None:
        """How the output's dimensions take the source's (out dim i is source dim order[i]), for a
        copy or a permute; None for other movement (slices, windows, gathers)."""
        if self.node is None:
            return tuple(range(len(self.source.shape)))
        if self.node.kind == "permute":
            return tuple(self.node.attrs["order"])
        return None

    def _pad(self) -> float | int:
        return self.node.attrs.get("value", self.node.attrs.get("fill", 0)) if self.node is not None else 0

    def _unpack(self, ctx: EmitContext, src: Ref, dtype: str, budget: int) -> Ref:
        """The source with every element alone in its long word, in every lane (a new buffer)."""
        if not has_lanes(src.placement.layout):
            return src  # already so (lanes broadcast)
        matched = lane_matched(src.placement, budget)
        matched = time_sliced(matched, budget, ctx.hw.elements_per_lw(dtype)) or matched
        loose = unpacked(matched)
        buf = ctx.buffer("temp", stage(ctx.lm_placement(loose, dtype)).dram, f"{self.source.name}_unpacked")
        arena = Arena(ctx.hw)
        a = arena.alloc(ctx.lm_placement(matched, dtype).slice_span * ctx.params.words_per_lw)
        b = arena.alloc(ctx.lm_placement(loose, dtype).slice_span * ctx.params.words_per_lw)
        epl = ctx.hw.elements_per_lw(dtype)
        for t in range(slice_count(matched)):
            ctx.download(src, ctx.lm_placement(matched, dtype), memory=a[0], word=a[1], slice_index=t)
            _shuffle(ctx, matched, loose, a, b, dtype, tuple(range(epl)))
            ctx.b.nop(ctx.hw.hazards["lm_write_to_read"])
            ctx.upload(ctx.lm_placement(loose, dtype), buf, memory=b[0], word=b[1], slice_index=t)
        return buf

    def _pack(self, ctx: EmitContext, loose_src: Ref, packed: Layout, dst: Ref, dtype: str) -> None:
        """Gather the target's unpacked form from `loose_src` (no lane moves), pack it in the PEs."""
        loose = unpacked(packed)
        arena = Arena(ctx.hw)
        a = arena.alloc(ctx.lm_placement(loose, dtype).slice_span * ctx.params.words_per_lw)
        b = arena.alloc(ctx.lm_placement(packed, dtype).slice_span * ctx.params.words_per_lw)
        # a target without lanes holds each element in every lane, as readers take it (base.fill_lanes)
        lanes = (0,) if has_lanes(packed) else tuple(range(ctx.hw.elements_per_lw(dtype)))
        for t in range(slice_count(packed)):
            ctx.download(loose_src, ctx.lm_placement(loose, dtype), memory=a[0], word=a[1], slice_index=t,
                         index=self.index, pad=self._pad())
            _shuffle(ctx, loose, packed, a, b, dtype, lanes)
            ctx.b.nop(ctx.hw.hazards["lm_write_to_read"])
            ctx.upload(ctx.lm_placement(packed, dtype), dst, memory=b[0], word=b[1], slice_index=t)

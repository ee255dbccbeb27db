"""Data movement: views that move nothing, and gathers the Data Engines run.

A reshape or permute the stored layout can express is a view: the value keeps its buffer and
reads it through another layout (`Layout.permute`, `reshape_layout`). Anything else that only
moves elements (slices, padding, windows, concatenation, splits, and views the layout cannot
express) is a gather: every output element comes from one source element (or is a pad value),
and when no element has to change the lane of its long word, the Data Engines copy runs of long
words through L2BM into the output's buffer (transfer.gather). The output is stored as the image
of an LM layout, so that its consumers stage it with block copies. Gathers that would move
elements between lanes go through the PEs instead (kernels.relayout).
"""

from __future__ import annotations

from math import prod
from typing import Callable

import numpy as np

from ..errors import LayoutError
from ..ir import Node, Value
from ..layout import Layout, Placement, lanes_innermost
from ..layout.reshape import reshape_layout
from ..layout.spread import lane_runs, lm_layouts
from ..transfer.gather import SKIP, LaneMismatch, LwSources, lw_sources
from ..transfer.staging import stage
from .base import Kernel, device_dtype
from .context import EmitContext, Ref

SourceMap = list[tuple[Value, np.ndarray]]  # (source value, flat source index of each output element)


def view_transform(node: Node) -> tuple[Callable[[Layout], Layout | None], Callable[[Layout], Layout | None]] | None:
    """For a reshape or permute: (layout of the input -> layout of the output, and back)."""
    x, out = node.args[0], node.out
    if node.kind == "reshape":
        return (lambda l: reshape_layout(l, out.shape or (1,)), lambda l: reshape_layout(l, x.shape or (1,)))
    if node.kind == "permute":
        order = node.attrs["order"]
        inverse = tuple(order.index(d) for d in range(len(order)))
        return (lambda l: l.permute(order), lambda l: l.permute(inverse))
    return None


def view_ref(ref: Ref, forward: Callable[[Layout], Layout | None]) -> Ref | None:
    """A stored value read through a view, or None when its layout cannot express the view (or
    would split a long word's lanes inside a dimension, which nothing could relay from)."""
    layout = forward(ref.placement.layout)
    if layout is None or not lanes_innermost(layout):
        return None
    lm = forward(ref.lm) if ref.lm is not None else None
    return Ref(ref.symbol, Placement(layout, ref.placement.hw, ref.placement.memory, ref.placement.dtype), lm)


def _grid(shape: tuple[int, ...]) -> np.ndarray:
    return np.arange(prod(shape), dtype=np.int64).reshape(shape)


def source_maps(node: Node) -> list[SourceMap]:
    """For each output of a movement node, where each of its elements comes from: (source, flat
    index) pairs; an index of -1 reads the node's pad value, SKIP another part (cat)."""
    k, a = node.kind, node.attrs
    x = node.args[0]
    if k == "reshape":
        return [[(x, np.arange(node.out.numel, dtype=np.int64))]]
    if k == "permute":
        return [[(x, _grid(x.shape).transpose(a["order"]).ravel())]]
    if k == "expand":
        lead = len(node.out.shape) - x.rank
        src = _grid(x.shape).reshape((1,) * lead + x.shape)
        return [[(x, np.broadcast_to(src, node.out.shape).ravel())]]
    if k == "slice":
        sel = [slice(None)] * x.rank
        sel[a["dim"]] = slice(a["start"], a["stop"], a["step"])
        return [[(x, _grid(x.shape)[tuple(sel)].ravel())]]
    if k == "split":
        outs, start = [], 0
        for out, size in zip(node.outputs, a["sizes"]):
            sel = [slice(None)] * x.rank
            sel[a["dim"]] = slice(start, start + size)
            outs.append([(x, _grid(x.shape)[tuple(sel)].ravel())])
            start += size
        return outs
    if k == "pad":
        out = np.full(node.out.shape, -1, dtype=np.int64)
        src = _grid(x.shape)
        dst_sel, src_sel = [], []
        for (before, after), size in zip(a["pads"], x.shape):
            lo, hi = max(0, -before), size - max(0, -after)
            dst_sel.append(slice(max(0, before), max(0, before) + max(0, hi - lo)))
            src_sel.append(slice(lo, max(lo, hi)))
        out[tuple(dst_sel)] = src[tuple(src_sel)]
        return [[(x, out.ravel())]]
    if k == "window":
        shape = node.out.shape
        idx = np.indices(shape).reshape(len(shape), -1)
        src = np.asarray(a["a"], dtype=np.int64) @ idx + np.asarray(a["b"], dtype=np.int64)[:, None]
        inside = np.all((src >= 0) & (src < np.asarray(x.shape)[:, None]), axis=0)
        flat = np.ravel_multi_index(tuple(np.clip(src, 0, np.asarray(x.shape)[:, None] - 1)), x.shape)
        return [[(x, np.where(inside, flat, -1))]]
    if k == "cat":
        dim, parts, offset = a["dim"], [], 0
        out_idx = np.indices(node.out.shape).reshape(node.out.rank, -1)
        for t in node.args:
            lo, hi = offset, offset + t.shape[dim]
            inside = (out_idx[dim] >= lo) & (out_idx[dim] < hi)
            local = out_idx.copy()
            local[dim] = np.clip(out_idx[dim] - lo, 0, t.shape[dim] - 1)
            parts.append((t, np.where(inside, np.ravel_multi_index(tuple(local), t.shape), SKIP)))
            offset = hi
        return [parts]
    raise ValueError(f"{node.kind} is not a movement node")


WINDOW_WISHES = 2  # source layouts a window wishes for (compile-time budget: each is a candidate of its producer)


def window_copies(node: Node) -> dict[int, int]:
    """For a window node, the output dims it copies unchanged, each with the source dim it copies
    (a pooling window's batch and channels): out[..., i, ...] reads the source at index i there,
    whatever the other indices are."""
    a, b = node.attrs["a"], node.attrs["b"]
    x, out = node.args[0], node.out
    copied = {}
    for src, row in enumerate(a):
        reads = [d for d, c in enumerate(row) if c]
        if b[src] or len(reads) != 1 or row[reads[0]] != 1:
            continue
        d = reads[0]
        if out.shape[d] == x.shape[src] and not any(other[d] for r, other in enumerate(a) if r != src):
            copied[d] = src
    return copied


def wishes(user: Node, v: Value, planner) -> list[Layout]:
    """A window (pooling patches) would read its source with lanes on a dim it copies unchanged
    (channels): each long word of its output is then one of the source's, and the Data Engines
    gather them in runs, where lanes on a dim the window strides over make every long word a
    gather of its own (ResNet-18's stem pooling at 224 x 224: 1.8 M single-long-word MVs)."""
    if user.kind != "window" or v is not user.args[0] or any(u is not user for u in planner.users.get(v, [])):
        return []  # another reader (a training step's relu backward) has its own stake in v's layout
    epl = planner.hw.elements_per_lw(device_dtype(v))
    lanes = sorted((src for src in window_copies(user).values() if v.shape[src] % epl == 0 and v.shape[src] > 1),
                   reverse=True)  # the innermost first: channels before the batch
    budget = planner.budget(2)
    found = []
    for src in lanes:
        found += [layout for layout in lane_runs(v.shape, epl, planner.hw.axes, src, budget) if layout not in found]
    return found[:WINDOW_WISHES]


def pad_value(node: Node) -> float | int:
    return node.attrs.get("value", node.attrs.get("fill", 0))


class GatherKernel(Kernel):
    """Movement outputs gathered by the Data Engines, each into the image of its LM layout."""

    def __init__(self, node: Node, layouts: dict[Value, Layout], maps: list[SourceMap]) -> None:
        self.nodes = (node,)
        self.node = node
        self.layouts = layouts
        self.maps = dict(zip(node.outputs, maps))
        self.pads = {}
        self.part_placements: dict[Value, Placement | None] = {}  # (source_placement, per part)

    def reads(self) -> dict[Value, Layout]:
        return {}

    def key(self, refs: dict[Value, Ref]) -> tuple:
        n = self.node
        return ("gather", n.kind, tuple((a.shape, a.dtype) for a in n.inputs), repr(sorted(n.attrs.items())),
                tuple(str(refs[v].placement.layout) for v in self.sources()),
                tuple(str(self.layouts[o]) for o in n.outputs))

    def sources(self) -> list[Value]:
        return list(dict.fromkeys(v for parts in self.maps.values() for v, _ in parts))

    def writes(self) -> dict[Value, Layout]:
        return dict(self.layouts)

    def source_placement(self, v: Value, ctx: EmitContext) -> Placement | None:
        """For a cat: a placement of part `v` whose long words the gather reads whole (each of its
        elements in the lane the output has it in), the first of the part's fresh layouts that
        does; None for other movements, or when none does. A part whose lanes lie elsewhere (a
        product's gradient read transposed, beside two that are not: the query, key and value
        gradients of an attention's fused projection) is relaid into it alone, where the cat
        was otherwise padded part by part to the whole output and summed (a 4 x 64 x 384 cat:
        560 K cycles, a relayout of the whole padded output among them)."""
        if self.node.kind != "cat":
            return None
        if v not in self.part_placements:
            self.part_placements[v] = None
            dtype = device_dtype(v)
            for layout in lm_layouts(v.shape, dtype, ctx.hw):
                placement = stage(ctx.lm_placement(layout, dtype)).dram
                if self._reads_whole(ctx, v, placement):
                    self.part_placements[v] = placement
                    break
        return self.part_placements[v]

    def source_ok(self, v: Value, ref: Ref, ctx: EmitContext, clean: bool) -> bool:
        """Whether the gather reads part `v` where it is (or no placement would serve better)."""
        return self.node.kind != "cat" or self._reads_whole(ctx, v, ref.placement) or \
            self.source_placement(v, ctx) is None

    def _reads_whole(self, ctx: EmitContext, v: Value, placement: Placement) -> bool:
        out = self.node.out
        try:
            lw_sources(self._image(ctx, out), placement, dict(self.maps[out])[v])
        except LaneMismatch:
            return False
        return True

    def _image(self, ctx: EmitContext, out: Value) -> Placement:
        """The DRAM image the gather writes `out` into (its LM layout's staging image)."""
        return stage(ctx.lm_placement(self.layouts[out], device_dtype(out))).dram

    def lw_sources(self, ctx: EmitContext, out: Value, refs: dict[Value, Ref]) -> LwSources:
        image = self._image(ctx, out)
        parts = self.maps[out]
        found = [lw_sources(image, refs[v].placement, index) for v, index in parts]
        return found[0] if len(found) == 1 else LwSources.merge(found)

    def least_cycles(self, ctx: EmitContext, refs: dict[Value, Ref]) -> float:
        """Its gathers' MVs (one per run of long words), each at least `gather_mv_cycles` (a
        max-pool's window in single long words: 5.3 M cycles, emitted beside the 58 K of the best)."""
        try:
            return sum(self.lw_sources(ctx, out, refs).mv_count for out in self.node.outputs) * ctx.gather_mv_cycles()
        except LayoutError:
            return 0.0

    def feasible(self, ctx: EmitContext, refs: dict[Value, Ref]) -> bool:
        from ..transfer.gather import LaneMismatch
        try:
            for out in self.node.outputs:
                self.lw_sources(ctx, out, refs)
            return True
        except LaneMismatch:
            return False

    def emit(self, ctx: EmitContext, refs: dict[Value, Ref]) -> None:
        for out in self.node.outputs:
            sources = self.lw_sources(ctx, out, refs)
            srcs = [refs[v] for v, _ in self.maps[out]]
            ctx.gather(sources, refs[out], srcs, pad_value(self.node))

"""Views and data movement: alias, permute, reshape, expand, slice, select, cat.

A permute or reshape that the layout can express moves nothing: the value keeps its buffer
and gets another layout (`Layout.permute`, `reshape_layout`). Otherwise, and for slices and
concatenations, the value is gathered into a new buffer by the Data Engines, in the staging
image of an LM layout chosen for it, so that its consumers download it with block copies.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from sim import Sym

from ..codegen import TAGS, CodeGen, Ref
from ..errors import CompileError, LayoutError, UnsupportedOpError
from ..frontend.graph import Node, Value
from ..layout import Layout, Placement
from ..layout.candidates import candidates
from ..layout.reshape import reshape_layout
from ..plan import LM, choose, time_sliced
from ..transfer.gather import SKIP, LaneMismatch, LwSources, emit_convert, lw_sources
from ..transfer.staging import stage
from . import lowering
from .kernel import lshape, ref_of

DRAM = "DRAM"


def placed(cg: CodeGen, v: Value) -> Ref:
    """The ref of `v`, placing a graph input or constant in a default layout if nothing has yet."""
    if v in cg.refs:
        return cg.refs[v]
    layout = choose(lshape(v), cg.device_dtype(v), cg.hw, budget_lw=cg.hw.memory_lw(LM))
    return ref_of(cg, v, layout)


def unplaced(cg: CodeGen, v: Value) -> bool:
    """A graph input or constant (or a view of one) that no kernel has placed yet."""
    return v not in cg.refs and (v in cg.pending or v.kind in ("input", "const"))


def defer(cg: CodeGen, out: Value, base: Value, to_base, to_view) -> None:
    """Place nothing now: when a kernel wants `out` in some LM layout, place `base` in the layout
    that the view maps onto it (`to_base`), then derive `out`'s ref (`to_view`). A view that
    cannot be inverted falls back to a default placement and a gather."""
    def resolve(wanted: Layout) -> Ref:
        base_layout = to_base(wanted)
        if base_layout is None:
            ref = to_view(placed(cg, base))
        else:
            ref = to_view(ref_of(cg, base, base_layout))
        cg.refs[out] = ref
        cg.pending.pop(out, None)
        cg.view_bases.pop(out, None)
        return ref
    cg.pending[out] = resolve
    cg.view_bases[out] = (base, to_base)


def alias(cg: CodeGen, out: Value, x: Value) -> None:
    """`out` is `x` (values are immutable); a not-yet-placed `x` is placed by out's first consumer."""
    if unplaced(cg, x):
        defer(cg, out, x, lambda wanted: wanted, lambda ref: ref)
    else:
        cg.refs[out] = placed(cg, x)


@lowering("alias.default", "clone.default", "lift_fresh_copy.default", "detach.default")
def lower_alias(cg: CodeGen, node: Node) -> None:
    alias(cg, node.out, node.args[0])


@lowering("permute.default")
def lower_permute(cg: CodeGen, node: Node) -> None:
    x, order = node.args[0], tuple(d % max(1, len(node.args[0].shape)) for d in node.args[1])
    inverse = tuple(order.index(d) for d in range(len(order)))

    def view(ref: Ref) -> Ref:
        layout = ref.placement.layout.permute(order)
        return Ref(ref.symbol, Placement(layout, cg.hw, DRAM, ref.placement.dtype),
                   ref.lm.permute(order) if ref.lm is not None else None)
    if unplaced(cg, x):
        defer(cg, node.out, x, lambda wanted: wanted.permute(inverse), view)
    else:
        cg.refs[node.out] = view(placed(cg, x))


@lowering("view.default", "_unsafe_view.default", "reshape.default", "squeeze.dim", "squeeze.dims",
          "squeeze.default", "unsqueeze.default")
def lower_view(cg: CodeGen, node: Node) -> None:
    x, out = node.args[0], node.out

    def view(ref: Ref) -> Ref | None:
        layout = reshape_layout(ref.placement.layout, lshape(out))
        if layout is None:
            return None
        lm = reshape_layout(ref.lm, lshape(out)) if ref.lm is not None else None
        return Ref(ref.symbol, Placement(layout, cg.hw, DRAM, ref.placement.dtype), lm)
    if unplaced(cg, x):
        def to_view(ref: Ref) -> Ref:
            found = view(ref)
            if found is None:
                gather(cg, node, [(x, np.arange(out.numel or 1))])
                return cg.refs[out]
            return found
        defer(cg, out, x, lambda wanted: reshape_layout(wanted, lshape(x)), to_view)
        return
    ref = view(placed(cg, x))
    if ref is not None:
        cg.refs[out] = ref
        return
    gather(cg, node, [(x, np.arange(out.numel or 1))])


def _index(shape: tuple[int, ...], fn) -> np.ndarray:
    """Flat source index of every element of an output of `shape`, from its multi-index."""
    idx = np.indices(shape or (1,)).reshape(len(shape or (1,)), -1)
    return fn(idx)


@lowering("slice.Tensor")
def lower_slice(cg: CodeGen, node: Node) -> None:
    x, out = node.args[0], node.out
    dim = (node.args[1] if len(node.args) > 1 else 0) % len(x.shape)
    start = node.args[2] if len(node.args) > 2 and node.args[2] is not None else 0
    step = node.args[4] if len(node.args) > 4 else 1
    start = start + x.shape[dim] if start < 0 else min(start, x.shape[dim])

    def src(idx: np.ndarray) -> np.ndarray:
        idx = idx.copy()
        idx[dim] = start + idx[dim] * step
        return np.ravel_multi_index(tuple(idx), x.shape)
    gather(cg, node, [(x, _index(out.shape, src))])


@lowering("select.int")
def lower_select(cg: CodeGen, node: Node) -> None:
    x, out = node.args[0], node.out
    dim, i = node.args[1] % len(x.shape), node.args[2] % x.shape[node.args[1] % len(x.shape)]

    def src(idx: np.ndarray) -> np.ndarray:
        full = np.insert(idx, dim, i, axis=0) if out.shape else np.full((len(x.shape), 1), i)
        return np.ravel_multi_index(tuple(full), x.shape)
    gather(cg, node, [(x, _index(out.shape, src))])


@lowering("cat.default")
def lower_cat(cg: CodeGen, node: Node) -> None:
    tensors, out = [t for t in node.args[0] if t.numel], node.out
    dim = (node.args[1] if len(node.args) > 1 else 0) % len(out.shape)
    parts, offset = [], 0
    for t in tensors:
        lo, hi = offset, offset + t.shape[dim]

        def src(idx: np.ndarray, lo=lo, hi=hi, t=t) -> np.ndarray:
            inside = (idx[dim] >= lo) & (idx[dim] < hi)
            local = idx.copy()
            local[dim] = np.clip(idx[dim] - lo, 0, t.shape[dim] - 1)
            return np.where(inside, np.ravel_multi_index(tuple(local), t.shape), SKIP)
        parts.append((t, _index(out.shape, src)))
        offset = hi
    gather(cg, node, parts)


def gather(cg: CodeGen, node: Node, parts: list[tuple[Value, np.ndarray]]) -> None:
    """Gather `node.out` from (source, index map) parts into a new buffer by MV runs."""
    out = node.out
    dtype = cg.device_dtype(out)
    refs = [placed(cg, v) for v, _ in parts]
    tried = []
    for layout in _out_layouts(cg, out, dtype):
        image = stage(Placement(layout, cg.hw, LM, dtype, check_capacity=False)).dram
        try:
            sources = LwSources.merge([lw_sources(image, r.placement, idx) for r, (_, idx) in zip(refs, parts)])
        except LaneMismatch as e:
            tried.append(str(e))
            continue
        new = cg.buffer("temp", image, out.name, lm=layout)
        zeros = cg.zeros_for(sources)
        emit_convert(cg.b, sources, dst=Sym(new.symbol), src=[Sym(r.symbol) for r in refs], zeros=zeros, l2_addr=0,
                     l2_room=cg.transit.l2_room, tags=TAGS["convert"])
        cg.refs[out] = new
        return
    raise UnsupportedOpError(node.op, [list(v.shape) for v, _ in parts], node.source,
                             "it moves elements between the lanes of long words, which the Data Engines cannot do"
                             + (f" ({tried[0]})" if tried else ""))


def _out_layouts(cg: CodeGen, out: Value, dtype: str) -> Iterator[Layout]:
    """LM layouts for a gathered value, best first; its DRAM layout will be the staging image."""
    budget = cg.hw.memory_lw(LM)
    shape = lshape(out)
    for slices in (d for d in range(1, shape[0] + 1) if shape[0] % d == 0):
        try:
            found = candidates((shape[0] // slices,) + shape[1:], dtype, cg.hw, LM)
        except LayoutError:
            continue
        usable = False
        for c in found:
            layout = time_sliced(c.layout, slices)
            try:
                p = Placement(layout, cg.hw, LM, dtype, check_capacity=False)
                if p.slice_span <= budget and stage(p).fitted is not None:
                    usable = True
                    yield layout
            except LayoutError:
                continue
        if usable:
            return
    raise CompileError(f"no LM layout fits {out!r} on {cg.hw.name}")

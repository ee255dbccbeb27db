"""Reductions over dimensions (sum, amax, amin), inside each PE.

The input is laid out so that the reduced dimensions never cross PEs: kept dimensions are
distributed over the chip's axes, reduced ones are address (and lane) digits. A VOP then
accumulates along them (the output's element stride is 0 on reduced digits), after the output
is set to the reduction's identity. A result whose lanes were reduced is copied to every lane
(its layout is broadcast over W, as its consumers expect).
"""

from __future__ import annotations

from math import prod

from ..codegen import CodeGen
from ..frontend.graph import Node
from ..layout import W_AXIS, Factor, Layout
from ..plan import choose, flat_factors, per_pe, restrict, slice_count
from . import lowering
from ..errors import CompileError
from ..frontend.graph import Value
from .kernel import Tensor, allocate, download_slice, lm_placement, lshape, new_output, ref_of, usable_for
from .loops import Operand as LoopOperand
from .loops import emit_vops, nest

OPS = {"sum": ("add", 0.0), "amax": ("max", float("-inf")), "amin": ("min", float("inf"))}


def _dims(node: Node, rank: int) -> tuple[list[int], bool]:
    args, kw = node.args, node.kwargs
    dims = args[1] if len(args) > 1 else kw.get("dim")
    keepdim = args[2] if len(args) > 2 else kw.get("keepdim", False)
    if dims is None or dims == [] or node.op == "sum.default":
        dims = list(range(rank))
    if isinstance(dims, int):
        dims = [dims]
    return sorted({d % max(rank, 1) for d in dims}), bool(keepdim)


def in_pe(layout: Layout, dims: list[int]) -> bool:
    """True when the reduced dimensions use only address and W digits (never PEs or slices)."""
    return all(f.axis in (None, W_AXIS) or f.size == 1 for d, f in flat_factors(layout) if d in dims)


def reduction_layout(cg: CodeGen, x: Value, shape: tuple[int, ...], dims: list[int], dtype: str, budget: int) -> Layout:
    """A layout of the input with the reduced dimensions inside each PE that `x` can get to."""
    ref = cg.refs.get(x)
    prefer = ref.lm if ref is not None else None
    if prefer is not None and prefer.shape == shape and in_pe(prefer, dims):
        return prefer
    kept = [d for d in range(len(shape)) if d not in dims]
    block = prod(shape[d] for d in dims)
    kept_shape = tuple(shape[d] for d in kept) or (1,)
    tried = []
    for pack in (True, False):  # lanes along the last reduced dimension, or along a kept one
        def build(outer: Layout, pack: bool = pack) -> Layout | None:
            return _with_reduced(outer, shape, dims, kept, dtype, cg.hw.elements_per_lw(dtype), pack)

        def accept(outer: Layout, build=build) -> bool:
            layout = build(outer)
            return layout is not None and usable_for(cg, x, layout)
        try:
            outer = choose(kept_shape, dtype, cg.hw, budget_lw=max(1, budget // block), accept=accept)
            return build(outer)
        except CompileError as e:
            tried.append(str(e))
    raise CompileError(f"no layout keeps dims {dims} of a {list(shape)} tensor inside each PE on {cg.hw.name}: "
                       f"{tried[-1]}")


def _with_reduced(outer: Layout, shape, dims, kept, dtype, epl: int, pack: bool) -> Layout | None:
    """`outer` (a layout of the kept dims) with the reduced dims added as address (and W) digits."""
    outer_w = any(f.axis == W_AXIS for _, f in flat_factors(outer))
    if pack and (outer_w or shape[dims[-1]] % epl or epl == 1):
        return None
    if not pack and not outer_w and epl > 1 and shape[dims[-1]] % epl == 0:
        return None  # that is the packed variant
    block = prod(shape[d] for d in dims)
    # reduced digits first (innermost, dense), then the kept dims' address digits scaled past them
    reduced_lw = block // (epl if pack else 1)
    dims_out: list[list[Factor]] = [[] for _ in shape]
    stride = 1
    for d in reversed(dims):
        n = shape[d]
        if pack and d == dims[-1]:
            dims_out[d] = [Factor(n // epl, None, stride), Factor(epl, W_AXIS, 1)]
            stride *= n // epl
        else:
            dims_out[d] = [Factor(n, None, stride)]
            stride *= n
    for k, d in enumerate(kept):
        dims_out[d] = [Factor(f.size, f.axis, f.stride * reduced_lw) if f.axis is None else f for f in outer.dims[k]]
    broadcast = tuple(b for b in outer.broadcast if not (pack and b.axis == W_AXIS))
    return Layout.of(dims_out, shape, broadcast)


@lowering("sum.dim_IntList", "sum.default", "amax.default", "amin.default")
def lower_reduce(cg: CodeGen, node: Node) -> None:
    x, out = node.args[0], node.out
    op, identity = OPS[node.op.split(".")[0]]
    shape = lshape(x)
    dims, keepdim = _dims(node, len(x.shape))
    dtype = cg.device_dtype(out)
    budget = (cg.hw.memory_lw("LM0") + cg.hw.memory_lw("LM1")) // 2
    layout = reduction_layout(cg, x, shape, dims, dtype, budget)
    kept_shape = tuple(1 if d in dims else s for d, s in enumerate(shape))
    source = Tensor(x, restrict(layout, shape), dtype)
    result_keep = restrict(layout, kept_shape)
    result = Tensor(out, result_keep, dtype)
    allocate(cg, [source, result])
    ref = ref_of(cg, x, layout)
    out_layout = result_keep.layout if keepdim or not x.shape else _squeeze(result_keep.layout, dims)
    out_ref = new_output(cg, out, out_layout)
    sizes = [s for s, _ in per_pe(layout, cg.hw.elements_per_lw(dtype))]
    in_op, out_op = source.loop_operand(cg), result.loop_operand(cg)  # strides along the input's digits
    own = per_pe(result_keep.layout, cg.hw.elements_per_lw(dtype))  # the result's own digits, to initialise it
    out_sizes, own_strides = [n for n, _ in own], [s for _, s in own]
    hazard = cg.hw.hazards["lm_write_to_read"]
    lanes_reduced = any(f.axis == W_AXIS for d, f in flat_factors(layout) if d in dims)
    epl = cg.hw.elements_per_lw(dtype)
    for t in range(slice_count(layout)):
        download_slice(cg, source, ref, t)
        init_loops, (init_st,) = nest(out_sizes, own_strides)
        emit_vops(cg.b, "copy", dtype, init_loops, LoopOperand(out_op.memory, out_op.base, init_st), identity)
        cg.b.nop(hazard)
        loops, (in_st, out_st) = nest(sizes, list(in_op.strides), list(out_op.strides))
        dst = LoopOperand(out_op.memory, out_op.base, out_st)
        emit_vops(cg.b, op, dtype, loops, dst, dst, LoopOperand(in_op.memory, in_op.base, in_st))
        if lanes_reduced and epl > 1:  # the result sits in lane 0: copy it to the other lanes
            cg.b.nop(hazard)
            span = lm_placement(cg, result_keep.layout, dtype).slice_span
            for w in range(1, epl):
                cg.b.vop("copy", dtype, 1, span, (out_op.memory, out_op.base + w, 0, epl),
                         (out_op.memory, out_op.base, 0, epl))
        cg.upload(lm_placement(cg, out_layout, dtype), out_ref, memory=result.memory, word=result.word, slice_index=t)


def _squeeze(layout: Layout, dims: list[int]) -> Layout:
    """Drop the reduced (size-1) dimensions of a keepdim layout."""
    kept = [d for d in range(layout.rank) if d not in dims]
    return Layout.of([layout.dims[d] for d in kept] or [[Factor(1, None, 1)]],
                     tuple(layout.shape[d] for d in kept) or (1,), layout.broadcast)


"""2-D convolution as a matrix product on the MAUs, with im2col done by the Data Engines.

out[n, co, ho, wo] = sum over (i, j, c) of w[co, c, i, j] * x[n, c, ho*s + i*d - p, wo*s + j*d - p]
is C = A @ B with rows m = (n, ho, wo), K = (i, j, c) and columns co. A (the im2col matrix) is
never stored: each K chunk of it is gathered from x as it is downloaded into LM, zeros for the
padding included. That gather moves whole long words, so x keeps its channels in the lanes
(NHWC underneath the NCHW shape); a convolution's output comes out that way, ready for the next.
The weights are B = w.permute(2, 3, 1, 0).reshape(K, Co): a constant is arranged so by the host
(placing parameters is not arithmetic); device-resident weights are placed so that B is a view.
"""

from __future__ import annotations

import numpy as np

from sim import Sym

from ..codegen import TAGS, CodeGen, Ref
from ..errors import UnsupportedOpError
from ..frontend.graph import Node, Value
from ..layout import W_AXIS, Factor, Layout, Placement
from ..layout.reshape import reshape_layout
from ..transfer.gather import emit_convert, lw_sources
from . import lower, lowering
from .elementwise import lower_elementwise
from .kernel import ref_of
from .matmul import Problem, Source, emit_product, layouts_for, plan_for

DRAM = "DRAM"
SAMPLE_ROWS = 4096  # im2col rows the run estimate looks at (planning cost, not a hardware number)


def nhwc_layout(cg: CodeGen, shape: tuple[int, ...], dtype: str) -> Layout:
    """A DRAM layout of an (N, C, H, W) tensor with channels in the lanes, rows split over Groups."""
    n, c, h, w = shape
    epl = cg.hw.elements_per_lw(dtype)
    if c % epl:
        raise UnsupportedOpError("convolution.default", [list(shape)], "", f"{c} channels do not fill long words of "
                                 f"{epl} {dtype} elements")
    groups = cg.params.n_groups
    axis = cg.hw.levels[cg.hw.memories[DRAM].level].axis
    per_group = cg.hw.level_axis_stride(cg.hw.memories[DRAM].level)
    row = w * c // epl  # long words per image row
    dims = [[Factor(n, None, h * row)], [Factor(c // epl, None, 1), Factor(epl, W_AXIS, 1)],
            [Factor(h, None, row)], [Factor(w, None, c // epl)]]
    if groups > 1 and n % groups == 0:
        dims[0] = [Factor(groups, axis, per_group), Factor(n // groups, None, h * row)]
    elif groups > 1 and h % groups == 0:
        dims[2] = [Factor(groups, axis, per_group), Factor(h // groups, None, row)]
    return Layout.of([[f for f in d if f.size > 1] or [Factor(1, None, 1)] for d in dims], shape)


def _source_runs(index: np.ndarray, x_shape, epl: int) -> float | None:
    """Average run, in long words, of im2col elements along K that are consecutive in x's NHWC
    DRAM layout (or all padding): how long the MVs of the gather can be. Estimated on at most
    SAMPLE_ROWS evenly spaced rows, so that planning a large batch stays cheap."""
    n, c, h, w = x_shape
    if index.size == 0:
        return None
    index = index[::max(1, index.shape[0] // SAMPLE_ROWS)]
    nn, cc, hh, ww = np.unravel_index(np.maximum(index, 0), x_shape)
    nhwc = np.where(index >= 0, ((nn * h + hh) * w + ww) * c + cc, -1)
    same = ((nhwc[:, 1:] == nhwc[:, :-1] + 1) & (nhwc[:, :-1] >= 0)) | ((nhwc[:, 1:] < 0) & (nhwc[:, :-1] < 0))
    return index.size / (index.shape[0] + int((~same).sum())) / epl


def im2col_index(x_shape, out_hw, kernel, stride, padding, dilation) -> np.ndarray:
    """For every element (m, kk) of the im2col matrix, the flat index into x, or -1 (padding)."""
    n, c, h, w = x_shape
    ho, wo = out_hw
    kh, kw = kernel
    nn, yy, xx = np.meshgrid(np.arange(n), np.arange(ho), np.arange(wo), indexing="ij")
    ii, jj, cc = np.meshgrid(np.arange(kh), np.arange(kw), np.arange(c), indexing="ij")
    nn, yy, xx = (a.reshape(-1, 1) for a in (nn, yy, xx))
    ii, jj, cc = (a.reshape(1, -1) for a in (ii, jj, cc))
    hy = yy * stride[0] + ii * dilation[0] - padding[0]
    wx = xx * stride[1] + jj * dilation[1] - padding[1]
    inside = (hy >= 0) & (hy < h) & (wx >= 0) & (wx < w)
    flat = ((nn * c + cc) * h + np.clip(hy, 0, h - 1)) * w + np.clip(wx, 0, w - 1)
    return np.where(inside, flat, -1).ravel()


@lowering("convolution.default")
def lower_conv(cg: CodeGen, node: Node) -> None:
    x, weight, bias, stride, padding, dilation, transposed, _, groups = node.args
    out = node.out
    shapes = [list(v.shape) for v in node.inputs]
    if transposed or groups != 1 or len(x.shape) != 4:
        raise UnsupportedOpError(node.op, shapes, node.source, "only 2-D, non-transposed, ungrouped convolutions")
    n, c, h, w = x.shape
    co, _, kh, kw = weight.shape
    ho, wo = out.shape[2:]
    dtype = cg.device_dtype(x)
    b_value = _weights_as_b(cg, node, weight)
    problem = Problem(1, n * ho * wo, kh * kw * c, co)
    index = im2col_index(x.shape, (ho, wo), (kh, kw), stride, padding, dilation)
    runs = _source_runs(index.reshape(problem.m, problem.k), x.shape, cg.hw.elements_per_lw(dtype))
    tiling = plan_for(cg, problem, False, dtype, cg.device_dtype(weight), trans_b=False, b=b_value, a_runs=runs)
    _, lb, _ = layouts_for(cg, tiling, problem, False, dtype == "float16" and cg.device_dtype(weight) == "float16")
    if x not in cg.refs:
        cg.refs[x] = cg.buffer("input" if x.kind == "input" else "const",
                               Placement(nhwc_layout(cg, x.shape, dtype), cg.hw, DRAM, dtype), x.name,
                               data=x.data if x.kind == "const" else None)
    out_dtype = cg.device_dtype(out)
    c_ref, lc = emit_product(cg, tiling, problem, False, Source(cg.refs[x], index), Source(ref_of(cg, b_value, lb)),
                             out_dtype, out.name)
    conv = _as_nchw(cg, c_ref, lc, (n, ho, wo, co), out_dtype)
    if conv is None:  # the tiling's rows do not split into images: gather into NHWC-packed NCHW
        target = Placement(nhwc_layout(cg, out.shape, out_dtype), cg.hw, DRAM, out_dtype)
        nn, cc, yy, xx = np.indices(out.shape).reshape(4, -1)
        index = ((nn * ho + yy) * wo + xx) * co + cc  # element (m, co) of the (N*Ho*Wo, Co) product
        sources = lw_sources(target, c_ref.placement, index)
        conv = cg.buffer("temp", target, f"{out.name}_nchw")
        emit_convert(cg.b, sources, dst=Sym(conv.symbol), src=Sym(c_ref.symbol), zeros=None, l2_addr=0,
                     l2_room=cg.transit.l2_room, tags=TAGS["convert"])
    if bias is None:
        cg.refs[out] = conv
        return
    product = Value(f"{out.name}_nobias", out.shape, out.dtype, "node")
    cg.refs[product] = conv
    b4 = Value(f"{bias.name}_nchw", (1, co, 1, 1), bias.dtype, "const", data=bias.data.reshape(1, co, 1, 1))
    lower_elementwise(cg, Node("add.Tensor", (product, b4), {}, out, node.source))


def _weights_as_b(cg: CodeGen, node: Node, weight: Value) -> Value:
    """B = w.permute(2, 3, 1, 0).reshape(K, Co). A constant is arranged by the host; weights that
    live on the device (registered parameters, inputs) are viewed that way, so the matrix
    product's B layout decides where they are placed (lower.views), with a gather as fallback."""
    co, c, kh, kw = weight.shape
    k = kh * kw * c
    if weight.kind == "const":
        return Value(f"{weight.name}_kkc", (k, co), weight.dtype, "const",
                     data=weight.data.permute(2, 3, 1, 0).reshape(k, co).contiguous())
    hwio = Value(f"{weight.name}_hwio", (kh, kw, c, co), weight.dtype, "node")
    b_value = Value(f"{weight.name}_kkc", (k, co), weight.dtype, "node")
    lower(cg, Node("permute.default", (weight, [2, 3, 1, 0]), {}, hwio, node.source))
    lower(cg, Node("view.default", (hwio, [k, co]), {}, b_value, node.source))
    return b_value


def _as_nchw(cg: CodeGen, ref: Ref, lm: Layout, nhwc: tuple[int, ...], dtype: str) -> Ref | None:
    """The (N*Ho*Wo, Co) product seen as the (N, Co, Ho, Wo) output: a view, nothing moves."""
    def view(layout: Layout | None) -> Layout | None:
        if layout is None:
            return None
        shaped = reshape_layout(layout.with_shape(layout.extents), nhwc) if layout.extents == layout.shape else None
        if shaped is None:
            shaped = _split_rows(layout, nhwc)
        return shaped.permute((0, 3, 1, 2)) if shaped is not None else None
    dram = view(ref.placement.layout)
    if dram is None:
        return None
    return Ref(ref.symbol, Placement(dram, cg.hw, DRAM, dtype), view(lm))


def _split_rows(layout: Layout, nhwc: tuple[int, ...]) -> Layout | None:
    """Reshape a padded (M, Co) layout: split M's factors into (N, Ho, Wo) (padding stays in N)."""
    rows = Layout.of([layout.dims[0]], (nhwc[0] * nhwc[1] * nhwc[2],), layout.broadcast)
    padded = rows.with_shape(rows.extents)
    extents = rows.extents[0]
    n_padded = extents // (nhwc[1] * nhwc[2])
    if n_padded * nhwc[1] * nhwc[2] != extents:
        return None
    split = reshape_layout(padded, (n_padded, nhwc[1], nhwc[2]))
    if split is None:
        return None
    return Layout.of([*split.dims, layout.dims[1]], nhwc, layout.broadcast)




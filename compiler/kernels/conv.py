"""2-D convolution as a matrix product on the MAUs, with im2col done by the Data Engines.

out[n, co, ho, wo] = sum over (i, j, c) of w[co, c, i, j] * x[n, c, ho*s + i*d - p, wo*s + j*d - p]
is C = A @ B with rows m = (n, ho, wo), K = (i, j, c) and columns co. A (the im2col matrix) is
never stored: each K chunk of it is gathered from x as it is downloaded into LM, zeros for the
spatial padding included. That gather moves whole long words, so x keeps its channels in the
lanes (NHWC underneath the NCHW shape); a convolution's output comes out that way, ready for the
next. Channels that do not fill a long word (an RGB image) are padded: K runs over the padded
channels, whose weights are zero and whose input lanes hold zeros (an uploaded tensor's padding
is zero; a computed one is relaid with zero padding first).

B = w.permute(2, 3, 1, 0).reshape(K, Co): a constant weight is arranged so by the host (placing
parameters is not arithmetic); a weight that lives on the device is gathered into B's layout.
"""

from __future__ import annotations

from math import ceil

import numpy as np
import torch

from ..errors import CompileError
from ..ir import Node, Value
from ..layout import W_AXIS, Factor, Layout, Placement
from ..layout.reshape import reshape_layout
from ..layout.spread import Spread, spread
from ..transfer.gather import SKIP, lw_sources
from ..transfer.staging import stage
from .base import Kernel, device_dtype
from .context import EmitContext, Ref, lane_compatible
from .matmul import Problem, Source, emit_product, layouts_for, output_layout, tilings


SAMPLE_ROWS = 4096  # im2col rows the run estimate looks at (planning cost, not a hardware number)
TIMED_TILINGS = 6  # a convolution's im2col gathers are costly to emit: only the most promising are timed


def nhwc_layout(ctx: EmitContext, shape: tuple[int, ...], dtype: str) -> Layout:
    """A DRAM layout of an (N, C, H, W) tensor with channels in the lanes (padded to fill them),
    rows split over the Groups' DRAMs."""
    n, c, h, w = shape
    epl = ctx.hw.elements_per_lw(dtype)
    cl = ceil(c / epl)  # long words per pixel
    groups = ctx.chain.groups
    axis = ctx.chain.l2_axis
    per_group = ctx.chain.l2_per_group
    row = w * cl  # long words per image row
    dims = [[Factor(n, None, h * row)], [Factor(cl, None, 1), Factor(epl, W_AXIS, 1)],
            [Factor(h, None, row)], [Factor(w, None, cl)]]
    if groups > 1 and n % groups == 0:
        dims[0] = [Factor(groups, axis, per_group), Factor(n // groups, None, h * row)]
    elif groups > 1 and h % groups == 0:
        dims[2] = [Factor(groups, axis, per_group), Factor(h // groups, None, row)]
    return Layout.of([[f for f in d if f.size > 1] or [Factor(1, None, 1)] for d in dims], shape)


def channels_in_lanes(p: Placement) -> bool:
    """Whether the lanes of p's long words pack consecutive channels (dim 1, innermost)."""
    dim = p.layout.dims[1]
    return bool(dim) and dim[-1].axis == W_AXIS and dim[-1].size == p.epl and dim[-1].stride == 1


def im2col_index(x_shape, out_hw, kernel, stride, padding, dilation, c_pad: int) -> np.ndarray:
    """For every element (m, kk) of the im2col matrix (K over padded channels), the flat index
    into x, -1 where the window reads spatial padding (zero), SKIP for padded channels (whatever
    the input's padding lanes hold: zeros)."""
    n, c, h, w = x_shape
    ho, wo = out_hw
    kh, kw = kernel
    nn, yy, xx = np.meshgrid(np.arange(n), np.arange(ho), np.arange(wo), indexing="ij")
    ii, jj, cc = np.meshgrid(np.arange(kh), np.arange(kw), np.arange(c_pad), indexing="ij")
    nn, yy, xx = (a.reshape(-1, 1) for a in (nn, yy, xx))
    ii, jj, cc = (a.reshape(1, -1) for a in (ii, jj, cc))
    hy = yy * stride[0] + ii * dilation[0] - padding[0]
    wx = xx * stride[1] + jj * dilation[1] - padding[1]
    inside = (hy >= 0) & (hy < h) & (wx >= 0) & (wx < w)
    flat = ((nn * c + np.minimum(cc, c - 1)) * h + np.clip(hy, 0, h - 1)) * w + np.clip(wx, 0, w - 1)
    return np.where(cc >= c, SKIP, np.where(inside, flat, -1)).ravel()


def source_runs(index: np.ndarray, x_shape, epl: int, sample_rows: int = 0) -> float | None:
    """Average run, in long words, of im2col elements along K that are consecutive in x's NHWC
    DRAM layout (or all padding): how long the MVs of the gather can be, which ranks tilings
    before the planner times the most promising. Estimated on `sample_rows` evenly spaced rows
    (all when 0)."""
    n, c, h, w = x_shape
    if index.size == 0:
        return None
    if sample_rows:
        index = index[::max(1, index.shape[0] // sample_rows)]
    nn, cc, hh, ww = np.unravel_index(np.maximum(index, 0), x_shape)
    nhwc = np.where(index >= 0, ((nn * h + hh) * w + ww) * c + cc, -1)
    same = ((nhwc[:, 1:] == nhwc[:, :-1] + 1) & (nhwc[:, :-1] >= 0)) | ((nhwc[:, 1:] < 0) & (nhwc[:, :-1] < 0))
    return index.size / (index.shape[0] + int((~same).sum())) / epl


def weight_index(w_shape, c_pad: int) -> np.ndarray:
    """For every element (k, co) of B (K = (i, j, padded c)), the flat index into w, -1 (zero) for
    padded channels."""
    co, c, kh, kw = w_shape
    ii, jj, cc, oo = np.meshgrid(np.arange(kh), np.arange(kw), np.arange(c_pad), np.arange(co), indexing="ij")
    flat = ((oo * c + np.minimum(cc, c - 1)) * kh + ii) * kw + jj
    return np.where(cc >= c, -1, flat).ravel()


def _as_nchw(ref_layout: Layout, nhwc: tuple[int, ...]) -> Layout | None:
    """The (N*Ho*Wo, Co) product's layout read as the (N, Co, Ho, Wo) output: nothing moves."""
    shaped = reshape_layout(ref_layout.with_shape(ref_layout.extents), nhwc) if ref_layout.extents == ref_layout.shape \
        else None
    if shaped is None:
        shaped = _split_rows(ref_layout, nhwc)
    return shaped.permute((0, 3, 1, 2)) if shaped is not None else None


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


class ConvKernel(Kernel):
    def __init__(self, node: Node, tiling, ctx: EmitContext, trans: bool = False) -> None:
        self.node, self.nodes = node, (node,)
        x, w = node.args
        self.x, self.w = x, w
        n, c, h, wd = x.shape
        co, _, kh, kw = w.shape
        ho, wo = node.out.shape[2:]
        self.dtype = device_dtype(x)
        epl = ctx.hw.elements_per_lw(self.dtype)
        self.c_pad = ceil(c / epl) * epl
        self.p = Problem(1, n * ho * wo, kh * kw * self.c_pad, co)
        self.t = tiling
        a = node.attrs
        self.index = im2col_index(x.shape, (ho, wo), (kh, kw), a["stride"], a["padding"], a["dilation"], self.c_pad)
        half_in = self.dtype == "float16" and device_dtype(w) == "float16"
        self.la, self.lb, _ = layouts_for(ctx, tiling, self.p, False, half_in)
        self.out_dtype = device_dtype(node.out)
        self.lc_out, self.summed = output_layout(ctx, tiling, self.p, False, half_in, self.out_dtype)
        self.nhwc = (n, ho, wo, co)
        product_image = stage(ctx.lm_placement(self.lc_out, self.out_dtype)).dram
        self.view = _as_nchw(product_image.layout, self.nhwc)
        self.view_lm = _as_nchw(self.summed, self.nhwc) if self.view is not None else None
        self.w_layout = None
        if w.kind == "const":  # arranged by the host: B itself is the constant
            data = w.data.permute(2, 3, 1, 0)
            data = torch.nn.functional.pad(data, (0, 0, 0, self.c_pad - c)).reshape(self.p.k, co).contiguous()
            self.b = Value(f"{w.name}_kkc", (self.p.k, co), w.dtype, "const", data=data)
        else:
            self.b = None
            if self.c_pad == c:  # B is a view of w: w placed so that B stages by block copies
                hwio = reshape_layout(self.lb, (kh, kw, c, co))
                self.w_layout = hwio.permute((3, 2, 0, 1)) if hwio is not None else None
        self.pads = {}

    def b_view(self, ref: Ref) -> Ref | None:
        """w's ref read as B = w.permute(2, 3, 1, 0).reshape(K, Co), when its layout can express it."""
        from .movement import view_ref
        return view_ref(ref, lambda l: reshape_layout(l.permute((2, 3, 1, 0)), (self.p.k, self.p.n)))

    def x_placement(self, ctx: EmitContext) -> Placement:
        return Placement(nhwc_layout(ctx, self.x.shape, self.dtype), ctx.hw, ctx.chain.dram, self.dtype)

    def reads(self) -> dict[Value, Layout]:
        if self.b is not None:
            return {self.b: self.lb}
        return {self.w: self.w_layout} if self.w_layout is not None else {}

    def sources(self) -> list[Value]:
        return [self.x] + ([self.w] if self.b is None and self.w_layout is None else [])

    def source_placement(self, v: Value, ctx: EmitContext) -> Placement:
        if v is self.x:
            return self.x_placement(ctx)
        epl = ctx.hw.elements_per_lw(device_dtype(v))
        lanes_on_co = spread(v.shape, epl, ctx.hw.axes, Spread(0, False))
        return stage(ctx.lm_placement(lanes_on_co, device_dtype(v))).dram

    def source_ok(self, v: Value, ref: Ref, ctx: EmitContext, clean: bool) -> bool:
        """x must have its channels in the lanes (zero padded, when they do not fill them); a
        device weight must gather into B's layout without moving lanes."""
        if v is self.x:
            return channels_in_lanes(ref.placement) and (self.c_pad == v.shape[1] or clean)
        destination = stage(ctx.lm_placement(self.lb, device_dtype(v))).destination
        return lane_compatible(destination, ref.placement, weight_index(v.shape, self.c_pad))

    def writes(self) -> dict[Value, Layout]:
        return {self.node.out: self.view_lm} if self.view is not None else {}

    def output_refs(self, ctx: EmitContext, symbols: dict[Value, str]) -> dict[Value, Ref]:
        out = self.node.out
        if self.view is not None:
            return {out: Ref(symbols[out], Placement(self.view, ctx.hw, ctx.chain.dram, self.out_dtype), self.view_lm)}
        return {out: Ref(symbols[out], Placement(nhwc_layout(ctx, out.shape, self.out_dtype), ctx.hw, ctx.chain.dram,
                                                 self.out_dtype))}

    def outputs(self) -> list[Value]:
        return [self.node.out]

    def emit(self, ctx: EmitContext, refs: dict[Value, Ref]) -> None:
        out = self.node.out
        if self.b is not None:
            b_source = Source(refs[self.b])
        else:
            view = self.b_view(refs[self.w]) if self.w_layout is not None else None
            b_source = Source(view) if view is not None else Source(refs[self.w], weight_index(self.w.shape, self.c_pad))
        image = stage(ctx.lm_placement(self.lc_out, self.out_dtype)).dram
        if self.view is not None:
            product = Ref(refs[out].symbol, image, self.summed)
        else:
            product = ctx.buffer("temp", image, f"{out.name}_product", lm=self.summed)
        emit_product(ctx, self.t, self.p, False, Source(refs[self.x], self.index), b_source, self.out_dtype, product)
        if self.view is None:  # the tiling's rows do not split into images: gather into NHWC-packed NCHW
            target = refs[out].placement
            nn, cc, yy, xx = np.indices(out.shape).reshape(out.rank, -1)
            ho, wo = out.shape[2:]
            index = ((nn * ho + yy) * wo + xx) * out.shape[1] + cc  # element (m, co) of the (N*Ho*Wo, Co) product
            ctx.gather(lw_sources(target, image, index), refs[out], [product])


def plan(node: Node, planner) -> list[Kernel]:
    x, w = node.args
    if node.attrs["groups"] != 1:
        raise CompileError("internal: grouped convolutions are rewritten before planning")
    n, c, h, wd = x.shape
    co, _, kh, kw = w.shape
    ho, wo = node.out.shape[2:]
    dtype = device_dtype(x)
    epl = planner.hw.elements_per_lw(dtype)
    c_pad = ceil(c / epl) * epl
    p = Problem(1, n * ho * wo, kh * kw * c_pad, co)
    half_in = dtype == "float16" and device_dtype(w) == "float16"
    half = half_in or planner.options.get("float_dtype") == "mixed"
    a = node.attrs
    index = im2col_index(x.shape, (ho, wo), (kh, kw), a["stride"], a["padding"], a["dilation"], c_pad)
    runs = source_runs(index.reshape(p.m, p.k), x.shape, epl, SAMPLE_ROWS)
    found = tilings(planner.ctx, p, batched=False, trans_b=False, half=half, staged_in_float32=half and not half_in,
                    out_half=device_dtype(node.out) == "float16",
                    in_bytes=planner.hw.element_bytes("float16" if half_in else "float32"), a_runs=runs,
                    limit=TIMED_TILINGS)
    return [ConvKernel(node, t, planner.ctx) for t in found]


def wishes(user: Node, v: Value, planner) -> list[Layout]:
    return []

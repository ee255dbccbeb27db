"""2-D convolution as a matrix product on the MAUs, with im2col done by the Data Engines.

out[n, co, ho, wo] = sum over (i, j, c) of w[co, c, i, j] * x[n, c, ho*s + i*d - p, wo*s + j*d - p]
is C = A @ B with rows m = (n, ho, wo), K = (i, j, c) and columns co. A (the im2col matrix) is
never stored: it is a window of x's storage (element (m, k) sits where x[n, c, ho*s + i*d - p,
wo*s + j*d - p] does), gathered by the Data Engines as each K chunk is downloaded into LM; where
the window reads the spatial padding it has holes, which arrive as zeros. The gathers move
whole long words, so x keeps its channels in the lanes (NHWC underneath the NCHW shape); a
convolution's output comes out that way, ready for the next. Channels that do not fill a long word (an RGB image) are padded: K runs over the
padded channels, whose weights are zero and whose input lanes hold zeros (an uploaded tensor's
padding is zero; a computed one is relaid with zero padding first).

The window is a sum of per-dimension terms (`compiler.transfer.separable`), so neither planning
nor emission ever holds a map of the im2col matrix's elements.

B = w.permute(2, 3, 1, 0).reshape(K, Co): a constant weight is arranged so by the host (placing
parameters is not arithmetic); a weight that lives on the device is gathered into B's layout.

A convolution whose strides are equal is also offered in a direct form (`Direct`): A is x's tiles
themselves, each with the halo its window reads, and each kernel position one MATMUL from a
shifted row (the matmul pipeline's `tiling.Shifts`), reading A's rows `stride` apart, so x is read
once per tile rather than kh*kw times.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from itertools import islice, product
from math import ceil

import numpy as np
import torch

from ..errors import CompileError, LayoutError
from ..ir import Node, Value
from ..layout import W_AXIS, Factor, Layout, Placement
from ..layout.reshape import reshape_layout
from ..layout.spread import Spread, lane_runs, spread
from ..transfer.gather import gather_runs, lw_sources
from ..transfer.separable import DimTerms, Terms, flatten_terms
from ..transfer.sources import LaneMismatch
from ..transfer.staging import stage
from .base import Kernel, device_dtype
from .context import EmitContext, Ref, lane_compatible
from .matmul import Problem, Source, a_blocks, emit_product, layouts_for, output_layout, tiling_bound, tilings
from .tiling import Shifts, Tiling


def nhwc_layout(ctx: EmitContext, shape: tuple[int, ...], dtype: str, channels: int | None = None) -> Layout:
    """A DRAM layout of an (N, C, H, W) tensor with channels in the lanes (padded to fill them, or
    to `channels`), images split over the Groups' DRAMs, else rows."""
    n, c, h, w = shape
    epl = ctx.hw.elements_per_lw(dtype)
    cl = ceil(max(c, channels or 0) / epl)  # long words per pixel
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


def _steps(count: int, step: int) -> Terms:
    """Terms of an index that moves `step` long words per position."""
    zeros = np.zeros(count, dtype=np.int64)
    return zeros, np.arange(count, dtype=np.int64) * step, zeros


def _reads(terms: Terms, out: int, kernel: int, size: int, stride: int, pad: int, dilation: int):
    """How a window reads one spatial dimension of x: x's step in long words per position, and
    per kernel position the output positions that read inside x, grouped by what x's terms add
    beyond the step there (rows split over Groups add a Group and an offset per block):
    [(kernel position, output positions, (Group, long words))]. None if the dimension moves lanes."""
    g, lw, lane = terms
    if lane.any():
        return None
    step = int(lw[1] - lw[0]) if size > 1 and g[1] == g[0] else 0
    rest_g, rest_lw = g, lw - np.arange(size, dtype=np.int64) * step
    reads = []
    for i in range(kernel):
        pos = np.arange(out, dtype=np.int64) * stride + i * dilation - pad
        outs = np.flatnonzero((pos >= 0) & (pos < size))
        at = pos[outs]
        extra, which = np.unique(np.stack([rest_g[at], rest_lw[at]], axis=1), axis=0, return_inverse=True)
        reads += [(i, outs[which.ravel() == k], (int(e[0]), int(e[1]))) for k, e in enumerate(extra)]
    return step, reads


def im2col_window(p: Placement, c_pad: int, out_hw: tuple[int, int], kernel, stride, padding, dilation
                  ) -> DimTerms | None:
    """The im2col matrix (M = (n, ho, wo), K = (i, j, padded c)) as a window of p, which holds x:
    element (m, k) is x[n, c, ho*s + i*d - p, wo*s + j*d - p]. Its terms are x's (n, c) terms plus
    uniform row and column steps; boxes (output rows x columns, one kernel position) read where the
    position lies inside x, each with what x adds there beyond the steps (its Group and offset
    when rows are split over Groups). The spatial padding is left as holes, which the gather's
    caller fills with zeros. None when x's placement does not separate."""
    n, c, h, w = p.layout.shape
    if p.layout.extents[1] < c_pad:
        return None
    base = DimTerms.of(p, sizes=(n, c_pad, h, w))
    if base is None or not base.readable:
        return None
    tn, tc, th, tw = base.terms
    (ho, wo), (kh, kw) = out_hw, kernel
    rows = _reads(th, ho, kh, h, stride[0], padding[0], dilation[0])
    cols = _reads(tw, wo, kw, w, stride[1], padding[1], dilation[1])
    if rows is None or cols is None:
        return None
    (row_step, row_reads), (col_step, col_reads) = rows, cols
    m = flatten_terms(tn, _steps(ho, stride[0] * row_step), _steps(wo, stride[1] * col_step))
    k = flatten_terms(_steps(kh, dilation[0] * row_step), _steps(kw, dilation[1] * col_step), tc)
    origin = -(padding[0] * row_step + padding[1] * col_step)
    images = np.arange(n, dtype=np.int64) * ho
    channels = np.arange(c_pad, dtype=np.int64)
    boxes = []
    for (i, ys, (g_y, lw_y)), (j, xs, (g_x, lw_x)) in product(row_reads, col_reads):
        ms = np.add.outer(np.add.outer(images, ys) * wo, xs).ravel()
        boxes.append(((ms, (i * kw + j) * c_pad + channels), (g_y + g_x, lw_y + lw_x)))
    return DimTerms(p, (m, k), origin, base.copies, base.group_copies, base.every_lane,
                    f"im2col {kh}x{kw} stride {tuple(stride)} padding {tuple(padding)} dilation {tuple(dilation)} "
                    f"of {c_pad} channels", tuple(boxes))


@dataclass(frozen=True)
class Direct:
    """A convolution computed directly: x flattened with its spatial padding, `pitch` pixels a
    row (at least the padded width; more to make the product's rows split into images, rows and
    columns) and `stride * image_rows` rows an image. Output pixel (n, ho, wo) is row
    f = (n * image_rows + ho) * pitch + wo of the product, and reads row
    stride * f + i*dh*pitch + j*dw of the flattened input with kernel position (i, j)'s weights
    (input row stride*ho + i*dh, column stride*wo + j*dw): each position is one MATMUL over the
    tile's input rows from that offset on, `stride` apart (`Shifts`), so x is read once per tile
    (with a halo of (kh - 1) rows and kw - 1 pixels more) instead of kh*kw times as im2col reads
    it. The product's rows past a row's or an image's end are computed and never read: the
    output is a view of the product whose padding they are (with stride s, a row's pitch
    pixels hold about pitch / s outputs: the MAUs compute s times the rows, where im2col would
    gather a pixel's channels kh*kw times)."""

    pitch: int
    image_rows: int  # of the product (the input's: stride times as many)
    padding: tuple[int, int]
    shifts: Shifts
    rows: int  # rows of the product: up to the last output pixel's
    # x's pixels this many apart in the flattened input, zeros between (`Builder.conv`): a
    # transposed convolution reads its input where it is stored, the zeros as holes
    input_dilation: tuple[int, int] = (1, 1)

    @property
    def stride(self) -> int:
        return self.shifts.stride


def direct(kernel, padding, dilation, pitch: int, image_rows: int, rows: int, stride: int = 1,
           input_dilation: tuple[int, int] = (1, 1)) -> Direct:
    """The direct form of a convolution of equal strides (see `Direct`): rows `pitch` pixels
    apart, the product's images `image_rows` rows apart, `rows` rows of output computed."""
    (kh, kw), (dh, dw) = kernel, dilation
    offsets = tuple(i * dh * pitch + j * dw for i in range(kh) for j in range(kw))
    return Direct(pitch, image_rows, tuple(padding), Shifts(offsets[-1], offsets, stride), rows * pitch,
                  tuple(input_dilation))


def direct_forms(x_shape: tuple[int, ...], out_hw: tuple[int, int], kernel, padding, dilation, unit: int,
                 stride: int = 1, input_dilation: tuple[int, int] = (1, 1)) -> list[Direct]:
    """The direct forms worth trying. The product's rows are cut into tiles by the hardware
    axes' sizes, and the output is a view of the product only when the tiles split at row
    boundaries (`direct_view`): so row pitches from the padded width up to a multiple of `unit`
    (the MAU's rows: tiles of whole MAU rows) and a power of two, and (one image) the output
    rows rounded up likewise, or (several) images as many rows apart (an image's padded rows,
    over the stride, rounded so)."""
    n = x_shape[0]
    ho = out_hw[0]
    # the padded input's extent: x spread by its input dilation, padded before and after, or (a
    # transposed convolution's padding after differs) as far as the last output reads
    h, w = (padded_extent(x_shape[2 + k], out_hw[k], kernel[k], stride, padding[k], dilation[k], input_dilation[k])
            for k in range(2))
    rounded = lambda v: {v, -(-v // unit) * unit, 1 << (v - 1).bit_length()}  # noqa: E731
    pitches = rounded(w)
    height = -(-h // stride)  # the product's rows an image needs
    layouts = [(height, r) for r in rounded(ho)] if n == 1 else [(rows, n * rows) for rows in rounded(height)]
    return [direct(kernel, padding, dilation, pitch, image_rows, rows, stride, input_dilation)
            for pitch in sorted(pitches) for image_rows, rows in sorted(layouts)]


def padded_extent(size: int, out: int, kernel: int, stride: int, padding: int, dilation: int, spread: int) -> int:
    """Pixels of a padded input dimension: x's `size` pixels `spread` apart with `padding` before
    and after, or more where the last of `out` outputs reads further."""
    return max((size - 1) * spread + 1 + 2 * padding, (out - 1) * stride + dilation * (kernel - 1) + 1)


def im2col_mvs(node: Node, x: Placement) -> float:
    """MVs the Data Engines run to gather convolution `node`'s im2col matrix from x placed as `x`
    (one per run of long words; each long word its own run when x's placement does not separate,
    which the kernel meets by a copy of x in the NHWC layout first): what a producer's choice of
    layout costs the convolution that reads it (planner.Planner.window_cycles)."""
    n, c, h, w = node.args[0].shape
    co, _, kh, kw = node.args[1].shape
    ho, wo = node.out.shape[2:]
    a = node.attrs
    epl = x.epl
    c_pad = ceil(c / epl) * epl
    if reads_spread(node):  # read by a direct form, about once: in runs of a pixel's channels at best
        window = im2col_window(x, c_pad, (h, w), (1, 1), (1, 1), (0, 0), (1, 1))
        a_lw = n * ho * wo * c_pad / epl
    else:
        window = im2col_window(x, c_pad, (ho, wo), (kh, kw), tuple(a["stride"]), tuple(a["padding"]),
                               tuple(a["dilation"]))
        a_lw = n * ho * wo * kh * kw * c_pad / epl
    return a_lw / (window.run_lw() if window is not None else 1.0)


def reads_spread(node: Node) -> bool:
    """Whether convolution `node` reads x spread by an input dilation (`Builder.conv`): only its
    direct form can (its window's holes are the zeros between the pixels)."""
    return tuple(node.attrs.get("input_dilation", (1, 1))) != (1, 1)


def direct_channels(c: int, epl: int, pes: int) -> int:
    """The channels a direct form's K runs over: padded so that every PE of a MAB holds whole long
    words of them (the MATMUL splits K over the PEs); the padding's weights are zero and its
    inputs holes (zeros). An RGB stem (3 channels: 8 on MN-Core 2) multiplies 5 zero channels a
    pixel, where im2col gathers its pixels in runs of one long word."""
    return ceil(c / (pes * epl)) * pes * epl


def direct_window(p: Placement, c: int, d: Direct, t: Tiling, rows: int) -> DimTerms | None:
    """A direct convolution's A as a window of p, which holds x: row r of A (`rows` of them: the
    tiles' a_rows for each tile and round) is the flattened input's row
    (r // a_rows) * stride * mt + r % a_rows, which lies in x or in its padding (a hole, which
    arrives as zeros); K is the channels. None when x's placement does not separate."""
    n, _, h, w = p.layout.shape
    held = min(c, p.layout.extents[1])  # channels x's storage has (padding included): the rest are holes
    base = DimTerms.of(p, sizes=(n, held, h, w))
    if base is None or not base.readable:
        return None
    tn, tc, th, tw = base.terms
    tc = tuple(np.concatenate([t, np.zeros(c - held, dtype=t.dtype)]) for t in tc)
    r = np.arange(rows, dtype=np.int64)
    flat = (r // t.a_rows) * d.stride * t.mt + r % t.a_rows
    image, rest = np.divmod(flat, d.stride * d.image_rows * d.pitch)
    y, x = np.divmod(rest, d.pitch)
    (sy, sx), (y, x) = d.input_dilation, (y - d.padding[0], x - d.padding[1])
    inside = (image < n) & (y >= 0) & (y % sy == 0) & (x >= 0) & (x % sx == 0)
    y, x = y // sy, x // sx  # x's pixel, where the spread input has one
    inside &= (y < h) & (x < w)
    image, y, x = (np.where(inside, v, 0) for v in (image, y, x))
    row_terms = tuple(np.where(inside, a[image] + b[y] + c_[x], 0) for a, b, c_ in zip(tn, th, tw))
    spread = f" input dilation {d.input_dilation}" if d.input_dilation != (1, 1) else ""
    return DimTerms(p, (row_terms, tc), 0, base.copies, base.group_copies, base.every_lane,
                    f"direct {rows}x{c} pitch {d.pitch} image {d.image_rows} padding {d.padding}{spread} "
                    f"stride {d.stride} tile {t.mt}+{t.a_rows - t.mt}", (((np.flatnonzero(inside), np.arange(held)), (0, 0)),))


def direct_view(layout: Layout, d: Direct, nhwc: tuple[int, ...]) -> Layout | None:
    """The product's (rows, Co) layout read as the (N, Co, Ho, Wo) output, the rows that are no
    output pixel its padding: nothing moves. None when the product's rows do not split into
    (images, image_rows, pitch) at its factors' boundaries."""
    rows, co = layout.extents
    one = nhwc[0] == 1  # one image: its rows need not end at image_rows
    lines = d.pitch if one else d.image_rows * d.pitch
    if rows % lines:
        return None
    split = reshape_layout(layout.with_shape(layout.extents),
                           (1, rows // d.pitch, d.pitch, co) if one else (rows // lines, d.image_rows, d.pitch, co))
    if split is None:
        return None
    return split.with_shape(nhwc).permute((0, 3, 1, 2))


def weight_index(w_shape, c_pad: int) -> np.ndarray:
    """For every element (k, co) of B (K = (i, j, padded c)), the flat index into w, -1 (zero) for
    padded channels."""
    co, c, kh, kw = w_shape
    ii, jj, cc, oo = np.meshgrid(np.arange(kh), np.arange(kw), np.arange(c_pad), np.arange(co), indexing="ij")
    flat = ((oo * c + np.minimum(cc, c - 1)) * kh + ii) * kw + jj
    return np.where(cc >= c, -1, flat).ravel()


def weight_read(dst: Placement, w: Placement, c_pad: int, padding_zero: bool = False
                ) -> tuple[Placement | DimTerms, np.ndarray | None]:
    """How B's image `dst` reads the weight w (Co, C, kh, kw) placed as `w`: as w's per-dimension
    terms regrouped into B's (K, Co) when no channel is padded, or w's layout pads the channels
    to K's and that padding holds zeros (`padding_zero`), and they separate (the gather follows
    from them, run by run), else through the element map `weight_index` (matched element by
    element: 0.2 s for a 256-channel 3x3 weight, asked for by every candidate; its padded
    channels come from the zero buffer, each a run of its own)."""
    weight = w
    if c_pad != w.layout.shape[1] and padding_zero and w.layout.extents[1] == c_pad:
        shape = (w.layout.shape[0], c_pad, *w.layout.shape[2:])
        w = Placement(w.layout.with_shape(shape), w.hw, w.memory, w.dtype)  # the padded channels as channels
    if c_pad == w.layout.shape[1]:
        terms = DimTerms.of(w)
        if terms is not None:
            terms = terms.regrouped([[2, 3, 1], [0]], "as B (K, Co)")
            try:
                lw_sources(dst, terms)  # (cached: every slice of a kernel asks again)
                return terms, None
            except LaneMismatch:
                return terms, None  # no block gather either way
            except LayoutError:
                pass  # the terms do not separate, or too many runs to list
    return weight, weight_index(weight.layout.shape, c_pad)


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
    """A convolution as a product on the MAUs: of the im2col matrix and B, or (`direct`) of x's
    tiles and B's per-position blocks, one MATMUL per kernel position.

    Its candidates stop being timed after a stale streak (`stops_when_stale`): a weight gradient's
    (a convolution of the input by the output gradient, with a kernel of the image's size) are
    tilings of one product whose gathers dominate alike, up to 29 of them within 2 % of each
    other, 0.2-2.2 s each to emit and time."""

    stops_when_stale = True

    def __init__(self, node: Node, tiling, ctx: EmitContext, trans: bool = False, direct: Direct | None = None,
                 read_padding: bool = False) -> None:
        self.node, self.nodes = node, (node,)
        x, w = node.args
        self.x, self.w = x, w
        n, c, h, wd = x.shape
        co, _, kh, kw = w.shape
        ho, wo = node.out.shape[2:]
        self.dtype = device_dtype(x)
        epl = ctx.hw.elements_per_lw(self.dtype)
        # K's channels: padded to fill long words, and for the direct form every PE's (`direct_channels`)
        self.c_pad = direct_channels(c, epl, ctx.params.pes_per_mab) if direct else ceil(c / epl) * epl
        self.direct = direct
        self.p = Problem(1, direct.rows, self.c_pad, co) if direct else Problem(1, n * ho * wo, kh * kw * self.c_pad, co)
        self.b_rows = kh * kw * self.c_pad  # B = w.permute(2, 3, 1, 0).reshape(b_rows, Co) (padded channels)
        self.t = tiling
        self.ctx = ctx
        a = node.attrs
        self.window_args = ((ho, wo), (kh, kw), tuple(a["stride"]), tuple(a["padding"]), tuple(a["dilation"]))
        self.half_in = half_in = self.dtype == "float16" and device_dtype(w) == "float16"
        self.la, self.lb, _ = layouts_for(ctx, tiling, self.p, False, half_in)
        self.out_dtype = device_dtype(node.out)
        self.lc_out, self.summed = output_layout(ctx, tiling, self.p, False, half_in, self.out_dtype)
        self.nhwc = (n, ho, wo, co)
        product_image = stage(ctx.lm_placement(self.lc_out, self.out_dtype)).dram
        as_nchw = partial(direct_view, d=direct) if direct else _as_nchw
        self.view = as_nchw(product_image.layout, nhwc=self.nhwc)
        self.view_lm = as_nchw(self.summed, nhwc=self.nhwc) if self.view is not None else None
        self.w_layout = None
        if w.kind == "const":  # arranged by the host: B itself is the constant
            data = w.data.permute(2, 3, 1, 0)
            data = torch.nn.functional.pad(data, (0, 0, 0, self.c_pad - c)).reshape(self.b_rows, co).contiguous()
            self.b = Value(f"{w.name}_kkc", (self.b_rows, co), w.dtype, "const", data=data)
        else:
            self.b = None
            # B is a view of w: w placed so that B stages by block copies. A direct form's padded
            # channels are w's padding, which must hold zeros (`sums_lane_padding`: a registered
            # weight the program does not write is bound with zero padding by the runtime, others
            # relaid); im2col's gather their zeros instead (an element map), or, with
            # `read_padding`, read them too: a view, or w placed as its image, from which B is
            # gathered padded channels included where they are zero (`padding_known`)
            if self.c_pad == c or direct or read_padding:
                hwio = reshape_layout(self.lb, (kh, kw, self.c_pad, co))
                self.w_layout = hwio.with_shape((kh, kw, c, co)).permute((3, 2, 0, 1)) if hwio is not None else None
        self.pads = {}
        self.windows: dict[str, tuple[Placement, DimTerms]] = {}  # x's layout -> (what A is gathered from, window)
        self.weight_bounds: dict[str, float] = {}  # w's layout -> least_cycles (asked by the planner and estimate)
        self.viewable: dict[str, bool] = {}  # w's LM layout -> whether B is a view of its image
        self.w_padding_zero = False  # whether w's padding is known to hold zeros (`padding_known`)

    def b_view(self, ref: Ref) -> Ref | None:
        """w's ref read as B = w.permute(2, 3, 1, 0).reshape(K, Co) (its padded channels
        included), when its layout can express it."""
        from .movement import view_ref

        def as_b(layout: Layout) -> Layout | None:
            hwio = layout.permute((2, 3, 1, 0))
            return reshape_layout(hwio.with_shape(hwio.extents), (self.b_rows, self.p.n))
        return view_ref(ref, as_b)

    def sums_lane_padding(self, v: Value, layout: Layout) -> bool:
        """Whether w, read in `layout`, brings padded channels into K: the MAU sums them, so they
        must hold zeros (the planner relays a w whose padding is not known to be zero, as for a
        product's operand: MatmulKernel.sums_lane_padding). Not when B is no view of `layout`'s
        image: B is then gathered from w with zeros in its padding (`emit`)."""
        if v is not self.w or self.c_pad == self.w.shape[1]:
            return False
        key = str(layout)
        if key not in self.viewable:
            image = stage(self.ctx.lm_placement(layout, device_dtype(v))).dram
            self.viewable[key] = self.b_view(Ref(v.name, image, layout)) is not None
        return self.viewable[key]

    def reads_padding(self, v: Value, ref: Ref) -> bool:
        """Whether the program reads w's padding where `ref` holds it (B a view of it, or gathered
        from it padded channels included): what a registered weight's copy must then hold zeros
        in (`Compiled.clean_inputs`)."""
        if v is not self.w or self.c_pad == self.w.shape[1]:
            return False
        if self.w_layout is not None and self.b_view(ref) is not None:
            return True
        return self.w_padding_zero and isinstance(self._weight_read(ref.placement)[0], DimTerms)

    def padding_known(self, v: Value, zero: bool) -> None:
        """The planner says whether `v`'s padding holds zeros: B is then gathered from w's padded
        channels too, in runs, where it had the zero buffer fill them one long word at a time."""
        if v is self.w:
            self.w_padding_zero = zero

    def _weight_read(self, w: Placement) -> tuple[Placement | DimTerms, np.ndarray | None]:
        return weight_read(self.b_image(self.ctx), w, self.c_pad, self.w_padding_zero)

    def x_placement(self, ctx: EmitContext) -> Placement:
        """x in NHWC, its channels padded as K's (a direct form's pixel then comes in one run)."""
        return Placement(nhwc_layout(ctx, self.x.shape, self.dtype, self.c_pad), ctx.hw, ctx.chain.dram, self.dtype)

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
        destination = self.b_image(ctx)
        return lane_compatible(destination, *weight_read(destination, ref.placement, self.c_pad))

    def b_image(self, ctx: EmitContext) -> Placement:
        """Where B's slices stage from: the DRAM image of B's LM layout (the weight's dtype)."""
        return stage(ctx.lm_placement(self.lb, device_dtype(self.w))).dram

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

    def window(self, x: Placement) -> tuple[Placement, DimTerms]:
        """The placement A (the im2col matrix, or the direct form's tiles) is a window of, and the
        window: x's own, unless x's placement does not separate or a copy of x in the usual NHWC
        layout first costs fewer MVs than gathering A from x's runs (x laid out by a layer whose
        rows interleave over the L1Bs: a 512-channel 3x3 layer at 7x7 after a direct one gathered
        its A in single long words, 324,522 cycles)."""
        key = str(x.layout)
        if key not in self.windows:
            if self.direct:
                of = partial(direct_window, c=self.c_pad, d=self.direct, t=self.t, rows=self.la.shape[0])
            else:
                of = partial(im2col_window, c_pad=self.c_pad, out_hw=self.window_args[0], kernel=self.window_args[1],
                             stride=self.window_args[2], padding=self.window_args[3], dilation=self.window_args[4])
            own = of(x)
            nhwc = self.x_placement(self.ctx)
            copied = of(nhwc) if own is None or not x.same_placement(nhwc) else None
            self.windows[key] = (nhwc, copied) if own is None or self._copy_pays(x, own, nhwc, copied) else (x, own)
        return self.windows[key]

    def _copy_pays(self, x: Placement, own: DimTerms, nhwc: Placement, copied: DimTerms | None) -> bool:
        """Whether copying x into `nhwc` and gathering A from the copy (window `copied`) takes
        fewer MVs than gathering A from x itself (window `own`; one MV a run of long words)."""
        if copied is None:  # (x is stored as nhwc already, or the copy's window does not separate)
            return False
        a_lw = self.la.shape[0] * self.la.shape[1] / x.epl
        from_x, from_copy = a_lw / own.run_lw(), a_lw / copied.run_lw()
        if from_copy >= from_x:
            return False
        try:
            return lw_sources(nhwc, x).mv_count + from_copy < from_x
        except (LaneMismatch, LayoutError):
            return False  # (lanes move, or too many runs to list: no copy by the Data Engines)

    def im2col(self, ctx: EmitContext, x: Ref) -> tuple[Ref, DimTerms]:
        """The storage the im2col matrix is a window of (x, or its NHWC copy, which the Data
        Engines write first), and the window."""
        placement, window = self.window(x.placement)
        if placement is x.placement:
            return x, window
        copy = ctx.buffer("temp", placement, f"{self.x.name}_nhwc")
        ctx.gather(lw_sources(placement, x.placement), copy, [x])
        return copy, window

    def estimate(self, ctx: EmitContext, refs: dict[Value, Ref]) -> float:
        """The tiling's cost with A in the runs its window gives (an NHWC copy of x is not
        counted, so the estimate stays below the timing); a direct one's with A in blocks (its
        runs' MVs the model over-counts, see `_direct_kernels`). At least what B's gather from
        the weight takes, when B is not the weight read in blocks: one DRAM latency per MV over
        all the Groups' queues, as for a product's operand (MatmulKernel.estimate). (A weight
        placed for a direct form, read by an im2col one in single long words: ResNet-18's
        compile at 224x224 timed 3x3 layers' candidates of 4.2 M cycles whose estimate was 44 K.)"""
        x, window = self.window(refs[self.x].placement)
        in_bytes = self.ctx.hw.element_bytes("float16" if self.half_in else "float32")
        bound = tiling_bound(self.ctx, self.t, in_bytes, self.t.half and not self.half_in,
                             None if self.direct else window.run_lw(), DimTerms.of(x).groups_spanned())
        return max(bound, self.least_cycles(ctx, refs))

    def least_cycles(self, ctx: EmitContext, refs: dict[Value, Ref]) -> float:
        """What B's gather from a device weight read by its terms takes at least: its MVs, each
        `gather_mv_cycles` (0: B is a constant the host arranges, a view of the weight, or read
        through an element map, which this does not count)."""
        if self.b is not None:
            return 0.0
        key = str(refs[self.w].placement.layout)
        if key not in self.weight_bounds:
            runs = None
            if self.w_layout is None or self.b_view(refs[self.w]) is None:
                destination = self.b_image(ctx)
                read, index = self._weight_read(refs[self.w].placement)
                runs = gather_runs(destination, read) if index is None else None
            self.weight_bounds[key] = (runs or 0) * ctx.gather_mv_cycles()
        return self.weight_bounds[key]

    def emit(self, ctx: EmitContext, refs: dict[Value, Ref]) -> None:
        out = self.node.out
        if self.b is not None:
            b_source = Source(refs[self.b])
        else:
            view = self.b_view(refs[self.w]) if self.w_layout is not None else None
            if view is not None:
                b_source = Source(view)
            else:
                read, index = self._weight_read(refs[self.w].placement)
                b_source = Source(refs[self.w], index) if index is not None else Source(refs[self.w], window=read)
        image = stage(ctx.lm_placement(self.lc_out, self.out_dtype)).dram
        if self.view is not None:
            product = Ref(refs[out].symbol, image, self.summed)
        else:
            product = ctx.buffer("temp", image, f"{out.name}_product", lm=self.summed)
        x_ref, window = self.im2col(ctx, refs[self.x])
        # a direct form's tiles are runs of x's rows: each L1B's in a block of its own (l2bmb@set) comes
        # in MVs as long as those runs, where an image dealt in 8-long-word chunks needs one MV per chunk
        a_source = Source(x_ref, window=window, blocks=a_blocks(self.t, ctx.chain))
        emit_product(ctx, self.t, self.p, False, a_source, b_source, self.out_dtype, product)
        if self.view is None:  # the tiling's rows do not split into images: gather into NHWC-packed NCHW
            target = DimTerms.of(refs[out].placement).regrouped([[0, 2, 3], [1]], "as (N*H*W, C)")
            ctx.gather(lw_sources(target, image), refs[out], [product])


# Compile-time budgets: the tilings whose B reads a device weight by block copies added to the
# cost-ranked ones, and, when B is larger than C, the best-ranked of the others kept beside them
# (the only ones then): each gathered candidate emits the weight's gather, up to one MV per long
# word, and timing them all took ResNet-18's compile at 64x64 from 12 to 72 s. A smaller weight's
# candidates are all timed (a depthwise 8-channel layer's best gathers its block-diagonal weight:
# 10,768 cycles, 17,324 by view).
ALIGNED_CANDIDATES = 4
GATHERED_BESIDE = 2
DIRECT_PER_KIND = 3  # direct tilings timed per kind of split (see _direct_kernels; compile-time budget)
DIRECT_TILINGS = 12  # tilings asked for per direct form (compile-time budget)


def plan(node: Node, planner) -> list[Kernel]:
    x, w = node.args
    if node.attrs["groups"] != 1:
        raise CompileError("internal: grouped convolutions are rewritten before planning")
    n, c, h, wd = x.shape
    co, _, kh, kw = w.shape
    ho, wo = node.out.shape[2:]
    epl = planner.hw.elements_per_lw(device_dtype(x))
    c_pad = ceil(c / epl) * epl
    p = Problem(1, n * ho * wo, kh * kw * c_pad, co)
    ask = _ask(node, planner.hw, planner.options)
    if reads_spread(node):
        directs = _direct_kernels(node, planner.ctx, ask, len(planner.users.get(x, [])))
        if not directs:  # (compiler.planner.rewrite spreads x explicitly where no direct form fits)
            raise CompileError(f"internal: no direct form of {node.label} fits the PE memories")
        return directs
    found = tilings(planner.ctx, p, **ask)
    aligned = []
    if w.kind != "const" and c_pad == c and kh * kw > 1:
        # A weight the device holds is read as B by block copies only when B's K chunks cut
        # K = (kernel position, channel) between factors (ConvKernel.w_layout); otherwise it is
        # gathered into B in runs as short as a long word each call (a 256-channel 3x3 layer's
        # weight: 294,912 MVs, 2.3 M cycles). The cost-ranked tilings seldom are (the estimate
        # leaves the weight's gather out), so the best few that are join them: the planner times
        # both kinds and keeps the faster.
        try:
            aligned = [t for t in tilings(planner.ctx, p, **ask, k_align=c, limit=ALIGNED_CANDIDATES) if t not in found]
        except CompileError:
            pass  # none fits: the others serve
    ranked = [ConvKernel(node, t, planner.ctx) for t in found]
    extra = [ConvKernel(node, t, planner.ctx) for t in aligned]
    if w.kind != "const" and c_pad != c:  # each tiling is also offered reading w's padding (beside the gathers)
        extra += [ConvKernel(node, t, planner.ctx, read_padding=True) for t in found]
    directs = _direct_kernels(node, planner.ctx, ask, len(planner.users.get(x, [])))
    by_view = [k for k in extra + ranked if k.w_layout is not None]
    if by_view and p.k > p.m:  # B larger than C: its gather would dominate what a candidate emits
        return directs + by_view + [k for k in ranked if k.w_layout is None][:GATHERED_BESIDE]
    # in rank order: the planner skips a candidate whose estimate is far above the fastest timed
    # alone, and a weight read by view may need a relayout first that its time alone leaves out
    return directs + ranked + extra


def _ask(node: Node, hw, options: dict) -> dict:
    """What convolution `node` asks `tilings` for (its formats, and the runs an im2col window
    gathers: a pixel's channels, and the next pixels' along a kernel row when they are adjacent)."""
    x, w = node.args
    dtype = device_dtype(x)
    epl = hw.elements_per_lw(dtype)
    half_in = dtype == "float16" and device_dtype(w) == "float16"
    half = half_in or options.get("float_dtype") == "mixed"
    runs = ceil(x.shape[1] / epl) * (w.shape[3] if node.attrs["dilation"][1] == 1 else 1)
    return dict(batched=False, trans_b=False, half=half, staged_in_float32=half and not half_in,
                out_half=device_dtype(node.out) == "float16",
                in_bytes=hw.element_bytes("float16" if half_in else "float32"), a_runs=runs,
                pseudo=options.get("float_dtype") == "pfloat32", float64=options.get("float_dtype") == "float64")


def direct_possible(node: Node, hw, options: dict, readers: int) -> bool:
    """Whether convolution `node`, whose x `readers` nodes read, has a direct form that fits."""
    return bool(_direct_kernels(node, EmitContext(hw, options), _ask(node, hw, options), readers))


def _direct_kernels(node: Node, ctx: EmitContext, ask: dict, readers: int) -> list[ConvKernel]:
    """Candidates that compute a convolution directly (`Direct`), its channels padded to fill
    every PE's long words (`direct_channels`); none when its strides differ (the flattened rows
    step by one stride), the kernel is one pixel and x is not spread (im2col is then x itself),
    or the channels need padding and another node reads x too (`readers`: x is stored with the
    padded channels, which that reader would have to read through: an MNIST CNN's training step,
    whose weight gradient reads the 1-channel input, took 15.7 -> 18.0 M cycles).

    The Data Engines gather A's tiles, halos included, into its L2BM image, whose runs end where
    the image interleaves the MABs' rows (every PE's long word: four, when the MABs split the
    rows) or the L1Bs' (every l2bm chunk, when they do): that, not the MAU, bounds these
    tilings, and the matmul model's MV latencies (summed over the Groups as if one queue) rank
    the ones whose L1Bs split the rows far too low (ResNet-50 conv2_x: 207,000 estimated,
    78,342 timed). So the best by that model of each kind of split are timed, DIRECT_PER_KIND
    each, those that split A's rows over the MABs only when no other fits."""
    x, w = node.args
    c, wd = x.shape[1], x.shape[3]
    co, _, kh, kw = w.shape
    a = node.attrs
    chain = ctx.chain
    sh, sw = a["stride"]
    epl = ctx.hw.elements_per_lw(device_dtype(x))
    k = direct_channels(c, epl, ctx.params.pes_per_mab)
    if sh != sw or (kh * kw == 1 and not reads_spread(node)) or (k != c and readers > 1):
        return []
    kinds: dict[tuple[bool, bool], list[tuple[Tiling, Direct]]] = {}
    mau_rows = ctx.hw.units[chain.matrix_unit].matrix["float32"].rows
    for d in direct_forms(x.shape, tuple(node.out.shape[2:]), (kh, kw), a["padding"], a["dilation"], mau_rows, sh,
                          tuple(a.get("input_dilation", (1, 1)))):
        try:
            found = tilings(ctx, Problem(1, d.rows, k, co), **{**ask, "a_runs": ceil(c / epl) * wd},
                            shifts=d.shifts, limit=DIRECT_TILINGS)
        except CompileError:
            continue  # no tile and its halo fit the PE memories
        for t in found:
            kinds.setdefault((t.places("a", chain.unit_axis), t.places("a", chain.l1_axis)), []).append((t, d))
    chosen = []
    for kind in sorted(kinds):  # those whose MABs hold A's rows last
        if kind[0] and chosen:
            break
        viewed = (k for k in (ConvKernel(node, t, ctx, direct=d)
                              for t, d in sorted(kinds[kind], key=lambda td: td[0].cost)) if k.view is not None)
        chosen += list(islice(viewed, DIRECT_PER_KIND))
    return chosen


def reads_as_is(user: Node, v: Value, ref: Ref, planner) -> bool:
    """x with its channels in the lanes is gathered as it is (ConvKernel.source_ok)."""
    return v is user.args[0] and channels_in_lanes(ref.placement)


def wishes(user: Node, v: Value, planner) -> list[Layout]:
    """A convolution gathers its input x by runs of a pixel's channels: it wishes x computed with
    the channels in the lanes and their long words on the innermost axes (`lane_runs`), so that a
    producer other readers also constrain (a residual block's output, which the next block's
    convolution and its sum both read) does not settle on a layout the convolution must relay
    through the PEs (ResNet-50 at 224x224: 8.4 M cycles each for two such relayouts)."""
    if v is not user.args[0]:
        return []
    epl = planner.hw.elements_per_lw(device_dtype(v))
    return lane_runs(v.shape, epl, planner.hw.axes, 1, planner.budget(2))

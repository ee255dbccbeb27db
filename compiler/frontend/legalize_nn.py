"""Legalization of the network ops kept whole by the decompositions: matrix products,
convolutions (a transposed one as a convolution's input gradient: the input dilated by the
stride and padded, correlated with the flipped, transposed weights), pooling and nearest
upsampling.

Pooling is a `window` (each output position sees its kh x kw input patch, with padding reading
the reduction's identity) followed by a reduction over the patch, so it runs as data movement
plus a vector reduction; an average divides by the count torch divides by.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..dtypes import INT32_MIN
from ..errors import UnsupportedOpError
from ..ir import CONV_RANK, Value, reduction_identity
from .build import Builder
from .legalize_movement import dilate, spaced
from .rules import ensure_float, out_dtype, rule


@rule("mm", "bmm", "matmul")
def _mm(b, out, x, y):
    dtype = out_dtype(out)
    compute = "float16" if x.dtype == y.dtype == "float16" else "float32"
    result = b.matmul(ensure_float(b, x, compute), ensure_float(b, y, compute))
    return b.cast(result, dtype)


def per_dim(values, dims: int) -> tuple:
    """A convolution's stride, padding or dilation with one entry per spatial dimension: torch
    gives one value for all of them as a list of one."""
    values = tuple(values)
    return values * dims if len(values) == 1 and dims > 1 else values


@rule("convolution", "_convolution", "conv2d")
def _convolution(b, out, x, w, bias, stride, padding, dilation, transposed=False, output_padding=(0, 0),
                 groups=1, *rest):
    one_d = x.rank == 3
    # one value for every spatial dimension, as torch takes it (conv2d's padding="valid" is [0])
    stride, padding, dilation, output_padding = (per_dim(v, x.rank - 2)
                                                 for v in (stride, padding, dilation, output_padding))
    if one_d:  # (N, C, L): a 2-D convolution of height 1
        x = b.reshape(x, (x.shape[0], x.shape[1], 1, x.shape[2]))
        w = b.reshape(w, (w.shape[0], w.shape[1], 1, w.shape[2]))
        stride, padding, dilation = (1, stride[0]), (0, padding[0]), (1, dilation[0])
    elif x.rank != CONV_RANK:
        raise UnsupportedOpError(b.aten, [list(x.shape), list(w.shape)], b.source, f"{x.rank - 2}-D convolutions")
    dtype = out_dtype(out)
    compute = "float16" if x.dtype == w.dtype == "float16" else "float32"
    x, w = ensure_float(b, x, compute), ensure_float(b, w, compute)
    if transposed:  # output_padding is in the output's shape
        shape = (out.shape[0], out.shape[1], 1, out.shape[2]) if one_d else tuple(out.shape)
        y = transposed_convolution(b, x, w, shape, tuple(stride), tuple(padding), tuple(dilation), groups)
    else:
        y = b.conv(x, w, tuple(stride), tuple(padding), tuple(dilation), groups)
    if bias is not None:
        y = b.ew("add", y, b.reshape(b.cast(bias, y.dtype), (1, bias.numel, 1, 1)))
    if one_d:
        y = b.reshape(y, (y.shape[0], y.shape[1], y.shape[3]))
    return b.cast(y, dtype)


def transposed_convolution(b: Builder, gy: Value, w: Value, x_shape: tuple[int, ...], stride, padding, dilation,
                           groups: int) -> Value:
    """dL/dx[n, c, i] = sum over (o, k) with i = o * s + k * d - p of gy[n, co, o] w[co, c, k]:
    gy dilated by s and padded by d (k - 1) - p, correlated with the flipped, transposed weights.
    The gradient of a convolution by its input is the transposed convolution of gy by w (torch's
    conv_transpose2d, whose weight is (in, out / groups, kh, kw)), of output size x_shape.

    gy's dilation is the convolution's input dilation (`Builder.conv`), read by the direct form
    from gy as it is stored: spread with explicit zeros first, a stride-2 layer's gradient went
    through four copies of gy's elements (a CNN training step on mncore2: about 2.6 M of its
    7.6 M cycles). Grouped convolutions, and padding past the dilated kernel's reach, take the
    explicit spread (`spread_input`)."""
    co, cg, kh, kw = w.shape
    k_size = (kh, kw)
    lo = tuple(dilation[k] * (k_size[k] - 1) - padding[k] for k in range(2))
    # weights (g * Co/g, C/g, kh, kw) -> (g * C/g, Co/g, kh, kw), flipped in both spatial axes
    split = b.reshape(w, (groups, co // groups, cg, kh, kw))
    a = [[1, 0, 0, 0, 0], [0, 0, 1, 0, 0], [0, 1, 0, 0, 0], [0, 0, 0, -1, 0], [0, 0, 0, 0, -1]]
    flipped = b.window(split, (groups, cg, co // groups, kh, kw), a, (0, 0, 0, kh - 1, kw - 1))
    flipped = b.reshape(flipped, (groups * cg, co // groups, kh, kw))
    if groups == 1 and min(lo) >= 0:
        return b.conv(gy, flipped, (1, 1), lo, dilation, 1, input_dilation=tuple(stride), out_hw=tuple(x_shape[2:]))
    return b.conv(spread_input(b, gy, tuple(stride), lo, tuple(x_shape[2:]), (kh, kw), dilation), flipped, (1, 1),
                  (0, 0), dilation, groups)


def spread_input(b: Builder, x: Value, step: tuple[int, int], before: tuple[int, int], out_hw: tuple[int, int],
                 kernel: tuple[int, int], dilation: tuple[int, int], stride: tuple[int, int] = (1, 1)) -> Value:
    """x's pixels `step` apart with zeros between, `before` zeros ahead (negative: cut) and after
    as many as a convolution of `kernel` needs for an output of `out_hw` (cut where it needs
    fewer): a convolution's input dilation made explicit."""
    for k, dim in enumerate((2, 3)):
        x = dilate(b, x, dim, step[k])
    pads = [(0, 0), (0, 0)]
    for k in range(2):
        need = (out_hw[k] - 1) * stride[k] + dilation[k] * (kernel[k] - 1) + 1
        pads.append((before[k], need - x.shape[2 + k] - before[k]))
    return b.pad(x, pads)


def pool_geometry(x: Value, kernel, stride, padding, dilation, ceil_mode: bool):
    """((kh, kw), stride, padding, dilation, (Ho, Wo)) of a pooling. The kernel is cut to the
    offsets whose reads can land inside the padded input (Ho, Wo are the full kernel's): the others
    read only the fill, which neither a window's sum nor its maximum nor torch's divisor counts,
    and a ceil-mode kernel may be far larger than the image (Hugging Face EfficientNet pools its
    7 x 7 map with a kernel of its hidden width, 1,280: patches of 1,280 x 1,280 per channel)."""
    kh, kw = (kernel * 2 if len(kernel) == 1 else kernel)
    stride = stride or (kh, kw)
    sh, sw = (stride * 2 if len(stride) == 1 else stride)
    ph, pw = (padding * 2 if len(padding) == 1 else padding) if padding else (0, 0)
    dh, dw = (dilation * 2 if len(dilation) == 1 else dilation) if dilation else (1, 1)
    h, w = x.shape[-2:]

    def out_size(size, k, s, p, d):
        span = size + 2 * p - d * (k - 1) - 1
        n = (math.ceil(span / s) if ceil_mode else span // s) + 1
        if ceil_mode and (n - 1) * s >= size + p:  # torch: the last window must start inside the input
            n -= 1
        return n

    def reachable(size, k, p, d):  # offsets i with -p + i * d inside the padded input
        return min(k, (size + 2 * p - 1) // d + 1)
    return ((reachable(h, kh, ph, dh), reachable(w, kw, pw, dw)), (sh, sw), (ph, pw), (dh, dw),
            (out_size(h, kh, sh, ph, dh), out_size(w, kw, sw, pw, dw)))


def tiling(geometry) -> bool:
    """Whether the windows tile the (padded) input: stride = kernel and no dilation, so that every
    input position lies in at most one window (2x2 max-pooling by 2, a global average)."""
    (kh, kw), (sh, sw), _, (dh, dw), _ = geometry
    return (sh, sw) == (kh, kw) and (dh, dw) == (1, 1)


def tile_pads(size: tuple[int, int], geometry) -> list[tuple[int, int]]:
    """The (before, after) padding of the last two dims that makes (H, W) exactly the tiles'
    (Ho * kh, Wo * kw): the pooling's own padding first, then as many positions as the tiles
    reach past the image (negative: rows and columns no window reads, cropped)."""
    (kh, kw), _, (ph, pw), _, (ho, wo) = geometry
    h, w = size
    return [(ph, ho * kh - h - ph), (pw, wo * kw - w - pw)]


def window_patches(b: Builder, x: Value, geometry, fill) -> Value:
    """(..., H, W) -> (..., Ho, Wo, kh, kw): every output position's input patch."""
    (kh, kw), (sh, sw), (ph, pw), (dh, dw), (ho, wo) = geometry
    lead = x.rank - 2
    shape = x.shape[:lead] + (ho, wo, kh, kw)
    a = [[1 if c == d else 0 for c in range(len(shape))] for d in range(lead)]
    a.append([0] * lead + [sh, 0, dh, 0])
    a.append([0] * lead + [0, sw, 0, dw])
    return b.window(x, shape, a, [0] * lead + [-ph, -pw], fill)


def depthwise_patches(b: Builder, x: Value, channels: int, geometry) -> Value:
    """(N, C, H, W) -> (N, Ho, Wo, kh, kw, channels), zero-padded: the patches each output channel
    of a depthwise convolution reads, input channel c feeding output channels c * m .. c * m + m - 1
    (m = channels / C, the channel multiplier). Channels last: a window shifts the image's axes, and
    an axis the long words' lanes run along cannot shift by a gather (its elements would change
    lanes); 144 channels of 4 x 4 on mini found no layout for the patches otherwise."""
    n, c, h, w = x.shape
    if channels > c:
        mult = channels // c
        x = b.reshape(b.expand(b.reshape(x, (n, c, 1, h, w)), (n, c, mult, h, w)), (n, channels, h, w))
    (kh, kw), (sh, sw), (ph, pw), (dh, dw), (ho, wo) = geometry
    shape = (n, ho, wo, kh, kw, channels)
    a = [[1, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 1], [0, sh, 0, dh, 0, 0], [0, 0, sw, 0, dw, 0]]
    return b.window(x, shape, a, [0, 0, -ph, -pw], 0.0)


def flat_positions(b: Builder, rows: Value, cols: Value, size: tuple[int, int], outside: int) -> Value:
    """The flat index (row * W + column) of image positions given as int32 rows and columns,
    `outside` where they lie outside the (H, W) image (padding)."""
    h, w = size
    inside = b.ew("and", b.ew("and", b.ew("ge", rows, 0), b.ew("lt", rows, h)),
                  b.ew("and", b.ew("ge", cols, 0), b.ew("lt", cols, w)))
    return b.ew("where", inside, b.ew("add", b.ew("mul", rows, w), cols), outside, dtype="int32")


def _patch_positions(b: Builder, size: tuple[int, int], geometry) -> Value:
    """(Ho, Wo, kh, kw): the flat index (row * W + column) of the input position each patch
    element reads, h * w where it reads the padding. Computed from iotas, where gathering a map of
    indices through the window would move a tensor of x's size."""
    (kh, kw), (sh, sw), (ph, pw), (dh, dw), (ho, wo) = geometry
    h, w = size
    shape = (ho, wo, kh, kw)  # every operand whole (one broadcast along alternating dims cannot be staged)
    rows = b.ew("add", b.iota(shape, 0, "int32", -ph, sh), b.iota(shape, 2, "int32", 0, dh))
    cols = b.ew("add", b.iota(shape, 1, "int32", -pw, sw), b.iota(shape, 3, "int32", 0, dw))
    return flat_positions(b, rows, cols, size, h * w)


@rule("max_pool2d_with_indices", "max_pool2d")
def _max_pool(b, out, x, kernel, stride=(), padding=(0,), dilation=(1,), ceil_mode=False):
    geometry = pool_geometry(x, kernel, stride, padding, dilation, ceil_mode)
    lowest = float("-inf") if x.dtype != "int32" else INT32_MIN
    patches = window_patches(b, x, geometry, lowest)
    last = (patches.rank - 2, patches.rank - 1)
    values = b.reduce("max", patches, last)
    if b.aten.startswith("aten.max_pool2d_with_indices") and b.wants_output(1):
        h, w = x.shape[-2:]
        where = _patch_positions(b, (h, w), geometry)
        top = b.reduce("max", patches, last, True)
        hit = b.ew("eq", patches, top)
        if x.dtype != "int32":  # a NaN is its window's maximum, and equals nothing: its own position
            hit = b.ew("or", hit, b.ew("and", b.ew("ne", patches, patches), b.ew("ne", top, top)))
        indices = b.reduce("min", b.ew("where", hit, where, h * w, dtype="int32"), last)
        return values, indices
    return (values, None) if b.aten.startswith("aten.max_pool2d_with_indices") else values


@rule("adaptive_max_pool2d")
def _adaptive_max_pool(b, out, x, output_size):
    """Adaptive max pooling (and so adaptive_max_pool1d): output position o of a dim of n takes
    the maximum over n*o // out .. ceil(n*(o+1) / out), windows that may overlap and differ in
    size. Each dim's windows are a mask (output position x input position) made from iotas, and
    the maximum is taken one dim at a time; the index (flat over h x w, the first maximum in
    row-major order, a NaN's when the window holds one) compares every window's positions with
    its maximum."""
    h, w = x.shape[-2:]
    ho, wo = (int(s) for s in output_size)
    lead = x.shape[:-2]
    lowest = reduction_identity("max", x.dtype)
    rows, cols = _windows(b, h, ho), _windows(b, w, wo)  # (ho, h), (wo, w)
    per_col = b.ew("where", b.reshape(cols, (1,) * len(lead) + (1, wo, w)),
                   b.reshape(x, lead + (h, 1, w)), lowest, dtype=x.dtype)  # (..., h, wo, w)
    col_max = b.reduce("max", per_col, [len(lead) + 2])  # (..., h, wo)
    per_row = b.ew("where", b.reshape(rows, (1,) * len(lead) + (ho, h, 1)),
                   b.reshape(col_max, lead + (1, h, wo)), lowest, dtype=x.dtype)  # (..., ho, h, wo)
    values = b.reduce("max", per_row, [len(lead) + 1])  # (..., ho, wo)
    if not b.wants_output(1):
        return values, None
    inside = b.ew("and", b.reshape(rows, (ho, 1, h, 1)), b.reshape(cols, (1, wo, 1, w)))  # (ho, wo, h, w)
    grid = b.reshape(x, lead + (1, 1, h, w))
    top = b.reshape(values, lead + (ho, wo, 1, 1))
    hit = b.ew("eq", grid, top)
    if x.dtype != "int32":
        hit = b.ew("or", hit, b.ew("and", b.ew("ne", grid, grid), b.ew("ne", top, top)))
    hit = b.ew("and", hit, inside)
    flat = b.ew("add", b.ew("mul", b.iota((h, w), 0, "int32"), w), b.iota((h, w), 1, "int32"))
    indices = b.reduce("min", b.ew("where", hit, flat, h * w, dtype="int32"), [len(lead) + 2, len(lead) + 3])
    return values, indices


def _windows(b: Builder, n: int, out: int) -> Value:
    """(out, n) booleans: whether input position p lies in adaptive window o (torch's bounds:
    floor(o * n / out) to ceil((o + 1) * n / out))."""
    o, p = b.iota((out, n), 0, "int32"), b.iota((out, n), 1, "int32")
    start = b.ew("floor_div", b.ew("mul", o, n), out, dtype="int32")
    end = b.ew("floor_div", b.ew("add", b.ew("mul", o, n), n + out - 1), out, dtype="int32")
    return b.ew("and", b.ew("ge", p, start), b.ew("lt", p, end))


@rule("avg_pool2d")
def _avg_pool(b, out, x, kernel, stride=(), padding=(0,), ceil_mode=False, count_include_pad=True,
              divisor_override=None):
    geometry = pool_geometry(x, kernel, stride, padding, (1,), ceil_mode)
    x = ensure_float(b, x)
    patches = window_patches(b, x, geometry, 0.0)
    total = b.reduce("sum", patches, (patches.rank - 2, patches.rank - 1))
    divisor = avg_divisor(b, x, geometry, ceil_mode, count_include_pad, divisor_override)
    return b.ew("mul", total, 1.0 / divisor) if not isinstance(divisor, Value) else b.ew("div", total, divisor)


def avg_divisor(b: Builder, x: Value, geometry, ceil_mode: bool, count_include_pad: bool,
                divisor_override: int | None) -> float | Value:
    """What torch divides each window's sum by: a number, or (Ho, Wo) counts where windows are
    clipped (padding not counted, or ceil mode's partial windows)."""
    (kh, kw), _, (ph, pw), _, (ho, wo) = geometry
    if divisor_override:
        return float(divisor_override)
    if not ceil_mode and (count_include_pad or (ph, pw) == (0, 0)):
        return float(kh * kw)
    h, w = x.shape[-2:]
    if count_include_pad:  # patches clipped to the padded input count
        ones = b.full((h + 2 * ph, w + 2 * pw), 1.0, x.dtype)
        unpadded = ((kh, kw), geometry[1], (0, 0), (1, 1), (ho, wo))
        return b.reduce("sum", window_patches(b, ones, unpadded, 0.0), (2, 3))
    return b.reduce("sum", window_patches(b, b.full((h, w), 1.0, x.dtype), geometry, 0.0), (2, 3))


@rule("upsample_nearest2d")
def _upsample_nearest(b, out, x, output_size=None, *scales: Any):
    """Nearest upsampling (or downsampling). Integer scale factors: every pixel repeated
    s_h x s_w times (reshape, expand, reshape). Otherwise each dim picks the positions torch's
    op picks (`nearest_sources`), one dim after the other (`pick`)."""
    n, c, h, w = x.shape
    ho, wo = out.shape[-2:]
    if ho % h == 0 and wo % w == 0:
        sh, sw = ho // h, wo // w
        grown = b.expand(b.reshape(x, (n, c, h, 1, w, 1)), (n, c, h, sh, w, sw))
        return b.reshape(grown, (n, c, ho, wo))
    rows, cols = nearest_sources((h, w), output_size, scales, b.aten.split(".")[-1])
    return pick(b, pick(b, x, 2, rows), 3, cols)


def nearest_sources(size: tuple[int, int], output_size, scales: tuple, overload: str,
                    packet=torch.ops.aten.upsample_nearest2d) -> tuple[list[int], list[int]]:
    """The source row of every output row and the source column of every output column that
    torch's nearest resizing picks: its own op (`packet`: nearest, or nearest-exact; the same
    overload, sizes and scales) asked at compile time, of an image of position numbers."""
    h, w = size
    op = getattr(packet, overload)
    numbers = torch.arange(h * w, dtype=torch.float64).reshape(1, 1, h, w)
    picked = op(numbers, output_size, *scales)[0, 0].to(torch.int64)
    return (picked[:, 0] // w).tolist(), (picked[0, :] % w).tolist()


def _period(sources: list[int]) -> tuple[int, int]:
    """(p, q): the fewest output positions p after which the sources repeat q positions further
    on (p = all of them when they never do; q = 0 for a single period)."""
    out = len(sources)
    p = next(p for p in range(1, out + 1) if out % p == 0 and (p == out or all(
        sources[o + p] == sources[o] + sources[p] - sources[0] for o in range(out - p))))
    return p, sources[p] - sources[0] if p < out else 0


def pick(b: Builder, x: Value, dim: int, sources: list[int]) -> Value:
    """x's positions `sources` (one per output position) along `dim`, by strided slices: phase r
    of every period (`_period`) is the slice from sources[r] in steps of q, and the phases are
    interleaved (6 -> 9 rows: periods of 3 outputs over 2 inputs, 3 slices). Nothing is
    computed, so values are copied exactly."""
    out = len(sources)
    period, step = _period(sources)
    blocks = out // period
    lead, tail = x.shape[:dim], x.shape[dim + 1:]
    phases = []
    for r in range(period):
        first = sources[r]
        if step > 0:
            part = b.slice(x, dim, first, first + (blocks - 1) * step + 1, step)
        else:
            part = b.expand(b.slice(x, dim, first, first + 1), lead + (blocks,) + tail)
        phases.append(b.reshape(part, lead + (blocks, 1) + tail))
    stacked = b.cat(phases, dim + 1) if len(phases) > 1 else phases[0]
    return b.reshape(stacked, lead + (out,) + tail)


def unpick(b: Builder, g: Value, dim: int, sources: list[int], size: int) -> Value:
    """The gradient of `pick`: each source position sums the output positions that took it,
    phase by phase in output order (torch's order), laid back by spaced copies."""
    out = len(sources)
    period, step = _period(sources)
    blocks = out // period
    lead, tail = g.shape[:dim], g.shape[dim + 1:]
    grid = b.reshape(g, lead + (blocks, period) + tail)
    total = None
    for r in range(period):
        part = b.reshape(b.slice(grid, dim + 1, r, r + 1), lead + (blocks,) + tail)
        if step == 0:
            part = b.reduce("sum", part, [dim], True)
        placed = spaced(b, part, dim, size, max(step, 1), sources[r])
        total = placed if total is None else b.ew("add", total, placed)
    return total


@rule("im2col")
def _im2col(b, out, x, kernel_size, dilation, padding, stride):
    """F.unfold: every output position's patch as a column, (..., C * kh * kw, Ho * Wo), channels
    outermost. One window of x (padding reads zeros), shaped (..., C, kh, kw, Ho, Wo) so that the
    reshape to columns keeps the element order; torch's decomposition gathers by computed
    indices, a one-hot product over every input position (1,896,488 cycles for a 3x3 unfold of
    2x3x16x16 on mncore2)."""
    (kh, kw), (dh, dw), (ph, pw), (sh, sw) = (tuple(v) * (2 // len(v)) for v in (kernel_size, dilation, padding, stride))
    h, w = x.shape[-2:]
    ho, wo = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1, (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    lead = x.rank - 3  # batch dimensions before C
    shape = x.shape[:lead + 1] + (kh, kw, ho, wo)
    a = [[1 if c == d else 0 for c in range(len(shape))] for d in range(lead + 1)]
    a.append([0] * (lead + 1) + [dh, 0, sh, 0])
    a.append([0] * (lead + 1) + [0, dw, 0, sw])
    patches = b.window(x, shape, a, [0] * (lead + 1) + [-ph, -pw], 0)
    return b.reshape(patches, x.shape[:lead] + (x.shape[lead] * kh * kw, ho * wo))

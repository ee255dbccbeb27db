"""Legalization of the backward ops of convolution and max-pooling, which torch leaves whole
(convolution_backward has no decomposition) or decomposes into a scatter (max-pool backward
scatters through its indices, which the device would run as a comparison against every input
position: quadratic in the image). Both become forward primitives:

* the input gradient of a convolution is a convolution of the output gradient, dilated by the
  stride and padded, with the weights transposed and flipped;
* its weight gradient is a convolution of the input with the output gradient as the kernel
  (batch and channel axes swapped, the stride becoming the dilation);
* a transposed convolution (forward: frontend.legalize_nn) is a convolution's input gradient,
  so its gradients are the same two with the roles of input and output gradient swapped;
* the input gradient of a max-pool is, for each of the kh x kw window offsets, the output
  gradient where that offset held the maximum, dilated by the stride and shifted into place;
  when the windows tile the input (stride = kernel), all offsets at once over the tiles
  (Ho, kh, Wo, kw), read back as the image (`_from_tiles`).
"""

from __future__ import annotations

from typing import Any

import torch

from ..errors import UnsupportedOpError
from ..ir import CONV_RANK, Value
from .build import Builder
from .rules import ensure_float, rule
from .legalize_movement import spaced
from .legalize_nn import (avg_divisor, depthwise_patches, flat_positions, nearest_sources, per_dim, pool_geometry,
                          tiling, tile_pads, transposed_convolution, unpick)


def _placed(b: Builder, g: Value, size: tuple[int, int], stride: tuple[int, int], offset: tuple[int, int]) -> Value:
    """(..., Ho, Wo) -> (..., H, W) with g[o] at position o * stride + offset (zeros elsewhere;
    positions outside the image are dropped)."""
    for k, dim in enumerate((g.rank - 2, g.rank - 1)):
        g = spaced(b, g, dim, size[k], stride[k], offset[k])
    return g


@rule("convolution_backward")
def _convolution_backward(b, out, gy, x, w, bias_sizes, stride, padding, dilation, transposed, output_padding,
                          groups, output_mask):
    shapes = [list(gy.shape), list(x.shape), list(w.shape)]
    stride, padding, dilation, output_padding = (per_dim(v, x.rank - 2)
                                                 for v in (stride, padding, dilation, output_padding))
    one_d = x.rank == 3
    if one_d:  # (N, C, L): a 2-D convolution of height 1
        gy, x, w = (b.reshape(t, (t.shape[0], t.shape[1], 1, t.shape[2])) for t in (gy, x, w))
        stride, padding, dilation = (1, stride[0]), (0, padding[0]), (1, dilation[0])
    elif x.rank != CONV_RANK:
        raise UnsupportedOpError(b.aten, shapes, b.source, f"gradients of {x.rank - 2}-D convolutions")
    compute = "float16" if gy.dtype == x.dtype == w.dtype == "float16" else "float32"
    gy, x, w = (ensure_float(b, t, compute) for t in (gy, x, w))
    results: list[Any] = [None, None, None]
    geometry = (tuple(stride), tuple(padding), tuple(dilation))
    # y = conv_transpose(x, w) is the input gradient of z = conv(y, w) for z's gradient x: its own
    # input gradient is that convolution of gy, and its weight gradient that of the convolution
    # with the roles of x and gy swapped
    if output_mask[0]:
        results[0] = b.conv(gy, w, *geometry, groups) if transposed else \
            transposed_convolution(b, gy, w, x.shape, *geometry, groups)
    if output_mask[1]:
        if transposed:
            results[1] = _weight_grad(b, x, gy, w.shape, *geometry, groups)
        elif w.shape[1] == 1 and groups == x.shape[1] > 1:
            results[1] = _depthwise_weight_grad(b, gy, x, w.shape, *geometry)
        else:
            results[1] = _weight_grad(b, gy, x, w.shape, *geometry, groups)
    if output_mask[2]:
        results[2] = b.reduce("sum", gy, (0, 2, 3))
    if one_d:
        results[0] = None if results[0] is None else b.reshape(results[0], out[0].shape)
        results[1] = None if results[1] is None else b.reshape(results[1], out[1].shape)
    return tuple(results)


def _weight_grad(b: Builder, gy: Value, x: Value, w_shape: tuple[int, ...], stride, padding, dilation,
                 groups: int) -> Value:
    """dL/dw[co, c, k] = sum over (n, o) of gy[n, co, o] x[n, c, o * s + k * d - p]: a convolution
    of x (channels of a group as the batch, (group, n) as channels) by gy ((co, n) as the
    kernel), stride d and dilation s, cropped to the kernel's size."""
    n, c, h, wd = x.shape
    co, cg, kh, kw = w_shape
    ho, wo = gy.shape[2:]
    spatial = (3, 3 + 1)  # (n, group, channel, H, W): the image axes stay last
    xs = b.reshape(x, (n, groups, cg, h, wd))
    xs = b.reshape(b.permute(xs, (2, 1, 0, *spatial)), (cg, groups * n, h, wd))
    gs = b.reshape(gy, (n, groups, co // groups, ho, wo))
    gs = b.reshape(b.permute(gs, (1, 2, 0, *spatial)), (co, n, ho, wo))
    full = b.conv(xs, gs, dilation, padding, stride, groups)
    cropped = b.slice(b.slice(full, 2, 0, kh), 3, 0, kw)
    return b.permute(cropped, (1, 0, 2, 3))


def _depthwise_weight_grad(b: Builder, gy: Value, x: Value, w_shape: tuple[int, ...], stride, padding,
                           dilation) -> Value:
    """dL/dw[co, 0, k] = sum over (n, o) of gy[n, co, o] x[n, co / m, o * s + k * d - p] for a
    depthwise convolution (m output channels per input channel): the forward's patches times the
    output gradient, summed over the batch and the output positions. As a convolution of x by gy
    (`_weight_grad`) it is one per channel with gy as a kernel the size of the image: MobileNetV2's
    48 channels of 17 x 17 (batch 2) did not fit the PE memories of mini."""
    co, _, kh, kw = w_shape
    n, _, ho, wo = gy.shape
    patches = depthwise_patches(b, x, co, ((kh, kw), stride, padding, dilation, (ho, wo)))
    products = b.ew("mul", patches, b.reshape(b.permute(gy, (0, 2, 3, 1)), (n, ho, wo, 1, 1, co)))
    grad = b.reduce("sum", products, (0, 1, 2))  # (kh, kw, C)
    return b.reshape(b.permute(grad, (2, 0, 1)), w_shape)


@rule("max_pool2d_with_indices_backward")
def _max_pool_backward(b, out, gy, x, kernel, stride, padding, dilation, ceil_mode, indices):
    """Each window offset (i, j) sends the output gradient where the forward's index says the
    maximum was at that offset; the offsets' contributions, placed on the input grid, add up."""
    geometry = pool_geometry(x, kernel, stride, padding, dilation, ceil_mode)
    (kh, kw), (sh, sw), (ph, pw), (dh, dw), (ho, wo) = geometry
    h, w = x.shape[-2:]
    gy = ensure_float(b, gy)
    if tiling(geometry):  # one comparison over the tiles, laid back onto the image by a view
        return _from_tiles(b, b.ew("where", _hits_on_tiles(b, indices, (h, w), geometry), _on_tiles(b, gy, geometry),
                                   0.0, dtype=gy.dtype), (h, w), geometry)
    rows, cols = b.iota((ho, wo), 0, "int32"), b.iota((ho, wo), 1, "int32")
    total = None
    for i in range(kh):
        for j in range(kw):
            r = b.ew("add", b.ew("mul", rows, sh), i * dh - ph)
            c = b.ew("add", b.ew("mul", cols, sw), j * dw - pw)
            where = flat_positions(b, r, c, (h, w), -1)
            hit = b.ew("eq", indices, b.expand(where, indices.shape))
            part = b.ew("where", hit, gy, 0.0, dtype=gy.dtype)
            placed = _placed(b, part, (h, w), (sh, sw), (i * dh - ph, j * dw - pw))
            total = placed if total is None else b.ew("add", total, placed)
    return total


@rule("adaptive_max_pool2d_backward")
def _adaptive_max_pool_backward(b, out, gy, x, indices):
    """Each output's gradient goes to the input position its index names (windows may overlap:
    the contributions add), by comparing every index with every position."""
    h, w = x.shape[-2:]
    lead, (ho, wo) = x.shape[:-2], gy.shape[-2:]
    gy = ensure_float(b, gy)
    picks = b.reshape(indices, lead + (ho * wo, 1))
    hit = b.ew("eq", picks, b.iota((1, h * w), 1, "int32"))  # (..., ho*wo, h*w)
    spread = b.ew("where", hit, b.reshape(gy, lead + (ho * wo, 1)), 0.0, dtype=gy.dtype)
    return b.reshape(b.reduce("sum", spread, [len(lead)]), x.shape)


@rule("avg_pool2d_backward")
def _avg_pool_backward(b, out, gy, x, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override):
    """Every input position of a window receives the window's gradient over its divisor."""
    geometry = pool_geometry(x, kernel, stride, padding, (1,), ceil_mode)
    return _spread_windows(b, gy, x, geometry, avg_divisor(b, x, geometry, ceil_mode, count_include_pad,
                                                           divisor_override))


def _on_tiles(b: Builder, v: Value, geometry) -> Value:
    """(..., Ho, Wo) -> (..., Ho, kh, Wo, kw): each window's value at every offset (a view)."""
    (kh, kw), _, _, _, (ho, wo) = geometry
    lead = v.shape[:-2]
    return b.expand(b.reshape(v, lead + (ho, 1, wo, 1)), lead + (ho, kh, wo, kw))


def _hits_on_tiles(b: Builder, indices: Value, size: tuple[int, int], geometry) -> Value:
    """(..., Ho, kh, Wo, kw) booleans: whether offset (di, dj) of window (i, j) is where the
    forward's index put the window's maximum. Compared as codes: the index less the flat position
    of the window's origin (i * kh - ph, j * kw - pw) against di * W + dj, a (kh, kw) table every
    window shares. Two offsets share a code only when one of them lies outside the image (their
    columns differ by W or more), which `_from_tiles` drops. The codes are computed at the
    outputs' shape, so the comparison over the tiles reads no operand that varies along the
    windows but not along the batch and channels: such an operand stages only in some layouts,
    and a CNN step's pooling gradient was computed in one that its readers gathered in single
    long words (131 K MVs)."""
    (kh, kw), _, (ph, pw), _, (ho, wo) = geometry
    h, w = size
    origin = b.ew("add", b.iota((ho, wo), 0, "int32", -ph * w, kh * w), b.iota((ho, wo), 1, "int32", -pw, kw))
    code = b.ew("sub", indices, b.expand(origin, indices.shape), dtype="int32")
    offsets = b.ew("add", b.iota((kh, 1, kw), 0, "int32", 0, w), b.iota((kh, 1, kw), 2, "int32"))
    tiles = _on_tiles(b, code, geometry)
    return b.ew("eq", tiles, b.expand(offsets, tiles.shape))


def _from_tiles(b: Builder, tiles: Value, size: tuple[int, int], geometry) -> Value:
    """(..., Ho, kh, Wo, kw) -> (..., H, W) for windows that tile the input: offset (di, dj) of
    window (i, j) is input position (i * kh + di - ph, j * kw + dj - pw); what lies outside the
    image is dropped, positions no window covers are zeros. A view and a pad, where placing
    each offset's share (`_placed`) took kh * kw pads, slices and sums of the image's size (a
    2x2 max-pooling's backward: about 1 M cycles a pooling in a CIFAR-sized training step)."""
    (kh, kw), _, _, _, (ho, wo) = geometry
    lead = tiles.shape[:tiles.rank - 2 * len(size)]  # two tile dims, (Ho, kh) and (Wo, kw), per image dim
    flat = b.reshape(tiles, lead + (ho * kh, wo * kw))
    return b.pad(flat, [(0, 0)] * len(lead) + [(-before, -after) for before, after in tile_pads(size, geometry)])


def _spread_windows(b: Builder, gy: Value, x: Value, geometry, divisor: float | Value) -> Value:
    (kh, kw), (sh, sw), (ph, pw), (dh, dw), _ = geometry
    g = ensure_float(b, gy)
    g = b.ew("mul", g, 1.0 / divisor) if not isinstance(divisor, Value) else b.ew("div", g, divisor)
    if tiling(geometry):
        return _from_tiles(b, _on_tiles(b, g, geometry), x.shape[-2:], geometry)
    total = None
    for i in range(kh):
        for j in range(kw):
            placed = _placed(b, g, x.shape[-2:], (sh, sw), (i * dh - ph, j * dw - pw))
            total = placed if total is None else b.ew("add", total, placed)
    return total


@rule("_upsample_nearest_exact2d_backward")
def _upsample_nearest_exact_backward(b, out, gy, output_size, input_size, *scales):
    """Nearest-exact resizing's gradient: the gradient of the picks its forward makes (`unpick`),
    the positions asked of torch's own op (torch has no decomposition of this backward)."""
    h, w = input_size[-2:]
    rows, cols = nearest_sources((h, w), output_size, scales, "default", torch.ops.aten._upsample_nearest_exact2d)
    return unpick(b, unpick(b, ensure_float(b, gy), 3, cols, w), 2, rows, h)


@rule("upsample_nearest2d_backward")
def _upsample_nearest_backward(b, out, gy, output_size, input_size, *scales):
    """Integer scale factors: each input pixel's gradient is the sum over its s_h x s_w copies.
    Otherwise the gradient of the forward's picks (`unpick`), a dim at a time."""
    n, c, h, w = input_size
    ho, wo = gy.shape[-2:]
    if ho % h or wo % w:
        rows, cols = nearest_sources((h, w), output_size, scales, b.aten.split(".")[-1])
        return unpick(b, unpick(b, ensure_float(b, gy), 3, cols, w), 2, rows, h)
    grid = b.reshape(ensure_float(b, gy), (n, c, h, ho // h, w, wo // w))
    return b.reduce("sum", grid, (grid.rank - 3, grid.rank - 1))  # the copies along H and along W

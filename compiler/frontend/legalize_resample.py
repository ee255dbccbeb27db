"""Separable resampling (bilinear and bicubic interpolation, with or without antialiasing;
adaptive average pooling over uneven windows) and their gradients, as two matrix products with
constant matrices.

Both ops are linear in x and act on H and W separately: out = R x C^T for a (Ho, H) matrix R and
a (Wo, W) matrix C that depend on the sizes alone, and the gradient is R^T g C. torch's
decompositions compute the same thing as gathers of neighbours at indices computed on the device
(bilinear: four gathers and three lerps; uneven adaptive pooling: a gather of every window). On
MN-Core those gathers run as one-hot products over every input pixel. Upsampling a 2x3x16x16
image twofold took 3,859,632 cycles on mncore2 that way and takes 10,296 as two products;
adaptive pooling of it to 3x3, 524,604 and 9,258. The matrices are torch's own: its
op applied to the unit vectors of one axis, on the host at compile time, as a convolution's
weights are arranged; the data is only ever touched by the device's products.

Deviation for non-finite inputs: a product multiplies every input of a row (column) by its
weight, zeros included, and 0 * inf is NaN. An infinity or NaN in x therefore makes NaN of every
output whose row and column products read its row or column, where torch's gathers keep it to
the outputs whose neighbours it is (one inf in a 6x6 image upsampled twofold: 128 NaN outputs,
torch none). Finite inputs give torch's values to rounding.
"""

from __future__ import annotations

from math import prod
from typing import Any, Callable

import torch

from ..errors import CompileError
from ..ir import Value
from .build import Builder
from .rules import RULES, ensure_float, rule

aten = torch.ops.aten


UNIT_WIDTH = 2  # columns of the unit images: torch's antialiased kernels are degenerate on one column


def axis_matrix(size: int, out_size: int, along: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """The (out_size, size) matrix of a separable op along one axis: `along` maps (size, 1, size,
    UNIT_WIDTH) unit images (image k is 1 on row k) to (size, 1, out_size, UNIT_WIDTH), keeping
    the width (`[out_size, units.shape[-1]]` as the op's size)."""
    units = torch.eye(size, dtype=torch.float64).reshape(size, 1, size, 1).expand(-1, -1, -1, UNIT_WIDTH).contiguous()
    with torch.no_grad():
        images = along(units)
    if tuple(images.shape) != (size, 1, out_size, UNIT_WIDTH):
        raise CompileError(f"internal: resampling {size} -> {out_size} gave unit images {tuple(images.shape)}")
    return images[:, 0, :, 0].t().contiguous()


def _identity(matrix: torch.Tensor) -> bool:
    """Whether an axis matrix keeps its axis as it is (the same size, sampled where it lies): a
    product with it would copy the image through a (size x size) constant."""
    n = matrix.shape[0]
    return matrix.shape[1] == n and torch.equal(matrix, torch.eye(n, dtype=matrix.dtype))


def resample(b: Builder, x: Value, rows: torch.Tensor, cols: torch.Tensor) -> Value:
    """rows @ x @ cols^T over x's last two dimensions (any leading ones); an axis the op keeps as
    it is is not multiplied (a 3-D resampling's second pass over H * W as one axis)."""
    x = ensure_float(b, x)
    dtype = x.dtype
    lead, (h, w) = x.shape[:-2], x.shape[-2:]
    images = b.reshape(x, (prod(lead), h, w))  # one batch dimension: the products reshape nothing between them
    across = images
    if not _identity(cols):
        across = b.matmul(images, constant(b, "resample_cols", cols.t(), dtype), dtype=dtype)  # (B, H, Wo)
        b.graph.nodes[-1].attrs["exact"] = True  # resampling, not a product the user wrote: never in half
    down = across
    if not _identity(rows):
        down = b.matmul(constant(b, "resample_rows", rows, dtype), across, dtype=dtype)  # (B, Ho, Wo)
        b.graph.nodes[-1].attrs["exact"] = True
    return b.reshape(down, lead + down.shape[-2:])


def constant(b: Builder, name: str, data: torch.Tensor, dtype: str) -> Value:
    """A constant of the program, in the products' dtype."""
    data = data.to(torch.float16 if dtype == "float16" else torch.float32).contiguous()
    v = Value(b.fresh(name), tuple(data.shape), dtype, "const", data=data)
    b.graph.constants.append(v)
    return v


INTERPOLATIONS = ("upsample_bilinear2d", "upsample_bicubic2d", "_upsample_bilinear2d_aa", "_upsample_bicubic2d_aa")


def _interpolation(name: str, h: int, w: int, size: tuple[int, int], align_corners: bool, scales: tuple[Any, Any]
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """torch's interpolation `name` to `size` along H and along W, as the (Ho, H) and (Wo, W)
    matrices (`scales` as the .default overload takes them: a factor per axis or None). Each mode
    weighs the neighbours along one axis independently of the other (bicubic's 4 x 4 taps are
    the products of its 1-D weights, at clamped positions; antialiasing widens the 1-D filter)."""
    op = getattr(aten, name).default

    def along(axis: int) -> Callable[[torch.Tensor], torch.Tensor]:
        return lambda units: op(units, [size[axis], units.shape[-1]], align_corners, scales[axis], None)
    return axis_matrix(h, size[0], along(0)), axis_matrix(w, size[1], along(1))


def _interpolate(name: str) -> Callable:
    def legalize(b, out, x, output_size, align_corners, *scales):
        """.default(x, output_size, align_corners, scales_h, scales_w) and .vec(x, output_size,
        align_corners, scale_factors): the size is torch's output's; the factors, when given,
        change where torch samples (1 / factor, not H / Ho)."""
        if b.aten.endswith(".vec"):
            scales = tuple(scales[0]) if output_size is None and scales and scales[0] is not None else ()
        scales = tuple(scales) + (None,) * (2 - len(scales))
        return resample(b, x, *_interpolation(name, *x.shape[-2:], tuple(out.shape[-2:]), align_corners, scales))
    return legalize


def _interpolate_backward(name: str) -> Callable:
    def legalize(b, out, gy, output_size, input_size, align_corners, *scales):
        scales = tuple(scales) + (None,) * (2 - len(scales))
        rows, cols = _interpolation(name, *input_size[-2:], tuple(output_size), align_corners, scales)
        return resample(b, gy, rows.t(), cols.t())
    return legalize


for _name in INTERPOLATIONS:
    rule(_name)(_interpolate(_name))
    rule(f"{_name}_backward")(_interpolate_backward(_name))


def _adaptive(h: int, w: int, ho: int, wo: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Adaptive average pooling's window means along H and along W (torch's windows)."""
    pool = lambda size: lambda units: aten._adaptive_avg_pool2d.default(units, [size, units.shape[-1]])  # noqa: E731
    return axis_matrix(h, ho, pool(ho)), axis_matrix(w, wo, pool(wo))


@rule("_adaptive_avg_pool2d")
def _adaptive_avg_pool(b, out, x, output_size):
    """Even windows are an average pooling (a reduction of patches); uneven ones, whose windows
    overlap and differ in size, are the product with the window means."""
    (h, w), (ho, wo) = x.shape[-2:], tuple(out.shape[-2:])
    if h % ho == 0 and w % wo == 0:
        k = (h // ho, w // wo)
        return RULES["avg_pool2d"](b, out, x, k, k)
    return resample(b, x, *_adaptive(h, w, ho, wo))


@rule("_adaptive_avg_pool2d_backward")
def _adaptive_avg_pool_backward(b, out, gy, x):
    (ho, wo), (h, w) = gy.shape[-2:], x.shape[-2:]
    if h % ho == 0 and w % wo == 0:
        return RULES["avg_pool2d_backward"](b, out, gy, x, (h // ho, w // wo), (h // ho, w // wo), (0,), False,
                                            True, None)
    rows, cols = _adaptive(h, w, ho, wo)
    return resample(b, gy, rows.t(), cols.t())

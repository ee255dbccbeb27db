"""Ops decomposed above autograd while a function is traced, so that autograd differentiates
torch's own decomposition of their forward.

torch decomposes these ops but not their backward ops, which the tracer would otherwise meet in
the joint graph and refuse: replication padding (an index at clamped positions;
aten.replication_pad*d_backward), weight normalisation (v * g / |v|;
aten._weight_norm_interface_backward) and reflection padding (whose decomposition's gradient is
one gather over every padded dimension at once). Replaced by torch's decomposition (for weight
normalisation, torch's own composite of it) before autograd sees them, their gradient is the
one autograd derives for the decomposition's ops (an index_put accumulation, products and a
norm). Nothing here is a gradient rule: the forward is torch's, the backward autograd's.
torch.bilinear (nn.Bilinear) runs as its definition, one einsum: torch's aten._trilinear has
no decomposition. So do three losses and an activation torch computes otherwise:
multilabel_margin_loss (torch's decomposition of its forward is wrong on targets ended by -1,
and its backward has none), multi_margin_loss (no decomposition of its backward),
gaussian_nll_loss (torch checks `var < 0` on the host, which a device program cannot: a
negative variance is clamped to eps like a small one, where torch raises ValueError), rrelu
in eval mode (a leaky ReLU of slope (lower + upper) / 2; in training mode it is random),
cdist, softshrink and hardshrink (no decomposition of their backward); one_hot with a class
count, which torch's kernel checks by reading the indices (a captured constant's values); CTC
loss, whose kernel's shapes depend on the lengths' values. And ops mnsim lowers through others
it lowers with their gradients: 3-D pooling (and so local_response_norm), adaptive 3-D average
pooling and trilinear resampling as two separable 2-D passes, 3-D convolutions (transposed too)
as 2-D ones per kernel depth, grid_sample on images as torch's decomposition of grid_sampler_2d;
matrix inverses, solves and determinants (LAPACK calls in torch) by Gauss-Jordan elimination.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F
from torch._decomp import decomposition_table
from torch.nn import _reduction
from torch.overrides import TorchFunctionMode

aten = torch.ops.aten

REPLICATION_PADS = {1: aten.replication_pad1d.default, 2: aten.replication_pad2d.default,
                    3: aten.replication_pad3d.default}


def _pad(input, pad, mode="constant", value=None):
    """F.pad in replicate mode as torch's replication_pad decomposition, in reflect mode as its
    definition (else not handled)."""
    if mode == "reflect":
        return _reflect(input, list(pad))
    op = REPLICATION_PADS.get(len(pad) // 2) if mode == "replicate" else None
    return NotImplemented if op is None else decomposition_table[op](input, list(pad))


def _reflect(x, pad: list[int]):
    """Reflection padding as its definition, one dimension at a time (the last first, as F.pad
    lists them): the `left` elements after the edge, mirrored, then x, then the `right` ones before
    the far edge, mirrored. torch's decomposition indexes all padded dimensions at once, and its
    gradient became one gather over them together: a 2 x 32 x 16 x 16 ReflectionPad2d needed
    1.7e8 runs and was refused; slices, flips and a cat differentiate dimension by dimension."""
    for k in range(len(pad) // 2):
        dim, left, right = x.dim() - 1 - k, pad[2 * k], pad[2 * k + 1]
        n = x.shape[dim]
        parts = [x.narrow(dim, 1, left).flip(dim)] if left else []
        parts.append(x)
        if right:
            parts.append(x.narrow(dim, n - 1 - right, right).flip(dim))
        x = torch.cat(parts, dim) if len(parts) > 1 else x
    return x


def _weight_norm(v, g, dim=0):
    """torch._weight_norm as torch computes it where it does not call its fused kernel:
    v * (g / norm_except_dim(v, 2, dim)), with torch's own handling of `dim` (-1: the whole
    tensor; another negative dim counts from the end; a 1-D v is normalised element by element).
    (The decomposition of aten._weight_norm_interface, which stands for the fused kernel torch
    calls for dim 0 and the last dim only, normalised over the whole tensor for dim=-2 of a
    matrix and for a 1-D v.)"""
    return v * (g / torch.norm_except_dim(v, 2, dim))


def _bilinear(input1, input2, weight, bias=None):
    """torch.bilinear as its definition, y = x1^T A x2 + b, in one einsum: torch computes it with
    aten._trilinear, which neither torch's decompositions nor mnsim's rules open."""
    y = torch.einsum("...i,oij,...j->...o", input1, weight, input2)
    return y if bias is None else y + bias


def _reduced(loss: torch.Tensor, reduction: str, size_average=None, reduce=None) -> torch.Tensor:
    """`loss` reduced as torch's losses take it (the legacy size_average / reduce flags first)."""
    if size_average is not None or reduce is not None:
        reduction = _reduction.legacy_get_string(size_average, reduce)
    return loss.mean() if reduction == "mean" else loss.sum() if reduction == "sum" else loss


def _multilabel_margin(input, target, size_average=None, reduce=None, reduction="mean"):
    """nn.MultiLabelMarginLoss as torch's kernel computes it: a row's targets are its entries
    before the first -1; loss = sum over targets j and non-targets i of max(0, 1 - (x[j] - x[i]))
    / C. (torch's decomposition also counts the entries after a -1.)"""
    x, y = (input, target) if input.dim() > 1 else (input.unsqueeze(0), target.unsqueeze(0))
    valid = (y >= 0).cumprod(-1).bool()  # the entries before the first -1
    index = y.clamp(min=0)
    is_target = torch.zeros_like(x).scatter_add(-1, index, valid.to(x.dtype)) > 0
    margins = (1 - x.gather(-1, index).unsqueeze(-1) + x.unsqueeze(-2)).clamp(min=0)  # [target j, class i]
    counted = valid.unsqueeze(-1) & ~is_target.unsqueeze(-2)
    loss = torch.where(counted, margins, torch.zeros_like(margins)).sum((-2, -1)) / x.shape[-1]
    return _reduced(loss if input.dim() > 1 else loss[0], reduction, size_average, reduce)


def _multi_margin(input, target, p=1, margin=1.0, weight=None, size_average=None, reduce=None, reduction="mean"):
    """nn.MultiMarginLoss as its definition: sum over classes i != y of w[y] max(0, margin - x[y]
    + x[i])^p / C (torch decomposes its forward, not its backward)."""
    if p not in (1, 2):
        raise ValueError("only p == 1 and p == 2 supported")
    x, y = (input, target) if input.dim() > 1 else (input.unsqueeze(0), target.unsqueeze(0))
    terms = (margin - x.gather(-1, y.unsqueeze(-1)) + x).clamp(min=0)
    terms = terms * terms if p == 2 else terms
    if weight is not None:
        terms = terms * weight[y].unsqueeze(-1)
    others = torch.ones_like(x).scatter(-1, y.unsqueeze(-1), 0.0)
    loss = (terms * others).sum(-1) / x.shape[-1]
    return _reduced(loss if input.dim() > 1 else loss[0], reduction, size_average, reduce)


def _gaussian_nll(input, target, var, full=False, eps=1e-6, reduction="mean"):
    """F.gaussian_nll_loss as torch computes it, but for its `torch.any(var < 0)` check (a value
    the host would read mid-program): var's shape rules, var clamped to eps where its gradient
    passes unchanged (torch clamps a clone under no_grad)."""
    if isinstance(var, float):
        var = var * torch.ones_like(input)
    elif var.size() != input.size():
        if input.size()[:-1] == var.size():
            var = var.unsqueeze(-1)
        elif not (input.dim() == var.dim() and
                  sum(b for a, b in zip(input.size(), var.size()) if a != b) == 1):
            raise ValueError("var is of incorrect size")
    if reduction not in ("none", "mean", "sum"):
        raise ValueError(reduction + " is not valid")
    var = var + (var.clamp(min=eps) - var).detach()
    loss = 0.5 * (torch.log(var) + (input - target) ** 2 / var)
    if full:
        loss = loss + 0.5 * math.log(2 * math.pi)
    return _reduced(loss, reduction)


# torch's threshold for computing Euclidean distances through a product (at::native cdist: more
# than 25 rows on either side, unless compute_mode says otherwise); torch's rule, kept to give its values
CDIST_MM_ROWS = 25


def _cdist(x1, x2, p=2.0, compute_mode="use_mm_for_euclid_dist_if_necessary"):
    """torch.cdist as torch computes it, so that autograd differentiates it (aten._cdist_backward
    has no decomposition): for p = 2 its product form (|a|^2 + |b|^2 - 2 a.b, clamped at 0) where
    torch uses it (more than CDIST_MM_ROWS rows on a side, or always when asked), else the
    differences' p-norm. A zero distance has gradient 0, as torch's kernel gives it."""
    rows = max(x1.shape[-2], x2.shape[-2])
    if p == 2 and (compute_mode == "use_mm_for_euclid_dist" or
                   compute_mode == "use_mm_for_euclid_dist_if_necessary" and rows > CDIST_MM_ROWS):
        squares = (x1.pow(2).sum(-1, keepdim=True) + x2.pow(2).sum(-1).unsqueeze(-2)
                   - 2 * x1 @ x2.transpose(-1, -2)).clamp(min=0)
        return _root(squares, 2.0)
    diff = (x1.unsqueeze(-2) - x2.unsqueeze(-3)).abs()
    if p == 0:
        return (diff != 0).to(diff.dtype).sum(-1)
    if p == math.inf:
        return diff.amax(-1)
    return diff.sum(-1) if p == 1 else _root(diff.pow(p).sum(-1), p)


def _root(total, p: float):
    """total ** (1 / p), with gradient 0 where total is 0 (its derivative there is infinite)."""
    positive = total > 0
    return torch.where(positive, torch.where(positive, total, torch.ones_like(total)).pow(1 / p),
                       torch.zeros_like(total))


def _softshrink(input, lambd=0.5):
    """F.softshrink as its definition (torch decomposes it, not its backward)."""
    return torch.where(input > lambd, input - lambd, torch.where(input < -lambd, input + lambd,
                                                                  torch.zeros_like(input)))


def _hardshrink(input, lambd=0.5):
    """F.hardshrink as its definition (torch decomposes it, not its backward)."""
    return torch.where((input > lambd) | (input < -lambd), input, torch.zeros_like(input))


def _one_hot(tensor, num_classes=-1):
    """F.one_hot with its class count given, as its definition: torch's kernel checks the indices'
    range by reading them, which a captured constant index tensor (a fixed target) turns into a
    value the trace cannot know. An index out of range gives a row of zeros (torch raises)."""
    if num_classes < 0:
        return NotImplemented  # the count is the indices' max: data
    return (tensor.unsqueeze(-1) == torch.arange(num_classes)).long()


def _rrelu(input, lower=0.125, upper=1.0 / 3, training=False, inplace=False):  # torch's defaults
    """F.rrelu in eval mode: a leaky ReLU with the mean slope (training mode draws slopes: random,
    not handled)."""
    if training:
        return NotImplemented
    slope = (lower + upper) / 2
    return F.leaky_relu_(input, slope) if inplace else F.leaky_relu(input, slope)


def _triple(v, default=None) -> tuple:
    """A 3-D op's size or scale argument as (depth, height, width)."""
    if v is None or isinstance(v, (list, tuple)) and len(v) == 0:
        v = default
    if isinstance(v, (int, float)):
        return (v, v, v)
    return tuple(v) * 3 if len(v) == 1 else tuple(v)


def _pool3d(x, pool2d, kernel, stride, padding, plane: dict, depth: dict):
    """A 3-D pooling as two 2-D ones: over (H, W) with every depth as a channel, then over D with
    H * W as the width. Max- and average-pooling over a box are separable, and so are their
    padding and clipping rules (a clipped window's divisor is the product of its clipped extents
    in each dimension). 2-D pooling and its gradient are what the compiler lowers."""
    unbatched = x.dim() == len(kernel) + 1  # (C, D, H, W)
    x = x.unsqueeze(0) if unbatched else x
    n, c, d, h, w = x.shape
    pooled = pool2d(x.reshape(n, c * d, h, w), kernel[1:], stride[1:], padding[1:], **plane)
    ho, wo = pooled.shape[-2:]
    pooled = pool2d(pooled.reshape(n, c, d, ho * wo), (kernel[0], 1), (stride[0], 1), (padding[0], 0), **depth)
    y = pooled.reshape(n, c, pooled.shape[2], ho, wo)
    return y[0] if unbatched else y


def _avg_pool3d(input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
                divisor_override=None):
    """F.avg_pool3d as two 2-D average-poolings (`_pool3d`); a divisor override divides the sums."""
    kernel = _triple(kernel_size)
    common = {"ceil_mode": ceil_mode, "count_include_pad": count_include_pad}
    if divisor_override:
        common["divisor_override"] = 1
    y = _pool3d(input, F.avg_pool2d, kernel, _triple(stride, kernel), _triple(padding),
                plane=common, depth=common)
    return y / divisor_override if divisor_override else y


def _max_pool3d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
    """F.max_pool3d as two 2-D max-poolings (`_pool3d`); with indices, not handled."""
    if return_indices:
        return NotImplemented
    kernel, dilation = _triple(kernel_size), _triple(dilation)
    return _pool3d(input, F.max_pool2d, kernel, _triple(stride, kernel), _triple(padding),
                   plane={"dilation": dilation[1:], "ceil_mode": ceil_mode},
                   depth={"dilation": (dilation[0], 1), "ceil_mode": ceil_mode})


def _conv3d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """F.conv3d as a sum of 2-D convolutions, one per kernel depth kd: the input's depths that
    position reads (kd * dilation, then every stride-th) folded into the batch, convolved with
    the weight's slice kd. The compiler lowers 2-D convolutions and their gradients."""
    unbatched = input.dim() == weight.dim() - 1
    x = input.unsqueeze(0) if unbatched else input
    kernel = weight.shape[2:]
    if padding == "valid":
        padding = 0
    elif padding == "same":  # the extra position of an even span after, as torch pads
        if _triple(stride) != (1, 1, 1):
            raise RuntimeError("padding='same' is not supported for strided convolutions")  # torch's refusal
        span = [d * (k - 1) for d, k in zip(_triple(dilation), kernel)]
        x = F.pad(x, [p for s in reversed(span) for p in (s // 2, s - s // 2)])
        padding = 0
    (sd, sh, sw), (pd, ph, pw), (dd, dh, dw) = _triple(stride), _triple(padding), _triple(dilation)
    x = F.pad(x, (0, 0, 0, 0, pd, pd)) if pd else x
    n, c, depth, h, w = x.shape
    out_depth = (depth - dd * (kernel[0] - 1) - 1) // sd + 1
    total = None
    for k in range(kernel[0]):
        picked = x[:, :, k * dd: k * dd + sd * (out_depth - 1) + 1: sd]  # (N, C, Do, H, W)
        folded = picked.transpose(1, 2).reshape(n * out_depth, c, h, w)
        part = F.conv2d(folded, weight[:, :, k], None, (sh, sw), (ph, pw), (dh, dw), groups)
        total = part if total is None else total + part
    y = total.reshape(n, out_depth, *total.shape[1:]).transpose(1, 2)
    if bias is not None:
        y = y + bias.reshape(1, -1, 1, 1, 1)
    return y[0] if unbatched else y


def _conv_transpose3d(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
    """F.conv_transpose3d as a sum over kernel depths kd of 2-D transposed convolutions: every
    input depth (folded into the batch) with the weight's slice kd, its results laid at output
    depths id * stride + kd * dilation - padding (spread `stride` apart, then shifted)."""
    unbatched = input.dim() == weight.dim() - 1
    x = input.unsqueeze(0) if unbatched else input
    (sd, sh, sw), (pd, ph, pw), (od, oh, ow), (dd, dh, dw) = (_triple(v) for v in (stride, padding, output_padding,
                                                                                   dilation))
    n, c, depth, h, w = x.shape
    kernel_depth = weight.shape[2]
    out_depth = (depth - 1) * sd - 2 * pd + dd * (kernel_depth - 1) + od + 1
    folded = x.transpose(1, 2).reshape(n * depth, c, h, w)
    spread = (depth - 1) * sd + 1  # the input depths' span once spread
    total = None
    for k in range(kernel_depth):
        part = F.conv_transpose2d(folded, weight[:, :, k], None, (sh, sw), (ph, pw), (oh, ow), groups, (dh, dw))
        part = part.reshape(n, depth, *part.shape[1:]).transpose(1, 2)  # (N, Co, D, Ho, Wo)
        if sd > 1:  # stride - 1 zeros after every depth, the last ones dropped
            part = F.pad(part.unsqueeze(3), (0, 0, 0, 0, 0, sd - 1)).flatten(2, 3)[:, :, :spread]
        front = k * dd - pd
        part = F.pad(part, (0, 0, 0, 0, front, out_depth - spread - front))
        total = part if total is None else total + part
    if bias is not None:
        total = total + bias.reshape(1, -1, 1, 1, 1)
    return total[0] if unbatched else total


def _local_response_norm(input, size, alpha=1e-4, beta=0.75, k=1.0):
    """F.local_response_norm as torch defines it, its average over `size` neighbouring channels a
    2-D average-pooling of the squares over (channels, the rest flattened) (torch pools a 5-D
    view with aten.avg_pool3d)."""
    if input.dim() < 3 or input.numel() == 0:
        return NotImplemented
    n, c = input.shape[:2]
    squares = (input * input).reshape(n, 1, c, -1)
    squares = F.pad(squares, (0, 0, size // 2, (size - 1) // 2))
    div = F.avg_pool2d(squares, (size, 1), stride=1).reshape(input.shape)
    return input / (div * alpha + k).pow(beta)


GRID_MODES = {"bilinear": 0, "nearest": 1, "bicubic": 2}  # torch.grid_sampler's enums (F.grid_sample's own)
GRID_PADDINGS = {"zeros": 0, "border": 1, "reflection": 2}


def _grid_sample(input, grid, mode="bilinear", padding_mode="zeros", align_corners=None):
    """F.grid_sample on images as torch's decomposition of aten.grid_sampler_2d (its backward has
    none): the corners' weights and gathers at the positions the grid computes."""
    if grid.shape[-1] != 2 or mode not in GRID_MODES or padding_mode not in GRID_PADDINGS:  # (x, y): an image
        return NotImplemented
    return decomposition_table[aten.grid_sampler_2d.default](input, grid, GRID_MODES[mode],
                                                             GRID_PADDINGS[padding_mode], bool(align_corners))


def _adaptive_avg_pool3d(input, output_size):
    """F.adaptive_avg_pool3d as two adaptive 2-D average-poolings (a box's average is separable,
    and each dimension's windows are its own)."""
    sizes = _triple(output_size)
    unbatched = input.dim() == len(sizes) + 1  # (C, D, H, W)
    x = input.unsqueeze(0) if unbatched else input
    n, c, d, h, w = x.shape
    do, ho, wo = (s if s is not None else full for s, full in zip(sizes, (d, h, w)))
    plane = F.adaptive_avg_pool2d(x.reshape(n, c * d, h, w), (ho, wo))
    y = F.adaptive_avg_pool2d(plane.reshape(n, c, d, ho * wo), (do, ho * wo)).reshape(n, c, do, ho, wo)
    return y[0] if unbatched else y


def _interpolate(input, size=None, scale_factor=None, mode="nearest", align_corners=None, recompute_scale_factor=None,
                 antialias=False):
    """F.interpolate in trilinear mode as two bilinear passes: over (H, W) with every depth as a
    channel, then over (D, H * W), the second axis kept as it is (legalize_resample does not
    multiply it). Linear interpolation is separable, and each pass samples where torch's 3-D
    kernel does (scale factors, when given, passed on per axis). Other modes: torch's own."""
    if mode != "trilinear" or input.dim() - 2 != 3 or antialias:  # (N, C) and three spatial dims
        return NotImplemented
    n, c, d, h, w = input.shape
    options = {"mode": "bilinear", "align_corners": align_corners, "recompute_scale_factor": recompute_scale_factor}
    if size is not None:
        do, ho, wo = _triple(size)
        plane = F.interpolate(input.reshape(n, c * d, h, w), size=(ho, wo), **options)
        depth = F.interpolate(plane.reshape(n, c, d, ho * wo), size=(do, ho * wo), **options)
    else:
        sd, sh, sw = _triple(scale_factor)
        plane = F.interpolate(input.reshape(n, c * d, h, w), scale_factor=(sh, sw), **options)
        ho, wo = plane.shape[-2:]
        depth = F.interpolate(plane.reshape(n, c, d, ho * wo), scale_factor=(sd, 1.0), **options)
    return depth.reshape(n, c, depth.shape[2], ho, wo)


def _eliminate(a: torch.Tensor, b: torch.Tensor | None = None):
    """Gauss-Jordan elimination of square matrices (..., n, n) with partial pivoting (each
    column's pivot the largest magnitude among its remaining rows, as LU factorisation takes it),
    one column a step: (A^-1 B or None, the pivots (..., n), the sign of the row permutation).
    Row swaps are sums with one-hot rows, so autograd differentiates every step."""
    n = a.shape[-1]
    m = a if b is None else torch.cat([a, b], -1)
    rows = torch.arange(n)
    pivots, sign = [], torch.ones(a.shape[:-2], dtype=a.dtype)
    for k in range(n):
        candidates = torch.where(rows >= k, m[..., :, k].abs(), -torch.ones_like(m[..., :, k]))
        chosen = rows == candidates.argmax(-1, keepdim=True)  # (..., n) one-hot of the pivot row
        at_k = (rows == k).to(m.dtype)
        pivot_row = (m * chosen.unsqueeze(-1).to(m.dtype)).sum(-2)
        row_k = m[..., k, :]
        m = m + at_k.unsqueeze(-1) * (pivot_row - row_k).unsqueeze(-2) \
            + chosen.unsqueeze(-1).to(m.dtype) * (row_k - pivot_row).unsqueeze(-2)  # rows k and p exchanged
        sign = torch.where(chosen[..., k], sign, -sign)
        pivot = m[..., k, k]
        pivots.append(pivot)
        unit = m[..., k, :] / pivot.unsqueeze(-1)
        m = torch.where((rows == k).unsqueeze(-1), unit.unsqueeze(-2), m - m[..., :, k:k + 1] * unit.unsqueeze(-2))
    return (None if b is None else m[..., n:]), torch.stack(pivots, -1), sign


def _inv(A, *, out=None):
    """torch.linalg.inv by Gauss-Jordan elimination (`_eliminate`): torch's LAPACK call has no
    decomposition; a singular matrix gives infinities or NaN where torch raises."""
    if out is not None:
        return NotImplemented
    eye = torch.eye(A.shape[-1], dtype=A.dtype).expand(A.shape)
    return _eliminate(A, eye)[0]


def _solve(A, B, *, left=True, out=None):
    """torch.linalg.solve by Gauss-Jordan elimination of [A | B] (B a matrix, or a vector)."""
    if not left or out is not None:
        return NotImplemented
    vector = B.dim() == 1 or B.dim() == A.dim() - 1 and B.shape == A.shape[:-1]
    rhs = B.unsqueeze(-1) if vector else B
    shape = torch.broadcast_shapes(A.shape[:-2], rhs.shape[:-2])
    x = _eliminate(A.expand(*shape, *A.shape[-2:]), rhs.expand(*shape, *rhs.shape[-2:]))[0]
    return x.squeeze(-1) if vector else x


def _det(A, *, out=None):
    """torch.linalg.det: the pivots' product, signed by the row exchanges (`_eliminate`)."""
    if out is not None:
        return NotImplemented
    _, pivots, sign = _eliminate(A)
    return sign * pivots.prod(-1)


def _slogdet(A, *, out=None):
    """torch.linalg.slogdet: (sign, log |det|), the log summed over the pivots."""
    if out is not None:
        return NotImplemented
    _, pivots, sign = _eliminate(A)
    return torch.return_types.slogdet((sign * torch.sign(pivots).prod(-1), pivots.abs().log().sum(-1)))


def _logdet(A):
    """torch.logdet: log det, NaN for a negative determinant (as torch)."""
    sign, logabs = _slogdet(A)
    return torch.where(sign < 0, torch.full_like(logabs, math.nan), logabs)


# The log-probability of a state no path reaches: finite, so that the recursion's log-sum-exp never
# takes -inf - -inf (whose gradient is NaN); a final value at or below half of it is an alignment
# that cannot happen (an infinite loss, as torch gives it). float32 absorbs any log-probability added.
UNREACHED = -1e30


def _log_add(*terms: torch.Tensor) -> torch.Tensor:
    """log(sum(exp(terms))) of tensors of one shape, around their maximum."""
    top = terms[0]
    for term in terms[1:]:
        top = torch.maximum(top, term)
    return top + torch.log(sum(torch.exp(term - top) for term in terms))


def _ctc(log_probs, targets, input_lengths, target_lengths, blank=0, reduction="mean", zero_infinity=False):
    """F.ctc_loss as its definition (Graves et al., 2006), so that autograd differentiates it:
    the forward variables alpha over each target with blanks between and around its labels, one
    frame a step, in log space. torch's kernel gives data-dependent shapes (aten._ctc_loss.Tensor),
    which a traced program cannot have; here the shapes bound every length and the lengths mask:
    a frame past an input's length leaves its alpha as it was, and the final states are read at
    each target's length. Targets come padded (N, S) or concatenated (the sum of the lengths),
    lengths as tensors or lists."""
    unbatched = log_probs.dim() == 2
    if unbatched:
        log_probs, targets = log_probs.unsqueeze(1), targets.reshape(1, -1)
    frames, batch, _ = log_probs.shape
    dtype = log_probs.dtype
    in_len = torch.as_tensor(input_lengths).reshape(-1)
    out_len = torch.as_tensor(target_lengths).reshape(-1)
    if targets.dim() == 1:  # concatenated: row n starts after the lengths before it
        total = targets.shape[0]
        starts = torch.cumsum(out_len, 0) - out_len
        targets = targets[(starts.unsqueeze(1) + torch.arange(total)).clamp(max=max(total - 1, 0))]
    labels = targets.shape[1]
    blanks = torch.full_like(targets, blank)
    ext = torch.cat([torch.stack([blanks, targets], -1).reshape(batch, 2 * labels), blanks[:, :1]], 1)
    if labels == 0:
        ext = torch.full((batch, 1), blank, dtype=targets.dtype)
    states = ext.shape[1]
    emit = log_probs.gather(2, ext.unsqueeze(0).expand(frames, batch, states))  # (T, N, states)
    unreached = torch.full((batch, states), UNREACHED, dtype=dtype)
    skip = torch.cat([torch.zeros(batch, min(2, states), dtype=torch.bool),
                      (ext[:, 2:] != blank) & (ext[:, 2:] != ext[:, :-2])], 1)  # s-2 -> s: a new label
    alpha = torch.cat([emit[0, :, :2], unreached[:, 2:]], 1)
    for t in range(1, frames):
        one = torch.cat([unreached[:, :1], alpha[:, :-1]], 1)
        two = torch.where(skip, torch.cat([unreached[:, :2], alpha[:, :-2]], 1)[:, :states], unreached)
        alpha = torch.where((t < in_len).unsqueeze(1), _log_add(alpha, one, two) + emit[t], alpha)
    last = (2 * out_len).unsqueeze(1)
    before = torch.where(last > 0, alpha.gather(1, (last - 1).clamp(min=0)), unreached[:, :1])
    final = _log_add(alpha.gather(1, last), before).squeeze(1)
    impossible = final <= UNREACHED / 2
    loss = torch.where(impossible, torch.zeros_like(final) if zero_infinity else torch.full_like(final, math.inf),
                       -final)
    if reduction == "mean":
        return (loss / out_len.clamp(min=1).to(dtype)).mean()
    if reduction == "sum":
        return loss.sum()
    return loss[0] if unbatched else loss


REPLACED: dict[Callable, Callable] = {
    F.ctc_loss: _ctc,
    F.avg_pool3d: _avg_pool3d,
    F.max_pool3d: _max_pool3d,
    F.local_response_norm: _local_response_norm,
    F.conv3d: _conv3d,
    F.conv_transpose3d: _conv_transpose3d,
    F.grid_sample: _grid_sample,
    F.adaptive_avg_pool3d: _adaptive_avg_pool3d,
    F.interpolate: _interpolate,
    torch.linalg.inv: _inv,
    torch.inverse: _inv,
    torch.Tensor.inverse: _inv,
    torch.linalg.solve: _solve,
    torch.linalg.det: _det,
    torch.det: _det,
    torch.Tensor.det: _det,
    torch.linalg.slogdet: _slogdet,
    torch.slogdet: _slogdet,
    torch.Tensor.slogdet: _slogdet,
    torch.logdet: _logdet,
    torch.Tensor.logdet: _logdet,
    F.multilabel_margin_loss: _multilabel_margin,
    F.multi_margin_loss: _multi_margin,
    F.gaussian_nll_loss: _gaussian_nll,
    F.rrelu: _rrelu,
    torch.cdist: _cdist,
    F.one_hot: _one_hot,
    F.softshrink: _softshrink,
    F.hardshrink: _hardshrink,
    torch.Tensor.hardshrink: _hardshrink,
    F.pad: _pad,
    torch._C._nn.pad: _pad,
    torch._weight_norm: _weight_norm,
    torch.bilinear: _bilinear,
}


class DecomposeAboveAutograd(TorchFunctionMode):
    """While active, the calls of REPLACED run as torch's decompositions (where they apply). Only
    calls the traced code makes itself: inside a torch function the mode is off, so an op that
    F.interpolate reaches is not replaced (nearest-exact resizing, whose backward torch does not
    decompose either, has a rule of its own: frontend.legalize_backward)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        handler = REPLACED.get(func)
        if handler is not None:
            result = handler(*args, **kwargs)
            if result is not NotImplemented:
                return result
        return func(*args, **kwargs)

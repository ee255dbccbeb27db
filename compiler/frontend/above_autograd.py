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
no decomposition.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch._decomp import decomposition_table
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


REPLACED: dict[Callable, Callable] = {
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

"""uint8, int8 and int16 tensors are held as int32: the device has no narrower integers.

torch computes on them at their own width: `x + 1` on a uint8 255 is 0, `-x` on an int8 -128 is
-128. The int32 result of an op is right modulo 2^32 (the device's integer arithmetic wraps as
torch's int32 does), so folding it into the narrow type's range, as torch's store does, gives
torch's value: for every ATen node whose result is a narrow integer, except those that only move
or pick values of operands already in range. Folding is a bitwise and with the type's mask after
shifting its minimum to 0 (for a signed type the shift is undone after): exact in two's
complement, whatever the int32 result.
"""

from __future__ import annotations

from typing import Any

import torch

from ..dtypes import NARROW_INTS
from ..ir import Value
from .build import Builder

# ATen ops whose result holds only values of their operands (or fills and indices that are not
# data): on narrow operands already in range, the result is in range too. A cast (_to_copy) is not
# one: it may bring int32 or float values in; nor is where, which may take a scalar that torch
# wraps into the type (torch.where(c, x, -1) on uint8 x holds 255).
SELECTING = frozenset({
    "view", "_unsafe_view", "reshape", "permute", "transpose", "t", "expand", "slice", "select", "squeeze",
    "unsqueeze", "clone", "alias", "detach", "lift_fresh_copy", "cat", "stack", "index", "index_select", "gather",
    "flip", "roll", "narrow", "split", "split_with_sizes", "unbind", "repeat", "diagonal", "as_strided",
    "unfold", "max", "min", "amax", "amin", "maximum", "minimum", "sort", "topk",
})
# operands a selecting op may take besides the data: conditions and indices
NOT_DATA = (torch.bool, torch.int32, torch.int64)


def fold_narrow_results(b: Builder, key: str, fx_args: tuple, val: Any, result: Any) -> Any:
    """`result` (the legalized values of an ATen node `key`, torch's `val`) with every narrow
    integer folded into its type's range as torch would hold it."""
    if key in SELECTING and all(t.dtype in NOT_DATA or t.dtype == _dtype_of(val) for t in _tensors(fx_args)):
        return result
    if isinstance(result, (list, tuple)):
        return type(result)(_fold(b, v, r) for v, r in zip(val, result))
    return _fold(b, val, result)


def _fold(b: Builder, val: Any, r: Any) -> Any:
    if not (isinstance(val, torch.Tensor) and val.dtype in NARROW_INTS and isinstance(r, Value)):
        return r
    info = torch.iinfo(val.dtype)
    shifted = b.ew("add", r, -info.min) if info.min else r
    folded = b.ew("bitand", shifted, info.max - info.min)
    return b.ew("add", folded, info.min) if info.min else folded


def _dtype_of(val: Any) -> torch.dtype | None:
    first = val[0] if isinstance(val, (list, tuple)) and val else val
    return first.dtype if isinstance(first, torch.Tensor) else None


def _tensors(args: Any) -> list[torch.Tensor]:
    """The fake tensors (torch's values) of an fx node's tensor arguments."""
    out = []
    for a in args if isinstance(args, (list, tuple)) else [args]:
        if isinstance(a, (list, tuple)):
            out.extend(_tensors(a))
        elif isinstance(a, torch.fx.Node) and isinstance(a.meta.get("val"), torch.Tensor):
            out.append(a.meta["val"])
    return out

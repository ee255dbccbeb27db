"""The legalization rule table and the dtype helpers every rule module shares.

A rule turns one ATen op (per overload packet name) into primitives; `@rule("aten.add", ...)`
registers it in `RULES`. The rules themselves live in compiler.frontend.legalize (element-wise,
reductions, constants) and its siblings (movement, nn, backward), which all import from here.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from ..errors import CompileError
from ..ir import FLOAT_DTYPES, Value
from .build import Builder

Rule = Callable[..., Any]
RULES: dict[str, Rule] = {}

IR_DTYPE = {torch.float32: "float32", torch.float16: "float16", torch.float64: "float32", torch.int64: "int32",
            torch.int32: "int32", torch.int16: "int32", torch.int8: "int32", torch.uint8: "int32",
            torch.bool: "bool"}


def ir_dtype(dtype: torch.dtype) -> str:
    try:
        return IR_DTYPE[dtype]
    except KeyError:
        raise CompileError(f"dtype {dtype} has no device representation; the device holds float32, float16, "
                           f"int32 (and int64 as int32) and bool") from None


def rule(*names: str) -> Callable[[Rule], Rule]:
    """Register `fn` as the legalization of the ATen ops `names`. A name registered twice is an
    error at import: the later rule would silently replace the earlier one."""
    def register(fn: Rule) -> Rule:
        for name in names:
            if name in RULES and RULES[name] is not fn:
                raise CompileError(f"internal: {name} has two legalization rules, {RULES[name].__qualname__} and "
                                   f"{fn.__qualname__}")
            RULES[name] = fn
        return fn
    return register


def out_dtype(out: Any) -> str:
    return ir_dtype(out.dtype)


def is_float(v: Any) -> bool:
    return isinstance(v, Value) and v.dtype in FLOAT_DTYPES


def promote(*operands: Any) -> str:
    """torch's type promotion over tensors and Python scalars, in device dtypes: tensors decide
    within a category (a float16 tensor times 2.0 stays float16), a higher category of scalar
    lifts it (an int tensor times 0.5 is float32)."""
    tensors = [a for a in operands if isinstance(a, Value)]
    scalars = [a for a in operands if not isinstance(a, Value) and a is not None]
    floats = [t.dtype for t in tensors if t.dtype in FLOAT_DTYPES]
    if floats:
        return "float32" if "float32" in floats else "float16"
    if any(isinstance(s, float) for s in scalars):
        return "float32"
    if any(t.dtype == "int32" for t in tensors) or any(isinstance(s, int) and not isinstance(s, bool) for s in scalars):
        return "int32"
    return "bool"


def as_dtype(b: Builder, a: Any, dtype: str) -> Any:
    """A tensor cast to `dtype`; a Python scalar as that dtype wants it."""
    if isinstance(a, Value):
        return b.cast(a, dtype)
    if dtype == "bool":
        return bool(a)
    return int(a) if dtype == "int32" else float(a)


def ensure_float(b: Builder, x: Value, dtype: str = "float32") -> Value:
    return x if x.dtype in FLOAT_DTYPES else b.cast(x, dtype)

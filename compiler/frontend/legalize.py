"""Legalization: ATen (and the few prims torch's decompositions emit) -> primitives (compiler.ir).

Every rule receives a `Builder` (which labels what it makes with the user's line), the fx node's
result (a FakeTensor or a tuple of them: shapes and torch dtypes as torch computed them) and the
op's arguments with tensors replaced by `Value`s, and returns a Value or a tuple of Values.
Rules are registered per ATen overload packet name in `RULES`; the element-wise, reduction,
movement and network rules live in this module and in `legalize_movement` / `legalize_nn`.

dtypes: torch's promotion is made explicit (casts), so a primitive's tensor operands share one
dtype. int64 is held as int32; float64 (which torch's decompositions sometimes use for a
scalar) computes in float32.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..dtypes import INT32_BITS, wrap_int32
from ..errors import UnsupportedOpError
from ..ir import FLOAT_DTYPES, Value
from .build import Builder, norm_dim
from .rules import as_dtype, ir_dtype, out_dtype, promote, rule

def arith(b: Builder, op: str, out: Any, *args: Any) -> Value:
    """An arithmetic op computed in the result's dtype (operands cast to it)."""
    dtype = out_dtype(out)
    return b.cast(b.ew(op, *[as_dtype(b, a, dtype) for a in args], dtype=dtype), dtype)


def compare(b: Builder, op: str, x: Any, y: Any) -> Value:
    dtype = promote(x, y)
    return b.ew(op, as_dtype(b, x, dtype), as_dtype(b, y, dtype))


# ---- element-wise -------------------------------------------------------------------------

UNARY_FLOAT = {"exp": "exp", "log": "log", "log1p": "log1p", "expm1": "expm1", "sqrt": "sqrt", "rsqrt": "rsqrt",
               "reciprocal": "reciprocal", "sigmoid": "sigmoid", "tanh": "tanh", "erf": "erf", "sin": "sin",
               "cos": "cos", **{name: name for name in ("tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh",
                                                        "atanh", "erfinv", "lgamma", "digamma", "erfc")},
               "special_erfcx": "erfcx"}
UNARY_SAME = {"neg": "neg", "abs": "abs", "relu": "relu", "sign": "sign"}
ROUNDING = {"floor": "floor", "ceil": "ceil", "trunc": "trunc", "round": "round"}


def _unary(name: str, op: str) -> None:
    @rule(name)
    def fn(b: Builder, out: Any, x: Value, *rest: Any, **options: Any) -> Value:
        dtype = out_dtype(out)
        if name == "round" and (rest or options):
            return _round_decimals(b, x, dtype, *rest, **options)
        if rest or options:
            raise UnsupportedOpError(b.aten, [list(x.shape)], b.source, f"{name} with arguments "
                                     f"{list(rest) + [f'{k}={v!r}' for k, v in options.items()]}")
        if name in ROUNDING and x.dtype in ("int32", "bool"):
            return b.cast(x, dtype)
        return b.ew(op, b.cast(x, dtype), dtype=dtype)


def _round_decimals(b: Builder, x: Value, dtype: str, decimals: int = 0) -> Value:
    """torch.round(x, decimals=d) as torch computes it: round(x * 10^d) / 10^d, and for d < 0
    round(x / 10^-d) * 10^-d (halves to even, in x's format)."""
    x = b.cast(x, dtype)
    scale = float(10 ** abs(decimals))
    if decimals >= 0:
        return b.ew("div", b.ew("round", b.ew("mul", x, scale), dtype=dtype), scale)
    return b.ew("mul", b.ew("round", b.ew("div", x, scale), dtype=dtype), scale)


for _name, _op in {**UNARY_FLOAT, **UNARY_SAME, **ROUNDING}.items():
    _unary(_name, _op)


@rule("exp2")
def _exp2(b, out, x):
    return b.ew("exp", b.ew("mul", b.cast(x, out_dtype(out)), math.log(2.0)))


@rule("log2", "log10")
def _log_base(b, out, x):
    base = 2.0 if "log2" in b.aten else 10.0
    return b.ew("mul", b.ew("log", b.cast(x, out_dtype(out))), 1.0 / math.log(base))


@rule("square")
def _square(b, out, x):
    x = b.cast(x, out_dtype(out))
    return b.ew("mul", x, x)


@rule("logical_not", "bitwise_not")
def _not(b, out, x):
    if "bitwise" in b.aten and x.dtype != "bool":
        return b.ew("bitxor", x, -1)  # ~x flips every bit of the int32 word
    return b.ew("not", x)


@rule("add", "sub")
def _add_sub(b, out, x, y, alpha=1):
    op = "add" if b.aten.startswith("aten.add") else "sub"
    if alpha != 1:
        y = b.ew("mul", y, alpha) if isinstance(y, Value) else y * alpha
    return arith(b, op, out, x, y)


@rule("rsub")
def _rsub(b, out, x, y, alpha=1):
    """y - alpha * x."""
    if alpha != 1:
        x = b.ew("mul", x, alpha) if isinstance(x, Value) else x * alpha
    return arith(b, "sub", out, y, x)


@rule("mul")
def _mul(b, out, x, y):
    return arith(b, "mul", out, x, y)


@rule("div", "true_divide")
def _div(b, out, x, y, rounding_mode=None):
    dtype = out_dtype(out)
    if rounding_mode is None:
        return arith(b, "div", out, x, y)
    if rounding_mode == "floor":
        return arith(b, "floor_div", out, x, y)
    if dtype in FLOAT_DTYPES:  # trunc
        return b.ew("trunc", arith(b, "div", out, x, y))
    return _trunc_div(b, as_dtype(b, x, dtype), as_dtype(b, y, dtype))


def _trunc_div(b: Builder, x: Any, y: Any) -> Value:
    """Integer division rounding toward zero, exactly: floor division, plus one where the
    operands' signs differ and the division is not exact."""
    q = b.ew("floor_div", x, y)
    inexact = b.ew("ne", b.ew("rem", x, y), 0)
    signs = b.ew("ne", b.ew("lt", x, 0) if isinstance(x, Value) else b.full(q.shape, x < 0, "bool"),
                 b.ew("lt", y, 0) if isinstance(y, Value) else b.full(q.shape, y < 0, "bool"))
    return b.ew("add", q, b.cast(b.ew("and", inexact, signs), "int32"))


@rule("floor_divide")
def _floor_divide(b, out, x, y):
    return arith(b, "floor_div", out, x, y)


@rule("remainder")
def _remainder(b, out, x, y):
    return arith(b, "rem", out, x, y)


@rule("fmod")
def _fmod(b, out, x, y):
    dtype = out_dtype(out)
    x, y = as_dtype(b, x, dtype), as_dtype(b, y, dtype)
    q = b.ew("trunc", b.ew("div", x, y)) if dtype in FLOAT_DTYPES else _trunc_div(b, x, y)
    return b.ew("sub", x, b.ew("mul", q, y))


@rule("pow")
def _pow(b, out, x, y):
    dtype = out_dtype(out)
    if not isinstance(x, Value):  # scalar ** tensor
        if dtype == "int32":
            return _int_power(b, int(x), y)
        if x <= 0:
            raise UnsupportedOpError(b.aten, [list(y.shape)], b.source, f"{x} ** tensor (the base must be > 0)")
        return b.ew("exp", b.ew("mul", b.cast(y, dtype), math.log(x)))
    x = b.cast(x, dtype)
    if isinstance(y, Value):
        return b.ew("pow", x, b.cast(y, dtype))
    special = {2: lambda: b.ew("mul", x, x), 1: lambda: x, 0.5: lambda: b.ew("sqrt", x),
               -0.5: lambda: b.ew("rsqrt", x), -1: lambda: b.ew("reciprocal", x),
               3: lambda: b.ew("mul", b.ew("mul", x, x), x), 0: lambda: b.full(x.shape, 1, dtype)}
    if y in special:
        return special[y]()
    if dtype == "int32":
        raise UnsupportedOpError(b.aten, [list(x.shape)], b.source, f"integer power {y}")
    return b.ew("pow", x, float(y))


def _int_power(b: Builder, base: int, y: Value) -> Value:
    """base ** y for an integer tensor y, exactly: the product, over the bits k set in y, of
    base ** (2 ** k), each a constant of the program (as the device's int32 products wrap, so do
    the constants: a product modulo 2 ** 32 is the product of the factors modulo 2 ** 32). A
    negative exponent gives 0, as torch's integer power does, unless the base is 1 or -1. Once the
    squared base wraps to 0 or 1, so do all the higher ones: the bits above take one test
    (`2 ** i` is 5 bit steps, not 31). (The float form, exp(y ln base), was refused: an int32
    exponent times ln base.)"""
    e = b.cast(y, "int32")
    result = b.full(y.shape, 1, "int32")
    factor = wrap_int32(base)
    for k in range(INT32_BITS - 1):  # (bit 31 is the sign: negative exponents below)
        if factor in (0, 1):  # every higher power is too (an even base's from 2 ** 5 on): one test for them all
            if factor == 0:
                result = b.ew("where", b.ew("ne", b.ew("shr", e, k), 0), 0, result, dtype="int32")
            break
        bit = b.ew("ne", b.ew("bitand", b.ew("shr", e, k), 1), 0)
        result = b.ew("where", bit, b.ew("mul", result, factor), result, dtype="int32")
        factor = wrap_int32(factor * factor)
    if base == -1:
        below = b.ew("where", b.ew("ne", b.ew("bitand", e, 1), 0), -1, 1, dtype="int32")
    else:
        below = b.full(y.shape, 1 if base == 1 else 0, "int32")
    return b.ew("where", b.ew("lt", e, 0), below, result, dtype="int32")


@rule("atan2", "arctan2", "hypot")
def _angle_and_length(b, out, x, y):
    return arith(b, "hypot" if "hypot" in b.aten else "atan2", out, x, y)


@rule("maximum")
def _maximum(b, out, x, y):
    return arith(b, "max", out, x, y)  # a NaN operand gives NaN (sim.numerics.nan_max)


@rule("minimum")
def _minimum(b, out, x, y):
    return arith(b, "min", out, x, y)


@rule("fmax", "fmin")
def _fmax(b, out, x, y):
    """torch.fmax and fmin ignore a NaN operand: the result is the other one (NaN if both are)."""
    extreme = arith(b, "max" if b.aten.startswith("aten.fmax") else "min", out, x, y)
    dtype = out_dtype(out)
    if dtype not in FLOAT_DTYPES:
        return extreme
    x, y = as_dtype(b, x, dtype), as_dtype(b, y, dtype)
    return b.ew("where", b.ew("ne", x, x), y, b.ew("where", b.ew("ne", y, y), x, extreme, dtype=dtype), dtype=dtype)


@rule("clamp", "clamp_min", "clamp_max")
def _clamp(b, out, x, lo=None, hi=None):
    if b.aten.startswith("aten.clamp_max"):
        lo, hi = None, lo
    dtype = out_dtype(out)
    y = b.cast(x, dtype)
    if lo is not None:
        y = b.ew("max", y, as_dtype(b, lo, dtype))
    if hi is not None:
        y = b.ew("min", y, as_dtype(b, hi, dtype))
    return y if y is not x else b.ew("copy", y)


for _cmp in ("lt", "le", "gt", "ge", "eq", "ne"):
    rule(_cmp)(lambda b, out, x, y, _op=_cmp: compare(b, _op, x, y))


@rule("isnan", "isinf")
def _special(b, out, x):
    """The IEEE tests (kl_div, nan_to_num and isfinite use them): NaN is the one value unequal to
    itself, the infinities the ones whose magnitude equals inf; integers are neither."""
    if x.dtype not in FLOAT_DTYPES:
        return b.full(x.shape, False, "bool")
    if b.aten.startswith("aten.isnan"):
        return b.ew("ne", x, x)
    return b.ew("eq", b.ew("abs", x), float("inf"))


@rule("signbit", "prims.signbit")
def _signbit(b, out, x):
    """Whether the sign bit is set (copysign decomposes to it): below zero, or a zero whose
    reciprocal is -inf (-0.0). A NaN counts as positive: mnsim does not keep NaN sign bits apart
    (torch's follow the host's arithmetic)."""
    if x.dtype not in FLOAT_DTYPES:
        return b.ew("lt", x, 0)
    negative_zero = b.ew("and", b.ew("eq", x, 0.0), b.ew("lt", b.ew("reciprocal", x), 0.0))
    return b.ew("or", b.ew("lt", x, 0.0), negative_zero)


@rule("copysign")
def _copysign(b, out, x, y):
    """|x| with the sign bit of y (`_signbit`), in torch's result dtype (float)."""
    dtype = out_dtype(out)
    magnitude = b.ew("abs", b.cast(x, dtype))
    sign = _signbit(b, out, y) if isinstance(y, Value) else b.full(magnitude.shape, math.copysign(1.0, y) < 0, "bool")
    return b.ew("where", sign, b.ew("neg", magnitude), magnitude, dtype=dtype)


@rule("logical_and", "logical_or", "logical_xor", "bitwise_and", "bitwise_or", "bitwise_xor")
def _logical(b, out, x, y):
    op = b.aten.split(".")[1].split("_")[-1]
    if "bitwise" in b.aten and out.dtype != torch.bool:  # integers: the ALU's iand, ior, ixor on int32 words
        return arith(b, "bit" + op, out, x, y)
    x = b.ew("ne", x, 0) if isinstance(x, Value) and x.dtype != "bool" else x
    y = b.ew("ne", y, 0) if isinstance(y, Value) and y.dtype != "bool" else y
    return b.ew(op, x, y)


@rule("__lshift__", "__rshift__", "bitwise_left_shift", "bitwise_right_shift")
def _shift(b, out, x, k):
    """x << k and x >> k (arithmetic) on int32 words, by a constant amount below the word's 32
    bits: the device takes an amount mod 32 where torch shifts everything out, so amounts the
    compiler cannot check (a tensor of them) are refused."""
    shape = [list(v.shape) for v in (x, k) if isinstance(v, Value)]
    if isinstance(k, Value) or not isinstance(x, Value):
        raise UnsupportedOpError(b.aten, shape, b.source, "a shift by a tensor of amounts (shift by a constant)")
    if x.dtype != "int32":
        raise UnsupportedOpError(b.aten, shape, b.source, f"a shift of {x.dtype} values (shifts are on integers)")
    if not 0 <= k < INT32_BITS:
        raise UnsupportedOpError(b.aten, shape, b.source, f"a shift by {k}: the device's integers have {INT32_BITS} "
                                 "bits (amounts from 0 to 31)")
    left = "left" in b.aten or "lshift" in b.aten
    return b.ew("shl" if left else "shr", x, int(k))


@rule("where")
def _where(b, out, cond, x, y):
    dtype = out_dtype(out)
    if cond.dtype != "bool":
        cond = b.ew("ne", cond, 0)
    return b.ew("where", cond, as_dtype(b, x, dtype), as_dtype(b, y, dtype), dtype=dtype)


@rule("_to_copy", "to", "type_as", "_convert_element_type")
def _to_copy(b, out, x, *args, **kwargs):
    return b.cast(x, out_dtype(out))


@rule("clone", "alias", "detach", "lift_fresh_copy", "contiguous", "_assert_tensor_metadata", "view_as",
      "alias_copy", "detach_copy", "lift_fresh")
def _identity(b, out, x, *args, **kwargs):
    return x


@rule("scalar_tensor")
def _scalar_tensor(b, out, value, **kwargs):
    return b.full((), value, out_dtype(out))


@rule("full", "new_full")
def _full(b, out, *args, **kwargs):
    value = args[-1] if b.aten.startswith("aten.full.") else args[-1]
    return b.full(tuple(out.shape), value, out_dtype(out))


@rule("full_like")
def _full_like(b, out, x, value, **kwargs):
    return b.full(tuple(out.shape), value, out_dtype(out))


@rule("zeros", "zeros_like", "new_zeros", "empty", "empty_like", "new_empty", "empty_strided", "empty_permuted",
      "_efficientzerotensor")  # (the zero gradient of sgn and friends)
def _zeros(b, out, *args, **kwargs):
    return b.full(tuple(out.shape), 0, out_dtype(out))


@rule("ones", "ones_like", "new_ones")
def _ones(b, out, *args, **kwargs):
    return b.full(tuple(out.shape), 1, out_dtype(out))


@rule("arange")
def _arange(b, out, *args, **kwargs):
    numbers = [a for a in args if isinstance(a, (int, float))]
    start, step = (0, 1)
    if len(numbers) >= 2:
        start = numbers[0]
    if len(numbers) >= 3:
        step = numbers[2]
    start, step = kwargs.get("start", start), kwargs.get("step", step)
    return b.iota(tuple(out.shape), 0, out_dtype(out), start, step)


@rule("rand", "randn", "rand_like", "randn_like", "bernoulli", "randint", "randperm", "native_dropout",
      "normal", "uniform", "exponential", "multinomial")
def _random(b, out, *args, **kwargs):
    shapes = [list(a.shape) for a in args if isinstance(a, Value)]
    raise UnsupportedOpError(b.aten, shapes, b.source, "random numbers: the device draws dropout, rand, randn, "
                             "randint, bernoulli and normal in programs compiled by a Context (frontend.random); "
                             "this one it does not, or the program was compiled without a Context")


# ---- reductions ---------------------------------------------------------------------------

def _dims_arg(x: Value, dims: Any) -> list[int] | None:
    if dims is None or dims == []:
        return None
    return [dims] if isinstance(dims, int) else list(dims)


@rule("sum")
def _sum(b, out, x, dims=None, keepdim=False, dtype=None):
    result = out_dtype(out)
    x = b.cast(x, result if result != "bool" else "int32")
    return b.reduce("sum", x, _dims_arg(x, dims), keepdim)


@rule("amax", "amin")
def _amax(b, out, x, dims=None, keepdim=False):
    return b.reduce("max" if "amax" in b.aten else "min", x, _dims_arg(x, dims), keepdim)


@rule("mean")
def _mean(b, out, x, dims=None, keepdim=False, dtype=None):
    dtype = out_dtype(out)
    x = b.cast(x, dtype)
    reduced = _dims_arg(x, dims)
    n = math.prod(x.shape[norm_dim(d, x.rank)] for d in reduced) if reduced is not None and x.rank else x.numel
    return b.ew("mul", b.reduce("sum", x, reduced, keepdim), 1.0 / n if n else float("nan"))


@rule("prod")
def _prod(b, out, x, *args, **kwargs):
    raise UnsupportedOpError(b.aten, [list(x.shape)], b.source, "products over a dimension")


@rule("max", "min")
def _max_dim(b, out, x, dim=None, keepdim=False):
    op = "max" if b.aten.startswith("aten.max") else "min"
    if dim is None:  # max.default: the whole tensor
        return b.reduce(op, x, None)
    values = b.reduce(op, x, [dim], keepdim)
    return values, _arg_index(b, x, dim, keepdim, op, values if keepdim else b.reduce(op, x, [dim], True))


@rule("argmax", "argmin")
def _argmax(b, out, x, dim=None, keepdim=False):
    op = "max" if "argmax" in b.aten else "min"
    if dim is None:
        flat = b.reshape(x, (x.numel,))
        found = _arg_index(b, flat, 0, False, op, b.reduce(op, flat, [0], True))
        return b.reshape(found, (1,) * x.rank) if keepdim else found
    return _arg_index(b, x, dim, keepdim, op, b.reduce(op, x, [dim], True))


def _arg_index(b: Builder, x: Value, dim: int, keepdim: bool, op: str, extreme: Value) -> Value:
    """The first index along `dim` where x reaches `extreme` (kept dim): the smallest index among
    the positions equal to it, as torch returns. A NaN is the extreme of its row (max and min
    propagate it) but equals nothing, so a NaN position counts as a hit: the first NaN's index,
    torch's answer, where the comparison alone found none (and answered the row length)."""
    dim = norm_dim(dim, x.rank)
    index = b.iota(x.shape, dim, "int32")
    hit = b.ew("eq", x, extreme)
    if x.dtype.startswith("float"):
        hit = b.ew("or", hit, b.ew("ne", x, x))
    candidates = b.ew("where", hit, index, x.shape[dim], dtype="int32")
    return b.reduce("min", candidates, [dim], keepdim)


@rule("any", "all")
def _any(b, out, x, dim=None, keepdim=False):
    op = "max" if b.aten.startswith("aten.any") else "min"
    truth = x if x.dtype == "bool" else b.ew("ne", x, 0)
    dims = None if dim is None else _dims_arg(truth, dim)
    return b.reduce(op, truth, dims, keepdim)


@rule("var", "std", "var_mean", "std_mean")
def _var(b, out, x, dims=None, correction=None, keepdim=False, **kwargs):
    """torch.var's definition: the mean of squared deviations, divided by n - correction."""
    name = b.aten.split(".")[1]
    correction = kwargs.get("correction", correction)
    correction = 1 if correction is None else correction
    dtype = "float32" if x.dtype != "float16" else "float16"
    x = b.cast(x, dtype)
    reduced = _dims_arg(x, dims)
    n = math.prod(x.shape[norm_dim(d, x.rank)] for d in reduced) if reduced is not None else x.numel
    mean = b.ew("mul", b.reduce("sum", x, reduced, True), 1.0 / n if n else float("nan"))  # of nothing: NaN
    centred = b.ew("sub", x, mean)
    var = b.ew("mul", b.reduce("sum", b.ew("mul", centred, centred), reduced, keepdim),
               1.0 / max(n - correction, 0) if n - correction > 0 else float("inf"))
    result = b.ew("sqrt", var) if name.startswith("std") else var
    if name.endswith("_mean"):
        return result, mean if keepdim else b.reshape(mean, var.shape)
    return result


# ---- prims that torch's decompositions emit -----------------------------------------------

@rule("prims.sum")
def _prims_sum(b, out, x, dims, output_dtype=None):
    return b.reduce("sum", x, list(dims))


@rule("prims.prod")
def _prims_prod(b, out, x, dims, output_dtype=None):
    return b.reduce("prod", b.cast(x, out_dtype(out)), list(dims))


@rule("prims.amax", "prims.amin")
def _prims_amax(b, out, x, dims):
    return b.reduce("max" if "amax" in b.aten else "min", x, list(dims))


@rule("prims.var")
def _prims_var(b, out, x, dims, correction=1, output_dtype=None, **kwargs):
    correction = kwargs.get("correction", correction)
    return _var(b, out, x, list(dims), correction, False)


@rule("prims.broadcast_in_dim")
def _broadcast_in_dim(b, out, x, shape, broadcast_dimensions):
    view = [1] * len(shape)
    for src, dst in enumerate(broadcast_dimensions):
        view[dst] = x.shape[src]
    return b.expand(b.reshape(x, view), tuple(shape))


@rule("prims.convert_element_type")
def _prims_convert(b, out, x, dtype):
    return b.cast(x, ir_dtype(dtype))


for _p, _op in {"prims.div": "div", "prims.mul": "mul", "prims.add": "add", "prims.sub": "sub"}.items():
    rule(_p)(lambda b, out, x, y, _op=_op: arith(b, _op, out, x, y))


from . import (legalize_backward, legalize_movement, legalize_nn, legalize_resample, legalize_scan,  # noqa: E402,F401
               legalize_sort)  # (their rules register)

"""Cumulative ops (cumsum, cumprod, logcumsumexp, cummax, cummin) as log-step scans.

Element i of a scan combines elements 0..i. Hillis and Steele's scan does it in ceil(log2 n)
steps: in step s every element combines with the one 2^s before it (the first 2^s combine with
the combination's identity, padded in front), so a row of n needs log2 n shifted copies and
element-wise ops, not n sequential ones nor n^2 comparisons.

cummax and cummin carry (value, index) pairs. A later element takes over when it is at least
(at most) the running value or is a NaN, as torch's loop decides: ties go to the later index,
and after a NaN the value stays NaN with the index of the latest NaN. That rule is associative,
so the scan gives torch's values and indices exactly. cumsum and cumprod combine in the scan's
order, not torch's left-to-right one (whose float32 sums accumulate in double on the CPU), so
they differ from torch by rounding (a few units in the last place over a row). torch's own
decomposition of cumsum sums a masked n x n copy of every row: a row of 1,000 took 33.7 M
cycles and a row of 2,048 did not fit the chip's DRAM.
"""

from __future__ import annotations

from ..ir import FLOAT_DTYPES, Value, reduction_identity
from .build import Builder, norm_dim
from .rules import out_dtype, rule


def _shifted(b: Builder, x: Value, dim: int, step: int, fill) -> Value:
    """x moved `step` places along `dim` (element i holds x's i - step), `fill` in front."""
    n = x.shape[dim]
    kept = b.slice(x, dim, 0, n - step)
    pads = [(0, 0)] * x.rank
    pads[dim] = (step, 0)
    return b.pad(kept, pads, fill)


def _steps(n: int) -> list[int]:
    """The scan's shifts: 1, 2, 4, ... below n."""
    out, s = [], 1
    while s < n:
        out.append(s)
        s *= 2
    return out


def _scan(b: Builder, out, x: Value, dim: int, combine, identity) -> Value:
    """x scanned along `dim` by `combine(later, earlier)`, `identity` padding in front, in torch's
    result dtype; a float16 row is combined in float32, as torch's CPU kernels accumulate, then
    rounded once."""
    want = out_dtype(out)
    if x.rank == 0:
        return b.cast(x, want)
    dim = norm_dim(dim, x.rank)
    compute = "float32" if want == "float16" else want
    if x.dtype != compute:
        x = b.cast(x, compute)
    for s in _steps(x.shape[dim]):
        x = combine(x, _shifted(b, x, dim, s, identity))
    return b.cast(x, want) if compute != want else x


@rule("cumsum", "cumprod")
def _cumulative(b, out, x, dim, dtype=None):
    """The running sum (product) along `dim` (integers and bools as integers)."""
    op, identity = ("add", 0) if "cumsum" in b.aten else ("mul", 1)
    return _scan(b, out, x, dim, lambda later, earlier: b.ew(op, later, earlier, dtype=later.dtype), identity)


@rule("logcumsumexp")
def _logcumsumexp(b, out, x, dim):
    """log of the running sum of exp along `dim`, combining log(e^a + e^b) = m + log1p(e^(min - m))
    with m = max(a, b): no exp of a large number, and an infinite m is the result (two -inf give
    -inf, a +inf gives +inf; min - m would be NaN), a NaN stays NaN. -inf pads in front."""
    def combine(later: Value, earlier: Value) -> Value:
        high, low = b.ew("max", later, earlier), b.ew("min", later, earlier)
        summed = b.ew("add", high, b.ew("log1p", b.ew("exp", b.ew("sub", low, high))))
        return b.ew("where", b.ew("eq", b.ew("abs", high), float("inf")), high, summed, dtype=later.dtype)
    return _scan(b, out, x, dim, combine, float("-inf"))


@rule("cummax", "cummin")
def _cummax(b, out, x, dim):
    """(values, indices) of the running maximum (minimum) along `dim`, as torch's."""
    if x.rank == 0:
        return x, b.full(x.shape, 0, "int32")
    dim = norm_dim(dim, x.rank)
    if x.dtype == "bool":
        x = b.cast(x, "int32")
    op = "max" if "cummax" in b.aten else "min"
    at_least = "ge" if op == "max" else "le"
    lowest = reduction_identity(op, x.dtype)  # loses to every element: the padding in front
    values, indices = x, b.iota(x.shape, dim, "int32")
    for s in _steps(x.shape[dim]):
        earlier_v = _shifted(b, values, dim, s, lowest)
        earlier_i = _shifted(b, indices, dim, s, 0)
        later = b.ew(at_least, values, earlier_v)
        if x.dtype in FLOAT_DTYPES:
            later = b.ew("or", later, b.ew("ne", values, values))
        values = b.ew("where", later, values, earlier_v, dtype=x.dtype)
        indices = b.ew("where", later, indices, earlier_i, dtype="int32")
    return values, indices

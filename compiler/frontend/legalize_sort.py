"""Ordering ops (sort, argsort, msort, topk, median, nanmedian) as ranks, with no data-dependent
control flow.

torch has no decomposition of sort or topk, and the PEs have no sorting network instruction.
Each element's place in the order is its rank: how many elements come before it (smaller, or
equal and at a lower index, so the order is stable, as torch's `stable=True`). The rank is a sum
of comparisons of every pair along the dimension, and the sorted tensor is a gather by rank (a
one-hot of the ranks, its hits' values summed, as `gather` is lowered). That is n^2 comparisons
for a dimension of n, on every row, so a sort is refused past MAX_SORT_PAIRS. topk of a few
elements (top-5 of a classifier's scores, the experts a router picks) is selection instead: k
rounds of a reduction and a first-index search, O(k n).

NaN sorts as torch sorts it: above every number (last ascending, first descending), NaNs among
themselves by index. A -0.0 comes out as +0.0 (it is summed with zeros); -0.0 and +0.0 are equal
keys, as in torch.
"""

from __future__ import annotations

from ..errors import UnsupportedOpError
from ..ir import FLOAT_DTYPES, Value, reduction_identity
from .build import Builder, norm_dim
from .rules import promote, rule

SELECTION_ROUNDS = 16  # topk of at most this many selects, one round each; more sorts (compile policy)
# pairs a sort may compare (every row's n^2): its comparison tensors and their window gathers grow
# with them, and a million keeps the compile's host memory and the simulated run small
MAX_SORT_PAIRS = 1 << 20


@rule("sort")
def _sort(b, out, x, dim=-1, descending=False, *, stable=False):
    """aten.sort.default(x, dim, descending) and aten.sort.stable(x, *, stable, dim, descending);
    unstable sorts are answered stably (one of the orders torch allows)."""
    return sort_along(b, x, dim, descending)


@rule("topk")
def _topk(b, out, x, k, dim=-1, largest=True, sorted=True):
    """The k largest (or smallest), in order, which `sorted=False` allows: for a few, k rounds of
    selection (O(k n)); else the first k of the sort."""
    if x.rank == 0:
        return x, b.full(x.shape, 0, "int32")
    dim = norm_dim(dim, x.rank)
    if not 0 < k <= x.shape[dim]:
        raise UnsupportedOpError(b.aten, [list(x.shape)], b.source, f"k = {k} outside 1..{x.shape[dim]}"
                                 + (" (an empty result)" if k == 0 else ""))
    if k <= SELECTION_ROUNDS:
        return select_top(b, x, k, dim, largest)
    values, indices = sort_along(b, x, dim, largest)
    return b.slice(values, dim, 0, k), b.slice(indices, dim, 0, k)


@rule("kthvalue")
def _kthvalue(b, out, x, k, dim=-1, keepdim=False):
    """The k-th smallest along `dim` and where it came from: place k - 1 of the stable sort (a NaN
    sorts last, as in torch's; among equal values torch does not say which index it gives)."""
    if x.rank == 0:
        return x, b.full(x.shape, 0, "int32")
    dim = norm_dim(dim, x.rank)
    if not 0 < k <= x.shape[dim]:
        raise UnsupportedOpError(b.aten, [list(x.shape)], b.source, f"k = {k} outside 1..{x.shape[dim]}")
    values, indices = sort_along(b, x, dim, False)
    value, index = b.slice(values, dim, k - 1, k), b.slice(indices, dim, k - 1, k)
    if not keepdim:
        kept = x.shape[:dim] + x.shape[dim + 1:]
        value, index = b.reshape(value, kept), b.reshape(index, kept)
    return value, index


@rule("median", "nanmedian")
def _median(b, out, x, dim=None, keepdim=False):
    """torch.median / nanmedian: the lower median, (n - 1) // 2 places into the stable sort, and
    where it came from (torch's index among ties, too). median propagates a NaN: its value NaN,
    its index the row's first NaN's. nanmedian takes the median of a row's numbers (when it has
    none, NaN from the middle place, as torch). Without `dim` (median.default), of all
    elements, the value only."""
    whole = dim is None
    if whole:
        x, dim = b.reshape(x, (max(1, x.numel),)), 0
    dim = norm_dim(dim, x.rank) if x.rank else 0
    if x.rank == 0:
        return (x, b.full(x.shape, 0, "int32")) if not whole else x
    n = x.shape[dim]
    values, indices = sort_along(b, x, dim, False)
    nan = b.ew("ne", x, x) if x.dtype in FLOAT_DTYPES else None
    if nan is not None and "nanmedian" in b.aten:  # the numbers sort first: the middle one of those
        count = b.ew("sub", n, b.reduce("sum", b.cast(nan, "int32"), [dim], True), dtype="int32")
        middle = b.ew("shr", b.ew("sub", count, 1, dtype="int32"), 1, dtype="int32")
        place = b.ew("where", b.ew("eq", count, 0), (n - 1) // 2, middle, dtype="int32")  # all NaN: as median
        pick = b.ew("eq", b.iota(values.shape, dim, "int32"), place)
        value = b.reduce("sum", b.ew("where", pick, values, 0, dtype=values.dtype), [dim], True)
        index = b.reduce("sum", b.ew("where", pick, indices, 0, dtype="int32"), [dim], True)
    else:
        k = (n - 1) // 2
        value, index = b.slice(values, dim, k, k + 1), b.slice(indices, dim, k, k + 1)
        if nan is not None:
            found = b.reduce("max", nan, [dim], True)
            first = b.reduce("min", b.ew("where", nan, b.iota(x.shape, dim, "int32"), n, dtype="int32"), [dim], True)
            value = b.ew("where", found, float("nan"), value, dtype=value.dtype)
            index = b.ew("where", found, first, index, dtype="int32")
    if whole:
        return b.reshape(value, ())
    if not keepdim:
        kept = x.shape[:dim] + x.shape[dim + 1:]
        value, index = b.reshape(value, kept), b.reshape(index, kept)
    return value, index


@rule("bucketize", "searchsorted")
def _bucketize(b, out, *args, out_int32=False, right=False, side=None, sorter=None):
    """bucketize(x, boundaries) and searchsorted(sorted_sequence, x): where torch's binary search
    over sorted boundaries (NaNs last, as torch sorts them) lands: the count of boundaries below
    the value (right: at or below) when some boundary is at or above it (right: above), else
    past them all, which is where a NaN value lands. Values and boundaries are compared in their
    promoted dtype. Boundaries are 1-D, or (searchsorted) one sorted row per row of the values.
    Counted by comparing every value with every boundary of its row."""
    if b.aten.startswith("aten.bucketize"):
        x, bounds = args[0], args[1]
    else:
        bounds, x = args[0], args[1]
    if sorter is not None:
        raise UnsupportedOpError(b.aten, [list(bounds.shape)], b.source, "a sorter argument (sort the boundaries "
                                 "first)")
    dtype = promote(x, bounds)
    x = b.cast(x, dtype) if isinstance(x, Value) else b.full((), x, dtype)
    bounds = b.cast(bounds, dtype)
    right = right or side == "right"
    m = bounds.shape[-1]
    if bounds.rank > 1 and bounds.shape[:-1] != x.shape[:-1]:
        raise UnsupportedOpError(b.aten, [list(bounds.shape), list(x.shape)], b.source,
                                 "boundaries whose leading dims differ from the values'")
    lead = bounds.shape[:-1]
    row = b.reshape(bounds, lead + (1,) * (x.rank - len(lead)) + (m,)) if bounds.rank > 1 else \
        b.reshape(bounds, (1,) * x.rank + (m,))
    value = b.reshape(x, x.shape + (1,))
    below = b.reduce("sum", b.cast(b.ew("le" if right else "lt", row, value), "int32"), [x.rank])
    stops = b.reduce("max", b.ew("gt" if right else "ge", row, value), [x.rank])  # a boundary ends the search
    return b.ew("where", stops, below, m, dtype="int32")


def select_top(b: Builder, x: Value, k: int, dim: int, largest: bool) -> tuple[Value, Value]:
    """k rounds, each taking the first extreme element not yet taken (a NaN counts as above every
    number, as in torch: the first taken when largest, the last when smallest)."""
    floats = x.dtype in FLOAT_DTYPES
    if x.dtype == "bool":
        x = b.cast(x, "int32")
    op = "max" if largest else "min"
    beyond = reduction_identity(op, x.dtype)  # below (above) every value: what a taken element becomes
    index = b.iota(x.shape, dim, "int32")
    nan = b.ew("ne", x, x) if floats else None
    taken = b.full(x.shape, False, "bool")
    values, indices = [], []
    for _ in range(k):
        hidden = taken if largest or nan is None else b.ew("or", taken, nan)  # smallest: NaNs only when all else is taken
        m = b.reduce(op, b.ew("where", hidden, beyond, x, dtype=x.dtype), [dim], True)
        hit = b.ew("and", b.ew("eq", x, m), b.ew("not", taken))
        if nan is not None:
            left = b.ew("and", nan, b.ew("not", taken))
            if largest:  # max propagates a NaN: then the NaNs are what is left to take
                hit = b.ew("or", hit, b.ew("and", left, b.ew("ne", m, m)))
            else:
                found = b.reduce("max", hit, [dim], True)
                hit = b.ew("where", found, hit, left, dtype="bool")
                m = b.ew("where", found, m, float("nan"), dtype=x.dtype)
        first = b.reduce("min", b.ew("where", hit, index, x.shape[dim], dtype="int32"), [dim], True)
        taken = b.ew("or", taken, b.ew("eq", index, first))
        values.append(m)
        indices.append(first)
    return b.cat(values, dim), b.cat(indices, dim)


def sort_along(b: Builder, x: Value, dim: int, descending: bool) -> tuple[Value, Value]:
    """x sorted along `dim` and the indices it came from (int32), by rank."""
    if x.rank == 0 or x.shape[norm_dim(dim, x.rank)] <= 1:
        return x, b.full(x.shape, 0, "int32")
    dim = norm_dim(dim, x.rank)
    n = x.shape[dim]
    if x.numel * n > MAX_SORT_PAIRS:
        raise UnsupportedOpError(b.aten, [list(x.shape)], b.source,
                                 f"sorting {x.numel // n:,} rows of {n:,}: a sort compares every pair of a row "
                                 f"({x.numel * n:,} pairs; at most {MAX_SORT_PAIRS:,}); topk of up to "
                                 f"{SELECTION_ROUNDS} elements selects instead")
    shape = x.shape
    mine = b.reshape(x, shape[:dim + 1] + (1,) + shape[dim + 1:])  # element i along dim, broadcast along j
    other = _pairs(b, x, dim)  # element j along dim + 1, stored for every i
    first, later = (mine, other) if descending else (other, mine)
    ahead = b.ew("lt", first, later)  # j strictly before i
    tied = b.ew("eq", other, mine)
    if x.dtype in FLOAT_DTYPES:  # NaN above every number, NaNs tied with each other
        nan_mine, nan_other = b.ew("ne", mine, mine), b.ew("ne", other, other)
        nan_later = nan_mine if not descending else nan_other
        nan_first = nan_other if not descending else nan_mine
        ahead = b.ew("or", ahead, b.ew("and", nan_later, b.ew("not", nan_first)))
        tied = b.ew("or", tied, b.ew("and", nan_mine, nan_other))
    pair = (1,) * dim + (n, n) + (1,) * (x.rank - dim - 1)
    lower_index = b.ew("lt", b.iota(pair, dim + 1, "int32"), b.iota(pair, dim, "int32"))  # j < i
    before = b.ew("or", ahead, b.ew("and", tied, lower_index))
    rank = b.reduce("sum", b.cast(before, "int32"), [dim + 1], True)  # (..., i, 1, ...)
    hit = b.ew("eq", rank, b.iota(pair, dim + 1, "int32"))  # (..., i, r, ...): element i goes to place r
    if x.dtype == "bool":
        values = b.reduce("max", b.ew("where", hit, mine, False, dtype="bool"), [dim])
    else:
        values = b.reduce("sum", b.ew("where", hit, mine, 0, dtype=x.dtype), [dim])
    index = b.iota(pair, dim, "int32")
    indices = b.reduce("sum", b.ew("where", hit, index, 0, dtype="int32"), [dim])
    return values, indices


def _pairs(b: Builder, x: Value, dim: int) -> Value:
    """x with `dim` doubled into (i, j) at (dim, dim + 1), element j for every i: a window (each
    row i a copy of x's), stored whole, not a broadcast. Operands broadcast along two different
    dimensions at once cannot all be staged into every layout (on the test chip none served a
    sort's comparisons); one broadcast beside this window can (8 rows of 32: 47,606 cycles on
    mncore2, 159,214 with both sides windows)."""
    shape = x.shape[:dim] + (x.shape[dim],) + x.shape[dim:]
    rows = [[0] * len(shape) for _ in range(x.rank)]
    for d in range(x.rank):
        rows[d][d if d < dim else d + 1] = 1
    return b.window(x, shape, rows, [0] * x.rank)

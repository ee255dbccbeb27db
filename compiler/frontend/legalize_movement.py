"""Legalization of views, data movement and indexing.

Views become reshape / permute / expand / slice primitives (the planner decides whether they
move data). Indexing by a tensor of indices (embedding, index_select, torch.gather, x[idx]) is
computed on the device as a one-hot selection: the index is compared with an iota of the indexed
dimension and the matching entries are summed (a matrix product for float tables, so an
embedding runs on the MAUs). mnsim does not model the Data Engine's indirect (DAR) addressing,
which would move only the selected rows; the one-hot form computes the same values with
instructions the simulator times.
"""

from __future__ import annotations

from math import prod
from typing import Any

from ..errors import UnsupportedOpError
from ..ir import FLOAT_DTYPES, Value, reduction_identity
from .build import Builder, broadcast_shapes, norm_dim
from .rules import ensure_float, out_dtype, rule


@rule("view", "_unsafe_view", "reshape", "view_copy", "_reshape_alias", "_reshape_alias_copy", "flatten",
      "unflatten", "squeeze", "squeeze_copy", "unsqueeze", "unsqueeze_copy")
def _view(b, out, x, *args, **kwargs):
    return b.reshape(x, tuple(out.shape))


@rule("permute", "permute_copy")
def _permute(b, out, x, order):
    return b.permute(x, order)


@rule("transpose", "transpose_copy", "swapaxes", "swapdims")
def _transpose(b, out, x, d0, d1):
    order = list(range(x.rank))
    d0, d1 = norm_dim(d0, x.rank), norm_dim(d1, x.rank)
    order[d0], order[d1] = order[d1], order[d0]
    return b.permute(x, order)


@rule("t", "t_copy", "numpy_T")
def _t(b, out, x):
    return b.permute(x, list(reversed(range(x.rank))))


@rule("expand", "expand_copy", "broadcast_to", "expand_as")
def _expand(b, out, x, *args, **kwargs):
    return b.expand(x, tuple(out.shape))


@rule("repeat")
def _repeat(b, out, x, repeats):
    """x.repeat(r): tile; each dimension d becomes (r_d, x_d) before flattening."""
    lead = len(repeats) - x.rank
    x = b.reshape(x, (1,) * lead + x.shape)
    shape = []
    for r, s in zip(repeats, x.shape):
        shape += [r, s]
    tiled = b.expand(b.reshape(x, [v for s in x.shape for v in (1, s)]), shape)
    return b.reshape(tiled, tuple(out.shape))


@rule("slice", "slice_copy")
def _slice(b, out, x, dim=0, start=None, end=None, step=1):
    return b.slice(x, dim, start, end, step)


@rule("select", "select_copy")
def _select(b, out, x, dim, index):
    dim = norm_dim(dim, x.rank)
    index = index + x.shape[dim] if index < 0 else index
    part = b.slice(x, dim, index, index + 1)
    return b.reshape(part, tuple(out.shape))


@rule("narrow", "narrow_copy")
def _narrow(b, out, x, dim, start, length):
    return b.slice(x, dim, start, start + length)


@rule("split", "split_copy", "split_with_sizes", "split_with_sizes_copy", "chunk", "tensor_split", "unsafe_split")
def _split(b, out, x, sizes, dim=0):
    return b.split(x, [tuple(o.shape)[norm_dim(dim, x.rank)] for o in out], dim)


@rule("unbind", "unbind_copy")
def _unbind(b, out, x, dim=0):
    dim = norm_dim(dim, x.rank)
    parts = b.split(x, [1] * x.shape[dim], dim)
    return tuple(b.reshape(p, tuple(o.shape)) for p, o in zip(parts, out))


@rule("cat", "concat", "concatenate")
def _cat(b, out, tensors, dim=0):
    dtype = out_dtype(out)
    keep = [b.cast(t, dtype) for t in tensors if t.numel or t.rank == len(out.shape)]
    keep = [t for t in keep if t.rank == len(out.shape)] or keep
    return b.cat(keep, dim)


@rule("stack")
def _stack(b, out, tensors, dim=0):
    dim = norm_dim(dim, tensors[0].rank + 1)
    shape = list(tensors[0].shape)
    shape.insert(dim, 1)
    dtype = out_dtype(out)
    return b.cat([b.reshape(b.cast(t, dtype), shape) for t in tensors], dim)


@rule("constant_pad_nd", "pad")
def _pad(b, out, x, pad, value=0, *rest):
    pads = [(0, 0)] * x.rank
    for k in range(len(pad) // 2):  # torch lists the last dimension first
        pads[x.rank - 1 - k] = (pad[2 * k], pad[2 * k + 1])
    return b.pad(x, pads, value if value is not None else 0)


@rule("flip")
def _flip(b, out, x, dims):
    dims = {norm_dim(d, x.rank) for d in dims}
    a = [[(-1 if d in dims else 1) if c == d else 0 for c in range(x.rank)] for d in range(x.rank)]
    offset = [x.shape[d] - 1 if d in dims else 0 for d in range(x.rank)]
    return b.window(x, x.shape, a, offset)


@rule("roll")
def _roll(b, out, x, shifts, dims=()):
    shifts = [shifts] if isinstance(shifts, int) else list(shifts)
    dims = [dims] if isinstance(dims, int) else list(dims)
    if not dims:
        flat = b.reshape(x, (x.numel,))
        return b.reshape(_roll_dim(b, flat, shifts[0], 0), x.shape)
    for s, d in zip(shifts, dims):
        x = _roll_dim(b, x, s, norm_dim(d, x.rank))
    return x


def _roll_dim(b: Builder, x: Value, shift: int, dim: int) -> Value:
    n = x.shape[dim]
    shift %= n
    if shift == 0:
        return x
    return b.cat([b.slice(x, dim, n - shift, n), b.slice(x, dim, 0, n - shift)], dim)


@rule("tril", "triu")
def _tri(b, out, x, diagonal=0):
    rows, cols = x.shape[-2:]
    shape = (rows, cols)
    r = b.iota(shape, 0, "int32")
    c = b.iota(shape, 1, "int32")
    offset = b.ew("sub", c, r)  # column - row
    keep = b.ew("le" if "tril" in b.aten else "ge", offset, diagonal)
    return b.ew("where", keep, x, 0 if x.dtype != "bool" else False, dtype=x.dtype)


# ---- indexing by tensors: one-hot selections --------------------------------------------------

def take(b: Builder, x: Value, dim: int, index: Value) -> Value:
    """x.index_select(dim, index) for an index tensor of any shape: the result has x's shape with
    dimension `dim` replaced by index's shape. Negative indices count from the end."""
    dim = norm_dim(dim, x.rank)
    size = x.shape[dim]
    idx = b.cast(index, "int32")
    idx = b.ew("where", b.ew("lt", idx, 0), b.ew("add", idx, size), idx, dtype="int32")
    lead, tail = x.shape[:dim], x.shape[dim + 1:]
    if x.dtype in FLOAT_DTYPES:
        table = b.reshape(x, (prod(lead), size, prod(tail)))  # (A, size, B)
        picked = b.matmul(b.cast(_one_hot(b, idx, size, 0), x.dtype), table, dtype=x.dtype)
        b.graph.nodes[-1].attrs["exact"] = True  # a selection: never in reduced precision
        return b.reshape(picked, lead + index.shape + tail)
    table = b.reshape(x, (prod(lead), 1, size, prod(tail)))
    mask = _one_hot(b, idx, size, 1)
    chosen = b.ew("where", mask, table, 0 if x.dtype != "bool" else False, dtype=x.dtype)
    summed = b.reduce("max" if x.dtype == "bool" else "sum", chosen, [2])
    return b.reshape(summed, lead + index.shape + tail)


def _one_hot(b: Builder, idx: Value, size: int, trailing: int) -> Value:
    """(1, n, size, 1 x `trailing`) booleans: whether each of idx's n flat elements is each
    position of a dimension of `size`. Computed in the shape its consumer reads (an embedding's
    product, a selection's `where`), not reshaped to it: a reshape that adds a dimension to a
    padded layout is a gather (for a vocabulary of 16,000 the one-hot's relayout took 5 M cycles)
    where the element-wise op can write the consumer's layout directly."""
    flat = b.reshape(idx, (1, idx.numel, 1) + (1,) * trailing)
    return b.ew("eq", flat, b.iota((1, 1, size) + (1,) * trailing, 2, "int32"))


@rule("embedding")
def _embedding(b, out, weight, indices, *args):
    return take(b, weight, 0, indices)


@rule("index_select")
def _index_select(b, out, x, dim, index):
    return take(b, x, dim, index)


@rule("index")
def _index(b, out, x, indices):
    """x[i0, i1, ...] with index tensors (None = the whole dimension). Index tensors on adjacent
    dimensions are combined into one flat index over those dimensions."""
    used = [d for d, i in enumerate(indices) if i is not None]
    if not used:
        return x
    if used != list(range(used[0], used[-1] + 1)):
        raise UnsupportedOpError(b.aten, [list(x.shape)], b.source, "index tensors on non-adjacent dimensions")
    first, last = used[0], used[-1]
    if any(i.dtype == "bool" for i in indices if i is not None):
        raise UnsupportedOpError(b.aten, [list(x.shape)], b.source,
                                 "boolean mask indexing (its result's shape depends on the data)")
    shape, flat = _flat_index(b, x, indices, used)
    merged = b.reshape(x, x.shape[:first] + (prod(x.shape[first:last + 1]),) + x.shape[last + 1:])
    return b.reshape(take(b, merged, first, flat), tuple(out.shape))


def _flat_index(b: Builder, x: Value, indices: list, used: list[int]) -> tuple[tuple[int, ...], Value]:
    """The index tensors on adjacent dimensions `used` of x (negative counting from the end),
    broadcast together, as one flat index over those dimensions: (its shape, the index)."""
    shape = broadcast_shapes(*[indices[d].shape for d in used])
    flat = None
    for d in used:
        idx = b.cast(indices[d], "int32")
        idx = b.ew("where", b.ew("lt", idx, 0), b.ew("add", idx, x.shape[d]), idx, dtype="int32")
        idx = b.expand(idx, shape) if idx.shape != shape else idx
        flat = idx if flat is None else b.ew("add", b.ew("mul", flat, x.shape[d]), idx)
    return shape, flat


@rule("gather")
def _gather(b, out, x, dim, index, sparse_grad=False):
    """torch.gather: out[..., j, ...] = x[..., index[..., j, ...], ...] along `dim`."""
    dim = norm_dim(dim, x.rank)
    if any(index.shape[d] > x.shape[d] for d in range(x.rank) if d != dim):
        raise UnsupportedOpError(b.aten, [list(x.shape), list(index.shape)], b.source, "an index larger than x")
    for d in range(x.rank):
        if d != dim and index.shape[d] < x.shape[d]:
            x = b.slice(x, d, 0, index.shape[d])
    size = x.shape[dim]
    table = b.reshape(x, x.shape[:dim] + (1, size) + x.shape[dim + 1:])  # (..., 1, size, ...)
    hit = _hits(b, index, dim, size)
    chosen = b.ew("where", hit, table, 0 if x.dtype != "bool" else False, dtype=x.dtype)
    return b.reduce("max" if x.dtype == "bool" else "sum", chosen, [dim + 1])


def _hits(b, index: Value, dim: int, size: int) -> Value:
    """(..., J, size, ...) booleans: whether index[..., j, ...] (negative counts from the end) is
    each position of a dimension of `size`, the new axis right after `dim`."""
    idx = b.cast(index, "int32")
    idx = b.ew("where", b.ew("lt", idx, 0), b.ew("add", idx, size), idx, dtype="int32")
    idx = b.reshape(idx, idx.shape[:dim + 1] + (1,) + idx.shape[dim + 1:])  # (..., J, 1, ...)
    iota_shape = (1,) * (dim + 1) + (size,) + (1,) * (index.rank - dim - 1)
    return b.ew("eq", idx, b.iota(iota_shape, dim + 1, "int32"))


@rule("scatter", "scatter_add")
def _scatter(b, out, x, dim, index, src, reduce=None):
    """torch.scatter / scatter_add: along `dim`, position index[..., j, ...] of the result takes
    src[..., j, ...] (a tensor or a number; added to x for scatter_add). Computed as gather is:
    the index compared with an iota of the dimension, the hits' values summed over j. This is how
    a cross-entropy's gradient puts -1 at each label. Where one position is hit twice, scatter_add
    adds both and scatter keeps the last write (`_last_hits`), as torch on the host does."""
    dim = norm_dim(dim, x.rank)
    if reduce is not None:
        raise UnsupportedOpError(b.aten, [list(x.shape)], b.source, f"scatter with reduce={reduce!r}")
    hit, src = _scattered(b, x, dim, index, src)
    if b.aten.startswith("aten.scatter_add"):
        return b.ew("add", x, b.reduce("sum", b.ew("where", hit, src, 0, dtype=x.dtype), [dim]), dtype=x.dtype)
    placed = b.reduce("sum", b.ew("where", _last_hits(b, hit, dim), src, 0, dtype=x.dtype), [dim])
    return b.ew("where", b.reduce("max", hit, [dim]), placed, x, dtype=x.dtype)


def _last_hits(b, hit: Value, along: int) -> Value:
    """Of the hits on each position, only the last along `along` (the writes' order): a write
    through a repeated index keeps one value, as torch's loop leaves it, instead of their sum (a
    multi-hot vector `zeros.scatter(1, ids, 1.0)` with a repeated id read 2 there)."""
    if hit.shape[along] == 1:  # one write per position (a cross-entropy gradient's label): nothing to drop
        return hit
    order = b.iota(hit.shape, along, "int32")
    last = b.reduce("max", b.ew("where", hit, order, -1, dtype="int32"), [along], True)
    return b.ew("and", hit, b.ew("eq", order, last))


def _scattered(b, x: Value, dim: int, index: Value, src) -> tuple[Value, Value | Any]:
    """A scatter's hits (`_hits`) and its source cut to the index's extent and given the hits'
    new axis (a number stays a number)."""
    if any(index.shape[d] != x.shape[d] for d in range(x.rank) if d != dim):
        raise UnsupportedOpError(b.aten, [list(x.shape), list(index.shape)], b.source,
                                 "an index smaller than x outside the scattered dimension")
    hit = _hits(b, index, dim, x.shape[dim])
    if isinstance(src, Value):
        for d in range(x.rank):
            if src.shape[d] > index.shape[d]:
                src = b.slice(src, d, 0, index.shape[d])
        src = b.reshape(b.cast(src, x.dtype), src.shape[:dim + 1] + (1,) + src.shape[dim + 1:])
    return hit, src


@rule("scatter_reduce")
def _scatter_reduce(b, out, x, dim, index, src, reduce, *, include_self=True):
    """torch.scatter_reduce with "sum", "prod", "mean", "amax" or "amin": the hits as for scatter,
    each position reduced over the sources that hit it (and x's own value with include_self); a
    position no source hits keeps x's. "mean" divides by the count of values taken, floored for
    integers as torch does."""
    dim = norm_dim(dim, x.rank)
    if reduce not in ("sum", "prod", "mean", "amax", "amin"):
        raise UnsupportedOpError(b.aten, [list(x.shape)], b.source, f"scatter_reduce with reduce={reduce!r}")
    hit, src = _scattered(b, x, dim, index, src)
    found = b.reduce("max", hit, [dim])
    if reduce in ("amax", "amin", "prod"):  # (the reduction, the element-wise op that combines x's own value)
        op, combine = {"amax": ("max", "max"), "amin": ("min", "min"), "prod": ("prod", "mul")}[reduce]
        taken = b.reduce(op, b.ew("where", hit, src, reduction_identity(op, x.dtype), dtype=x.dtype), [dim])
        taken = b.ew(combine, taken, x, dtype=x.dtype) if include_self else taken
        return b.ew("where", found, taken, x, dtype=x.dtype)
    total = b.reduce("sum", b.ew("where", hit, src, 0, dtype=x.dtype), [dim])
    total = b.ew("add", total, x, dtype=x.dtype) if include_self else total
    if reduce == "mean":
        count = b.reduce("sum", b.cast(hit, "int32"), [dim])
        count = b.ew("add", count, 1, dtype="int32") if include_self else count
        divide = "div" if x.dtype in FLOAT_DTYPES else "floor_div"
        total = b.ew(divide, total, b.cast(b.ew("max", count, 1, dtype="int32"), x.dtype), dtype=x.dtype)
    return b.ew("where", found, total, x, dtype=x.dtype)


def dilate(b: Builder, x: Value, dim: int, step: int) -> Value:
    """step - 1 zeros between neighbours along `dim`: size n becomes (n - 1) * step + 1."""
    if step == 1:
        return x
    n = x.shape[dim]
    spread = b.reshape(x, x.shape[:dim + 1] + (1,) + x.shape[dim + 1:])
    spread = b.pad(spread, [(0, 0)] * (dim + 1) + [(0, step - 1)] + [(0, 0)] * (x.rank - dim - 1))
    spread = b.reshape(spread, x.shape[:dim] + (n * step,) + x.shape[dim + 1:])
    return b.slice(spread, dim, 0, (n - 1) * step + 1)


def spaced(b: Builder, x: Value, dim: int, size: int, step: int, start: int) -> Value:
    """`x` along `dim` laid into `size` positions: element k at start + k * step, zeros
    elsewhere; positions outside 0 .. size - 1 are dropped."""
    x = dilate(b, x, dim, step)
    pads = [(0, 0)] * x.rank
    pads[dim] = (start, size - x.shape[dim] - start)
    return b.pad(x, pads)


@rule("copy")
def _copy(b, out, x, src, non_blocking=False):
    """The functional form of x.copy_(src) (functionalize's, for writes like ema.copy_(new)): src
    broadcast to x's shape in x's dtype."""
    src = b.cast(src, x.dtype) if isinstance(src, Value) else b.full(x.shape, src, x.dtype)
    return b.expand(src, x.shape) if src.shape != x.shape else src


@rule("slice_scatter")
def _slice_scatter(b, out, x, src, dim=0, start=None, end=None, step=1):
    """x with x[..., start:end:step, ...] = src along `dim` (a slice's gradient)."""
    dim = norm_dim(dim, x.rank)
    size = x.shape[dim]
    start, end, _ = slice(start, end, step).indices(size)
    if src.shape[dim] == 0:
        return x
    placed = spaced(b, b.cast(src, x.dtype), dim, size, step, start)
    k = b.iota(tuple(size if d == dim else 1 for d in range(x.rank)), dim, "int32")
    inside = b.ew("and", b.ew("ge", k, start), b.ew("lt", k, start + step * src.shape[dim]))
    if step > 1:
        inside = b.ew("and", inside, b.ew("eq", b.ew("rem", b.ew("sub", k, start), step), 0))
    return b.ew("where", inside, placed, x, dtype=x.dtype)


@rule("index_put", "index_put_")
def _index_put(b, out, x, indices, values, accumulate=False):
    """x[i0, i1, ...] = values (+= with accumulate; an embedding's gradient) for index tensors on
    adjacent dimensions: the indexed dimensions are brought first and flattened, and the rows a
    one-hot of the flat index selects are summed by a matrix product. A repeated index adds up
    with accumulate, and otherwise keeps the last write (`_last_hits`), as torch on the host."""
    used = [d for d, i in enumerate(indices) if i is not None]
    shapes = [list(x.shape), list(values.shape)]
    if len(used) == 1 and indices[used[0]].dtype == "bool":
        return _masked_put(b, x, used[0], indices[used[0]], values, accumulate)
    if not used or used != list(range(used[0], used[-1] + 1)) or \
            any(i.dtype == "bool" for i in indices if i is not None):
        raise UnsupportedOpError(b.aten, shapes, b.source, "index_put other than with integer index tensors on "
                                 "adjacent dimensions")
    first, last = used[0], used[-1]
    order = list(range(first, last + 1)) + [d for d in range(x.rank) if not first <= d <= last]
    moved = b.permute(x, order)
    rows = prod(x.shape[first:last + 1])
    rest = moved.shape[last - first + 1:]
    shape, flat = _flat_index(b, x, indices, used)
    n = prod(shape)
    indexed_shape = x.shape[:first] + shape + x.shape[last + 1:]  # what x[indices] would be
    vals = b.cast(values, "float32")
    vals = b.expand(vals, indexed_shape) if vals.shape != indexed_shape else vals
    lead = len(x.shape[:first])
    vals = b.permute(vals, list(range(lead, lead + len(shape))) + list(range(lead)) +
                     list(range(lead + len(shape), vals.rank)))
    vals = b.reshape(vals, (n, prod(rest)))
    hits = b.ew("eq", b.iota((rows, 1), 0, "int32"), b.reshape(flat, (1, n)))  # (rows, n)
    summed = b.matmul(b.cast(hits if accumulate else _last_hits(b, hits, 1), "float32"), vals, dtype="float32")
    b.graph.nodes[-1].attrs["exact"] = True  # a selection: never in reduced precision
    summed = b.cast(b.reshape(summed, (rows,) + rest), x.dtype)
    base = b.reshape(moved, (rows,) + rest)
    if accumulate:
        result = b.ew("add", base, summed, dtype=x.dtype)
    else:
        hit = b.reshape(b.reduce("max", hits, [1]), (rows,) + (1,) * len(rest))
        result = b.ew("where", hit, summed, base, dtype=x.dtype)
    result = b.reshape(result, moved.shape)
    return b.permute(result, [order.index(d) for d in range(x.rank)])


def _masked_put(b: Builder, x: Value, d: int, mask: Value, values: Value, accumulate: bool) -> Value:
    """x[..., mask, ...] = values (+= with accumulate) for a boolean mask over dims d, d + 1, ...:
    `x[x < 0] = 0`, `scores[mask] = -inf`. The selected positions are as many as the mask's true
    elements, a count known only from the data, so values must be the same for each (a scalar,
    or a tensor without that dimension, or with it of size 1): then the write is a where."""
    rest = x.shape[d + mask.rank:]
    selected = d + 1 + len(rest)  # the rank of x[..., mask, ...]: leading dims, the count, the rest
    vshape = (1,) * (selected - values.rank) + values.shape
    if values.rank > selected or vshape[d] != 1:
        raise UnsupportedOpError(b.aten, [list(x.shape), list(values.shape)], b.source,
                                 "a masked write of one value per selected position (their count depends on the "
                                 "mask's data); write a value the same for every position, or torch.where(mask, "
                                 "new, x)")
    values = b.reshape(b.cast(values, x.dtype), vshape[:d] + (1,) * mask.rank + vshape[d + 1:])
    mask = b.reshape(mask, (1,) * d + mask.shape + (1,) * len(rest))
    if accumulate:
        return b.ew("add", x, b.ew("where", mask, values, 0, dtype=x.dtype), dtype=x.dtype)
    return b.ew("where", mask, values, x, dtype=x.dtype)


@rule("index_add", "index_copy", "masked_scatter",
      "nonzero", "masked_select", "unique", "_unique2", "unique_consecutive", "argwhere", "bincount",
      "repeat_interleave", "_local_scalar_dense", "item")
def _data_dependent(b, out, x, *args, **kwargs):
    """Ops whose result or addresses depend on the data (the ones torch's tables leave as they
    are; index_add, index_copy and repeat_interleave with a number usually arrive decomposed)."""
    shapes = [list(x.shape)] if isinstance(x, Value) else []
    why = {"_local_scalar_dense": "it reads a tensor's value on the host (.item(), a Python condition on a "
                                  "tensor); keep the value a tensor"}
    raise UnsupportedOpError(b.aten, shapes, b.source,
                             why.get(b.aten.split(".")[1], "its result depends on the data's values or it writes "
                                                             "by data-dependent addresses"))


@rule("diagonal", "diagonal_copy")
def _diagonal(b, out, x, offset=0, dim1=0, dim2=1):
    """out[..., i] = x[..., i, i + offset] (dim1 and dim2 removed, the diagonal last, as torch)."""
    d1, d2 = norm_dim(dim1, x.rank), norm_dim(dim2, x.rank)
    rest = [d for d in range(x.rank) if d not in (d1, d2)]
    a = [[0] * (len(rest) + 1) for _ in range(x.rank)]
    for column, d in enumerate(rest):
        a[d][column] = 1
    a[d1][-1] = a[d2][-1] = 1
    start = [0] * x.rank
    start[d2 if offset >= 0 else d1] = abs(offset)
    return b.window(x, tuple(out.shape), a, start)


@rule("diagonal_scatter")
def _diagonal_scatter(b, out, x, src, offset=0, dim1=0, dim2=1):
    """x with its diagonal (as torch.diagonal takes it) replaced by src: the gradient of
    torch.diag / .diagonal(). src is laid out over x's shape by a window (position [.., i, j] reads
    src[.., i] below the offset's start, src[.., j] above it) and kept where j - i == offset.
    (torch's decomposition writes through a view of a clone, which the tracer cannot take.)"""
    d1, d2 = norm_dim(dim1, x.rank), norm_dim(dim2, x.rank)
    rest = [d for d in range(x.rank) if d not in (d1, d2)]
    a = [[0] * x.rank for _ in range(src.rank)]
    for column, d in enumerate(rest):
        a[column][d] = 1
    a[-1][d1 if offset >= 0 else d2] = 1  # the diagonal's index: its row, or its column below the main one
    placed = b.window(b.cast(src, x.dtype), x.shape, a, [0] * src.rank)
    rows = b.iota(tuple(x.shape[d] if d == d1 else 1 for d in range(x.rank)), d1, "int32")
    cols = b.iota(tuple(x.shape[d] if d == d2 else 1 for d in range(x.rank)), d2, "int32")
    on = b.ew("eq", b.ew("sub", cols, rows, dtype="int32"), offset)
    return b.ew("where", on, placed, x, dtype=x.dtype)


@rule("as_strided", "as_strided_copy")
def _as_strided(b, out, x, size, stride, storage_offset=0):
    """out[o] = x.flatten()[offset + sum(o * stride)]: the operand is contiguous (functionalized
    graphs materialize views), so its storage is its row-major order."""
    size = tuple(size)
    contiguous = tuple(prod(size[d + 1:]) for d in range(len(size)))
    offset = storage_offset or 0
    if offset == 0 and prod(size) == x.numel and all(s == c for s, c, n in zip(stride, contiguous, size) if n > 1):
        return b.reshape(x, size)
    flat = b.reshape(x, (x.numel,))
    return b.window(flat, size, [list(stride)], [offset])


@rule("as_strided_scatter")
def _as_strided_scatter(b, out, x, src, size, stride, storage_offset=0):
    """x with the elements of its storage at offset + sum(o * stride) replaced by src[o], when
    those positions are one run of the storage, each once (the strides a row-major layout of the
    dims in some order): src's dims put in that order fill the run. (Functionalization writes a
    channels-last tensor's restriding this way: a channels-last model's global average pooling
    gradient.) x is contiguous, as `_as_strided` takes it."""
    size, offset = tuple(size), storage_offset or 0
    placed = [d for d in range(len(size)) if size[d] > 1]
    order = sorted(placed, key=lambda d: -stride[d])
    n = prod(size)
    run = 1
    for d in reversed(order):
        if stride[d] != run:
            break
        run *= size[d]
    if run != n or offset + n > x.numel:
        raise UnsupportedOpError(b.aten, [list(x.shape), list(src.shape)], b.source,
                                 f"a strided write (size {list(size)}, stride {list(stride)}, offset {offset}) that "
                                 "does not cover one run of the tensor's storage once")
    moved = b.reshape(b.cast(src, x.dtype), tuple(size[d] for d in placed) or (1,))
    moved = b.reshape(b.permute(moved, [placed.index(d) for d in order]), (n,))
    flat = b.reshape(x, (x.numel,))
    parts = [p for p in (b.slice(flat, 0, 0, offset) if offset else None, moved,
                         b.slice(flat, 0, offset + n, x.numel) if offset + n < x.numel else None) if p is not None]
    return b.reshape(parts[0] if len(parts) == 1 else b.cat(parts, 0), x.shape)


EMBEDDING_BAG_MODES = ("sum", "mean", "max")


def _bag_membership(b: Builder, indices: Value, offsets: Value, bags: int, padding_idx: int | None) -> Value:
    """(bags, positions) booleans: position p is in bag k when offsets[k] <= p < offsets[k + 1]
    (the last bag runs to the end unless offsets name its end too) and its index is not
    padding_idx. Offsets are data: membership is computed, not assumed."""
    positions = indices.shape[0]
    starts = b.cast(b.slice(offsets, 0, 0, bags), "int32")
    if offsets.shape[0] > bags:  # include_last_offset: the offsets end the last bag
        ends = b.cast(b.slice(offsets, 0, 1, bags + 1), "int32")
    else:
        ends = b.cat([b.cast(b.slice(offsets, 0, 1, bags), "int32"), b.full((1,), positions, "int32")], 0)
    where = b.iota((1, positions), 1, "int32")
    member = b.ew("and", b.ew("le", b.reshape(starts, (bags, 1)), where),
                  b.ew("lt", where, b.reshape(ends, (bags, 1))))
    if padding_idx is not None and padding_idx >= 0:
        kept = b.ew("ne", b.reshape(b.cast(indices, "int32"), (1, positions)), padding_idx)
        member = b.ew("and", member, kept)
    return member


def _bag_weights(b: Builder, member: Value, kind: str, per_sample_weights: Value | None, dtype: str) -> Value:
    """(bags, positions): what each position's row counts in its bag's sum or mean."""
    weights = b.cast(member, dtype)
    if per_sample_weights is not None:
        weights = b.ew("mul", weights, b.reshape(ensure_float(b, per_sample_weights), (1, member.shape[1])))
    if kind == "mean":
        count = b.reduce("sum", b.cast(member, dtype), [1], True)
        weights = b.ew("div", weights, b.ew("max", count, 1.0))  # an empty bag's mean is 0, as torch's
    return weights


@rule("_embedding_bag", "_embedding_bag_forward_only")
def _embedding_bag(b, out, weight, indices, offsets, scale_grad_by_freq=False, mode=0, sparse=False,
                   per_sample_weights=None, include_last_offset=False, padding_idx=-1):
    """nn.EmbeddingBag: bag k sums (averages, takes the max of) the rows at indices[offsets[k]:
    offsets[k + 1]]. The rows are selected as `embedding` selects them; sums and means are a
    product of the bags' weights with them, maxima a masked reduction. An empty bag gives zeros,
    as torch's. The bookkeeping outputs (offset2bag, bag_size) are left out: the gradient below
    recomputes membership from the offsets; max's indices are not computed (its gradient is
    refused)."""
    kind = EMBEDDING_BAG_MODES[mode]
    if indices.rank != 1 or kind == "max" and b.wants_output(3):
        raise UnsupportedOpError(b.aten, [list(weight.shape), list(indices.shape)], b.source,
                                 "indices of rank other than 1" if indices.rank != 1 else
                                 "the gradient of embedding_bag with mode 'max' (its max_indices)")
    positions, bags = indices.shape[0], offsets.shape[0] - (1 if include_last_offset else 0)
    rows = take(b, ensure_float(b, weight), 0, indices)  # (P, D)
    member = _bag_membership(b, indices, offsets, bags, padding_idx)
    if kind == "max":
        if per_sample_weights is not None:
            rows = b.ew("mul", rows, b.reshape(ensure_float(b, per_sample_weights), (positions, 1)))
        masked = b.ew("where", b.reshape(member, (bags, positions, 1)), b.reshape(rows, (1,) + rows.shape),
                      float("-inf"), dtype=rows.dtype)
        found = b.reduce("max", masked, [1])
        empty = b.ew("eq", b.reduce("max", member, [1], True), False)
        return b.ew("where", empty, 0.0, found, dtype=rows.dtype), None, None, None
    summed = b.matmul(_bag_weights(b, member, kind, per_sample_weights, rows.dtype), rows, dtype=rows.dtype)
    b.graph.nodes[-1].attrs["exact"] = True  # sums of the table's rows: never in reduced precision
    return summed, None, None, None


@rule("_embedding_bag_backward")
def _embedding_bag_backward(b, out, grad, indices, offsets, offset2bag, bag_size, maximum_indices, num_weights,
                            scale_grad_by_freq=False, mode=0, sparse=False, per_sample_weights=None,
                            padding_idx=-1):
    """The table's gradient for sum and mean: each position's bag gradient, weighted as the
    forward weighted its row, summed into the row it read (two products: bags to positions,
    positions to table rows)."""
    kind = EMBEDDING_BAG_MODES[mode]
    if kind == "max" or scale_grad_by_freq:
        raise UnsupportedOpError(b.aten, [list(grad.shape), list(indices.shape)], b.source,
                                 "the gradient of embedding_bag with mode 'max'" if kind == "max"
                                 else "scale_grad_by_freq")
    grad = ensure_float(b, grad)
    member = _bag_membership(b, indices, offsets, grad.shape[0], padding_idx)
    weights = _bag_weights(b, member, kind, per_sample_weights, grad.dtype)  # (bags, P)
    per_position = b.matmul(b.permute(weights, (1, 0)), grad, dtype=grad.dtype)  # (P, D)
    b.graph.nodes[-1].attrs["exact"] = True  # the bags' gradients carried back: never in reduced precision
    hits = b.ew("eq", b.iota((num_weights, 1), 0, "int32"), b.reshape(b.cast(indices, "int32"), (1, indices.shape[0])))
    table = b.matmul(b.cast(hits, grad.dtype), per_position, dtype=grad.dtype)
    b.graph.nodes[-1].attrs["exact"] = True  # summed into the rows read, as an embedding's gradient
    return table

"""A copy between a tensor and its image in memory rows, swept in the memory's order.

The host's image of a tensor in DRAM interleaves the tensor's rows and columns by its layout's
digits: consecutive words of a memory row come from elements a few columns and tens of rows
apart. numpy's assignment sweeps the destination in its own order, so reading an image back into
a row-major tensor touches a new memory line on almost every element (MN-Core 2's 4096 x 4096
add: 11x a plain copy of the tensor). Swept in the memory's order instead, the tensor side of
each stretch of memory stays within a few kilobytes of rows, and the image side is sequential.
Dimensions contiguous on both sides are merged, and a pair of 32-bit words contiguous on both
sides moves as one 64-bit word.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .index import at

_WIDER = {np.dtype(np.uint16): np.uint32, np.dtype(np.uint32): np.uint64}


def copy_view(dst_base: np.ndarray, dst: np.ndarray, src_base: np.ndarray, src: np.ndarray, *,
              memory_is_dst: bool) -> None:
    """dst[...] = src (broadcast as numpy would), for views `dst` of the 1-D array `dst_base` and
    `src` of `src_base` of one dtype; the loops follow the memory side's strides."""
    if not (dst.dtype == src.dtype == dst_base.dtype == src_base.dtype):
        raise TypeError(f"copy_view needs one dtype on both sides, not {dst.dtype} and {src.dtype}")
    src = np.broadcast_to(src, dst.shape)
    if dst.size == 0:
        return
    d0, s0 = _offset(dst_base, dst), _offset(src_base, src)
    dims = _merged_dims(dst, src, key=0 if memory_is_dst else 1)
    _check_inside(dst_base, d0, [d for d, _, n in dims], [n for *_, n in dims])
    _check_inside(src_base, s0, [s for _, s, n in dims], [n for *_, n in dims])
    while dst_base.dtype in _WIDER and _pairs(dims, d0, s0, dst_base, src_base):
        wide = _WIDER[dst_base.dtype]
        dst_base, src_base = dst_base.view(wide), src_base.view(wide)
        d0, s0 = d0 // 2, s0 // 2
        dims = [[1, 1, dims[0][2] // 2]] + [[d // 2, s // 2, n] for d, s, n in dims[1:]]
        if dims[0][2] == 1 and len(dims) > 1:  # a single pair: the next dimension is the innermost loop
            dims = dims[1:]
    table = np.array(dims, dtype=np.int64)
    _copy(dst_base, d0, np.ascontiguousarray(table[:, 0]), src_base, s0, np.ascontiguousarray(table[:, 1]),
          np.ascontiguousarray(table[:, 2]))


def _offset(base: np.ndarray, view: np.ndarray) -> int:
    """The element index in `base` of `view`'s first element."""
    if base.ndim != 1 or not base.flags.c_contiguous:
        raise ValueError("a base buffer of copy_view is a contiguous 1-D array")
    start = view.__array_interface__["data"][0] - base.__array_interface__["data"][0]
    if start % base.itemsize:
        raise ValueError("a view of copy_view does not lie in its base buffer")
    return start // base.itemsize


def _check_inside(base: np.ndarray, start: int, strides: list[int], sizes: list[int]) -> None:
    """Refuse a view reaching outside its base: the compiled loops do not check their indices."""
    low = start + sum(min(0, (n - 1) * st) for st, n in zip(strides, sizes))
    high = start + sum(max(0, (n - 1) * st) for st, n in zip(strides, sizes))
    if low < 0 or high >= base.size:
        raise ValueError("a view of copy_view does not lie in its base buffer")


def _merged_dims(dst: np.ndarray, src: np.ndarray, key: int) -> list[list[int]]:
    """[destination stride, source stride, size] in elements, innermost first: size-1 dimensions
    dropped, sorted by the strides of side `key` (0 the destination), neighbours merged where
    both sides continue each other."""
    item = dst.itemsize
    dims = [[d // item, s // item, n] for n, d, s in zip(dst.shape, dst.strides, src.strides) if n > 1]
    dims.sort(key=lambda dim: abs(dim[key]))
    merged: list[list[int]] = []
    for d, s, n in dims:
        if merged and d == merged[-1][0] * merged[-1][2] and s == merged[-1][1] * merged[-1][2]:
            merged[-1][2] *= n
        else:
            merged.append([d, s, n])
    return merged or [[1, 1, 1]]


def _pairs(dims: list[list[int]], d0: int, s0: int, dst_base: np.ndarray, src_base: np.ndarray) -> bool:
    """Whether every element pair (2i, 2i+1) of the copy is contiguous and aligned on both sides:
    the innermost dimension unit-stride and even on both, every other stride and both starts even."""
    first, rest = dims[0], dims[1:]
    return (first[0] == 1 and first[1] == 1 and first[2] % 2 == 0 and d0 % 2 == 0 and s0 % 2 == 0
            and dst_base.size % 2 == 0 and src_base.size % 2 == 0
            and all(d % 2 == 0 and s % 2 == 0 for d, s, _ in rest))


@njit(cache=True)
def _copy(dst, d_start, d_strides, src, s_start, s_strides, shape):
    """Dimension 0 innermost; dimensions 0 and 1 as loops, the rest through a counter."""
    nd = shape.shape[0]
    n0, ds0, ss0 = shape[0], d_strides[0], s_strides[0]
    n1, ds1, ss1 = (shape[1], d_strides[1], s_strides[1]) if nd > 1 else (1, 0, 0)
    outer = 1
    for k in range(2, nd):
        outer *= shape[k]
    count = np.zeros(nd, dtype=np.int64)
    d, s = d_start, s_start
    for _ in range(outer):
        for j in range(n1):
            dj, sj = d + j * ds1, s + j * ss1
            for i in range(n0):
                dst[at(dj + i * ds0)] = src[at(sj + i * ss0)]
        k = 2
        while k < nd:
            count[k] += 1
            d += d_strides[k]
            s += s_strides[k]
            if count[k] < shape[k]:
                break
            d -= d_strides[k] * shape[k]
            s -= s_strides[k] * shape[k]
            count[k] = 0
            k += 1

"""A copy between a tensor and its image in memory rows, swept in the memory's order.

The host's image of a tensor in DRAM interleaves the tensor's rows and columns by its layout's
digits: consecutive words of a memory row come from elements a few columns and tens of rows
apart. numpy's assignment sweeps the destination in its own order, so reading an image back into
a row-major tensor touches a new memory line on almost every element (MN-Core 2's 4096 x 4096
add: 11x a plain copy of the tensor). Swept in the memory's order instead, the tensor side of
each stretch of memory stays within a few kilobytes of rows, and the image side is sequential.
Dimensions contiguous on both sides are merged, and a pair of 32-bit words contiguous on both
sides moves as one 64-bit word.

A large copy is shared between the cores (`sim.hostpool`): the sweep is cut into blocks of its
innermost dimensions, and each thread takes a range of whole blocks. A single core moves about
3.5 GB/s through these interleaved images (the loads miss the cache whichever side leads); two
move twice that (MN-Core 2's 4096 x 4096 upload: 13.2 -> 6.8 ms). Small copies stay on one
thread, where starting the others would cost more than the copy.
"""

from __future__ import annotations

from math import gcd

import numpy as np
from numba import njit

from .hostpool import run_shares
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
    dims = _unit_strides_inside(dims)
    if dims[0][2] > BLOCK_ELEMENTS:  # one long run: cut it into blocks the threads can share
        d, s, n = dims[0]
        run = gcd(n, BLOCK_ELEMENTS)
        dims = [[d, s, run], [d * run, s * run, n // run]] + dims[1:]
    table = np.array(dims, dtype=np.int64)
    d_strides, s_strides, shape = (np.ascontiguousarray(table[:, k]) for k in range(3))
    if dst.size >= PARALLEL_ELEMENTS:
        split = _block_dims(shape)
        blocks = int(np.prod(shape[split:]))
        run_shares(lambda first, last: _copy_blocks(dst_base, d0, d_strides, src_base, s0, s_strides, shape, split,
                                                    first, last), blocks)
    else:
        _copy_blocks(dst_base, d0, d_strides, src_base, s0, s_strides, shape, len(shape), 0, 1)


# Copies of at least this many elements are shared between threads (below, starting them costs
# more than the copy: host policy, measured on 2 cores).
PARALLEL_ELEMENTS = 1 << 18
# Elements of the memory-side block one thread sweeps at a time: a few hundred kilobytes on
# either side, so that the block's lines stay in the core's cache (host policy).
BLOCK_ELEMENTS = 1 << 13


def _block_dims(shape: np.ndarray) -> int:
    """How many innermost dimensions make one thread's block: as many as keep it within
    BLOCK_ELEMENTS (at least one)."""
    size = 1
    for k, n in enumerate(shape):
        if k and size * n > BLOCK_ELEMENTS:
            return k
        size *= int(n)
    return len(shape)


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


def _unit_strides_inside(dims: list[list[int]]) -> list[list[int]]:
    """The loop order: the dimension the destination holds contiguously innermost, then the one
    the source does, the others in the memory's order. Writes then fill whole lines and reads
    take several elements of each line they load (MN-Core 2's 4096 x 4096 image, one thread:
    download 17.3 -> 7.4 ms, upload 13.2 -> 10.3 ms)."""
    front = []
    for side in (0, 1):
        unit = next((k for k, dim in enumerate(dims) if abs(dim[side]) == 1), None)
        if unit is not None and unit not in front:
            front.append(unit)
    order = front + [k for k in range(len(dims)) if k not in front]
    return [dims[k] for k in order]


def _pairs(dims: list[list[int]], d0: int, s0: int, dst_base: np.ndarray, src_base: np.ndarray) -> bool:
    """Whether every element pair (2i, 2i+1) of the copy is contiguous and aligned on both sides:
    the innermost dimension unit-stride and even on both, every other stride and both starts even."""
    first, rest = dims[0], dims[1:]
    return (first[0] == 1 and first[1] == 1 and first[2] % 2 == 0 and d0 % 2 == 0 and s0 % 2 == 0
            and dst_base.size % 2 == 0 and src_base.size % 2 == 0
            and all(d % 2 == 0 and s % 2 == 0 for d, s, _ in rest))


@njit(cache=True, nogil=True)
def _copy_blocks(dst, d_start, d_strides, src, s_start, s_strides, shape, split, first, last):
    """Blocks [first, last) of the copy: dimensions [split, ...), flattened, number the blocks
    (split = every dimension: one block, the whole copy). Inside a block dimension 0 is the
    innermost loop and dimension 1 the next; the others move through a counter."""
    nd = shape.shape[0]
    n0, ds0, ss0 = shape[0], d_strides[0], s_strides[0]
    n1, ds1, ss1 = (shape[1], d_strides[1], s_strides[1]) if split > 1 else (1, 0, 0)
    outer = 1
    for k in range(2, split):
        outer *= shape[k]
    count = np.zeros(nd, dtype=np.int64)
    for b in range(first, last):
        d, s, rest = d_start, s_start, b
        for k in range(split, nd):
            digit = rest % shape[k]
            rest //= shape[k]
            d += digit * d_strides[k]
            s += digit * s_strides[k]
        count[:] = 0
        for _ in range(outer):
            for j in range(n1):
                dj, sj = d + j * ds1, s + j * ss1
                for i in range(n0):
                    dst[at(dj + i * ds0)] = src[at(sj + i * ss0)]
            k = 2
            while k < split:
                count[k] += 1
                d += d_strides[k]
                s += s_strides[k]
                if count[k] < shape[k]:
                    break
                d -= d_strides[k] * shape[k]
                s -= s_strides[k] * shape[k]
                count[k] = 0
                k += 1

"""Host scatter and gather: a tensor into memory rows per its placement, and back.

Memory rows are `uint32` arrays shaped [instances, words] (the simulator's machine state). A
tensor's elements are written as raw bits of their width (16, 32 or 64) into the row viewed as
slots of that width, every broadcast copy included, and read back from the first copy.

Placements are linear in their digits, so for an unpadded layout the tensor reshaped to its
digits *is* a strided view of memory: scatter and gather are one numpy strided copy each, with
broadcast copies as extra zero-source dimensions. A padded dimension's indices 0..n-1 split, as a
mixed-radix count, into a few blocks that are each a strided view (at most the sum of its digit
sizes), so padded layouts are a handful of strided copies, never an element map. Only placements
whose instance index is not linear take the general path through explicit offsets. Nothing loops
in Python per element.
"""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from collections.abc import Callable

import numpy as np
from numpy.lib.stride_tricks import as_strided

from sim.strided import copy_view

from ..errors import LayoutError
from .placement import Placement

# Element -> word maps of layouts no strided view expresses, kept for the next transfer in the same
# layout (every call uploads its inputs again): least recently used first out past this many bytes.
OFFSET_CACHE_BYTES = 512 << 20
_offset_cache: "OrderedDict[tuple, tuple[np.ndarray, np.ndarray]]" = OrderedDict()
_offset_lock = threading.Lock()

_UINT = {16: np.uint16, 32: np.uint32, 64: np.uint64}


def slot_rows(mem: np.ndarray, bits: int) -> np.ndarray:
    """The [instances, words] uint32 memory viewed as [instances, slots] of `bits`-wide slots."""
    if mem.dtype != np.uint32 or mem.ndim != 2 or not mem.flags.c_contiguous:
        raise LayoutError("memory rows must be a C-contiguous uint32 array shaped [instances, words]")
    return mem.view(_UINT[bits])


def as_bits(values: np.ndarray, bits: int) -> np.ndarray:
    """The raw bits of `values`, which must have the element width of the placement's dtype."""
    values = np.ascontiguousarray(values)
    if values.dtype.itemsize * 8 != bits:
        raise LayoutError(f"values of dtype {values.dtype} are {values.dtype.itemsize * 8}-bit; this placement "
                          f"holds {bits}-bit elements")
    return values.view(_UINT[bits])


def _check_fits(p: Placement, rows: np.ndarray, base_lw: int) -> None:
    if rows.shape[0] < p.instance_count:
        raise LayoutError(f"memory has {rows.shape[0]} rows but {p.memory} has {p.instance_count} instances")
    need = (base_lw + p.span_lw) * p.epl
    if base_lw < 0 or need > rows.shape[1]:
        raise LayoutError(f"{p.memory} rows hold {rows.shape[1] // p.epl} long words; the tensor needs "
                          f"long words {base_lw}..{base_lw + p.span_lw - 1}")


def _strided_view(p: Placement, rows: np.ndarray, base_lw: int) -> np.ndarray | None:
    """Memory as an array indexed [digits..., copies...] (padding positions included), or None when
    the instance index is not linear and the layout needs the general path."""
    if not p.linear or _blocks(p) is None:
        return None
    per_row = rows.shape[1]
    coef = p.inst_coef * per_row + p.slot_coef
    copy_sizes = [n for n, _, _ in p.copy_dims]
    copy_coef = [inst * per_row + slot for _, inst, slot in p.copy_dims]
    item = rows.itemsize
    flat = rows.reshape(-1)[base_lw * p.epl:]
    return as_strided(flat, shape=(*p.sizes.tolist(), *copy_sizes),
                      strides=tuple(int(c) * item for c in (*coef.tolist(), *copy_coef)), writeable=True)


# Past this many strided blocks (several padded dimensions of many digits), an element map is cheaper.
MAX_BLOCKS = 4096

Block = tuple[tuple, tuple, tuple[int, ...]]  # (index into the digit view, index into the tensor, block shape)


def _dim_blocks(sizes: list[int], n: int) -> list[Block]:
    """Indices 0..n-1 of one dimension whose digits have `sizes` (most significant first), as blocks
    that are each a strided view: all digits after a fixed prefix free, the next one below a bound."""
    blocks: list[Block] = []
    prefix: list[int] = []
    start, rest = 0, n
    for j in range(len(sizes)):
        block = int(np.prod(sizes[j + 1:], dtype=np.int64))
        full = rest // block
        if full:
            blocks.append(((*prefix, slice(0, full), *[slice(None)] * (len(sizes) - j - 1)),
                           (slice(start, start + full * block),), (full, *sizes[j + 1:])))
        start, rest = start + full * block, rest - full * block
        if not rest:
            break
        prefix.append(full)
    return blocks


def _blocks(p: Placement) -> list[Block] | None:
    """The tensor as strided blocks of its digit view (the product of every dimension's blocks), or
    None when there would be more than MAX_BLOCKS of them."""
    key = (p.layout.key(), p.hw.fingerprint, p.memory, p.dtype)
    with _offset_lock:
        if key in _block_cache:
            _block_cache.move_to_end(key)
            return _block_cache[key]
    per_dim = [_dim_blocks([int(x) for x in p.sizes[p.dim_of == d]], n) for d, n in enumerate(p.layout.shape)]
    found = None
    if int(np.prod([len(b) for b in per_dim], dtype=np.int64)) <= MAX_BLOCKS:
        found = [tuple(sum((b[i] for b in combo), ()) for i in range(3)) for combo in itertools.product(*per_dim)]
    with _offset_lock:
        _block_cache[key] = found
        while len(_block_cache) > BLOCK_CACHE_ENTRIES:
            _block_cache.popitem(last=False)
    return found


# Block lists of recent layouts (each a few tuples), least recently used first out.
BLOCK_CACHE_ENTRIES = 1024
_block_cache: "OrderedDict[tuple, list[Block] | None]" = OrderedDict()


def _split(part: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """`part` (a range of every dimension) with its dimensions split into a block's digits, as a
    view: splitting never needs a copy, and setting `shape` raises rather than copy silently."""
    view = part.view()
    view.shape = shape
    return view


def _offsets(p: Placement, rows: np.ndarray, base_lw: int, first_copy_only: bool) -> tuple[np.ndarray, np.ndarray]:
    """(element, word offset in `rows`) of every element of the tensor (of its first copy)."""
    key = (p.layout.key(), p.hw.fingerprint, p.memory, p.dtype, p.epl, rows.shape[1], first_copy_only)
    with _offset_lock:
        found = _offset_cache.get(key)
        if found is not None:
            _offset_cache.move_to_end(key)
    if found is None:
        loc = p.locate(first_copy_only=first_copy_only)
        offset = loc.instance * rows.shape[1] + loc.lw * p.epl + loc.w
        found = (_compact(loc.element), _compact(offset))
        with _offset_lock:
            _offset_cache[key] = found
            while sum(a.nbytes + b.nbytes for a, b in _offset_cache.values()) > OFFSET_CACHE_BYTES \
                    and len(_offset_cache) > 1:
                _offset_cache.popitem(last=False)
    element, offset = found
    return element, offset + base_lw * p.epl if base_lw else offset


def _compact(index: np.ndarray) -> np.ndarray:
    """An index array in int32 when its values fit (half the memory, and faster to gather with)."""
    if index.size and int(index.max()) < np.iinfo(np.int32).max and int(index.min()) >= 0:
        return index.astype(np.int32)
    return index


def scatter(p: Placement, values: np.ndarray, mem: np.ndarray, base_lw: int = 0) -> None:
    """Write `values` (shape = the layout's shape) into `mem` at `base_lw`, every copy."""
    bits = p.hw.formats[p.dtype].bits
    rows = slot_rows(mem, bits)
    _check_fits(p, rows, base_lw)
    src = as_bits(values, bits)
    if src.shape != p.layout.shape:
        raise LayoutError(f"values have shape {src.shape}; the layout is for {p.layout.shape}")
    view = _strided_view(p, rows, base_lw)
    if view is not None:
        copies = (1,) * len(p.copy_dims)
        rows_flat, src_flat = rows.reshape(-1), src.reshape(-1)
        for at, part, shape in _blocks(p):
            copy_view(rows_flat, view[at], src_flat, _split(src[part], shape).reshape(*shape, *copies),
                      memory_is_dst=True)
        return
    element, offset = _offsets(p, rows, base_lw, first_copy_only=False)
    rows.reshape(-1)[offset] = src.reshape(-1)[element]


def gather(p: Placement, mem: np.ndarray, base_lw: int = 0, *, out_dtype: np.dtype | None = None,
           check_replicas: bool = False, into: Callable[[tuple[int, ...], np.dtype], np.ndarray] = np.empty
           ) -> np.ndarray:
    """Read the tensor back from the first copy; optionally check that every copy agrees.
    `into(shape, dtype)` makes the array it returns (a recycled one: runtime.host_outputs)."""
    bits = p.hw.formats[p.dtype].bits
    rows = slot_rows(mem, bits)
    _check_fits(p, rows, base_lw)
    view = _strided_view(p, rows, base_lw)
    if view is not None:
        out = into(p.layout.shape, rows.dtype)
        first_copy, every_copy = (0,) * len(p.copy_dims), (slice(None),) * len(p.copy_dims)
        out_flat, rows_flat = out.reshape(-1), rows.reshape(-1)
        for at, part, shape in _blocks(p):
            first = view[(*at, *first_copy)]
            copy_view(out_flat, _split(out[part], shape), rows_flat, first, memory_is_dst=False)
            if check_replicas and p.copies > 1 and \
                    not (view[(*at, *every_copy)] == first[(Ellipsis, *([None] * len(p.copy_dims)))]).all():
                raise LayoutError(f"the copies of the tensor in {p.memory} differ (layout {p.layout})")
    else:
        element, offset = _offsets(p, rows, base_lw, first_copy_only=not check_replicas)
        flat = rows.reshape(-1)
        out = into((p.layout.numel,), rows.dtype)
        stride = 1 if not check_replicas else p.copies
        out[element[::stride]] = flat[offset[::stride]]
        if check_replicas and not np.array_equal(flat[offset], np.repeat(out[element[::stride]], stride)):
            raise LayoutError(f"the copies of the tensor in {p.memory} differ (layout {p.layout})")
        out = out.reshape(p.layout.shape)
    return out.view(out_dtype) if out_dtype is not None else out

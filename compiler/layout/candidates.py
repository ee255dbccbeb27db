"""Candidate layouts of a shape and dtype for a memory of a chip, ordered by a cost hint.

The planner scores candidates with the simulator's timing model; this module only proposes
legal ones, built from the chip's own axes so that a different chip gets different candidates:

* per-PE memories (LM0, LM1): each hardware axis either splits one tensor dimension (taking the
  largest divisor of what is left of it that fits the axis) or is broadcast; a dimension's split
  is blocked (axes outside the address) or cyclic (axes inside it); W packs the innermost
  elements of the last dimension, or is broadcast (one element per long word) when they do not
  divide evenly.
* DRAM: row-major rows with a pitch of whole long words, split into one block of rows per
  Group's DRAM (the educational compiler's rule, from the chip's Group count), or all in DRAM 0
  for small tensors.

The hint sorts by per-instance footprint (smaller spreads the work wider), then packed lanes
before W broadcast (packed layouts pair elements in long words the way most other layouts do,
so values move between them without changing lanes), then by replicas (copies cost
transfers), then blocked before cyclic; it is a hint, not a timing.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from itertools import product
from math import ceil, prod

from hwdesc import HwDesc

from ..errors import LayoutError
from .layout import W_AXIS, Broadcast, Factor, Layout
from .placement import Placement

MAX_CANDIDATES = 24
SINGLE_DRAM_MAX_ELEMENTS = 16  # the educational compiler's convention (layout_notation.md 5.2)


@dataclass(frozen=True)
class Candidate:
    layout: Layout
    footprint_lw: int
    replicas: int
    hint: tuple[int, ...]


def candidates(shape: tuple[int, ...], dtype: str, hw: HwDesc, memory: str,
               limit: int = MAX_CANDIDATES) -> list[Candidate]:
    """Legal layouts for a tensor, best hint first; raises LayoutError when none fits."""
    return list(_candidates(tuple(shape), dtype, hw, memory, limit))


@lru_cache(maxsize=512)
def _candidates(shape: tuple[int, ...], dtype: str, hw: HwDesc, memory: str, limit: int) -> tuple[Candidate, ...]:
    shape = shape or (1,)
    level = hw.memories[memory].level
    raw = _pe_layouts(shape, dtype, hw) if level == hw.leaf_level else _dram_layouts(shape, dtype, hw, memory)
    out: dict[Layout, Candidate] = {}
    seen: set[Layout] = set()
    last_error: LayoutError | None = None
    for rank_key, layout in raw:
        if layout in seen:
            continue
        seen.add(layout)
        try:
            p = Placement(layout, hw, memory, dtype)
        except LayoutError as e:
            last_error = e
            continue
        out[layout] = Candidate(layout, p.footprint_lw, p.instance_replicas,
                                (p.footprint_lw, rank_key[1], p.instance_replicas, rank_key))
    if not out:
        raise LayoutError(f"no layout of a {dtype} tensor of shape {shape} fits {memory} on {hw.name}"
                          + (f": {last_error}" if last_error else ""))
    return tuple(sorted(out.values(), key=lambda c: c.hint)[:limit])


def _largest_divisor(n: int, cap: int) -> int:
    for d in range(min(n, cap), 0, -1):
        if n % d == 0:
            return d
    return 1


def _pe_layouts(shape: tuple[int, ...], dtype: str, hw: HwDesc):
    """(hint rank, layout) pairs for per-PE memories; lanes pack the last dimension, else another
    one (channels of an NHWC-packed activation), else nothing (W broadcast)."""
    epl = hw.elements_per_lw(dtype)
    axes = list(hw.axes.items())  # root to leaf
    rank = len(shape)
    choices = [list(range(rank)) + [None]] * len(axes)
    w_dims = [rank - 1] + [d for d in range(rank - 1) if shape[d] % epl == 0 and epl > 1]
    for assignment in product(*choices):
        for cyclic in (False, True):
            for k, w_dim in enumerate(w_dims):
                layout = _pe_layout(shape, epl, axes, assignment, cyclic, True, w_dim)
                if layout is not None:
                    yield (int(cyclic), int(k > 0)), layout
            layout = _pe_layout(shape, epl, axes, assignment, cyclic, False, rank - 1)
            if layout is not None:
                yield (int(cyclic), 2), layout


def _pe_layout(shape, epl, axes, assignment, cyclic: bool, pack_w: bool, w_dim: int) -> Layout | None:
    rank = len(shape)
    remaining = list(shape)
    inner: list[list[Factor]] = [[] for _ in range(rank)]  # minor factors: W then (cyclic) axes
    outer: list[list[Factor]] = [[] for _ in range(rank)]
    w_size = 1
    if pack_w and epl > 1:
        w_size = _largest_divisor(shape[w_dim], epl)
        if w_size == 1:
            return None
        remaining[w_dim] //= w_size
    axis_factors: list[list[Factor]] = [[] for _ in range(rank)]
    # Leaf axes take the innermost part of their dimension, so go leaf to root.
    for (name, size), dim in reversed(list(zip(axes, assignment))):
        if dim is None:
            continue
        take = _largest_divisor(remaining[dim], size)
        if take == 1:
            return None  # this assignment adds nothing; another one covers it
        axis_factors[dim].insert(0, Factor(take, name, 1))
        remaining[dim] //= take
    for d in range(rank):
        if cyclic:
            inner[d] = axis_factors[d]
        else:
            outer[d] = axis_factors[d]
    # Address factors, row-major over dimensions: strides are suffix products.
    address_sizes = [remaining[d] for d in range(rank)]
    strides = [prod(address_sizes[d + 1:]) for d in range(rank)]
    dims = []
    for d in range(rank):
        factors = list(outer[d])
        if address_sizes[d] > 1:
            factors.append(Factor(address_sizes[d], None, strides[d]))
        factors += inner[d]
        if d == w_dim and w_size > 1:
            factors.append(Factor(w_size, W_AXIS, 1))
        dims.append(factors or [Factor(1, None, 1)])
    broadcast = () if pack_w or epl == 1 else (Broadcast(W_AXIS),)
    return Layout.of(dims, shape, broadcast)


def _dram_layouts(shape: tuple[int, ...], dtype: str, hw: HwDesc, memory: str):
    """Row-major layouts for memories above the PE level (DRAM): split over instances or not."""
    epl = hw.elements_per_lw(dtype)
    level = hw.memories[memory].level
    axis = hw.levels[level].axis
    instances = hw.memory_instances(memory)
    stride = hw.level_axis_stride(level)
    rows, cols = prod(shape[:-1]), shape[-1]
    pitch = ceil(cols / epl)
    numel = prod(shape)
    col_factors = [Factor(pitch, None, 1)] if pitch > 1 else []
    if epl > 1:
        col_factors.append(Factor(epl, W_AXIS, 1))
    col_factors = col_factors or [Factor(1, None, 1)]

    def layout(row_factors: list[Factor]) -> Layout:
        if len(shape) == 1:
            # one dimension: rows are chunks of the vector
            return Layout.of([row_factors + col_factors], shape) if row_factors else Layout.of([col_factors], shape)
        lead = [[Factor(s, None, 1)] for s in shape[:-2]]
        if lead:  # fold leading dimensions into the row split by giving them row pitches
            return _fold_rows(shape, row_factors, col_factors, pitch)
        return Layout.of([row_factors or [Factor(1, None, 1)], col_factors], shape)

    split_ok = axis is not None and instances > 1 and numel > SINGLE_DRAM_MAX_ELEMENTS
    if len(shape) == 1:
        per = ceil(ceil(numel / epl) / instances)
        if split_ok and per >= 1:
            yield (0, 0), Layout.of([[Factor(instances, axis, stride), Factor(per, None, 1), *([Factor(epl, W_AXIS, 1)] if epl > 1 else [])]],
                                  shape)
        yield (1, 0), Layout.of([[*([Factor(ceil(numel / epl), None, 1)] if ceil(numel / epl) > 1 else []),
                                 *([Factor(epl, W_AXIS, 1)] if epl > 1 else [])] or [Factor(1, None, 1)]], shape)
        return
    if split_ok and rows >= instances:
        yield (0, 0), layout([Factor(instances, axis, stride), Factor(ceil(rows / instances), None, pitch)])
    yield (1, 0), layout([Factor(rows, None, pitch)] if rows > 1 else [])


def _fold_rows(shape, row_factors, col_factors, pitch) -> Layout:
    """Rank > 2: spread the row split over the leading dimensions, row-major."""
    lead = shape[:-1]
    # the split (if any) goes on dimension 0 when it divides it, else the rows stay in one DRAM
    dims: list[list[Factor]] = []
    split = row_factors[0] if len(row_factors) == 2 else None
    row_pitch = pitch
    strides = []
    for s in reversed(lead):
        strides.insert(0, row_pitch)
        row_pitch *= s
    for d, s in enumerate(lead):
        if d == 0 and split is not None and s % split.size == 0:
            dims.append([split, Factor(s // split.size, None, strides[0])])
        else:
            dims.append([Factor(s, None, strides[d])] if s > 1 else [Factor(1, None, 1)])
    return Layout.of(dims + [col_factors], shape)

"""Candidate layouts of a shape and dtype for a memory of a chip, ordered by a cost hint.

The planner scores candidates with the simulator's timing model; this module only proposes
legal ones, built from the chip's own axes so that a different chip gets different candidates:

* per-PE memories (LM0, LM1): the padded spreads of compiler.layout.spread (every shape has
  some: each hardware axis takes a dimension, padded where sizes do not divide);
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
from math import ceil, prod

from hwdesc import HwDesc

from ..errors import LayoutError
from .layout import W_AXIS, Factor, Layout
from .placement import Placement
from .spread import lm_layouts

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


def _pe_layouts(shape: tuple[int, ...], dtype: str, hw: HwDesc):
    """(hint rank, layout) pairs for per-PE memories: the padded spreads of compiler.layout.spread."""
    for k, layout in enumerate(lm_layouts(shape, dtype, hw)):
        yield (0, k), layout


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

"""Element loops over LM layouts, emitted as VOP instructions.

All PEs run one instruction stream, so an element-wise operation over an LM layout is a loop
over the digits that vary *within* a PE (address and W factors): the same element addresses on
every PE. Each operand has its own element stride per loop level (its layout's coefficient for
that digit, 0 where the operand is broadcast). Levels that are contiguous for every operand
merge; the two innermost become one VOP (outer and inner stride), any others are unrolled into
several VOPs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim import ProgramBuilder

MAX_VOPS_PER_OP = 4096  # unrolling beyond this means the layout pairing is pathological


@dataclass(frozen=True)
class Operand:
    memory: str
    base: int  # element address of the operand's first element on every PE
    strides: tuple[int, ...]  # element stride per loop level


@dataclass(frozen=True)
class LoopNest:
    sizes: tuple[int, ...]  # loop levels, outermost first

    @property
    def count(self) -> int:
        return int(np.prod(self.sizes)) if self.sizes else 1


def nest(sizes: list[int], *strides: list[int]) -> tuple[LoopNest, list[tuple[int, ...]]]:
    """Order levels by the first operand's strides (outermost first), drop levels that do not move
    it (size 1, or hardware-axis and Time digits) and merge levels contiguous for every operand.
    The first operand is the one the loop walks: the output of an element-wise op, the input of
    a reduction."""
    levels = [k for k in range(len(sizes)) if sizes[k] > 1 and strides[0][k] != 0]
    levels.sort(key=lambda k: -strides[0][k])
    merged_sizes: list[int] = []
    merged: list[list[int]] = [[] for _ in strides]
    for k in levels:
        if merged_sizes and all(m[-1] == s[k] * sizes[k] for m, s in zip(merged, strides)):
            merged_sizes[-1] *= sizes[k]
            for m, s in zip(merged, strides):
                m[-1] = s[k]
            continue
        merged_sizes.append(sizes[k])
        for m, s in zip(merged, strides):
            m.append(s[k])
    return LoopNest(tuple(merged_sizes)), [tuple(m) for m in merged]


def emit_vops(b: ProgramBuilder, op: str, dtype: str, loops: LoopNest, dst: Operand, *srcs: Operand | float | None,
              src_dtype: str | None = None) -> int:
    """Emit VOPs applying `op` over the loop nest; returns how many were emitted."""
    sizes = loops.sizes or (1,)
    inner = sizes[-2:] if len(sizes) >= 2 else (1, sizes[-1])
    outer_levels = sizes[:-2] if len(sizes) >= 2 else ()
    n_outer_instr = int(np.prod(outer_levels)) if outer_levels else 1
    if n_outer_instr > MAX_VOPS_PER_OP:
        raise ValueError(f"{n_outer_instr} VOPs for one op: the operand layouts do not nest")
    pad = lambda st: (st + (0,) * (len(sizes) - len(st)))[-len(sizes):] if st else (0,) * len(sizes)  # noqa: E731

    def strides_of(o: Operand) -> tuple[int, ...]:
        st = pad(o.strides) if loops.sizes else (0,)
        return st if len(sizes) >= 2 else (0,) + st

    count = 0
    for index in np.ndindex(*outer_levels) if outer_levels else [()]:
        def at(o: Operand | float | None):
            if o is None or isinstance(o, (int, float)):
                return o
            st = strides_of(o)
            base = o.base + sum(i * s for i, s in zip(index, st[:-2]))
            return (o.memory, base, st[-2], st[-1])
        b.vop(op, dtype, inner[0], inner[1], at(dst), *[at(s) for s in srcs], src_dtype=src_dtype)
        count += 1
    return count

"""Lifetimes of temporaries -> offsets in one scratch region of DRAM, reused as values die.

A temporary is live from the first step that touches its buffer to the last one (views read the
base's buffer, so they extend it). Offsets are given first-fit in order of birth, and a region is
free again after the last step that reads it, so a long chain of kernels needs as much scratch as
its widest point, not the sum of its values.
"""

from __future__ import annotations

from sim import MachineParams
from sim.alloc import Allocator

from .kernels.context import Buffer


def schedule(buffers: dict[str, Buffer], touched: list[set[str]], params: MachineParams, capacity_lw: int) -> int:
    """Give every temporary an offset (in `buffers`); returns the scratch region's long words."""
    temps = {s for s, b in buffers.items() if b.role == "temp"}
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for i, symbols in enumerate(touched):
        for s in symbols & temps:
            first.setdefault(s, i)
            last[s] = i
    align = params.dram_align
    region = Allocator("scratch", capacity_lw, "long words", align=align)
    # the temporaries born and dying at each step, in order of birth (scanning every temporary at
    # every step took seconds for a training step of thousands of both)
    born: dict[int, list[str]] = {}
    dying: dict[int, list[str]] = {}
    for s in sorted(first, key=lambda s: (first[s], s)):
        born.setdefault(first[s], []).append(s)
        dying.setdefault(last[s], []).append(s)
    for i in range(len(touched)):
        for s in born.get(i, ()):
            size = -(-buffers[s].lw // align) * align
            buffers[s].offset = region.alloc(size)
        for s in dying.get(i, ()):
            region.free(buffers[s].offset)
    return region.high_water

"""The layout a slice of a tensor keeps: its source's digits, the sliced dimension cut short.

A split or slice along a dimension (an attention's query, key and value out of one projection,
`(x @ w).split(d, dim=1)`) is a gather into a buffer of its own. In a layout of its own it reads
its source in runs as short as a long word where the two layouts' digits disagree: the split of
a 256 x 384 projection on MN-Core 2 took 345,882 cycles, and q @ k.T, reading the parts, 252,066.
A part whose range starts at a digit boundary of its source's dimension is one block of that
digit's positions: in the same digits, less of the leading one, every run of the source (the
digits below) is a run of the part (that split 22,554 cycles, q @ k.T 9,294). The planner times
it as one more candidate output layout of the gather (`Planner.part_layouts`).
"""

from __future__ import annotations

from .layout import Factor, Layout


def part_layout(source: Layout, dim: int, start: int, size: int) -> Layout | None:
    """`source`'s layout for elements [start, start + size) of dimension `dim` (the other
    dimensions whole), or None when the range does not start at a boundary of a digit that holds
    it: the positions below digit j are a whole block (size > the block of the digits below j,
    at most j's block), and `start` is a multiple of the digits below j's block, staying inside
    one block of j. The part keeps no copies (`B@`): it is a value of its own."""
    factors = source.dims[dim]
    below = 1  # the positions of the digits after j, for j from the last
    for j in range(len(factors) - 1, -1, -1):
        block = below * factors[j].size
        if size <= block and start % below == 0 and (start % block) + size <= block:
            lead = -(-size // below)  # positions of digit j the part takes (its last one padded)
            kept = ((Factor(lead, factors[j].axis, factors[j].stride),) if lead > 1 else ()) + factors[j + 1:]
            if not kept:
                kept = (Factor(1),)
            dims = source.dims[:dim] + (kept,) + source.dims[dim + 1:]
            shape = source.shape[:dim] + (size,) + source.shape[dim + 1:]
            return Layout.of(dims, shape)
        below = block
    return None


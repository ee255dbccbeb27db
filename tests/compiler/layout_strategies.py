"""Hypothesis strategies: random legal layouts of random shapes for a chip and memory."""

from __future__ import annotations

from math import prod

from hypothesis import strategies as st

from compiler.layout import Broadcast, Factor, Layout


@st.composite
def legal_layouts(draw, hw, memory: str = "LM0", dtype: str = "float32") -> Layout:
    """A layout that is legal by construction: axis reaches within the chip, nested address strides."""
    max_lw = min(256, hw.memory_lw(memory) // 16)  # room for holes (each stride may double) and filler dims
    epl = hw.elements_per_lw(dtype)
    rank = draw(st.integers(1, 3))
    dims: list[list[Factor]] = [[] for _ in range(rank)]
    leaf = hw.memories[memory].level == hw.leaf_level
    level = hw.memories[memory].level
    depth = hw.level_names.index(level)
    usable = []
    for axis, size in hw.axes.items():
        names = hw.axis_levels(axis)
        above = [n for n in names if hw.level_names.index(n) <= depth]
        if above:
            divisor = prod(hw.levels[n].count for n in names if hw.level_names.index(n) > depth)
            usable.append((axis, size, divisor))
    placed = set()
    for axis, size, divisor in usable:
        positions = size // divisor
        if positions < 2 or not draw(st.booleans()):
            continue
        if draw(st.booleans()) and positions >= 4:  # split the axis into two nested factors
            inner = draw(st.sampled_from([d for d in range(2, positions) if positions % d == 0] or [2]))
            outer = draw(st.integers(1, positions // inner))
            factors = [Factor(outer, axis, inner * divisor), Factor(inner, axis, divisor)]
        else:
            factors = [Factor(draw(st.integers(2, positions)), axis, divisor)]
        for f in factors:
            dims[draw(st.integers(0, rank - 1))].append(f)
        placed.add(axis)
    if epl > 1 and draw(st.booleans()):
        dims[draw(st.integers(0, rank - 1))].append(Factor(draw(st.integers(2, epl)), "W", 1))
        placed.add("W")
    n_addr = draw(st.integers(0, 3))
    addr_sizes = [draw(st.integers(1, 6)) for _ in range(n_addr)]
    while prod(addr_sizes) > max_lw:
        addr_sizes[addr_sizes.index(max(addr_sizes))] //= 2
    addr_dims = [draw(st.integers(0, rank - 1)) for _ in addr_sizes]
    order = draw(st.permutations(range(n_addr)))
    strides = [0] * n_addr
    stride = 1
    for k in reversed(order):  # nested strides, innermost last in `order`
        strides[k] = stride
        stride *= addr_sizes[k] * draw(st.integers(1, 2))  # sometimes leave holes
    addr_factors = [Factor(s, None, st_) for s, st_ in zip(addr_sizes, strides)]
    for f, d in zip(addr_factors, addr_dims):
        dims[d].append(f)
    capacity = hw.memory_lw(memory)
    for d in range(rank):
        if not dims[d]:  # a filler dimension; it multiplies the span, which must stay in the memory
            dims[d].append(Factor(draw(st.integers(1, max(1, min(4, capacity // stride)))), None, stride))
            stride *= dims[d][0].size
        dims[d] = draw(st.permutations(dims[d]))
    extents = [prod(f.size for f in dim) for dim in dims]
    shape = tuple(draw(st.integers(max(1, e // 2), e)) if draw(st.booleans()) else e for e in extents)
    broadcast = []
    for axis, size, divisor in usable:
        if axis not in placed and draw(st.integers(0, 3)) == 0:
            broadcast.append(Broadcast(axis) if draw(st.booleans()) or size // divisor < 2
                             else Broadcast(axis, draw(st.integers(1, size // divisor)), divisor))
    if not leaf and "W" not in placed and draw(st.booleans()):
        broadcast.append(Broadcast("W"))
    return Layout.of(dims, shape, tuple(broadcast))


def spaced(text: str, draw) -> str:
    """The same layout text with random insignificant whitespace and default strides omitted."""
    out = []
    for ch in text:
        out.append(ch)
        if ch in "(),;" and draw(st.booleans()):
            out.append(" " * draw(st.integers(1, 2)))
    text = "".join(out)
    return text.replace(":1)", ")") if draw(st.booleans()) else text

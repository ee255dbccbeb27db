"""The same DRAM image through the other PE hop: a MAB-broadcast LM layout spread over the MABs.

A matrix product's B operand is staged by mab_broadcast (l1bmm): L1BM long word q goes to member
q mod G (G PEs per MAB) of every MAB, at PE address q div G. So a tensor first placed as a B
operand (a Linear layer's weight) has, as its LM layout, a layout without the MAB axis, and
whatever else runs in that layout (the weight's optimizer update) runs on one MAB's worth of
data in every MAB, the other copies being redundant work.

Distribute (l1bmd, chunk 1) gives PE q mod F (F PEs per L1B) long word q at q div F. Both read
the same L1BM words, so the layout in which MAB m holds what mab_broadcast put at PE addresses
congruent to m modulo F/G, at address div F/G, has the same image: its staging moves the same
long words from DRAM, and every MAB holds distinct data. `spread_over_units` builds it from the
layout's digits; the caller keeps it only where the staging confirms the image.
"""

from __future__ import annotations

from .layout import Factor, Layout


def spread_over_units(layout: Layout, units: int, unit_axis: str) -> Layout | None:
    """`layout` (placed over the PE axis, not over `unit_axis`) with its lowest `units` PE-address
    positions moved onto `unit_axis` and the rest of its addresses divided by `units`; None where
    the address digits do not split there (a gap below the boundary, a stride above it that
    `units` does not divide, fewer than `units` addresses), or where the layout already places
    `unit_axis`."""
    if units <= 1 or unit_axis in layout.placed_axes:
        return None
    address = sorted(((f.stride, d, k) for d, dim in enumerate(layout.dims) for k, f in enumerate(dim)
                      if f.axis is None and f.size > 1))
    dims = [list(dim) for dim in layout.dims]
    covered = 1  # address positions moved onto the unit axis so far
    replaced: dict[tuple[int, int], list[Factor]] = {}
    for stride, d, k in address:
        f = dims[d][k]
        if covered == units:  # above the boundary: the address shrinks by `units`
            if stride % units:
                return None
            replaced[(d, k)] = [Factor(f.size, None, stride // units)]
            continue
        if stride != covered:
            return None  # a gap below the boundary: those PE addresses are padding, not a unit's data
        need = units // covered
        if f.size <= need:
            if need % f.size:
                return None
            replaced[(d, k)] = [Factor(f.size, unit_axis, covered)]
            covered *= f.size
        else:
            if f.size % need:
                return None
            replaced[(d, k)] = [Factor(f.size // need, None, 1), Factor(need, unit_axis, covered)]
            covered = units
    if covered != units:
        return None  # fewer addresses than units: the distribute hop would read a different L1BM pattern
    out = []
    for d, dim in enumerate(dims):
        row: list[Factor] = []
        for k, f in enumerate(dim):
            row.extend(replaced.get((d, k), [f]))
        out.append(row)
    broadcast = tuple(b for b in layout.broadcast if b.axis != unit_axis)
    return Layout.of(out, layout.shape, broadcast)

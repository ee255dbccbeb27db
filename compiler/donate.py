"""Which state updates a program can write into the buffer of the value they replace.

A training step reads a parameter and writes its new value. Giving the new value the old one's
buffer (XLA calls this donating the input) keeps one copy of the state on the device and makes
the update in place, but only if no instruction reads a long word of the old value after an
instruction has written that long word of the new one. This module checks exactly that, on the
emitted instruction stream: every relocated MV address is an offset into its buffer, so the
long words each MV reads from the input and writes to the output are known.
"""

from __future__ import annotations

import numpy as np

from sim import Program, isa


Ranges = dict[tuple[str, int], tuple[np.ndarray, np.ndarray, np.ndarray]]


def mv_ranges(program: Program) -> Ranges:
    """(symbol, address field) -> (instruction, first long word, end) of each MV whose address in
    that field is in the symbol's buffer, in program order: every relocation grouped in one sort
    (a mask over all of them per update took 8 s for a training step of 600 updates)."""
    relocs = program.relocs
    if len(relocs) == 0:
        return {}
    relocs = relocs[np.lexsort((relocs[:, 1], relocs[:, 2]))]  # by symbol, then field; stable
    starts = np.flatnonzero(np.r_[True, np.any(relocs[1:, 1:3] != relocs[:-1, 1:3], axis=1)])
    out: Ranges = {}
    for lo, hi in zip(starts, np.r_[starts[1:], len(relocs)]):
        mine = relocs[lo:hi]
        field = int(mine[0, 1])
        rows = program.code[mine[:, 0]]
        start = rows[:, field]
        out[(program.symbols[int(mine[0, 2])], field)] = (mine[:, 0], start, start + rows[:, isa.MV_N])
    return out


def can_write_in_place(program: Program, input_symbol: str, output_symbol: str, ranges: Ranges | None = None) -> bool:
    """True when no MV reads a long word of `input_symbol` after some MV wrote it in `output_symbol`
    (an MV that reads and writes overlapping long words counts, unless it writes them where it
    reads them: it copies in order, so a shifted overlap would read what it has just written).
    `ranges` is `mv_ranges(program)`, made once by a caller that checks several pairs."""
    ranges = mv_ranges(program) if ranges is None else ranges
    empty = (np.zeros(0, dtype=np.int64),) * 3
    r_at, r_lo, r_hi = ranges.get((input_symbol, isa.MV_SRC_ADDR), empty)
    w_at, w_lo, w_hi = ranges.get((output_symbol, isa.MV_DST_ADDR), empty)
    if len(r_at) == 0 or len(w_at) == 0:
        return True
    order = np.argsort(w_at, kind="stable")
    w_at, w_lo, w_hi = w_at[order], w_lo[order], w_hi[order]
    written_up_to = np.searchsorted(w_at, r_at, side="right")  # writes no later than each read
    for k in np.flatnonzero(written_up_to):
        n = written_up_to[k]
        overlap = (w_lo[:n] < r_hi[k]) & (w_hi[:n] > r_lo[k])
        same_mv_in_place = (w_at[:n] == r_at[k]) & (w_lo[:n] == r_lo[k])
        if np.any(overlap & ~same_mv_in_place):
            return False
    return True

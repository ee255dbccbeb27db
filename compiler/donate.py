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


def _ranges(program: Program, symbol: str, field: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(instruction, first long word, end) of each MV whose `field` address is in `symbol`."""
    if symbol not in program.symbols or len(program.relocs) == 0:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty
    relocs = program.relocs
    mine = relocs[(relocs[:, 2] == program.symbols.index(symbol)) & (relocs[:, 1] == field)]
    rows = program.code[mine[:, 0]]
    start = rows[:, field]
    return mine[:, 0], start, start + rows[:, isa.MV_N]


def can_write_in_place(program: Program, input_symbol: str, output_symbol: str) -> bool:
    """True when no MV reads a long word of `input_symbol` after some MV wrote it in `output_symbol`
    (an MV that reads and writes overlapping long words counts, unless it writes them where it
    reads them: it copies in order, so a shifted overlap would read what it has just written)."""
    r_at, r_lo, r_hi = _ranges(program, input_symbol, isa.MV_SRC_ADDR)
    w_at, w_lo, w_hi = _ranges(program, output_symbol, isa.MV_DST_ADDR)
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

"""Unwaited accesses: a PE-stream instruction touching memory an MV in flight still writes or reads.

An MV runs on its Group's Data Engine after the PE stream issues it; the stream learns that it
is done only from a WAIT on its tag. So until that WAIT, a PE-stream instruction must neither
read nor write what the MV writes, nor write what it reads. The functional simulator runs each
MV whole where the program issues it, so a missing WAIT gives right values here and stale ones
on the chip (and the timing engine starts the reader as soon as the stream reaches it): only the
program order shows the race, which this finds.

Not part of the validator that every run passes: its check is per instruction pair and costs
more than simulating a large program. Tests run it over compiled programs.
"""

from __future__ import annotations

import numpy as np

from . import isa
from .accesses import FIRST, LAST, MEM, accesses
from .params import MachineParams


def unwaited(p: MachineParams, code: np.ndarray) -> list[tuple[int, int]]:
    """(MV, PE-stream instruction) pairs, in program order, where the instruction comes after the
    MV and before the first WAIT on its tag, and reads or writes a range the MV writes, or writes
    a range it reads. Ranges are compared by address in each memory: a PE-stream instruction
    reaches every instance of a memory at once."""
    op = code[:, 0]
    writes, reads = accesses(p, code)
    stream = np.flatnonzero(np.isin(op, (isa.Op.XFER, isa.Op.VOP, isa.Op.MATMUL)))
    waits = np.flatnonzero(op == isa.Op.WAIT)
    wait_tags = code[waits, isa.WAIT_TAG]
    found: list[tuple[int, int]] = []
    for i in np.flatnonzero(op == isa.Op.MV).tolist():
        until = waits[(waits > i) & (wait_tags == code[i, isa.MV_TAG])]
        between = stream[(stream > i) & (stream < (until[0] if len(until) else len(code)))]
        if not len(between):
            continue
        mv_writes = _range(p, code[i], isa.MV_DST_MEM, isa.MV_DST_ADDR)
        mv_reads = _range(p, code[i], isa.MV_SRC_MEM, isa.MV_SRC_ADDR)
        touched = np.zeros(len(between), dtype=bool)
        for k in range(reads.shape[1]):
            touched |= _meets(reads[between, k], mv_writes)
        touched |= _meets(writes[between], mv_writes) | _meets(writes[between], mv_reads)
        found += [(i, int(j)) for j in between[touched]]
    return found


def _range(p: MachineParams, row: np.ndarray, mem_f: int, addr_f: int) -> tuple[int, int, int]:
    """(memory, first, last) of one side of an MV, in the memory's address unit."""
    mem, first = int(row[mem_f]), int(row[addr_f])
    unit = 1 if p.mem_lw_addressed[mem] else p.words_per_lw
    return mem, first, first + int(row[isa.MV_N]) * unit - 1


def _meets(table: np.ndarray, span: tuple[int, int, int]) -> np.ndarray:
    mem, first, last = span
    return (table[:, MEM] == mem) & (table[:, FIRST] <= last) & (table[:, LAST] >= first)

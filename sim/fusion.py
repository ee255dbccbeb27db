"""MATMULs that are one product cut by rows, run as one by the functional engine.

Why: a compiler cuts a step's MATMUL into parts so that each issues in a bundle beside other
transfers (compiler.kernels.pipeline.beside: the 1024^3 product's 128 steps become 449 MATMULs),
and the functional engine's cost is mostly per MATMUL over every MAB (sim.mau). Parts that
continue each other (the same B and C pitch, A's and C's rows following on) run as one product
at the first part's place, when nothing issued between them touches any word the product reads
or writes and its C meets neither its A nor its B (so nothing can tell when the rows were
computed), and when the product is computed in sim.mau's loop form, which sums each element
along K in order however the products are stacked: the words are the same. The timing engine
runs the program as written.
"""

from __future__ import annotations

import numpy as np

from . import isa
from .accesses import FIRST, LAST, MEM, accesses
from .isa import Op
from .mau import SHORT_SLICE
from .params import MachineParams
from .replicas import Touches

# the fields parts of one product share (their M, A's and C's addresses follow on)
SHARED_FIELDS = [isa.MM_DTYPE, isa.MM_K, isa.MM_N, isa.MM_A_MEM, isa.MM_A_PITCH, isa.MM_B_MEM, isa.MM_B_ADDR,
                 isa.MM_B_PITCH, isa.MM_C_MEM, isa.MM_C_PITCH, isa.MM_FLAGS]


def fused_products(p: MachineParams, code: np.ndarray) -> tuple[dict[int, np.ndarray], frozenset[int]]:
    """(row of each run's first part -> the whole product's MATMUL row, the rows of the parts after
    the first), for the runs of parts that may run as one (see the module's docstring)."""
    mm = np.flatnonzero(code[:, 0] == Op.MATMUL)
    if len(mm) < 2:
        return {}, frozenset()
    c = code[mm]
    shared = np.all(c[1:, SHARED_FIELDS] == c[:-1, SHARED_FIELDS], axis=1)
    follows = ((c[:-1, isa.MM_A_ADDR] + c[:-1, isa.MM_M] * c[:-1, isa.MM_A_PITCH] == c[1:, isa.MM_A_ADDR])
               & (c[:-1, isa.MM_C_ADDR] + c[:-1, isa.MM_M] * c[:-1, isa.MM_C_PITCH] == c[1:, isa.MM_C_ADDR]))
    looped = c[:-1, isa.MM_K] // p.pes_per_mab <= SHORT_SLICE
    candidate = shared & follows & looped
    if not candidate.any():
        return {}, frozenset()
    touches = Touches.of(p, code)
    fused: dict[int, np.ndarray] = {}
    skipped: set[int] = set()
    i = 0
    while i < len(mm) - 1:
        j, row = i, code[mm[i]].copy()
        while j < len(mm) - 1 and candidate[j]:
            grown = row.copy()
            grown[isa.MM_M] += code[mm[j + 1], isa.MM_M]
            if _disturbed(p, touches, grown, mm[i:j + 2]):
                break
            row, j = grown, j + 1
        if j > i:
            fused[int(mm[i])] = row
            skipped.update(int(r) for r in mm[i + 1:j + 1])
        i = j + 1
    return fused, frozenset(skipped)


def _disturbed(p: MachineParams, touches: Touches, product: np.ndarray, parts: np.ndarray) -> bool:
    """Whether an instruction between the first and the last of `parts` touches a word `product`
    (their union) reads or writes, or the parts' C meets their A or B (one part would read what
    another wrote, which the whole product reads before it writes)."""
    writes, reads = accesses(p, product[None])
    for operand in reads[0, :2]:  # A and B
        if operand[MEM] == writes[0, MEM] and operand[FIRST] <= writes[0, LAST] and writes[0, FIRST] <= operand[LAST]:
            return True
    own = Touches.of(p, product[None])
    lo, hi = np.searchsorted(touches.row, [parts[0] + 1, parts[-1]])
    rows = touches.row[lo:hi]
    between = ~np.isin(rows, parts)
    mem, first, last = touches.mem[lo:hi][between], touches.lo[lo:hi][between], touches.hi[lo:hi][between]
    for m, a, b in zip(own.mem, own.lo, own.hi):
        if ((mem == m) & (first < b) & (a < last)).any():
            return True
    return False

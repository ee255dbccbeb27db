"""Replicated words: what an XFER mab_broadcast writes, held once per upper instance until needed.

mab_broadcast gives every group of an upper instance's children the same words (the 16 MABs of
an L1B on MN-Core 2, each of their 4 PEs its own member's share). The modelled state has 16
copies; the host need not write them all at once. The functional engine writes group 0 of every
upper instance and records the range here as replicated: in the other groups the words are the
group 0 ones, though the host arrays do not hold them yet. Before any instruction touches a
replicated range (reads or writes it, by the table of sim.accesses), the copies of the words it
touches are written (`materialize`), unless it writes them in every instance (then they are
dead, `Touches.covers`); the MATMUL reads a replicated operand from group 0 instead, and when A and B are
both replicated it computes one product per upper instance (sim.mau). The ranges outlive a run
(the next run of a loop mostly overwrites them); whoever reads memory from outside the engine
asks for it whole first (`sim.Machine.memory`).

Why: compiled products broadcast an operand over the MABs of an L1B, and a convolution whose
output channels are split over the L1Bs broadcasts both (ResNet-50's conv2_x: every product
computed 16 times over, and 56 broadcasts of 4,096 long words per call). Copying and multiplying
what the hardware computes in 16 places once keeps the simulator at the cost of the distinct work.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from . import isa
from .accesses import FIRST, LAST, MEM, accesses
from .params import MachineParams

# Blocks' plans a program keeps (`Touches.plans`; host policy: a loop of calls meets a few sets of
# ranges, each block once; past this the plans are dropped and made again rather than grow)
PLANS_KEPT = 1 << 12


@dataclass(frozen=True)
class Replicated:
    """Words [lo, hi) of memory `mem`: in every upper instance (`fan` children), groups 1.. of
    `group` children hold what group 0 holds."""

    mem: int
    lo: int
    hi: int
    group: int
    fan: int

    def meets(self, mem: int, lo: int, hi: int) -> bool:
        return mem == self.mem and lo < self.hi and self.lo < hi


@dataclass(frozen=True)
class Touches:
    """Every access of a program to a memory, in words, ordered by instruction (a chip may offer
    mab_broadcast on another path than MN-Core 2's L1BM -> PE one, so no memory is left out).
    `covers`: the access is a write of all of words [lo, hi) in every instance of its memory (an
    XFER down that gives every child the same number of long words, a VOP writing 32-bit
    elements side by side), so what a replica held there before is dead."""

    row: np.ndarray
    mem: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    covers: np.ndarray
    # What `Replicas.touch` made of a block of instructions met with a set of ranges: the copies it
    # wrote out and the ranges left (the same ranges meet a program's blocks every call of a loop)
    plans: dict = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def of(cls, p: MachineParams, code: np.ndarray) -> "Touches":
        writes, reads = accesses(p, code)
        reads[code[:, 0] == isa.Op.MV] = -1  # an MV's accesses follow, both sides, in case a chip's engines reach the PEs
        table = np.concatenate([writes[:, None, :LAST + 1], reads[:, :, :LAST + 1],
                                _mv_side(p, code, isa.MV_SRC_MEM, isa.MV_SRC_ADDR),
                                _mv_side(p, code, isa.MV_DST_MEM, isa.MV_DST_ADDR)], axis=1)
        rows = np.repeat(np.arange(len(code)), table.shape[1])
        flat = table.reshape(-1, 3)
        covers = np.zeros(table.shape[:2], dtype=np.bool_)
        covers[:, 0] = _whole_writes(p, code)
        keep = flat[:, MEM] >= 0
        mem, first, last = flat[keep, MEM], flat[keep, FIRST], flat[keep, LAST]
        unit = np.where(p.mem_lw_addressed[mem], p.words_per_lw, 1)
        return cls(rows[keep], mem, first * unit, (last + 1) * unit, covers.reshape(-1)[keep])


def _whole_writes(p: MachineParams, code: np.ndarray) -> np.ndarray:
    """Per instruction: whether its write (sim.accesses) is all of its word range in every
    instance of the memory. An XFER down reaches every child of every upper instance: broadcast
    gives each all n long words (unless it names a subset), distribute n / fan when n is a multiple of chunk x fan. A VOP
    writes every PE: all of its range when the elements are words side by side (row after row)."""
    op = code[:, 0]
    xfer = op == isa.Op.XFER
    mode, um, lm = code[:, isa.X_MODE], code[:, isa.X_UP_MEM], code[:, isa.X_LO_MEM]
    down = xfer & (code[:, isa.X_DIR] == isa.Dir.down)
    path = p.path_of[np.where(down, um, 0), np.where(down, lm, 0)]
    chunk = p.mode_chunk[path, np.clip(mode, 0, p.mode_chunk.shape[1] - 1)]
    fan = p.mem_instances[np.where(down, lm, 0)] // p.mem_instances[np.where(down, um, 0)]
    dealt = (mode == isa.Mode.distribute) & (code[:, isa.X_N] % np.maximum(chunk * fan, 1) == 0)
    xfer_whole = down & (((mode == isa.Mode.broadcast) & (code[:, isa.X_INDEX] == 0)) | dealt)  # not to a subset
    n_outer, n_inner = code[:, isa.V_N_OUTER], code[:, isa.V_N_INNER]
    dense = (code[:, isa.V_DST + 3] == 1) & ((n_outer == 1) | (code[:, isa.V_DST + 2] == n_inner))
    words = np.isin(code[:, isa.V_DTYPE], (isa.DType.float32, isa.DType.int32))
    vop_whole = (op == isa.Op.VOP) & dense & words & (n_outer * n_inner > 0)
    return xfer_whole | vop_whole


def _mv_side(p: MachineParams, code: np.ndarray, mem_f: int, addr_f: int) -> np.ndarray:
    """[n, 1, 3] (memory, first, last) in the memory's address unit of one side of each MV (-1 elsewhere)."""
    mem = np.where(code[:, 0] == isa.Op.MV, code[:, mem_f], -1)
    unit = np.where(p.mem_lw_addressed[np.maximum(mem, 0)], 1, p.words_per_lw)
    first = code[:, addr_f]
    return np.stack([mem, first, first + code[:, isa.MV_N] * unit - 1], 1)[:, None]


class Replicas:
    """The replicated ranges of `memories` (a list whose arrays the functional engine runs on)."""

    def __init__(self, p: MachineParams, memories: list[np.ndarray]) -> None:
        self.p, self.memories = p, memories
        self.ranges: list[Replicated] = []

    def __bool__(self) -> bool:
        return bool(self.ranges)

    def holding(self, mem: int, lo: int, hi: int) -> Replicated | None:
        """The range that holds all of words [lo, hi) of `mem`, if one does."""
        for r in self.ranges:
            if r.mem == mem and r.lo <= lo and hi <= r.hi:
                return r
        return None

    def materialize(self, mem: int, lo: int, hi: int) -> None:
        """Write out words [lo, hi) of `mem` where ranges hold them replicated; what those ranges
        hold outside [lo, hi) stays replicated."""
        self._cut(mem, lo, hi, True)

    def dead(self, mem: int, lo: int, hi: int) -> None:
        """Words [lo, hi) of `mem` are about to be written in every instance: forget them."""
        self._cut(mem, lo, hi, False)

    def _cut(self, mem: int, lo: int, hi: int, write_out: bool) -> None:
        for r, a, b in self._split(mem, lo, hi, write_out):
            self._write_out(r, a, b)

    def _split(self, mem: int, lo: int, hi: int, write_out: bool) -> list[tuple[Replicated, int, int]]:
        """Take words [lo, hi) of `mem` out of the ranges; returns the (range, first, end) whose
        copies must be written (`write_out`), which this leaves to the caller."""
        kept, copies = [], []
        for r in self.ranges:
            if r.meets(mem, lo, hi):
                a, b = max(lo, r.lo), min(hi, r.hi)
                if write_out:
                    copies.append((r, a, b))
                kept += [Replicated(r.mem, lo_, hi_, r.group, r.fan) for lo_, hi_ in ((r.lo, a), (b, r.hi)) if lo_ < hi_]
            else:
                kept.append(r)
        self.ranges = kept
        return copies

    def _write_out(self, r: Replicated, a: int, b: int) -> None:
        """Give groups 1.. of `r` the words [a, b) of its group 0."""
        rows = self.memories[r.mem]
        view = rows.reshape(rows.shape[0] // r.fan, r.fan // r.group, r.group, rows.shape[1])
        view[:, 1:, :, a:b] = view[:, :1, :, a:b]

    def materialize_all(self) -> None:
        for r in list(self.ranges):
            self.materialize(r.mem, r.lo, r.hi)

    def overwritten(self, r: Replicated) -> None:
        """Record `r`, whose words are about to be written in group 0 only (recorded first, so a
        write cut short leaves every group reading the same words). A range of the same kind that
        meets or adjoins it joins it (in the union every group holds what group 0 holds); a range
        of another kind that meets it is written out first (its words outside `r` stand; inside
        `r`, group 0 will hold what every group holds)."""
        for old in [o for o in self.ranges if o.mem == r.mem and r.lo <= o.hi and o.lo <= r.hi]:  # meets or adjoins
            if (old.group, old.fan) == (r.group, r.fan):
                self.ranges.remove(old)
                r = Replicated(r.mem, min(r.lo, old.lo), max(r.hi, old.hi), r.group, r.fan)
            elif old.meets(r.mem, r.lo, r.hi):
                self.materialize(old.mem, old.lo, old.hi)
        self.ranges.append(r)

    def touch(self, touches: Callable[[], Touches], start: int, end: int) -> None:
        """Instructions [start, end) of a program whose access table `touches()` gives are about to
        run unaware of replicas: write out the words they touch. What that takes depends only on
        the block and the ranges, so it is worked out once (`Touches.plans`) and replayed: an
        MNIST training step meets the same ranges at the same blocks every call (386 blocks a
        call, 19 of its 80 ms in this bookkeeping)."""
        if not self.ranges:
            return
        t = touches()
        key = (start, end, tuple(self.ranges))
        plan = t.plans.get(key)
        if plan is None:
            copies = self._touched(t, start, end)
            if len(t.plans) >= PLANS_KEPT:
                t.plans.clear()
            plan = t.plans[key] = (tuple(copies), tuple(self.ranges))
        else:
            self.ranges = list(plan[1])
        for r, a, b in plan[0]:
            self._write_out(r, a, b)

    def _touched(self, t: Touches, start: int, end: int) -> list[tuple[Replicated, int, int]]:
        """Take out of the ranges what instructions [start, end) touch; returns the copies to write
        out, in order."""
        a, b = np.searchsorted(t.row, [start, end])
        if a == b:
            return []
        mem, lo, hi, covers = t.mem[a:b], t.lo[a:b], t.hi[a:b], t.covers[a:b]
        meeting = np.zeros(b - a, dtype=np.bool_)
        for r in self.ranges:
            meeting |= (mem == r.mem) & (lo < r.hi) & (r.lo < hi)
        # what any of them reads (or writes in part) first, as it stands before the first runs;
        # then what is written whole is dead (one of them may read it before another writes it)
        copies = []
        for k in np.flatnonzero(meeting & ~covers).tolist():
            copies += self._split(int(mem[k]), int(lo[k]), int(hi[k]), True)
        for k in np.flatnonzero(meeting & covers).tolist():
            self._split(int(mem[k]), int(lo[k]), int(hi[k]), False)
        return copies


def written_range(p: MachineParams, row: np.ndarray, group: int) -> Replicated:
    """The words an XFER mab_broadcast writes in its lower memory (every child the same range)."""
    lm, um, n = int(row[isa.X_LO_MEM]), int(row[isa.X_UP_MEM]), int(row[isa.X_N])
    wpl = p.words_per_lw
    lo = int(row[isa.X_LO_ADDR]) * (wpl if p.mem_lw_addressed[lm] else 1)
    fan = int(p.mem_instances[lm]) // int(p.mem_instances[um])
    return Replicated(lm, lo, lo + wpl * (n // group), group, fan)

"""Hand-written programs shared by the simulator tests (no compiler involved)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import sim
from hwdesc import HwDesc


@dataclass(frozen=True)
class Shape:
    """Sizes of the add pipeline on one chip: every PE gets `per_pe` long words of each operand."""

    per_pe: int
    pes_per_l1b: int  # Q
    l1b_per_l2b: int  # F
    l2b_per_group: int  # C
    groups: int

    @staticmethod
    def of(hw: HwDesc, per_pe: int = 8) -> "Shape":
        return Shape(per_pe, hw.fanout("L1B", "PE"), hw.fanout("L2B", "L1B"), hw.fanout("Group", "L2B"),
                     hw.instances("Group"))

    @property
    def n_l1bm(self) -> int:  # LW of one operand per L1BM
        return self.per_pe * self.pes_per_l1b

    @property
    def n_l2bm(self) -> int:
        return self.n_l1bm * self.l1b_per_l2b

    @property
    def n_group(self) -> int:  # LW of one operand per Group's DRAM
        return self.n_l2bm * self.l2b_per_group


def add_pipeline(machine: sim.Machine) -> tuple[sim.Program, Shape]:
    """x + y: DRAM -> L2BM -> L1BM -> PE (distribute), VOP add, collect back to DRAM.

    DRAM layout per Group: x at [0, n_group), y at [n_group, 2 n_group), result at 2 n_group."""
    hw, s = machine.hw, Shape.of(machine.hw)
    gap = hw.hazards
    b = sim.ProgramBuilder(machine.params)
    for t in range(2):
        for c in range(s.l2b_per_group):
            b.mv("individual", "DRAM", t * s.n_group + c * s.n_l2bm, "L2BM", t * s.n_l2bm, s.n_l2bm, tag=t + 1, dst_local=c)
    for t in range(2):
        b.wait(t + 1)
        b.xfer("distribute", "down", "L2BM", t * s.n_l2bm, "L1BM", t * s.n_l1bm, s.n_l2bm)
    b.nop(gap["l2bm_to_l1bm_read"])
    b.xfer("distribute", "down", "L1BM", 0, "LM0", 0, s.n_l1bm)
    b.xfer("distribute", "down", "L1BM", s.n_l1bm, "LM1", 0, s.n_l1bm)
    b.nop(gap["lm_write_to_read"])
    words = 2 * s.per_pe
    b.vop("add", "float32", 1, words, ("LM0", words, 0, 1), ("LM0", 0, 0, 1), ("LM1", 0, 0, 1))
    b.nop(gap["lm_write_to_read"])
    b.xfer("collect", "up", "L1BM", 2 * s.n_l1bm, "LM0", words, s.n_l1bm)
    b.nop(gap["l1bm_write_to_l2bm_read"])
    b.xfer("collect", "up", "L2BM", 2 * s.n_l2bm, "L1BM", 2 * s.n_l1bm, s.n_l2bm)
    b.nop(gap["l2bm_write_to_mv_read"])
    for c in range(s.l2b_per_group):
        b.mv("individual", "L2BM", 2 * s.n_l2bm, "DRAM", 2 * s.n_group + c * s.n_l2bm, s.n_l2bm, tag=3, src_local=c)
    b.wait(3)
    return b.build(), s


def load_dram(machine: sim.Machine, words: np.ndarray, at_lw: int = 0) -> None:
    """Test setup: put [Groups, words] into every Group's DRAM starting at long word `at_lw`."""
    machine.grow("DRAM", 2 * at_lw + words.shape[1])
    machine.memory("DRAM")[:, 2 * at_lw: 2 * at_lw + words.shape[1]] = words.view(np.uint32)

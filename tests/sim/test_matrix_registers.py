"""The MAU's matrix registers as a path between a MAB's PEs: mwrite (pe_to_mreg, individual) and
the transposed read mread (mreg_to_pe, transpose), against numpy, the YAML's rates and the issue
model's rules (sim.isa, "the matrix registers")."""

from __future__ import annotations

import numpy as np
import pytest

import hwdesc
import sim
from sim.errors import SimError

CHIPS = ["mini", "mncore2"]


def _pe_matrix(words: np.ndarray, pes: int, epl: int, rows: int) -> np.ndarray:
    """A MAB's PEs' long words 0..rows-1 as a matrix: row r is long word r of PE 0, 1, ... side by side."""
    return np.concatenate([words[pe].reshape(rows, epl) for pe in range(pes)], axis=1)


@pytest.mark.parametrize("chip", CHIPS)
@pytest.mark.parametrize("dtype, item", [("float32", np.uint32), ("int32", np.uint32), ("float16", np.uint16)])
def test_a_write_and_a_transposed_read_transpose_every_mabs_blocks(chip, dtype, item):
    """Each MAB transposes side x side blocks whose columns lie across its PEs (side = PEs x
    elements per long word): PE p then holds rows p*epl.. of every column."""
    hw = hwdesc.load(chip)
    m = sim.Machine(hw)
    pes, wpl = hw.fanout("MAB", "PE"), hw.long_word_bytes // hw.word_bytes
    epl = wpl * 32 // hw.formats[dtype].bits
    side = pes * epl
    blocks = 2
    per_pe_lw = blocks * side
    lm0 = m.memory("LM0")
    rng = np.random.default_rng(1)
    lm0[:, : wpl * per_pe_lw] = rng.integers(0, 2 ** 32, size=(lm0.shape[0], wpl * per_pe_lw), dtype=np.uint32)
    b = sim.ProgramBuilder(m.params)
    for k in range(blocks):  # one block at a time: a face holds at most 16 rows
        n = side * pes
        b.xfer("individual", "up", "MREG", 0, "LM0", wpl * k * side, n, dtype=dtype)
        b.xfer("transpose", "down", "MREG", 0, "LM1", wpl * k * side, n, dtype=dtype)
    m.run(b.build())
    src = lm0[:, : wpl * per_pe_lw].view(item)
    out = m.memory("LM1")[:, : wpl * per_pe_lw].view(item)
    for mab in (0, hw.instances("MAB") - 1):
        pe_rows = slice(mab * pes, (mab + 1) * pes)
        for k in range(blocks):
            block = slice(k * side * epl, (k + 1) * side * epl)
            a = _pe_matrix(src[pe_rows, block], pes, epl, side)
            t = _pe_matrix(out[pe_rows, block], pes, epl, side)
            np.testing.assert_array_equal(t, a.T)


def test_cycles_follow_the_yaml_rates(mini):
    """mwrite: n LW over the MAB's PEs at pe_to_mreg's per-PE rate; mread the same at
    mreg_to_pe's; whole steps each (step_cycles)."""
    hw = mini
    m = sim.Machine(hw)
    pes, step = hw.fanout("MAB", "PE"), hw.step_cycles
    n = 4 * pes * pes * 2  # float32: one 8 x 8 block is 32 LW; four of them
    write = hw.transfers["pe_to_mreg"].modes["individual"]
    read = hw.transfers["mreg_to_pe"].modes["transpose"]
    mreg_rate = hw.memories["MREG"].lw_per_cycle

    def steps(src: float, dst: float, src_lw: int, dst_lw: int) -> int:
        return -(-int(np.ceil(max(src_lw / src, dst_lw / dst))) // step)
    expect = step * (steps(write.src_lw_per_cycle, min(write.dst_lw_per_cycle, mreg_rate), n // pes, n)
                     + steps(min(read.src_lw_per_cycle, mreg_rate), read.dst_lw_per_cycle, n, n // pes))
    b = sim.ProgramBuilder(m.params)
    b.xfer("individual", "up", "MREG", 0, "LM0", 0, n)
    b.xfer("transpose", "down", "MREG", 0, "LM1", 0, n)
    assert m.run(b.build(), mode="timing").total_cycles == expect == 64


def test_a_write_and_a_read_of_other_faces_issue_together(mini):
    """Double buffering: the next block's mwrite (into the other face) issues with this block's
    mread (slots mau and mread), so a pipeline of blocks takes one block's time per block, and
    the values still match."""
    m = sim.Machine(mini)
    pes, wpl = mini.fanout("MAB", "PE"), 2
    side, n = 8, 32  # float32 blocks: 8 rows of 4 LW
    face = mini.memory_lw("MREG") // mini.memories["MREG"].faces
    lm0 = m.memory("LM0")
    lm0[:, : 2 * side * wpl] = np.arange(lm0.shape[0] * 2 * side * wpl, dtype=np.uint32).reshape(lm0.shape[0], -1)

    def program(bundled: bool) -> sim.Program:
        b = sim.ProgramBuilder(m.params)
        b.xfer("individual", "up", "MREG", 0, "LM0", 0, n)
        if bundled:
            with b.together():
                b.xfer("transpose", "down", "MREG", 0, "LM1", 0, n)
                b.xfer("individual", "up", "MREG", face, "LM0", side * wpl, n)
        else:
            b.xfer("transpose", "down", "MREG", 0, "LM1", 0, n)
            b.xfer("individual", "up", "MREG", face, "LM0", side * wpl, n)
        b.xfer("transpose", "down", "MREG", face, "LM1", side * wpl, n)
        return b.build()
    alone, together = (m.run(program(x), mode="timing").total_cycles for x in (False, True))
    assert (alone, together) == (32, 24)
    m.run(program(True), mode="functional")
    for k in range(2):
        block = slice(k * side * wpl, (k + 1) * side * wpl)
        a = _pe_matrix(lm0[:pes, block], pes, wpl, side)
        np.testing.assert_array_equal(_pe_matrix(m.memory("LM1")[:pes, block], pes, wpl, side), a.T)


def test_a_matmul_leaves_no_mau_group_for_a_register_transfer(mini):
    m = sim.Machine(mini)
    b = sim.ProgramBuilder(m.params)
    with b.together():
        b.matmul("float32", 8, 16, 32, ("LM0", 0, 4), ("LM1", 0, 32), ("GRF0", 0, 8))
        b.xfer("transpose", "down", "MREG", 0, "GRF1", 0, 32)
    with pytest.raises(SimError, match=r"#1 moves the matrix registers \(MREG\) while MATMUL #0 holds"):
        m.run(b.build(), mode="timing")


@pytest.mark.parametrize("mode, direction, at, n, message", [
    ("transpose", "down", 0, 16, r"n=16 at MREG 0: a transpose reads whole blocks of 8 rows of 4 long words "
                                 r"\(float32\), each starting at a multiple of 32"),
    ("transpose", "down", 8, 32, r"n=32 at MREG 8: a transpose reads whole blocks"),
    ("transpose", "up", 0, 32, r"path pe_to_mreg does not offer mode transpose"),
    ("broadcast", "down", 0, 32, r"path mreg_to_pe does not offer mode broadcast"),
])
def test_bad_register_transfers_are_refused(mini, mode, direction, at, n, message):
    m = sim.Machine(mini)
    b = sim.ProgramBuilder(m.params)
    b.xfer(mode, direction, "MREG", at, "LM0", 0, n)
    with pytest.raises(SimError, match=message):
        m.run(b.build())


def test_a_face_serves_one_instruction_per_step(mini):
    """memories.MREG.faces: a write and a read of one face in one bundle are refused even when
    their rows do not meet (a float32 block is half a face)."""
    m = sim.Machine(mini)
    b = sim.ProgramBuilder(m.params)
    b.xfer("individual", "up", "MREG", 0, "LM0", 0, 32)
    with b.together():
        b.xfer("transpose", "down", "MREG", 0, "LM1", 0, 32)
        b.xfer("individual", "up", "MREG", 32, "LM0", 16, 32)
    with pytest.raises(SimError, match=r"instructions #1 and #2 of one bundle use face 0 of MREG "
                                       r"\(memories.MREG.faces: 2\); a face serves one instruction per step"):
        m.run(b.build())

"""The issue model: instructions in different VLIW slots issue in the same steps (a bundle holds
the stream for its longest member), and the validator refuses bundles one VLIW word cannot hold."""

from __future__ import annotations

from math import ceil

import numpy as np
import pytest

import sim


def _matmul_and_fetch(b: sim.ProgramBuilder, hw, together: bool) -> None:
    """A MATMUL (A in LM0, B in LM1, C to GRF0) and the next operand's fetch from L1BM into GRF1."""
    def body() -> None:
        b.matmul("float32", 32, 16, 16, ("LM0", 0, 4), ("LM1", 0, 16), ("GRF0", 0, 4))
        b.xfer("broadcast", "down", "L1BM", 0, "GRF1", 0, 64)
    if together:
        with b.together():
            body()
    else:
        body()


def _cycles(hw) -> tuple[int, int]:
    step = hw.step_cycles
    mode = hw.units["MAU"].matrix["float32"]
    mm = ceil(ceil(32 / mode.rows) * ceil(16 / mode.cols) * max(16, ceil(mode.rows / mode.load_rows_per_cycle)) / step) * step
    rates = hw.transfers["l1bm_to_pe"].modes["broadcast"]
    xfer = ceil(ceil(max(64 / rates.src_lw_per_cycle, 64 / rates.dst_lw_per_cycle)) / step) * step
    return mm, xfer


def test_a_matmul_and_a_fetch_in_other_slots_overlap(mini):
    m = sim.Machine(mini)
    rng = np.random.default_rng(0)
    for name in ("LM0", "LM1", "L1BM"):
        m.memory(name)[:] = rng.standard_normal(m.memory(name).shape, dtype=np.float32).view(np.uint32)
    state = [a.copy() for a in m.memories]
    runs = {}
    for together in (False, True):
        for memory, before in zip(m.memories, state):
            memory[...] = before
        b = sim.ProgramBuilder(m.params)
        _matmul_and_fetch(b, mini, together)
        program = b.build()
        assert program.code[1, sim.isa.F_WITH_PREVIOUS] == together
        runs[together] = (m.run(program), [m.memory(n).copy() for n in ("GRF0", "GRF1")])
    mm, xfer = _cycles(mini)
    assert runs[False][0].total_cycles == mm + xfer
    assert runs[True][0].total_cycles == max(mm, xfer)  # the l1bm slot works beside the MAU
    assert runs[True][0].pe_busy == max(mm, xfer)
    for apart, together in zip(runs[False][1], runs[True][1]):
        np.testing.assert_array_equal(apart, together)


def test_an_alu_and_a_mau_vop_issue_together(mini):
    m = sim.Machine(mini)
    b = sim.ProgramBuilder(m.params)
    with b.together():
        b.vop("max", "float32", 1, 64, ("GRF0", 0, 0, 1), ("LM0", 0, 0, 1), 0.0)  # the ALU
        b.vop("add", "float32", 1, 128, ("LM1", 0, 0, 1), ("LM1", 0, 0, 1), ("GRF1", 0, 0, 1))  # the MAU
    stats = m.run(b.build(), mode="timing")
    assert stats.start[0] == stats.start[1] == 0
    assert stats.total_cycles == max(stats.end[0], stats.end[1])


def _rejects(mini, emit, match: str) -> None:
    m = sim.Machine(mini)
    b = sim.ProgramBuilder(m.params)
    emit(b)
    with pytest.raises(sim.SimError, match=match):
        m.run(b.build(), mode="timing")


def _bundle(*members):
    def emit(b):
        with b.together():
            for member in members:
                member(b)
    return emit


def test_one_slot_holds_one_instruction(mini):
    _rejects(mini, _bundle(lambda b: b.vop("add", "float32", 1, 8, ("LM1", 0, 0, 1), ("LM0", 0, 0, 1), 1.0),
                           lambda b: b.vop("mul", "float32", 1, 8, ("GRF0", 0, 0, 1), ("GRF1", 0, 0, 1), 2.0)),
             r"instruction #1 .*it issues with instruction #0 in the same VLIW slot mau")


def test_a_memory_is_read_by_one_member(mini):
    _rejects(mini, _bundle(lambda b: b.vop("max", "float32", 1, 8, ("GRF0", 0, 0, 1), ("LM0", 0, 0, 1), 0.0),
                           lambda b: b.xfer("individual", "up", "L1BM", 0, "LM0", 64, 8)),
             r"instruction #1 .*it reads LM0, which instruction #0 of its bundle reads too")


def test_an_lm_cannot_be_written_and_read_by_two_members(mini):
    _rejects(mini, _bundle(lambda b: b.matmul("float32", 32, 16, 16, ("LM0", 0, 4), ("LM1", 0, 16), ("GRF0", 0, 4)),
                           lambda b: b.xfer("broadcast", "down", "L1BM", 0, "LM0", 512, 64)),
             r"instructions #1 and #0 of one bundle write and read LM0, whose one port \(memories.LM0.ports: 1RW\)")


def test_members_must_not_depend_on_each_other(mini):
    _rejects(mini, _bundle(lambda b: b.xfer("broadcast", "down", "L1BM", 0, "GRF1", 0, 64),
                           lambda b: b.vop("max", "float32", 1, 8, ("GRF0", 0, 0, 1), ("GRF1", 4, 0, 1), 0.0)),
             r"instruction #1 reads GRF1 4..11, which instruction #0 of its bundle writes")


def test_a_flag_after_a_transfer_engine_instruction_is_refused(mini):
    def emit(b):
        b.mv("individual", "DRAM", 0, "L2BM", 0, 64, tag=1)
        b.vop("copy", "float32", 1, 8, ("LM1", 0, 0, 1), ("LM0", 0, 0, 1))
        b.wait(1)
    m = sim.Machine(mini)
    b = sim.ProgramBuilder(m.params)
    emit(b)
    program = b.build()
    program.code[1, sim.isa.F_WITH_PREVIOUS] = 1
    m.grow("DRAM", 1024)
    with pytest.raises(sim.SimError, match=r"instruction #1 .*the previous instruction, which is not a VOP, XFER"):
        m.run(program, mode="timing")


def test_hazard_nops_go_before_the_bundle(mini):
    """A member that reads too soon after an earlier writer: the nops precede its whole bundle."""
    m = sim.Machine(mini)
    b = sim.ProgramBuilder(m.params)
    b.vop("add", "float32", 1, 8, ("GRF1", 0, 0, 1), ("LM1", 0, 0, 1), 1.0)
    with b.together():
        b.xfer("broadcast", "down", "L1BM", 0, "LM0", 0, 8)
        b.vop("max", "float32", 1, 8, ("GRF0", 0, 0, 1), ("GRF1", 0, 0, 1), 0.0)  # reads what #0 wrote
    program = b.build()
    ops = program.code[:, 0].tolist()
    assert ops == [sim.Op.VOP, sim.Op.NOP, sim.Op.XFER, sim.Op.VOP]
    assert program.code[1, sim.isa.NOP_STEPS] == mini.hazards["grf_write_to_read"]
    assert program.code[3, sim.isa.F_WITH_PREVIOUS] == 1
    m.run(program, mode="timing")

"""Replicated ranges (sim.replicas): what a mab_broadcast writes is held once per L1B until needed.

The reference is the same program run one instruction at a time with the memories read whole in
between (`Machine.memories` writes every replica out), so no instruction ever sees a replica: the
state after the whole program must be the same word for word.
"""

from __future__ import annotations

import numpy as np
import pytest

import hwdesc
import sim
from sim import mau

CHIPS = ["mini", "mncore2"]


def _machine(chip: str, seed: int = 0) -> sim.Machine:
    """A machine whose PE and L1B memories hold random words, different in every PE (so a copy a
    run failed to write out shows)."""
    m = sim.Machine(hwdesc.load(chip))
    rng = np.random.default_rng(seed)
    for name in ("L1BM", "LM0", "LM1", "GRF0", "GRF1"):
        m.memory(name)[:] = rng.standard_normal(m.memory(name).shape, dtype=np.float32).view(np.uint32)
    return m


def _state(m: sim.Machine) -> list[np.ndarray]:
    return [a.copy() for a in m.memories]


def _one_by_one(m: sim.Machine, program: sim.Program) -> None:
    for i in range(len(program.code)):
        m.run(program.code[i:i + 1], mode="functional", validated=True)
        m.memories  # noqa: B018 - reading them whole writes every replica out


def _program(m: sim.Machine) -> sim.Program:
    """mab_broadcasts into LM0 (two adjacent pieces) and LM1, products that read them replicated
    (both operands, A or B alone, B transposed, gathered and in place, accumulating into a
    C that differs per MAB), a distribute overwriting part of a replicated range, a VOP and a
    collect reading one."""
    hw = m.hw
    pes = m.params.pes_per_mab
    group = pes  # l1bm_to_pe's mab_broadcast: the PEs of a MAB
    b = sim.ProgramBuilder(m.params)
    M, K, N = 4, 8 * pes, 2 * pes  # K/PE = 8: gathered
    kp = K // pes
    a_words, b_words = M * kp, kp * N
    wpl = m.params.words_per_lw
    half_a = a_words // 2
    b.xfer("mab_broadcast", "down", "L1BM", 0, "LM0", 0, group * half_a // wpl)
    b.xfer("mab_broadcast", "down", "L1BM", 64, "LM0", half_a, group * half_a // wpl)  # adjoins the first
    b.xfer("mab_broadcast", "down", "L1BM", 128, "LM1", 0, group * b_words // wpl)
    b.matmul("float32", M, K, N, ("LM0", 0, kp), ("LM1", 0, N), ("GRF0", 0, N // pes))  # both replicated
    b.matmul("float32", M, K, N, ("LM0", 0, kp), ("LM1", 0, N), ("GRF1", 0, N // pes), accumulate=True)
    b.xfer("distribute", "down", "L1BM", 256, "LM1", 0, hw.fanout("L1B", "PE"))  # one LW into every PE
    b.matmul("float32", M, K, N, ("LM0", 0, kp), ("LM1", 0, N), ("GRF0", 0, N // pes))  # A replicated only
    K2 = 18 * pes  # K/PE = 18: in place, A read replicated (at stride 0)
    b.xfer("mab_broadcast", "down", "L1BM", 0, "LM0", 256, group * (2 * 18) // wpl)
    b.matmul("float32", 2, K2, N, ("LM0", 256, 18), ("LM1", 512, N), ("GRF1", 64, N // pes))
    b.xfer("mab_broadcast", "down", "L1BM", 128, "LM1", 256, group * b_words // wpl)
    b.matmul("float32", M, K, N, ("LM0", 512, kp), ("LM1", 256, N), ("GRF0", 32, N // pes))  # B replicated only
    b.matmul("float32", M, K, N, ("LM0", 512, kp), ("LM1", 256, kp), ("GRF0", 32, N // pes), trans_b=True,
             accumulate=True)
    b.vop("add", "float32", 1, 16, ("LM1", 768, 0, 1), ("LM0", 0, 0, 1), ("GRF0", 8, 0, 1))
    b.xfer("collect", "up", "L1BM", 512, "LM0", 0, hw.fanout("L1B", "PE"))
    b.xfer("mab_broadcast", "down", "L1BM", 32, "LM0", 4, group * 4 // wpl)  # inside the first range: left pending
    return b.build()


@pytest.mark.parametrize("chip", CHIPS)
def test_a_program_leaves_the_state_it_leaves_without_replicas(chip, monkeypatch):
    whole, reference = _machine(chip), _machine(chip)
    program = _program(whole)
    shared = []
    stack = mau._Stack

    class Recorded(stack):
        def __init__(self, pes, n_mab, every, *args):
            shared.append((every, args))
            super().__init__(pes, n_mab, every, *args)
    monkeypatch.setattr(mau, "_Stack", Recorded)
    whole.run(program, mode="functional")
    assert whole.replicas.ranges, "the last broadcast stays replicated after the run"
    mabs_per_l1b = whole.hw.fanout("L1B", "MAB")
    assert [every for every, _ in shared] == [mabs_per_l1b] * 2 + [1] * 3  # a product per MAB once one is not
    a_share, b_share = shared[2][1][:2]
    assert (a_share, b_share) == (mabs_per_l1b, 1), "A replicated only: one wide product per L1B"
    a_share, b_share = shared[-1][1][:2]
    assert (a_share, b_share) == (1, mabs_per_l1b), "B replicated only: one tall product per L1B"
    _one_by_one(reference, program)
    for name, got, expect in zip(whole.params.memory_names, whole.memories, reference.memories):
        np.testing.assert_array_equal(got, expect, err_msg=name)
    assert not whole.replicas.ranges


@pytest.mark.parametrize("chip", CHIPS)
def test_a_broadcast_read_whole_gives_every_mab_the_same_words(chip):
    m = _machine(chip, seed=1)
    hw = m.hw
    group, mabs = hw.fanout("MAB", "PE"), hw.fanout("L1B", "MAB")
    b = sim.ProgramBuilder(m.params)
    b.xfer("mab_broadcast", "down", "L1BM", 0, "LM0", 0, 8 * group)
    m.run(b.build(), mode="functional")
    upper = m.memory("L1BM")[:, :16 * group].reshape(hw.instances("L1B"), 8, group, 2)  # [L1B, round, member, word]
    lm0 = m.memory("LM0")[:, :16].reshape(hw.instances("L1B"), mabs, group, 8, 2)  # [L1B, MAB, member, round, word]
    np.testing.assert_array_equal(lm0, np.broadcast_to(upper.transpose(0, 2, 1, 3)[:, None], lm0.shape))


def test_a_write_meeting_a_replicated_range_in_part_keeps_its_other_words(mini):
    m = _machine("mini", seed=2)
    group = mini.fanout("MAB", "PE")
    b = sim.ProgramBuilder(m.params)
    b.xfer("mab_broadcast", "down", "L1BM", 0, "LM0", 0, 8 * group)  # words 0..15 of every PE
    b.vop("copy", "float32", 1, 4, ("LM0", 12, 0, 1), 7.0)  # words 12..15 of every PE
    m.run(b.build(), mode="functional")
    reference = _machine("mini", seed=2)
    _one_by_one(reference, b.build())
    np.testing.assert_array_equal(m.memory("LM0"), reference.memory("LM0"))
    assert (m.memory("LM0").view(np.float32)[:, 12:16] == 7.0).all()


@pytest.mark.parametrize("short_slice", [mau.SHORT_SLICE, 0])  # the loop; BLAS
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_a_product_of_replicated_operands_by_either_way(mini, monkeypatch, short_slice, dtype):
    monkeypatch.setattr(mau, "SHORT_SLICE", short_slice)
    pes, wpl = mini.fanout("MAB", "PE"), mini.long_word_bytes // mini.word_bytes
    per_word = 2 if dtype == "float16" else 1
    M, K, N = 4, 8 * pes, 2 * pes
    kp = K // pes
    b = sim.ProgramBuilder(sim.MachineParams.from_hw(mini))
    b.xfer("mab_broadcast", "down", "L1BM", 0, "LM0", 0, pes * M * kp // per_word // wpl)
    b.xfer("mab_broadcast", "down", "L1BM", 128, "LM1", 0, pes * kp * N // per_word // wpl)
    b.matmul(dtype, M, K, N, ("LM0", 0, kp), ("LM1", 0, N), ("GRF0", 0, N // pes))
    b.matmul(dtype, M, K, N, ("LM0", 0, kp), ("LM1", 0, N), ("GRF1", 0, N // pes), accumulate=True)
    program = b.build()
    whole, reference = _machine("mini", seed=3), _machine("mini", seed=3)
    if dtype == "float16":  # random words are not all finite halves: make the operands' words halves of small values
        for m in (whole, reference):
            codec = m.params.half
            m.memory("L1BM")[:] = codec.encode(np.linspace(-2, 2, 2 * m.memory("L1BM").size, dtype=np.float32)
                                               ).view(np.uint32).reshape(m.memory("L1BM").shape)
    whole.run(program, mode="functional")
    _one_by_one(reference, program)
    for name in ("GRF0", "GRF1", "LM0", "LM1"):
        np.testing.assert_array_equal(whole.memory(name), reference.memory(name), err_msg=name)


@pytest.mark.parametrize("short_slice", [mau.SHORT_SLICE, 0, None])  # the loop; BLAS; in place
@pytest.mark.parametrize("chip", CHIPS)
def test_a_product_accumulated_over_k_chunks_of_replicated_operands_keeps_c_replicated(chip, monkeypatch,
                                                                                       short_slice):
    """A product of operands replicated over an L1B's MABs, overwriting C and then adding to it
    chunk by chunk, writes C into the first MAB only and records it replicated: every MAB's C
    would be the same words. A C whose rows lie apart (pitch above its width) is written into
    every MAB (its range would claim the gap). Either way the state is word for word the one
    with every replica written out between instructions."""
    if short_slice is None:
        monkeypatch.setattr(mau, "form", lambda m, k, n, pes: mau.IN_PLACE)
    else:
        monkeypatch.setattr(mau, "SHORT_SLICE", short_slice)
    m0 = _machine(chip, seed=5)
    pes, wpl = m0.params.pes_per_mab, m0.params.words_per_lw
    M, K, N = 4, 8 * pes, 2 * pes
    kp, cols = K // pes, N // pes
    b = sim.ProgramBuilder(m0.params)
    b.xfer("mab_broadcast", "down", "L1BM", 0, "LM0", 0, pes * M * kp // wpl)
    b.xfer("mab_broadcast", "down", "L1BM", 128, "LM1", 0, pes * kp * N // wpl)
    for chunk in range(3):  # C one run per PE: GRF0 words [0, M * cols)
        b.matmul("float32", M, K, N, ("LM0", 0, kp), ("LM1", 0, N), ("GRF0", 0, cols), accumulate=chunk > 0)
    for chunk in range(2):  # C's rows apart: GRF1 rows at pitch 2 * cols
        b.matmul("float32", M, K, N, ("LM0", 0, kp), ("LM1", 0, N), ("GRF1", 0, 2 * cols), accumulate=chunk > 0)
    program = b.build()
    whole, reference = m0, _machine(chip, seed=5)
    whole.run(program, mode="functional")
    grf0, grf1 = whole.params.memory_id("GRF0"), whole.params.memory_id("GRF1")
    held = [(r.mem, r.lo, r.hi) for r in whole.replicas.ranges]
    assert (grf0, 0, M * cols) in held
    assert not any(mem == grf1 for mem, _, _ in held)
    _one_by_one(reference, program)
    for name in ("GRF0", "GRF1", "LM0", "LM1"):
        np.testing.assert_array_equal(whole.memory(name), reference.memory(name), err_msg=name)


@pytest.mark.parametrize("short_slice", [mau.SHORT_SLICE, 0])  # the loop; BLAS
def test_a_product_reading_across_the_edge_of_a_replicated_range_reads_every_mabs_words(mini, monkeypatch,
                                                                                         short_slice):
    """A's words 12..19 of every PE: 12..15 replicated by the broadcast, 16..19 each PE's own."""
    monkeypatch.setattr(mau, "SHORT_SLICE", short_slice)
    pes = mini.fanout("MAB", "PE")
    b = sim.ProgramBuilder(sim.MachineParams.from_hw(mini))
    b.xfer("mab_broadcast", "down", "L1BM", 0, "LM0", 0, pes * 8)  # words 0..15 of every PE
    b.matmul("float32", 1, 8 * pes, pes, ("LM0", 12, 8), ("LM1", 0, pes), ("GRF1", 0, 1))
    program = b.build()
    whole, reference = _machine("mini", seed=4), _machine("mini", seed=4)
    whole.run(program, mode="functional")
    _one_by_one(reference, program)
    np.testing.assert_array_equal(whole.memory("GRF1"), reference.memory("GRF1"))


@pytest.mark.parametrize("replicated", ["LM0", "LM1"])  # A alone, B alone
def test_a_product_in_place_reads_one_replicated_operand_where_it_lies(mini, replicated):
    """K/PE = 24 is computed in place (one BLAS product per PE's slice): with A or B alone
    replicated, the product reads it from the first MAB, leaves its copies pending, and gives
    every word it gives without replicas."""
    pes = mini.fanout("MAB", "PE")
    kp = mau.SHORT_SLICE + 8
    M, N = 4, 2 * pes
    assert mau.form(M, kp * pes, N, pes) == mau.IN_PLACE
    b = sim.ProgramBuilder(sim.MachineParams.from_hw(mini))
    words = (M if replicated == "LM0" else N) * kp
    wpl = mini.long_word_bytes // mini.word_bytes
    b.xfer("mab_broadcast", "down", "L1BM", 0, replicated, 0, pes * words // wpl)
    b.matmul("float32", M, kp * pes, N, ("LM0", 0, kp), ("LM1", 0, N), ("GRF0", 0, N // pes))
    b.matmul("float32", M, kp * pes, N, ("LM0", 0, kp), ("LM1", 0, kp), ("GRF1", 0, N // pes), trans_b=True,
             accumulate=True)
    program = b.build()
    whole, reference = _machine("mini", seed=5), _machine("mini", seed=5)
    whole.run(program, mode="functional")
    assert [r.mem for r in whole.replicas.ranges] == [whole.params.memory_id(replicated)], "read where it lies"
    _one_by_one(reference, program)
    for name in ("GRF0", "GRF1", replicated):
        np.testing.assert_array_equal(whole.memory(name), reference.memory(name), err_msg=name)

"""Data patterns of every transfer mode, reductions included, against numpy on mini and mncore2."""

from __future__ import annotations

import numpy as np
import pytest

import hwdesc
import sim

CHIPS = ["mini", "mncore2"]


def machine(chip: str) -> sim.Machine:
    return sim.Machine(hwdesc.load(chip))


def rows(m: sim.Machine, name: str, dtype=np.float32) -> np.ndarray:
    return m.memory(name).view(dtype)


@pytest.mark.parametrize("chip", CHIPS)
@pytest.mark.parametrize("red, fn", [("add", np.sum), ("max", np.max), ("min", np.min)])
def test_pe_to_l1bm_reduce_over_mabs(chip, red, fn):
    """l1bmr: L1BM LW q = op over the MABs of PE (q mod 4)'s LW (q div 4)."""
    m = machine(chip)
    hw = m.hw
    n_pe, pes, mabs = hw.instances("PE"), hw.fanout("MAB", "PE"), hw.fanout("L1B", "MAB")
    lm = rows(m, "LM0")
    lm[:, :8] = np.random.default_rng(0).standard_normal((n_pe, 8), dtype=np.float32)
    b = sim.ProgramBuilder(m.params)
    n = 4 * pes  # 4 LW from each PE
    b.xfer("reduce", "up", "L1BM", 16, "LM0", 0, n, red=red)
    m.run(b.build())
    per_l1b = lm[:, :8].reshape(hw.instances("L1B"), mabs, pes, 4, 2)  # [L1B, MAB, PE, LW, W]
    expect = fn(per_l1b, axis=1).transpose(0, 2, 1, 3).reshape(hw.instances("L1B"), 2 * n)  # q = LW*4 + PE
    np.testing.assert_allclose(rows(m, "L1BM")[:, 32:32 + 2 * n], expect, rtol=1e-6)


@pytest.mark.parametrize("chip", CHIPS)
def test_l1bm_to_l2bm_reduce_over_l1bs_in_half(chip):
    m = machine(chip)
    hw = m.hw
    codec = sim.MachineParams.from_hw(hw).half
    encode_half, decode_half = codec.encode, codec.decode
    values = np.random.default_rng(1).standard_normal((hw.instances("L1B"), 64)).astype(np.float32)
    rows(m, "L1BM", np.uint16)[:, :64] = encode_half(values)
    b = sim.ProgramBuilder(m.params)
    b.xfer("reduce", "up", "L2BM", 0, "L1BM", 0, 16, red="add", dtype="float16")
    m.run(b.build())
    got = decode_half(rows(m, "L2BM", np.uint16)[:, :64])
    f = hw.fanout("L2B", "L1B")
    expect = decode_half(encode_half(values)).reshape(-1, f, 64)
    acc = expect[:, 0]
    for k in range(1, f):  # the hardware adds L1B by L1B, rounding to half each time
        acc = decode_half(encode_half(acc + expect[:, k]))
    np.testing.assert_array_equal(got, acc)


@pytest.mark.parametrize("chip", CHIPS)
@pytest.mark.parametrize("scope", ["group", "chip"])
def test_mv_reduce_l2bm_to_dram(chip, scope):
    m = machine(chip)
    hw = m.hw
    l2 = rows(m, "L2BM")
    l2[:, :128] = np.random.default_rng(2).standard_normal((hw.instances("L2B"), 128), dtype=np.float32)
    m.grow("DRAM", 1024)
    b = sim.ProgramBuilder(m.params)
    if scope == "group":
        b.mv("reduce", "L2BM", 0, "DRAM", 64, 64, tag=1, red="add")  # every Group: its L2Bs -> its DRAM
    else:
        b.mv("reduce", "L2BM", 0, "DRAM", 64, 64, tag=1, red="max", scope="chip", src_inst=0, dst_inst=0)
    b.wait(1)
    m.run(b.build())
    out = rows(m, "DRAM")[:, 128:256]
    if scope == "group":
        expect = l2[:, :128].reshape(hw.instances("Group"), -1, 128).sum(axis=1)
        np.testing.assert_allclose(out, expect, rtol=1e-5)
    else:
        np.testing.assert_array_equal(out[0], l2[:, :128].max(axis=0))


@pytest.mark.parametrize("chip", CHIPS)
def test_broadcasts_and_individuals(chip):
    m = machine(chip)
    hw = m.hw
    rng = np.random.default_rng(3)
    src = rng.standard_normal((hw.instances("L2B"), 64), dtype=np.float32)
    rows(m, "L2BM")[:, :64] = src
    b = sim.ProgramBuilder(m.params)
    b.xfer("broadcast", "down", "L2BM", 0, "L1BM", 0, 32)  # l2bmb: every L1BM of an L2B gets the same 32 LW
    b.nop(1)
    b.xfer("mab_broadcast", "down", "L1BM", 0, "LM1", 0, 16)  # l1bmm: PE q mod 4 of every MAB, LW q div 4
    b.xfer("broadcast", "down", "L1BM", 0, "GRF0", 0, 2)  # l1bmp: every PE gets 2 LW
    b.nop(2)
    b.xfer("individual", "up", "L1BM", 100, "LM1", 0, 16, index=1)  # l1bmm@1: MAB 1 back to L1BM
    b.nop(3)
    b.xfer("individual", "up", "L2BM", 100, "L1BM", 100, 16, index=hw.fanout("L2B", "L1B") - 1)  # l2bm@last
    m.run(b.build())
    l1b_src = np.repeat(src, hw.fanout("L2B", "L1B"), axis=0)[:, :64]
    np.testing.assert_array_equal(rows(m, "L1BM")[:, :64], l1b_src)
    pe_src = np.repeat(l1b_src, hw.fanout("L1B", "PE"), axis=0)  # each PE's L1B's data
    lw = pe_src[:, :32].reshape(-1, 4, 4, 2)  # [PE, LW q div 4, PE q mod 4, W]
    pe_in_mab = np.arange(hw.instances("PE")) % hw.fanout("MAB", "PE")
    np.testing.assert_array_equal(rows(m, "LM1")[:, :8], lw[np.arange(len(lw)), :, pe_in_mab].reshape(-1, 8))
    np.testing.assert_array_equal(rows(m, "GRF0")[:, :4], pe_src[:, :4])
    np.testing.assert_array_equal(rows(m, "L1BM")[:, 200:232], l1b_src[:, :32])  # MAB 1 had the same 16 LW
    np.testing.assert_array_equal(rows(m, "L2BM")[:, 200:232], src[:, :32])


@pytest.mark.parametrize("chip", CHIPS)
def test_a_broadcast_to_a_subset_of_the_l1bs_writes_only_those(chip):
    """l2bmb@set: the XFER's index is the set of L1Bs as a bit mask; the others keep their words,
    and the transfer takes as long as a broadcast to all of them (its rates are l2bmb's)."""
    m = machine(chip)
    fan = m.hw.fanout("L2B", "L1B")
    src = np.random.default_rng(4).standard_normal((m.hw.instances("L2B"), 64), dtype=np.float32)
    rows(m, "L2BM")[:, :64] = src
    before = np.random.default_rng(5).standard_normal(rows(m, "L1BM")[:, :64].shape, dtype=np.float32)
    rows(m, "L1BM")[:, :64] = before
    chosen = [k for k in range(fan) if k % 3 != 1]  # L1B 0 and every third after it is left out
    b = sim.ProgramBuilder(m.params)
    b.xfer("broadcast", "down", "L2BM", 0, "L1BM", 0, 32, index=sum(1 << k for k in chosen))
    program = b.build()
    m.run(program)
    got = rows(m, "L1BM")[:, :64].reshape(-1, fan, 64)
    expect = before.reshape(-1, fan, 64).copy()
    expect[:, chosen] = src[:, None]
    np.testing.assert_array_equal(got, expect)
    whole = sim.ProgramBuilder(m.params)
    whole.xfer("broadcast", "down", "L2BM", 0, "L1BM", 0, 32)
    rate, step = m.hw.transfers["l2bm_to_l1bm"].modes["broadcast"].src_lw_per_cycle, m.hw.step_cycles
    steps = -(-(32 / rate) // step)  # 32 LW at the L2BM side's rate, in whole PE-stream steps
    assert m.time(program.code).total_cycles == m.time(whole.build().code).total_cycles == steps * step


def in_dram(m: sim.Machine, mode: str, rounds: int, seed: int, room: int) -> tuple[int, int, int, np.ndarray]:
    """(Groups, L2Bs per Group, the mode's chunk, random float32 words) for an MV test moving
    `rounds` rounds of chunks over a Group's L2Bs: the words written at the start of every Group's
    DRAM, which holds `room` times as many."""
    groups = m.hw.instances("Group")
    per = m.hw.instances("L2B") // groups
    chunk = m.hw.transfers["dram_to_l2bm"].modes[mode].chunk_lw
    data = np.random.default_rng(seed).standard_normal((groups, 2 * chunk * per * rounds), dtype=np.float32)
    m.grow("DRAM", room * data.shape[1])
    rows(m, "DRAM")[:, : data.shape[1]] = data
    return groups, per, chunk, data


@pytest.mark.parametrize("chip", CHIPS)
def test_mv_broadcast_distribute_collect(chip):
    m = machine(chip)
    groups, per, chunk, data = in_dram(m, "distribute", 4, seed=4, room=2)
    l2b, n = groups * per, data.shape[1] // 2
    b = sim.ProgramBuilder(m.params)
    b.mv("broadcast", "DRAM", 0, "L2BM", 0, n, tag=1)  # each Group's DRAM -> both its L2Bs
    b.mv("distribute", "DRAM", 0, "L2BM", 1024, n, tag=2)  # chunks round-robin over the Group's L2Bs
    b.wait(2)
    b.mv("collect", "L2BM", 1024, "DRAM", 2 * n, n, tag=3)  # and back
    b.wait(3)
    b.wait(1)
    m.run(b.build())
    l2 = rows(m, "L2BM")
    np.testing.assert_array_equal(l2[:, : 2 * n], np.repeat(data, per, axis=0))
    lw = data.reshape(groups, n // (chunk * per), per, chunk, 2)  # [G, row, L2B, chunk LW, W]
    np.testing.assert_array_equal(l2[:, 2048: 2048 + 2 * n // per], lw.transpose(0, 2, 1, 3, 4).reshape(l2b, -1))
    np.testing.assert_array_equal(rows(m, "DRAM")[:, 4 * n: 6 * n], data)


@pytest.mark.parametrize("chip", CHIPS)
def test_mv_distributed_broadcast_gives_every_group_all_groups_data(chip):
    """mvb4: Group g's chunk j lands in local L2B j mod P of every Group, at chunk G*(j div P) + g."""
    m = machine(chip)
    groups, per, chunk, data = in_dram(m, "distributed_broadcast", 3, seed=5, room=1)
    n = data.shape[1] // 2
    b = sim.ProgramBuilder(m.params)
    b.mv("distributed_broadcast", "DRAM", 0, "L2BM", 64, n, tag=1, scope="chip")
    b.wait(1)
    m.run(b.build())
    got = rows(m, "L2BM")[:, 128: 128 + 2 * n * groups // per].reshape(groups, per, n // (chunk * per), groups,
                                                                        2 * chunk)  # [G', L2B, round, G, chunk]
    sent = data.reshape(groups, n // (chunk * per), per, 2 * chunk)  # [G, round, local L2B, chunk]
    for g_to in range(groups):
        np.testing.assert_array_equal(got[g_to], sent.transpose(2, 1, 0, 3))
    assert not rows(m, "L2BM")[:, :128].any() and not rows(m, "L2BM")[:, 128 + 2 * n * groups // per:].any()


def test_host_dma_round_trip(mini):
    m = sim.Machine(mini)
    host_in = np.arange(256, dtype=np.uint32)
    host_out = np.zeros(256, dtype=np.uint32)
    b = sim.ProgramBuilder(m.params)
    b.host_dma(True, 0, 0, 0, 128, tag=1)
    b.wait(1)
    b.mv("individual", "PDM", 0, "DRAM", 0, 128, tag=2, src_inst=0, dst_inst=0)
    b.wait(2)
    b.mv("individual", "DRAM", 0, "PDM", 256, 128, tag=3, src_inst=0, dst_inst=0)
    b.wait(3)
    b.host_dma(False, 256, 1, 0, 128, tag=4)
    b.wait(4)
    stats = m.run(b.build(), host=[host_in, host_out])
    np.testing.assert_array_equal(host_out, host_in)
    link = mini.transfers["host_to_pdm"]
    rate = link.modes["individual"].src_lw_per_cycle
    assert stats.host_busy == 2 * int(128 / rate)  # data cycles; each DMA also waits the latency
    assert stats.total_cycles > 2 * link.latency_cycles


@pytest.mark.parametrize("chip", CHIPS)
def test_moves_large_enough_to_split_by_group_between_threads(chip):
    """A run of Group-local moves of at least SHARED_WORDS is split between the host's threads,
    each running every instruction for its own Groups: each instance still gets its own data.
    DRAM -> L2BM in every Group, L1BM -> LM1 dealt one long word per PE, and back up by collect.
    (mini has one Group: there it checks the same run on one thread.)"""
    from sim.functional import SHARED_WORDS
    from sim.moves import group_local
    m = machine(chip)
    hw = m.hw
    l1b, pe, groups = hw.instances("L1B"), hw.instances("PE"), hw.instances("Group")
    fan = pe // l1b
    n = m.memory("L1BM").shape[1] // 4 // fan * fan  # long words per L1BM: the source and the collect's copy
    big = m.memory("L2BM").shape[1] // 2  # long words the MV moves in each Group: all of L2BM
    rng = np.random.default_rng(7)
    dram = rng.standard_normal((groups, 2 * big), dtype=np.float32)
    m.grow("DRAM", big)
    rows(m, "DRAM")[:, :2 * big] = dram
    src = rng.standard_normal((l1b, 2 * n), dtype=np.float32)
    rows(m, "L1BM")[:, :2 * n] = src
    b = sim.ProgramBuilder(m.params)
    b.mv("individual", "DRAM", 0, "L2BM", 0, big, tag=1)
    b.xfer("distribute", "down", "L1BM", 0, "LM1", 0, n)
    b.nop(2)
    b.xfer("collect", "up", "L1BM", n, "LM1", 0, n)
    b.wait(1)
    program = b.build()
    local, words = group_local(program.code, m.params.mem_instances, groups, 2)
    assert local.all()
    if chip == "mncore2":
        assert groups > 1 and words.sum() >= SHARED_WORDS
    m.run(program)
    per = hw.instances("L2B") // groups
    np.testing.assert_array_equal(rows(m, "L2BM")[::per, :2 * big], dram)  # the first L2B of each Group
    dealt = src.reshape(l1b, n // fan, fan, 2).transpose(0, 2, 1, 3).reshape(pe, -1)  # LW q: PE q mod fan, q div fan
    np.testing.assert_array_equal(rows(m, "LM1")[:, :2 * n // fan], dealt)
    np.testing.assert_array_equal(rows(m, "L1BM")[:, 2 * n:4 * n], src)


def test_moves_between_groups_are_not_group_local(mncore2):
    """An MV naming an instance (Group 0's PDM to every Group's DRAM: the host link's path) or
    reaching the whole chip crosses Groups: a run holding one is not split."""
    from sim.moves import group_local
    m = sim.Machine(mncore2)
    b = sim.ProgramBuilder(m.params)
    b.mv("individual", "DRAM", 0, "L2BM", 0, 8, tag=1)
    b.mv("individual", "PDM", 0, "DRAM", 0, 8, src_inst=0, tag=2)
    b.mv("broadcast", "DRAM", 0, "L2BM", 0, 8, scope="chip", tag=3)
    b.mv("distribute", "DRAM", 0, "L2BM", 0, 8, tag=4)
    b.xfer("broadcast", "down", "L2BM", 0, "L1BM", 0, 8)
    b.nop(1)
    local, words = group_local(b.build().code, m.params.mem_instances, mncore2.instances("Group"), 2)
    assert local.tolist() == [True, False, False, True, True, True]
    assert words.tolist()[:2] == [8 * 2 * 4, 8 * 2] and words[-1] == 0


@pytest.mark.parametrize("chip", CHIPS)
def test_moves_on_long_word_items_equal_moves_on_words(chip):
    """`execute_moves` runs on uint64 views (one long word an item) when the addresses allow: the
    copying MV and XFER modes, both directions, leave every memory as they do on 32-bit words."""
    from sim.functional import stepped_rows
    from sim.moves import LW_ITEM, execute_moves, long_word_aligned
    m = machine(chip)
    p = m.params
    wpl, fan = p.words_per_lw, m.hw.fanout("L1B", "PE")  # PEs a long word of L1BM is dealt over
    rng = np.random.default_rng(11)
    m.grow("DRAM", 4096)
    for name in ("DRAM", "L2BM", "L1BM", "LM0"):
        m.memory(name)[:] = rng.integers(0, 1 << 32, m.memory(name).shape, dtype=np.uint32)
    b = sim.ProgramBuilder(p)
    b.mv("individual", "DRAM", 0, "L2BM", 0, 64, tag=1)
    b.mv("distribute", "DRAM", 512, "L2BM", 256, 64, tag=2)
    b.mv("broadcast", "DRAM", 1024, "L2BM", 512, 16, tag=3)
    b.mv("collect", "L2BM", 256, "DRAM", 2048, 64, tag=4)
    b.wait(1)
    b.xfer("distribute", "down", "L2BM", 0, "L1BM", 64, 64)
    b.xfer("broadcast", "down", "L2BM", 512, "L1BM", 256, 16)
    b.xfer("distribute", "down", "L1BM", 0, "LM0", 6, 4 * fan)
    b.xfer("collect", "up", "L1BM", 512, "LM0", 2, 2 * fan)
    b.wait(2)
    b.wait(3)
    b.wait(4)
    code = b.build().code
    assert not stepped_rows(code) and long_word_aligned(code, p.mem_lw_addressed, wpl).all()
    words = [r.copy() for r in m._rows]
    items = [r.copy() for r in m._rows]
    args = (p.mem_instances, p.mem_lw_addressed, p.n_groups, p.path_of, p.path_group, p.mode_chunk, wpl)
    execute_moves(code, 0, len(code), tuple(words), *args, 1, 0, p.n_groups)
    execute_moves(code, 0, len(code), tuple(r.view(LW_ITEM[wpl]) for r in items), *args, wpl, 0, p.n_groups)
    for name, w, i in zip(p.memory_names, words, items):
        np.testing.assert_array_equal(w, i, err_msg=name)
    assert any(not np.array_equal(w, r) for w, r in zip(words, m._rows))  # the moves moved something


def test_a_move_at_an_odd_word_address_is_not_long_word_aligned(mini):
    """A word-addressed memory's address that splits a long word keeps its run on 32-bit words."""
    from sim import isa
    from sim.moves import long_word_aligned
    p = sim.Machine(mini).params
    b = sim.ProgramBuilder(p)
    b.xfer("distribute", "down", "L1BM", 0, "LM0", 4, 16)
    b.xfer("distribute", "down", "L1BM", 0, "LM0", 6, 16)
    code = b.build().code.copy()
    code[1, isa.X_LO_ADDR] = 5  # past the validator, which refuses it
    assert long_word_aligned(code, p.mem_lw_addressed, 2).tolist() == [True, False]

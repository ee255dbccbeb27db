"""Staging: block copies between DRAM and LM layouts, checked on the simulator and against PFN."""

from __future__ import annotations

import numpy as np
import pytest

import hwdesc
import sim
from compiler.errors import LayoutError
from compiler.layout import Placement, parse
from compiler.layout.candidates import candidates
from compiler.layout.hostio import gather, scatter
from compiler.transfer.gather import lw_sources
from compiler.transfer.staging import Transit, emit_download, emit_upload, pieces, stage


@pytest.mark.parametrize("lm, dram", [
    ("((8_L2B:1, 4:2, 8_L1B:1), (2:1, 4_PE:1, 2_W:1))", "((4_L2B:2, 64:8), (8:1, 2_W:1))"),  # L5 from D6
    ("((8_L2B:1, 16:2, 8_L1B:1), (2:1, 4_PE:1, 2_W:1))", "((4_L2B:2, 256:8), (8:1, 2_W:1))"),  # L4 from D7
    ("((4_L2B:2, 64:2), (2:1, 4_PE:1, 2_W:1))", "((4_L2B:2, 64:8), (8:1, 2_W:1))"),  # L7 ("PE") from D6
    ("((8_L2B:1, 32:2), (2:1, 4_PE:1, 2_W:1))", "((4_L2B:2, 64:8), (8:1, 2_W:1))"),  # L8 ("L2B") from D6
])
def test_dram_images_are_pfns_dl_sources(mncore2, lm, dram):
    """PFN's educational compiler downloads these LM layouts from these DRAM layouts with mvp,
    l2bmd/l2bmb and l1bmm (layout_notation.md 7.5): our staging finds the same DRAM layouts."""
    st = stage(Placement(parse(lm), mncore2, "LM0", "float32"))
    assert st.dram.layout == parse(dram).with_shape(st.dram.layout.shape)
    assert st.pe_mode == "mab_broadcast"


def transit_for(hw: hwdesc.HwDesc) -> Transit:
    l2, l1 = hw.memory_lw("L2BM") // 2, hw.memory_lw("L1BM") // 2
    return Transit((0, l2), (0, l1), l2, l1, (1, 2))


def staged_candidates(hw, shape, dtype="float32", limit=6):
    for c in candidates(shape, dtype, hw, "LM0")[:limit]:
        try:
            yield stage(Placement(c.layout, hw, "LM0", dtype))
        except LayoutError:
            continue


@pytest.mark.parametrize("chip", ["mini", "mncore2"])
@pytest.mark.parametrize("shape", [(32, 64), (256, 16), (3, 4), (2, 3, 8, 8), (64, 96)])
def test_download_then_upload_round_trips(chip, shape):
    hw = hwdesc.load(chip)
    rng = np.random.default_rng(0)
    for st in staged_candidates(hw, shape):
        machine = sim.Machine(hw)
        src, dst = machine.alloc_dram(st.dram_lw), machine.alloc_dram(st.dram_lw)
        x = rng.standard_normal(shape, dtype=np.float32)
        scatter(st.dram, x, machine.memory("DRAM"), src)
        b = sim.ProgramBuilder(machine.params)
        emit_download(b, st, dram=src, lm_mem="LM1", lm_word=8, transit=transit_for(hw))
        machine.run(b.build())
        got = gather(st.lm, machine.memory("LM1"), 4, check_replicas=True)  # word 8 = long word 4
        np.testing.assert_array_equal(got.view(np.float32), x, err_msg=str(st.lm.layout))
        if st.pe_mode == "broadcast":
            continue
        b = sim.ProgramBuilder(machine.params)
        emit_upload(b, st, dram=dst, lm_mem="LM1", lm_word=8, transit=transit_for(hw))
        machine.run(b.build())
        np.testing.assert_array_equal(gather(st.dram, machine.memory("DRAM"), dst).view(np.float32), x)


def test_large_tensors_move_in_double_buffered_pieces(mncore2):
    st = next(staged_candidates(mncore2, (1024, 1024), limit=1))
    small = Transit((0, 2048), (0, 1024), 2048, 1024, (1, 2))
    machine = sim.Machine(mncore2)
    src = machine.alloc_dram(st.dram_lw)
    x = np.random.default_rng(1).standard_normal((1024, 1024), dtype=np.float32)
    scatter(st.dram, x, machine.memory("DRAM"), src)
    b = sim.ProgramBuilder(machine.params)
    emit_download(b, st, dram=src, lm_mem="LM0", lm_word=0, transit=small)
    program = b.build()
    stats = machine.run(program)
    np.testing.assert_array_equal(gather(st.lm, machine.memory("LM0")).view(np.float32), x)
    n_pieces = len(pieces(st, small))
    assert n_pieces > 1 and stats.instructions["MV"] == n_pieces * len(st.l2_locals)
    mv = mncore2.transfers["dram_to_l2bm"].modes["individual"]
    data_cycles = st.dram_lw / mv.src_lw_per_cycle
    assert data_cycles <= stats.total_cycles < 1.5 * data_cycles  # the Data Engines are the bottleneck, kept busy


@pytest.mark.parametrize("chip", ["mini", "mncore2"])
def test_a_block_per_l1b_delivers_what_dealt_chunks_do(chip):
    """`blocks`: the L2B holds each L1B's long words as one block (L1B k's from n_l1 * k), each
    sent to its L1B alone (l2bmb@set), piece by piece through small transit buffers: LM ends
    with the same tensor as through l2bmd's chunks. Only fetches stage so: an upload is refused."""
    hw = hwdesc.load(chip)
    fan = hw.fanout("L2B", "L1B")
    rng = np.random.default_rng(2)
    tried = 0
    for dealt in staged_candidates(hw, (64, 96), limit=12):
        if dealt.l1_mode != "distribute":
            continue
        st = stage(dealt.lm, blocks=True)
        assert st.l1_mode == "blocks" and st.n_l2 == st.n_l1 * fan
        if st.span < 2:
            continue  # one LM long word per PE: a single piece
        l1 = st.per_lm_lw * (st.span // 2)  # room for half the slice: two pieces or more
        small = Transit((0, l1 * fan), (0, l1), l1 * fan, l1, (1, 2))
        assert len(pieces(st, small)) > 1
        machine = sim.Machine(hw)
        src = machine.alloc_dram(st.dram_lw)
        x = rng.standard_normal((64, 96), dtype=np.float32)
        scatter(st.dram, x, machine.memory("DRAM"), src)
        b = sim.ProgramBuilder(machine.params)
        emit_download(b, st, dram=src, lm_mem="LM0", lm_word=0, transit=small)
        program = b.build()
        machine.run(program)
        np.testing.assert_array_equal(gather(st.lm, machine.memory("LM0")).view(np.float32), x, str(st.lm.layout))
        code = program.code
        sets = code[(code[:, 0] == sim.isa.Op.XFER) & (code[:, sim.isa.X_MODE] == sim.isa.Mode.broadcast),
                    sim.isa.X_INDEX]
        assert sets.tolist() == [1 << k for k in range(fan)] * len(pieces(st, small))
        # each piece's broadcasts wait for its data first: a WAIT since the piece before's last one
        at = np.flatnonzero((code[:, 0] == sim.isa.Op.XFER) & (code[:, sim.isa.X_MODE] == sim.isa.Mode.broadcast))
        waits = np.flatnonzero(code[:, 0] == sim.isa.Op.WAIT)
        for first, before in zip(at[::fan], [-1, *at[fan - 1::fan]]):
            assert ((waits > before) & (waits < first)).any()
        with pytest.raises(LayoutError, match="block per L1B, for fetches only"):
            emit_upload(sim.ProgramBuilder(machine.params), st, dram=src, lm_mem="LM0", lm_word=0, transit=small)
        tried += 1
    assert tried


def test_layouts_no_mode_can_feed(mncore2):
    with pytest.raises(LayoutError, match="broadcast over PE but placed over MAB"):
        stage(Placement(parse("((3_MAB:1), (2_L1B:1, 2_W:1))"), mncore2, "LM0", "float32"))


@pytest.mark.parametrize("lm, image_copies", [
    ("((4_L2B:2, 16:2), (4_PE:1, 2:1, 2_W:1); B@[2_L2B:1])", ""),  # copies on both L2Bs of a Group
    ("((2_L2B:1, 16:2), (4_PE:1, 2:1, 2_W:1); B@[4_L2B:2])", "B@[L2B]"),  # copies in every Group's DRAM
    ("((2_L2B:4, 16:2), (4_PE:1, 2:1, 2_W:1); B@[2_L2B:2])", "B@[2_L2B:2]"),  # in every other Group
])
def test_copies_over_l2bs_download_into_every_copy(mncore2, lm, image_copies):
    st = stage(Placement(parse(lm), mncore2, "LM0", "float32"))
    assert str(st.dram.layout).endswith(image_copies + ")")
    machine = sim.Machine(mncore2)
    src = machine.alloc_dram(st.dram_lw)
    x = np.random.default_rng(2).standard_normal(st.lm.layout.shape, dtype=np.float32)
    scatter(st.dram, x, machine.memory("DRAM"), src)
    b = sim.ProgramBuilder(machine.params)
    emit_download(b, st, dram=src, lm_mem="LM0", lm_word=0, transit=transit_for(mncore2))
    machine.run(b.build())
    got = gather(st.lm, machine.memory("LM0"), check_replicas=True)  # every copy holds the values
    np.testing.assert_array_equal(got.view(np.float32), x)


def test_partial_sums_over_a_groups_l2bs_are_added_on_upload(mncore2):
    """An upload with `reduce`: the copies of each element on the L2Bs of a Group hold partial
    sums (a product whose L2Bs split K); an MV reduce adds them on the way to DRAM."""
    st = stage(Placement(parse("((4_L2B:2, 16:2), (4_PE:1, 2:1, 2_W:1); B@[2_L2B:1])"), mncore2, "LM0", "float32"))
    machine = sim.Machine(mncore2)
    src, dst = machine.alloc_dram(st.dram_lw), machine.alloc_dram(st.dram_lw)
    x = np.random.default_rng(3).standard_normal(st.lm.layout.shape, dtype=np.float32)
    scatter(st.dram, x, machine.memory("DRAM"), src)
    b = sim.ProgramBuilder(machine.params)
    emit_download(b, st, dram=src, lm_mem="LM0", lm_word=0, transit=transit_for(mncore2))
    emit_upload(b, st, dram=dst, lm_mem="LM0", lm_word=0, transit=transit_for(mncore2), reduce=True)
    machine.run(b.build())
    np.testing.assert_allclose(gather(st.dram, machine.memory("DRAM"), dst).view(np.float32), 2 * x, rtol=1e-6)
    plain = stage(Placement(parse("((4_L2B:2, 16:2), (4_PE:1, 2:1, 2_W:1))"), mncore2, "LM0", "float32"))
    with pytest.raises(LayoutError, match="not copied over every L2B of a Group; there is nothing to reduce"):
        emit_upload(sim.ProgramBuilder(machine.params), plain, dram=dst, lm_mem="LM0", lm_word=0,
                    transit=transit_for(mncore2), reduce=True)


def test_copies_that_cross_a_group_boundary_are_refused(mncore2):
    """Local L2B 1 copied by offset 3 lands on L2B 4, in another Group and at another local
    position: neither an MV inside a Group nor a copy of the Group's DRAM image sends it there."""
    with pytest.raises(LayoutError, match=r"copies of the L2Bs at local positions \[0, 1\] by offsets \[0, 3\] "
                                          r"cross a Group boundary"):
        stage(Placement(parse("((2_L2B:1, 16:2), (4_PE:1, 2:1, 2_W:1); B@[2_L2B:3])"), mncore2, "LM0", "float32"))


@pytest.mark.parametrize("lm", [
    "(8, 1)/((8_L1B:1), (1:1); B@[W])",  # every PE of an L1B gets the same long word (l1bmp)
    "(16,)/((8_L1B:1, 1_PE:1, 2_W:1))",  # one PE of each MAB (l1bmm)
])
def test_downloads_write_nothing_past_the_lm_region(mncore2, lm):
    """The L1BM range of a staging is padded to whole l2bm chunks, but the PE hop must move only the
    layout's own long words: what follows the region in LM is another operand's."""
    st = stage(Placement(parse(lm), mncore2, "LM0", "float32"))
    machine = sim.Machine(mncore2)
    src = machine.alloc_dram(max(st.dram_lw, 64))
    x = np.arange(st.lm.layout.numel, dtype=np.float32).reshape(st.lm.layout.shape)
    scatter(st.dram, x, machine.memory("DRAM"), src)
    lm = machine.memory("LM0").view(np.float32)
    lm[:] = -7.0
    b = sim.ProgramBuilder(machine.params)
    emit_download(b, st, dram=src, lm_mem="LM0", lm_word=0, transit=transit_for(mncore2))
    machine.run(b.build())
    words = st.span * machine.params.words_per_lw
    assert (lm[:, words:] == -7.0).all()
    np.testing.assert_array_equal(gather(st.lm, machine.memory("LM0")).view(np.float32), x)


SPREAD = "((2_L2B:1, 512:2), (4_PE:1, 2:1, 2_W:1); B@[4_L2B:2])"  # each L2B of a Group its own rows, every Group alike


def test_a_layout_copied_over_every_group_is_spread_over_their_drams(mncore2):
    """Copied over the four Groups, each of a Group's two L2Bs holding its own rows, and asked
    for (`spread`, what the host writes): the image is not kept whole in every Group's DRAM but
    spread over them, a quarter each, and one distributed broadcast (mvb4) a piece brings every
    Group all of it. Worked by hand from `_spread`'s pattern (16-LW blocks, L2BM long word t of
    local L2B c from Group (t div 16) mod 4 at 16 (2 (t div 64) + c) + t mod 16) on the LM digits:
    rows 512 x 2 LW at 4 PEs a long word make t = 8 r + 4 q + pe. Without `spread`, or when the
    saving is below a DRAM latency (2 x 4,096 / 16 - 4,096 / 16 = 256 cycles here, 32 for 64 rows),
    the image is the whole copy in every Group."""
    st = stage(Placement(parse(SPREAD), mncore2, "LM0", "float32"), spread=True)
    assert st.spread and st.image_lw == st.n_l2 * 2 // 4
    assert st.dram.layout == parse("((2:16, 64:32, 4_L2B:2, 2:8), (4:1, 2:4, 2_W:1))").with_shape((1024, 16))
    assert not stage(Placement(parse(SPREAD), mncore2, "LM0", "float32")).spread
    assert not stage(Placement(parse(SPREAD.replace("512:2", "64:2")), mncore2, "LM0", "float32"), spread=True).spread
    machine = sim.Machine(mncore2)
    src, dst = machine.alloc_dram(st.dram_lw), machine.alloc_dram(st.dram_lw)
    x = np.random.default_rng(6).standard_normal((1024, 16), dtype=np.float32)
    scatter(st.dram, x, machine.memory("DRAM"), src)
    down, up = sim.ProgramBuilder(machine.params), sim.ProgramBuilder(machine.params)
    emit_download(down, st, dram=src, lm_mem="LM1", lm_word=0, transit=transit_for(mncore2))
    emit_upload(up, st, dram=dst, lm_mem="LM1", lm_word=0, transit=transit_for(mncore2))
    down, up = down.build(), up.build()
    read = machine.run(down)
    machine.run(up)
    np.testing.assert_array_equal(gather(st.lm, machine.memory("LM1"), check_replicas=True).view(np.float32), x)
    np.testing.assert_array_equal(gather(st.dram, machine.memory("DRAM"), dst).view(np.float32), x)
    modes = [[sim.Mode(int(r[sim.isa.MV_MODE])).name for r in p.code if r[0] == sim.Op.MV] for p in (down, up)]
    assert modes == [["distributed_broadcast"], ["collect"] * (4 * st.n_l2 // 64)]  # up: each Group its blocks
    # each Group reads its quarter at the DRAM-side rate: 8 LW/cycle, 2,048 / 8 cycles on every Data Engine
    rate = mncore2.transfers["dram_to_l2bm"].modes["distributed_broadcast"].src_lw_per_cycle
    assert list(read.engine_busy) == [st.image_lw / rate] * 4 == [256] * 4


def test_a_gather_into_a_spread_image_lands_every_block(mncore2):
    """A tensor stored otherwise (row-major in Group 0's DRAM) gathered into a spread staging:
    each 16-LW block of every L2B comes from the runs the spread image would hold there."""
    st = stage(Placement(parse(SPREAD), mncore2, "LM0", "float32"), spread=True)
    held = Placement(parse("(1024, 16)/((1024:8), (8:1, 2_W:1))"), mncore2, "DRAM", "float32")
    machine = sim.Machine(mncore2)
    src = machine.alloc_dram(held.layout.numel)
    x = np.random.default_rng(7).standard_normal((1024, 16), dtype=np.float32)
    scatter(held, x, machine.memory("DRAM"), src)
    b = sim.ProgramBuilder(machine.params)
    emit_download(b, st, dram=src, lm_mem="LM0", lm_word=0, transit=transit_for(mncore2),
                  source=(lw_sources(st.dram, held), src, None))
    machine.run(b.build())
    np.testing.assert_array_equal(gather(st.lm, machine.memory("LM0"), check_replicas=True).view(np.float32), x)

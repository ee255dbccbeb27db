"""Bad instructions raise SimError naming the instruction; a failed run leaves the machine usable."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

import hwdesc
import sim
from sim import DeviceMemoryError, SimError


def builder(m: sim.Machine) -> sim.ProgramBuilder:
    return sim.ProgramBuilder(m.params)


def fails(m: sim.Machine, build, match: str, index: int) -> SimError:
    b = builder(m)
    build(b)
    with pytest.raises(SimError, match=match) as info:
        m.run(b.build())
    assert info.value.index == index
    return info.value


def test_address_out_of_range_names_the_instruction(mini):
    m = sim.Machine(mini)
    lm_words = mini.memory_words("LM0")
    e = fails(m, lambda b: (b.nop(1), b.vop("add", "float32", 1, 16, ("LM0", lm_words - 8, 0, 1), ("LM0", 0, 0, 1),
                                               ("LM1", 0, 0, 1))),
              rf"operand dst elements {lm_words - 8}..{lm_words + 7} are outside LM0 \(0..{lm_words - 1} float32", 1)
    assert "instruction #1 (VOP add.float32 1x16 LM0[1016:0,1]" in str(e)
    l2 = mini.memory_lw("L2BM")
    fails(m, lambda b: b.mv("individual", "DRAM", 0, "L2BM", l2 - 8, 64, tag=1),
          rf"destination long words {l2 - 8}..{l2 + 55} are outside L2BM", 0)


def test_mode_the_path_does_not_offer(mini):
    m = sim.Machine(mini)
    fails(m, lambda b: b.mv("reduce", "DRAM", 0, "L2BM", 0, 64, tag=1, red="add"),
          "path dram_to_l2bm does not offer mode reduce; it offers individual, broadcast, distribute", 0)
    fails(m, lambda b: b.mv("individual", "L1BM", 0, "DRAM", 0, 64, tag=1), "mini has no transfer path from L1BM to DRAM", 0)


def test_a_subset_only_where_the_broadcast_offers_one(mini):
    """l2bmb@set names L1Bs by a bit mask; l1bmp (L1BM -> PE) has no subset form in the YAML."""
    m = sim.Machine(mini)
    fan = mini.fanout("L2B", "L1B")
    fails(m, lambda b: b.xfer("broadcast", "down", "L2BM", 0, "L1BM", 0, 8, index=1 << fan),
          rf"index {1 << fan} is no subset of the {fan} children \(a bit mask below {1 << fan}\)", 0)
    fails(m, lambda b: b.xfer("broadcast", "down", "L1BM", 0, "LM0", 0, 2, index=1),
          r"index 1: l1bm_to_pe's broadcast cannot name a subset of its children "
          r"\(transfers.l1bm_to_pe.modes.broadcast.subsets\)", 0)


def test_a_variant_without_a_mode(tmp_path, mini):
    path = tmp_path / "nobcast.yaml"
    path.write_text(textwrap.dedent("""
        extends: mini
        name: nobcast
        transfers:
          l1bm_to_pe:
            modes:
              broadcast: ~
        """))
    m = sim.Machine(hwdesc.load(path))
    fails(m, lambda b: b.xfer("broadcast", "down", "L1BM", 0, "LM0", 0, 2),
          "path l1bm_to_pe does not offer mode broadcast; it offers mab_broadcast, distribute", 0)


def test_misaligned_operand(mini):
    m = sim.Machine(mini)
    fails(m, lambda b: b.xfer("distribute", "down", "L1BM", 0, "LM0", 3, 8),
          "word address 3 of LM0 is not long-word aligned", 0)
    fails(m, lambda b: b.xfer("distribute", "down", "L2BM", 0, "L1BM", 0, 24),
          "n=24 must be a multiple of chunk 8 x 2 children for distribute", 0)


def test_wait_on_a_tag_never_issued(mini):
    m = sim.Machine(mini)
    fails(m, lambda b: (b.mv("individual", "DRAM", 0, "L2BM", 0, 64, tag=1), b.wait(2)),
          "WAIT on tag 2, which no earlier MV or HOST_DMA carries", 1)
    fails(m, lambda b: b.mv("individual", "DRAM", 0, "L2BM", 0, 64, tag=64), r"tag 64 is outside 1..63", 0)


def test_matmul_shape_rules(mini):
    m = sim.Machine(mini)
    fails(m, lambda b: b.matmul("float32", 8, 6, 8, ("LM0", 0, 2), ("LM1", 0, 8), ("GRF0", 0, 2)),
          "K, N multiples of the 4 PEs of a MAB", 0)
    fails(m, lambda b: b.matmul("float32", 8, 8, 8, ("DRAM", 0, 2), ("LM1", 0, 8), ("GRF0", 0, 2)),
          "operand A must be in a PE memory, not DRAM", 0)


def test_failed_run_leaves_the_machine_usable(mini):
    m = sim.Machine(mini)
    m.memory("LM0").view(np.float32)[:, :4] = 2.0
    before = [mem.copy() for mem in m.memories]
    b = builder(m)
    b.vop("add", "float32", 1, 4, ("LM1", 0, 0, 1), ("LM0", 0, 0, 1), ("LM0", 0, 0, 1))
    b.wait(9)
    with pytest.raises(SimError):
        m.run(b.build())
    assert all(np.array_equal(x, y) for x, y in zip(before, m.memories))  # nothing ran
    ok = builder(m)
    ok.vop("add", "float32", 1, 4, ("LM1", 0, 0, 1), ("LM0", 0, 0, 1), ("LM0", 0, 0, 1))
    m.run(ok.build())
    assert (m.memory("LM1").view(np.float32)[:, :4] == 4.0).all()


def test_allocator_runs_out_with_a_clear_message(mini):
    m = sim.Machine(mini)
    assert m.memory("DRAM").shape[1] == 0  # DRAM is not allocated whole
    total = mini.memory_lw("DRAM")
    a = m.alloc_dram(total // 2)
    m.alloc_dram(total // 4)
    with pytest.raises(DeviceMemoryError, match=rf"DRAM: cannot allocate {total // 2} long words; {total // 4} long "
                                                rf"words free in all, largest free region {total // 4} long words"):
        m.alloc_dram(total // 2)
    m.free_dram(a)
    assert m.alloc_dram(total // 2) == a  # freed space is reused
    words = m.memory("DRAM").shape[1]
    assert 2 * m.dram.high_water <= words <= 2 * 2 * m.dram.high_water  # grown (doubling) to the high-water mark


def test_allocator_alignment_and_merging():
    alloc = sim.Allocator("LM0", 100, "words", align=4)
    a, b, c = alloc.alloc(10), alloc.alloc(10), alloc.alloc(10)
    assert (a, b, c) == (0, 12, 24)
    alloc.free(b)
    alloc.free(a)
    assert alloc.alloc(22) == 0  # the two freed regions merged
    with pytest.raises(ValueError, match="not the start of an allocated region"):
        alloc.free(5)


def test_relocatable_buffers_are_checked_at_every_binding(mini):
    m = sim.Machine(mini)
    b = builder(m)
    b.mv("individual", "DRAM", sim.Sym("x") + 64, "L2BM", 0, 64, tag=1)
    b.wait(1)
    program = b.build()
    m.grow("DRAM", 4096)
    m.run(program, bases={"x": 0})
    m.run(program, bases={"x": 1024})  # validated once, bound twice
    assert len(program.validated) == 1
    top = mini.memory_lw("DRAM")
    with pytest.raises(SimError, match=rf"buffer 'x' bound at long word {top - 100} reaches {top + 27}, outside DRAM"):
        m.run(program, bases={"x": top - 100})
    with pytest.raises(SimError, match="no address bound for buffer 'x'"):
        m.run(program, bases={})


def test_each_buffer_reaches_its_farthest_long_word_and_stays_in_one_memory(mini):
    """symbol_extents over buffers whose relocations interleave: each buffer's reach is the end of
    its farthest MV, whichever comes first; a buffer named in two memories is refused at the first
    instruction that names it in the second."""
    from sim.validate import symbol_extents
    m = sim.Machine(mini)
    b = builder(m)
    b.mv("individual", "DRAM", sim.Sym("x") + 64, "L2BM", 0, 64, tag=1)
    b.mv("individual", "DRAM", sim.Sym("y"), "L2BM", 64, 32, tag=1)
    b.mv("individual", "L2BM", 0, "DRAM", sim.Sym("x"), 16, tag=2)
    b.mv("individual", "DRAM", sim.Sym("y") + 8, "L2BM", 128, 8, tag=2)
    b.wait(1)
    b.wait(2)
    program = b.build()
    dram = m.params.memory_id("DRAM")
    assert symbol_extents(m.params, program.code, program.relocs, program.symbols) == {"x": (dram, 128),
                                                                                       "y": (dram, 32)}
    relocs = program.relocs.copy()
    relocs[relocs[:, 0] == 3, 1] = sim.isa.MV_DST_ADDR  # y's second MV as if it wrote L2BM at y
    with pytest.raises(SimError, match="buffer y is addressed in both DRAM and L2BM") as info:
        symbol_extents(m.params, program.code, relocs, program.symbols)
    assert info.value.index == 3


def test_bulk_checked_mvs_report_the_first_bad_instruction(mini):
    """Plain MVs are validated all at once; the error must still be the first bad instruction."""
    m = sim.Machine(mini)
    m.grow("DRAM", 4096)
    l2 = mini.memory_lw("L2BM")

    def build(b, bad_at: int, wait_at: int | None = None):
        for k in range(100):
            if k == wait_at:
                b.wait(7)
            b.mv("individual", "DRAM", k, "L2BM", l2 + 1 if k == bad_at else k, 4, tag=1 if k < 60 else 7)
        b.wait(1)

    fails(m, lambda b: build(b, 57), rf"destination long words {l2 + 1}..{l2 + 4} are outside L2BM", 57)
    # a WAIT on a tag that only a later MV carries
    fails(m, lambda b: build(b, -1, wait_at=30), "WAIT on tag 7, which no earlier MV or HOST_DMA carries", 30)
    b = builder(m)
    build(b, -1)
    assert m.run(b.build()).instructions["MV"] == 100


def test_repeated_rows_are_checked_once_yet_report_where_they_first_fail(mini):
    """The validator checks each distinct row once (a compiled program repeats its rounds); a bad
    row repeated is reported at its first occurrence, and a WAIT is checked where it stands."""
    m = sim.Machine(mini)

    def rounds(b, bad: bool, wait_tag: int = 1):
        for k in range(6):
            b.xfer("distribute", "down", "L1BM", 0, "LM0", 3 if bad and k >= 2 else 0, 8)
            b.mv("individual", "DRAM", 0, "L2BM", 0, 64, tag=1)
            b.wait(wait_tag if k == 4 else 1)

    fails(m, lambda b: rounds(b, True), "word address 3 of LM0 is not long-word aligned", 6)
    fails(m, lambda b: rounds(b, False, wait_tag=2), "WAIT on tag 2, which no earlier MV or HOST_DMA carries", 14)
    b = builder(m)
    rounds(b, False)
    assert m.run(b.build(), mode="timing").instructions["XFER"] == 6


def test_a_builder_refuses_instructions_past_its_limit(mini):
    """A builder with a limit raises InstructionLimit before it holds more instructions than that,
    for single instructions and for a block of MVs alike, and keeps what it had (the planner
    stops emitting a candidate it would not time)."""
    from sim.builder import InstructionLimit
    b = sim.ProgramBuilder(sim.Machine(mini).params, limit=3)
    b.nop(1)
    b.nop(1)
    with pytest.raises(InstructionLimit, match="limit of 3 instructions"):
        b.mv_block("individual", "DRAM", 0, np.arange(2), "L2BM", 0, np.arange(2), np.ones(2, dtype=np.int64),
                   tag=1, src_inst=0, dst_inst=0)
    assert len(b) == 2
    b.nop(1)
    with pytest.raises(InstructionLimit):
        b.nop(1)
    assert len(b) == 3 and len(b.build(hazards=False).code) == 3


def test_an_allocator_fits_only_where_the_aligned_block_does():
    """A free region as large as asked may start where the aligned block no longer fits: `fits`
    answers as `alloc` will (the compiler asked `largest_free` and met DeviceMemoryError)."""
    from sim.alloc import Allocator
    a = Allocator("LM0", 16, "words", align=4)
    a.alloc(3, align=1)  # words 0..2: the free region [3, 16) is 13 words, aligned from 4 only 12
    assert a.largest_free == 13 and not a.fits(13) and a.fits(12)
    with pytest.raises(DeviceMemoryError):
        a.alloc(13)
    assert a.alloc(12) == 4


@pytest.mark.parametrize("order, message", [
    (("vop", "xfer"), r"instruction #2 \(VOP exp.float32 .*\): lacking has no cost for PE op exp \(pe_ops.exp is missing\)"),
    (("xfer", "vop"), r"instruction #2 \(XFER broadcast down .*\): path l1bm_to_pe does not offer mode broadcast"),
])
def test_what_a_candidate_uses_and_the_chip_lacks_is_named_at_its_first_instruction(tmp_path, order, message):
    """`check_offered`, which the planner runs on every candidate it times: among MVs the chip
    offers, the first of a VOP it does not cost and an XFER mode its path does not offer is named
    (validate's message for it), whichever kind comes first."""
    from sim.validate import check_offered
    path = tmp_path / "lacking.yaml"
    path.write_text("extends: mini\nname: lacking\npe_ops:\n  exp: ~\ntransfers:\n  l1bm_to_pe:\n    modes:\n"
                    "      broadcast: ~\n")
    hw = hwdesc.load(path)
    b = sim.ProgramBuilder(sim.Machine(hw).params)
    b.mv("individual", "DRAM", 0, "L2BM", 0, 64, tag=1)
    b.mv("individual", "DRAM", 64, "L2BM", 64, 64, tag=1)
    emit = {"vop": lambda: b.vop("exp", "float32", 1, 2, ("LM0", 0, 0, 1), ("LM0", 0, 0, 1)),
            "xfer": lambda: b.xfer("broadcast", "down", "L1BM", 0, "LM0", 0, 2)}
    for kind in order:
        emit[kind]()
    b.mv("individual", "DRAM", 128, "L2BM", 128, 64, tag=1)
    with pytest.raises(SimError, match=message) as info:
        check_offered(sim.Machine(hw).params, b.build(hazards=False).code)
    assert info.value.index == 2

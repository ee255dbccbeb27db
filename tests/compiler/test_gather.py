"""Long-word gathers between DRAM layouts: conversions, slices, zero padding, lane mismatches."""

from __future__ import annotations

import numpy as np
import pytest

import sim
from compiler.layout import Placement, parse
from compiler.layout.hostio import gather, scatter
from compiler.transfer.gather import LaneMismatch, emit_convert, lw_sources

A = "(64,96)/((4_L2B:2, 16:48), (48:1, 2_W:1))"  # row-major, a quarter of the rows per Group
B = "(64,96)/((8:96, 4_L2B:2, 2:48), (48:1, 2_W:1))"  # pairs of rows round-robin over Groups, same lanes


def convert(hw, src_text, dst_text, x, index=None, dst_shape=None, zeros=False):
    m = sim.Machine(hw)
    src = Placement(parse(src_text), hw, "DRAM", "float32")
    dst = Placement(parse(dst_text), hw, "DRAM", "float32")
    a, b = m.alloc_dram(src.span_lw), m.alloc_dram(dst.span_lw)
    z = m.alloc_dram(dst.span_lw) if zeros else None  # allocations start zeroed
    scatter(src, x, m.memory("DRAM"), a)
    prog = sim.ProgramBuilder(m.params)
    emit_convert(prog, lw_sources(dst, src, index), dst=b, src=a, zeros=z, l2_addr=0, l2_room=hw.memory_lw("L2BM"),
                 tags=(1, 2))
    stats = m.run(prog.build())
    return gather(dst, m.memory("DRAM"), b, check_replicas=True).view(np.float32), stats


def test_conversion_between_distributions(mncore2):
    x = np.random.default_rng(0).standard_normal((64, 96), dtype=np.float32)
    y, stats = convert(mncore2, A, B, x)
    np.testing.assert_array_equal(y, x)
    assert stats.instructions["MV"] > 8  # runs from every Group into every Group
    same, s2 = convert(mncore2, A, A, x)
    np.testing.assert_array_equal(same, x)
    assert s2.instructions["MV"] == 2 * 4  # one run in and one block out per Group
    assert s2.total_cycles < stats.total_cycles


def test_slice_and_zero_padding(mini):
    """rows 1..4 of a (6, 8) tensor into a (5, 8) tensor whose last row is zero padding."""
    x = np.arange(48, dtype=np.float32).reshape(6, 8)
    index = np.full((5, 8), -1)
    index[:4] = np.arange(8, 40).reshape(4, 8)
    y, _ = convert(mini, "(6,8)/((6:4), (4:1, 2_W:1))", "(5,8)/((5:4), (4:1, 2_W:1))", x, index=index, zeros=True)
    np.testing.assert_array_equal(y, np.concatenate([x[1:5], np.zeros((1, 8), np.float32)]))


def test_replicated_destination(mncore2):
    x = np.random.default_rng(1).standard_normal((8, 16), dtype=np.float32)
    y, _ = convert(mncore2, "(8,16)/((4_L2B:2, 2:8), (8:1, 2_W:1))", "(8,16)/((8:8), (8:1, 2_W:1); B@[L2B])", x)
    np.testing.assert_array_equal(y, x)  # every Group's DRAM holds the whole tensor (check_replicas)


def test_lane_changes_are_refused(mini):
    src = Placement(parse("(4,8)/((4:4), (4:1, 2_W:1))"), mini, "DRAM", "float32")
    transposed = Placement(parse("(4,8)/((2:1, 2_W:1), (8:2))"), mini, "DRAM", "float32")
    with pytest.raises(LaneMismatch, match="element 1 sits in lane 0 .* comes from lane 1"):
        lw_sources(transposed, src)

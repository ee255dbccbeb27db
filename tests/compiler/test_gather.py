"""Long-word gathers between DRAM layouts: conversions, slices, zero padding, lane mismatches."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hwdesc
import sim
from compiler.layout import Placement, parse
from compiler.layout.hostio import gather, scatter
from compiler.transfer.gather import LaneMismatch, emit_convert, lw_sources

from .layout_strategies import legal_layouts

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
    assert s2.instructions["MV"] == 2  # one run in and one block out, each an MV in every Group at once
    assert s2.total_cycles < stats.total_cycles


def test_slice_and_zero_padding(mini):
    """rows 1..4 of a (6, 8) tensor into a (5, 8) tensor whose last row is zero padding."""
    x = np.arange(48, dtype=np.float32).reshape(6, 8)
    index = np.full((5, 8), -1)
    index[:4] = np.arange(8, 40).reshape(4, 8)
    y, _ = convert(mini, "(6,8)/((6:4), (4:1, 2_W:1))", "(5,8)/((5:4), (4:1, 2_W:1))", x, index=index, zeros=True)
    np.testing.assert_array_equal(y, np.concatenate([x[1:5], np.zeros((1, 8), np.float32)]))


def test_an_element_map_gather_is_reused_only_for_the_same_map(mini, monkeypatch):
    """Planning asks for one element-map gather many times: the second ask is a cache hit, while
    a map that differs in one element is matched afresh and gives its own runs."""
    from collections import OrderedDict

    import compiler.transfer.gather as gather_module
    monkeypatch.setattr(gather_module, "_CACHE", OrderedDict())  # whatever earlier tests matched
    monkeypatch.setattr(gather_module, "_cached_bytes", [0])
    src = Placement(parse("(6,8)/((6:4), (4:1, 2_W:1))"), mini, "DRAM", "float32")
    dst = Placement(parse("(5,8)/((5:4), (4:1, 2_W:1))"), mini, "DRAM", "float32")
    matched = []
    element_sources = gather_module._element_sources
    monkeypatch.setattr(gather_module, "_element_sources", lambda *a: matched.append(1) or element_sources(*a))
    index = np.full((5, 8), -1)
    index[:4] = np.arange(8, 40).reshape(4, 8)
    first = lw_sources(dst, src, index)
    assert lw_sources(dst, src, index.copy()) is first and len(matched) == 1
    other = index.copy()
    other[0] = np.arange(0, 8)  # row 0 of the source instead of row 1
    runs = lw_sources(dst, src, other)
    assert len(matched) == 2
    assert runs.src.tolist() != first.src.tolist()


def test_replicated_destination(mncore2):
    x = np.random.default_rng(1).standard_normal((8, 16), dtype=np.float32)
    y, _ = convert(mncore2, "(8,16)/((4_L2B:2, 2:8), (8:1, 2_W:1))", "(8,16)/((8:8), (8:1, 2_W:1); B@[L2B])", x)
    np.testing.assert_array_equal(y, x)  # every Group's DRAM holds the whole tensor (check_replicas)


def test_lane_changes_are_refused(mini):
    src = Placement(parse("(4,8)/((4:4), (4:1, 2_W:1))"), mini, "DRAM", "float32")
    transposed = Placement(parse("(4,8)/((2:1, 2_W:1), (8:2))"), mini, "DRAM", "float32")
    with pytest.raises(LaneMismatch, match=r"element \(1, 0\) sits in lane 1 .* comes from lane 0"):
        lw_sources(transposed, src)


def _restrided(layout, order):
    """The layout with its address factors packed in another order (same lanes and axes)."""
    from compiler.layout import Factor, Layout
    addr = [(d, k) for d, dim in enumerate(layout.dims) for k, f in enumerate(dim) if f.axis is None]
    dims = [list(dim) for dim in layout.dims]
    stride = 1
    for i in order:
        d, k = addr[i % len(addr)] if addr else (0, 0)
        if addr and dims[d][k].axis is None and dims[d][k] is layout.dims[d][k]:
            dims[d][k] = Factor(dims[d][k].size, None, stride)
            stride *= dims[d][k].size
    for d, k in addr:  # any factor the order skipped, outermost
        if dims[d][k] is layout.dims[d][k]:
            dims[d][k] = Factor(dims[d][k].size, None, stride)
            stride *= dims[d][k].size
    return Layout.of(dims, layout.shape, layout.broadcast)


@pytest.mark.parametrize("chip", ["mncore2", "mini"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_runs_from_dimension_terms_are_the_element_by_element_runs(chip, dtype, data):
    """The gather the compiler computes from per-dimension terms (no element maps) moves exactly
    what matching every element gives: the same MVs, for every Group and every piece."""
    from compiler.transfer.gather import _element_sources, run_arrays
    from compiler.transfer.separable import separable_sources
    hw = hwdesc.load(chip)
    a = data.draw(legal_layouts(hw, "DRAM", dtype))
    n_addr = sum(f.axis is None for _, f in a.factors)
    order = data.draw(st.permutations(range(max(n_addr, 1))))
    b = _restrided(a, order)
    pa, pb = Placement(a, hw, "DRAM", dtype), Placement(b, hw, "DRAM", dtype)
    for dst, src in ((pa, pb), (pb, pa), (pa, pa)):
        try:
            expected = _element_sources(dst, src, None)
        except LaneMismatch:
            with pytest.raises(LaneMismatch):
                separable_sources(dst, src)
            continue
        got = separable_sources(dst, src)
        if got is None:  # not separable (a non-linear instance map): the element path serves
            assert not (dst.linear and src.linear)
            continue
        piece = data.draw(st.integers(1, max(dst.span_lw, 1)))
        for g in range(dst.instance_count):
            for first in range(0, dst.span_lw, piece):
                for x, y in zip(run_arrays(got, g, first, first + piece), run_arrays(expected, g, first, first + piece)):
                    np.testing.assert_array_equal(x, y)
        padded = got.zero_holes(dst.span_lw + 3), expected.zero_holes(dst.span_lw + 3)
        for g in range(dst.instance_count):
            for x, y in zip(run_arrays(padded[0], g, 0, dst.span_lw + 3), run_arrays(padded[1], g, 0, dst.span_lw + 3)):
                np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("text, shape, run", [
    ("(6,8)/((6:4), (4:1, 2_W:1))", None, 24),  # row-major: rows continue each other, one run
    ("(8,6)/((4:1, 2_W:1), (6:4))", None, 4),  # column-major: read row by row it breaks; a column runs 4
    (A, None, 768),  # 16 rows of 48 long words per Group, then the next Group
])
def test_run_length_of_a_placement_from_its_terms(mncore2, text, shape, run):
    from compiler.transfer.separable import DimTerms
    terms = DimTerms.of(Placement(parse(text), mncore2, "DRAM", "float32"))
    assert terms.run_lw() == run


def test_a_gathers_mvs_keep_every_groups_data_engine_busy(mncore2, monkeypatch):
    """A within-Group row permutation of a (512, 32) tensor: 128 runs of 16 long words per Group.
    The MVs take the four engines in turn, so each engine's queue fills and drains as if it were
    alone. From the YAML: every MV waits the read latency L after its issue and is charged a whole
    unit (d = 64 LW / 16 LW per cycle = 4 cycles); a queue holds Q = 31 MVs, and the stream issues
    the next MV once the oldest is done, so run j of a Group finishes at (j div Q + 1)(L + d) +
    (j mod Q) d while Q d <= L + d. After the last run, one write-back per Group: its latency
    plus 2,048 long words at 16 per cycle. In Group order (each Group's runs after the last's),
    the stream stalled on Group 0's full queue while the others idled. Every Group's runs are
    alike, so each is one MV in every Group at once: the same cycles from a quarter of the MVs."""
    import compiler.transfer.gather as gather_module
    from compiler.chain import Chain

    src = "(512,32)/((4_L2B:2, 128:16), (16:1, 2_W:1))"
    dst = "(512,32)/((4_L2B:2, 64:16, 2:1024), (16:1, 2_W:1))"  # rows 2a + b at 16a + 1024b: runs of one row
    x = np.random.default_rng(0).standard_normal((512, 32), dtype=np.float32)
    y, stats = convert(mncore2, src, dst, x)
    np.testing.assert_array_equal(y, x)
    chain = Chain.of(mncore2)
    down, up = mncore2.transfers[chain.dram_to_l2], mncore2.transfers[chain.l2_to_dram]
    read, write = down.modes["individual"], up.modes["individual"]
    latency, d = down.latency_cycles, -(-read.unit_lw // read.src_lw_per_cycle)
    queue = mncore2.data_engine.queue_depth
    runs, group_lw = 128, 2048
    assert queue * d <= latency + d
    last = runs - 1
    fill = (last // queue + 1) * (latency + d) + (last % queue) * d
    assert stats.instructions["MV"] == runs + 1
    assert stats.total_cycles == fill + up.latency_cycles + group_lw / write.src_lw_per_cycle  # 1,310
    monkeypatch.setattr(gather_module, "in_every_group", lambda n_groups, group, own, key: (
        np.zeros(0, dtype=np.int64), np.arange(len(group))))  # each Group's MVs apart
    y, apart = convert(mncore2, src, dst, x)
    np.testing.assert_array_equal(y, x)
    assert apart.instructions["MV"] == 4 * runs + 1 and apart.total_cycles == stats.total_cycles
    monkeypatch.setattr(gather_module, "engines_in_turn", lambda engine, *_: np.argsort(engine, kind="stable"))
    y, group_order = convert(mncore2, src, dst, x)
    np.testing.assert_array_equal(y, x)
    assert group_order.total_cycles > 2 * stats.total_cycles  # 3,794


def test_a_gather_from_every_groups_dram_keeps_the_engines_side_by_side(mncore2, monkeypatch):
    """Rows split over the Groups in blocks, gathered into rows dealt to the Groups in turn, in
    single long words: every Group reads every Group's DRAM, and an MV from another Group's DRAM
    holds both Groups' engines. Each engine takes its own Group's DRAM first, then the next
    Group's, and a turn visits engines 0, 2, 1, 3, so the MVs side by side hold different engines:
    the gather takes about as long as its busiest engine (3,854 cycles against 3,344 when
    written). Every engine reading the same source Group in a turn (the order before) took about
    twice that (7,522)."""
    import compiler.transfer.gather as gather_module
    src = "(64,32)/((4_L2B:2, 16:16), (16:1, 2_W:1))"
    dst = "(64,32)/((16:16, 4_L2B:2), (4:1, 4:4, 2_W:1))"  # a column's long words 4 apart: runs of one
    x = np.random.default_rng(3).standard_normal((64, 32), dtype=np.float32)
    y, stats = convert(mncore2, src, dst, x)
    np.testing.assert_array_equal(y, x)
    busiest = max(stats.engine_busy)
    assert stats.instructions["MV"] > 64 * 16 and stats.total_cycles < 1.2 * busiest
    order = gather_module.engines_in_turn
    monkeypatch.setattr(gather_module, "engines_in_turn", lambda engine, *_: order(engine))
    y, same_source = convert(mncore2, src, dst, x)
    np.testing.assert_array_equal(y, x)
    assert same_source.total_cycles > 1.8 * stats.total_cycles


def test_a_group_replicated_destination_is_gathered_once_and_copied(mncore2, monkeypatch):
    """Every Group holds the whole destination (B@[L2B]: a tied embedding's weight as its LM head
    reads it), from a source split over the Groups: each Group gathers a quarter of it and writes
    that quarter into every Group's DRAM, instead of each Group gathering all of it. In single
    long words: 2,210 cycles when written, against 13,558 (3,857 MVs) each Group for itself; the
    same data in every copy."""
    from compiler.transfer.sources import LwSources
    src = "(64,32)/((4_L2B:2, 16:16), (16:1, 2_W:1))"
    dst = "(64,32)/((64:16), (4:1, 4:4, 2_W:1); B@[L2B])"  # a column's long words 4 apart: runs of one
    x = np.random.default_rng(3).standard_normal((64, 32), dtype=np.float32)
    y, once = convert(mncore2, src, dst, x)  # (convert checks that every copy holds the same words)
    np.testing.assert_array_equal(y, x)
    monkeypatch.setattr(LwSources, "same_in_every_group", property(lambda self: False))
    y, each = convert(mncore2, src, dst, x)
    np.testing.assert_array_equal(y, x)
    assert each.instructions["MV"] > 3 * 64 * 16 > 3 * once.instructions["MV"]
    assert once.total_cycles < each.total_cycles / 4, (once.total_cycles, each.total_cycles)


def test_mvs_merge_into_one_in_every_group_only_when_every_group_makes_them_alike_from_its_own_dram():
    from compiler.transfer.gather import in_every_group

    group = np.array([0, 1, 2, 3, 0, 1, 2, 0, 1, 2, 3, 3])
    own = np.array([1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 1], dtype=bool)  # row 10 reads another Group's DRAM
    key = np.array([[0, 5, 8, 0, 0]] * 4  # alike in all four Groups: one MV
                   + [[8, 9, 8, 0, 0]] * 3  # missing in Group 3
                   + [[16, 1, 4, 0, 0]] * 4  # Group 3's reads another Group's DRAM
                   + [[24, 2, 4, 0, 1]])  # Group 3 alone
    every, alone = in_every_group(4, group, own, key)
    assert every.tolist() == [0]
    assert alone.tolist() == list(range(4, 12))
    one_group = in_every_group(1, np.zeros(3, dtype=np.int64), np.ones(3, dtype=bool), key[[0, 4, 11]])
    assert one_group[0].tolist() == [0, 1, 2] and one_group[1].tolist() == []


def test_the_gather_cache_keeps_runs_up_to_its_byte_budget(mncore2, monkeypatch):
    """Cached conversions are evicted, least recently used first, once their runs pass
    CACHED_GATHER_BYTES (a large tensor's gather can be gigabytes of runs); the newest stays, and
    an evicted one is computed again, the same."""
    from compiler.transfer import gather as gathers
    monkeypatch.setattr(gathers, "_CACHE", type(gathers._CACHE)())
    monkeypatch.setattr(gathers, "_cached_bytes", [0])
    a, b = (Placement(parse(t), mncore2, "DRAM", "float32") for t in (A, B))
    first = lw_sources(b, a)
    one = first.nbytes
    monkeypatch.setattr(gathers, "CACHED_GATHER_BYTES", one)
    second = lw_sources(a, b)
    assert len(gathers._CACHE) == 1 and lw_sources(a, b) is second  # the newest kept, the older evicted
    assert gathers._cached_bytes[0] == second.nbytes
    again = lw_sources(b, a)
    assert again is not first and np.array_equal(again.src, first.src) and np.array_equal(again.n, first.n)


def test_a_gather_of_too_many_runs_is_refused_naming_its_layouts(mncore2, monkeypatch):
    """A gather whose runs would pass MAX_GATHER_RUNS raises GatherTooLarge (a LayoutError, so the
    planner drops the candidate that needs it) naming both layouts, before its runs are built."""
    from compiler.transfer import gather as gathers
    from compiler.transfer import separable
    monkeypatch.setattr(gathers, "_CACHE", type(gathers._CACHE)())
    monkeypatch.setattr(gathers, "_cached_bytes", [0])
    a, b = (Placement(parse(t), mncore2, "DRAM", "float32") for t in (A, B))
    runs = len(lw_sources(b, a).n)
    gathers._CACHE.clear()
    monkeypatch.setattr(separable, "MAX_GATHER_RUNS", runs - 1)
    with pytest.raises(separable.GatherTooLarge, match=rf"{re.escape(str(a.layout))} into {re.escape(str(b.layout))}: "
                                                       rf"a gather of [\d,]+ runs \(more than {runs - 1:,}\)"):
        lw_sources(b, a)

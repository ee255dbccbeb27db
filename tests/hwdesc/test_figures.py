"""Derived figures of mncore2 and mini, against formulas written out from the YAML numbers."""

from __future__ import annotations

import pytest

import hwdesc
from hwdesc import figures

GIB = 1 << 30


def test_mncore2_counts(mncore2):
    counts = figures.level_counts(mncore2)
    assert counts == {"Group": 4, "L2B": 8, "L1B": 64, "MAB": 1024, "PE": 4096}
    assert mncore2.axes == {"L2B": 8, "L1B": 8, "MAB": 16, "PE": 4}


def test_mncore2_capacities(mncore2):
    assert figures.capacity_total_bytes(mncore2, "DRAM") == 16 * GIB
    # LM 16 KiB x 2 + GRF 2 KiB x 2 per PE; L1BM 64 KiB per L1B; L2BM 256 KiB per L2B; PDM 4 MiB per Group
    by_level = figures.capacity_by_level(mncore2)
    assert by_level["PE"] == 4096 * (2 * 16 + 2 * 2) * 1024 + 4096 * 64
    assert by_level["L1B"] == 64 * 64 * 1024
    assert by_level["L2B"] == 8 * 256 * 1024


@pytest.mark.parametrize("dtype, published_tflops", [
    ("float64", 12.3), ("float32", 49.2), ("pfloat32", 98.3), ("float16", 393.2)])
def test_mncore2_matrix_peaks(mncore2, dtype, published_tflops):
    mode = mncore2.units["MAU"].matrix[dtype]
    by_formula = 2 * mode.rows * mode.cols * mncore2.instances("MAB") * mncore2.clock_hz
    assert figures.peak_flops(mncore2, dtype, "matrix") == by_formula
    assert figures.peak_flops(mncore2, dtype, "matrix") / 1e12 == pytest.approx(published_tflops, rel=2e-3)


def test_mncore2_vector_peaks(mncore2):
    # SDM 2.3: 3.07 / 12.29 / 24.6 TFLOP/s for double / single / half vector mode
    assert figures.peak_flops(mncore2, "float64", "vector") / 1e12 == pytest.approx(3.07, rel=1e-2)
    assert figures.peak_flops(mncore2, "float32", "vector") / 1e12 == pytest.approx(12.29, rel=1e-3)
    assert figures.peak_flops(mncore2, "float16", "vector") / 1e12 == pytest.approx(24.6, rel=1e-2)


def test_mncore2_bandwidths(mncore2):
    lw, f = mncore2.long_word_bytes, mncore2.clock_hz
    assert figures.dram_bandwidth_total(mncore2) == pytest.approx(4 * 128e9, rel=1e-6)
    by_key = {(b.transfer, b.mode): b for b in figures.path_bandwidths(mncore2)}
    mv = by_key["dram_to_l2bm", "individual"]
    assert mv.lw_per_cycle * lw * f == 16 * lw * f == 96e9
    assert mv.engines == 4 and mv.bytes_per_s == 4 * 96e9
    l1bmd = by_key["l1bm_to_pe", "distribute"]
    assert l1bmd.engines == 64 and l1bmd.bytes_per_s == 64 * 64 * lw * f  # 24.6 TB/s, SDM 3.2
    # the way up: 1 LW/cycle from each of an L1B's 64 PEs, 64 LW/cycle into its L1BM
    collect = by_key["pe_to_l1bm", "collect"]
    assert (collect.src_lw_per_cycle, collect.dst_lw_per_cycle, collect.lw_per_cycle) == (1, 64, 64)
    assert collect.engines == 64 and collect.bytes_per_s == 64 * 64 * lw * f
    # a MAB-wide broadcast reads 8 LW/cycle and writes 2 into each of the 4 PEs of a MAB: 8 per engine
    mab = by_key["l1bm_to_pe", "mab_broadcast"]
    assert mab.lw_per_cycle == min(8, 2 * 4)
    # the Data Engine's collect gathers from the Group's 2 L2BMs at 32 each, writes DRAM at 16
    mvc = by_key["l2bm_to_dram", "collect"]
    assert mvc.lw_per_cycle == min(32 * 2, 16)


def test_a_slower_memory_bounds_every_path_through_it(tmp_path):
    """memories.<m>.lw_per_cycle is in force: DRAM at 4 LW/cycle caps its 16 LW/cycle paths, in the
    figures and in the simulator's rates alike."""
    import hwdesc
    import sim
    path = tmp_path / "slowdram.yaml"
    path.write_text("extends: mncore2\nname: slowdram\nmemories:\n  DRAM: {lw_per_cycle: 4}\n")
    hw = hwdesc.load(path)
    by_key = {(b.transfer, b.mode): b for b in figures.path_bandwidths(hw)}
    assert by_key["dram_to_l2bm", "individual"].src_lw_per_cycle == 4
    assert by_key["l2bm_to_dram", "individual"].dst_lw_per_cycle == 4
    assert by_key["l2bm_to_pdm", "individual"].lw_per_cycle == 16  # no DRAM on this path
    p = sim.MachineParams.from_hw(hw)
    k = p.path_names.index("dram_to_l2bm")
    assert p.mode_src_rate[k, sim.Mode.individual] == 4


def test_mini_figures(mini):
    assert figures.level_counts(mini) == {"Group": 1, "L2B": 1, "L1B": 2, "MAB": 4, "PE": 16}
    assert mini.axes == {"L2B": 1, "L1B": 2, "MAB": 2, "PE": 4}
    assert figures.capacity_total_bytes(mini, "DRAM") == 64 << 20
    assert figures.capacity_total_bytes(mini, "LM0") == 16 * 4096
    assert figures.peak_flops(mini, "float32") == 2 * 8 * 4 * 4 * mini.clock_hz
    assert figures.dram_bandwidth_total(mini) == pytest.approx(128e9, rel=1e-6)


def test_elements_per_long_word(mncore2):
    assert [mncore2.elements_per_lw(d) for d in ("float64", "float32", "float16")] == [1, 2, 4]


def test_axis_helpers(mncore2):
    assert mncore2.axis_levels("L2B") == ("Group", "L2B")
    assert mncore2.level_axis_stride("Group") == 2 and mncore2.level_axis_stride("L2B") == 1
    assert mncore2.fanout("L1B", "PE") == 64


def test_roofline_sides_of_a_1024_cubed_product(mncore2):
    """Compute: 1024^3 multiply-adds over 1024 MABs at 8 x 4 (float32) or 16 x 16 (half) per
    cycle. Traffic: A and B read and C written once, 4 Groups x 16 LW x 8 B per cycle each way."""
    n = 1024
    assert figures.matrix_cycles(mncore2, n ** 3, "float32") == n ** 3 / (8 * 4 * 1024) == 32768
    assert figures.matrix_cycles(mncore2, n ** 3, "float16") == 4096
    assert figures.dram_traffic_cycles(mncore2, 2 * n * n * 4, n * n * 4) == 3 * n * n * 4 / (4 * 16 * 8) == 24576


def test_dram_bandwidth_reachable_is_its_fastest_path_within_its_own_rate(mncore2, tmp_path):
    """Doubling memories.DRAM.lw_per_cycle past its paths' rates changed the DRAM bandwidth hw diff
    reported and no cycle count: the reachable figure stays what the simulator can move."""
    assert figures.dram_bandwidth_reachable(mncore2) == pytest.approx(4 * 96e9, rel=1e-6)  # dram_to_l2bm individual
    path = tmp_path / "fast_memory.yaml"
    path.write_text("extends: mncore2\nname: fast_memory\nmemories:\n  DRAM:\n    lw_per_cycle: 64\n")
    fast = hwdesc.load(str(path))
    assert figures.dram_bandwidth_total(fast) > figures.dram_bandwidth_total(mncore2)
    assert figures.dram_bandwidth_reachable(fast) == figures.dram_bandwidth_reachable(mncore2)

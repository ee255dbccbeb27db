"""A hand-written program moves data DRAM -> L2BM -> L1BM -> PE, adds, and moves it back:
right values, and exactly the cycles derived by hand from the YAML numbers."""

from __future__ import annotations

from math import ceil

import numpy as np
import pytest

import hwdesc
import sim

from .programs import Shape, add_pipeline, load_dram


def expected_cycles(hw: hwdesc.HwDesc) -> int:
    """The add pipeline's timeline, step by step, from the YAML values (see sim.isa.TABLE)."""
    s = Shape.of(hw)
    step, gap = hw.step_cycles, hw.hazards

    def steps(cycles: float) -> int:  # PE-stream instructions last whole steps
        return max(1, ceil(ceil(cycles) / step)) * step

    def mv(path: str, n: int) -> tuple[int, int]:  # (latency, data cycles) of one transfer
        t = hw.transfers[path]
        m = t.modes["individual"]
        n = ceil(n / m.unit_lw) * m.unit_lw
        return t.latency_cycles, ceil(max(n / m.src_lw_per_cycle, n / m.dst_lw_per_cycle))

    def xfer(path: str, mode: str, upper_side: int, lower_side: int, down: bool) -> int:
        m = hw.transfers[path].modes[mode]
        src, dst = (upper_side, lower_side) if down else (lower_side, upper_side)
        return steps(max(src / m.src_lw_per_cycle, dst / m.dst_lw_per_cycle))

    (lat_in, data_in), (lat_out, data_out) = mv("dram_to_l2bm", s.n_l2bm), mv("l2bm_to_dram", s.n_l2bm)
    l2_down = xfer("l2bm_to_l1bm", "distribute", s.n_l2bm, s.n_l2bm // s.l1b_per_l2b, True)
    l1_down = xfer("l1bm_to_pe", "distribute", s.n_l1bm, s.n_l1bm // s.pes_per_l1b, True)
    l1_up = xfer("pe_to_l1bm", "collect", s.n_l1bm, s.n_l1bm // s.pes_per_l1b, False)
    l2_up = xfer("l1bm_to_l2bm", "collect", s.n_l2bm, s.n_l2bm // s.l1b_per_l2b, False)
    lanes = hw.units["MAU"].vector["float32"].lanes_per_cycle * step // hw.fanout("MAB", "PE")
    add = ceil(2 * s.per_pe / lanes) * hw.pe_ops["add"].issues * step
    # All 2C transfers are issued at cycle 0; every Group's Data Engine pipelines them: the data of
    # the k-th flows after the latency and after the data of the ones before it.
    x_ready = lat_in + s.l2b_per_group * data_in
    y_ready = lat_in + 2 * s.l2b_per_group * data_in
    t = x_ready + l2_down
    t = max(t, y_ready) + l2_down
    t += gap["l2bm_to_l1bm_read"] * step + 2 * l1_down + gap["lm_write_to_read"] * step
    t += add + gap["lm_write_to_read"] * step + l1_up + gap["l1bm_write_to_l2bm_read"] * step
    t += l2_up + gap["l2bm_write_to_mv_read"] * step
    return t + lat_out + s.l2b_per_group * data_out  # the result's C transfers, then WAIT


@pytest.mark.parametrize("chip", ["mini", "mncore2"])
def test_add_pipeline_values_and_cycles(chip):
    machine = sim.Machine(hwdesc.load(chip))
    program, s = add_pipeline(machine)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((s.groups, 2 * s.n_group), dtype=np.float32)
    y = rng.standard_normal((s.groups, 2 * s.n_group), dtype=np.float32)
    load_dram(machine, np.concatenate([x, y], axis=1))
    stats = machine.run(program)
    out = machine.memory("DRAM")[:, 4 * s.n_group: 6 * s.n_group].view(np.float32)
    np.testing.assert_array_equal(out, x + y)
    assert stats.total_cycles == expected_cycles(machine.hw)
    assert stats.total_cycles == {"mini": 466, "mncore2": 2090}[chip]  # the same formula, evaluated once by hand


def test_doubled_mv_bandwidth_changes_cycles_as_the_formula_predicts():
    base, fast = hwdesc.load("mncore2"), hwdesc.load("mncore2_fastdram")
    cycles = {}
    for hw in (base, fast):
        machine = sim.Machine(hw)
        program, _ = add_pipeline(machine)
        cycles[hw.name] = machine.run(program, mode="timing").total_cycles
        assert cycles[hw.name] == expected_cycles(hw)
    # 4096 LW per transfer: 256 cycles of data at 16 LW/cycle, 128 at 32; 4 transfers in and 2 out
    # are on the critical path, so the variant saves 6 x 128 cycles.
    assert cycles["mncore2"] - cycles["mncore2_fastdram"] == 6 * 128


def test_bytes_and_busy_cycles(mncore2):
    machine = sim.Machine(mncore2)
    program, s = add_pipeline(machine)
    stats = machine.run(program, mode="timing")
    lw = mncore2.long_word_bytes
    assert stats.bytes_per_path["dram_to_l2bm"] == 2 * s.n_group * s.groups * lw
    assert stats.bytes_per_path["l2bm_to_dram"] == s.n_group * s.groups * lw
    assert stats.instructions == {"NOP": 5, "WAIT": 3, "MV": 6, "XFER": 6, "VOP": 1}
    assert stats.engine_busy == [6 * 4096 // 16] * 4  # 6 transfers of 4096 LW at 16 LW/cycle each
    assert stats.pe_busy + stats.wait_stall <= stats.total_cycles
    assert set(stats.utilisation()) == {"PE stream", "Data Engine 0", "Data Engine 1", "Data Engine 2",
                                        "Data Engine 3", "host link"}

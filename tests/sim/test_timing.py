"""The timing engine: overlap of Data Engine and PE stream, queues, waits, run modes."""

from __future__ import annotations

from math import ceil

import numpy as np
import pytest

import sim


def vop_steps(hw, n: int, op: str = "add") -> int:
    lanes = hw.units[hw.pe_ops[op].unit].vector["float32"].lanes_per_cycle * hw.step_cycles // hw.fanout(
        hw.pe_ops[op].unit == "MAU" and "MAB" or "PE", "PE")
    return ceil(n / lanes) * hw.pe_ops[op].issues


def mv_data(hw, n: int) -> int:
    mode = hw.transfers["dram_to_l2bm"].modes["individual"]
    n = ceil(n / mode.unit_lw) * mode.unit_lw
    return ceil(n / min(mode.src_lw_per_cycle, mode.dst_lw_per_cycle))


def mv_cycles(hw, n: int) -> int:
    """Issue to completion of one transfer on an idle Data Engine: latency, then data."""
    return hw.transfers["dram_to_l2bm"].latency_cycles + mv_data(hw, n)


def program(m: sim.Machine, *, overlap: bool, n_mv: int = 4096, vops: int = 40) -> sim.Program:
    b = sim.ProgramBuilder(m.params)
    b.mv("individual", "DRAM", 0, "L2BM", 0, n_mv, tag=1)
    if not overlap:
        b.wait(1)
    for _ in range(vops):
        b.vop("add", "float32", 1, 512, ("LM0", 0, 0, 1), ("LM1", 0, 0, 1), ("LM1", 0, 0, 1))  # no hazard between them
    if overlap:
        b.wait(1)
    return b.build()


def test_mv_overlapping_compute_finishes_sooner_than_in_sequence(mncore2):
    m = sim.Machine(mncore2)
    m.grow("DRAM", 2 * 4096)
    compute = 40 * vop_steps(mncore2, 512) * mncore2.step_cycles
    transfer = mv_cycles(mncore2, 4096)
    together = m.run(program(m, overlap=True), mode="timing").total_cycles
    apart = m.run(program(m, overlap=False), mode="timing").total_cycles
    assert apart == transfer + compute
    assert together == max(transfer, compute)
    assert together < apart


def test_wait_stalls_only_until_the_tag_is_done(mini):
    m = sim.Machine(mini)
    stats = m.run(program(m, overlap=True, vops=1), mode="timing")
    compute = vop_steps(mini, 512) * mini.step_cycles
    assert stats.wait_stall == mv_cycles(mini, 4096) - compute
    assert stats.total_cycles == mv_cycles(mini, 4096)


def test_full_data_engine_queue_stalls_the_stream(mini):
    m = sim.Machine(mini)
    depth = mini.data_engine.queue_depth
    b = sim.ProgramBuilder(m.params)
    for _ in range(depth + 1):
        b.mv("individual", "DRAM", 0, "L2BM", 0, 64, tag=1)
    b.nop(1)
    stats = m.run(b.build(), mode="timing")
    latency, data = mini.transfers["dram_to_l2bm"].latency_cycles, mv_data(mini, 64)
    assert stats.queue_stall == latency + data  # the (depth+1)-th issue waits for the first to finish
    assert stats.end[-1] == latency + data + mini.step_cycles
    # the last transfer is issued only when the first completes, then pays its own latency
    assert stats.total_cycles == max(latency + (depth + 1) * data, 2 * (latency + data))
    assert stats.engine_busy == [(depth + 1) * data]


def test_a_pipelined_queue_pays_the_latency_once(mncore2):
    m = sim.Machine(mncore2)
    m.grow("DRAM", 2 * 4096)
    b = sim.ProgramBuilder(m.params)
    for _ in range(8):
        b.mv("individual", "DRAM", 0, "L2BM", 0, 512, tag=1)
    b.wait(1)
    stats = m.run(b.build(), mode="timing")
    assert stats.total_cycles == mncore2.transfers["dram_to_l2bm"].latency_cycles + 8 * mv_data(mncore2, 512)


def test_xfer_and_vop_cycles_from_the_yaml(mncore2):
    m = sim.Machine(mncore2)
    b = sim.ProgramBuilder(m.params)
    b.xfer("mab_broadcast", "down", "L1BM", 0, "LM0", 0, 64)  # 64 LW at 8/cycle; 16 per PE at 2/cycle
    b.xfer("distribute", "down", "L2BM", 0, "L1BM", 0, 1024)  # 1024 at 64/cycle; 128 per L1BM at 8/cycle
    b.vop("exp", "float32", 4, 100, ("LM1", 0, 100, 1), ("LM0", 0, 100, 1))  # 400 elements, 8 lanes per step
    stats = m.run(b.build(), mode="timing")
    step = mncore2.step_cycles
    assert stats.end[0] - stats.start[0] == ceil(max(64 / 8, 16 / 2) / step) * step
    assert stats.end[1] - stats.start[1] == ceil(max(1024 / 64, 128 / 8) / step) * step
    assert stats.end[2] - stats.start[2] == ceil(400 / 8) * mncore2.pe_ops["exp"].issues * step


def test_cross_group_mv_runs_at_the_cross_group_rate(mncore2):
    m = sim.Machine(mncore2)
    m.grow("DRAM", 2 * 1024)
    b = sim.ProgramBuilder(m.params)
    b.mv("individual", "DRAM", 0, "L2BM", 0, 1024, tag=1, src_inst=0, dst_inst=7)  # Group 0 -> L2B 7 (Group 3)
    b.wait(1)
    stats = m.run(b.build(), mode="timing")
    mode = mncore2.transfers["dram_to_l2bm"].modes["individual"]
    data = 1024 / mode.cross_group_lw_per_cycle
    assert stats.total_cycles == mncore2.transfers["dram_to_l2bm"].latency_cycles + data
    assert stats.engine_busy[0] == stats.engine_busy[3] == data and stats.engine_busy[1] == 0


def test_distributed_broadcast_runs_on_every_engine_at_both_side_rates(mncore2):
    """mvb4 on MN-Core 2: each Group reads n at 8 LW/cycle while each L2BM takes 4 n / 2 at 16: n / 8
    cycles on all four Data Engines at once."""
    m = sim.Machine(mncore2)
    n = 4096
    m.grow("DRAM", 2 * n)
    b = sim.ProgramBuilder(m.params)
    b.mv("distributed_broadcast", "DRAM", 0, "L2BM", 0, n, tag=1, scope="chip")
    b.wait(1)
    stats = m.run(b.build(), mode="timing")
    mode = mncore2.transfers["dram_to_l2bm"].modes["distributed_broadcast"]
    data = max(n / mode.src_lw_per_cycle, n * 4 / 2 / mode.dst_lw_per_cycle)
    assert data == n / 8
    assert stats.total_cycles == mncore2.transfers["dram_to_l2bm"].latency_cycles + data
    assert list(stats.engine_busy) == [data] * 4


def test_distributed_broadcast_needs_every_group_on_both_ends(mncore2):
    b = sim.ProgramBuilder(sim.MachineParams.from_hw(mncore2))
    b.mv("distributed_broadcast", "DRAM", 0, "L2BM", 0, 64, tag=1)  # scope group
    b.wait(1)
    with pytest.raises(sim.SimError, match="distributed_broadcast MV reads every Group's source"):
        sim.Machine(mncore2).run(b.build(), mode="timing")


def test_timing_only_and_functional_only(mini):
    m = sim.Machine(mini)
    m.memory("LM0").view(np.float32)[:, :8] = 1.5
    b = sim.ProgramBuilder(m.params)
    b.vop("add", "float32", 1, 8, ("LM1", 0, 0, 1), ("LM0", 0, 0, 1), ("LM0", 0, 0, 1))
    prog = b.build()
    stats = m.run(prog, mode="timing")
    assert stats.total_cycles == mini.step_cycles and not m.memory("LM1").any()  # nothing computed
    assert m.run(prog, mode="functional") is None
    assert (m.memory("LM1").view(np.float32)[:, :8] == 3.0).all()


def test_trace_has_one_track_per_unit(mini):
    m = sim.Machine(mini)
    m.grow("DRAM", 2 * 4096)
    prog = program(m, overlap=True, vops=1)  # the add is shorter than the load: the WAIT stalls
    stats = m.run(prog, mode="timing")
    events = stats.trace(labels=[(0, 1, "load"), (1, 2, "compute")])
    assert {e.unit for e in events} == {"PE stream", "Data Engine 0", "PE stream waits"}
    assert [e.name for e in events if e.unit == "PE stream"] == ["compute"]
    assert [e.name for e in events if e.unit == "PE stream waits"] == ["#2"]  # the stall shows as the WAIT
    assert [e.name for e in events if e.unit == "Data Engine 0"] == ["load"]


def test_mvs_shorter_than_their_unit_are_counted_with_the_engine_cycles_they_took(mini, mncore2):
    """A gather's runs of single long words: each is charged its mode's whole unit (64 LW at 16
    LW a cycle: 4 cycles), on every engine it runs on; an MV of whole units is not counted."""
    m = sim.Machine(mini)
    b = sim.ProgramBuilder(m.params)
    for k in range(5):
        b.mv("individual", "DRAM", 64 * k, "L2BM", k, 1, tag=1, src_inst=0, dst_inst=0)
    b.mv("individual", "DRAM", 1024, "L2BM", 512, 64, tag=1, src_inst=0, dst_inst=0)
    stats = m.time(b.build().code)
    assert (stats.short_mvs, stats.short_mv_cycles) == (5, 5 * mv_data(mini, 1))
    assert sum(stats.engine_busy) == 5 * mv_data(mini, 1) + mv_data(mini, 64)

    m = sim.Machine(mncore2)
    b = sim.ProgramBuilder(m.params)
    b.mv("individual", "DRAM", 0, "L2BM", 0, 3, tag=1)  # in every Group: on each of their engines
    b.mv("individual", "DRAM", 64, "L2BM", 64, 128, tag=1)
    stats = m.time(b.build().code)
    assert (stats.short_mvs, stats.short_mv_cycles) == (1, mncore2.instances("Group") * mv_data(mncore2, 3))

"""The timing engine: a numba event loop over a program's instruction array.

Units and how they advance (DESIGN.md, "the machine model"):

* the PE stream issues one macro-instruction after another; a PE instruction (NOP, VOP, XFER,
  MATMUL) occupies it for steps x step_cycles, and a bundle of instructions issued together
  (`isa.F_WITH_PREVIOUS`, the issue model of sim.isa) for its longest member;
* MV instructions are issued from the stream at no stream time and run on the Data Engines of
  the Groups they touch, first come first served. A transfer's data flows `latency_cycles`
  after its issue at the earliest, and after the previous transfer's data on each of its
  engines: requests are pipelined, so a full queue pays the latency once, and an engine is
  busy while data flows. When an engine already has `queue_depth` transfers outstanding, the
  stream stalls until the oldest finishes;
* HOST_DMA runs on the single host link the same way;
* WAIT stalls the stream until every transfer with its tag has finished.

The program ends when the stream and every engine are done. All costs come from `MachineParams`
(the YAML): transfer rates per side and mode, unit sizes, latencies, lanes and issue counts of
the PE operations, MAU shapes. See `sim.isa.TABLE` for each instruction's rule.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from . import isa
from .isa import ALL_GROUPS, Dir, Mode, Op, Scope
from .params import MachineParams
from .stats import RunStats

UNIT_WAIT, UNIT_PE, UNIT_HOST = -1, 0, 1  # per-instruction unit ids; Data Engine g is 2 + g; a WAIT is a stall


@njit(cache=True)
def _ceil_div(a: float, b: float) -> int:
    return int(math.ceil(a / b - 1e-9))


@njit(cache=True)
def vop_cycles(vop, dtype, src_dtype, n, step, vop_dtype_issues, vop_lanes):
    """Cycles of a VOP over n elements (the rule of `isa.TABLE`), from `MachineParams`'
    vop_dtype_issues and vop_lanes; a planner costing a VOP calls this, not a copy of it.

    A cvt runs at the fewer lanes and the more issues of its two dtypes (an int32 side is the
    ALU's, a float side may be the MAU's); `src_dtype` is read only for cvt."""
    lanes = vop_lanes[vop, dtype]
    issues = vop_dtype_issues[vop, dtype]
    if vop == isa.VOp.cvt:
        lanes = min(lanes, vop_lanes[vop, src_dtype])
        issues = max(issues, vop_dtype_issues[vop, src_dtype])
    return max(1, _ceil_div(n, lanes)) * issues * step


@njit(cache=True)
def _pe_cycles(row, step, vop_dtype_issues, vop_lanes, path_of, path_group, mode_src_rate, mode_dst_rate,
               mem_instances, mm_rows, mm_cols, mm_load):
    op = row[0]
    if op == Op.NOP:
        return row[isa.NOP_STEPS] * step
    if op == Op.VOP:
        n = row[isa.V_N_OUTER] * row[isa.V_N_INNER]
        return vop_cycles(row[isa.V_OP], row[isa.V_DTYPE], row[isa.V_SRC_DTYPE], n, step, vop_dtype_issues,
                          vop_lanes)
    if op == Op.XFER:
        mode, n = row[isa.X_MODE], row[isa.X_N]
        um, lm = row[isa.X_UP_MEM], row[isa.X_LO_MEM]
        down = row[isa.X_DIR] == Dir.down
        p = path_of[um, lm] if down else path_of[lm, um]
        fan = mem_instances[lm] // mem_instances[um]
        g = path_group[p]
        if mode == Mode.broadcast:
            per_lower = n
        elif mode == Mode.distribute or mode == Mode.collect:
            per_lower = _ceil_div(n, fan)
        else:  # mab_broadcast, individual, reduce: each member of a group carries n / G
            per_lower = _ceil_div(n, g)
        upper, lower = (n, per_lower)
        src_side, dst_side = (upper, lower) if down else (lower, upper)
        cycles = max(src_side / mode_src_rate[p, mode], dst_side / mode_dst_rate[p, mode])
        return max(1, _ceil_div(_ceil_div(cycles, 1.0), step)) * step
    if op == Op.MATMUL:
        dt = row[isa.MM_DTYPE]
        rows, cols = mm_rows[dt], mm_cols[dt]
        load = _ceil_div(rows, mm_load[dt])
        cycles = _ceil_div(row[isa.MM_M], rows) * _ceil_div(row[isa.MM_K], cols) * max(row[isa.MM_N], load)
        return max(1, _ceil_div(cycles, step)) * step
    return 0


@njit(cache=True)
def _mv_cost(row, n_groups, mem_instances, path_of, path_latency, mode_src_rate, mode_dst_rate, mode_cross_rate,
             mode_unit, lw_bytes):
    """(latency, data cycles, engine mask, bytes written) of one MV."""
    mode, n = row[isa.MV_MODE], row[isa.MV_N]
    sm, dm = row[isa.MV_SRC_MEM], row[isa.MV_DST_MEM]
    p = path_of[sm, dm]
    unit = mode_unit[p, mode]
    n_eff = _ceil_div(n, unit) * unit
    s_per, d_per = mem_instances[sm] // n_groups, mem_instances[dm] // n_groups
    every = row[isa.MV_SRC_INST] == ALL_GROUPS or row[isa.MV_DST_INST] == ALL_GROUPS
    chip = row[isa.MV_SCOPE] == Scope.chip and mode != Mode.individual
    all_mask = (np.int64(1) << n_groups) - 1
    if every:
        mask, crossing = all_mask, False
    elif chip:
        mask, crossing = all_mask, n_groups > 1
    else:
        sg = row[isa.MV_SRC_INST] // s_per
        dg = row[isa.MV_DST_INST] // d_per if mode == Mode.individual else sg
        if mode == Mode.collect or mode == Mode.reduce:
            sg = dg = row[isa.MV_DST_INST] // d_per
        mask = (np.int64(1) << sg) | (np.int64(1) << dg)
        crossing = sg != dg
    if mode == Mode.distributed_broadcast:  # every Group reads n; each destination gets n_groups * n / d_per
        data = _ceil_div(max(n_eff / mode_src_rate[p, mode], n_eff * n_groups / d_per / mode_dst_rate[p, mode]), 1.0)
        return path_latency[p], data, all_mask, n * lw_bytes * n_groups * n_groups
    count = 1
    if mode != Mode.individual:
        count = mem_instances[dm] if (mode == Mode.broadcast or mode == Mode.distribute) else mem_instances[sm]
        if not chip:
            count = count // n_groups
    src_lw, dst_lw = float(n_eff), float(n_eff)
    if mode == Mode.distribute:
        dst_lw = n_eff / count
    elif mode == Mode.collect:
        src_lw = n_eff / count
    src_rate, dst_rate = mode_src_rate[p, mode], mode_dst_rate[p, mode]
    if crossing:
        cross = mode_cross_rate[p, mode]
        src_rate, dst_rate = min(src_rate, cross), min(dst_rate, cross)
    data = _ceil_div(max(src_lw / src_rate, dst_lw / dst_rate), 1.0)
    groups = n_groups if every else 1
    copies = count if mode == Mode.broadcast else 1
    return path_latency[p], data, mask, n * lw_bytes * groups * copies


@njit(cache=True)
def simulate(code, n_groups, step, queue_depth, n_tags, mem_instances, path_of, path_engine, path_latency, path_group,
             mode_src_rate, mode_dst_rate, mode_cross_rate, mode_unit, vop_dtype_issues, vop_lanes, mm_rows,
             mm_cols, mm_load, host_path_in, host_path_out, lw_bytes):
    """Start and end cycle, unit and bytes of every instruction, plus busy cycles per unit."""
    n = code.shape[0]
    start = np.zeros(n, dtype=np.int64)
    end = np.zeros(n, dtype=np.int64)
    unit = np.zeros(n, dtype=np.int64)
    mask_of = np.zeros(n, dtype=np.int64)
    path = np.full(n, -1, dtype=np.int64)
    nbytes = np.zeros(n, dtype=np.int64)
    engine_free = np.zeros(n_groups, dtype=np.int64)
    engine_busy = np.zeros(n_groups, dtype=np.int64)
    ring = np.zeros((n_groups + 1, queue_depth), dtype=np.int64)  # last slot row: the host link
    issued = np.zeros(n_groups + 1, dtype=np.int64)
    tag_done = np.zeros(n_tags + 1, dtype=np.int64)
    t = np.int64(0)
    bundle_start = np.int64(0)
    host_free = np.int64(0)
    pe_busy = np.int64(0)
    host_busy = np.int64(0)
    wait_stall = np.int64(0)
    queue_stall = np.int64(0)
    short_mvs = np.int64(0)  # MVs of fewer long words than their mode's unit, and their engine cycles
    short_cycles = np.int64(0)
    for i in range(n):
        row = code[i]
        op = row[0]
        if op == Op.WAIT:
            start[i] = t
            done = tag_done[row[isa.WAIT_TAG]]
            if done > t:
                wait_stall += done - t
                t = done
            end[i] = t
            unit[i] = UNIT_WAIT
        elif op == Op.MV:
            latency, data, mask, b = _mv_cost(row, n_groups, mem_instances, path_of, path_latency, mode_src_rate,
                                              mode_dst_rate, mode_cross_rate, mode_unit, lw_bytes)
            for g in range(n_groups):  # a full queue stalls the stream until its oldest transfer ends
                if (mask >> g) & 1 and issued[g] >= queue_depth:
                    oldest = ring[g, issued[g] % queue_depth]
                    if oldest > t:
                        queue_stall += oldest - t
                        t = oldest
            begin = t + latency  # data flows after the latency, and after the data queued before it
            for g in range(n_groups):
                if (mask >> g) & 1 and engine_free[g] > begin:
                    begin = engine_free[g]
            finish = begin + data
            for g in range(n_groups):
                if (mask >> g) & 1:
                    engine_free[g] = finish
                    engine_busy[g] += data
                    ring[g, issued[g] % queue_depth] = finish
                    issued[g] += 1
            tag = row[isa.MV_TAG]
            if finish > tag_done[tag]:
                tag_done[tag] = finish
            start[i], end[i], mask_of[i] = begin, finish, mask
            first = 0
            while (mask >> first) & 1 == 0:
                first += 1
            unit[i] = 2 + first  # the lowest engine it runs on; `mask_of` lists them all
            path[i] = path_of[row[isa.MV_SRC_MEM], row[isa.MV_DST_MEM]]
            if row[isa.MV_N] < mode_unit[path[i], row[isa.MV_MODE]]:
                short_mvs += 1
                for g in range(n_groups):
                    if (mask >> g) & 1:
                        short_cycles += data
            nbytes[i] = b
        elif op == Op.HOST_DMA:
            p = host_path_in if row[isa.DMA_DIR] == 0 else host_path_out
            unit_lw = mode_unit[p, Mode.individual]
            rate = min(mode_src_rate[p, Mode.individual], mode_dst_rate[p, Mode.individual])
            data = _ceil_div(_ceil_div(row[isa.DMA_N], unit_lw) * unit_lw, rate)
            h = n_groups
            if issued[h] >= queue_depth:
                oldest = ring[h, issued[h] % queue_depth]
                if oldest > t:
                    queue_stall += oldest - t
                    t = oldest
            begin = max(t + path_latency[p], host_free)
            finish = begin + data
            host_free = finish
            host_busy += data
            ring[h, issued[h] % queue_depth] = finish
            issued[h] += 1
            tag = row[isa.DMA_TAG]
            if finish > tag_done[tag]:
                tag_done[tag] = finish
            start[i], end[i], unit[i], path[i], nbytes[i] = begin, finish, UNIT_HOST, p, row[isa.DMA_N] * lw_bytes
        else:
            cycles = _pe_cycles(row, step, vop_dtype_issues, vop_lanes, path_of, path_group, mode_src_rate,
                                mode_dst_rate, mem_instances, mm_rows, mm_cols, mm_load)
            if row[isa.F_WITH_PREVIOUS] == 0:  # a new bundle starts where the stream is
                bundle_start = t
            start[i] = bundle_start
            end[i] = bundle_start + cycles
            if end[i] > t:  # the stream is held for the bundle's longest member
                pe_busy += end[i] - t
                t = end[i]
            unit[i] = UNIT_PE
            if op == Op.XFER:
                um, lm = row[isa.X_UP_MEM], row[isa.X_LO_MEM]
                path[i] = path_of[um, lm] if row[isa.X_DIR] == Dir.down else path_of[lm, um]
                nbytes[i] = row[isa.X_N] * lw_bytes * mem_instances[um]
    total = t
    for g in range(n_groups):
        total = max(total, engine_free[g])
    total = max(total, host_free)
    return (start, end, unit, mask_of, path, nbytes, total, pe_busy, engine_busy, host_busy, wait_stall, queue_stall,
            short_mvs, short_cycles)


def pe_cycles(p: MachineParams, row: np.ndarray) -> int:
    """Cycles one PE-stream instruction holds the stream, by the timing engine's own rule: what a
    compiler weighs the members of its bundles by (how long each MATMUL piece must last). The row
    must use modes and ops the chip offers (sim.validate.check_offered): others have no rate."""
    return int(_pe_cycles(row, p.step_cycles, p.vop_dtype_issues, p.vop_lanes, p.path_of, p.path_group,
                          p.mode_src_rate, p.mode_dst_rate, p.mem_instances, p.mm_rows, p.mm_cols, p.mm_load_rows))


def time_code(p: MachineParams, code: np.ndarray) -> RunStats:
    """Cycles of a (validated) instruction array on the chip `p` describes, from the YAML numbers
    only: no machine state, so a planner can time what it would emit."""
    (start, end, unit, mask, path, nbytes, total, pe_busy, engine_busy, host_busy, wait_stall, queue_stall,
     short_mvs, short_cycles) = simulate(code, p.n_groups, p.step_cycles, p.queue_depth, p.tags, p.mem_instances,
                                         p.path_of, p.path_engine, p.path_latency, p.path_group, p.mode_src_rate,
                                         p.mode_dst_rate, p.mode_cross_rate, p.mode_unit, p.vop_dtype_issues,
                                         p.vop_lanes, p.mm_rows, p.mm_cols, p.mm_load_rows, p.host_path_in,
                                         p.host_path_out, p.lw_bytes)
    per_path = np.bincount(path[path >= 0], weights=nbytes[path >= 0], minlength=len(p.path_names))
    ops = np.bincount(code[:, 0], minlength=len(Op))
    return RunStats(total_cycles=int(total), clock_hz=p.clock_hz, pe_busy=int(pe_busy),
                    engine_busy=[int(x) for x in engine_busy], host_busy=int(host_busy),
                    wait_stall=int(wait_stall), queue_stall=int(queue_stall),
                    bytes_per_path={name: int(per_path[i]) for i, name in enumerate(p.path_names) if per_path[i]},
                    instructions={op.name: int(ops[op]) for op in Op if ops[op]},
                    start=start, end=end, unit=unit, engine_mask=mask, short_mvs=int(short_mvs),
                    short_mv_cycles=int(short_cycles))

"""Figures derived from a description: counts, capacities, peaks and bandwidths.

Nothing here is written in the YAML: each figure is arithmetic on described values, so a variant
that changes one number changes every figure that depends on it, and no number is stated twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from .model import HwDesc


@dataclass(frozen=True)
class Peak:
    """Peak arithmetic throughput of one unit kind in one mode and dtype."""

    unit: str
    mode: str  # "matrix" or "vector"
    dtype: str
    flop_per_cycle_per_unit: int
    units: int
    flops: float  # FLOP/s for the whole chip


@dataclass(frozen=True)
class PathBandwidth:
    """Throughput of one transfer mode: the rate of each side of one instance, and the payload (the
    long words a transfer instruction names) one engine and the whole chip move.

    The sides differ in fan-out: a distribute reads 64 LW/cycle from one L1BM and writes 1 LW/cycle
    into each of its 64 PEs, so one engine (one L1B) moves 64 LW of payload per cycle either way.
    """

    transfer: str
    mode: str
    src_lw_per_cycle: float  # per source instance, bounded by the memories' rates
    dst_lw_per_cycle: float  # per destination instance
    lw_per_cycle: float  # payload per engine: the slower side, over the instances sharing it
    engines: int  # engines that run this path at once
    bytes_per_s: float  # payload over the whole chip


def level_counts(hw: HwDesc) -> dict[str, int]:
    """Instances of every level: Group 4, L2B 8, L1B 64, MAB 1024, PE 4096 on MN-Core 2."""
    return {name: hw.instances(name) for name in hw.level_names}


def capacity_total_bytes(hw: HwDesc, memory: str) -> int:
    return int(hw.memories[memory].capacity_bytes) * hw.memory_instances(memory)


def capacity_by_level(hw: HwDesc) -> dict[str, int]:
    """Total bytes of memory owned at each level."""
    totals = {name: 0 for name in hw.level_names}
    for name, mem in hw.memories.items():
        totals[mem.level] += capacity_total_bytes(hw, name)
    return totals


def on_chip_bytes(hw: HwDesc) -> int:
    """Every memory but those at the root-most level that holds tensors off chip (DRAM)."""
    return sum(capacity_total_bytes(hw, m) for m in hw.memories if m != "DRAM")


def peaks(hw: HwDesc) -> list[Peak]:
    """Peak FLOP/s per unit, mode and dtype; an FMA counts as two FLOPs."""
    out = []
    for name, unit in hw.units.items():
        n = hw.instances(unit.level)
        for dtype, m in unit.matrix.items():
            per = 2 * m.rows * m.cols
            out.append(Peak(name, "matrix", dtype, per, n, per * n * hw.clock_hz))
        for dtype, v in unit.vector.items():
            per = 2 * v.lanes_per_cycle
            out.append(Peak(name, "vector", dtype, per, n, per * n * hw.clock_hz))
    return out


def peak_flops(hw: HwDesc, dtype: str, mode: str = "matrix") -> float:
    """The chip's best FLOP/s for a dtype in a mode, over all units that offer it."""
    return max((p.flops for p in peaks(hw) if p.dtype == dtype and p.mode == mode), default=0.0)


def memory_bandwidth(hw: HwDesc, memory: str) -> float:
    """Bytes/s of one instance of a memory (one port)."""
    return hw.memories[memory].lw_per_cycle * hw.long_word_bytes * hw.clock_hz


def dram_bandwidth_total(hw: HwDesc) -> float:
    """Aggregate DRAM bandwidth of the chip in bytes/s: the DRAM's own rate
    (`memories.DRAM.lw_per_cycle`) in every instance, a ceiling on each path that reads or writes
    it (`dram_bandwidth_reachable` is what transfers can use of it)."""
    return memory_bandwidth(hw, "DRAM") * hw.memory_instances("DRAM")


def dram_bandwidth_reachable(hw: HwDesc) -> float:
    """The DRAM bandwidth transfers reach, in bytes/s: the fastest path mode that reads or writes
    DRAM, over all its engines, within `dram_bandwidth_total`. Doubling the DRAM's own rate past
    its paths' changes nothing the simulator does, and this figure says so."""
    paths = [b.bytes_per_s for b in path_bandwidths(hw)
             if "DRAM" in (*hw.transfers[b.transfer].src, *hw.transfers[b.transfer].dst)]
    return min(dram_bandwidth_total(hw), max(paths)) if paths else dram_bandwidth_total(hw)


@lru_cache(maxsize=256)
def side_rates(hw: HwDesc, transfer: str, mode: str) -> tuple[float, float]:
    """LW/cycle on the source and destination side of one instance of a transfer mode: the mode's
    rate, bounded by the rate of each memory on that side (`memories.<m>.lw_per_cycle`; the host
    end has none). The simulator's timing uses exactly these (sim.params). Cached: the compiler's
    tiling search asks for them per candidate (descriptions are immutable)."""
    t, m = hw.transfers[transfer], hw.transfers[transfer].modes[mode]

    def bounded(rate: float, memories: tuple[str, ...]) -> float:
        return min([rate, *(hw.memories[x].lw_per_cycle for x in memories if x in hw.memories)])

    return bounded(m.src_lw_per_cycle, t.src), bounded(m.dst_lw_per_cycle, t.dst)


def engine_instances(hw: HwDesc, transfer: str) -> int:
    """How many engines run a path at once: one Data Engine per Group, one PE-stream transfer per
    instance of the upper memory (every L2B or L1B at once), one host link."""
    t = hw.transfers[transfer]
    if t.engine == "host_link":
        return 1
    if t.engine == "data_engine":
        return hw.instances(hw.data_engine.level)
    return min(hw.memory_instances(m) for m in (*t.src, *t.dst) if m in hw.memories)


def side_shares(hw: HwDesc, transfer: str, mode: str) -> tuple[float, float]:
    """Into how many instances one engine's payload is split on the source and the destination
    side (the timing model's rule, sim.isa.TABLE): a distribute deals it out over the children, a
    collect gathers it from them, a MAB-wide mode splits it over a group's members; a distributed
    broadcast gives each destination every Group's payload over the destinations of a Group (a
    share below one); every other side carries all of it (a broadcast writes all of it into every
    child)."""
    t = hw.transfers[transfer]
    if t.engine == "pe_stream":
        mems = [m for m in (*t.src, *t.dst) if m in hw.memories]
        upper = min(mems, key=hw.memory_instances)
        lower = max(mems, key=hw.memory_instances)
        fan = hw.memory_instances(lower) // hw.memory_instances(upper)
        group = hw.fanout(t.group_level, hw.memories[lower].level) if t.group_level else 1
        share = 1 if mode == "broadcast" else fan if mode in ("distribute", "collect") else group
        return (1, share) if upper in t.src else (share, 1)
    if t.engine == "data_engine" and mode == "distributed_broadcast":  # each destination gets every Group's
        groups = hw.instances(hw.data_engine.level)
        return 1, hw.memory_instances(t.dst[0]) / groups / groups
    if t.engine == "data_engine" and mode in ("distribute", "collect"):
        side = t.dst if mode == "distribute" else t.src
        count = hw.memory_instances(side[0]) // hw.instances(hw.data_engine.level)
        return (1, count) if mode == "distribute" else (count, 1)
    return 1, 1


def path_bandwidths(hw: HwDesc) -> list[PathBandwidth]:
    out = []
    lw, f = hw.long_word_bytes, hw.clock_hz
    for name in hw.transfers:
        n = engine_instances(hw, name)
        for mode_name in hw.transfers[name].modes:
            src, dst = side_rates(hw, name, mode_name)
            src_share, dst_share = side_shares(hw, name, mode_name)
            payload = min(src * src_share, dst * dst_share)
            out.append(PathBandwidth(name, mode_name, src, dst, payload, n, payload * n * lw * f))
    return out


def summary(hw: HwDesc) -> dict[str, float | int]:
    """The headline figures as one flat mapping (used by `hw show` and `hw diff`)."""
    out: dict[str, float | int] = {}
    for level, n in level_counts(hw).items():
        out[f"count.{level}"] = n
    for mem in hw.memories:
        out[f"capacity_total.{mem}"] = capacity_total_bytes(hw, mem)
    out["capacity_total.on_chip"] = on_chip_bytes(hw)
    for p in peaks(hw):
        out[f"peak_flops.{p.unit}.{p.mode}.{p.dtype}"] = p.flops
    for b in path_bandwidths(hw):
        out[f"bandwidth.{b.transfer}.{b.mode}"] = b.bytes_per_s
    out["bandwidth.dram_total"] = dram_bandwidth_total(hw)
    out["bandwidth.dram_reachable"] = dram_bandwidth_reachable(hw)
    return out


def matrix_cycles(hw: HwDesc, multiply_adds: int, dtype: str) -> float:
    """Cycles for `multiply_adds` at the MAU matrix rate (rows x cols per cycle) of every MAB:
    the compute side of a matrix product's roofline."""
    mode = hw.units["MAU"].matrix[dtype]
    return multiply_adds / (mode.rows * mode.cols * hw.instances(hw.units["MAU"].level))


def dram_traffic_cycles(hw: HwDesc, read_bytes: int, write_bytes: int) -> float:
    """Cycles to read and write these bytes between DRAM and L2BM once, every Group's Data Engine
    at its individual-mode rate: the traffic side of a roofline."""
    groups, lw = hw.instances(hw.memories["DRAM"].level), hw.long_word_bytes
    read = side_rates(hw, "dram_to_l2bm", "individual")[0] * lw * groups
    write = side_rates(hw, "l2bm_to_dram", "individual")[1] * lw * groups
    return read_bytes / read + write_bytes / write

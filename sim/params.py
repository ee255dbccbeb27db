"""The numbers a program runs on, derived once from a hardware description.

Kernels and the timing loop are numba functions; they take plain integer and float arrays, not
objects. `MachineParams.from_hw` is the one place that turns a `HwDesc` into those arrays, so
every cycle and every data pattern the simulator produces traces back to a YAML value.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from hwdesc import HwDesc
from hwdesc.bounds import WORD_BYTES
from hwdesc.figures import side_rates

from .isa import COST_NAME, DType, Mode, VOp
from .numerics import HalfCodec

HOST = -2  # memory id of the host end of the host link
WORD_BITS = 8 * WORD_BYTES  # the element of mnsim's memory arrays (hwdesc.bounds refuses another word size)
WORD_MASK = (1 << WORD_BITS) - 1
# `fmt`, passed to the kernels, holds the numbers from the YAML that data patterns depend on.
FMT_WPL, FMT_HALF_E, FMT_HALF_M = 0, 1, 2  # words per long word, half exponent and mantissa bits
ENGINES = ("data_engine", "pe_stream", "host_link")
DTYPE_FORMAT = {DType.float32: "float32", DType.float16: "float16", DType.int32: "int32", DType.pfloat32: "pfloat32",
                DType.float64: "float64"}
_ACC_DTYPE = {"float32": DType.float32, "float64": DType.float64}  # a matrix mode's `acc` as C's DType


@dataclass(frozen=True, eq=False)
class MachineParams:
    """Topology, transfer rates, op costs: arrays indexed by memory id, path id, mode, op, dtype."""

    hw: HwDesc
    memory_names: tuple[str, ...]
    mem_instances: np.ndarray  # [memories]
    mem_words: np.ndarray  # capacity per instance in 32-bit words
    mem_lw_addressed: np.ndarray  # bool: addresses count long words (else words)
    mem_level: np.ndarray  # level index of each memory
    level_instances: np.ndarray  # [levels]
    n_groups: int  # Data Engines
    engine_level: int
    pe_memories: tuple[int, ...]  # memories one per leaf instance
    # paths
    path_names: tuple[str, ...]
    path_of: np.ndarray  # [memories + 1 (host), memories + 1] -> path id or -1; host at index -1... see path_id
    path_engine: np.ndarray  # ENGINES index
    path_latency: np.ndarray
    path_group: np.ndarray  # G: children treated as one unit (1 or PEs per MAB)
    mode_offered: np.ndarray  # [paths, modes] bool
    mode_src_rate: np.ndarray  # [paths, modes] LW/cycle
    mode_dst_rate: np.ndarray
    mode_cross_rate: np.ndarray  # 0 = not offered across Groups
    mode_unit: np.ndarray  # [paths, modes] LW
    mode_chunk: np.ndarray  # [paths, modes] LW
    mode_subsets: np.ndarray  # [paths, modes] bool: a broadcast may name a subset of the children
    # PE stream
    step_cycles: int
    vop_dtype_issues: np.ndarray  # [VOp, DType] issues per lane group; 0 = op has no cost entry (not offered)
    vop_lanes: np.ndarray  # [VOp, DType] lanes per PE per step of the op's unit for the dtype; 0 = no vector mode
    mm_rows: np.ndarray  # [DType] MAU matrix rows (0 = dtype not offered)
    mm_cols: np.ndarray
    mm_load_rows: np.ndarray
    mm_acc: np.ndarray  # [DType] the DType of a MATMUL's C: its matrix mode's `acc` (float32; float64 for float64)
    mab_level: int  # level of the MAU
    pes_per_mab: int
    # engines
    queue_depth: int
    tags: int
    host_path_in: int
    host_path_out: int
    host_instance: int  # the PDM instance the host link reaches
    host_memory: int
    clock_hz: int
    words_per_lw: int  # 32-bit words in a long word (2 on MN-Core 2)
    dram_align: int  # long words: the largest MV unit on a DRAM path, so whole units stay in a buffer
    lw_bytes: int
    half: HalfCodec  # the chip's half format (1-6-9 on MN-Core 2)
    fmt: np.ndarray  # [words per LW, half exponent bits, half mantissa bits] for the kernels
    pseudo_mask: int = WORD_MASK  # the float32 bits a pseudo-single MATMUL operand keeps (formats.pfloat32)
    hazards: dict[str, int] = field(default_factory=dict)
    # the issue model: the VLIW group (slot) each PE-stream instruction issues in, -1 = none
    slot_names: tuple[str, ...] = ()
    vop_slot: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), dtype=np.int64))  # [VOp, DType]
    path_slot: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # [paths]
    mm_slot: int = -1

    def elements_per_word(self, dtype: DType) -> int:
        """Elements of `dtype` in one word (2 for half); a float64 element spans two words, so
        for it this is 0: word ranges of element ranges come from `word_span`."""
        return WORD_BITS // self.hw.formats[DTYPE_FORMAT[dtype]].bits

    def words_per_element(self, dtype: DType) -> int:
        """Words one element of `dtype` fills (2 for float64; 1 for the formats a word holds)."""
        return max(1, self.hw.formats[DTYPE_FORMAT[dtype]].bits // WORD_BITS)

    def word_span(self, dtype: DType, first, last):
        """The first and last word that elements first..last of `dtype` occupy (numbers or numpy
        arrays of element indices)."""
        wide = self.words_per_element(dtype)
        if wide > 1:
            return first * wide, last * wide + wide - 1
        per = self.elements_per_word(dtype)
        return first // per, last // per

    @staticmethod
    def from_hw(hw: HwDesc) -> "MachineParams":
        return _from_hw(hw)

    def memory_id(self, name: str) -> int:
        try:
            return self.memory_names.index(name)
        except ValueError:
            raise KeyError(f"{self.hw.name} has no memory {name!r}; it has {', '.join(self.memory_names)}") from None

    def path_id(self, src: int, dst: int) -> int:
        return int(self.path_of[src, dst])

    def instances_per_group(self, mem: int) -> int:
        return int(self.mem_instances[mem]) // self.n_groups

    def group_of(self, mem: int, instance: int) -> int:
        return instance // self.instances_per_group(mem)


@lru_cache(maxsize=32)
def _from_hw(hw: HwDesc) -> MachineParams:
    names = tuple(hw.memories)
    mem_id = {n: i for i, n in enumerate(names)}
    levels = hw.level_names
    n_mem = len(names)
    path_names = tuple(hw.transfers)
    n_paths, n_modes = len(path_names), len(Mode)
    # host gets index n_mem in the lookup table (HOST = -2 maps there via path_id's caller)
    path_of = np.full((n_mem + 2, n_mem + 2), -1, dtype=np.int64)
    offered = np.zeros((n_paths, n_modes), dtype=np.bool_)
    src_rate = np.zeros((n_paths, n_modes))
    dst_rate = np.zeros((n_paths, n_modes))
    cross = np.zeros((n_paths, n_modes))
    unit = np.ones((n_paths, n_modes), dtype=np.int64)
    chunk = np.ones((n_paths, n_modes), dtype=np.int64)
    subsets = np.zeros((n_paths, n_modes), dtype=np.bool_)
    engine = np.zeros(n_paths, dtype=np.int64)
    latency = np.zeros(n_paths, dtype=np.int64)
    group = np.ones(n_paths, dtype=np.int64)
    for p, (pname, t) in enumerate(hw.transfers.items()):
        engine[p] = ENGINES.index(t.engine)
        latency[p] = t.latency_cycles
        for s in t.src:
            for d in t.dst:
                si = mem_id.get(s, HOST)
                di = mem_id.get(d, HOST)
                path_of[si, di] = p
        if t.group_level is not None:
            lower = [m for m in t.src + t.dst if m in hw.memories]
            lower_level = max((hw.memories[m].level for m in lower), key=levels.index)
            group[p] = hw.fanout(t.group_level, lower_level)
        for mname, m in t.modes.items():
            k = Mode[mname]
            offered[p, k] = True
            src_rate[p, k], dst_rate[p, k] = side_rates(hw, pname, mname)  # bounded by the memories' rates
            cross[p, k] = m.cross_group_lw_per_cycle or 0.0
            unit[p, k] = m.unit_lw
            chunk[p, k] = m.chunk_lw or 1
            subsets[p, k] = m.subsets
    vop_dtype_issues, vop_lanes = _vop_costs(hw)
    mau = hw.units.get("MAU")
    mm_rows = np.zeros(len(DType), dtype=np.int64)
    mm_cols = np.zeros(len(DType), dtype=np.int64)
    mm_load = np.ones(len(DType), dtype=np.int64)
    mm_acc = np.full(len(DType), int(DType.float32), dtype=np.int64)
    mab_level = levels.index(mau.level) if mau else len(levels) - 1
    if mau:
        for dt in DType:
            m = mau.matrix.get(DTYPE_FORMAT[dt])
            if m is not None:
                mm_rows[dt], mm_cols[dt], mm_load[dt] = m.rows, m.cols, m.load_rows_per_cycle
                mm_acc[dt] = _ACC_DTYPE.get(m.acc, DType.float32)
    host_in = hw.transfer("host", hw.host_link.memory)
    host_out = hw.transfer(hw.host_link.memory, "host")
    host_mem = mem_id[hw.host_link.memory]
    return MachineParams(
        hw=hw, memory_names=names,
        mem_instances=np.array([hw.memory_instances(n) for n in names], dtype=np.int64),
        mem_words=np.array([hw.memory_words(n) for n in names], dtype=np.int64),
        mem_lw_addressed=np.array([hw.memories[n].address_unit == "long_word" for n in names]),
        mem_level=np.array([levels.index(hw.memories[n].level) for n in names], dtype=np.int64),
        level_instances=np.array([hw.instances(n) for n in levels], dtype=np.int64),
        n_groups=hw.instances(hw.data_engine.level), engine_level=levels.index(hw.data_engine.level),
        pe_memories=tuple(i for i, n in enumerate(names) if hw.memories[n].level == hw.leaf_level),
        path_names=path_names, path_of=path_of, path_engine=engine, path_latency=latency, path_group=group,
        mode_offered=offered, mode_src_rate=src_rate, mode_dst_rate=dst_rate, mode_cross_rate=cross,
        mode_unit=unit, mode_chunk=chunk, mode_subsets=subsets, step_cycles=hw.step_cycles,
        vop_dtype_issues=vop_dtype_issues, vop_lanes=vop_lanes,
        mm_rows=mm_rows, mm_cols=mm_cols, mm_load_rows=mm_load, mm_acc=mm_acc, mab_level=mab_level,
        pes_per_mab=hw.fanout(mau.level, hw.leaf_level) if mau else 1,
        queue_depth=hw.data_engine.queue_depth, tags=hw.data_engine.tags,
        host_path_in=path_names.index(host_in[0]) if host_in else -1,
        host_path_out=path_names.index(host_out[0]) if host_out else -1,
        host_instance=hw.host_link.groups[0] * (hw.memory_instances(hw.host_link.memory) // hw.instances(hw.data_engine.level)),
        host_memory=host_mem, clock_hz=hw.clock_hz, words_per_lw=hw.long_word_bytes // hw.word_bytes,
        dram_align=max((m.unit_lw for t in hw.transfers.values() if "DRAM" in (*t.src, *t.dst) for m in t.modes.values()),
                       default=1),
        lw_bytes=hw.long_word_bytes, half=HalfCodec.of(hw),
        fmt=np.array([hw.long_word_bytes // hw.word_bytes, hw.formats["float16"].exponent_bits,
                      hw.formats["float16"].mantissa_bits], dtype=np.int64),
        hazards=dict(hw.hazards), pseudo_mask=_pseudo_mask(hw), **_slots(hw, path_names))


def _pseudo_mask(hw: HwDesc) -> int:
    """Pseudo-single is stored as single (hwdesc.checks holds the YAML to that); the MAU ignores
    the low mantissa bits that formats.pfloat32 lacks against formats.float32."""
    pseudo = hw.formats.get("pfloat32")
    if pseudo is None:
        return WORD_MASK
    ignored = hw.formats["float32"].mantissa_bits - pseudo.mantissa_bits
    return WORD_MASK & ~((1 << ignored) - 1)


def _slots(hw: HwDesc, path_names: tuple[str, ...]) -> dict:
    """Slot ids of the units' and PE-stream paths' VLIW groups (`units.<u>.slot`,
    `transfers.<t>.slot`): which instructions may issue in the same steps."""
    names = tuple(dict.fromkeys([u.slot for u in hw.units.values() if u.slot] +
                                [t.slot for t in hw.transfers.values() if t.slot]))
    slot = lambda name: names.index(name) if name else -1  # noqa: E731
    vop_slot = np.full((len(VOp), len(DType)), -1, dtype=np.int64)
    for op in VOp:
        entry = hw.pe_ops.get(COST_NAME[op])
        for dt in DType if entry else ():
            unit = hw.units.get(entry.cost(DTYPE_FORMAT[dt]).unit)
            vop_slot[op, dt] = slot(unit.slot) if unit else -1
    mau = hw.units.get("MAU")
    return dict(slot_names=names, vop_slot=vop_slot,
                path_slot=np.array([slot(hw.transfers[n].slot) for n in path_names], dtype=np.int64),
                mm_slot=slot(mau.slot) if mau else -1)


def _vop_costs(hw: HwDesc) -> tuple[np.ndarray, np.ndarray]:
    """Issues and lanes per (op, dtype) from the entry for
    that dtype (`pe_ops.<op>.dtypes.<format>`, else the default): an int32 add is costed on the
    ALU that runs it, not on the MAU of the float add."""
    dtype_issues = np.zeros((len(VOp), len(DType)), dtype=np.int64)
    lanes = np.zeros((len(VOp), len(DType)), dtype=np.int64)
    for op in VOp:
        entry = hw.pe_ops.get(COST_NAME[op])
        if entry is None:
            continue
        for dt in DType:
            cost = entry.cost(DTYPE_FORMAT[dt])
            dtype_issues[op, dt] = cost.issues
            lanes[op, dt] = _lanes(hw, cost.unit, DTYPE_FORMAT[dt])
    return dtype_issues, lanes


def _lanes(hw: HwDesc, unit_name: str, fmt: str) -> int:
    """Elements of `fmt` one PE processes per step on `unit_name` (0: the unit has no vector mode
    for it); a unit shared by several PEs (the MAU of a MAB) gives each its share."""
    unit = hw.units[unit_name]
    mode = unit.vector.get(fmt)
    if mode is None:
        return 0
    return max(1, mode.lanes_per_cycle * hw.step_cycles // hw.fanout(unit.level, hw.leaf_level))

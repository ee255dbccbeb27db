"""The memory chain a compiled program moves data through, read from a chip's description.

The compiler never names a memory, a path or a unit: it asks the chain. From the YAML it finds

* the top memory: the Location at the Data Engines' level (DRAM on MN-Core 2);
* three hops down to the PEs, each a transfer path and its inverse: the Data Engines' path from
  the top memory into the next one (L2BM), the PE stream's path into the one below (L1BM), and the
  PE stream's path into the PEs' own memories (LM0, LM1, GRF0, GRF1);
* the PE memories that are Locations (LM0, LM1) and the scratch ones;
* the fan-outs and layout axes of each level, and the unit that multiplies matrices.

The staging patterns (compiler.transfer.staging) are those of such a three-hop chain; a chip
whose description has another shape is refused here with a message that says what was found.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from hwdesc import HwDesc
from hwdesc.figures import side_rates

from .errors import CompileError


@dataclass(frozen=True)
class Chain:
    hw: HwDesc
    dram: str  # the top memory (its level has the Data Engines)
    l2: str  # below it, fed by the Data Engines
    l1: str  # below that, fed by the PE stream
    pe_memories: tuple[str, ...]  # the PE memories the last hop reaches
    lm: tuple[str, ...]  # those of them that are Locations (tensor homes), first preferred
    dram_to_l2: str  # path names, down and up each hop
    l2_to_dram: str
    l2_to_l1: str
    l1_to_l2: str
    l1_to_pe: str
    pe_to_l1: str
    matrix_unit: str | None
    groups: int  # instances of the top memory (one Data Engine each)
    l2_per_group: int
    l1_per_l2: int
    pes_per_l1: int
    pes_per_unit: int  # PEs a 16x1 mode treats as one unit (the MAB's PEs)
    l2_chunk: int  # round-robin chunk of the l2 hop's distribute / collect
    l2_axis: str
    l1_axis: str
    unit_axis: str
    pe_axis: str

    @staticmethod
    def of(hw: HwDesc) -> "Chain":
        return _chain(hw)

    @property
    def scratch(self) -> tuple[str, ...]:
        """PE memories a kernel may use for its operands and temporaries, Locations first."""
        return self.lm + tuple(m for m in self.pe_memories if m not in self.lm)

    @property
    def spread_chunk(self) -> int:
        """The block of the Data Engines' distributed broadcast (mvb4: every Group's DRAM to every
        Group's L2Bs at once); 0 when the chip has none, has one Group, or has no upload that
        inverts it (a collect over a Group's L2Bs in blocks of the same size)."""
        down = self.hw.transfers[self.dram_to_l2].modes.get("distributed_broadcast")
        up = self.hw.transfers[self.l2_to_dram].modes.get("collect")
        if down is None or up is None or self.groups < 2 or (down.chunk_lw or 1) != (up.chunk_lw or 1):
            return 0
        return down.chunk_lw or 1

    @property
    def l1_subsets(self) -> bool:
        """Whether the l2 hop's broadcast can send to one L1B alone (l2bmb@set), so that an L2B can
        hold each L1B's data as a block of its own (transfer.staging's `blocks`)."""
        broadcast = self.hw.transfers[self.l2_to_l1].modes.get("broadcast")
        return broadcast is not None and broadcast.subsets

    def spread_saving(self, n_l2: float) -> float:
        """Data Engine cycles each Group saves bringing `n_l2` long words into every one of its
        L2Bs by distributed broadcast (each Group reads 1/groups of them) instead of one
        individual MV per L2B from its own copy; worth a spread image when it exceeds the DRAM
        latency (below that, a tensor's fetch is its latency either way)."""
        own = side_rates(self.hw, self.dram_to_l2, "individual")[0]
        src, dst = side_rates(self.hw, self.dram_to_l2, "distributed_broadcast")
        return self.l2_per_group * n_l2 / own - max(self.l2_per_group * n_l2 / self.groups / src, n_l2 / dst)

    def worth_spreading(self, n_l2: float) -> bool:
        latency = self.hw.transfers[self.dram_to_l2].latency_cycles
        return bool(self.spread_chunk) and self.spread_saving(n_l2) >= latency

    def level_of(self, memory: str) -> str:
        return self.hw.memories[memory].level


def _path(hw: HwDesc, engine: str, src: str, deeper_than: str | None = None, dst: str | None = None) -> tuple[str, tuple[str, ...]]:
    levels = hw.level_names
    for name, t in hw.transfers.items():
        if t.engine != engine or src not in t.src:
            continue
        targets = [m for m in t.dst if m in hw.memories]
        if dst is not None and dst in targets:
            return name, (dst,)
        if deeper_than is not None and targets and all(
                levels.index(hw.memories[m].level) > levels.index(deeper_than) for m in targets):
            return name, tuple(targets)
    want = f"to {dst}" if dst else f"to a memory below {deeper_than}"
    raise CompileError(f"{hw.name}: no {engine} transfer from {src} {want}; mnsim's compiler moves tensors down a "
                       f"chain top memory -(Data Engine)-> L2 -(PE stream)-> L1 -(PE stream)-> PE memories")


@cache
def _chain(hw: HwDesc) -> Chain:
    top_level = hw.data_engine.level
    tops = [m for m, mem in hw.memories.items() if mem.level == top_level and mem.location]
    if len(tops) != 1:
        raise CompileError(f"{hw.name}: expected one Location memory at the {top_level} level (the Data Engines'), "
                           f"found {tops or 'none'}")
    dram = tops[0]
    down1, (l2,) = _path(hw, "data_engine", dram, deeper_than=top_level)
    up1, _ = _path(hw, "data_engine", l2, dst=dram)
    down2, (l1,) = _path(hw, "pe_stream", l2, deeper_than=hw.memories[l2].level)
    up2, _ = _path(hw, "pe_stream", l1, dst=l2)
    down3, pes = _path(hw, "pe_stream", l1, deeper_than=hw.memories[l1].level)
    up3, _ = _path(hw, "pe_stream", pes[0], dst=l1)
    if any(hw.memories[m].level != hw.leaf_level for m in pes):
        raise CompileError(f"{hw.name}: path {down3} must end at the {hw.leaf_level} level")
    lm = tuple(m for m in pes if hw.memories[m].location)
    if not lm:
        raise CompileError(f"{hw.name}: none of the PE memories {list(pes)} is a Location")
    matrix = [name for name, u in hw.units.items() if u.matrix]
    l2_level, l1_level = hw.memories[l2].level, hw.memories[l1].level
    unit_level = hw.transfers[down3].group_level or hw.leaf_level
    return Chain(hw, dram, l2, l1, pes, lm, down1, up1, down2, up2, down3, up3, matrix[0] if matrix else None,
                 hw.instances(top_level), hw.fanout(top_level, l2_level), hw.fanout(l2_level, l1_level),
                 hw.fanout(l1_level, hw.leaf_level), hw.fanout(unit_level, hw.leaf_level),
                 hw.transfers[down2].modes["distribute"].chunk_lw or 1 if "distribute" in hw.transfers[down2].modes
                 else 1, hw.levels[l2_level].axis, hw.levels[l1_level].axis, hw.levels[unit_level].axis,
                 hw.levels[hw.leaf_level].axis)

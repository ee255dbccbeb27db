"""`Machine`: the device state of one chip, and running programs on it.

The state is one uint32 array per memory kind with one row per instance (DRAM and PDM per Group,
L2BM per L2B, L1BM per L1B, LM0/LM1/GRF0/GRF1 per PE, ...), sized from the YAML; DRAM starts
empty and grows to the highest address a program or an allocation touches. `run` validates a
program, then executes it functionally (data really moves through the memories), times it, or
both.
"""

from __future__ import annotations

from typing import Literal, Sequence

import numpy as np

from hwdesc import HwDesc

from . import functional, isa
from .alloc import Allocator
from .isa import Op
from .params import MachineParams
from .program import Bound, Program
from .replicas import Replicas
from .stats import RunStats
from .timing import time_code
from .errors import SimError
from .validate import max_addresses, symbol_extents, validate

RunMode = Literal["both", "timing", "functional"]


DRAM = "DRAM"


class Machine:
    """Memories of one simulated chip plus allocators for DRAM buffers."""

    def __init__(self, hw: HwDesc) -> None:
        self.hw = hw
        self.params = MachineParams.from_hw(hw)
        p = self.params
        self._rows: list[np.ndarray] = []  # what the engine runs on: replicated ranges may be pending
        for m, name in enumerate(p.memory_names):
            words = 0 if name == DRAM else int(p.mem_words[m])
            self._rows.append(np.zeros((int(p.mem_instances[m]), words), dtype=np.uint32))
        self.replicas = Replicas(p, self._rows)
        self.dram = Allocator(DRAM, hw.memory_lw(DRAM), "long words", align=1)

    # ---- memory -----------------------------------------------------------------------------

    @property
    def memories(self) -> list[np.ndarray]:
        """Every memory, whole (replicas a run left pending written out), one array per kind.
        The arrays are whole as of this call: the next run may leave copies pending in them
        again (sim.replicas), so ask again after a run rather than keep them."""
        self.replicas.materialize_all()
        return self._rows

    def memory(self, name: str) -> np.ndarray:
        """One memory kind, [instances, words], whole as of this call (see `memories`)."""
        return self.memories[self.params.memory_id(name)]

    def grow(self, name: str, words: int) -> None:
        """Make every instance of a growable memory (DRAM) hold at least `words` words."""
        m = self.params.memory_id(name)
        current = self._rows[m]
        if words <= current.shape[1]:
            return
        cap = int(self.params.mem_words[m])
        new = min(cap, max(words, 2 * current.shape[1], 1 << 16))
        grown = np.zeros((current.shape[0], new), dtype=np.uint32)
        grown[:, : current.shape[1]] = current
        self._rows[m] = grown

    def alloc_dram(self, n_lw: int, align: int | None = None) -> int:
        """A DRAM region of n long words, the same range in every Group's DRAM, aligned to the MV
        unit (so that transfers of whole units stay inside it)."""
        addr = self.dram.alloc(n_lw, align or self.params.dram_align)
        self.grow(DRAM, self.params.words_per_lw * self.dram.high_water)
        return addr

    def free_dram(self, addr: int) -> None:
        self.dram.free(addr)

    # ---- running ----------------------------------------------------------------------------

    def run(self, program: Program | np.ndarray, *, mode: RunMode = "both", host: Sequence[np.ndarray] = (),
            bases: dict[str, int] | None = None, validated: bool = False) -> RunStats | None:
        """Run a program. `host` are uint32 arrays the HOST_DMA instructions read or write;
        `bases` binds a Program's relocatable buffers. Returns RunStats unless mode is functional."""
        host = [np.ascontiguousarray(h).view(np.uint32).reshape(-1) for h in host]
        if isinstance(program, Program):
            if not validated:
                self._check_program(program, bases or {}, [len(h) for h in host])
            bound = program.bound(bases or {}, self.hw.fingerprint)
            if program.stepped is None:
                program.stepped = functional.stepped_rows(program.code)
            stepped, timed = program.stepped, program.timed
        else:
            bound = Bound((), np.ascontiguousarray(program, np.int64))
            if not validated:
                validate(self.params, bound.code, [len(h) for h in host])
            stepped, timed = None, {}
        if mode in ("both", "functional"):
            self._execute(bound, host, stepped)
        if mode == "functional":
            return None
        if self.hw.fingerprint not in timed:
            timed[self.hw.fingerprint] = self.time(bound.code)
        return timed[self.hw.fingerprint]

    def _check_program(self, program: Program, bases: dict[str, int], host_words: list[int]) -> None:
        """Validate a Program once per chip and host-buffer sizes; at every binding only check that
        each relocatable buffer's base plus the extent its instructions reach fits its memory."""
        key = (self.hw.fingerprint, tuple(host_words))
        if key not in program.validated:
            validate(self.params, program.code, host_words)
            program.validated[key] = symbol_extents(self.params, program.code, program.relocs, program.symbols)
        for name, (mem, extent) in program.validated[key].items():
            base = bases.get(name)
            if base is None:
                raise SimError(f"no address bound for buffer {name!r}")
            capacity = int(self.params.mem_words[mem]) // self.params.words_per_lw
            if base < 0 or base + extent > capacity:
                raise SimError(f"buffer {name!r} bound at long word {base} reaches {base + extent - 1}, outside "
                               f"{self.params.memory_names[mem]} (0..{capacity - 1})")

    def time(self, code: np.ndarray) -> RunStats:
        """Cycles of a (validated) instruction array, from the YAML numbers only."""
        return time_code(self.params, code)

    def _execute(self, bound: Bound, host: list[np.ndarray], stepped: list[int] | None) -> None:
        p = self.params
        if bound.tops is None:
            bound.tops = max_addresses(p, bound.code)
        for m, top in bound.tops.items():
            if p.memory_names[m] == DRAM:
                self.grow(DRAM, top)
        functional.execute(p, self._rows, bound.code, {Op.HOST_DMA: lambda row: self._host_dma(row, host)}, stepped,
                           bound.derived, self.replicas)

    def _host_dma(self, row: np.ndarray, host: list[np.ndarray]) -> None:
        p = self.params
        pdm = self._rows[p.host_memory]
        buf = host[row[isa.DMA_HOST_BUF]]
        n, off, addr = int(row[isa.DMA_N]), int(row[isa.DMA_HOST_OFF]), int(row[isa.DMA_PDM_ADDR])
        w = p.words_per_lw
        device = pdm[p.host_instance, w * addr: w * (addr + n)]
        if row[isa.DMA_DIR] == 0:
            device[:] = buf[w * off: w * (off + n)]
        else:
            buf[w * off: w * (off + n)] = device

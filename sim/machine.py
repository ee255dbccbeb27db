"""`Machine`: the device state of one chip, and running programs on it.

The state is one uint32 array per memory kind with one row per instance (DRAM and PDM per Group,
L2BM per L2B, L1BM per L1B, LM0/LM1/GRF0/GRF1 per PE, ...), sized from the YAML; DRAM starts
empty and grows to the highest address a program or an allocation touches. `run` validates a
program, then executes it functionally (data really moves through the memories), times it, or
both.
"""

from __future__ import annotations

import functools
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Literal, Sequence

import numpy as np
from numpy.lib.stride_tricks import as_strided

from hwdesc import HwDesc

from . import functional, isa
from .alloc import Allocator
from .isa import DType, Op
from .params import MachineParams
from .program import Bound, Program
from .stats import RunStats
from .timing import time_code
from .errors import SimError
from .validate import max_addresses, symbol_extents, validate

RunMode = Literal["both", "timing", "functional"]
_WORKERS = os.cpu_count() or 1


@functools.cache
def _pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(_WORKERS, thread_name_prefix="mnsim-mau")


DRAM = "DRAM"


class Machine:
    """Memories of one simulated chip plus allocators for DRAM buffers."""

    def __init__(self, hw: HwDesc) -> None:
        self.hw = hw
        self.params = MachineParams.from_hw(hw)
        p = self.params
        self.memories: list[np.ndarray] = []
        for m, name in enumerate(p.memory_names):
            words = 0 if name == DRAM else int(p.mem_words[m])
            self.memories.append(np.zeros((int(p.mem_instances[m]), words), dtype=np.uint32))
        self.dram = Allocator(DRAM, hw.memory_lw(DRAM), "long words", align=1)

    # ---- memory -----------------------------------------------------------------------------

    def memory(self, name: str) -> np.ndarray:
        return self.memories[self.params.memory_id(name)]

    def grow(self, name: str, words: int) -> None:
        """Make every instance of a growable memory (DRAM) hold at least `words` words."""
        m = self.params.memory_id(name)
        current = self.memories[m]
        if words <= current.shape[1]:
            return
        cap = int(self.params.mem_words[m])
        new = min(cap, max(words, 2 * current.shape[1], 1 << 16))
        grown = np.zeros((current.shape[0], new), dtype=np.uint32)
        grown[:, : current.shape[1]] = current
        self.memories[m] = grown

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
        functional.execute(p, self.memories, bound.code, {Op.MATMUL: lambda row: self._matmul(row, host),
                                                     Op.HOST_DMA: lambda row: self._host_dma(row, host)},
                           stepped)

    def _host_dma(self, row: np.ndarray, host: list[np.ndarray]) -> None:
        p = self.params
        pdm = self.memories[p.host_memory]
        buf = host[row[isa.DMA_HOST_BUF]]
        n, off, addr = int(row[isa.DMA_N]), int(row[isa.DMA_HOST_OFF]), int(row[isa.DMA_PDM_ADDR])
        w = p.words_per_lw
        device = pdm[p.host_instance, w * addr: w * (addr + n)]
        if row[isa.DMA_DIR] == 0:
            device[:] = buf[w * off: w * (off + n)]
        else:
            buf[w * off: w * (off + n)] = device

    def _matmul(self, row: np.ndarray, host: list[np.ndarray]) -> None:
        """C (+)= A @ B on every MAB at once: K is split over a MAB's PEs in A and B, N in C, so
        each PE's slice is a row-major matrix and the products are plain BLAS calls."""
        p = self.params
        pes = p.pes_per_mab
        dtype = DType(int(row[isa.MM_DTYPE]))
        m, k, n = int(row[isa.MM_M]), int(row[isa.MM_K]), int(row[isa.MM_N])
        kp, np_ = k // pes, n // pes
        trans = bool(row[isa.MM_FLAGS] & isa.MM_TRANS_B)

        def operand(mem_f: int, rows: int, cols: int, half: bool) -> np.ndarray:
            mem = self.memories[int(row[mem_f])]
            view = mem.view(np.uint16) if half else mem.view(np.float32)
            per_pe = view.shape[1]
            flat = view.reshape(-1)[int(row[mem_f + 1]):]
            pitch = int(row[mem_f + 2])
            item = view.itemsize
            n_mab = view.shape[0] // pes
            out = as_strided(flat, shape=(n_mab, pes, rows, cols),
                             strides=(pes * per_pe * item, per_pe * item, pitch * item, item))
            return p.half.table[out] if half else out

        half = dtype == DType.float16
        a = operand(isa.MM_A_MEM, m, kp, half)
        b = operand(isa.MM_B_MEM, n, kp, half).swapaxes(-1, -2) if trans else operand(isa.MM_B_MEM, kp, n, half)
        if dtype == DType.pfloat32:  # float32 words, their low mantissa bits ignored (truncated); a
            # NaN stays NaN (clearing its payload could make it an infinity), as special values follow torch
            a, b = (np.where(np.isnan(x), x, (x.view(np.uint32) & np.uint32(p.pseudo_mask)).view(np.float32))
                    for x in (a, b))
        c = operand(isa.MM_C_MEM, m, np_, False)
        accumulate = bool(row[isa.MM_FLAGS] & isa.MM_ACCUMULATE)

        # Two ways to one product, whichever moves fewer words: with the PEs' K-slices side by
        # side (a copy of A and B, one product over the whole K per MAB), or one product per PE's
        # K-slice read in place, summed (pes - 1 additions of an M x N tile). ResNet-50 conv2_x's
        # M=28 K=576 N=8 takes the second (52 -> 15 ms a MATMUL), the 1024^3 product's M=16 K=16 N=128 the first.
        in_place = (pes - 1) * m * n < a[0].size + b[0].size

        def mabs(first: int, last: int) -> None:
            count = last - first
            with np.errstate(invalid="ignore", over="ignore"):  # padding holds whatever its memory held (as on
                # the chip): inf x 0 there makes a NaN in padding only
                if in_place:
                    tile = np.matmul(a[first:last, 0], b[first:last, 0])
                    for q in range(1, pes):
                        tile += np.matmul(a[first:last, q], b[first:last, q])
                else:
                    tile = np.matmul(a[first:last].transpose(0, 2, 1, 3).reshape(count, m, pes * kp),
                                     b[first:last].reshape(count, pes * kp, n))
            result = tile.reshape(count, m, pes, np_).transpose(0, 2, 1, 3)
            if accumulate:
                c[first:last] += result
            else:
                c[first:last] = result

        # Many small products: BLAS alone keeps one core busy, so split the MABs over the cores.
        n_mab = a.shape[0]
        bounds = np.linspace(0, n_mab, min(_WORKERS, n_mab) + 1).astype(int)
        list(_pool().map(lambda k: mabs(bounds[k], bounds[k + 1]), range(len(bounds) - 1)))

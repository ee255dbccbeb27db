"""`ProgramBuilder`: write programs with names instead of field numbers.

Hand-written test programs and the compiler's code generator both emit instructions through
this one API. Memories, modes and ops are given by name; an address may be a `Sym` (an offset
into a named, relocatable buffer) that `Program.bind` resolves at run time.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from . import isa
from .errors import SimError
from .isa import ALL_GROUPS, FIELDS, IMM, DType, Dir, Mode, Op, Red, Scope, VOp
from .params import MachineParams
from .program import Program
from .hazards import involved, schedule as schedule_hazards
from .validate import validate_fields


def _fields_valid(params: MachineParams, rows: np.ndarray) -> bool:
    """Whether the fields the hazard analysis reads (of these rows) are valid: it times the
    PE-stream instructions with the unchecked numba engine. The whole program is validated when
    it runs."""
    try:
        validate_fields(params, rows, None)
    except SimError:
        return False
    return True


@dataclass(frozen=True)
class Sym:
    """An address inside a relocatable buffer: `Sym("x") + 64` is long word 64 of buffer x."""

    name: str
    offset: int = 0

    def __add__(self, k: int) -> "Sym":
        return Sym(self.name, self.offset + int(k))


Address = int | Sym
Operand = tuple[str, int, int, int] | float | None  # (memory, element address, outer stride, inner stride) or an immediate


def f32_bits(x: float) -> int:
    return int(np.array([x], dtype=np.float32).view(np.uint32)[0])


def i32_bits(x: int | float) -> int:
    """The two's-complement bits of an int32 immediate; a float is taken only when integral (the
    compiler writes its scalars as floats), since truncating one silently would change a result."""
    if isinstance(x, float) and not x.is_integer():
        raise SimError(f"an int32 operand's immediate must be an integer, not {x!r}")
    info = np.iinfo(np.int32)
    if not info.min <= int(x) <= info.max:
        raise SimError(f"immediate {x!r} does not fit an int32 ({info.min}..{info.max})")
    return int(np.array([int(x)], dtype=np.int32).view(np.uint32)[0])


def imm_bits(x: int | float | None, dtype: DType) -> int:
    """The address field of an immediate operand of `dtype` (see `isa.IMM`): int32 bits for an
    int32 operand, float64 bits for a float64 one, float32 bits otherwise; None (an operand the op
    does not read) is 0. (Not `x or 0`: that turns -0.0 into +0.0, and x / -0.0 into +inf.)"""
    if x is None:
        x = 0
    if dtype == DType.float64:
        return int(np.array([float(x)], dtype=np.float64).view(np.int64)[0])
    return i32_bits(x) if dtype == DType.int32 else f32_bits(float(x))


class InstructionLimit(SimError):
    """A builder given a `limit` was asked for more instructions: raised as the block that crosses
    it is emitted, before the program's memory is spent (the planner times candidate programs
    under a budget once it has a cheaper one; compiler.planner.search)."""


class ProgramBuilder:
    def __init__(self, params: MachineParams, limit: int | None = None) -> None:
        self.params = params
        self.limit = limit  # instructions this builder may hold (None: any number)
        self._blocks: list[np.ndarray] = []  # [k, FIELDS] instruction blocks, in order
        self._count = 0
        self._relocs: list[tuple[int, int, int]] = []
        self._reloc_blocks: list[np.ndarray] = []  # [k, 3] (instruction, field, symbol) of mv_block
        self._symbols: dict[str, int] = {}
        self._labels: list[tuple[int, int, str]] = []
        self._bundle: bool | None = None  # inside `together`: whether a member was emitted yet

    def __len__(self) -> int:
        return self._count

    # ---- low level --------------------------------------------------------------------------

    def _mem(self, name: str) -> int:
        return self.params.memory_id(name)

    def _emit(self, op: Op, fields: dict[int, Address]) -> int:
        self._check_limit(1)
        row = np.zeros((1, FIELDS), dtype=np.int64)
        row[0, 0] = op
        if self._bundle is not None and op in (Op.VOP, Op.XFER, Op.MATMUL):
            row[0, isa.F_WITH_PREVIOUS] = 1 if self._bundle else 0
            self._bundle = True
        index = self._count
        for k, v in fields.items():
            if isinstance(v, Sym):
                self._relocs.append((index, k, self._symbol(v.name)))
                row[0, k] = v.offset
            else:
                row[0, k] = int(v)
        self._blocks.append(row)
        self._count += 1
        return index

    def _check_limit(self, more: int) -> None:
        """Raise InstructionLimit if `more` instructions would pass the limit."""
        if self.limit is not None and self._count + more > self.limit:
            raise InstructionLimit(f"the program would pass its limit of {self.limit:,} instructions")

    def _symbol(self, name: str) -> int:
        return self._symbols.setdefault(name, len(self._symbols))

    @property
    def count(self) -> int:
        """Instructions emitted so far (the index the next one gets)."""
        return self._count

    @contextlib.contextmanager
    def label(self, name: str) -> Iterator[None]:
        """Name the instructions emitted inside the block (for reports and traces)."""
        first = self._count
        yield
        if self._count > first:
            self._labels.append((first, self._count, name))

    @contextlib.contextmanager
    def together(self) -> Iterator[None]:
        """Issue the VOPs, XFERs and MATMULs emitted inside the block in the same steps (one bundle
        of the issue model, sim.isa): each after the first carries `isa.F_WITH_PREVIOUS`."""
        if self._bundle is not None:
            raise SimError("bundles do not nest")
        self._bundle = False
        try:
            yield
        finally:
            self._bundle = None

    @contextlib.contextmanager
    def ahead_of_bundle(self) -> Iterator[None]:
        """Emit instructions on their own before the bundle `together` has opened, which has no
        member yet (a direct convolution's MATMULs but the last, when the last goes with a
        transfer)."""
        if self._bundle:
            raise SimError("internal: the bundle has members already")
        opened, self._bundle = self._bundle, None
        try:
            yield
        finally:
            self._bundle = opened

    def extend(self, code: np.ndarray) -> None:
        """Append instructions built elsewhere (rows without relocatable addresses): a kernel emits
        the same compute for every time slice once, then repeats it."""
        if len(code):
            self._check_limit(len(code))
            self._blocks.append(np.ascontiguousarray(code, dtype=np.int64).reshape(-1, FIELDS))
            self._count += len(code)

    def build(self, *, hazards: bool = True) -> Program:
        """The program, with the nops its hazards need inserted (`sim.hazards.schedule`), so
        that what a kernel emits is what the validator accepts. Labels and relocations follow
        the instructions. A program whose fields are invalid is returned as written: running it
        raises the error. `hazards=False` keeps it exactly as written (to test the validator)."""
        code, moved = self._scheduled(hazards)
        relocs = np.concatenate([np.array(self._relocs, dtype=np.int64).reshape(-1, 3), *self._reloc_blocks])
        relocs = relocs[np.argsort(relocs[:, 0], kind="stable")]
        symbols = tuple(sorted(self._symbols, key=self._symbols.get))
        labels = list(self._labels)
        if moved is not None:
            relocs[:, 0] = moved[relocs[:, 0] + 1] - 1
            labels = [(int(moved[a]), int(moved[b]), name) for a, b, name in labels]
        return Program(code, labels, relocs, symbols)

    def build_code(self) -> np.ndarray:
        """`build`'s instructions alone: what timing a candidate needs. Its relocations (one per
        gathered MV, sorted) and labels are left out: a planner times thousands of candidates,
        some of a million rows (a 2-layer MLP's training step: 1.3 of the 32 s of its compile)."""
        return self._scheduled(True)[0]

    def _scheduled(self, hazards: bool) -> tuple[np.ndarray, np.ndarray | None]:
        """The instructions with their hazard nops (`hazards`), and where each row moved (None
        when none was inserted)."""
        code = np.concatenate(self._blocks) if self._blocks else np.zeros((0, FIELDS), dtype=np.int64)
        rows = involved(code) if hazards and len(code) else None
        if rows is not None and _fields_valid(self.params, code[rows]):
            return schedule_hazards(self.params, code, rows)
        return code, None

    # ---- instructions -----------------------------------------------------------------------

    def nop(self, steps: int = 1) -> int:
        return self._emit(Op.NOP, {isa.NOP_STEPS: steps})

    def wait(self, tag: int) -> int:
        return self._emit(Op.WAIT, {isa.WAIT_TAG: tag})

    def mv(self, mode: str, src_mem: str, src_addr: Address, dst_mem: str, dst_addr: Address, n_lw: int, *, tag: int,
           src_inst: int = ALL_GROUPS, dst_inst: int = ALL_GROUPS, src_local: int = 0, dst_local: int = 0,
           red: str = "none", dtype: str = "float32", scope: str = "group") -> int:
        """A Data Engine transfer. With the default instances (-1) it runs in every Group at once,
        between the Group's `src_local`-th and `dst_local`-th instances of the two memories."""
        return self._emit(Op.MV, {
            isa.MV_MODE: Mode[mode], isa.MV_SRC_MEM: self._mem(src_mem), isa.MV_SRC_INST: src_inst,
            isa.MV_SRC_ADDR: src_addr, isa.MV_DST_MEM: self._mem(dst_mem), isa.MV_DST_INST: dst_inst,
            isa.MV_DST_ADDR: dst_addr, isa.MV_N: n_lw, isa.MV_TAG: tag, isa.MV_RED: Red[red], isa.MV_DTYPE: DType[dtype],
            isa.MV_SRC_LOCAL: src_local, isa.MV_DST_LOCAL: dst_local, isa.MV_SCOPE: Scope[scope]})

    def mv_block(self, mode: str, src_mem: str, src_addr: Address | list[Address], src_offsets: np.ndarray,
                 dst_mem: str, dst_addr: Address, dst_offsets: np.ndarray, n_lw: np.ndarray, *, tag: int,
                 src_inst: np.ndarray | int, dst_inst: np.ndarray | int, src_which: np.ndarray | None = None,
                 dst_local: np.ndarray | int = 0) -> None:
        """Many individual MVs at once (a gather's runs): row k moves n_lw[k] long words from
        src_addr + src_offsets[k] to dst_addr + dst_offsets[k]. With a list of source bases,
        row k reads from src_addr[src_which[k]]. Same encoding as `mv` (`dst_local`: the
        destination's instance in each Group, for MVs in every Group)."""
        k = len(n_lw)
        if k == 0:
            return
        self._check_limit(k)  # before the block is allocated
        block = np.zeros((k, FIELDS), dtype=np.int64)
        block[:, 0] = Op.MV
        block[:, isa.MV_MODE] = Mode[mode]
        block[:, isa.MV_SRC_MEM], block[:, isa.MV_DST_MEM] = self._mem(src_mem), self._mem(dst_mem)
        block[:, isa.MV_SRC_INST], block[:, isa.MV_DST_INST] = src_inst, dst_inst
        block[:, isa.MV_DST_LOCAL] = dst_local
        block[:, isa.MV_N], block[:, isa.MV_TAG] = n_lw, tag
        block[:, isa.MV_RED], block[:, isa.MV_DTYPE] = Red["none"], DType["float32"]
        block[:, isa.MV_SCOPE] = Scope["group"]
        rows = np.arange(self._count, self._count + k)
        bases = src_addr if isinstance(src_addr, list) else [src_addr]
        which = np.zeros(k, dtype=np.int64) if src_which is None else np.asarray(src_which)
        fields = [(isa.MV_SRC_ADDR, base, src_offsets, which == b) for b, base in enumerate(bases)]
        fields.append((isa.MV_DST_ADDR, dst_addr, dst_offsets, None))
        for field_, base, offsets, mine in fields:
            at = slice(None) if mine is None or len(bases) == 1 else mine
            picked = rows[at]
            if len(picked) == 0:
                continue
            offsets = np.asarray(offsets)[at] if np.ndim(offsets) else offsets
            if isinstance(base, Sym):
                block[at, field_] = base.offset + offsets
                self._reloc_blocks.append(np.stack([picked, np.full(len(picked), field_),
                                                    np.full(len(picked), self._symbol(base.name))], 1))
            else:
                block[at, field_] = int(base) + offsets
        self._blocks.append(block)
        self._count += k

    def host_dma(self, to_device: bool, pdm_addr: Address, host_buf: int, host_off_lw: int, n_lw: int, *, tag: int) -> int:
        return self._emit(Op.HOST_DMA, {isa.DMA_DIR: 0 if to_device else 1, isa.DMA_PDM_ADDR: pdm_addr,
                                        isa.DMA_HOST_BUF: host_buf, isa.DMA_HOST_OFF: host_off_lw, isa.DMA_N: n_lw,
                                        isa.DMA_TAG: tag})

    def xfer(self, mode: str, direction: str, up_mem: str, up_addr: int, lo_mem: str, lo_addr: int, n_lw: int, *,
             red: str = "none", dtype: str = "float32", index: int = 0) -> int:
        """A PE-stream transfer between an upper memory (L2BM, L1BM) and its children, in every
        upper instance at once; `n_lw` counts long words on the upper side. `index`: the group an
        individual transfer reads, or the children (a bit mask) a broadcast down writes, 0 all."""
        return self._emit(Op.XFER, {isa.X_MODE: Mode[mode], isa.X_DIR: Dir[direction], isa.X_UP_MEM: self._mem(up_mem),
                                    isa.X_UP_ADDR: up_addr, isa.X_LO_MEM: self._mem(lo_mem), isa.X_LO_ADDR: lo_addr,
                                    isa.X_N: n_lw, isa.X_RED: Red[red], isa.X_DTYPE: DType[dtype], isa.X_INDEX: index})

    def vop(self, op: str, dtype: str, n_outer: int, n_inner: int, dst: Operand, a: Operand, b: Operand = None,
            c: Operand = None, *, src_dtype: str | None = None) -> int:
        """Element-wise op on every PE: dst[i, j] = op(a[i, j], b[i, j], c[i, j]); an operand is
        (memory, element address, outer stride, inner stride) or an immediate number.

        An immediate is encoded in its operand's dtype (`isa.IMM`): as int32 bits when that is
        int32 (a must then be an integer, or an integral float), else as float32 bits. The
        operand dtype is `dtype`, except for a of a cvt, which is `src_dtype`."""
        vop = isa.vop_named(op)
        fields = {isa.V_OP: vop, isa.V_DTYPE: DType[dtype], isa.V_N_OUTER: n_outer, isa.V_N_INNER: n_inner,
                  isa.V_SRC_DTYPE: DType[src_dtype or dtype]}
        for base, operand in ((isa.V_DST, dst), (isa.V_A, a), (isa.V_B, b), (isa.V_C, c)):
            if operand is None or isinstance(operand, (int, float)):
                kind = fields[isa.V_SRC_DTYPE] if base == isa.V_A and vop == VOp.cvt else fields[isa.V_DTYPE]
                fields.update({base: IMM, base + 1: imm_bits(operand, kind), base + 2: 0, base + 3: 0})
            else:
                mem, addr, so, si = operand
                fields.update({base: self._mem(mem), base + 1: addr, base + 2: so, base + 3: si})
        return self._emit(Op.VOP, fields)

    def matmul(self, dtype: str, m: int, k: int, n: int, a: tuple[str, int, int], b: tuple[str, int, int],
               c: tuple[str, int, int], *, trans_b: bool = False, accumulate: bool = False) -> int:
        """C (+)= A @ B on every MAB. Operands are (memory, element address, row pitch in elements)
        per PE: A is M x K with K split over the MAB's PEs, B is K x N with K split (or N x K when
        `trans_b`), C is float32 M x N with N split; see sim.isa."""
        return self._emit(Op.MATMUL, {
            isa.MM_DTYPE: DType[dtype], isa.MM_M: m, isa.MM_K: k, isa.MM_N: n,
            isa.MM_A_MEM: self._mem(a[0]), isa.MM_A_ADDR: a[1], isa.MM_A_PITCH: a[2],
            isa.MM_B_MEM: self._mem(b[0]), isa.MM_B_ADDR: b[1], isa.MM_B_PITCH: b[2],
            isa.MM_C_MEM: self._mem(c[0]), isa.MM_C_ADDR: c[1], isa.MM_C_PITCH: c[2],
            isa.MM_FLAGS: (isa.MM_TRANS_B if trans_b else 0) | (isa.MM_ACCUMULATE if accumulate else 0)})

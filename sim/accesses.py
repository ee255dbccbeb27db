"""What each instruction of a program reads and writes: memory and address range per operand.

The hazard check (which pairs are too close) and the issue model (which instructions may share a
VLIW word) both ask this of a program; it is computed here once, with numpy over all rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from . import isa
from .isa import IMM, DType, Dir, Mode, Op, VOp
from .params import DTYPE_FORMAT, MachineParams

# Columns of the tables `accesses` returns: a read is (memory, first, last, path); a write also
# says whether it reduces and whether the ALU produced it. At most MAX_READS operands are read.
MEM, FIRST, LAST, PATH, REDUCES, ON_ALU = range(6)
READ_FIELDS, WRITE_FIELDS, MAX_READS = PATH + 1, ON_ALU + 1, 3
ALU_UNIT = "ALU"


@dataclass(frozen=True, eq=False)
class _OpTables:
    vop_alu: np.ndarray  # [VOp, DType] the op runs on the ALU
    vop_arity: np.ndarray  # [VOp] operands read


@lru_cache(maxsize=None)  # one per chip in use
def _op_tables(p: MachineParams) -> _OpTables:
    vop_alu = np.zeros((len(VOp), len(DType)), dtype=np.bool_)
    for op in VOp:
        entry = p.hw.pe_ops.get(isa.COST_NAME[op])
        for dt in DType:
            vop_alu[op, dt] = entry is not None and entry.cost(DTYPE_FORMAT[dt]).unit == ALU_UNIT
    return _OpTables(vop_alu, np.array([isa.arity(op) for op in VOp], dtype=np.int64))


def matmul_operands(c: np.ndarray, pes: int) -> tuple:
    """(name, memory field, rows, columns) per PE of a MATMUL's A, B and C, from one row or from
    an array of rows (sim.isa: K is split over the MAB's PEs in A and B, N in C; B is N x K
    when transposed)."""
    m, kp, n = c[..., isa.MM_M], c[..., isa.MM_K] // pes, c[..., isa.MM_N]
    trans = (c[..., isa.MM_FLAGS] & isa.MM_TRANS_B) != 0
    return (("A", isa.MM_A_MEM, m, kp), ("B", isa.MM_B_MEM, np.where(trans, n, kp), np.where(trans, kp, n)),
            ("C", isa.MM_C_MEM, m, n // pes))


def accesses(p: MachineParams, code: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """What each instruction writes and reads: writes [n, 6] = (memory, first, last, path, reduces,
    on the ALU) and reads [n, 3, 4] = (memory, first, last, path), memory -1 where none. Ranges are
    in the memory's own address units (words or long words), bounding boxes of strided operands."""
    t = _op_tables(p)
    n = len(code)
    op = code[:, 0]
    writes = np.full((n, WRITE_FIELDS), -1, dtype=np.int64)
    reads = np.full((n, MAX_READS, READ_FIELDS), -1, dtype=np.int64)
    def words(first, last, dtype):
        """Element ranges of each row's dtype as word ranges."""
        lo, hi = np.array(first, copy=True), np.array(last, copy=True)
        for dt in np.unique(dtype).tolist():
            if dt in (DType.float16, DType.float64):
                mine = dtype == dt
                lo[mine], hi[mine] = p.word_span(DType(dt), lo[mine], hi[mine])
        return lo, hi

    rows = np.flatnonzero(op == Op.VOP)
    if len(rows):
        c = code[rows]
        vop, dt, no, ni = c[:, isa.V_OP], c[:, isa.V_DTYPE], c[:, isa.V_N_OUTER], c[:, isa.V_N_INNER]
        arity = t.vop_arity[vop]
        for k, base in enumerate((isa.V_DST, isa.V_A, isa.V_B, isa.V_C)):
            mem = c[:, base]
            used = (mem != IMM) & (k <= arity)
            d = np.where((k == 1) & (vop == VOp.cvt), c[:, isa.V_SRC_DTYPE], dt)
            first = c[:, base + 1]
            lo, hi = words(first, first + (no - 1) * c[:, base + 2] + (ni - 1) * c[:, base + 3], d)
            where = rows[used]
            if k == 0:
                writes[where, :PATH] = np.stack([mem, lo, hi], 1)[used]
                writes[where, REDUCES], writes[where, ON_ALU] = 0, t.vop_alu[vop, dt][used]
            else:
                reads[where, k - 1, :PATH] = np.stack([mem, lo, hi], 1)[used]
    rows = np.flatnonzero(op == Op.XFER)
    if len(rows):
        c = code[rows]
        mode, n_lw, um, lm = c[:, isa.X_MODE], c[:, isa.X_N], c[:, isa.X_UP_MEM], c[:, isa.X_LO_MEM]
        down = c[:, isa.X_DIR] == Dir.down
        path = np.where(down, p.path_of[um, lm], p.path_of[lm, um])
        fan = p.mem_instances[lm] // p.mem_instances[um]
        per = np.where(mode == Mode.broadcast, 1,
                       np.where((mode == Mode.distribute) | (mode == Mode.collect), fan, p.path_group[path]))
        lower_n = -(-n_lw // per)
        lo_first = c[:, isa.X_LO_ADDR]
        lo_last = lo_first + lower_n * np.where(p.mem_lw_addressed[lm], 1, p.words_per_lw) - 1
        up_first = c[:, isa.X_UP_ADDR]
        upper = np.stack([um, up_first, up_first + n_lw - 1, path], 1)
        lower = np.stack([lm, lo_first, lo_last, path], 1)
        src, dst = np.where(down[:, None], upper, lower), np.where(down[:, None], lower, upper)
        reads[rows, 0] = src
        writes[rows, :READ_FIELDS] = dst
        writes[rows, REDUCES], writes[rows, ON_ALU] = mode == Mode.reduce, 0
    rows = np.flatnonzero(op == Op.MATMUL)
    if len(rows):
        c = code[rows]
        for k, (name, base, n_rows, cols) in enumerate(matmul_operands(c, p.pes_per_mab)):
            d = p.mm_acc[c[:, isa.MM_DTYPE]] if name == "C" else c[:, isa.MM_DTYPE]  # C: the mode's accumulator
            first = c[:, base + 1]
            lo, hi = words(first, first + (n_rows - 1) * c[:, base + 2] + cols - 1, d)
            access = np.stack([c[:, base], lo, hi, np.full(len(c), -1)], 1)
            if base == isa.MM_C_MEM:
                writes[rows, :READ_FIELDS] = access
                writes[rows, REDUCES], writes[rows, ON_ALU] = 0, 0
                accumulate = (c[:, isa.MM_FLAGS] & isa.MM_ACCUMULATE) != 0
                reads[rows[accumulate], 2] = access[accumulate]
            else:
                reads[rows, k] = access
    rows = np.flatnonzero(op == Op.MV)
    if len(rows):
        c = code[rows]
        sm, first = c[:, isa.MV_SRC_MEM], c[:, isa.MV_SRC_ADDR]
        reads[rows, 0] = np.stack([sm, first, first + c[:, isa.MV_N] - 1, p.path_of[sm, c[:, isa.MV_DST_MEM]]], 1)
    return writes, reads

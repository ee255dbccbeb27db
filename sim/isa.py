"""mnsim's instruction set: macro-instructions, each a run of identical hardware steps.

A program is an int64 array shaped [instructions, FIELDS]; field 0 is the opcode and the rest
are the operands named in `TABLE` below. One row stands for what the hardware does in many
steps (a vector op over an address range, a transfer of n long words in one mode, a MAU matrix
product over tiles), so simulation cost grows with instructions, not with PEs or cycles.

Units of addresses: long words (LW) for LW-addressed memories (DRAM, PDM, L2BM, L1BM), words for
word-addressed ones (LM0, LM1, GRF0, GRF1) as in the hardware; VOP and MATMUL operands count
elements of their dtype (word for float32 and int32, half word for float16, two words for float64,
the first at an even word). Instance fields are global instance
indices of the memory's level; -1 means "in every Group at once" (with the local index within
the Group in the matching *_local field).

The timing rules cite the YAML numbers they use: steps are PE-stream steps of `step_cycles`;
"rate" is a transfer mode's LW/cycle on one side (`transfers.<path>.modes.<mode>`).

The issue model. The PE stream is a VLIW word per step; each instruction of mnsim occupies one
group (slot) of it: a VOP its unit's (`units.<u>.slot`: mau, alu), a MATMUL the MAU's, an XFER
its path's (`transfers.<t>.slot`: l2bm, l1bm). A VOP, XFER or MATMUL with F_WITH_PREVIOUS set
issues in the same steps as the PE-stream instruction before it: together they are a bundle,
which starts when the stream reaches it and holds the stream for its longest member; each
member ends after its own cycles. Without the flag, instructions issue one after another. The
validator (sim.issue) accepts a bundle when its members use distinct slots, none reads or writes
what another writes, each memory is read by at most one member and written by at most one, and a
memory with a single read/write port (1RW) is not read by one member and written by another.
Hazards (sim.hazards) count a bundle as one issue: its members start at its first step.

The matrix registers. The MAU's two faces (the YAML memory at the MAU's level, MREG) are reached
by two PE-stream XFERs: `mwrite` (path pe_to_mreg, mode individual, up: register row r is long
word r of each of a MAB's PEs, PE p's at position p of the row) and `mread` (path mreg_to_pe,
mode transpose, down). A transposed read takes blocks of `side` rows, side = PEs per MAB x
elements per long word of the XFER's dtype (8 float32, 16 half: the register's logical square),
and gives PE p, at lower long word b*side + j, the elements of rows p*epl .. p*epl + epl - 1 of
column j of block b: a MAB transposes side x side tiles whose columns lie across its PEs, the
move between PEs that the SDM's `mread` makes. The validator gives each register face
(`memories.MREG.faces`) to one member of a bundle, and a transposed block starts at a multiple
of its size, so it lies in one face; the compiler writes one face while it reads the other. A
MATMUL takes the MAU's mau-calc and mau-mwrite groups (its slot, `mau`), so the validator never
bundles it with an XFER on a matrix-register path (the SDM allows 2 of the 3 MAU groups in one
step); mwrite shares the slot `mau` with the MAU's VOPs, which is stricter than the SDM (fvadd
and mwrite are separate groups there).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

FIELDS = 24
# Field of every PE-stream instruction (VOP, XFER, MATMUL): 1 = it issues in the same steps as
# the PE-stream instruction before it (one VLIW word; see "the issue model" below).
F_WITH_PREVIOUS = FIELDS - 1
ALL_GROUPS = -1  # an instance field meaning: the same transfer in every Group at once
# A VOP operand memory meaning: an immediate, its bits in the address field, in the operand's
# dtype: int32 bits (two's complement) for an int32 operand, the 64 bits of a float64 for a
# float64 one, float32 bits for every other (a half operand's immediate is a float32, encoded to
# half where used). The operand's dtype is the VOP's, except for operand a of a cvt, which has
# the source dtype.
IMM = -1


class Op(IntEnum):
    NOP = 0
    WAIT = 1
    MV = 2
    HOST_DMA = 3
    XFER = 4
    VOP = 5
    MATMUL = 6


class Mode(IntEnum):
    """Transfer modes (names as in the YAML `modes:` tables)."""

    individual = 0
    broadcast = 1
    mab_broadcast = 2
    distribute = 3
    collect = 4
    reduce = 5
    transpose = 6  # the matrix registers' transposed read (mread): blocks of rows come out as columns
    # mvb4: every Group reads n long words of its own and every Group's L2BMs receive all of them,
    # block j (chunk_lw long words) of Group g at local L2B j mod L2Bs-per-Group, chunk
    # n_groups * (j div L2Bs-per-Group) + g: each Group's L2Bs together hold every Group's data
    distributed_broadcast = 7


class Dir(IntEnum):
    down = 0  # toward the PEs (upper memory -> lower memory)
    up = 1


class Red(IntEnum):
    none = 0
    add = 1
    max = 2
    min = 3


class DType(IntEnum):
    float32 = 0
    float16 = 1  # MN-Core half, 1-6-9
    int32 = 2
    pfloat32 = 3  # pseudo-single: float32 words whose low mantissa bits the MAU ignores; MATMUL operands only
    float64 = 4  # IEEE double (MN-Core 2's 1-11-52): two words, the low half first; VOP and MATMUL operands


class Scope(IntEnum):
    group = 0  # the set of instances in the source's (or destination's) Group
    chip = 1  # every instance on the chip


class VOp(IntEnum):
    """Element-wise PE operations; each is costed by the YAML `pe_ops` entry of `COST_NAME`."""

    copy = 0
    add = 1
    sub = 2
    mul = 3
    div = 4
    fma = 5  # a * b + c
    neg = 6
    max = 7
    min = 8
    relu = 9
    abs = 10
    cmp_lt = 11  # 1.0 where a < b else 0.0
    cmp_le = 12
    cmp_gt = 13
    cmp_ge = 14
    cmp_eq = 15
    cmp_ne = 16
    select = 17  # a != 0 ? b : c
    cvt = 18  # convert from the source dtype (field `src_dtype`) to the dtype
    floor = 19
    reciprocal = 20
    rsqrt = 21
    sqrt = 22
    exp = 23
    log = 24
    tanh = 25
    sigmoid = 26
    erf = 27
    pow = 28
    # appended, so that programs written before keep their meaning
    sin = 29
    cos = 30
    log1p = 31
    expm1 = 32
    ceil = 33
    trunc = 34
    round = 35  # half to even, as torch.round
    sign = 36  # -1, 0 or 1 (0 for a NaN, as torch.sign)
    floor_div = 37  # floor(a / b), as torch.div(rounding_mode="floor")
    rem = 38  # a - b * floor_div(a, b): the sign of b, as torch.remainder
    and_ = 39  # bitwise on int32; on floats nonzero is true and the result 1.0 or 0.0
    or_ = 40
    xor = 41
    shl = 42  # int32 only: a << (b mod 32), the bits shifted out of the word dropped
    shr = 43  # int32 only: a >> (b mod 32), arithmetic (the sign bit copied in): floor(a / 2^b)
    tan = 44
    asin = 45
    acos = 46
    atan = 47
    sinh = 48
    cosh = 49
    asinh = 50
    acosh = 51
    atanh = 52
    erfinv = 53
    lgamma = 54
    digamma = 55
    atan2 = 56  # atan2(a, b): the angle of the point (b, a), as torch.atan2(a, b)
    hypot = 57  # sqrt(a^2 + b^2) without overflow or underflow on the way
    erfc = 58  # 1 - erf(a), without the cancellation: erfc(5) is 1.5e-12, not 0
    erfcx = 59  # exp(a^2) erfc(a), finite where both factors are not: erfcx(100) is 5.6e-3


ARITY = {VOp.copy: 1, VOp.neg: 1, VOp.relu: 1, VOp.abs: 1, VOp.cvt: 1, VOp.floor: 1, VOp.reciprocal: 1,
         VOp.rsqrt: 1, VOp.sqrt: 1, VOp.exp: 1, VOp.log: 1, VOp.tanh: 1, VOp.sigmoid: 1, VOp.erf: 1,
         VOp.sin: 1, VOp.cos: 1, VOp.log1p: 1, VOp.expm1: 1, VOp.ceil: 1, VOp.trunc: 1, VOp.round: 1,
         VOp.sign: 1, VOp.fma: 3, VOp.select: 3,
         **{op: 1 for op in (VOp.tan, VOp.asin, VOp.acos, VOp.atan, VOp.sinh, VOp.cosh, VOp.asinh, VOp.acosh,
                             VOp.atanh, VOp.erfinv, VOp.lgamma, VOp.digamma, VOp.erfc, VOp.erfcx)}}
# The op's name in programs, reports and the YAML: `and_` and `or_` are spelled so only because
# `and` and `or` are Python keywords.
OP_NAME = {op: op.name.rstrip("_") for op in VOp}
COST_NAME = {op: ("cmp" if op.name.startswith("cmp_") else OP_NAME[op]) for op in VOp}
# The ops defined on int32 operands (with two's-complement wraparound); cvt converts to and from
# int32 besides. Every other op is floating point only.
INT32_OPS = frozenset({VOp.copy, VOp.add, VOp.sub, VOp.mul, VOp.neg, VOp.abs, VOp.max, VOp.min, VOp.relu,
                       VOp.cmp_lt, VOp.cmp_le, VOp.cmp_gt, VOp.cmp_ge, VOp.cmp_eq, VOp.cmp_ne, VOp.select,
                       VOp.floor_div, VOp.rem, VOp.and_, VOp.or_, VOp.xor, VOp.sign, VOp.cvt, VOp.shl, VOp.shr})
# The ops defined on int32 alone (shifts of the word's bits).
INT32_ONLY_OPS = frozenset({VOp.shl, VOp.shr})


def arity(op: VOp) -> int:
    return ARITY.get(op, 2)


def vop_named(name: str) -> VOp:
    """The VOp called `name` in programs and the YAML (`and`, `or` as well as `and_`, `or_`)."""
    for op, spelled in OP_NAME.items():
        if name in (spelled, op.name):
            return op
    raise KeyError(f"no element-wise op {name!r}; the ops are {', '.join(OP_NAME.values())}")


# Field positions per opcode. Operands of VOP come in groups of four: memory, address (elements),
# outer stride, inner stride; the element (i, j) of operand X is X.address + i*outer + j*inner.
F_OP = 0
NOP_STEPS = 1
WAIT_TAG = 1
DMA_DIR, DMA_PDM_ADDR, DMA_HOST_BUF, DMA_HOST_OFF, DMA_N, DMA_TAG = range(1, 7)
(MV_MODE, MV_SRC_MEM, MV_SRC_INST, MV_SRC_ADDR, MV_DST_MEM, MV_DST_INST, MV_DST_ADDR, MV_N, MV_TAG, MV_RED,
 MV_DTYPE, MV_SRC_LOCAL, MV_DST_LOCAL, MV_SCOPE) = range(1, 15)
(X_MODE, X_DIR, X_UP_MEM, X_UP_ADDR, X_LO_MEM, X_LO_ADDR, X_N, X_RED, X_DTYPE, X_INDEX) = range(1, 11)
V_OP, V_DTYPE, V_N_OUTER, V_N_INNER = 1, 2, 3, 4
V_DST, V_A, V_B, V_C = 5, 9, 13, 17  # each: mem, addr, outer stride, inner stride
V_SRC_DTYPE = 21
(MM_DTYPE, MM_M, MM_K, MM_N, MM_A_MEM, MM_A_ADDR, MM_A_PITCH, MM_B_MEM, MM_B_ADDR, MM_B_PITCH, MM_C_MEM, MM_C_ADDR,
 MM_C_PITCH, MM_FLAGS) = range(1, 15)
MM_TRANS_B, MM_ACCUMULATE = 1, 2  # flag bits


@dataclass(frozen=True)
class InstrDoc:
    op: Op
    operands: str
    unit: str
    timing: str


TABLE: tuple[InstrDoc, ...] = (
    InstrDoc(Op.NOP, "steps", "PE stream",
             "steps * step_cycles (never in a bundle)"),
    InstrDoc(Op.WAIT, "tag", "PE stream",
             "the stream (and every later issue) stalls until all MV/DMA with this tag have completed"),
    InstrDoc(Op.MV, "mode, src_mem, src_inst, src_addr, dst_mem, dst_inst, dst_addr, n_lw, tag, red, dtype, "
             "src_local, dst_local, scope", "Data Engine of every Group it touches",
             "issue takes no stream time (a full queue of data_engine.queue_depth stalls it); data flows for "
             "ceil(max(src LW / src rate, LW per destination / dst rate)) cycles, sizes rounded up to unit_lw, "
             "cross_group_lw_per_cycle when it crosses Groups, starting latency_cycles after issue and after the "
             "data queued before it on each of its engines (pipelined requests); distributed_broadcast (mvb4) runs "
             "on every Data Engine at once, each reading n_lw while each destination receives n_groups * n_lw / "
             "destinations per Group at the mode's own two rates"),
    InstrDoc(Op.HOST_DMA, "dir, pdm_addr, host_buf, host_off_lw, n_lw, tag", "host link",
             "data for ceil(n_lw / rate) cycles of host_to_pdm or pdm_to_host, latency_cycles after issue at the "
             "earliest; FIFO on the one link"),
    InstrDoc(Op.XFER, "mode, dir, up_mem, up_addr, lo_mem, lo_addr, n_lw (upper side), red, dtype, index",
             "PE stream (the path's slot: l2bm, l1bm; mau for mwrite, mread for the matrix registers' read)",
             "ceil(ceil(max(LW on the src side / src rate, LW per dst instance / dst rate)) / step_cycles) steps; "
             "index: the group an individual transfer reads, or the children a broadcast down writes as a bit mask "
             "(0: all of them; a mask only where the mode has `subsets`, the SDM's l2bmb@set), which its cycles do "
             "not depend on"),
    InstrDoc(Op.VOP, "op, dtype, n_outer, n_inner, dst(mem, addr, so, si), a(...), b(...), c(...), src_dtype",
             "PE stream (ALU or MAU per pe_ops.<op>.unit, or pe_ops.<op>.dtypes.<dtype>.unit)",
             "ceil(n_outer * n_inner / lanes per PE per step) * issues steps, with unit and issues those of "
             "pe_ops.<op>.dtypes.<dtype> where given, else of pe_ops.<op>; lanes per PE per step = "
             "units.<unit>.vector.<dtype>.lanes_per_cycle * step_cycles / PEs per unit; a cvt takes the fewer "
             "lanes and the more issues of its two dtypes"),
    InstrDoc(Op.MATMUL, "dtype, M, K, N, a(mem, addr, pitch), b(mem, addr, pitch), c(mem, addr, pitch), flags",
             "PE stream (MAU of every MAB)",
             "ceil(ceil(M / rows) * ceil(K / cols) * max(N, rows / load_rows_per_cycle) / step_cycles) steps, from "
             "units.MAU.matrix.<dtype>"),
)


def instr_doc(op: Op) -> InstrDoc:
    return next(d for d in TABLE if d.op == op)

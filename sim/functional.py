"""The functional engine: numba kernels that apply instructions to the memory arrays.

Every memory is a uint32 array shaped [instances, words]; a kernel loops over all instances of
the level an instruction drives (every Group, every L2B, every PE) inside one call, so a program
costs per instruction, not per PE. Data patterns of the transfer modes follow
layout_notation.md section 7.2, with fan-outs and chunk sizes from the hardware description:

* distribute: upper LW q goes to child (q div chunk) mod F at chunk*(q div (chunk*F)) + q mod chunk
  (l2bmd: chunk 8 over 8 L1Bs; l1bmd: chunk 1 over the 64 PEs of an L1B); collect is its inverse;
* mab_broadcast: upper LW q goes to member q mod G at q div G of every group of G children
  (l1bmm: the 4 PEs of every MAB); individual and reduce (upward) read groups the same way;
* broadcast: every child gets the same n long words.

MATMUL and HOST_DMA run in `sim.machine` with numpy (BLAS for the products); everything else is
here. Element-wise operations use the PE's lanes: float32 words, half words of a float16, or
int32 words; each dtype has loops of its own, so the hot float32 loops carry no integer branch.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from . import isa
from .isa import ALL_GROUPS, IMM, DType, Dir, Mode, Op, Red, Scope, VOp
from .numerics import apply, apply_i32, half_from_f32_bits, half_from_int, half_to_f32, i32_from_f32

# `fmt`, passed to every kernel, holds the numbers from the YAML that data patterns depend on.
FMT_WPL, FMT_HALF_E, FMT_HALF_M = 0, 1, 2  # words per long word, half exponent and mantissa bits
WORD_BITS = 32  # the element of mnsim's memory arrays (MachineParams checks the YAML's word size)


@njit(cache=True)
def _word_addr(lw_addressed: np.ndarray, mem: int, addr: int, wpl: int) -> int:
    return addr * wpl if lw_addressed[mem] else addr


@njit(cache=True)
def _copy_lw(dst: np.ndarray, d_inst: int, d_word: int, src: np.ndarray, s_inst: int, s_word: int, n_lw: int,
             wpl: int) -> None:
    for i in range(wpl * n_lw):
        dst[d_inst, d_word + i] = src[s_inst, s_word + i]


@njit(cache=True)
def _deal(dst, first, dw, src, s, sw, n, chunk, count, wpl):
    """Distribute: chunk q of `src` (long words q*chunk..) goes to child q mod count at chunk
    round q div count. Child by child, so each child's row is written in one sweep (children
    are whole memory rows apart: interleaving them thrashes the cache on aliasing addresses)."""
    for k in range(count):
        for r in range((n + chunk * count - 1) // (chunk * count)):
            q = chunk * (r * count + k)
            if q >= n:
                break
            _copy_lw(dst, first + k, dw + wpl * chunk * r, src, s, sw + wpl * q, min(chunk, n - q), wpl)


@njit(cache=True)
def _undeal(dst, d, dw, src, first, sw, n, chunk, count, wpl):
    """Collect, the inverse of `_deal`: child by child, each child's row read in one sweep."""
    for k in range(count):
        for r in range((n + chunk * count - 1) // (chunk * count)):
            q = chunk * (r * count + k)
            if q >= n:
                break
            _copy_lw(dst, d, dw + wpl * q, src, first + k, sw + wpl * chunk * r, min(chunk, n - q), wpl)


@njit(cache=True)
def _combine(red: int, dtype: int, a: np.uint32, b: np.uint32, fmt: np.ndarray) -> np.uint32:
    """Reduce two words element-wise (one float32/int32, or the halves packed in it)."""
    if dtype == DType.float16:
        he, hm = fmt[FMT_HALF_E], fmt[FMT_HALF_M]
        bits = 1 + he + hm
        mask = (1 << bits) - 1
        out = np.uint32(0)
        for k in range(WORD_BITS // bits):
            shift = k * bits
            x = half_to_f32(np.uint16((a >> shift) & mask), he, hm)
            y = half_to_f32(np.uint16((b >> shift) & mask), he, hm)
            r = x + y if red == Red.add else (max(x, y) if red == Red.max else min(x, y))
            out |= np.uint32(half_from_f32_bits(np.array([np.float32(r)]).view(np.uint32)[0], he, hm)) << shift
        return out
    if dtype == DType.int32:
        x, y = np.int32(a), np.int32(b)
        r = x + y if red == Red.add else (max(x, y) if red == Red.max else min(x, y))
        return np.array([r], dtype=np.int32).view(np.uint32)[0]
    fx = np.array([a], dtype=np.uint32).view(np.float32)[0]
    fy = np.array([b], dtype=np.uint32).view(np.float32)[0]
    fr = np.float32(fx + fy) if red == Red.add else (max(fx, fy) if red == Red.max else min(fx, fy))
    return np.array([fr], dtype=np.float32).view(np.uint32)[0]


# ---- MV: the Data Engines ---------------------------------------------------------------------

@njit(cache=True)
def _scope_range(mem_instances: np.ndarray, n_groups: int, mem: int, scope: int, group: int) -> tuple:
    if scope == Scope.chip:
        return 0, mem_instances[mem]
    per = mem_instances[mem] // n_groups
    return group * per, per


@njit(cache=True)
def _mv(row, mems, mem_instances, lw_addressed, n_groups, chunk, fmt):
    mode, n = row[isa.MV_MODE], row[isa.MV_N]
    sm, dm = row[isa.MV_SRC_MEM], row[isa.MV_DST_MEM]
    src, dst = mems[sm], mems[dm]
    wpl = fmt[FMT_WPL]
    sw = _word_addr(lw_addressed, sm, row[isa.MV_SRC_ADDR], wpl)
    dw = _word_addr(lw_addressed, dm, row[isa.MV_DST_ADDR], wpl)
    per_group = row[isa.MV_SRC_INST] == ALL_GROUPS or row[isa.MV_DST_INST] == ALL_GROUPS
    groups = n_groups if per_group else 1
    s_per, d_per = mem_instances[sm] // n_groups, mem_instances[dm] // n_groups
    for g in range(groups):
        s = row[isa.MV_SRC_INST] if row[isa.MV_SRC_INST] >= 0 else g * s_per + row[isa.MV_SRC_LOCAL]
        d = row[isa.MV_DST_INST] if row[isa.MV_DST_INST] >= 0 else g * d_per + row[isa.MV_DST_LOCAL]
        if mode == Mode.individual:
            _copy_lw(dst, d, dw, src, s, sw, n, wpl)
        elif mode == Mode.broadcast:
            first, count = _scope_range(mem_instances, n_groups, dm, row[isa.MV_SCOPE], s // s_per)
            for k in range(count):
                _copy_lw(dst, first + k, dw, src, s, sw, n, wpl)
        elif mode == Mode.distribute:
            first, count = _scope_range(mem_instances, n_groups, dm, row[isa.MV_SCOPE], s // s_per)
            _deal(dst, first, dw, src, s, sw, n, chunk, count, wpl)
        elif mode == Mode.collect:
            first, count = _scope_range(mem_instances, n_groups, sm, row[isa.MV_SCOPE], d // d_per)
            _undeal(dst, d, dw, src, first, sw, n, chunk, count, wpl)
        else:  # reduce
            first, count = _scope_range(mem_instances, n_groups, sm, row[isa.MV_SCOPE], d // d_per)
            red, dtype = row[isa.MV_RED], row[isa.MV_DTYPE]
            for i in range(wpl * n):
                acc = src[first, sw + i]
                for k in range(1, count):
                    acc = _combine(red, dtype, acc, src[first + k, sw + i], fmt)
                dst[d, dw + i] = acc


# ---- XFER: L2BM <-> L1BM and L1BM <-> PE, in every upper instance at once --------------------

@njit(cache=True)
def _xfer(row, mems, mem_instances, lw_addressed, group, chunk, fmt):
    mode, direction, n = row[isa.X_MODE], row[isa.X_DIR], row[isa.X_N]
    um, lm = row[isa.X_UP_MEM], row[isa.X_LO_MEM]
    up, lo = mems[um], mems[lm]
    wpl = fmt[FMT_WPL]
    uw = _word_addr(lw_addressed, um, row[isa.X_UP_ADDR], wpl)
    lw = _word_addr(lw_addressed, lm, row[isa.X_LO_ADDR], wpl)
    n_up = mem_instances[um]
    fan = mem_instances[lm] // n_up
    for u in range(n_up):
        base = u * fan
        if direction == Dir.down:
            if mode == Mode.broadcast:
                for k in range(fan):
                    _copy_lw(lo, base + k, lw, up, u, uw, n, wpl)
            elif mode == Mode.mab_broadcast:  # every group of `group` children gets the same words
                for q in range(n):  # the first group, from the upper memory
                    _copy_lw(lo, base + q % group, lw + wpl * (q // group), up, u, uw + wpl * q, 1, wpl)
                for m in range(min(group, n)):  # the others copy each member's contiguous run from it
                    words = wpl * ((n - m + group - 1) // group)
                    for g in range(1, fan // group):
                        lo[base + g * group + m, lw:lw + words] = lo[base + m, lw:lw + words]
            else:  # distribute, a chunk of consecutive long words to each child in turn
                _deal(lo, base, lw, up, u, uw, n, chunk, fan, wpl)
        else:
            if mode == Mode.collect:
                _undeal(up, u, uw, lo, base, lw, n, chunk, fan, wpl)
            elif mode == Mode.individual:
                g = row[isa.X_INDEX]
                for q in range(n):
                    _copy_lw(up, u, uw + wpl * q, lo, base + g * group + q % group, lw + wpl * (q // group), 1, wpl)
            else:  # reduce over the groups
                red, dtype = row[isa.X_RED], row[isa.X_DTYPE]
                for q in range(n):
                    member = q % group
                    for w in range(wpl):
                        at = lw + wpl * (q // group) + w
                        acc = lo[base + member, at]
                        for g in range(1, fan // group):
                            acc = _combine(red, dtype, acc, lo[base + g * group + member, at], fmt)
                        up[u, uw + wpl * q + w] = acc


# ---- VOP: element-wise PE operations ----------------------------------------------------------

@njit(cache=True)
def _imm(bits: np.int64) -> np.float32:
    return np.array([bits & 0xFFFFFFFF], dtype=np.uint32).view(np.float32)[0]


@njit(cache=True)
def _imm_i32(bits: np.int64) -> np.int32:
    """An int32 immediate: the low 32 bits of the address field, two's complement."""
    return np.int32(bits & 0xFFFFFFFF)


@njit(cache=True, inline="always")
def _f_copy(a, b, c):
    return a


@njit(cache=True, inline="always")
def _f_add(a, b, c):
    return a + b


@njit(cache=True, inline="always")
def _f_sub(a, b, c):
    return a - b


@njit(cache=True, inline="always")
def _f_mul(a, b, c):
    return a * b


@njit(cache=True, inline="always")
def _f_fma(a, b, c):
    return np.float32(a * b) + c


@njit(cache=True, inline="always")
def _f_max(a, b, c):
    return a if a >= b else b


@njit(cache=True, inline="always")
def _f_relu(a, b, c):
    return a if a > 0 else np.float32(0.0)


@njit(cache=True, inline="always")
def _i_add(a, b, c):
    return np.int32(np.int64(a) + np.int64(b))  # wraps around, as torch's int32


@njit(cache=True, inline="always")
def _i_sub(a, b, c):
    return np.int32(np.int64(a) - np.int64(b))


def _make_loop(fn, arity, zero=np.float32(0.0)):
    """The element loop of one op: numba compiles (and caches) one tight loop per op, inlining it;
    operands beyond the op's arity are not read, so unit-stride loops vectorise. `zero` (the
    element type's zero) stands in for the operands not read."""

    @njit(cache=True)
    def loop(n_pe, n_outer, n_inner, d, d0, dso, dsi, a, a0, aso, asi, b, b0, bso, bsi, c, c0, cso, csi):
        unit = dsi == 1 and asi == 1 and (arity < 2 or bsi == 1) and (arity < 3 or csi == 1)
        for pe in range(n_pe):
            for i in range(n_outer):
                dd, aa, bb, cc = d0 + i * dso, a0 + i * aso, b0 + i * bso, c0 + i * cso
                if unit:  # contiguous rows: a loop the compiler can vectorise
                    for j in range(n_inner):
                        y = b[pe, bb + j] if arity >= 2 else zero
                        z = c[pe, cc + j] if arity >= 3 else zero
                        d[pe, dd + j] = fn(a[pe, aa + j], y, z)
                else:
                    for j in range(n_inner):
                        y = b[pe, bb + j * bsi] if arity >= 2 else zero
                        z = c[pe, cc + j * csi] if arity >= 3 else zero
                        d[pe, dd + j * dsi] = fn(a[pe, aa + j * asi], y, z)

    return loop


_loop_copy, _loop_add, _loop_sub, _loop_mul, _loop_fma, _loop_max, _loop_relu = (
    _make_loop(f, n) for f, n in ((_f_copy, 1), (_f_add, 2), (_f_sub, 2), (_f_mul, 2), (_f_fma, 3), (_f_max, 2),
                                  (_f_relu, 1)))
_loop_i_copy, _loop_i_add, _loop_i_sub = (_make_loop(f, n, np.int32(0)) for f, n in ((_f_copy, 1), (_i_add, 2),
                                                                                    (_i_sub, 2)))


@njit(cache=True)
def _loop_any(op, n_pe, n_outer, n_inner, d, d0, dso, dsi, a, a0, aso, asi, b, b0, bso, bsi, c, c0, cso, csi):
    for pe in range(n_pe):
        for i in range(n_outer):
            dd, aa, bb, cc = d0 + i * dso, a0 + i * aso, b0 + i * bso, c0 + i * cso
            for j in range(n_inner):
                d[pe, dd + j * dsi] = apply(op, a[pe, aa + j * asi], b[pe, bb + j * bsi], c[pe, cc + j * csi])


@njit(cache=True)
def _vop_f32(op, n_pe, n_outer, n_inner, d, d0, dso, dsi, a, a0, aso, asi, b, b0, bso, bsi, c, c0, cso, csi):
    """float32 ops: immediates arrive as [PEs, 1] arrays read at stride 0, so loops do not branch."""
    args = (n_pe, n_outer, n_inner, d, d0, dso, dsi, a, a0, aso, asi, b, b0, bso, bsi, c, c0, cso, csi)
    if op == VOp.copy:
        _loop_copy(*args)
    elif op == VOp.add:
        _loop_add(*args)
    elif op == VOp.sub:
        _loop_sub(*args)
    elif op == VOp.mul:
        _loop_mul(*args)
    elif op == VOp.fma:
        _loop_fma(*args)
    elif op == VOp.max:
        _loop_max(*args)
    elif op == VOp.relu:
        _loop_relu(*args)
    else:
        _loop_any(op, *args)


@njit(cache=True)
def _loop_any_i32(op, n_pe, n_outer, n_inner, d, d0, dso, dsi, a, a0, aso, asi, b, b0, bso, bsi, c, c0, cso, csi):
    for pe in range(n_pe):
        for i in range(n_outer):
            dd, aa, bb, cc = d0 + i * dso, a0 + i * aso, b0 + i * bso, c0 + i * cso
            for j in range(n_inner):
                d[pe, dd + j * dsi] = apply_i32(op, a[pe, aa + j * asi], b[pe, bb + j * bsi], c[pe, cc + j * csi])


@njit(cache=True)
def _vop_i32(op, n_pe, n_outer, n_inner, d, d0, dso, dsi, a, a0, aso, asi, b, b0, bso, bsi, c, c0, cso, csi):
    """int32 ops, on the int32 view of the words: the moves and adds in loops of their own."""
    args = (n_pe, n_outer, n_inner, d, d0, dso, dsi, a, a0, aso, asi, b, b0, bso, bsi, c, c0, cso, csi)
    if op == VOp.copy or op == VOp.cvt:
        _loop_i_copy(*args)
    elif op == VOp.add:
        _loop_i_add(*args)
    elif op == VOp.sub:
        _loop_i_sub(*args)
    else:
        _loop_any_i32(op, *args)


@njit(cache=True)
def _cvt_from_i32(n_pe, n_outer, n_inner, to_half, d16, d32, d0, dso, dsi, a, a0, aso, asi, he, hm):
    """cvt int32 -> float32 or half, rounding to nearest even once (`a` is an int32 operand)."""
    for pe in range(n_pe):
        for i in range(n_outer):
            for j in range(n_inner):
                x = np.int64(a[pe, a0 + i * aso + j * asi])
                idx = d0 + i * dso + j * dsi
                if to_half:
                    d16[pe, idx] = half_from_int(x, he, hm)
                else:
                    d32[pe, idx] = np.float32(x)


@njit(cache=True)
def _cvt_to_i32(n_pe, n_outer, n_inner, from_half, d, d0, dso, dsi, a16, a32, a0, aso, asi, he, hm):
    """cvt float32 or half -> int32, toward zero with saturation (`a32` is a float32 operand)."""
    for pe in range(n_pe):
        for i in range(n_outer):
            for j in range(n_inner):
                at = a0 + i * aso + j * asi
                x = half_to_f32(a16[pe, at], he, hm) if from_half else a32[pe, at]
                d[pe, d0 + i * dso + j * dsi] = i32_from_f32(x)


@njit(cache=True)
def _f32_operand(f32, m, addr, so, si, n_pe):
    """A float32 operand as (array, address, strides); an immediate is a [PEs, 1] array read at
    stride 0, so the loops do not branch on it."""
    if m == IMM:
        return np.full((n_pe, 1), _imm(addr), dtype=np.float32), 0, 0, 0
    return f32[m], addr, so, si


@njit(cache=True)
def _i32_operand(i32, m, addr, so, si, n_pe):
    """An int32 operand, as `_f32_operand` (an immediate holds int32 bits)."""
    if m == IMM:
        return np.full((n_pe, 1), _imm_i32(addr), dtype=np.int32), 0, 0, 0
    return i32[m], addr, so, si


@njit(cache=True)
def _vop_half(op, n_pe, n_outer, n_inner, dst_half, src_half, d16, d32, d0, dso, dsi, a16, a32, a_imm, a0, aso, asi,
              b16, b_imm, b0, bso, bsi, c16, c_imm, c0, cso, csi, he, hm):
    """Loop for VOPs with a float16 side: half operands are decoded, results encoded (1-6-9)."""
    ai, bi, ci = _imm(a0), _imm(b0), _imm(c0)
    for pe in range(n_pe):
        for i in range(n_outer):
            for j in range(n_inner):
                if a_imm:
                    x = ai
                elif src_half:
                    x = half_to_f32(a16[pe, a0 + i * aso + j * asi], he, hm)
                else:
                    x = a32[pe, a0 + i * aso + j * asi]
                y = bi if b_imm else half_to_f32(b16[pe, b0 + i * bso + j * bsi], he, hm)
                z = ci if c_imm else half_to_f32(c16[pe, c0 + i * cso + j * csi], he, hm)
                r = apply(op, x, y, z)
                idx = d0 + i * dso + j * dsi
                if dst_half:
                    d16[pe, idx] = half_from_f32_bits(np.array([r], dtype=np.float32).view(np.uint32)[0], he, hm)
                else:
                    d32[pe, idx] = r


@njit(cache=True)
def _vop(row, f32, u16, i32, n_pe, fmt):
    op, dtype = row[isa.V_OP], row[isa.V_DTYPE]
    src_dtype = row[isa.V_SRC_DTYPE] if op == isa.VOp.cvt else dtype
    n_outer, n_inner = row[isa.V_N_OUTER], row[isa.V_N_INNER]
    dm, d0, dso, dsi = row[isa.V_DST], row[isa.V_DST + 1], row[isa.V_DST + 2], row[isa.V_DST + 3]
    am, a0, aso, asi = row[isa.V_A], row[isa.V_A + 1], row[isa.V_A + 2], row[isa.V_A + 3]
    bm, b0, bso, bsi = row[isa.V_B], row[isa.V_B + 1], row[isa.V_B + 2], row[isa.V_B + 3]
    cm, c0, cso, csi = row[isa.V_C], row[isa.V_C + 1], row[isa.V_C + 2], row[isa.V_C + 3]
    ka, kb, kc = max(am, 0), max(bm, 0), max(cm, 0)  # an immediate reads no memory; any array will do
    he, hm = fmt[FMT_HALF_E], fmt[FMT_HALF_M]
    if dtype == DType.int32 and src_dtype == DType.int32:
        a, a0, aso, asi = _i32_operand(i32, am, a0, aso, asi, n_pe)
        b, b0, bso, bsi = _i32_operand(i32, bm, b0, bso, bsi, n_pe)
        c, c0, cso, csi = _i32_operand(i32, cm, c0, cso, csi, n_pe)
        _vop_i32(op, n_pe, n_outer, n_inner, i32[dm], d0, dso, dsi, a, a0, aso, asi, b, b0, bso, bsi, c, c0, cso, csi)
        return
    if src_dtype == DType.int32:  # cvt int32 -> float
        a, a0, aso, asi = _i32_operand(i32, am, a0, aso, asi, n_pe)
        _cvt_from_i32(n_pe, n_outer, n_inner, dtype == DType.float16, u16[dm], f32[dm], d0, dso, dsi, a, a0, aso,
                      asi, he, hm)
        return
    if dtype == DType.int32:  # cvt float -> int32
        a, a0, aso, asi = _f32_operand(f32, am, a0, aso, asi, n_pe)
        _cvt_to_i32(n_pe, n_outer, n_inner, src_dtype == DType.float16 and am != IMM, i32[dm], d0, dso, dsi,
                    u16[ka], a, a0, aso, asi, he, hm)
        return
    if dtype == DType.float32 and src_dtype == DType.float32:
        a, a0, aso, asi = _f32_operand(f32, am, a0, aso, asi, n_pe)
        b, b0, bso, bsi = _f32_operand(f32, bm, b0, bso, bsi, n_pe)
        c, c0, cso, csi = _f32_operand(f32, cm, c0, cso, csi, n_pe)
        _vop_f32(op, n_pe, n_outer, n_inner, f32[dm], d0, dso, dsi, a, a0, aso, asi, b, b0, bso, bsi, c, c0, cso, csi)
        return
    _vop_half(op, n_pe, n_outer, n_inner, dtype == DType.float16, src_dtype == DType.float16, u16[dm], f32[dm],
              d0, dso, dsi, u16[ka], f32[ka], am == IMM, a0, aso, asi, u16[kb], bm == IMM, b0, bso, bsi,
              u16[kc], cm == IMM, c0, cso, csi, he, hm)


# ---- the block executor -----------------------------------------------------------------------

@njit(cache=True)
def execute_block(code, start, end, mems, f32, u16, i32, mem_instances, lw_addressed, n_groups, path_of, path_group,
                  mode_chunk, n_pe, fmt):
    """Run instructions [start, end) that the numba engine handles (NOP, WAIT, MV, XFER, VOP).

    `mems` are the uint32 rows of every memory; `f32`, `u16` and `i32` the same rows viewed as
    float32, as half words and as int32 (made by the caller: numba cannot build tuples of views
    itself)."""
    for i in range(start, end):
        row = code[i]
        op = row[0]
        if op == Op.MV:
            p = path_of[row[isa.MV_SRC_MEM], row[isa.MV_DST_MEM]]
            _mv(row, mems, mem_instances, lw_addressed, n_groups, mode_chunk[p, row[isa.MV_MODE]], fmt)
        elif op == Op.XFER:
            if row[isa.X_DIR] == Dir.down:
                p = path_of[row[isa.X_UP_MEM], row[isa.X_LO_MEM]]
            else:
                p = path_of[row[isa.X_LO_MEM], row[isa.X_UP_MEM]]
            _xfer(row, mems, mem_instances, lw_addressed, path_group[p], mode_chunk[p, row[isa.X_MODE]], fmt)
        elif op == Op.VOP:
            _vop(row, f32, u16, i32, n_pe, fmt)

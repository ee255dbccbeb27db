"""VOP: element-wise PE operations, one numba loop per op family, chosen per instruction.

Element-wise operations use the PE's lanes: float32 words, half words of a float16, or int32
words. The common float32 and int32 ops (copy, add, sub, mul, fma, max, relu) have loops of
their own, in which unit-stride rows vectorise; every other op goes through `numerics.apply`. The
loop is chosen here in Python, per instruction, so numba compiles a loop the first time a
program uses it, not every loop on the first run of any program (a fresh checkout compiled all
of them, about 40 s, before the first result).
"""

from __future__ import annotations

from functools import partial
from math import prod
from typing import Callable

import numpy as np
from numba import njit

from . import isa
from .hostpool import run_shares
from .index import at
from .isa import IMM, DType, VOp
from .numerics import apply, apply_i32, half_from_f32_bits, half_from_int, half_to_f32, i32_from_f32, nan_max
from .params import FMT_HALF_E, FMT_HALF_M

# Elements a float VOP computes from which its PEs are split between the host's threads (host
# policy: below, waking the threads costs more than the loop; a 4096 x 4096 add's VOPs compute
# millions, an MNIST step's a few thousand).
SHARED_ELEMENTS = 1 << 18


@njit(cache=True)
def _imm(bits: np.int64) -> np.float32:
    return np.array([bits & 0xFFFFFFFF], dtype=np.uint32).view(np.float32)[0]


@njit(cache=True, inline="always")
def _fast(op, zero, a, b, c):
    """The ops with loops of their own. `op` is a constant of each loop (a closure variable, which
    numba freezes), so after inlining one branch is left and the loop vectorises. Every branch
    keeps the element type (`zero` is its zero): float32 stays float32, and an int32 sum, computed
    in int64, wraps around when stored back, as torch's int32 does."""
    if op == VOp.add:
        return a + b
    if op == VOp.sub:
        return a - b
    if op == VOp.mul:
        return a * b
    if op == VOp.fma:
        return a * b + c
    if op == VOp.max:
        return nan_max(a, b)
    if op == VOp.relu:
        return zero if a < zero else a  # keeps NaN and -0.0, as torch.relu
    return a  # copy (and cvt between int32 words)


def _make_loop(op: VOp, arity: int, element: type = np.float32):
    """The element loop of one op on `element`s (np.float32, np.int32, np.float64): operands
    beyond the op's arity are not read, so unit-stride loops vectorise. Its closure holds only
    numbers: numba keys its disk cache by a hash of the pickled closure, and a closure over a
    jitted function pickles differently in every process, so such loops were compiled again each
    time (0.6 s each). Each loop is named after its op and element."""
    op_code = int(op)
    zero = element(0)  # stands in for the operands not read

    def loop(n_pe, n_outer, n_inner, d, d0, dso, dsi, a, a0, aso, asi, b, b0, bso, bsi, c, c0, cso, csi):
        unit = dsi == 1 and asi == 1 and (arity < 2 or bsi == 1) and (arity < 3 or csi == 1)
        for pe in range(n_pe):
            for i in range(n_outer):
                dd, aa, bb, cc = d0 + i * dso, a0 + i * aso, b0 + i * bso, c0 + i * cso
                if unit:  # contiguous rows: a loop the compiler can vectorise
                    for j in range(n_inner):
                        y = b[pe, at(bb + j)] if arity >= 2 else zero
                        z = c[pe, at(cc + j)] if arity >= 3 else zero
                        d[pe, at(dd + j)] = _fast(op_code, zero, a[pe, at(aa + j)], y, z)
                else:
                    for j in range(n_inner):
                        y = b[pe, at(bb + j * bsi)] if arity >= 2 else zero
                        z = c[pe, at(cc + j * csi)] if arity >= 3 else zero
                        d[pe, at(dd + j * dsi)] = _fast(op_code, zero, a[pe, at(aa + j * asi)], y, z)

    loop.__name__ = loop.__qualname__ = f"loop_{op.name}_{np.dtype(element).name}"
    return njit(cache=True, nogil=True)(loop)


def _make_fold(op: VOp, element: type = np.float32):
    """The loop of a VOP that folds into its destination, d = d op b with d read at stride 0 along
    the outer dimension (a sum over rows into one row) or along both (into one word): each
    destination word is kept in a register across the fold, in the order the element loop takes,
    so the words are the same. The element loop stores and reloads it every step (a chain of
    dependent memory round trips: an MNIST step's sums of 64 rows took 1.1 ms a VOP, 2.6 ms a step)."""
    op_code = int(op)
    zero = element(0)

    def fold(n_pe, n_outer, n_inner, whole, d, d0, dsi, b, b0, bso, bsi):
        for pe in range(n_pe):
            if whole:  # every element into one word
                acc = d[pe, at(d0)]
                for i in range(n_outer):
                    for j in range(n_inner):
                        acc = _fast(op_code, zero, acc, b[pe, at(b0 + i * bso + j * bsi)], zero)
                d[pe, at(d0)] = acc
            else:  # column j into word j
                for j in range(n_inner):
                    acc = d[pe, at(d0 + j * dsi)]
                    for i in range(n_outer):
                        acc = _fast(op_code, zero, acc, b[pe, at(b0 + i * bso + j * bsi)], zero)
                    d[pe, at(d0 + j * dsi)] = acc

    fold.__name__ = fold.__qualname__ = f"fold_{op.name}_{np.dtype(element).name}"
    return njit(cache=True, nogil=True)(fold)


def _fold_fields(row: np.ndarray, op: int) -> tuple | None:
    """(whole, (b memory, b0, bso, bsi)) when a VOP folds into its destination (see
    `_make_fold`): an op with a loop of its own and two operands, A the destination itself (same
    memory, address and strides), the destination at stride 0 along the outer dimension (or both),
    and B a memory operand reading none of the destination's words."""
    if op not in _FOLDS_F32:
        return None
    dm, d0, dso, dsi = (int(x) for x in row[isa.V_DST:isa.V_DST + FIELDS])
    bm, b0, bso, bsi = (int(x) for x in row[isa.V_B:isa.V_B + FIELDS])
    n_outer, n_inner = int(row[isa.V_N_OUTER]), int(row[isa.V_N_INNER])
    whole = dsi == 0 and (dso == 0 or n_outer == 1) and n_outer * n_inner > 1
    columns = dso == 0 and dsi != 0 and n_outer > 1
    if bm == IMM or tuple(int(x) for x in row[isa.V_A:isa.V_A + FIELDS]) != (dm, d0, dso, dsi) \
            or not (whole or columns):
        return None
    if bm == dm:
        d_hi = d0 + max(0, (n_inner - 1) * dsi)
        d_lo = d0 + min(0, (n_inner - 1) * dsi)
        b_span = [b0 + i * bso + j * bsi for i in (0, n_outer - 1) for j in (0, n_inner - 1)]
        if min(b_span) <= d_hi and d_lo <= max(b_span):
            return None
    return whole, (bm, b0, bso, bsi)


_ARITY = {VOp.copy: 1, VOp.add: 2, VOp.sub: 2, VOp.mul: 2, VOp.fma: 3, VOp.max: 2, VOp.relu: 1}
_F32_LOOPS = {op: _make_loop(op, arity) for op, arity in _ARITY.items()}
_F64_LOOPS = {op: _make_loop(op, arity, np.float64) for op, arity in _ARITY.items()}
_I32_LOOPS = {op: _make_loop(op, _ARITY[op], np.int32) for op in (VOp.copy, VOp.add, VOp.sub)}
_I32_LOOPS[VOp.cvt] = _I32_LOOPS[VOp.copy]  # cvt int32 -> int32 copies the words
_FOLDS_F32 = {op: _make_fold(op) for op in (VOp.add, VOp.sub, VOp.mul, VOp.max)}


@njit(cache=True, nogil=True)
def _loop_any(op, n_pe, n_outer, n_inner, d, d0, dso, dsi, a, a0, aso, asi, b, b0, bso, bsi, c, c0, cso, csi, T):
    """Any float op, element by element through `numerics.apply`, in the float type T of the arrays."""
    for pe in range(n_pe):
        for i in range(n_outer):
            dd, aa, bb, cc = d0 + i * dso, a0 + i * aso, b0 + i * bso, c0 + i * cso
            for j in range(n_inner):
                d[pe, at(dd + j * dsi)] = apply(op, a[pe, at(aa + j * asi)], b[pe, at(bb + j * bsi)],
                                              c[pe, at(cc + j * csi)], T)


@njit(cache=True)
def _cvt_float(n_pe, n_outer, n_inner, d, d0, dso, dsi, a, a0, aso, asi, T):
    """cvt between float32 and float64: each element rounded to the destination's type T (to
    nearest even; float64 -> float32 overflows to +-inf, as torch's .float())."""
    for pe in range(n_pe):
        for i in range(n_outer):
            for j in range(n_inner):
                d[pe, at(d0 + i * dso + j * dsi)] = T(a[pe, at(a0 + i * aso + j * asi)])


@njit(cache=True)
def _loop_any_i32(op, n_pe, n_outer, n_inner, d, d0, dso, dsi, a, a0, aso, asi, b, b0, bso, bsi, c, c0, cso, csi):
    for pe in range(n_pe):
        for i in range(n_outer):
            dd, aa, bb, cc = d0 + i * dso, a0 + i * aso, b0 + i * bso, c0 + i * cso
            for j in range(n_inner):
                d[pe, at(dd + j * dsi)] = apply_i32(op, a[pe, at(aa + j * asi)], b[pe, at(bb + j * bsi)],
                                              c[pe, at(cc + j * csi)])


@njit(cache=True)
def _cvt_from_i32(n_pe, n_outer, n_inner, to_half, d16, d32, d0, dso, dsi, a, a0, aso, asi, he, hm):
    """cvt int32 -> float32 or half, rounding to nearest even once (`a` is an int32 operand)."""
    for pe in range(n_pe):
        for i in range(n_outer):
            for j in range(n_inner):
                x = np.int64(a[pe, at(a0 + i * aso + j * asi)])
                idx = at(d0 + i * dso + j * dsi)
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
                src = at(a0 + i * aso + j * asi)
                x = half_to_f32(a16[pe, src], he, hm) if from_half else a32[pe, src]
                d[pe, at(d0 + i * dso + j * dsi)] = i32_from_f32(x)


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
                r = apply(op, x, y, z, np.float32)
                idx = d0 + i * dso + j * dsi
                if dst_half:
                    d16[pe, idx] = half_from_f32_bits(np.array([r], dtype=np.float32).view(np.uint32)[0], he, hm)
                else:
                    d32[pe, idx] = r


FIELDS = isa.V_A - isa.V_DST  # an operand's fields: memory, address, outer stride, inner stride


def _operand(field: int, row: np.ndarray, n_pe: int, dtype: type) -> tuple:
    """(memory or None, immediate or None, address, outer stride, inner stride) of an operand; an
    immediate is a [PEs, 1] array read at stride 0, so the loops do not branch on it (its bits are
    the operand's dtype). `_bound` gives the array the loops read."""
    m, addr, so, si = (int(x) for x in row[field:field + FIELDS])
    if m == IMM:
        wide = np.dtype(dtype).itemsize > np.dtype(np.uint32).itemsize  # a float64: all 64 bits of the field
        bits = np.int64(addr) if wide else np.uint32(addr & 0xFFFFFFFF)
        return None, np.full((n_pe, 1), bits).view(dtype), 0, 0, 0
    return m, None, addr, so, si


def _bound(operand: tuple, views: list[np.ndarray]) -> tuple:
    """(array, address, outer stride, inner stride) of an `_operand` on the memories `views`."""
    m, imm, *rest = operand
    return (imm if m is None else views[m], *rest)


def _read_only_used(row: np.ndarray, op: int) -> np.ndarray:
    """The row with the operands `op` does not read made immediate zeros: the loops index every
    operand, and the validator does not check the fields of one the op ignores (indices are
    unsigned, sim.index: a stray field would read far outside the memory)."""
    unused = [f for k, f in enumerate((isa.V_A, isa.V_B, isa.V_C)) if k >= isa.arity(VOp(op)) and row[f] != IMM]
    if not unused:
        return row
    row = row.copy()
    for f in unused:
        row[f:f + FIELDS] = (IMM, 0, 0, 0)
    return row


def run_vop(row: np.ndarray, f32: list[np.ndarray], u16: list[np.ndarray], i32: list[np.ndarray],
            f64: Callable[[], list[np.ndarray | None]], n_pe: int, fmt: np.ndarray, plans: dict | None = None) -> None:
    """One VOP on every PE. `f32`, `u16` and `i32` are the memories viewed as float32, half words
    and int32; `f64()` gives them as float64 (the PE memories; made on first use). `plans` keeps
    what `_plan` makes of each row for the next time (a program's rows come back every call:
    reading the fields and making the immediates took about 15 us of a VOP's 60 in an MNIST step)."""
    key = row.tobytes()
    plan = None if plans is None else plans.get(key)
    if plan is None:
        plan = _plan(row, n_pe, fmt)
        if plans is not None:
            plans[key] = plan
    plan(f32, u16, i32, f64)


def _plan(row: np.ndarray, n_pe: int, fmt: np.ndarray) -> Callable:
    """What a VOP row runs: a function of the memory views (f32, u16, i32, f64) of `run_vop`."""
    row = _read_only_used(row, int(row[isa.V_OP]))
    op, dtype = int(row[isa.V_OP]), int(row[isa.V_DTYPE])
    src_dtype = int(row[isa.V_SRC_DTYPE]) if op == VOp.cvt else dtype
    shape = (n_pe, int(row[isa.V_N_OUTER]), int(row[isa.V_N_INNER]))
    dm, d0, dso, dsi = (int(x) for x in row[isa.V_DST:isa.V_DST + FIELDS])
    he, hm = int(fmt[FMT_HALF_E]), int(fmt[FMT_HALF_M])
    if DType.float64 in (dtype, src_dtype):
        return _plan_f64(row, op, dtype, src_dtype, shape, n_pe)
    if dtype == DType.int32 and src_dtype == DType.int32:
        a, b, c = (_operand(f, row, n_pe, np.int32) for f in (isa.V_A, isa.V_B, isa.V_C))
        kernel = _I32_LOOPS[op] if op in _I32_LOOPS else partial(_loop_any_i32, op)
        return lambda f32, u16, i32, f64: kernel(*shape, i32[dm], d0, dso, dsi, *_bound(a, i32), *_bound(b, i32),
                                                 *_bound(c, i32))
    if src_dtype == DType.int32:  # cvt int32 -> float
        a = _operand(isa.V_A, row, n_pe, np.int32)
        half = dtype == DType.float16
        return lambda f32, u16, i32, f64: _cvt_from_i32(*shape, half, u16[dm], f32[dm], d0, dso, dsi,
                                                        *_bound(a, i32), he, hm)
    if dtype == DType.int32:  # cvt float -> int32
        a = _operand(isa.V_A, row, n_pe, np.float32)
        from_half = src_dtype == DType.float16 and row[isa.V_A] != IMM
        am = max(int(row[isa.V_A]), 0)
        return lambda f32, u16, i32, f64: _cvt_to_i32(*shape, from_half, i32[dm], d0, dso, dsi, u16[am],
                                                      *_bound(a, f32), he, hm)
    if dtype == DType.float32 and src_dtype == DType.float32:
        run = _plan_float(row, op, shape, n_pe, np.float32, _F32_LOOPS)
        return lambda f32, u16, i32, f64: run(f32)
    (am, a0, aso, asi), (bm, b0, bso, bsi), (cm, c0, cso, csi) = (
        (int(x) for x in row[f:f + FIELDS]) for f in (isa.V_A, isa.V_B, isa.V_C))
    ka, kb, kc = max(am, 0), max(bm, 0), max(cm, 0)  # an immediate reads no memory; any array will do
    to_half, from_half = dtype == DType.float16, src_dtype == DType.float16
    return lambda f32, u16, i32, f64: _vop_half(
        op, *shape, to_half, from_half, u16[dm], f32[dm], d0, dso, dsi, u16[ka], f32[ka], am == IMM, a0, aso, asi,
        u16[kb], bm == IMM, b0, bso, bsi, u16[kc], cm == IMM, c0, cso, csi, he, hm)


def _plan_f64(row: np.ndarray, op: int, dtype: int, src_dtype: int, shape: tuple, n_pe: int) -> Callable:
    """A VOP with a float64 side: float64 arithmetic, or a cvt between float32 and float64 (the
    validator refuses the other pairs)."""
    dm, d0, dso, dsi = (int(x) for x in row[isa.V_DST:isa.V_DST + FIELDS])
    if dtype == src_dtype:
        run = _plan_float(row, op, shape, n_pe, np.float64, _F64_LOOPS)
        return lambda f32, u16, i32, f64: run(f64())
    if dtype == DType.float64:  # cvt float32 -> float64
        a = _operand(isa.V_A, row, n_pe, np.float32)
        return lambda f32, u16, i32, f64: _cvt_float(*shape, f64()[dm], d0, dso, dsi, *_bound(a, f32), np.float64)
    a = _operand(isa.V_A, row, n_pe, np.float64)  # cvt float64 -> float32
    return lambda f32, u16, i32, f64: _cvt_float(*shape, f32[dm], d0, dso, dsi, *_bound(a, f64()), np.float32)


def _plan_float(row: np.ndarray, op: int, shape: tuple, n_pe: int, element: type, loops: dict) -> Callable:
    """A VOP whose operands and result are all `element`s (float32 or float64), as a function of
    the memories viewed so: a loop of its own for the common ops (float32 ones that fold into
    their destination: a fold, `_make_fold`), else `numerics.apply` element by element."""
    fold = _fold_fields(row, op) if element is np.float32 else None
    dm, d0, dso, dsi = (int(x) for x in row[isa.V_DST:isa.V_DST + FIELDS])
    shared = prod(shape) >= SHARED_ELEMENTS
    if fold is not None:
        whole, (bm, b0, bso, bsi) = fold

        def run(views: list[np.ndarray]) -> None:
            def pes(first: int, last: int) -> None:
                """The fold on PEs [first, last)."""
                _FOLDS_F32[op](last - first, *shape[1:], whole, views[dm][first:last], d0, dsi, views[bm][first:last],
                               b0, bso, bsi)
            run_shares(pes, n_pe) if shared else pes(0, n_pe)
        return run
    a, b, c = (_operand(f, row, n_pe, element) for f in (isa.V_A, isa.V_B, isa.V_C))
    kernel = loops[op] if op in loops else partial(_loop_any, op)
    extra = () if op in loops else (element,)

    def run(views: list[np.ndarray]) -> None:
        operands = [(views[dm], d0, dso, dsi)] + [_bound(x, views) for x in (a, b, c)]
        if not shared:
            kernel(*shape, *operands[0], *operands[1], *operands[2], *operands[3], *extra)
            return

        def pes(first: int, last: int) -> None:
            """The op on PEs [first, last): every operand's rows of those PEs."""
            rows = [(x[0][first:last], *x[1:]) for x in operands]
            kernel(last - first, *shape[1:], *rows[0], *rows[1], *rows[2], *rows[3], *extra)
        run_shares(pes, n_pe)
    return run

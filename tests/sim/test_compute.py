"""PE vector ops and MAU matrix products against torch; half follows the 1-6-9 format."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import hwdesc
import sim
from sim import isa, mau, vector
from sim.numerics import HalfCodec
from sim.numerics import f32_to_half as _f32_to_half
from sim.numerics import half_to_f32 as _half_to_f32

CODEC = HalfCodec.of(hwdesc.load("mncore2"))
encode_half, decode_half = CODEC.encode, CODEC.decode


def f32_to_half(x):
    return _f32_to_half(x, CODEC.e_bits, CODEC.m_bits)


def half_to_f32(h):
    return _half_to_f32(h, CODEC.e_bits, CODEC.m_bits)

UNARY = {"neg": torch.neg, "relu": torch.relu, "abs": torch.abs, "floor": torch.floor, "exp": torch.exp,
         "tanh": torch.tanh, "sigmoid": torch.sigmoid, "erf": torch.erf, "copy": lambda x: x}
POSITIVE = {"log": torch.log, "sqrt": torch.sqrt, "rsqrt": torch.rsqrt, "reciprocal": torch.reciprocal}
BINARY = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div, "max": torch.maximum,
          "min": torch.minimum, "pow": torch.pow,
          "cmp_lt": lambda a, b: (a < b).float(), "cmp_le": lambda a, b: (a <= b).float(),
          "cmp_gt": lambda a, b: (a > b).float(), "cmp_ge": lambda a, b: (a >= b).float(),
          "cmp_eq": lambda a, b: (a == b).float(), "cmp_ne": lambda a, b: (a != b).float()}


def pe_rows(m: sim.Machine, name: str) -> np.ndarray:
    return m.memory(name).view(np.float32)


# one memory per operand: an instruction reads each memory with one address pattern (memories.*.ports)
OPERAND_MEMORIES = ("LM0", "GRF0", "GRF1")


def run_vop(m: sim.Machine, op: str, a: np.ndarray, b: np.ndarray | None = None, c: np.ndarray | None = None):
    n = a.shape[1]
    for k, arr in enumerate((a, b, c)):
        if arr is not None:
            pe_rows(m, OPERAND_MEMORIES[k])[:, :n] = arr
    bld = sim.ProgramBuilder(m.params)
    ops = [(OPERAND_MEMORIES[k], 0, 0, 1) if arr is not None else None for k, arr in enumerate((a, b, c))]
    bld.vop(op, "float32", 1, n, ("LM1", 0, 0, 1), *ops)
    return m.run(bld.build()), pe_rows(m, "LM1")[:, :n].copy()


@pytest.mark.parametrize("op", sorted(UNARY) + sorted(POSITIVE))
def test_unary_ops_match_torch(mini, op):
    m = sim.Machine(mini)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((16, 64), dtype=np.float32) * 3
    if op in POSITIVE:
        x = np.abs(x) + 0.1
    _, got = run_vop(m, op, x)
    expect = ({**UNARY, **POSITIVE}[op])(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(got, expect, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("op", sorted(BINARY))
def test_binary_ops_match_torch(mini, op):
    m = sim.Machine(mini)
    rng = np.random.default_rng(1)
    a = rng.standard_normal((16, 64), dtype=np.float32)
    b = rng.standard_normal((16, 64), dtype=np.float32)
    if op == "pow":
        a, b = np.abs(a) + 0.5, np.round(b * 2)
    b[:, :8] = a[:, :8]  # some equal pairs for the comparisons
    _, got = run_vop(m, op, a, b)
    np.testing.assert_allclose(got, BINARY[op](torch.from_numpy(a), torch.from_numpy(b)).numpy(), rtol=1e-6)


def test_fma_select_and_immediates(mini):
    m = sim.Machine(mini)
    rng = np.random.default_rng(2)
    a, b, c = (rng.standard_normal((16, 32), dtype=np.float32) for _ in range(3))
    _, got = run_vop(m, "fma", a, b, c)
    np.testing.assert_allclose(got, a * b + c, rtol=1e-6)
    _, got = run_vop(m, "select", (a > 0).astype(np.float32), b, c)
    np.testing.assert_array_equal(got, np.where(a > 0, b, c))
    pe_rows(m, "LM0")[:, :32] = a
    bld = sim.ProgramBuilder(m.params)
    bld.vop("mul", "float32", 1, 32, ("LM1", 0, 0, 1), ("LM0", 0, 0, 1), 2.0)
    bld.vop("add", "float32", 1, 32, ("LM1", 0, 0, 1), ("LM1", 0, 0, 1), 1.0)
    m.run(bld.build())
    np.testing.assert_array_equal(pe_rows(m, "LM1")[:, :32], a * np.float32(2) + np.float32(1))


@pytest.mark.parametrize("op", ["add", "fma", "div"])
def test_a_vop_large_enough_to_split_its_pes_between_threads(mncore2, op):
    """Past SHARED_ELEMENTS the PEs are split between the host's threads (a loop of its own:
    add, fma; numerics.apply: div), an immediate operand too: every PE still computes its own."""
    from sim.vector import SHARED_ELEMENTS
    m = sim.Machine(mncore2)
    rng = np.random.default_rng(5)
    n_pe = mncore2.instances("PE")
    n = -(-SHARED_ELEMENTS // n_pe)
    a, b = (rng.standard_normal((n_pe, n), dtype=np.float32) for _ in range(2))
    pe_rows(m, "LM0")[:, :n], pe_rows(m, "GRF0")[:, :n] = a, b
    bld = sim.ProgramBuilder(m.params)
    third = (3.0,) if op == "fma" else ()
    bld.vop(op, "float32", 1, n, ("LM1", 0, 0, 1), ("LM0", 0, 0, 1), ("GRF0", 0, 0, 1), *third)
    m.run(bld.build())
    expected = {"add": a + b, "fma": a * b + np.float32(3), "div": a / b}[op]
    np.testing.assert_array_equal(pe_rows(m, "LM1")[:, :n], expected)


def test_strides_broadcast_and_reduce_along_the_address(mini):
    """Outer/inner strides: a row-broadcast add (stride 0) and an in-PE row sum (dst stride 0)."""
    m = sim.Machine(mini)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((16, 4, 8), dtype=np.float32)
    bias = rng.standard_normal((16, 8), dtype=np.float32)
    pe_rows(m, "LM0")[:, :32] = x.reshape(16, 32)
    pe_rows(m, "GRF0")[:, :8] = bias  # another memory than x: one read pattern per memory
    bld = sim.ProgramBuilder(m.params)
    bld.vop("add", "float32", 4, 8, ("LM1", 0, 8, 1), ("LM0", 0, 8, 1), ("GRF0", 0, 0, 1))
    bld.vop("copy", "float32", 1, 4, ("GRF1", 0, 0, 1), 0.0)
    bld.vop("add", "float32", 4, 8, ("GRF1", 0, 1, 0), ("GRF1", 0, 1, 0), ("LM1", 0, 8, 1))
    m.run(bld.build())
    np.testing.assert_array_equal(pe_rows(m, "LM1")[:, :32].reshape(16, 4, 8), x + bias[:, None, :])
    # summed left to right in float32 (numpy sums pairwise, hence the tolerance)
    np.testing.assert_allclose(pe_rows(m, "GRF1")[:, :4], (x + bias[:, None, :]).sum(axis=2), rtol=1e-5, atol=1e-6)


def _sequential_fold(op: str, start: np.ndarray, items: np.ndarray) -> np.ndarray:
    """start op items[..., 0] op items[..., 1] ..., left to right in float32 (the element loop's order)."""
    step = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "max": np.maximum}[op]  # maximum: NaN wins
    acc = start.copy()
    for k in range(items.shape[-1]):
        acc = step(acc, items[..., k]).astype(np.float32)
    return acc


@pytest.mark.parametrize("op", ["add", "sub", "mul", "max"])
def test_a_vop_folding_into_its_destination_gives_the_element_loops_words(mini, op):
    """d = d op b with d at stride 0 along the outer dimension (rows summed into one row) or along
    both (everything into one word) is run with d in a register (sim.vector's folds): the same
    words as the element loop, which adds each element to the word it stored one step before.
    B reading the destination's words (it can only as A, by memories.*.ports) keeps the element loop."""
    m = sim.Machine(mini)
    rng = np.random.default_rng(8)
    x = rng.standard_normal((16, 6, 5), dtype=np.float32)
    x[3, 2, 1] = np.nan if op == "max" else x[3, 2, 1]
    start = rng.standard_normal((16, 5), dtype=np.float32)
    pe_rows(m, "LM0")[:, :30] = x.reshape(16, 30)
    pe_rows(m, "LM1")[:, :5] = start
    pe_rows(m, "GRF0")[:, :1] = start[:, :1]
    pe_rows(m, "GRF1")[:, :1] = start[:, :1]
    bld = sim.ProgramBuilder(m.params)
    bld.vop(op, "float32", 6, 5, ("LM1", 0, 0, 1), ("LM1", 0, 0, 1), ("LM0", 0, 5, 1))  # rows into one row
    bld.vop(op, "float32", 6, 5, ("GRF0", 0, 0, 0), ("GRF0", 0, 0, 0), ("LM0", 0, 5, 1))  # all into one word
    bld.vop(op, "float32", 1, 4, ("GRF1", 0, 0, 0), ("GRF1", 0, 0, 0), ("GRF1", 0, 0, 0))  # d op d, four times
    program = bld.build()
    assert [vector._fold_fields(row, int(row[isa.V_OP])) is not None for row in program.code] == [True, True, False]
    m.run(program)
    np.testing.assert_array_equal(pe_rows(m, "LM1")[:, :5], _sequential_fold(op, start, x.transpose(0, 2, 1)))
    np.testing.assert_array_equal(pe_rows(m, "GRF0")[:, 0], _sequential_fold(op, start[:, 0], x.reshape(16, 30)))
    acc = start[:, 0]
    for _ in range(4):  # each step reads the word the step before stored, as B too
        acc = _sequential_fold(op, acc, acc[:, None])
    np.testing.assert_array_equal(pe_rows(m, "GRF1")[:, 0], acc)


def test_half_conversions_and_arithmetic(mini):
    m = sim.Machine(mini)
    x = np.random.default_rng(4).standard_normal((16, 64), dtype=np.float32)
    pe_rows(m, "LM0")[:, :64] = x
    bld = sim.ProgramBuilder(m.params)
    bld.vop("cvt", "float16", 1, 64, ("LM1", 0, 0, 1), ("LM0", 0, 0, 1), src_dtype="float32")  # 64 halves = 32 words
    bld.vop("mul", "float16", 1, 64, ("LM1", 64, 0, 1), ("LM1", 0, 0, 1), 3.0)
    bld.vop("cvt", "float32", 1, 64, ("GRF0", 0, 0, 1), ("LM1", 64, 0, 1), src_dtype="float16")
    m.run(bld.build())
    halves = m.memory("LM1").view(np.uint16)[:, :64]
    np.testing.assert_array_equal(halves, encode_half(x))
    np.testing.assert_array_equal(m.memory("GRF0").view(np.float32)[:, :64], decode_half(encode_half(decode_half(halves) * 3)))


def test_half_format_is_1_6_9():
    assert f32_to_half(np.float32(1.0)) == 0x3E00 and half_to_f32(np.uint16(0x3E00)) == 1.0
    assert f32_to_half(np.float32(-2.0)) == (1 << 15) | (32 << 9)
    assert half_to_f32(np.uint16((5 << 9) | 7)) == np.float32((1 + 7 / 512) * 2.0 ** (5 - 31))
    assert f32_to_half(np.float32(1 + 1 / 1024)) == 0x3E00  # a tie rounds to even (mantissa 0)
    assert f32_to_half(np.float32(1 + 3 / 1024)) == 0x3E02  # a tie rounds to even (mantissa 2)
    assert f32_to_half(np.float32(2.0 ** -31)) == 0  # below the smallest normal: +0, no denormals
    assert f32_to_half(np.float32(-2.0 ** -31)) == 0  # zero gets the + sign
    assert f32_to_half(np.float32(2.0 ** 33)) == 63 << 9  # beyond the largest: +inf
    assert f32_to_half(np.float32(np.nan)) == 63 << 9  # no NaN in the format
    assert half_to_f32(np.uint16((63 << 9) | 5)) == np.inf and half_to_f32(np.uint16(7)) == 0.0
    x = np.random.default_rng(5).standard_normal(10000).astype(np.float32)
    assert np.all(np.abs(decode_half(encode_half(x)) - x) <= np.abs(x) * 2.0 ** -10)


def _place_matmul(m: sim.Machine, a: np.ndarray, b: np.ndarray, *, trans_b: bool, half: bool) -> None:
    """Test setup: every MAB gets its own A (M x K) and B (K x N, or N x K), K split over its PEs."""
    pes = m.params.pes_per_mab
    n_mab, rows_a, k = a.shape
    kp = k // pes
    enc = encode_half if half else (lambda v: v)
    view = lambda name: m.memory(name).view(np.uint16 if half else np.float32).reshape(n_mab, pes, -1)  # noqa: E731
    for p in range(pes):
        view("LM0")[:, p, : rows_a * kp] = enc(a[:, :, p * kp:(p + 1) * kp]).reshape(n_mab, -1)
        part = b[:, :, p * kp:(p + 1) * kp] if trans_b else b[:, p * kp:(p + 1) * kp, :]
        view("LM1")[:, p, : part.shape[1] * part.shape[2]] = enc(part).reshape(n_mab, -1)


@pytest.mark.parametrize("chip", ["mini", "mncore2"])
@pytest.mark.parametrize("dtype, trans_b", [("float32", False), ("float32", True), ("float16", False)])
@pytest.mark.parametrize("M, K, N, short_slice, form", [
    (8, 16, 16, mau.SHORT_SLICE, mau.LOOP), (8, 64, 8, mau.SHORT_SLICE, mau.LOOP),
    (16, 16, 8, mau.SHORT_SLICE, mau.LOOP),  # taller than wide: the loop computes B^T A^T
    (8, 16, 16, 0, mau.GATHERED), (8, 64, 8, 0, mau.IN_PLACE)])  # BLAS for these shapes when no slice is short
def test_matmul_against_torch(chip, dtype, trans_b, M, K, N, short_slice, form, monkeypatch):
    hw = hwdesc.load(chip)
    m = sim.Machine(hw)
    n_mab, pes = hw.instances("MAB"), m.params.pes_per_mab
    monkeypatch.setattr(mau, "SHORT_SLICE", short_slice)
    assert mau.form(M, K, N, pes) == form
    rng = np.random.default_rng(6)
    a = rng.standard_normal((n_mab, M, K), dtype=np.float32)
    b = rng.standard_normal((n_mab, N, K) if trans_b else (n_mab, K, N), dtype=np.float32)
    half = dtype == "float16"
    _place_matmul(m, a, b, trans_b=trans_b, half=half)
    kp, np_ = K // pes, N // pes
    bld = sim.ProgramBuilder(m.params)
    bld.matmul(dtype, M, K, N, ("LM0", 0, kp), ("LM1", 0, kp if trans_b else N), ("GRF0", 0, np_), trans_b=trans_b)
    bld.matmul(dtype, M, K, N, ("LM0", 0, kp), ("LM1", 0, kp if trans_b else N), ("GRF0", 0, np_), trans_b=trans_b,
               accumulate=True)
    stats = m.run(bld.build())
    c = m.memory("GRF0").view(np.float32).reshape(n_mab, pes, -1)[:, :, : M * np_].reshape(n_mab, pes, M, np_)
    c = c.transpose(0, 2, 1, 3).reshape(n_mab, M, N)
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    if half:
        ta, tb = torch.from_numpy(decode_half(encode_half(a))), torch.from_numpy(decode_half(encode_half(b)))
    expect = 2 * torch.matmul(ta, tb.transpose(1, 2) if trans_b else tb).numpy()
    np.testing.assert_allclose(c, expect, rtol=1e-5, atol=1e-5)
    mode = hw.units["MAU"].matrix[dtype]
    cycles = -(-M // mode.rows) * -(-K // mode.cols) * max(N, -(-mode.rows // mode.load_rows_per_cycle))
    # the accumulating product reads the C (GRF0) the first one wrote: the YAML's gap between them
    gap = hw.hazards["grf_write_to_read"] * hw.step_cycles
    assert stats.pe_busy == 2 * -(-cycles // hw.step_cycles) * hw.step_cycles + gap


@pytest.mark.parametrize("rows, k, cols", [(64, 16, 128), (16, 7, 33), (3, 5, 8), (8, 1, 4), (1, 12, 1), (6, 9, 8), (7, 4, 3)])
def test_loop_products_sum_each_element_along_k_in_order(rows, k, cols):
    """The loop form's words are those of multiply-then-add in K order, starting from zero, for
    every K (its passes of four steps and the remainder): what makes stacked products equal.
    Values spread over magnitudes, so that another order of the adds rounds otherwise."""
    rng = np.random.default_rng(7)
    a = (rng.standard_normal((2, rows, k)) * 10.0 ** rng.integers(-4, 5, (2, rows, k))).astype(np.float32)
    b = (rng.standard_normal((2, k, cols)) * 10.0 ** rng.integers(-4, 5, (2, k, cols))).astype(np.float32)
    out = np.empty((2, rows, cols), np.float32)
    mau._multiply(a, b, out)
    expect = np.zeros((2, rows, cols), np.float32)
    for kk in range(k):
        expect = expect + a[:, :, kk:kk + 1] * b[:, kk:kk + 1, :]  # float32 products and sums, in order
    np.testing.assert_array_equal(out.view(np.uint32), expect.view(np.uint32))
    assert k < 4 or not np.array_equal(expect, (a.astype(np.float64) @ b.astype(np.float64)).astype(np.float32))

"""float64 (MN-Core 2's double, 1-11-52): VOPs on the units the YAML gives a float64 vector mode,
cvt to and from float32, and MATMUL at `units.MAU.matrix.float64`, against torch in float64."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import hwdesc
import sim
from sim import SimError, mau
from sim.isa import DType, VOp

N = 32  # float64 elements per PE of every test vector (64 words)
CHIPS = ["mini", "mncore2"]


def _values(n_pe: int, seed: int, positive: bool = False) -> np.ndarray:
    """Random doubles with the special values in the first columns: signed zeros, infinities, NaN
    and numbers below float32's range, which float64 keeps."""
    x = np.random.default_rng(seed).standard_normal((n_pe, N)) * 3
    x[:, :8] = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-300, -1e300, 1.0 + 2.0 ** -40]
    return np.abs(x) if positive else x


def _vop(m: sim.Machine, op: str, *arrays: np.ndarray, imm: float | None = None) -> np.ndarray:
    """One float64 VOP over N elements of every PE, operand k at word 0 of LM0, GRF0, GRF1."""
    ops = []
    for k, arr in enumerate(arrays):
        mem = ("LM0", "GRF0", "GRF1")[k]
        m.memory(mem)[:, :2 * N] = np.ascontiguousarray(arr, dtype=np.float64).view(np.uint32)
        ops.append((mem, 0, 0, 1))
    if imm is not None:
        ops.append(imm)
    b = sim.ProgramBuilder(m.params)
    b.vop(op, "float64", 1, N, ("LM1", 0, 0, 1), *ops)
    m.run(b.build())
    return m.memory("LM1")[:, :2 * N].copy().view(np.float64)


def _offered(hw) -> list[str]:
    """The float ops the chip runs in float64 (their unit has a float64 vector mode)."""
    p = sim.MachineParams.from_hw(hw)
    return [op.name for op in VOp if p.vop_lanes[op, DType.float64] > 0 and op != VOp.cvt]


T = torch.from_numpy
UNARY = {"neg": torch.neg, "reciprocal": torch.reciprocal, "rsqrt": torch.rsqrt, "sqrt": torch.sqrt,
         "exp": torch.exp, "expm1": torch.expm1, "log": torch.log, "log1p": torch.log1p, "tanh": torch.tanh,
         "sigmoid": torch.sigmoid, "erf": torch.erf, "sin": torch.sin, "cos": torch.cos, "round": torch.round,
         **{name: getattr(torch, name) for name in ("tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh",
                                                    "atanh", "erfinv", "lgamma", "digamma", "erfc")},
         "erfcx": torch.special.erfcx}
BINARY = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div,
          "floor_div": lambda a, b: torch.div(a, b, rounding_mode="floor"), "rem": torch.remainder,
          "pow": torch.pow, "atan2": torch.atan2, "hypot": torch.hypot}
# (rtol, atol) where the default is too tight: lgamma and digamma near their zeros (lgamma(1 + 2^-40),
# digamma's roots below 0), where the reflection's cancellation leaves torch and us about 3e-13
# relative from the exact value (checked with mpmath); erfcx, whose product exp(x^2) erfc(x) carries
# x^2's rounding into exp (a few ulps: 2.3e-15 over these values)
LOOSER = {"lgamma": (4e-16, 1e-15), "digamma": (1e-12, 1e-15), "erfcx": (4e-15, 0)}
# correctly rounded on both sides (torch's float64 sqrt on this CPU is not: 3 of 512 results 1 ulp off,
# where ours is the correctly rounded one, checked with decimal)
EXACT = {"add", "sub", "mul", "div", "neg", "round", "floor_div", "rem", "fma"}


def test_every_op_the_yaml_offers_in_float64_is_checked_here(mncore2):
    assert set(_offered(mncore2)) <= set(UNARY) | set(BINARY) | {"fma"}


@pytest.mark.parametrize("op", sorted(set(UNARY) | set(BINARY)))
def test_float64_ops_against_torch(mini, op):
    m = sim.Machine(mini)
    if op not in _offered(mini):
        pytest.skip(f"{op} has no float64 vector mode on {mini.name}")
    n_pe = mini.instances("PE")
    a = _values(n_pe, 1)
    if op in UNARY:
        got, want = _vop(m, op, a), UNARY[op](T(a)).numpy()
    else:
        b = _values(n_pe, 2)
        b[:, 8:12] = [0.0, -0.0, 2.0, 0.5]
        got, want = _vop(m, op, a, b), BINARY[op](T(a), T(b)).numpy()
    if op in EXACT:
        np.testing.assert_array_equal(got, want)
    else:  # libm against torch's own float64 kernels: the last bit or two may differ
        rtol, atol = LOOSER.get(op, (4e-16, 0))
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, equal_nan=True)
        assert np.array_equal(np.isnan(got), np.isnan(want)) and np.array_equal(np.signbit(got[~np.isnan(got)]),
                                                                                 np.signbit(want[~np.isnan(want)]))


def test_fma_and_an_immediate_keep_float64_precision(mini):
    m = sim.Machine(mini)
    n_pe = mini.instances("PE")
    a, b, c = (_values(n_pe, s) for s in (3, 4, 5))
    np.testing.assert_array_equal(_vop(m, "fma", a, b, c), (T(a) * T(b) + T(c)).numpy())  # multiply, round, add
    third = 1 / 3  # not a float32: an immediate of a float64 operand keeps all 64 bits
    np.testing.assert_array_equal(_vop(m, "mul", a, imm=third), a * third)


@pytest.mark.parametrize("chip", CHIPS)
def test_cvt_between_float32_and_float64_against_torch(chip):
    hw = hwdesc.load(chip)
    m = sim.Machine(hw)
    n_pe = hw.instances("PE")
    wide = _values(n_pe, 6)
    wide[:, 8:10] = [1e39, -1e-50]  # beyond float32: +inf, and -0.0
    m.memory("LM0")[:, :2 * N] = wide.view(np.uint32)
    b = sim.ProgramBuilder(m.params)
    b.vop("cvt", "float32", 1, N, ("LM1", 0, 0, 1), ("LM0", 0, 0, 1), src_dtype="float64")
    b.vop("cvt", "float64", 1, N, ("GRF0", 0, 0, 1), ("LM1", 0, 0, 1), src_dtype="float32")
    m.run(b.build())
    narrow = m.memory("LM1")[:, :N].copy().view(np.float32)
    np.testing.assert_array_equal(narrow, T(wide).float().numpy())
    np.testing.assert_array_equal(m.memory("GRF0")[:, :2 * N].copy().view(np.float64), T(narrow).double().numpy())


@pytest.mark.parametrize("op, dtypes, message", [
    ("max", ("float64", None), r"PE op max has no unit with a vector mode for float64: pe_ops.max runs float64 on ALU"),
    ("cvt", ("int32", "float64"), r"cvt between float64 and int32 is not modelled: float64 converts to and from float32"),
])
def test_what_float64_cannot_do_is_refused(mini, op, dtypes, message):
    b = sim.ProgramBuilder(sim.MachineParams.from_hw(mini))
    dtype, src = dtypes
    b.vop(op, dtype, 1, 4, ("LM1", 0, 0, 1), ("LM0", 0, 0, 1), ("GRF0", 0, 0, 1), src_dtype=src)
    with pytest.raises(SimError, match=message):
        sim.Machine(mini).run(b.build())


def test_transfers_do_not_reduce_float64(mini):
    b = sim.ProgramBuilder(sim.MachineParams.from_hw(mini))
    b.xfer("reduce", "up", "L1BM", 0, "LM0", 0, 16, red="add", dtype="float64")
    with pytest.raises(SimError, match="float64 elements are not reduced or transposed by transfers"):
        sim.Machine(mini).run(b.build())


def _place(m: sim.Machine, a: np.ndarray, b: np.ndarray) -> None:
    """Every MAB its own A (M x K) in LM0 and B (K x N) in LM1 as float64, K split over its PEs."""
    pes = m.params.pes_per_mab
    n_mab, rows, k = a.shape
    kp = k // pes
    view = lambda name: m.memory(name).view(np.float64).reshape(n_mab, pes, -1)  # noqa: E731
    for q in range(pes):
        view("LM0")[:, q, :rows * kp] = a[:, :, q * kp:(q + 1) * kp].reshape(n_mab, -1)
        view("LM1")[:, q, :kp * b.shape[2]] = b[:, q * kp:(q + 1) * kp, :].reshape(n_mab, -1)


@pytest.mark.parametrize("chip", CHIPS)
@pytest.mark.parametrize("M, K, N, short_slice", [(4, 16, 8, mau.SHORT_SLICE), (4, 16, 8, 0), (2, 96, 4, 0)])
def test_a_float64_product_against_torch_at_the_float64_matrix_rate(chip, M, K, N, short_slice, monkeypatch):
    monkeypatch.setattr(mau, "SHORT_SLICE", short_slice)  # the loop, and BLAS (gathered, in place)
    hw = hwdesc.load(chip)
    m = sim.Machine(hw)
    n_mab, pes = hw.instances("MAB"), m.params.pes_per_mab
    rng = np.random.default_rng(7)
    a, b = rng.standard_normal((n_mab, M, K)), rng.standard_normal((n_mab, K, N))
    a[:, 0, 0] = 1 + 2.0 ** -40  # lost in float32
    _place(m, a, b)
    kp, np_ = K // pes, N // pes
    bld = sim.ProgramBuilder(m.params)
    bld.matmul("float64", M, K, N, ("LM0", 0, kp), ("LM1", 0, N), ("GRF0", 0, np_))
    bld.matmul("float64", M, K, N, ("LM0", 0, kp), ("LM1", 0, N), ("GRF0", 0, np_), accumulate=True)
    stats = m.run(bld.build())
    c = m.memory("GRF0").view(np.float64).reshape(n_mab, pes, -1)[:, :, :M * np_].reshape(n_mab, pes, M, np_)
    expect = 2 * torch.matmul(T(a), T(b)).numpy()
    np.testing.assert_allclose(c.transpose(0, 2, 1, 3).reshape(n_mab, M, N), expect, rtol=1e-13, atol=1e-13)
    mode = hw.units["MAU"].matrix["float64"]
    cycles = math.ceil(M / mode.rows) * math.ceil(K / mode.cols) * max(N, math.ceil(mode.rows / mode.load_rows_per_cycle))
    gap = hw.hazards["grf_write_to_read"] * hw.step_cycles  # the accumulating product reads the C the first wrote
    assert stats.pe_busy == 2 * -(-cycles // hw.step_cycles) * hw.step_cycles + gap

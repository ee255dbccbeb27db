"""int32 arithmetic, int <-> float conversion and the float ops compiled models need beyond the
first set (sin, cos, log1p, expm1, rounding, sign, floor_div, rem, logic), against torch."""

from __future__ import annotations

import textwrap
from math import ceil

import numpy as np
import pytest
import torch

import hwdesc
import sim
from sim import SimError
from sim.isa import IMM, V_B
from sim.numerics import HalfCodec

I32 = np.iinfo(np.int32)
N = 64  # elements per PE of every test vector


def _load(m: sim.Machine, arrays: list[np.ndarray]) -> list[tuple[str, int, int, int] | None]:
    """Test setup: operand k at LM0 words [k*N, (k+1)*N) of every PE, bit for bit."""
    ops = []
    for k, arr in enumerate(arrays):  # one memory per operand: one read pattern per memory (memories.*.ports)
        mem = ("LM0", "GRF0", "GRF1")[k]
        m.memory(mem)[:, :N] = np.ascontiguousarray(arr).view(np.uint32)
        ops.append((mem, 0, 0, 1))
    return ops


def run(m: sim.Machine, op: str, dtype: str, *arrays: np.ndarray, src_dtype: str | None = None,
        out: type = np.int32, imm: float | int | None = None) -> np.ndarray:
    """One VOP over N elements of every PE; returns the destination as `out`."""
    ops = _load(m, list(arrays)) + ([imm] if imm is not None else [])
    b = sim.ProgramBuilder(m.params)
    b.vop(op, dtype, 1, N, ("LM1", 0, 0, 1), *ops, src_dtype=src_dtype)
    m.run(b.build())
    return m.memory("LM1").view(out)[:, :N].copy()


def ints(rng: np.random.Generator, small: bool = False) -> np.ndarray:
    """int32 test data: the full range (so that sums and products overflow), small values of both
    signs, and the extremes."""
    if small:
        x = rng.integers(-20, 21, (16, N))
    else:
        x = rng.integers(I32.min, I32.max, (16, N), endpoint=True)
        x[:, :4] = [I32.min, I32.max, -1, 0]
        x[:, 4:24] = rng.integers(-1000, 1001, (16, 20))
    return x.astype(np.int32)


T = torch.from_numpy

INT_BINARY = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "max": torch.maximum, "min": torch.minimum,
    "and": torch.bitwise_and, "or": torch.bitwise_or, "xor": torch.bitwise_xor,
    "cmp_lt": lambda a, b: (a < b).int(), "cmp_le": lambda a, b: (a <= b).int(), "cmp_gt": lambda a, b: (a > b).int(),
    "cmp_ge": lambda a, b: (a >= b).int(), "cmp_eq": lambda a, b: (a == b).int(), "cmp_ne": lambda a, b: (a != b).int(),
}
INT_UNARY = {"copy": lambda x: x, "neg": torch.neg, "abs": torch.abs, "relu": torch.relu, "sign": torch.sign}


@pytest.mark.parametrize("op", sorted(INT_BINARY))
def test_int32_binary_ops_wrap_like_torch(mini, op):
    m = sim.Machine(mini)
    rng = np.random.default_rng(10)
    a, b = ints(rng), ints(rng)
    b[:, 24:32] = a[:, 24:32]  # equal pairs for the comparisons
    got = run(m, op, "int32", a, b)
    np.testing.assert_array_equal(got, INT_BINARY[op](T(a), T(b)).numpy())


@pytest.mark.parametrize("op", sorted(INT_UNARY))
def test_int32_unary_ops_match_torch(mini, op):
    m = sim.Machine(mini)
    a = ints(np.random.default_rng(11))  # holds INT32_MIN: neg and abs of it wrap to itself
    np.testing.assert_array_equal(run(m, op, "int32", a), INT_UNARY[op](T(a)).numpy())


@pytest.mark.parametrize("op, torch_op", [("shl", torch.bitwise_left_shift), ("shr", torch.bitwise_right_shift)])
def test_int32_shifts_match_torch_and_take_the_amount_mod_32(mini, op, torch_op):
    """Amounts 0..31 shift as torch does (shr is arithmetic: floor(a / 2^b)); an amount of 32 or
    more, or a negative one, shifts by its low five bits (sim.numerics)."""
    m = sim.Machine(mini)
    rng = np.random.default_rng(15)
    a = ints(rng)
    b = rng.integers(0, 32, (16, N)).astype(np.int32)
    b[:, :4] = [0, 1, 30, 31]
    np.testing.assert_array_equal(run(m, op, "int32", a, b), torch_op(T(a), T(b)).numpy())
    wide = rng.integers(-100, 100, (16, N)).astype(np.int32)
    np.testing.assert_array_equal(run(m, op, "int32", a, wide), torch_op(T(a), T(wide & 31)).numpy())


def test_shifts_are_refused_on_floats(mini):
    b = sim.ProgramBuilder(sim.Machine(mini).params)
    b.vop("shl", "float32", 1, N, ("LM1", 0, 0, 1), ("LM0", 0, 0, 1), 2.0)
    with pytest.raises(SimError, match="PE op shl shifts the bits of int32 words; it is not defined on float32"):
        sim.Machine(mini).run(b.build())


def test_int32_overflow_wraps_around(mini):
    m = sim.Machine(mini)
    a = np.full((16, N), I32.max, dtype=np.int32)
    assert (run(m, "add", "int32", a, imm=1) == I32.min).all()
    assert (run(m, "mul", "int32", a, imm=2) == -2).all()


@pytest.mark.parametrize("small", [False, True])
def test_int32_floor_div_and_rem_follow_torch_signs(mini, small):
    """floor_div rounds toward -inf and rem has the sign of b, as torch.div(rounding_mode="floor")
    and torch.remainder; a zero divisor gives 0 and a (documented in sim.numerics)."""
    m = sim.Machine(mini)
    rng = np.random.default_rng(12)
    a, b = ints(rng, small), ints(rng, small=True)
    b[:, :8] = 0
    b[:, 8:12] = [-1, 1, -7, 7]
    q, r = run(m, "floor_div", "int32", a, b), run(m, "rem", "int32", a, b)
    nz = b != 0
    safe = T(np.where(nz, b, 1))
    ok = nz & ~((a == I32.min) & (b == -1))  # torch may trap there; we wrap (checked below)
    np.testing.assert_array_equal(q[ok], torch.div(T(a), safe, rounding_mode="floor").numpy()[ok])
    np.testing.assert_array_equal(r[ok], torch.remainder(T(a), safe).numpy()[ok])
    assert (q[~nz] == 0).all() and (r[~nz] == a[~nz]).all()
    # a == b * q + r everywhere, in wrapping int32 arithmetic
    np.testing.assert_array_equal((b.astype(np.int64) * q + r).astype(np.int32), a)


def test_int32_select_and_wrapping_min_div(mini):
    m = sim.Machine(mini)
    rng = np.random.default_rng(13)
    cond, b, c = ints(rng, small=True), ints(rng), ints(rng)
    np.testing.assert_array_equal(run(m, "select", "int32", cond, b, c), np.where(cond != 0, b, c))
    a = np.full((16, N), I32.min, dtype=np.int32)
    assert (run(m, "floor_div", "int32", a, imm=-1) == I32.min).all()
    assert (run(m, "rem", "int32", a, imm=-1) == 0).all()


def test_int32_immediates_are_int32_bits(mini):
    m = sim.Machine(mini)
    b = sim.ProgramBuilder(m.params)
    b.vop("add", "int32", 1, N, ("LM1", 0, 0, 1), ("LM0", 0, 0, 1), -3)
    b.vop("add", "float32", 1, N, ("LM1", 0, 0, 1), ("LM0", 0, 0, 1), -3)
    code = b.build().code
    assert code[0, V_B] == IMM and code[0, V_B + 1] == np.array([-3], np.int32).view(np.uint32)[0]
    assert code[1, V_B + 1] == np.array([-3], np.float32).view(np.uint32)[0]
    a = ints(np.random.default_rng(14))
    np.testing.assert_array_equal(run(m, "sub", "int32", a, imm=-3.0), (T(a) - (-3)).numpy())  # integral float ok
    with pytest.raises(SimError, match="must be an integer, not 2.5"):
        sim.ProgramBuilder(m.params).vop("add", "int32", 1, N, ("LM1", 0, 0, 1), ("LM0", 0, 0, 1), 2.5)
    with pytest.raises(SimError, match="does not fit an int32"):
        sim.ProgramBuilder(m.params).vop("add", "int32", 1, N, ("LM1", 0, 0, 1), ("LM0", 0, 0, 1), 2 ** 31)


# ---- conversions --------------------------------------------------------------------------

def test_cvt_float32_to_int32_truncates_like_torch(mini):
    m = sim.Machine(mini)
    x = (np.random.default_rng(15).standard_normal((16, N)) * 1e5).astype(np.float32)
    x[:, :6] = [2.5, -2.5, 0.99, -0.99, -0.0, 2.0 ** 31 - 128]
    got = run(m, "cvt", "int32", x, src_dtype="float32")
    np.testing.assert_array_equal(got, T(x).to(torch.int32).numpy())


def test_cvt_float_to_int32_saturates_and_maps_nan_to_zero(mini):
    m = sim.Machine(mini)
    x = np.tile(np.array([3e9, -3e9, np.inf, -np.inf, np.nan, 2.0 ** 31, -2.0 ** 31, 1.5], np.float32), (16, N // 8))
    expect = np.tile(np.array([I32.max, I32.min, I32.max, I32.min, 0, I32.max, I32.min, 1], np.int32), (16, N // 8))
    np.testing.assert_array_equal(run(m, "cvt", "int32", x, src_dtype="float32"), expect)


def test_cvt_int32_to_float32_rounds_to_nearest_like_torch(mini):
    m = sim.Machine(mini)
    a = ints(np.random.default_rng(16))
    got = run(m, "cvt", "float32", a, src_dtype="int32", out=np.float32)
    np.testing.assert_array_equal(got, T(a).to(torch.float32).numpy())


def _nearest_half(values: np.ndarray, codec: HalfCodec) -> np.ndarray:
    """Reference: the half bits nearest each value, ties to the even mantissa (one rounding)."""
    finite = np.flatnonzero(np.isfinite(codec.table) & (codec.table >= 0))
    order = finite[np.argsort(codec.table[finite], kind="stable")]
    grid = codec.table[order].astype(np.float64)
    v = np.abs(values.astype(np.float64))
    hi = np.clip(np.searchsorted(grid, v), 1, len(grid) - 1)
    lo = hi - 1
    d_lo, d_hi = v - grid[lo], grid[hi] - v
    pick = np.where((d_hi < d_lo) | ((d_hi == d_lo) & (order[hi] % 2 == 0)), hi, lo)
    bits = order[pick].astype(np.uint16)
    sign = np.uint16(1 << (codec.e_bits + codec.m_bits))
    return np.where((values < 0) & (bits != 0), bits | sign, bits).astype(np.uint16)


def test_cvt_between_int32_and_half(mini):
    m = sim.Machine(mini)
    codec = m.params.half
    rng = np.random.default_rng(17)
    a = ints(rng)
    a[:, 24:32] = [(1 << 25) + (1 << 15) + 1, -((1 << 25) + (1 << 15) + 1), 513, 1025, 1027, -1027, 1, -1]
    b = sim.ProgramBuilder(m.params)
    ops = _load(m, [a])
    b.vop("cvt", "float16", 1, N, ("LM1", 0, 0, 1), ops[0], src_dtype="int32")  # N halves in LM1 words 0..N/2
    b.vop("cvt", "int32", 1, N, ("GRF0", 0, 0, 1), ("LM1", 0, 0, 1), src_dtype="float16")
    m.run(b.build())
    halves = m.memory("LM1").view(np.uint16)[:, :N]
    np.testing.assert_array_equal(halves, _nearest_half(a, codec))  # not via float32: that rounds twice
    back = codec.decode(halves).astype(np.float64)
    expect = np.clip(np.trunc(back), I32.min, I32.max).astype(np.int32)
    np.testing.assert_array_equal(m.memory("GRF0").view(np.int32)[:, :N], expect)


# ---- the new float ops --------------------------------------------------------------------

FLOAT_UNARY = {"sin": torch.sin, "cos": torch.cos, "log1p": torch.log1p, "expm1": torch.expm1, "ceil": torch.ceil,
               "trunc": torch.trunc, "round": torch.round, "sign": torch.sign}


@pytest.mark.parametrize("op", sorted(FLOAT_UNARY))
def test_new_float_unary_ops_match_torch(mini, op):
    m = sim.Machine(mini)
    x = np.random.default_rng(18).standard_normal((16, N)).astype(np.float32) * 3
    if op == "log1p":
        x = np.abs(x) - 0.9
    x[:, :8] = [0.5, 1.5, 2.5, -0.5, -2.5, 0.0, -0.0, 1e-3]  # ties round to even, signed zeros
    got = run(m, op, "float32", x, out=np.float32)
    np.testing.assert_allclose(got, FLOAT_UNARY[op](T(x)).numpy(), rtol=1e-6, atol=1e-6)


def test_new_float_ops_special_values(mini):
    m = sim.Machine(mini)
    x = np.tile(np.array([np.nan, np.inf, -np.inf, -1.0, -2.0, 100.0, 0.0, 1e30], np.float32), (16, N // 8))
    for op in ("sign", "log1p", "expm1", "ceil", "trunc", "round", "sin", "cos"):
        got = run(m, op, "float32", x, out=np.float32)
        # NaN, infinities and zeros exactly; torch's float32 sin and cos may be an ulp off elsewhere
        np.testing.assert_allclose(got, FLOAT_UNARY[op](T(x)).numpy(), rtol=2e-7, atol=0, err_msg=op)


def _float_pairs(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    a = (rng.standard_normal((16, N)) * 10).astype(np.float32)
    b = (rng.standard_normal((16, N)) * 3).astype(np.float32)
    a[:, :8] = [7.5, -7.5, 7.5, -7.5, 6.0, -6.0, 1e-8, -1e-8]
    b[:, :8] = [2.0, 2.0, -2.0, -2.0, 3.0, 3.0, 3.0, -3.0]
    return a, b


def test_float_floor_div_and_rem_match_torch(mini):
    m = sim.Machine(mini)
    a, b = _float_pairs(np.random.default_rng(19))
    b[:, 8:10] = 0.0  # a zero divisor: +-inf and NaN, as torch
    np.testing.assert_array_equal(run(m, "floor_div", "float32", a, b, out=np.float32),
                                  torch.div(T(a), T(b), rounding_mode="floor").numpy())
    np.testing.assert_array_equal(run(m, "rem", "float32", a, b, out=np.float32), torch.remainder(T(a), T(b)).numpy())


@pytest.mark.parametrize("op, ref", [("and", torch.logical_and), ("or", torch.logical_or), ("xor", torch.logical_xor)])
def test_float_logic_treats_nonzero_as_true(mini, op, ref):
    m = sim.Machine(mini)
    rng = np.random.default_rng(20)
    a = rng.integers(0, 2, (16, N)).astype(np.float32)
    b = rng.integers(0, 2, (16, N)).astype(np.float32)
    a[:, :4] = [-3.0, 0.5, np.nan, 0.0]
    np.testing.assert_array_equal(run(m, op, "float32", a, b, out=np.float32), ref(T(a), T(b)).float().numpy())


def test_new_ops_in_half(mini):
    m = sim.Machine(mini)
    codec = m.params.half
    x = np.random.default_rng(21).standard_normal((16, N)).astype(np.float32)
    h = codec.encode(x)
    m.memory("LM0").view(np.uint16)[:, :N] = h
    b = sim.ProgramBuilder(m.params)
    b.vop("sin", "float16", 1, N, ("LM1", 0, 0, 1), ("LM0", 0, 0, 1))
    m.run(b.build())
    expect = codec.encode(torch.sin(T(codec.decode(h))).numpy())
    np.testing.assert_array_equal(m.memory("LM1").view(np.uint16)[:, :N], expect)


# ---- what the chip offers -----------------------------------------------------------------

def test_float_only_ops_on_int32_are_refused(mini):
    m = sim.Machine(mini)
    b = sim.ProgramBuilder(m.params)
    b.vop("exp", "int32", 1, N, ("LM1", 0, 0, 1), ("LM0", 0, 0, 1))
    with pytest.raises(SimError, match="PE op exp has no unit with a vector mode for int32: pe_ops.exp runs int32 "
                                       "on MAU"):
        m.run(b.build())
    b = sim.ProgramBuilder(m.params)
    b.vop("floor", "int32", 1, N, ("LM1", 0, 0, 1), ("LM0", 0, 0, 1))  # the ALU has int32, but floor is float
    with pytest.raises(SimError, match="PE op floor is not defined on int32; the int32 ops are copy, add"):
        m.run(b.build())


def _without_int32(tmp_path, op: str) -> sim.Machine:
    path = tmp_path / f"no_int_{op}.yaml"
    path.write_text(textwrap.dedent(f"""
        extends: mini
        name: no_int_{op}
        pe_ops:
          {op}:
            dtypes:
              int32: ~
        """))
    return sim.Machine(hwdesc.load(path))


def test_a_variant_without_the_int32_override_refuses_int32_add(tmp_path):
    m = _without_int32(tmp_path, "add")
    b = sim.ProgramBuilder(m.params)
    b.vop("add", "int32", 1, N, ("LM1", 0, 0, 1), ("LM0", 0, 0, 1), ("GRF0", 0, 0, 1))
    with pytest.raises(SimError, match=r"instruction #0 \(VOP add.int32.*PE op add has no unit with a vector mode "
                                       r"for int32: pe_ops.add runs int32 on MAU"):
        m.run(b.build())


def test_a_cvt_is_checked_for_both_dtypes(tmp_path):
    m = _without_int32(tmp_path, "cvt")
    for dtype, src in (("float32", "int32"), ("int32", "float32")):
        b = sim.ProgramBuilder(m.params)
        b.vop("cvt", dtype, 1, N, ("LM1", 0, 0, 1), ("LM0", 0, 0, 1), src_dtype=src)
        with pytest.raises(SimError, match="PE op cvt has no unit with a vector mode for int32"):
            m.run(b.build())


# ---- timing -------------------------------------------------------------------------------

def vop_cycles(hw: hwdesc.HwDesc, op: str, fmt: str, n: int) -> int:
    """ceil(n / lanes) * issues * step_cycles, with unit and issues of the op's entry for `fmt`."""
    cost = hw.pe_ops[op].cost(fmt)
    unit = hw.units[cost.unit]
    lanes = unit.vector[fmt].lanes_per_cycle * hw.step_cycles // hw.fanout(unit.level, hw.leaf_level)
    return ceil(n / lanes) * cost.issues * hw.step_cycles


@pytest.mark.parametrize("op, dtype", [("add", "int32"), ("mul", "int32"), ("sin", "float32"), ("add", "float32"),
                                       ("floor_div", "int32"), ("and", "float32"), ("and", "int32")])
def test_vop_cycles_from_the_dtype_entry(mncore2, op, dtype):
    m = sim.Machine(mncore2)
    b = sim.ProgramBuilder(m.params)
    b.vop(op, dtype, 3, 100, ("LM1", 0, 100, 1), ("LM0", 0, 100, 1), ("GRF0", 0, 100, 1))
    stats = m.run(b.build(), mode="timing")
    assert stats.pe_busy == vop_cycles(mncore2, op, dtype, 300)


def test_int32_add_runs_on_the_alu_sin_on_the_mau(mncore2):
    """The YAML says where each runs: the int32 override, and the float default."""
    assert mncore2.pe_ops["add"].cost("int32").unit == "ALU" != mncore2.pe_ops["add"].cost("float32").unit
    assert mncore2.pe_ops["sin"].cost("float32").unit == "MAU"


def test_cvt_cycles_take_the_slower_side(mncore2):
    m = sim.Machine(mncore2)
    b = sim.ProgramBuilder(m.params)
    b.vop("cvt", "int32", 1, 200, ("LM1", 0, 0, 1), ("LM0", 0, 0, 1), src_dtype="float32")
    stats = m.run(b.build(), mode="timing")
    step = mncore2.step_cycles
    sides = [(mncore2.pe_ops["cvt"].cost(f), mncore2.units[mncore2.pe_ops["cvt"].cost(f).unit]) for f in ("int32", "float32")]
    lanes = min(u.vector[f].lanes_per_cycle * step // mncore2.fanout(u.level, mncore2.leaf_level)
                for (_, u), f in zip(sides, ("int32", "float32")))
    issues = max(c.issues for c, _ in sides)
    assert stats.pe_busy == ceil(200 / lanes) * issues * step


# ---- trigonometric, hyperbolic, their inverses and the gamma family ----------------------------

# op: (reference, inputs drawn from its domain, relative tolerance). digamma's tolerance is its
# error against float64 near its root (x ~ 1.4616), where torch's float32 kernel is further off.
INVERSE_UNARY = {
    "tan": (torch.tan, lambda r: r.uniform(-1.5, 1.5, (16, N)), 1e-6),
    "asin": (torch.asin, lambda r: r.uniform(-1, 1, (16, N)), 1e-6),
    "acos": (torch.acos, lambda r: r.uniform(-1, 1, (16, N)), 1e-6),
    "atan": (torch.atan, lambda r: r.standard_normal((16, N)) * 10, 1e-6),
    "sinh": (torch.sinh, lambda r: r.standard_normal((16, N)) * 5, 1e-6),
    "cosh": (torch.cosh, lambda r: r.standard_normal((16, N)) * 5, 1e-6),
    "asinh": (torch.asinh, lambda r: r.standard_normal((16, N)) * 100, 1e-6),
    "acosh": (torch.acosh, lambda r: 1 + np.abs(r.standard_normal((16, N))) * 50, 1e-6),
    "atanh": (torch.atanh, lambda r: r.uniform(-1, 1, (16, N)), 1e-6),
    "erfinv": (torch.erfinv, lambda r: r.uniform(-1, 1, (16, N)), 1e-5),
    "erfc": (torch.erfc, lambda r: r.standard_normal((16, N)) * 3, 1e-6),
    "erfcx": (torch.special.erfcx, lambda r: np.abs(r.standard_normal((16, N))) * 3, 1e-6),  # below 0: next test
    "lgamma": (torch.lgamma, lambda r: r.standard_normal((16, N)) * 8, 1e-5),
    "digamma": (torch.digamma, lambda r: r.standard_normal((16, N)) * 8, 1e-4),
}


@pytest.mark.parametrize("op", sorted(INVERSE_UNARY))
def test_inverse_and_hyperbolic_ops_match_torch(mini, op):
    ref, draw, rtol = INVERSE_UNARY[op]
    x = draw(np.random.default_rng(21)).astype(np.float32)
    got = run(sim.Machine(mini), op, "float32", x, out=np.float32)
    np.testing.assert_allclose(got, ref(T(x)).numpy(), rtol=rtol, atol=1e-6)


@pytest.mark.parametrize("op, ref", [("atan2", torch.atan2), ("hypot", torch.hypot)])
def test_atan2_and_hypot_match_torch(mini, op, ref):
    a, b = _float_pairs(np.random.default_rng(22))
    a[:, 8:12], b[:, 8:12] = [3e38, -1e-30, 0.0, -0.0], [3e38, 1e-30, -0.0, -1.0]  # no overflow; signed zeros
    got = run(sim.Machine(mini), op, "float32", a, b, out=np.float32)
    np.testing.assert_allclose(got, ref(T(a), T(b)).numpy(), rtol=1e-6, atol=0)


def test_erfcx_is_finite_where_its_two_factors_are_not(mini):
    """erfcx(x) = exp(x^2) erfc(x): exp(x^2) overflows float32 from x = 9.4 and erfc underflows it
    from 10.1, where erfcx is about 1 / (x sqrt(pi)); float64 from 26.6, where the series takes over.
    Below -9.4 it is inf, as torch's. Against torch's float64 erfcx rounded to float32: below 0 its
    float32 one is 3e-6 off (2 exp(x^2) with x^2 rounded to float32), where ours rounds once."""
    x = np.concatenate([np.linspace(-12, 40, 16 * N - 6), [1e30, 3e38, np.inf, -np.inf, np.nan, -0.0]])
    x = x.astype(np.float32).reshape(16, N)
    got = run(sim.Machine(mini), "erfcx", "float32", x, out=np.float32)
    want = torch.special.erfcx(T(x).double()).float().numpy()
    far = np.isfinite(x) & (x > 9.4)
    assert np.isfinite(got[far]).all() and (got[far] > 0).all()
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=0)


def test_erfc_keeps_its_tail_where_one_minus_erf_is_zero(mini):
    """erfc is an op of its own: 1 - erf(x) in float32 is 0 from x = 4, erfc(9) is 4.1e-37. Checked
    relative to torch's (no absolute slack), over the whole float32 range of the tail."""
    x = np.linspace(-4, 9, 16 * N, dtype=np.float32).reshape(16, N)
    x[0, :4] = [np.inf, -np.inf, np.nan, -0.0]
    got = run(sim.Machine(mini), "erfc", "float32", x, out=np.float32)
    want = torch.special.erfc(T(x)).numpy()
    assert got[0, 0] == 0 and got[0, 1] == 2 and np.isnan(got[0, 2]) and got[0, 3] == 1
    tail = np.isfinite(x) & (x > 4)
    assert (want[tail] > 0).all() and (got[tail] > 0).all()
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=0)

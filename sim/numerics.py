"""Number formats: MN-Core 2's half (1-6-9) and the element-wise arithmetic of the PEs.

Half is PFN's own format, not IEEE binary16: on MN-Core 2 1 sign, 6 exponent (bias 31, so 1.0
is 0x3e00) and 9 mantissa bits, read from the YAML's `formats.float16`; an all-zero exponent is
zero whatever the mantissa (no denormals), an all-one exponent is infinity whatever the mantissa
(no NaN), and results are normalised: zero always gets the + sign. Encoding rounds to nearest,
ties to even.

How mnsim deviates from the hardware, exactly:
* float32 arithmetic is IEEE single precision with round-to-nearest, as torch computes it;
  the hardware flushes float32 denormals to zero and has no NaN (a NaN result of ours is NaN).
  Nothing is published about MN-Core 2's NaN and signed zeros, so special values follow torch
  (tests/mlsdk/test_special_values.py checks every element-wise op): max and min propagate a NaN
  from either operand (`nan_max`, `nan_min`; reductions too); relu keeps NaN and -0.0; x / -0.0
  and rsqrt(-0.0) are -inf; exp(NaN) is NaN; pow follows C's pow, as torch does (pow(0, 1/3) is
  0, pow(-0.0, -1) is -inf, pow(NaN, 0) and pow(1, NaN) are 1, a negative base to a fractional
  power is NaN). Between -0.0 and +0.0, max and min answer as
  torch's scalar CPU loop does (max(-0.0, +0.0) is -0.0); torch itself is not consistent there:
  its vectorised loop, which it takes from 16 elements on, answers +0.0.
  Functions torch computes from a decomposition (gelu, for one) give that decomposition's
  signed zero: gelu(-0.0) is -0.0, where torch's CPU kernel returns +0.0.
* float64 (the VOPs of units with a float64 vector mode in the YAML: the MAU's on MN-Core 2,
  not the ALU's; cvt to and from float32; MATMUL, accumulating in float64) is IEEE double with
  round-to-nearest, special values as for float32. `apply` computes every float op in the
  operands' type, so the element functions are to float64 accuracy there (libm; torch's own
  float64 kernels may differ in the last bit, its sqrt on this machine's CPU too).
* A NaN encoded to half becomes +inf (the format has no NaN).
* exp, expm1, log, log1p, sin, cos, tan, their inverses (asin, acos, atan, atan2), sinh, cosh,
  tanh, theirs (asinh, acosh, atanh), sigmoid, erf, erfc, erfcx, erfinv, lgamma, digamma, hypot, reciprocal,
  rsqrt, sqrt, pow, floor_div and rem are computed to float32 accuracy (floor_div and rem exactly
  as torch computes them); the hardware runs them as instruction sequences (their step counts
  come from the YAML), whose rounding may differ in the last bits. Their special values are
  torch's: lgamma is +inf at its poles, digamma -inf at +0.0, +inf at -0.0 and NaN at the
  negative integers, erfinv +-inf at +-1 and NaN beyond.
* int32 arithmetic wraps around in two's complement, as torch's int32 does (INT32_MIN // -1 is
  INT32_MIN, abs and neg of INT32_MIN are INT32_MIN). An int32 division by zero gives
  floor_div 0 and rem a, so that a == b * floor_div(a, b) + rem(a, b) still holds; torch
  raises instead. The shifts (shl, shr: arithmetic) take the amount mod 32, the five bits a
  shift field holds; torch's int32 shifts by 32 or more give 0 (or -1 right of a negative). The
  compiler emits only constant amounts below 32, where the two agree.
* cvt from float to int32 truncates toward zero like torch's `.to(torch.int32)`; values beyond
  the int32 range saturate to INT32_MIN / INT32_MAX and NaN becomes 0, where torch's result is
  undefined (INT32_MIN on x86). cvt from int32 rounds to nearest even, once (to half directly,
  not through float32, which would round twice).
* Matrix products in half use each element's own exponent; the hardware's block-float operands
  share one exponent per block, which loses low bits of small elements in a block. The same
  holds for float32 and pseudo-single operands. A pseudo-single (`pfloat32`) operand is the
  float32 word with the low mantissa bits that `formats.pfloat32` lacks against
  `formats.float32` cleared (truncation; a NaN stays NaN); its products accumulate in float32.
"""

from __future__ import annotations

import functools
import math
import sys

import numpy as np
from numba import njit

from hwdesc.errors import HwDescError

from .isa import VOp

# IEEE binary32: the layout of numpy's float32, the type every PE op computes in. MN-Core's
# single (formats.float32 in the YAML) has the same field widths; `HalfCodec` checks that.
F32_EXP_BITS, F32_MAN_BITS = 8, 23
INT32_BITS = 32
SHIFT_MASK = INT32_BITS - 1  # the shift amount's bits a 32-bit shift uses
F32_BIAS = (1 << (F32_EXP_BITS - 1)) - 1
I32_MIN, I32_MAX = int(np.iinfo(np.int32).min), int(np.iinfo(np.int32).max)


@njit(cache=True)
def half_from_f32_bits(bits: np.uint32, e_bits: int, m_bits: int) -> np.uint16:
    """float32 bits -> half bits with e_bits exponent and m_bits mantissa bits (MN-Core: 6 and 9):
    round to nearest even, flush to +0, saturate to infinity, NaN to +infinity."""
    e_max = (1 << e_bits) - 1
    bias = (1 << (e_bits - 1)) - 1
    sign = np.int64((bits >> (F32_EXP_BITS + F32_MAN_BITS)) & 1)
    exp8 = np.int64((bits >> F32_MAN_BITS) & ((1 << F32_EXP_BITS) - 1))
    man = np.int64(bits & ((1 << F32_MAN_BITS) - 1))
    sign_bit = sign << (e_bits + m_bits)
    inf = e_max << m_bits
    if exp8 == (1 << F32_EXP_BITS) - 1:
        return np.uint16(inf if man != 0 else sign_bit | inf)
    if exp8 == 0:
        return np.uint16(0)
    e = exp8 - F32_BIAS + bias
    drop = F32_MAN_BITS - m_bits
    m = man >> drop
    rest = man & ((1 << drop) - 1)
    half_way = 1 << (drop - 1)
    if rest > half_way or (rest == half_way and (m & 1) == 1):
        m += 1
        if m == 1 << m_bits:
            m = 0
            e += 1
    if e >= e_max:
        return np.uint16(sign_bit | inf)
    if e <= 0:
        return np.uint16(0)
    return np.uint16(sign_bit | (e << m_bits) | m)


@njit(cache=True)
def half_to_f32(h: np.uint16, e_bits: int, m_bits: int) -> np.float32:
    """Half bits -> float32 value: exponent 0 is zero, all-ones is infinity, whatever the mantissa."""
    e_max = (1 << e_bits) - 1
    sign = -1.0 if (np.int64(h) >> (e_bits + m_bits)) & 1 else 1.0
    e = (np.int64(h) >> m_bits) & e_max
    m = np.int64(h) & ((1 << m_bits) - 1)
    if e == 0:
        return np.float32(0.0)
    if e == e_max:
        return np.float32(sign * np.inf)
    return np.float32(sign * (1.0 + m / float(1 << m_bits)) * 2.0 ** (e - ((1 << (e_bits - 1)) - 1)))


@njit(cache=True)
def f32_to_half(x: np.float32, e_bits: int, m_bits: int) -> np.uint16:
    return half_from_f32_bits(np.array([x], dtype=np.float32).view(np.uint32)[0], e_bits, m_bits)


@njit(cache=True)
def half_from_int(x: np.int64, e_bits: int, m_bits: int) -> np.uint16:
    """An integer -> half bits, rounded once to nearest even; beyond the largest half: infinity."""
    if x == 0:
        return np.uint16(0)
    sign = np.int64(1) if x < 0 else np.int64(0)
    mag = -np.int64(x) if x < 0 else np.int64(x)
    e = 0
    while mag >> (e + 1):
        e += 1
    shift = e - m_bits
    if shift > 0:
        m = mag >> shift
        rest = mag & ((np.int64(1) << shift) - 1)
        half_way = np.int64(1) << (shift - 1)
        if rest > half_way or (rest == half_way and (m & 1) == 1):
            m += 1
            if m == np.int64(1) << (m_bits + 1):
                m >>= 1
                e += 1
    else:
        m = mag << -shift
    e_max = (1 << e_bits) - 1
    biased = e + (1 << (e_bits - 1)) - 1
    sign_bit = sign << (e_bits + m_bits)
    if biased >= e_max:
        return np.uint16(sign_bit | (e_max << m_bits))
    return np.uint16(sign_bit | (biased << m_bits) | (m & ((1 << m_bits) - 1)))


@njit(cache=True)
def i32_from_f32(x: np.float32) -> np.int32:
    """float -> int32 toward zero, as torch's `.to(torch.int32)`; out of range saturates and NaN
    is 0 (torch leaves both undefined)."""
    if x != x:
        return np.int32(0)
    if x >= I32_MAX:
        return np.int32(I32_MAX)
    if x <= I32_MIN:
        return np.int32(I32_MIN)
    return np.int32(np.int64(x))


class HalfCodec:
    """Vectorised conversions for one half format, built from the YAML's `formats.float16`."""

    def __init__(self, exponent_bits: int, mantissa_bits: int) -> None:
        self.e_bits, self.m_bits = exponent_bits, mantissa_bits
        self.bias = (1 << (exponent_bits - 1)) - 1
        self.e_max = (1 << exponent_bits) - 1
        h = np.arange(1 << (1 + exponent_bits + mantissa_bits), dtype=np.int64)
        e, m = (h >> mantissa_bits) & self.e_max, h & ((1 << mantissa_bits) - 1)
        s = np.where((h >> (exponent_bits + mantissa_bits)) & 1, -1.0, 1.0)
        v = s * (1.0 + m / float(1 << mantissa_bits)) * np.exp2(e - self.bias)
        self.table = np.where(e == 0, 0.0, np.where(e == self.e_max, s * np.inf, v)).astype(np.float32)

    @staticmethod
    def of(hw) -> "HalfCodec":
        single, half = hw.formats["float32"], hw.formats["float16"]
        if (single.exponent_bits, single.mantissa_bits) != (F32_EXP_BITS, F32_MAN_BITS):
            raise HwDescError(f"{hw.name}: mnsim computes single precision as IEEE binary32 (1-8-23); the chip's "
                             f"float32 is 1-{single.exponent_bits}-{single.mantissa_bits}")
        return _codec(half.exponent_bits, half.mantissa_bits)

    def encode(self, x: np.ndarray) -> np.ndarray:
        """float32 values -> half bits (same rounding as `half_from_f32_bits`)."""
        bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.int64)
        sign = (bits >> (F32_EXP_BITS + F32_MAN_BITS)) & 1
        exp8, man = (bits >> F32_MAN_BITS) & ((1 << F32_EXP_BITS) - 1), bits & ((1 << F32_MAN_BITS) - 1)
        drop = F32_MAN_BITS - self.m_bits
        e = exp8 - F32_BIAS + self.bias
        m, rest = man >> drop, man & ((1 << drop) - 1)
        half_way = 1 << (drop - 1)
        m = m + ((rest > half_way) | ((rest == half_way) & ((m & 1) == 1)))
        carry = m == (1 << self.m_bits)
        e, m = np.where(carry, e + 1, e), np.where(carry, 0, m)
        sign_bit = sign << (self.e_bits + self.m_bits)
        inf = sign_bit | (self.e_max << self.m_bits)
        out = np.where(e >= self.e_max, inf, sign_bit | (e << self.m_bits) | m)
        out = np.where(e <= 0, 0, out)
        out = np.where(exp8 == (1 << F32_EXP_BITS) - 1, np.where(man != 0, self.e_max << self.m_bits, inf), out)
        out = np.where(exp8 == 0, 0, out)
        return out.astype(np.uint16).reshape(np.shape(x))

    def decode(self, h: np.ndarray) -> np.ndarray:
        return self.table[np.asarray(h, dtype=np.uint16)]


@functools.cache
def _codec(e_bits: int, m_bits: int) -> HalfCodec:
    return HalfCodec(e_bits, m_bits)


@njit(cache=True)
def _erf(x: float) -> float:
    return math.erf(x)


# Where exp(x^2) erfc(x) stops being a float64 product of two finite factors: erfc underflows
# (1e-296 at 26) and exp(x^2) overflows (at 26.6); beyond, the asymptotic series (a numerical
# method's bound, not the chip's)
ERFCX_SERIES_FROM = 26.0
LOG_DOUBLE_MAX = math.log(sys.float_info.max)  # exp overflows double beyond it


@njit(cache=True)
def _erfcx(x: float) -> float:
    """exp(x^2) erfc(x) to double accuracy: the product where both factors are finite, the
    asymptotic series 1 / (x sqrt(pi)) (1 - 1/(2x^2) + 3/(4x^4) - 15/(8x^6)) beyond (its next term
    is below 1e-10 there), and 2 exp(x^2) - erfcx(-x) below 0 (+inf where exp(x^2) overflows, as
    torch's float32 erfcx is inf from x = -9.4)."""
    if x != x:
        return x
    if x < 0:
        return 2.0 * math.exp(x * x) - _erfcx(-x) if x * x < LOG_DOUBLE_MAX else math.inf
    if x < ERFCX_SERIES_FROM:
        return math.exp(x * x) * math.erfc(x)
    u = 1.0 / (2.0 * x * x)
    return (1.0 - u + 3.0 * u * u - 15.0 * u * u * u) / (x * math.sqrt(math.pi))


@njit(cache=True)
def _ieee_div(a, b, T):
    """a / b with IEEE results for a zero divisor (numba would raise): +-inf, or NaN for 0 / 0."""
    if b != 0:
        return T(a / b)
    if a != a or a == 0:
        return T(np.nan)
    return T(np.copysign(np.inf, a) * np.copysign(1.0, b))


@njit(cache=True)
def _floor_div(a, b, T):
    """floor(a / b) step for step as torch's div_floor_floating, in `T`: the quotient of
    a - fmod(a, b), corrected to the floor, so that it agrees with torch.remainder."""
    if b == 0:
        return _ieee_div(a, b, T)
    mod = T(np.fmod(a, b))
    div = T(T(a - mod) / b)
    if mod != 0 and (b < 0) != (mod < 0):
        div = T(div - T(1.0))
    if div == 0:
        return T(np.copysign(0.0, T(a / b)))
    q = T(np.floor(div))
    if T(div - q) > T(0.5):
        q = T(q + T(1.0))
    return q


@njit(cache=True)
def _rem(a, b, T):
    """a mod b with the sign of b, as torch.remainder: fmod, moved by b when the signs differ."""
    if b == 0:
        return T(np.nan)
    mod = T(np.fmod(a, b))
    if mod != 0 and (b < 0) != (mod < 0):
        mod = T(mod + b)
    return mod


@njit(cache=True, inline="always")
def nan_max(a, b):
    """torch.maximum: a NaN in either operand gives NaN; otherwise b if a < b, else a (so
    max(-0.0, +0.0) is -0.0, as torch computes it on the CPU)."""
    return b if (b != b or a < b) else a


@njit(cache=True, inline="always")
def nan_min(a, b):
    """torch.minimum, as `nan_max`: NaN wins, otherwise b if b < a, else a."""
    return b if (b != b or b < a) else a


@njit(cache=True)
def _truth(x: bool, T):
    return T(1.0) if x else T(0.0)


@njit(cache=True)
def apply(op: int, a, b, c, T):
    """One element of a VOP in the float type `T` (np.float32, or np.float64 for float64 operands;
    half operands are decoded to float32 before and encoded after): every result is rounded to T."""
    if op == VOp.copy or op == VOp.cvt:
        return a
    if op == VOp.add:
        return T(a + b)
    if op == VOp.sub:
        return T(a - b)
    if op == VOp.mul:
        return T(a * b)
    if op == VOp.div:
        return _ieee_div(a, b, T)
    if op == VOp.fma:
        return T(T(a * b) + c)
    if op == VOp.neg:
        return T(-a)
    if op == VOp.max:
        return nan_max(a, b)
    if op == VOp.min:
        return nan_min(a, b)
    if op == VOp.relu:
        return T(0.0) if a < 0 else a  # keeps NaN and -0.0, as torch.relu
    if op == VOp.abs:
        return T(abs(a))
    if op == VOp.cmp_lt:
        return T(1.0) if a < b else T(0.0)
    if op == VOp.cmp_le:
        return T(1.0) if a <= b else T(0.0)
    if op == VOp.cmp_gt:
        return T(1.0) if a > b else T(0.0)
    if op == VOp.cmp_ge:
        return T(1.0) if a >= b else T(0.0)
    if op == VOp.cmp_eq:
        return T(1.0) if a == b else T(0.0)
    if op == VOp.cmp_ne:
        return T(1.0) if a != b else T(0.0)
    if op == VOp.select:
        return b if a != 0 else c
    if op == VOp.floor:
        return T(np.floor(a))  # not math.floor: an int64 in numba, wrong beyond 2^63 and for inf
    if op == VOp.reciprocal:
        return T(1.0) / a if a != 0 else T(np.copysign(np.inf, a))
    if op == VOp.rsqrt:
        if a == 0:
            return T(np.copysign(np.inf, a))  # rsqrt(-0.0) is -inf, as 1 / sqrt(-0.0)
        return T(1.0 / math.sqrt(a)) if a > 0 else T(np.nan)
    if op == VOp.sqrt:
        return T(math.sqrt(a)) if a >= 0 else T(np.nan)
    if op == VOp.exp:
        return T(math.exp(float(a)))  # NaN stays NaN; beyond the type's range inf
    if op == VOp.log:
        return T(math.log(a)) if a > 0 else (T(-np.inf) if a == 0 else T(np.nan))
    if op == VOp.tanh:
        return T(math.tanh(a))
    if op == VOp.sigmoid:
        if a >= 0:
            return T(1.0 / (1.0 + math.exp(-a)))
        z = math.exp(a)
        return T(z / (1.0 + z))
    if op == VOp.erf:
        return T(_erf(float(a)))
    if op == VOp.pow:
        return T(math.pow(float(a), float(b)))  # C's pow, as torch's: pow(0, 1/3) is 0, pow(-0.0, -1) -inf
    return _apply_more(op, a, b, c, T)


@njit(cache=True)
def _apply_more(op: int, a, b, c, T):
    """The float ops added after the first set (VOp 29 on), kept apart so `apply` stays short."""
    if op == VOp.sin:
        return T(math.sin(float(a))) if abs(a) < np.inf else T(np.nan)
    if op == VOp.cos:
        return T(math.cos(float(a))) if abs(a) < np.inf else T(np.nan)
    if op == VOp.log1p:
        if a > -1:
            return T(math.log1p(float(a)))
        return T(-np.inf) if a == -1 else T(np.nan)
    if op == VOp.expm1:
        return T(math.expm1(float(a)))
    if op == VOp.ceil:
        return T(np.ceil(a))
    if op == VOp.trunc:
        return T(np.trunc(a))
    if op == VOp.round:
        return T(np.rint(a))  # half to even
    if op == VOp.sign:
        return T(1.0) if a > 0 else (T(-1.0) if a < 0 else T(0.0))
    if op == VOp.floor_div:
        return _floor_div(a, b, T)
    if op == VOp.rem:
        return _rem(a, b, T)
    if op == VOp.and_:
        return _truth(a != 0 and b != 0, T)
    if op == VOp.or_:
        return _truth(a != 0 or b != 0, T)
    if op == VOp.xor:
        return _truth((a != 0) != (b != 0), T)
    return _apply_inverse(op, a, b, T)


@njit(cache=True)
def _apply_inverse(op: int, a, b, T):
    """The trigonometric, hyperbolic and inverse functions and the gamma family (VOp 44 on),
    computed in double and rounded once to T; special values as torch's (C99's for the libm ones)."""
    x = np.float64(a)  # float(a) keeps a float32 a float32 in numba
    if op == VOp.tan:
        return T(math.tan(x)) if abs(x) < np.inf else T(np.nan)
    if op == VOp.asin:
        return T(math.asin(x)) if abs(x) <= 1 else T(np.nan)
    if op == VOp.acos:
        return T(math.acos(x)) if abs(x) <= 1 else T(np.nan)
    if op == VOp.atan:
        return T(math.atan(x))
    if op == VOp.sinh:
        return T(math.sinh(x))
    if op == VOp.cosh:
        return T(math.cosh(x))
    if op == VOp.asinh:
        return T(math.asinh(x))
    if op == VOp.acosh:
        return T(math.acosh(x)) if x >= 1 else T(np.nan)
    if op == VOp.atanh:
        if abs(x) < 1:
            return T(math.atanh(x))
        return T(np.copysign(np.inf, x)) if abs(x) == 1 else T(np.nan)
    if op == VOp.erfinv:
        return T(_erfinv(x))
    if op == VOp.lgamma:
        if x <= 0 and x == np.floor(x):
            return T(np.inf)  # the poles (and -inf), as torch
        return T(math.lgamma(x))
    if op == VOp.digamma:
        return T(_digamma(x))
    if op == VOp.atan2:
        return T(math.atan2(x, float(b)))
    if op == VOp.hypot:
        return T(math.hypot(x, float(b)))
    if op == VOp.erfc:
        return T(math.erfc(x))
    if op == VOp.erfcx:
        return T(_erfcx(x))
    return T(np.nan)


NEWTON_STEPS = 6  # at most, for erfinv; two reach float64 accuracy from Giles' start on float32's range


@njit(cache=True)
def _erfinv(x: float) -> float:
    """The inverse error function: Giles' single-precision approximation ("Approximating the erfinv
    function", 2010) as the start, then Newton steps in double on erf (from 0.5 on log erfc, where
    erf(y) - x would cancel and erfc falls steeply): two for a float32 input; float64 inputs
    closer to +-1 than float32 reaches (past the start's fitted range) take a few more."""
    if not abs(x) <= 1:
        return np.nan
    if abs(x) == 1:
        return np.copysign(np.inf, x)
    if x == 0:
        return x  # keeps the zero's sign
    w = -math.log((1.0 - x) * (1.0 + x))
    if w < 5.0:
        w -= 2.5
        p = 2.81022636e-08
        for c in (3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087, -0.00125372503,
                  -0.00417768164, 0.246640727, 1.50140941):
            p = c + p * w
    else:
        w = math.sqrt(w) - 3.0
        p = -0.000200214257
        for c in (0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773, -0.0076224613,
                  0.00943887047, 1.00167406, 2.83297682):
            p = c + p * w
    a = abs(x)
    y = abs(p * x)
    for _ in range(NEWTON_STEPS):
        slope = 2.0 / math.sqrt(math.pi) * math.exp(-y * y)
        if a < 0.5:
            step = (math.erf(y) - a) / slope
        else:  # on log erfc(y) = log(1 - a): exact to erfc's accuracy, and nearly quadratic in y
            tail = math.erfc(y)
            step = (math.log(tail) - math.log(1.0 - a)) / (-slope / tail)
        y -= step
        if abs(step) <= abs(y) * 1e-17:
            break
    return np.copysign(y, x)


@njit(cache=True)
def _digamma(x: float) -> float:
    """psi(x) as torch: -inf at +0.0 and +inf at -0.0, NaN at the negative integers and -inf;
    the reflection psi(1 - x) - pi / tan(pi x) below 0, the recurrence psi(x) = psi(x + 1) - 1/x
    up to 6, then the asymptotic series."""
    if x != x or x == -np.inf:
        return np.nan
    if x == 0:
        return -np.copysign(np.inf, x)
    shift = 0.0
    if x < 0:
        if x == np.floor(x):
            return np.nan
        r = x - np.floor(x)  # pi / tan(pi x) has period 1: reduced before the product loses bits
        shift = -math.pi / math.tan(math.pi * r)
        x = 1.0 - x
    if x == np.inf:
        return np.inf
    while x < 10.0:
        shift -= 1.0 / x
        x += 1.0
    z = 1.0 / (x * x)
    # B_2k / (2k x^2k), B the Bernoulli numbers: 1/12, 1/120, 1/252, 1/240, 1/132, 691/32760, 1/12
    # with alternating signs; from x = 10 the first term left out is below 1e-16 (float64 accuracy)
    series = 0.0
    for c in (1.0 / 12.0, -691.0 / 32760.0, 1.0 / 132.0, -1.0 / 240.0, 1.0 / 252.0, -1.0 / 120.0, 1.0 / 12.0):
        series = series * z + c
    return shift + math.log(x) - 0.5 / x - series * z


@njit(cache=True)
def apply_i32(op: int, a: np.int32, b: np.int32, c: np.int32) -> np.int32:
    """One element of an int32 VOP: computed in int64, wrapped to 32 bits (two's complement, as
    torch's int32); comparisons give 1 or 0. Division by zero: floor_div 0, rem a (see above)."""
    x, y = np.int64(a), np.int64(b)
    if op == VOp.copy:
        return a
    if op == VOp.add:
        return np.int32(x + y)
    if op == VOp.sub:
        return np.int32(x - y)
    if op == VOp.mul:
        return np.int32(x * y)
    if op == VOp.neg:
        return np.int32(-x)
    if op == VOp.abs:
        return np.int32(abs(x))
    if op == VOp.max:
        return a if x >= y else b
    if op == VOp.min:
        return a if x <= y else b
    if op == VOp.relu:
        return a if x > 0 else np.int32(0)
    if op == VOp.sign:
        return np.int32(1) if x > 0 else (np.int32(-1) if x < 0 else np.int32(0))
    if op == VOp.select:
        return b if x != 0 else c
    if op == VOp.floor_div:
        return np.int32(x // y) if y != 0 else np.int32(0)  # Python's // is the floor
    if op == VOp.rem:
        return np.int32(x % y) if y != 0 else a  # Python's % has the sign of y
    if op == VOp.and_:
        return np.int32(x & y)
    if op == VOp.or_:
        return np.int32(x | y)
    if op == VOp.xor:
        return np.int32(x ^ y)
    if op == VOp.shl:
        return np.int32(x << (y & SHIFT_MASK))  # at most 62 bits in the int64, the high ones dropped
    if op == VOp.shr:
        return np.int32(x >> (y & SHIFT_MASK))  # int64 >> is arithmetic, as the ALU's bsr
    return _compare_i32(op, x, y)


@njit(cache=True)
def _compare_i32(op: int, x: np.int64, y: np.int64) -> np.int32:
    if op == VOp.cmp_lt:
        r = x < y
    elif op == VOp.cmp_le:
        r = x <= y
    elif op == VOp.cmp_gt:
        r = x > y
    elif op == VOp.cmp_ge:
        r = x >= y
    elif op == VOp.cmp_eq:
        r = x == y
    elif op == VOp.cmp_ne:
        r = x != y
    else:  # not an int32 op: the validator rejects it before it gets here
        r = False
    return np.int32(1) if r else np.int32(0)

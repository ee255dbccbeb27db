"""Number formats: MN-Core 2's half (1-6-9) and the element-wise arithmetic of the PEs.

Half is PFN's own format, not IEEE binary16: 1 sign, 6 exponent (bias 31, so 1.0 is 0x3e00),
9 mantissa bits; an all-zero exponent is zero whatever the mantissa (no denormals), an all-one
exponent is infinity whatever the mantissa (no NaN), and results are normalised: zero always
gets the + sign. Encoding rounds to nearest, ties to even.

How mnsim deviates from the hardware, exactly:
* float32 arithmetic is IEEE single precision with round-to-nearest, as torch computes it;
  the hardware flushes float32 denormals to zero and has no NaN (a NaN result of ours is NaN).
* A NaN encoded to half becomes +inf (the format has no NaN).
* exp, log, tanh, sigmoid, erf, reciprocal, rsqrt, sqrt and pow are computed to float32 accuracy;
  the hardware runs them as instruction sequences (their step counts come from the YAML), whose
  rounding may differ in the last bits.
* Matrix products in half use each element's own exponent; the hardware's block-float operands
  share one exponent per block of 16, which loses low bits of small elements in a block.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from .isa import VOp

HALF_BIAS = 31
HALF_MANT = 9
HALF_EXP_MAX = 63
HALF_INF = np.uint16(HALF_EXP_MAX << HALF_MANT)


@njit(cache=True)
def half_from_f32_bits(bits: np.uint32) -> np.uint16:
    """float32 bits -> MN-Core half bits (round to nearest even, flush to +0, saturate to inf)."""
    sign = (bits >> 31) & 1
    exp8 = (bits >> 23) & 0xFF
    man = bits & 0x7FFFFF
    if exp8 == 0xFF:
        if man != 0:
            return np.uint16(HALF_EXP_MAX << HALF_MANT)  # NaN -> +inf
        return np.uint16((sign << 15) | (HALF_EXP_MAX << HALF_MANT))
    if exp8 == 0:
        return np.uint16(0)
    e = np.int64(exp8) - 127 + HALF_BIAS
    m = np.int64(man >> 14)
    rest = np.int64(man & 0x3FFF)
    if rest > 0x2000 or (rest == 0x2000 and (m & 1) == 1):
        m += 1
        if m == 512:
            m = 0
            e += 1
    if e >= HALF_EXP_MAX:
        return np.uint16((sign << 15) | (HALF_EXP_MAX << HALF_MANT))
    if e <= 0:
        return np.uint16(0)
    return np.uint16((sign << 15) | (e << HALF_MANT) | m)


@njit(cache=True)
def half_to_f32(h: np.uint16) -> np.float32:
    """MN-Core half bits -> float32 value."""
    sign = -1.0 if (h >> 15) & 1 else 1.0
    e = (np.int64(h) >> HALF_MANT) & HALF_EXP_MAX
    m = np.int64(h) & 511
    if e == 0:
        return np.float32(0.0)
    if e == HALF_EXP_MAX:
        return np.float32(sign * np.inf)
    return np.float32(sign * (1.0 + m / 512.0) * 2.0 ** (e - HALF_BIAS))


@njit(cache=True)
def f32_to_half(x: np.float32) -> np.uint16:
    return half_from_f32_bits(np.array([x], dtype=np.float32).view(np.uint32)[0])


def _half_table() -> np.ndarray:
    h = np.arange(1 << 16, dtype=np.int64)
    e, m, s = (h >> HALF_MANT) & HALF_EXP_MAX, h & 511, np.where(h >> 15, -1.0, 1.0)
    v = s * (1.0 + m / 512.0) * np.exp2(e - HALF_BIAS)
    v = np.where(e == 0, 0.0, np.where(e == HALF_EXP_MAX, s * np.inf, v))
    return v.astype(np.float32)


HALF_TO_F32 = _half_table()  # decode table: float32 value of every half bit pattern


def encode_half(x: np.ndarray) -> np.ndarray:
    """Vectorised float32 -> half bits (same rounding as `half_from_f32_bits`)."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.int64)
    sign, exp8, man = (bits >> 31) & 1, (bits >> 23) & 0xFF, bits & 0x7FFFFF
    e = exp8 - 127 + HALF_BIAS
    m, rest = man >> 14, man & 0x3FFF
    up = (rest > 0x2000) | ((rest == 0x2000) & ((m & 1) == 1))
    m = m + up
    e = np.where(m == 512, e + 1, e)
    m = np.where(m == 512, 0, m)
    out = (sign << 15) | (e << HALF_MANT) | m
    inf = (sign << 15) | (HALF_EXP_MAX << HALF_MANT)
    out = np.where(e >= HALF_EXP_MAX, inf, out)
    out = np.where(e <= 0, 0, out)
    out = np.where(exp8 == 0xFF, np.where(man != 0, HALF_EXP_MAX << HALF_MANT, inf), out)
    out = np.where(exp8 == 0, 0, out)
    return out.astype(np.uint16).reshape(np.shape(x))


def decode_half(h: np.ndarray) -> np.ndarray:
    return HALF_TO_F32[np.asarray(h, dtype=np.uint16)]


@njit(cache=True)
def _erf(x: float) -> float:
    return math.erf(x)


@njit(cache=True)
def apply(op: int, a: np.float32, b: np.float32, c: np.float32) -> np.float32:
    """One element of a VOP, in float32 (half operands are decoded before and encoded after)."""
    if op == VOp.copy or op == VOp.cvt:
        return a
    if op == VOp.add:
        return np.float32(a + b)
    if op == VOp.sub:
        return np.float32(a - b)
    if op == VOp.mul:
        return np.float32(a * b)
    if op == VOp.div:
        return np.float32(a / b) if b != 0 else np.float32(np.copysign(np.inf, a) if a != 0 else np.nan)
    if op == VOp.fma:
        return np.float32(np.float32(a * b) + c)
    if op == VOp.neg:
        return np.float32(-a)
    if op == VOp.max:
        return a if a >= b else b
    if op == VOp.min:
        return a if a <= b else b
    if op == VOp.relu:
        return a if a > 0 else np.float32(0.0)
    if op == VOp.abs:
        return np.float32(abs(a))
    if op == VOp.cmp_lt:
        return np.float32(1.0) if a < b else np.float32(0.0)
    if op == VOp.cmp_le:
        return np.float32(1.0) if a <= b else np.float32(0.0)
    if op == VOp.cmp_gt:
        return np.float32(1.0) if a > b else np.float32(0.0)
    if op == VOp.cmp_ge:
        return np.float32(1.0) if a >= b else np.float32(0.0)
    if op == VOp.cmp_eq:
        return np.float32(1.0) if a == b else np.float32(0.0)
    if op == VOp.cmp_ne:
        return np.float32(1.0) if a != b else np.float32(0.0)
    if op == VOp.select:
        return b if a != 0 else c
    if op == VOp.floor:
        return np.float32(math.floor(a))
    if op == VOp.reciprocal:
        return np.float32(1.0) / a if a != 0 else np.float32(np.copysign(np.inf, a))
    if op == VOp.rsqrt:
        return np.float32(1.0 / math.sqrt(a)) if a > 0 else (np.float32(np.inf) if a == 0 else np.float32(np.nan))
    if op == VOp.sqrt:
        return np.float32(math.sqrt(a)) if a >= 0 else np.float32(np.nan)
    if op == VOp.exp:
        return np.float32(math.exp(min(float(a), 88.8)) if a < 88.8 else np.inf)
    if op == VOp.log:
        return np.float32(math.log(a)) if a > 0 else (np.float32(-np.inf) if a == 0 else np.float32(np.nan))
    if op == VOp.tanh:
        return np.float32(math.tanh(a))
    if op == VOp.sigmoid:
        if a >= 0:
            return np.float32(1.0 / (1.0 + math.exp(-a)))
        z = math.exp(a)
        return np.float32(z / (1.0 + z))
    if op == VOp.erf:
        return np.float32(_erf(float(a)))
    if op == VOp.pow:
        return np.float32(float(a) ** float(b)) if (a > 0 or b == math.floor(b)) else np.float32(np.nan)
    return np.float32(np.nan)

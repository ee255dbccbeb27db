"""Number formats: MN-Core 2's half (1-6-9) and the element-wise arithmetic of the PEs.

Half is PFN's own format, not IEEE binary16: on MN-Core 2 1 sign, 6 exponent (bias 31, so 1.0
is 0x3e00) and 9 mantissa bits, read from the YAML's `formats.float16`; an all-zero exponent is
zero whatever the mantissa (no denormals), an all-one exponent is infinity whatever the mantissa
(no NaN), and results are normalised: zero always gets the + sign. Encoding rounds to nearest,
ties to even.

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

import functools
import math

import numpy as np
from numba import njit

from .isa import VOp

# IEEE binary32: the layout of numpy's float32, the type every PE op computes in. MN-Core's
# single (formats.float32 in the YAML) has the same field widths; `HalfCodec` checks that.
F32_EXP_BITS, F32_MAN_BITS = 8, 23
F32_BIAS = (1 << (F32_EXP_BITS - 1)) - 1


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
            raise ValueError(f"{hw.name}: mnsim computes single precision as IEEE binary32 (1-8-23); the chip's "
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


_EXP_OVERFLOW = math.log(float(np.finfo(np.float32).max))  # exp beyond this is inf in float32


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
        return np.float32(math.exp(float(a))) if a < _EXP_OVERFLOW else np.float32(np.inf)
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

"""Reductions in transfers: MV mode reduce (Data Engines) and XFER mode reduce (upward, per group).

A reduce combines the same words of several children in order (child 0, then 1, ...), rounding
after every combine as the hardware's adders do. Both instructions are driven from Python over
numpy views of the memories, and the arithmetic runs in numba over whole rows at once: float32
and int32 on views of the words, halves per packed word through the half codec.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from . import isa
from .isa import ALL_GROUPS, DType, Red
from .moves import member_groups, scope_range, word_addr
from .numerics import half_from_f32_bits, half_to_f32, nan_max, nan_min
from .params import FMT_HALF_E, FMT_HALF_M, FMT_WPL, WORD_BITS


@njit(cache=True)
def _combine_values(red: int, acc: np.ndarray, other: np.ndarray) -> None:
    """acc = acc (red) other, float32 or int32 arrays shaped [rows, members, words] (int32 adds
    wrap around, as torch's int32 does: the int64 sum is stored back into int32)."""
    for i in range(acc.shape[0]):
        for j in range(acc.shape[1]):
            for k in range(acc.shape[2]):
                x, y = acc[i, j, k], other[i, j, k]
                acc[i, j, k] = x + y if red == Red.add else (nan_max(x, y) if red == Red.max else nan_min(x, y))


@njit(cache=True)
def _combine_halves(red: int, acc: np.ndarray, other: np.ndarray, he: int, hm: int) -> None:
    """As `_combine_values` on words that pack halves, each result rounded back to a half."""
    bits = 1 + he + hm
    mask = (1 << bits) - 1
    for i in range(acc.shape[0]):
        for j in range(acc.shape[1]):
            for k in range(acc.shape[2]):
                a, b = acc[i, j, k], other[i, j, k]
                out = np.uint32(0)
                for h in range(WORD_BITS // bits):
                    shift = h * bits
                    x = half_to_f32(np.uint16((a >> shift) & mask), he, hm)
                    y = half_to_f32(np.uint16((b >> shift) & mask), he, hm)
                    r = np.float32(x + y) if red == Red.add else (nan_max(x, y) if red == Red.max else nan_min(x, y))
                    out |= np.uint32(half_from_f32_bits(np.array([r]).view(np.uint32)[0], he, hm)) << shift
                acc[i, j, k] = out


_VIEW = {DType.float32: np.float32, DType.int32: np.int32}


def _combine(red: int, dtype: int, acc: np.ndarray, other: np.ndarray, fmt: np.ndarray) -> None:
    """acc (a fresh uint32 array) = acc (red) other, uint32 words shaped [rows, members, words]."""
    if dtype == DType.float16:
        _combine_halves(red, acc, other, int(fmt[FMT_HALF_E]), int(fmt[FMT_HALF_M]))
    else:
        _combine_values(red, acc.view(_VIEW[dtype]), other.view(_VIEW[dtype]))


def mv_reduce(row: np.ndarray, mems: list[np.ndarray], mem_instances: np.ndarray, lw_addressed: np.ndarray,
              n_groups: int, fmt: np.ndarray) -> None:
    """MV reduce: the children in scope of each destination, combined word by word."""
    wpl = int(fmt[FMT_WPL])
    n, sm, dm = int(row[isa.MV_N]), int(row[isa.MV_SRC_MEM]), int(row[isa.MV_DST_MEM])
    src, dst = mems[sm], mems[dm]
    sw = word_addr(lw_addressed, sm, int(row[isa.MV_SRC_ADDR]), wpl)
    dw = word_addr(lw_addressed, dm, int(row[isa.MV_DST_ADDR]), wpl)
    per_group = row[isa.MV_SRC_INST] == ALL_GROUPS or row[isa.MV_DST_INST] == ALL_GROUPS
    d_per = int(mem_instances[dm]) // n_groups
    red, dtype, words = int(row[isa.MV_RED]), int(row[isa.MV_DTYPE]), wpl * n
    for g in range(n_groups if per_group else 1):
        d = int(row[isa.MV_DST_INST]) if row[isa.MV_DST_INST] >= 0 else g * d_per + int(row[isa.MV_DST_LOCAL])
        first, count = scope_range(mem_instances, n_groups, sm, int(row[isa.MV_SCOPE]), d // d_per)
        acc = src[first:first + 1, sw:sw + words].copy()[None]  # a copy: the destination may be a source
        for k in range(1, count):
            _combine(red, dtype, acc, src[first + k:first + k + 1, sw:sw + words][None], fmt)
        dst[d, dw:dw + words] = acc.reshape(-1)


def xfer_reduce(row: np.ndarray, mems: list[np.ndarray], mem_instances: np.ndarray, lw_addressed: np.ndarray,
                group: int, fmt: np.ndarray) -> None:
    """XFER reduce (upward): member m of every group of `group` children, combined over the groups,
    gives upper long words m, m + group, ... (the inverse pattern of mab_broadcast)."""
    wpl = int(fmt[FMT_WPL])
    upper, children, rounds = member_groups(row, mems, mem_instances, lw_addressed, group, wpl)
    acc = children[:, 0].copy()
    for g in range(1, children.shape[1]):
        _combine(int(row[isa.X_RED]), int(row[isa.X_DTYPE]), acc, children[:, g], fmt)
    # upper long word q = member + group * j holds long word j of the member
    n_up = upper.shape[0]
    upper = upper.view()
    upper.shape = (n_up, rounds, group, wpl)  # a split of the last axis: a view, never a copy
    upper[...] = acc.reshape(n_up, group, rounds, wpl).transpose(0, 2, 1, 3)

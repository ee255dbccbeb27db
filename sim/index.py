"""`at(i)`: an array index that numba's compiled loops can vectorise.

numba follows Python's rule that a negative index counts from the end, so it guards every signed
index with a test that adds the dimension's length when the index is negative. A loop whose
index is an offset plus its counter (`dst[row, start + i]`) keeps that test in each iteration,
and LLVM does not vectorise it: on this project's 2-core machine a 64 MB copy in memory rows
took 18.8 ms so, against 3.1 ms with the same index as an unsigned integer (numpy's own copy:
2.9 ms). The simulator's addresses are validated before a program runs and never negative, so
its kernels index through `at`.

Arithmetic must not mix the result with signed integers: numba types uint64 op int64 as float64.
Convert the finished index, nothing else.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, inline="always")
def at(i: int) -> np.uint64:
    """The non-negative index `i` as an unsigned integer (no wrap-around test in the loop)."""
    return np.uint64(i)

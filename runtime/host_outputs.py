"""Arrays that downloaded tensors hold, used again once the tensor that held one is gone.

A download reads the tensor out of its host image into a new array, which the returned tensor
keeps as its storage. The kernel maps and zeroes each page of a new array on first touch, and
the copy into it runs on two threads that queue for that: MN-Core 2's 4096 x 4096 download
spent 20 ms in a new array against 12 ms in a used one. A program called in a loop downloads
arrays of the same shapes each time while the previous call's tensors are dropped, so the device
keeps the large arrays it handed out and takes one again when nothing else refers to it.

"Nothing else" is CPython's reference count: a tensor made by `torch.from_numpy` keeps its
array (or a view whose base is the array) alive, and so do the tensor's views and the arrays
`Tensor.numpy()` returns (their base is the tensor). While any of them lives the count is above
the pool's own reference, and the array is not reused.

Not thread-safe on its own: the device uses it under its lock.
"""

from __future__ import annotations

import sys
from collections import OrderedDict

import numpy as np

# Arrays smaller than this are allocated each time (their pages cost less than the bookkeeping;
# host policy), and the pool keeps at most this many bytes of arrays, least recently used dropped
# first (a dropped array stays with its tensor).
MIN_BYTES = 1 << 20
POOL_BYTES = 1 << 28
# References to an array that only the pool holds: the pool's list and getrefcount's argument.
_ONLY_THE_POOL = 2


def _counts_as_expected() -> bool:
    """Whether this interpreter counts an array in a list as `_ONLY_THE_POOL` references (CPython
    3.11 does; an interpreter that defers or elides counts gets no recycling rather than a reuse
    of an array still in use)."""
    held = [np.empty(1)]
    alias = held[0]
    alone = sys.getrefcount(held[0])
    del alias
    return alone == _ONLY_THE_POOL + 1 and sys.getrefcount(held[0]) == _ONLY_THE_POOL


class HostOutputs:
    """Large arrays handed to downloaded tensors, by shape and dtype."""

    def __init__(self, budget: int = POOL_BYTES) -> None:
        self.budget = budget if _counts_as_expected() else 0
        self._arrays: OrderedDict[tuple, list[np.ndarray]] = OrderedDict()

    def array(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """An array of `shape` and `dtype` that nothing else refers to (contents undefined)."""
        dtype = np.dtype(dtype)
        if int(np.prod(shape, dtype=np.int64)) * dtype.itemsize < MIN_BYTES or not self.budget:
            return np.empty(shape, dtype)
        key = (tuple(shape), dtype.str)
        arrays = self._arrays.setdefault(key, [])
        self._arrays.move_to_end(key)
        for k in range(len(arrays)):
            if sys.getrefcount(arrays[k]) == _ONLY_THE_POOL:
                return arrays[k]
        arrays.append(np.empty(shape, dtype))
        self._trim()
        return arrays[-1]

    def _trim(self) -> None:
        """Drop the least recently used arrays past the budget (never the newest one)."""
        total = sum(a.nbytes for arrays in self._arrays.values() for a in arrays)
        while total > self.budget:
            key, arrays = next(iter(self._arrays.items()))
            if key == next(reversed(self._arrays)) and len(arrays) == 1:
                return
            total -= arrays.pop(0).nbytes
            if not arrays:
                del self._arrays[key]

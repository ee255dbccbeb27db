"""The host threads the simulator shares its large pieces of work between.

The MATMUL's products (`sim.mau`), the host copies into and out of tensor images
(`sim.strided`) and the moves of whole Groups (`sim.functional`) are split into one share per
core. numba kernels compiled `nogil` and BLAS release the GIL, so plain threads run the shares
side by side.

Plain threads rather than numba's `prange`: numba runs `prange` on the OpenMP runtime torch
loaded, whose threads spin for milliseconds after every loop (torch sets that up when it is
imported, before mnsim can choose). On two cores that spin took the CPU from the BLAS threads
of the next MATMUL: MN-Core 2's compiled 1024^3 product went from 80-90 ms to 100-140 ms a call.
Idle pool threads sleep instead.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

WORKERS = os.cpu_count() or 1


@functools.cache
def pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(WORKERS, thread_name_prefix="mnsim")


def shares(total: int, parts: int = WORKERS) -> list[tuple[int, int]]:
    """[first, last) ranges cutting `total` items into at most `parts` nearly equal shares."""
    parts = max(1, min(parts, total))
    bounds = [total * k // parts for k in range(parts + 1)]
    return [(bounds[k], bounds[k + 1]) for k in range(parts)]


def run_shares(work: Callable[[int, int], None], total: int) -> None:
    """work(first, last) for every share of `total` items: the first on the calling thread (it
    would only wait otherwise), the others on the pool. An exception of any share is raised."""
    first, *rest = shares(total)
    futures = [pool().submit(work, *share) for share in rest]
    try:
        work(*first)
    finally:
        for future in futures:
            future.result()

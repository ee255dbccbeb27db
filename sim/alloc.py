"""A first-fit allocator for device memory regions (DRAM buffers, LM scratch).

An allocation is the same address range on every instance of the memory (every Group's DRAM,
every PE's LM), because the hardware addresses all instances alike. Freed regions merge with
their neighbours. Running out raises `DeviceMemoryError` with what is free.
"""

from __future__ import annotations

import bisect

from .errors import DeviceMemoryError


class Allocator:
    """Regions of [0, capacity) in a memory's address units (long words or words)."""

    def __init__(self, memory: str, capacity: int, unit: str = "long words", align: int = 1) -> None:
        self.memory, self.capacity, self.unit, self.align = memory, capacity, unit, align
        self._free: list[tuple[int, int]] = [(0, capacity)]  # sorted (start, size)
        self._used: dict[int, int] = {}
        self.high_water = 0

    def _first_fit(self, size: int, align: int | None) -> tuple[int, int] | None:
        """(index of the free region, aligned start) of the first region that holds `size` units."""
        align = align or self.align
        for i, (start, length) in enumerate(self._free):
            addr = -(-start // align) * align
            if addr + size <= start + length:
                return i, addr
        return None

    def fits(self, size: int, align: int | None = None) -> bool:
        """Whether `alloc(size, align)` would find room (a free region as large may start where
        the aligned block no longer fits)."""
        return self._first_fit(max(1, size), align) is not None

    def alloc(self, size: int, align: int | None = None) -> int:
        """Start address of a new region of `size` units, aligned to `align` (default: the allocator's)."""
        if size <= 0:
            raise ValueError(f"{self.memory}: allocation size must be positive, got {size}")
        found = self._first_fit(size, align)
        if found is None:
            raise DeviceMemoryError(self.memory, size, self.free_total, self.largest_free, self.unit)
        i, addr = found
        start, length = self._free.pop(i)
        if addr > start:
            self._insert(start, addr - start)
        if addr + size < start + length:
            self._insert(addr + size, start + length - addr - size)
        self._used[addr] = size
        self.high_water = max(self.high_water, addr + size)
        return addr

    def free(self, addr: int) -> None:
        size = self._used.pop(addr, None)
        if size is None:
            raise ValueError(f"{self.memory}: address {addr} is not the start of an allocated region")
        self._insert(addr, size)
        self._merge()

    def size_of(self, addr: int) -> int:
        return self._used[addr]

    @property
    def free_total(self) -> int:
        return sum(length for _, length in self._free)

    @property
    def largest_free(self) -> int:
        return max((length for _, length in self._free), default=0)

    @property
    def used(self) -> int:
        return sum(self._used.values())

    def _insert(self, start: int, length: int) -> None:
        bisect.insort(self._free, (start, length))

    def _merge(self) -> None:
        merged: list[tuple[int, int]] = []
        for start, length in self._free:
            if merged and merged[-1][0] + merged[-1][1] == start:
                merged[-1] = (merged[-1][0], merged[-1][1] + length)
            else:
                merged.append((start, length))
        self._free = merged

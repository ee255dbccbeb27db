"""Errors of the simulator: bad instructions and exhausted memories."""

from __future__ import annotations

from hwdesc.errors import MnsimError


class SimError(MnsimError, RuntimeError):
    """An instruction cannot run: address out of range, a mode its path does not offer, a
    misaligned operand, a wait on a tag never issued. Names the instruction index and fields."""

    def __init__(self, message: str, *, index: int | None = None, instruction: str | None = None) -> None:
        self.index = index
        self.instruction = instruction
        where = f"instruction #{index} ({instruction}): " if index is not None else ""
        super().__init__(where + message)


class DeviceMemoryError(MnsimError, MemoryError):
    """A memory has no free region large enough; names the memory, the request and what is free."""

    def __init__(self, memory: str, requested: int, free_total: int, largest_free: int, unit: str, *,
                 what: str | None = None) -> None:
        self.memory, self.requested, self.free_total, self.largest_free = memory, requested, free_total, largest_free
        self.what = what
        if what is not None:  # a compile that cannot fit: what does not, and the room there is
            super().__init__(f"{what} needs {requested} {unit} of {memory}; the chip has {free_total} {unit}")
        else:
            super().__init__(f"{memory}: cannot allocate {requested} {unit}; {free_total} {unit} free in all, "
                             f"largest free region {largest_free} {unit}")

"""`Program`: an instruction array with labels and relocatable buffer addresses.

A compiled program refers to its IO buffers symbolically: the address fields that point into a
buffer hold an offset and a relocation entry names the buffer. `bind` adds the buffers' base
addresses (chosen at run time, or the producer's buffer for relocation) in one vectorised step.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import numpy as np

from .isa import FIELDS, Op

@dataclass
class Bound:
    """A program bound to buffer addresses, and the highest address it touches per memory (to grow
    DRAM before a run). Nothing may write the code (it stays writeable: numba compiles read-only
    arrays as another type)."""

    key: tuple
    code: np.ndarray
    tops: dict[int, int] | None = None
    derived: dict = field(default_factory=dict)  # other tables of the bound code (sim.replicas' accesses)


@dataclass
class Program:
    code: np.ndarray  # int64 [instructions, FIELDS]
    labels: list[tuple[int, int, str]] = field(default_factory=list)  # [start, end) ranges named by op
    relocs: np.ndarray = field(default_factory=lambda: np.zeros((0, 3), dtype=np.int64))  # (instr, field, symbol)
    symbols: tuple[str, ...] = ()
    # Validation results per (chip, host buffer sizes): the long words each symbol must span.
    validated: dict = field(default_factory=dict, repr=False, compare=False)
    # What runs derive from the code alone, kept for the next run: the latest binding (a loop calls
    # a program on the same buffers; one kept, so programs run on fresh buffers each time hold no
    # extra copies), the timing per chip (cycles depend neither on the data nor on the addresses)
    # and the rows sim.functional dispatches one at a time.
    timed: dict = field(default_factory=dict, repr=False, compare=False)
    stepped: list[int] | None = field(default=None, repr=False, compare=False)
    _last: Bound | None = field(default=None, repr=False, compare=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.code = np.ascontiguousarray(self.code, dtype=np.int64).reshape(-1, FIELDS)

    def __len__(self) -> int:
        return len(self.code)

    def bind(self, bases: dict[str, int]) -> np.ndarray:
        """The code with every relocatable address resolved against `bases` (symbol -> address)."""
        missing = [s for s in self.symbols if s not in bases]
        if missing:
            raise KeyError(f"no address bound for buffer(s) {', '.join(missing)}")
        code = self.code.copy()
        if len(self.relocs):
            base = np.array([bases[s] for s in self.symbols], dtype=np.int64)
            code[self.relocs[:, 0], self.relocs[:, 1]] += base[self.relocs[:, 2]]
        return code

    def bound(self, bases: dict[str, int], chip: str) -> Bound:
        """`bind(bases)` for chip `chip` (a fingerprint), kept for the next run on the same buffers."""
        key = (chip, tuple(sorted(bases.items())))
        with self._lock:
            if self._last is None or self._last.key != key:
                self._last = Bound(key, self.bind(bases))
            return self._last

    def counts(self) -> dict[str, int]:
        ops = np.bincount(self.code[:, 0], minlength=len(Op))
        return {op.name: int(ops[op]) for op in Op if ops[op]}

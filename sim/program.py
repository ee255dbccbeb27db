"""`Program`: an instruction array with labels and relocatable buffer addresses.

A compiled program refers to its IO buffers symbolically: the address fields that point into a
buffer hold an offset and a relocation entry names the buffer. `bind` adds the buffers' base
addresses (chosen at run time, or the producer's buffer for relocation) in one vectorised step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .isa import FIELDS, Op


@dataclass
class Program:
    code: np.ndarray  # int64 [instructions, FIELDS]
    labels: list[tuple[int, int, str]] = field(default_factory=list)  # [start, end) ranges named by op
    relocs: np.ndarray = field(default_factory=lambda: np.zeros((0, 3), dtype=np.int64))  # (instr, field, symbol)
    symbols: tuple[str, ...] = ()
    # Validation results per (chip, host buffer sizes): the long words each symbol must span.
    validated: dict = field(default_factory=dict, repr=False, compare=False)

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

    def counts(self) -> dict[str, int]:
        ops = np.bincount(self.code[:, 0], minlength=len(Op))
        return {op.name: int(ops[op]) for op in Op if ops[op]}

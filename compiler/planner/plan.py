"""`Plan`: every decision the compiler makes, before any instruction of the program is emitted.

Per value: where it is stored (a DRAM buffer symbol and the layout it has there, which for a view
is the base's buffer read through another layout). Per step: the kernel that computes some
nodes, with its layouts and tilings decided, the refs it reads and writes (an input may be read
from a relaid copy), and the cycles the planner measured for it on the simulator's timing rules.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hwdesc import HwDesc

from ..ir import Graph, Value
from ..kernels.base import Kernel
from ..kernels.context import Buffer, Ref


@dataclass
class Step:
    kernel: Kernel
    refs: dict[Value, Ref]  # what the kernel reads and writes
    # None while the planner has not timed it: a candidate's relayouts are timed only as long as
    # the candidate can still win (Planner.price)
    cycles: int | None
    reads: tuple[Value, ...] = ()  # the values whose buffers it reads (for lifetimes)
    writes: tuple[Value, ...] = ()

    @property
    def label(self) -> str:
        return self.kernel.label


@dataclass
class Plan:
    graph: Graph
    hw: HwDesc
    options: dict
    refs: dict[Value, Ref]
    buffers: dict[str, Buffer]
    steps: list[Step]
    input_symbols: dict[str, str]
    output_symbols: dict[str, str]
    owner: dict[str, Value] = field(default_factory=dict)  # buffer symbol -> the value that owns it
    clean_inputs: frozenset[str] = frozenset()  # resident inputs read as if their padding held zeros

    @property
    def cycles(self) -> int:
        """The planner's estimate: the steps' measured cycles, one after another."""
        return sum(s.cycles for s in self.steps)

    def describe(self) -> list[str]:
        """One line per step: what it computes, in which layouts, and its measured cycles."""
        lines = []
        for s in self.steps:
            layouts = ", ".join(f"{v.name}: {layout}" for v, layout in s.kernel.writes().items())
            lines.append(f"{s.label}: {s.cycles} cycles; writes {layouts}")
        return lines

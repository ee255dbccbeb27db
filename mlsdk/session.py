"""What happened in a Context: compiles, calls, how each input was bound and what it cost.

Records are plain data for reports (mlsdk.report): per call the simulator's RunStats, per input
binding the path taken (host upload, relocation, conversion) with its cycles and the cycles of
the alternatives (conversion, host round trip), and transfers to and from the host.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sim import RunStats


@dataclass
class Binding:
    function: str
    input: str
    path: str  # upload | relocation | conversion
    cycles: int
    bytes: int
    producer: str | None = None  # "function.output" of the proxy bound here
    conversion_cycles: int | None = None  # what a DRAM-to-DRAM conversion would cost (or cost)
    host_cycles: int | None = None  # what a round trip through the host would cost
    advice: str | None = None


@dataclass
class Call:
    function: str
    stats: RunStats
    labels: list[tuple[int, int, str]]
    bindings: list[Binding]


@dataclass
class Transfer:
    kind: str  # download | upload | conversion | load
    what: str
    stats: RunStats


@dataclass
class Session:
    chip: str
    clock_hz: int
    compiles: list[tuple[str, float]] = field(default_factory=list)  # (function, seconds)
    calls: list[Call] = field(default_factory=list)
    transfers: list[Transfer] = field(default_factory=list)

    @property
    def bindings(self) -> list[Binding]:
        return [b for c in self.calls for b in c.bindings]

    def total_cycles(self) -> int:
        """Device cycles of everything recorded: programs, input bindings (uploads, conversions,
        host round trips) and other transfers (downloads, registered tensors, constants)."""
        return (sum(c.stats.total_cycles for c in self.calls) + sum(b.cycles for b in self.bindings)
                + sum(t.stats.total_cycles for t in self.transfers))

"""What happened in a Context: compiles, device runs in order, calls and how each input was bound.

Records are plain data for reports (mlsdk.report). Every simulated program a Context runs (a
compiled function, an input upload, a conversion, a download, ...) is one `Run`, in the order it
ran, so totals and timelines come from one list and nothing is counted twice. Per call, each
input `Binding` says which path was taken (host upload, relocation, conversion, host round trip)
with its cycles and the cycles of the alternatives.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Iterator

from sim import RunStats

Labels = list[tuple[int, int, str]]

# Run kinds. Call inputs are "binding" runs; "upload"/"download"/"load" are the other transfers.
CALL, BINDING, UPLOAD, DOWNLOAD, LOAD = "call", "binding", "upload", "download", "load"
TRANSFER_KINDS = (UPLOAD, DOWNLOAD, LOAD)


@dataclass
class Run:
    kind: str
    what: str  # function name, "function.input", "registered name", ...
    stats: RunStats
    labels: Labels = field(default_factory=list)


@dataclass
class Binding:
    function: str
    input: str
    path: str  # upload | relocation | conversion | host
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
    labels: Labels
    bindings: list[Binding]
    runs: list[Run] = field(default_factory=list)  # this call's binding runs, then the program
    phases: Labels = field(default_factory=list)  # forward / backward / optimizer ranges of the program


@dataclass
class Session:
    chip: str
    clock_hz: int
    compiles: list[tuple[str, float]] = field(default_factory=list)  # (function, seconds)
    runs: list[Run] = field(default_factory=list)
    calls: list[Call] = field(default_factory=list)
    resident_bytes: int = 0  # device memory of the Context's registered tensors, after the last call

    @property
    def bindings(self) -> list[Binding]:
        return [b for c in self.calls for b in c.bindings]

    @property
    def transfers(self) -> list[Run]:
        """Uploads of registered tensors and load_from, downloads, constants of loaded programs."""
        return [r for r in self.runs if r.kind in TRANSFER_KINDS]

    def total_cycles(self) -> int:
        """Device cycles of everything that ran, one program after another."""
        return sum(r.stats.total_cycles for r in self.runs)


_collectors: list[list[Session]] = []


@contextlib.contextmanager
def collecting() -> Iterator[list[Session]]:
    """Gather the Sessions of Contexts created inside (how `mnsim run` reports a script's
    Contexts after the script dropped them). Outside, nothing keeps a Session alive."""
    found: list[Session] = []
    _collectors.append(found)
    try:
        yield found
    finally:
        _collectors.remove(found)


def new_session(chip: str, clock_hz: int) -> Session:
    session = Session(chip, clock_hz)
    for found in _collectors:
        found.append(session)
    return session

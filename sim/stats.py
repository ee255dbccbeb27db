"""`RunStats`: what a run cost, per unit, per path and per instruction."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


STREAM_WAITS = "PE stream waits"  # trace track of WAIT stalls (not a unit: never busy)


@dataclass(frozen=True)
class TraceEvent:
    unit: str  # "PE stream", "Data Engine 0", ..., "host link", or STREAM_WAITS
    name: str
    start: int
    end: int


@dataclass
class RunStats:
    """Cycles of one program run. Busy cycles count the time a unit works (stalls excluded)."""

    total_cycles: int
    clock_hz: int
    pe_busy: int
    engine_busy: list[int]  # one per Data Engine (Group)
    host_busy: int
    wait_stall: int  # stream cycles spent in WAIT
    queue_stall: int  # stream cycles spent waiting for a full Data Engine or host queue
    bytes_per_path: dict[str, int]
    instructions: dict[str, int]  # per opcode name
    start: np.ndarray = field(repr=False)  # per instruction
    end: np.ndarray = field(repr=False)
    unit: np.ndarray = field(repr=False)  # -1 stream waiting, 0 PE stream, 1 host link, 2 + g Data Engine g
    engine_mask: np.ndarray = field(repr=False)
    # MVs of fewer long words than their mode's unit (a gather's runs), and the Data Engine cycles
    # they took, summed over the engines each ran on: each is charged a whole unit
    short_mvs: int = 0
    short_mv_cycles: int = 0

    @property
    def seconds(self) -> float:
        return self.total_cycles / self.clock_hz

    @property
    def units(self) -> dict[str, int]:
        """Busy cycles per unit name."""
        out = {"PE stream": self.pe_busy}
        out.update({f"Data Engine {g}": c for g, c in enumerate(self.engine_busy)})
        out["host link"] = self.host_busy
        return out

    def intervals(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Per unit (as `units`), the [start, end) of every instruction it ran; WAIT stalls are
        no unit's work. Intervals of a pipelined engine may overlap."""
        ran = self.end > self.start

        def on(where: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            return self.start[where & ran], self.end[where & ran]
        out = {"PE stream": on(self.unit == 0)}
        out.update({f"Data Engine {g}": on((self.unit >= 2) & ((self.engine_mask >> g) & 1 == 1))
                    for g in range(len(self.engine_busy))})
        out["host link"] = on(self.unit == 1)
        return out

    def utilisation(self) -> dict[str, float]:
        return {name: (busy / self.total_cycles if self.total_cycles else 0.0) for name, busy in self.units.items()}

    def span(self, first: int, last: int) -> int:
        """Cycles from the start of instruction `first` to the end of the latest of [first, last)."""
        if last <= first:
            return 0
        return int(self.end[first:last].max() - self.start[first:last].min())

    def trace(self, labels: list[tuple[int, int, str]] | None = None, names: list[str] | None = None) -> list[TraceEvent]:
        """One event per instruction and unit it ran on, named by its label (or its opcode)."""
        label_of = np.full(len(self.start), -1, dtype=np.int64)
        for k, (a, b, _) in enumerate(labels or []):
            label_of[a:b] = k
        events = []
        for i in range(len(self.start)):
            if self.end[i] == self.start[i]:
                continue
            name = labels[label_of[i]][2] if label_of[i] >= 0 else (names[i] if names else f"#{i}")
            u = int(self.unit[i])
            if u < 0:
                events.append(TraceEvent(STREAM_WAITS, name, int(self.start[i]), int(self.end[i])))
            elif u == 0:
                events.append(TraceEvent("PE stream", name, int(self.start[i]), int(self.end[i])))
            elif u == 1:
                events.append(TraceEvent("host link", name, int(self.start[i]), int(self.end[i])))
            else:
                mask = int(self.engine_mask[i])
                for g in range(len(self.engine_busy)):
                    if mask >> g & 1:
                        events.append(TraceEvent(f"Data Engine {g}", name, int(self.start[i]), int(self.end[i])))
        return events

"""`trace_scope(path)` and `trace_event(name)`: a timeline Perfetto opens (Chrome trace JSON).

Host events (compiles, calls, transfers, user spans) are on the wall clock; every simulated run
is placed on a device timeline of its own, one track per unit (the PE stream, each Group's Data
Engine, the host link), in simulated microseconds at the chip's clock.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from typing import Iterator

from sim import RunStats

_active: list["Recorder"] = []
HOST_PID, DEVICE_PID = 1, 2


class Recorder:
    def __init__(self) -> None:
        self.events: list[dict] = []
        self.start = time.perf_counter()
        self.device_us = 0.0  # where the next simulated run starts on the device timeline
        self.tracks: dict[str, int] = {}

    def _us(self, t: float) -> float:
        return (t - self.start) * 1e6

    def host(self, name: str, t0: float, t1: float, category: str = "host") -> None:
        self.events.append({"name": name, "cat": category, "ph": "X", "pid": HOST_PID, "tid": 1,
                            "ts": self._us(t0), "dur": max(0.0, self._us(t1) - self._us(t0))})

    def _tid(self, unit: str) -> int:
        if unit not in self.tracks:
            self.tracks[unit] = len(self.tracks) + 1
        return self.tracks[unit]

    def device(self, name: str, stats: RunStats, labels: list[tuple[int, int, str]]) -> None:
        per_us = stats.clock_hz / 1e6
        base = self.device_us
        for e in stats.trace(labels):
            self.events.append({"name": e.name, "cat": name, "ph": "X", "pid": DEVICE_PID, "tid": self._tid(e.unit),
                                "ts": base + e.start / per_us, "dur": (e.end - e.start) / per_us,
                                "args": {"run": name}})
        self.events.append({"name": name, "cat": "run", "ph": "X", "pid": DEVICE_PID, "tid": self._tid("runs"),
                            "ts": base, "dur": stats.total_cycles / per_us})
        self.device_us = base + stats.total_cycles / per_us

    def write(self, path: str | os.PathLike) -> None:
        meta = [{"name": "process_name", "ph": "M", "pid": HOST_PID, "args": {"name": "host"}},
                {"name": "process_name", "ph": "M", "pid": DEVICE_PID, "args": {"name": "simulated device"}}]
        meta += [{"name": "thread_name", "ph": "M", "pid": DEVICE_PID, "tid": tid, "args": {"name": unit}}
                 for unit, tid in self.tracks.items()]
        with open(path, "w") as f:
            json.dump({"traceEvents": meta + self.events, "displayTimeUnit": "ns"}, f)


@contextlib.contextmanager
def recording(recorder: Recorder | None) -> Iterator[None]:
    """Send the events inside to `recorder` (None: nowhere)."""
    if recorder is None:
        yield
        return
    _active.append(recorder)
    try:
        yield
    finally:
        _active.remove(recorder)


@contextlib.contextmanager
def trace_scope(path: str | os.PathLike | None) -> Iterator[None]:
    """Record everything inside into a trace file at `path`; None disables tracing."""
    recorder = Recorder() if path is not None else None
    try:
        with recording(recorder):
            yield
    finally:  # a failing block still leaves its trace
        if recorder is not None:
            recorder.write(path)


@contextlib.contextmanager
def trace_event(name: str) -> Iterator[None]:
    """A named span of host time inside the active trace scope (no effect outside one)."""
    t0 = time.perf_counter()
    try:
        yield
    finally:
        for r in _active:
            r.host(name, t0, time.perf_counter(), "user")


def record_host(name: str, t0: float, category: str) -> None:
    for r in _active:
        r.host(name, t0, time.perf_counter(), category)


def record_run(name: str, stats: RunStats, labels: list[tuple[int, int, str]]) -> None:
    for r in _active:
        r.device(name, stats, labels)

"""`trace_scope(path)` and `trace_event(name)`: a timeline Perfetto opens (Chrome trace JSON).

Host events (compiles, calls, user spans) are on the wall clock, in the "host" process. Every
simulated run (a call's program, an upload named by its tensor, a conversion, a download) is a
process of its own, "device run k: what", anchored where the host issued it (inside the host
call's span) and laid out on the device's clock from there: simulated microseconds at the chip's
clock, one track per unit (the PE stream, each Group's Data Engine, the host link) and one for
the run as a whole.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from typing import Iterator

from sim import RunStats

_active: list["Recorder"] = []
HOST_PID, FIRST_RUN_PID = 1, 100  # device runs are processes FIRST_RUN_PID, FIRST_RUN_PID + 1, ...


class Recorder:
    def __init__(self) -> None:
        self.events: list[dict] = []
        self.start = time.perf_counter()
        self.runs: list[tuple[int, str, list[str]]] = []  # (pid, name, units in track order)

    def _us(self, t: float) -> float:
        return (t - self.start) * 1e6

    def host(self, name: str, t0: float, t1: float, category: str = "host") -> None:
        self.events.append({"name": name, "cat": category, "ph": "X", "pid": HOST_PID, "tid": 1,
                            "ts": self._us(t0), "dur": max(0.0, self._us(t1) - self._us(t0))})

    def device(self, name: str, stats: RunStats, labels: list[tuple[int, int, str]]) -> None:
        """One simulated run, anchored at the host time it was issued (it ran just now)."""
        pid = FIRST_RUN_PID + len(self.runs)
        per_us = stats.clock_hz / 1e6
        anchor = max(0.0, self._us(time.perf_counter()) - stats.total_cycles / per_us)  # it ends now, on the host
        units: list[str] = ["run"]
        self.events.append({"name": name, "cat": "run", "ph": "X", "pid": pid, "tid": 1, "ts": anchor,
                            "dur": stats.total_cycles / per_us, "args": {"cycles": stats.total_cycles}})
        for e in stats.trace(labels):
            if e.unit not in units:
                units.append(e.unit)
            self.events.append({"name": e.name, "cat": name, "ph": "X", "pid": pid, "tid": units.index(e.unit) + 1,
                                "ts": anchor + e.start / per_us, "dur": (e.end - e.start) / per_us,
                                "args": {"run": name, "cycles": e.end - e.start}})
        self.runs.append((pid, name, units))

    def write(self, path: str | os.PathLike) -> None:
        meta = [{"name": "process_name", "ph": "M", "pid": HOST_PID, "args": {"name": "host"}},
                {"name": "process_sort_index", "ph": "M", "pid": HOST_PID, "args": {"sort_index": 0}}]
        for k, (pid, name, units) in enumerate(self.runs):
            meta.append({"name": "process_name", "ph": "M", "pid": pid, "args": {"name": f"device run {k}: {name}"}})
            meta.append({"name": "process_sort_index", "ph": "M", "pid": pid, "args": {"sort_index": k + 1}})
            meta += [{"name": "thread_name", "ph": "M", "pid": pid, "tid": tid + 1, "args": {"name": unit}}
                     for tid, unit in enumerate(units)]
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

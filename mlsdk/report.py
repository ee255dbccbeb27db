"""`Report`: where a session's cycles went, as plain data (JSON in, JSON out).

Built from the `Session`s of one or more Contexts on the same chip (or from one codegen_dir,
timed without data). Every number comes from the simulator's `RunStats`:

* runs: each device program in order (calls, input bindings, transfers), placed one after
  another on the device timeline; their cycles add up to the total;
* units: busy cycles and utilisation of the PE stream, each Group's Data Engine and the host link,
  and how many of the engines' busy cycles went to MVs shorter than their mode's unit (a gather's
  runs of single long words: each is charged a whole unit, as the hardware moves whole units);
* paths: bytes moved per transfer path of the hardware description;
* ops: per compiled function and op label, the cycles the op adds to its calls (the advance of
  the latest finishing instruction, so the ops of a call sum to the call) and its span (first
  start to last end; ops overlap in a pipelined machine, so spans need not add up);
* phases: per training step function, the cycles its forward, backward and optimizer parts add
  to its calls (counted like ops, so they sum to the calls), and the bytes of resident state;
* bindings: per consumer input, the path taken (upload, relocation, conversion, host round trip)
  and its cycles;
* handovers: per producer output and the consumer inputs it went to, the whole chain (the
  producer's call and its bindings, plus every binding of the output) as run, with the producer
  constrained to a use's layout, without (its own layout plus conversions) and through the host,
  all simulated, and what relocating saves as their difference (negative: the constraint costs
  cycles), with advice when it is positive;
* chains: calls linked by hand-overs, as run against every function compiled without
  constraints (the whole chain's saving);
* timeline: utilisation per unit in equal slices of the session, for the utilisation plot.

Renderers live elsewhere (mlsdk.render for text and CSV, mlsdk.plots for PNG).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from typing import Iterable

import numpy as np

from sim import RunStats

from runtime.session import Binding, Call, Handover, Run, Session, advice, chains

from .errors import ReportError

TIMELINE_SLICES = 200  # resolution of the utilisation-over-time plot (presentation, not hardware)
FORMAT = "mnsim-report/1"


@dataclass
class RunRow:
    kind: str
    what: str
    start_cycle: int
    cycles: int
    context: str = ""  # the Context that ran it (a report may cover several)


@dataclass
class UnitRow:
    unit: str
    busy_cycles: int
    utilisation: float


@dataclass
class OpRow:
    function: str
    op: str
    calls: int
    cycles: int  # cycles the op adds to its calls, summed over calls
    span_cycles: int


@dataclass
class PhaseRow:
    function: str
    phase: str  # forward | backward | optimizer
    calls: int
    cycles: int  # cycles the phase adds to its calls, summed over calls


@dataclass
class BindingRow:
    """A consumer input, bound from one producer by one path, summed over the calls that did so."""

    function: str
    input: str
    path: str
    producer: str | None
    bytes: int
    cycles: int
    calls: int = 1  # the figures are totals over this many calls

    @property
    def consumer(self) -> str:
        return f"{self.function}.{self.input}"


@dataclass
class HandoverRow:
    """A producer's output and the consumer inputs it went to, summed over the producer's calls:
    the whole chain (the producer's call with its own input bindings, plus every binding of the
    output) as run, with the producer constrained to a use's layout (relocation), without (its
    own layout plus conversions) and through the host, all simulated."""

    producer: str
    consumers: list[str]
    calls: int  # producer calls whose output went this way
    as_run: int
    with_constraint: int | None
    without_constraint: int | None
    host_round_trip: int | None
    saved: int | None  # without_constraint - with_constraint: what relocating saves (< 0: it costs)
    saved_vs_host: int | None  # host_round_trip - with_constraint
    constrained: bool
    note: str = ""
    target: str | None = None  # the consumer input spec the constraint would name
    advice: str | None = None  # the constraint to add and what following it saves, when positive


@dataclass
class ChainRow:
    """Calls linked by hand-overs: their cycles (programs and input bindings) as run, and with
    every function compiled without io_spec_constraints (conversions where layouts differ)."""

    functions: list[str]
    calls: int
    as_run: int
    unconstrained: int | None
    saved: int | None  # unconstrained - as_run
    chains: int = 1  # chains of these functions (a loop runs one per iteration), summed in this row


@dataclass
class Report:
    chip: str
    clock_hz: int
    total_cycles: int
    runs: list[RunRow] = field(default_factory=list)
    units: list[UnitRow] = field(default_factory=list)
    paths: dict[str, int] = field(default_factory=dict)
    ops: list[OpRow] = field(default_factory=list)
    bindings: list[BindingRow] = field(default_factory=list)
    compiles: list[tuple[str, float]] = field(default_factory=list)
    timeline_slice_cycles: int = 0
    timeline: dict[str, list[float]] = field(default_factory=dict)
    source: str = ""  # what was reported: a script, a codegen_dir
    phases: list[PhaseRow] = field(default_factory=list)
    resident_bytes: int = 0  # device memory of registered tensors (parameters, buffers, optimizer state)
    chains: list[ChainRow] = field(default_factory=list)
    handovers: list[HandoverRow] = field(default_factory=list)
    untimed_calls: dict[str, int] = field(default_factory=dict)  # function -> calls in functional mode (not counted)
    short_mvs: int = 0  # MVs of fewer long words than their mode's unit (RunStats.short_mvs), all runs
    short_mv_cycles: int = 0  # the Data Engine cycles they took, summed over the engines

    @property
    def engine_busy_cycles(self) -> int:
        """Busy cycles of all the Data Engines together."""
        return sum(u.busy_cycles for u in self.units if u.unit.startswith("Data Engine"))

    @property
    def time_us(self) -> float:
        return self.total_cycles / self.clock_hz * 1e6 if self.clock_hz else 0.0

    @property
    def advice(self) -> list[str]:
        return [h.advice for h in self.handovers if h.advice]

    def relocations(self) -> list[BindingRow]:
        return [b for b in self.bindings if b.path == "relocation"]

    # ---- JSON ---------------------------------------------------------------------------------

    def to_json(self) -> dict:
        d = asdict(self)
        d["format"] = FORMAT
        d["time_us"] = self.time_us
        d["advice"] = self.advice
        return d

    @staticmethod
    def from_json(d: dict) -> "Report":
        if d.get("format") != FORMAT:
            raise ReportError(f"not an mnsim report (format {d.get('format')!r}; expected {FORMAT!r})")
        return Report(d["chip"], d["clock_hz"], d["total_cycles"], [RunRow(**r) for r in d["runs"]],
                      [UnitRow(**u) for u in d["units"]], dict(d["paths"]), [OpRow(**o) for o in d["ops"]],
                      [BindingRow(**b) for b in d["bindings"]], [tuple(c) for c in d["compiles"]],
                      d["timeline_slice_cycles"], {k: list(v) for k, v in d["timeline"].items()}, d.get("source", ""),
                      [PhaseRow(**p) for p in d.get("phases", [])], d.get("resident_bytes", 0),
                      [ChainRow(**c) for c in d.get("chains", [])], [HandoverRow(**h) for h in d.get("handovers", [])],
                      dict(d.get("untimed_calls", {})), d.get("short_mvs", 0), d.get("short_mv_cycles", 0))

    def save(self, path: str | os.PathLike) -> None:
        with open(path, "w") as f:
            json.dump(self.to_json(), f, indent=1)

    @staticmethod
    def load(path: str | os.PathLike) -> "Report":
        try:
            with open(path) as f:
                return Report.from_json(json.load(f))
        except ReportError:
            raise
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ReportError(f"{path} is not a readable mnsim report: {type(e).__name__}: {e}") from None


# ---- building -------------------------------------------------------------------------------


def build(sessions: Iterable[Session], source: str = "") -> Report:
    """One report over sessions on one chip, their runs one after another."""
    sessions = [s for s in sessions if s.chip != "pfvm"]
    if not sessions:
        raise ReportError("nothing ran on a simulated chip (pfvm:cpu runs have no cycles)")
    chips = {s.chip for s in sessions}
    if len(chips) > 1:
        raise ReportError(f"sessions on different chips ({', '.join(sorted(chips))}); report each chip separately")
    runs = [r for s in sessions for r in s.runs]
    calls = [c for s in sessions for c in s.calls]
    report = Report(sessions[0].chip, sessions[0].clock_hz, sum(r.stats.total_cycles for r in runs), source=source)
    start = 0
    for s in sessions:
        for r in s.runs:
            report.runs.append(RunRow(r.kind, r.what, start, r.stats.total_cycles, s.label))
            start += r.stats.total_cycles
    report.units = _units(runs, report.total_cycles)
    report.short_mvs = sum(r.stats.short_mvs for r in runs)
    report.short_mv_cycles = sum(r.stats.short_mv_cycles for r in runs)
    report.paths = _paths(runs)
    name = _qualifier(sessions)
    report.ops = _ops([(name(s, c.function), c.stats, c.labels) for s in sessions for c in s.calls])
    report.phases = _phases([(name(s, c.function), c) for s in sessions for c in s.calls])
    report.resident_bytes = sum(s.resident_bytes for s in sessions)
    report.bindings = _bindings([(name(s, b.function), b) for s in sessions for c in s.calls for b in c.bindings])
    report.chains = _chains(chains(calls))
    report.handovers = _handovers([h for s in sessions for h in s.handovers])
    report.compiles = [(name, round(seconds, 4)) for s in sessions for name, seconds in s.compiles]
    for s in sessions:
        for function, n in s.untimed_calls.items():
            key = name(s, function)
            report.untimed_calls[key] = report.untimed_calls.get(key, 0) + n
    report.timeline_slice_cycles, report.timeline = _timeline(runs, report.total_cycles)
    return report


def for_call(session: Session, index: int = -1) -> Report:
    """A report of one call of a session (default: the last): its input bindings and its program."""
    call = session.calls[index]
    handovers = list({id(b.handover): b.handover for b in call.bindings if b.handover}.values())
    one = Session(session.chip, session.clock_hz, runs=list(call.runs), calls=[call], handovers=handovers,
                  label=session.label)
    return build([one], call.function)


def for_program(function: str, stats: RunStats, labels: list[tuple[int, int, str]], chip: str,
                source: str = "") -> Report:
    """A report of one program run (a codegen_dir timed on its chip): no bindings."""
    run = Run("call", function, stats, labels)
    session = Session(chip, stats.clock_hz, runs=[run], calls=[Call(function, stats, labels, [], [run])])
    return build([session], source)


def _units(runs: list[Run], total: int) -> list[UnitRow]:
    busy: dict[str, int] = {}
    for r in runs:
        for unit, cycles in r.stats.units.items():
            busy[unit] = busy.get(unit, 0) + cycles
    return [UnitRow(u, c, c / total if total else 0.0) for u, c in busy.items()]


def _paths(runs: list[Run]) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in runs:
        for path, n in r.stats.bytes_per_path.items():
            out[path] = out.get(path, 0) + n
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def op_cycles(stats: RunStats, labels: list[tuple[int, int, str]]) -> list[tuple[str, int, int]]:
    """(label, cycles added, span) per labelled range of one run, in program order.

    An op adds the cycles by which it pushes out the latest end seen so far, so the ops of a
    run sum to its total (unlabelled instructions are reported as "(other)")."""
    n = len(stats.start)
    ranges = sorted(labels)
    covered = np.zeros(n, dtype=bool)
    for a, b, _ in ranges:
        covered[a:b] = True
    pieces = [(a, b, name) for a, b, name in ranges]
    pieces += [(i, i + 1, "(other)") for i in np.flatnonzero(~covered)]
    pieces.sort()
    out: dict[str, list[int]] = {}
    frontier = 0
    for a, b, name in pieces:
        if b <= a:
            continue
        end = int(stats.end[a:b].max())
        added = max(0, end - frontier)
        frontier = max(frontier, end)
        row = out.setdefault(name, [0, 0])
        row[0] += added
        row[1] += stats.span(a, b)
    # the run ends when every unit is done; any tail after the last instruction's end is "(other)"
    tail = stats.total_cycles - frontier
    if tail > 0:
        out.setdefault("(other)", [0, 0])[0] += tail
    return [(name, c, s) for name, (c, s) in out.items()]


def _ops(calls: list[tuple[str, RunStats, list]]) -> list[OpRow]:
    rows: dict[tuple[str, str], OpRow] = {}
    for function, stats, labels in calls:
        for name, cycles, span in op_cycles(stats, labels):
            row = rows.setdefault((function, name), OpRow(function, name, 0, 0, 0))
            row.calls += 1
            row.cycles += cycles
            row.span_cycles += span
    return sorted(rows.values(), key=lambda r: -r.cycles)


def _qualifier(sessions: list[Session]):
    """How rows name a function: its name, with its Context when several Contexts have one so
    called (their rows would otherwise merge)."""
    seen: dict[str, set[int]] = {}
    for i, s in enumerate(sessions):
        for c in s.calls:
            seen.setdefault(c.function, set()).add(i)
    shared = {name for name, where in seen.items() if len(where) > 1}
    return lambda s, name: f"{name} ({s.label})" if name in shared and s.label else name


def _phases(calls: list[tuple[str, Call]]) -> list[PhaseRow]:
    """Forward / backward / optimizer cycles of the calls of training steps (programs with a
    backward part); instructions outside every phase range count with the forward."""
    rows: dict[tuple[str, str], PhaseRow] = {}
    for function, c in calls:
        if not any(phase == "backward" for _, _, phase in c.phases):
            continue
        for phase, cycles, _ in op_cycles(c.stats, c.phases):
            phase = "forward" if phase == "(other)" else phase
            row = rows.setdefault((function, phase), PhaseRow(function, phase, 0, 0))
            row.cycles += cycles
        for phase in {p for _, _, p in c.phases}:
            rows[(function, phase)].calls += 1
    order = {"forward": 0, "backward": 1, "optimizer": 2}
    return sorted(rows.values(), key=lambda r: (r.function, order.get(r.phase, 3)))


def _bindings(bindings: list[tuple[str, Binding]]) -> list[BindingRow]:
    """One row per (consumer input, producer, path), summed over the calls that bound it so."""
    rows: dict[tuple, BindingRow] = {}
    for function, b in bindings:
        key = (function, b.input, b.producer, b.path)
        row = rows.get(key)
        if row is None:
            rows[key] = BindingRow(function, b.input, b.path, b.producer, b.bytes, b.cycles)
            continue
        row.calls += 1
        row.bytes += b.bytes
        row.cycles += b.cycles
    return list(rows.values())


FIGURES = ("as_run", "with_constraint", "without_constraint", "host_round_trip", "saved", "saved_vs_host")


def _handovers(handovers: list[Handover]) -> list[HandoverRow]:
    """One row per producer output and its consumers, summed over the producer's calls; the
    advice's figure is the row's saving (what following it saves over the whole run)."""
    rows: dict[tuple, HandoverRow] = {}
    for h in handovers:
        key = (h.producer, tuple(h.consumers), h.constrained, h.target)
        row = rows.get(key)
        figures = [getattr(h, name) for name in FIGURES]
        if row is None:
            rows[key] = HandoverRow(h.producer, list(h.consumers), 1, *figures, h.constrained, h.note, h.target)
            continue
        row.calls += 1
        for name, value in zip(FIGURES, figures):
            setattr(row, name, _add(getattr(row, name), value))
    for row in rows.values():
        row.advice = None if row.constrained else advice(row.producer, row.target, row.saved)
    return list(rows.values())


def _chains(chains: list) -> list[ChainRow]:
    """One row per sequence of functions: a loop that hands over every iteration is one row."""
    rows: dict[tuple[str, ...], ChainRow] = {}
    for c in chains:
        key = tuple(c.functions)
        row = rows.get(key)
        if row is None:
            rows[key] = ChainRow(list(c.functions), c.calls, c.as_run, c.unconstrained, c.saved)
            continue
        row.chains += 1
        row.calls += c.calls
        row.as_run += c.as_run
        row.unconstrained = _add(row.unconstrained, c.unconstrained)
        row.saved = _add(row.saved, c.saved)
    return list(rows.values())



def _add(a: int | None, b: int | None) -> int | None:
    return None if a is None or b is None else a + b


def _timeline(runs: list[Run], total: int) -> tuple[int, dict[str, list[float]]]:
    """Busy fraction per unit in equal slices of the session (a pipelined engine's overlapping
    transfers count once); the last slice may be shorter, it ends with the session."""
    if total == 0:
        return 0, {}
    width = -(-total // min(TIMELINE_SLICES, total))
    at = np.minimum(np.arange(-(-total // width) + 1, dtype=np.int64) * width, total)
    spans: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
    offset = 0
    for r in runs:
        for unit, (starts, ends) in r.stats.intervals().items():
            spans.setdefault(unit, []).append((starts + offset, ends + offset))
        offset += r.stats.total_cycles
    out = {}
    for unit, parts in spans.items():
        covered = _covered(np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]), at)
        out[unit] = [round(float(x), 4) for x in np.diff(covered) / np.diff(at)]
    return width, out


def _covered(starts: np.ndarray, ends: np.ndarray, at: np.ndarray) -> np.ndarray:
    """Cycles of the union of the intervals [starts, ends) that lie before each time in `at`."""
    if len(starts) == 0:
        return np.zeros(len(at))
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], np.maximum.accumulate(ends[order])
    first = np.flatnonzero(np.r_[True, s[1:] > e[:-1]])  # where a disjoint stretch begins
    seg_s, seg_e = s[first], e[np.r_[first[1:] - 1, len(s) - 1]]
    before = np.r_[0, np.cumsum(seg_e - seg_s)]  # covered cycles of the first k stretches
    k = np.searchsorted(seg_s, at, side="right")
    overhang = np.where(k > 0, np.clip(seg_e[np.maximum(k - 1, 0)] - at, 0, None), 0)
    return before[k] - overhang

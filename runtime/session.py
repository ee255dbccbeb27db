"""What happened in a Context: compiles, device runs in order, calls and how each input was bound.

Records are plain data for reports (mlsdk.report). Every simulated program a Context runs (a
compiled function, an input upload, a conversion, a download, ...) is one `Run`, in the order it
ran, so totals and timelines come from one list and nothing is counted twice. Per call, each
input `Binding` says which path was taken (host upload, relocation, conversion, host round trip)
with its cycles; a binding of another call's output carries a `Handover`: the whole chain
(producer call included) as run and its simulated counterfactuals (runtime.whatif). Calls linked
by hand-overs form a chain (`Call.chain`), whose cycles with every function compiled without
io_spec_constraints each call records in `Call.unconstrained_cycles`.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Iterator

from sim import RunStats

from .errors import DeviceError

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


def cycles(stats: RunStats | None) -> int | None:
    """A run's cycles; None for a run in functional mode (simulation_mode='functional': not timed)."""
    return None if stats is None else stats.total_cycles


@dataclass
class Handover:
    """One producer call's output and every use of it so far (the consumer inputs it was bound
    to): the whole chain (the producer's call with its own input bindings, plus every binding of
    the output) as run and simulated each other way. `None` where a variant cannot be built
    (`note` says why). Bindings of the same output share one Handover."""

    producer: str  # "function.output"
    consumers: list[str]  # "function.input" of each use, in order
    as_run: int
    with_constraint: int | None  # producer compiled for `target`'s layout (as run, if it was constrained)
    without_constraint: int | None  # producer in its own layout + a conversion for each use
    host_round_trip: int | None  # producer in its own layout + download + an upload for each use
    constrained: bool  # whether the producer ran with a constraint on this output
    note: str = ""  # e.g. "the layouts match without a constraint"
    target: str | None = None  # the consumer input spec the constraint would name, e.g. "c.input_specs['x']"

    @property
    def saved(self) -> int | None:
        """What relocating by the constraint saves against the conversion (negative: it costs)."""
        if self.with_constraint is None or self.without_constraint is None:
            return None
        return self.without_constraint - self.with_constraint

    @property
    def saved_vs_host(self) -> int | None:
        if self.with_constraint is None or self.host_round_trip is None:
            return None
        return self.host_round_trip - self.with_constraint

    @property
    def advice(self) -> str | None:
        return advice(self.producer, self.target, self.saved) if not self.constrained else None


def advice(producer: str, target: str | None, saved: int | None) -> str | None:
    """The constraint to add, with what following it saves; None unless that is positive."""
    if target is None or saved is None or saved <= 0:
        return None
    function, _, output = producer.rpartition(".")
    return (f"compile {function} with io_spec_constraints={{{output!r}: {target}}} to relocate instead and save "
            f"{saved} cycles")


@dataclass
class Binding:
    function: str
    input: str
    path: str  # upload | relocation | conversion | host
    cycles: int | None  # None: the call ran in functional mode (not timed)
    bytes: int
    producer: str | None = None  # "function.output" of the proxy bound here
    handover: Handover | None = None  # when the proxy is another call's output (shared by its uses)

    @property
    def advice(self) -> str | None:
        return self.handover.advice if self.handover else None


@dataclass
class Call:
    function: str
    stats: RunStats | None  # None: a call in functional mode, which Session.calls does not hold
    labels: Labels
    bindings: list[Binding]
    runs: list[Run] = field(default_factory=list)  # this call's binding runs, then the program
    phases: Labels = field(default_factory=list)  # forward / backward / optimizer ranges of the program
    chain: int | None = None  # index of the hand-over chain this call belongs to (None: no hand-over)
    unconstrained_cycles: int | None = None  # this call with its bindings, every function unconstrained
    index: int = 0  # position in the session's calls (-1: a call in functional mode, which it does not hold)
    function_id: int = 0  # which compiled function (names may repeat)

    @property
    def cycles(self) -> int:
        """The program's cycles."""
        return self._timed().total_cycles

    @property
    def cycles_with_bindings(self) -> int:
        """The program and its input bindings (uploads, conversions): what a chain counts."""
        return self._timed().total_cycles + sum(b.cycles for b in self.bindings)

    def _timed(self) -> RunStats:
        if self.stats is None:
            raise DeviceError(f"this call of {self.function} ran in functional mode (simulation_mode='functional'): "
                              "its values were computed, its cycles were not; compile with simulation_mode 'both' or "
                              "'timing' to time it")
        return self.stats


@dataclass
class ChainSummary:
    """Calls linked by hand-overs, as run and with every function compiled without constraints."""

    functions: list[str]
    calls: int
    as_run: int
    unconstrained: int | None

    @property
    def saved(self) -> int | None:
        return None if self.unconstrained is None else self.unconstrained - self.as_run


def io_layouts(function: str, inputs: dict, outputs: dict) -> dict[str, str]:
    """The DRAM layout of each input and output spec of a function, keyed as Session.layouts."""
    return {f"{function}.{side}.{name}": str(spec.layout)
            for side, specs in (("in", inputs), ("out", outputs)) for name, spec in specs.items()}


@dataclass
class Session:
    chip: str
    clock_hz: int
    compiles: list[tuple[str, float]] = field(default_factory=list)  # (function, seconds)
    runs: list[Run] = field(default_factory=list)
    handovers: list[Handover] = field(default_factory=list)  # one per producer call output that was used
    calls: list[Call] = field(default_factory=list)
    resident_bytes: int = 0  # device memory of the Context's registered tensors, after the last call
    label: str = ""  # the Context's, e.g. "Context #2 on mncore2:auto"
    layouts: dict[str, str] = field(default_factory=dict)  # "function.in.x" / "function.out.y" -> DRAM layout
    untimed_calls: dict[str, int] = field(default_factory=dict)  # function -> calls in functional mode (no cycles)

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

    def chains(self) -> list[ChainSummary]:
        """Each hand-over chain: its calls' cycles (with bindings) as run and unconstrained."""
        return chains(self.calls)


def chains(calls: list[Call]) -> list[ChainSummary]:
    """The hand-over chains among `calls` (of one or several sessions: chain ids are global)."""
    by_chain: dict[int, list[Call]] = {}
    for c in calls:
        if c.chain is not None:
            by_chain.setdefault(c.chain, []).append(c)
    out = []
    for members in by_chain.values():
        alt = [c.unconstrained_cycles for c in members]
        names = list(dict.fromkeys(c.function for c in members))
        out.append(ChainSummary(names, len(members), sum(c.cycles_with_bindings for c in members),
                                None if None in alt else sum(alt)))
    return out


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


def new_session(chip: str, clock_hz: int, label: str = "") -> Session:
    session = Session(chip, clock_hz, label=label)
    for found in _collectors:
        found.append(session)
    return session

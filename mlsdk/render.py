"""Reports as text (rich tables) and CSV; `compare` puts two reports side by side."""

from __future__ import annotations

import csv
import io

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from .report import Report

MAX_RUN_ROWS = 40  # longer sessions list their largest runs and say how many are not shown


def _us(cycles: int | None, clock_hz: int) -> str:
    return "" if cycles is None else f"{cycles / clock_hz * 1e6:,.2f}"


def _n(x: int | None) -> str:
    return "-" if x is None else f"{x:,}"


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def text(report: Report, console: Console) -> None:
    console.print(Group(*tables(report)))


def tables(report: Report) -> list:
    r = report
    head = Text.assemble(
        ("mnsim report", "bold"), f" - {r.source} on " if r.source else " - ",
        (r.chip, "bold"), f" at {r.clock_hz / 1e6:g} MHz: ",
        (f"{r.total_cycles:,} cycles", "bold"), f" ({r.time_us:,.2f} us) in {len(r.runs)} device runs")
    out: list = [head]
    if r.untimed_calls:
        out.append(Text("not timed (simulation_mode='functional'), so not counted here: " + ", ".join(
            f"{n} call{'s' if n > 1 else ''} of {f}" for f, n in r.untimed_calls.items())))

    runs = Table(title="device runs, in order", title_justify="left")
    for col in ("kind", "what", "cycles", "us", "share"):
        runs.add_column(col, justify="right" if col in ("cycles", "us", "share") else "left")
    shown = r.runs if len(r.runs) <= MAX_RUN_ROWS else sorted(r.runs, key=lambda x: -x.cycles)[:MAX_RUN_ROWS]
    for row in shown:
        runs.add_row(row.kind, row.what, _n(row.cycles), _us(row.cycles, r.clock_hz),
                     _pct(row.cycles / r.total_cycles if r.total_cycles else 0))
    if len(shown) < len(r.runs):
        runs.caption = f"the {len(shown)} longest of {len(r.runs)} runs"
    out.append(runs)

    units = Table(title="units", title_justify="left")
    for col in ("unit", "busy cycles", "utilisation"):
        units.add_column(col, justify="left" if col == "unit" else "right")
    for u in r.units:
        units.add_row(u.unit, _n(u.busy_cycles), _pct(u.utilisation))
    paths = Table(title="bytes per path", title_justify="left")
    paths.add_column("path")
    paths.add_column("bytes", justify="right")
    for p, n in r.paths.items():
        paths.add_row(p, _n(n))
    out += [units, paths]

    if r.ops:
        ops = Table(title="cycles per op (what each op adds to its calls; spans overlap)", title_justify="left")
        for col in ("function", "op", "calls", "cycles", "share", "span"):
            ops.add_column(col, justify="left" if col in ("function", "op") else "right")
        calls_total = sum(o.cycles for o in r.ops)
        for o in r.ops:
            ops.add_row(o.function, o.op, str(o.calls), _n(o.cycles), _pct(o.cycles / calls_total if calls_total else 0),
                        _n(o.span_cycles))
        out.append(ops)

    if r.phases:
        ph = Table(title="training steps: cycles per phase (what each adds to the calls)", title_justify="left")
        for col in ("function", "phase", "calls", "cycles", "share"):
            ph.add_column(col, justify="left" if col in ("function", "phase") else "right")
        for row in r.phases:
            total = sum(x.cycles for x in r.phases if x.function == row.function)
            ph.add_row(row.function, row.phase, str(row.calls), _n(row.cycles), _pct(row.cycles / total if total else 0))
        ph.caption = f"resident state (parameters, buffers, optimizer state): {r.resident_bytes:,} bytes"
        out.append(ph)

    if r.bindings:
        b = Table(title="input bindings: the path each input took and its cycles, summed over the calls",
                  title_justify="left")
        for col in ("input", "from", "path", "calls", "cycles"):
            b.add_column(col, justify="left" if col in ("input", "from", "path") else "right", no_wrap=True)
        for row in r.bindings:
            b.add_row(row.consumer, row.producer or "host tensor", row.path, str(row.calls), _n(row.cycles))
        out.append(b)
    if r.handovers:
        h = Table(title="hand-overs: the whole chain (producer call + its bindings + every binding of its output) "
                        "each way, simulated, summed over the producer's calls", title_justify="left")
        for col in ("output", "to", "calls", "as run", "relocated", "converted", "host trip", "saved"):
            h.add_column(col, justify="left" if col in ("output", "to") else "right", no_wrap=col != "to")
        for row in r.handovers:
            h.add_row(row.producer, ", ".join(dict.fromkeys(row.consumers)), str(row.calls), _n(row.as_run),
                      _n(row.with_constraint), _n(row.without_constraint), _n(row.host_round_trip), _n(row.saved))
        h.caption = ("relocated: the producer compiled with io_spec_constraints for a consumer's layout; converted: the "
                     "producer in its own layout + DRAM-to-DRAM conversions; saved = converted - relocated")
        out.append(h)
        for row in r.handovers:
            if row.note:
                out.append(Text.assemble((f"{row.producer} -> {', '.join(dict.fromkeys(row.consumers))}: ", "bold"),
                                         row.note))
    if r.chains:
        c = Table(title="hand-over chains: cycles of their calls and bindings, as run and with every function "
                        "compiled without io_spec_constraints", title_justify="left")
        for col in ("functions", "chains", "calls", "as run", "unconstrained", "saved"):
            c.add_column(col, justify="left" if col == "functions" else "right")
        for row in r.chains:
            c.add_row(" -> ".join(row.functions), str(row.chains), str(row.calls), _n(row.as_run),
                      _n(row.unconstrained), _n(row.saved))
        out.append(c)
    for advice in r.advice:
        out.append(Text.assemble(("advice: ", "bold yellow"), advice))
    return out


def csv_text(report: Report) -> str:
    """Long-format CSV (section, item, metric, value): one file that every tool can filter."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["section", "item", "metric", "value"])
    r = report
    for metric, value in (("chip", r.chip), ("clock_hz", r.clock_hz), ("total_cycles", r.total_cycles),
                          ("time_us", round(r.time_us, 4))):
        w.writerow(["summary", "", metric, value])
    for i, row in enumerate(r.runs):
        item = f"{i}:{row.kind}:{row.what}"
        w.writerow(["runs", item, "start_cycle", row.start_cycle])
        w.writerow(["runs", item, "cycles", row.cycles])
    for u in r.units:
        w.writerow(["units", u.unit, "busy_cycles", u.busy_cycles])
        w.writerow(["units", u.unit, "utilisation", round(u.utilisation, 6)])
    for p, n in r.paths.items():
        w.writerow(["paths", p, "bytes", n])
    for o in r.ops:
        for metric in ("calls", "cycles", "span_cycles"):
            w.writerow(["ops", f"{o.function}:{o.op}", metric, getattr(o, metric)])
    for ph in r.phases:
        for metric in ("calls", "cycles"):
            w.writerow(["phases", f"{ph.function}:{ph.phase}", metric, getattr(ph, metric)])
    if r.resident_bytes:
        w.writerow(["summary", "", "resident_bytes", r.resident_bytes])
    for function, n in r.untimed_calls.items():
        w.writerow(["untimed_calls", function, "calls", n])
    for b in r.bindings:
        w.writerow(["bindings", b.consumer, "path", b.path])
        w.writerow(["bindings", b.consumer, "producer", b.producer or ""])
        for metric in ("calls", "bytes", "cycles"):
            w.writerow(["bindings", b.consumer, metric, getattr(b, metric)])
    for i, h in enumerate(r.handovers):
        item = f"{i}:{h.producer} -> {', '.join(dict.fromkeys(h.consumers))}"
        for metric in ("calls", "as_run", "with_constraint", "without_constraint", "host_round_trip", "saved",
                       "saved_vs_host"):
            value = getattr(h, metric)
            w.writerow(["handovers", item, metric, "" if value is None else value])
        for metric in ("note", "advice"):
            if getattr(h, metric):
                w.writerow(["handovers", item, metric, getattr(h, metric)])
    for i, c in enumerate(r.chains):
        item = f"{i}:{' -> '.join(c.functions)}"
        for metric in ("chains", "calls", "as_run", "unconstrained", "saved"):
            value = getattr(c, metric)
            w.writerow(["chains", item, metric, "" if value is None else value])
    return buf.getvalue()


def comparison(a: Report, b: Report) -> Table:
    """Two reports of the same script side by side: totals, units, runs and bindings."""
    t = Table(title=f"{a.source or 'run'}: {a.chip} vs {b.chip}", title_justify="left")
    t.add_column("")
    t.add_column(a.chip, justify="right")
    t.add_column(b.chip, justify="right")
    t.add_column(f"{b.chip} / {a.chip}", justify="right")

    def row(label: str, x: float | None, y: float | None, fmt=_n) -> None:
        ratio = f"{y / x:.3f}" if x and y is not None else "-"
        t.add_row(label, fmt(x), fmt(y), ratio)

    row("total cycles", a.total_cycles, b.total_cycles)
    t.add_row("time (us)", f"{a.time_us:,.2f}", f"{b.time_us:,.2f}",
              f"{b.time_us / a.time_us:.3f}" if a.time_us else "-")
    for label, x, y in aligned([(f"busy: {u.unit}", u.busy_cycles) for u in a.units],
                               [(f"busy: {u.unit}", u.busy_cycles) for u in b.units]):
        row(label, x, y)
    for label, x, y in aligned([(f"{r.kind}: {r.what}", r.cycles) for r in a.runs],
                               [(f"{r.kind}: {r.what}", r.cycles) for r in b.runs]):
        row(label, x, y)
    for label, x, y in aligned(_binding_figures(a), _binding_figures(b)):
        row(label, x, y)
    return t


def aligned(a: list[tuple[str, int]], b: list[tuple[str, int]]) -> list[tuple[str, int | None, int | None]]:
    """Rows of two runs matched by name (the k-th occurrence of a name with the k-th): in a's order,
    then what only b has; a side without the row gets None (shown as "-", marked "only in ...")."""
    def keyed(rows):
        seen: dict[str, int] = {}
        out = {}
        for name, value in rows:
            k = seen.get(name, 0)
            seen[name] = k + 1
            out[(name, k)] = value
        return out
    ka, kb = keyed(a), keyed(b)
    rows = []
    for key in [*ka, *(k for k in kb if k not in ka)]:
        name, k = key
        label = name if k == 0 else f"{name} #{k + 1}"
        x, y = ka.get(key), kb.get(key)
        if x is None or y is None:
            label += f" (only in {'the first' if y is None else 'the second'})"
        rows.append((label, x, y))
    return rows


def _binding_figures(r: Report) -> list[tuple[str, int]]:
    out = [(f"{x.consumer} <- {x.producer or 'host tensor'}: binding", x.cycles) for x in r.bindings]
    for h in r.handovers:
        to = ", ".join(dict.fromkeys(h.consumers))
        out += [(f"{h.producer} -> {to}: chain as run", h.as_run),
                (f"{h.producer} -> {to}: chain relocated", h.with_constraint),
                (f"{h.producer} -> {to}: chain converted", h.without_constraint)]
    return out

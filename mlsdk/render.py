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


def _table(title: str, columns: tuple[str, ...], rows: list[tuple[str, ...]], *, text: tuple[str, ...],
           caption: str | None = None) -> Table:
    """A table whose `text` columns fold long names onto more lines and whose other (figure)
    columns keep every digit: a narrow console squeezes names, never numbers (a transformer's
    parameter names once left its bindings table showing "ca…" and "cy…")."""
    t = Table(title=title, title_justify="left", caption=caption)
    for k, col in enumerate(columns):
        if col in text:
            t.add_column(col, justify="left", overflow="fold")
        else:
            t.add_column(col, justify="right", no_wrap=True, min_width=max([len(col), *(len(r[k]) for r in rows)]))
    for r in rows:
        t.add_row(*r)
    return t


def short_mvs_line(r: Report) -> str:
    """What MVs shorter than their mode's unit (a gather's runs) cost the Data Engines."""
    busy = r.engine_busy_cycles
    return (f"{r.short_mvs:,} MVs shorter than their mode's unit (each charged a whole unit) took "
            f"{r.short_mv_cycles:,} of the Data Engines' {busy:,} busy cycles "
            f"({_pct(r.short_mv_cycles / busy if busy else 0.0)})")


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

    shown = r.runs if len(r.runs) <= MAX_RUN_ROWS else sorted(r.runs, key=lambda x: -x.cycles)[:MAX_RUN_ROWS]
    out.append(_table(
        "device runs, in order", ("kind", "what", "cycles", "us", "share"),
        [(row.kind, row.what, _n(row.cycles), _us(row.cycles, r.clock_hz),
          _pct(row.cycles / r.total_cycles if r.total_cycles else 0)) for row in shown], text=("kind", "what"),
        caption=f"the {len(shown)} longest of {len(r.runs)} runs" if len(shown) < len(r.runs) else None))
    out.append(_table("units", ("unit", "busy cycles", "utilisation"),
                      [(u.unit, _n(u.busy_cycles), _pct(u.utilisation)) for u in r.units], text=("unit",)))
    if r.short_mvs:
        out.append(Text(short_mvs_line(r)))
    out.append(_table("bytes per path", ("path", "bytes"), [(p, _n(n)) for p, n in r.paths.items()], text=("path",)))

    if r.ops:
        calls_total = sum(o.cycles for o in r.ops)
        out.append(_table(
            "cycles per op (what each op adds to its calls; spans overlap)",
            ("function", "op", "calls", "cycles", "share", "span"),
            [(o.function, o.op, str(o.calls), _n(o.cycles), _pct(o.cycles / calls_total if calls_total else 0),
              _n(o.span_cycles)) for o in r.ops], text=("function", "op")))

    if r.phases:
        totals = {f: sum(x.cycles for x in r.phases if x.function == f) for f in {x.function for x in r.phases}}
        out.append(_table(
            "training steps: cycles per phase (what each adds to the calls)",
            ("function", "phase", "calls", "cycles", "share"),
            [(row.function, row.phase, str(row.calls), _n(row.cycles),
              _pct(row.cycles / totals[row.function] if totals[row.function] else 0)) for row in r.phases],
            text=("function", "phase"),
            caption=f"resident state (parameters, buffers, optimizer state): {r.resident_bytes:,} bytes"))

    if r.bindings:
        out.append(_table(
            "input bindings: the path each input took and its cycles, summed over the calls",
            ("input", "from", "path", "calls", "cycles"),
            [(row.consumer, row.producer or "host tensor", row.path, str(row.calls), _n(row.cycles))
             for row in r.bindings], text=("input", "from")))
    if r.handovers:
        out.append(_table(
            "hand-overs: the whole chain (producer call + its bindings + every binding of its output) each way, "
            "simulated, summed over the producer's calls",
            ("output", "to", "calls", "as run", "relocated", "converted", "host trip", "saved"),
            [(row.producer, ", ".join(dict.fromkeys(row.consumers)), str(row.calls), _n(row.as_run),
              _n(row.with_constraint), _n(row.without_constraint), _n(row.host_round_trip), _n(row.saved))
             for row in r.handovers], text=("output", "to"),
            caption="relocated: the producer compiled with io_spec_constraints for a consumer's layout; converted: "
                    "the producer in its own layout + DRAM-to-DRAM conversions; saved = converted - relocated"))
        for row in r.handovers:
            if row.note:
                out.append(Text.assemble((f"{row.producer} -> {', '.join(dict.fromkeys(row.consumers))}: ", "bold"),
                                         row.note))
    if r.chains:
        out.append(_table(
            "hand-over chains: cycles of their calls and bindings, as run and with every function compiled without "
            "io_spec_constraints", ("functions", "chains", "calls", "as run", "unconstrained", "saved"),
            [(" -> ".join(row.functions), str(row.chains), str(row.calls), _n(row.as_run), _n(row.unconstrained),
              _n(row.saved)) for row in r.chains], text=("functions",)))
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
    if r.short_mvs:
        w.writerow(["summary", "", "short_mvs", r.short_mvs])
        w.writerow(["summary", "", "short_mv_engine_cycles", r.short_mv_cycles])
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
    rows: list[tuple[str, str, str, str]] = []

    def row(label: str, x: float | None, y: float | None, fmt=_n) -> None:
        ratio = f"{y / x:.3f}" if x and y is not None else "-"
        rows.append((label, fmt(x), fmt(y), ratio))

    row("total cycles", a.total_cycles, b.total_cycles)
    rows.append(("time (us)", f"{a.time_us:,.2f}", f"{b.time_us:,.2f}",
                 f"{b.time_us / a.time_us:.3f}" if a.time_us else "-"))
    for label, x, y in aligned([(f"busy: {u.unit}", u.busy_cycles) for u in a.units],
                               [(f"busy: {u.unit}", u.busy_cycles) for u in b.units]):
        row(label, x, y)
    if a.short_mvs or b.short_mvs:  # a variant's MV units change what gathers of short runs cost
        row("engine cycles of MVs shorter than their unit", a.short_mv_cycles, b.short_mv_cycles)
    for label, x, y in aligned([(f"{r.kind}: {r.what}", r.cycles) for r in a.runs],
                               [(f"{r.kind}: {r.what}", r.cycles) for r in b.runs]):
        row(label, x, y)
    for label, x, y in aligned(_binding_figures(a), _binding_figures(b)):
        row(label, x, y)
    return _table(f"{a.source or 'run'}: {a.chip} vs {b.chip}", ("", a.chip, b.chip, f"{b.chip} / {a.chip}"), rows,
                  text=("",))


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

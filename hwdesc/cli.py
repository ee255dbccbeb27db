"""`mnsim hw ...`: list, show, diff and validate hardware descriptions."""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.tree import Tree

from . import figures
from .dump import MISSING, diff
from .errors import HwDescError
from .fmt import human_bytes, si
from .loader import load, names
from .model import HwDesc
from .source import CONFIDENCE_TAGS, UNSOURCED, key_path_text


def register(sub: argparse._SubParsersAction) -> None:
    hw = sub.add_parser("hw", help="hardware descriptions: list, show, diff, validate")
    cmds = hw.add_subparsers(dest="hw_command", required=True)
    cmds.add_parser("list", help="the built-in descriptions").set_defaults(func=cmd_list)
    show = cmds.add_parser("show", help="the tree, units and paths of a chip with derived figures")
    show.add_argument("chip", help="a built-in name (mncore2, mini, ...) or a path to a YAML file")
    show.add_argument("--sources", action="store_true", help="also list every value with its source note")
    show.set_defaults(func=cmd_show)
    d = cmds.add_parser("diff", help="what differs between two chips, written values and derived figures")
    d.add_argument("a")
    d.add_argument("b")
    d.set_defaults(func=cmd_diff)
    v = cmds.add_parser("validate", help="check a description; exit 0, or print file:line and exit 1")
    v.add_argument("path")
    v.set_defaults(func=cmd_validate)


def cmd_list(args: argparse.Namespace, console: Console) -> int:
    table = Table("name", "PEs", "MABs", "DRAM", "summary", title="hardware descriptions")
    for name in names():
        hw = load(name)
        table.add_row(name, str(hw.instances("PE")), str(hw.instances("MAB")),
                      human_bytes(figures.capacity_total_bytes(hw, "DRAM")), hw.summary)
    console.print(table)
    return 0


def cmd_show(args: argparse.Namespace, console: Console) -> int:
    hw = load(args.chip)
    counts = figures.level_counts(hw)
    console.print(f"[bold]{hw.name}[/bold]: {hw.summary}")
    console.print(f"from {', '.join(hw.source_files)}")
    console.print(f"{counts[hw.leaf_level]} {hw.leaf_level}s, {hw.instances('MAB')} MABs, "
                  f"{human_bytes(figures.capacity_total_bytes(hw, 'DRAM'))} DRAM, "
                  f"{human_bytes(figures.on_chip_bytes(hw))} on-chip memory; clock {si(hw.clock_hz, 'Hz')}, "
                  f"step {hw.step_cycles} cycles, long word {hw.long_word_bytes} B")
    console.print(_tree(hw))
    console.print(_units_table(hw))
    console.print(_paths_table(hw))
    console.print(_sources_table(hw, full=args.sources))
    return 0


def cmd_diff(args: argparse.Namespace, console: Console) -> int:
    a, b = load(args.a), load(args.b)
    rows = diff(a, b)
    table = Table("key", a.name, b.name, "kind", title=f"{a.name} vs {b.name}")
    for d in rows:
        table.add_row(d.key, _value(d.key, d.a), _value(d.key, d.b), "derived" if d.derived else "written")
    console.print(table if rows else f"{a.name} and {b.name} describe the same chip")
    return 0


def cmd_validate(args: argparse.Namespace, console: Console) -> int:
    try:
        hw = load(args.path)
    except HwDescError as e:
        console.print(f"[red]{e}[/red]", highlight=False)
        return 1
    console.print(f"{args.path}: valid ({hw.name}, {hw.instances(hw.leaf_level)} {hw.leaf_level}s)")
    return 0


def _value(key: str, v: object) -> str:
    """Figures in the units a person reads them in; written values as written."""
    if v == MISSING or not isinstance(v, (int, float)) or isinstance(v, bool):
        return str(v)
    if key.startswith("capacity") or key.endswith("_bytes"):
        return human_bytes(v)
    if key.startswith("peak_flops"):
        return si(v, "FLOP/s")
    if key.startswith("bandwidth"):
        return si(v, "B/s")
    return f"{v:.6g}"


def _tree(hw: HwDesc) -> Tree:
    root = Tree("[bold]Top[/bold] (1)")
    node = root
    for name, level in hw.levels.items():
        mems = [f"{m} {human_bytes(int(mem.capacity_bytes))} ({human_bytes(figures.capacity_total_bytes(hw, m))} total)"
                for m, mem in hw.memories.items() if mem.level == name]
        units = [u for u, unit in hw.units.items() if unit.level == name]
        axis = f", axis {level.axis}" if level.axis else ""
        label = f"{level.count} x [bold]{name}[/bold] ({hw.instances(name)} in all{axis})"
        if mems:
            label += ": " + ", ".join(mems)
        if units:
            label += "; units " + ", ".join(units)
        node = node.add(label)
    return root


def _units_table(hw: HwDesc) -> Table:
    table = Table("unit", "mode", "dtype", "shape / lanes", "FLOP/cycle/unit", "units", "peak", title="compute")
    for p in figures.peaks(hw):
        unit = hw.units[p.unit]
        shape = (f"{unit.matrix[p.dtype].rows}x{unit.matrix[p.dtype].cols}" if p.mode == "matrix"
                 else f"{unit.vector[p.dtype].lanes_per_cycle} lanes")
        table.add_row(p.unit, p.mode, p.dtype, shape, str(p.flop_per_cycle_per_unit), str(p.units), si(p.flops, "FLOP/s"))
    return table


def _paths_table(hw: HwDesc) -> Table:
    table = Table("path", "mode", "engine", "LW/cycle src/dst instance", "LW/cycle per engine",
                  "engines", "B/s chip", "latency", title="transfer paths (what the simulator reaches)")
    for b in figures.path_bandwidths(hw):
        t = hw.transfers[b.transfer]
        table.add_row(b.transfer, b.mode, t.engine, f"{b.src_lw_per_cycle:g} / {b.dst_lw_per_cycle:g}",
                      f"{b.lw_per_cycle:g}", str(b.engines), si(b.bytes_per_s, "B/s"), f"{t.latency_cycles} cyc")
    if "DRAM" in hw.memories:
        table.caption = (f"DRAM: {si(figures.dram_bandwidth_total(hw), 'B/s')} its own rate, "
                         f"{si(figures.dram_bandwidth_reachable(hw), 'B/s')} through its fastest path")
    return table


def _sources_table(hw: HwDesc, *, full: bool) -> Table:
    table_ = hw.provenance_table
    if not full:
        tally = Counter(p.conf for p in table_.values())
        table = Table("confidence", "meaning", "values", title="sources of the written values (--sources lists them)")
        for tag, n in sorted(tally.items(), key=lambda kv: -kv[1]):
            table.add_row(tag, CONFIDENCE_TAGS.get(tag, "bare value, set where written" if tag == UNSOURCED else ""), str(n))
        return table
    table = Table("key", "value", "conf", "source", "where", title="every written value")
    for path, prov in table_.items():
        value = _lookup(hw, path)
        where = f"{Path(prov.location.file).name}:{prov.location.line}"
        table.add_row(key_path_text(path), str(value), prov.conf, prov.src, where)
    return table


def _lookup(hw: HwDesc, path: tuple) -> object:
    value: object = hw
    for part in path:
        value = value[part] if isinstance(value, dict) else getattr(value, str(part))
    return value

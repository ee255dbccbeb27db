"""`mnsim layout ...`: what a layout string means on a chip, and the candidates for a shape."""

from __future__ import annotations

import argparse

import numpy as np
from rich.console import Console
from rich.table import Table

import hwdesc
from hwdesc.fmt import human_bytes

from ..errors import LayoutError
from .candidates import candidates
from .layout import W_AXIS
from .parse import parse
from .placement import Placement

SHOWN_COPIES = 8


def register(sub: argparse._SubParsersAction) -> None:
    layout = sub.add_parser("layout", help="layouts in PFN notation: show one, list candidates")
    cmds = layout.add_subparsers(dest="layout_command", required=True)
    show = cmds.add_parser("show", help="shape, footprint, instances and copies of a layout on a chip")
    show.add_argument("layout", help="e.g. '(256,16)/((8_L2B:1, 4:2, 8_L1B:1), (2:1, 4_PE:1, 2_W:1); B@[MAB])'")
    show.add_argument("--hw", default="mncore2", help="chip name or YAML path (default mncore2)")
    show.add_argument("--dtype", default="float32")
    show.add_argument("--memory", default="LM0", help="LM0, LM1, DRAM, ... (default LM0)")
    show.add_argument("--where", help="an element index, e.g. 33,0: show every place it lives")
    show.set_defaults(func=cmd_show)
    cand = cmds.add_parser("candidates", help="legal layouts of a shape, best hint first")
    cand.add_argument("shape", help="e.g. 32,64")
    cand.add_argument("--hw", default="mncore2")
    cand.add_argument("--dtype", default="float32")
    cand.add_argument("--memory", default="LM0")
    cand.set_defaults(func=cmd_candidates)


def cmd_show(args: argparse.Namespace, console: Console) -> int:
    hw = hwdesc.load(args.hw)
    p = Placement(parse(args.layout), hw, args.memory, args.dtype, check_capacity=False)
    lw = hw.long_word_bytes
    console.print(f"[bold]{p.layout}[/bold]")
    console.print(f"{args.dtype} tensor of shape {p.layout.shape} ({p.layout.numel} elements) in {args.memory} "
                  f"on {hw.name}")
    fits = "" if p.fits else f"  [red]does not fit: {args.memory} holds {hw.memory_lw(args.memory)} long words[/red]"
    slices = f" ({p.time_slices} time slices of {p.slice_span})" if p.time_slices > 1 else ""
    console.print(f"footprint: {p.footprint_lw} long words ({human_bytes(p.footprint_lw * lw)}) per "
                  f"{args.memory} instance{slices}{fits}")
    used = p.instances_used
    console.print(f"instances: {len(used)} of {p.instance_count} {args.memory} hold data "
                  f"({p.distinct_instances} distinct x {p.instance_replicas} replicas)")
    bcast = ", ".join(f"{axis} x{n}" for (n, _, _), axis in zip(p.copy_dims, p.broadcast_axes)) or "none"
    console.print(f"broadcast copies: {p.copies} per element ({bcast})")
    console.print(f"total: {human_bytes(p.footprint_bytes_total)} reserved on the chip")
    if args.where:
        _where(console, p, args.where)
    return 0


def _where(console: Console, p: Placement, text: str) -> None:
    try:
        index = tuple(int(x) for x in text.split(","))
        flat = int(np.ravel_multi_index(index, p.layout.shape))
    except ValueError as e:
        raise LayoutError(f"--where {text!r} is not an index of shape {p.layout.shape}: {e}") from None
    loc = p.locate(np.array([flat]))
    levels = list(p.level_coordinates(0))
    word_addressed = p.hw.memories[p.memory].address_unit == "word"
    columns = [*levels, "long word", W_AXIS, *(["word address"] if word_addressed else []), "time"]
    table = Table(*columns, title=f"element {index}: {len(loc.instance)} place(s)")
    words_per_lw = p.hw.long_word_bytes // p.hw.word_bytes
    for i in range(min(len(loc.instance), SHOWN_COPIES)):
        lv = p.level_coordinates(int(loc.instance[i]))
        word = [str(words_per_lw * int(loc.lw[i]) + int(loc.w[i]) * words_per_lw // p.epl)] if word_addressed else []
        table.add_row(*(str(lv[n]) for n in levels), str(int(loc.lw[i])), str(int(loc.w[i])), *word,
                      str(int(loc.time[i])))
    console.print(table)
    if len(loc.instance) > SHOWN_COPIES:
        console.print(f"... and {len(loc.instance) - SHOWN_COPIES} more copies")


def cmd_candidates(args: argparse.Namespace, console: Console) -> int:
    hw = hwdesc.load(args.hw)
    shape = tuple(int(x) for x in args.shape.split(",") if x.strip())
    table = Table("#", "layout", "LW per instance", "replicas", title=f"{args.dtype}{list(shape)} in {args.memory} on {hw.name}")
    for i, c in enumerate(candidates(shape, args.dtype, hw, args.memory)):
        table.add_row(str(i), str(c.layout), str(c.footprint_lw), str(c.replicas))
    console.print(table)
    return 0

"""`mnsim run`, `mnsim report` and `mnsim compare`: scripts on the simulator, and their reports."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from rich.console import Console
from rich.rule import Rule

from hwdesc import MnsimError

from . import render
from .device import MNDevice
from .errors import MLSDKError
from .report import Report, for_program
from .run import run_script

FORMATS = ("text", "json", "csv", "png")
PNG_DEFAULT = "mnsim-report.png"


class CommandError(MnsimError, ValueError):
    """A command line that cannot be carried out (bad file, missing output path, ...)."""


def register(sub: argparse._SubParsersAction) -> None:
    run = sub.add_parser("run", help="run an MLSDK script on the simulator and report its cycles",
                         description="Run SCRIPT (with ARGS) as python would; every MNDevice it creates is the "
                                     "simulated chip --device (default: what the script asks for). At exit, report "
                                     "the cycles of every Context it used. The script's own arguments, --device "
                                     "included, are passed to it untouched.")
    run.add_argument("--device", help="chip to run on, e.g. mncore2:auto, mini:auto, mncore2_fastdram:auto")
    run.add_argument("--report", choices=FORMATS, default="text")
    run.add_argument("--out", help="write the report here (png: default mnsim-report.png)")
    run.add_argument("--trace", help="also write a Chrome/Perfetto trace of the run to this file")
    run.add_argument("script")
    run.add_argument("args", nargs=argparse.REMAINDER)
    run.set_defaults(func=cmd_run)

    rep = sub.add_parser("report", help="report a codegen_dir (timed on its chip) or re-render a report.json")
    rep.add_argument("source", help="a codegen_dir written by Context.compile, or a JSON report")
    rep.add_argument("--format", choices=FORMATS, default="text")
    rep.add_argument("--out")
    rep.set_defaults(func=cmd_report)

    cmp_ = sub.add_parser("compare", help="run a script on two chips and show the cycles side by side")
    cmp_.add_argument("--device", action="append", required=True, help="give exactly two")
    cmp_.add_argument("--report", choices=("text", "json"), default="text")
    cmp_.add_argument("--out")
    cmp_.add_argument("script")
    cmp_.add_argument("args", nargs=argparse.REMAINDER)
    cmp_.set_defaults(func=cmd_compare)


def cmd_run(args: argparse.Namespace, console: Console) -> int:
    run = run_script(args.script, args.args, args.device, args.trace)
    reports = run.reports()
    if not reports:
        Console(stderr=True).print("[yellow]nothing ran on a simulated chip: no report[/yellow]")
        return run.exit_code
    default = PNG_DEFAULT if args.report == "png" else None
    for i, report in enumerate(reports):
        emit(report, args.report, _numbered(args.out or default, i, len(reports)), console)
    if args.trace:
        console.print(f"trace: {args.trace} (open it at https://ui.perfetto.dev)")
    return run.exit_code


def cmd_report(args: argparse.Namespace, console: Console) -> int:
    emit(load_report(args.source), args.format, args.out, console)
    return 0


def cmd_compare(args: argparse.Namespace, console: Console) -> int:
    if len(args.device) != 2:
        raise CommandError(f"compare takes exactly two --device options, got {len(args.device)}")
    for device in args.device:  # both names checked before the script runs on the first
        try:
            MNDevice(device)
        except MLSDKError as e:
            raise CommandError(f"--device {device}: {e}") from None
    reports = []
    for device in args.device:
        run = run_script(args.script, args.args, device)
        if run.exit_code:
            raise CommandError(f"{args.script} failed on {device} (exit code {run.exit_code})")
        found = run.reports()
        if len(found) != 1:
            raise CommandError(f"{args.script} on {device} used {len(found)} simulated chips; compare needs one")
        reports.append(found[0])
    a, b = reports
    if args.report == "json":
        _write(json.dumps({"a": a.to_json(), "b": b.to_json()}, indent=1), args.out, console)
    elif args.out:
        with open(args.out, "w") as f:
            Console(file=f, width=140).print(render.comparison(a, b))
        console.print(f"report: {args.out}")
    else:
        console.print(Rule())
        console.print(render.comparison(a, b))
    return 0


def load_report(source: str) -> Report:
    path = Path(source)
    if path.is_dir():
        return _codegen_report(path)
    if not path.is_file():
        raise CommandError(f"no codegen_dir or report file at {source}")
    try:
        return Report.load(path)
    except (ValueError, KeyError, TypeError) as e:
        raise CommandError(f"{source} is not an mnsim report: {e}") from None


def _codegen_report(path: Path) -> Report:
    """A codegen_dir's program timed on the chip it was compiled for (no data needed)."""
    from compiler import artifact
    from sim import Machine
    compiled = artifact.load(path)
    stats = Machine(compiled.hw).time(compiled.program.code)
    return for_program(path.name, stats, compiled.program.labels, compiled.hw.name, source=str(path))


def emit(report: Report, fmt: str, out: str | None, console: Console) -> None:
    if fmt == "png":
        from .plots import png
        target = out or PNG_DEFAULT
        png(report, target)
        console.print(f"report plot: {target}")
    elif fmt == "json":
        _write(json.dumps(report.to_json(), indent=1), out, console)
    elif fmt == "csv":
        _write(render.csv_text(report), out, console)
    else:
        if out:
            with open(out, "w") as f:
                render.text(report, Console(file=f, width=140))
            console.print(f"report: {out}")
        else:
            console.print(Rule())
            render.text(report, console)


def _write(content: str, out: str | None, console: Console) -> None:
    if out:
        Path(out).write_text(content)
        console.print(f"report: {out}")
    else:
        sys.stdout.write(content if content.endswith("\n") else content + "\n")


def _numbered(out: str | None, i: int, n: int) -> str | None:
    """report.json -> report.json, report-1.json, ... when a script used several chips."""
    if out is None or n == 1 or i == 0:
        return out
    stem, ext = os.path.splitext(out)
    return f"{stem}-{i}{ext}"

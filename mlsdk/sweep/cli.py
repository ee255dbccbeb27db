"""`mnsim sweep SPEC.yaml`: run a SPEC's workloads on every point, resume what was started,
write the table and plots."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from ..errors import SweepError
from . import plots, table
from .engine import plan, run
from .spec import load_spec
from .store import RowStore


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sweep", help="run workloads on variant chips drawn from a SPEC (local cores or Dask)",
                       description="Derive a chip per point of SPEC's axes, compile and time each workload on it, "
                                   "and write one row per (point, workload) to OUT/sweep.csv and sweep.parquet, "
                                   "with plots. Rows are saved as points finish: run it again to resume.")
    p.add_argument("spec", help="the sweep SPEC (YAML): base, axes, sample, workloads, cost")
    p.add_argument("--out", help="results folder (default: <spec name>-sweep in the current folder)")
    engine = p.add_mutually_exclusive_group()
    engine.add_argument("--workers", type=int, help="worker processes of the local Dask cluster (default: cores)")
    engine.add_argument("--scheduler", help="submit to a running Dask cluster, e.g. tcp://host:8786")
    engine.add_argument("--serial", action="store_true", help="no Dask: every point in this process, in order")
    p.add_argument("--fresh", action="store_true", help="forget the rows of an earlier run and compute them all")
    p.add_argument("--dry-run", action="store_true", help="list the points and invalid chips; run nothing")
    p.add_argument("--no-plots", action="store_true", help="write the table only")
    p.set_defaults(func=cmd_sweep)


def cmd_sweep(args: argparse.Namespace, console: Console) -> int:
    if args.workers is not None and args.workers < 1:
        raise SweepError(f"--workers {args.workers}: give at least 1 (or --serial)")
    loaded = load_spec(args.spec)
    work = plan(loaded)
    out = Path(args.out) if args.out else Path(f"{loaded.path.stem}-sweep")
    if args.dry_run:  # what would run: the store is read, never changed
        console.print(table.summary(work, table.rows(work, RowStore(out))))
        return 0
    store = RowStore(out, fresh=args.fresh)
    pending = sum(t.key not in store for t in work.tasks)
    engine = "serial" if args.serial else ("dask" if args.scheduler else "local")
    console.print(f"{len(work.points)} points ({len(work.invalid)} invalid) x {len(work.workloads)} workloads: "
                  f"{pending} to compute, {len(work.tasks) - pending} already in {store.path}")
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TimeRemainingColumn())
    with Progress(*columns, console=console, transient=not console.is_terminal) as progress:
        bar = progress.add_task("sweep", total=pending)
        failed = 0

        def finished(row: dict) -> None:
            nonlocal failed
            failed += row["status"] != "ok"
            progress.update(bar, advance=1, description=f"sweep ({failed} failed)" if failed else "sweep")
        run(work, store, engine=engine, workers=args.workers, scheduler=args.scheduler, on_row=finished)
    rows = table.rows(work, store)
    out.mkdir(parents=True, exist_ok=True)
    csv_path, parquet_path = table.write(table.to_arrow(work, rows), out)
    console.print(table.summary(work, rows))
    written = [csv_path, parquet_path]
    if not args.no_plots:
        written.append(out / plots.CYCLES_PNG)
        plots.cycles_by_axis(work, rows, written[-1])
        if work.cost:
            written.append(out / plots.PARETO_PNG)
            plots.pareto(work, rows, written[-1])
    console.print("wrote " + ", ".join(str(p) for p in written))
    return 0

"""The results of a sweep as one table: a row per (point, workload), in grid order.

Columns: `point`, `workload`, `status` (ok, failed, invalid: the values describe no valid chip,
pending: not computed yet), `error`, one column per axis (the value, or the factor for factor
axes), the cost column when the SPEC names a YAML path, then `chip`, `fingerprint`, `cycles`,
`time_us`, `busy.<unit>`, `util.<unit>`, `bytes.<path>` and `layouts` (JSON: each IO tensor's
DRAM layout). Written as CSV and Parquet with pyarrow; summarised with rich.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
from rich.console import Group
from rich.table import Table

from .axes import lookup
from .engine import Plan
from .store import RowStore

CSV, PARQUET = "sweep.csv", "sweep.parquet"
LEAD = ("point", "workload", "status", "error")
MEASURED = ("chip", "fingerprint", "cycles", "time_us")
GROUPS = ("busy.", "util.", "bytes.")
SHOWN = 30  # rows of the summary's point table before it shows the fastest only
REASONS = 10  # points that did not run listed with their reason


def rows(work: Plan, store: RowStore) -> list[dict[str, Any]]:
    """Every (point, workload) of the plan, measured or not, in grid then workload order."""
    out = []
    tasks = {(t.point, t.workload): t for t in work.tasks}
    for p in work.points:
        cost = {}
        if work.cost_key is not None:
            cost[work.cost] = lookup(p.hw.model_dump(mode="json"), work.cost_key) if p.hw else None
        for w, workload in enumerate(work.workloads):
            row: dict[str, Any] = {"point": p.index, "workload": workload.label, **p.values, **cost}
            if p.hw is None:
                row.update(status="invalid", error=p.error)
            else:
                found = store.rows.get(tasks[(p.index, w)].key)
                if found is None:
                    row.update(status="pending", chip=p.hw.name, fingerprint=p.hw.fingerprint)
                else:
                    row.update({k: v for k, v in found.items() if k not in ("key", "workload")},
                               chip=p.hw.name, fingerprint=p.hw.fingerprint)
            out.append(row)
    return out


def columns(work: Plan, rows_: list[dict[str, Any]]) -> list[str]:
    seen = dict.fromkeys(k for r in rows_ for k in r)
    fixed = [*LEAD, *(a.name for a in work.axes)]
    if work.cost and work.cost not in fixed:
        fixed.append(work.cost)
    fixed.extend(MEASURED)
    grouped = [k for prefix in GROUPS for k in sorted((k for k in seen if k.startswith(prefix)), key=_unit_order)]
    rest = [k for k in seen if k not in fixed and k not in grouped]
    return [*fixed, *grouped, *rest]


def _unit_order(column: str) -> tuple:
    """PE stream, Data Engine 0, 1, ... 10 (by number), host link; paths by name."""
    name = column.split(".", 1)[1]
    if name.startswith("Data Engine "):
        return (1, int(name.rsplit(" ", 1)[1]), name)
    return ({"PE stream": 0, "host link": 2}.get(name, 3), 0, name)


def to_arrow(work: Plan, rows_: list[dict[str, Any]]) -> pa.Table:
    arrays = {}
    for name in columns(work, rows_):
        values = [r.get(name) for r in rows_]
        try:
            arrays[name] = pa.array(values)
        except (pa.ArrowInvalid, pa.ArrowTypeError):  # an axis of mixed kinds (numbers and names)
            arrays[name] = pa.array([None if v is None else str(v) for v in values])
    return pa.table(arrays)


def write(table: pa.Table, folder: Path) -> tuple[Path, Path]:
    csv_path, parquet_path = folder / CSV, folder / PARQUET
    pa_csv.write_csv(table, csv_path)
    pq.write_table(table, parquet_path)
    return csv_path, parquet_path


def summary(work: Plan, rows_: list[dict[str, Any]]) -> Group:
    """Per workload: how many points ran, the spread of cycles and the fastest point; then the
    points with their cycles per workload; then what failed and why."""
    per = Table("workload", "ok", "failed", "invalid", "pending", "cycles min", "median", "max", "fastest point",
                title=f"sweep {work.loaded.path.name}: {len(work.points)} points x {len(work.workloads)} workloads")
    for workload in work.workloads:
        mine = [r for r in rows_ if r["workload"] == workload.label]
        ok = [r for r in mine if r["status"] == "ok"]
        count = {s: sum(r["status"] == s for r in mine) for s in ("ok", "failed", "invalid", "pending")}
        cycles = [r["cycles"] for r in ok]
        best = min(ok, key=lambda r: (r["cycles"], r["point"]), default=None)
        per.add_row(workload.label, *map(str, count.values()),
                    *((f"{min(cycles):,}", f"{statistics.median(cycles):,.0f}", f"{max(cycles):,}") if cycles
                      else ("", "", "")),
                    _point_label(work, best["point"]) if best else "")
    parts: list[Any] = [per, _points_table(work, rows_)]
    bad = [r for r in rows_ if r["status"] == "failed"]
    bad += list({r["point"]: {**r, "workload": "(all)"} for r in rows_ if r["status"] == "invalid"}.values())
    if bad:
        why = Table("point", "workload", "status", "reason", title="points that did not run")
        for r in bad[:REASONS]:
            why.add_row(str(r["point"]), r["workload"], r["status"], str(r["error"]).splitlines()[0])
        if len(bad) > REASONS:
            why.caption = f"{len(bad) - REASONS} more in {CSV}"
        parts.append(why)
    return Group(*parts)


def _points_table(work: Plan, rows_: list[dict[str, Any]]) -> Table:
    labels = [w.label for w in work.workloads]
    by_point: dict[int, dict[str, Any]] = {}
    for r in rows_:
        by_point.setdefault(r["point"], {})[r["workload"]] = r
    order = list(by_point)
    caption = None
    if len(order) > SHOWN:
        first = labels[0]
        order = sorted(order, key=lambda i: (by_point[i][first].get("cycles") is None,
                                             by_point[i][first].get("cycles") or 0, i))[:SHOWN // 2]
        caption = f"the {len(order)} fastest of {len(by_point)} points for {first}; all of them in {CSV}"
    table = Table("point", *(a.name for a in work.axes), *(f"{w} cycles" for w in labels), title="points",
                  caption=caption)
    for i in order:
        cells = by_point[i]
        first = cells[labels[0]]
        table.add_row(str(i), *(str(first.get(a.name)) for a in work.axes),
                      *(f"{cells[w]['cycles']:,}" if cells[w].get("cycles") is not None else cells[w]["status"]
                        for w in labels))
    return table


def _point_label(work: Plan, index: int) -> str:
    point = next(p for p in work.points if p.index == index)
    return f"{index}: {point.label}"

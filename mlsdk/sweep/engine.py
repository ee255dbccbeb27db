"""Planning a sweep (points x workloads) and running what is not done yet, here or on Dask.

Three engines give the same rows: `serial` runs each (point, workload) in this process; the
default starts a Dask `LocalCluster` of worker processes on this machine (one thread each: a
compile is Python and holds the GIL); `scheduler=` submits to a running Dask cluster. Every
task carries its chip as plain data and is computed from nothing else, so where it runs cannot
change its row. Rows reach the store as they finish, in whatever order; the table sorts them.
"""

from __future__ import annotations

import logging
import os
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import hwdesc
from hwdesc import MnsimError
from hwdesc.source import Document

from ..errors import SweepError, SweepSpecError, WorkloadError
from .axes import Axis, expand, parse_path, resolve_axes
from .points import Point, base_data, chosen, derive
from .spec import LoadedSpec, Workload
from .store import RowStore, row_key
from .workloads import measure, workload_hash


@dataclass(frozen=True)
class Task:
    """One workload on one point's chip: everything a worker needs, and nothing of the host."""

    key: str
    point: int
    workload: int  # index into the SPEC's workloads
    chip: dict[str, Any] = field(repr=False)  # the point's description as plain data
    fingerprint: str
    spec: Workload
    folder: str  # the SPEC's folder: scripts and codegen_dirs are relative to it


@dataclass
class Plan:
    """A SPEC resolved against its base chip: the axes, the points drawn, the tasks to run."""

    loaded: LoadedSpec
    axes: list[Axis]
    points: list[Point]
    tasks: list[Task]
    cost: str | None  # the column the Pareto plot puts on x

    @property
    def workloads(self) -> list[Workload]:
        return self.loaded.spec.workloads

    @property
    def invalid(self) -> list[Point]:
        return [p for p in self.points if p.hw is None]


def plan(loaded: LoadedSpec) -> Plan:
    """Derive and validate every point's chip (invalid ones are kept, with their reason) and
    list the (point, workload) tasks; SweepSpecError for problems of the SPEC itself."""
    spec = loaded.spec
    try:
        base = hwdesc.load(loaded.resolve(spec.base) if spec.base.endswith((".yaml", ".yml")) else spec.base)
    except hwdesc.HwDescError as e:
        loaded.fail(("base",), str(e))
    data = base_data(base)
    axes = resolve_axes(loaded, data)
    cost = _cost_column(loaded, axes, data)
    hashes = []
    for i, w in enumerate(spec.workloads):
        try:
            hashes.append(workload_hash(w, loaded.folder))
        except MnsimError as e:
            loaded.fail(("workloads", i), str(e))
    points = [derive(base, data, axes, index) for index in chosen(axes, spec.sample)]
    tasks = []
    for p in points:
        if p.hw is None:
            continue
        chip = p.hw.model_dump(mode="python")
        for w, (workload, h) in enumerate(zip(spec.workloads, hashes)):
            tasks.append(Task(row_key(p.hw.fingerprint, h), p.index, w, chip, p.hw.fingerprint, workload,
                              str(loaded.folder)))
    return Plan(loaded, axes, points, tasks, cost)


def _cost_column(loaded: LoadedSpec, axes: list[Axis], data: dict[str, Any]) -> str | None:
    cost = loaded.spec.cost
    if cost is None or cost in {a.name for a in axes}:
        return cost
    try:
        found = expand(data, parse_path(cost))
    except SweepSpecError as e:
        loaded.fail(("cost",), str(e))
    if isinstance(found, str) or len(found) != 1:
        loaded.fail(("cost",), f"{cost}: {found if isinstance(found, str) else 'names several keys'}; cost names an "
                               f"axis ({', '.join(a.name for a in axes)}) or one YAML path of the chip")
    return cost


def evaluate(task: Task) -> dict[str, Any]:
    """The row of one task. A workload that fails gives a failed row with the reason: one bad
    point never stops a sweep."""
    hw = hwdesc.from_document(Document(data=task.chip, locations={}, provenance={}))
    if hw.fingerprint != task.fingerprint:
        raise WorkloadError(f"point {task.point}: the chip arrived changed (fingerprint {hw.fingerprint}, "
                           f"sent {task.fingerprint})")
    row: dict[str, Any] = {"key": task.key, "fingerprint": task.fingerprint, "chip": hw.name,
                           "workload": task.spec.label}
    try:
        row.update(measure(task.spec, Path(task.folder), hw))
        row["status"] = "ok"
    except MnsimError as e:
        row.update(status="failed", error=f"{type(e).__name__}: {e}")
    except Exception as e:  # a defect of mnsim: kept with where it happened, the sweep goes on
        where = traceback.extract_tb(e.__traceback__)[-1]
        row.update(status="failed", error=f"{type(e).__name__}: {e} (at {Path(where.filename).name}:{where.lineno})")
    return row


def run(work: Plan, store: RowStore, *, engine: str = "local", workers: int | None = None,
        scheduler: str | None = None, on_row: Callable[[dict[str, Any]], None] | None = None) -> int:
    """Compute every task the store lacks with `engine` ("serial", "local" or "dask" with
    `scheduler`), adding each row to the store as it finishes; returns how many were computed."""
    pending = [t for t in work.tasks if t.key not in store]
    if not pending:
        return 0

    def finished(row: dict[str, Any]) -> None:
        store.add(row)
        if on_row is not None:
            on_row(row)

    if engine == "serial":
        for task in pending:
            finished(evaluate(task))
    elif engine in ("local", "dask"):
        _run_dask(pending, finished, workers, scheduler if engine == "dask" else None)
    else:
        raise SweepError(f"engine {engine!r}; expected serial, local or dask")
    return len(pending)


def _run_dask(tasks: list[Task], finished: Callable[[dict[str, Any]], None], workers: int | None,
              scheduler: str | None) -> None:
    from distributed import Client, LocalCluster, as_completed
    cluster = None
    if scheduler is None:
        n = workers or os.cpu_count() or 1
        cluster = LocalCluster(n_workers=n, threads_per_worker=1, processes=True, dashboard_address=None,
                               silence_logs=logging.ERROR)
    client = Client(cluster if cluster is not None else scheduler)
    try:
        futures = client.map(evaluate, tasks, pure=False)
        for future in as_completed(futures):
            finished(future.result())
    finally:
        client.close()
        if cluster is not None:
            cluster.close()

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
import threading
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

import hwdesc
from hwdesc import MnsimError
from hwdesc.source import Document, KeyPath, resolve_name

from ..errors import SweepError, SweepSpecError, WorkloadError
from .axes import Axis, expand, is_number, lookup, parse_path, resolve_axes
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
    cost_key: KeyPath | None = None  # where that column's value is in a point's chip, when not an axis

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
        base = hwdesc.load(resolve_name(spec.base, relative_to=loaded.folder))
    except hwdesc.HwDescError as e:
        loaded.fail(("base",), str(e))
    data = base_data(base)
    axes = resolve_axes(loaded, data)
    cost_key = _cost_key(loaded, axes, data)
    hashes = []
    for i, w in enumerate(spec.workloads):
        try:
            hashes.append(workload_hash(w, loaded.folder))
        except MnsimError as e:
            loaded.fail(("workloads", i), str(e))
    points = [derive(base, data, axes, index) for index in chosen(axes, spec.sample, loaded.fail)]
    tasks = []
    for p in points:
        if p.hw is None:
            continue
        chip = p.hw.model_dump(mode="json")
        for w, (workload, h) in enumerate(zip(spec.workloads, hashes)):
            tasks.append(Task(row_key(p.hw.content_fingerprint, h), p.index, w, chip, p.hw.fingerprint, workload,
                              str(loaded.folder)))
    return Plan(loaded, axes, points, tasks, spec.cost, cost_key)


def _cost_key(loaded: LoadedSpec, axes: list[Axis], data: dict[str, Any]) -> KeyPath | None:
    """Where a cost that is not an axis is in the chip: one key, holding a number."""
    cost = loaded.spec.cost
    if cost is None or cost in {a.name for a in axes}:
        return None
    try:
        found = expand(data, parse_path(cost))
    except SweepSpecError as e:
        loaded.fail(("cost",), str(e))
    if isinstance(found, str) or len(found) != 1 or not is_number(lookup(data, found[0])):
        why = found if isinstance(found, str) else (
            "names several keys" if len(found) != 1 else f"is {lookup(data, found[0])!r}, not a number")
        loaded.fail(("cost",), f"{cost}: {why}; cost names an axis ({', '.join(a.name for a in axes)}) or one "
                               "numeric YAML path of the chip")
    return found[0]


_one_at_a_time = threading.Lock()  # a script's run is process-wide (argv, stdout, device override)


def evaluate(task: Task) -> dict[str, Any]:
    """The row of one task. A workload that fails gives a failed row with the reason: one bad
    point never stops a sweep. Tasks of one process run one at a time (a Dask worker may give
    it several threads), each from torch's defaults, so no task sees another's state."""
    with _one_at_a_time:
        torch.set_grad_enabled(True)
        torch.set_default_dtype(torch.float32)
        try:
            hw = hwdesc.from_document(Document(data=task.chip, locations={}, provenance={}))
            if hw.fingerprint != task.fingerprint:
                raise WorkloadError(f"point {task.point}: the chip arrived changed (fingerprint {hw.fingerprint}, "
                                    f"sent {task.fingerprint})")
            return {**_row(task), **measure(task.spec, Path(task.folder), hw), "status": "ok"}
        except Exception as e:
            return failed_row(task, e)


def _row(task: Task) -> dict[str, Any]:
    return {"key": task.key, "fingerprint": task.fingerprint, "workload": task.spec.label}


def failed_row(task: Task, e: BaseException) -> dict[str, Any]:
    """A task's row when it did not run: the error's type and message; for an error that is not
    one of mnsim's (a defect, or a worker lost), also where it was raised."""
    text = f"{type(e).__name__}: {e}"
    if not isinstance(e, MnsimError) and e.__traceback__ is not None:
        where = traceback.extract_tb(e.__traceback__)[-1]
        text += f" (at {Path(where.filename).name}:{where.lineno})"
    return {**_row(task), "status": "failed", "error": text}


def run(work: Plan, store: RowStore, *, engine: str = "local", workers: int | None = None,
        scheduler: str | None = None, on_row: Callable[[dict[str, Any]], None] | None = None) -> int:
    """Compute every task the store lacks with `engine` ("serial", "local" or "dask" with
    `scheduler`), adding each row to the store as it finishes; returns how many were computed."""
    pending = list({t.key: t for t in work.tasks if t.key not in store}.values())
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
        task_of = {f.key: t for f, t in zip(futures, tasks)}
        for future in as_completed(futures):
            try:
                finished(future.result())
            except Exception as e:  # the worker died or the task could not travel: that task failed
                finished(failed_row(task_of[future.key], e))
    finally:
        client.close()
        if cluster is not None:
            cluster.close()

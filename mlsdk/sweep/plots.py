"""Plots of a sweep (PNG, matplotlib): cycles against each axis, and the Pareto front of cycles
against the SPEC's cost.

Against an axis, every point is drawn (faint) with the median over the other axes as a line,
one colour per workload: the spread at one value is what the other axes do. The Pareto front
takes less as better on both sides (fewer cycles, lower cost): the points no other point beats
on both.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; no display needed
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from .axes import is_number  # noqa: E402
from .engine import Plan  # noqa: E402

CYCLES_PNG, PARETO_PNG = "cycles.png", "pareto.png"


def cycles_by_axis(work: Plan, rows: list[dict[str, Any]], path: Path) -> None:
    ok = [r for r in rows if r["status"] == "ok"]
    n = len(work.axes)
    fig, axes = plt.subplots(1, n, figsize=(4.2 * n, 3.6), squeeze=False, sharey=True)
    for ax, axis in zip(axes[0], work.axes):
        labels = [str(v) for v in axis.values]  # as written: 1, 2, 4 or x0.5, x1, x2
        shown = [axis.column(v) for v in axis.values]  # as the table holds them
        for colour, workload in zip(_colours(), work.workloads):
            mine = [r for r in ok if r["workload"] == workload.label]
            xs = [shown.index(r[axis.name]) for r in mine]
            ax.scatter(xs, [r["cycles"] for r in mine], s=10, alpha=0.3, color=colour)
            medians = [np.median([r["cycles"] for r, x in zip(mine, xs) if x == i]) if i in xs else np.nan
                       for i in range(len(labels))]
            ax.plot(range(len(labels)), medians, marker="o", color=colour, label=workload.label)
        ax.set_xticks(range(len(labels)), labels)
        ax.set_xlabel(axis.name, fontsize=8)
        ax.grid(alpha=0.3)
    cycles = [r["cycles"] for r in ok]
    if cycles and max(cycles) > 10 * min(cycles):  # workloads of different sizes: each stays readable
        axes[0][0].set_yscale("log")
    axes[0][0].set_ylabel("cycles")
    axes[0][0].legend(fontsize=8)
    fig.suptitle(f"{work.loaded.path.name}: cycles against each axis (line: median over the other axes)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def pareto_front(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The (cost, cycles) pairs no other pair beats on both, by increasing cost."""
    front: list[tuple[float, float]] = []
    for cost, cycles in sorted(set(points)):
        if not front or cycles < front[-1][1]:
            front.append((cost, cycles))
    return front


def pareto(work: Plan, rows: list[dict[str, Any]], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for colour, workload in zip(_colours(), work.workloads):
        mine = [(float(r[work.cost]), float(r["cycles"])) for r in rows
                if r["status"] == "ok" and r["workload"] == workload.label and is_number(r.get(work.cost))]
        if not mine:
            continue
        ax.scatter(*zip(*mine), s=12, alpha=0.35, color=colour)
        front = pareto_front(mine)
        ax.step(*zip(*front), where="post", marker="o", color=colour, label=f"{workload.label} (front)")
    ax.set_xlabel(f"{work.cost} (cost)")
    ax.set_ylabel("cycles")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"{work.loaded.path.name}: cycles against {work.cost}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _colours() -> list[str]:
    return plt.rcParams["axes.prop_cycle"].by_key()["color"] * 4

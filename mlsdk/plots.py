"""PNG plots of a report: relocation vs conversion vs host round trip per binding, and unit
utilisation over the session."""

from __future__ import annotations

import os

import matplotlib

matplotlib.use("Agg")  # files only; no display needed
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from .report import Report  # noqa: E402

COLOURS = {"relocation": "tab:green", "conversion": "tab:orange", "host round trip": "tab:red"}


KIND_COLOURS = {"call": "tab:blue", "binding": "tab:orange", "upload": "tab:purple", "download": "tab:brown",
                "load": "tab:gray"}
MAX_RUN_LABELS = 40  # runs labelled on the run strip (the longest ones; the rest are drawn, unlabelled)


def png(report: Report, path: str | os.PathLike) -> None:
    handed_over = report.handovers
    panels = 3 if handed_over else 2
    fig, axes = plt.subplots(panels, 1, figsize=(9, 3.2 * panels + 0.6), squeeze=False)
    if handed_over:
        _bindings(axes[0][0], report, handed_over)
    _runs(axes[-2][0], report)
    _utilisation(axes[-1][0], report)
    fig.suptitle(f"{report.source or 'mnsim'} on {report.chip}: {report.total_cycles:,} cycles "
                 f"({report.time_us:,.1f} us)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _bindings(ax, report: Report, rows) -> None:
    """Per producer -> consumer hand-over, the whole chain (producer call, its bindings, the
    hand-over) each way, as the simulator measured it."""
    x = np.arange(len(rows))
    width = 0.25

    def figures(name: str) -> list[float]:
        return [getattr(b, name) if getattr(b, name) is not None else np.nan for b in rows]
    series = {"relocation": figures("with_constraint"), "conversion": figures("without_constraint"),
              "host round trip": figures("host_round_trip")}
    for k, (name, values) in enumerate(series.items()):
        bars = ax.bar(x + (k - 1) * width, values, width, label=name, color=COLOURS[name])
        ax.bar_label(bars, labels=[f"{v:,.0f}" if not np.isnan(v) else "n/a" for v in values], fontsize=7)
    ax.set_xticks(x, [f"{h.producer} -> {', '.join(dict.fromkeys(h.consumers))}" for h in rows], fontsize=8)
    ax.set_xlim(-0.6, len(rows) - 0.4)
    ax.set_ylabel("chain cycles")
    ax.set_title("a producer's output handed to a consumer, whole chain: relocation (producer constrained) vs "
                 "conversion vs host round trip", fontsize=9)
    ax.legend(fontsize=8)


def run_labels(report: Report) -> list[str]:
    """Each run as "kind: what", with its Context when the same name ran in several Contexts."""
    contexts: dict[str, set[str]] = {}
    for r in report.runs:
        contexts.setdefault(r.what, set()).add(r.context)
    return [f"{r.kind}: {r.what}" + (f" ({r.context})" if len(contexts[r.what]) > 1 and r.context else "")
            for r in report.runs]


def _runs(ax, report: Report) -> None:
    """The device runs one after another (uploads, calls, conversions, downloads), each labelled."""
    scale = 1e6 / report.clock_hz
    labels = run_labels(report)
    labelled = set(sorted(range(len(report.runs)), key=lambda i: -report.runs[i].cycles)[:MAX_RUN_LABELS])
    for i, r in enumerate(report.runs):
        ax.barh(i % 2, r.cycles * scale, left=r.start_cycle * scale, height=0.8,
                color=KIND_COLOURS.get(r.kind, "tab:olive"), edgecolor="white", linewidth=0.3)
        if i in labelled:
            ax.text((r.start_cycle + r.cycles / 2) * scale, i % 2, labels[i], ha="center", va="center",
                    fontsize=6, rotation=90 if r.cycles < report.total_cycles / 8 else 0, clip_on=True)
    ax.set_yticks([])
    ax.set_xlim(0, max(report.total_cycles, 1) * scale)
    ax.set_xlabel("simulated time (us)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in KIND_COLOURS.values()]
    ax.legend(handles, list(KIND_COLOURS), fontsize=7, ncol=len(KIND_COLOURS), loc="upper right")
    ax.set_title("device runs in order (binding: an input's upload, conversion or host round trip)", fontsize=9)


def _utilisation(ax, report: Report) -> None:
    """Busy fraction per unit and time slice, as a heat map (one row per unit)."""
    units = list(report.timeline)
    if not units:  # nothing ran
        ax.text(0.5, 0.5, "no device runs", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        return
    grid = np.array([report.timeline[u] for u in units]) * 100
    end_us = len(grid[0]) * report.timeline_slice_cycles / report.clock_hz * 1e6 if len(grid) else 1
    im = ax.imshow(grid, aspect="auto", interpolation="nearest", cmap="viridis", vmin=0, vmax=100,
                   extent=(0, end_us, len(units) - 0.5, -0.5))
    ax.set_yticks(range(len(units)), units, fontsize=8)
    ax.set_xlabel("simulated time (us)")
    for run in report.runs:  # where each device run starts
        ax.axvline(run.start_cycle / report.clock_hz * 1e6, color="white", linewidth=0.5, alpha=0.6)
    ax.set_title("unit utilisation over the session (white lines: start of each device run)", fontsize=9)
    ax.figure.colorbar(im, ax=ax, label="busy (%)", pad=0.01)

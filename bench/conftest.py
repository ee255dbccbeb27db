"""Helpers for benchmarks that report ratios against a baseline measured in the same run.

Absolute times on a shared two-core machine mean little; a ratio against a baseline that does
comparable work (numpy copying the same bytes, torch computing the same result) run in the same
process moments earlier is what we compare between commits. Each benchmark stores its ratio in
`benchmark.extra_info`, which `pytest bench/ --benchmark-only --benchmark-json=out.json` keeps.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def baseline_seconds(fn: Callable[[], object], *, rounds: int = 15, warmup: int = 2) -> float:
    """Median wall time of `fn` over `rounds` calls after `warmup` calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def record_ratio(benchmark, name: str, baseline: float, **extra: object) -> float:
    """Store median(benchmark) / baseline under `name` and return it."""
    ratio = benchmark.stats.stats.median / baseline
    benchmark.extra_info[name] = round(ratio, 3)
    benchmark.extra_info[f"{name}_baseline_s"] = baseline
    benchmark.extra_info.update(extra)
    return ratio

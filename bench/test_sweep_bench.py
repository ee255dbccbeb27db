"""Design-space sweeps: the 64-point sweep of the transformer block (examples/sweep_transformer.yaml:
DRAM rate x L2BM rate x Groups on MN-Core 2, timing mode), as `mnsim sweep` runs it.

* two local Dask workers against one, both timed here from a fresh results folder, cluster
  start included: `speedup` is one worker's wall time over two workers' (target >= 1.6 on this
  2-core machine), with points per minute for each;
* the two-worker sweep against running its points one by one, each in a new Python process
  (a one-point SPEC per process, as a user without the sweep would run them): `speedup`.

MNSIM_BENCH_SWEEP_POINTS=N draws a seeded sample of N points instead of all 64, for a quick look.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from mlsdk.sweep import RowStore, load_spec, plan, run
from mlsdk.sweep.axes import Factor

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "sweep_transformer.yaml"
ROOT = EXAMPLE.parents[1]
_walls: dict[str, float] = {}  # engine -> wall seconds, shared by the two benchmarks


def spec_data() -> dict:
    data = yaml.safe_load(EXAMPLE.read_text())
    if os.environ.get("MNSIM_BENCH_SWEEP_POINTS"):
        data["sample"] = {"random": int(os.environ["MNSIM_BENCH_SWEEP_POINTS"]), "seed": 0}
    return data


@pytest.fixture(scope="module")
def spec(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("sweep") / "sweep_transformer.yaml"
    path.write_text(yaml.safe_dump(spec_data(), sort_keys=False))
    return path


def sweep_seconds(spec: Path, out: Path, workers: int) -> float:
    work = plan(load_spec(spec))
    start = time.perf_counter()
    computed = run(work, RowStore(out, fresh=True), engine="local", workers=workers)
    assert computed == len(work.tasks)
    return time.perf_counter() - start


def two_workers(spec: Path) -> float:
    if "local2" not in _walls:
        _walls["local2"] = sweep_seconds(spec, spec.parent / "two", 2)
    return _walls["local2"]


def test_sweep_two_workers_against_one(benchmark, spec):
    points = len(plan(load_spec(spec)).tasks)
    one = sweep_seconds(spec, spec.parent / "one", 1)
    benchmark.pedantic(lambda: two_workers(spec), rounds=1, iterations=1)
    two = _walls["local2"]
    benchmark.extra_info.update(points=points, one_worker_s=round(one, 1), two_workers_s=round(two, 1),
                                one_worker_points_per_min=round(points / one * 60, 1),
                                two_workers_points_per_min=round(points / two * 60, 1), speedup=round(one / two, 2))
    print(f"\n{points}-point sweep: 1 worker {one:.0f} s ({points / one * 60:.1f} points/min), 2 workers {two:.0f} s "
          f"({points / two * 60:.1f} points/min): {one / two:.2f}x")


def test_sweep_against_one_process_per_point(benchmark, spec):
    work = plan(load_spec(spec))
    base = yaml.safe_load(spec.read_text())
    base.pop("sample", None)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def one_by_one() -> None:
        for point in work.points:
            data = copy.deepcopy(base)
            for axis, value in point.settings:
                given = data["axes"][axis.name]
                one = [str(value) if isinstance(value, Factor) else value]  # as the SPEC writes it
                if isinstance(given, dict):
                    given["values"] = one
                else:
                    data["axes"][axis.name] = one
            single = spec.parent / f"point{point.index}.yaml"
            single.write_text(yaml.safe_dump(data, sort_keys=False))
            subprocess.run([sys.executable, "-m", "mlsdk.cli", "sweep", str(single), "--serial", "--no-plots",
                            "--out", str(spec.parent / f"point{point.index}")], env=env, check=True,
                           stdout=subprocess.DEVNULL)
    start = time.perf_counter()
    benchmark.pedantic(one_by_one, rounds=1, iterations=1)
    separate = time.perf_counter() - start
    sweep = two_workers(spec)
    benchmark.extra_info.update(points=len(work.points), processes_s=round(separate, 1), sweep_s=round(sweep, 1),
                                speedup=round(separate / sweep, 2))
    print(f"\n{len(work.points)} points one process each: {separate:.0f} s; the sweep on 2 workers: {sweep:.0f} s "
          f"({separate / sweep:.2f}x)")

"""`mnsim sweep`: SPECs, the variant chips of their points, engines that agree, resuming.

Compiling sweeps run on the `mini` chip with the suite's smallest programs; a module-scoped
serial run is the reference every engine and every resumed run must reproduce exactly.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
import pytest

import hwdesc
from mlsdk import Context, MNDevice
from mlsdk.cli import main
from mlsdk.sweep import SweepSpecError, load_spec, plan, run
from mlsdk.sweep import table
from mlsdk.sweep.engine import evaluate
from mlsdk.sweep.plots import pareto_front
from mlsdk.sweep.store import RowStore
from mlsdk.sweep.suite import MODELS

# Groups: 3 is not a power of two (an invalid point); DRAM: the memory and its DE-side rates.
SPEC = """\
base: mini
axes:
  levels.Group.count: [1, 2, 3]
  dram_rate:
    paths: [memories.DRAM.lw_per_cycle, "transfers.dram_to_l2bm.modes.*.src_lw_per_cycle"]
    values: [x0.5, x1, x2, x4]
workloads:
  - program: two_matmuls
cost: levels.Group.count
"""


def write_spec(folder: Path, text: str = SPEC, name: str = "spec.yaml") -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(text))
    return path


def sweep_table(spec: Path, out: Path, **engine) -> tuple[object, int]:
    work = plan(load_spec(spec))
    store = RowStore(out)
    computed = run(work, store, **engine)
    return table.to_arrow(work, table.rows(work, store)), computed


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The SPEC run serially from scratch: its table, and the folder it ran in."""
    folder = tmp_path_factory.mktemp("sweep")
    spec = write_spec(folder)
    result, computed = sweep_table(spec, folder / "serial", engine="serial")
    assert computed == 8  # 12 points, the 4 with 3 Groups invalid
    return result, spec


# ---- SPEC errors: the SPEC's file and line ----------------------------------------------------


@pytest.mark.parametrize("text, line, message", [
    ("base: mini\naxes: {levels.Group.count: [1]}\nworkloads: [{program: mlp}]\nsampel: grid\n", 4,
     "unknown key 'sampel'"),
    ("base: mini\naxes:\n  levels.Grup.count: [1, 2]\nworkloads: [{program: mlp}]\n", 3,
     "the base chip has no 'Grup' under levels (keys there: Group, L2B, L1B, MAB, PE)"),
    ("base: mini\naxes:\n  levels.Group: [1, 2]\nworkloads: [{program: mlp}]\n", 3,
     "levels.Group is a mapping in the base chip"),
    ("base: mini\naxes:\n  name: [x2]\nworkloads: [{program: mlp}]\n", 3, "a factor (x...) multiplies a number"),
    ("base: mini\naxes:\n  levels..count: [1]\nworkloads: [{program: mlp}]\n", 3, "is not a dotted YAML path"),
    ("base: mini\naxes: {levels.Group.count: [1]}\nworkloads:\n  - {program: mlp, script: a.py}\n", 4,
     "exactly one of program, script, codegen_dir"),
    ("base: mini\naxes:\n  a: {paths: [memories.DRAM.lw_per_cycle], values: [x2]}\n  memories.DRAM.lw_per_cycle: [1]\n"
     "workloads: [{program: mlp}]\n", 4, "memories.DRAM.lw_per_cycle is also set by axis 'a'"),
    ("base: mini\naxes: {levels.Group.count: [1]}\nworkloads: [{program: mlp}]\ncost: levels.Group.size\n", 4,
     "the base chip has no 'size' under levels.Group"),
    ("base: nosuchchip\naxes: {levels.Group.count: [1]}\nworkloads: [{program: mlp}]\n", 1,
     "no hardware description named 'nosuchchip'"),
    ("base: mini\naxes: {levels.Group.count: [1]}\nworkloads:\n  - {script: missing.py}\n", 4,
     "cannot read the script"),
    ("base: mini\naxes: {levels.Group.count: [1]}\nworkloads:\n  - {program: mlp}\n  - {program: mlp}\n", 5,
     "a second workload named 'mlp'"),
    ("base: mini\naxes:\n  levels.Group.count: [2, x2]\nworkloads: [{program: mlp}]\n", 3,
     "the value 'x2' is given twice (as 2)"),
    ("base: mini\naxes: {levels.Group.count: [1]}\nworkloads: [{program: mlp}]\n"
     "cost: transfers.host_to_pdm.modes.*.src_lw_per_cycle\n", 4, None),
    ("base: mini\naxes: {levels.Group.count: [1]}\nworkloads: [{program: mlp}]\ncost: host_link.kind\n", 4,
     "host_link.kind: is 'PCIe Gen5 x16', not a number"),
])
def test_spec_errors_name_the_spec_line(tmp_path, text, line, message):
    spec = write_spec(tmp_path, text)
    if message is None:  # a valid SPEC among the invalid ones: a wildcard cost that names one key
        work = plan(load_spec(spec))
        assert work.cost_key == ("transfers", "host_to_pdm", "modes", "individual", "src_lw_per_cycle")
        assert table.rows(work, RowStore(tmp_path / "none"))[0][work.cost] == 8.0
        return
    with pytest.raises(SweepSpecError) as e:
        plan(load_spec(spec))
    assert f"{spec}:{line}:" in str(e.value) and message in str(e.value)


def test_a_huge_grid_is_refused_before_anything_runs(tmp_path):
    axes = "\n".join(f"  hazards.{k}: [{', '.join(map(str, range(1, 17)))}]" for k in
                     ("lm_write_to_read", "grf_write_to_read", "alu_result_to_use", "l1bm_reduce_to_read",
                      "l2bm_write_to_mv_read"))
    spec = write_spec(tmp_path, f"base: mini\naxes:\n{axes}\nworkloads: [{{program: mlp}}]\n")
    with pytest.raises(SweepSpecError, match=r"1,048,576 points .* sample: \{random: N"):
        plan(load_spec(spec))


# ---- points and their chips -------------------------------------------------------------------


def test_points_write_their_values_into_the_chip(tmp_path):
    work = plan(load_spec(write_spec(tmp_path)))
    mini = hwdesc.load("mini")
    assert [p.index for p in work.points] == list(range(12))
    p = work.points[6]  # grid order, the last axis fastest: Groups 2, DRAM x2
    assert p.values == {"levels.Group.count": 2, "dram_rate": 2.0}
    assert p.hw.levels["Group"].count == 2 and isinstance(p.hw.levels["Group"].count, int)
    assert p.hw.memories["DRAM"].lw_per_cycle == pytest.approx(2 * mini.memories["DRAM"].lw_per_cycle)
    for mode, rates in p.hw.transfers["dram_to_l2bm"].modes.items():  # every mode of the wildcard
        assert rates.src_lw_per_cycle == 2 * mini.transfers["dram_to_l2bm"].modes[mode].src_lw_per_cycle
        assert rates.dst_lw_per_cycle == mini.transfers["dram_to_l2bm"].modes[mode].dst_lw_per_cycle
    assert p.hw.name == "mini[levels.Group.count=2, dram_rate=x2]"


def test_an_invalid_point_is_reported_with_its_yaml_path_and_skipped(tmp_path):
    work = plan(load_spec(write_spec(tmp_path)))
    bad = work.invalid
    assert [p.index for p in bad] == [8, 9, 10, 11]
    assert bad[0].error.startswith("levels.Group.count: 3 is not a power of two")
    assert ".yaml" not in bad[0].error  # the chip was derived in memory: no file to name
    assert {t.point for t in work.tasks} == set(range(8))


def test_random_samples_are_seeded_subsets_that_keep_grid_numbers(tmp_path):
    def drawn(sample: str) -> list[int]:
        spec = SPEC.replace("cost: levels.Group.count", sample)
        return [p.index for p in plan(load_spec(write_spec(tmp_path, spec))).points]
    a, b = drawn("sample: {random: 3, seed: 7}"), drawn("sample: {random: 3, seed: 7}")
    assert a == b and len(set(a)) == 3 and set(a) <= set(range(12))
    assert drawn("sample: {random: 100}") == list(range(12))  # more than the grid: the grid


def test_axes_reach_list_items_and_factors_round_to_integers(tmp_path):
    spec = "base: mncore2\naxes:\n  clock_hz: [x1.1]\nworkloads: [{program: mlp}]\n"
    point = plan(load_spec(write_spec(tmp_path, spec))).points[0]  # 750 MHz x 1.1 is 825000000.0000001
    assert point.error is None and point.hw.clock_hz == 825_000_000
    spec = "base: mncore2\naxes:\n  host_link.groups[0]: [1]\nworkloads: [{program: mlp}]\n"
    assert plan(load_spec(write_spec(tmp_path, spec))).points[0].hw.host_link.groups == (1,)


def test_factors_keep_integers_integers(tmp_path):
    spec = "base: mncore2\naxes:\n  levels.Group.count: [x0.5, x0.75, x0.3]\nworkloads: [{program: mlp}]\n"
    half, three_quarters, fraction = plan(load_spec(write_spec(tmp_path, spec))).points
    assert half.hw.levels["Group"].count == 2
    assert three_quarters.error.startswith("levels.Group.count: 3 is not a power of two")  # 3, an int
    assert fraction.error.startswith("levels.Group.count: expected a valid integer")  # 1.2: no chip


# ---- running: values against a direct run, engines, resuming ----------------------------------


def test_rows_are_the_cycles_of_the_same_chip_run_directly(reference, tmp_path):
    result, _ = reference
    rows = result.to_pylist()
    # point 2: Groups 1, DRAM x2 -- the same chip written as a YAML file and run through mlsdk
    mini = hwdesc.load("mini")
    rates = {m: r.src_lw_per_cycle * 2 for m, r in mini.transfers["dram_to_l2bm"].modes.items()}
    variant = tmp_path / "fast.yaml"
    variant.write_text("extends: mini\nname: fast\nmemories:\n  DRAM: {lw_per_cycle: %r}\n"
                       "transfers:\n  dram_to_l2bm:\n    modes:\n%s" % (
                           mini.memories["DRAM"].lw_per_cycle * 2,
                           "".join(f"      {m}: {{src_lw_per_cycle: {v!r}}}\n" for m, v in rates.items())))
    fn, inputs = MODELS["two_matmuls"]()
    ctx = Context(MNDevice(str(variant)))
    ctx.compile(fn, inputs, None, options={"simulation_mode": "timing"})(inputs)
    direct = ctx.report()
    row = rows[2]
    assert (row["point"], row["status"]) == (2, "ok")
    assert row["cycles"] == direct.total_cycles
    assert row["bytes.dram_to_l2bm"] == direct.paths["dram_to_l2bm"]
    assert row["busy.PE stream"] == next(u.busy_cycles for u in direct.units if u.unit == "PE stream")
    layouts = json.loads(row["layouts"])
    assert any(k.endswith(".out.y") for k in layouts) and all("/" in v for v in layouts.values())
    # more DRAM bandwidth never costs cycles; two Groups add their Data Engines' columns
    for groups in (0, 4):
        cycles = [r["cycles"] for r in rows[groups:groups + 4]]
        assert cycles == sorted(cycles, reverse=True)
    assert rows[0]["busy.Data Engine 1"] is None and rows[4]["busy.Data Engine 1"] is not None
    assert [r["status"] for r in rows[8:]] == ["invalid"] * 4


def test_two_local_dask_workers_give_the_serial_table(reference):
    result, spec = reference
    dasked, computed = sweep_table(spec, spec.parent / "dask", engine="local", workers=2)
    assert computed == 8
    assert dasked.equals(result)


def test_resuming_after_a_kill_computes_only_the_missing_points(reference):
    result, spec = reference
    out = spec.parent / "killed"
    rows_file = out / "rows.jsonl"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    log = spec.parent / "killed.log"
    proc = subprocess.Popen([sys.executable, "-m", "mlsdk.cli", "sweep", str(spec), "--serial", "--out", str(out),
                             "--no-plots"], env=env, stdout=subprocess.DEVNULL, stderr=open(log, "w"))
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if rows_file.exists() and rows_file.read_text().count("\n") >= 1:
                break
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait()
    done = rows_file.read_text().count("\n")
    assert 1 <= done < 8, f"the sweep was not killed midway ({done} rows): {log.read_text()[-2000:]}"
    with open(rows_file, "a") as f:
        f.write('{"key": "torn')  # a kill in the middle of a write
    resumed, computed = sweep_table(spec, out, engine="serial")
    assert computed == 8 - done
    assert rows_file.read_text().count("\n") == 8  # the torn line dropped, nothing computed twice
    assert resumed.equals(result)
    assert sweep_table(spec, out, engine="serial")[1] == 0  # all done: nothing to compute


def test_a_changed_chip_or_workload_is_recomputed(reference, tmp_path):
    _, spec = reference
    out = spec.parent / "serial"  # the reference's own rows
    grown = write_spec(tmp_path, SPEC.replace("values: [x0.5, x1, x2, x4]", "values: [x4, x2, x1, x0.5, x8]")
                       .replace("dram_rate", "dram"))
    assert sweep_table(grown, out, engine="serial")[1] == 2  # only the new x8 points (Groups 1 and 2): the
    # others kept their rows through the axis' new name and order
    other = write_spec(tmp_path, SPEC.replace("two_matmuls", "two_matmuls\n    name: again\n    mode: both"),
                       "other.yaml")
    work = plan(load_spec(other))
    assert not any(t.key in RowStore(out) for t in work.tasks)  # another mode: another workload hash


# ---- workloads: scripts and codegen_dirs ------------------------------------------------------


SCRIPT = """\
import sys
import torch
from mlsdk import Context, MNDevice
ctx = Context(MNDevice("mncore2"))
f = ctx.compile(lambda d: {"y": d["x"] * 2 + 1}, {"x": torch.ones(16, 32)}, None)
out = f({"x": torch.ones(16, 32)})
if "--read" in sys.argv:
    print(out["y"].cpu().sum())
"""


def test_script_workloads_run_on_each_chip_and_say_when_they_need_values(tmp_path):
    (tmp_path / "script.py").write_text(SCRIPT)
    spec = write_spec(tmp_path, """\
        base: mini
        axes: {memories.DRAM.lw_per_cycle: [x1]}
        workloads:
          - {script: script.py, name: plain}
          - {script: script.py, args: [--read], name: reads}
          - {script: script.py, args: [--read], mode: both, name: reads_both}
        """)
    result, _ = sweep_table(spec, tmp_path / "out", engine="serial")
    rows = {r["workload"]: r for r in result.to_pylist()}
    assert rows["plain"]["status"] == "ok" and rows["plain"]["chip"].startswith("mini[")  # not the script's mncore2
    assert rows["reads"]["status"] == "failed" and "give the workload mode: both" in rows["reads"]["error"]
    assert rows["reads_both"]["status"] == "ok"
    assert rows["reads_both"]["cycles"] > rows["plain"]["cycles"]  # it also downloads y


def test_codegen_dir_workloads_are_timed_as_compiled_and_refused_where_they_cannot_run(tmp_path):
    fn, inputs = MODELS["two_matmuls"]()
    Context(MNDevice("mini")).compile(fn, inputs, tmp_path / "prog")
    spec = write_spec(tmp_path, """\
        base: mini
        axes:
          hazards.lm_write_to_read: [x1, x8]
          memories.DRAM.lw_per_cycle: [x0.25, x1]
        workloads: [{codegen_dir: prog}]
        """)
    rows = sweep_table(spec, tmp_path / "out", engine="serial")[0].to_pylist()
    ok = [r for r in rows if r["hazards.lm_write_to_read"] == 1]
    assert [r["status"] for r in ok] == ["ok", "ok"] and ok[0]["cycles"] > ok[1]["cycles"]
    assert json.loads(ok[0]["layouts"]) == json.loads(ok[1]["layouts"])  # a fixed program: fixed layouts
    refused = [r for r in rows if r["hazards.lm_write_to_read"] == 8]  # its nops are too few there
    assert refused and all(r["status"] == "failed" and "lm_write_to_read" in r["error"]
                           and "A codegen_dir is a fixed program" in r["error"] for r in refused)


# ---- the command ------------------------------------------------------------------------------


def test_the_command_writes_csv_parquet_and_plots(reference, capsys):
    result, spec = reference
    out = spec.parent / "serial"  # resumes the reference: nothing to compute
    assert main(["sweep", str(spec), "--serial", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "0 to compute, 8 already in" in text and "3 is not a power of two" in text
    assert pq.read_table(out / "sweep.parquet").equals(result)
    csv = pa_csv.read_csv(out / "sweep.csv")
    assert csv.column("cycles").to_pylist() == result.column("cycles").to_pylist()
    assert (out / "cycles.png").stat().st_size > 10_000 and (out / "pareto.png").stat().st_size > 10_000
    assert main(["sweep", str(spec), "--dry-run", "--out", str(spec.parent / "dry")]) == 0
    counts = r"two_matmuls\s*│\s*{}\s*│\s*0\s*│\s*4\s*│\s*{}\s*│"  # ok, failed, invalid, pending
    assert re.search(counts.format(0, 8), capsys.readouterr().out) and not (spec.parent / "dry").exists()
    kept = (out / "rows.jsonl").read_text()
    assert main(["sweep", str(spec), "--dry-run", "--fresh", "--out", str(out)]) == 0  # reads, never deletes
    assert re.search(counts.format(8, 0), capsys.readouterr().out)
    assert (out / "rows.jsonl").read_text() == kept


def test_bad_options_and_specs_are_errors_of_the_command(tmp_path, capsys):
    assert main(["sweep", str(tmp_path / "none.yaml")]) == 1
    assert "no file" in capsys.readouterr().err
    assert main(["sweep", str(write_spec(tmp_path)), "--workers", "0"]) == 1
    assert "--workers 0" in capsys.readouterr().err


def test_pareto_front():
    assert pareto_front([(1, 50), (2, 40), (2, 45), (4, 40), (4, 10), (8, 20)]) == [(1, 50), (2, 40), (4, 10)]


def test_tasks_evaluated_from_several_threads_give_their_own_rows(reference):
    """A Dask worker may run tasks in several threads: each still gets its own chip's cycles."""
    result, spec = reference
    tasks = plan(load_spec(spec)).tasks[:4]
    with ThreadPoolExecutor(4) as pool:
        rows = list(pool.map(evaluate, tasks))
    expected = {r["point"]: r["cycles"] for r in result.to_pylist()}
    assert [r["cycles"] for r in rows] == [expected[t.point] for t in tasks]
    assert len(set(expected[t.point] for t in tasks)) > 1  # the points differ, so a mix-up would show

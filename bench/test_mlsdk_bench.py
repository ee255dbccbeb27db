"""End-to-end speed of MLSDK programs on the simulator, and the relocation savings table.

* the seed example (compile + run) in this process, against the same script on pfvm:cpu
  (torch running the traced graph) in the same run; and in a fresh process with an empty and a
  filled numba cache (the difference is the first-call JIT cost);
* the ResNet-50 conv2_x 3x3 layer end to end against torch's conv2d, and timing-only in a new
  process (import, compile, one call);
* a 1024^3 float32 product and a 16M-element add compiled through mlsdk, end to end with `.cpu()`,
  against torch computing the same on this CPU;
* what handing a tensor from a producer to a consumer costs, from 4 KiB to 16 MiB: relocation,
  a DRAM-to-DRAM copy between equal layouts, a conversion from row-major, and a round trip
  through the host. Written to bench/out/relocation_sweep.csv and .png.
"""

from __future__ import annotations

import csv
import os
import runpy
import subprocess
import sys
import time
from pathlib import Path

import torch

import hwdesc
from compiler.convert import build_conversion
from compiler.iospec import IOSpec
from compiler.layout.candidates import candidates
from mlsdk import Context, MNDevice
from sim import Machine

from .conftest import baseline_seconds, record_ratio

REPO = Path(__file__).resolve().parents[1]
SEED = REPO / "examples" / "io_spec_constraints.py"
OUT = REPO / "bench" / "out"
# Up to 16 MiB: the conversion from row-major is a gather of single long words, whose program for
# 64 MiB takes about 20 GB of host memory to build (and the OOM killer ends the bench run).
SWEEP_KIB = (4, 16, 64, 256, 1024, 4096, 16384)


def run_seed(device: str) -> None:
    argv = sys.argv
    sys.argv = [str(SEED), "--device", device]
    try:
        runpy.run_path(str(SEED), run_name="__main__")
    finally:
        sys.argv = argv


def test_seed_end_to_end_warm(benchmark, capsys):
    """Compile both functions and run the chain, numba kernels already compiled."""
    run_seed("mncore2:auto")
    baseline = baseline_seconds(lambda: run_seed("pfvm:cpu"), rounds=5, warmup=1)
    benchmark.pedantic(run_seed, args=("mncore2:auto",), rounds=5, iterations=1, warmup_rounds=1)
    ratio = record_ratio(benchmark, "ratio_vs_pfvm_cpu", baseline)
    capsys.readouterr()
    with capsys.disabled():
        print(f"\nseed end to end on mncore2: {benchmark.stats.stats.median:.2f} s, {ratio:.1f}x the same script "
              f"on pfvm:cpu ({baseline:.2f} s)")


SEED_IN_PROCESS = f"""
import runpy, sys, time
start = time.perf_counter()
sys.argv = [{str(SEED)!r}, "--device", "mncore2:auto"]
runpy.run_path(sys.argv[0], run_name="__main__")
print(time.perf_counter() - start)
"""


def test_seed_end_to_end_cold(benchmark, tmp_path):
    """A new process (imports, compile, run): with an empty numba cache, then with it filled."""
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba")}

    def run() -> float:
        out = subprocess.run([sys.executable, "-c", SEED_IN_PROCESS], env=env, capture_output=True, text=True,
                             check=True, cwd=tmp_path)
        return float(out.stdout.strip().splitlines()[-1])

    cold = run()
    warm = benchmark.pedantic(run, rounds=2, iterations=1)
    benchmark.extra_info.update(cold_s=round(cold, 2), warm_s=round(warm, 2), jit_s=round(cold - warm, 2))
    print(f"\nseed in a new process: {cold:.1f} s with an empty numba cache, {warm:.1f} s with it filled "
          f"(JIT {cold - warm:.1f} s)")


def test_resnet_conv2_x_3x3_vs_torch(benchmark):
    """ResNet-50 conv2_x 3x3: input 1x64x56x56, 64 filters 3x3, stride 1, padding 1, weights
    registered (device-resident). One call = upload the input, run, download the output."""
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(64, 64, 3, stride=1, padding=1, bias=False)
    ctx = Context(MNDevice("mncore2:auto"))
    ctx.registry.register("conv", conv)
    x = torch.randn(1, 64, 56, 56)
    start = time.perf_counter()
    fn = ctx.compile(lambda d: {"y": conv(d["x"])}, {"x": x}, None)
    compile_s = time.perf_counter() - start
    first = fn({"x": x})["y"].cpu()
    with torch.no_grad():
        expected = conv(x)
        assert torch.allclose(first, expected, atol=1e-4)
        baseline = baseline_seconds(lambda: conv(x))
    benchmark.pedantic(lambda: fn({"x": x})["y"].cpu(), rounds=5, iterations=1)
    call = ctx.session.calls[-1].stats
    hw = ctx.device.hw
    mode = hw.units["MAU"].matrix["float32"]
    peak_flops_per_cycle = 2 * mode.rows * mode.cols * hw.instances("MAB")
    flops = 2 * 56 * 56 * 64 * 64 * 9
    ratio = record_ratio(benchmark, "ratio_vs_torch", baseline, compile_s=round(compile_s, 2),
                         simulated_cycles=call.total_cycles,
                         simulated_us=round(call.total_cycles / hw.clock_hz * 1e6, 1),
                         fraction_of_mau_peak=round(flops / (call.total_cycles * peak_flops_per_cycle), 5))
    print(f"\nconv2_x 3x3: simulator / torch = {ratio:.0f}x; compile {compile_s:.1f} s; {call.total_cycles:,} simulated "
          f"cycles ({flops / (call.total_cycles * peak_flops_per_cycle):.2%} of the MAU fp32 peak)")


CONV2_X_TIMING_ONLY = """
import time
start = time.perf_counter()
import torch
from mlsdk import Context, MNDevice
conv = torch.nn.Conv2d(64, 64, 3, stride=1, padding=1, bias=False)
ctx = Context(MNDevice("mncore2:auto"))
ctx.registry.register("conv", conv)
x = torch.randn(1, 64, 56, 56)
fn = ctx.compile(lambda d: {"y": conv(d["x"])}, {"x": x}, None, options={"simulation_mode": "timing"})
fn({"x": x})
print(ctx.session.calls[-1].stats.total_cycles, time.perf_counter() - start)
"""


def test_resnet_conv2_x_timing_only_new_process(benchmark, tmp_path):
    """What a chip-variant sweep pays per point: a new process imports mlsdk, compiles conv2_x and
    times one call without computing values (numba kernels cached by an earlier run)."""
    def run() -> tuple[int, float]:
        out = subprocess.run([sys.executable, "-c", CONV2_X_TIMING_ONLY], capture_output=True, text=True,
                             check=True, cwd=tmp_path)
        cycles, seconds = out.stdout.split()
        return int(cycles), float(seconds)

    run()  # fills the numba cache if this checkout has not yet
    inside: list[float] = []  # what the process measured itself, from before `import torch`

    def timed() -> int:
        cycles, seconds = run()
        inside.append(seconds)
        return cycles
    cycles = benchmark.pedantic(timed, rounds=3, iterations=1)
    benchmark.extra_info.update(simulated_cycles=cycles, inside_process_s=round(sorted(inside)[1], 2))
    print(f"\nconv2_x timing-only in a new process: {benchmark.stats.stats.median:.2f} s the whole process "
          f"(start to exit), {sorted(inside)[1]:.2f} s inside it (import, compile, one call); {cycles:,} cycles")


def _end_to_end_vs_torch(benchmark, fn, inputs: dict, reference, label: str) -> float:
    """Median of calls with `.cpu()` against `reference()` (torch on this CPU), after a checked call."""
    out = fn(inputs)
    name = next(iter(out))
    torch.testing.assert_close(out[name].cpu(), reference(), rtol=1e-4, atol=1e-3)
    baseline = baseline_seconds(reference, rounds=10)
    benchmark.pedantic(lambda: fn(inputs)[name].cpu(), rounds=3, iterations=1, warmup_rounds=1)
    ratio = record_ratio(benchmark, "ratio_vs_torch", baseline, simulated_cycles=fn.last_cycles)
    print(f"\n{label}: {benchmark.stats.stats.median:.2f} s per call, {ratio:.1f}x torch ({baseline * 1e3:.1f} ms)")
    return ratio


def test_matmul_1024_compiled_vs_torch(benchmark):
    """1024^3 float32, compiled through mlsdk: upload both operands, run, download the product."""
    torch.manual_seed(0)
    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    ctx = Context(MNDevice("mncore2:auto"))
    fn = ctx.compile(lambda d: {"c": d["a"] @ d["b"]}, {"a": a, "b": b}, None)
    _end_to_end_vs_torch(benchmark, fn, {"a": a, "b": b}, lambda: a @ b, "1024^3 product through mlsdk")


def test_add_16m_compiled_vs_torch(benchmark):
    """A 4096x4096 float32 add, compiled through mlsdk: two uploads, the add, one download."""
    torch.manual_seed(0)
    x, y = torch.randn(4096, 4096), torch.randn(4096, 4096)
    ctx = Context(MNDevice("mncore2:auto"))
    fn = ctx.compile(lambda d: {"z": d["x"] + d["y"]}, {"x": x, "y": y}, None)
    _end_to_end_vs_torch(benchmark, fn, {"x": x, "y": y}, lambda: x + y, "16M-element add through mlsdk")


def sweep_row(ctx: Context, kib: int) -> dict:
    """One tensor size: the seed's chain at that size, through the runtime."""
    hw = ctx.device.hw
    n = kib * 1024 // 4
    cols = min(n, 1024)
    x = torch.randn(n // cols, cols)
    consumer = ctx.compile(lambda d: {"r": d["s"] + 1}, {"s": x}, None)
    producer = ctx.compile(lambda d: {"s": d["x"] * 2}, {"x": x}, None,
                           io_spec_constraints={"s": consumer.input_specs["s"]})
    result = consumer(producer({"x": x}))["r"].cpu()
    assert torch.allclose(result, x * 2 + 1)
    binding = ctx.session.calls[-1].bindings[0]
    assert binding.path == "relocation"
    handover = binding.handover  # whole chain each way, simulated by the runtime
    spec = consumer.input_specs["s"]
    row_major = candidates(tuple(x.shape), "float32", hw, "DRAM")[0].layout
    src = IOSpec("s", tuple(x.shape), "float32", "DRAM", row_major, 0, hw.name, hw.fingerprint)
    machine = Machine(hw)
    relayout = machine.time(build_conversion(src, spec, hw).program.code).total_cycles
    copy = machine.time(build_conversion(spec, spec, hw).program.code).total_cycles
    return {"bytes": kib * 1024, "relocation_cycles": binding.cycles, "copy_conversion_cycles": copy,
            "conversion_from_row_major_cycles": relayout,
            "host_round_trip_cycles": handover.host_round_trip - handover.with_constraint,
            "chain_relocated_cycles": handover.with_constraint, "chain_converted_cycles": handover.without_constraint,
            "chain_saved_cycles": handover.saved}


def test_relocation_vs_conversion_vs_host(benchmark):
    """Cycles to hand a float32 tensor from producer to consumer, 4 KiB to 16 MiB (mncore2)."""
    ctx = Context(MNDevice("mncore2:auto"))
    rows = benchmark.pedantic(lambda: [sweep_row(ctx, kib) for kib in SWEEP_KIB], rounds=1, iterations=1)
    OUT.mkdir(exist_ok=True)
    with open(OUT / "relocation_sweep.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    plot_sweep(rows, OUT / "relocation_sweep.png", hwdesc.load("mncore2").clock_hz)
    big = rows[-1]
    benchmark.extra_info.update(sizes=len(rows), saved_vs_copy_64mib=big["copy_conversion_cycles"],
                                saved_vs_host_64mib=big["host_round_trip_cycles"])
    print("\n" + "\n".join(f"{r['bytes'] // 1024:>6} KiB: relocation {r['relocation_cycles']}, copy "
                           f"{r['copy_conversion_cycles']:,}, conversion from row-major "
                           f"{r['conversion_from_row_major_cycles']:,}, host round trip {r['host_round_trip_cycles']:,}"
                           for r in rows))


def plot_sweep(rows: list[dict], path: Path, clock_hz: int) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    size = [r["bytes"] for r in rows]
    for key, label, colour in (("copy_conversion_cycles", "conversion between equal layouts (a copy)", "tab:olive"),
                               ("conversion_from_row_major_cycles", "conversion from row-major", "tab:orange"),
                               ("host_round_trip_cycles", "host round trip", "tab:red")):
        ax.plot(size, [r[key] for r in rows], marker="o", label=label, color=colour)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("tensor size (bytes)")
    ax.set_ylabel("cycles (relocation: 0)")
    ax.set_title(f"what relocation saves on mncore2 ({clock_hz / 1e6:g} MHz)", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def test_seed_compile_time(benchmark):
    """Compiling the seed's two functions (trace, plan, emit), warm: the interactive loop."""
    ctx = Context(MNDevice("mncore2:auto"))
    sample = torch.randn(32, 64)

    def compile_both() -> None:
        consumer = ctx.compile(lambda d: {"result": d["shared"] + 1}, {"shared": sample}, None)
        ctx.compile(lambda d: {"shared": d["x"] * 2}, {"x": sample}, None,
                    io_spec_constraints={"shared": consumer.input_specs["shared"]})

    compile_both()
    from torch.fx.experimental.proxy_tensor import make_fx
    baseline = baseline_seconds(lambda: make_fx(lambda x: x * 2 + 1)(sample), rounds=5)
    benchmark.pedantic(compile_both, rounds=5, iterations=1)
    ratio = record_ratio(benchmark, "ratio_vs_make_fx", baseline)
    print(f"\nseed compile (both functions): {benchmark.stats.stats.median * 1e3:.0f} ms, {ratio:.1f}x one torch "
          f"make_fx trace of the same arithmetic")

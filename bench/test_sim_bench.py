"""Simulator speed: timing-only throughput, functional simulation against torch, JIT cost.

Ratios compare the simulator with torch doing the same arithmetic on the same CPU in the same
run (torch warmed up, writing into preallocated outputs).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import torch

import hwdesc
import sim

from .conftest import baseline_seconds, record_ratio

HW = hwdesc.load("mncore2")


def mixed_program(machine: sim.Machine, repeats: int) -> np.ndarray:
    """MV, two PE-stream transfers, a vector op and a wait, `repeats` times."""
    b = sim.ProgramBuilder(machine.params)
    for _ in range(repeats):
        b.mv("individual", "DRAM", 0, "L2BM", 0, 64, tag=1)
        b.xfer("distribute", "down", "L2BM", 0, "L1BM", 0, 128)
        b.xfer("distribute", "down", "L1BM", 0, "LM0", 0, 64)
        b.vop("add", "float32", 1, 16, ("LM0", 0, 0, 1), ("LM0", 0, 0, 1), ("LM1", 0, 0, 1))
        b.wait(1)
    return b.build().code


def test_timing_only_throughput(benchmark):
    machine = sim.Machine(HW)
    code = mixed_program(machine, 50_000)
    start = time.perf_counter()
    sim.validate(machine.params, code)
    validate_s = time.perf_counter() - start
    machine.time(code[:10])  # compiled before timing
    stats = benchmark(machine.time, code)
    rate = len(code) / benchmark.stats.stats.median
    benchmark.extra_info.update(macro_instructions_per_s=round(rate), instructions=len(code),
                                validation_instructions_per_s=round(len(code) / validate_s),
                                simulated_cycles=stats.total_cycles)
    print(f"\ntiming only: {rate / 1e6:.2f} M macro-instructions/s; validation {len(code) / validate_s / 1e3:.0f} k/s")


def test_functional_elementwise_16m_vs_torch(benchmark):
    """16M float32 additions: 4096 elements on each of the 4096 PEs (LM1 = LM0 + LM1)."""
    machine = sim.Machine(HW)
    per_pe = HW.memory_words("LM0")
    n_pe = HW.instances("PE")
    rng = np.random.default_rng(0)
    machine.memory("LM0").view(np.float32)[:] = rng.random((n_pe, per_pe), dtype=np.float32)
    machine.memory("LM1").view(np.float32)[:] = rng.random((n_pe, per_pe), dtype=np.float32)
    b = sim.ProgramBuilder(machine.params)
    b.vop("add", "float32", 1, per_pe, ("LM1", 0, 0, 1), ("LM0", 0, 0, 1), ("LM1", 0, 0, 1))
    program = b.build()
    machine.run(program, mode="functional")
    x, y = torch.rand(n_pe * per_pe), torch.rand(n_pe * per_pe)
    z = torch.empty_like(x)
    baseline = baseline_seconds(lambda: torch.add(x, y, out=z))
    benchmark(machine.run, program, mode="functional", validated=True)
    ratio = record_ratio(benchmark, "ratio_vs_torch", baseline, elements=n_pe * per_pe)
    print(f"\n16M-element add: simulator / torch = {ratio:.2f}x")


def test_functional_matmul_1024_vs_torch(benchmark):
    """1024x1024x1024 float32: each of the 1024 MABs computes a 32x32 tile of C over K = 1024 in
    four MATMUL instructions of K = 256 (A 32x256 and B 256x32 fit in a MAB's LM0 and LM1)."""
    machine = sim.Machine(HW)
    pes = machine.params.pes_per_mab
    m = n = 32
    k_step = 256
    kp = k_step // pes
    rng = np.random.default_rng(1)
    for name in ("LM0", "LM1"):
        machine.memory(name).view(np.float32)[:] = rng.standard_normal(machine.memory(name).shape, dtype=np.float32)
    b = sim.ProgramBuilder(machine.params)
    for k in range(1024 // k_step):
        b.matmul("float32", m, k_step, n, ("LM0", k * 0, kp), ("LM1", 0, n), ("GRF0", 0, n // pes), accumulate=k > 0)
    program = b.build()
    machine.run(program, mode="functional")
    a, bb = torch.rand(1024, 1024), torch.rand(1024, 1024)
    c = torch.empty(1024, 1024)
    baseline = baseline_seconds(lambda: torch.mm(a, bb, out=c))
    benchmark(machine.run, program, mode="functional", validated=True)
    ratio = record_ratio(benchmark, "ratio_vs_torch", baseline, flops=2 * 1024 ** 3)
    print(f"\n1024^3 float32 matrix product: simulator / torch = {ratio:.2f}x")


JIT_SCRIPT = textwrap.dedent("""
    import time
    start = time.perf_counter()
    import numpy as np, hwdesc, sim
    m = sim.Machine(hwdesc.load("mini"))
    b = sim.ProgramBuilder(m.params)
    b.mv("individual", "DRAM", 0, "L2BM", 0, 64, tag=1)
    b.wait(1)
    b.xfer("distribute", "down", "L2BM", 0, "L1BM", 0, 64)
    b.xfer("distribute", "down", "L1BM", 0, "LM0", 0, 16)
    for op in ("add", "mul", "exp"):
        b.vop(op, "float32", 1, 8, ("LM1", 0, 0, 1), ("LM0", 0, 0, 1), ("LM0", 0, 0, 1))
    m.grow("DRAM", 256)
    m.run(b.build())
    print(time.perf_counter() - start)
""")


def test_first_call_jit_cost(benchmark, tmp_path):
    """A fresh process running a small program: with an empty numba cache (cold) and a full one."""
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba")}

    def run() -> float:
        out = subprocess.run([sys.executable, "-c", JIT_SCRIPT], env=env, capture_output=True, text=True, check=True)
        return float(out.stdout.strip())

    cold = run()
    warm = benchmark.pedantic(run, rounds=3, iterations=1)
    benchmark.extra_info.update(cold_first_call_s=round(cold, 2), warm_first_call_s=round(warm, 2))
    print(f"\nfirst call in a new process: {cold:.1f} s with an empty numba cache, {warm:.2f} s with it filled")

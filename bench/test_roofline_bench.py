"""Simulated cycles against the roofline bound of the hardware description.

The bound of a kernel is max(compute time, DRAM traffic time): compute at the MAUs' matrix rate
(rows x cols multiply-adds per cycle per MAB, `units.MAU.matrix`) or the ALU/MAU vector lanes,
traffic as the bytes each operand and result must cross between DRAM and L2BM at least once,
at every Group's Data Engine rate (`transfers.dram_to_l2bm` / `l2bm_to_dram`, individual mode).
The ratio bound / simulated is the fraction of the roofline the compiled program reaches.
Cycles come from the timing engine (the values do not change them).
"""

from __future__ import annotations

import time

import pytest
import torch

import hwdesc
from hwdesc.figures import dram_traffic_cycles, matrix_cycles
from compiler.compile import compile_function
from sim import Machine

HW = hwdesc.load("mncore2")


def simulate(fn, inputs, options) -> tuple[int, float]:
    start = time.perf_counter()
    compiled = compile_function(fn, inputs, HW, options=options)
    compile_s = time.perf_counter() - start
    return Machine(HW).time(compiled.program.code).total_cycles, compile_s


def record(benchmark, what: str, cycles: int, compile_s: float, compute: float, traffic: float) -> None:
    bound = max(compute, traffic)
    benchmark.extra_info.update(simulated_cycles=cycles, compute_bound=round(compute), traffic_bound=round(traffic),
                                fraction_of_roofline=round(bound / cycles, 3), compile_s=round(compile_s, 2))
    print(f"\n{what}: {cycles:,} cycles; bound {bound:,.0f} (compute {compute:,.0f}, DRAM {traffic:,.0f}) -> "
          f"{bound / cycles:.2f} of the roofline; compile {compile_s:.1f} s")


MAU_FORMAT = {"float": "float32", "pfloat32": "pfloat32", "mixed": "float16", "half": "float16"}


@pytest.mark.parametrize("case", ["float", "pfloat32", "mixed", "half"])
def test_matmul_1024_roofline(benchmark, case):
    """float: float32 throughout; pfloat32: float32 operands multiplied as pseudo-single; mixed:
    float32 operands multiplied in half (converted in LM), so DRAM traffic is float32; half:
    float16 operands and result."""
    n = 1024
    dtype = torch.float16 if case == "half" else torch.float32
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    options = {"float_dtype": "float" if case == "half" else case}
    cycles, compile_s = benchmark.pedantic(simulate, args=(lambda d: {"c": d["a"] @ d["b"]}, {"a": a, "b": b},
                                                            options), rounds=1, iterations=1)
    compute = matrix_cycles(HW, n ** 3, MAU_FORMAT[case])
    size = HW.element_bytes("float16" if case == "half" else "float32")
    record(benchmark, f"1024^3 {case}", cycles, compile_s, compute, dram_traffic_cycles(HW, 2 * n * n * size, n * n * size))


@pytest.mark.parametrize("shape", [(1000, 1000, 1000), (1024, 1024, 1000), (768, 768, 768)])
def test_matmul_odd_sizes_roofline(benchmark, shape):
    """float32 products whose sizes do not fill the tiles (padding in M, K or N): 1000^3 ran at
    0.31 of the bound (98,210 cycles) before padded operands known to hold zeros were copied whole
    and B-stationary rounds padded to whole MAU rows; 768 = 6 x 128, BERT-base's width."""
    m, k, n = shape
    a, b = torch.randn(m, k), torch.randn(k, n)
    cycles, compile_s = benchmark.pedantic(simulate, args=(lambda d: {"c": d["a"] @ d["b"]}, {"a": a, "b": b},
                                                            {"float_dtype": "float"}), rounds=1, iterations=1)
    size = HW.element_bytes("float32")
    record(benchmark, f"{m}x{k}x{n} float", cycles, compile_s, matrix_cycles(HW, m * k * n, "float32"),
           dram_traffic_cycles(HW, (m * k + k * n) * size, m * n * size))


def test_elementwise_16m_roofline(benchmark):
    n = 4096
    a, b = torch.randn(n, n), torch.randn(n, n)
    cycles, compile_s = benchmark.pedantic(simulate, args=(lambda d: {"c": d["a"] + d["b"]}, {"a": a, "b": b}, {}),
                                           rounds=1, iterations=1)
    lanes = HW.units[HW.pe_ops["add"].unit].vector["float32"].lanes_per_cycle
    compute = n * n * HW.pe_ops["add"].issues / (lanes * HW.instances("PE"))
    record(benchmark, "16M-element add", cycles, compile_s, compute, dram_traffic_cycles(HW, 2 * n * n * 4, n * n * 4))

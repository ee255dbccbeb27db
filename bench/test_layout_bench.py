"""Host scatter + gather of a 1024x1024 float32 tensor against numpy copying the same bytes.

The baseline is two plain numpy copies of the same 4 MiB into a preallocated array (scatter and
gather each move the bytes once); preallocated, so that page faults do not flatter the ratio.
Three layouts: the DRAM row-major split over the Groups (contiguous runs), the best LM0
candidate (a block of rows per PE, 1 KiB runs), and a column-cyclic LM0 layout that spreads
every row over 64 PEs in 64-byte runs (the slow case).
"""

from __future__ import annotations

import numpy as np
import pytest

import hwdesc
from compiler.layout import parse
from compiler.layout.candidates import candidates
from compiler.layout.hostio import gather, scatter
from compiler.layout.placement import Placement

from .conftest import baseline_seconds, record_ratio

HW = hwdesc.load("mncore2")


CYCLIC = "(1024,1024)/((8_L2B:1, 8_L1B:1, 16:8), (16_MAB:1, 4_PE:1, 8:1, 2_W:1))"


@pytest.mark.parametrize("memory, text", [("DRAM", None), ("LM0", None), ("LM0", CYCLIC)], ids=["dram", "lm0", "lm0-cyclic"])
def test_scatter_gather_1024x1024_vs_numpy_copy(benchmark, memory, text):
    layout = parse(text) if text else candidates((1024, 1024), "float32", HW, memory)[0].layout
    p = Placement(layout, HW, memory, "float32")
    x = np.random.default_rng(0).random((1024, 1024), dtype=np.float32)
    mem = np.zeros((p.instance_count, max(2 * p.span_lw, 64)), dtype=np.uint32)

    def round_trip():
        scatter(p, x, mem)
        return gather(p, mem)

    dst = np.empty_like(x)
    baseline = baseline_seconds(lambda: (np.copyto(dst, x), np.copyto(dst, x)))
    result = benchmark(round_trip)
    assert np.array_equal(result.view(np.float32), x)
    ratio = record_ratio(benchmark, "ratio_vs_two_numpy_copies", baseline, layout=str(layout))
    print(f"\n{memory} {layout}: scatter+gather {benchmark.stats.stats.median*1e3:.3f} ms, 2 copies {baseline*1e3:.3f} ms = {ratio:.2f}x")

"""sim.races: a PE-stream instruction that touches what an MV in flight writes (or overwrites what
it reads) before a WAIT on its tag. Hand-built programs with and without the WAIT, and compiled
programs of every kernel kind, none of which may have one."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import hwdesc
import sim
from compiler.compile import compile_function
from sim.races import unwaited


def fetch_then_read(m: sim.Machine, wait: bool, *, overlap: bool = True) -> sim.Program:
    """An MV into L2BM, then (after a WAIT on its tag, or not) the l2bm broadcast of that range or
    of one beside it."""
    b = sim.ProgramBuilder(m.params)
    b.mv("individual", "DRAM", 0, "L2BM", 0, 64, tag=1)
    if wait:
        b.wait(1)
    b.xfer("broadcast", "down", "L2BM", 0 if overlap else 64, "L1BM", 0, 32)
    return b.build()


def test_a_read_before_the_wait_is_found_and_after_it_is_not(mini):
    m = sim.Machine(mini)
    m.grow("DRAM", 1 << 10)
    assert unwaited(m.params, fetch_then_read(m, wait=False).code) == [(0, 1)]
    assert unwaited(m.params, fetch_then_read(m, wait=True).code) == []
    assert unwaited(m.params, fetch_then_read(m, wait=False, overlap=False).code) == []  # another range


def test_overwriting_what_an_upload_still_reads_is_found(mini):
    """An MV from L2BM to DRAM reads its range until its WAIT: the l2bm hop that refills the range
    before it is a race; after it, none."""
    m = sim.Machine(mini)
    m.grow("DRAM", 1 << 10)
    for wait, expected in ((False, [(0, 1)]), (True, [])):
        b = sim.ProgramBuilder(m.params)
        b.mv("individual", "L2BM", 0, "DRAM", 0, 64, tag=2)
        if wait:
            b.wait(2)
        b.xfer("individual", "up", "L2BM", 32, "L1BM", 0, 16, index=0)
        assert unwaited(m.params, b.build().code) == expected


PROGRAMS = {  # name: (function, inputs(on mncore2)); every kernel kind: fetches, pipelines, uploads, gathers
    "direct conv (blocks)": (lambda d: {"y": F.conv2d(d["x"], d["w"], padding=1)},
                             lambda big: {"x": torch.randn(1, 64, 56, 56) if big else torch.randn(1, 16, 14, 14),
                                          "w": torch.randn(64, 64, 3, 3) if big else torch.randn(16, 16, 3, 3)}),
    "strided conv": (lambda d: {"y": F.conv2d(d["x"], d["w"], stride=2, padding=1)},
                     lambda big: {"x": torch.randn(1, 32, 28, 28), "w": torch.randn(64, 32, 3, 3)}),
    "product": (lambda d: {"c": d["a"] @ d["b"]}, lambda big: {"a": torch.randn(512, 512), "b": torch.randn(512, 512)}),
    "element-wise and a sum": (lambda d: {"y": torch.relu(d["a"] * 2 + 1).sum(0)},
                               lambda big: {"a": torch.randn(700, 300)}),
    "softmax over rows": (lambda d: {"y": torch.softmax(d["a"], -1)}, lambda big: {"a": torch.randn(128, 1000)}),
    "row reductions of a product across PEs": (
        lambda d: {"m": (d["a"] @ d["b"]).amax(-1), "s": (d["a"] @ d["b"]).sum(-1)},
        lambda big: {"a": torch.randn(256, 128), "b": torch.randn(128, 512)} if big else
        {"a": torch.randn(8, 16), "b": torch.randn(16, 256)}),
}


@pytest.mark.parametrize("chip", ["mini", "mncore2"])
@pytest.mark.parametrize("name", list(PROGRAMS))
def test_compiled_programs_wait_before_they_touch_what_an_mv_moves(chip, name):
    fn, inputs = PROGRAMS[name]
    torch.manual_seed(0)
    hw = hwdesc.load(chip)
    compiled = compile_function(fn, inputs(chip == "mncore2"), hw)
    assert unwaited(sim.MachineParams.from_hw(hw), compiled.program.code) == []

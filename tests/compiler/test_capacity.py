"""Programs too large for the chip are refused at compile, naming the tensor; compile memory follows the program.

The bounds come from mini.yaml (DRAM 64 MiB = 8,388,608 long words of 8 bytes, two float32 per long word)
and from what a per-element map would cost (8 bytes per element for one int64 index).
"""

from __future__ import annotations

import tracemalloc

import pytest
import torch

import hwdesc
from compiler import compile_function
from sim import DeviceMemoryError


@pytest.fixture(scope="module")
def mini():
    return hwdesc.load("mini")


def test_an_input_larger_than_dram_is_refused_before_planning(mini, monkeypatch):
    from compiler.planner import search
    monkeypatch.setattr(search.Planner, "plan", lambda self: pytest.fail("planned a program that cannot fit"))
    big = torch.empty(32 * 1024 * 1024)  # 128 MiB of float32: 16,777,216 long words
    with pytest.raises(DeviceMemoryError, match=r"tensor 'big' \(float32\[33554432\]\) needs 16777216 long words "
                                                r"of DRAM; the chip has 8388608 long words"):
        compile_function(lambda d: {"y": d["big"] + 1}, {"big": big}, mini)


def test_an_intermediate_larger_than_dram_names_its_op_and_line(mini):
    a, b = torch.randn(8192), torch.randn(8192)
    with pytest.raises(DeviceMemoryError) as caught:
        compile_function(lambda d: {"y": (d["a"][:, None] * d["b"][None, :]).sum()}, {"a": a, "b": b}, mini)
    message = str(caught.value)
    assert "(float32[8192, 8192], made by aten.mul.Tensor at " in message
    assert "test_capacity.py" in message and "33554432 long words" in message


def test_inputs_and_outputs_that_fit_one_by_one_but_not_together_are_refused(mini):
    x = torch.randn(5 * 1024 * 1024)  # 20 MiB each: input plus three outputs need 80 MiB of 64 MiB
    with pytest.raises(DeviceMemoryError, match="inputs, constants and outputs together"):
        compile_function(lambda d: {"a": d["x"] + 1, "b": d["x"] * 2, "c": d["x"] - 1}, {"x": x}, mini)


def test_a_refused_compile_leaves_the_compiler_usable(mini):
    with pytest.raises(DeviceMemoryError):
        compile_function(lambda d: {"y": d["x"] + 1}, {"x": torch.empty(32 * 1024 * 1024)}, mini)
    compiled = compile_function(lambda d: {"y": d["x"] + 1}, {"x": torch.randn(64)}, mini)
    assert compiled.inputs["x"].shape == (64,)


@pytest.mark.parametrize("chip", ["mini", "mncore2"])
def test_compile_memory_follows_the_program_not_the_elements(chip):
    """A 16M-element add: host memory held by compile is well under one byte per element (an int64 map
    of the tensor would be 8) and per instruction stays within a few KiB."""
    hw = hwdesc.load(chip)
    compile_function(lambda d: {"y": d["x"] + 1}, {"x": torch.randn(64)}, hw)  # imports and caches
    n = 16 * 1024 * 1024 if chip == "mncore2" else 4 * 1024 * 1024
    x = torch.randn(n)
    tracemalloc.start()
    try:
        compiled = compile_function(lambda d: {"y": d["x"] + 1}, {"x": x}, hw)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < n * 4, f"{peak} bytes traced for {n} elements"
    assert peak < 1 << 20 or peak < 4096 * len(compiled.program), f"{peak} bytes for {len(compiled.program)} instructions"


def test_a_program_too_large_for_the_hosts_memory_is_refused_at_compile(mini, monkeypatch):
    """Real-size MobileNetV2, VGG-11 and U-Net programs passed 16 GB of host memory while being
    emitted. The program's instructions are bounded by the host's free memory (at
    HOST_BYTES_PER_INSTRUCTION each): past it, compile refuses naming the step it reached, and
    the compiler stays usable."""
    from compiler import emit as emit_module
    from compiler.errors import CompileError
    free = 2000 * emit_module.HOST_BYTES_PER_INSTRUCTION  # room for 2,000 instructions
    monkeypatch.setattr(emit_module, "host_memory_available", lambda: free)
    convs = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(8, 8, 3, padding=1))
    with pytest.raises(CompileError, match=r"the program passes 2,000 instructions at .* \(step \d+ of \d+\): building "
                                           r"and simulating it would take more than the 0.0 GiB of host memory free"):
        compile_function(lambda d: {"y": convs(d["x"])}, {"x": torch.randn(2, 3, 32, 32)}, mini)
    small = compile_function(lambda d: {"y": d["x"] * 2}, {"x": torch.randn(4, 8)}, mini)
    assert len(small.program.code) < 2000
    monkeypatch.setattr(emit_module, "host_memory_available", lambda: None)  # a system that does not say: no bound
    assert compile_function(lambda d: {"y": convs(d["x"])}, {"x": torch.randn(2, 3, 32, 32)}, mini).program.code.size


def test_a_gather_matched_element_by_element_past_the_hosts_memory_is_refused(mini, monkeypatch):
    """A gather through an element map (a flip), or whose layouts do not separate, is matched
    element by element (about ELEMENT_MATCH_BYTES of host memory an element): past the host's
    free memory the candidate is refused, naming the gather's size, instead of the process being
    killed (a Linear over a 61x70x61x102 input reached 21 GB before its reshape became a view).
    With room, the same program compiles."""
    from compiler.errors import CompileError
    from compiler.transfer import gather
    fn = lambda d: {"y": d["x"].flip(0) * 2}  # noqa: E731
    inputs = {"x": torch.randn(64, 100)}
    monkeypatch.setattr(gather, "host_memory_available", lambda: 1 << 20)
    with pytest.raises(CompileError, match=r"a gather matched element by element over [\d,]+ elements would take "
                                           r"about [\d.]+ GiB of host memory, more than the 0.0 GiB free"):
        compile_function(fn, inputs, mini)
    monkeypatch.setattr(gather, "host_memory_available", lambda: None)
    assert compile_function(fn, inputs, mini).program.code.size

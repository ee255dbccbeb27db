"""One read-address pattern per memory and instruction (memories.<m>.ports, SDM: readers of one
memory use identical address patterns): the validator rejects two, and compiled kernels place
the operands an instruction reads together in different memories."""

from __future__ import annotations

import pytest
import torch

import sim
from compiler.compile import compile_function


def _run(m: sim.Machine, emit) -> None:
    b = sim.ProgramBuilder(m.params)
    emit(b)
    m.run(b.build(), mode="timing")


def test_two_patterns_in_one_memory_are_rejected(mini):
    m = sim.Machine(mini)
    with pytest.raises(sim.SimError, match=r"instruction #0 \(VOP add.float32 1x8 LM1\[0:0,1\] LM0\[0:0,1\] "
                                           r"LM0\[64:0,1\]\): operands a and b read LM0 at different addresses or "
                                           r"strides; LM0 has 1 read port\(s\) \(memories.LM0.ports: 1RW\)"):
        _run(m, lambda b: b.vop("add", "float32", 1, 8, ("LM1", 0, 0, 1), ("LM0", 0, 0, 1), ("LM0", 64, 0, 1)))
    with pytest.raises(sim.SimError, match="operands a and c read GRF0"):  # strides count as the pattern
        _run(m, lambda b: b.vop("fma", "float32", 2, 4, ("LM1", 0, 4, 1), ("GRF0", 0, 4, 1), ("LM0", 0, 4, 1),
                                ("GRF0", 0, 0, 1)))
    with pytest.raises(sim.SimError, match="operands A and B read LM0"):
        _run(m, lambda b: b.matmul("float32", 8, 16, 4, ("LM0", 0, 4), ("LM0", 256, 4), ("GRF0", 0, 1)))


def test_one_pattern_read_twice_and_separate_memories_are_accepted(mini):
    m = sim.Machine(mini)
    _run(m, lambda b: b.vop("mul", "float32", 1, 8, ("LM0", 0, 0, 1), ("LM0", 0, 0, 1), ("LM0", 0, 0, 1)))  # x * x
    _run(m, lambda b: b.vop("fma", "float32", 1, 8, ("LM0", 0, 0, 1), ("LM0", 0, 0, 1), ("LM1", 0, 0, 1),
                            ("GRF0", 0, 0, 1)))


@pytest.mark.parametrize("chip", ["mini", "mncore2"])
@pytest.mark.parametrize("name, fn, inputs", [
    ("add", lambda d: {"y": d["a"] + d["b"]}, {"a": torch.randn(64, 64), "b": torch.randn(64, 64)}),
    ("where", lambda d: {"y": torch.where(d["c"], d["a"], d["b"])},
     {"c": torch.randn(256, 256) > 0, "a": torch.randn(256, 256), "b": torch.randn(256, 256)}),
    ("sum", lambda d: {"y": d["a"].sum(0)}, {"a": torch.randn(64, 128)}),
    ("matmul", lambda d: {"y": d["a"] @ d["b"]}, {"a": torch.randn(128, 128), "b": torch.randn(128, 128)}),
])
def test_compiled_kernels_read_each_memory_with_one_pattern(request, chip, name, fn, inputs):
    hw = request.getfixturevalue(chip)
    compiled = compile_function(fn, inputs, hw)
    code = compiled.program.code
    sim.validate(sim.MachineParams.from_hw(hw), code)  # raised for each of these before the kernels spread them

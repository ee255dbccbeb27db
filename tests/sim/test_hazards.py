"""Hazards: the validator rejects a reader that comes too soon after its writer, naming the YAML
key, the instruction and the distance; the builder inserts exactly the nops that are missing."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest
import torch

import hwdesc
import sim
from compiler.compile import compile_function
from hwdesc.checks import HAZARDS
from sim import hazards

# Each case: a writer, then a reader that depends on it (hand-written on mini, whose hazards are
# mncore2's). The gap is looked up in the YAML by the key, never written here.
CASES = {
    "lm_write_to_read": (  # a port conflict: the reader's address does not matter
        lambda b: b.vop("add", "float32", 1, 8, ("LM0", 0, 0, 1), ("LM1", 0, 0, 1), ("LM1", 0, 0, 1)),
        lambda b: b.vop("copy", "float32", 1, 8, ("LM1", 64, 0, 1), ("LM0", 512, 0, 1))),
    "grf_write_to_read": (
        lambda b: b.vop("add", "float32", 1, 8, ("GRF0", 0, 0, 1), ("LM1", 0, 0, 1), ("LM1", 0, 0, 1)),
        lambda b: b.vop("copy", "float32", 1, 8, ("LM1", 64, 0, 1), ("GRF0", 4, 0, 1))),
    "alu_result_to_use": (  # max runs on the ALU; the GRF rule alone would ask for less
        lambda b: b.vop("max", "float32", 1, 8, ("GRF1", 0, 0, 1), ("LM1", 0, 0, 1), ("GRF0", 0, 0, 1)),
        lambda b: b.vop("copy", "float32", 1, 8, ("LM1", 64, 0, 1), ("GRF1", 0, 0, 1))),
    "l2bm_to_l1bm_read": (
        lambda b: b.xfer("broadcast", "down", "L2BM", 0, "L1BM", 0, 16),
        lambda b: b.xfer("broadcast", "down", "L1BM", 8, "GRF0", 0, 2)),
    "l1bm_write_to_l2bm_read": (
        lambda b: b.xfer("individual", "up", "L1BM", 0, "LM1", 0, 8),
        lambda b: b.xfer("individual", "up", "L2BM", 0, "L1BM", 0, 8)),
    "l1bm_reduce_to_read": (
        lambda b: b.xfer("reduce", "up", "L1BM", 0, "LM1", 0, 8, red="add"),
        lambda b: b.xfer("broadcast", "down", "L1BM", 0, "GRF0", 0, 2)),
    "l2bm_write_to_mv_read": (
        lambda b: b.xfer("individual", "up", "L2BM", 0, "L1BM", 0, 16),
        lambda b: b.mv("individual", "L2BM", 0, "DRAM", 0, 64, tag=1)),
}


def _program(params, case: str, nops: int, *, hazards: bool = False) -> sim.Program:
    write, read = CASES[case]
    b = sim.ProgramBuilder(params)
    write(b)
    if nops:
        b.nop(nops)
    read(b)
    if case == "l2bm_write_to_mv_read":
        b.wait(1)
    return b.build(hazards=hazards)


def test_the_rules_name_every_yaml_hazard(mncore2):
    """The vocabulary hw validate accepts, the simulator's rules and mncore2's YAML are one set."""
    assert set(CASES) == set(hazards.KEYS) == set(HAZARDS) == set(mncore2.hazards)


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_reader_one_step_too_soon_is_rejected(mini, case):
    m = sim.Machine(mini)
    gap = mini.hazards[case]
    assert gap >= 1
    program = _program(m.params, case, gap - 1)
    reader = 2 if gap > 1 else 1
    with pytest.raises(sim.SimError, match=rf"instruction #{reader} .*hazard {case}: it reads {gap - 1} step\(s\) "
                                           rf"after instruction #0 .* needs {gap} \(hazards\.{case}\); insert NOP "
                                           r"steps=1 before it"):
        m.run(program, mode="timing")
    m.run(_program(m.params, case, gap), mode="timing")  # the YAML's gap is enough


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_builder_inserts_exactly_the_missing_steps(mini, case):
    m = sim.Machine(mini)
    program = _program(m.params, case, 0, hazards=True)
    nops = program.code[program.code[:, 0] == sim.Op.NOP]
    assert nops[:, sim.isa.NOP_STEPS].tolist() == [mini.hazards[case]]
    m.run(program, mode="timing")


def test_independent_instructions_need_no_gap(mini):
    m = sim.Machine(mini)
    b = sim.ProgramBuilder(m.params)
    b.vop("add", "float32", 1, 8, ("GRF0", 0, 0, 1), ("LM1", 0, 0, 1), ("LM1", 0, 0, 1))
    b.vop("copy", "float32", 1, 8, ("LM0", 0, 0, 1), ("GRF0", 64, 0, 1))  # another GRF0 address: no rule
    program = b.build()
    assert sim.Op.NOP not in program.code[:, 0]
    m.run(program, mode="timing")


def test_a_nop_serves_every_later_reader_that_spans_it(mini):
    """W; R1; R2 with R1 and R2 both reading W's LM: the nops before R1 also separate W from R2,
    so no more are inserted before R2."""
    m = sim.Machine(mini)
    gap = mini.hazards["lm_write_to_read"]
    b = sim.ProgramBuilder(m.params)
    b.vop("add", "float32", 1, 8, ("LM0", 0, 0, 1), ("LM1", 0, 0, 1), ("LM1", 0, 0, 1))
    b.vop("copy", "float32", 1, 8, ("LM1", 64, 0, 1), ("LM0", 0, 0, 1))
    b.vop("copy", "float32", 1, 8, ("GRF0", 0, 0, 1), ("LM0", 0, 0, 1))
    program = b.build()
    ops = program.code[:, 0].tolist()
    assert ops == [sim.Op.VOP, sim.Op.NOP, sim.Op.VOP, sim.Op.VOP]
    assert program.code[1, sim.isa.NOP_STEPS] == gap


def test_labels_and_relocations_follow_the_instructions(mini):
    m = sim.Machine(mini)
    b = sim.ProgramBuilder(m.params)
    with b.label("first"):
        b.xfer("individual", "up", "L2BM", 0, "L1BM", 0, 16)
    with b.label("second"):
        b.mv("individual", "L2BM", 0, "DRAM", sim.Sym("out") + 8, 64, tag=1)
        b.wait(1)
    program = b.build()
    assert program.code[1, 0] == sim.Op.NOP
    assert program.labels == [(0, 1, "first"), (1, 4, "second")]
    assert program.relocs[:, 0].tolist() == [2]
    assert program.code[2, 0] == sim.Op.MV
    assert np.array_equal(b.build_code(), program.code)  # what the planner times: the same rows, nops included


def test_the_gaps_come_from_the_yaml(tmp_path):
    path = tmp_path / "slowlm.yaml"
    path.write_text(textwrap.dedent("""
        extends: mini
        name: slowlm
        hazards:
          lm_write_to_read: 5
        """))
    hw = hwdesc.load(path)
    program = _program(sim.MachineParams.from_hw(hw), "lm_write_to_read", 0, hazards=True)
    assert program.code[1, sim.isa.NOP_STEPS] == 5


def _without_nops(program: sim.Program) -> sim.Program:
    keep = program.code[:, 0] != sim.Op.NOP
    new_index = np.cumsum(keep) - 1
    relocs = program.relocs.copy()
    relocs[:, 0] = new_index[relocs[:, 0]]
    return sim.Program(program.code[keep], [], relocs, program.symbols)


@pytest.mark.parametrize("name, fn, inputs", [
    ("softmax", lambda d: {"y": torch.softmax(d["x"], -1)}, {"x": torch.randn(16, 32)}),
    ("linear_relu", lambda d: {"y": torch.relu(d["x"] @ d["w"] + 1.0)}, {"x": torch.randn(16, 32), "w": torch.randn(32, 16)}),
])
def test_a_compiled_program_without_its_nops_is_rejected(mini, name, fn, inputs):
    compiled = compile_function(fn, inputs, mini)
    params = sim.MachineParams.from_hw(mini)
    sim.validate(params, compiled.program.code)  # as compiled: every gap is there
    stripped = _without_nops(compiled.program)
    with pytest.raises(sim.SimError, match=r"hazard \w+: it reads 0 step\(s\) after instruction #\d+"):
        sim.validate(params, stripped.code)

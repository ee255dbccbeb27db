"""MATMUL parts fused by the functional engine (sim.fusion): a product cut by rows, with other
instructions between its parts, leaves the words it leaves run one instruction at a time; parts
that something between them could tell apart are not fused."""

from __future__ import annotations

import numpy as np
import pytest

import hwdesc
import sim
from sim import fusion, functional

CHIPS = ["mini", "mncore2"]


def _machine(chip: str) -> sim.Machine:
    m = sim.Machine(hwdesc.load(chip))
    rng = np.random.default_rng(1)
    for name in ("L1BM", "LM0", "LM1", "GRF0", "GRF1"):
        m.memory(name)[:] = rng.standard_normal(m.memory(name).shape, dtype=np.float32).view(np.uint32)
    return m


def _program(m: sim.Machine, between_writes_a: bool) -> sim.Program:
    """A 24 x 16 x 8 product cut into rows 0-7, 8-15, 16-23 (accumulating into C), with an L1BM ->
    PE transfer into LM0 between the parts (away from A, or, with `between_writes_a`, into the
    last part's rows of A), a mab_broadcast into LM1 beside B, and a VOP on GRF1 between."""
    pes = m.params.pes_per_mab
    wpl = m.params.words_per_lw
    K, N = 4 * pes, 2 * pes
    kp, npe = K // pes, N // pes
    b = sim.ProgramBuilder(m.params)

    def part(first: int, rows: int) -> None:
        b.matmul("float32", rows, K, N, ("LM0", first * kp, kp), ("LM1", 0, N), ("GRF0", first * npe, npe),
                 accumulate=True)
    part(0, 8)
    b.xfer("mab_broadcast", "down", "L1BM", 0, "LM0", 16 * kp if between_writes_a else 512, pes * 8 // wpl)
    part(8, 8)
    b.xfer("mab_broadcast", "down", "L1BM", 64, "LM1", 512, pes * 8 // wpl)
    b.vop("add", "float32", 1, 8, ("GRF1", 0, 0, 1), ("LM0", 600, 0, 1), ("GRF1", 64, 0, 1))
    part(16, 8)
    return b.build()


@pytest.mark.parametrize("chip", CHIPS)
@pytest.mark.parametrize("between_writes_a", [False, True])
def test_parts_of_a_product_leave_the_words_they_leave_one_at_a_time(chip, between_writes_a, monkeypatch):
    m = _machine(chip)
    program = _program(m, between_writes_a)
    fused, skipped = fusion.fused_products(m.params, program.code)
    matmuls = np.flatnonzero(program.code[:, 0] == sim.Op.MATMUL).tolist()
    if between_writes_a:  # the second and the third part cannot go together (A's rows changed between)
        assert list(fused) == [matmuls[0]] and skipped == {matmuls[1]}
    else:
        assert list(fused) == [matmuls[0]] and skipped == set(matmuls[1:])
        assert fused[matmuls[0]][sim.isa.MM_M] == 24
    _same_words_unfused(chip, m, program, lambda m: _program(m, between_writes_a), monkeypatch)


def _same_words_unfused(chip: str, m: sim.Machine, program: sim.Program, build, monkeypatch) -> None:
    """`program` run on `m` leaves the words a fresh copy of it (a program keeps what the engine
    derived from it, fusion included) leaves with nothing fused."""
    m.run(program, mode="functional")
    got = [a.copy() for a in m.memories]
    reference = _machine(chip)
    asked = []
    monkeypatch.setattr(functional, "fused_products", lambda p, code: (asked.append(1), ({}, frozenset()))[1])
    reference.run(build(reference), mode="functional")
    assert asked  # the reference ran unfused
    for a, b in zip(got, reference.memories):
        assert np.array_equal(a, b)


@pytest.mark.parametrize("overlap", ["C on A", "C on B"])
def test_parts_whose_c_meets_their_a_or_b_are_not_fused(mini, overlap, monkeypatch):
    """Run one at a time, a part reads what the part before wrote where C lies on A or on B; the
    whole product would read both before writing: such parts run as written."""
    def build(m: sim.Machine) -> sim.Program:
        pes = m.params.pes_per_mab
        K, N = 4 * pes, 2 * pes
        kp, npe = K // pes, N // pes
        b = sim.ProgramBuilder(m.params)
        for first in (0, 8):
            c = ("LM0", 8 * kp + first * npe, npe) if overlap == "C on A" else ("LM1", first * npe, npe)
            b.matmul("float32", 8, K, N, ("LM0", first * kp, kp), ("LM1", 0, N), c)
        return b.build()
    m = _machine("mini")
    program = build(m)
    assert fusion.fused_products(m.params, program.code) == ({}, frozenset())
    _same_words_unfused("mini", m, program, build, monkeypatch)


def test_parts_whose_k_slices_take_blas_are_not_fused(mini):
    """Above sim.mau.SHORT_SLICE per PE a product is multiplied by BLAS, whose words may differ
    with its shape: its parts run as written."""
    m = sim.Machine(mini)
    pes = m.params.pes_per_mab
    K = (sim.mau.SHORT_SLICE + 2) * pes
    kp = K // pes
    b = sim.ProgramBuilder(m.params)
    for first in (0, 8):
        b.matmul("float32", 8, K, 2 * pes, ("LM0", first * kp, kp), ("LM1", 0, 2 * pes), ("GRF0", first * 2, 2))
    assert fusion.fused_products(m.params, b.build().code) == ({}, frozenset())

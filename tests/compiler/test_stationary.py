"""Products whose B stays in the PE memories over their M rounds (compiler.kernels.stationary): the
values, the planner's figure against the simulator's, B fetched once, and C's earlier rounds on
their way out while the last round multiplies."""

from __future__ import annotations

from dataclasses import replace
from itertools import combinations

import numpy as np
import pytest
import torch

import sim.isa as isa
from compiler.chain import Chain
from compiler.compile import compile_function
from compiler.kernels import conv, matmul, pipeline
from compiler.kernels import stationary as stationary_mod
from runtime import Device
from sim import Machine
from sim.params import MachineParams


def matmul_fn(d):
    return {"c": d["a"] @ d["b"]}


@pytest.fixture
def stationary_only(monkeypatch):
    """The planner offered the B-stationary tilings of a product alone (where it has any)."""
    tilings = matmul._tilings

    def only(*args, **kwargs):
        found = tilings(*args, **kwargs)
        return tuple(t for t in found if t.b_stationary) or found
    monkeypatch.setattr(matmul, "_tilings", only)
    chosen = []
    for module in (matmul, conv):
        emit = module.emit_product
        monkeypatch.setattr(module, "emit_product",
                            lambda cg, t, *a, emit=emit, **k: (chosen.append(t), emit(cg, t, *a, **k))[1])
    return chosen


@pytest.mark.parametrize("shape", [(64, 256, 64), (48, 384, 64), (128, 256, 32)])
def test_several_later_rounds_send_the_finished_rounds_c_up_as_they_finish(mini, monkeypatch, shape):
    """One round chunk by chunk with B coming down, the others after it with A alone: each
    round's C goes up once that round is done, interleaved with the rounds after it: values
    against torch, the planner's figure the simulator's."""
    tilings = matmul._tilings

    def first_round_only(*args, **kwargs):
        found = [t for t in tilings(*args, **kwargs) if t.b_stationary and t.rounds >= 3]
        return tuple(replace(t, stationary_first=1) for t in found[:1]) or tilings(*args, **kwargs)
    monkeypatch.setattr(matmul, "_tilings", first_round_only)
    m, k, n = shape
    torch.manual_seed(m + k + n)
    inputs = {"a": torch.randn(m, k), "b": torch.randn(k, n)}
    chosen = []
    emit = matmul.emit_product
    monkeypatch.setattr(matmul, "emit_product", lambda cg, t, *a, **kw: (chosen.append(t), emit(cg, t, *a, **kw))[1])
    compiled = compile_function(matmul_fn, inputs, mini)
    assert chosen[-1].b_stationary and chosen[-1].stationary_first == 1 and chosen[-1].rounds >= 3
    assert compiled.summary["planned_cycles"] == Machine(mini).time(compiled.program.code).total_cycles
    got = Device(mini).execute(compiled, inputs)["c"]
    want = matmul_fn(inputs)["c"]
    assert (got - want).abs().max() <= 1e-5 * want.abs().max()


@pytest.mark.parametrize("fn, shapes", [
    (lambda d: {"c": d["a"] @ d["b"].t()}, ((64, 256), (64, 256))),  # B read transposed
    (lambda d: {"c": torch.nn.functional.conv2d(d["a"], d["b"], padding=1)}, ((1, 16, 16, 16), (32, 16, 3, 3))),
])
def test_b_stationary_transposed_products_and_convolutions_match_torch(mini, stationary_only, fn, shapes):
    torch.manual_seed(len(shapes[0]))
    inputs = {"a": torch.randn(*shapes[0]), "b": torch.randn(*shapes[1])}
    compiled = compile_function(fn, inputs, mini)
    assert stationary_only and stationary_only[-1].b_stationary
    got = Device(mini).execute(compiled, inputs)["c"]
    want = fn(inputs)["c"]
    assert (got - want).abs().max() <= 1e-5 * want.abs().max()


@pytest.mark.parametrize("shape, options", [
    ((64, 256, 64), {}),
    ((64, 512, 32), {}),  # 16 chunks: B's banks hold 8 each
    ((64, 256, 64), {"float_dtype": "pfloat32"}),
])
def test_b_stationary_products_match_torch(mini, stationary_only, shape, options):
    m, k, n = shape
    torch.manual_seed(m + k + n)
    inputs = {"a": torch.randn(m, k), "b": torch.randn(k, n)}
    compiled = compile_function(matmul_fn, inputs, mini, options=options)
    assert stationary_only and stationary_only[-1].b_stationary and stationary_only[-1].rounds > 1
    assert compiled.summary["planned_cycles"] == Machine(mini).time(compiled.program.code).total_cycles
    got = Device(mini).execute(compiled, inputs)["c"]
    want = matmul_fn(inputs)["c"]
    tol = 3e-3 if options else 1e-5
    assert (got - want).abs().max() <= tol * want.abs().max()


def test_b_comes_down_once_and_the_earlier_rounds_c_leave_while_the_last_round_multiplies(mncore2, monkeypatch):
    """1024 x 512 x 1024 on MN-Core 2: the planner keeps B stationary over several rounds. It moves exactly
    the one-round tiling's long words from DRAM (A and B once each), starts uploading C before most of
    the later rounds' MAU work, and is faster than the best tiling without it."""
    torch.manual_seed(0)
    inputs = {"a": torch.randn(1024, 512), "b": torch.randn(512, 1024)}
    chosen = []
    emit = matmul.emit_product
    monkeypatch.setattr(matmul, "emit_product", lambda cg, t, *a, **k: (chosen.append(t), emit(cg, t, *a, **k))[1])
    stationary = compile_function(matmul_fn, inputs, mncore2)
    t = chosen[-1]  # the one emitted last is the one chosen
    assert t.b_stationary
    one_round = replace(t, rounds=1, mt=t.mt * t.rounds, b_stationary=False)
    monkeypatch.setattr(matmul, "STATIONARY_CANDIDATES", 0)
    matmul._tilings.cache_clear()
    without = compile_function(matmul_fn, inputs, mncore2)
    matmul._tilings.cache_clear()
    machine = Machine(mncore2)
    stats, before = machine.time(stationary.program.code), machine.time(without.program.code)
    assert stats.total_cycles < before.total_cycles

    # the same DRAM -> L2BM traffic as the one-round version of the same tiling
    monkeypatch.setattr(matmul, "_tilings", lambda *a, **k: (one_round,))
    plain = compile_function(matmul_fn, inputs, mncore2)
    path = Chain.of(mncore2).dram_to_l2
    assert stats.bytes_per_path[path] == machine.time(plain.program.code).bytes_per_path[path]

    code = stationary.program.code
    dram = MachineParams.from_hw(mncore2).memory_id(Chain.of(mncore2).dram)
    uploads = np.flatnonzero((code[:, 0] == isa.Op.MV) & (code[:, isa.MV_DST_MEM] == dram))
    products = np.flatnonzero(code[:, 0] == isa.Op.MATMUL)
    mau = stats.end[products] - stats.start[products]
    after = mau[stats.start[products] >= stats.start[uploads].min()].sum()
    assert after >= 0.5 * mau.sum() / t.rounds  # C's first rounds go up while the last round multiplies

    # the later rounds' A comes in while the first rounds still multiply: when their last MATMUL
    # ends, the fetches of as many later steps as A's ring holds have started (a ring of their own
    # started with the first rounds' last step: 5 of 8). A's fetches, in program order, are the
    # steps' in order.
    symbol = stationary.program.symbols.index("input:a")
    relocs = stationary.program.relocs
    a_fetches = relocs[(relocs[:, 1] == isa.MV_SRC_ADDR) & (relocs[:, 2] == symbol), 0]
    a_fetches = a_fetches[code[a_fetches, isa.MV_DST_MEM] != dram]
    per_step = len(a_fetches) // (t.rounds * t.chunks)
    later_steps = a_fetches[per_step * t.stationary_first * t.chunks::per_step]  # each step's first fetch
    c_round = t.mt * (t.nt // MachineParams.from_hw(mncore2).pes_per_mab)  # C's words a round, in each PE
    c_at = code[products, isa.MM_C_ADDR]
    first_rounds = products[c_at < c_at.min() + t.stationary_first * c_round]
    started = (stats.start[later_steps] < stats.end[first_rounds].max()).sum()
    assert started == min(stationary_mod.A_RING, len(later_steps))
    got = Device(mncore2).execute(stationary, inputs)["c"]
    want = matmul_fn(inputs)["c"]
    assert (got - want).abs().max() <= 1e-5 * want.abs().max()


@pytest.mark.parametrize("needs", [[32, 0, 128, 0, 16], [0, 64, 0, 32], [128, 0, 16], [1] * 8, [0, 0], [200, 200]])
def test_a_step_cut_by_needs_covers_each_bundles_transfers_where_its_rows_allow(needs):
    """A 64-row step (8 units of the MAU's 8 rows, 32 cycles each) cut beside bundles whose
    transfers take `needs` cycles: the parts tile its rows at whole units, one at least each;
    where the units allow, every part lasts as long as its bundle's transfers (the stream then
    pays the MATMUL alone), and a heavier bundle never gets fewer rows than a lighter one."""
    t = matmul.Tiling((), 1, 1, 64, 1, 4, 8, False, False)
    parts = pipeline.cuts(t, 8, 2, len(needs), needs, cycles=256)
    assert [p[0] for p in parts] == ["m"] * len(needs)
    assert parts[0][1] == 0 and sum(p[2] for p in parts) == t.mt
    assert all(a[1] + a[2] == b[1] for a, b in zip(parts, parts[1:]))
    assert all(p[2] >= 8 and p[2] % 8 == 0 for p in parts)
    if sum(max(1, -(-need // 32)) for need in needs) <= 8:
        assert all(p[2] // 8 * 32 >= need for p, need in zip(parts, needs))
    for (wa, pa), (wb, pb) in combinations(zip(needs, parts), 2):
        assert (wa - wb) * (pa[2] - pb[2]) >= 0

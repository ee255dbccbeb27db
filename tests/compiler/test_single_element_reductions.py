"""Reductions over dims of size 1 (compiler.planner.rewrite `_single_element`): element-wise ops
and a reshape instead of a reduction kernel, with torch's values (a float sum turns -0 into +0,
max, min and prod keep it), and a cross entropy's gradient, which sums its scattered one-hot
over such a dim, computed where its readers want it."""

from __future__ import annotations

import torch
import torch.nn as nn

import compiler.planner.rewrite as rewrite
from compiler.compile import compile_function
from compiler.kernels.reduce import ReduceKernel
from runtime import Device
from tests.compiler.test_dealt_columns import mlp_step, planned_kernels


def reductions(d):
    x, i, t = d["x"], d["i"], d["t"]
    return {"sum": x.sum(1), "sum_kept": x.sum(1, keepdim=True), "max": x.amax(1), "min": x.amin(1, keepdim=True),
            "prod": x.prod(1), "mean": x.mean(1), "int_sum": i.sum(1), "any": t.any(1), "both": x.sum((1, 3))}


def test_reductions_over_size_one_dims_are_element_wise_with_torchs_values(mini, monkeypatch):
    x = torch.randn(4, 1, 6, 1)
    x[0, 0, :4, 0] = torch.tensor([-0.0, float("nan"), float("inf"), -float("inf")])
    inputs = {"x": x, "i": torch.randint(-5, 5, (3, 1, 5), dtype=torch.int32), "t": torch.rand(3, 1, 5) > 0.5}
    kernels = planned_kernels(monkeypatch)
    compiled = compile_function(reductions, inputs, mini)
    got, want = Device(mini).execute(compiled, inputs), reductions(inputs)
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=0, atol=0, equal_nan=True, msg=name)
        if want[name].is_floating_point():
            assert torch.equal(got[name].signbit(), want[name].signbit()), name  # -0 summed is +0
    assert not [k.node.label for k in kernels if isinstance(k, ReduceKernel)]


def test_a_reduction_over_a_dim_of_size_one_and_another_still_reduces(mini):
    x = torch.randn(4, 1, 6)
    compiled = compile_function(lambda d: {"y": d["x"].sum((1, 2))}, {"x": x}, mini)
    torch.testing.assert_close(Device(mini).execute(compiled, {"x": x})["y"], x.sum((1, 2)))


def mlp_step_cycles(monkeypatch, folded: bool) -> tuple[int, nn.Module]:
    """Cycles of one SGD step of a 256-128-100 MLP's cross entropy (batch 64) on mini, with
    single-element reductions rewritten or left to the reduction kernels, and the model after it."""
    g = torch.Generator().manual_seed(1)
    batch = {"x": torch.randn(64, 256, generator=g), "t": torch.randint(0, 100, (64,), generator=g)}
    with monkeypatch.context() as patch:
        if not folded:
            patch.setattr(rewrite, "_single_element", lambda b, node: False)
        return mlp_step("mini", (256, 128, 100), batch)


def test_a_cross_entropy_step_takes_fewer_cycles_with_its_gradients_sum_element_wise(monkeypatch):
    """The gradient of a cross entropy scatters -1/N into (N, 1, C) and sums the 1 away: as an
    element-wise op it is computed where the logits' gradient is (410,680 cycles on mini against
    456,940 for the reduction kernel's own layout); the same weights either way."""
    folded, model = mlp_step_cycles(monkeypatch, True)
    kernel_made, reference = mlp_step_cycles(monkeypatch, False)
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    assert folded < 0.95 * kernel_made, (folded, kernel_made)

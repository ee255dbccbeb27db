"""Products whose C comes out with its columns dealt to the MAB's PEs a long word at a time
(`Tiling.n_dealt`): B's columns are stored in the order the MAU writes C's, so that C is in the
layout a B operand deals K in. A weight's gradient then arrives in the runs its update reads."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import compiler.compile as compile_module
from compiler.compile import compile_function
from compiler.chain import Chain
from compiler.kernels import matmul
from compiler.kernels.context import EmitContext
from compiler.layout import W_AXIS, Factor
from mlsdk import Context, MNCoreSGD, MNDevice
from runtime import Device
from tests.mlsdk.test_training import MLP, registered, training_step


def planned_kernels(monkeypatch) -> list:
    """The kernels of every plan compiled from now on, as the planner chose them."""
    kernels: list = []
    emit = compile_module.emit

    def recording(plan):
        kernels.extend(s.kernel for s in plan.steps)
        return emit(plan)
    monkeypatch.setattr(compile_module, "emit", recording)
    return kernels


def products(kernels: list) -> list[matmul.MatmulKernel]:
    return [k for k in kernels if isinstance(k, matmul.MatmulKernel)]


def only(monkeypatch, dealt: bool) -> None:
    """Let the planner choose among the tilings with (or without) dealt columns only (dealt ones
    offered for every product, whoever reads it)."""
    planned = matmul._tilings_for
    if dealt:
        monkeypatch.setattr(matmul, "_dealt_columns_read", lambda node, planner: True)
    monkeypatch.setattr(matmul, "_tilings_for", lambda node, planner, trans_b: [
        t for t in planned(node, planner, trans_b) if t.n_dealt == dealt])


PRODUCTS = {
    "a @ b": (lambda d: {"c": d["a"] @ d["b"]}, lambda: {"a": torch.randn(24, 40), "b": torch.randn(40, 48)}),
    "a @ w.T": (lambda d: {"c": d["a"] @ d["w"].T}, lambda: {"a": torch.randn(24, 40), "w": torch.randn(48, 40)}),
    "bmm": (lambda d: {"c": torch.bmm(d["a"], d["b"])},
            lambda: {"a": torch.randn(3, 20, 36), "b": torch.randn(3, 36, 40)}),
    "half a @ w.T": (lambda d: {"c": d["a"] @ d["w"].T},
                     lambda: {"a": torch.randn(16, 64).half(), "w": torch.randn(64, 64).half()}),
}


@pytest.mark.parametrize("name", list(PRODUCTS))
def test_dealt_columns_compute_the_product(mini, monkeypatch, name):
    """Forced to dealt tilings, products (B plain and transposed, batched, half) give torch's
    values, and C's columns are (long word, PE, lane) from the inside: the PE digit between the
    lanes and the address digit of the tile's long words."""
    fn, make = PRODUCTS[name]
    torch.manual_seed(len(name))
    inputs = make()
    only(monkeypatch, dealt=True)
    kernels = planned_kernels(monkeypatch)
    compiled = compile_function(fn, inputs, mini)
    got = Device(mini).execute(compiled, inputs)["c"]
    want = fn({k: v.float() for k, v in inputs.items()})["c"]
    tolerance = 2e-2 if "half" in name else 1e-5
    torch.testing.assert_close(got.float(), want, rtol=tolerance, atol=tolerance * want.abs().max().item())
    (kernel,) = products(kernels)
    t, pes = kernel.t, Chain.of(mini).pes_per_unit
    epl = mini.elements_per_lw(kernel.out_dtype)
    assert t.n_dealt
    assert kernel.lc_out.dims[-1][-3:] == (Factor(t.nt // pes // epl, None, 1), Factor(pes, Chain.of(mini).pe_axis, 1),
                                           Factor(epl, W_AXIS, 1))


@pytest.mark.parametrize("float_dtype, tolerance", [("mixed", 2e-3), ("pfloat32", 2e-5), ("float64", 1e-6)])
@pytest.mark.parametrize("name", ["a @ b", "a @ w.T"])
def test_dealt_columns_in_every_format_the_mau_multiplies(mini, monkeypatch, float_dtype, tolerance, name):
    """B's columns converted in LM (mixed: float32 staged, half multiplied; float64) or read as
    pseudo-single keep the order dealt columns give them: torch's values within the format's
    precision (relative to the largest)."""
    fn, make = PRODUCTS[name]
    torch.manual_seed(7)
    inputs = make()
    only(monkeypatch, dealt=True)
    kernels = planned_kernels(monkeypatch)
    compiled = compile_function(fn, inputs, mini, options={"float_dtype": float_dtype})
    got, want = Device(mini).execute(compiled, inputs)["c"], fn(inputs)["c"]
    assert [k.t.n_dealt for k in products(kernels)] == [True]
    assert (got - want).abs().max().item() <= tolerance * want.abs().max().item()


def test_only_tilings_whose_lanes_agree_are_dealt(mini):
    """B's columns are permuted by long word: with half B (4 a long word, B not transposed) and a
    float32 C (2 a long word) a B long word would hold columns of two of C's, so no tiling of such
    a product is dealt; tilings with fewer than two of C's long words a PE have nothing to deal."""
    ask = dict(batched=False, half=True, staged_in_float32=False, in_bytes=2, dealt=True)
    plain = matmul.tilings(EmitContext(mini), matmul.Problem(1, 32, 64, 64), trans_b=False, **ask)
    transposed = matmul.tilings(EmitContext(mini), matmul.Problem(1, 32, 64, 64), trans_b=True, **ask)
    assert plain and not any(t.n_dealt for t in plain)
    assert any(t.n_dealt for t in transposed)
    pes = Chain.of(mini).pes_per_unit
    assert all(t.nt // pes // mini.elements_per_lw("float32") >= 2 for t in transposed if t.n_dealt)


def mlp_step(chip: str, sizes: tuple[int, int, int], batch: dict[str, torch.Tensor]) -> tuple[int, nn.Module]:
    """One SGD step (lr 0.1, momentum 0.9) of the training suite's MLP (Linear, ReLU, Linear
    through `sizes`, cross entropy; torch's initialisation from seed 0) compiled on `chip`: the
    step's cycles and the model after it."""
    torch.manual_seed(0)
    model = MLP(*sizes)
    ctx = Context(MNDevice(chip))
    optimizer = MNCoreSGD(model.parameters(), 0.1, 0.9)
    registered(ctx, model, optimizer)
    ctx.compile(training_step(model, optimizer), batch, None)(batch)["loss"].item()
    ctx.synchronize()
    return ctx.session.calls[-1].stats.total_cycles, model


def test_a_weights_gradient_is_made_in_the_runs_its_update_reads(mini, monkeypatch):
    """The first weight's gradient (dL/dW = G^T X) is a product whose C the update reads in the
    weight's layout, where the forward product (X W^T, W as B) deals W's columns to the PEs a
    long word at a time. With dealt tilings on offer the planner makes the gradient dealt, and
    the step takes fewer cycles than with block tilings only; both steps give torch's weights."""
    torch.manual_seed(0)
    ref = MLP(96, 64)
    ref_opt = torch.optim.SGD(ref.parameters(), 0.1, 0.9)
    torch.manual_seed(0)
    x, t = torch.randn(16, 96), torch.randint(0, 10, (16,))
    training_step(ref, ref_opt)({"x": x, "t": t})
    results = {}
    for dealt in (None, False):
        with monkeypatch.context() as patch:
            if dealt is not None:
                only(patch, dealt)
            kernels = planned_kernels(patch)
            results[dealt] = (*mlp_step("mini", (96, 64, 10), {"x": x, "t": t}), kernels)
    (with_dealt, model, kernels), (blocks_only, model_blocks, _) = results[None], results[False]
    for m in (model, model_blocks):
        for p, q in zip(m.parameters(), ref.parameters()):
            torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-5, atol=1e-6)
    gradient = [k for k in products(kernels) if tuple(k.node.out.shape) == (64, 96)]
    assert gradient and all(k.t.n_dealt for k in gradient)
    assert with_dealt < 0.8 * blocks_only, (with_dealt, blocks_only)


def test_row_reductions_of_dealt_columns_go_in_two_steps_without_relayouts(mini, monkeypatch):
    """A row's maximum, sum and minimum over a product whose columns are dealt (8 x 256 on mini:
    long word, PE, lane inside each L1B and MAB) reduce in two steps as over columns in blocks:
    over the digits each PE holds (the long words and lanes, which are not one run of columns),
    then across the MABs and PEs; torch's values, no relayout."""
    from tests.compiler.test_row_reductions import _three_reductions
    only(monkeypatch, dealt=True)
    kernels = planned_kernels(monkeypatch)
    g = torch.Generator().manual_seed(0)
    inputs = {"a": torch.randn(8, 16, generator=g), "b": torch.randn(16, 256, generator=g)}
    compiled = compile_function(_three_reductions, inputs, mini)
    got = Device(mini).execute(compiled, inputs)
    for name, want in _three_reductions(inputs).items():
        torch.testing.assert_close(got[name], want, rtol=1e-5, atol=1e-4)
    assert [k.t.n_dealt for k in products(kernels)] == [True]
    assert not [label for *_, label in compiled.program.labels if label.startswith("relayout")]

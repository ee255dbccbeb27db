"""Transposed convolutions (and a strided convolution's input gradient) read their input spread
by the stride (`Builder.conv`'s input dilation) where it is stored: the direct form's window has
holes between x's pixels, instead of a chain of pads and slices spreading x with zeros first."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import hwdesc
import compiler.planner.rewrite as rewrite_module
from compiler.compile import compile_function
from compiler.frontend.tracing import trace
from compiler.ir import evaluate
from compiler.planner.rewrite import rewrite
from runtime import Device
from sim import Machine

from .test_compile import check


@pytest.fixture(scope="module")
def mini_device() -> Device:
    return Device(hwdesc.load("mini"))


# (x, weight (Cin, Cout, kh, kw), stride, padding, output_padding)
TRANSPOSED = [((2, 8, 5, 6), (8, 4, 3, 3), 2, 1, 1), ((1, 16, 8, 8), (16, 8, 3, 3), 2, 1, 0),
              ((1, 8, 4, 4), (8, 8, 4, 4), 2, 1, 0), ((1, 8, 6, 6), (8, 8, 1, 1), 2, 0, 1),
              ((2, 3, 5, 5), (3, 8, 3, 3), 3, 2, 2)]


def _transposed(shape, stride, padding, output_padding, seed=0):
    torch.manual_seed(seed)
    w = torch.randn(*shape)
    return lambda d: {"y": F.conv_transpose2d(d["x"], w, stride=stride, padding=padding,  # noqa: E731
                                              output_padding=output_padding)}


def _kinds(fn, inputs, hw) -> list[str]:
    graph = trace(fn, inputs, None)
    rewrite(graph, hw)
    return [n.kind for n in graph.nodes]


@pytest.mark.parametrize("x_shape, w_shape, stride, padding, output_padding", TRANSPOSED)
def test_a_transposed_convolution_reads_its_input_spread_where_it_lies(mini_device, monkeypatch, x_shape, w_shape,
                                                                        stride, padding, output_padding):
    """Values against torch; one conv node and no pad or slice; and fewer cycles than the same
    convolution of x spread with zeros by pads and slices first (what a direct form that does not
    fit gets), whose values agree too."""
    fn = _transposed(w_shape, stride, padding, output_padding)
    inputs = {"x": torch.randn(*x_shape)}
    hw = mini_device.hw
    kinds = _kinds(fn, inputs, hw)
    assert kinds.count("conv") == 1 and "pad" not in kinds and "slice" not in kinds, kinds
    machine = Machine(hw)
    fused = machine.time(check(mini_device, fn, inputs).program.code).total_cycles
    monkeypatch.setattr(rewrite_module, "direct_possible", lambda *a, **k: False)
    assert "pad" in _kinds(fn, inputs, hw)
    spread = machine.time(check(mini_device, fn, inputs).program.code).total_cycles
    assert fused < 0.7 * spread, (fused, spread)


def test_grouped_transposed_convolutions_spread_their_input_explicitly(mini_device):
    torch.manual_seed(3)
    w = torch.randn(8, 2, 3, 3)
    fn = lambda d: {"y": F.conv_transpose2d(d["x"], w, stride=2, padding=1, groups=4)}  # noqa: E731
    inputs = {"x": torch.randn(1, 8, 5, 5)}
    assert "pad" in _kinds(fn, inputs, mini_device.hw)
    check(mini_device, fn, inputs)


def test_a_strided_convolutions_input_gradient_reads_the_output_gradient_spread(mini_device):
    """The backward of a stride-2 convolution: the input gradient is one conv of the output
    gradient with an input dilation of 2, no pad or slice in the graph; the gradient against
    torch's, by the graph's reference semantics and on the chip."""
    torch.manual_seed(4)
    w = torch.randn(16, 8, 3, 3)

    def fn(d):
        y = F.conv2d(d["x"], w, stride=2, padding=1)
        (gx,) = torch.autograd.grad((y * d["g"]).sum(), d["x"])
        return {"gx": gx}
    inputs = {"x": torch.randn(2, 8, 9, 9).requires_grad_(), "g": torch.randn(2, 16, 5, 5)}
    want = fn(inputs)["gx"].detach()
    graph = trace(fn, inputs, None)
    convs = [n for n in graph.nodes if n.kind == "conv"]
    assert [tuple(n.attrs["input_dilation"]) for n in convs] == [(2, 2)]  # (the forward is not returned)
    assert not [n for n in graph.nodes if n.kind in ("pad", "slice")]
    torch.testing.assert_close(evaluate(graph, inputs)["gx"], want, rtol=1e-5, atol=1e-5)
    got = mini_device.execute(compile_function(fn, inputs, mini_device.hw), inputs)["gx"]
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * want.abs().max().item())


def test_a_transposed_convolution_without_a_direct_form_spreads_its_input(mini_device):
    """Channels that need padding for the direct form (3) while another node reads x too (x
    would be stored with the padded channels): x is spread by pads and slices first, and the
    convolution still computes. (An image row too wide for a tile and its halo in the PE memories
    is spread so too.)"""
    torch.manual_seed(5)
    w = torch.randn(3, 8, 3, 3)
    fn = lambda d: {"y": F.conv_transpose2d(d["x"], w, stride=2, padding=1), "z": d["x"] + 1}  # noqa: E731
    inputs = {"x": torch.randn(1, 3, 6, 5)}
    kinds = _kinds(fn, inputs, mini_device.hw)
    assert "pad" in kinds and "slice" in kinds
    check(mini_device, fn, inputs)
    wide = {"x": torch.randn(1, 16, 4, 140)}
    assert "pad" in _kinds(_transposed((16, 8, 3, 3), 2, 1, 0), wide, mini_device.hw)

"""Max- and average-pooling: values and indices against torch (padding, dilation, ceil_mode,
NaN and ties), and the layouts a pooling window is gathered in: the window keeps the lanes of
the dim it copies (channels), where a convolution leaves them, so that its Data Engines move
runs of long words instead of one long word an MV."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import hwdesc
import sim.isa as isa
from compiler.compile import compile_function
from compiler.frontend.tracing import trace
from compiler.kernels.movement import window_copies
from compiler.layout import W_AXIS, parse
from runtime import Device


@pytest.fixture(scope="module")
def mini() -> Device:
    return Device(hwdesc.load("mini"))


@pytest.mark.parametrize("kernel, stride, padding, dilation, ceil_mode", [
    (2, 2, 0, 1, False), (3, 2, 1, 1, False), (3, 1, 1, 1, False), (3, 2, 1, 2, False), (3, 2, 0, 1, True),
    ((2, 3), (1, 2), (1, 1), 1, True)])
def test_max_pooling_values_and_indices_match_torch(mini, kernel, stride, padding, dilation, ceil_mode):
    """Indices are flat positions in the input image (row * W + column), the first maximum in
    window order; a NaN is its window's maximum. They are computed from iotas over the window's
    positions (legalize_nn._patch_positions), never from padding positions."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 6, 9, 11, generator=g)
    x[0, 1, 4, 4] = float("nan")
    x[1, 2, 3, 5] = x[1, 2, 3, 6] = x[1, 2, 4, 5] = 7.0  # ties: the first in the window wins
    x[1, 4] = -float("inf")  # a channel of -inf: the indices still name positions inside the image

    def fn(d):
        v, i = F.max_pool2d(d["x"], kernel, stride, padding, dilation, ceil_mode, return_indices=True)
        return {"v": v, "i": i}
    got = mini.execute(compile_function(fn, {"x": x}, mini.hw), {"x": x})
    want = fn({"x": x})
    torch.testing.assert_close(got["v"], want["v"], rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(got["i"], want["i"], rtol=0, atol=0)


def test_average_pooling_matches_torch(mini):
    x = torch.randn(2, 6, 9, 11, generator=torch.Generator().manual_seed(4))
    fn = lambda d: {"y": F.avg_pool2d(d["x"], 3, 2, 1), "z": F.avg_pool2d(d["x"], 2, count_include_pad=False)}  # noqa: E731
    got = mini.execute(compile_function(fn, {"x": x}, mini.hw), {"x": x})
    for name, want in fn({"x": x}).items():
        torch.testing.assert_close(got[name], want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("pool, shape", [(lambda x: F.max_pool2d(x, 2), (2, 3, 8, 10)),
                                         (lambda x: F.max_pool2d(x, 2, padding=1, ceil_mode=True), (2, 3, 7, 9)),
                                         (lambda x: F.avg_pool2d(x, 3, padding=1, count_include_pad=False), (1, 4, 8, 7)),
                                         # a window wider than the image: offsets outside it share codes
                                         (lambda x: F.max_pool2d(x, (2, 3), padding=1), (2, 3, 5, 1))])
def test_the_gradient_of_windows_that_tile_the_input_is_one_comparison_laid_back_by_a_view(mini, pool, shape):
    """Windows with stride = kernel cover each input position at most once: the input gradient
    is computed over the tiles (Ho, kh, Wo, kw) at once and read back as the image, padded or
    cropped by one pad. Placing each window offset's share took kh * kw pads, slices and sums
    (a CIFAR-sized training step on mncore2: 22.8 M -> 13.4 M cycles)."""
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(5))

    def fn(d):
        xg = d["x"].requires_grad_()
        (gx,) = torch.autograd.grad(pool(xg).pow(2).sum(), [xg])
        return {"gx": gx}
    graph = trace(fn, {"x": x})
    kinds = [n.kind for n in graph.nodes]
    assert kinds.count("pad") <= 1 and "slice" not in kinds, kinds
    got = mini.execute(compile_function(fn, {"x": x}, mini.hw), {"x": x})
    torch.testing.assert_close(got["gx"], fn({"x": x.clone()})["gx"], rtol=1e-5, atol=1e-5)


def test_the_tiled_max_pooling_gradient_compares_codes_with_one_table_of_offsets():
    """The comparison over the tiles reads the forward's indices less each window's origin and a
    (kh, kw) table of offsets that every window shares, not a map of positions per window: that
    varies along the windows but not along the batch and channels, which stages only in some
    layouts (a CNN step's pooling gradient was gathered by its readers in single long words)."""
    x = torch.randn(2, 3, 8, 6, generator=torch.Generator().manual_seed(6))

    def fn(d):
        xg = d["x"].requires_grad_()
        (gx,) = torch.autograd.grad(F.max_pool2d(xg, 2).pow(2).sum(), [xg])
        return {"gx": gx}
    graph = trace(fn, {"x": x})
    tiles = (2, 3, 4, 2, 3, 2)
    [eq] = [n for n in graph.nodes if n.kind == "ew" and n.op == "eq" and n.out.shape == tiles]
    producers = {n.out: n for n in graph.nodes}
    sizes = []
    for operand in eq.inputs:
        while operand in producers and producers[operand].kind in ("expand", "reshape"):
            operand = producers[operand].args[0]
        sizes.append(operand.shape)
    assert sorted(sizes, key=len) == [(2, 1, 2), (2, 3, 4, 3)], sizes  # the offsets; the codes at the outputs' shape


def test_a_pooling_window_copies_the_batch_and_channels():
    """window_copies: the output dims a window reads unchanged from a source dim (a pooling's
    N and C), and not the strided or flipped ones."""
    graph = trace(lambda d: {"y": F.max_pool2d(d["x"], 3, 2, 1)}, {"x": torch.randn(2, 4, 8, 8)})
    window = next(n for n in graph.nodes if n.kind == "window")
    assert window_copies(window) == {0: 0, 1: 1}
    graph = trace(lambda d: {"y": d["x"].flip(1)}, {"x": torch.randn(3, 5)})
    flips = [n for n in graph.nodes if n.kind == "window"]
    assert all(0 not in window_copies(n).values() or 1 not in window_copies(n).values() for n in flips)


def _stem(d):
    return {"y": F.max_pool2d(F.relu(F.conv2d(d["x"], d["w"], None, 2, 3)), 3, 2, 1)}


def _window_mvs(compiled) -> tuple[int, int]:
    """MVs in the range labelled as the pooling window's gather, and the long words its output spans."""
    program = compiled.program
    start, end = next((a, b) for a, b, name in program.labels if "(window)" in name)
    mvs = int((program.code[start:end, 0] == isa.Op.MV).sum())
    patches = next(v for k, v in compiled.summary["layouts"].items() if k.startswith("temp:max_pool2d"))
    layout = parse(patches)
    return mvs, layout.numel // 2


@pytest.mark.parametrize("chip", ["mini", "mncore2"])
def test_a_pooling_window_keeps_the_channels_a_convolution_left_in_the_lanes(chip):
    """ResNet's stem: conv 7x7 / 2, relu, max-pool 3x3 / 2. The relu, read only by the window,
    computes in a layout with the channels' long words on the PEs and MABs (movement.wishes), and
    the patches keep the channels in their lanes (reduce._window_lanes): the window's MVs move
    several long words each, where lanes on the output columns (read at stride 2) made one MV of
    every long word (ResNet-18 at 224 x 224: 1.8 M MVs, 15.4 M of its 23.0 M cycles)."""
    hw = hwdesc.load(chip)
    g = torch.Generator().manual_seed(5)
    x, w = torch.randn(1, 3, 40, 40, generator=g), torch.randn(16, 3, 7, 7, generator=g) * 0.1
    compiled = compile_function(_stem, {"x": x, "w": w}, hw)
    layouts = {k.split(":", 1)[1]: parse(v) for k, v in compiled.summary["layouts"].items() if k.startswith("temp:")}
    for name in ("relu", "max_pool2d_with_indices"):
        lanes = [d for d, f in layouts[name].factors if f.axis == W_AXIS and f.size > 1]
        assert lanes == [1], (name, layouts[name])
    mvs, lw = _window_mvs(compiled)
    # a pixel's 16 channels are 8 long words: at least 6 an MV on average (8.2 on mncore2, 34 on
    # mini, whose windows span more pixels a run); with lanes on the columns, 4.2 on both
    assert mvs * 6 <= lw, (mvs, lw)
    got = Device(hw).execute(compiled, {"x": x, "w": w})
    torch.testing.assert_close(got["y"], _stem({"x": x, "w": w})["y"], rtol=1e-5, atol=1e-5)


def test_a_source_with_another_reader_keeps_the_layout_that_reader_gets(mini):
    """The window's wish stands back when its source has another reader (a training step's relu
    backward reads the relu's output too): the relu then computes where the planner prices it
    for both, and the pooling still matches torch."""
    g = torch.Generator().manual_seed(6)
    x, w = torch.randn(1, 3, 40, 40, generator=g), torch.randn(16, 3, 7, 7, generator=g) * 0.1

    def fn(d):
        r = F.relu(F.conv2d(d["x"], d["w"], None, 2, 3))
        return {"y": F.max_pool2d(r, 3, 2, 1), "s": r * 2}
    graph = trace(fn, {"x": x, "w": w})
    relu = next(n for n in graph.nodes if n.op == "relu")
    window = next(n for n in graph.nodes if n.kind == "window")
    users = graph.users()[relu.out]
    assert window in users and len(users) == 2

    class Planner:  # what movement.wishes asks of the planner
        hw = mini.hw
        users = graph.users()

        @staticmethod
        def budget(_):
            return 1024
    from compiler.kernels.movement import wishes
    assert wishes(window, relu.out, Planner) == []
    got = mini.execute(compile_function(fn, {"x": x, "w": w}, mini.hw), {"x": x, "w": w})
    for name, want in fn({"x": x, "w": w}).items():
        torch.testing.assert_close(got[name], want, rtol=1e-5, atol=1e-5)

"""Layouts that keep a channels-last tensor's channels in runs (`layout.spread.lane_runs`): what
the planner offers an element-wise op between two convolutions (a ResNet block's batch norm and
relu), so that it stages the first one's channels-last output and feeds the second's im2col in
runs of a pixel's channels instead of single long words."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import hwdesc
from compiler.compile import compile_function
from compiler.layout import W_AXIS, lane_dims
from compiler.layout.spread import lane_runs
from compiler.planner import search
from runtime import Device


@pytest.mark.parametrize("channels", [64, 256])
def test_lane_runs_put_the_channels_long_words_on_the_pes_then_the_mabs(channels):
    """Lanes on the channels and the PE and MAB axes on them: blocked (axes outermost) and cyclic
    (address outermost), the latter distinct once the channels' long words exceed a L1B's PEs."""
    hw = hwdesc.load("mncore2")
    shape = (1, channels, 14, 14)
    found = lane_runs(shape, 2, hw.axes, 1, 1 << 20)
    assert 1 <= len(found) <= 2
    for layout in found:
        assert layout.shape == shape
        on_channels = [f.axis for d, f in layout.factors if d == 1]
        assert on_channels[-1] == W_AXIS and "PE" in on_channels and "MAB" in on_channels, layout
        assert not any(f.axis in ("PE", "MAB") for d, f in layout.factors if d != 1), layout
    # more long words than a L1B's 64 PEs: the cyclic form (the address outermost) comes first, as
    # a consumer offers the first wish its producer can make (ResNet-50: 17.3 M -> 7.3 M cycles)
    cyclic_first = channels // 2 > 64
    assert (found[0].dims[1][0].axis is None) is cyclic_first, found


def _block(d, also_read: bool = False):
    """Two convolutions with a scaled relu between them, as in a ResNet block; `also_read`: the
    relu's result read by another op too."""
    r = F.relu(F.conv2d(d["x"], d["w1"], None, 2, 1) * d["s"])
    out = {"y": F.conv2d(r, d["w2"], None, 1, 1)}
    if also_read:
        out["r"] = r * 2
    return out


def _inputs():
    g = torch.Generator().manual_seed(7)
    return {"x": torch.randn(1, 32, 28, 28, generator=g), "w1": torch.randn(128, 32, 3, 3, generator=g) * 0.1,
            "w2": torch.randn(128, 128, 3, 3, generator=g) * 0.05, "s": torch.rand(1, 128, 1, 1, generator=g)}


def test_an_op_between_convolutions_is_offered_channel_runs(monkeypatch):
    """On mini the block's program with the candidates (and their twins gathering in blocks)
    takes fewer cycles than without (578,576 against 650,880 when written), and both match
    torch."""
    hw = hwdesc.load("mini")
    inputs = _inputs()
    device = Device(hw)
    with_runs = compile_function(_block, inputs, hw)
    monkeypatch.setattr(search.Planner, "_read_by_windows", lambda self, group: False)
    without = compile_function(_block, inputs, hw)
    assert with_runs.summary["planned_cycles"] < without.summary["planned_cycles"]
    want = _block(inputs)["y"]
    for compiled in (with_runs, without):
        torch.testing.assert_close(device.execute(compiled, inputs)["y"], want, rtol=1e-4, atol=1e-4)


def test_channel_runs_are_offered_only_where_windows_read_every_result():
    """A result another node reads too (a training step's relu backward reads the forward's
    activations) keeps the layouts that reader is priced against."""
    from compiler.frontend.tracing import trace
    from compiler.kernels.elementwise import Group
    inputs = _inputs()
    for also_read in (False, True):
        graph = trace(lambda d: _block(d, also_read), inputs)
        planner = search.Planner(graph, hwdesc.load("mini"), {}, {})
        relu = next(n for n in graph.nodes if n.op == "relu")
        assert planner._read_by_windows(Group([relu], list(relu.inputs), [relu.out])) is not also_read


def test_a_convolution_wishes_its_input_with_the_channels_in_runs():
    """conv.wishes: x in the `lane_runs` layouts, nothing for the weight; conv.reads_as_is: any
    placement with the channels in the lanes is read without a relayout (so a producer's
    candidate that has them is not charged the copy into a wished layout)."""
    from compiler.frontend.tracing import trace
    from compiler.kernels import conv
    from compiler.kernels.context import Ref
    from compiler.layout import Placement, parse
    hw = hwdesc.load("mncore2")
    inputs = _inputs()
    graph = trace(_block, inputs)
    planner = search.Planner(graph, hw, {}, {})
    second = [n for n in graph.nodes if n.kind == "conv"][1]
    x, w = second.args
    assert conv.wishes(second, x, planner) == lane_runs(x.shape, 2, hw.axes, 1, planner.budget(2))
    assert conv.wishes(second, w, planner) == []
    channels = Placement(parse("(1, 128, 14, 14)/((1:1), (64:1, 2_W:1), (14:896), (14:64))"), hw, "DRAM", "float32")
    columns = Placement(parse("(1, 128, 14, 14)/((1:1), (128:7), (14:896), (7:1, 2_W:1))"), hw, "DRAM", "float32")
    assert lane_dims(channels.layout) == [1] and lane_dims(columns.layout) == [3]
    assert conv.reads_as_is(second, x, Ref("x", channels, None), planner)
    assert not conv.reads_as_is(second, x, Ref("x", columns, None), planner)
    assert not conv.reads_as_is(second, w, Ref("w", channels, None), planner)


class _Bottleneck(torch.nn.Module):
    """ResNet-50's block: 1x1, 3x3, 1x1 convolutions with batch norm, the sum with the input
    (through a 1x1 convolution when the channels change) and a relu."""

    def __init__(self, cin: int, mid: int) -> None:
        super().__init__()
        nn = torch.nn
        self.body = nn.Sequential(nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid), nn.ReLU(),
                                  nn.Conv2d(mid, mid, 3, 1, 1, bias=False), nn.BatchNorm2d(mid), nn.ReLU(),
                                  nn.Conv2d(mid, 4 * mid, 1, bias=False), nn.BatchNorm2d(4 * mid))
        self.down = None if cin == 4 * mid else nn.Sequential(nn.Conv2d(cin, 4 * mid, 1, bias=False),
                                                              nn.BatchNorm2d(4 * mid))

    def forward(self, x):
        return F.relu(self.body(x) + (x if self.down is None else self.down(x)))


def _two_blocks(monkeypatch, wishes: bool, mode: str):
    """Two bottleneck blocks at 28x28 on mncore2, parameters registered: the call's cycles and output."""
    from mlsdk import Context, MNDevice, set_tensor_name_in_module
    import compiler.kernels as kernels
    if not wishes:
        monkeypatch.setitem(kernels.WISHES, "conv", lambda user, v, planner: [])
    torch.manual_seed(0)
    model = torch.nn.Sequential(_Bottleneck(64, 64), _Bottleneck(256, 64)).eval()
    ctx = Context(MNDevice("mncore2:auto"))
    set_tensor_name_in_module(model, "m")
    for p in model.parameters():
        ctx.register_param(p)
    for b in model.buffers():
        ctx.register_buffer(b)
    x = torch.randn(1, 64, 28, 28, generator=torch.Generator().manual_seed(10))
    fn = ctx.compile(lambda d: {"y": model(F.relu(d["x"]))}, {"x": x}, None, options={"simulation_mode": mode})
    out = fn({"x": x})["y"]
    with torch.no_grad():
        want = model(F.relu(x))
    return fn.last_cycles, (out.cpu() if mode != "timing" else None), want


def test_residual_blocks_compute_where_the_next_convolution_reads(monkeypatch):
    """A block's output is read by the next block's convolution and by its sum: the convolution's
    wish is the only say the convolution has in that layout (224,070 cycles against 296,076
    without, when written; ResNet-50 at 224x224: 35.5 M -> 17.3 M, two relayouts of 2.8-9.9 M
    gone). The values match torch."""
    cycles, got, want = _two_blocks(monkeypatch, True, "both")
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    without, _, _ = _two_blocks(monkeypatch, False, "timing")
    assert cycles < without

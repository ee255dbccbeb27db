"""Convolutions computed directly (compiler.kernels.conv.Direct): x's tiles, halos included, in
the PE memories, one MATMUL per kernel position at a shifted address (reading A's rows `stride`
apart), the output a view of the product. Values against torch, the MATMULs against the rule
derived by hand, and the planner's choice against the im2col candidates alone."""

from __future__ import annotations

from math import ceil

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import hwdesc
import sim.isa as isa
from compiler.compile import compile_function
from compiler.frontend.tracing import trace
from compiler.kernels import conv
from compiler.kernels.context import Ref
from compiler.layout import Placement, parse
from compiler.planner.rewrite import rewrite
from compiler.planner.search import Planner
from compiler.transfer.gather import lw_sources
from runtime import Device
from sim import Machine
from sim.params import MachineParams

from .test_compile import check as run  # compiled on the device's chip, against torch to rtol of the largest


@pytest.fixture(scope="module")
def mini_device() -> Device:
    return Device(hwdesc.load("mini"))


@pytest.fixture
def only_direct(monkeypatch):
    """The planner offered the direct candidates only (the im2col ones dropped), so that a test
    checks what the direct kernel computes however the ranking goes."""
    plan = conv.plan

    def direct_only(node, planner):
        kernels = [k for k in plan(node, planner) if k.direct is not None]
        assert kernels, "the convolution should have direct candidates"
        return kernels
    from compiler import kernels
    monkeypatch.setitem(kernels.PLANNERS, "conv", direct_only)


CASES = {  # (N, C, H, W), (Co, kh, kw), padding, dilation[, stride]
    "3x3 same": ((1, 8, 12, 12), (16, 3, 3), 1, 1),
    "two images": ((2, 8, 9, 7), (8, 3, 3), 1, 1),
    "no padding": ((1, 8, 10, 11), (8, 3, 3), 0, 1),
    "5x5 dilated": ((1, 16, 13, 12), (12, 5, 5), 4, 2),
    "3x1 and 1x3": ((2, 8, 6, 10), (8, 3, 1), (1, 0), 1),
    "more padding than kernel": ((1, 8, 5, 5), (8, 2, 2), 2, 1),
    "stride 2": ((1, 8, 9, 9), (8, 3, 3), 1, 1, 2),
    "stride 2, two images, odd sizes": ((2, 8, 10, 7), (16, 3, 3), 1, 1, 2),
    "stride 3, 5x5": ((1, 16, 12, 12), (8, 5, 5), 2, 1, 3),
    "stride 2, dilated, no padding": ((1, 8, 11, 12), (8, 3, 3), 0, 2, 2),
}


@pytest.mark.parametrize("case", list(CASES))
def test_direct_convolutions_match_torch(mini_device, only_direct, case):
    (n, c, h, w), (co, kh, kw), padding, dilation, *stride = CASES[case]
    torch.manual_seed(len(case))
    weight = torch.randn(co, c, kh, kw)
    fn = lambda d: {"y": F.conv2d(d["x"], weight, padding=padding, dilation=dilation,  # noqa: E731
                                  stride=stride[0] if stride else 1)}
    run(mini_device, fn, {"x": torch.randn(n, c, h, w)})


def test_a_direct_convolution_reads_a_weight_the_device_holds_and_feeds_the_next(mini_device, only_direct):
    """Conv -> ReLU -> conv, both weights inputs: B read by view of each weight, the first
    output's padding rows (computed, never zero) never reach the second."""
    torch.manual_seed(1)
    fn = lambda d: {"y": F.conv2d(torch.relu(F.conv2d(d["x"], d["w1"], padding=1)), d["w2"], padding=1)}  # noqa
    inputs = {"x": torch.randn(1, 8, 8, 8), "w1": torch.randn(8, 8, 3, 3), "w2": torch.randn(16, 8, 3, 3)}
    run(mini_device, fn, inputs, rtol=1e-4)


@pytest.mark.parametrize("stride", [1, 2])
def test_each_kernel_position_is_one_matmul_of_the_tile(mncore2, only_direct, stride):
    """The product is kh*kw MATMULs per step over the tile's mt rows, reading A's rows `stride`
    row pitches apart, each costing (sim.isa's MATMUL rule, from units.MAU.matrix.float32)
    ceil(mt / rows) * ceil(K / cols) * max(nt, rows / load_rows_per_cycle) cycles."""
    torch.manual_seed(0)
    weight = torch.randn(64, 64, 3, 3)
    compiled = compile_function(lambda d: {"y": F.conv2d(d["x"], weight, padding=1, stride=stride)},
                                {"x": torch.randn(1, 64, 56, 56)}, mncore2)
    code = compiled.program.code
    matmuls = code[code[:, 0] == isa.Op.MATMUL]
    mode = mncore2.units["MAU"].matrix["float32"]
    pes = MachineParams.from_hw(mncore2).pes_per_mab
    assert len(matmuls) % 9 == 0
    per_step = matmuls.reshape(-1, 9, code.shape[1])
    for step in per_step:
        assert (step[:, isa.MM_M] == step[0, isa.MM_M]).all() and (step[:, isa.MM_N] == step[0, isa.MM_N]).all()
        assert (step[1:, isa.MM_FLAGS] & isa.MM_ACCUMULATE).all()  # every later position adds to C
        a_addresses = step[:, isa.MM_A_ADDR] - step[0, isa.MM_A_ADDR]
        assert (step[:, isa.MM_A_PITCH] == step[0, isa.MM_A_PITCH]).all()
        kp = step[0, isa.MM_A_PITCH] // stride  # K per PE: A's rows, `stride` of them a product row
        assert step[0, isa.MM_A_PITCH] == stride * kp and step[0, isa.MM_K] == kp * pes
        assert (a_addresses % kp == 0).all()
        rows = (a_addresses // kp).tolist()  # position (i, j) starts i row pitches and j pixels on
        pitch = rows[3]
        assert pitch >= 58 and rows == [i * pitch + j for i in range(3) for j in range(3)]
        b_block = kp * step[0, isa.MM_N]  # B: one (K per PE) x N block per position, one after another
        assert (step[:, isa.MM_B_ADDR] - step[0, isa.MM_B_ADDR]).tolist() == [p * b_block for p in range(9)]
    m, k, n = (int(matmuls[0, f]) for f in (isa.MM_M, isa.MM_K, isa.MM_N))
    stats = Machine(mncore2).time(matmuls[:1].copy())
    assert stats.pe_busy == ceil(m / mode.rows) * ceil(k / mode.cols) * max(n, ceil(mode.rows / mode.load_rows_per_cycle))


def test_each_l1bs_tile_is_gathered_into_a_block_of_its_own(mncore2, tmp_path):
    """l2bmb@set: an L2B holds each L1B's tile of x (rows and halo) as one block, sent to that L1B
    alone, so the Data Engines gather x in runs of its rows instead of one l2bmd chunk of 8 long
    words per MV. ResNet-50 conv2_x against a variant whose l2bm broadcast names no subsets (the
    same planner, so it picks among the same candidates): the L1Bs get a broadcast each, in turn,
    and the gather takes far fewer MVs and cycles."""
    torch.manual_seed(0)
    weight = torch.randn(64, 64, 3, 3)
    fn = lambda d: {"y": F.conv2d(d["x"], weight, padding=1)}  # noqa: E731
    inputs = {"x": torch.randn(1, 64, 56, 56)}
    variant = tmp_path / "nosubsets.yaml"
    variant.write_text("extends: mncore2\nname: nosubsets\ntransfers:\n  l2bm_to_l1bm:\n    modes:\n"
                       "      broadcast: {subsets: false}\n")
    runs = {}
    for hw in (mncore2, hwdesc.load(variant)):
        code = compile_function(fn, inputs, hw).program.code
        runs[hw.name] = (int((code[:, 0] == isa.Op.MV).sum()), Machine(hw).time(code).total_cycles, code)
    fan = mncore2.fanout("L2B", "L1B")
    code = runs["mncore2"][2]
    to_one = code[(code[:, 0] == isa.Op.XFER) & (code[:, isa.X_MODE] == isa.Mode.broadcast) & (code[:, isa.X_INDEX] != 0)]
    assert len(to_one) and len(to_one) % fan == 0
    assert to_one[:, isa.X_INDEX].reshape(-1, fan).tolist() == [[1 << k for k in range(fan)]] * (len(to_one) // fan)
    nosubsets = runs["nosubsets"][2]
    assert not (nosubsets[(nosubsets[:, 0] == isa.Op.XFER) & (nosubsets[:, isa.X_MODE] == isa.Mode.broadcast),
                          isa.X_INDEX]).any()
    (mvs, cycles, _), (mvs_dealt, cycles_dealt, _) = runs["mncore2"], runs["nosubsets"]
    assert mvs * 10 < mvs_dealt and cycles * 2 < cycles_dealt, runs


@pytest.mark.parametrize("filters, stride", [(64, 1), (128, 2)])
def test_the_planner_prefers_the_direct_form_where_it_is_faster(mncore2, monkeypatch, filters, stride):
    """ResNet-50 conv2_x (1x64x56x56, 64 3x3 filters) and ResNet-18's first layer2 convolution
    (128 filters, stride 2): with the direct candidates the planner's pick takes fewer cycles
    than the best im2col candidate, on the simulator's timing (the strided one 46,582 -> 25,098)."""
    torch.manual_seed(0)
    weight = torch.randn(filters, 64, 3, 3)
    fn = lambda d: {"y": F.conv2d(d["x"], weight, padding=1, stride=stride)}  # noqa: E731
    inputs = {"x": torch.randn(1, 64, 56, 56)}
    machine = Machine(mncore2)
    with_direct = machine.time(compile_function(fn, inputs, mncore2).program.code).total_cycles
    monkeypatch.setattr(conv, "_direct_kernels", lambda *a, **k: [])
    im2col = machine.time(compile_function(fn, inputs, mncore2).program.code).total_cycles
    assert with_direct < 0.8 * im2col, (with_direct, im2col)


def test_direct_forms_offer_row_pitches_from_the_padded_width_up(mncore2):
    rows = mncore2.units["MAU"].matrix["float32"].rows  # 8
    forms = conv.direct_forms((1, 64, 56, 56), (56, 56), (3, 3), (1, 1), (1, 1), rows)
    assert sorted({f.pitch for f in forms}) == [58, 64]  # the padded width; up to 8s and a power of 2: 64
    for f in forms:
        assert f.shifts.offsets == (0, 1, 2, f.pitch, f.pitch + 1, f.pitch + 2, 2 * f.pitch, 2 * f.pitch + 1,
                                    2 * f.pitch + 2)
        assert f.shifts.halo == 2 * f.pitch + 2
        assert f.rows % f.pitch == 0 and f.rows >= 56 * f.pitch
    two = conv.direct_forms((2, 8, 9, 7), (9, 7), (3, 3), (1, 1), (1, 1), rows)
    assert {f.image_rows for f in two} == {11, 16}  # 9 + 2 padded rows, up to a multiple of 8 and a power of 2
    assert all(f.rows == 2 * f.image_rows * f.pitch for f in two)
    # stride 2: the same shifts, read every other row; an image's 11 padded rows are 6 of the product's
    strided = conv.direct_forms((2, 8, 9, 7), (5, 4), (3, 3), (1, 1), (1, 1), rows, 2)
    assert {f.image_rows for f in strided} == {6, 8} and all(f.stride == 2 for f in strided)
    assert all(f.shifts.offsets == (0, 1, 2, f.pitch, f.pitch + 1, f.pitch + 2, 2 * f.pitch, 2 * f.pitch + 1,
                                    2 * f.pitch + 2) for f in strided)


def test_unequal_strides_and_one_pixel_kernels_have_no_direct_form(mini_device, monkeypatch):
    """Strides (2, 1) (the flattened rows step by one stride), a 1x1 kernel (im2col is x itself)
    and thin channels whose x another node reads too (x would be stored with the padded
    channels) keep to im2col, and still compute."""
    torch.manual_seed(2)
    plan = conv.plan
    offered = []

    def recording(node, planner):
        kernels = plan(node, planner)
        offered.extend(k.direct for k in kernels)
        return kernels
    from compiler import kernels
    monkeypatch.setitem(kernels.PLANNERS, "conv", recording)
    for shape, weight, stride in (((1, 8, 9, 9), torch.randn(8, 8, 3, 3), (2, 1)), ((1, 8, 6, 6), torch.randn(8, 8, 1, 1), 1)):
        fn = lambda d, weight=weight, stride=stride: {"y": F.conv2d(d["x"], weight, padding=1, stride=stride)}  # noqa
        run(mini_device, fn, {"x": torch.randn(*shape)})
    weight = torch.randn(8, 3, 3, 3)
    run(mini_device, lambda d: {"y": F.conv2d(d["x"], weight, padding=1), "z": d["x"] * 2}, {"x": torch.randn(1, 3, 8, 8)})
    assert offered and not any(offered)


@pytest.mark.parametrize("c, stride, weight_as", [(3, 2, "const"), (3, 2, "input"), (5, 1, "input"), (1, 1, "const"),
                                                  (3, 2, "computed")])
def test_thin_channels_are_padded_to_every_pes_long_words(mini_device, only_direct, monkeypatch, c, stride, weight_as):
    """Channels that do not fill a long word in each PE of a MAB (an RGB stem) are padded for the
    direct form: K runs over pes * lanes channels, x is uploaded with that many (zeros past its
    own) and the weight's padded channels are zeros (a constant arranged so by the host, an
    input uploaded so, both read by view; a computed weight, w + 1 with 1 in every padded
    channel, is copied with zero padding by the Data Engines alone: its padded channels fill
    long words of their own, the lanes holding output channels)."""
    chosen = []
    emit = conv.ConvKernel.emit
    monkeypatch.setattr(conv.ConvKernel, "emit", lambda self, ctx, refs: (chosen.append(self), emit(self, ctx, refs))[1])
    torch.manual_seed(c + stride)
    weight = torch.randn(8, c, 3, 3)
    x = torch.randn(1, c, 11, 10)
    if weight_as == "const":
        fn = lambda d: {"y": F.conv2d(d["x"], weight, padding=1, stride=stride)}  # noqa: E731
        inputs = {"x": x}
    elif weight_as == "computed":
        fn = lambda d: {"y": F.conv2d(d["x"], d["w"] + 1, padding=1, stride=stride)}  # noqa: E731
        inputs = {"x": x, "w": weight}
    else:
        fn = lambda d: {"y": F.conv2d(d["x"], d["w"], padding=1, stride=stride)}  # noqa: E731
        inputs = {"x": x, "w": weight}
    device = mini_device
    if weight_as == "computed":  # on a chip whose DRAM holds NaN wherever nothing was written
        device = Device(mini_device.hw)
        device.machine.grow("DRAM", 1 << 20)
        device.machine.memory("DRAM")[:] = np.float32(np.nan).view(np.uint32)
    compiled = run(device, fn, inputs)
    relaid = [(start, end) for start, end, name in compiled.program.labels if name.startswith("relayout")]
    assert len(relaid) == (weight_as == "computed")
    for start, end in relaid:  # MVs only: no VOP or PE transfer
        assert set(compiled.program.code[start:end, 0].tolist()) <= {isa.Op.MV, isa.Op.NOP, isa.Op.WAIT}
    params = MachineParams.from_hw(mini_device.hw)
    lanes = mini_device.hw.elements_per_lw("float32")
    assert chosen[-1].c_pad == ceil(c / (params.pes_per_mab * lanes)) * params.pes_per_mab * lanes


@pytest.mark.parametrize("float_dtype", ["mixed", "pfloat32"])
def test_direct_convolutions_in_the_other_matrix_formats(mini_device, only_direct, float_dtype):
    """Mixed precision stages float32 tiles and converts them (and B's blocks) to half in the PE
    memories; pseudo-single multiplies float32 words with their low mantissa bits ignored."""
    torch.manual_seed(4)
    weight = torch.randn(16, 16, 3, 3)
    fn = lambda d: {"y": F.conv2d(d["x"], weight, padding=1)}  # noqa: E731
    inputs = {"x": torch.randn(2, 16, 7, 9)}
    compiled = compile_function(fn, inputs, mini_device.hw, options={"float_dtype": float_dtype})
    got = mini_device.execute(compiled, inputs)["y"]
    want = fn(inputs)["y"]
    tolerance = 4e-3 if float_dtype == "mixed" else 1e-4  # half: 9 mantissa bits; pseudo-single: 18
    assert (got - want).abs().max() <= tolerance * want.abs().max()
    assert (got - want).abs().max() > 0  # rounded: the format was used


def test_the_planner_prices_a_layout_by_the_gather_of_the_convolution_it_feeds(mncore2):
    """Planner.window_cycles: x stored channels-last (the layout a convolution copies x into when
    it must) costs the convolution reading it nothing more; stored column by column (a pixel's
    channels the longest run of the im2col gather) it costs the extra MVs of that gather, one
    DRAM latency each over all the Groups' queues, at most those of a copy of x into that layout.
    It reaches the convolution through the element-wise op between them."""
    torch.manual_seed(0)
    w = torch.randn(32, 16, 3, 3)
    graph = trace(lambda d: {"y": F.conv2d(torch.relu(d["x"]), w, stride=2, padding=1)}, {"x": torch.randn(1, 16, 8, 8)})
    rewrite(graph, mncore2)
    planner = Planner(graph, mncore2, {}, {})
    x = graph.inputs["x"]
    conv_node = next(n for n in graph.nodes if n.kind == "conv")
    assert planner.convolutions_fed(x) == [conv_node]  # through the relu
    nhwc = Placement(conv.nhwc_layout(planner.ctx, x.shape, "float32"), mncore2, "DRAM", "float32")
    assert planner.window_cycles(x, Ref("x", nhwc)) == 0
    # channels in the lanes, but the image stored column by column: a row's pixels lie 64 long words apart
    scattered = Placement(parse("(1, 16, 8, 8)/((1:1), (8:1, 2_W:1), (8:8), (8:64))"), mncore2, "DRAM", "float32")
    extra = conv.im2col_mvs(conv_node, scattered) - conv.im2col_mvs(conv_node, nhwc)
    bound = min(extra, lw_sources(nhwc, scattered).mv_count)
    assert extra > 0
    assert planner.window_cycles(x, Ref("x", scattered)) == round(bound * planner.ctx.gather_mv_cycles())


def test_a_convolution_copies_x_into_nhwc_when_that_takes_fewer_mvs(mncore2):
    """ConvKernel.window: x stored column by column (a pixel's channels the longest run) is first
    copied into the NHWC layout when the copy's MVs and the gather from the copy together are
    fewer than the gather from x; x stored NHWC is read as it is."""
    torch.manual_seed(0)
    w = torch.randn(32, 16, 3, 3)
    graph = trace(lambda d: {"y": F.conv2d(d["x"], w, stride=2, padding=1)}, {"x": torch.randn(1, 16, 8, 8)})
    rewrite(graph, mncore2)
    planner = Planner(graph, mncore2, {}, {})
    conv_node = next(n for n in graph.nodes if n.kind == "conv")
    kernel = next(k for k in conv.plan(conv_node, planner) if k.direct is None)
    nhwc = kernel.x_placement(planner.ctx)
    scattered = Placement(parse("(1, 16, 8, 8)/((1:1), (8:1, 2_W:1), (8:8), (8:64))"), mncore2, "DRAM", "float32")
    read_from, window = kernel.window(scattered)
    a_lw = kernel.la.shape[0] * kernel.la.shape[1] / 2
    own = conv.im2col_window(scattered, kernel.c_pad, *kernel.window_args)
    copied = lw_sources(nhwc, scattered).mv_count + a_lw / window.run_lw()
    assert copied < a_lw / own.run_lw()
    assert read_from.same_placement(nhwc)
    read_from, _ = kernel.window(nhwc)
    assert read_from is nhwc or read_from.same_placement(nhwc)


def test_a_layer_after_a_direct_one_reads_its_input_copied(mini_device):
    """Two 3x3 convolutions in a row (the second reads the first's direct-form output, whose rows
    interleave): values against torch with the copy into NHWC in the chain."""
    g = torch.Generator().manual_seed(8)
    inputs = {"x": torch.randn(1, 64, 7, 7, generator=g), "w1": torch.randn(64, 64, 3, 3, generator=g) * 0.05,
              "w2": torch.randn(64, 64, 3, 3, generator=g) * 0.05}
    compiled = run(mini_device, lambda d: {"y": F.conv2d(F.relu(F.conv2d(d["x"], d["w1"], None, 1, 1)), d["w2"], None,
                                                         1, 1)}, inputs, rtol=1e-4)
    assert "temp:relu_nhwc" in compiled.summary["layouts"]  # the copy ConvKernel.im2col writes first


def test_a_registered_weight_is_copied_with_zero_padding_by_the_data_engines(mncore2, monkeypatch):
    """A registered weight whose padding is not known to be zero (one the program writes, as a
    training step does) is read by the thin-channel direct form from a copy whose padded channels
    are zeros. Those channels fill long words of their own (the lanes hold output channels): the
    Data Engines copy the weight alone and write them from the zero buffer. Through the PEs,
    element by element, the copy of ResNet's stem weight took 625,076 cycles and im2col won
    (663,274 at 224x224, now 147,060). Here the registered weight arrives with NaN in every
    padding word."""
    from compiler.planner import search
    from runtime.device import spec_placement
    monkeypatch.setattr(search.Planner, "clean_resident", lambda self, v: False)
    torch.manual_seed(7)
    layer = torch.nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
    names = {id(layer.weight): "w"}
    x = torch.randn(1, 3, 32, 32)
    compiled = compile_function(lambda d: {"y": layer(d["x"])}, {"x": x}, mncore2, resident=lambda t: names.get(id(t)))
    assert compiled.clean_inputs == set()
    relaid = [(start, end) for start, end, name in compiled.program.labels if name.startswith("relayout")]
    assert len(relaid) == 1
    start, end = relaid[0]
    assert set(compiled.program.code[start:end, 0].tolist()) <= {isa.Op.MV, isa.Op.NOP, isa.Op.WAIT}
    device = Device(mncore2)
    image = device.host_image(spec_placement(compiled.inputs["w"], mncore2), upload=True)
    image[:] = np.float32(np.nan).view(np.uint32)  # the upload writes the elements only
    got = device.execute(compiled, {"x": x, "w": layer.weight.detach()})["y"]
    with torch.no_grad():
        torch.testing.assert_close(got, layer(x), rtol=1e-5, atol=1e-5 * layer(x).abs().max().item())


def test_a_registered_weight_the_program_does_not_write_is_read_by_view(mncore2):
    """The same layer reading a registered weight it does not write: the program reads the
    weight's padding as zeros where it lies (no copy), and says so (`clean_inputs`): the runtime
    binds it a copy whose padding is zero (tests/mlsdk/test_clean_padding.py)."""
    torch.manual_seed(7)
    layer = torch.nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
    names = {id(layer.weight): "w"}
    x = torch.randn(1, 3, 32, 32)
    compiled = compile_function(lambda d: {"y": layer(d["x"])}, {"x": x}, mncore2, resident=lambda t: names.get(id(t)))
    assert compiled.clean_inputs == {"w"}
    assert not [name for _, _, name in compiled.program.labels if name.startswith("relayout")]
    got = Device(mncore2).execute(compiled, {"x": x, "w": layer.weight.detach()})["y"]
    with torch.no_grad():
        torch.testing.assert_close(got, layer(x), rtol=1e-5, atol=1e-5 * layer(x).abs().max().item())


def test_a_codegen_dir_keeps_which_inputs_are_read_with_zero_padding(mncore2, tmp_path):
    """A program loaded from a codegen_dir is bound as the one compiled: its clean inputs too."""
    from compiler import artifact
    layer = torch.nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
    names = {id(layer.weight): "w"}
    compiled = compile_function(lambda d: {"y": layer(d["x"])}, {"x": torch.randn(1, 3, 32, 32)}, mncore2,
                                resident=lambda t: names.get(id(t)))
    assert artifact.load(artifact.save(compiled, tmp_path / "stem"), mncore2).clean_inputs == {"w"}


@pytest.mark.parametrize("clean", [True, False])
def test_a_weight_gathered_into_b_reads_its_padding_only_when_it_is_zero(mini, monkeypatch, clean):
    """A patch convolution whose B is no view of its weight's image (ViT-B/16's at 224x224 on
    MN-Core 2; here every B made no view) gathers B from the weight. A registered weight the
    program does not write has zeros in its padding: B is gathered padded channels included, in
    runs, and the weight is listed (`clean_inputs`: ViT-B/16's patch embedding 538,666 -> 115,306
    cycles, as with a constant weight). Not known to be zero, the zero buffer fills B's padded
    channels instead, nothing is listed, and a weight with NaN in its padding gives torch's values."""
    from compiler.kernels.conv import ConvKernel
    from compiler.planner import search
    from runtime.device import spec_placement
    monkeypatch.setattr(ConvKernel, "b_view", lambda self, ref: None)
    if not clean:
        monkeypatch.setattr(search.Planner, "clean_resident", lambda self, v: False)
    torch.manual_seed(3)
    layer = torch.nn.Conv2d(3, 16, 4, stride=4, bias=False)
    names = {id(layer.weight): "w"}
    x = torch.randn(2, 3, 16, 16)
    compiled = compile_function(lambda d: {"y": layer(d["x"])}, {"x": x}, mini, resident=lambda t: names.get(id(t)))
    assert compiled.clean_inputs == ({"w"} if clean else set())
    device = Device(mini)
    if not clean:
        image = device.host_image(spec_placement(compiled.inputs["w"], mini), upload=True)
        image[:] = np.float32(np.nan).view(np.uint32)
    got = device.execute(compiled, {"x": x, "w": layer.weight.detach()})["y"]
    with torch.no_grad():
        torch.testing.assert_close(got, layer(x), rtol=1e-5, atol=1e-5)

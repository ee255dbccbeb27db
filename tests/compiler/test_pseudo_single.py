"""Pseudo-single (`pfloat32`, PFN's "TF32"): float32 words whose low mantissa bits the MAU
ignores, multiplied at the YAML's pfloat32 matrix rate. A MATMUL format only: the compiler picks it
for matrix products and convolutions with `float_dtype="pfloat32"`; memories keep float32."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import hwdesc
from compiler.compile import compile_function
from compiler.errors import CompileError
from mlsdk import Context, MNDevice, OptionError
from runtime import Device
from sim import Machine, ProgramBuilder, SimError
from sim.isa import DType, Op


def truncated(x: torch.Tensor, hw) -> torch.Tensor:
    """x as the MAU reads a pseudo-single operand: the mantissa bits pfloat32 lacks set to zero."""
    ignored = hw.formats["float32"].mantissa_bits - hw.formats["pfloat32"].mantissa_bits
    mask = torch.tensor(-(1 << ignored), dtype=torch.int32)
    return (x.view(torch.int32) & mask).view(torch.float32)


def product(d):
    return {"c": d["a"] @ d["b"]}


@pytest.fixture(scope="module")
def device(mini) -> Device:
    return Device(mini)


def test_a_product_multiplies_truncated_operands(device, mini):
    torch.manual_seed(0)
    inputs = {"a": torch.randn(40, 96), "b": torch.randn(96, 24)}
    compiled = compile_function(product, inputs, mini, options={"float_dtype": "pfloat32"})
    code = compiled.program.code
    assert set(code[code[:, 0] == Op.MATMUL, 1].tolist()) == {DType.pfloat32}
    got = device.execute(compiled, inputs)["c"]
    exact = (truncated(inputs["a"], mini).double() @ truncated(inputs["b"], mini).double()).float()
    plain = (inputs["a"].double() @ inputs["b"].double()).float()
    scale = plain.abs().max().item()
    assert (got - exact).abs().max().item() <= 1e-5 * scale  # float32 accumulation of the truncated operands
    assert (got - plain).abs().max().item() > 10 * (got - exact).abs().max().item()  # not a float32 product


def test_a_nan_whose_payload_is_ignored_stays_nan(device, mini):
    """Clearing the low mantissa bits of a NaN whose payload lies only there would leave an
    infinity; special values follow torch, so the product is NaN."""
    nan = torch.tensor([0x7F800001], dtype=torch.int32).view(torch.float32)
    a = torch.ones(8, 16)
    a[3, 5] = nan[0]
    inputs = {"a": a, "b": torch.ones(16, 8)}
    got = device.execute(compile_function(product, inputs, mini, options={"float_dtype": "pfloat32"}), inputs)["c"]
    assert torch.isnan(got[3]).all() and not torch.isnan(got[:3]).any() and not torch.isinf(got).any()


def test_pseudo_single_products_take_fewer_cycles_than_float32(mini):
    inputs = {"a": torch.randn(256, 512), "b": torch.randn(512, 384)}
    machine = Machine(mini)
    cycles = {dt: machine.time(compile_function(product, inputs, mini, options={"float_dtype": dt}).program.code)
              .total_cycles for dt in ("float", "pfloat32")}
    assert cycles["pfloat32"] < cycles["float"]


def test_a_convolution_in_pseudo_single_matches_torch_on_truncated_operands(device, mini):
    torch.manual_seed(1)
    w = torch.randn(8, 4, 3, 3)
    inputs = {"x": torch.randn(1, 4, 6, 6)}
    fn = lambda d: {"y": F.conv2d(d["x"], w, padding=1)}  # noqa: E731
    compiled = compile_function(fn, inputs, mini, options={"float_dtype": "pfloat32"})
    got = device.execute(compiled, inputs)["y"]
    want = F.conv2d(truncated(inputs["x"], mini).double(), truncated(w, mini).double(), padding=1).float()
    assert (got - want).abs().max().item() <= 1e-5 * want.abs().max().item()


def test_the_matmul_cycles_follow_the_pfloat32_matrix_mode(mini):
    """ceil(M / rows) * ceil(K / cols) * max(N, rows / load) steps of units.MAU.matrix.pfloat32."""
    machine = Machine(mini)
    pes = mini.fanout("MAB", "PE")
    m, k, n = 16, 8 * pes, 4 * pes
    b = ProgramBuilder(machine.params)
    b.matmul("pfloat32", m, k, n, ("LM0", 0, k // pes), ("LM1", 0, n), ("GRF0", 0, n // pes))
    mode = mini.units["MAU"].matrix["pfloat32"]
    steps = -(-(-(-m // mode.rows) * -(-k // mode.cols) * max(n, mode.rows // mode.load_rows_per_cycle))
              // mini.step_cycles)
    assert machine.time(b.build().code).total_cycles == steps * mini.step_cycles


@pytest.mark.parametrize("emit, what", [
    (lambda b: b.vop("add", "pfloat32", 1, 4, ("LM0", 0, 0, 1), ("LM0", 0, 0, 1), ("LM0", 0, 0, 1)), "vector mode"),
    (lambda b: b.xfer("distribute", "down", "L1BM", 0, "LM0", 0, 32, dtype="pfloat32"), "only as MATMUL operands"),
])
def test_pseudo_single_is_refused_outside_matmul(mini, emit, what):
    machine = Machine(mini)
    b = ProgramBuilder(machine.params)
    emit(b)
    with pytest.raises(SimError, match=what):
        machine.run(b.build(hazards=False), mode="timing")


def test_a_chip_without_the_mode_is_refused_at_compile(tmp_path):
    path = tmp_path / "no_pseudo.yaml"
    path.write_text("extends: mini\nname: no_pseudo\nunits:\n  MAU:\n    matrix:\n      pfloat32: null\n")
    hw = hwdesc.load(str(path))
    assert "pfloat32" not in hw.units["MAU"].matrix  # null removes an inherited entry
    with pytest.raises(CompileError, match="units.MAU.matrix.pfloat32"):
        compile_function(product, {"a": torch.randn(8, 8), "b": torch.randn(8, 8)}, hw,
                         options={"float_dtype": "pfloat32"})


def test_the_option_is_listed_when_a_value_is_wrong():
    ctx = Context(MNDevice("mini:auto"))
    with pytest.raises(OptionError, match="pfloat32"):
        ctx.compile(product, {"a": torch.randn(4, 4), "b": torch.randn(4, 4)}, None, options={"float_dtype": "tf16"})

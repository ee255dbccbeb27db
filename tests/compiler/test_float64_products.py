"""float64 products (`float_dtype="float64"`, mnsim's name): matrix products and convolutions
convert their float32 operands to float64 in LM, multiply and accumulate in float64 at the YAML's
`units.MAU.matrix.float64` rate, and round the result to float32; memories keep float32."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import hwdesc
from compiler.compile import compile_function
from compiler.errors import CompileError
from runtime import Device
from sim import Machine
from sim.isa import DType, Op, VOp

OPTIONS = {"float_dtype": "float64"}


def product(d):
    return {"c": d["a"] @ d["b"]}


@pytest.fixture(scope="module")
def device(mini) -> Device:
    return Device(mini)


def _inputs(seed: int, *shapes) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    return {name: torch.randn(*shape) for name, shape in zip("ab", shapes)}


@pytest.mark.parametrize("shapes", [((40, 96), (96, 24)), ((3, 16, 40), (3, 40, 8)),  # a product, a batched one
                                    ((257, 300), (300, 66))])  # its last LM region fits only unaligned: refused before
def test_a_product_is_the_float64_product_rounded_once(device, mini, shapes):
    inputs = _inputs(0, *shapes)
    inputs["a"][0, 0] = 1 + 2.0 ** -20  # what float32 products lose
    compiled = compile_function(product, inputs, mini, options=OPTIONS)
    code = compiled.program.code
    assert set(code[code[:, 0] == Op.MATMUL, 1].tolist()) == {DType.float64}
    cvt = code[(code[:, 0] == Op.VOP) & (code[:, 1] == VOp.cvt)]
    assert {DType.float64, DType.float32} <= set(cvt[:, 2].tolist())  # operands in, C out
    got = device.execute(compiled, inputs)["c"]
    torch.testing.assert_close(got, (inputs["a"].double() @ inputs["b"].double()).float(), rtol=0, atol=0)


def test_a_convolution_in_float64_matches_torch_in_float64(device, mini):
    torch.manual_seed(1)
    w = torch.randn(8, 4, 3, 3)
    inputs = {"x": torch.randn(1, 4, 6, 6)}
    compiled = compile_function(lambda d: {"y": F.conv2d(d["x"], w, padding=1)}, inputs, mini, options=OPTIONS)
    got = device.execute(compiled, inputs)["y"]
    torch.testing.assert_close(got, F.conv2d(inputs["x"].double(), w.double(), padding=1).float(), rtol=0, atol=0)


def test_float64_products_take_the_float64_matrix_rate(mini):
    """The MAU does rows x cols multiply-adds a cycle per MAB: float64's 2 x 4 against float32's
    8 x 4 (units.MAU.matrix), so the float64 product's MATMULs take 4x the steps."""
    inputs = _inputs(2, (256, 512), (512, 384))
    machine = Machine(mini)
    matmul_cycles = {}
    for dt in ("float", "float64"):
        code = compile_function(product, inputs, mini, options={"float_dtype": dt}).program.code
        stats = machine.time(code)
        matmul_cycles[dt] = sum(int(stats.end[i] - stats.start[i]) for i in range(len(code)) if code[i, 0] == Op.MATMUL)
    modes = mini.units["MAU"].matrix
    ratio = (modes["float32"].rows * modes["float32"].cols) / (modes["float64"].rows * modes["float64"].cols)
    assert matmul_cycles["float64"] >= ratio * matmul_cycles["float"] * 0.9


def test_a_chip_without_the_mode_is_refused_at_compile(tmp_path):
    path = tmp_path / "no_double.yaml"
    path.write_text("extends: mini\nname: no_double\nunits:\n  MAU:\n    matrix:\n      float64: null\n")
    with pytest.raises(CompileError, match="float_dtype 'float64' multiplies in float64, but no_double has no "
                                           "units.MAU.matrix.float64"):
        compile_function(product, _inputs(3, (8, 8), (8, 8)), hwdesc.load(str(path)), options=OPTIONS)

"""The model suite: ordinary programs compile and match torch, on the full chip and on mini.

float32 results must match torch to 1e-5 of their largest magnitude; "mixed" (matrix products in
MN-Core's half, 1-6-9 with 9 mantissa bits, float32 accumulation) to MIXED_TOLERANCE of it: a half
product rounds each operand to 2^-10 relative, and sums of such products keep about that.
Integer results (argmax) must be equal.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import hwdesc
from compiler.compile import compile_function
from runtime import Device

from mlsdk.sweep.suite import MODELS

FLOAT_TOLERANCE = 1e-5
MIXED_TOLERANCE = 4e-3


@pytest.fixture(scope="module", params=["mini", "mncore2"])
def device(request) -> Device:
    return Device(hwdesc.load(request.param))


def check(device: Device, fn, inputs, tolerance: float, options: dict | None = None) -> None:
    compiled = compile_function(fn, inputs, device.hw, options=options)
    got = device.execute(compiled, inputs)
    with torch.no_grad():
        want = fn(inputs)
    for name, expected in want.items():
        result = got[name]
        assert result.shape == expected.shape and result.dtype == expected.dtype, name
        if not expected.is_floating_point():
            assert torch.equal(result, expected), name
            continue
        scale = max(expected.abs().max().item(), 1e-30)
        error = (result.float() - expected.float()).abs().max().item()
        assert error <= tolerance * scale, f"{name}: error {error:.3g} of {scale:.3g}"


@pytest.mark.parametrize("model", list(MODELS))
def test_models_match_torch_in_float32(device, model):
    fn, inputs = MODELS[model]()
    check(device, fn, inputs, FLOAT_TOLERANCE, {"float_dtype": "float"})


@pytest.mark.parametrize("model", list(MODELS))
def test_models_match_torch_in_mixed_precision(device, model):
    fn, inputs = MODELS[model]()
    check(device, fn, inputs, MIXED_TOLERANCE, {"float_dtype": "mixed"})


ODD_SHAPES = [(), (1,), (7,), (13,), (4097,), (7, 13), (17, 25), (1, 8191)]


def random_shapes(count: int, seed: int = 0) -> list[tuple[int, ...]]:
    """Shapes of rank 1 to 4 with sizes from 1 to 24, primes included."""
    rng = np.random.default_rng(seed)
    shapes = []
    while len(shapes) < count:
        rank = int(rng.integers(1, 5))
        shape = tuple(int(s) for s in rng.integers(1, 25, size=rank))
        if shape not in shapes:
            shapes.append(shape)
    return shapes


def elementwise(d):
    """Unary, binary and ternary ops, a scalar on either side, broadcasting against a row."""
    x, row = d["x"], d["row"]
    y = torch.relu(x * 2.0 - 1.0) + torch.exp(-x * x) / (1.0 + torch.abs(x))
    z = torch.where(x > row, x - row, 3.0 - x)
    return {"y": y, "z": torch.maximum(z, torch.tanh(y)), "mask": (x < 0) | (x > 1)}


@pytest.mark.parametrize("shape", ODD_SHAPES + random_shapes(26))
def test_elementwise_ops_over_any_shape(device, shape):
    torch.manual_seed(sum(shape) + len(shape))
    row = torch.randn(shape[-1:] if shape else ())
    check(device, elementwise, {"x": torch.randn(shape), "row": row}, FLOAT_TOLERANCE)


def test_transformer_encoder_with_masks_traces_through_the_composite_path():
    """nn.TransformerEncoder in eval mode: its CPU fast path (a nested tensor made from the padding
    mask's values) and its guess whether a mask made in the function is causal (a comparison of
    values) cannot be traced with static shapes; the composite path computes the same. A captured
    causal mask is recognised on the host, as torch does."""
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.1, batch_first=True)
    encoder = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
    captured = torch.nn.Transformer.generate_square_subsequent_mask(6)

    def fn(d):
        made = torch.nn.Transformer.generate_square_subsequent_mask(6)
        return {"made": encoder(d["x"], mask=made), "captured": encoder(d["x"], mask=captured),
                "padded": encoder(d["x"], src_key_padding_mask=d["pad"])}
    pad = torch.zeros(2, 6, dtype=torch.bool)
    pad[1, 4:] = True
    check(Device(hwdesc.load("mini")), fn, {"x": torch.randn(2, 6, 16), "pad": pad}, FLOAT_TOLERANCE,
          {"float_dtype": "float"})
    assert torch.backends.mha.get_fastpath_enabled()  # given back after the trace


def test_trigonometric_hyperbolic_and_gamma_functions_compile():
    """torch's tan, the inverse and hyperbolic functions, atan2, hypot, erfinv, erfc, erfcx (and
    log_ndtr through it), lgamma and digamma, compiled (an int tensor is promoted to float first,
    as torch does), and the gradient of a loss through them (torch's own derivative formulas:
    atan2's, asinh's, lgamma's digamma)."""
    g = torch.Generator().manual_seed(3)
    x, y = torch.rand(8, 12, generator=g) * 1.8 - 0.9, torch.randn(8, 12, generator=g)
    k = torch.randint(1, 9, (8, 12), generator=g, dtype=torch.int32)

    def fn(d):
        x, y = d["x"], d["y"]
        return {"tan": torch.tan(x), "asin": torch.asin(x), "acos": torch.acos(x), "atan": torch.atan(y),
                "sinh": torch.sinh(y), "cosh": torch.cosh(y), "asinh": torch.asinh(y), "acosh": torch.acosh(1 + y.abs()),
                "atanh": torch.atanh(x), "erfinv": torch.erfinv(x), "lgamma": torch.lgamma(y), "digamma": torch.digamma(y),
                "erfc": torch.erfc(y * 3), "erfcx": torch.special.erfcx(y.abs() * 3),
                "log_ndtr": torch.special.log_ndtr(y * 3),
                "atan2": torch.atan2(y, x), "hypot": torch.hypot(x, y), "of_int": torch.atan(d["k"])}
    check(Device(hwdesc.load("mini")), fn, {"x": x, "y": y, "k": k}, 1e-5, {"float_dtype": "float"})

    def grad(d):
        with torch.enable_grad():  # `check` runs the reference under no_grad
            x = d["x"].detach().requires_grad_()
            loss = (torch.atan2(d["y"], x) + torch.asinh(x) * torch.lgamma(d["y"].abs() + 1) + torch.atanh(x)
                    + torch.erfc(x)).sum()
            return {"dx": torch.autograd.grad(loss, x)[0]}
    check(Device(hwdesc.load("mini")), grad, {"x": x, "y": y}, 1e-5, {"float_dtype": "float"})

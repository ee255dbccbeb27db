"""Signed zeros, infinities and NaN through every element-wise op, compiled and simulated, against
the rule `sim/numerics.py` documents: torch's results (nothing is published for MN-Core 2's NaN
or signed-zero behaviour). Finite non-zero results may differ in the last bits (transcendental
functions are computed to float32 accuracy); the special values must match exactly.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from mlsdk import Context, MNDevice

NAN, INF = float("nan"), float("inf")
# Every pair a rule can trip on: NaN on either side, zeros of both signs against each other,
# infinities of both signs, and ordinary numbers. Under 16 elements: from 16 on, torch's CPU
# max/min take a vectorised loop that breaks a -0.0/+0.0 tie the other way (see sim/numerics.py).
X = torch.tensor([NAN, 1.0, -1.0, 0.0, -0.0, INF, -INF, 2.0, NAN, -0.0, 3.0, -2.5])
Y = torch.tensor([1.0, NAN, -0.0, -0.0, 0.0, -INF, INF, NAN, NAN, -0.0, -INF, 0.5])

OPS = {
    "add": lambda x, y: x + y, "sub": lambda x, y: x - y, "mul": lambda x, y: x * y,
    "div": lambda x, y: x / y, "div_by_negative_zero": lambda x, y: x / -0.0,
    "div_by_zero": lambda x, y: x / 0.0, "add_zero": lambda x, y: x + 0.0, "add_int_zero": lambda x, y: x + 0,
    "add_negative_zero": lambda x, y: x + -0.0, "sub_zero": lambda x, y: x - 0.0,
    "sub_negative_zero": lambda x, y: x - -0.0, "mul_one": lambda x, y: x * 1.0, "div_one": lambda x, y: x / 1, "maximum": torch.maximum, "minimum": torch.minimum,
    "fmax": torch.fmax, "fmin": torch.fmin, "clamp": lambda x, y: torch.clamp(x, -1, 1),
    "clamp_min": lambda x, y: torch.clamp_min(x, 0.5), "neg": lambda x, y: -x, "abs": lambda x, y: x.abs(),
    "relu": lambda x, y: torch.relu(x), "sign": lambda x, y: x.sign(), "exp": lambda x, y: x.exp(),
    "expm1": lambda x, y: torch.expm1(x), "log": lambda x, y: x.log(), "log1p": lambda x, y: torch.log1p(x),
    "sqrt": lambda x, y: x.sqrt(), "rsqrt": lambda x, y: x.rsqrt(), "reciprocal": lambda x, y: x.reciprocal(),
    "sigmoid": lambda x, y: x.sigmoid(), "tanh": lambda x, y: x.tanh(), "erf": lambda x, y: torch.erf(x),
    "sin": lambda x, y: x.sin(), "cos": lambda x, y: x.cos(), "floor": lambda x, y: x.floor(),
    "ceil": lambda x, y: x.ceil(), "trunc": lambda x, y: x.trunc(), "round": lambda x, y: x.round(),
    "where": lambda x, y: torch.where(x > 0, x, y), "lt": lambda x, y: (x < y).float(),
    "le": lambda x, y: (x <= y).float(), "eq": lambda x, y: (x == y).float(), "ne": lambda x, y: (x != y).float(),
    "remainder": torch.remainder, "floor_divide": lambda x, y: torch.floor_divide(x, y),
    "pow": torch.pow, "pow_third": lambda x, y: x.pow(1 / 3), "pow_negative_half": lambda x, y: x.pow(-0.5),
    "softplus": lambda x, y: F.softplus(x), "silu": lambda x, y: F.silu(x), "elu": lambda x, y: F.elu(x),
    "leaky_relu": lambda x, y: F.leaky_relu(x, 0.1), "hardtanh": lambda x, y: F.hardtanh(x),
    "amax": lambda x, y: x.reshape(3, 4).amax(1), "amin": lambda x, y: y.reshape(3, 4).amin(1),
    "isnan": lambda x, y: torch.isnan(x).float(), "isinf": lambda x, y: torch.isinf(x / y).float(),
    "isfinite": lambda x, y: torch.isfinite(x).float(),
    "nan_to_num": lambda x, y: torch.nan_to_num(x * y, nan=0.5, posinf=9.0, neginf=-9.0),
    "atan2": torch.atan2, "hypot": torch.hypot,
    **{name: (lambda f: lambda x, y: f(x))(getattr(torch, name)) for name in (
        "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh", "erfinv", "lgamma", "digamma", "erfc")},
    "erfcx": lambda x, y: torch.special.erfcx(x),
    "acosh_above_one": lambda x, y: torch.acosh(x.abs() + 1), "erfinv_inside": lambda x, y: torch.erfinv(x / 4),
}


def _same(got: float, want: float) -> bool:
    if math.isnan(want) or math.isnan(got):
        return math.isnan(want) and math.isnan(got)
    if want == 0 or math.isinf(want):
        return got == want and math.copysign(1, got) == math.copysign(1, want)
    return math.isclose(got, want, rel_tol=1e-6)


@pytest.fixture(scope="module")
def ctx():
    return Context(MNDevice("mini:auto"))


@pytest.mark.parametrize("name", sorted(OPS))
def test_special_values_follow_torch(ctx, name):
    op = OPS[name]
    fn = ctx.compile(lambda d: {"out": op(d["x"], d["y"])}, {"x": X, "y": Y}, None)
    got = fn({"x": X, "y": Y})["out"].cpu().reshape(-1).tolist()
    want = op(X, Y).reshape(-1).tolist()
    x, y = X.tolist(), Y.tolist()
    wrong = [f"{name}({x[i] if i < len(x) else '?'}, {y[i] if i < len(y) else '?'}) = {g}, torch {w}"
             for i, (g, w) in enumerate(zip(got, want)) if not _same(g, w)]
    assert not wrong, "\n".join(wrong)

"""Complex tensors inside compiled functions, computed as pairs of reals (compiler.frontend.complex_pairs):
values against torch, a rotary-embedding training step against torch's optimizer (its rotations
captured, a registered buffer or an input), a registered complex tensor written in place coming
back complex, and the refusals (complex128 inputs, complex outputs, ops without a rule) by type
and message."""

from __future__ import annotations

import copy
import inspect
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from compiler.errors import CompileError, UnsupportedOpError
from mlsdk import Context, MNCoreSGD, MNDevice, set_tensor_name
from tests.mlsdk.test_training import assert_state_close, registered, steps_against_torch, training_step


def every_rule(d: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """One output per complex op the pairs compute (returned as view_as_real, or real)."""
    a, b, r = torch.view_as_complex(d["a"]), torch.view_as_complex(d["b"]), d["r"]
    complex_results = {
        "mul": a * b, "add": a + b, "sub": a - 2 * b, "div": a / b, "conj": a.conj() * b, "neg": -a,
        "real_factor": a * r, "real_term": a + r, "scalar": a * 2j + 1, "exp": torch.exp(a),
        "sgn": torch.sgn(torch.cat([a, 0 * a], 1)), "reciprocal": 1 / a,
        "matmul": a @ b.T, "batched": (a.unsqueeze(0) @ b.T.unsqueeze(0))[0],
        "polar": torch.polar(r.abs() + 0.5, r), "complex": torch.complex(r, r * 2),
        "cat": torch.cat([a, b], 0), "cat_real": torch.cat([a, r], 1), "stack": torch.stack([a, b], -1),
        "sum": (a * b).sum(-1, keepdim=True), "sum_dtype": a.sum(0, dtype=torch.complex64),
        "to_complex": r.to(torch.complex64) * a,
        "mean": a.mean(0), "where": torch.where(r > 0, a, b), "transpose": a.transpose(0, 1) * b.t(),
        "permute": a.unsqueeze(0).permute(2, 0, 1).squeeze(1), "expand": a[:1].expand(3, 4) * b,
        "select": a[:, 1] * b[:, 2].unsqueeze(1).T, "split": torch.cat(a.split(2, 1)[::-1], 1), "slice": a[:, 1::2],
        "flip": torch.flip(a, [1]) * b, "roll": torch.roll(a, 1, 0) * b, "repeat": a[:1].repeat(3, 1) * b,
        "narrow": a.narrow(1, 1, 2),
    }
    out = {k: torch.view_as_real(v) for k, v in complex_results.items()}
    out.update(abs=a.abs(), angle=(a * b).angle(), real=(a * b).real, imag=(a / b).imag)
    return out


def test_every_complex_op_matches_torch():
    torch.manual_seed(0)
    d = {"a": torch.randn(3, 4, 2), "b": torch.randn(3, 4, 2), "r": torch.randn(3, 4)}
    fn = Context(MNDevice("mini:auto")).compile(every_rule, d, None)
    got, want = fn(d), every_rule(d)
    for name, w in want.items():
        torch.testing.assert_close(got[name].cpu(), w, rtol=1e-5, atol=1e-5 * w.abs().max().item(),
                                   msg=lambda m, n=name: f"{n}: {m}")


def precompute_freqs_cis(dim: int, end: int, theta: float = 10000.0) -> torch.Tensor:
    """Meta's LLaMA reference, as written there: the rotations as unit complex numbers."""
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: (dim // 2)].float() / dim))
    t = torch.arange(end, device=freqs.device)
    freqs = torch.outer(t, freqs).float()
    return torch.polar(torch.ones_like(freqs), freqs)


def apply_rotary_emb(xq: torch.Tensor, xk: torch.Tensor, freqs_cis: torch.Tensor):
    """Meta's LLaMA reference: channel pairs as complex numbers, rotated by a complex product."""
    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
    fc = freqs_cis.view(1, xq_.shape[1], 1, xq_.shape[-1])
    return torch.view_as_real(xq_ * fc).flatten(3).type_as(xq), torch.view_as_real(xk_ * fc).flatten(3).type_as(xk)


class RotaryAttention(nn.Module):
    """Attention with rotary positions the complex way, the rotations a captured constant (as in
    Meta's reference) or a buffer (registered with the model's, it lives on the device)."""

    def __init__(self, dim: int = 16, heads: int = 2, seq: int = 6, buffer: bool = False) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(dim, dim, bias=False) for _ in range(4))
        self.head = nn.Linear(dim, 10)
        if buffer:
            self.register_buffer("freqs_cis", precompute_freqs_cis(self.head_dim, seq), persistent=False)
        else:
            self.freqs_cis = precompute_freqs_cis(self.head_dim, seq)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        q, k, v = (w(x).view(b, n, self.heads, self.head_dim) for w in (self.wq, self.wk, self.wv))
        q, k = apply_rotary_emb(q, k, self.freqs_cis[:n])
        q, k, v = (y.transpose(1, 2) for y in (q, k, v))
        a = torch.softmax(q @ k.transpose(2, 3) / math.sqrt(self.head_dim), -1) @ v
        return F.cross_entropy(self.head(self.wo(a.transpose(1, 2).reshape(b, n, -1))).mean(1), t)


@pytest.mark.parametrize("buffer", [False, True], ids=["captured", "registered"])
def test_rotary_attention_trains_as_torch_does(buffer):
    torch.manual_seed(0)
    model = RotaryAttention(buffer=buffer)
    ref = copy.deepcopy(model)
    ctx = Context(MNDevice("mini:auto"))
    optimizer = MNCoreSGD(model.parameters(), 0.1, 0.9, 0.0)
    ref_optimizer = torch.optim.SGD(ref.parameters(), 0.1, 0.9, 0.0)
    registered(ctx, model, optimizer)
    data = [{"x": torch.randn(2, 6, 16), "t": torch.randint(0, 10, (2,))} for _ in range(3)]
    steps_against_torch(ctx, ctx.compile(training_step(model, optimizer), data[0], None), ref, ref_optimizer, data)
    assert_state_close(model, ref)
    assert model.freqs_cis.dtype == torch.complex64 and torch.equal(model.freqs_cis, ref.freqs_cis)


def test_a_complex_input_is_passed_as_its_pairs():
    """A complex64 input (the rotations passed in rather than captured) is uploaded as its
    view_as_real form, each call's own values."""
    def rotate(d):
        return dict(zip("qk", apply_rotary_emb(d["q"], d["k"], d["freqs_cis"])))
    d = {"q": torch.randn(2, 6, 2, 8), "k": torch.randn(2, 6, 2, 8), "freqs_cis": precompute_freqs_cis(8, 6)}
    fn = Context(MNDevice("mini:auto")).compile(rotate, d, None)
    for theta in (10000.0, 100.0):
        d["freqs_cis"] = precompute_freqs_cis(8, 6, theta)
        got, want = fn(d), rotate(d)
        for n in "qk":
            torch.testing.assert_close(got[n].cpu(), want[n], rtol=1e-5, atol=1e-6)


def test_complex128_inputs_outputs_and_ops_without_a_rule_are_refused_by_name():
    ctx = Context(MNDevice("mini:auto"))
    x = torch.randn(3, 4, 2)
    with pytest.raises(CompileError, match=r"input 'z' has dtype torch.complex128; the device takes .* and complex64"):
        ctx.compile(lambda d: {"y": torch.view_as_real(d["z"] * 2)}, {"z": torch.view_as_complex(x.double())}, None)
    with pytest.raises(CompileError, match=r"output 'w' is a complex tensor.*return torch.view_as_real"):
        ctx.compile(lambda d: {"w": torch.view_as_complex(d["x"]) * 2}, {"x": x}, None)

    def square_root(d):
        return {"y": torch.view_as_real(torch.sqrt(torch.view_as_complex(d["x"])))}
    line = inspect.getsourcelines(square_root)[1] + 1
    with pytest.raises(UnsupportedOpError, match=rf"aten.sqrt.default with shapes \[\[3, 4\]\]: complex tensors are "
                                                 rf"computed as pairs of reals by the ops .*\n  at .*:{line}:"):
        ctx.compile(square_root, {"x": x}, None)
    # the Context still compiles and runs
    y = ctx.compile(lambda d: {"y": torch.view_as_real(torch.view_as_complex(d["x"]) * 1j)}, {"x": x}, None)({"x": x})
    torch.testing.assert_close(y["y"].cpu(), torch.stack([-x[..., 1], x[..., 0]], -1))


def test_a_registered_complex_tensor_written_in_place_comes_back_complex():
    torch.manual_seed(0)
    phase = torch.polar(torch.ones(3, 4), torch.randn(3, 4))
    start = phase.clone()
    ctx = Context(MNDevice("mini:auto"))
    set_tensor_name(phase, "phase")
    ctx.register_buffer(phase)

    def turn(d):
        phase.mul_(torch.view_as_complex(d["r"]))
        return {"y": torch.view_as_real(phase * 2)}
    r = torch.randn(3, 4, 2)
    fn = ctx.compile(turn, {"r": r}, None)
    for _ in range(2):
        y = fn({"r": r})["y"].cpu()
    ctx.synchronize()
    want = start * torch.view_as_complex(r) ** 2
    assert phase.dtype == torch.complex64
    torch.testing.assert_close(phase, want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(torch.view_as_complex(y.contiguous()), 2 * want, rtol=1e-5, atol=1e-6)


def test_complex_rotation_costs_no_more_cycles_than_its_real_formula():
    """Held as two parts, the complex rotation is the real formula's ops (each product reads its
    constant's parts as contiguous constants), so it takes no more cycles than the same rotation
    written with cos and sin of the channel pairs (held as one view_as_real tensor it took 1.42x)."""
    rotations = precompute_freqs_cis(64, 128)
    cos, sin = rotations.real.view(1, 128, 1, 32), rotations.imag.view(1, 128, 1, 32)

    def complex_way(d):
        q, k = apply_rotary_emb(d["q"], d["k"], rotations)
        return {"q": q, "k": k}

    def real_way(d):
        pairs = {n: d[n].reshape(*d[n].shape[:-1], -1, 2) for n in ("q", "k")}
        return {n: torch.stack([x[..., 0] * cos - x[..., 1] * sin, x[..., 0] * sin + x[..., 1] * cos], -1).flatten(3)
                for n, x in pairs.items()}
    d = {"q": torch.randn(2, 128, 8, 64), "k": torch.randn(2, 128, 8, 64)}
    ctx = Context(MNDevice("mncore2:auto"))
    cycles = {}
    for f in (complex_way, real_way):
        out = ctx.compile(f, d, None)(d)
        cycles[f.__name__] = ctx.session.calls[-1].stats.total_cycles
        torch.testing.assert_close(out["q"].cpu(), complex_way(d)["q"], rtol=1e-5, atol=1e-5)
    assert cycles["complex_way"] <= cycles["real_way"], cycles

"""Random numbers drawn on the device (compiler/frontend/random.py): dropout and torch's random
functions compile, every call draws anew from the Context's generator, and the numbers are those
of the same Threefry generator evaluated by torch on the host with the same state."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import hwdesc
from compiler.compile import compile_function
from compiler.errors import CompileError, UnsupportedOpError
from compiler.frontend.random import DeviceGenerator, HostDraws, threefry
from mlsdk import Context, MNCoreSGD, MNDevice
from mlsdk.context import GENERATOR_NAME

from .test_training import registered


def _int32(word: int) -> int:
    return word - (1 << 32) if word >= 1 << 31 else word


@pytest.mark.parametrize("rounds, key, counter, words", [  # Random123's known-answer vectors (kat_vectors)
    (20, (0, 0), (0, 0), (0x6B200159, 0x99BA4EFE)),
    (20, (0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF, 0xFFFFFFFF), (0x1CB996FC, 0xBB002BE7)),
    (20, (0x13198A2E, 0x03707344), (0x243F6A88, 0x85A308D3), (0xC4923A9C, 0x483DF7A0)),
    (13, (0, 0), (0, 0), (0x9D1C5EC6, 0x8BD50731)),
])
def test_threefry_gives_the_published_words(rounds, key, counter, words):
    k = torch.tensor([_int32(w) for w in key], dtype=torch.int32)
    c0, c1 = (torch.tensor([_int32(w)], dtype=torch.int32) for w in counter)
    got = threefry(k, c0, c1, rounds)
    assert [int(w) & 0xFFFFFFFF for w in got] == list(words)


def host_generator(ctx: Context) -> DeviceGenerator:
    """A host copy of the Context's generator as it stands (the device's state read back)."""
    ctx.synchronize()
    copy = DeviceGenerator(lambda t: t, state=ctx.generator.state.clone(), registered=True)
    copy.start_trace()
    return copy


def drawn_on_host(generator: DeviceGenerator, fn, inputs):
    """What `fn` computes on the host with its draws taken from `generator` (one call)."""
    generator.start_trace()
    with HostDraws(generator):
        return fn(inputs)


def test_dropout_draws_a_new_mask_every_call_and_the_generator_counts_calls():
    """Call k draws under key (seed, k): the first 32 x 48 counters, as the host computes them with
    the same generator state (torch's CPU dropout: bernoulli_(1 - p) noise over 1 - p)."""
    torch.manual_seed(0)
    ctx = Context(MNDevice("mini:auto"))
    p = 0.25
    dropout = lambda d: {"y": F.dropout(d["x"], p, training=True)}  # noqa: E731
    fn = ctx.compile(dropout, {"x": torch.ones(32, 48)}, None)
    x = torch.randn(32, 48)
    seed = int(ctx.generator.state[0])
    masks = []
    for call in range(3):
        y = fn({"x": x})["y"].cpu()
        at_call = DeviceGenerator(lambda t: t, state=torch.tensor([seed, call], dtype=torch.int32), registered=True)
        assert torch.equal(y, drawn_on_host(at_call, dropout, {"x": x})["y"]), call
        index = torch.arange(32 * 48, dtype=torch.int32).reshape(32, 48)
        word = threefry(torch.tensor([seed, call], dtype=torch.int32), index)[0]
        keep = ((word >> 8) & 0xFFFFFF).float() * 2.0 ** -24 < 1 - p  # the uniform number of `_unit`
        assert torch.equal(y != 0, keep & (x != 0)), call  # Threefry's words, counters 0.. of the call
        masks.append(keep)
    ctx.synchronize()
    assert ctx.generator.state.tolist() == [seed, 3]  # the device counted the calls
    rate = torch.stack(masks).float().mean().item()
    assert abs(rate - (1 - p)) < 0.02  # 4,608 draws: 5 standard deviations
    assert not torch.equal(masks[0], masks[1]) and not torch.equal(masks[1], masks[2])


RANDOM_FUNCTIONS = {
    "rand": lambda d: {"r": torch.rand(6, 10) + d["x"]},
    "randn_like": lambda d: {"r": torch.randn_like(d["x"])},
    "randint": lambda d: {"r": torch.randint(3, 9, (6, 10))},
    "bernoulli": lambda d: {"r": torch.bernoulli(torch.sigmoid(d["x"]))},
    "normal": lambda d: {"r": torch.normal(d["x"], 0.5)},
    "in_place": lambda d: {"r": torch.empty(6, 10).uniform_(-2, 3) + torch.zeros(6, 10).normal_(1, 2)},
    "dropout2d": lambda d: {"r": F.dropout2d(d["x"].reshape(2, 3, 2, 5), 0.5)},
    "several": lambda d: {"a": torch.rand(4), "b": torch.rand(4), "c": F.dropout(d["x"], 0.5)},
}


@pytest.mark.parametrize("name", sorted(RANDOM_FUNCTIONS))
def test_random_functions_are_the_generators_numbers(name):
    """Each draw of a call takes its own counters (`several`: a and b differ)."""
    torch.manual_seed(1)
    ctx = Context(MNDevice("mini:auto"))
    fn = RANDOM_FUNCTIONS[name]
    x = torch.randn(6, 10)
    compiled = ctx.compile(fn, {"x": x}, None)
    compiled({"x": x})
    want = drawn_on_host(host_generator(ctx), fn, {"x": x})  # the second call's numbers
    got = compiled({"x": x})
    for key, expected in want.items():
        assert got[key].dtype == expected.dtype, key
        torch.testing.assert_close(got[key].cpu(), expected, rtol=1e-6, atol=1e-6, msg=key)
    if name == "several":
        assert not torch.equal(want["a"], want["b"])


def test_training_step_with_dropout_matches_torch_with_the_same_masks():
    """An MLP with nn.Dropout trained by MNCoreSGD: loss and weights after three steps as torch's
    eager step computes them when its dropout draws the device generator's numbers."""
    def model() -> torch.nn.Module:
        torch.manual_seed(2)
        return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Dropout(0.3),
                                   torch.nn.Linear(32, 4)).train()
    x, t = torch.randn(8, 16), torch.randint(0, 4, (8,))
    torch.manual_seed(3)
    ctx = Context(MNDevice("mini:auto"))
    net = model()
    opt = MNCoreSGD(net.parameters(), 0.1, 0.9, 0.0)
    registered(ctx, net, opt, "net")

    def step(d):
        opt.zero_grad()
        loss = F.cross_entropy(net(d["x"]), d["t"])
        loss.backward()
        opt.step()
        return {"loss": loss}
    compiled = ctx.compile(step, {"x": x, "t": t}, None)
    host = host_generator(ctx)
    ref = model()
    ref_opt = torch.optim.SGD(ref.parameters(), 0.1, 0.9, 0.0)

    def ref_step(d):
        ref_opt.zero_grad()
        loss = F.cross_entropy(ref(d["x"]), d["t"])
        loss.backward()
        ref_opt.step()
        return {"loss": loss.detach()}
    for _ in range(3):
        got = compiled({"x": x, "t": t})["loss"].item()
        want = drawn_on_host(host, ref_step, {"x": x, "t": t})["loss"].item()
        assert got == pytest.approx(want, rel=1e-5)
    ctx.synchronize()
    for mine, theirs in zip(net.parameters(), ref.parameters()):
        torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-6)


def test_the_seed_comes_from_torchs_generator():
    def run() -> torch.Tensor:
        torch.manual_seed(4)
        ctx = Context(MNDevice("mini:auto"))
        return ctx.compile(lambda d: {"r": torch.rand(5) * d["x"]}, {"x": torch.ones(5)}, None)({"x": torch.ones(5)})["r"].cpu()
    assert torch.equal(run(), run())


def test_a_program_without_draws_registers_no_generator_and_leaves_torchs_alone():
    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    ctx = Context(MNDevice("mini:auto"))
    ctx.compile(lambda d: {"y": F.dropout(d["x"], 0.5, training=False) * 2}, {"x": torch.ones(4)}, None)
    assert GENERATOR_NAME not in ctx.runtime.resident
    assert torch.equal(torch.rand(3), expected)  # model initialisation after a compile is torch's


def test_random_numbers_without_a_context_are_refused():
    with pytest.raises(UnsupportedOpError, match="random numbers: the device draws dropout.*without a Context"):
        compile_function(lambda d: {"y": F.dropout(d["x"], 0.5)}, {"x": torch.ones(4)}, hwdesc.load("mini"))


def test_attention_dropout_is_drawn_inside_the_math_composite():
    """scaled_dot_product_attention with dropout_p (transformers' sdpa attention in training) and
    nn.MultiheadAttention with dropout: their weights' dropout is ATen's native_dropout inside
    the composite, drawn by the generator; with gradients, as in a training step."""
    mha = torch.nn.MultiheadAttention(8, 2, dropout=0.3, batch_first=True).train()

    def fn(d, attention=F.scaled_dot_product_attention):
        with torch.enable_grad():
            q = d["q"].detach().requires_grad_()
            out = attention(q, d["k"], d["v"], dropout_p=0.2, is_causal=True)
            mixed = mha(q[0], d["k"][0], d["v"][0], need_weights=False)[0]
            loss = out.square().sum() + mixed.square().sum()
            return {"out": out.detach(), "mixed": mixed.detach(), "dq": torch.autograd.grad(loss, q)[0]}

    def reference(d):  # the composite the trace takes, on the host
        def math(*args, **kwargs):
            return torch.ops.aten._scaled_dot_product_attention_math(*args, **kwargs)[0]
        return fn(d, math)
    torch.manual_seed(5)
    ctx = Context(MNDevice("mini:auto"))
    inputs = {name: torch.randn(2, 2, 6, 8) for name in "qkv"}
    got = ctx.compile(fn, inputs, None)(inputs)
    start = DeviceGenerator(lambda t: t, state=torch.tensor([int(ctx.generator.state[0]), 0], dtype=torch.int32),
                            registered=True)
    want = drawn_on_host(start, reference, inputs)
    for key in want:
        torch.testing.assert_close(got[key].cpu(), want[key], rtol=1e-5, atol=1e-5, msg=key)
    undropped = F.scaled_dot_product_attention(inputs["q"], inputs["k"], inputs["v"], is_causal=True)
    assert not torch.allclose(want["out"], undropped)  # some weights were dropped


@pytest.mark.parametrize("call", [
    lambda x: torch.rand(size=(4, 5)) + x, lambda x: torch.randn(size=(4, 5)) + x,
    lambda x: torch.randint(low=2, high=5, size=(4, 5)) + x, lambda x: torch.randint_like(x, low=3, high=7),
    lambda x: x.clone().uniform_(**{"from": 2, "to": 4}), lambda x: torch.bernoulli(input=torch.sigmoid(x)),
    lambda x: x.clone().random_(0, 10), lambda x: F.alpha_dropout(x, 0.3, True),
], ids=["rand_size", "randn_size", "randint_keywords", "randint_like", "uniform_from_to", "bernoulli_input",
        "random_", "alpha_dropout"])
def test_every_spelling_of_a_random_call_draws(call):
    """Keyword forms and ops reached inside others: all end in ATen's random ops, which are drawn."""
    torch.manual_seed(6)
    ctx = Context(MNDevice("mini:auto"))
    x = torch.zeros(4, 5)
    got = ctx.compile(lambda d: {"y": call(d["x"])}, {"x": x}, None)({"x": x})["y"].cpu()
    start = DeviceGenerator(lambda t: t, state=torch.tensor([int(ctx.generator.state[0]), 0], dtype=torch.int32),
                            registered=True)
    want = drawn_on_host(start, lambda d: {"y": call(d["x"])}, {"x": x})["y"]
    assert got.shape == want.shape == (4, 5) and got.dtype == want.dtype
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_a_torch_generator_argument_is_refused():
    ctx = Context(MNDevice("mini:auto"))
    g = torch.Generator().manual_seed(0)
    with pytest.raises(CompileError, match="a torch.Generator passed to a random function cannot be followed"):
        ctx.compile(lambda d: {"y": torch.rand(3, generator=g) + d["x"]}, {"x": torch.ones(3)}, None)

"""Random numbers on the device: a counter-based generator computed by the PEs' integer ops.

torch's CPU generator (Mersenne Twister) walks a sequential state, which a device program cannot
share with the host. The device instead draws as JAX does, from a counter-based generator:
Threefry-2x32 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011), whose
output for element i is a function of (i, key) alone, made of 32-bit adds, rotations and xors,
all of which the PE's ALU runs (iadd, lsl, bsr with iand, ior, ixor; `pe_ops`). 13 rounds, the
fewest the authors found to pass BigCrush with its safety margin for 2x32 (JAX takes 20); each
round is six int32 ops over the tensor.

The key is the Context's generator state, a registered int32 pair (seed, calls) kept on the
device: the first draw of a traced function reads it and adds one to `calls`, so every call of
the compiled program draws new numbers, and each draw of one call takes its own range of
counters. The seed is one number of torch's default generator, taken when the first function
that draws is compiled in the Context (so `torch.manual_seed` before it makes runs repeat, and
compiling functions that draw nothing leaves torch's generator alone); later seeds do not reach a
Context's generator, nor a reloaded codegen_dir's (it brings its state). The numbers differ from
what torch draws on the host, but not their distribution.

While a function is traced, ATen's random ops are decomposed into draws (`draws`, make_fx's
decomposition table in the trace's first pass): native_dropout (nn.Dropout, F.dropout, attention's
dropout_p), bernoulli and bernoulli_ (feature and alpha dropout), rand, randn, randint, their
_like forms, normal, uniform_, normal_ and random_. They are ordinary int32 and float ops then,
below autograd: dropout's gradient is torch's formula with the mask the draw made.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.fx.experimental.proxy_tensor import disable_proxy_modes_tracing
from torch.utils._python_dispatch import TorchDispatchMode

from ..dtypes import wrap_int32

ROTATIONS = (13, 15, 26, 6, 17, 29, 16, 24)  # Threefry-2x32's rotation constants (Random123)
PARITY = 0x1BD11BDA  # Threefry's key-schedule constant
ROUNDS = 13
MANTISSA = 24  # bits of a float32 significand: a uniform number is 24 random bits times 2^-24
SEED_BITS = 31  # a seed is a non-negative int32


@dataclass
class DeviceGenerator:
    """A Context's generator: its state (made and registered on the first draw) and, while a
    function is traced, the key that trace read and the counters its draws have taken."""

    # keeps the state on the device, as a registered buffer; returns the tensor registered under its
    # name (another one, when a reloaded program brought its own state)
    register: Callable[[torch.Tensor], torch.Tensor]
    state: torch.Tensor | None = None
    registered: bool = False
    key: torch.Tensor | None = field(default=None, repr=False)
    drawn: int = 0

    def start_trace(self) -> None:
        self.key, self.drawn = None, 0

    def counters(self, shape: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        """The key and the counters of a draw of `shape`: element i of the draw (row-major) gets
        counter drawn + i, after those of the trace's earlier draws."""
        if not self.registered:
            if self.state is None:  # the first draw of the Context: one number of torch's generator, drawn
                with unset_fake_temporarily(), disable_proxy_modes_tracing():  # for real, outside the trace
                    seed = int(torch.randint(0, 2 ** SEED_BITS - 1, ()).item())
                    self.state = torch.tensor([seed, 0], dtype=torch.int32)
            self.state = self.register(self.state)
            self.registered = True
        if self.key is None:  # the first draw of this trace: read the state and count the call
            self.key = self.state.clone()
            self.state.add_(torch.tensor([0, 1], dtype=torch.int32))
        index = torch.full((), wrap_int32(self.drawn), dtype=torch.int32)
        stride = 1
        for dim in reversed(range(len(shape))):
            size = shape[dim]
            view = [1] * len(shape)
            view[dim] = size
            index = index + torch.arange(0, size * stride, stride, dtype=torch.int32).reshape(view)
            stride *= size
        self.drawn += stride
        return self.key, index.expand(shape)


def _rotl(x: torch.Tensor, r: int) -> torch.Tensor:
    """x rotated left by r bits (int32 words: the arithmetic right shift's copies of the sign bit
    masked off)."""
    return (x << r) | ((x >> (32 - r)) & ((1 << r) - 1))


def threefry(key: torch.Tensor, c0: torch.Tensor, c1: torch.Tensor | int = 0, rounds: int = ROUNDS
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """Threefry-2x32: the two int32 words for counters (c0, c1) under key = (k0, k1), an int32 pair."""
    k0, k1 = key[0], key[1]
    schedule = (k0, k1, k0 ^ k1 ^ PARITY)
    x0, x1 = c0 + k0, c1 + k1
    for r in range(rounds):
        x0 = x0 + x1
        x1 = _rotl(x1, ROTATIONS[r % len(ROTATIONS)]) ^ x0
        if r % 4 == 3:  # key injection every four rounds
            s = r // 4 + 1
            x0 = x0 + schedule[s % 3]
            x1 = x1 + schedule[(s + 1) % 3] + s
    return x0, x1


def _unit(word: torch.Tensor, dtype: torch.dtype, open_below: bool = False) -> torch.Tensor:
    """A uniform number from the top 24 bits of an int32 word: in [0, 1), or (0, 1] for a log."""
    bits = (word >> (32 - MANTISSA)) & ((1 << MANTISSA) - 1)
    u = (bits.to(torch.float32) + (1.0 if open_below else 0.0)) * 2.0 ** -MANTISSA
    return u.to(dtype)


def draws(generator: DeviceGenerator) -> dict[Any, Callable]:
    """ATen's random ops as draws from `generator`, for make_fx's decomposition table: every way
    of reaching them (nn.Dropout, F.dropout2d's feature dropout, alpha dropout, attention's
    dropout_p inside scaled_dot_product_attention or nn.MultiheadAttention, Tensor.uniform_)
    ends in one of these, with ATen's one spelling of the arguments."""
    aten = torch.ops.aten

    def uniform(shape: Any, dtype: torch.dtype | None) -> torch.Tensor:
        key, index = generator.counters(tuple(int(n) for n in shape))
        return _unit(threefry(key, index)[0], dtype or torch.get_default_dtype())

    def gaussian(shape: Any, dtype: torch.dtype | None) -> torch.Tensor:
        """Box-Muller: sqrt(-2 log u1) cos(2 pi u2), u1 in (0, 1] from one word of the pair, u2
        from the other."""
        key, index = generator.counters(tuple(int(n) for n in shape))
        w0, w1 = threefry(key, index)
        u1, u2 = _unit(w0, torch.float32, open_below=True), _unit(w1, torch.float32)
        z = torch.sqrt(-2.0 * torch.log(u1)) * torch.cos(2.0 * math.pi * u2)
        return z.to(dtype or torch.get_default_dtype())

    def integers(shape: Any, low: int, high: int, dtype: torch.dtype | None) -> torch.Tensor:
        """floor(u (high - low)) + low: uniform while the range is within u's 24 bits."""
        u = uniform(shape, torch.float32)
        return (torch.floor(u * (high - low)) + low).to(dtype or torch.int64)

    def native_dropout(x: torch.Tensor, p: float, train: bool | None) -> tuple[torch.Tensor, torch.Tensor]:
        """(x times the mask over 1 - p, the mask): each element kept with probability 1 - p."""
        if train is False:
            return x.clone(), torch.ones_like(x, dtype=torch.bool)
        if p >= 1:  # x * 0, as torch: a NaN or an infinity stays NaN
            return x * 0, torch.zeros_like(x, dtype=torch.bool)
        keep = uniform(x.shape, torch.float32) >= p
        return x * keep.to(x.dtype) * (1.0 / (1.0 - p)), keep

    def filled(x: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        return x.copy_(values.to(x.dtype))

    def likely(x: torch.Tensor, p: Any) -> torch.Tensor:
        return uniform(x.shape, torch.float32) < (p.float() if isinstance(p, torch.Tensor) else p)

    table = {
        aten.native_dropout.default: native_dropout,
        aten.bernoulli.default: lambda x, *, generator=None: _one(generator) and likely(x, x).to(x.dtype),
        aten.bernoulli.p: lambda x, p=0.5, *, generator=None: _one(generator) and likely(x, p).to(x.dtype),
        aten.bernoulli_.float: lambda x, p=0.5, *, generator=None: _one(generator) and filled(x, likely(x, p)),
        aten.bernoulli_.Tensor: lambda x, p, *, generator=None: _one(generator) and filled(x, likely(x, p)),
        aten.rand.default: lambda size, *, dtype=None, **_: uniform(size, dtype),
        aten.rand.generator: lambda size, *, generator, **_: _one(generator),
        aten.rand_like.default: lambda x, *, dtype=None, **_: uniform(x.shape, dtype or x.dtype),
        aten.randn.default: lambda size, *, dtype=None, **_: gaussian(size, dtype),
        aten.randn.generator: lambda size, *, generator, **_: _one(generator),
        aten.randn_like.default: lambda x, *, dtype=None, **_: gaussian(x.shape, dtype or x.dtype),
        aten.randint.default: lambda high, size, *, dtype=None, **_: integers(size, 0, high, dtype),
        aten.randint.low: lambda low, high, size, *, dtype=None, **_: integers(size, low, high, dtype),
        aten.randint_like.default: lambda x, high, *, dtype=None, **_: integers(x.shape, 0, high, dtype or x.dtype),
        aten.randint_like.low_dtype: lambda x, low, high, *, dtype=None, **_:
            integers(x.shape, low, high, dtype or x.dtype),
        aten.uniform_.default: lambda x, low=0.0, high=1.0, *, generator=None:
            _one(generator) and filled(x, uniform(x.shape, torch.float32) * (high - low) + low),
        aten.normal_.default: lambda x, mean=0.0, std=1.0, *, generator=None:
            _one(generator) and filled(x, gaussian(x.shape, torch.float32) * std + mean),
        getattr(aten.random_, "from"): lambda x, low, high=None, *, generator=None:
            _one(generator) and filled(x, integers(x.shape, low, _high(high), torch.float32)),
        aten.random_.to: lambda x, high, *, generator=None: _one(generator) and filled(
            x, integers(x.shape, 0, high, torch.float32)),
    }
    for normal in ("Tensor_Tensor", "Tensor_float", "float_Tensor"):
        table[getattr(aten.normal, normal)] = _normal_of(gaussian)
    table[aten.normal.float_float] = lambda mean, std, size, *, generator=None, dtype=None, **_: \
        _one(generator) and gaussian(size, dtype) * std + mean
    return table


def _normal_of(gaussian: Callable) -> Callable:
    """torch.normal with a tensor mean or std: one draw per element of their broadcast shape."""
    def normal(mean: Any, std: Any = 1.0, *, generator: Any = None) -> torch.Tensor:
        _one(generator)
        tensors = [t for t in (mean, std) if isinstance(t, torch.Tensor)]
        shape = torch.broadcast_shapes(*(tuple(t.shape) for t in tensors))
        return gaussian(shape, tensors[0].dtype) * std + mean
    return normal


def _high(high: int | None) -> int:
    """random_'s upper bound; without one (torch: the dtype's largest exact integer) it is refused,
    since the generator's 24-bit uniform numbers would not spread over such a range."""
    if high is not None:
        return high
    raise ValueError("random_(from, None) draws up to the type's largest integer, which the device generator's "
                     "24-bit numbers do not reach; give `to`")


def _one(generator: Any) -> bool:
    """A torch.Generator names a stream of the host's; the device has one generator per Context."""
    if generator is not None:
        raise ValueError("a torch.Generator passed to a random function cannot be followed on the device: it "
                         "draws from its Context's generator (torch.manual_seed before the first compile seeds "
                         "it); leave generator= out")
    return True


class HostDraws(TorchDispatchMode):
    """The device's draws evaluated by torch on the host (eager): what a compiled program drawing
    from a generator in the same state computes, for tests and reference runs."""

    def __init__(self, generator: DeviceGenerator) -> None:
        super().__init__()
        self.table = draws(generator)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        handler = self.table.get(func)
        return (handler or func)(*args, **(kwargs or {}))

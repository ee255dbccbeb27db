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
counters. The seed comes from torch's default generator when the state is made (so
`torch.manual_seed` before the first compile makes runs repeat); the numbers differ from what
torch draws on the host, but not their distribution.

While a function is traced, `DeviceRandom` replaces torch's random functions by draws: dropout
(F.dropout, nn.Dropout, torch.dropout and their channel-wise forms; scaled_dot_product_attention
with dropout_p runs as its definition with F.dropout, frontend.tracing), rand, randn, their _like
forms, bernoulli, randint, normal, and the in-place uniform_, normal_ and bernoulli_. They are ordinary int32 and float ops then: autograd sees
dropout as a product with a mask, whose gradient reuses the same mask.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

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
        """Called before a trace, outside it: the state is made here (its seed is a real number
        of torch's generator), registered only once a draw reads it."""
        if self.state is None:
            seed = int(torch.randint(0, 2 ** SEED_BITS - 1, ()).item())
            self.state = torch.tensor([seed, 0], dtype=torch.int32)
        self.key, self.drawn = None, 0

    def counters(self, shape: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        """The key and the counters of a draw of `shape`: element i of the draw (row-major) gets
        counter drawn + i, after those of the trace's earlier draws."""
        if not self.registered:
            self.state = self.register(self.state)
            self.registered = True
        if self.key is None:  # the first draw of this trace: read the state and count the call
            self.key = self.state.clone()
            self.state.add_(torch.tensor([0, 1], dtype=torch.int32))
        index = torch.full((), (self.drawn + 2 ** 31) % 2 ** 32 - 2 ** 31, dtype=torch.int32)  # wraps as int32
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


class DeviceRandom(TorchFunctionMode):
    """While active (tracing), torch's random functions draw from `generator` (see the module)."""

    def __init__(self, generator: DeviceGenerator) -> None:
        super().__init__()
        self.generator = generator
        g = self
        self.replaced: dict[Callable, Callable] = {
            torch.rand: g.rand, torch.rand_like: lambda x, **kw: g.rand(*x.shape, **_like(x, kw)),
            torch.randn: g.randn, torch.randn_like: lambda x, **kw: g.randn(*x.shape, **_like(x, kw)),
            torch.randint: g.randint, torch.randint_like: g.randint_like,
            torch.bernoulli: g.bernoulli, torch.Tensor.bernoulli: g.bernoulli, torch.Tensor.bernoulli_: g.bernoulli_,
            torch.normal: g.normal, torch.Tensor.normal_: g.normal_, torch.Tensor.uniform_: g.uniform_,
            F.dropout: g.dropout, torch.dropout: g.dropout, torch.nn.functional.dropout1d: g.dropout_nd(1),
            F.dropout2d: g.dropout_nd(2), F.dropout3d: g.dropout_nd(3),
        }

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        handler = self.replaced.get(func)
        if handler is not None:
            result = handler(*args, **kwargs)
            if result is not NotImplemented:
                return result
        return func(*args, **kwargs)

    # ---- draws ------------------------------------------------------------------------------

    def _uniform(self, shape: tuple[int, ...], dtype: torch.dtype | None) -> torch.Tensor:
        key, index = self.generator.counters(shape)
        return _unit(threefry(key, index)[0], dtype or torch.get_default_dtype())

    def rand(self, *size: Any, dtype: torch.dtype | None = None, generator: Any = None, **_: Any) -> torch.Tensor:
        return self._uniform(_shape(size), dtype) if generator is None else NotImplemented

    def randn(self, *size: Any, dtype: torch.dtype | None = None, generator: Any = None, **_: Any) -> torch.Tensor:
        """Box-Muller: sqrt(-2 log u1) cos(2 pi u2), u1 in (0, 1] from one word of the pair, u2
        from the other."""
        if generator is not None:
            return NotImplemented
        key, index = self.generator.counters(_shape(size))
        w0, w1 = threefry(key, index)
        u1, u2 = _unit(w0, torch.float32, open_below=True), _unit(w1, torch.float32)
        z = torch.sqrt(-2.0 * torch.log(u1)) * torch.cos(2.0 * math.pi * u2)
        return z.to(dtype or torch.get_default_dtype())

    def randint(self, *args: Any, size: Any = None, dtype: torch.dtype | None = None, generator: Any = None,
                **_: Any) -> torch.Tensor:
        """randint(high, size) or randint(low, high, size): floor(u * (high - low)) + low."""
        if generator is not None:
            return NotImplemented
        numbers = [a for a in args if isinstance(a, int)]
        shapes = [a for a in args if not isinstance(a, int)]
        size = size if size is not None else shapes[0]
        low, high = (0, numbers[0]) if len(numbers) == 1 else numbers[:2]
        u = self._uniform(_shape((size,)), torch.float32)
        return (torch.floor(u * (high - low)) + low).to(dtype or torch.int64)

    def randint_like(self, x: torch.Tensor, *args: int, dtype: torch.dtype | None = None, **_: Any) -> torch.Tensor:
        return self.randint(*args, size=tuple(x.shape), dtype=dtype or x.dtype)

    def bernoulli(self, x: torch.Tensor, p: float | None = None, *, generator: Any = None, **_: Any) -> torch.Tensor:
        """1 with probability p (a number, or x itself holding the probabilities), else 0."""
        if generator is not None:
            return NotImplemented
        u = self._uniform(tuple(x.shape), torch.float32)
        return (u < (x.float() if p is None else p)).to(x.dtype)

    def bernoulli_(self, x: torch.Tensor, p: float | torch.Tensor = 0.5, *, generator: Any = None) -> torch.Tensor:
        if generator is not None:
            return NotImplemented
        u = self._uniform(tuple(x.shape), torch.float32)
        return x.copy_((u < p).to(x.dtype))

    def normal(self, mean: Any = 0.0, std: Any = 1.0, size: Any = None, *, generator: Any = None,
               dtype: torch.dtype | None = None, **_: Any) -> torch.Tensor:
        if generator is not None:
            return NotImplemented
        shape = _shape((size,)) if size is not None else torch.broadcast_shapes(
            *(tuple(t.shape) for t in (mean, std) if isinstance(t, torch.Tensor)))
        like = next((t.dtype for t in (mean, std) if isinstance(t, torch.Tensor)), dtype)
        return self.randn(*shape, dtype=like) * std + mean

    def normal_(self, x: torch.Tensor, mean: float = 0.0, std: float = 1.0, *, generator: Any = None) -> torch.Tensor:
        if generator is not None:
            return NotImplemented
        return x.copy_(self.randn(*x.shape, dtype=x.dtype) * std + mean)

    def uniform_(self, x: torch.Tensor, a: float = 0.0, b: float = 1.0, *, generator: Any = None) -> torch.Tensor:
        if generator is not None:
            return NotImplemented
        return x.copy_(self._uniform(tuple(x.shape), x.dtype) * (b - a) + a)

    # ---- dropout ----------------------------------------------------------------------------

    def _dropped(self, x: torch.Tensor, p: float, mask_shape: tuple[int, ...], inplace: bool) -> torch.Tensor:
        """x times a mask of `mask_shape` (broadcast over x) that keeps with probability 1 - p,
        scaled by 1 / (1 - p), as torch's dropout."""
        _check_probability(p)
        if p == 1:  # x * 0, as torch: a NaN or an infinity stays NaN
            y = x * 0
        else:
            keep = self._uniform(mask_shape, torch.float32) >= p
            y = x * keep.to(x.dtype) * (1.0 / (1.0 - p))
        return x.copy_(y) if inplace else y

    def dropout(self, x: torch.Tensor, p: float = 0.5, train: bool = True, inplace: bool = False,
                **kwargs: Any) -> torch.Tensor:
        training = kwargs.get("training", train)
        if not training or p == 0:
            return NotImplemented  # torch's own: the input
        return self._dropped(x, p, tuple(x.shape), inplace)

    def dropout_nd(self, spatial: int) -> Callable[..., torch.Tensor]:
        """F.dropout1d / 2d / 3d: whole channels dropped, as torch's feature dropout (a 3-D input
        to dropout2d is taken as (N, C, L), as torch does; an unbatched input has one channel dim)."""
        def dropout(x: torch.Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> torch.Tensor:
            if not training or p == 0:
                return NotImplemented
            batched = x.dim() == spatial + 2 or (spatial == 2 and x.dim() == 3)
            lead = 2 if batched else 1
            return self._dropped(x, p, tuple(x.shape[:lead]) + (1,) * (x.dim() - lead), inplace)
        return dropout


def _shape(size: tuple) -> tuple[int, ...]:
    """torch's size arguments: rand(2, 3), rand((2, 3)), rand([2, 3]), rand(torch.Size)."""
    if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)):
        size = tuple(size[0])
    return tuple(int(s) for s in size)


def _like(x: torch.Tensor, kwargs: dict) -> dict:
    return {"dtype": kwargs.get("dtype") or x.dtype}


def _check_probability(p: float) -> None:
    if not 0 <= p <= 1:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")

"""The compiler's primitive graph: a small set of tensor operations that every model reduces to.

A traced torch function is decomposed with torch's own tables and then *legalized*
(`compiler.frontend.legalize`) into these primitives, so the planner and the kernels see a
handful of kinds instead of hundreds of ATen ops:

============  ==========================================================================
kind          meaning (shapes are static; broadcasting follows torch's rules)
============  ==========================================================================
``ew``        element-wise ``op`` over 1-3 operands (tensors or Python scalars), see EW_OPS
``reduce``    ``op`` in sum / max / min over ``dims`` (``keepdim``)
``reshape``   the same elements, row-major, in another ``shape``
``permute``   dimensions reordered by ``order``
``expand``    broadcast to ``shape`` (size-1 or new leading dimensions repeat)
``slice``     ``start:stop:step`` along ``dim`` (step > 0)
``pad``       ``pads`` = ((before, after), ...) per dimension, filled with ``value``; a
              negative amount crops
``window``    ``out[o] = x[A o + b]`` for an integer matrix ``A`` and offset ``b`` (pooling
              windows, flips, diagonals); a source index out of range reads ``fill``
``cat``       operands joined along ``dim``
``split``     ``sizes`` along ``dim``: one output per part (the multi-output primitive)
``matmul``    ``a @ b`` with batch dimensions broadcast (torch.matmul on >= 2-D operands)
``conv``      2-D convolution of (N, C, H, W) by (Co, C / groups, kh, kw) with ``stride``,
              ``padding``, ``dilation``, ``groups``
``iota``      ``start + step * index[dim]`` over ``shape`` (arange), a literal of indices
``full``      ``value`` everywhere in ``shape``
============  ==========================================================================

Invariants the legalizer establishes and the backend relies on: tensor operands of an ``ew``
node share one dtype (its compute dtype), except the condition of ``where`` (bool) and the
operand of ``cast``; comparisons and logical ops return bool; ``matmul`` and ``conv`` operands
are floating point. Dtypes are the device's: float32, float16 (MN-Core half), int32 (also
holds torch's int64, range-checked where values cross the host boundary) and bool.

`evaluate` runs a graph with torch, one primitive at a time: it is the definition of each
primitive's semantics, against which the legalizer is tested.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from math import prod
from typing import Any, Callable

import torch

from .dtypes import INT32_MAX, INT32_MIN

DTYPES = ("float32", "float16", "int32", "bool")
FLOAT_DTYPES = ("float32", "float16")
TORCH_OF = {"float32": torch.float32, "float16": torch.float16, "int32": torch.int32, "bool": torch.bool}

UNARY = ("copy", "neg", "abs", "relu", "exp", "log", "log1p", "expm1", "sqrt", "rsqrt", "reciprocal",
         "sigmoid", "tanh", "erf", "sin", "cos", "floor", "ceil", "trunc", "round", "sign", "not", "cast",
         "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh", "erfinv", "lgamma", "digamma",
         "erfc", "erfcx")
BINARY = ("add", "sub", "mul", "div", "floor_div", "rem", "pow", "max", "min", "atan2", "hypot",
          "lt", "le", "gt", "ge", "eq", "ne", "and", "or", "xor", "bitand", "bitor", "bitxor", "shl", "shr")
TERNARY = ("where",)
EW_OPS = UNARY + BINARY + TERNARY
COMPARISONS = ("lt", "le", "gt", "ge", "eq", "ne")
LOGICAL = ("and", "or", "xor", "not")
BITWISE = ("bitand", "bitor", "bitxor", "shl", "shr")  # on int32 words (two's complement), the result int32
REDUCE_OPS = ("sum", "max", "min", "prod")
MOVEMENT = ("reshape", "permute", "expand", "slice", "pad", "window", "cat", "split")
KINDS = ("ew", "reduce", *MOVEMENT, "matmul", "conv", "iota", "full")

Scalar = int | float | bool


def reduction_identity(op: str, dtype: str) -> Scalar:
    """What a reduction `op` (REDUCE_OPS) starts from in `dtype`: padding it reads changes nothing."""
    if dtype == "bool":
        return op in ("min", "prod")
    if dtype == "int32":
        return {"sum": 0, "max": INT32_MIN, "min": INT32_MAX, "prod": 1}[op]
    return {"sum": 0.0, "max": float("-inf"), "min": float("inf"), "prod": 1.0}[op]
CONV_RANK = 4  # conv operands are (N, C, H, W) and (Co, C / groups, kh, kw)


@dataclass(eq=False)
class Value:
    """A tensor of the graph: an input, a captured constant, or an output of a node."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    kind: str = "node"  # input | const | node
    producer: "Node | None" = None
    index: int = 0  # which output of the producer
    data: torch.Tensor | None = None  # a constant's values (device dtype)
    torch_dtype: str = ""  # the user's dtype when it differs from the device's (int64 held as int32)

    @property
    def numel(self) -> int:
        return prod(self.shape)

    @property
    def rank(self) -> int:
        return len(self.shape)

    def __repr__(self) -> str:
        return f"%{self.name}:{self.dtype}{list(self.shape)}"


@dataclass(eq=False)
class Node:
    """One primitive: `kind` (see the module doc), `op` (the element-wise or reduction op; the kind
    otherwise), operands `args` (Values and, for ew, Python scalars), named `attrs`, outputs."""

    kind: str
    op: str
    args: tuple[Any, ...]
    attrs: dict[str, Any]
    outputs: tuple[Value, ...] = ()
    source: str = ""  # "file.py:12: y = x @ w", the user's line that produced it
    aten: str = ""  # the ATen op it was legalized from (messages and reports)
    phase: str = "forward"  # forward | backward | optimizer: which part of a training step made it

    @property
    def inputs(self) -> list[Value]:
        seen: list[Value] = []
        for a in self.args:
            if isinstance(a, Value) and a not in seen:
                seen.append(a)
        return seen

    @property
    def out(self) -> Value:
        return self.outputs[0]

    @property
    def label(self) -> str:
        """How reports name the node: 'mm_1 (matmul) @ model.py:12'."""
        text = f"{self.out.name} ({self.op})"
        if self.source:
            file, line = self.source.split(":")[:2]
            text += f" @ {os.path.basename(file)}:{line}"
        return text

    def __repr__(self) -> str:
        args = ", ".join(repr(a) for a in self.args)
        attrs = "".join(f", {k}={v!r}" for k, v in self.attrs.items())
        return f"{', '.join(map(repr, self.outputs))} = {self.kind}.{self.op}({args}{attrs})"


def update_output(name: str) -> str:
    """The output that carries the new value of resident input `name`."""
    return f"{name}@updated"


@dataclass(eq=False)
class Graph:
    """Inputs and outputs keep the names the user gave them (key paths of the pytrees)."""

    inputs: dict[str, Value]
    outputs: dict[str, Value]
    nodes: list[Node]
    constants: list[Value] = field(default_factory=list)
    out_spec: Any = None  # pytree spec of the function's return value
    in_spec: Any = None
    module: Any = None  # the traced torch.fx GraphModule (flat tensors in, flat list out): reference runs
    resident: dict[str, torch.Tensor] = field(default_factory=dict, repr=False)
    """Inputs that are device-resident tensors (registered parameters, buffers, optimizer state),
    by name, with the host tensors they were traced from."""
    updates: dict[str, Value] = field(default_factory=dict)
    """Resident input name -> the value the function leaves in it (also the output named
    `update_output(name)`): what a training step writes back into its state."""
    gradients_left: list[torch.Tensor] = field(default_factory=list, repr=False)
    """Captured tensors whose `.grad` the function left holding a gradient it computed."""
    zeroed: set[int] = field(default_factory=set, repr=False)
    """ids of the parameters whose gradients the function cleared (an optimizer's or a module's
    zero_grad): the others' gradients add up over calls, as torch's do."""

    def update_outputs(self) -> dict[str, str]:
        """Resident input name -> the output carrying its new value."""
        return {name: update_output(name) for name in self.updates}

    def has_phase(self, phase: str) -> bool:
        return any(n.phase == phase for n in self.nodes)

    def users(self) -> dict[Value, list[Node]]:
        out: dict[Value, list[Node]] = {}
        for n in self.nodes:
            for v in n.inputs:
                out.setdefault(v, []).append(n)
        return out

    def ops(self) -> list[str]:
        return sorted({f"{n.kind}.{n.op}" if n.kind in ("ew", "reduce") else n.kind for n in self.nodes})

    def drop_dead(self) -> None:
        """Remove primitives nothing reads (legalization and rewrites leave some, e.g. a permute
        or reshape folded into the next one), so the planner does not place and run them."""
        needed = set(self.outputs.values())
        kept = []
        for node in reversed(self.nodes):
            if any(v in needed for v in node.outputs):
                kept.append(node)
                needed.update(node.inputs)
        self.nodes = kept[::-1]

    def signature(self) -> str:
        """A text that changes when the program would (cache keys)."""
        lines = [f"in {n} {v.shape} {v.dtype}" for n, v in self.inputs.items()]
        for node in self.nodes:
            args = [a.name if isinstance(a, Value) else repr(a) for a in node.args]
            lines.append(f"{[o.name for o in node.outputs]} {node.kind}.{node.op} {args} {sorted(node.attrs.items())}")
        lines += [f"out {n} {v.name}" for n, v in self.outputs.items()]
        return "\n".join(lines)


# ---- semantics ------------------------------------------------------------------------------

def _cast(x: torch.Tensor, dtype: str) -> torch.Tensor:
    if dtype == "int32" and x.is_floating_point():
        return x.to(torch.float64).trunc().clamp(INT32_MIN, INT32_MAX).to(torch.int32)
    return x.to(TORCH_OF[dtype])


def _ew(op: str, xs: list[Any], dtype: str) -> torch.Tensor:
    t = torch
    unary: dict[str, Callable] = {
        "copy": lambda a: a, "neg": t.neg, "abs": t.abs, "relu": t.relu, "exp": t.exp, "log": t.log,
        "log1p": t.log1p, "expm1": t.expm1, "sqrt": t.sqrt, "rsqrt": t.rsqrt, "reciprocal": t.reciprocal,
        "sigmoid": t.sigmoid, "tanh": t.tanh, "erf": t.erf, "sin": t.sin, "cos": t.cos, "floor": t.floor,
        "ceil": t.ceil, "trunc": t.trunc, "round": t.round, "sign": t.sign, "not": t.logical_not,
        "cast": lambda a: _cast(a, dtype), **{name: getattr(t, name) for name in (
            "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh", "erfinv", "lgamma", "digamma",
            "erfc")},
        "erfcx": t.special.erfcx}
    binary: dict[str, Callable] = {
        "add": t.add, "sub": t.sub, "mul": t.mul, "div": t.div, "pow": t.pow, "max": t.maximum, "min": t.minimum,
        "atan2": t.atan2, "hypot": t.hypot,
        "floor_div": lambda a, b: t.div(a, b, rounding_mode="floor"), "rem": t.remainder,
        "lt": t.lt, "le": t.le, "gt": t.gt, "ge": t.ge, "eq": t.eq, "ne": t.ne,
        "and": t.logical_and, "or": t.logical_or, "xor": t.logical_xor,
        "bitand": t.bitwise_and, "bitor": t.bitwise_or, "bitxor": t.bitwise_xor,
        "shl": t.bitwise_left_shift, "shr": t.bitwise_right_shift}
    if op == "where":
        return t.where(xs[0], xs[1], xs[2])
    if op in unary:
        return unary[op](xs[0])
    a, b = xs
    if not isinstance(a, torch.Tensor):  # scalar first operand
        a = t.tensor(a, dtype=b.dtype)
    if op in ("max", "min") and not isinstance(b, torch.Tensor):
        b = t.tensor(b, dtype=a.dtype)
    return binary[op](a, b)


def _window(x: torch.Tensor, shape: tuple[int, ...], a: tuple[tuple[int, ...], ...], b: tuple[int, ...],
            fill: Scalar) -> torch.Tensor:
    out_idx = torch.stack(torch.meshgrid(*[torch.arange(s) for s in shape], indexing="ij")).reshape(len(shape), -1)
    src = torch.tensor(a, dtype=torch.int64).reshape(x.dim(), len(shape)) @ out_idx + torch.tensor(b).reshape(-1, 1)
    inside = torch.ones(src.shape[1], dtype=torch.bool)
    for d, size in enumerate(x.shape):
        inside &= (src[d] >= 0) & (src[d] < size)
    flat = torch.zeros(src.shape[1], dtype=torch.int64)
    for d, size in enumerate(x.shape):
        flat = flat * size + src[d].clamp(0, size - 1)
    values = x.reshape(-1)[flat]
    return torch.where(inside, values, torch.tensor(fill, dtype=x.dtype)).reshape(shape)


def _conv(x: torch.Tensor, w: torch.Tensor, a: dict, out_hw: tuple[int, ...]) -> torch.Tensor:
    """A conv node on torch tensors: x spread by its input dilation (zeros between its pixels),
    padded before by `padding` and after to what `out_hw` reads (cut where it reads less)."""
    s, p, d, stride = a.get("input_dilation", (1, 1)), a["padding"], a["dilation"], a["stride"]
    n, c, h, wd = x.shape
    spread_hw = ((h - 1) * s[0] + 1, (wd - 1) * s[1] + 1)
    need = [(o - 1) * st + dl * (k - 1) + 1 for o, st, dl, k in zip(out_hw, stride, d, w.shape[2:])]
    after = [need[i] - p[i] - spread_hw[i] for i in range(2)]  # negative: cut
    if tuple(s) == (1, 1) and after == list(p):  # torch's own convolution
        return torch.nn.functional.conv2d(x, w, None, stride, p, d, a["groups"])
    spread = x.new_zeros((n, c, *spread_hw))
    spread[:, :, ::s[0], ::s[1]] = x
    padded = torch.nn.functional.pad(spread, (p[1], after[1], p[0], after[0]))
    return torch.nn.functional.conv2d(padded, w, None, stride, 0, d, a["groups"])


def apply(node: Node, args: list[Any]) -> list[torch.Tensor]:
    """One primitive on torch tensors (the operands in `node.args` order, scalars as they are)."""
    k, a = node.kind, node.attrs
    dtype = node.out.dtype
    if k == "ew":
        return [_ew(node.op, args, dtype).to(TORCH_OF[dtype])]
    x = args[0] if args else None
    if k == "reduce":
        fn = {"sum": torch.sum, "max": torch.amax, "min": torch.amin}[node.op]
        return [fn(x, dim=tuple(a["dims"]), keepdim=a["keepdim"]).to(TORCH_OF[dtype])] if a["dims"] else [x.clone()]
    if k == "reshape":
        return [x.reshape(a["shape"])]
    if k == "permute":
        return [x.permute(a["order"])]
    if k == "expand":
        return [x.expand(a["shape"])]
    if k == "slice":
        return [x.narrow(a["dim"], 0, x.shape[a["dim"]])[(slice(None),) * a["dim"]
                                                          + (slice(a["start"], a["stop"], a["step"]),)]]
    if k == "pad":
        flat = [p for before_after in reversed(a["pads"]) for p in before_after]
        return [torch.nn.functional.pad(x, flat, value=a["value"])]
    if k == "window":
        return [_window(x, node.out.shape, a["a"], a["b"], a["fill"])]
    if k == "cat":
        return [torch.cat(args, dim=a["dim"])]
    if k == "split":
        return list(torch.split(x, list(a["sizes"]), dim=a["dim"]))
    if k == "matmul":
        return [torch.matmul(args[0].float(), args[1].float()).to(TORCH_OF[dtype])]
    if k == "conv":
        return [_conv(args[0].float(), args[1].float(), a, node.out.shape[2:]).to(TORCH_OF[dtype])]
    if k == "iota":
        shape, dim = node.out.shape, a["dim"]
        line = a["start"] + a["step"] * torch.arange(shape[dim], dtype=torch.float64)
        view = [1] * len(shape)
        view[dim] = shape[dim]
        return [_cast(line.reshape(view).expand(shape), dtype).contiguous()]
    if k == "full":
        return [torch.full(node.out.shape, a["value"], dtype=TORCH_OF[dtype])]
    raise ValueError(f"unknown primitive kind {k!r}")


def evaluate(graph: Graph, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Run the primitive graph with torch (device dtypes: int64 inputs are taken as int32)."""
    env: dict[Value, torch.Tensor] = {}
    for name, v in graph.inputs.items():
        env[v] = _cast(inputs[name], v.dtype) if v.dtype == "int32" else inputs[name].to(TORCH_OF[v.dtype])
    for c in graph.constants:
        env[c] = c.data
    for node in graph.nodes:
        args = [env[a] if isinstance(a, Value) else a for a in node.args]
        for out, result in zip(node.outputs, apply(node, args)):
            if tuple(result.shape) != out.shape:
                raise AssertionError(f"{node}: computed shape {tuple(result.shape)}, declared {out.shape}")
            env[out] = result
    return {name: env[v] for name, v in graph.outputs.items()}

"""`Builder`: makes primitive nodes (compiler.ir) with their shapes and dtypes inferred.

Legalization rules call `b.ew("add", x, 1.0)`, `b.reduce("sum", x, [1])`, `b.reshape(x, (4, 8))`
and so on; the builder checks operands, infers each output's shape and dtype, names the value
and stamps the node with the user's source line and the ATen op being legalized, so every
primitive can say where it came from.
"""

from __future__ import annotations

from math import copysign, prod
from typing import Any, Sequence

from ..dtypes import INT32_MAX, INT32_MIN
from ..errors import CompileError
from ..ir import (BINARY, COMPARISONS, CONV_RANK, EW_OPS, FLOAT_DTYPES, LOGICAL, REDUCE_OPS, TERNARY, UNARY, Graph, Node,
                  Scalar, Value, reduction_identity)


def broadcast_shapes(*shapes: Sequence[int]) -> tuple[int, ...]:
    """torch's broadcasting rule (right-aligned; size 1 stretches)."""
    rank = max((len(s) for s in shapes), default=0)
    out = []
    for k in range(rank):
        sizes = {s[len(s) - rank + k] for s in shapes if len(s) - rank + k >= 0} - {1}
        if len(sizes) > 1:
            raise CompileError(f"shapes {[list(s) for s in shapes]} do not broadcast")
        out.append(sizes.pop() if sizes else 1)
    return tuple(out)


def norm_dim(dim: int, rank: int) -> int:
    r = max(rank, 1)
    if not -r <= dim < r:
        raise CompileError(f"dimension {dim} is out of range for a tensor of rank {rank}")
    return dim % r


class Builder:
    """Appends primitives to `graph.nodes`; `source` and `aten` label what it makes."""

    def __init__(self, graph: Graph, taken: set[str]) -> None:
        self.graph = graph
        self.taken = taken
        self.source = ""
        self.aten = ""
        self.phase = "forward"
        self.stem = "v"
        self.used: set[int] = set()  # outputs of the ATen node being legalized that something reads
        # whether the ATen node's result is a torch int32 tensor: its arithmetic wraps a scalar
        # beyond int32 as the device does (an int64 result would not: torch keeps 64 bits)
        self.int32_result = False
        # values that are a device-resident input's content after an in-place write (copy_) into
        # it, by that input's name: a later write into them writes the input again
        self.resident_contents: dict[Value, str] = {}

    def wants_output(self, k: int) -> bool:
        return k in self.used

    def fresh(self, base: str) -> str:
        name, k = base, 1
        while name in self.taken:
            name, k = f"{base}_{k}", k + 1
        self.taken.add(name)
        return name

    def node(self, kind: str, op: str, args: Sequence[Any], attrs: dict[str, Any],
             outs: Sequence[tuple[tuple[int, ...], str]]) -> Node:
        node = Node(kind, op, tuple(args), dict(attrs), (), self.source, self.aten, self.phase)
        values = []
        for k, (shape, dtype) in enumerate(outs):
            v = Value(self.fresh(self.stem), tuple(int(s) for s in shape), dtype, "node", node, k)
            values.append(v)
        node.outputs = tuple(values)
        self.graph.nodes.append(node)
        return node

    # ---- element-wise ---------------------------------------------------------------------

    def ew(self, op: str, *args: Value | Scalar, dtype: str | None = None) -> Value:
        """An element-wise op; tensor operands must share a dtype (cast first), except where's
        condition and cast's operand. `dtype` is the output's (needed for cast and full results)."""
        if op not in EW_OPS:
            raise CompileError(f"unknown element-wise op {op!r}")
        arity = 1 if op in UNARY else 2 if op in BINARY else 3
        if len(args) != arity:
            raise CompileError(f"{op} takes {arity} operands, got {len(args)}")
        tensors = [a for a in args if isinstance(a, Value)]
        if not tensors:
            raise CompileError(f"{op} of scalars only; fold it")
        data = tensors if op not in TERNARY else [a for a in args[1:] if isinstance(a, Value)]
        compute = {t.dtype for t in data} if op != "cast" else set()
        if len(compute) > 1:
            raise CompileError(f"{op} mixes operand dtypes {sorted(compute)}; cast first")
        operand_dtype = compute.pop() if compute else (tensors[0].dtype if op != "where" else None)
        if op == "where" and (not isinstance(args[0], Value) or args[0].dtype != "bool"):
            raise CompileError("where needs a bool tensor condition")
        if op in COMPARISONS or op in LOGICAL:
            out_dtype = "bool"
        elif op == "cast":
            if dtype is None:
                raise CompileError("cast needs a result dtype")
            out_dtype = dtype
        else:
            out_dtype = dtype or operand_dtype
            if out_dtype is None:
                raise CompileError(f"{op}: give the result dtype (scalar data operands)")
        shape = broadcast_shapes(*[t.shape for t in tensors])
        args = tuple(_scalar(a, operand_dtype or out_dtype, op, self.int32_result) if not isinstance(a, Value) else a
                     for a in args)
        if _identity(op, args) and args[0].shape == shape and args[0].dtype == out_dtype:
            return args[0]  # x * 1, x / 1, x + 0, x - 0: decompositions leave them (addmm's alpha, beta)
        return self.node("ew", op, args, {}, [(shape, out_dtype)]).out

    def cast(self, x: Value, dtype: str) -> Value:
        return x if x.dtype == dtype else self.ew("cast", x, dtype=dtype)

    def full(self, shape: Sequence[int], value: Scalar, dtype: str) -> Value:
        return self.node("full", "full", (), {"value": _scalar(value, dtype)}, [(tuple(shape), dtype)]).out

    def iota(self, shape: Sequence[int], dim: int, dtype: str, start: Scalar = 0, step: Scalar = 1) -> Value:
        return self.node("iota", "iota", (), {"dim": norm_dim(dim, len(shape)), "start": start, "step": step},
                         [(tuple(shape), dtype)]).out

    # ---- reductions -----------------------------------------------------------------------

    def reduce(self, op: str, x: Value, dims: Sequence[int] | None, keepdim: bool = False) -> Value:
        if op not in REDUCE_OPS:
            raise CompileError(f"unknown reduction {op!r}")
        dims = tuple(sorted({norm_dim(d, x.rank) for d in (range(x.rank) if dims is None else dims)})) \
            if x.rank else ()
        shape = tuple(1 if d in dims else s for d, s in enumerate(x.shape)) if keepdim else \
            tuple(s for d, s in enumerate(x.shape) if d not in dims)
        if any(x.shape[d] == 0 for d in dims) and op not in ("sum", "prod"):
            raise CompileError(f"{op} over an empty dimension has no value")
        if any(x.shape[d] == 0 for d in dims):  # a sum (product) of nothing: its identity, whatever made x
            return self.full(shape, reduction_identity(op, x.dtype), x.dtype)
        return self.node("reduce", op, (x,), {"dims": dims, "keepdim": bool(keepdim)}, [(shape, x.dtype)]).out

    # ---- movement -------------------------------------------------------------------------

    def reshape(self, x: Value, shape: Sequence[int]) -> Value:
        shape = list(shape)
        if -1 in shape:
            known = prod(s for s in shape if s != -1)
            shape[shape.index(-1)] = x.numel // known if known else 0
        shape = tuple(int(s) for s in shape)
        if prod(shape) != x.numel:
            raise CompileError(f"cannot reshape {list(x.shape)} ({x.numel} elements) to {list(shape)}")
        if shape == x.shape:
            return x
        if x.producer is not None and x.producer.kind == "reshape":  # a reshape of a reshape is one
            return self.reshape(x.producer.args[0], shape)
        return self.node("reshape", "reshape", (x,), {"shape": shape}, [(shape, x.dtype)]).out

    def permute(self, x: Value, order: Sequence[int]) -> Value:
        order = tuple(norm_dim(d, x.rank) for d in order)
        if sorted(order) != list(range(x.rank)):
            raise CompileError(f"{list(order)} is not a permutation of {x.rank} dimensions")
        if order == tuple(range(x.rank)):
            return x
        if x.producer is not None and x.producer.kind == "permute":  # a permute of a permute is one
            inner = x.producer.attrs["order"]
            return self.permute(x.producer.args[0], tuple(inner[d] for d in order))
        return self.node("permute", "permute", (x,), {"order": order},
                         [(tuple(x.shape[d] for d in order), x.dtype)]).out

    def expand(self, x: Value, shape: Sequence[int]) -> Value:
        shape = tuple(int(s) for s in shape)
        lead = len(shape) - x.rank
        shape = tuple(x.shape[d - lead] if s == -1 else s for d, s in enumerate(shape))
        if lead < 0 or any(x.shape[d] not in (1, shape[d + lead]) for d in range(x.rank)):
            raise CompileError(f"cannot expand {list(x.shape)} to {list(shape)}")
        if shape == x.shape:
            return x
        return self.node("expand", "expand", (x,), {"shape": shape}, [(shape, x.dtype)]).out

    def slice(self, x: Value, dim: int, start: int | None, stop: int | None, step: int = 1) -> Value:
        dim = norm_dim(dim, x.rank)
        size = x.shape[dim]
        if step <= 0:
            raise CompileError(f"slice step {step}: only positive steps")
        start, stop, _ = slice(start, stop, step).indices(size)
        stop = max(stop, start)
        length = len(range(start, stop, step))
        if (start, length, step) == (0, size, 1) or (length == size and step == 1):
            return x
        shape = x.shape[:dim] + (length,) + x.shape[dim + 1:]
        return self.node("slice", "slice", (x,), {"dim": dim, "start": start, "stop": stop, "step": step},
                         [(shape, x.dtype)]).out

    def pad(self, x: Value, pads: Sequence[tuple[int, int]], value: Scalar = 0) -> Value:
        pads = tuple((int(a), int(b)) for a, b in pads)
        if len(pads) != x.rank:
            raise CompileError(f"pad needs (before, after) for each of {x.rank} dimensions")
        if all(p == (0, 0) for p in pads):
            return x
        shape = tuple(s + a + b for s, (a, b) in zip(x.shape, pads))
        if any(s < 0 for s in shape):
            raise CompileError(f"padding {pads} crops {list(x.shape)} below zero")
        return self.node("pad", "pad", (x,), {"pads": pads, "value": _scalar(value, x.dtype)},
                         [(shape, x.dtype)]).out

    def window(self, x: Value, shape: Sequence[int], a: Sequence[Sequence[int]], b: Sequence[int],
               fill: Scalar = 0) -> Value:
        """out[o] = x[A o + b] (A: rank(x) rows x len(shape) columns); out of range reads `fill`."""
        a = tuple(tuple(int(c) for c in row) for row in a)
        if len(a) != x.rank or any(len(row) != len(shape) for row in a) or len(b) != x.rank:
            raise CompileError(f"a window of {list(x.shape)} needs a {x.rank} x {len(shape)} matrix")
        return self.node("window", "window", (x,), {"a": a, "b": tuple(int(c) for c in b),
                                                   "fill": _scalar(fill, x.dtype)}, [(tuple(shape), x.dtype)]).out

    def cat(self, xs: Sequence[Value], dim: int) -> Value:
        xs = [x for x in xs if x.numel or len(xs) == 1]
        rank = xs[0].rank
        dim = norm_dim(dim, rank)
        if any(x.rank != rank or x.dtype != xs[0].dtype or
               any(x.shape[d] != xs[0].shape[d] for d in range(rank) if d != dim) for x in xs):
            raise CompileError(f"cat of {[f'{x.dtype}{list(x.shape)}' for x in xs]} along {dim}")
        if len(xs) == 1:
            return xs[0]
        shape = xs[0].shape[:dim] + (sum(x.shape[dim] for x in xs),) + xs[0].shape[dim + 1:]
        return self.node("cat", "cat", tuple(xs), {"dim": dim}, [(shape, xs[0].dtype)]).out

    def split(self, x: Value, sizes: Sequence[int], dim: int) -> tuple[Value, ...]:
        dim = norm_dim(dim, x.rank)
        sizes = tuple(int(s) for s in sizes)
        if sum(sizes) != x.shape[dim]:
            raise CompileError(f"split sizes {list(sizes)} do not add up to {x.shape[dim]}")
        if len(sizes) == 1:
            return (x,)
        outs = [(x.shape[:dim] + (s,) + x.shape[dim + 1:], x.dtype) for s in sizes]
        return self.node("split", "split", (x,), {"dim": dim, "sizes": sizes}, outs).outputs

    # ---- contractions ---------------------------------------------------------------------

    def matmul(self, a: Value, b: Value, dtype: str | None = None) -> Value:
        if a.rank < 2 or b.rank < 2:
            raise CompileError(f"matmul needs operands of rank >= 2, got {list(a.shape)} and {list(b.shape)}")
        if a.shape[-1] != b.shape[-2]:
            raise CompileError(f"matmul of {list(a.shape)} and {list(b.shape)}: inner sizes differ")
        for v in (a, b):
            if v.dtype not in FLOAT_DTYPES:
                raise CompileError(f"matmul of {v.dtype} operands: cast to a float first")
        batch = broadcast_shapes(a.shape[:-2], b.shape[:-2])
        out = dtype or ("float16" if a.dtype == b.dtype == "float16" else "float32")
        return self.node("matmul", "matmul", (a, b), {}, [(batch + (a.shape[-2], b.shape[-1]), out)]).out

    def conv(self, x: Value, w: Value, stride: Sequence[int], padding: Sequence[int], dilation: Sequence[int],
             groups: int, dtype: str | None = None, input_dilation: Sequence[int] = (1, 1),
             out_hw: Sequence[int] | None = None) -> Value:
        """A 2-D convolution (torch's conv2d). `input_dilation` spreads x's pixels that many apart
        with zeros between (a transposed convolution's input, XLA's lhs dilation), `padding`
        before them; `out_hw` gives the output's size where the padding after differs (the rows
        and columns the output reads past x are zeros too)."""
        if x.rank != CONV_RANK or w.rank != CONV_RANK:
            raise CompileError(f"conv takes (N, C, H, W) and (Co, C, kh, kw), got {list(x.shape)} and {list(w.shape)}")
        n, c, h, wd = x.shape
        co, ci, kh, kw = w.shape
        if c != ci * groups or co % groups:
            raise CompileError(f"conv of {c} channels by weights {list(w.shape)} in {groups} groups")
        sh, sw = ((h - 1) * input_dilation[0] + 1, (wd - 1) * input_dilation[1] + 1)  # x spread
        ho = (sh + 2 * padding[0] - dilation[0] * (kh - 1) - 1) // stride[0] + 1
        wo = (sw + 2 * padding[1] - dilation[1] * (kw - 1) - 1) // stride[1] + 1
        if out_hw is not None:
            ho, wo = out_hw
        if ho <= 0 or wo <= 0:
            raise CompileError(f"conv output would be {ho} x {wo}")
        attrs = {"stride": tuple(stride), "padding": tuple(padding), "dilation": tuple(dilation), "groups": groups,
                 "input_dilation": tuple(input_dilation)}
        out = dtype or ("float16" if x.dtype == w.dtype == "float16" else "float32")
        return self.node("conv", "conv", (x, w), attrs, [((n, co, ho, wo), out)]).out


IDENTITIES = {("mul", 1), ("div", 1), ("add", 0), ("sub", 0)}


def _identity(op: str, args: tuple) -> bool:
    """`op(tensor, scalar)` that returns the tensor itself. For floats, adding a zero keeps every
    value only when the zero is -0.0 (-0.0 + 0.0 is +0.0), and subtracting one only when it is
    +0.0 (-0.0 - (-0.0) is +0.0)."""
    if not (len(args) == 2 and isinstance(args[0], Value) and not isinstance(args[1], Value)
            and not isinstance(args[1], bool) and (op, args[1]) in IDENTITIES):
        return False
    if op in ("add", "sub") and args[0].dtype not in ("int32", "int64", "bool"):
        negative_zero = copysign(1.0, float(args[1])) < 0
        return negative_zero == (op == "add")
    return True


# int32 ops whose result mod 2^32 depends only on their operands mod 2^32: a scalar beyond int32
# wraps into it first when torch's result is int32 too, as torch's int32 arithmetic wraps it (an
# int32 tensor * 2654435761); an int64 tensor (held as int32 on the device) is refused instead
WRAPPING = ("add", "sub", "mul", "neg", "bitand", "bitor", "bitxor")


def _scalar(a: Any, dtype: str, op: str | None = None, wrap: bool = False) -> Scalar:
    """A Python scalar as the compute dtype wants it (int for int32, float for floats)."""
    if isinstance(a, Value):
        return a
    if dtype == "int32":
        if isinstance(a, float) and not a.is_integer():
            raise CompileError(f"the scalar {a} is not an integer but the operands are int32")
        a = int(a)
        if not INT32_MIN <= a <= INT32_MAX:
            if not (wrap and op in WRAPPING):
                raise CompileError(f"{op or 'an op'} of integer values and the scalar {a}, which int32 (the "
                                   f"device's integers, int64 tensors included) cannot hold ({INT32_MIN}..{INT32_MAX})")
            a = (a - INT32_MIN) % (INT32_MAX - INT32_MIN + 1) + INT32_MIN
        return a
    if dtype == "bool":
        return bool(a)
    return float(a)

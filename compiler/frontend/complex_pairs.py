"""Complex tensors computed as pairs of real numbers, so that functions using them compile.

The device holds real numbers only, but programs people write use complex arithmetic where it
is the shortest way to say a rotation: rotary position embeddings in Meta's LLaMA reference
code (`torch.polar`, `torch.view_as_complex`, a complex product, `torch.view_as_real`), though
every tensor the function takes and returns is real. When the tracer's first pass (through
autograd and the optimizer, so the backward's complex ops too) holds complex values, its second
pass runs that graph through `_PairInterpreter`, which holds each complex tensor z of shape S as
the real tensor of shape S + (2,) that `torch.view_as_real(z)` is (real part first, imaginary
part second in the last dimension) and runs each complex op as the real ops of its definition,
(a + bi)(c + di) = (ac - bd) + (ad + bc)i and so on. The second pass records those ops, with
its decompositions and functionalization, so the graph the compiler legalizes holds no complex
value, and each op keeps the user's source line. A complex tensor the function captures (a
precomputed `freqs_cis`) becomes the real constant `view_as_real` gives.

A registered complex tensor is held on the device as its pairs (`device_form`, runtime.resident)
and read so. What is refused, by name: complex inputs and outputs of the compiled function (the
host would convert them each call: pass and return `torch.view_as_real(z)` instead), and
complex ops outside `_RULES`, with the user's line.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch.utils import _pytree as pytree

from ..errors import CompileError, UnsupportedOpError


@dataclass(frozen=True)
class Pair:
    """A complex tensor held as `torch.view_as_real` holds it: its shape plus a last dimension
    of 2, the real part at index 0 and the imaginary part at index 1."""

    t: torch.Tensor

    @property
    def ndim(self) -> int:
        """Dimensions of the complex tensor (the pair's dimension left out)."""
        return self.t.dim() - 1

    @property
    def re(self) -> torch.Tensor:
        return self.t[..., 0]

    @property
    def im(self) -> torch.Tensor:
        return self.t[..., 1]

    def dim(self, d: int) -> int:
        """Complex dimension `d` (negative counts from the complex tensor's end) in `t`."""
        return d % self.ndim if self.ndim else 0


def _pair(re: Any, im: Any) -> Pair:
    """The pair of a real and an imaginary part (tensors or numbers, broadcast together)."""
    re, im = torch.as_tensor(re) if not isinstance(re, torch.Tensor) else re, \
        torch.as_tensor(im) if not isinstance(im, torch.Tensor) else im
    re, im = torch.broadcast_tensors(re, im)
    return Pair(torch.stack([re, im], -1))


def _parts(x: Any) -> tuple[Any, Any]:
    """(real part, imaginary part) of a pair, a Python complex number, a real tensor or number."""
    if isinstance(x, Pair):
        return x.re, x.im
    if isinstance(x, complex):
        return x.real, x.imag
    return x, 0.0


def _real(x: Any) -> bool:
    return not isinstance(x, (Pair, complex))


def _lanes(x: Any) -> Any:
    """A real tensor broadcast against a pair's `t` (a last dimension of 1); numbers as they are."""
    return x.unsqueeze(-1) if isinstance(x, torch.Tensor) else x


def _mul(a: Any, b: Any) -> Pair:
    if _real(b):  # a real factor scales both parts
        return Pair(a.t * _lanes(b)) if isinstance(a, Pair) else _mul(b, a)
    if _real(a):
        return Pair(_lanes(a) * b.t) if isinstance(b, Pair) else _pair(a * b.real, a * b.imag)
    (ar, ai), (br, bi) = _parts(a), _parts(b)
    return _pair(ar * br - ai * bi, ar * bi + ai * br)


def _add(a: Any, b: Any, alpha: Any = 1) -> Pair:
    (ar, ai), (br, bi) = _parts(a), _parts(b)
    return _pair(ar + alpha * br, ai + alpha * bi)


def _sub(a: Any, b: Any, alpha: Any = 1) -> Pair:
    return _add(a, b, -alpha)


def _div(a: Any, b: Any) -> Pair:
    if _real(b):
        return Pair(a.t / _lanes(b))
    (ar, ai), (br, bi) = _parts(a), _parts(b)
    scale = br * br + bi * bi
    return _pair((ar * br + ai * bi) / scale, (ai * br - ar * bi) / scale)


def _product(op: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> Callable[[Any, Any], Any]:
    """A matrix product `op` (torch.mm, torch.bmm) of complex operands (torch multiplies no real
    matrix by a complex one): four real products, (Ar + Ai i)(Br + Bi i) = (Ar Br - Ai Bi) +
    (Ar Bi + Ai Br) i."""
    def product(a: Pair, b: Pair) -> Pair:
        return _pair(op(a.re, b.re) - op(a.im, b.im), op(a.re, b.im) + op(a.im, b.re))
    return product


def _conj(z: Pair) -> Pair:
    return _pair(z.re, -z.im)


def _exp(z: Pair) -> Pair:
    size = torch.exp(z.re)
    return _pair(size * torch.cos(z.im), size * torch.sin(z.im))


def _sgn(z: Pair) -> Pair:
    """z / |z|, and 0 where z is 0 (torch.sgn; abs's gradient)."""
    size = torch.sqrt(z.re * z.re + z.im * z.im)
    return Pair(z.t * _lanes(torch.where(size > 0, 1 / size, 0.0)))


def _polar(size: torch.Tensor, angle: torch.Tensor) -> Pair:
    return _pair(size * torch.cos(angle), size * torch.sin(angle))


def _to_copy(x: Any, dtype: torch.dtype | None = None, **_: Any) -> Any:
    """A cast: complex to complex keeps both parts; complex to real keeps the real part, as
    torch does; real to complex gives a zero imaginary part."""
    if isinstance(x, Pair):
        if dtype is None or dtype.is_complex:
            return Pair(x.t.to(_part_dtype(dtype or _complex_of(x.t.dtype))))
        return x.re.to(dtype)
    real = x if dtype is None else x.to(_part_dtype(dtype))
    return _pair(real, torch.zeros_like(real))


def _part_dtype(dtype: torch.dtype) -> torch.dtype:
    """The real dtype of a complex dtype's parts."""
    return torch.empty(0, dtype=dtype).real.dtype if dtype.is_complex else dtype


def _complex_of(dtype: torch.dtype) -> torch.dtype:
    return torch.complex128 if dtype == torch.float64 else torch.complex64


def _dims(z: Pair, dims: Any) -> list[int]:
    """A reduction's complex dimensions in `t` (none given: all of them)."""
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return list(range(z.ndim))
    return [z.dim(d) for d in (dims if isinstance(dims, (list, tuple)) else [dims])]


def _squeeze(z: Pair, dims: Any = None) -> Pair:
    if dims is None:
        dims = [d for d in range(z.ndim) if z.t.shape[d] == 1]
    return Pair(z.t.squeeze(tuple(_dims(z, dims)))) if dims != [] else z


def _reshape(z: Pair, shape: Any) -> Pair:
    return Pair(z.t.reshape(*shape, 2))


def _every_pair(tensors: list[Any]) -> list[torch.Tensor]:
    """The pairs of a list of complex and real tensors (the real ones with a zero imaginary part)."""
    return [x.t if isinstance(x, Pair) else _to_copy(x).t for x in tensors]


def _cat(tensors: list[Any], dim: int = 0) -> Pair:
    pairs = _every_pair(tensors)
    return Pair(torch.cat(pairs, dim % (pairs[0].dim() - 1)))


def _stack(tensors: list[Any], dim: int = 0) -> Pair:
    pairs = _every_pair(tensors)
    return Pair(torch.stack(pairs, dim % pairs[0].dim()))


def _where(cond: torch.Tensor, a: Any, b: Any) -> Pair:
    (ar, ai), (br, bi) = _parts(a), _parts(b)
    return _pair(torch.where(cond, ar, br), torch.where(cond, ai, bi))


def _slice(z: Pair, dim: int = 0, start: Any = None, end: Any = None, step: int = 1) -> Pair:
    return Pair(torch.ops.aten.slice.Tensor(z.t, z.dim(dim), start, end, step))


def _split(z: Pair, sizes: Any, dim: int = 0) -> list[Pair]:
    return [Pair(p) for p in torch.split(z.t, sizes, z.dim(dim))]


def _in_place(rule: Callable[..., Any]) -> Callable[..., Pair]:
    """The in-place form of an op (`mul_`, a write into a registered complex tensor): its result
    copied into the first operand's pairs."""
    def written(z: Pair, *args: Any, **kwargs: Any) -> Pair:
        return _copy_into(z, rule(z, *args, **kwargs))
    return written


def _copy_into(z: Pair, value: Any, non_blocking: bool = False) -> Pair:
    z.t.copy_(value.t if isinstance(value, Pair) else _to_copy(value).t)
    return z


# op key (tracing._op_key) -> the op on pairs; a rule takes the op's arguments with pairs where
# the op had complex tensors and returns pairs where it returns complex tensors
_VIEW = {
    "view_as_complex": lambda x: Pair(x), "view_as_real": lambda z: z.t,
    "view": _reshape, "_unsafe_view": _reshape, "reshape": _reshape,
    "expand": lambda z, size, implicit=False: Pair(z.t.expand(*size, 2)),
    "permute": lambda z, dims: Pair(z.t.permute(*[z.dim(d) for d in dims], z.ndim)),
    "transpose": lambda z, d0, d1: Pair(z.t.transpose(z.dim(d0), z.dim(d1))),
    "t": lambda z: Pair(z.t.transpose(0, 1)) if z.ndim == 2 else z,
    "unsqueeze": lambda z, d: Pair(z.t.unsqueeze(d % (z.ndim + 1))),
    "squeeze": _squeeze, "slice": _slice,
    "select": lambda z, dim, index: Pair(torch.select(z.t, z.dim(dim), index)),
    "split": _split, "split_with_sizes": _split,
    "unbind": lambda z, dim=0: [Pair(p) for p in torch.unbind(z.t, z.dim(dim))],
    "alias": lambda z: z, "detach": lambda z: z, "lift_fresh": lambda z: z,
    "real": lambda z: z.re, "imag": lambda z: z.im, "conj": _conj, "_conj": _conj,
}
_RULES: dict[str, Callable[..., Any]] = {
    **_VIEW, **{f"{k}_copy": v for k, v in _VIEW.items()},
    "clone": lambda z, **_: Pair(z.t.clone()), "lift_fresh_copy": lambda z: Pair(z.t.clone()),
    "_to_copy": _to_copy, "copy_": _copy_into, "cat": _cat, "stack": _stack, "where": _where,
    "index": lambda z, indices: Pair(torch.ops.aten.index.Tensor(z.t, indices)),
    "sum": lambda z, dims=None, keepdim=False, dtype=None: Pair(z.t.sum(_dims(z, dims), keepdim)),
    "prims.sum": lambda z, dims, output_dtype=None: Pair(z.t.sum(_dims(z, dims))),
    "mean": lambda z, dims=None, keepdim=False, dtype=None: Pair(z.t.mean(_dims(z, dims), keepdim)),
    "mul": _mul, "add": _add, "sub": _sub, "div": _div, "neg": lambda z: Pair(-z.t),
    "reciprocal": lambda z: _div(1.0, z), "mm": _product(torch.mm), "bmm": _product(torch.bmm),
    "conj_physical": _conj, "resolve_conj": lambda z: z, "resolve_neg": lambda z: z,
    "abs": lambda z: torch.sqrt(z.re * z.re + z.im * z.im), "angle": lambda z: torch.atan2(z.im, z.re),
    "exp": _exp, "sgn": _sgn, "polar": _polar, "complex": lambda re, im: _pair(re, im),
}


def device_form(tensor: torch.Tensor) -> torch.Tensor:
    """A host tensor as the device holds it: a complex one as the pairs of reals
    `torch.view_as_real` gives (a view: what the device writes back lands in the complex tensor),
    any other as it is. A registered complex tensor is held so (runtime.resident), and the
    program reads it so (`_PairInterpreter.placeholder`)."""
    return torch.view_as_real(tensor) if tensor.is_complex() else tensor


def is_complex(val: Any) -> bool:
    """Whether a node's value (a tensor, or a list of them) is or holds a complex tensor."""
    return any(isinstance(v, torch.Tensor) and v.is_complex() for v in pytree.tree_leaves(val))


def interpreter(gm: torch.fx.GraphModule, out_names: list[str], op_key: Callable[[Any], str],
                where: Callable[[torch.fx.Node], str]) -> torch.fx.Interpreter:
    """What runs traced graph `gm` for the tracer's second pass: one that holds complex values as
    pairs of reals when the graph computes any (see the module docstring), else fx's own. Its
    inputs are given in `device_form`; `op_key` names an op as the legalizer's rules do and
    `where` gives a node's user source line. CompileError for a complex output (`out_names`)."""
    if not any(is_complex(n.meta.get("val")) for n in gm.graph.nodes):
        return torch.fx.Interpreter(gm)
    results = next(n for n in gm.graph.nodes if n.op == "output").args[0]
    for name, node in zip(out_names, results if isinstance(results, (list, tuple)) else [results]):
        if isinstance(node, torch.fx.Node) and is_complex(node.meta.get("val")):
            raise CompileError(f"output {name!r} is a complex tensor; the device holds real numbers: return "
                               "torch.view_as_real of it (and take torch.view_as_complex of that on the host)")
    return _PairInterpreter(gm, op_key, where)


class _PairInterpreter(torch.fx.Interpreter):
    """Runs a traced graph with complex values held as `Pair`s (see the module docstring)."""

    def __init__(self, gm: torch.fx.GraphModule, op_key: Callable[[Any], str],
                 where: Callable[[torch.fx.Node], str]) -> None:
        super().__init__(gm)
        self.op_key, self.where = op_key, where
        self.refused: str | None = None  # the message of the op refused, as it was raised
        # captured complex tensors as view_as_real holds them: made here, before tracing, so that
        # they are constants of the new graph (made while tracing, they would be fake tensors)
        self.constants = {n.target: torch.view_as_real(getattr(gm, n.target).detach()).clone()
                          for n in gm.graph.nodes if n.op == "get_attr" and is_complex(getattr(gm, n.target))}

    def placeholder(self, target: Any, args: tuple, kwargs: dict) -> Any:
        value = super().placeholder(target, args, kwargs)  # (a registered complex tensor in device_form)
        return Pair(value) if isinstance(value, torch.Tensor) and is_complex(self.node_val(target)) else value

    def node_val(self, target: Any) -> Any:
        """The traced value of the placeholder `target`."""
        return next(n.meta.get("val") for n in self.graph.nodes if n.op == "placeholder" and n.target == target)

    def get_attr(self, target: Any, args: tuple, kwargs: dict) -> Any:
        value = super().get_attr(target, args, kwargs)
        if isinstance(value, torch.Tensor) and value.is_complex():
            return Pair(self.constants[target])
        return value

    def run(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().run(*args, **kwargs)
        except CompileError as e:
            if self.refused is not None:  # as raised: fx's interpreter appends its own listing of the node
                e.args = (self.refused,)
            raise

    def run_node(self, n: torch.fx.Node) -> Any:
        if n.op != "call_function" or n.target is operator.getitem or not (
                is_complex(n.meta.get("val")) or any(is_complex(a.meta.get("val")) for a in n.all_input_nodes)):
            return super().run_node(n)
        with self._set_current_node(n):
            args, kwargs = self.fetch_args_kwargs_from_env(n)
            key = self.op_key(n.target)
            rule = _RULES.get(key) or (_in_place(_RULES[key[:-1]]) if key.endswith("_") and key[:-1] in _RULES
                                       else None)
            shapes = [list(a.meta["val"].shape) for a in n.all_input_nodes if isinstance(a.meta.get("val"), torch.Tensor)]
            if rule is None:
                refused = UnsupportedOpError(str(n.target), shapes, self.where(n),
                                             "complex tensors are computed as pairs of reals by the ops "
                                             f"{', '.join(sorted(k for k in _RULES if not k.endswith('_copy')))}; "
                                             "this one is not among them")
                self.refused = str(refused)
                raise refused
            kwargs = {k: v for k, v in kwargs.items() if k not in ("layout", "device", "pin_memory", "memory_format",
                                                                  "non_blocking")}
            result = rule(*args, **kwargs)
            _check(n, result)
            return result


def _check(n: torch.fx.Node, result: Any) -> None:
    """A rule's result has the shape of the op's value (complex ones as pairs): a wrong rule is
    found here, at its op, not as wrong numbers later."""
    for want, got in zip(pytree.tree_leaves(n.meta.get("val")), pytree.tree_leaves(
            result, is_leaf=lambda x: isinstance(x, Pair))):
        if not isinstance(want, torch.Tensor):
            continue
        shape = tuple(got.t.shape[:-1]) if isinstance(got, Pair) else tuple(getattr(got, "shape", ()))
        if shape != tuple(want.shape) or isinstance(got, Pair) != want.is_complex():
            raise CompileError(f"internal: the complex rule for {n.target} gave {shape} "
                               f"{'complex' if isinstance(got, Pair) else 'real'}, torch {tuple(want.shape)} {want.dtype}")

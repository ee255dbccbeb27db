"""Complex tensors computed as pairs of real numbers, so that functions using them compile.

The device holds real numbers only, but programs people write use complex arithmetic where it
is the shortest way to say a rotation: rotary position embeddings in Meta's LLaMA reference
code (`torch.polar`, `torch.view_as_complex`, a complex product, `torch.view_as_real`), though
every tensor the function takes and returns is real. When the tracer's first pass (through
autograd and the optimizer, so the backward's complex ops too) holds complex values, its second
pass runs that graph through `_PairInterpreter`, which holds each complex tensor as a `Pair` of
real tensors of its shape, its real and imaginary parts, and runs each complex op as the real
ops of its definition, (a + bi)(c + di) = (ac - bd) + (ad + bc)i and so on (views, copies and
sums over dimensions as the same op on each part, `PER_PART`). The second pass records those
ops, with its decompositions and functionalization, so the graph the compiler legalizes holds no
complex value, and each op keeps the user's source line. A complex tensor the function captures
(a precomputed `freqs_cis`) becomes two real constants, its parts.

A registered complex tensor is held on the device as the real tensor `torch.view_as_real` gives
(`device_form`, runtime.resident: a view, so what the program writes back lands in the complex
tensor), whose last dimension holds the parts, and so is a complex64 input of the compiled
function (mlsdk.function passes it so). What is refused, by name: complex outputs (return
`torch.view_as_real(z)` instead: a proxy of a complex tensor is not modelled) and complex ops
without a rule, with the user's line.
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
    """A complex tensor as its real and imaginary parts, two real tensors of its shape. Parts
    rather than the one tensor `view_as_real` gives (parts in its last dimension): a view, a
    reduction or a product of parts is the same op on each, and a constant's parts are two
    contiguous constants, which the compiler lays out as any other tensor (Meta's rotary
    embedding on mncore2, 2 x 128 x 8 x 64: 731,256 cycles with the pairs in one tensor, each
    product reading its constant's parts at a stride of 2; the parts as the real formula with
    cos and sin gives them, 516,040)."""

    re: torch.Tensor
    im: torch.Tensor

    @staticmethod
    def of(t: torch.Tensor) -> "Pair":
        """The parts of a `view_as_real` form (last dimension 2)."""
        return Pair(t[..., 0], t[..., 1])

    @property
    def t(self) -> torch.Tensor:
        """The `view_as_real` form."""
        return torch.stack([self.re, self.im], -1)


def _pair(re: Any, im: Any) -> Pair:
    """The pair of a real and an imaginary part (tensors or numbers, broadcast together)."""
    re, im = torch.broadcast_tensors(torch.as_tensor(re) if not isinstance(re, torch.Tensor) else re,
                                     torch.as_tensor(im) if not isinstance(im, torch.Tensor) else im)
    return Pair(re, im)


def _parts(x: Any) -> tuple[Any, Any]:
    """(real part, imaginary part) of a pair, a Python complex number, a real tensor or number."""
    if isinstance(x, Pair):
        return x.re, x.im
    if isinstance(x, complex):
        return x.real, x.imag
    return x, 0.0


def _real(x: Any) -> bool:
    return not isinstance(x, (Pair, complex))


def _mul(a: Any, b: Any) -> Pair:
    if _real(b):  # a real factor scales both parts
        return Pair(a.re * b, a.im * b) if isinstance(a, Pair) else _mul(b, a)
    if _real(a):
        return Pair(a * b.re, a * b.im) if isinstance(b, Pair) else _pair(a * b.real, a * b.imag)
    (ar, ai), (br, bi) = _parts(a), _parts(b)
    return _pair(ar * br - ai * bi, ar * bi + ai * br)


def _add(a: Any, b: Any, alpha: Any = 1) -> Pair:
    (ar, ai), (br, bi) = _parts(a), _parts(b)
    return _pair(ar + alpha * br, ai + alpha * bi)


def _sub(a: Any, b: Any, alpha: Any = 1) -> Pair:
    return _add(a, b, -alpha)


def _div(a: Any, b: Any) -> Pair:
    if _real(b):
        return Pair(a.re / b, a.im / b)
    (ar, ai), (br, bi) = _parts(a), _parts(b)
    scale = br * br + bi * bi
    return _pair((ar * br + ai * bi) / scale, (ai * br - ar * bi) / scale)


def _product(op: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> Callable[[Any, Any], Any]:
    """A matrix product `op` (torch.mm, torch.bmm) of complex operands (torch multiplies no real
    matrix by a complex one): four real products, (Ar + Ai i)(Br + Bi i) = (Ar Br - Ai Bi) +
    (Ar Bi + Ai Br) i."""
    def product(a: Pair, b: Pair) -> Pair:
        return Pair(op(a.re, b.re) - op(a.im, b.im), op(a.re, b.im) + op(a.im, b.re))
    return product


def _conj(z: Pair) -> Pair:
    return Pair(z.re, -z.im)


def _size(z: Pair) -> torch.Tensor:
    return torch.sqrt(z.re * z.re + z.im * z.im)


def _exp(z: Pair) -> Pair:
    size = torch.exp(z.re)
    return Pair(size * torch.cos(z.im), size * torch.sin(z.im))


def _sgn(z: Pair) -> Pair:
    """z / |z|, and 0 where z is 0 (torch.sgn; abs's gradient)."""
    size = _size(z)
    scale = torch.where(size > 0, 1 / size, 0.0)
    return Pair(z.re * scale, z.im * scale)


def _polar(size: torch.Tensor, angle: torch.Tensor) -> Pair:
    return _pair(size * torch.cos(angle), size * torch.sin(angle))


def _to_copy(x: Any, dtype: torch.dtype | None = None, **_: Any) -> Any:
    """A cast: complex to complex keeps both parts; complex to real keeps the real part, as
    torch does; real to complex gives a zero imaginary part."""
    if isinstance(x, Pair):
        if dtype is None or dtype.is_complex:
            part = _part_dtype(dtype) if dtype is not None else x.re.dtype
            return Pair(x.re.to(part), x.im.to(part))
        return x.re.to(dtype)
    real = x if dtype is None else x.to(_part_dtype(dtype))
    return Pair(real, torch.zeros_like(real))


def _part_dtype(dtype: torch.dtype) -> torch.dtype:
    """The real dtype of a complex dtype's parts (from the dtype alone: a tensor made here, while
    tracing, would be recorded as one more op of the program)."""
    return dtype.to_real()


def _as_pairs(tensors: list[Any]) -> list[Pair]:
    """A list of complex and real tensors as pairs (the real ones with a zero imaginary part)."""
    return [x if isinstance(x, Pair) else _to_copy(x) for x in tensors]


def _joined(op: Callable[..., torch.Tensor]) -> Callable[..., Pair]:
    """cat or stack of complex (and real) tensors: the parts joined alike."""
    def joined(tensors: list[Any], *args: Any, **kwargs: Any) -> Pair:
        pairs = _as_pairs(tensors)
        return Pair(op([p.re for p in pairs], *args, **kwargs), op([p.im for p in pairs], *args, **kwargs))
    return joined


def _where(cond: torch.Tensor, a: Any, b: Any) -> Pair:
    (ar, ai), (br, bi) = _parts(a), _parts(b)
    return _pair(torch.where(cond, ar, br), torch.where(cond, ai, bi))


def _copy_into(z: Pair, value: Any, non_blocking: bool = False) -> Pair:
    value = value if isinstance(value, Pair) else _to_copy(value)
    z.re.copy_(value.re)
    z.im.copy_(value.im)
    return z


def _in_place(rule: Callable[..., Any]) -> Callable[..., Pair]:
    """The in-place form of an op (`mul_`, a write into a registered complex tensor): its result
    copied into the first operand's parts."""
    def written(z: Pair, *args: Any, **kwargs: Any) -> Pair:
        return _copy_into(z, rule(z, *args, **kwargs))
    return written


# Ops that act on a complex tensor as on each of its parts: views, copies and sums over
# dimensions. Their rule is the op itself on the real part and on the imaginary part
# (`_PairInterpreter.run_node`), the op's own arguments unchanged.
PER_PART = frozenset({
    "view", "_unsafe_view", "reshape", "expand", "permute", "transpose", "t", "unsqueeze", "squeeze", "slice",
    "select", "split", "split_with_sizes", "unbind", "index", "alias", "detach", "lift_fresh", "clone",
    "lift_fresh_copy", "sum", "prims.sum", "mean", "neg", "flip", "roll", "repeat", "narrow",
    *(f"{k}_copy" for k in ("view", "_unsafe_view", "reshape", "expand", "permute", "transpose", "t", "unsqueeze",
                            "squeeze", "slice", "select", "split", "split_with_sizes", "unbind", "alias",
                            "detach")),
})
# op key (tracing._op_key) -> the op on pairs, for the rest: a rule takes the op's arguments with
# pairs where the op had complex tensors and returns pairs where it returns complex tensors
_VIEW = {
    "view_as_complex": Pair.of, "view_as_real": lambda z: z.t,
    "real": lambda z: z.re, "imag": lambda z: z.im, "conj": _conj, "_conj": _conj,
}
_RULES: dict[str, Callable[..., Any]] = {
    **_VIEW, **{f"{k}_copy": v for k, v in _VIEW.items()},
    "_to_copy": _to_copy, "copy_": _copy_into, "cat": _joined(torch.cat), "stack": _joined(torch.stack),
    "where": _where, "mul": _mul, "add": _add, "sub": _sub, "div": _div,
    "reciprocal": lambda z: _div(1.0, z), "mm": _product(torch.mm), "bmm": _product(torch.bmm),
    "conj_physical": _conj, "resolve_conj": lambda z: z, "resolve_neg": lambda z: z,
    "abs": _size, "angle": lambda z: torch.atan2(z.im, z.re),
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
        self.complex_inputs = {n.target for n in gm.graph.nodes  # (given in device_form: read as pairs)
                               if n.op == "placeholder" and is_complex(n.meta.get("val"))}
        # captured complex tensors as their parts: made here, before tracing, so that they are
        # constants of the new graph (made while tracing, they would be fake tensors)
        self.constants = {n.target: Pair(getattr(gm, n.target).detach().real.clone(),
                                         getattr(gm, n.target).detach().imag.clone())
                          for n in gm.graph.nodes if n.op == "get_attr" and is_complex(getattr(gm, n.target))}

    def placeholder(self, target: Any, args: tuple, kwargs: dict) -> Any:
        value = super().placeholder(target, args, kwargs)
        return Pair.of(value) if target in self.complex_inputs else value

    def get_attr(self, target: Any, args: tuple, kwargs: dict) -> Any:
        value = super().get_attr(target, args, kwargs)
        if isinstance(value, torch.Tensor) and value.is_complex():
            return self.constants[target]
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
            rule = _per_part(n.target) if key in PER_PART else _RULES.get(key) or (
                _in_place(_RULES[key[:-1]]) if key.endswith("_") and key[:-1] in _RULES else None)
            if rule is None:
                shapes = [list(a.meta["val"].shape) for a in n.all_input_nodes
                          if isinstance(a.meta.get("val"), torch.Tensor)]
                ruled = sorted(k for k in {*_RULES, *PER_PART} if not k.endswith("_copy"))
                refused = UnsupportedOpError(str(n.target), shapes, self.where(n),
                                             f"complex tensors are computed as pairs of reals by the ops "
                                             f"{', '.join(ruled)}; this one is not among them")
                self.refused = str(refused)
                raise refused
            kwargs = {k: v for k, v in kwargs.items() if k not in ("layout", "device", "pin_memory", "memory_format",
                                                                  "non_blocking")}
            result = rule(*args, **kwargs)
            _check(n, result)
            return result


def _per_part(op: Callable[..., Any]) -> Callable[..., Any]:
    """`op` (in PER_PART) on each part of its complex operand: a pair, or a list of pairs for
    an op that returns a list (split, unbind)."""
    def on_parts(z: Pair, *args: Any, **kwargs: Any) -> Any:
        if isinstance(kwargs.get("dtype"), torch.dtype):  # a sum's result dtype: its parts' then
            kwargs["dtype"] = _part_dtype(kwargs["dtype"])
        re, im = op(z.re, *args, **kwargs), op(z.im, *args, **kwargs)
        return [Pair(r, i) for r, i in zip(re, im)] if isinstance(re, (list, tuple)) else Pair(re, im)
    return on_parts


def _check(n: torch.fx.Node, result: Any) -> None:
    """A rule's result has the shape of the op's value (complex ones as pairs): a wrong rule is
    found here, at its op, not as wrong numbers later."""
    for want, got in zip(pytree.tree_leaves(n.meta.get("val")), pytree.tree_leaves(
            result, is_leaf=lambda x: isinstance(x, Pair))):
        if not isinstance(want, torch.Tensor):
            continue
        shape = tuple(got.re.shape) if isinstance(got, Pair) else tuple(getattr(got, "shape", ()))
        if shape != tuple(want.shape) or isinstance(got, Pair) != want.is_complex():
            kind = "complex" if isinstance(got, Pair) else "real"
            raise CompileError(f"internal: the complex rule for {n.target} gave {shape} {kind}, "
                               f"torch {tuple(want.shape)} {want.dtype}")

"""Tracing `fn(dict[str, Tensor]) -> dict[str, Tensor]` into a `Graph` of ATen ops.

make_fx with fake tensors runs the function once without computing anything: static shapes,
core ATen ops, and (unlike torch.export) the autograd engine can run inside, so a training step
(forward, backward, optimiser update) traces the same way later. Tensors the function captures
(model parameters) become named constants. Composite ops are decomposed into the small set the
backend lowers (softmax into amax/sub/exp/sum/div, layer_norm into sums and rsqrt, ...).
"""

from __future__ import annotations

import contextlib
import math
import os
import re
from typing import Any, Callable, Iterator

import torch
from torch._decomp import core_aten_decompositions, get_decompositions
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils import _pytree as pytree

from ..errors import CompileError
from .graph import DTYPES, Graph, Node, Value

aten = torch.ops.aten
_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<fn>\S+)\n\s*(?P<code>[^\n]*)')
_INTERNAL = tuple(os.path.dirname(m.__file__) for m in (torch,)) + (os.path.dirname(os.path.dirname(__file__)),)


def _mean_dim(x, dims, keepdim=False, dtype=None):
    dims = [d % x.dim() for d in (dims if dims else range(x.dim()))]
    n = math.prod(x.shape[d] for d in dims)
    return torch.sum(x, dims, keepdim=keepdim) * (1.0 / n)


def _mean(x, dtype=None):
    return _mean_dim(x, list(range(x.dim())))


def _layer_norm(x, normalized_shape, weight, bias, eps):
    dims = list(range(x.dim() - len(normalized_shape), x.dim()))
    mean = _mean_dim(x, dims, keepdim=True)
    centred = x - mean
    rstd = torch.rsqrt(_mean_dim(centred * centred, dims, keepdim=True) + eps)
    y = centred * rstd
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y, mean, rstd


def _var_mean(x, dims=None, correction=None, keepdim=False):
    dims = [d % x.dim() for d in (dims if dims else range(x.dim()))]
    n = math.prod(x.shape[d] for d in dims)
    mean = _mean_dim(x, dims, keepdim=True)
    centred = x - mean
    var = torch.sum(centred * centred, dims, keepdim=keepdim) * (1.0 / (n - (1 if correction is None else correction)))
    return var, (mean if keepdim else torch.sum(x, dims) * (1.0 / n))


def _silu(x):
    return x * torch.sigmoid(x)


def _hardtanh(x, lo=-1.0, hi=1.0):
    return torch.clamp(x, lo, hi)


def decompositions() -> dict:
    """Core ATen decompositions plus the composites the backend wants spelled out."""
    table = dict(core_aten_decompositions())
    table.update(get_decompositions([aten._softmax, aten._log_softmax, aten.gelu, aten.addmm, aten.t, aten.linear]))
    table.update({aten.native_layer_norm.default: _layer_norm, aten.mean.dim: _mean_dim, aten.mean.default: _mean,
                  aten.var_mean.correction: _var_mean, aten.silu.default: _silu, aten.hardtanh.default: _hardtanh})
    return table


@contextlib.contextmanager
def _all_stack_frames() -> Iterator[None]:
    """make_fx keeps only frames of `forward` methods in node stack traces; keep them all while
    we trace (we pick the user's frame ourselves), so plain functions get source lines too."""
    tracer = torch.fx.proxy.TracerBase
    original = tracer.__dict__.get("_filter_traceback_frames")
    if original is None:  # a torch without the hook: source lines may be missing, tracing still works
        yield
        return
    tracer._filter_traceback_frames = lambda self, summary: summary
    try:
        yield
    finally:
        tracer._filter_traceback_frames = original


def user_line(stack_trace: str | None) -> str:
    """The innermost frame of the user's code in a stack trace: 'file.py:12: y = x @ w'."""
    if not stack_trace:
        return ""
    frames = [m for m in _FRAME.finditer(stack_trace) if not m.group("file").startswith(_INTERNAL)]
    if not frames:
        return ""
    m = frames[-1]
    return f"{m.group('file')}:{m.group('line')}: {m.group('code').strip()}"


def key_name(path: tuple) -> str:
    """Pytree key path -> 'shared', 'aux.m', 'items.0'."""
    parts = []
    for k in path:
        for attr in ("key", "idx", "name"):
            if hasattr(k, attr):
                parts.append(str(getattr(k, attr)))
                break
        else:
            parts.append(str(k))
    return ".".join(parts) or "out"


def trace(fn: Callable[[Any], Any], inputs: Any) -> Graph:
    """Trace `fn(inputs)` with fake tensors into a Graph whose inputs and outputs keep their names."""
    leaves, in_spec = pytree.tree_flatten_with_path(inputs)
    names = [key_name(path) for path, _ in leaves]
    tensors = [leaf for _, leaf in leaves]
    for name, t in zip(names, tensors):
        if not isinstance(t, torch.Tensor):
            raise CompileError(f"input {name!r} is a {type(t).__name__}; compiled functions take tensors")
        if t.dtype not in DTYPES:
            raise CompileError(f"input {name!r} has dtype {t.dtype}; supported: {', '.join(map(str, DTYPES))}")
    spec = pytree.tree_structure(inputs)
    out_info: dict[str, Any] = {}

    def flat_fn(*args: torch.Tensor) -> list[torch.Tensor]:
        result = fn(pytree.tree_unflatten(list(args), spec))
        out_leaves, out_spec = pytree.tree_flatten_with_path(result)
        out_info["names"] = [key_name(p) for p, _ in out_leaves]
        out_info["spec"] = pytree.tree_structure(result)
        bad = [key_name(p) for p, leaf in out_leaves if not isinstance(leaf, torch.Tensor)]
        if bad:
            raise CompileError(f"the function returns non-tensor values at {', '.join(bad)}")
        return [leaf for _, leaf in out_leaves]

    try:
        with _all_stack_frames():
            gm = make_fx(flat_fn, decomposition_table=decompositions(), tracing_mode="fake",
                         _allow_non_fake_inputs=True, record_stack_traces=True)(*tensors)
    except CompileError:
        raise
    except Exception as e:  # data-dependent control flow, unsupported Python, ...
        raise CompileError(f"tracing {getattr(fn, '__name__', fn)} failed: {type(e).__name__}: {e}") from e
    graph = _to_graph(gm, names, out_info["names"], out_info["spec"], in_spec)
    graph.module = gm  # the traced function itself, runnable with real tensors (reference runs)
    return graph


def _to_graph(gm: torch.fx.GraphModule, in_names: list[str], out_names: list[str], out_spec: Any, in_spec: Any) -> Graph:
    values: dict[torch.fx.Node, Value] = {}
    inputs: dict[str, Value] = {}
    constants: list[Value] = []
    nodes: list[Node] = []
    placeholders = iter(in_names)
    taken: set[str] = set(in_names) | set(out_names)

    def fresh(base: str) -> str:
        name, k = base, 1
        while name in taken:
            name, k = f"{base}_{k}", k + 1
        taken.add(name)
        return name

    def convert(a: Any) -> Any:
        if isinstance(a, torch.fx.Node):
            return values[a]
        if isinstance(a, (list, tuple)):
            return type(a)(convert(x) for x in a)
        return a

    for fx_node in gm.graph.nodes:
        val = fx_node.meta.get("val")
        if fx_node.op == "placeholder":
            name = next(placeholders)
            v = Value(name, tuple(val.shape), DTYPES[val.dtype], "input")
            values[fx_node] = inputs[name] = v
        elif fx_node.op == "get_attr":
            data = getattr(gm, fx_node.target)
            v = Value(fresh(fx_node.target.lstrip("_")), tuple(data.shape), DTYPES.get(data.dtype, str(data.dtype)),
                      "const", data=data.detach(), origin=data)
            values[fx_node] = v
            constants.append(v)
        elif fx_node.op == "call_function":
            op = _op_name(fx_node.target)
            source = user_line(fx_node.meta.get("stack_trace"))
            if not isinstance(val, torch.Tensor):
                shapes = [list(getattr(x, "shape", [])) for x in (val if isinstance(val, (list, tuple)) else [val])]
                from ..errors import UnsupportedOpError
                raise UnsupportedOpError(op, shapes, source, "it does not return one tensor")
            out = Value(fresh(fx_node.name), tuple(val.shape), DTYPES.get(val.dtype, str(val.dtype)), "node")
            node = Node(op, convert(fx_node.args), convert(dict(fx_node.kwargs)), out, source)
            out.producer = node
            values[fx_node] = out
            nodes.append(node)
        elif fx_node.op == "output":
            results = convert(fx_node.args[0])
            outputs = dict(zip(out_names, results))
            return Graph(inputs, outputs, nodes, constants, out_spec, in_spec)
    raise CompileError("the traced graph has no output")


def _op_name(target: Any) -> str:
    name = str(target)
    for prefix in ("aten.", "prims."):
        if name.startswith(prefix):
            return name[len(prefix):]
    return getattr(target, "__name__", name)

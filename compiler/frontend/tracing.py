"""Tracing `fn(dict[str, Tensor]) -> dict[str, Tensor]` into a primitive graph (compiler.ir).

make_fx runs the function once on fake tensors (static shapes, nothing computed), functionalized
(in-place ops become pure ones, views become copies), with torch's decomposition tables
(frontend.decompositions); the resulting ATen graph is legalized node by node into primitives
(frontend.legalize). Tensors the function captures (model parameters) become named constants.
Every primitive keeps the user's source line of the ATen op it came from, so errors and reports
point at the user's code.
"""

from __future__ import annotations

import contextlib
import operator
import os
import re
import traceback
from typing import Any, Callable, Iterator

import torch
from torch.fx.experimental.proxy_tensor import make_fx
from torch.func import functionalize
from torch.utils import _pytree as pytree

from ..dtypes import INT32_MAX, INT32_MIN
from ..errors import CompileError, UnsupportedOpError
from ..ir import Graph, Value
from . import legalize
from .build import Builder
from .decompositions import table

_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<fn>\S+)\n\s*(?P<code>[^\n]*)')
_INTERNAL = (os.path.dirname(torch.__file__), os.path.dirname(os.path.dirname(__file__)))
INPUT_DTYPES = (torch.float32, torch.float16, torch.int64, torch.int32, torch.bool)


@contextlib.contextmanager
def _all_stack_frames() -> Iterator[None]:
    """make_fx keeps only frames of `forward` methods in node stack traces; keep every frame
    outside torch and the compiler while we trace (we pick the user's innermost one), so plain
    functions get source lines too, and torch formats no frames of its own."""
    tracer = torch.fx.proxy.TracerBase
    original = tracer.__dict__.get("_filter_traceback_frames")
    if original is None:  # a torch without the hook: source lines may be missing, tracing still works
        yield
        return
    tracer._filter_traceback_frames = lambda self, summary: traceback.StackSummary.from_list(
        [f for f in summary if not f.filename.startswith(_INTERNAL) and (f.filename[:1] != "<" or f.line)])
    # ("<string>" without a line: code torch generated, not the user's)
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


def _exception_line(e: BaseException) -> str:
    frames = [f for f in traceback.extract_tb(e.__traceback__) if not f.filename.startswith(_INTERNAL)]
    return f"{frames[-1].filename}:{frames[-1].lineno}: {(frames[-1].line or '').strip()}" if frames else ""


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


def device_constant(name: str, data: torch.Tensor) -> tuple[str, torch.Tensor]:
    """A captured tensor in its device dtype (int64 -> int32, checked; float64 -> float32)."""
    dtype = legalize.ir_dtype(data.dtype)
    data = data.detach()
    if dtype == "int32" and data.dtype != torch.int32:
        if data.numel() and (data.min() < INT32_MIN or data.max() > INT32_MAX):
            raise CompileError(f"constant {name!r} holds integers outside int32 (the device's integers)")
        data = data.to(torch.int32)
    elif dtype == "float32" and data.dtype != torch.float32:
        data = data.to(torch.float32)
    return dtype, data


def trace(fn: Callable[[Any], Any], inputs: Any) -> Graph:
    """Trace `fn(inputs)` into a primitive Graph whose inputs and outputs keep their names."""
    leaves, in_spec = pytree.tree_flatten_with_path(inputs)
    names = [key_name(path) for path, _ in leaves]
    tensors = [leaf for _, leaf in leaves]
    for name, t in zip(names, tensors):
        if not isinstance(t, torch.Tensor):
            raise CompileError(f"input {name!r} is a {type(t).__name__}; compiled functions take tensors")
        if t.dtype not in INPUT_DTYPES:
            raise CompileError(f"input {name!r} has dtype {t.dtype}; the device takes "
                               f"{', '.join(str(d).replace('torch.', '') for d in INPUT_DTYPES)}")
    spec = pytree.tree_structure(inputs)
    out_info: dict[str, Any] = {}

    def flat_fn(*args: torch.Tensor) -> list[torch.Tensor]:
        result = fn(pytree.tree_unflatten(list(args), spec))
        out_leaves, _ = pytree.tree_flatten_with_path(result)
        out_info["names"] = [key_name(p) for p, _ in out_leaves]
        out_info["spec"] = pytree.tree_structure(result)
        bad = [key_name(p) for p, leaf in out_leaves if not isinstance(leaf, torch.Tensor)]
        if bad:
            raise CompileError(f"the function returns non-tensor values at {', '.join(bad)}")
        return [leaf for _, leaf in out_leaves]

    try:
        with _all_stack_frames():
            traced, keep_meta = flat_fn, contextlib.nullcontext()
            if any(t.requires_grad for t in tensors):
                # functionalize hides autograd: trace through autograd first (gradients become
                # ATen ops), then functionalize that graph, each node keeping its source line
                joint = make_fx(flat_fn, tracing_mode="fake", _allow_non_fake_inputs=True,
                                record_stack_traces=True)(*tensors)
                traced = lambda *args: torch.fx.Interpreter(joint).run(*args)  # noqa: E731
                keep_meta = torch.fx.traceback.preserve_node_meta()
                tensors = [t.detach() for t in tensors]
            with keep_meta:
                gm = make_fx(functionalize(traced, remove="mutations_and_views"), decomposition_table=table(),
                             tracing_mode="fake", _allow_non_fake_inputs=True, record_stack_traces=True)(*tensors)
    except CompileError:
        raise
    except Exception as e:  # data-dependent control flow, unsupported Python, ...
        line = _exception_line(e)
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise CompileError(f"tracing {getattr(fn, '__name__', fn)} failed: {type(e).__name__}: {first}"
                           + (f"\n  at {line}" if line else "")) from e
    graph = _legalize(gm, names, tensors, out_info["names"], out_info["spec"], in_spec)
    graph.module = gm  # the traced function itself, runnable with real tensors (reference runs)
    return graph


def _static_shape(val: Any) -> bool:
    vals = val if isinstance(val, (list, tuple)) else [val]
    return all(not isinstance(v, torch.Tensor) or all(isinstance(s, int) for s in v.shape) for v in vals)


def _op_key(target: Any) -> str:
    schema = getattr(target, "_schema", None)
    if schema is not None:
        space, _, name = schema.name.partition("::")
        return name if space == "aten" else f"{space}.{name}"
    return getattr(target, "__name__", str(target))


def _legalize(gm: torch.fx.GraphModule, in_names: list[str], samples: list[torch.Tensor], out_names: list[str],
              out_spec: Any, in_spec: Any) -> Graph:
    graph = Graph({}, {}, [], [], out_spec, in_spec)
    b = Builder(graph, set(in_names) | set(out_names))
    env: dict[torch.fx.Node, Any] = {}
    placeholders = iter(zip(in_names, samples))

    def convert(a: Any) -> Any:
        if isinstance(a, torch.fx.Node):
            return env[a]
        if isinstance(a, (list, tuple)):
            return type(a)(convert(x) for x in a)
        return a

    for fx_node in gm.graph.nodes:
        val = fx_node.meta.get("val")
        if fx_node.op == "placeholder":
            name, sample = next(placeholders)
            v = Value(name, tuple(val.shape), legalize.ir_dtype(val.dtype), "input")
            if sample.dtype != torch.int32 and v.dtype == "int32":
                v.torch_dtype = str(sample.dtype).replace("torch.", "")
            env[fx_node] = graph.inputs[name] = v
        elif fx_node.op == "get_attr":
            captured = getattr(gm, fx_node.target)
            dtype, data = device_constant(fx_node.target, captured)
            v = Value(b.fresh(fx_node.target.lstrip("_")), tuple(data.shape), dtype, "const", data=data,
                      origin=captured)
            env[fx_node] = v
            graph.constants.append(v)
        elif fx_node.op == "call_function":
            env[fx_node] = _call(b, fx_node, val, convert)
        elif fx_node.op == "output":
            results = convert(fx_node.args[0])
            for name, v, fx_out in zip(out_names, results, fx_node.args[0]):
                val = fx_out.meta.get("val") if isinstance(fx_out, torch.fx.Node) else None
                if isinstance(val, torch.Tensor) and val.dtype == torch.int64 and v.dtype == "int32":
                    v.torch_dtype = "int64"
                graph.outputs[name] = v
            return graph
    raise CompileError("the traced graph has no output")


def _call(b: Builder, fx_node: torch.fx.Node, val: Any, convert: Callable[[Any], Any]) -> Any:
    """Legalize one ATen node; returns its Value (or tuple of Values for multi-output ops)."""
    if fx_node.target is operator.getitem:
        parts, k = convert(fx_node.args[0]), fx_node.args[1]
        return parts[k]
    aten = str(fx_node.target)
    source = user_line(fx_node.meta.get("stack_trace"))
    args, kwargs = convert(fx_node.args), convert(dict(fx_node.kwargs))
    shapes = [list(a.shape) for a in args if isinstance(a, Value)]
    if not _static_shape(val):
        raise UnsupportedOpError(aten, shapes, source, "its output shape depends on the data")
    key = _op_key(fx_node.target)
    if key == "copy_":
        raise UnsupportedOpError(aten, shapes, source, "the function writes one of its inputs in place; return the "
                                 "new value instead")
    fn = legalize.RULES.get(key)
    if fn is None:
        raise UnsupportedOpError(aten, shapes, source)
    b.source, b.aten, b.stem = source, aten, fx_node.name
    b.used = {u.args[1] for u in fx_node.users if u.target is operator.getitem}
    kwargs = {k: v for k, v in kwargs.items() if k not in ("layout", "device", "pin_memory", "memory_format",
                                                          "non_blocking", "requires_grad")}
    try:
        result = fn(b, val, *args, **kwargs)
    except (CompileError, UnsupportedOpError) as e:
        if isinstance(e, UnsupportedOpError) or not source or "at " in str(e):
            raise
        raise CompileError(f"{aten} with shapes {shapes}: {e}\n  at {source}") from None
    return _check(b, aten, source, shapes, val, result)


def _check(b: Builder, aten: str, source: str, shapes: list, val: Any, result: Any) -> Any:
    """The legalized result has torch's shapes; dtypes are made the device form of torch's."""
    vals = list(val) if isinstance(val, (list, tuple)) else [val]
    results = list(result) if isinstance(result, (list, tuple)) else [result]
    fixed = []
    for v, r in zip(vals, results):
        if r is None or not isinstance(v, torch.Tensor):
            fixed.append(r)
            continue
        if tuple(r.shape) != tuple(v.shape):
            raise CompileError(f"internal: {aten} legalized to shape {list(r.shape)}, torch says {list(v.shape)}"
                               f"\n  at {source or 'an unknown line'}")
        fixed.append(b.cast(r, legalize.ir_dtype(v.dtype)))
    return tuple(fixed) if isinstance(result, (list, tuple)) else fixed[0]

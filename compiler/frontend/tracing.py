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
import functools
import operator
import os
import re
import threading
import traceback
import warnings
from typing import Any, Callable, Iterator

import torch
from torch._subclasses.fake_tensor import is_fake, unset_fake_temporarily
from torch.fx.experimental.proxy_tensor import disable_proxy_modes_tracing, make_fx
from torch.func import functionalize
from torch.optim.optimizer import register_optimizer_step_pre_hook
from torch.utils import _pytree as pytree

from ..dtypes import DTYPES, INT32_MAX, INT32_MIN, OUTPUT_DTYPES
from ..errors import CompileError, UnregisteredWriteError, UnsupportedOpError
from ..ir import Graph, Value, update_output
from . import legalize  # noqa: F401  (imported for its rules: they register in rules.RULES)
from .rules import RULES, ir_dtype
from .build import Builder
from . import complex_pairs
from .above_autograd import DecomposeAboveAutograd
from .cumulative_average import traced_cumulative_average
from .random import DeviceGenerator, draws
from .mappings import register_mappings
from .decompositions import table
from .narrow_ints import fold_narrow_results

_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<fn>\S+)\n\s*(?P<code>[^\n]*)')
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
# frames of torch and of mnsim's own packages (by path: the compiler imports none of the others)
_INTERNAL = (os.path.dirname(torch.__file__), *(os.path.join(_ROOT, p) + os.sep for p in ("compiler", "runtime",
                                                                                         "mlsdk", "sim")))
INPUT_DTYPES = tuple(DTYPES)


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
    return _user_line(traceback.extract_tb(e.__traceback__))


def _user_line(frames: traceback.StackSummary) -> str:
    """The innermost frame outside torch and mnsim, as file:line: source."""
    mine = [f for f in frames if not f.filename.startswith(_INTERNAL)]
    return f"{mine[-1].filename}:{mine[-1].lineno}: {(mine[-1].line or '').strip()}" if mine else ""


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
    """A captured tensor in its device dtype (int64 -> int32, checked; float64 -> float32), copied:
    a program's constants are the values at compile (what a saved codegen_dir holds), not at the
    first call, when the program is loaded, after host edits made since."""
    dtype = ir_dtype(data.dtype)
    data = data.detach().clone()
    if dtype == "int32" and data.dtype != torch.int32:
        if data.numel() and (data.min() < INT32_MIN or data.max() > INT32_MAX):
            raise CompileError(f"constant {name!r} holds integers outside int32 (the device's integers)")
        data = data.to(torch.int32)
    elif dtype == "float32" and data.dtype != torch.float32:
        data = data.to(torch.float32)
    return dtype, data


def trace(fn: Callable[[Any], Any], inputs: Any, resident: Callable[[torch.Tensor], str | None] | None = None,
          describe: Callable[[torch.Tensor], str | None] | None = None, generator: DeviceGenerator | None = None
          ) -> Graph:
    """Trace `fn(inputs)` into a primitive Graph whose inputs and outputs keep their names.

    `resident(t)` names captured tensors that live on the device between calls (registered
    parameters, buffers, optimizer state): they become graph inputs of that name, and what the
    function writes into them (an optimizer step, BatchNorm's running statistics, gradients
    accumulated by `backward()`) becomes `graph.updates[name]`, the value the program leaves in
    that tensor for the next call. A write into any other captured tensor is refused. With a
    `generator` (a Context's), torch's random functions draw from it (frontend.random); without
    one they are refused.

    One trace runs at a time in a process: torch's fake-tensor tracing keeps global state, and
    tracing patches process-wide hooks (autograd_phases), so traces from several threads queue.
    """
    with _TRACING:
        return _trace(fn, inputs, resident, describe, generator)


def _trace(fn: Callable[[Any], Any], inputs: Any, resident: Callable[[torch.Tensor], str | None] | None,
           describe: Callable[[torch.Tensor], str | None] | None, generator: DeviceGenerator | None) -> Graph:
    register_mappings(inputs)
    leaves, in_spec = pytree.tree_flatten_with_path(inputs)
    names = _distinct_names([key_name(path) for path, _ in leaves], "inputs")
    tensors = [leaf for _, leaf in leaves]
    for name, t in zip(names, tensors):
        if not isinstance(t, torch.Tensor):
            raise CompileError(f"input {name!r} is a {type(t).__name__}; compiled functions take tensors")
        if t.dtype not in INPUT_DTYPES and t.dtype != torch.complex64:  # (complex: as its view_as_real pairs)
            raise CompileError(f"input {name!r} has dtype {t.dtype}; the device takes "
                               f"{', '.join(str(d).replace('torch.', '') for d in INPUT_DTYPES)} and complex64")
    tensors = _unaliased(tensors)
    spec = pytree.tree_structure(inputs)
    out_info: dict[str, Any] = {}

    def flat_fn(*args: torch.Tensor) -> list[torch.Tensor]:
        result = fn(pytree.tree_unflatten(list(args), spec))
        out_leaves, _ = pytree.tree_flatten_with_path(result)
        out_info["names"] = _distinct_names([key_name(p) for p, _ in out_leaves], "outputs")
        out_info["spec"] = pytree.tree_structure(result)
        bad = [key_name(p) for p, leaf in out_leaves if not isinstance(leaf, torch.Tensor)]
        if bad:
            raise CompileError(f"the function returns non-tensor values at {', '.join(bad)}")
        return [leaf for _, leaf in out_leaves]

    try:
        # without oneDNN, recurrent layers (nn.LSTM) trace as their ATen composite rather than as
        # one fused CPU kernel (mkldnn_rnn_layer) that no decomposition opens
        no_onednn = torch.backends.mkldnn.flags(enabled=False, deterministic=None, allow_tf32=None, fp32_precision=None)
        with _all_stack_frames(), no_onednn, _no_attention_fastpath(), traced_cumulative_average():
            # pass 1, through autograd and the optimizer: backward() and step() become ATen ops on
            # the captured tensors (functionalize would hide autograd, so it comes second)
            zeroed: set[int] = set()
            if generator is not None:
                generator.start_trace()
            with autograd_phases(resident, zeroed), DecomposeAboveAutograd():
                joint = make_fx(flat_fn, tracing_mode="fake", _allow_non_fake_inputs=True, record_stack_traces=True,
                                decomposition_table=draws(generator) if generator is not None else None)(*tensors)
            state, gradients_left, unkept = _captured_state(joint, resident)
            state = {name: complex_pairs.device_form(t) for name, t in state.items()}  # (as the device holds it)
            clash = sorted(set(state) & set(names))
            if clash:
                raise CompileError(f"input {clash[0]!r} has the name of a registered tensor the function reads; "
                                   "rename the input or give the model another prefix")
            tensors = [complex_pairs.device_form(t.detach()) for t in tensors]  # (as the device takes them)
            # fake tensor mode keeps one-element constants real and runs ops on them: pass 2 would
            # really add 1 to an unregistered BatchNorm's num_batches_tracked (kept as it was below)
            written = [(t, t.detach().clone()) for _, t in unkept]
            # pass 2: functionalized (writes become values, writes into inputs a final copy_) and
            # decomposed, each node keeping its source line and phase. Without autograd: pass 1's
            # graph holds the backward already, and an op pass 1 chose for a function run under
            # no_grad (CPU flash attention, whose float mask a parameter computes: T5's relative
            # position bias) refuses a mask that requires grad
            try:
                with torch.fx.traceback.preserve_node_meta(), torch.no_grad():
                    second = complex_pairs.interpreter(joint, out_info["names"], _op_key,
                                                       lambda node: user_line(node.meta.get("stack_trace")))
                    gm = make_fx(functionalize(lambda *args: second.run(*args),
                                               remove="mutations_and_views"), decomposition_table=table(),
                                 tracing_mode="fake", _allow_non_fake_inputs=True, record_stack_traces=True)(
                        *tensors, *(t.detach() for t in state.values()))
            except Exception:
                _refuse_captured_writes(unkept, describe)  # what pass 1 found says more than pass 2's failure
                raise
            finally:
                with torch.no_grad():
                    for t, before in written:
                        t.copy_(before)
            # writes into captured tensors not kept on the device: seen by pass 1 (ops whose schema
            # writes), and by pass 2 (functionalize's copy_ back, for writes inside composite ops
            # such as batch_norm's running statistics): refused, or listed to be registered, at once
            _refuse_captured_writes(unkept + _copies_into_captured(gm), describe)
    except CompileError:
        raise
    except Exception as e:  # data-dependent control flow, unsupported Python, ...
        line = _exception_line(e)
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        hint = f"\n  {_DATA_DEPENDENT}" if type(e).__name__ in ("GuardOnDataDependentSymNode",
                                                               "DataDependentOutputException") else ""
        raise CompileError(f"tracing {getattr(fn, '__name__', fn)} failed: {type(e).__name__}: {first}"
                           + (f"\n  at {line}" if line else "") + hint) from e
    graph = _legalize(gm, [*names, *state], [*tensors, *state.values()], out_info["names"], out_info["spec"],
                      in_spec, state)
    graph.gradients_left, graph.zeroed = gradients_left, zeroed
    graph.module = gm  # the traced function itself, runnable with real tensors (reference runs)
    return graph


@contextlib.contextmanager
def _no_attention_fastpath() -> Iterator[None]:
    """Trace nn.MultiheadAttention and nn.TransformerEncoder(Layer) through their composite
    path: in eval mode their CPU fast path turns a padding mask into a nested tensor by the mask's
    values (`_nested_tensor_from_mask`), which no static-shape trace can follow (a data-dependent
    guard), and calls fused kernels no decomposition opens. The composite path computes the same."""
    enabled = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    module = torch.nn.modules.transformer
    detect = getattr(module, "_detect_is_causal_mask", None)
    if detect is not None:
        module._detect_is_causal_mask = functools.partial(_causal_hint, detect)
    try:
        yield
    finally:
        torch.backends.mha.set_fastpath_enabled(enabled)
        if detect is not None:
            module._detect_is_causal_mask = detect


def _causal_hint(detect: Callable[..., bool], mask: torch.Tensor | None, is_causal: bool | None = None,
                 size: int | None = None) -> bool:
    """nn.Transformer*'s guess whether a mask is causal compares the mask's values with a causal
    one. A mask made inside the traced function has no values during the trace (the comparison
    would be a data-dependent guard, and its `.item()` a node of the program): it is not taken
    for causal and is applied as given, which computes the same (the guess only lets torch drop
    the mask for a causal kernel). A captured real mask is compared on the host, off the trace."""
    if is_causal is not None or mask is None or is_fake(mask):
        return is_causal is True
    with unset_fake_temporarily(), disable_proxy_modes_tracing():
        return detect(mask, is_causal, size)


def _distinct_names(names: list[str], what: str) -> list[str]:
    """The dotted names of a pytree's leaves, refused when two meet: a key "a.b" beside a nested
    {"a": {"b": ...}} named one tensor for both (the program read one for two inputs; outputs
    compiled, then every call failed inside torch's pytree)."""
    seen = set()
    for name in names:
        if name in seen:
            raise CompileError(f"two {what} are both named {name!r} once nested keys are joined with dots (a key "
                               f"with a dot beside nested dicts); rename one")
        seen.add(name)
    return names


def _unaliased(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """The sample inputs with each one that shares memory with an earlier one copied. One tensor
    under two names (z = zeros(...); {"x": z, "y": z}), or a view of another, is two inputs of
    the program: traced as one (tracing follows the storage), the program read the same buffer for
    both, whatever the call passed."""
    seen: set[int] = set()
    out = []
    for t in tensors:
        storage = t.untyped_storage().data_ptr() if t.numel() else None
        out.append(t.clone() if storage in seen else t)
        if storage is not None:
            seen.add(storage)
    return out


BACKWARD, OPTIMIZER, FORWARD = "backward", "optimizer", "forward"
_PHASE_MARK = "mnsim:"


class _TrainingTrace(torch.overrides.TorchFunctionMode):
    """Pass 1's torch-function mode. It brackets `backward()` and `torch.autograd.grad` with
    profiler marks, so the nodes autograd adds are known as the backward pass (optimizers bracket
    their own steps); runs attention as its math composite (see autograd_phases); and keeps the
    user's tensors as they were: fake tensor mode computes an op whose tensor operands are all
    real for real, so `step.add_(1)` on an optimizer's counter or `buf.mul_(momentum)` would write
    the captured tensor while tracing. Each real tensor written in place is saved first and
    restored by `restore()`."""

    GRADIENTS = (torch.Tensor.backward, torch.autograd.backward, torch.autograd.grad)
    HOST_READS = (torch.Tensor.item, torch.Tensor.__float__, torch.Tensor.__int__, torch.Tensor.__bool__,
                  torch.Tensor.__index__, torch.Tensor.tolist)

    def __init__(self, resident: Callable[[torch.Tensor], str | None] | None = None) -> None:
        super().__init__()
        self.saved: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.resident = resident

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in self.HOST_READS and args and _is_real(args[0]) and self.resident is not None:
            self._refuse_host_read(func, args[0])
        if _indices_of_true(func, args, kwargs):
            raise UnsupportedOpError(f"{getattr(func, '__name__', func)} of one condition", [list(args[0].shape)],
                                     _user_line(traceback.extract_stack()),
                                     "its output shape depends on the data (one index tensor per dim, as long as the "
                                     "condition holds true values): keep the shape with torch.where(mask, x, y), "
                                     "or count with mask.sum()")
        if func is torch.nn.functional.one_hot and (args[1] if len(args) > 1 else kwargs.get("num_classes", -1)) < 0:
            raise UnsupportedOpError("one_hot", [list(args[0].shape)], _user_line(traceback.extract_stack()),
                                     "without num_classes its width is the largest index plus one, a value of the "
                                     "data; give num_classes")
        if func is _PACK_PADDED:
            shapes = [list(a.shape) for a in args[:2] if isinstance(a, torch.Tensor)]
            raise UnsupportedOpError("pack_padded_sequence", shapes, _user_line(traceback.extract_stack()),
                                     "a packed sequence's batch sizes are data (how many sequences are still running "
                                     "at each step), which a program of static shapes cannot follow: run the RNN on "
                                     "the padded batch and mask its outputs (or pick each sequence's last step with "
                                     "torch.gather at its length - 1)")
        if func in self.GRADIENTS:
            with torch.autograd.profiler.record_function(_PHASE_MARK + BACKWARD):
                return func(*args, **kwargs)
        if func is _FUSED_ATTENTION:
            return _math_attention(*args, **kwargs)
        written = [args[0]] if args and _writes_first(func) else []
        written += pytree.tree_leaves(kwargs.get("out"))
        if getattr(func, "__name__", "") == "__set__" and args and \
                getattr(getattr(func, "__self__", None), "__name__", "") == "data":  # `t.data = ...`
            written.append(args[0])
        for t in written:
            if _is_real(t) and id(t) not in self.saved:
                with torch.no_grad(), unset_fake_temporarily(), disable_proxy_modes_tracing():  # a real copy
                    self.saved[id(t)] = (t, t.data, t.detach().clone())
        return func(*args, **kwargs)

    def _refuse_host_read(self, func: Any, t: torch.Tensor) -> None:
        """A registered tensor read as a Python number (float(), .item(), a condition) would be
        read once, here, and frozen into the program, while the device keeps updating it: a
        counter `x / float(self.count)` divided by 1 on every call, and BatchNorm with
        momentum=None kept the last batch's statistics instead of their running average."""
        name = self.resident(t)
        if name is None:
            return
        line = _user_line(traceback.extract_stack())
        raise CompileError(f"registered tensor {name!r} is read as a Python number ({func.__name__}) while "
                           f"tracing: its value then would be frozen into the program although the device "
                           f"updates it; keep it a tensor (x / t rather than x / float(t))"
                           + (f"\n  at {line}" if line else ""))

    def restore(self) -> None:
        with torch.no_grad():
            for t, data, value in self.saved.values():
                if t.data is not data:
                    t.data = data
                t.copy_(value)
        self.saved.clear()


_PACK_PADDED = torch._VF._pack_padded_sequence  # what torch.nn.utils.rnn.pack_padded_sequence calls


def _indices_of_true(func: Any, args: tuple, kwargs: dict) -> bool:
    """torch.where(condition) and nonzero(as_tuple=True): the trace would fail on the count of
    true values (a data-dependent guard, reported far from the user's call)."""
    if not args or not isinstance(args[0], torch.Tensor):
        return False
    if func is torch.where:
        return len(args) == 1 and not kwargs
    return func in (torch.nonzero, torch.Tensor.nonzero) and bool(kwargs.get("as_tuple", False))


def _writes_first(func: Any) -> bool:
    """Tensor.add_, torch.Tensor.__iadd__, ...: methods that write their first operand."""
    name = getattr(func, "__name__", "")
    return name.startswith("__i") or (name.endswith("_") and not name.endswith("__"))


def _is_real(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and not isinstance(t, torch._subclasses.FakeTensor) \
        and type(t) in (torch.Tensor, torch.nn.Parameter)


_FUSED_ATTENTION = torch.nn.functional.scaled_dot_product_attention
_DATA_DEPENDENT = ("the code reads a tensor's value as a Python number, which a compiled program cannot: a "
                   "branch on it (nn.Transformer and nn.TransformerEncoder test whether a mask is causal unless "
                   "given is_causal=, gaussian_nll_loss tests var < 0: pass the flag or keep the branch out), or "
                   "an index `x[i]` with a 0-d tensor i (write x.index_select(0, i.reshape(1)) instead)")
_TRACING = threading.RLock()


def _math_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attn_mask: torch.Tensor | None = None, dropout_p: float = 0.0, is_causal: bool = False, *,
                    scale: float | None = None, enable_gqa: bool = False) -> torch.Tensor:
    """Attention as its math composite when gradients are taken, so autograd differentiates ops
    we lower (the fused CPU kernel's backward is one opaque op). The composite takes what
    torch.nn.functional's front end hands it: a boolean mask (True: attend) already made additive,
    0 or -inf (the composite would add the booleans themselves). With dropout too: its dropout is
    ATen's native_dropout, which a Context's generator draws (frontend.random)."""
    if not torch.is_grad_enabled() and dropout_p == 0:
        return _FUSED_ATTENTION(query, key, value, attn_mask, dropout_p, is_causal, scale=scale,
                                enable_gqa=enable_gqa)
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        attn_mask = torch.zeros(attn_mask.shape, dtype=query.dtype).masked_fill(attn_mask.logical_not(),
                                                                                 float("-inf"))
    return torch.ops.aten._scaled_dot_product_attention_math(query, key, value, attn_mask, dropout_p, is_causal,
                                                             scale=scale, enable_gqa=enable_gqa)[0]


@contextlib.contextmanager
def autograd_phases(resident: Callable[[torch.Tensor], str | None] | None = None,
                    zeroed: set[int] | None = None) -> Iterator[None]:
    """While tracing: mark the backward pass, refuse optimizers that keep state on the host and
    reads of `resident` tensors as Python numbers, clear resident gradients in place on zero_grad
    (`_zeroing`, noting the parameters' ids in `zeroed`), and run attention as its math composite
    (called directly, or through torch.nn.functional from inside other torch functions, such as
    multi-head attention, which the mode does not see)."""
    with _TRACING, contextlib.ExitStack() as undo:  # process-wide patches: one trace at a time
        undo.callback(register_optimizer_step_pre_hook(_check_optimizer).remove)
        for owner, params in ((torch.optim.Optimizer, lambda o: [p for g in o.param_groups for p in g["params"]]),
                              (torch.nn.Module, lambda m: list(m.parameters()))):
            undo.callback(setattr, owner, "zero_grad", owner.zero_grad)
            owner.zero_grad = _zeroing(owner.zero_grad, params, resident, set() if zeroed is None else zeroed)
        attention = torch.nn.functional.scaled_dot_product_attention
        torch.nn.functional.scaled_dot_product_attention = _math_attention
        undo.callback(setattr, torch.nn.functional, "scaled_dot_product_attention", attention)
        mode = _TrainingTrace(resident)
        undo.callback(mode.restore)
        with mode:
            yield


def _zeroing(zero_grad: Callable, params: Callable[[Any], list], resident: Callable[[torch.Tensor], str | None] | None,
             zeroed: set[int]) -> Callable:
    """`zero_grad` for tracing: a gradient the device keeps (a registered p.grad, slm_sft's
    pre-allocated ones) is zeroed in place, which the trace records as its update, where
    set_to_none=True (the default) only dropped the Python reference: the device kept the sum,
    and a step after gradient accumulation over compiled calls used every round's gradients."""
    def traced_zero_grad(self: Any, *args: Any, **kwargs: Any) -> None:
        cleared = params(self)
        zeroed.update(id(p) for p in cleared)
        kept = {p: p.grad for p in cleared
                if _is_real(p.grad) and resident is not None and resident(p.grad) is not None}
        zero_grad(self, *args, **kwargs)
        for p, grad in kept.items():
            grad.zero_()
            p.grad = grad
    return traced_zero_grad


def _check_optimizer(optimizer: Any, args: Any, kwargs: Any) -> None:
    if not getattr(optimizer, "traceable_step", False):
        raise CompileError(f"{type(optimizer).__module__}.{type(optimizer).__name__}.step() in a compiled function: "
                           "it keeps its state and hyper-parameters on the host (made at its first step, read "
                           "as numbers); use mlsdk.MNCoreSGD, MNCoreAdam or MNCoreAdamW, whose state and "
                           "learning rate live on the device")


def _captured_state(joint: torch.fx.GraphModule, resident: Callable[[torch.Tensor], str | None] | None
                    ) -> tuple[dict[str, torch.Tensor], list[torch.Tensor], list[tuple[torch.fx.Node, torch.Tensor]]]:
    """Rewrite pass 1's graph in place: captured tensors that `resident` names become placeholders
    (after the inputs), profiler marks become each node's phase. Returns name -> tensor, the
    captured tensors in whose `.grad` backward() left a gradient (reset to None here), and the
    writes into other captured tensors (`_captured_writes`)."""
    graph = joint.graph
    last_input: list[Any] = [n for n in graph.nodes if n.op == "placeholder"][-1:] or [None]
    state: dict[str, torch.Tensor] = {}
    placeholders: dict[str, torch.fx.Node] = {}
    phase, marks, profiler_nodes, gradients_left = FORWARD, [], [], []
    unkept: list[tuple[torch.fx.Node, torch.Tensor]] = []  # writes into captured tensors not resident
    for node in list(graph.nodes):
        if node.op == "get_attr":
            captured = getattr(joint, node.target)
            if isinstance(captured, torch.Tensor) and isinstance(captured.grad, torch._subclasses.FakeTensor):
                captured.grad = None  # backward() set it while tracing
                gradients_left.append(captured)
            name = resident(captured) if resident is not None and isinstance(captured, torch.Tensor) else None
            if name is None:
                continue
            if name not in placeholders:
                anchor = last_input[-1]
                with graph.inserting_after(anchor) if anchor is not None else \
                        graph.inserting_before(next(iter(graph.nodes))):
                    placeholders[name] = graph.placeholder(_placeholder_name(name))
                    placeholders[name].meta["val"] = node.meta.get("val")  # (complex_pairs reads it)
                last_input.append(placeholders[name])
                state[name] = captured
            node.replace_all_uses_with(placeholders[name])
            graph.erase_node(node)
        elif node.op == "call_function" and getattr(node.target, "namespace", "") == "profiler":
            profiler_nodes.append(node)
            if node.target is torch.ops.profiler._record_function_enter_new.default:
                marks.append(phase)
                label = str(node.args[0])
                if label == _PHASE_MARK + BACKWARD:
                    phase = BACKWARD
                elif label.startswith("Optimizer.step#"):
                    phase = OPTIMIZER
            elif marks:
                phase = marks.pop()
        elif node.op == "call_function":
            node.meta["custom"] = {**node.meta.get("custom", {}), "mnsim_phase": phase}
            unkept += _captured_writes(node, joint)
    for node in reversed(profiler_nodes):  # exits before the entries they use
        graph.erase_node(node)
    joint.recompile()
    return state, gradients_left, unkept


def _placeholder_name(name: str) -> str:
    return "state_" + re.sub(r"\W", "_", name)


def _captured_writes(node: torch.fx.Node, joint: torch.fx.GraphModule) -> list[tuple[torch.fx.Node, torch.Tensor]]:
    """(node, tensor) for each captured tensor (not resident: those are placeholders by now) the
    node writes in place, directly or through views of it (F.embedding's max_norm renormalizes
    `weight.detach()` in place)."""
    schema = getattr(node.target, "_schema", None)
    if schema is None:
        return []
    out = []
    for k, arg in enumerate(schema.arguments):
        value = node.args[k] if k < len(node.args) else node.kwargs.get(arg.name)
        if arg.alias_info is not None and arg.alias_info.is_write and isinstance(value, torch.fx.Node):
            base = _view_base(value)
            if base.op == "get_attr":
                out.append((node, getattr(joint, base.target)))
    return out


def _view_base(value: torch.fx.Node) -> torch.fx.Node:
    """The node a chain of views (ops whose result aliases their first argument without writing
    it: detach, alias, view, ...) starts from."""
    while value.op == "call_function" and value.args and isinstance(value.args[0], torch.fx.Node):
        schema = getattr(value.target, "_schema", None)
        returns = schema.returns if schema is not None else ()
        first = schema.arguments[0].alias_info if schema is not None and schema.arguments else None
        if not returns or returns[0].alias_info is None or returns[0].alias_info.is_write or first is None \
                or first.is_write or returns[0].alias_info.before_set != first.before_set:
            break
        value = value.args[0]
    return value


def _copies_into_captured(gm: torch.fx.GraphModule) -> list[tuple[torch.fx.Node, torch.Tensor]]:
    """(node, tensor) for each copy_ of pass 2 into a captured tensor (through copy_ chains)."""
    out = []
    for node in gm.graph.nodes:
        if node.op != "call_function" or _op_key(node.target) != "copy_":
            continue
        dst = node.args[0]
        while isinstance(dst, torch.fx.Node) and dst.op == "call_function" and _op_key(dst.target) == "copy_":
            dst = dst.args[0]
        if isinstance(dst, torch.fx.Node) and dst.op == "get_attr":
            out.append((node, getattr(gm, dst.target)))
    return out


def _refuse_captured_writes(writes: list[tuple[torch.fx.Node, torch.Tensor]],
                            describe: Callable[[torch.Tensor], str | None] | None) -> None:
    """A write into a captured tensor the device does not keep would be lost after the call. When
    every such tensor has a name, UnregisteredWriteError lists them (a Context registers them and
    traces again); otherwise CompileError names the first without one."""
    if not writes:
        return
    named = {id(t): (node, t, describe(t) if describe is not None else None) for node, t in writes}
    nameless = [(node, t) for node, t, name in named.values() if name is None]
    node, t = nameless[0] if nameless else writes[0]
    what = f"({str(t.dtype).replace('torch.', '')}{list(t.shape)})"
    if nameless:
        raise CompileError(f"{node.target} writes a captured tensor {what} that is not registered in the Context, so "
                           "the device would not keep the new value; name and register it (set_tensor_name_in_module "
                           "and register_buffer, or register_optimizer_buffers)" + _at(node))
    names = [name for _, _, name in named.values()]
    raise UnregisteredWriteError(
        f"{node.target} writes a captured tensor {names[0]!r} {what}"
        + (f" (and {len(names) - 1} more: {', '.join(map(repr, names[1:3]))}{', ...' if len(names) > 3 else ''})"
           if len(names) > 1 else "")
        + " that is not registered in the Context, so the device would not keep the new value; register it "
          "(register_param, register_buffer or register_optimizer_buffers)" + _at(node),
        [t for _, t, _ in named.values()])


def _at(node: torch.fx.Node) -> str:
    line = user_line(node.meta.get("stack_trace"))
    return f"\n  at {line}" if line else ""


def _static_shape(val: Any) -> bool:
    vals = val if isinstance(val, (list, tuple)) else [val]
    return all(not isinstance(v, torch.Tensor) or all(isinstance(s, int) for s in v.shape) for v in vals)


# Why ops without a rule have none, where a user can do something about it (by _op_key).
_FACTORIZATION = ("matrix factorizations and eigenproblems are not simulated (the device has no such "
                  "kernel); compute them on the host and pass the factors in as inputs")
WHY_NOT = {
    "embedding_renorm": "nn.Embedding(max_norm=...) rescales the rows it looks up in the table itself, in place, "
                        "before reading them; leave max_norm out, or scale the rows you read: "
                        "w * torch.clamp(max_norm / w.norm(dim=-1, keepdim=True), max=1)",
    "_fft_r2c": "FFTs are not simulated", "_fft_c2r": "FFTs are not simulated", "_fft_c2c": "FFTs are not simulated",
    "linalg_cholesky_ex": _FACTORIZATION, "linalg_qr": _FACTORIZATION, "_linalg_eigh": _FACTORIZATION,
    "_linalg_svd": _FACTORIZATION, "linalg_eig": _FACTORIZATION,
    "histc": "histc is not simulated; count each bin with ((x >= low) & (x < high)).sum()",
    "_pdist_forward": "pdist is not simulated; torch.cdist(x, x) is, and holds pdist's values above its diagonal",
}


def _op_key(target: Any) -> str:
    schema = getattr(target, "_schema", None)
    if schema is not None:
        space, _, name = schema.name.partition("::")
        return name if space == "aten" else f"{space}.{name}"
    return getattr(target, "__name__", str(target))


def _legalize(gm: torch.fx.GraphModule, in_names: list[str], samples: list[torch.Tensor], out_names: list[str],
              out_spec: Any, in_spec: Any, state: dict[str, torch.Tensor]) -> Graph:
    graph = Graph({}, {}, [], [], out_spec, in_spec, resident=dict(state))
    b = Builder(graph, set(in_names) | set(out_names))
    env: dict[torch.fx.Node, Any] = {}
    placeholders = iter(zip(in_names, samples))

    def convert(a: Any) -> Any:
        if isinstance(a, torch.fx.Node):
            return env[a]
        if isinstance(a, (list, tuple)):
            return type(a)(convert(x) for x in a)
        return a

    doubles: list[str] = []  # where the function computes in float64 (done in float32)
    for fx_node in gm.graph.nodes:
        val = fx_node.meta.get("val")
        if fx_node.op == "placeholder":
            name, sample = next(placeholders)
            v = Value(name, tuple(val.shape), ir_dtype(val.dtype), "input")
            if sample.dtype != torch.int32 and v.dtype == "int32":
                v.torch_dtype = str(sample.dtype).replace("torch.", "")
            env[fx_node] = graph.inputs[name] = v
        elif fx_node.op == "get_attr":
            captured = getattr(gm, fx_node.target)
            dtype, data = device_constant(fx_node.target, captured)
            v = Value(b.fresh(fx_node.target.lstrip("_")), tuple(data.shape), dtype, "const", data=data)
            env[fx_node] = v
            graph.constants.append(v)
        elif fx_node.op == "call_function":
            if isinstance(val, torch.Tensor) and val.dtype == torch.float64:
                doubles.append(user_line(fx_node.meta.get("stack_trace")) or str(fx_node.target))
            env[fx_node] = _call(b, fx_node, val, convert)
            written = fx_node.args[0] if _op_key(fx_node.target) == "copy_" else None
            while isinstance(written, torch.fx.Node):  # later reads of the written tensor see what it holds now
                env[written] = env[fx_node]
                written = written.args[0] if written.op == "call_function" and _op_key(written.target) == "copy_" \
                    else None
        elif fx_node.op == "output":
            results = convert(fx_node.args[0])
            for name, v, fx_out in zip(out_names, results, fx_node.args[0]):
                val = fx_out.meta.get("val") if isinstance(fx_out, torch.fx.Node) else None
                if isinstance(val, torch.Tensor) and isinstance(v, Value):
                    v = _as_output(b, v, OUTPUT_DTYPES.get(val.dtype, v.dtype))
                graph.outputs[name] = v
            for name, v in graph.updates.items():
                if graph.inputs[name].torch_dtype and v.kind == "node":
                    v.torch_dtype = graph.inputs[name].torch_dtype
                graph.outputs[update_output(name)] = v
            graph.drop_dead()
            if doubles:
                _warn_at(doubles[0], f"{len(doubles)} op(s) compute in float64, which the device computes in "
                                     f"float32 (its vector units have no float64; outputs keep torch's dtype): "
                                     f"first at {doubles[0]}")
            return graph
    raise CompileError("the traced graph has no output")


def _warn_at(line: str, message: str) -> None:
    """A UserWarning attributed to the user's source line `line` ("file:line: code", `user_line`)."""
    found = re.match(r"(.*?):(\d+): ", line)
    filename, lineno = (found.group(1), int(found.group(2))) if found else ("<traced function>", 0)
    warnings.warn_explicit(message, UserWarning, filename, lineno)


def _masked_hint(args: Any) -> str:
    """What to write instead of x[mask] (a boolean index selects as many elements as it holds
    true values): the masked forms whose shape does not depend on the data."""
    indices = args[1] if len(args) > 1 and isinstance(args[1], (list, tuple)) else ()
    if not any(isinstance(i, Value) and i.dtype == "bool" for i in indices):
        return ""
    return (" (x[mask] has as many elements as the mask holds true values): keep the shape with torch.where("
            "mask, x, 0), a loss over the selected elements as (loss * mask).sum() / mask.sum(), and x[mask] += v "
            "as x += torch.where(mask, v, 0)")


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
        raise UnsupportedOpError(aten, shapes, source, "its output shape depends on the data" + _masked_hint(args))
    key = _op_key(fx_node.target)
    if key == "copy_":
        return _write_back(b, args, aten, shapes, source)
    fn = RULES.get(key)
    if fn is None:
        why = "sparse tensors are not simulated (a sparse gradient: nn.Embedding(sparse=True); use sparse=False)" \
            if "sparse" in key else WHY_NOT.get(key, "")
        raise UnsupportedOpError(aten, shapes, source, why)
    b.source, b.aten, b.stem = source, aten, fx_node.name
    b.phase = fx_node.meta.get("custom", {}).get("mnsim_phase", FORWARD)
    b.used = {u.args[1] for u in fx_node.users if u.target is operator.getitem and u.users}  # read by something
    b.int32_result = isinstance(val, torch.Tensor) and val.dtype == torch.int32
    kwargs = {k: v for k, v in kwargs.items() if k not in ("layout", "device", "pin_memory", "memory_format",
                                                          "non_blocking", "requires_grad")}
    try:
        result = fn(b, val, *args, **kwargs)
    except (CompileError, UnsupportedOpError) as e:
        if isinstance(e, UnsupportedOpError) or not source or "at " in str(e):
            raise
        raise CompileError(f"{aten} with shapes {shapes}: {e}\n  at {source}") from None
    return fold_narrow_results(b, key, fx_node.args, val, _check(b, aten, source, shapes, val, result))


def _as_output(b: Builder, v: Value, dtype: str) -> Value:
    """`v` as an output of the user's dtype `dtype` (int64 and narrow integers are held as int32,
    so one Value may stand for several: `x.int()` of a uint8 input is the input's own Value); a
    Value that may already be another dtype's (an input, another output) is copied."""
    if (v.torch_dtype or v.dtype) == dtype:
        return v
    if v.torch_dtype or v.kind != "node" or any(o is v for o in b.graph.outputs.values()):
        v = b.ew("copy", v)
    if dtype != v.dtype:
        v.torch_dtype = dtype
    return v


def _write_back(b: Builder, args: tuple, aten: str, shapes: list, source: str) -> Value:
    """`copy_(input, new)`: functionalize ends with one for each input the function wrote, and
    decompositions below it (BatchNorm's running statistics) write in place. For a device-resident
    tensor that is its update, and the new value is what the tensor holds from here on (the
    result, which `_legalize` also gives every later read of the written node); a user's input
    cannot be written."""
    dst, src = args[0], args[1]
    name = dst.name if isinstance(dst, Value) and dst.kind == "input" and dst.name in b.graph.resident else \
        b.resident_contents.get(dst) if isinstance(dst, Value) else None
    # a temporary may be written too (InstanceNorm's running statistics, repeated per sample, updated
    # by its batch norm): its new value is all there is to it
    if name is None and not (isinstance(dst, Value) and dst.kind == "node"):
        # functionalize adds the copy_ at the end of the trace: the user's line is the write's, the new value's
        written = src.producer.source if isinstance(src, Value) and src.producer is not None else ""
        raise UnsupportedOpError(aten, shapes, written or source, "the function writes one of its inputs in place; "
                                 "return the new value instead")
    if tuple(src.shape) != dst.shape:
        src = b.expand(src, dst.shape)
    new = b.cast(src, dst.dtype)
    if name is not None:  # a device-resident tensor: its update
        b.graph.updates[name] = new
        b.resident_contents[new] = name
    return new


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
        fixed.append(b.cast(r, ir_dtype(v.dtype)))
    return tuple(fixed) if isinstance(result, (list, tuple)) else fixed[0]

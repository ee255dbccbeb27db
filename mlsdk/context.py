"""`Context`: compiles functions for a device and runs them, keeping registered tensors there.

A Context owns: the registered parameters and buffers (device-resident between calls, shared
by every function compiled in it), the conversion programs it has built, and the session
record that reports read. `Context.switch_context(ctx)` makes a context current, as in MLSDK.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import os
import shutil
import time
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

import torch

from compiler import artifact
from compiler.compile import Compiled, compile_traced
from compiler.convert import Conversion, build_conversion
from compiler.device import DeviceBuffer, Loaded, spec_placement
from compiler.errors import CompileError
from compiler.frontend import trace as trace_graph
from compiler.dtypes import DEVICE_DTYPE, DTYPES
from compiler.iospec import IOSpec
from compiler.layout import Factor, Layout, Placement
from compiler.layout.candidates import candidates
from sim import Machine

from . import options as options_mod
from . import trace
from .device import MNDevice
from .errors import InputError, InvalidatedError, MLSDKError
from .function import CompiledFunction
from .naming import (get_tensor_name, optimizer_tensors, set_buffer_name_in_optimizer, set_tensor_name,
                     set_tensor_name_in_module)
from .proxy import TORCH_DTYPES, TensorProxy
from .resident import ResidentTensors, layout_key
from .session import BINDING, CALL, DOWNLOAD, LOAD, UPLOAD, Binding, Run, new_session

if TYPE_CHECKING:
    from .report import Report


@dataclasses.dataclass
class CacheOptions:
    """Where compiles are cached. A compile is reused when the traced function, its inputs, the
    options, the constraints and the hardware description are unchanged (the four MLSDK flags
    are accepted; mnsim caches whole programs, like enable_app_cache)."""

    cache_dir: str | os.PathLike
    enable_app_cache: bool = True
    enable_onnx_cache: bool = True
    enable_codegen_cache: bool = True
    enable_gpfn2obj_cache: bool = True


class Registry:
    """`ctx.registry.register(name, module)`: register a whole module's parameters and buffers."""

    def __init__(self, context: "Context") -> None:
        self._context = context

    def register(self, name: str, obj: Any) -> None:
        if isinstance(obj, torch.nn.Module):
            set_tensor_name_in_module(obj, name, only_unnamed=True)  # names given before are kept
            for t in [*obj.parameters(), *obj.buffers()]:
                self._context._register(t)
        elif isinstance(obj, torch.optim.Optimizer):
            set_buffer_name_in_optimizer(obj, name, only_unnamed=True)  # names given before are kept
            for _, t in optimizer_tensors(obj):
                self._context._register(t)
        else:
            raise TypeError(f"registry.register takes an nn.Module or an optimizer, got {type(obj).__name__}")


class Context:
    _current: "Context | None" = None

    def __init__(self, device: MNDevice) -> None:
        if not isinstance(device, MNDevice):
            raise TypeError(f"Context takes an MNDevice, got {type(device).__name__}")
        self.device = device
        hw = device.hw
        self.session = new_session(device.chip, hw.clock_hz if hw else 0)
        self.invalidated = False
        self.registry = Registry(self)
        self._registered: dict[str, torch.Tensor] = {}
        self._name_by_id: dict[int, str] = {}
        self._resident = ResidentTensors(self)
        self._conversions: dict[tuple[str, str], Conversion] = {}
        self._conversion_buffers: dict[tuple[str, str], dict[str, DeviceBuffer]] = {}
        self._estimates: dict[tuple, int] = {}
        self._functions: list[CompiledFunction] = []
        self._loaded: list[Loaded] = []
        self._buffers: "weakref.WeakSet[TensorProxy]" = weakref.WeakSet()

    @classmethod
    def switch_context(cls, context: "Context") -> None:
        cls._current = context

    @classmethod
    def current(cls) -> "Context | None":
        return cls._current

    def __repr__(self) -> str:
        return f"Context({self.device!r}{', invalidated' if self.invalidated else ''})"

    def _check(self) -> None:
        if self.invalidated:
            raise InvalidatedError("this Context was invalidated; create a new one")

    # ---- registration -------------------------------------------------------------------------

    def _register(self, t: torch.Tensor) -> None:
        self._check()
        name = get_tensor_name(t)
        if name is None:
            raise MLSDKError("name a tensor before registering it: set_tensor_name(t, name) or "
                             "set_tensor_name_in_module(model, prefix)")
        if name in self._registered and self._registered[name] is not t:
            raise MLSDKError(f"another tensor is already registered as {name!r}; give each model its own prefix")
        self._registered[name] = t
        self._name_by_id[id(t)] = name
        if not self.device.reference:  # registered again: the host value is the one to use from now on
            self._resident.refresh(name)

    def register_param(self, tensor: torch.Tensor) -> None:
        self._register(tensor)

    def register_buffer(self, tensor: torch.Tensor) -> None:
        self._register(tensor)

    def register_optimizer_buffers(self, optimizer: Any) -> None:
        self.registry.register(getattr(optimizer, "_mnsim_name", "optimizer"), optimizer)

    def is_registered(self, t: torch.Tensor) -> bool:
        return self._name_of(t) is not None

    def _name_of(self, t: torch.Tensor | None) -> str | None:
        if t is None:
            return None
        name = self._name_by_id.get(id(t))
        return name if name is not None and self._registered.get(name) is t else None

    def get_registered_value_proxy(self, tensor: torch.Tensor) -> TensorProxy:
        """The device handle of a registered tensor; `load_from` on it updates the device value."""
        self._check()
        name = self._name_of(tensor)
        if name is None:
            raise MLSDKError("this tensor is not registered in the Context (register_param / register_buffer)")
        if self.device.reference:  # the host tensor is the value: the handle views it
            return TensorProxy(self, _host_spec(name, tensor), host=tensor.detach(), registered=name,
                               on_write=lambda v: tensor.data.copy_(v))
        return self._resident.handle(name, lambda: self._wanted_spec(name, tensor))

    def _wanted_spec(self, name: str, tensor: torch.Tensor) -> tuple[IOSpec, int]:
        """The layout (and buffer size) the first compiled function that reads `name` wants, or a
        default DRAM layout when none does yet."""
        for fn in self._functions:
            if fn.compiled is not None and name in fn.compiled.resident:
                return fn.compiled.inputs[name], fn._need(name)
        return _default_spec(name, tensor, self.device.hw), 0

    def _adopt_resident(self, compiled: Compiled) -> dict[str, str]:
        """Bind a program's device-resident inputs to this Context's registered tensors; a name not
        registered here (a codegen_dir loaded without its model) is registered with the value the
        artifact carries, so later loads that name it share the same device copy."""
        for name, value in compiled.resident.items():
            if name not in self._registered:
                tensor = value.clone()
                set_tensor_name(tensor, name)
                self._register(tensor)
        return {name: name for name in compiled.resident}

    def synchronize(self) -> None:
        """Write the device values of registered tensors that programs or handles changed back
        into the host tensors."""
        self._check()
        if self.device.reference:
            return
        for name in self._resident.written_names():
            buf, spec = self._resident.any_copy(name)
            value, stats = self.device.board.download(buf, spec.dtype, tuple(spec.shape))
            self._record(DOWNLOAD, f"registered {name}", stats)
            with torch.no_grad():
                self._registered[name].copy_(value)
        self._resident.synced()

    def resident_bytes(self) -> int:
        """Bytes of device memory the registered tensors' copies hold (parameters, buffers,
        optimizer state, gradients kept for the host)."""
        return 0 if self.device.reference else self._resident.resident_bytes()

    def invalidate(self) -> None:
        """Release every device buffer of this Context; its proxies and functions stop working."""
        if not (self.invalidated or self.device.reference):
            board = self.device.board
            self._resident.free_all()
            for placed in self._conversion_buffers.values():
                for buf in placed.values():
                    board.free(buf)
            for loaded in self._loaded:
                board.unload(loaded)
            for proxy in list(self._buffers):
                if proxy._buffer is not None:
                    board.free(proxy._buffer)
        self.invalidated = True
        if Context._current is self:
            Context._current = None

    def report(self) -> "Report":
        """Where this Context's device cycles went so far (see mlsdk.report)."""
        from .report import build
        return build([self.session], f"Context on {self.device.name}")

    # ---- compiling ----------------------------------------------------------------------------

    def compile(self, function: Callable, inputs: Any, codegen_dir: str | os.PathLike, options: dict | None = None,
                cache_options: CacheOptions | None = None, training: bool | None = None,
                io_spec_constraints: dict[str, IOSpec] | None = None, export_kwargs: dict | None = None,
                num_compiler_threads: int = -1, quiet: bool = False, optimizers: Any = None) -> CompiledFunction:
        """Compile `function(inputs) -> dict of tensors` for this Context's device.

        A function that calls `backward()` (and an MNCore optimizer's `step()`) compiles into one
        training program: forward, backward and update, the registered tensors it writes updated
        on the device at every call. `training` defaults to detecting that; `training=False`
        refuses a function that computes gradients.

        `export_kwargs`, `num_compiler_threads`, `quiet` and `optimizers` are accepted as PFN's
        examples pass them and do not change what mnsim builds."""
        self._check()
        t0 = time.perf_counter()
        opts = options_mod.check(options)
        name = function_name(function)
        graph = self._trace(function, inputs, name, training)
        if self.device.reference:
            fn = self._reference_function(name, graph)
        else:
            compiled = self._compile_cached(graph, opts, io_spec_constraints or {}, cache_options)
            if codegen_dir is not None:
                artifact.save(compiled, os.fspath(codegen_dir))
            fn = CompiledFunction(self, name, compiled, resident=self._adopt_resident(compiled))
        self._functions.append(fn)
        self.session.compiles.append((name, time.perf_counter() - t0))
        trace.record_host(f"compile {name}", t0, "compile")
        return fn

    def _trace(self, function: Callable, inputs: Any, name: str, training: bool | None) -> Any:
        """The primitive graph of `function`, registered tensors as resident inputs. A function
        that computes gradients of registered parameters and applies no optimizer (the
        gradient-only pattern) accumulates them into `p.grad`, which is registered (as
        `<name>@grad`, zeros if it was None) so the device keeps it for `synchronize()`."""
        for t in list(self._registered.values()):  # gradients the host allocated: kept with their parameter
            if t.grad is not None:
                self._register_grad(t)
        with _grads_kept(self._registered.values()):
            graph = trace_graph(function, inputs, self._name_of, get_tensor_name)
        if training is False and graph.has_phase("backward"):
            line = next((n.source for n in graph.nodes if n.phase == "backward" and n.source), "")
            raise CompileError(f"{name}: training=False, but the function computes gradients (backward() or "
                               f"torch.autograd.grad)" + (f"\n  at {line}" if line else "")
                               + "; compile it with training=True or without the argument")
        got_grad = {id(t) for t in graph.gradients_left}
        left = [t for t in graph.resident.values() if id(t) in got_grad]
        if left and not graph.has_phase("optimizer"):
            if any(t.grad is not None for t in left):  # registered .grad replaced, not accumulated into
                raise CompileError(f"{name}: backward() leaves new gradients in .grad of "
                                   f"{', '.join(self._name_of(t) for t in left[:3])}: the function sets .grad "
                                   "to None first (zero_grad()); in a step without an optimizer, gradients "
                                   "accumulate into the registered p.grad: remove zero_grad() and zero them "
                                   "with get_registered_value_proxy(p.grad).load_from(...)")
            for t in left:
                t.grad = torch.zeros_like(t)
                self._register_grad(t)
            with _grads_kept(self._registered.values()):
                graph = trace_graph(function, inputs, self._name_of, get_tensor_name)
        return graph

    def _register_grad(self, t: torch.Tensor) -> None:
        if self._name_of(t.grad) is None:
            if get_tensor_name(t.grad) is None:
                set_tensor_name(t.grad, f"{self._name_of(t)}@grad")
            self._register(t.grad)

    def _compile_cached(self, graph: Any, opts: dict, constraints: dict, cache: CacheOptions | None) -> Compiled:
        hw = self.device.hw
        if cache is None or not cache.enable_app_cache:
            return compile_traced(graph, hw, options=opts, constraints=constraints)
        key = _cache_key(graph, opts, constraints, hw.fingerprint)
        where = Path(os.fspath(cache.cache_dir)) / key
        if (where / "manifest.json").exists():
            try:
                compiled = artifact.load(where, hw)
                compiled.resident = {k: t.detach() for k, t in graph.resident.items()}  # today's values
                return compiled
            except CompileError:
                shutil.rmtree(where, ignore_errors=True)  # a stale or broken entry is rebuilt
        compiled = compile_traced(graph, hw, options=opts, constraints=constraints)
        artifact.save(compiled, where)
        return compiled

    def _reference_function(self, name: str, graph: Any) -> CompiledFunction:
        """pfvm:cpu: torch runs the traced program, writing the registered host tensors."""
        updates = set(graph.update_outputs().values())
        specs_in = {k: _host_spec(k, v) for k, v in graph.inputs.items() if k not in graph.resident}
        specs_out = {k: _host_spec(k, v) for k, v in graph.outputs.items() if k not in updates}
        return CompiledFunction(self, name, None, reference=graph, specs=(specs_in, specs_out))

    def compile_automap(self, function: Callable, args: tuple, kwargs: dict, codegen_dir: str | os.PathLike,
                        options: dict | None = None, **compile_kwargs: Any) -> "AutomapFunction":
        """Compile a function of positional and keyword pytrees; call it with the same signature."""
        returns: list[bool] = []  # whether the traced call returned a dict

        def packed(d: dict) -> Any:
            result = function(*d["args"], **d["kwargs"])
            returns.append(isinstance(result, dict))
            return result if returns[-1] else {"result": result}
        packed.__name__ = function_name(function)
        fn = self.compile(packed, {"args": tuple(args), "kwargs": dict(kwargs)}, codegen_dir, options=options,
                          **compile_kwargs)
        return AutomapFunction(fn, single=not returns[-1])

    def load_codegen_dir(self, codegen_dir: str | os.PathLike) -> CompiledFunction:
        """A CompiledFunction from a codegen_dir written by compile (in this or another process)."""
        self._check()
        if self.device.reference:
            raise MLSDKError("pfvm:cpu runs the traced Python function; a codegen_dir holds a device program")
        compiled = artifact.load(os.fspath(codegen_dir), self.device.hw)
        fn = CompiledFunction(self, Path(os.fspath(codegen_dir)).name, compiled, resident=self._adopt_resident(compiled))
        self._functions.append(fn)
        return fn

    # ---- runtime helpers (used by CompiledFunction and TensorProxy) ---------------------------

    def _alloc(self, spec: IOSpec, need: int = 0) -> DeviceBuffer:
        return self.device.board.alloc(spec_placement(spec, self.device.hw), need)

    def _own(self, proxy: TensorProxy) -> None:
        """Free a proxy's buffer when the proxy is garbage (or when the Context is invalidated)."""
        self._buffers.add(proxy)
        weakref.finalize(proxy, self.device.board.free, proxy._buffer)

    def _load(self, fn: CompiledFunction) -> Loaded:
        loaded = self.device.board.load(fn.compiled)
        for stats in loaded.load_stats:
            self._record(LOAD, f"constants of {fn.name}", stats)
        self._loaded.append(loaded)
        return loaded

    def _record(self, kind: str, what: str, stats: Any, labels: list | None = None) -> None:
        """Every device run goes through here: into the session (reports) and the active trace."""
        self.session.runs.append(Run(kind, what, stats, labels or []))
        trace.record_run(what if kind in (CALL, BINDING) else f"{kind} {what}", stats, labels or [])

    def _download(self, proxy: TensorProxy) -> torch.Tensor:
        value, stats = self.device.board.download(proxy._buffer, proxy.spec.dtype, tuple(proxy.shape))
        self._record(DOWNLOAD, proxy.producer or "proxy", stats)
        return value

    def _upload_into(self, proxy: TensorProxy, value: torch.Tensor) -> None:
        stats = self.device.board.upload(proxy._buffer, value)
        self._record(UPLOAD, proxy.producer or "proxy", stats)

    def _conversion(self, src: IOSpec, dst: IOSpec) -> Conversion:
        """The DRAM-to-DRAM program that re-lays `src` as `dst`, built once per spec pair."""
        key = _pair_key(src, dst)
        if key not in self._conversions:
            self._conversions[key] = build_conversion(src, dst, self.device.hw)
        return self._conversions[key]

    def _conversion_constants(self, conv: Conversion) -> dict[str, int]:
        """The fill images a conversion reads, placed on the device once per conversion."""
        key = _pair_key(conv.src, conv.dst)
        if key not in self._conversion_buffers:
            board, placed = self.device.board, {}
            for symbol, buffer in conv.constants.items():
                placed[symbol] = board.alloc(buffer.placement, buffer.lw)
                if buffer.data is not None:
                    self._record(LOAD, f"constants of convert {conv.src.name}", board.upload(placed[symbol], buffer.data))
            self._conversion_buffers[key] = placed
        return {symbol: buf.address for symbol, buf in self._conversion_buffers[key].items()}

    def _estimate(self, kind: str, src: IOSpec, dst: IOSpec) -> int | None:
        """Cycles a conversion, or a host round trip (download + upload), would take: what a
        relocation saves. Only timed, never kept for running (a relocation builds no program)."""
        key = (kind, *_pair_key(src, dst))
        if key not in self._estimates:
            machine: Machine = self.device.board.machine
            board = self.device.board
            try:
                if kind == "conversion" and src.is_memcopyable_to(dst):  # what-if only: not kept
                    cycles = machine.time(build_conversion(src, dst, self.device.hw).program.code).total_cycles
                elif kind == "conversion":  # it will run: build it once, for both
                    cycles = machine.time(self._conversion(src, dst).program.code).total_cycles
                else:
                    down = board.transfer_program(spec_placement(src, self.device.hw), upload=False)
                    up = board.transfer_program(spec_placement(dst, self.device.hw), upload=True)
                    cycles = machine.time(down.code).total_cycles + machine.time(up.code).total_cycles
            except CompileError:
                cycles = None
            self._estimates[key] = cycles
        return self._estimates[key]

    def _bind_upload(self, fn: CompiledFunction, name: str, value: torch.Tensor, spec: IOSpec,
                     need: int) -> tuple[DeviceBuffer, Binding]:
        """A host tensor for an input: host link -> PDM0 -> DRAM, in the input's layout."""
        buf = self._alloc(spec, need)
        stats = self.device.board.upload(buf, value)
        self._record(BINDING, f"upload {fn.name}.{name}", stats)
        return buf, Binding(fn.name, name, "upload", stats.total_cycles, spec.size_bytes)

    def _bind_proxy(self, fn: CompiledFunction, name: str, proxy: TensorProxy, spec: IOSpec,
                    need: int) -> tuple[DeviceBuffer, Binding]:
        proxy._check()
        board = self.device.board
        if proxy._buffer is None:  # a reference-run value: upload it
            return self._bind_upload(fn, name, proxy.cpu(), spec, need)
        if proxy._context.device is not self.device:
            raise InputError(f"{fn.name}: input {name!r} is a proxy on {proxy._context.device.name}, not on "
                             f"{self.device.name}")
        conversion = self._estimate("conversion", proxy.spec, spec)
        host = self._estimate("host", proxy.spec, spec)
        if proxy.spec.is_memcopyable_to(spec) and proxy._buffer.lw >= need:
            return proxy._buffer, Binding(fn.name, name, "relocation", 0, 0, proxy.producer, conversion, host)
        where = f"{proxy.producer or 'proxy'} -> {fn.name}.{name}"
        if conversion is None:  # no conversion program for this pair: go through the host
            buf = self._alloc(spec, need)
            value, down = board.download(proxy._buffer, proxy.spec.dtype, tuple(proxy.shape))
            up = board.upload(buf, value)
            self._record(BINDING, f"host round trip {where} (download)", down)
            self._record(BINDING, f"host round trip {where} (upload)", up)
            return buf, Binding(fn.name, name, "host", down.total_cycles + up.total_cycles, spec.size_bytes,
                                proxy.producer, None, host)
        conv = self._conversion(proxy.spec, spec)
        buf = board.alloc(spec_placement(spec, self.device.hw), max(need, conv.dst_lw))
        scratch = board.machine.alloc_dram(conv.scratch_lw) if conv.scratch_lw else 0
        try:
            bases = {**conv.bases(proxy._buffer.address, buf.address, scratch), **self._conversion_constants(conv)}
            stats = board.machine.run(conv.program, bases=bases)
        finally:
            if conv.scratch_lw:
                board.machine.free_dram(scratch)
        self._record(BINDING, f"convert {where}", stats, conv.program.labels)
        advice = None
        if proxy._origin is not None:
            producer_fn, output = proxy._origin
            advice = (f"compile {producer_fn} with io_spec_constraints={{{output!r}: "
                      f"{fn.name}.input_specs[{name!r}]}} to relocate instead and save {stats.total_cycles} cycles")
        return buf, Binding(fn.name, name, "conversion", stats.total_cycles, spec.size_bytes, proxy.producer,
                            stats.total_cycles, host, advice)


class AutomapFunction:
    """A compile_automap result: called with the original positional and keyword arguments."""

    def __init__(self, fn: CompiledFunction, single: bool) -> None:
        self._fn, self._single = fn, single

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        out = self._fn({"args": tuple(args), "kwargs": dict(kwargs)})
        return out["result"] if self._single else out

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fn, name)


def _host_spec(name: str, v: Any) -> IOSpec:
    """IOSpecs of a reference (pfvm:cpu) function: host tensors, row-major."""
    shape = tuple(v.shape)
    dtype = getattr(v, "torch_dtype", "") or (v.dtype if isinstance(v.dtype, str) else str(v.dtype).replace("torch.", ""))
    layout = Layout.of([[Factor(s, None, 1)] for s in shape] or [[Factor(1, None, 1)]], shape or (1,))
    size = math.prod(shape) * TORCH_DTYPES[dtype].itemsize
    return IOSpec(name, shape, dtype, "host", layout, size, "pfvm", "pfvm")


def _default_spec(name: str, tensor: torch.Tensor, hw: Any) -> IOSpec:
    """A registered tensor's layout before any function asks for one: the first DRAM candidate."""
    if tensor.dtype not in DTYPES:
        raise MLSDKError(f"registered tensor {name!r} has dtype {tensor.dtype}; the device holds "
                         f"{', '.join(DTYPES.values())}")
    dtype = DTYPES[tensor.dtype]
    device_dtype = DEVICE_DTYPE[dtype]
    layout = candidates(tuple(tensor.shape) or (1,), device_dtype, hw, "DRAM")[0].layout
    return IOSpec.in_dram(name, tuple(tensor.shape), dtype, Placement(layout, hw, "DRAM", device_dtype))


def function_name(function: Callable) -> str:
    """How reports name a compiled function: its name, or where a lambda was written."""
    name = getattr(function, "__name__", type(function).__name__)
    code = getattr(function, "__code__", None)
    if name == "<lambda>" and code is not None:
        return f"lambda@{os.path.basename(code.co_filename)}:{code.co_firstlineno}"
    return name


def _pair_key(src: IOSpec, dst: IOSpec) -> tuple[str, str]:
    """Conversions depend on the layouts, not on the IO names."""
    return layout_key(src), layout_key(dst)


def _cache_key(graph: Any, opts: dict, constraints: dict, fingerprint: str) -> str:
    """Resident inputs are in the signature by name and shape; constants also by value."""
    h = hashlib.sha256()
    h.update(json.dumps([fingerprint, opts, sorted((k, v.to_json()) for k, v in constraints.items())],
                        sort_keys=True, default=str).encode())
    h.update(graph.signature().encode())
    for c in graph.constants:
        h.update(f"const {c.shape} {c.dtype}".encode())
        h.update(c.data.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:24]


@contextlib.contextmanager
def _grads_kept(tensors: Any) -> Iterator[None]:
    """Tracing runs `zero_grad()` and `backward()`: the host tensors' `.grad` stay as they were."""
    kept = [(t, t.grad) for t in list(tensors)]
    try:
        yield
    finally:
        for t, grad in kept:
            if t.grad is not grad:
                t.grad = grad


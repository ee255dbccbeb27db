"""`Context`: compiles functions for a device and runs them, keeping registered tensors there.

The MLSDK-compatible facade over a `runtime.Runtime`, which owns what the Context holds on the
device (registered tensors' copies, loaded programs, conversion programs, call outputs) and the
session record that reports read. The Context names and registers tensors, traces and compiles
functions (reusing the compile cache), and hands everything that runs to the runtime.
`Context.switch_context(ctx)` makes a context current, as in MLSDK.

Calls and compiles may come from several threads: compiles of one Context run one at a time,
calls hold the device's lock, so each gives the values it would give alone.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
import threading
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

import torch

from compiler import artifact
from compiler.compile import Compiled, compile_traced
from compiler.errors import ArtifactError, CompileError, UnregisteredWriteError
from compiler.frontend import trace as trace_graph
from compiler.frontend.random import DeviceGenerator
from compiler.iospec import IOSpec
from runtime import Executable, Run, Runtime, Session, host_spec
from runtime.session import CALL, BINDING, io_layouts

from . import optim
from . import options as options_mod
from . import trace
from .collector import collector_held
from .device import MNDevice
from .errors import ArgumentError, MLSDKError, NameTakenError, OptionError, RegistrationError
from .function import AutomapFunction, CompiledFunction
from .optim import MNCoreOptimizer
from .naming import (get_tensor_name, optimizer_prefix, optimizer_tensors, set_buffer_name_in_optimizer,
                     set_tensor_name, set_tensor_name_in_module)
from .proxy import TensorProxy

GENERATOR_NAME = "mnsim@generator"  # the registered name of a Context's device generator state (seed, calls)

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
                self._context.register_buffer(t)
        elif isinstance(obj, torch.optim.Optimizer):
            set_buffer_name_in_optimizer(obj, name, only_unnamed=True)  # names given before are kept
            for _, t in optimizer_tensors(obj):
                self._context.register_buffer(t)
        else:
            raise ArgumentError(f"registry.register takes an nn.Module or an optimizer, got {type(obj).__name__}")


class Context:
    _current: "Context | None" = None

    def __init__(self, device: MNDevice) -> None:
        if not isinstance(device, MNDevice):
            raise ArgumentError(f"Context takes an MNDevice, got {type(device).__name__}")
        self.device = device
        hw = device.hw
        self.runtime = Runtime(None if device.reference else device.board, device.chip, device.name,
                               hw.clock_hz if hw else 0)
        self.runtime.observers.append(_trace_run)
        self.registry = Registry(self)
        self._functions: list[CompiledFunction] = []
        self._compiling = threading.RLock()  # one compile at a time: registration and tracing are shared
        # random numbers drawn on the device (dropout, rand, ...): its state is registered on first use
        self.generator = DeviceGenerator(self._register_generator)

    @classmethod
    def switch_context(cls, context: "Context") -> None:
        if context is not None and not isinstance(context, Context):
            raise ArgumentError(f"switch_context takes a Context (or None), got {type(context).__name__} "
                                f"{context!r:.60}")
        cls._current = context

    @classmethod
    def current(cls) -> "Context | None":
        return cls._current

    @property
    def session(self) -> Session:
        """What ran so far: compiles, device runs in order, calls and their input bindings."""
        return self.runtime.session

    @property
    def invalidated(self) -> bool:
        return self.runtime.invalidated

    @property
    def functions(self) -> list[CompiledFunction]:
        """The functions compiled or loaded in this Context, in order."""
        return list(self._functions)

    def __repr__(self) -> str:
        return f"Context({self.device!r}, #{self.runtime.id}{', invalidated' if self.invalidated else ''})"

    # ---- registration -------------------------------------------------------------------------

    def register_buffer(self, tensor: torch.Tensor) -> None:
        """Keep a named tensor on the device between calls (registered again: its host value is sent)."""
        self.runtime.check()
        if not isinstance(tensor, torch.Tensor):
            raise ArgumentError(f"{self.runtime.label}: register takes a torch.Tensor, got {type(tensor).__name__}")
        name = get_tensor_name(tensor)
        if name is None:
            raise RegistrationError(f"{self.runtime.label}: name a tensor before registering it: "
                                    "set_tensor_name(t, name) or set_tensor_name_in_module(model, prefix)")
        self.runtime.register(name, tensor)

    register_param = register_buffer

    def register_optimizer_buffers(self, optimizer: Any) -> None:
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise ArgumentError(f"{self.runtime.label}: register_optimizer_buffers takes an optimizer, got "
                                f"{type(optimizer).__name__}" + (" (register a module's tensors with "
                                "register_param / register_buffer)" if isinstance(optimizer, torch.nn.Module) else ""))
        try:
            self.registry.register(optimizer_prefix(optimizer), optimizer)
        except NameTakenError as e:
            raise NameTakenError(f"{e}: name each optimizer's state apart with "
                                 "set_buffer_name_in_optimizer(optimizer, prefix) before registering it") from None

    def _register_generator(self, state: torch.Tensor) -> torch.Tensor:
        """Keep the device generator's state (seed, calls) on the device as a registered buffer;
        the state a reloaded program brought (`load_codegen_dir`) is kept instead, if there is one."""
        if GENERATOR_NAME in self.runtime.resident:
            return self.runtime.resident.tensor(GENERATOR_NAME)
        set_tensor_name(state, GENERATOR_NAME)
        self.runtime.register(GENERATOR_NAME, state)
        return state

    def is_registered(self, t: torch.Tensor) -> bool:
        return self.runtime.resident.name_of(t) is not None

    def get_registered_value_proxy(self, tensor: torch.Tensor) -> TensorProxy:
        """The device handle of a registered tensor; `load_from` on it updates the device value."""
        self.runtime.check()
        if self.device.reference:  # the host tensor is the value: the handle views it
            name = self.runtime.resident.name_of(tensor)
            if name is None:
                raise RegistrationError(f"{self.runtime.label}: this tensor is not registered (register_param / "
                                        "register_buffer)")
            return TensorProxy(self.runtime, host_spec(name, tensor), host=tensor.detach(),
                               on_write=lambda v: tensor.data.copy_(v))
        value = self.runtime.handle(tensor)
        return TensorProxy(self.runtime, value.spec, value=value)

    def _adopt_resident(self, compiled: Compiled) -> None:
        """A codegen_dir's device-resident inputs not registered here (loaded without its model)
        are registered with the values the artifact carries, so later loads share the copy."""
        for name, value in compiled.resident.items():
            if name not in self.runtime.resident:
                tensor = value.clone()
                set_tensor_name(tensor, name)
                self.runtime.register(name, tensor)
                continue
            mine, spec = self.runtime.resident.tensor(name), compiled.inputs[name]
            if tuple(mine.shape) != tuple(spec.shape) or str(mine.dtype).replace("torch.", "") != spec.dtype:
                raise RegistrationError(f"{self.runtime.label}: registered tensor {name!r} is "
                                        f"{str(mine.dtype).replace('torch.', '')}{list(mine.shape)}, but the program "
                                        f"reads it as {spec.dtype}{list(spec.shape)}")

    def synchronize(self) -> None:
        """Write the device values of registered tensors that programs or handles changed back
        into the host tensors."""
        self.runtime.synchronize()

    def resident_bytes(self) -> int:
        """Bytes of device memory the registered tensors' copies hold (parameters, buffers,
        optimizer state, gradients kept for the host)."""
        return self.runtime.resident_bytes()

    def invalidate(self) -> None:
        """Release every device buffer of this Context; its proxies and functions stop working."""
        self.runtime.invalidate()
        if Context._current is self:
            Context._current = None

    def report(self) -> "Report":
        """Where this Context's device cycles went so far (see mlsdk.report): `total_cycles`,
        `runs`, `ops`, `bindings` (with each hand-over's whole-chain figures), `chains`, ..."""
        from .report import build
        return build([self.session], self.runtime.label)

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
        examples pass them and do not change what mnsim builds, except the legacy torch.onnx
        training path (`options={"backprop": True}` with `optimizers=[torch.optim...]`, where
        the compiler adds the backward and the update), which is refused: ignoring it would
        compile the loss alone."""
        self.runtime.check()
        t0 = time.perf_counter()
        _check_arguments(function, codegen_dir, cache_options, training, io_spec_constraints)
        opts = options_mod.check(options)
        legacy = [type(o).__name__ for o in (optimizers or []) if not isinstance(o, MNCoreOptimizer)]
        if (options or {}).get("backprop") or legacy:
            raise OptionError(f"{self.runtime.label}: the legacy torch.onnx training path ("
                              + ("options['backprop']" if (options or {}).get("backprop") else "")
                              + (" and " if (options or {}).get("backprop") and legacy else "")
                              + (f"optimizers={legacy}" if legacy else "") + ") is not simulated; write the step "
                              "as the fx2onnx path does: loss.backward() and an MNCore optimizer's step() inside "
                              "the compiled function")
        mode = options_mod.simulation_mode(options)
        constraints = dict(io_spec_constraints or {})
        name = function_name(function)
        with self._compiling, collector_held(), _noted(f"while compiling {name} in {self.runtime.label}"):
            with optim.recording_steps() as stepped:
                graph = self._trace(function, inputs, name, training)
            if self.device.reference:
                fn = self._reference_function(name, graph)
                if codegen_dir is not None:
                    artifact.save_reference(graph, os.fspath(codegen_dir))
            else:
                compiled = self._compile_cached(graph, opts, constraints, cache_options)
                if codegen_dir is not None:
                    artifact.save(compiled, os.fspath(codegen_dir))
                self._adopt_resident(compiled)
                executable = self.runtime.add(Executable(name, compiled, options=opts, constraints=constraints,
                                                         mode=mode))
                fn = CompiledFunction(self.runtime, executable.name, executable)
                self.session.layouts.update(io_layouts(executable.name, compiled.inputs, compiled.outputs))
            fn.runs_steps_of(stepped)
            self._functions.append(fn)
            self.session.compiles.append((name, time.perf_counter() - t0))
        trace.record_host(f"compile {name}", t0, "compile")
        return fn

    def _trace(self, function: Callable, inputs: Any, name: str, training: bool | None) -> Any:
        """The primitive graph of `function`, registered tensors as resident inputs. A function
        that computes gradients of registered parameters and applies no optimizer (the
        gradient-only pattern), or steps without ever clearing some of them (no zero_grad: torch
        adds each call's gradients to the last's), accumulates them into `p.grad`, which is
        registered (as `<name>@grad`, zeros if it was None) so the device keeps it."""
        resident = self.runtime.resident
        for t in resident.tensors():  # gradients the host allocated: kept with their parameter
            if t.grad is not None:
                self._register_grad(t)
        graph = self._trace_registering(function, inputs, name)
        if training is False and (graph.has_phase("backward") or graph.gradients_left):  # (a gradient-only
            # step's backward has no reader before its gradients are registered: the nodes were dropped)
            line = next((n.source for n in graph.nodes if n.phase == "backward" and n.source), "")
            raise CompileError(f"{name}: training=False, but the function computes gradients (backward() or "
                               f"torch.autograd.grad)" + (f"\n  at {line}" if line else "")
                               + "; compile it with training=True or without the argument")
        got_grad = {id(t) for t in graph.gradients_left}
        left = [t for t in graph.resident.values() if id(t) in got_grad]
        stepped = graph.has_phase("optimizer")
        if stepped:  # a step that never clears some gradients: they add up over calls, as torch's
            left = [t for t in left if id(t) not in graph.zeroed]
        elif any(t.grad is not None for t in left):  # registered .grad replaced, not accumulated into
            raise CompileError(f"{name}: backward() leaves new gradients in .grad of "
                               f"{', '.join(resident.name_of(t) for t in left[:3])}: the function sets .grad "
                               "to None first (zero_grad()); in a step without an optimizer, gradients "
                               "accumulate into the registered p.grad: remove zero_grad() and zero them "
                               "with get_registered_value_proxy(p.grad).load_from(...)")
        if left:  # kept on the device as `<name>@grad`, from zeros
            for t in left:
                t.grad = torch.zeros_like(t)
                self._register_grad(t)
            graph = self._trace_registering(function, inputs, name)
        return graph

    def _trace_registering(self, function: Callable, inputs: Any, name: str) -> Any:
        """The traced graph; named tensors the function writes without their being registered (a
        BatchNorm's running statistics when only the parameters were, as PFN's run_timm.py does)
        are registered, with a warning, and the function traced again: the device keeps their new
        values, as torch keeps them in the module."""
        resident = self.runtime.resident
        try:
            with _grads_kept(resident.tensors()):
                return trace_graph(function, inputs, resident.name_of, get_tensor_name, self.generator)
        except UnregisteredWriteError as e:
            names = [get_tensor_name(t) for t in e.tensors]
            for t in e.tensors:
                self.register_buffer(t)
        warnings.warn(f"{name}: registered {len(names)} tensor(s) the function writes ({', '.join(names[:3])}"
                      f"{', ...' if len(names) > 3 else ''}): the device keeps their values between calls and "
                      "synchronize() writes them back; register them before compiling to silence this",
                      stacklevel=4)
        with _grads_kept(resident.tensors()):
            return trace_graph(function, inputs, resident.name_of, get_tensor_name, self.generator)

    def _register_grad(self, t: torch.Tensor) -> None:
        resident = self.runtime.resident
        if resident.name_of(t.grad) is None:
            if get_tensor_name(t.grad) is None:
                set_tensor_name(t.grad, f"{resident.name_of(t)}@grad")
            self.register_buffer(t.grad)

    def _compile_cached(self, graph: Any, opts: dict, constraints: dict, cache: CacheOptions | None) -> Compiled:
        hw = self.device.hw
        if cache is None or not cache.enable_app_cache:
            return compile_traced(graph, hw, options=opts, constraints=constraints)
        key = _cache_key(graph, opts, constraints, hw.fingerprint)
        where = Path(os.fspath(cache.cache_dir)) / key
        if where.exists():
            try:
                compiled = artifact.load(where, hw)
                compiled.resident = {k: t.detach() for k, t in graph.resident.items()}  # today's values
                compiled.graph = graph  # what-if variants can be compiled from it
                return compiled
            except ArtifactError:  # a stale, broken or foreign entry is rebuilt (the cache is mnsim's)
                if where.is_dir():
                    shutil.rmtree(where, ignore_errors=True)
                else:
                    where.unlink(missing_ok=True)
        compiled = compile_traced(graph, hw, options=opts, constraints=constraints)
        artifact.save(compiled, where)
        return compiled

    def _load_reference(self, codegen_dir: str | os.PathLike) -> CompiledFunction:
        """pfvm:cpu's load_codegen_dir: the traced program a pfvm:cpu compile wrote. Its registered
        tensors are this Context's where it has them by name (the loader registered the model
        first), else registered with the values the directory carries."""
        graph, calling = artifact.load_reference(os.fspath(codegen_dir))
        for name, value in graph.resident.items():
            if name in self.runtime.resident:
                graph.resident[name] = self.runtime.resident.tensor(name)
            else:
                set_tensor_name(value, name)
                self.runtime.register(name, value)
        fn = self._reference_function(Path(os.fspath(codegen_dir)).name, graph)
        self._functions.append(fn)
        return AutomapFunction(fn, single=calling["single"]) if calling is not None else fn

    def _reference_function(self, name: str, graph: Any) -> CompiledFunction:
        """pfvm:cpu: torch runs the traced program, writing the registered host tensors."""
        updates = set(graph.update_outputs().values())
        specs_in = {k: host_spec(k, v) for k, v in graph.inputs.items() if k not in graph.resident}
        specs_out = {k: host_spec(k, v) for k, v in graph.outputs.items() if k not in updates}
        return CompiledFunction(self.runtime, name, reference=graph, specs=(specs_in, specs_out))

    def compile_automap(self, function: Callable, args: tuple, kwargs: dict | None, codegen_dir: str | os.PathLike,
                        options: dict | None = None, **compile_kwargs: Any) -> AutomapFunction:
        """Compile a function of positional and keyword pytrees; call it with the same signature.
        Its codegen_dir records that calling convention, so load_codegen_dir gives it back."""
        if not isinstance(args, (tuple, list)):
            raise ArgumentError(f"compile_automap takes the positional arguments as a tuple, not {type(args).__name__}")
        if kwargs is not None and not isinstance(kwargs, dict):
            raise ArgumentError(f"compile_automap takes the keyword arguments as a dict (or None), not "
                                f"{type(kwargs).__name__}")
        returns: list[bool] = []  # whether the traced call returned a dict

        def packed(d: dict) -> Any:
            result = function(*d["args"], **d["kwargs"])
            returns.append(isinstance(result, dict))
            return result if returns[-1] else {"result": result}
        packed.__name__ = function_name(function)
        fn = self.compile(packed, {"args": tuple(args), "kwargs": dict(kwargs or {})}, None, options=options,
                          **compile_kwargs)
        automap = AutomapFunction(fn, single=not returns[-1])
        if codegen_dir is not None and fn.compiled is not None:
            artifact.save(dataclasses.replace(fn.compiled, summary={**fn.compiled.summary, "calling": automap.calling}),
                          os.fspath(codegen_dir))
        elif codegen_dir is not None:  # pfvm:cpu
            artifact.save_reference(fn.reference_graph, os.fspath(codegen_dir), automap.calling)
        return automap

    def load_codegen_dir(self, codegen_dir: str | os.PathLike) -> CompiledFunction:
        """A CompiledFunction from a codegen_dir written by compile (in this or another process)."""
        self.runtime.check()
        if not isinstance(codegen_dir, (str, os.PathLike)):
            raise ArgumentError(f"load_codegen_dir takes a directory path, got {type(codegen_dir).__name__}")
        if self.device.reference:
            return self._load_reference(codegen_dir)
        compiled = artifact.load(os.fspath(codegen_dir), self.device.hw)
        name = Path(os.fspath(codegen_dir)).name
        self._adopt_resident(compiled)
        executable = self.runtime.add(Executable(name, compiled, constraints=compiled.constraints))
        fn = CompiledFunction(self.runtime, executable.name, executable)
        self.session.layouts.update(io_layouts(executable.name, compiled.inputs, compiled.outputs))
        self._functions.append(fn)
        calling = compiled.summary.get("calling")
        return AutomapFunction(fn, single=calling["single"]) if calling is not None else fn


def function_name(function: Callable) -> str:
    """How reports name a compiled function: its name, or where a lambda was written."""
    name = getattr(function, "__name__", type(function).__name__)
    code = getattr(function, "__code__", None)
    if name == "<lambda>" and code is not None:
        return f"lambda@{os.path.basename(code.co_filename)}:{code.co_firstlineno}"
    return name


def _trace_run(run: Run) -> None:
    """A device run into the active trace (mlsdk.trace), named as reports name it."""
    trace.record_run(run.what if run.kind in (CALL, BINDING) else f"{run.kind} {run.what}", run.stats, run.labels)


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
def _noted(note: str) -> Iterator[None]:
    """Errors raised inside carry `note` (shown under the message): which function, which Context."""
    try:
        yield
    except MLSDKError as e:
        e.add_note(note)
        raise


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


def _check_arguments(function: Any, codegen_dir: Any, cache_options: Any, training: Any,
                     io_spec_constraints: Any) -> None:
    """compile's arguments of the wrong type, refused before they reach the compiler (a string
    for cache_options failed on a missing attribute, a number for codegen_dir inside os.fspath)."""
    if not callable(function):
        raise ArgumentError(f"compile takes a function (or nn.Module) to compile, not {type(function).__name__} "
                            f"{function!r:.60}")
    if io_spec_constraints is not None and not isinstance(io_spec_constraints, dict):
        raise ArgumentError(f"io_spec_constraints must be a dict of input or output name -> IOSpec (such as "
                            f"{{'x': other.output_specs['y']}}), not {type(io_spec_constraints).__name__}")
    if codegen_dir is not None and not isinstance(codegen_dir, (str, os.PathLike)):
        raise ArgumentError(f"codegen_dir must be a path (str or os.PathLike) or None, not "
                            f"{type(codegen_dir).__name__} {codegen_dir!r:.60}")
    if cache_options is not None and not isinstance(cache_options, CacheOptions):
        raise ArgumentError(f"cache_options must be an mlsdk.CacheOptions or None, not "
                            f"{type(cache_options).__name__} {cache_options!r:.60}")
    if training is not None and not isinstance(training, bool):
        raise ArgumentError(f"training must be True, False or None, not {type(training).__name__} {training!r:.60}")

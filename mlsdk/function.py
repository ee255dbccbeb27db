"""`CompiledFunction`: calling a compiled program with tensors and proxies.

The facade over a runtime `Executable`: it checks a call's inputs against the input specs
(names, shapes, dtypes), hands host tensors and proxies' device values to the runtime, and
returns the outputs as TensorProxies in the structure the traced function returned. How each
input was bound (upload, relocation, conversion, host round trip) and what the call cost is
recorded in the Context's session; `last_call` is this function's latest record.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import torch
from torch.utils import _pytree as pytree

from compiler.compile import Compiled
from compiler.frontend import key_name
from compiler.frontend.complex_pairs import device_form
from compiler.frontend.mappings import register_mappings
from compiler.iospec import IOSpec
from runtime import TORCH_DTYPES, Call, Executable, Runtime, run_reference

from . import optim, trace
from .errors import ArgumentError, InputError
from .proxy import TensorProxy


class CompiledFunction:
    def __init__(self, runtime: Runtime, name: str, executable: Executable | None = None, *,
                 reference: Any = None, specs: tuple[dict, dict] | None = None) -> None:
        self._runtime = runtime
        self.name = name
        self._executable = executable
        self._last = threading.local()  # each thread's latest call of this function
        self._reference = reference  # pfvm:cpu: the traced graph, run by torch
        self._stepped: list[torch.optim.Optimizer] = []  # optimizers whose step() each call runs
        if executable is not None:
            self._inputs, self._outputs = executable.input_specs, executable.output_specs
        else:
            self._inputs, self._outputs = specs

    def runs_steps_of(self, optimizers: Any) -> None:
        """Each call runs these optimizers' step() (traced into the program): torch is told after
        every call, as its own step() would (`optim.mark_stepped`)."""
        self._stepped = list(optimizers)

    @property
    def input_specs(self) -> dict[str, IOSpec]:
        return dict(self._inputs)

    @property
    def output_specs(self) -> dict[str, IOSpec]:
        return dict(self._outputs)

    @property
    def compiled(self) -> Compiled | None:
        return self._executable.compiled if self._executable is not None else None

    @property
    def reference_graph(self) -> Any:
        """The traced graph torch runs (None unless this is a pfvm:cpu reference function)."""
        return self._reference

    @property
    def executable(self) -> Executable | None:
        """The runtime's program (None for a pfvm:cpu reference function)."""
        return self._executable

    @property
    def last_call(self) -> Call | None:
        """This function's latest call record (in this thread, when threads call it): `.cycles`
        (the program), `.cycles_with_bindings` (its input bindings too), `.bindings` (how each
        input was bound), `.stats` (RunStats)."""
        mine = getattr(self._last, "call", None)
        if mine is not None or self._executable is None:
            return mine
        return next((c for c in reversed(self._runtime.session.calls) if c.function_id == self._executable.id), None)

    @property
    def last_cycles(self) -> int | None:
        """Simulated cycles of this function's latest call (its program), None before the first;
        DeviceError when that call ran in functional mode (simulation_mode='functional')."""
        call = self.last_call
        return call.cycles if call is not None else None

    def __repr__(self) -> str:
        return f"CompiledFunction({self.name!r} in {self._runtime.label}, inputs {list(self._inputs)})"

    def allocate_input_proxy(self) -> dict[str, TensorProxy]:
        """A device buffer for every input, to be filled with `load_from` and passed to a call."""
        self._runtime.check()
        if self._reference is not None:
            return {name: TensorProxy(self._runtime, spec, host=torch.zeros(spec.shape, dtype=TORCH_DTYPES[spec.dtype]))
                    for name, spec in self._inputs.items()}
        return {name: TensorProxy(self._runtime, spec, value=self._runtime.allocate(self._executable, name))
                for name, spec in self._inputs.items()}

    # ---- calls --------------------------------------------------------------------------------

    def __call__(self, inputs: Any) -> Any:
        self._runtime.check()
        t0 = time.perf_counter()
        values = self._flatten(inputs)
        if any(isinstance(v, torch._subclasses.FakeTensor) for v in values.values()):
            raise ArgumentError(f"{self.name} is called inside a function being compiled: a compiled function "
                                "runs on the device and cannot be traced into another; call the Python function "
                                "it was compiled from instead")
        if self._reference is not None:
            host = {k: v.cpu() if isinstance(v, TensorProxy) else v for k, v in values.items()}
            results = run_reference(self._reference, host)
            proxies = [TensorProxy(self._runtime, self._outputs[name], host=results[name]) for name in self._outputs]
            out_spec = self._reference.out_spec
        else:
            self._send_rates()
            device = {k: self._device_input(k, v) for k, v in values.items()}
            outputs, self._last.call = self._runtime.call(self._executable, device)
            proxies = [TensorProxy(self._runtime, self._outputs[name], value=outputs[name]) for name in self._outputs]
            out_spec = self._executable.compiled.out_spec
        optim.mark_stepped(self._stepped)
        trace.record_host(f"call {self.name}", t0, "call")
        if out_spec is None:
            return dict(zip(self._outputs, proxies))
        return pytree.tree_unflatten(proxies, out_spec)

    def _send_rates(self) -> None:
        """Learning rates changed on the host (mlsdk.optim: `group["lr"] = x`, a torch scheduler's
        step) into the device copies of this Context, before the step reads them."""
        for rate in optim.changed_rates():
            if self._runtime.resident.name_of(rate) is not None:
                handle = self._runtime.handle(rate)
                TensorProxy(self._runtime, handle.spec, value=handle).load_from(rate)
                optim.sent(rate)

    def _device_input(self, name: str, value: Any) -> Any:
        if not isinstance(value, TensorProxy):
            return value
        value.check()
        if value.device_value is None:  # a reference-run value: uploaded like a host tensor
            return value.cpu()
        return value.device_value

    def _flatten(self, inputs: Any) -> dict[str, Any]:
        register_mappings(inputs)
        leaves, _ = pytree.tree_flatten_with_path(inputs, is_leaf=lambda x: isinstance(x, TensorProxy))
        # a complex tensor is passed as the device holds it, its view_as_real form (compiled so)
        values = {key_name(path): device_form(leaf) if isinstance(leaf, torch.Tensor) else leaf
                  for path, leaf in leaves}
        missing = [k for k in self._inputs if k not in values]
        extra = [k for k in values if k not in self._inputs]
        if missing or extra:
            parts = ([f"missing {', '.join(map(repr, missing))}"] if missing else []) + \
                    ([f"unexpected {', '.join(map(repr, extra))}"] if extra else [])
            raise InputError(f"{self.name} ({self._runtime.label}): {'; '.join(parts)}; it takes "
                             f"{', '.join(map(repr, self._inputs))}")
        for name, value in values.items():
            spec = self._inputs[name]
            if not isinstance(value, (torch.Tensor, TensorProxy)):
                raise InputError(f"{self.name} ({self._runtime.label}): input {name!r} is a {type(value).__name__}; "
                                 f"expected a tensor or a TensorProxy for {spec}")
            if tuple(value.shape) != tuple(spec.shape) or value.dtype != TORCH_DTYPES[spec.dtype]:
                raise InputError(f"{self.name} ({self._runtime.label}): input {name!r} is "
                                 f"{_dtype_name(value.dtype)}{list(value.shape)}; expected "
                                 f"{spec.dtype}{list(spec.shape)} ({spec})")
        return values


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


class AutomapFunction(CompiledFunction):
    """A compile_automap result: the compiled function of {"args": ..., "kwargs": ...}, called
    with the original positional and keyword arguments (and a lone tensor back when the function
    returned one)."""

    def __init__(self, fn: CompiledFunction, single: bool) -> None:
        self.__dict__.update(fn.__dict__)  # the same program, runtime and call records
        self._single = single

    @property
    def calling(self) -> dict:
        """The calling convention a codegen_dir records (summary.json) for load_codegen_dir."""
        return {"automap": True, "single": self._single}

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        out = super().__call__({"args": tuple(args), "kwargs": dict(kwargs)})
        return out["result"] if self._single else out

"""`CompiledFunction`: calling a compiled program with tensors and proxies.

Each input is bound one of three ways, recorded with its cycles (and, for proxies, the cycles of
the alternatives):

* a host tensor is uploaded: host link -> PDM0 -> each Group's DRAM, in the input's layout;
* a proxy whose spec is memcopyable to the input's is relocated: the program reads the
  producer's buffer, nothing moves;
* any other proxy is converted by a DRAM-to-DRAM program (built once per spec pair).

Outputs come back as TensorProxies in fresh device buffers.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import torch
from torch.utils import _pytree as pytree

from compiler.compile import Compiled
from compiler.device import DeviceBuffer, Loaded
from compiler.frontend import key_name
from compiler.iospec import IOSpec

from . import trace
from .errors import InputError
from .proxy import TORCH_DTYPES, TensorProxy
from .session import CALL, Binding, Call

if TYPE_CHECKING:
    from .context import Context


class CompiledFunction:
    def __init__(self, context: "Context", name: str, compiled: Compiled | None, *, reference: Any = None,
                 resident: dict[str, str] | None = None, specs: tuple[dict, dict] | None = None) -> None:
        self._context = context
        self.name = name
        self._compiled = compiled
        self._reference = reference  # pfvm:cpu: the traced graph, run by torch
        self._resident = resident or {}  # input name -> registered tensor name
        self._loaded: Loaded | None = None
        if specs is not None:
            self._inputs, self._outputs = specs
        else:
            self._inputs = {k: v for k, v in compiled.inputs.items() if k not in self._resident}
            updates = set(compiled.updates.values())
            self._outputs = {k: v for k, v in compiled.outputs.items() if k not in updates}

    @property
    def input_specs(self) -> dict[str, IOSpec]:
        return dict(self._inputs)

    @property
    def output_specs(self) -> dict[str, IOSpec]:
        return dict(self._outputs)

    @property
    def compiled(self) -> Compiled | None:
        return self._compiled

    def __repr__(self) -> str:
        return f"CompiledFunction({self.name!r} on {self._context.device.name}, inputs {list(self._inputs)})"

    def allocate_input_proxy(self) -> dict[str, TensorProxy]:
        """A device buffer for every input, to be filled with `load_from` and passed to a call."""
        self._context._check()
        out = {}
        for name, spec in self._inputs.items():
            if self._reference is not None:
                out[name] = TensorProxy(self._context, spec, host=torch.zeros(spec.shape, dtype=TORCH_DTYPES[spec.dtype]))
            else:
                buf = self._context._alloc(spec, self._need(name))
                out[name] = TensorProxy(self._context, spec, buffer=buf, producer=f"{self.name}.allocate_input_proxy")
                self._context._own(out[name])
        return out

    def _need(self, name: str) -> int:
        c = self._compiled
        return c.buffers[c.input_symbols[name]].lw

    # ---- calls --------------------------------------------------------------------------------

    def __call__(self, inputs: Any) -> Any:
        self._context._check()
        t0 = time.perf_counter()
        values = self._flatten(inputs)
        if self._reference is not None:
            result = self._call_reference(values)
        else:
            result = self._call_device(values)
        trace.record_host(f"call {self.name}", t0, "call")
        return result

    def _flatten(self, inputs: Any) -> dict[str, Any]:
        leaves, _ = pytree.tree_flatten_with_path(inputs, is_leaf=lambda x: isinstance(x, TensorProxy))
        values = {key_name(path): leaf for path, leaf in leaves}
        missing = [k for k in self._inputs if k not in values]
        extra = [k for k in values if k not in self._inputs]
        if missing or extra:
            parts = ([f"missing {', '.join(map(repr, missing))}"] if missing else []) + \
                    ([f"unexpected {', '.join(map(repr, extra))}"] if extra else [])
            raise InputError(f"{self.name}: {'; '.join(parts)}; it takes {', '.join(map(repr, self._inputs))}")
        for name, value in values.items():
            spec = self._inputs[name]
            if not isinstance(value, (torch.Tensor, TensorProxy)):
                raise InputError(f"{self.name}: input {name!r} is a {type(value).__name__}; expected a tensor or a "
                                 f"TensorProxy for {spec}")
            if tuple(value.shape) != tuple(spec.shape) or value.dtype != TORCH_DTYPES[spec.dtype]:
                raise InputError(f"{self.name}: input {name!r} is {_dtype_name(value.dtype)}{list(value.shape)}; "
                                 f"expected {spec.dtype}{list(spec.shape)} ({spec})")
        return values

    def _call_reference(self, values: dict[str, Any]) -> Any:
        graph = self._reference
        host = {**values, **graph.resident}  # the traced program writes the registered host tensors
        flat = [host[name].cpu() if isinstance(host[name], TensorProxy) else host[name] for name in graph.inputs]
        with torch.no_grad():
            results = graph.module(*flat)
        proxies = [TensorProxy(self._context, self._outputs[name], host=r.detach().clone())
                   for name, r in zip(graph.outputs, results) if name in self._outputs]
        return pytree.tree_unflatten(proxies, graph.out_spec)

    def _call_device(self, values: dict[str, Any]) -> Any:
        ctx, compiled = self._context, self._compiled
        board = ctx.device.board
        if self._loaded is None:
            self._loaded = ctx._load(self)
        bound: dict[str, DeviceBuffer] = {}
        temporary: list[DeviceBuffer] = []
        bindings: list[Binding] = []
        first_run = len(ctx.session.runs)
        try:
            for name, value in values.items():
                buf, binding = self._bind(name, value, self._inputs[name])
                bound[name] = buf
                bindings.append(binding)
                if binding.path != "relocation":
                    temporary.append(buf)
            for name, registered in self._resident.items():
                buf, binding = ctx._resident.bind(self, name, registered, compiled.inputs[name], self._need(name))
                bound[name] = buf
                bindings.append(binding)
            into = {out: bound[name] for name, out in compiled.updates.items()  # written in place when it fits
                    if out in compiled.donated and bound[name].lw >= compiled.buffers[compiled.output_symbols[out]].lw}
            outputs, stats = board.call(self._loaded, bound, into)
        finally:  # inputs uploaded or converted for this call only, also when a later one fails
            for buf in temporary:
                board.free(buf)
        for name, out in compiled.updates.items():  # the state the step leaves: its one device copy
            ctx._resident.replace(self._resident[name], outputs.pop(out), compiled.inputs[name])
        ctx._record(CALL, self.name, stats, compiled.program.labels)
        ctx.session.resident_bytes = ctx.resident_bytes()
        ctx.session.calls.append(Call(self.name, stats, compiled.program.labels, bindings,
                                      ctx.session.runs[first_run:], compiled.phases))
        proxies = [TensorProxy(ctx, compiled.outputs[name], buffer=outputs[name], producer=f"{self.name}.{name}",
                               shape=compiled.output_shapes[name], origin=(self.name, name))
                   for name in self._outputs]
        for p in proxies:
            ctx._own(p)
        if compiled.out_spec is None:
            return dict(zip(compiled.outputs, proxies))
        return pytree.tree_unflatten(proxies, compiled.out_spec)

    def _bind(self, name: str, value: Any, spec: IOSpec) -> tuple[DeviceBuffer, Binding]:
        ctx = self._context
        need = self._need(name)
        if isinstance(value, TensorProxy):
            return ctx._bind_proxy(self, name, value, spec, need)
        return ctx._bind_upload(self, name, value, spec, need)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")

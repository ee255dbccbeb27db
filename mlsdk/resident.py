"""Device copies of registered tensors (parameters, buffers): uploaded once, kept between calls.

A registered tensor has one copy per layout that some compiled function reads it in: the first
copy is uploaded from the host, any other is converted from an existing copy on the device once
and kept, so functions that disagree on a weight's layout do not convert it on every call.
Writing a tensor makes the written copy the only one and drops the others: a training step
leaving its new parameters and optimizer state (`replace`), or a handle's
`get_registered_value_proxy(t).load_from(...)` (`written`). Written tensors are the ones
`Context.synchronize()` downloads.
"""

from __future__ import annotations

import json
import weakref
from typing import TYPE_CHECKING, Callable

from compiler.device import DeviceBuffer, spec_placement
from compiler.iospec import IOSpec

from .proxy import TensorProxy
from .session import UPLOAD, Binding

if TYPE_CHECKING:
    from .context import Context
    from .function import CompiledFunction


def layout_key(spec: IOSpec) -> str:
    """What makes two copies interchangeable: everything but the IO name (as is_memcopyable_to)."""
    d = spec.to_json()
    d.pop("name")
    d.pop("lm_layout")
    return json.dumps(d, sort_keys=True)


class ResidentTensors:
    def __init__(self, context: "Context") -> None:
        self._ctx = context
        self._copies: dict[str, dict[str, tuple[DeviceBuffer, IOSpec]]] = {}  # name -> layout key -> copy
        self._handles: dict[str, "weakref.WeakSet[TensorProxy]"] = {}
        self._dirty: set[str] = set()

    def names(self) -> list[str]:
        return list(self._copies)

    def written_names(self) -> list[str]:
        """Tensors whose device value a program or handle wrote since the last `synced()`."""
        return [name for name in self._dirty if name in self._copies]

    def synced(self) -> None:
        self._dirty.clear()

    def resident_bytes(self) -> int:
        """Bytes of the device copies (every layout) of registered tensors."""
        return sum(spec.size_bytes for copies in self._copies.values() for _, spec in copies.values())

    def any_copy(self, name: str) -> tuple[DeviceBuffer, IOSpec]:
        return next(iter(self._copies[name].values()))

    def handle(self, name: str, wanted: Callable[[], tuple[IOSpec, int]]) -> TensorProxy:
        """A proxy on the device copy of `name` (uploaded in the wanted layout if there is none)."""
        if name not in self._copies:
            spec, need = wanted()
            self._upload(name, spec, need)
        buf, spec = self.any_copy(name)
        proxy = TensorProxy(self._ctx, spec, buffer=buf, producer=f"registered {name}", registered=name)
        self._handles.setdefault(name, weakref.WeakSet()).add(proxy)
        return proxy

    def bind(self, fn: "CompiledFunction", input_name: str, name: str, spec: IOSpec,
             need: int) -> tuple[DeviceBuffer, Binding]:
        """The copy of `name` in `spec`'s layout for a call: relocated if it exists, else made from
        another copy by a conversion (recorded as this binding), else uploaded from the host."""
        copies = self._copies.get(name)
        if not copies:
            self._upload(name, spec, need)
            copies = self._copies[name]
        key = layout_key(spec)
        if key in copies and copies[key][0].lw >= need:
            return copies[key][0], Binding(fn.name, input_name, "relocation", 0, 0, f"registered {name}")
        buf, stored = self.any_copy(name)
        source = TensorProxy(self._ctx, stored, buffer=buf, producer=f"registered {name}")
        new_buf, binding = self._ctx._bind_proxy(fn, input_name, source, spec, need)
        if key in copies:  # too small for this program: replace it
            self._ctx.device.board.free(copies[key][0])
        copies[key] = (new_buf, spec)
        return new_buf, binding

    def written(self, handle: TensorProxy) -> None:
        """`handle`'s copy was overwritten: it is now the only one, and every handle shows it."""
        self.replace(handle._registered, handle._buffer, handle.spec)

    def replace(self, name: str, buf: DeviceBuffer, spec: IOSpec) -> None:
        """`buf` (in `spec`'s layout) holds the new value of `name`: the only copy from now on,
        shown by every handle; the other copies are freed (a buffer written in place stays)."""
        board = self._ctx.device.board
        for old, _ in self._copies.get(name, {}).values():
            if old is not buf:
                board.free(old)
        self._copies[name] = {layout_key(spec): (buf, spec)}
        self._dirty.add(name)
        for other in self._handles.get(name, ()):
            other._buffer, other._spec, other._cache = buf, spec, None

    def refresh(self, name: str) -> None:
        """Upload the host tensor of `name` into its device copies (it was registered again)."""
        if name not in self._copies:
            return
        buf, spec = self.any_copy(name)
        ctx = self._ctx
        stats = ctx.device.board.upload(buf, ctx._registered[name].detach())
        ctx._record(UPLOAD, f"registered {name}", stats)
        self.replace(name, buf, spec)
        self._dirty.discard(name)

    def free_all(self) -> None:
        board = self._ctx.device.board
        for copies in self._copies.values():
            for buf, _ in copies.values():
                board.free(buf)
        self._copies.clear()

    def _upload(self, name: str, spec: IOSpec, need: int) -> None:
        ctx = self._ctx
        board = ctx.device.board
        buf = board.alloc(spec_placement(spec, ctx.device.hw), need)
        stats = board.upload(buf, ctx._registered[name].detach())
        ctx._record(UPLOAD, f"registered {name}", stats)
        self._copies[name] = {layout_key(spec): (buf, spec)}

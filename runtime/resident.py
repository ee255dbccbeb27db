"""Registered tensors (parameters, buffers, optimizer state) and their device copies, by name.

A registered tensor has one copy per layout that some compiled function reads it in: the first
copy is uploaded from the host, any other is converted from an existing copy on the device once
and kept, so functions that disagree on a weight's layout do not convert it on every call.
Writing a tensor makes the written copy the only one and drops the others: a training step
leaving its new parameters and optimizer state (`replace`), or a handle's `load_from`
(`written`). Written tensors are the ones `Context.synchronize()` downloads.

A copy uploaded from the host holds zeros in its layout's padding; one a program wrote or a
conversion made may hold anything there. A program that reads a tensor's padding as zeros (a
registered weight whose padded channels a convolution sums, `Compiled.clean_inputs`)
is bound a copy whose padding was zeroed on the device when it may not be, once per write.
"""

from __future__ import annotations

import weakref
from typing import Callable, Iterator

import torch

from compiler.frontend.complex_pairs import device_form
from compiler.iospec import IOSpec

from .binder import RELOCATION, Binder, Bound
from .conversions import layout_key
from .device import BOTH, DeviceBuffer
from .errors import NameTakenError, RegistrationError
from .memory import allocating
from .session import DOWNLOAD, UPLOAD, Binding, Run
from .value import DeviceValue


class ResidentTensors:
    def __init__(self, binder: Binder | None, record: Callable[[Run], None], owner: str = "") -> None:
        self._binder = binder  # None on a reference device: names and host tensors only
        self._device = binder.device if binder is not None else None
        self._record = record
        self._owner = owner
        self._tensors: dict[str, torch.Tensor] = {}  # as the device holds them (complex_pairs.device_form)
        self._registered: dict[str, torch.Tensor] = {}  # as registered (identity: `name_of`)
        self._name_by_id: dict[int, str] = {}
        self._copies: dict[str, dict[str, tuple[DeviceBuffer, IOSpec]]] = {}  # name -> layout key -> copy
        self._handles: dict[str, "weakref.WeakSet[DeviceValue]"] = {}
        self._dirty: set[str] = set()
        self._unclean: set[tuple[str, str]] = set()  # (name, layout key) of copies whose padding may not be zero

    # ---- the host tensors ---------------------------------------------------------------------

    def register(self, name: str, tensor: torch.Tensor) -> None:
        """Keep `tensor` as `name`; registered again, its host value replaces the device copies."""
        if name in self._registered and self._registered[name] is not tensor:
            raise NameTakenError(f"another tensor is already registered as {name!r}; give each model its own "
                                 "prefix")
        held = device_form(tensor)
        if name in self._copies:
            _, spec = self.any_copy(name)
            if tuple(held.shape) != tuple(spec.shape):
                raise RegistrationError(f"{name!r} is registered with shape {list(spec.shape)} and programs read it "
                                        f"so; registered again with shape {list(held.shape)}, it would not fit "
                                        "them: register the new tensor under another name, in a new Context")
        self._tensors[name], self._registered[name] = held, tensor
        self._name_by_id[id(tensor)] = name
        if name in self._copies:
            self.refresh(name)

    def name_of(self, tensor: torch.Tensor | None) -> str | None:
        """The name `tensor` is registered as here, or None."""
        if tensor is None:
            return None
        name = self._name_by_id.get(id(tensor))
        return name if name is not None and self._registered.get(name) is tensor else None

    def tensor(self, name: str) -> torch.Tensor:
        """The host tensor of `name` as the device holds it (complex_pairs.device_form)."""
        return self._tensors[name]

    def tensors(self) -> Iterator[torch.Tensor]:
        """The tensors as registered (their `.grad` is the host's)."""
        return iter(list(self._registered.values()))

    def __contains__(self, name: str) -> bool:
        return name in self._tensors

    # ---- device copies ------------------------------------------------------------------------

    def has_copy(self, name: str) -> bool:
        return name in self._copies

    def written_names(self) -> list[str]:
        """Tensors whose device value a program or handle wrote since the last `synced()`."""
        return [name for name in self._dirty if name in self._copies]

    def synced(self) -> None:
        self._dirty.clear()

    def held_lw(self) -> dict[str, int]:
        """Long words (per Group) of DRAM each registered tensor's device copies hold."""
        return {name: sum(buf.lw for buf, _ in copies.values()) for name, copies in self._copies.items() if copies}

    def resident_bytes(self) -> int:
        """Bytes of the device copies (every layout) of registered tensors."""
        return sum(spec.size_bytes for copies in self._copies.values() for _, spec in copies.values())

    def any_copy(self, name: str) -> tuple[DeviceBuffer, IOSpec]:
        return next(iter(self._copies[name].values()))

    def handle(self, name: str, spec: IOSpec, need: int) -> DeviceValue:
        """A device value on the copy of `name` (uploaded in `spec`'s layout if there is none)."""
        if name not in self._copies:
            self._upload(name, spec, need)
        buf, stored = self.any_copy(name)
        value = DeviceValue(buf, stored, tuple(stored.shape), f"registered {name}", registered=name,
                            owner=self._owner, device_id=id(self._device))
        self._handles.setdefault(name, weakref.WeakSet()).add(value)
        return value

    def bind(self, consumer: str, input_name: str, name: str, spec: IOSpec, need: int, mode: str = BOTH,
             clean: bool = False) -> Bound:
        """The copy of `name` in `spec`'s layout for a call: relocated if it exists, else made from
        another copy by a conversion (recorded as this binding), else uploaded from the host. With
        `clean`, a copy whose padding holds zeros: one whose padding may not is copied on the
        device with its padding zeroed first (recorded as this binding), and kept instead."""
        copies = self._copies.get(name)
        if not copies:
            self._upload(name, spec, need)
            copies = self._copies[name]
        key = layout_key(spec)
        if key in copies and copies[key][0].lw >= need and not (clean and (name, key) in self._unclean):
            return Bound(copies[key][0], Binding(consumer, input_name, RELOCATION, 0, 0, f"registered {name}"), False)
        buf, stored = copies[key] if key in copies and clean else self.any_copy(name)
        source = DeviceValue(buf, stored, tuple(stored.shape), f"registered {name}")
        with allocating(f"a copy of registered tensor {name!r} in the layout {consumer} reads ({spec.size_bytes} "
                        "bytes)"):
            bound = self._binder.bind_value(consumer, input_name, source, spec, need, mode, zero_pad=clean)
        if clean:
            self._unclean.discard((name, key))
        else:
            self._unclean.add((name, key))  # (a conversion writes no padding of its own)
        if key in copies:  # too small for this program, or its padding not zero: replace it (handles follow)
            old = copies[key][0]
            for handle in self._handles.get(name, ()):
                if handle.buffer is old:
                    handle.show(bound.buffer, spec)
            self._device.free(old)
        copies[key] = (bound.buffer, spec)
        return Bound(bound.buffer, bound.binding, False)  # kept as a copy, not freed after the call

    def written(self, value: DeviceValue, uploaded: bool = False) -> None:
        """`value`'s copy was overwritten (`uploaded`: from the host, its padding zero): it is now
        the only one, and every handle shows it."""
        self.replace(value.registered, value.buffer, value.spec)
        if uploaded:
            self._unclean.discard((value.registered, layout_key(value.spec)))

    def replace(self, name: str, buf: DeviceBuffer, spec: IOSpec) -> None:
        """`buf` (in `spec`'s layout) holds the new value of `name`: the only copy from now on,
        shown by every handle; the other copies are freed (a buffer written in place stays)."""
        for old, _ in self._copies.get(name, {}).values():
            if old is not buf:
                self._device.free(old)
        self._copies[name] = {layout_key(spec): (buf, spec)}
        self._dirty.add(name)
        self._unclean = {u for u in self._unclean if u[0] != name} | {(name, layout_key(spec))}
        for handle in self._handles.get(name, ()):
            handle.show(buf, spec)

    def refresh(self, name: str) -> None:
        """Upload the host tensor of `name` into its device copies (it was registered again)."""
        buf, spec = self.any_copy(name)
        stats = self._device.upload(buf, self._tensors[name].detach(), name=name)
        self._record(Run(UPLOAD, f"registered {name}", stats))
        self.replace(name, buf, spec)
        self._dirty.discard(name)
        self._unclean.discard((name, layout_key(spec)))

    def download_written(self) -> None:
        """Write the device values of tensors that programs or handles changed into the host tensors."""
        for name in self.written_names():
            buf, spec = self.any_copy(name)
            value, stats = self._device.download(buf, spec.dtype, tuple(spec.shape), f"registered tensor {name!r}")
            self._record(Run(DOWNLOAD, f"registered {name}", stats))
            with torch.no_grad():
                self._tensors[name].copy_(value)
        self.synced()

    def free_all(self) -> None:
        for copies in self._copies.values():
            for buf, _ in copies.values():
                self._device.free(buf)
        self._copies.clear()

    def _upload(self, name: str, spec: IOSpec, need: int) -> None:
        with allocating(f"the device copy of registered tensor {name!r} ({spec.size_bytes} bytes)"):
            buf = self._binder.alloc(spec, need)
        try:
            stats = self._device.upload(buf, self._tensors[name].detach(), name=name)
        except BaseException:
            self._device.free(buf)
            raise
        self._record(Run(UPLOAD, f"registered {name}", stats))
        self._copies[name] = {layout_key(spec): (buf, spec)}
        self._unclean = {u for u in self._unclean if u[0] != name}

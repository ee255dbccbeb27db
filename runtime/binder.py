"""Binding a call's inputs to device buffers, each by the path it takes.

* a host tensor is uploaded: host link -> PDM0 -> each Group's DRAM, in the input's layout;
* a device value whose spec is memcopyable to the input's is relocated: the program reads the
  producer's buffer, nothing moves;
* any other device value is converted by a DRAM-to-DRAM program (built once per layout pair),
  or, when no conversion program exists for the pair, goes through the host (download, upload).

Each returns the buffer and a `Binding` record with its cycles; whether the buffer is the call's
own (to free after the call) is `Bound.temporary`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from compiler.errors import CompileError, LayoutError
from compiler.iospec import IOSpec

from .conversions import Conversions
from .device import BOTH, TIMING, Device, DeviceBuffer, spec_placement
from .memory import allocating
from .session import BINDING, Binding, Run, cycles
from .value import DeviceValue

RELOCATION, UPLOAD_PATH, CONVERSION, HOST = "relocation", "upload", "conversion", "host"


@dataclass
class Bound:
    buffer: DeviceBuffer
    binding: Binding
    temporary: bool  # a buffer made for this call (upload, conversion), freed after it


class Binder:
    def __init__(self, device: Device, conversions: Conversions, record: Callable[[Run], None]) -> None:
        self.device = device
        self.conversions = conversions
        self._record = record

    def alloc(self, spec: IOSpec, need: int = 0) -> DeviceBuffer:
        return self.device.alloc(spec_placement(spec, self.device.hw), need)

    def upload(self, consumer: str, input_name: str, value: torch.Tensor, spec: IOSpec, need: int,
               mode: str = BOTH) -> Bound:
        """A host tensor for an input, in the input's layout."""
        with allocating(f"input {input_name!r} of {consumer} ({spec.size_bytes} bytes, uploaded)"):
            buf = self.alloc(spec, need)
        try:
            stats = self.device.upload(buf, value, name=f"{consumer} input {input_name!r}", mode=mode)
        except BaseException:
            self.device.free(buf)
            raise
        self._record(Run(BINDING, f"upload {consumer}.{input_name}", stats))
        return Bound(buf, Binding(consumer, input_name, UPLOAD_PATH, cycles(stats), spec.size_bytes), True)

    def bind_value(self, consumer: str, input_name: str, value: DeviceValue, spec: IOSpec, need: int,
                   mode: str = BOTH, zero_pad: bool = False) -> Bound:
        """A device value for an input: relocated when its layout already serves, else converted.
        With `zero_pad` always converted (or through the host), into a copy whose padding holds
        zeros: for a program that reads the input's padding as zeros."""
        producer = value.producer
        if not zero_pad and value.spec.is_memcopyable_to(spec) and value.buffer.lw >= need:
            return Bound(value.buffer, Binding(consumer, input_name, RELOCATION, 0, 0, producer), False)
        where = f"{producer or 'proxy'} -> {consumer}.{input_name}"
        try:
            conversion = self.conversions.program(value.spec, spec, zero_pad)
        except (CompileError, LayoutError):  # no program for the pair (uploads write zero padding)
            return self._host_round_trip(consumer, input_name, value, spec, need, where, mode)
        with allocating(f"input {input_name!r} of {consumer} ({spec.size_bytes} bytes, converted from "
                        f"{producer or 'a proxy'})"):
            buf = self.alloc(spec, max(need, conversion.dst_lw))
        try:
            stats = self.conversions.run(value.spec, value.buffer, spec, buf, mode, zero_pad)
        except BaseException:
            self.device.free(buf)
            raise
        self._record(Run(BINDING, f"{conversion.action} {where}", stats, conversion.program.labels))
        return Bound(buf, Binding(consumer, input_name, CONVERSION, cycles(stats), spec.size_bytes, producer), True)

    def _host_round_trip(self, consumer: str, input_name: str, value: DeviceValue, spec: IOSpec, need: int,
                         where: str, mode: str) -> Bound:
        if not value.buffer.valid:  # no values to carry: time both transfers
            mode = TIMING
        host, down = self.device.download(value.buffer, value.spec.dtype, value.shape, mode=mode)
        with allocating(f"input {input_name!r} of {consumer} ({spec.size_bytes} bytes, from "
                        f"{value.producer or 'a proxy'} through the host)"):
            buf = self.alloc(spec, need)
        try:
            up = self.device.upload(buf, host, mode=mode)
        except BaseException:
            self.device.free(buf)
            raise
        self._record(Run(BINDING, f"host round trip {where} (download)", down))
        self._record(Run(BINDING, f"host round trip {where} (upload)", up))
        both = None if down is None or up is None else down.total_cycles + up.total_cycles
        return Bound(buf, Binding(consumer, input_name, HOST, both, spec.size_bytes, value.producer), True)

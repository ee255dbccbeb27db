"""A simulated chip that runs compiled functions: buffers, host transfers, loading and calls.

Host data reaches a tensor's DRAM layout the way it does on the board: the host arranges the
tensor into the layout's per-Group DRAM image (what MLSDK's host side does during upload), DMA
copies the image over the host link into Group 0's PDM, and MV instructions move it on to each
Group's DRAM, double-buffered in the driver's PDM window. Download is the reverse. Both are
programs on the simulator, so their cycles come from the YAML like any other.
"""

from __future__ import annotations

import functools
import gc
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch

from hwdesc import HwDesc
from sim import Machine, RunStats
from sim.errors import DeviceMemoryError

from compiler.compile import Compiled
from compiler.dtypes import DEVICE_DTYPE, INT32_MAX, INT32_MIN, TORCH_DTYPES
from compiler.iospec import IOSpec
from compiler.layout import Placement
from compiler.layout.hostio import gather, scatter
from compiler.transfer.host import host_transfer

from .errors import DeviceError, InputError
from .host_images import HostImages
from .host_outputs import HostOutputs
from .memory import allocating

# Simulation modes (sim.RunMode): timing only, data and timing, data only (a run returns no RunStats)
TIMING, BOTH, FUNCTIONAL = "timing", "both", "functional"


@dataclass(eq=False)
class DeviceBuffer:
    """A region of every Group's DRAM holding one tensor in a DRAM placement."""

    address: int
    placement: Placement
    lw: int
    freed: bool = False
    valid: bool = True  # False once a timing-only run wrote it: it holds no values
    # returns the region to the device when the buffer is collected unfreed (Device._buffer)
    release: weakref.finalize | None = field(default=None, repr=False)


def check_host_value(tensor: torch.Tensor, dtype: str, name: str = "tensor") -> None:
    """Refuse a host tensor the device cannot hold as `dtype` (an IOSpec dtype): integers must fit
    the device's int32 (class labels held as int64 by torch do), and its elements must be on the
    host, stored densely (a meta tensor has none, a sparse one is not strided)."""
    if tensor.layout != torch.strided or tensor.device.type != "cpu":
        raise InputError(f"{name} is a {str(tensor.layout).replace('torch.', '')} tensor on {tensor.device}; the "
                         "device takes dense (strided) CPU tensors: pass .to_dense() or .cpu() of it")
    check_int_range(tensor, DEVICE_DTYPE.get(dtype, dtype), name)


def check_int_range(tensor: torch.Tensor, device_dtype: str, name: str) -> None:
    t = tensor.detach()
    if device_dtype == "int32" and t.dtype == torch.int64 and t.numel():
        low, high = int(t.min()), int(t.max())
        if low < INT32_MIN or high > INT32_MAX:
            raise InputError(f"{name} holds integers from {low} to {high}; the device's integers are int32 "
                             f"({INT32_MIN} .. {INT32_MAX})")


def to_bits(tensor: torch.Tensor, device_dtype: str, hw: HwDesc, name: str = "tensor") -> np.ndarray:
    """Host tensor -> the raw bits of its elements in the device's formats."""
    check_int_range(tensor, device_dtype, name)
    t = tensor.detach().cpu()
    if device_dtype == "float16":
        from sim.numerics import HalfCodec
        return HalfCodec.of(hw).encode(t.float().numpy())
    if device_dtype == "float32":
        return np.ascontiguousarray(t.float().numpy()).view(np.uint32)
    return np.ascontiguousarray(t.to(torch.int32).numpy()).view(np.uint32)


def from_bits(bits: np.ndarray, dtype: str, hw: HwDesc, *, owned: bool = False) -> torch.Tensor:
    """A host tensor of the logical `dtype` from raw bits; `owned` bits (an array nothing else
    holds) become the tensor's storage instead of being copied."""
    if dtype == "float16":
        from sim.numerics import HalfCodec
        return torch.from_numpy(HalfCodec.of(hw).decode(bits)).to(torch.float16)
    if dtype in ("float32", "bool", "float64"):  # float64: computed and held in float32
        t = torch.from_numpy(bits.view(np.float32) if owned else bits.view(np.float32).copy())
        return t != 0 if dtype == "bool" else t.double() if dtype == "float64" else t
    t = torch.from_numpy(bits.view(np.int32) if owned else bits.view(np.int32).copy())
    return t if dtype == "int32" else t.to(TORCH_DTYPES[dtype])  # int64, uint8, int8, int16 held as int32


@dataclass
class Loaded:
    """A compiled program resident on a device: its constants and temporaries allocated."""

    compiled: Compiled
    resident: dict[str, DeviceBuffer] = field(default_factory=dict)
    load_stats: list[RunStats] = field(default_factory=list)
    bases: dict[str, int] = field(default_factory=dict)  # symbol -> DRAM address (constants, temporaries)
    scratch: DeviceBuffer | None = None


def locked(method: Callable) -> Callable:
    """Run a Device method holding the device's lock."""
    @functools.wraps(method)
    def wrapper(self: "Device", *args: Any, **kwargs: Any) -> Any:
        with self.lock:
            return method(self, *args, **kwargs)
    return wrapper


class Device:
    """The simulated chip: its machine state, DRAM buffers, host transfers and program calls.
    Every method that touches the machine holds `lock`."""

    def __init__(self, hw: HwDesc) -> None:
        self.hw = hw
        self.machine = Machine(hw)
        self.params = self.machine.params
        # One machine state: whoever runs a program, moves data or (de)allocates holds this, so
        # calls from several threads (or Contexts sharing a device) run one after another.
        self.lock = threading.RLock()
        self.images = HostImages(self.params.words_per_lw)
        self.outputs = HostOutputs()
        # Regions of buffers collected without being freed (a Context dropped without
        # invalidate(), with its functions and values): returned to the allocator at the next
        # allocation, under the lock, not from the collector, which may run in the middle of one.
        self._dropped: list[int] = []

    def _buffer(self, lw: int, placement: Placement | None) -> DeviceBuffer:
        """A new buffer of `lw` long words whose region comes back when nothing holds it any more."""
        self._free_dropped()
        try:
            address = self.machine.alloc_dram(lw)
        except DeviceMemoryError:  # buffers only a reference cycle still holds may be garbage: collect, retry
            gc.collect()
            self._free_dropped()
            address = self.machine.alloc_dram(lw)
        buf = DeviceBuffer(address, placement, lw)
        buf.release = weakref.finalize(buf, self._dropped.append, buf.address)
        return buf

    def _free_dropped(self) -> None:
        while self._dropped:
            self.machine.free_dram(self._dropped.pop())

    # ---- buffers ----------------------------------------------------------------------------

    @locked
    def alloc(self, placement: Placement, lw: int = 0) -> DeviceBuffer:
        """A buffer for a tensor in `placement`, of at least `lw` long words (what programs touch)."""
        lw = max(1, placement.span_lw, lw)
        return self._buffer(lw, placement)

    @locked
    def free(self, buf: DeviceBuffer) -> None:
        if not buf.freed:
            if buf.release is not None:
                buf.release.detach()
            self.machine.free_dram(buf.address)
            buf.freed = True

    @locked
    def allocated_lw(self) -> int:
        """Long words of DRAM (per Group) held by live buffers, loaded programs and temporaries."""
        self._free_dropped()
        return self.machine.dram.used

    # ---- host transfers ---------------------------------------------------------------------

    def transfer_program(self, placement: Placement, upload: bool):
        return host_transfer(placement, upload)

    def host_image(self, placement: Placement, upload: bool) -> np.ndarray:
        """The host-side image of a tensor in `placement` (what upload fills and download reads),
        reused from the last transfer in that placement (runtime.host_images)."""
        return self.images.image(placement, upload)

    @locked
    def upload(self, buf: DeviceBuffer, values: torch.Tensor | np.ndarray, *, dtype: str | None = None,
               name: str = "tensor", mode: str = BOTH) -> RunStats | None:
        """Host tensor -> device buffer, over the host link. `values` may already be raw bits.
        In timing mode only the transfer is timed; the buffer then holds no values. In functional
        mode nothing is timed (None)."""
        placement = buf.placement
        image = self.host_image(placement, upload=True)
        if mode != TIMING:
            bits = values if isinstance(values, np.ndarray) else to_bits(values, placement.dtype, self.hw, name)
            scatter(placement, bits.reshape(placement.layout.shape), image)
        program = self.transfer_program(placement, upload=True)
        stats = self.machine.run(program, host=[image], bases={"tensor": buf.address}, mode=mode)
        buf.valid = mode != TIMING
        return stats

    @locked
    def download(self, buf: DeviceBuffer, dtype: str, shape: tuple[int, ...], what: str = "a tensor",
                 mode: str = BOTH) -> tuple[torch.Tensor | None, RunStats | None]:
        """Device buffer -> host tensor of the logical `dtype` and `shape`, over the host link.
        In timing mode only the transfer is timed (no tensor), in functional mode not at all."""
        if mode == TIMING:
            stats = self.machine.run(self.transfer_program(buf.placement, upload=False),
                                     host=[self.host_image(buf.placement, upload=False)],
                                     bases={"tensor": buf.address}, mode=TIMING)
            return None, stats
        if not buf.valid:
            raise DeviceError(f"{what} has no values: a timing-only run (simulation_mode='timing') computed it, "
                              "so only its cycles exist; compile with simulation_mode 'both' to read values")
        placement = buf.placement
        image = self.host_image(placement, upload=False)
        program = self.transfer_program(placement, upload=False)
        stats = self.machine.run(program, host=[image], bases={"tensor": buf.address}, mode=mode)
        bits = gather(placement, image, into=self.outputs.array)  # an array nothing else holds: the tensor's
        return from_bits(np.ascontiguousarray(bits), dtype, self.hw, owned=True).reshape(shape), stats

    # ---- programs ---------------------------------------------------------------------------

    @locked
    def load(self, compiled: Compiled) -> Loaded:
        """Allocate a program's constants and its scratch region (where its temporaries live, each
        at the offset compiler.schedule gave it) and upload the constants."""
        loaded = Loaded(compiled)
        scratch = None
        if compiled.scratch_lw:
            with allocating("the program's temporaries (its scratch region)"):
                scratch = self._buffer(compiled.scratch_lw, None)
            loaded.scratch = scratch
        for symbol, buf in compiled.buffers.items():
            if buf.role == "temp":
                loaded.bases[symbol] = scratch.address + buf.offset
            elif buf.role in ("const", "fill"):
                with allocating(f"the program's constant {symbol!r}"):
                    loaded.resident[symbol] = self.alloc(buf.placement, buf.lw)
                loaded.bases[symbol] = loaded.resident[symbol].address
                if buf.data is not None:
                    data = buf.data
                    bits = data if isinstance(data, np.ndarray) else to_bits(data, buf.placement.dtype, self.hw)
                    loaded.load_stats.append(self.upload(loaded.resident[symbol], bits))
        return loaded

    @locked
    def unload(self, loaded: Loaded) -> None:
        for buf in loaded.resident.values():
            self.free(buf)
        if loaded.scratch is not None:
            self.free(loaded.scratch)

    @locked
    def call(self, loaded: Loaded, inputs: dict[str, DeviceBuffer], into: dict[str, DeviceBuffer] | None = None,
             mode: str = BOTH) -> tuple[dict[str, DeviceBuffer], RunStats | None]:
        """Run a loaded program on bound input buffers; outputs get fresh buffers, except those
        named in `into` (a donated input's buffer, written in place). Outputs hold values when
        the run moved data and every input held values. No RunStats in functional mode."""
        compiled = loaded.compiled
        bases = dict(loaded.bases)
        for name, symbol in compiled.input_symbols.items():
            need = compiled.buffers[symbol].lw
            if inputs[name].lw < need:
                raise InputError(f"input {name!r}: its buffer holds {inputs[name].lw} long words per Group; the program "
                                 f"reads {need}")
            bases[symbol] = inputs[name].address
        outputs: dict[str, DeviceBuffer] = {}
        fresh: list[DeviceBuffer] = []
        try:
            for name, symbol in compiled.output_symbols.items():
                buf = (into or {}).get(name)
                if buf is not None and buf.lw < compiled.buffers[symbol].lw:
                    raise InputError(f"output {name!r}: the buffer given holds {buf.lw} long words per Group; the "
                                     f"program writes {compiled.buffers[symbol].lw}")
                if buf is None:
                    with allocating(f"output {name!r}"):
                        buf = self.alloc(compiled.buffers[symbol].placement, compiled.buffers[symbol].lw)
                    fresh.append(buf)
                outputs[name] = buf
                bases[symbol] = buf.address
            stats = self.machine.run(compiled.program, bases=bases, mode=mode)
        except BaseException:  # a failed call leaves no output buffers behind
            for buf in fresh:
                self.free(buf)
            raise
        valid = mode != TIMING and all(buf.valid for buf in inputs.values())
        for buf in outputs.values():
            buf.valid = valid
        return outputs, stats

    @locked
    def execute(self, compiled: Compiled, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Upload, load, run and download in one go (tests and quick checks)."""
        loaded = self.load(compiled)
        bufs = {}
        for name, spec in compiled.inputs.items():
            bufs[name] = self.alloc(spec.placement(self.hw, DEVICE_DTYPE[spec.dtype]),
                                    compiled.buffers[compiled.input_symbols[name]].lw)
            self.upload(bufs[name], inputs[name], name=name)
        outputs, _ = self.call(loaded, bufs)
        result = {}
        for name, buf in outputs.items():
            spec = compiled.outputs[name]
            result[name], _ = self.download(buf, spec.dtype, compiled.output_shapes[name])
        for buf in [*bufs.values(), *outputs.values()]:
            self.free(buf)
        self.unload(loaded)
        return result


def spec_placement(spec: IOSpec, hw: HwDesc) -> Placement:
    return spec.placement(hw, DEVICE_DTYPE[spec.dtype])


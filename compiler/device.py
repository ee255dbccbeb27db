"""A simulated chip that runs compiled functions: buffers, host transfers, loading and calls.

Host data reaches a tensor's DRAM layout the way it does on the board: the host arranges the
tensor into the layout's per-Group DRAM image (what MLSDK's host side does during upload), DMA
copies the image over the host link into Group 0's PDM, and MV instructions move it on to each
Group's DRAM, double-buffered in the driver's PDM window. Download is the reverse. Both are
programs on the simulator, so their cycles come from the YAML like any other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

import numpy as np
import torch

from hwdesc import HwDesc
from sim import Machine, ProgramBuilder, RunStats, Sym

from .compile import Compiled
from .frontend.graph import DEVICE_DTYPE
from .iospec import IOSpec
from .layout import Placement
from .layout.hostio import gather, scatter

TAG_DMA, TAG_MV = (7, 8), (9, 10)  # tags of host transfer programs: programs run one after another and
# each waits for its own transfers, so these may coincide with tags a kernel program uses


@dataclass(eq=False)
class DeviceBuffer:
    """A region of every Group's DRAM holding one tensor in a DRAM placement."""

    address: int
    placement: Placement
    lw: int
    freed: bool = False


def to_bits(tensor: torch.Tensor, device_dtype: str, hw: HwDesc) -> np.ndarray:
    """Host tensor -> the raw bits of its elements in the device's formats."""
    t = tensor.detach().cpu()
    if device_dtype == "float16":
        from sim.numerics import HalfCodec
        return HalfCodec.of(hw).encode(t.float().numpy())
    if device_dtype == "float32":
        return np.ascontiguousarray(t.float().numpy()).view(np.uint32)
    return np.ascontiguousarray(t.to(torch.int32).numpy()).view(np.uint32)


def from_bits(bits: np.ndarray, dtype: str, hw: HwDesc) -> torch.Tensor:
    if dtype == "float16":
        from sim.numerics import HalfCodec
        return torch.from_numpy(HalfCodec.of(hw).decode(bits)).to(torch.float16)
    if dtype in ("float32", "bool"):
        t = torch.from_numpy(bits.view(np.float32).copy())
        return t != 0 if dtype == "bool" else t
    return torch.from_numpy(bits.view(np.int32).copy())


@dataclass
class Loaded:
    """A compiled program resident on a device: its constants and temporaries allocated."""

    compiled: Compiled
    resident: dict[str, DeviceBuffer] = field(default_factory=dict)
    load_stats: list[RunStats] = field(default_factory=list)


class Device:
    def __init__(self, hw: HwDesc) -> None:
        self.hw = hw
        self.machine = Machine(hw)
        self.params = self.machine.params
        self._transfer_programs: dict[tuple, object] = {}

    # ---- buffers ----------------------------------------------------------------------------

    def alloc(self, placement: Placement, lw: int = 0) -> DeviceBuffer:
        """A buffer for a tensor in `placement`, of at least `lw` long words (what programs touch)."""
        lw = max(1, placement.span_lw, lw)
        return DeviceBuffer(self.machine.alloc_dram(lw), placement, lw)

    def free(self, buf: DeviceBuffer) -> None:
        if not buf.freed:
            self.machine.free_dram(buf.address)
            buf.freed = True

    def allocated_lw(self) -> int:
        """Long words of DRAM (per Group) held by live buffers, loaded programs and temporaries."""
        return self.machine.dram.used

    # ---- host transfers ---------------------------------------------------------------------

    def _window(self) -> int:
        return int(self.hw.host_link.window_bytes) // self.hw.long_word_bytes // 2

    def transfer_program(self, placement: Placement, upload: bool):
        key = (str(placement.layout), placement.dtype, upload)
        program = self._transfer_programs.get(key)
        if program is None:
            program = self._build_transfer(placement, upload)
            self._transfer_programs[key] = program
        return program

    def _build_transfer(self, placement: Placement, upload: bool):
        p = self.params
        b = ProgramBuilder(p)
        span, chunk = placement.span_lw, self._window()
        pdm, host_inst = p.memory_names[p.host_memory], p.host_instance
        groups = [int(g) for g in placement.instances_used]
        k = 0
        for g in groups:
            for offset in range(0, span, chunk):
                n, half = min(chunk, span - offset), k % 2
                at, host_off = half * chunk, g * span + offset
                if upload:
                    if k >= 2:
                        b.wait(TAG_MV[half])  # the MV that last read this half of the window is done
                    b.host_dma(True, at, 0, host_off, n, tag=TAG_DMA[half])
                    b.wait(TAG_DMA[half])
                    b.mv("individual", pdm, at, "DRAM", Sym("tensor") + offset, n, tag=TAG_MV[half],
                         src_inst=host_inst, dst_inst=g)
                else:
                    if k >= 2:
                        b.wait(TAG_DMA[half])
                    b.mv("individual", "DRAM", Sym("tensor") + offset, pdm, at, n, tag=TAG_MV[half], src_inst=g,
                         dst_inst=host_inst)
                    b.wait(TAG_MV[half])
                    b.host_dma(False, at, 0, host_off, n, tag=TAG_DMA[half])
                k += 1
        for tag in (TAG_MV if upload else TAG_DMA)[: min(k, 2)]:
            b.wait(tag)
        return b.build()

    def _image(self, placement: Placement) -> np.ndarray:
        return np.zeros((placement.instance_count, max(1, placement.span_lw) * self.params.words_per_lw),
                        dtype=np.uint32)

    def upload(self, buf: DeviceBuffer, values: torch.Tensor | np.ndarray, *, dtype: str | None = None) -> RunStats:
        """Host tensor -> device buffer, over the host link. `values` may already be raw bits."""
        placement = buf.placement
        image = self._image(placement)
        bits = values if isinstance(values, np.ndarray) else to_bits(values, placement.dtype, self.hw)
        scatter(placement, bits.reshape(placement.layout.shape), image)
        program = self.transfer_program(placement, upload=True)
        return self.machine.run(program, host=[image], bases={"tensor": buf.address})

    def download(self, buf: DeviceBuffer, dtype: str, shape: tuple[int, ...]) -> tuple[torch.Tensor, RunStats]:
        """Device buffer -> host tensor of the logical `dtype` and `shape`, over the host link."""
        placement = buf.placement
        image = self._image(placement)
        program = self.transfer_program(placement, upload=False)
        stats = self.machine.run(program, host=[image], bases={"tensor": buf.address})
        bits = gather(placement, image)
        return from_bits(np.ascontiguousarray(bits), dtype, self.hw).reshape(shape), stats

    # ---- programs ---------------------------------------------------------------------------

    def load(self, compiled: Compiled) -> Loaded:
        """Allocate a program's constants and temporaries and upload its constants."""
        loaded = Loaded(compiled)
        for symbol, buf in compiled.buffers.items():
            if buf.role in ("const", "temp", "zeros"):
                loaded.resident[symbol] = self.alloc(buf.placement, buf.lw)
                if buf.data is not None:
                    data = buf.data
                    bits = data if isinstance(data, np.ndarray) else to_bits(data, buf.placement.dtype, self.hw)
                    loaded.load_stats.append(self.upload(loaded.resident[symbol], bits))
        return loaded

    def unload(self, loaded: Loaded) -> None:
        for buf in loaded.resident.values():
            self.free(buf)

    def call(self, loaded: Loaded, inputs: dict[str, DeviceBuffer]) -> tuple[dict[str, DeviceBuffer], RunStats]:
        """Run a loaded program on bound input buffers; outputs get fresh buffers."""
        compiled = loaded.compiled
        bases = {s: b.address for s, b in loaded.resident.items()}
        for name, symbol in compiled.input_symbols.items():
            need = compiled.buffers[symbol].lw
            if inputs[name].lw < need:
                raise ValueError(f"input {name!r}: its buffer holds {inputs[name].lw} long words per Group; the program "
                                 f"reads {need}")
            bases[symbol] = inputs[name].address
        outputs = {}
        for name, symbol in compiled.output_symbols.items():
            outputs[name] = self.alloc(compiled.buffers[symbol].placement, compiled.buffers[symbol].lw)
            bases[symbol] = outputs[name].address
        stats = self.machine.run(compiled.program, bases=bases)
        return outputs, stats

    def execute(self, compiled: Compiled, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Upload, load, run and download in one go (tests and quick checks)."""
        loaded = self.load(compiled)
        bufs = {}
        for name, spec in compiled.inputs.items():
            bufs[name] = self.alloc(spec.placement(self.hw, DEVICE_DTYPE[spec.dtype]),
                                    compiled.buffers[compiled.input_symbols[name]].lw)
            self.upload(bufs[name], inputs[name])
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


def free_all(device: Device, bufs: Iterable[DeviceBuffer]) -> None:
    for b in bufs:
        device.free(b)

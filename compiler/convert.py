"""DRAM-to-DRAM layout conversion between two IOSpecs of one tensor.

When a producer's output spec is not memcopyable to a consumer's input spec, the runtime runs
this program between them. It is the compiler's own relayout (kernels.relayout): the Data
Engines gather long words when no element changes lanes, the PEs move lanes otherwise, so every
pair of layouts of a tensor converts on the device. Built once per spec pair. Buffers the
relayout needs in between live in a scratch region of `scratch_lw` long words per Group.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hwdesc import HwDesc
from sim import Program
from sim.validate import symbol_extents

from .dtypes import DEVICE_DTYPE
from .errors import CompileError
from .iospec import IOSpec
from .ir import Value
from .kernels.context import Buffer, EmitContext, Ref
from .kernels.relayout import RelayoutKernel
from .schedule import schedule


@dataclass(frozen=True)
class Conversion:
    program: Program  # symbols "src", "dst" and the scratch buffers
    src: IOSpec
    dst: IOSpec
    dst_lw: int  # long words per Group the destination buffer needs
    scratch_lw: int = 0
    offsets: dict[str, int] = field(default_factory=dict)  # scratch buffer symbol -> long words into the region
    constants: dict[str, Buffer] = field(default_factory=dict)  # fill images the program reads (placed at load)
    zero_pad: bool = False  # the destination's padding is written with zeros

    @property
    def action(self) -> str:
        """What it does, as its label and the runtime's record name it."""
        return action(self.src, self.dst, self.zero_pad)

    def bases(self, src: int, dst: int, scratch: int = 0) -> dict[str, int]:
        return {"src": src, "dst": dst, **{s: scratch + off for s, off in self.offsets.items()}}


def build_conversion(src: IOSpec, dst: IOSpec, hw: HwDesc, zero_pad: bool = False) -> Conversion:
    """The program that re-lays `src` as `dst`; with `zero_pad`, one that also writes zeros into
    the destination's padding (between equal specs: a copy of a buffer whose padding a program
    may have written, for a reader that needs it zero)."""
    if src.shape != dst.shape or src.dtype != dst.dtype:
        raise CompileError(f"cannot convert {src.name} ({src.dtype}{list(src.shape)}) to {dst.name} "
                           f"({dst.dtype}{list(dst.shape)}): shapes and dtypes must match")
    dtype = DEVICE_DTYPE[src.dtype]
    source, target = src.placement(hw, dtype), dst.placement(hw, dtype)
    ctx = EmitContext(hw)
    value = Value(src.name, tuple(src.shape), "bool" if src.dtype == "bool" else dtype, "input")
    kernel = RelayoutKernel(value, None, target=target, zero_pad=zero_pad)
    # (the LM layouts, where known, guide a transpose)
    with ctx.label(f"{action(src, dst, zero_pad)} {src.name} -> {dst.name}"):
        kernel.emit(ctx, {value: Ref("src", source, src.lm_layout), kernel.out: Ref("dst", target, dst.lm_layout)})
    program = ctx.b.build()
    extents = symbol_extents(ctx.params, program.code, program.relocs, program.symbols)
    for symbol, (_, reach) in extents.items():
        if symbol in ctx.buffers:
            ctx.buffers[symbol].reach = reach
    temps = {s: b for s, b in ctx.buffers.items() if b.role == "temp"}
    scratch = schedule(temps, [set(temps)], ctx.params, hw.memory_lw(ctx.chain.dram)) if temps else 0
    constants = {s: b for s, b in ctx.buffers.items() if b.role in ("const", "fill") and s in program.symbols}
    return Conversion(program, src, dst, max(target.span_lw, extents.get("dst", (0, 0))[1]), scratch,
                      {s: b.offset for s, b in temps.items()}, constants, zero_pad)


def action(src: IOSpec, dst: IOSpec, zero_pad: bool) -> str:
    """A conversion's name: a copy into the same layout that zeroes its padding is "zero the
    padding of", any other "convert"."""
    return "zero the padding of" if zero_pad and src.is_memcopyable_to(dst) else "convert"

"""DRAM-to-DRAM layout conversion between two IOSpecs of one tensor.

When a producer's output spec is not memcopyable to a consumer's input spec, the runtime runs
this program between them: the Data Engines gather the producer's long words into the
consumer's layout through L2BM (compiler.transfer.gather). Built once per spec pair.
"""

from __future__ import annotations

from dataclasses import dataclass

from hwdesc import HwDesc
from sim import Program, ProgramBuilder, Sym
from sim.validate import symbol_extents

from .errors import CompileError
from .frontend.graph import DEVICE_DTYPE
from .iospec import IOSpec
from .transfer.gather import LaneMismatch, emit_convert, lw_sources

TAGS = (5, 6)


@dataclass(frozen=True)
class Conversion:
    program: Program  # symbols "src" and "dst"
    src: IOSpec
    dst: IOSpec
    dst_lw: int  # long words per Group the destination buffer needs


def build_conversion(src: IOSpec, dst: IOSpec, hw: HwDesc) -> Conversion:
    if src.shape != dst.shape or src.dtype != dst.dtype:
        raise CompileError(f"cannot convert {src.name} ({src.dtype}{list(src.shape)}) to {dst.name} "
                           f"({dst.dtype}{list(dst.shape)}): shapes and dtypes must match")
    dtype = DEVICE_DTYPE[src.dtype]
    source, target = src.placement(hw, dtype), dst.placement(hw, dtype)
    try:
        sources = lw_sources(target, source)
    except LaneMismatch as e:
        raise CompileError(f"converting {src.layout} to {dst.layout} needs elements to change lanes: {e}") from None
    from sim import MachineParams
    b = ProgramBuilder(MachineParams.from_hw(hw))
    with b.label(f"convert {src.name} -> {dst.name}"):
        emit_convert(b, sources, dst=Sym("dst"), src=Sym("src"), zeros=None, l2_addr=0,
                     l2_room=hw.memory_lw("L2BM") // 2, tags=TAGS)
    program = b.build()
    extents = symbol_extents(MachineParams.from_hw(hw), program.code, program.relocs, program.symbols)
    return Conversion(program, src, dst, max(target.span_lw, extents.get("dst", (0, 0))[1]))

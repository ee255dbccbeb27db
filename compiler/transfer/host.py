"""Host transfers: a tensor between the host and its DRAM layout, as the board moves it.

The host arranges the tensor into its layout's per-Group DRAM image; DMA copies each Group's
part over the host link into the driver's window of Group 0's PDM (double-buffered halves), and
MV instructions move it on to that Group's DRAM. Download is the reverse. Both are programs on
the simulator, so their cycles come from the YAML like any other; the planner times them to
prefer, among equally fast kernels, layouts that are cheaper to upload and download.
"""

from __future__ import annotations

from functools import lru_cache

from hwdesc import HwDesc
from sim import MachineParams, Program, ProgramBuilder, Sym

from ..chain import Chain
from ..layout import Placement

TAG_DMA, TAG_MV = (7, 8), (9, 10)  # tags of host transfer programs: programs run one after another and
# each waits for its own transfers, so these may coincide with tags a kernel program uses


def window_lw(hw: HwDesc) -> int:
    """Long words of each half of the driver's PDM window."""
    return int(hw.host_link.window_bytes) // hw.long_word_bytes // 2


def host_transfer(placement: Placement, upload: bool) -> Program:
    """The program moving a tensor in `placement` (buffer symbol "tensor") from (or to) the host."""
    return _host_transfer(placement.layout, placement.hw, placement.memory, placement.dtype, upload)


@lru_cache(maxsize=256)
def _host_transfer(layout, hw: HwDesc, memory: str, dtype: str, upload: bool) -> Program:
    placement = Placement(layout, hw, memory, dtype)
    p = MachineParams.from_hw(hw)
    dram = Chain.of(hw).dram
    b = ProgramBuilder(p)
    span, chunk = placement.span_lw, window_lw(hw)
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
                b.mv("individual", pdm, at, dram, Sym("tensor") + offset, n, tag=TAG_MV[half],
                     src_inst=host_inst, dst_inst=g)
            else:
                if k >= 2:
                    b.wait(TAG_DMA[half])
                b.mv("individual", dram, Sym("tensor") + offset, pdm, at, n, tag=TAG_MV[half], src_inst=g,
                     dst_inst=host_inst)
                b.wait(TAG_MV[half])
                b.host_dma(False, at, 0, host_off, n, tag=TAG_DMA[half])
            k += 1
    for tag in (TAG_MV if upload else TAG_DMA)[: min(k, 2)]:
        b.wait(tag)
    return b.build()

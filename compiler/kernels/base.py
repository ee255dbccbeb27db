"""What every kernel is: the contract between the planner and the emitters.

A kernel computes one or more primitive nodes. The planner builds candidate kernels (each with
its layouts and tilings decided), asks each what it reads (the LM layout each input is staged
into) and what it writes (the DRAM placement each output gets: the image of the LM layout it is
computed in), emits the candidates into scratch contexts to time them, and keeps the fastest.
Emission is the same code for timing and for the final program, so the cost of a choice is the
simulator's own count of the instructions it would run.

`Operand` and `emit_steps` are the pieces element-wise and reduction kernels share: a tensor in
an LM region, and VOPs looped over the digits of the layouts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sim import DType

from ..ir import Node, Value
from ..layout import Layout, Placement
from ..transfer.staging import stage
from .context import EmitContext, Ref
from .loops import Operand as LoopOperand
from .loops import emit_vops, nest
from .operands import Restricted, per_pe, slice_count

DEVICE_DTYPE = {"float32": "float32", "float16": "float16", "int32": "int32", "bool": "float32"}


def device_dtype(v: Value) -> str:
    """How a value's elements are held on the device (bool as float32 0.0 / 1.0)."""
    return DEVICE_DTYPE[v.dtype]


class Kernel:
    """A planned kernel: `reads` and `writes` LM layouts, `emit` instructions."""

    nodes: tuple[Node, ...] = ()
    pads: dict[Value, str] = {}  # inputs whose padding must hold a fill pattern (a reduction's identity)
    # Whether the planner may stop timing this kind's candidates once several in a row have not
    # bettered the best (planner.search.STALE_CANDIDATES): their timings cluster
    stops_when_stale: bool = False

    @property
    def label(self) -> str:
        return self.nodes[0].label if self.nodes else type(self).__name__

    def estimate(self, ctx: EmitContext, refs: dict[Value, Ref]) -> float | None:
        """Cycles the kernel's own model expects with these operands, or None. The planner does not
        time a candidate whose estimate is far above the fastest timed (see ESTIMATE_SLACK), so an
        estimate must stay within that factor of the timing above it."""
        return None

    def least_cycles(self, ctx: EmitContext, refs: dict[Value, Ref]) -> float:
        """A lower bound of the cycles it emits (unlike `estimate`, never above the timing), so the
        planner need not emit and time a kernel that cannot win: 0 where nothing cheap bounds it."""
        return 0.0

    def reads(self) -> dict[Value, Layout]:
        """The LM layout each input is staged into."""
        raise NotImplementedError

    def writes(self) -> dict[Value, Layout]:
        """The LM layout each output is computed in; it is stored as that layout's image."""
        raise NotImplementedError

    def key(self, refs: dict[Value, Ref]) -> tuple | None:
        """What emission depends on besides buffer names (equal keys emit equal code), so the
        planner times each distinct candidate once; None: do not cache."""
        return None

    def outputs(self) -> list[Value]:
        """The values it stores (most are `writes()`' keys; some are not images of an LM layout)."""
        return list(self.writes())

    def emit(self, ctx: EmitContext, refs: dict[Value, Ref]) -> None:
        raise NotImplementedError

    def output_refs(self, ctx: EmitContext, symbols: dict[Value, str]) -> dict[Value, Ref]:
        """Where the outputs will be: each stored as the image of the layout it is computed in."""
        return {v: Ref(symbols[v], stage(ctx.lm_placement(layout, device_dtype(v))).dram, layout)
                for v, layout in self.writes().items()}


@dataclass
class Operand:
    """A tensor of a kernel in an LM region: its layout (derived from the iteration layout), dtype."""

    value: Value | None
    restricted: Restricted
    dtype: str
    memory: str = ""
    word: int = 0

    @property
    def layout(self) -> Layout:
        return self.restricted.layout

    @property
    def sliced(self) -> bool:
        return slice_count(self.layout) > 1

    def placement(self, ctx: EmitContext) -> Placement:
        return ctx.lm_placement(self.layout, self.dtype)

    def words(self, ctx: EmitContext) -> int:
        return self.placement(ctx).slice_span * ctx.params.words_per_lw

    def loop(self, ctx: EmitContext) -> LoopOperand:
        """Element strides of this operand along the iteration layout's factors (0 where broadcast)."""
        mine = [s for _, s in per_pe(self.layout, ctx.hw.elements_per_lw(self.dtype))]
        strides = tuple(0 if s is None else mine[s] for s in self.restricted.source)
        per_word = ctx.params.elements_per_word(DType[self.dtype])
        return LoopOperand(self.memory, self.word * per_word, strides)


Slot = Any  # an Operand or a Python scalar (immediate)


def emit_step(ctx: EmitContext, vop: str, dtype: str, iteration: Layout, dst: Operand, srcs: list[Slot],
              src_dtype: str | None = None) -> None:
    """One VOP applied over the iteration layout's digits inside each PE: `dst = vop(*srcs)`."""
    sizes = [n for n, _ in per_pe(iteration, ctx.hw.elements_per_lw(dtype))]
    out = dst.loop(ctx)
    ins = [s.loop(ctx) if isinstance(s, Operand) else s for s in srcs]
    tensors = [s for s in ins if isinstance(s, LoopOperand)]
    loops, strides = nest(sizes, list(out.strides), *[list(s.strides) for s in tensors])
    moved = iter(strides[1:])
    placed = [LoopOperand(s.memory, s.base, next(moved)) if isinstance(s, LoopOperand) else s for s in ins]
    emit_vops(ctx.b, vop, dtype, loops, LoopOperand(out.memory, out.base, strides[0]), *placed, src_dtype=src_dtype)


def fill_lanes(ctx: EmitContext, memory: str, base: int, span: int, dtype: str) -> None:
    """Copy lane 0 of each of `span` long words (from element `base` of `memory`) into the other
    lanes. A layout without lanes (no W factor) holds each element in every lane: that is how its
    placement locates it, so a gather into a layout with lanes reads whichever lane it needs (a
    window spreading a vector over a matrix's rows read lane 1, which VOPs over such a layout had
    left as it was). Kernels whose VOPs write lane 0 of such an output fill the rest before the
    upload."""
    epl = ctx.hw.elements_per_lw(dtype)
    for w in range(1, epl):
        ctx.b.vop("copy", dtype, 1, span, (memory, base + w, 0, epl), (memory, base, 0, epl))

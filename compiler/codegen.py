"""The code generator's context: where values live, scratch in every memory, and data movement.

Every graph value that is materialised lives in a DRAM buffer (a relocatable symbol of the
Program) in some DRAM layout. Kernels stage their operands into LM, compute there and upload
results back. A value's DRAM layout is usually the staging image of the LM layout its producer
computed it in (`Ref.lm`), so the next kernel that wants the same LM layout downloads it with
block copies; a different but lane-compatible layout is gathered by the Data Engines on the way.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field, replace
from typing import Callable, Iterator

import numpy as np

from hwdesc import HwDesc
from sim import MachineParams, ProgramBuilder, Sym
from sim.alloc import Allocator

from .errors import CompileError, LayoutError
from .frontend.graph import DEVICE_DTYPE, Value
from .layout import W_AXIS, Broadcast, Factor, Layout, Placement
from .transfer.gather import ZERO, LaneMismatch, LwSources, emit_convert, lw_sources, run_arrays
from .transfer.staging import Staging, Transit, emit_download, emit_upload, stage

DRAM = "DRAM"
LM_MEMORIES = ("LM0", "LM1", "GRF0", "GRF1")
TAGS = {"transit": (1, 2), "drain": (3, 4), "convert": (5, 6)}
FIRST_FREE_TAG = max(max(pair) for pair in TAGS.values()) + 1  # from here to the chip's tag count: kernels' own pipelines


@dataclass
class Buffer:
    """A DRAM region of the program: an input, output, constant or temporary."""

    symbol: str
    role: str  # input | output | const | temp | zeros
    placement: Placement  # the layout the buffer was written in
    value: str | None = None  # graph value name
    data: np.ndarray | None = None  # constants: element values (host order), placed at load
    lm: Layout | None = None
    reach: int = 0  # long words the program's transfers touch (whole staging pieces may pass the span)

    @property
    def lw(self) -> int:
        """Long words to allocate in every Group: what the layout spans and the program touches."""
        return max(self.placement.span_lw, self.reach, 1)


@dataclass(frozen=True)
class Ref:
    """A value in DRAM: its buffer and the layout the value has there (views change the layout)."""

    symbol: str
    placement: Placement
    lm: Layout | None = None  # the LM layout whose staging image `placement` is, if any
    shape: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not self.shape:
            object.__setattr__(self, "shape", self.placement.layout.shape)


class Arena:
    """LM, GRF word regions for one kernel: every PE gets the same addresses."""

    def __init__(self, hw: HwDesc) -> None:
        wpl = hw.long_word_bytes // hw.word_bytes
        self.allocators = {m: Allocator(m, hw.memory_words(m), "words", align=2 * wpl) for m in LM_MEMORIES
                           if m in hw.memories}

    def alloc(self, words: int, prefer: tuple[str, ...] = LM_MEMORIES) -> tuple[str, int]:
        for m in prefer:
            alloc = self.allocators.get(m)
            if alloc is not None and alloc.largest_free >= words:
                return m, alloc.alloc(words)
        free = {m: a.largest_free for m, a in self.allocators.items()}
        raise CompileError(f"a kernel needs {words} more words of PE memory; largest free regions: {free}")


@dataclass
class CodeGen:
    hw: HwDesc
    options: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.params = MachineParams.from_hw(self.hw)
        self.b = ProgramBuilder(self.params)
        self.buffers: dict[str, Buffer] = {}
        self.refs: dict[Value, Ref] = {}
        self.wishes: dict[Value, Layout] = {}  # output layouts a constraint asks for
        self.pending: dict[Value, Callable[[Layout], Ref]] = {}  # views of not-yet-placed values
        # for each pending view: its base and the map from a layout of the view to one of the base
        self.view_bases: dict[Value, tuple[Value, Callable[[Layout], Layout | None]]] = {}
        self.lane_cache: dict[tuple, bool] = {}
        self.sources_cache: dict[tuple, LwSources] = {}
        l2, l1 = self.hw.memory_lw("L2BM") // 2, self.hw.memory_lw("L1BM") // 2
        self.transit = Transit((0, l2), (0, l1), l2, l1, TAGS["transit"])
        self.labels: list[tuple[int, int, str]] = []

    # ---- values and buffers -----------------------------------------------------------------

    def device_dtype(self, v: Value) -> str:
        return DEVICE_DTYPE[v.dtype]

    def buffer(self, role: str, placement: Placement, value: str | None = None, *, lm: Layout | None = None,
               data: np.ndarray | None = None) -> Ref:
        stem = f"{role}:{value}" if value else role
        symbol, k = stem, 1
        while symbol in self.buffers:
            symbol, k = f"{stem}#{k}", k + 1
        self.buffers[symbol] = Buffer(symbol, role, placement, value, data, lm)
        return Ref(symbol, placement, lm)

    def zeros(self, lw: int) -> Sym:
        """A zero-filled DRAM buffer of at least `lw` long words, in every Group's DRAM."""
        existing = self.buffers.get("zeros")
        if existing is None or existing.lw < lw:
            n = lw * self.hw.elements_per_lw("int32")
            group_axis = self.hw.levels[self.hw.memories[DRAM].level].axis
            layout = Layout.of([[Factor(lw, None, 1), Factor(n // lw, W_AXIS, 1)]], (n,), (Broadcast(group_axis),))
            self.buffers["zeros"] = Buffer("zeros", "zeros", Placement(layout, self.hw, DRAM, "int32"), None,
                                           np.zeros(n, dtype=np.int32))
        return Sym("zeros")

    def zeros_for(self, sources: LwSources) -> Sym | None:
        """The zero buffer, long enough for the longest zero run of a gather (None if it has none)."""
        if not (sources.group == ZERO).any():
            return None
        longest = 0
        for g in range(sources.group.shape[0]):  # the runs the MVs will read, holes included
            _, group, _, n, _ = run_arrays(sources, g, 0, sources.span)
            if (group == ZERO).any():
                longest = max(longest, int(n[group == ZERO].max()))
        return self.zeros(longest)

    @contextlib.contextmanager
    def label(self, name: str) -> Iterator[None]:
        with self.b.label(name):
            yield

    # ---- data movement ----------------------------------------------------------------------

    def download(self, ref: Ref, lm: Placement, *, memory: str, word: int, slice_index: int = 0,
                 zero_fill: bool = False, index: np.ndarray | None = None) -> Staging:
        """Stage `ref` into LM layout `lm` (one slice) at `memory` word `word`. With `zero_fill`,
        long words of the layout that hold no element arrive as zeros (padding that is summed);
        with `index`, element e of the layout is element index[e] of `ref` (-1: zero), gathered
        on the way (im2col for convolutions)."""
        st, source = self.fetch_source(ref, lm, zero_fill=zero_fill, index=index)
        emit_download(self.b, st, dram=Sym(ref.symbol), lm_mem=memory, lm_word=word, transit=self.transit,
                      slice_index=slice_index, source=source)
        return st

    def fetch_source(self, ref: Ref, lm: Placement, *, zero_fill: bool = False, index: np.ndarray | None = None
                     ) -> tuple[Staging, tuple[LwSources, Sym, Sym | None] | None]:
        """How `ref` reaches LM layout `lm`: its staging, and unless `ref` is stored as that
        staging's image, the long-word gather the Data Engines run instead of a block copy."""
        st = stage(lm)
        plain = st.fitted is not None and ref.placement.same_placement(st.fitted)
        zero_fill = zero_fill and lm.layout.extents != lm.layout.shape  # without padding there are no holes
        if not (zero_fill or index is not None or not plain):
            return st, None
        sources = self._sources(st, ref, lm, index)
        if zero_fill:
            sources = sources.zero_holes(st.dram_lw)
        return st, (sources, Sym(ref.symbol), self.zeros_for(sources))

    def _sources(self, st: Staging, ref: Ref, lm: Placement, index: np.ndarray | None = None) -> LwSources:
        key = (ref.symbol, str(ref.placement.layout), str(lm.layout), lm.dtype, id(index))
        if key not in self.sources_cache:
            try:
                self.sources_cache[key] = lw_sources(st.destination, ref.placement, index)
            except LaneMismatch as e:
                raise CompileError(f"cannot bring a value stored as {ref.placement.layout} into {lm.layout}: {e}") from None
        return self.sources_cache[key]

    def upload(self, lm: Placement, ref: Ref, *, memory: str, word: int, slice_index: int = 0,
               reduce: bool = False) -> None:
        """LM layout `lm` (one slice) at `memory` word `word` to `ref`, stored as its image; with
        `reduce`, the copies over the L2Bs of each Group are partial sums, added on the way."""
        st = stage(lm)
        if not ref.placement.same_placement(st.dram):
            raise CompileError(f"upload target {ref.placement.layout} is not the image of {lm.layout}")
        transit = replace(self.transit, tags=TAGS["drain"])
        emit_upload(self.b, st, dram=Sym(ref.symbol), lm_mem=memory, lm_word=word, transit=transit,
                    slice_index=slice_index, reduce=reduce)

    def convert(self, src: Ref, dst_placement: Placement, role: str, value: str | None) -> Ref:
        """A copy of `src` in another DRAM layout (long-word gather through L2BM)."""
        try:
            sources = lw_sources(dst_placement, src.placement)
        except LaneMismatch as e:
            raise CompileError(f"cannot convert {src.placement.layout} to {dst_placement.layout}: {e}") from None
        out = self.buffer(role, dst_placement, value)
        zeros = self.zeros_for(sources)
        emit_convert(self.b, sources, dst=Sym(out.symbol), src=Sym(src.symbol), zeros=zeros, l2_addr=0,
                     l2_room=self.transit.l2_room, tags=TAGS["convert"])
        return out

    def lw_sources(self, dst: Placement, src: Placement) -> LwSources:
        return lw_sources(dst, src)


def stageable(layout: Layout, hw: HwDesc, dtype: str, memory: str = "LM0") -> Staging | None:
    try:
        return stage(Placement(layout, hw, memory, dtype))
    except LayoutError:
        return None

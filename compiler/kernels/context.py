"""`EmitContext`: what kernels emit into, and the data movement they share.

A context holds the program being built, the DRAM buffers its instructions name (relocatable
symbols: inputs, outputs, constants, temporaries, fill patterns), the L2BM / L1BM transit regions
that pieces pass through, and the moves every kernel needs: staging a stored value into an LM
layout (block copies when it is stored as that layout's image, a long-word gather otherwise),
uploading an LM layout to its image, and DRAM-to-DRAM gathers. The planner emits each candidate
kernel into a scratch context to time it; the final program is emitted into one context.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, replace
from typing import Callable, Iterable, Iterator

import numpy as np
import torch

from hwdesc import HwDesc
from sim import MachineParams, ProgramBuilder, Sym
from sim.alloc import Allocator

from ..chain import Chain
from ..errors import CompileError, LayoutError
from ..layout import W_AXIS, Broadcast, Factor, Layout, Placement
from ..transfer.gather import LaneMismatch, LwSources, emit_convert, gather_runs, lw_sources
from ..transfer.separable import DimTerms
from ..transfer.staging import Staging, Transit, emit_download, emit_upload, stage, stored_staging

TAGS = {"transit": (1, 2), "drain": (3, 4), "convert": (5, 6)}
FIRST_FREE_TAG = max(max(pair) for pair in TAGS.values()) + 1  # from here to the chip's tag count: kernels' own pipelines


@dataclass
class Buffer:
    """A DRAM region of the program: an input, output, constant, temporary or fill pattern."""

    symbol: str
    role: str  # input | output | const | temp | fill
    placement: Placement  # the layout the buffer holds its tensor in
    value: str | None = None  # graph value name
    data: np.ndarray | None = None  # constants: element values (host order), placed at load
    lm: Layout | None = None
    reach: int = 0  # long words the program's transfers touch (whole staging pieces may pass the span)
    offset: int = 0  # temporaries: long words into the program's scratch region (set by compiler.schedule)

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

    @property
    def shape(self) -> tuple[int, ...]:
        return self.placement.layout.shape

    @property
    def sym(self) -> Sym:
        return Sym(self.symbol)


class Arena:
    """PE-memory word regions for one kernel: every PE gets the same addresses."""

    def __init__(self, hw: HwDesc) -> None:
        chain = Chain.of(hw)
        wpl = hw.long_word_bytes // hw.word_bytes
        self.memories = chain.scratch
        self.allocators = {m: Allocator(m, hw.memory_words(m), "words", align=2 * wpl) for m in self.memories}

    def alloc(self, words: int, prefer: tuple[str, ...] | None = None, avoid: set[str] | frozenset = frozenset(),
              strict: bool = False) -> tuple[str, int]:
        """A region of `words` in the first memory of `prefer` (default: all, in chain order) with
        room, other than those in `avoid` (`strict`: never in them): operands one instruction
        reads together go to different memories, since an instruction reads each memory with
        one address pattern (memories.<m>.ports)."""
        order = prefer or self.memories
        for m in [m for m in order if m not in avoid] + ([] if strict else [m for m in order if m in avoid]):
            alloc = self.allocators.get(m)
            if alloc is not None and alloc.fits(words):
                return m, alloc.alloc(max(1, words))
        free = {m: a.largest_free for m, a in self.allocators.items()}
        besides = f" outside {', '.join(sorted(avoid))} (read by the same instruction)" if strict and avoid else ""
        raise CompileError(f"a kernel needs {words} more words of PE memory{besides}; largest free regions: {free}")

    def free(self, memory: str, word: int) -> None:
        self.allocators[memory].free(word)

    def total_words(self, memories: tuple[str, ...] | None = None) -> int:
        return sum(a.capacity for m, a in self.allocators.items() if memories is None or m in memories)


class EmitContext:
    def __init__(self, hw: HwDesc, options: dict | None = None, instruction_limit: int | None = None) -> None:
        self.hw = hw
        self.options = options or {}
        self.chain = Chain.of(hw)
        self.params = MachineParams.from_hw(hw)
        self.b = ProgramBuilder(self.params, instruction_limit)
        self.buffers: dict[str, Buffer] = {}
        self.sources_cache: dict[tuple, LwSources] = {}
        l2, l1 = hw.memory_lw(self.chain.l2) // 2, hw.memory_lw(self.chain.l1) // 2
        self.transit = Transit((0, l2), (0, l1), l2, l1, TAGS["transit"])

    # ---- buffers ----------------------------------------------------------------------------

    def buffer(self, role: str, placement: Placement, value: str | None = None, *, lm: Layout | None = None,
               data: np.ndarray | None = None, symbol: str | None = None) -> Ref:
        stem = symbol or (f"{role}:{value}" if value else role)
        symbol, k = stem, 1
        while symbol in self.buffers:
            symbol, k = f"{stem}#{k}", k + 1
        self.buffers[symbol] = Buffer(symbol, role, placement, value, data, lm)
        return Ref(symbol, placement, lm)

    def fill(self, lw: int, value: float | int = 0, dtype: str = "float32") -> Sym:
        """A DRAM buffer of at least `lw` long words holding `value` in every element of `dtype`, in
        every Group's DRAM: what gathers read where padding must hold a pad value or the identity
        of a reduction (a constant, placed at load like any other)."""
        key = f"fill:{dtype}:{value!r}"
        existing = self.buffers.get(key)
        if existing is None or existing.lw < lw:
            epl = self.hw.elements_per_lw(dtype)
            n = lw * epl
            axis = self.hw.levels[self.hw.memories[self.chain.dram].level].axis
            layout = Layout.of([[Factor(lw, None, 1), Factor(epl, W_AXIS, 1)]], (n,), (Broadcast(axis),))
            data = torch.full((n,), value, dtype=torch.int32 if dtype == "int32" else torch.float32)
            self.buffers[key] = Buffer(key, "fill", Placement(layout, self.hw, self.chain.dram, dtype), None, data)
        return Sym(key)

    def fill_for(self, sources: LwSources, value: float | int = 0, dtype: str = "float32") -> Sym | None:
        """The fill buffer, long enough for the longest fill run of a gather (None if it has none)."""
        if not sources.has_zeros:
            return None
        return self.fill(sources.longest_zero_run, value, dtype)

    @contextlib.contextmanager
    def label(self, name: str) -> Iterator[None]:
        with self.b.label(name):
            yield

    # ---- data movement ----------------------------------------------------------------------

    def gather_mv_cycles(self) -> float:
        """Cycles one MV of a gather costs at least: a DRAM latency over all the Groups' queues
        (their latencies overlap, the timing engine's rule)."""
        down = self.hw.transfers[self.chain.dram_to_l2]
        return down.latency_cycles / (self.hw.data_engine.queue_depth * self.chain.groups)

    def lm_placement(self, layout: Layout, dtype: str) -> Placement:
        return Placement(layout, self.hw, self.chain.lm[0], dtype, check_capacity=False)

    def download(self, ref: Ref, lm: Placement, *, memory: str, word: int, slice_index: int = 0,
                 pad: float | int | None = None, index: np.ndarray | None = None,
                 window: DimTerms | None = None, blocks: bool = False, zero_padded: bool = False) -> Staging:
        """Stage `ref` into LM layout `lm` (one slice) at `memory` word `word`. With `pad` (a fill
        value), long words of the layout that hold no element arrive filled with it (padding a
        reduction or a product sums over); with `index`, element e of the layout is element
        index[e] of `ref` (-1: the pad value), gathered on the way; with `window`, the layout's
        tensor is that window of `ref`'s storage (im2col for convolutions); `blocks` and
        `zero_padded`: see `fetch_source`."""
        st, source = self.fetch_source(ref, lm, pad=pad, index=index, window=window, blocks=blocks,
                                       zero_padded=zero_padded)
        emit_download(self.b, st, dram=ref.sym, lm_mem=memory, lm_word=word, transit=self.transit,
                      slice_index=slice_index, source=source)
        return st

    def fetch_source(self, ref: Ref, lm: Placement, *, pad: float | int | None = None,
                     index: np.ndarray | None = None, window: DimTerms | None = None, blocks: bool = False,
                     zero_padded: bool = False) -> tuple[Staging, tuple[LwSources, Sym, Sym | None] | None]:
        """How `ref` reaches LM layout `lm`: its staging, and unless `ref` is stored as that
        staging's image, the long-word gather the Data Engines run instead of a block copy. With
        `blocks`, a gather into an image that holds each L1B's data in a block of its own
        (transfer.staging), where the layout allows one.

        A layout with padding and a `pad` value is gathered with the pad value put in the padding,
        unless `ref` is stored as the image and `zero_padded` (its padding holds zeros, the planner
        knows) with `pad` 0: the block copy then brings the same. (A 1024 x 1024 x 1000 product's
        B, columns padded to 1024 over the MABs, was gathered in 122,880 MVs of 16 long words:
        563,078 cycles where the 1024-column product takes 36,446.)"""
        st = stored_staging(lm, ref.placement) or _staging_for_gather(lm, blocks)
        plain = ref.placement.same_placement(st.dram)
        holes = window is not None and window.boxes is not None  # a window's reads outside its storage
        padded = pad is not None and (lm.layout.extents != lm.layout.shape or holes)
        if plain and index is None and window is None and (not padded or (zero_padded and pad == 0)):
            return st, None
        sources = self.sources(st, ref, lm, index, window, st.dram_lw if padded else None)
        return st, (sources, ref.sym, self.fill_for(sources, 0 if pad is None else pad, lm.dtype))

    def sources(self, st: Staging, ref: Ref, lm: Placement, index: np.ndarray | None = None,
                window: DimTerms | None = None, zeros_up_to: int | None = None) -> LwSources:
        """The gather of `ref` (or a window of it) into `lm`'s image, with its holes made zeros up
        to `zeros_up_to` long words when given; kept, since every slice of a kernel asks again."""
        key = (ref.symbol, str(ref.placement.layout), str(lm.layout), lm.dtype, st.l1_mode, id(index),
               window.key() if window is not None else None, zeros_up_to)
        if key not in self.sources_cache:
            try:
                found = lw_sources(st.dram, window if window is not None else ref.placement, index)
            except LaneMismatch as e:
                raise CompileError(f"internal: the planner asked for a gather that moves lanes: {e}") from None
            self.sources_cache[key] = found.zero_holes(zeros_up_to) if zeros_up_to is not None else found
        return self.sources_cache[key]

    def upload(self, lm: Placement, ref: Ref, *, memory: str, word: int, slice_index: int = 0,
               reduce: bool = False, ready: Callable[[int], None] | None = None, transit: Transit | None = None,
               after: int = 0) -> None:
        """LM layout `lm` (one slice) at `memory` word `word` to `ref`, stored as its image; with
        `reduce`, the copies over the L2Bs of each Group are partial sums, added on the way; with
        `ready`, the slice is produced piece by piece as the upload goes (staging.emit_upload).
        `transit`: buffers of its own (with the "drain" tags), where other transfers use the
        context's meanwhile; `after`: pieces sent through them just before (staging.emit_upload)."""
        st = stage(lm)
        if not ref.placement.same_placement(st.dram):
            raise CompileError(f"internal: upload target {ref.placement.layout} is not the image of {lm.layout}")
        transit = transit or replace(self.transit, tags=TAGS["drain"])
        emit_upload(self.b, st, dram=ref.sym, lm_mem=memory, lm_word=word, transit=transit,
                    slice_index=slice_index, reduce=reduce, ready=ready, after=after)

    def gather(self, sources: LwSources, dst: Ref, srcs: list[Ref], pad: float | int = 0) -> None:
        """DRAM-to-DRAM gather of long words (through L2BM) into `dst`."""
        zeros = self.fill_for(sources, pad, dst.placement.dtype)
        emit_convert(self.b, sources, dst=dst.sym, src=[r.sym for r in srcs], zeros=zeros, l2_addr=0,
                     l2_room=self.transit.l2_room, tags=TAGS["convert"])


def gather_mvs(ctx: EmitContext, refs: dict, reads: Iterable[tuple], blocks: bool = False) -> int | None:
    """MVs of the Data Engines' gathers that stage each (value, LM layout) of `reads` from
    where `refs` holds it (as `EmitContext.fetch_source` would: none for one stored as its
    staging's image), one per run of long words; a gather too large to list counts its runs.
    None when one cannot be listed otherwise (its lanes move: a relayout the candidate's
    timing prices). Times `gather_mv_cycles`, a lower bound of what the gathers take."""
    total = 0
    for v, layout in reads:
        held = refs[v].placement
        lm = ctx.lm_placement(layout, held.dtype)
        st = stored_staging(lm, held) or _staging_for_gather(lm, blocks)
        if held.same_placement(st.dram):
            continue
        runs = gather_runs(st.dram, held)
        if runs is None:
            return None
        total += runs
    return total


def _staging_for_gather(lm: Placement, blocks: bool) -> Staging:
    if blocks:
        try:
            return stage(lm, blocks=True)
        except LayoutError:
            pass
    return stage(lm)


def lane_compatible(dst: Placement, src: Placement, index: np.ndarray | None = None) -> bool:
    """Whether the Data Engines alone can gather `src` into `dst` (no element changes lanes)."""
    try:
        lw_sources(dst, src, index)
        return True
    except LaneMismatch:
        return False
    except LayoutError:
        return False

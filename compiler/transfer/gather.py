"""Gathers at long-word granularity: DRAM layout -> DRAM layout by MV runs through L2BM.

A conversion between two layouts, a slice, a concatenation or a shifted window is a gather:
every destination element comes from some source element (or is zero). When each destination
long word holds exactly the elements of one source long word in the same lanes, the gather is
a permutation of long words, and the Data Engines do it alone: runs of consecutive source long
words are copied into an L2BM staging buffer of the destination's Group, which is then written
to the destination in one block. Zeros come from a zero-filled DRAM buffer.

A gather is kept as its runs (`LwSources`), never as a map of every element: between two
placements, or a placement and a window of one, the runs follow from per-dimension terms
(`compiler.transfer.separable`); only an explicit element map (a movement node's) is matched
element by element.

Gathers that move elements between lanes (a transpose of the packed dimension) cannot be done
by MV; `LaneMismatch` says which element and why.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from sim import ProgramBuilder, Sym

from ..errors import LayoutError
from ..layout import Placement
from ..layout.placement import Location

DRAM, L2BM = "DRAM", "L2BM"
HOLE, ZERO = -1, -2  # source group of a destination long word nobody reads / one that must be zero
SKIP = -2  # in an index map: this destination element comes from another source (a hole here)
Address = int | Sym


class LaneMismatch(LayoutError):
    """The gather needs elements to change lanes; MV moves whole long words only."""


RUN_FIELDS = ("dst_group", "dst", "n", "src_group", "src", "buffer")  # the arrays of an LwSources


def _empty() -> np.ndarray:
    return np.zeros(0, dtype=np.int64)


@dataclass(frozen=True)
class LwSources:
    """Where destination long words come from: exact runs, sorted by (Group, long word).

    Run k covers destination long words [dst[k], dst[k] + n[k]) of Group dst_group[k], from
    source long words src[k]... of Group src_group[k] of buffer buffer[k], or zeros (src_group
    ZERO). Long words no run covers are holes: nobody reads them. Runs are exact (a hole stays
    a hole, so that `zero_holes` can still fill it); `run_arrays` lets MVs run through holes."""

    dst_group: np.ndarray
    dst: np.ndarray
    n: np.ndarray
    src_group: np.ndarray
    src: np.ndarray
    buffer: np.ndarray
    groups: int
    span: int

    # ---- construction -----------------------------------------------------------------------

    @staticmethod
    def from_runs(dst_group, dst, n, src_group, src, buffer, groups: int, span: int) -> "LwSources":
        """Normalise runs: sort, drop exact repeats, join those that continue each other. Raises
        LaneMismatch when two runs write one destination long word from different sources."""
        cols = [np.asarray(a, dtype=np.int64).ravel() for a in (dst_group, dst, n, src_group, src, buffer)]
        dst_group, dst, n, src_group, src, buffer = cols
        keep = n > 0
        if not keep.all():
            dst_group, dst, n, src_group, src, buffer = (a[keep] for a in (dst_group, dst, n, src_group, src, buffer))
        src = np.where(src_group == ZERO, 0, src)
        position = dst_group * (int(dst.max(initial=0)) + 1) + dst
        order = np.argsort(position, kind="stable")
        if len(order) > 1 and (position[order][1:] == position[order][:-1]).any():  # ties: repeats side by side
            order = np.lexsort((n, src, src_group, buffer, dst, dst_group))
        dst_group, dst, n, src_group, src, buffer = (a[order] for a in (dst_group, dst, n, src_group, src, buffer))
        if len(dst) > 1:
            repeat = (dst_group[1:] == dst_group[:-1]) & (dst[1:] == dst[:-1]) & (n[1:] == n[:-1]) & \
                (src_group[1:] == src_group[:-1]) & (src[1:] == src[:-1]) & (buffer[1:] == buffer[:-1])
            if repeat.any():
                keep = np.concatenate(([True], ~repeat))
                dst_group, dst, n, src_group, src, buffer = (a[keep] for a in (dst_group, dst, n, src_group, src,
                                                                               buffer))
            same_group = dst_group[1:] == dst_group[:-1]
            overlap = same_group & (dst[1:] < dst[:-1] + n[:-1])
            if overlap.any():
                i = int(np.flatnonzero(overlap)[0]) + 1
                raise LaneMismatch(f"long word {int(dst[i])} of Group {int(dst_group[i])} mixes elements of "
                                   f"different source long words")
            join = same_group & (dst[1:] == dst[:-1] + n[:-1]) & (buffer[1:] == buffer[:-1]) & \
                (src_group[1:] == src_group[:-1]) & ((src_group[1:] == ZERO) | (src[1:] == src[:-1] + n[:-1]))
            if join.any():
                start = np.concatenate(([True], ~join))
                first = np.flatnonzero(start)
                last = np.concatenate((first[1:], [len(dst)])) - 1
                n = dst[last] + n[last] - dst[first]
                dst_group, dst, src_group, src, buffer = (a[first] for a in (dst_group, dst, src_group, src, buffer))
        if len(dst) and (dst_group.min() < 0 or dst_group.max() >= groups or dst.min() < 0):
            raise LayoutError("internal: a gather writes outside its destination's Groups")
        return LwSources(dst_group, dst, n, src_group, src, buffer, groups, span)

    @staticmethod
    def from_words(group: np.ndarray, address: np.ndarray, buffer: np.ndarray | None = None) -> "LwSources":
        """From one (source Group, address) per destination long word ([Groups, span] arrays;
        HOLE where nothing is read)."""
        groups, span = group.shape
        buffer = np.zeros_like(group) if buffer is None else buffer
        g_idx, at = np.nonzero(group != HOLE)
        if len(at) == 0:
            return LwSources(*(_empty() for _ in RUN_FIELDS), groups, span)
        gg, aa, bb = group[g_idx, at], address[g_idx, at], buffer[g_idx, at]
        # exact runs: consecutive positions whose sources are consecutive (zeros: any address)
        brk = (g_idx[1:] != g_idx[:-1]) | (at[1:] != at[:-1] + 1) | (gg[1:] != gg[:-1]) | (bb[1:] != bb[:-1]) | \
            ((gg[1:] != ZERO) & (aa[1:] != aa[:-1] + 1))
        first = np.concatenate(([0], np.flatnonzero(brk) + 1))
        last = np.concatenate((first[1:], [len(at)])) - 1
        return LwSources(g_idx[first], at[first], at[last] - at[first] + 1, gg[first], np.where(gg[first] == ZERO, 0,
                                                                                                aa[first]),
                         bb[first], groups, span)

    # ---- queries ----------------------------------------------------------------------------

    @cached_property
    def _group_bounds(self) -> np.ndarray:
        return np.searchsorted(self.dst_group, np.arange(self.groups + 1))

    @cached_property
    def _end(self) -> np.ndarray:
        return self.dst + self.n

    @cached_property
    def _keys(self) -> tuple[int, np.ndarray, np.ndarray]:
        """(width, start keys, end keys): runs ordered by Group * width + long word, for searching."""
        width = int(max(self._end.max(initial=0), self.span)) + 1
        return width, self.dst_group * width + self.dst, self.dst_group * width + self._end

    def of_group(self, group: int, first: int = 0, last: int | None = None) -> tuple[np.ndarray, ...]:
        """The exact runs of one destination Group clipped to long words [first, last):
        (dst, n, source group, src, buffer)."""
        last = self.span if last is None else last
        a, z = self._group_bounds[group], self._group_bounds[group + 1]
        dst, n = self.dst[a:z], self.n[a:z]
        lo = np.searchsorted(self._end[a:z], first, side="right")
        hi = np.searchsorted(dst, last, side="left")
        dst, n, sg, src, buf = (x[lo:hi] for x in (dst, n, self.src_group[a:z], self.src[a:z], self.buffer[a:z]))
        start = np.maximum(dst, first)
        end = np.minimum(dst + n, last)
        src = np.where(sg == ZERO, 0, src + (start - dst))
        return start, end - start, sg, src, buf

    def busy(self, group: int, first: int, last: int) -> bool:
        return len(self.of_group(group, first, last)[0]) > 0

    @property
    def has_zeros(self) -> bool:
        return bool((self.src_group == ZERO).any())

    @cached_property
    def _joined(self) -> tuple[np.ndarray, ...]:
        """The MVs of the whole gather, every Group: `run_arrays_many` over each Group's span."""
        groups = np.arange(self.groups, dtype=np.int64)
        return run_arrays_many(self, groups, np.zeros_like(groups), np.full_like(groups, self.span))

    @property
    def mv_count(self) -> int:
        """MVs of the whole gather, its runs joined across holes (`run_arrays`): a kernel that
        fetches it in slices issues at least this many."""
        return len(self._joined[1])

    @property
    def longest_zero_run(self) -> int:
        """The longest run of zeros the MVs will read (runs joined across holes): how large a
        zero buffer the gather needs."""
        _, _, group, _, n, _ = self._joined
        zero = group == ZERO
        return int(n[zero].max()) if zero.any() else 0

    def zero_holes(self, span: int = 0) -> "LwSources":
        """Holes become zeros, up to `span` long words (past the last element too): for operands
        whose padding is summed (a matrix product's K)."""
        span = max(span, self.span)
        parts = [(self.dst_group, self.dst, self.n, self.src_group, self.src, self.buffer)]
        for g in range(self.groups):
            dst, n = self.of_group(g, 0, span)[:2]
            starts = np.concatenate(([0], dst + n))
            ends = np.concatenate((dst, [span]))
            gap = ends > starts
            k = int(gap.sum())
            parts.append((np.full(k, g), starts[gap], (ends - starts)[gap], np.full(k, ZERO), np.zeros(k, np.int64),
                          np.zeros(k, np.int64)))
        return LwSources.from_runs(*(np.concatenate(cols) for cols in zip(*parts)), self.groups, span)

    @staticmethod
    def merge(parts: list["LwSources"]) -> "LwSources":
        """Combine gathers of disjoint destination long words from several source buffers."""
        cols = [np.concatenate([getattr(p, name) if name != "buffer" else np.full(len(p.dst), k)
                                for k, p in enumerate(parts)])
                for name in RUN_FIELDS]
        return LwSources.from_runs(*cols, parts[0].groups, max(p.span for p in parts))


_CACHE: "OrderedDict[tuple, LwSources | LaneMismatch]" = OrderedDict()
CACHED_GATHERS = 256  # conversions kept (planning asks for the same ones repeatedly; compile-time cache)


def lw_sources(dst: "Placement | DimTerms", src: "Placement | DimTerms", index: np.ndarray | None = None
               ) -> LwSources:
    """Match every destination long word to one source long word; raise LaneMismatch if impossible.

    Either side is a placement or a window of one (`DimTerms`). `index[e]` is the source element
    of destination element e (flat); -1 means zero, SKIP that the element comes from another
    source. Without it, element e comes from element e (a conversion between layouts of one
    tensor, or a window read as a tensor); those are matched on their per-dimension terms, and
    cached."""
    from .separable import DimTerms, separable_sources
    if index is not None:
        return _element_sources(dst, src, index)
    side = lambda p: p.key() if isinstance(p, DimTerms) else p.layout._key()  # noqa: E731
    key = (side(dst), dst.dtype, side(src), src.dtype, src.placement.hw.fingerprint if isinstance(src, DimTerms)
           else src.hw.fingerprint)
    found = _CACHE.get(key)
    if found is None:
        try:
            found = separable_sources(dst, src)
            if found is None:
                if isinstance(src, DimTerms) or isinstance(dst, DimTerms):
                    raise LayoutError("internal: a window whose terms do not separate")
                found = _element_sources(dst, src, None)
        except LaneMismatch as e:
            found = e
        _CACHE[key] = found
        if len(_CACHE) > CACHED_GATHERS:
            _CACHE.popitem(last=False)
    else:
        _CACHE.move_to_end(key)
    if isinstance(found, LaneMismatch):
        raise LaneMismatch(str(found))
    return found


def _element_sources(dst: Placement, src: Placement, index: np.ndarray | None) -> LwSources:
    """The gather matched element by element (an explicit element map, or layouts whose terms
    do not separate)."""
    if dst.memory != DRAM or src.memory != DRAM:
        raise LayoutError("long-word gathers write and read DRAM placements")
    if dst.epl != src.epl:
        raise LaneMismatch(f"destination and {src.dtype} source pack {dst.epl} and {src.epl} elements per long word")
    groups, span = dst.instance_count, dst.span_lw
    want = dst.locate()
    source = want.element if index is None else np.asarray(index, dtype=np.int64).ravel()[want.element]
    keep = source != SKIP
    want = Location(want.element[keep], want.instance[keep], want.lw[keep], want.w[keep],
                    {k: v[keep] for k, v in want.coords.items()}, want.time[keep])
    source = source[keep]
    zero = source < 0
    # A replicated source offers several copies: read one in the destination's lane (a W-broadcast
    # source has every element in every lane), in the destination's own Group if it can.
    every = src.locate(np.where(zero, 0, source))  # one row per (element, copy)
    copies = src.copies
    same_lane = every.w.reshape(-1, copies) == want.w[:, None]
    same_group = every.instance.reshape(-1, copies) == want.instance[:, None]
    pick = np.argmax(same_lane * 2 + (same_lane & same_group), axis=1)
    rows = np.arange(len(source)) * copies + pick
    s_group, s_addr, s_w = every.instance[rows], every.lw[rows], every.w[rows]
    bad = ~zero & (s_w != want.w)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise LaneMismatch(f"element {int(want.element[i])} sits in lane {int(want.w[i])} of {dst.layout} but comes "
                           f"from lane {int(s_w[i])} of {src.layout}")
    group = np.full((groups, span), HOLE, dtype=np.int64)
    address = np.zeros((groups, span), dtype=np.int64)
    s_group = np.where(zero, ZERO, s_group)
    s_addr = np.where(zero, 0, s_addr)
    key = want.instance * span + want.lw
    flat_g, flat_a = group.reshape(-1), address.reshape(-1)
    flat_g[key] = s_group
    flat_a[key] = s_addr
    # every lane of a destination long word must name the same source long word
    conflict = (flat_g[key] != s_group) | (flat_a[key] != s_addr)
    if conflict.any():
        i = int(np.flatnonzero(conflict)[0])
        raise LaneMismatch(f"long word {int(want.lw[i])} of Group {int(want.instance[i])} in {dst.layout} mixes "
                           f"elements of different source long words")
    return LwSources.from_words(group, address)


@dataclass(frozen=True)
class Run:
    dst: int  # destination long word (in its Group)
    group: int  # source Group, or ZERO
    src: int  # source long word
    n: int
    buffer: int = 0


def run_arrays(sources: LwSources, group: int, first: int, last: int) -> tuple[np.ndarray, ...]:
    """The MVs of long words [first, last) of a destination Group, as arrays (dst, source group,
    src, n, buffer): the exact runs, joined across holes where the sources continue (a hole's
    content does not matter; zeros join any zeros)."""
    _, dst, gg, aa, n, bb = run_arrays_many(sources, np.array([group]), np.array([first]), np.array([last]))
    return dst, gg, aa, n, bb


def runs(sources: LwSources, group: int, first: int, last: int) -> list[Run]:
    """`run_arrays` as Run records."""
    return [Run(int(d), int(g), int(s), int(n), int(b)) for d, g, s, n, b in zip(*run_arrays(sources, group, first, last))]


def emit_runs(b: ProgramBuilder, sources: LwSources, *, dst_group: int, first: int, last: int,
              src: Address | list[Address], zeros: Address | None, l2_instance: int, l2_addr: int, tag: int) -> int:
    """MV the sources of destination long words [first, last) of one Group into an L2BM buffer
    (destination long word first + k lands at l2_addr + k). `src` lists the source buffers of a
    merged gather. Returns the MVs emitted."""
    return emit_pieces(b, sources, [(dst_group, first, last, l2_instance)], src=src, zeros=zeros, l2_addr=l2_addr,
                       tag=tag)


def emit_pieces(b: ProgramBuilder, sources: LwSources, pieces: list[tuple[int, int, int, int]], *,
                src: Address | list[Address], zeros: Address | None, l2_addr: int, tag: int) -> int:
    """`emit_runs` for several (dst Group, first, last, L2BM instance) pieces, as one block of MVs
    in the order given (a piece's runs in destination order)."""
    srcs = src if isinstance(src, list) else [src]
    if not pieces:
        return 0
    group_of, first, last, l2_instance = (np.array(c, dtype=np.int64) for c in zip(*pieces))
    piece, dst, group, address, n, buffer = run_arrays_many(sources, group_of, first, last)
    if len(dst) == 0:
        return 0
    zero = group == ZERO
    if zeros is None and zero.any():
        raise LayoutError("this gather needs zeros but no zero buffer was given")
    bases = srcs + ([zeros] if zeros is not None else [])
    b.mv_block("individual", DRAM, bases, np.where(zero, 0, address), L2BM, l2_addr, dst - first[piece], n, tag=tag,
               src_inst=np.where(zero, group_of[piece], group), dst_inst=l2_instance[piece],
               src_which=np.where(zero, len(srcs), buffer))
    return len(n)


def run_arrays_many(sources: LwSources, group: np.ndarray, first: np.ndarray, last: np.ndarray
                    ) -> tuple[np.ndarray, ...]:
    """`run_arrays` of many (Group, first, last) ranges at once: (range index, dst, source group,
    src, n, buffer), the ranges' runs one after the other."""
    empty = (_empty(),) + tuple(_empty() for _ in RUN_FIELDS[1:])  # (range index, dst, group, src, n, buffer)
    if len(sources.dst) == 0:
        return empty
    width, starts, ends = sources._keys
    last = np.minimum(last, sources.span)
    first = np.minimum(first, last)
    lo = np.searchsorted(ends, group * width + first, side="right")
    hi = np.maximum(np.searchsorted(starts, group * width + last, side="left"), lo)
    counts = hi - lo
    total = int(counts.sum())
    if total == 0:
        return empty
    piece = np.repeat(np.arange(len(counts)), counts)
    idx = np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts) + lo[piece]
    dst, end = np.maximum(sources.dst[idx], first[piece]), np.minimum(sources._end[idx], last[piece])
    gg, bb = sources.src_group[idx], sources.buffer[idx]
    aa = np.where(gg == ZERO, 0, sources.src[idx] + (dst - sources.dst[idx]))
    join = (piece[1:] == piece[:-1]) & (gg[1:] == gg[:-1]) & (bb[1:] == bb[:-1]) & \
        ((gg[1:] == ZERO) | (aa[1:] - aa[:-1] == dst[1:] - dst[:-1]))
    head = np.flatnonzero(np.concatenate(([True], ~join)))
    tail = np.concatenate((head[1:], [total])) - 1
    return piece[head], dst[head], gg[head], aa[head], end[tail] - dst[head], bb[head]


def emit_convert(b: ProgramBuilder, sources: LwSources, *, dst: Address, src: Address | list[Address],
                 zeros: Address | None,
                 l2_addr: int, l2_room: int, tags: tuple[int, int]) -> None:
    """DRAM -> DRAM gather: per Group, pieces of the destination pass through the Group's first L2BM.

    A piece's runs fill the L2BM (tag 0), then one MV writes it back (tag 1). Reusing the buffer
    for the next piece needs no wait: every MV into a Group's L2BM runs on that Group's Data
    Engine, which serves transfers in order, after the write-back."""
    params = b.params
    l2_per_group = params.instances_per_group(params.memory_id(L2BM))
    fill, drain = tags
    for first in range(0, sources.span, l2_room):
        last = min(sources.span, first + l2_room)
        busy = [g for g in range(sources.groups) if sources.busy(g, first, last)]
        for g in busy:
            emit_runs(b, sources, dst_group=g, first=first, last=last, src=src, zeros=zeros,
                      l2_instance=g * l2_per_group, l2_addr=l2_addr, tag=fill)
        if busy:
            b.wait(fill)
        for g in busy:
            b.mv("individual", L2BM, l2_addr, DRAM, dst + first, last - first, tag=drain, src_inst=g * l2_per_group,
                 dst_inst=g)
    b.wait(drain)

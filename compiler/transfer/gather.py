"""Gathers at long-word granularity: DRAM layout -> DRAM layout by MV runs through L2BM.

A conversion between two layouts, a slice, a concatenation or a shifted window is a gather:
every destination element comes from some source element (or is zero). When each destination
long word holds exactly the elements of one source long word in the same lanes, the gather is
a permutation of long words, and the Data Engines do it alone: runs of consecutive source long
words are copied into an L2BM staging buffer of the destination's Group, which is then written
to the destination in one block. Zeros come from a zero-filled DRAM buffer.

Gathers that move elements between lanes (a transpose of the packed dimension) cannot be done
by MV; `LaneMismatch` says which element and why.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

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


@dataclass(frozen=True)
class LwSources:
    """Where each destination long word comes from: [Groups, span] arrays of (buffer, group, address)."""

    group: np.ndarray  # source Group, or HOLE / ZERO
    address: np.ndarray
    groups: int
    span: int
    buffer: np.ndarray | None = None  # which source buffer (cat reads several); None: all from one

    def source_buffer(self) -> np.ndarray:
        return self.buffer if self.buffer is not None else np.zeros_like(self.group)

    def zero_holes(self, span: int = 0) -> "LwSources":
        """Holes become zeros, up to `span` long words (past the last element too): for operands
        whose padding is summed (a matrix product's K)."""
        span = max(span, self.span)
        pad = span - self.span
        widen = lambda a, fill: np.pad(a, ((0, 0), (0, pad)), constant_values=fill) if pad else a  # noqa: E731
        group = np.where(self.group == HOLE, ZERO, self.group)
        buffer = widen(self.buffer, 0) if self.buffer is not None else None
        return LwSources(widen(group, ZERO), widen(self.address, 0), self.groups, span, buffer)

    @staticmethod
    def merge(parts: list["LwSources"]) -> "LwSources":
        """Combine gathers of disjoint destination elements from several source buffers."""
        group = np.full_like(parts[0].group, HOLE)
        address = np.zeros_like(parts[0].address)
        buffer = np.zeros_like(parts[0].group)
        for k, part in enumerate(parts):
            mine = part.group != HOLE
            group[mine], address[mine], buffer[mine] = part.group[mine], part.address[mine], k
        return LwSources(group, address, parts[0].groups, parts[0].span, buffer)

    @property
    def is_identity(self) -> bool:
        used = self.group >= 0
        g = np.broadcast_to(np.arange(self.groups)[:, None], self.group.shape)
        a = np.broadcast_to(np.arange(self.span)[None, :], self.group.shape)
        return bool(np.all(~used | ((self.group == g) & (self.address == a))))


@dataclass(frozen=True)
class Destination:
    """Where a gather writes: every (element, copy) location, the Groups and the span, as numbers.
    A DRAM Placement gives one (`of`); so does a staging image that has no PFN notation."""

    want: Location
    groups: int
    span: int
    epl: int
    name: str  # for messages

    @staticmethod
    def of(p: Placement) -> "Destination":
        if p.memory != DRAM:
            raise LayoutError("long-word gathers write DRAM placements")
        return Destination(p.locate(), p.instance_count, p.span_lw, p.epl, str(p.layout))


_CACHE: "OrderedDict[tuple, LwSources | LaneMismatch]" = OrderedDict()
CACHED_GATHERS = 256  # conversions kept (planning asks for the same ones repeatedly; compile-time cache)


def lw_sources(dst: "Placement | Destination", src: Placement, index: np.ndarray | None = None) -> LwSources:
    """Match every destination long word to one source long word; raise LaneMismatch if impossible.

    `index[e]` is the source element of destination element e (flat); -1 means zero, SKIP that
    the element comes from another source. Without it, element e comes from element e (a
    conversion between layouts of one tensor); those answers are cached."""
    if index is not None:
        return _lw_sources(dst, src, index)
    d = dst if isinstance(dst, Destination) else None
    key = (d.name if d is not None else str(dst.layout), dst.memory if d is None else "image", src.layout._key(),
           src.dtype, src.hw.fingerprint)
    found = _CACHE.get(key)
    if found is None:
        try:
            found = _lw_sources(dst, src, None)
        except LaneMismatch as e:
            found = e
        _CACHE[key] = found
        if len(_CACHE) > CACHED_GATHERS:
            _CACHE.popitem(last=False)
    if isinstance(found, LaneMismatch):
        raise LaneMismatch(str(found))
    return found


def _lw_sources(dst: "Placement | Destination", src: Placement, index: np.ndarray | None) -> LwSources:
    dst = dst if isinstance(dst, Destination) else Destination.of(dst)
    if src.memory != DRAM:
        raise LayoutError("long-word gathers read DRAM placements")
    if dst.epl != src.epl:
        raise LaneMismatch(f"destination and {src.dtype} source pack {dst.epl} and {src.epl} elements per long word")
    groups, span = dst.groups, dst.span
    want = dst.want
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
        raise LaneMismatch(f"element {int(want.element[i])} sits in lane {int(want.w[i])} of {dst.name} but comes "
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
        raise LaneMismatch(f"long word {int(want.lw[i])} of Group {int(want.instance[i])} in {dst.name} mixes "
                           f"elements of different source long words")
    return LwSources(group, address, groups, span)


@dataclass(frozen=True)
class Run:
    dst: int  # destination long word (in its Group)
    group: int  # source Group, or ZERO
    src: int  # source long word
    n: int
    buffer: int = 0


def run_arrays(sources: LwSources, group: int, first: int, last: int) -> tuple[np.ndarray, ...]:
    """Maximal runs of [first, last) of a destination Group whose sources are consecutive, as
    arrays (dst, source group, src, n, buffer); holes (and positions past the destination's span)
    extend any run: their content does not matter."""
    last = min(last, sources.span)
    g, a = sources.group[group, first:last], sources.address[group, first:last]
    buf = sources.source_buffer()[group, first:last]
    at = np.flatnonzero(g != HOLE)
    if len(at) == 0:
        return tuple(np.zeros(0, dtype=np.int64) for _ in range(5))
    gg, aa, bb = g[at], a[at], buf[at]
    breaks = (gg[1:] != gg[:-1]) | (bb[1:] != bb[:-1]) | ((gg[1:] != ZERO) & (aa[1:] - aa[:-1] != at[1:] - at[:-1]))
    starts = np.concatenate(([0], np.flatnonzero(breaks) + 1))
    ends = np.concatenate((starts[1:] - 1, [len(at) - 1]))
    return (first + at[starts], gg[starts], aa[starts], at[ends] - at[starts] + 1, bb[starts])


def runs(sources: LwSources, group: int, first: int, last: int) -> list[Run]:
    """`run_arrays` as Run records."""
    return [Run(int(d), int(g), int(s), int(n), int(b)) for d, g, s, n, b in zip(*run_arrays(sources, group, first, last))]


def emit_runs(b: ProgramBuilder, sources: LwSources, *, dst_group: int, first: int, last: int,
              src: Address | list[Address], zeros: Address | None, l2_instance: int, l2_addr: int, tag: int) -> int:
    """MV the sources of destination long words [first, last) of one Group into an L2BM buffer
    (destination long word first + k lands at l2_addr + k). `src` lists the source buffers of a
    merged gather. Returns the MVs emitted."""
    srcs = src if isinstance(src, list) else [src]
    dst, group, address, n, buffer = run_arrays(sources, dst_group, first, last)
    zero = group == ZERO
    if zero.any() and zeros is None:
        raise LayoutError("this gather needs zeros but no zero buffer was given")
    if len(dst) == 0:
        return 0
    order = np.argsort(dst, kind="stable")  # destination order, a block per stretch of one source
    kind = np.where(zero, -1, buffer)[order]
    cuts = np.concatenate(([0], np.flatnonzero(kind[1:] != kind[:-1]) + 1, [len(order)]))
    for a, z in zip(cuts[:-1], cuts[1:]):
        rows = order[a:z]
        which = int(kind[a])
        base = zeros if which < 0 else srcs[which]
        offsets = np.zeros(len(rows), dtype=np.int64) if which < 0 else address[rows]
        b.mv_block("individual", DRAM, base, offsets, L2BM, l2_addr - first, dst[rows], n[rows], tag=tag,
                   src_inst=dst_group if which < 0 else group[rows], dst_inst=l2_instance)
    return len(order)


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
        busy = [g for g in range(sources.groups) if not (sources.group[g, first:last] == HOLE).all()]
        for g in busy:
            emit_runs(b, sources, dst_group=g, first=first, last=last, src=src, zeros=zeros,
                      l2_instance=g * l2_per_group, l2_addr=l2_addr, tag=fill)
        if busy:
            b.wait(fill)
        for g in busy:
            b.mv("individual", L2BM, l2_addr, DRAM, dst + first, last - first, tag=drain, src_inst=g * l2_per_group,
                 dst_inst=g)
    b.wait(drain)

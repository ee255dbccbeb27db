"""`LwSources`: where each destination long word of a gather comes from, kept as runs.

The value the gather planners (compiler.transfer.gather, compiler.transfer.separable) build and
the emitters read: per destination Group, runs of consecutive long words and the source Group
and long word each starts at (ZERO for zeros; long words no run covers are holes).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ..errors import LayoutError

HOLE, ZERO = -1, -2  # source group of a destination long word nobody reads / one that must be zero
SKIP = -2  # in an index map: this destination element comes from another source (a hole here)


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

    @cached_property
    def same_in_every_group(self) -> bool:
        """Whether every destination Group reads the same source long words (a destination
        replicated over the Groups, from a source that is not): each Group's copy is then the
        same data, which one Group may gather and the others copy."""
        if self.groups < 2:
            return False
        bounds = self._group_bounds
        return all(np.array_equal(a[bounds[g]:bounds[g + 1]], a[bounds[0]:bounds[1]])
                   for a in (self.dst, self.n, self.src_group, self.src, self.buffer) for g in range(1, self.groups))

    @cached_property
    def has_zeros(self) -> bool:
        return bool((self.src_group == ZERO).any())

    @cached_property
    def _joined(self) -> tuple[np.ndarray, ...]:
        """The MVs of the whole gather, every Group: `run_arrays_many` over each Group's span."""
        groups = np.arange(self.groups, dtype=np.int64)
        return run_arrays_many(self, groups, np.zeros_like(groups), np.full_like(groups, self.span))

    @property
    def nbytes(self) -> int:
        """Host bytes of the run arrays (what a cache of gathers holds)."""
        return sum(a.nbytes for a in (self.dst_group, self.dst, self.n, self.src_group, self.src, self.buffer))

    @property
    def mv_count(self) -> int:
        """MVs of the whole gather, its runs joined across holes (`run_arrays`): a kernel that
        fetches it in slices issues at least this many. A destination every Group holds alike is
        gathered once, each Group a piece (`gather.emit_convert`): one Group's runs."""
        if self.same_in_every_group:
            return int((self._joined[0] == 0).sum())
        return len(self._joined[1])

    @cached_property
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

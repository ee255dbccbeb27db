"""Long-word gathers computed from per-dimension terms: runs, never a map of every element.

In a linear placement an element's (Group, long word, lane) is a sum over the tensor's
dimensions of what each index adds (`Placement.dim_terms`). So is a window of one: the im2col
matrix of a convolution reads x[n, c, ho*s + i*d, wo*s + j*d], which is a sum of terms of
(n, ho, wo) and of (i, j, c) when x's H and W terms are linear. When the destination and the
source are both such sums, a gather between them splits by dimension:

* lanes must match dimension by dimension (each dimension moves a lane by a constant, and the
  constants cancel), or the source has every element in every lane;
* per dimension, the index values that share a destination long word must share a source one;
  the distinct (destination, source) long-word pairs of a dimension are few (its size over its
  lanes);
* runs of consecutive long words on both sides lie along one dimension (chosen to give the
  fewest runs) and every combination of the other dimensions' pairs starts one.

The work is the runs' count, which is what the program's MVs cost anyway. `separable_sources`
returns None for what it cannot separate (a non-linear instance map, copies it cannot pick
from); callers then match element by element (`gather._element_sources`).
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

import numpy as np

from ..errors import LayoutError
from ..layout import Placement
from .sources import LaneMismatch, LwSources

Terms = tuple[np.ndarray, np.ndarray, np.ndarray]  # (Group, long word, lane) added by each index value
PAIR = ("dst Group", "dst", "src Group", "src")  # the columns of a dimension's long-word pairs
# A gather of more runs than this is refused (GatherTooLarge) rather than listed: its runs take
# about 100 bytes each to build, and a GPT-2's tied 50,257 x 768 table read transposed was 77 M
# runs, 15 GB of host memory, as one planner candidate. Such a gather is also tens of millions of
# MVs on the chip. A compile-time budget, not a hardware number.
MAX_GATHER_RUNS = 8_000_000


class GatherTooLarge(LayoutError):
    """A gather whose runs would pass MAX_GATHER_RUNS (`runs` of them)."""

    def __init__(self, message: str, runs: int) -> None:
        super().__init__(message)
        self.runs = runs


@dataclass(frozen=True, eq=False)
class DimTerms:
    """A tensor's elements as sums of per-dimension terms over a placement's storage: the
    placement itself (`of`), or a window of it (a view that may read one element many times).

    `copies` are a placement's broadcast copies as (Group, lane) offsets: a destination writes
    every element at each; a source offers them, and a reader takes the copy in its own Group
    when there is one (`group_copies`, the distinct Group offsets), and any lane when the source
    holds every element in every lane (`every_lane`)."""

    placement: Placement
    terms: tuple[Terms, ...]
    base: int = 0  # long words from the placement's start
    copies: tuple[np.ndarray, np.ndarray] | None = None
    group_copies: tuple[int, ...] = (0,)
    every_lane: bool = False
    view: str = ""  # what window this is, for cache keys and messages ("": the placement itself)
    # the index sets read, each with a (Group, long word) it adds (None: every index, nothing
    # added); elsewhere holes
    boxes: tuple[tuple[tuple[np.ndarray, ...], tuple[int, int]], ...] | None = None

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(len(t[0]) for t in self.terms)

    @property
    def dtype(self) -> str:
        return self.placement.dtype

    def key(self) -> tuple:
        return (self.placement.layout.key(), self.view, self.base, self.shape)

    @staticmethod
    def of(p: Placement, *, sizes: tuple[int, ...] | None = None) -> "DimTerms | None":
        """A DRAM placement's terms (over `sizes` index values per dimension, padding positions
        included; default the shape), or None when its instance map is not linear."""
        if p.memory != "DRAM" or not p.linear:
            return None
        slot = np.unique(p.copy_slot)
        every_lane = len(slot) > 1 and np.array_equal(slot, np.arange(p.epl))
        copies = (p.copy_inst, p.copy_slot) if p.copies > 1 else None
        terms = tuple(p.dim_terms(sizes))
        return DimTerms(p, terms, 0, copies, tuple(np.unique(p.copy_inst).tolist()), every_lane,
                        "" if sizes is None else f"sizes{sizes}")

    def regrouped(self, groups: list[list[int]], view: str) -> "DimTerms":
        """The same elements as a tensor whose dimension k flattens dimensions groups[k] (the first
        outermost): a permutation and a reshape that merges dimensions, e.g. (N, C, H, W) read as
        the (N*H*W, C) matrix. Flattening is a sum of terms, so it always separates."""
        if self.boxes is not None:
            raise LayoutError("internal: regrouping a window with boxes")
        terms = [flatten_terms(*(self.terms[d] for d in dims)) for dims in groups]
        return DimTerms(self.placement, tuple(terms), self.base, self.copies, self.group_copies, self.every_lane,
                        f"{self.view} {view}".strip())

    def run_lw(self) -> float:
        """Long words per run when the elements are read in order (last dimension fastest), from
        the terms: the runs of the inner dimensions, joined across an outer one while the inner
        ones form one run and the outer one steps by its length; or, when longer, the runs along a
        single dimension (a gather may run along any one). Holes and box edges are not counted
        (they only cut runs), so the figure is an upper bound, which is what an estimate that must
        not exceed the real cost needs."""
        def runs(group: np.ndarray, lw: np.ndarray, step: float) -> tuple[int, int]:
            keep = np.concatenate(([True], (group[1:] != group[:-1]) | (lw[1:] != lw[:-1])))
            g, w = group[keep], lw[keep]  # the distinct long words along the dimension, in order
            return len(w), int(np.count_nonzero((g[1:] != g[:-1]) | (w[1:] != w[:-1] + step))) + 1

        along_one = max((n / k for n, k in (runs(g, w, 1) for g, w, _ in self.terms)), default=1.0)
        length = 1.0
        for group, lw, _ in reversed(self.terms):
            distinct, count = runs(group, lw, length)
            if count > 1:
                return max(along_one, length * distinct / count)
            length *= distinct
        return max(along_one, length)

    def groups_spanned(self) -> int:
        """How many Groups hold the elements (their Data Engines can serve reads side by side)."""
        groups = np.zeros(1, dtype=np.int64)
        for group, _, _ in self.terms:
            groups = np.unique(np.add.outer(groups, np.unique(group)))
        return len(groups)

    @property
    def readable(self) -> bool:
        """Whether a reader knows which lane holds an element: one lane, or every lane."""
        return self.copies is None or len(np.unique(self.copies[1])) == 1 or self.every_lane


def flatten_terms(*parts: Terms) -> Terms:
    """The terms of a dimension that flattens `parts` (the first outermost): sums of theirs."""
    out = []
    for k in range(3):
        total = np.zeros(1, dtype=np.int64)
        for part in parts:
            total = np.add.outer(total, part[k]).ravel()
        out.append(total)
    return tuple(out)


def separable_sources(dst: "Placement | DimTerms", src: "Placement | DimTerms") -> LwSources | None:
    """The runs that gather `src` into `dst` (same shape), from their per-dimension terms; None
    when either does not separate. Raises LaneMismatch when the gather would move lanes."""
    d = dst if isinstance(dst, DimTerms) else DimTerms.of(dst)
    s = src if isinstance(src, DimTerms) else DimTerms.of(src)
    if d is None or s is None or not s.readable:
        return None
    if d.shape != s.shape:
        raise LayoutError(f"internal: gather of shape {s.shape} into shape {d.shape}")
    if d.placement.epl != s.placement.epl:
        raise LaneMismatch(f"destination and {s.dtype} source pack {d.placement.epl} and {s.placement.epl} elements "
                           f"per long word")
    boxes = s.boxes if s.boxes is not None else ((None, (0, 0)),)
    parts = []
    for box, (add_group, add_lw) in boxes:
        try:
            dst_group, dst_lw, src_group, src_lw, n = _box_runs(d, s, box)
        except GatherTooLarge as e:
            raise GatherTooLarge(f"{s.placement.layout}{_window(s)} into {d.placement.layout}: {e}", e.runs) from None
        parts.append((dst_group, dst_lw, src_group + add_group, src_lw + add_lw, n))
    dst_group, dst_lw, src_group, src_lw, n = (np.concatenate(cols) for cols in zip(*parts))
    dst_lw, src_lw = dst_lw + d.base, src_lw + s.base
    if len(s.group_copies) > 1:  # the copy in the destination's Group, if the source keeps one there
        src_group = np.where(np.isin(dst_group - src_group, s.group_copies), dst_group, src_group)
    if len(n) and (src_lw.min() < 0 or (src_lw + n).max() > max(s.placement.span_lw, 1)):
        raise LayoutError(f"internal: {s.placement.layout}{_window(s)} reads outside its storage")
    return LwSources.from_runs(dst_group, dst_lw, n, src_group, src_lw, np.zeros_like(n),
                               d.placement.instance_count, d.placement.span_lw)


def _box_runs(d: DimTerms, s: DimTerms, box: tuple[np.ndarray, ...] | None) -> tuple[np.ndarray, ...]:
    """The runs of the elements whose indices lie in `box` (per dimension, the index values; None:
    all): (dst Group, dst, src Group, src, n), before the bases are added."""
    pick = (lambda t, k: t) if box is None else (lambda t, k: tuple(a[box[k]] for a in t))  # noqa: E731
    at = (lambda k, i: i) if box is None else (lambda k, i: int(box[k][i]))  # noqa: E731
    pairs, shift = [], 0
    for k, (dst_terms, src_terms) in enumerate(zip(d.terms, s.terms)):
        (dg, dl, dw), (sg, sl, sw) = pick(dst_terms, k), pick(src_terms, k)
        if not s.every_lane and len(dw):
            moved = dw - sw
            if (moved != moved[0]).any():
                i = int(np.flatnonzero(moved != moved[0])[0])
                where = tuple(at(k, i) if j == k else 0 for j in range(len(d.terms)))
                lanes = [(sum(int(t[2][x]) for t, x in zip(side.terms, where))) for side in (d, s)]
                raise LaneMismatch(f"element {where} sits in lane {lanes[0]} of {d.placement.layout} but comes from "
                                   f"lane {lanes[1]} of {s.placement.layout}{_window(s)}")
            shift += int(moved[0])
        rows = _distinct_pairs(dg, dl, sg, sl)
        if rows is None:
            raise LaneMismatch(f"a long word of {d.placement.layout} holds indices of dimension {k} from different "
                               f"long words of {s.placement.layout}{_window(s)}")
        pairs.append(rows)
    if shift:
        raise LaneMismatch(f"the gather shifts every element by {shift} lanes from {s.placement.layout}{_window(s)} "
                           f"into {d.placement.layout}")
    if d.copies is not None:
        group, lane = d.copies
        if not s.every_lane and (lane != 0).any():
            raise LaneMismatch(f"{d.placement.layout} repeats elements over lanes; {s.placement.layout} does not")
        zero = np.zeros_like(group)
        pairs.append(np.unique(np.stack([group, zero, zero, zero], axis=1), axis=0))
    if any(len(r) == 0 for r in pairs):
        return tuple(np.zeros(0, dtype=np.int64) for _ in (*PAIR, "n"))
    return _enumerate(pairs)


def _distinct_pairs(dg: np.ndarray, dl: np.ndarray, sg: np.ndarray, sl: np.ndarray) -> np.ndarray | None:
    """The distinct (dst Group, dst, src Group, src) rows of one dimension, sorted by destination;
    None when one destination long word takes two different source long words."""
    if len(dg) == 0:
        return np.zeros((0, len(PAIR)), dtype=np.int64)
    low = int(dl.min())
    position = (dg - int(dg.min())) * (int(dl.max()) - low + 1) + (dl - low)
    order = np.argsort(position, kind="stable")
    position = position[order]
    rows = np.stack([dg[order], dl[order], sg[order], sl[order]], axis=1)
    same = position[1:] == position[:-1]
    if same.any():
        if ((rows[1:, 2:] != rows[:-1, 2:]).any(axis=1) & same).any():
            return None
        rows = rows[np.concatenate(([True], ~same))]
    return rows


def _window(s: DimTerms) -> str:
    return f" ({s.view})" if s.view else ""


def _segments(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows (sorted) that continue each other on both sides, as (first rows, lengths)."""
    if len(rows) <= 1:
        return rows, np.ones(len(rows), dtype=np.int64)
    go_on = (rows[1:, 0] == rows[:-1, 0]) & (rows[1:, 1] == rows[:-1, 1] + 1) & \
        (rows[1:, 2] == rows[:-1, 2]) & (rows[1:, 3] == rows[:-1, 3] + 1)
    first = np.flatnonzero(np.concatenate(([True], ~go_on)))
    length = np.diff(np.concatenate((first, [len(rows)])))
    return rows[first], length


def _enumerate(pairs: list[np.ndarray]) -> tuple[np.ndarray, ...]:
    """Every run: segments along the dimension that gives the fewest, times every combination of
    the other dimensions' (destination, source) pairs. Returns (dst Group, dst, src Group, src, n)."""
    if not pairs:
        return tuple(np.zeros(1, dtype=np.int64) for _ in PAIR) + (np.ones(1, dtype=np.int64),)
    segments = [_segments(r) for r in pairs]
    sizes = [len(r) for r in pairs]
    count = [len(seg[0]) * prod(s for j, s in enumerate(sizes) if j != k) for k, seg in enumerate(segments)]
    along = int(np.argmin(count))
    if count[along] > MAX_GATHER_RUNS:
        raise GatherTooLarge(f"a gather of {count[along]:,} runs (more than {MAX_GATHER_RUNS:,}); its layouts "
                             f"keep too few long words adjacent", count[along])
    cols = [np.zeros(1, dtype=np.int64) for _ in PAIR]
    for k, rows in enumerate(pairs):
        if k != along:
            cols = [np.add.outer(c, rows[:, j]).ravel() for j, c in enumerate(cols)]
    first, length = segments[along]
    cols = [np.add.outer(c, first[:, j]).ravel() for j, c in enumerate(cols)]
    n = np.tile(length, len(cols[0]) // max(len(length), 1))
    return cols[0], cols[1], cols[2], cols[3], n

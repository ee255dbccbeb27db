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

import hashlib
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from sim import ALL_GROUPS, ProgramBuilder, Sym

from ..errors import LayoutError
from ..hostmem import host_memory_available
from ..layout import Placement
from ..layout.placement import Location
from .separable import DimTerms, GatherTooLarge, separable_sources
from .sources import HOLE, SKIP, ZERO, LaneMismatch, LwSources, run_arrays_many  # noqa: F401  (re-exported)

DRAM, L2BM = "DRAM", "L2BM"
Address = int | Sym


_CACHE: "OrderedDict[tuple, LwSources | LaneMismatch]" = OrderedDict()
CACHED_GATHERS = 256  # conversions kept (planning asks for the same ones repeatedly; compile-time cache)
# and at most this many bytes of their runs: a large tensor's gather in single long words is tens of
# millions of runs (1.8 GB for a transposed 50,257 x 768 table), and a count alone let a GPT-2's
# compile keep 15 GB of them (host policy, like hostio's OFFSET_CACHE_BYTES)
CACHED_GATHER_BYTES = 512 << 20
# Host memory matching a gather element by element takes at its peak, per element of the
# destination (measured 707-802 bytes for a million-element reshape). A host policy.
ELEMENT_MATCH_BYTES = 1024
_cached_bytes = [0]  # the runs' bytes _CACHE holds, kept as entries come and go


def lw_sources(dst: "Placement | DimTerms", src: "Placement | DimTerms", index: np.ndarray | None = None
               ) -> LwSources:
    """Match every destination long word to one source long word; raise LaneMismatch if impossible.

    Either side is a placement or a window of one (`DimTerms`). `index[e]` is the source element
    of destination element e (flat); -1 means zero, SKIP that the element comes from another
    source. Without it, element e comes from element e (a conversion between layouts of one
    tensor, or a window read as a tensor); those are matched on their per-dimension terms. Both
    kinds are cached: planning asks for the same ones repeatedly (ResNet-50 conv2_x's compile
    checked its weight's gather into B eight times over, 47 ms each), an element map keyed by a
    digest of its contents."""
    side = lambda p: p.key() if isinstance(p, DimTerms) else p.layout.key()  # noqa: E731
    key = (side(dst), dst.dtype, side(src), src.dtype, src.placement.hw.fingerprint if isinstance(src, DimTerms)
           else src.hw.fingerprint, None if index is None else _digest(index))
    found = _CACHE.get(key)
    if found is None:
        try:
            if index is not None:
                found = _element_sources(dst, src, index)
            else:
                found = separable_sources(dst, src)
                if found is None:
                    if isinstance(src, DimTerms) or isinstance(dst, DimTerms):
                        raise LayoutError("internal: a window whose terms do not separate")
                    found = _element_sources(dst, src, None)
        except LaneMismatch as e:
            # kept without its traceback: its frames held the caller's objects (a whole Context and
            # its device buffers) for as long as the cache kept the answer
            found = e.with_traceback(None)
        _CACHE[key] = found
        _cached_bytes[0] += _nbytes(found)
        while len(_CACHE) > 1 and (len(_CACHE) > CACHED_GATHERS or _cached_bytes[0] > CACHED_GATHER_BYTES):
            _cached_bytes[0] -= _nbytes(_CACHE.popitem(last=False)[1])  # the least recently used; the newest stays
    else:
        _CACHE.move_to_end(key)
    if isinstance(found, LaneMismatch):
        raise LaneMismatch(str(found))
    return found


def gather_runs(dst: "Placement | DimTerms", src: "Placement | DimTerms", index: np.ndarray | None = None
                ) -> int | None:
    """The MVs of `lw_sources`' gather (one a run of long words), a gather too large to list
    counting its runs; None when there is no such gather (its lanes move, or the layouts do not
    separate): what the planner's lower bounds count."""
    try:
        return lw_sources(dst, src, index).mv_count
    except GatherTooLarge as e:
        return e.runs
    except LayoutError:
        return None


def _nbytes(found: "LwSources | LaneMismatch") -> int:
    return 0 if isinstance(found, LaneMismatch) else found.nbytes


def _digest(index: np.ndarray) -> tuple:
    """An element map's identity: its shape, dtype and a hash of its values."""
    index = np.ascontiguousarray(index)
    return index.shape, str(index.dtype), hashlib.blake2b(index.view(np.uint8), digest_size=16).digest()


def _element_sources(dst: Placement, src: Placement, index: np.ndarray | None) -> LwSources:
    """The gather matched element by element (an explicit element map, or layouts whose terms
    do not separate). Refused (GatherTooLarge) when that would take more host memory than is
    free: about ELEMENT_MATCH_BYTES an element (a Linear over a 61x70x61x102 input reached 21 GB
    and was killed)."""
    if dst.memory != DRAM or src.memory != DRAM:
        raise LayoutError("long-word gathers write and read DRAM placements")
    elements = int(np.prod(dst.layout.extents))
    free = host_memory_available()
    if free is not None and elements * ELEMENT_MATCH_BYTES > free:
        raise GatherTooLarge(f"a gather matched element by element over {elements:,} elements would take about "
                             f"{elements * ELEMENT_MATCH_BYTES / 2 ** 30:.1f} GiB of host memory, more than the "
                             f"{free / 2 ** 30:.1f} GiB free", elements)
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


def emit_pieces(b: ProgramBuilder, sources: LwSources, pieces: list[tuple[int, ...]], *,
                src: Address | list[Address], zeros: Address | None, l2_addr: int, tag: int) -> int:
    """MV the sources of destination long words [first, last) of each (dst Group, first, last, L2BM
    instance[, shift]) piece into that L2BM (destination long word first + k lands at l2_addr +
    shift + k), as
    one block of MVs: each piece's runs in destination order, the Data Engines' MVs in turn
    (`engines_in_turn`). A run that every Group makes alike, each from its own DRAM, is one MV
    in every Group at once (the hardware's parallel individual MV; `in_every_group`). `src`
    lists the source buffers of a merged gather. Returns the MVs emitted."""
    srcs = src if isinstance(src, list) else [src]
    if not pieces:
        return 0
    group_of, first, last, l2_instance, *shifts = (np.array(c, dtype=np.int64) for c in zip(*pieces))
    shift = shifts[0] if shifts else np.zeros_like(first)
    piece, dst, group, address, n, buffer = run_arrays_many(sources, group_of, first, last)
    if len(dst) == 0:
        return 0
    zero = group == ZERO
    if zeros is None and zero.any():
        raise LayoutError("this gather needs zeros but no zero buffer was given")
    bases = srcs + ([zeros] if zeros is not None else [])
    per_group = b.params.instances_per_group(b.params.memory_id(L2BM))
    dst_group, local = np.divmod(l2_instance[piece], per_group)
    src_inst = np.where(zero, group_of[piece], group)
    address, which = np.where(zero, 0, address), np.where(zero, len(srcs), buffer)
    offset = dst - first[piece] + shift[piece]
    every, alone = in_every_group(b.params.n_groups, dst_group, src_inst == dst_group,
                                  np.stack([offset, address, n, which, local], 1))
    if len(every):
        b.mv_block("individual", DRAM, bases, address[every], L2BM, l2_addr, offset[every], n[every], tag=tag,
                   src_inst=ALL_GROUPS, dst_inst=ALL_GROUPS, src_which=which[every], dst_local=local[every])
    order = alone[engines_in_turn(dst_group[alone], src_inst[alone], b.params.n_groups)]
    b.mv_block("individual", DRAM, bases, address[order], L2BM, l2_addr, offset[order], n[order], tag=tag,
               src_inst=src_inst[order], dst_inst=l2_instance[piece][order], src_which=which[order])
    return len(every) + len(order)


def in_every_group(n_groups: int, group: np.ndarray, own: np.ndarray, key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Which of a block's MVs (row k in Group `group[k]`, reading its own Group's DRAM where
    `own[k]`, moving what `key[k]` says: offsets, size, buffer, L2BM) are made alike by every
    Group: (the first of each such set, in order; every other MV, in order). One MV in every
    Group does the same on each Data Engine, with a quarter of the instructions to issue (and to
    simulate: MNIST's training step had 40,594 MVs, 16,417 of them in one weight update).

    Usually every Group's MVs are the same list (a layout split evenly over the Groups): that is
    checked first, in one comparison; otherwise rows are matched by sorting."""
    everything = np.arange(len(group))
    rows = np.flatnonzero(own)
    if n_groups == 0 or len(rows) == 0:
        return rows[:0], everything
    mine = [rows[group[rows] == g] for g in range(n_groups)]
    if len(rows) == len(group) and all(len(m) == len(mine[0]) for m in mine) \
            and all(np.array_equal(key[m], key[mine[0]]) for m in mine[1:]):
        return mine[0], rows[:0]
    order = rows[np.lexsort((group[rows], *key[rows].T[::-1]))]  # by key, then Group
    k, g = key[order], group[order]
    new = np.ones(len(order), dtype=bool)
    new[1:] = (k[1:] != k[:-1]).any(1)  # where a run of equal keys starts
    starts = np.flatnonzero(new)
    length = np.diff(np.append(starts, len(order)))
    sets = starts[length == n_groups][:, None] + np.arange(n_groups)  # positions in `order` of each candidate
    sets = sets[(g[sets] == np.arange(n_groups)).all(1)]  # once in each Group
    alone = np.ones(len(group), dtype=bool)
    alone[order[sets.ravel()]] = False
    return np.sort(order[sets[:, 0]]), everything[alone]  # each set's Group-0 row


def engines_in_turn(engine: np.ndarray, source: np.ndarray | None = None, n_groups: int = 1) -> np.ndarray:
    """An order of MVs (engine[k]: the Group whose Data Engine runs MV k; source[k]: the Group whose
    DRAM it reads) that takes each engine's MVs one engine after another in turn. MVs issue one
    after another, and a full queue stalls the stream: in a block sorted by Group, Group 1's
    engine would idle until Group 0's last MVs were queued. Each engine takes its MVs by source
    Group counted from its own (its own DRAM first, then the next Group's, ...), so that the MVs
    side by side in a turn read different Groups: an MV from another Group's DRAM holds both
    Groups' engines, and rows split over the Groups in blocks, gathered into rows dealt to them in
    turn, had every engine read Group 0 first, then Group 1, ... (64 x 32 in single long words:
    7,522 cycles against 3,854; a tied embedding's weight relaid into every Group, before
    `_emit_replicated`: 920,028 against 449,652). A turn visits the
    even-numbered engines first: there, engine d reading Group d + w holds Groups d and d + w,
    and in the order 0, 1, 2, 3 each MV waited for the one before (a chain round the ring); in
    the order 0, 2, 1, 3 two run side by side, for every w. The MVs of a gather's block write
    distinct L2BM words, so any order gives the same data."""
    within = np.zeros_like(engine) if source is None else (source - engine) % max(n_groups, 1)
    by_engine = np.lexsort((np.arange(len(engine)), within, engine))  # by engine, then source, stable
    sorted_engine = engine[by_engine]
    starts = np.searchsorted(sorted_engine, sorted_engine, side="left")
    rank = np.empty_like(engine)
    rank[by_engine] = np.arange(len(engine)) - starts  # k's place among its engine's MVs
    return np.lexsort((engine, engine % 2, rank))


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
    if sources.same_in_every_group and sources.groups == params.n_groups:
        _emit_replicated(b, sources, dst=dst, src=src, zeros=zeros, l2_addr=l2_addr, l2_room=l2_room, tags=tags)
        return
    for first in range(0, sources.span, l2_room):
        last = min(sources.span, first + l2_room)
        busy = [g for g in range(sources.groups) if sources.busy(g, first, last)]
        emit_pieces(b, sources, [(g, first, last, g * l2_per_group) for g in busy], src=src, zeros=zeros,
                    l2_addr=l2_addr, tag=fill)  # the Groups' runs in turn, so their engines work together
        if busy:
            b.wait(fill)
        if len(busy) == sources.groups == params.n_groups:  # one MV in every Group at once
            b.mv("individual", L2BM, l2_addr, DRAM, dst + first, last - first, tag=drain)
            continue
        for g in busy:
            b.mv("individual", L2BM, l2_addr, DRAM, dst + first, last - first, tag=drain, src_inst=g * l2_per_group,
                 dst_inst=g)
    b.wait(drain)


def _emit_replicated(b: ProgramBuilder, sources: LwSources, *, dst: Address, src: Address | list[Address],
                     zeros: Address | None, l2_addr: int, l2_room: int, tags: tuple[int, int]) -> None:
    """`emit_convert` into a destination that every Group holds alike (`same_in_every_group`): the
    destination is cut into pieces dealt to the Groups in turn; each Group gathers its piece into
    its L2BM and writes it to every Group's DRAM. The gather's MVs are made once instead of once
    per Group: a tied embedding's weight relaid after its update into the Group-replicated layout
    its LM head reads (512 x 128 on MN-Core 2) was 131,072 single-long-word MVs, 32,768 of them in
    each Group's copy. The L2BMs are refilled only once every write of the round is done (the
    writes into other Groups' DRAMs are not all on the filling Group's engine)."""
    params = b.params
    groups = params.n_groups
    l2_per_group = params.instances_per_group(params.memory_id(L2BM))
    fill, drain = tags
    piece = max(1, min(l2_room, -(-sources.span // groups)))  # every Group busy, each within its L2BM room
    starts = list(range(0, sources.span, piece))
    for r in range(0, len(starts), groups):
        pieces = [(g, first, min(sources.span, first + piece), g * l2_per_group)
                  for g, first in enumerate(starts[r:r + groups]) if sources.busy(g, first, first + piece)]
        if not pieces:
            continue
        emit_pieces(b, sources, pieces, src=src, zeros=zeros, l2_addr=l2_addr, tag=fill)
        b.wait(fill)
        for shift in range(groups):  # side by side, each write into another Group's DRAM
            for g, first, last, l2 in pieces:
                b.mv("individual", L2BM, l2_addr, DRAM, dst + first, last - first, tag=drain, src_inst=l2,
                     dst_inst=(g + shift) % groups)
        b.wait(drain)

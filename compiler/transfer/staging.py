"""Staging: moving a tensor between DRAM and an LM layout with block copies only.

An LM layout is fed from DRAM down the chain DRAM -MV-> L2BM -l2bm-> L1BM -l1bm-> PE memory.
Each hop has modes with fixed data patterns (sim.functional), chosen from what the layout
broadcasts:

* PE hop: the MAB axis broadcast and the PE axis placed -> mab_broadcast (l1bmm); both broadcast
  -> broadcast (l1bmp); otherwise distribute (l1bmd, one long word to each of the L1B's PEs);
* L1B hop: the L1B axis broadcast -> broadcast (l2bmb); otherwise distribute (l2bmd), or, asked
  for `blocks`, one broadcast to each L1B alone (l2bmb@set) from a block of L2BM per L1B: an
  image whose L1Bs' data lie in 8-long-word chunks dealt round-robin is gathered in runs of 8 long
  words, one held in blocks is gathered in runs as long as the source's (a direct convolution's
  shifted rows), for four times the distribute's PE-stream time;
* Group hop: each L2B the layout places reads its own range of its Group's DRAM (MV individual);
  a layout broadcast over L2Bs reads one range, kept in every Group's DRAM (MV broadcast).
  Copies on other L2Bs of the same Group (a sized `B@[2_L2B:1]`) are the same range sent to
  each; copies in other Groups (`B@[2_L2B:4]`) are kept in those Groups' DRAMs too.

Inverting those patterns gives, for every element, the place in its Group's DRAM from which
plain block copies land it where the layout wants it: the layout's *DRAM image*, fitted to PFN
notation so that it can be an IOSpec. Upload (LM -> DRAM) runs the same chain upwards, reading
replica 0 of anything broadcast. Tensors larger than the transit buffers move in pieces of
long-word ranges, double-buffered so that the Data Engine fills one while the PE stream drains
the other. Every size comes from the YAML (fan-outs, chunk sizes, capacities, hazards).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cached_property, lru_cache, partial
from math import gcd, lcm

import numpy as np

from hwdesc.figures import side_rates
from sim import ProgramBuilder, Sym

from ..errors import LayoutError
from ..chain import Chain
from ..layout import Broadcast, Factor, Layout, Placement
from .gather import LwSources, emit_pieces

DRAM, L2BM, L1BM = "DRAM", "L2BM", "L1BM"
Address = int | Sym


@dataclass(frozen=True)
class Staging:
    """How one LM placement is fed from its DRAM image by block copies, per time slice."""

    lm: Placement
    chain: Chain
    pe_mode: str  # distribute | mab_broadcast | broadcast
    l1_mode: str  # distribute | broadcast | blocks (a block of L2BM per L1B, each sent to its L1B alone)
    l2_locals: tuple[int, ...] | None  # local L2Bs of a Group that hold data; None: all alike
    span: int  # LM long words per PE per slice
    per_lm_lw: int  # L1BM long words per LM long word
    n_l1: int  # L1BM long words per slice (padded to the l2bm chunk)
    n_l2: int  # L2BM long words per slice
    image_lw: int  # DRAM long words per Group per slice
    slices: int
    fitted: Placement | None  # the image as a PFN layout
    why_not: str = ""
    l2_replicas: tuple[int, ...] = (0,)  # local L2B offsets each slot is also sent to (a sized B@ on L2B)
    # The image is spread over the Groups' DRAMs and read by a distributed broadcast (see `_spread`)
    spread: bool = False

    def l2_targets(self, local: int) -> tuple[int, ...]:
        """The local L2Bs that receive the image slot of local L2B `local`."""
        return tuple(local + r for r in self.l2_replicas)

    @property
    def dram(self) -> Placement:
        """The image as a DRAM placement; only layouts whose image has PFN notation can be stored."""
        if self.fitted is None:
            raise LayoutError(f"the DRAM image of {self.lm.layout} is not a PFN layout ({self.why_not}); it can be "
                              f"gathered into but not stored")
        return self.fitted

    @property
    def dram_lw(self) -> int:
        """Long words the image occupies in each Group's DRAM."""
        return self.image_lw * self.slices

    @property
    def l1_fan(self) -> int:
        """L1Bs whose data an L2B holds side by side (1: it holds one L1B's, broadcast to all)."""
        return 1 if self.l1_mode == "broadcast" else self.chain.l1_per_l2

    def ranges(self, piece: "Piece", *, in_slice: bool) -> list[tuple[int, int, int]]:
        """A piece's L2BM long words as (first image long word, count, L2BM offset) runs: one
        range, or with `blocks` one per L1B. The offset is from where the whole slice lies in L2BM
        (`in_slice`), or from a transit buffer holding the piece alone (its L1Bs' parts side by side)."""
        if self.l1_mode != "blocks":
            return [(piece.q2_first, piece.q2_count, piece.q2_first if in_slice else 0)]
        return [(k * self.n_l1 + piece.q1_first, piece.q1_count,
                 k * self.n_l1 + piece.q1_first if in_slice else k * piece.q1_count) for k in range(self.l1_fan)]

    @cached_property
    def piece_quantum(self) -> int:
        """LM long words whose L1BM range is a whole number of l2bm chunks."""
        q1_unit, fan = (self.chain.l2_chunk, self.chain.l1_per_l2) if self.l1_mode == "distribute" else (1, 1)
        if self.spread:  # a distributed broadcast moves whole rounds of blocks over the Groups
            block = self.chain.spread_chunk * self.chain.groups
            q1_unit = lcm(q1_unit, block // gcd(block, fan))
        return q1_unit // gcd(q1_unit, self.per_lm_lw)


CACHED_STAGINGS = 2048  # a planner asks for a few per candidate (compile-time cache; each is small)


def stage(lm: Placement, *, spread: bool = False, blocks: bool = False) -> Staging:
    """The staging of an LM placement; raises LayoutError when block copies cannot produce it.
    Kernels ask for the same stagings repeatedly (planning, then emitting), so they are cached.

    With `blocks`, a layout placed over the L1Bs is held in L2BM as one block per L1B, each sent
    to its L1B by a broadcast to it alone (where the chip's l2bm broadcast names subsets): for
    tensors gathered into LM (a fetch, never an upload).

    With `spread`, a layout copied over every Group is fed from an image spread over the Groups'
    DRAMs by distributed broadcast where the chip has one (`_spread`): half the Data Engine time
    of a read on MN-Core 2, but an upload needs one MV per block and Group, so only tensors the
    host writes (inputs, constants) are stored so (the planner's choice)."""
    return _stage_cached(lm.layout, lm.hw, lm.memory, lm.dtype, spread, blocks)


def stored_staging(lm: Placement, held: Placement) -> Staging | None:
    """The staging of `lm` whose image `held` is (plain or spread), or None: the tensor must be
    gathered."""
    for spread in (False, True):
        try:
            st = stage(lm, spread=spread)
        except LayoutError:
            return None
        if held.same_placement(st.dram):
            return st
    return None


@lru_cache(maxsize=CACHED_STAGINGS)
def _stage_cached(layout, hw, memory: str, dtype: str, spread: bool, blocks: bool) -> Staging:
    return _stage(Placement(layout, hw, memory, dtype, check_capacity=False), spread, blocks)


@dataclass
class _Digit:
    """One digit of an LM layout, refined where a hop's chunk boundary cuts a factor, with its
    coefficient on every quantity the staging derives (see `_stage`)."""

    dim: int
    size: int
    coef: dict[str, int]
    outer: bool  # the most significant digit of its dimension: its range may be padded

    def split(self, low: int) -> tuple["_Digit", "_Digit"]:
        """(major, minor) digits: the minor one takes `low` positions, the major the rest (rounded
        up: an outermost digit's extra positions lie past the dimension's extent, holding nothing)."""
        major = _Digit(self.dim, -(-self.size // low), {k: v * low for k, v in self.coef.items()}, self.outer)
        return major, _Digit(self.dim, low, dict(self.coef), False)


def _cut(digits: list[_Digit], key: str, unit: int, layout) -> tuple[list[_Digit], list[bool]]:
    """Refine the digits so that quantity `key` splits at multiples of `unit`: each digit is then
    either below (contributes key mod unit) or above (a multiple of unit). Returns the digits and
    which are below. Raises LayoutError when a factor straddles the boundary unevenly."""
    out: list[_Digit] = []
    for d in digits:
        k = d.coef.get(key, 0)
        if k == 0 or k % unit == 0 or k * (d.size - 1) < unit:
            out.append(d)
        elif unit % k == 0 and (d.size % (unit // k) == 0 or d.outer):
            out += list(d.split(unit // k))
        else:
            raise LayoutError(f"{layout}: a factor of dimension {d.dim} ({d.size} positions, step {k}) straddles the "
                              f"{unit}-long-word chunks of a transfer mode unevenly")
    below = [d.coef.get(key, 0) != 0 and d.coef[key] < unit for d in out]
    if sum(d.coef[key] * (d.size - 1) for d, b in zip(out, below) if b) >= unit:
        raise LayoutError(f"{layout}: the digits below the {unit}-long-word chunk boundary overlap it")
    return out, below


def _stage(lm: Placement, spread: bool = False, blocks: bool = False) -> Staging:
    """The staging of an LM placement, computed on the layout's digits (no per-element arrays).

    Every quantity along the chain is linear in the digits of the LM layout: the L1BM position
    q1 (the PE hop's pattern), the L2BM position q2 (the L1B hop's round-robin over chunks, once
    digits are cut at the chunk boundary), the Group and the slot of the L2B inside it, and the
    DRAM address of the image. So the image is itself a layout, with one factor per digit."""
    chain = Chain.of(lm.hw)
    layout = lm.layout
    placed = set(layout.placed_axes)
    if chain.unit_axis not in placed and chain.pe_axis in placed:
        pe_mode, per_lm = "mab_broadcast", chain.pes_per_unit
    elif chain.unit_axis not in placed:
        pe_mode, per_lm = "broadcast", 1
    elif chain.pe_axis in placed or chain.pes_per_unit == 1:
        pe_mode, per_lm = "distribute", chain.pes_per_l1
    else:
        raise LayoutError(f"{layout}: broadcast over {chain.pe_axis} but placed over {chain.unit_axis}; no "
                          f"l1bm mode feeds that (use mab_broadcast layouts or place {chain.pe_axis})")
    for b in layout.broadcast:
        if b.axis in (chain.l1_axis, chain.unit_axis, chain.pe_axis) and layout.adds_copies(b):
            raise LayoutError(f"{layout}: copies between placed {b.axis} positions (B@ item {b}); the transfer modes "
                              f"broadcast over whole {b.axis} axes only")
    l1_mode = "distribute" if chain.l1_axis in placed else "broadcast"
    if blocks:
        if l1_mode != "distribute":
            raise LayoutError(f"{layout}: not placed over {chain.l1_axis}, so not held in a block per {chain.l1_axis}")
        if not chain.l1_subsets:
            raise LayoutError(f"{lm.hw.name}: {chain.l2_to_l1}'s broadcast names no subsets; no block per {chain.l1_axis}")
        l1_mode = "blocks"
    span = lm.slice_span
    n_l1 = span * per_lm
    c = chain.l2_chunk
    if l1_mode == "distribute":
        n_l1 = -(-n_l1 // c) * c
        n_l2 = n_l1 * chain.l1_per_l2
    elif l1_mode == "blocks":
        n_l2 = n_l1 * chain.l1_per_l2
    else:
        n_l2 = n_l1
    digits = []
    seen_dims: set[int] = set()
    for d, f in layout.factors:
        if f.size == 1:
            continue
        outer = d not in seen_dims
        seen_dims.add(d)
        coef = {"addr": f.stride if f.axis is None else 0, "time": f.stride if f.axis == "Time" else 0,
                "w": f.stride if f.axis == "W" else 0}
        for axis in (chain.l2_axis, chain.l1_axis, chain.unit_axis, chain.pe_axis):
            coef[axis] = f.stride if f.axis == axis else 0
        if pe_mode == "distribute":
            coef["q1"] = coef["addr"] * per_lm + coef[chain.unit_axis] * chain.pes_per_unit + coef[chain.pe_axis]
        elif pe_mode == "mab_broadcast":
            coef["q1"] = coef["addr"] * per_lm + coef[chain.pe_axis]
        else:
            coef["q1"] = coef["addr"]
        digits.append(_Digit(d, f.size, coef, outer))
    if l1_mode == "distribute":
        digits, below = _cut(digits, "q1", c, layout)
        for dg, low in zip(digits, below):
            dg.coef["q2"] = dg.coef["q1"] if low else dg.coef["q1"] * chain.l1_per_l2
            dg.coef["q2"] += dg.coef[chain.l1_axis] * c
    elif l1_mode == "blocks":
        for dg in digits:
            dg.coef["q2"] = dg.coef["q1"] + dg.coef[chain.l1_axis] * n_l1
    else:
        for dg in digits:
            dg.coef["q2"] = dg.coef["q1"]
    # the L2B coordinate: local L2B in the Group (below l2_per_group) and the Group (above)
    g2 = chain.l2_per_group
    digits, local = _cut(digits, chain.l2_axis, g2, layout) if chain.l2_axis in placed else (digits, [False] * len(digits))
    local_digits = [(dg, dg.coef[chain.l2_axis]) for dg, low in zip(digits, local) if low]
    if chain.l2_axis in placed:
        positions = {0}
        for dg, k in local_digits:
            positions = {p + i * k for p in positions for i in range(dg.size)}
        locals_ = tuple(sorted(positions))
        step = locals_[1] if len(locals_) > 1 else 1
        if locals_ != tuple(range(0, len(locals_) * step, step)):
            raise LayoutError(f"{layout}: it uses the L2Bs {list(locals_)} of each Group, which are not evenly spaced")
    else:
        locals_, step = None, 1
    image_lw = n_l2 * (len(locals_) if locals_ else 1)
    dims: list[list[Factor]] = [[] for _ in layout.shape]
    for dg, low in zip(digits, local):
        k_l2 = dg.coef[chain.l2_axis]
        address = dg.coef["q2"] + dg.coef["time"] * image_lw + (k_l2 // step * n_l2 if low else 0)
        targets = [(None, address), ("W", dg.coef["w"]), (chain.l2_axis, 0 if low else k_l2)]
        used = [(axis, k) for axis, k in targets if k]
        if len(used) != 1:
            raise LayoutError(f"internal: digit of dimension {dg.dim} of {layout} maps to {used}")
        dims[dg.dim].append(Factor(dg.size, used[0][0], used[0][1]))
    # Copies over L2B: those in other Groups come from every Group's DRAM (the image is kept in
    # each); those on other L2Bs of the same Group are the same DRAM range sent to each of them.
    offsets = lm.copy_coords.get(chain.l2_axis)
    groups = np.unique(offsets // g2) if offsets is not None else np.zeros(1, dtype=np.int64)
    replicas = (0,)
    if offsets is not None and locals_ is not None:
        replicas = tuple(int(r) for r in np.unique(offsets % g2))
        if max(locals_) + max(replicas) >= g2:
            raise LayoutError(f"{layout}: copies of the L2Bs at local positions {list(locals_)} by offsets "
                              f"{sorted(set(offsets.tolist()))} cross a Group boundary; no MV pattern sends "
                              f"them (copies must stay inside the Group or move by whole Groups)")
    g_copies = len(groups)
    g_step = int(groups[1]) if g_copies > 1 else 1
    if groups.tolist() != list(range(0, g_copies * g_step, g_step)):
        raise LayoutError(f"{layout}: its copies are in Groups {groups.tolist()}, which are not evenly spaced")
    broadcast: tuple[Broadcast, ...] = ()
    if g_copies == chain.groups and chain.groups * g2 > 1:
        broadcast = (Broadcast(chain.l2_axis),)
    elif g_copies > 1:
        broadcast = (Broadcast(chain.l2_axis, g_copies, g_step * g2),)
    if spread and g_copies == chain.groups and locals_ == tuple(range(g2)) and replicas == (0,) and \
            chain.worth_spreading(n_l2 * lm.time_slices):
        spread_image = _spread(chain, digits, layout, n_l2)
        if spread_image is not None:
            fitted = Placement(spread_image, lm.hw, chain.dram, lm.dtype, check_capacity=False)
            return Staging(lm, chain, pe_mode, l1_mode, locals_, span, per_lm, n_l1, n_l2, n_l2 * g2 // chain.groups,
                           lm.time_slices, fitted, "", replicas, spread=True)
    image = Layout.of([_major_first(dim) for dim in dims], layout.shape, broadcast)
    fitted = Placement(image, lm.hw, chain.dram, lm.dtype, check_capacity=False)
    return Staging(lm, chain, pe_mode, l1_mode, locals_, span, per_lm, n_l1, n_l2, image_lw, lm.time_slices,
                   fitted, "", replicas)


def _spread(chain: Chain, digits: list[_Digit], layout: Layout, n_l2: int) -> Layout | None:
    """The image of a layout copied over every Group, each of a Group's L2Bs holding a slot of its
    own, spread over the Groups' DRAMs for a distributed broadcast (mvb4), or None when its digits
    do not split at the broadcast's blocks.

    The broadcast sends Group g's block j (`spread_chunk` long words) to local L2B j mod P of every
    Group, at block G * (j div P) + g: so L2BM long word t of local L2B c comes from Group
    (t div chunk) mod G at chunk * (P * (t div (chunk * G)) + c) + t mod chunk. Each Group holds
    1/G of the image instead of all of it, and reads it at the broadcast's rate: for MN-Core 2 half
    the Data Engine time of reading every slot from each Group's own copy."""
    ch, groups, per = chain.spread_chunk, chain.groups, chain.l2_per_group
    if n_l2 % (ch * groups):
        return None
    try:
        cut, _ = _cut(digits, "q2", ch, layout)
        cut, _ = _cut(cut, "q2", ch * groups, layout)
    except LayoutError:
        return None
    image_lw = n_l2 * per // groups
    dims: list[list[Factor]] = [[] for _ in layout.shape]
    for dg in cut:
        k, slot = dg.coef["q2"], dg.coef[chain.l2_axis]
        if dg.coef["w"]:
            factor = Factor(dg.size, "W", dg.coef["w"])
        elif dg.coef["time"]:
            factor = Factor(dg.size, None, dg.coef["time"] * image_lw)
        elif slot:
            factor = Factor(dg.size, None, ch * slot)
        elif 0 < k < ch:
            factor = Factor(dg.size, None, k)
        elif ch <= k < ch * groups:
            factor = Factor(dg.size, chain.l2_axis, k // ch * per)
        elif k:
            factor = Factor(dg.size, None, k * per // groups)
        else:
            return None
        dims[dg.dim].append(factor)
    return Layout.of([_major_first(dim) for dim in dims], layout.shape, ())


def _major_first(factors: list[Factor]) -> list[Factor]:
    """A dimension's digits, major to minor as the LM layout lists them (a refined factor's major
    part comes first), or a size-1 placeholder."""
    real = [f for f in factors if f.size > 1]
    return real or [Factor(1, None, 1)]


@dataclass(frozen=True)
class Transit:
    """Scratch the pieces pass through: two L2BM and two L1BM buffers (long words) and two tags."""

    l2: tuple[int, int]
    l1: tuple[int, int]
    l2_room: int
    l1_room: int
    tags: tuple[int, int]


@dataclass(frozen=True)
class Piece:
    lm_first: int  # LM long words [lm_first, lm_last)
    lm_last: int
    q1_first: int  # L1BM long words of the slice
    q1_count: int
    q2_first: int  # L2BM long words of the slice
    q2_count: int


def pieces(st: Staging, transit: Transit, at_least: int = 1) -> list[Piece]:
    """Split a slice into LM long-word ranges whose L1BM and L2BM ranges fit the transit buffers,
    into at least `at_least` of them where the piece quantum allows."""
    fan = st.l1_fan
    per_piece = min(transit.l1_room // st.per_lm_lw, transit.l2_room // (st.per_lm_lw * fan))
    if at_least > 1:
        per_piece = min(per_piece, max(st.piece_quantum, -(-st.span // at_least)))
    per_piece -= per_piece % st.piece_quantum
    if per_piece <= 0:
        raise LayoutError(f"transit buffers of {transit.l1_room} L1BM / {transit.l2_room} L2BM long words cannot hold "
                          f"one piece of {st.lm.layout}")
    out = []
    for first in range(0, st.span, per_piece):
        last = min(st.span, first + per_piece)
        q1_first, q1_last = first * st.per_lm_lw, last * st.per_lm_lw
        if st.l1_mode == "distribute":
            c = st.chain.l2_chunk
            q1_last = -(-q1_last // c) * c
            q2_first, q2_last = q1_first // c * c * fan, q1_last // c * c * fan
        else:  # broadcast: the L1BM range itself; blocks: the L2BM its L1Bs' parts take (where: Staging.ranges)
            q2_first, q2_last = q1_first * fan, q1_last * fan
        out.append(Piece(first, last, q1_first, q1_last - q1_first, q2_first, q2_last - q2_first))
    return out


Gather = tuple[LwSources, Address, Address | None]  # runs, the stored tensor, a zeros buffer


def emit_fetch(b: ProgramBuilder, st: Staging, *, dram: Address, l2_addr: int, first: int, count: int, tag: int,
               slice_index: int = 0, source: Gather | None = None) -> None:
    """MVs that bring L2BM long words [first, first + count) of one slice of the image (at `dram`)
    to `l2_addr` in every L2B that holds data, on the Data Engines, tagged `tag`.

    With `source` = (sources, address, zeros), the tensor is not stored as the image but in
    another layout whose long words `sources` maps image positions to: the Data Engines gather
    the runs into L2BM instead of copying one block."""
    l2_per_group = st.chain.l2_per_group
    base = dram + slice_index * st.image_lw
    if source is not None and st.spread:
        sources, address, zeros = source
        emit_pieces(b, sources, _spread_pieces(st, slice_index, first, count), src=address, zeros=zeros,
                    l2_addr=l2_addr, tag=tag)
    elif source is not None:
        sources, address, zeros = source
        pieces = []
        for slot, local in enumerate(st.l2_locals if st.l2_locals is not None else (0,)):
            start = slice_index * st.image_lw + slot * st.n_l2 + first
            targets = range(l2_per_group) if st.l2_locals is None else st.l2_targets(local)
            for g in range(st.chain.groups):
                for target in targets:  # a broadcast over L2Bs: every L2B of the Group gets the same data
                    pieces.append((g, start, start + count, g * l2_per_group + target))
        emit_pieces(b, sources, pieces, src=address, zeros=zeros, l2_addr=l2_addr, tag=tag)
    elif st.spread:
        groups, block = st.chain.groups, st.chain.spread_chunk * st.chain.groups
        if first % block or count % block:
            raise LayoutError(f"internal: a distributed broadcast of L2BM long words {first}..{first + count} of "
                              f"{st.lm.layout}, not whole rounds of {block}")
        b.mv("distributed_broadcast", DRAM, base + first * l2_per_group // groups, L2BM, l2_addr,
             count * l2_per_group // groups, tag=tag, scope="chip")
    elif st.l2_locals is None:
        b.mv("broadcast", DRAM, base + first, L2BM, l2_addr, count, tag=tag)
    else:
        for slot, local in enumerate(st.l2_locals):
            for target in st.l2_targets(local):
                b.mv("individual", DRAM, base + slot * st.n_l2 + first, L2BM, l2_addr, count, tag=tag,
                     dst_local=target)


def emit_piece_fetch(b: ProgramBuilder, st: Staging, piece: Piece, *, dram: Address, l2_addr: int, in_slice: bool,
                     tag: int, slice_index: int = 0, source: Gather | None = None) -> None:
    """`emit_fetch` of one piece's L2BM long words (`Staging.ranges`), with `l2_addr` where the
    whole slice lies in L2BM (`in_slice`) or the transit buffer that holds the piece alone."""
    for first, count, offset in st.ranges(piece, in_slice=in_slice):
        emit_fetch(b, st, dram=dram, l2_addr=l2_addr + offset, first=first, count=count, tag=tag,
                   slice_index=slice_index, source=source)


def _spread_pieces(st: Staging, slice_index: int, first: int, count: int) -> list[tuple[int, int, int, int, int]]:
    """A gather into a spread image's L2BM long words [first, first + count): per block and L2B,
    (the image's Group, its first and last long word there, the L2BM instance, where the block
    lands after `first`), the inverse of the distributed broadcast's pattern (`_spread`)."""
    ch, groups, per = st.chain.spread_chunk, st.chain.groups, st.chain.l2_per_group
    out = []
    for t in range(first, first + count, ch):
        group, round_ = (t // ch) % groups, t // (ch * groups)
        for local in range(per):
            at = slice_index * st.image_lw + ch * (per * round_ + local)
            out += [(group, at, at + ch, g * per + local, t - first) for g in range(groups)]
    return out


@dataclass(frozen=True)
class Leg:
    """One piece of a slice on its way from L2BM (at `l2_addr`) to LM."""

    st: Staging
    piece: Piece
    l2_addr: int  # of the piece's first L2BM long word (with `blocks`, of L1B 0's block)
    lm_mem: str
    lm_word: int
    block_stride: int = 0  # with `blocks`: L2BM long words from one L1B's block to the next

    def l2_hops(self, transit: Transit, k: int) -> list[Member]:
        """Its L2BM long words into L1BM transit buffer k % 2 (the l2bm slot): one instruction,
        or with `blocks` one per L1B (a broadcast to that L1B alone)."""
        if self.st.l1_mode != "blocks":
            return [partial(_xfer_down, mode=self.st.l1_mode, l2_addr=self.l2_addr, l1_addr=transit.l1[k % 2],
                            n=self.piece.q2_count)]
        return [partial(_xfer_down, mode="broadcast", l2_addr=self.l2_addr + j * self.block_stride,
                        l1_addr=transit.l1[k % 2], n=self.piece.q1_count, index=1 << j) for j in range(self.st.l1_fan)]

    def to_lm(self, b: ProgramBuilder, transit: Transit, k: int) -> None:
        """From L1BM transit buffer k % 2 to LM (the l1bm slot). The L1BM range is padded to whole
        l2bm chunks; this hop moves only the piece's own long words, so that nothing lands past the
        LM region."""
        st, p = self.st, self.piece
        wpl = st.lm.hw.long_word_bytes // st.lm.hw.word_bytes
        b.xfer(st.pe_mode, "down", L1BM, transit.l1[k % 2], self.lm_mem, self.lm_word + wpl * p.lm_first,
               (p.lm_last - p.lm_first) * st.per_lm_lw)


Member = Callable[[ProgramBuilder], None]  # emits one PE-stream instruction


def _xfer_down(b: ProgramBuilder, *, mode: str, l2_addr: int, l1_addr: int, n: int, index: int = 0) -> None:
    b.xfer(mode, "down", L2BM, l2_addr, L1BM, l1_addr, n, index=index)


@dataclass(frozen=True)
class Bundle:
    """PE-stream instructions issued together, and the legs whose L2BM hop starts (`opens`: wait
    for its data before) and finishes (`ends`: its L2BM range is free after) in it."""

    members: list[Member]
    ends: int | None = None
    opens: int | None = None


def leg_bundles(legs: list[Leg], transit: Transit, *, started: bool = False) -> list[Bundle]:
    """The bundles of `emit_legs`' pipeline, in order: leg 0's L2BM hop (unless `started`), then
    leg k's LM hop beside leg k + 1's L2BM hop, then the last leg's LM hop. An L2BM hop of several
    instructions (one per L1B, `blocks`) has its first in the bundle and the others in bundles of
    their own after it: it opens in the first and ends in the last. A caller may add one PE-stream
    instruction of another slot to any bundle: `emit_product` hides the next step's legs behind
    this step's MATMUL so."""
    def with_hop(k: int, members: list[Member]) -> list[Bundle]:
        hops = legs[k].l2_hops(transit, k)
        bundles = [members + hops[:1]] + [[hop] for hop in hops[1:]]
        return [Bundle(m, ends=k if j == len(bundles) - 1 else None, opens=k if j == 0 else None)
                for j, m in enumerate(bundles)]

    out: list[Bundle] = []
    if legs and not started:
        out += with_hop(0, [])
    for k, leg in enumerate(legs):
        members = [partial(leg.to_lm, transit=transit, k=k)]
        out += with_hop(k + 1, members) if k + 1 < len(legs) else [Bundle(members)]
    return out


def emit_legs(b: ProgramBuilder, legs: list[Leg], transit: Transit, *, started: bool = False, before=None,
              after=None) -> None:
    """Legs through the two L1BM transit buffers (leg k through buffer k % 2), software-
    pipelined: leg k + 1 goes from L2BM into one buffer while leg k goes from the other to LM, in
    one bundle (the l2bm and l1bm slots; L1BM's separate ports serve both), so the stream pays the
    slower hop, not both. `started`: leg 0's L2BM hop was issued already (with the instruction
    before, see `first_hop`). `before(k)` runs before leg k's L2BM hop (a WAIT for its data),
    `after(k)` right after it (a fetch into the L2BM buffer leg k has left). The builder inserts
    the hazard nops."""
    for bundle in leg_bundles(legs, transit, started=started):
        if bundle.opens is not None and before:
            before(bundle.opens)
        with b.together():
            for member in bundle.members:
                member(b)
        if bundle.ends is not None and after:
            after(bundle.ends)


def first_hop(b: ProgramBuilder, legs: list[Leg], transit: Transit, instruction) -> None:
    """`instruction()` (emitting one PE-stream instruction, a MATMUL say) in one bundle with the
    L2BM hop of the first of `legs`, which `emit_legs(..., started=True)` then continues. The
    instruction must not touch L2BM or the first transit buffer."""
    hops = legs[0].l2_hops(transit, 0) if legs else []
    with b.together():
        instruction()
        for hop in hops[:1]:
            hop(b)
    for hop in hops[1:]:
        with b.together():
            hop(b)


def slice_pieces(st: Staging, transit: Transit) -> list[Piece]:
    """The pieces of a whole slice held in L2BM (only the L1BM transit buffers bound them)."""
    return pieces(st, replace(transit, l2_room=max(transit.l2_room, st.n_l2)))


def slice_legs(st: Staging, transit: Transit, *, l2_addr: int, lm_mem: str, lm_word: int) -> list[Leg]:
    """The legs of a whole slice already in L2BM at `l2_addr`."""
    return [Leg(st, p, l2_addr + st.ranges(p, in_slice=True)[0][2], lm_mem, lm_word, st.n_l1)
            for p in slice_pieces(st, transit)]


def emit_download(b: ProgramBuilder, st: Staging, *, dram: Address, lm_mem: str, lm_word: int, transit: Transit,
                  slice_index: int = 0, source: Gather | None = None) -> None:
    """DRAM image (at `dram`) -> LM (`lm_mem` from word `lm_word`), one slice, double-buffered:
    as soon as piece k has left its L2BM buffer the Data Engines fetch piece k + 2 into it, while
    the stream moves pieces k and k + 1 on (see `emit_legs`)."""
    parts = pieces(st, transit)

    def fetch(k: int) -> None:
        emit_piece_fetch(b, st, parts[k], dram=dram, l2_addr=transit.l2[k % 2], in_slice=False,
                         tag=transit.tags[k % 2], slice_index=slice_index, source=source)

    for k in range(min(2, len(parts))):
        fetch(k)

    def after(k: int) -> None:  # piece k has left its L2BM buffer: piece k + 2 may come in
        if k + 2 < len(parts):
            fetch(k + 2)

    legs = [Leg(st, p, transit.l2[k % 2], lm_mem, lm_word, p.q1_count) for k, p in enumerate(parts)]
    emit_legs(b, legs, transit, before=lambda k: b.wait(transit.tags[k % 2]), after=after)


@dataclass(frozen=True)
class UploadPiece:
    """One piece of an upload, in the PE stream's three parts, for a caller that spreads them over
    other work: `collect()` waits until its buffers are free and brings the piece from the PEs
    into L1BM; `lift` (one instruction on the l2bm slot, which may go in a bundle beside a MATMUL
    that touches neither L1BM nor L2BM) takes it on into L2BM; `send()` issues the MVs to DRAM."""

    lm_last: int  # LM long words per PE [0, lm_last) of the slice are read once `collect` ran
    collect: Callable[[], None]
    lift: Member
    send: Callable[[], None]


def upload_pieces(b: ProgramBuilder, st: Staging, *, dram: Address, lm_mem: str, lm_word: int, transit: Transit,
                  slice_index: int = 0, reduce: bool = False, at_least: int = 1, after: int = 0) -> list[UploadPiece]:
    """The pieces of `emit_upload` (at least `at_least` of them, where the quantum allows), to emit
    in order: piece k goes through buffer (after + k) % 2 and waits for the piece two before it."""
    if st.l1_mode == "blocks":
        raise LayoutError(f"internal: {st.lm.layout} is staged in a block per L1B, for fetches only")
    if reduce and st.l2_replicas != tuple(range(st.chain.l2_per_group)):
        raise LayoutError(f"{st.lm.layout} is not copied over every L2B of a Group; there is nothing to reduce")
    if st.pe_mode == "broadcast":
        raise LayoutError(f"{st.lm.layout} is broadcast over every PE of an L1B; uploading it would need an "
                          f"l1bm mode that reads one PE alone")
    wpl = st.lm.hw.long_word_bytes // st.lm.hw.word_bytes
    base = dram + slice_index * st.image_lw
    pe_mode = "collect" if st.pe_mode == "distribute" else "individual"
    l1_mode = "collect" if st.l1_mode == "distribute" else "individual"

    def collect(k: int, p: Piece) -> None:
        if k >= 2:
            b.wait(transit.tags[k % 2])  # the transfer that last used this buffer has drained it
        b.xfer(pe_mode, "up", L1BM, transit.l1[k % 2], lm_mem, lm_word + wpl * p.lm_first, p.q1_count, index=0)

    def lift(k: int, p: Piece, b: ProgramBuilder) -> None:
        b.xfer(l1_mode, "up", L2BM, transit.l2[k % 2], L1BM, transit.l1[k % 2], p.q2_count, index=0)

    def send(k: int, p: Piece) -> None:
        tag = transit.tags[k % 2]
        if st.spread:
            _collect_spread(b, st, transit.l2[k % 2], base, p, tag)
        for slot, local in enumerate(() if st.spread else st.l2_locals if st.l2_locals is not None else (0,)):
            if reduce:
                b.mv("reduce", L2BM, transit.l2[k % 2], DRAM, base + slot * st.n_l2 + p.q2_first, p.q2_count,
                     tag=tag, red="add", dtype=st.lm.dtype)
            else:
                b.mv("individual", L2BM, transit.l2[k % 2], DRAM, base + slot * st.n_l2 + p.q2_first, p.q2_count,
                     tag=tag, src_local=local)
    return [UploadPiece(p.lm_last, partial(collect, k, p), partial(lift, k, p), partial(send, k, p))
            for k, p in enumerate(pieces(st, transit, at_least), start=after)]


def emit_upload(b: ProgramBuilder, st: Staging, *, dram: Address, lm_mem: str, lm_word: int, transit: Transit,
                slice_index: int = 0, reduce: bool = False, ready: Callable[[int], None] | None = None,
                after: int = 0) -> None:
    """LM -> DRAM image, one slice; broadcast copies are read from replica 0. With `reduce`, the
    copies on the L2Bs of each Group are partial sums (a product whose L2Bs split K): the Data
    Engines add them up on the way to DRAM (MV reduce).

    With `ready`, the slice is still being written when the upload starts: `ready(last)` is called
    before each piece with the piece's end (LM long words per PE from `lm_word`) and emits what
    finishes those words. The slice is then cut into short pieces (`pipelined_pieces`), so that
    the Data Engines start on the first piece while the PE stream still produces the rest.

    `after`: the pieces sent through the same buffers just before (`upload_pieces`, whose last two
    may still be draining): this upload's first pieces wait for them. At its end it waits for
    every buffer to drain."""
    hz = st.lm.hw.hazards
    parts = upload_pieces(b, st, dram=dram, lm_mem=lm_mem, lm_word=lm_word, transit=transit,
                          slice_index=slice_index, reduce=reduce, after=after,
                          at_least=pipelined_pieces(st, reduce) if ready is not None else 1)
    for piece in parts:
        if ready is not None:
            ready(piece.lm_last)  # before the wait: the PE stream works while the engines drain piece k - 2
        piece.collect()
        b.nop(hz["l1bm_write_to_l2bm_read"])
        piece.lift(b)
        b.nop(hz["l2bm_write_to_mv_read"])
        piece.send()
    sent = after + len(parts)
    for k in range(max(0, sent - 2), sent):
        b.wait(transit.tags[k % 2])


def pipelined_pieces(st: Staging, reduce: bool) -> int:
    """How many pieces an upload overlapped with its producer is cut into: the smaller the first,
    the sooner the Data Engines start; but none so short that its MV ends before the next piece's
    MV can start (through two transit buffers, the next piece is collected only once the one before
    has left, and its MV waits a latency): each MV outlasts twice the path's latency."""
    hw, path = st.chain.hw, st.chain.l2_to_dram
    mode = "reduce" if reduce else "individual"
    shortest = 2 * hw.transfers[path].latency_cycles * side_rates(hw, path, mode)[1]
    return max(1, int(st.n_l2 // shortest))


def _collect_spread(b: ProgramBuilder, st: Staging, l2_addr: int, base: Address, p: Piece, tag: int) -> None:
    """A piece of a spread image from L2BM (at `l2_addr`) to DRAM: Group g writes its blocks of
    each round, one from each of its L2Bs, as one collect (the inverse of `_spread`'s pattern)."""
    ch, groups, per = st.chain.spread_chunk, st.chain.groups, st.chain.l2_per_group
    block = ch * groups
    for r in range(p.q2_count // block):
        for g in range(groups):
            b.mv("collect", L2BM, l2_addr + block * r + ch * g, DRAM, base + ch * per * (p.q2_first // block + r),
                 ch * per, tag=tag, src_inst=g * per, dst_inst=g)

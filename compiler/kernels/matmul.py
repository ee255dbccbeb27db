"""Matrix products (mm, bmm, and so linear and matmul) on the MAUs of every MAB.

The output is cut into tiles, one per MAB: each level above the MAB (L2B, L1B, MAB) takes a
role, splitting the batch, the rows (M) or the columns (N); a level splitting M leaves B
broadcast over it, one splitting N leaves A broadcast. The L2B axis is also cut at the Group
boundary (the L2Bs of a Group share its Data Engine): the Groups take one or two roles and the
L2Bs inside each Group another, or K, their partial sums added by an MV reduce on the way out.
Inside a MAB the MATMUL instruction's convention holds (sim.isa): K is split over the MAB's PEs
in A and B, N in C. K is processed in chunks and M in rounds when a tile does not fit the PEs'
memories; chunks and rounds are time slices of the operands' layouts.

Each step (one chunk) the Data Engines fetch chunks ahead into a ring of L2BM regions while
the PE stream moves this one down to the PEs and multiplies it. Tilings are ranked by a model
of that pipeline from the YAML numbers (`_cost`: Data Engine time per step against the PE
stream's transfers, hazards and MAU steps) and the best is emitted. Tilings of one round are
also offered with B kept in the PE memories over several rounds (compiler.kernels.stationary), so
that C goes up round by round while the last round multiplies. The best few tilings are also
offered with C's columns dealt to the PEs a long word at a time (`Tiling.n_dealt`), the way A and
B deal K: C is then in the layout a later product reads it in as an operand, or a state its
update reads beside it (a weight and its gradient: a 784-512-10 MLP's SGD step on mncore2 took
767,762 cycles without them, 541,864 with). The parts both schedules are built from are in
compiler.kernels.pipeline, the tilings and their layouts in .tiling.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import lru_cache, partial
from itertools import product
from math import ceil, prod

import numpy as np

from hwdesc.figures import side_rates
from sim.isa import DType, VOp

from ..chain import Chain
from ..errors import CompileError, LayoutError
from ..ir import Node, Value
from ..layout import W_AXIS, Layout, Placement, lane_padding_dims
from ..layout.layout import spread
from ..transfer.staging import leg_bundles, stage, stored_staging
from .base import Kernel, device_dtype
from .context import Arena, EmitContext, Ref, gather_mvs
from .pipeline import Epilogue, Feed, beside, multiply
from .stationary import emit_stationary, stationary_cost, stationary_fits, stationary_regions
from .tiling import (NO_OVERLAP, OPERAND_ROLES, OVERLAP_ALL, OVERLAP_EARLY, ROLES, Problem, Shifts, Source, Take,
                     Tiling, layouts, layouts_for, output_layout)

WISHED_TILINGS = 4  # tilings whose operand layouts a producer is offered (compile-time budget)
CANDIDATES = 32  # at most this many undominated tilings per product are timed (compile-time budget)
STATIONARY_CANDIDATES = 2  # B-stationary tilings timed besides (compile-time budget)
DEALT_CANDIDATES = 4  # tilings also timed with C's columns dealt to the PEs (compile-time budget)
MOST_STATIONARY_ROUNDS = 8  # rounds a B-stationary tiling may have (more only shorten the last round's upload)
# A B-stationary tiling's rounds are whole MAU rows: the row tile may be padded up to this factor for them
# (a 1000-row product's 250 rows per Group as 4 rounds of 64: 2.4 % more MAU work, C going up while it
# multiplies). A compile-time choice, not a hardware number.
STATIONARY_PADDING = 9 / 8


@dataclass(frozen=True)
class Regions:
    """Where one step's operands and result live in every PE: (memory, word) of A and B as the
    MAU reads them, C (the accumulator: float32, float64 for a float64 product), and when needed
    float32 staging for A and B (converted to half or float64 in LM) and C's copy for upload (half
    for a half output, float32 from a float64 accumulator)."""

    a: tuple[str, int]
    b: tuple[str, int]
    c: tuple[str, int]
    a32: tuple[str, int] | None
    b32: tuple[str, int] | None
    c_up: tuple[str, int] | None


def _regions(cg: EmitContext, t: Tiling, convert_in: bool, out_half: bool) -> Regions:
    """The PE-memory regions of a tiling, largest first so that they pack; the accumulator
    prefers the GRFs. Raises CompileError when they do not fit."""
    c_elements = t.mt * (t.nt // cg.params.pes_per_mab)
    c_words = 2 * c_elements if t.float64 else c_elements
    wanted = {"a": t.words(t.a_elements), "b": t.words(t.b_elements), "c": c_words}
    if convert_in:
        wanted.update(a32=t.a_elements, b32=t.b_elements)
    if out_half:
        wanted["c_up"] = c_elements // 2 + 1
    elif t.float64:
        wanted["c_up"] = c_elements
    arena = Arena(cg.hw)
    got = {}
    together = ("a", "b", "c")  # one MATMUL reads A, B and (accumulating) C: each memory once
    for name in sorted(wanted, key=lambda n: -wanted[n]):
        prefer = ("GRF0", "GRF1", "LM0", "LM1") if name == "c" else ("LM0", "LM1", "GRF0", "GRF1")
        avoid = {got[o][0] for o in together if o in got and o != name} if name in together else set()
        got[name] = arena.alloc(wanted[name], prefer=prefer, avoid=avoid, strict=True)
    return Regions(got["a"], got["b"], got["c"], got.get("a32"), got.get("b32"), got.get("c_up"))


def _fits(cg: EmitContext, t: Tiling, convert_in: bool, out_half: bool) -> bool:
    try:
        _regions(cg, t, convert_in, out_half)
        return True
    except CompileError:
        return False


def _double_regions(cg: EmitContext, t: Tiling, out_half: bool) -> tuple[Regions, Regions] | None:
    """Two steps' operand regions and one accumulator, placed so that a MATMUL reading one step's
    operands issues in one bundle with the transfers that write the other's (the issue model's
    memory rules, sim.issue): one operand alternates between two memories (the one a MATMUL does
    not read is written), the other keeps both steps' copies in one memory with separate read and
    write ports (read at one range while the other is written), C in a fourth memory. None when
    no such placement fits (or the operands are converted in LM: their float32 staging would need
    doubling too)."""
    if t.float64:
        return None
    words = {"a": t.words(t.a_elements), "b": t.words(t.b_elements)}
    c_words = t.mt * (t.nt // cg.params.pes_per_mab)
    memories = cg.chain.scratch
    two_ported = [m for m in memories if cg.hw.memories[m].ports != "1RW"]
    for alternating, kept in sorted((("a", "b"), ("b", "a")), key=lambda pair: -words[pair[0]]):
        for shared in two_ported:
            # C in the other two-ported memory if it fits: MATMUL pieces write their rows of C and
            # read the next ones, which an LM's port-conflict hazard would separate by nops
            for c_mem in sorted((m for m in memories if m != shared), key=lambda m: m not in two_ported):
                pair = [m for m in memories if m not in (shared, c_mem)]
                if len(pair) < 2:
                    continue
                arena = Arena(cg.hw)
                try:
                    got = {(alternating, 0): arena.alloc(words[alternating], prefer=(pair[0],), strict=True),
                           (alternating, 1): arena.alloc(words[alternating], prefer=(pair[1],), strict=True),
                           (kept, 0): arena.alloc(words[kept], prefer=(shared,), strict=True),
                           (kept, 1): arena.alloc(words[kept], prefer=(shared,), strict=True),
                           "c": arena.alloc(c_words, prefer=(c_mem,), strict=True)}
                    c_up = arena.alloc(c_words // 2 + 1) if out_half else None
                except CompileError:
                    continue
                return tuple(Regions(got["a", s], got["b", s], got["c"], None, None, c_up) for s in (0, 1))
    return None


@dataclass(frozen=True)
class Traffic:
    """Long words one step (one K chunk of one round) moves, per L2B (its share of the Group's
    Data Engine) and per L1BM and PE (the PE stream's transfers), for A and for B."""

    l2: tuple[float, float]
    l1: tuple[float, float]
    pe: tuple[float, float]


def _traffic(cg: EmitContext, t: Tiling, in_bytes: int) -> Traffic:
    chain = Chain.of(cg.hw)
    lw, pes = cg.hw.long_word_bytes, cg.params.pes_per_mab
    below_l2 = (chain.l1_axis, chain.unit_axis)
    k_step = t.kp * pes
    rows_l2 = t.a_rows * t.tiles("m", below_l2)
    cols_l2 = t.nt * t.tiles("n", below_l2)
    l2 = (rows_l2 * k_step * in_bytes / lw, t.positions * cols_l2 * k_step * in_bytes / lw)
    l1 = tuple(v / (t.tiles(role, (chain.l1_axis,)) if t.places(op, chain.l1_axis) else 1)
               for v, role, op in zip(l2, ("m", "n"), ("a", "b")))
    pe = (t.a_elements * in_bytes / lw, t.b_elements * in_bytes / lw)
    return Traffic(l2, l1, pe)


@dataclass(frozen=True)
class Work:
    """What a tiling makes each unit do, in counts that no rate enters: MAU cycles (from the MAU's
    shape), long words and MVs per Group's Data Engine, long words on each side of each PE-stream
    transfer mode, and how often the pipeline starts (steps, rounds, prefetch or not). A tiling
    whose counts are all at most another's is at least as fast on any rates: the planner keeps
    the tilings no other dominates (the same set on any variant of a chip) and times them."""

    mau: int
    engine_lw: float
    engine_mvs: float
    stream: tuple[float, ...]  # (upper, lower) long words per (path, mode), in a fixed order
    steps: int
    rounds: int
    serial: int  # 1 when the Data Engines cannot fetch ahead (each step waits for its operands)
    upload_lw: float
    overlap: int = 0  # Tiling.overlap where the Data Engines fetch ahead, else NO_OVERLAP
    operand_lw: tuple[float, float] = (0.0, 0.0)  # engine_lw's parts for A and B (not compared: in engine_lw)

    @property
    def exposed(self) -> int:
        """Steps per round whose transfers to the PEs the stream pays in full (all without overlap)."""
        return {NO_OVERLAP: self.steps // self.rounds, OVERLAP_ALL: 1, OVERLAP_EARLY: 2}[self.overlap]

    def vector(self) -> tuple[float, ...]:
        # the overlaps are each better than none, and neither better than the other on all rates
        return (self.mau, self.engine_lw, self.engine_mvs, *self.stream, self.steps, self.rounds, self.serial,
                self.upload_lw, int(self.overlap != OVERLAP_ALL), int(self.overlap != OVERLAP_EARLY))


def _gather_mvs(cg: EmitContext, t: Tiling, a_l2_lw: float, in_bytes: int, source_run: float,
                bound: bool = False, source_groups: int = 1) -> tuple[float, float]:
    """(MVs, long words moved by each Data Engine) per step for an A gathered from runs of
    `source_run` long words on average (im2col): one MV per run, in every Group, into each L2B
    that holds A there. The PE stream issues them all, so their latencies queue in one stream;
    their data flows on the Data Engines of the `source_groups` Groups the source is spread over,
    side by side. A run
    also ends where A's L2BM image interleaves other rows: after the PEs of a MAB when the MABs
    split M (l1bm distribute), after an l2bm chunk when the L1Bs do, unless the image holds each
    L1B's rows in a block of its own (a direct convolution's, `a_blocks`); each MV moves whole
    units."""
    hw, chain = cg.hw, cg.chain
    per_pe = t.kp * in_bytes / hw.long_word_bytes  # a row's long words in each PE per step
    run = chain.pes_per_unit * (1 if t.places("a", chain.unit_axis) else per_pe)
    blocks = a_blocks(t, chain)
    if t.places("a", chain.l1_axis) and not blocks:
        run = min(run, chain.l2_chunk)
    whole_rows = t.chunks == 1 and not t.places("a", chain.unit_axis) and (blocks or not t.places("a", chain.l1_axis))
    if whole_rows and (bound or (blocks and t.tiles("k") == 1)):
        run = a_l2_lw  # whole rows, one after another: at best (or in blocks, a row's every channel) one block
    # either kind of boundary ends an MV: as if independent (to rank tilings), or at best coinciding
    run = min(run, source_run) if bound else 1 / (1 / run + 1 / source_run)
    unit = hw.transfers[chain.dram_to_l2].modes["individual"].unit_lw
    targets = _l2_per_group_used(t, chain) if t.places("a", chain.l2_axis) else chain.l2_per_group
    mvs = chain.groups * targets * a_l2_lw / run
    return mvs, mvs / source_groups * ceil(run / unit) * unit


def a_blocks(t: Tiling, chain: Chain) -> bool:
    """Whether A's L2BM image holds each L1B's part in a block of its own (transfer.staging's
    `blocks`): a direct convolution's A placed over the L1Bs, where the l2bm broadcast names
    subsets (conv.ConvKernel.emit asks for it)."""
    return t.shifts is not None and chain.l1_subsets and t.places("a", chain.l1_axis)


def _work(cg: EmitContext, t: Tiling, in_bytes: int, staged_in_float32: bool, a_runs: float | None = None,
          bound: bool = False, source_groups: int = 1, spread: tuple[bool, bool] = (False, False)) -> Work:
    hw, params, chain = cg.hw, cg.params, cg.chain
    traffic = _traffic(cg, t, in_bytes)
    l2_in_group = _l2_per_group_used(t, chain)
    unit = hw.transfers[chain.dram_to_l2].modes["individual"].unit_lw
    block = [ceil(v / unit) * unit for v in traffic.l2]  # one MV per operand, whole units
    # per operand: (long words at the individual mode's rate, MVs) each Group's Data Engine moves a step
    # (`spread`: the operand is stored spread over the Groups' DRAMs where its layout allows, see _spread_fetch)
    steps = t.batch_local * t.rounds * t.chunks
    fetches = [(_spread_fetch(cg, t, op, v, raw, steps) if sp else None) or (l2_in_group * v, l2_in_group)
               for op, v, raw, sp in zip(("a", "b"), block, traffic.l2, spread)]
    if a_runs is not None:  # A's long words come in short runs, not blocks
        mvs, lw = _gather_mvs(cg, t, traffic.l2[0], in_bytes, a_runs, bound, source_groups)
        fetches[0] = (lw, mvs)
    engine_lw, engine_mvs = fetches[0][0] + fetches[1][0], fetches[0][1] + fetches[1][1]
    modes = {(chain.l2_to_l1, m): [0.0, 0.0] for m in ("broadcast", "distribute")}
    modes.update({(chain.l1_to_pe, m): [0.0, 0.0] for m in ("mab_broadcast", "distribute")})
    for op, l2, l1, pe in zip(("a", "b"), traffic.l2, traffic.l1, traffic.pe):
        l1_mode = "distribute" if t.places(op, chain.l1_axis) else "broadcast"
        if op == "a" and a_blocks(t, chain):  # a broadcast to each L1B alone: its block at the broadcast's rates
            l1_mode, l1 = "broadcast", l2
        modes[chain.l2_to_l1, l1_mode][0] += l2
        modes[chain.l2_to_l1, l1_mode][1] += l1
        pe_mode = "distribute" if t.places(op, chain.unit_axis) else "mab_broadcast"
        per_mode = chain.pes_per_l1 if pe_mode == "distribute" else chain.pes_per_unit  # PEs with their own data
        modes[chain.l1_to_pe, pe_mode][0] += pe * per_mode
        modes[chain.l1_to_pe, pe_mode][1] += pe
    mode = hw.units[chain.matrix_unit].matrix[t.mau_dtype]
    mm = t.positions * ceil(t.mt / mode.rows) * ceil(t.kp * params.pes_per_mab / mode.cols) \
        * max(t.nt, ceil(mode.rows / mode.load_rows_per_cycle))
    if t.converts_in(staged_in_float32):  # float32 staged, converted to half or float64 in LM: VOP work
        other = DType.float64 if t.float64 else DType.float16
        lanes = min(params.vop_lanes[VOp.cvt, DType.float32], params.vop_lanes[VOp.cvt, other])
        issues = max(params.vop_dtype_issues[VOp.cvt, other], params.vop_dtype_issues[VOp.cvt, DType.float32])
        mm += ceil((t.a_elements + t.b_elements) / lanes) * issues * hw.step_cycles  # as sim.timing costs a cvt
    c_lw = t.mt * t.tiles("m", (chain.l1_axis, chain.unit_axis)) * t.nt * t.tiles("n", (chain.l1_axis, chain.unit_axis)) \
        * hw.element_bytes("float32") / hw.long_word_bytes * l2_in_group / t.tiles("k")  # partial sums reduce on the way
    serial = int(t.chunks == 1 or 2 * sum(traffic.l2) > hw.memory_lw(chain.l2))  # nothing to fetch ahead (see pipeline.Feed)
    stream = tuple(v * steps for key in sorted(modes) for v in modes[key])
    return Work(mm * steps, engine_lw * steps, engine_mvs * steps, stream, steps, t.batch_local * t.rounds, serial,
                c_lw * t.batch_local * t.rounds, NO_OVERLAP if serial else t.overlap,
                (fetches[0][0] * steps, fetches[1][0] * steps))


def _spread_fetch(cg: EmitContext, t: Tiling, operand: str, block: int, raw: float, steps: int
                  ) -> tuple[float, int] | None:
    """(long words at the individual mode's rate, MVs) a Group's Data Engine spends on an operand
    its staging reads by one distributed broadcast a step (transfer.staging._spread: copied over
    every Group, each L2B of a Group holding its own `block`, `raw` long words before rounding
    to whole MV units, in whole rounds of the broadcast's blocks, and worth it over the `steps`),
    or None when it is not read so."""
    chain = cg.chain
    ch = chain.spread_chunk
    if not ch or raw % (ch * chain.groups) or not chain.worth_spreading(raw * steps):
        return None
    roles, per = OPERAND_ROLES[operand], chain.l2_per_group
    takes = [k for k in t.takes if k.axis == chain.l2_axis and k.n > 1]
    local = prod(k.n for k in takes if k.stride < per and k.role in roles)
    across = [k for k in takes if k.stride >= per]
    if local != per or prod(k.n for k in across) != chain.groups or any(k.role in roles for k in across):
        return None
    own = side_rates(cg.hw, chain.dram_to_l2, "individual")[0]
    return per * block - chain.spread_saving(block) * own, 1


def tiling_bound(cg: EmitContext, t: Tiling, in_bytes: int, staged_in_float32: bool, a_runs: float | None,
                 source_groups: int = 1) -> float:
    """`_cost` of a tiling whose A comes in runs of `a_runs` long words (None: in blocks) that end
    where its L2BM image's runs end, read from `source_groups` Groups: an estimate to prune by,
    which should not exceed the timing by more than the planner's slack."""
    return _cost(cg, t, _work(cg, t, in_bytes, staged_in_float32, a_runs, True, source_groups))


def _cost(cg: EmitContext, t: Tiling, work: Work) -> float:
    """An estimate of a tiling's cycles from its work and the YAML's rates, only to order the
    candidates the planner times (the choice is the timing engine's)."""
    r = _rates(cg.hw)
    # A Group's queue keeps `queue_depth` MVs in flight: their data flows one after another, their
    # latencies overlap (the timing engine's rule), so many short MVs cost their latency over the depth
    data = work.engine_lw / r.dram
    engine = max(data, (work.engine_mvs * r.latency + data) / r.queue_depth)
    moves = 0.0
    for k, src_rate, dst_rate in r.stream:
        moves += max(work.stream[2 * k] / src_rate, work.stream[2 * k + 1] / dst_rate)
    # hidden behind the MATMULs, the transfers cost only the first step of each round
    stream = max(work.mau, moves) + moves / work.steps * work.rounds * work.exposed if work.overlap else \
        work.mau + moves
    stream += work.steps * r.step_hazards
    upload = work.upload_lw / r.dram + work.rounds * r.latency
    if work.serial:
        return stream + engine + work.steps * r.latency + upload
    # the first operands arrive a DRAM latency after the start, whatever the tiling: the same for
    # every candidate (the ranking does not move), but small products are mostly this
    return r.latency + max(stream, engine) + upload


@dataclass(frozen=True)
class _Rates:
    """The YAML numbers `_cost` prices a tiling's work with (asked for once per description: a
    product has hundreds of tilings)."""

    dram: float  # LW/cycle of a Group's Data Engine, DRAM -> L2BM individual
    latency: int  # of that path
    queue_depth: int
    stream: tuple[tuple[int, float, float], ...]  # (index in Work.stream / 2, source rate, destination rate)
    step_hazards: int  # cycles of the two hazards every step waits out


@lru_cache(maxsize=None)  # one per chip in use
def _rates(hw) -> _Rates:
    chain = Chain.of(hw)
    keys = sorted([(chain.l2_to_l1, m) for m in ("broadcast", "distribute")] +
                  [(chain.l1_to_pe, m) for m in ("mab_broadcast", "distribute")])
    stream = tuple((k, *side_rates(hw, path, mode)) for k, (path, mode) in enumerate(keys)
                   if mode in hw.transfers[path].modes)
    return _Rates(side_rates(hw, chain.dram_to_l2, "individual")[0], hw.transfers[chain.dram_to_l2].latency_cycles,
                  hw.data_engine.queue_depth, stream,
                  2 * (hw.hazards["l2bm_to_l1bm_read"] + hw.hazards["lm_write_to_read"]) * hw.step_cycles)


def pareto(items: list, vector) -> list:
    """The items whose vectors no other item's is at most in every component (and below in one),
    the first of equal vectors only, in their order.

    A product has thousands of feasible tilings, so not pairwise (an n x n table: 0.95 s for an
    embedding's one-hot product): in lexicographic order, an item's dominators and equals all come
    before it, so each item is checked against the front found so far only."""
    if not items:
        return []
    v = np.array([vector(x) for x in items], dtype=np.float64)
    order = np.lexsort((np.arange(len(v)), *v.T[::-1]))  # by the components in turn, then first come
    front = np.empty((len(v), v.shape[1]))
    kept: list[int] = []
    for i in order.tolist():
        if kept and (front[:len(kept)] <= v[i]).all(1).any():  # an earlier one is at most it everywhere
            continue
        front[len(kept)] = v[i]
        kept.append(i)
    return [items[i] for i in sorted(kept)]


def _l2_per_group_used(t: Tiling, chain: Chain) -> int:
    """L2Bs of each Group the tiling feeds (each gets its own operand data from the Group's DRAM)."""
    positions = {0}
    for k in t.takes:
        if k.axis == chain.l2_axis:
            positions = spread(positions, k.n, k.stride)
    groups = {p // chain.l2_per_group for p in positions}
    return ceil(len(positions) / len(groups))


def _axis_options(axis: str, size: int, roles: tuple[str, ...], chain: Chain) -> list[tuple[tuple[str, int, int], ...]]:
    """Ways one axis can serve the roles; each option lists (role, positions, stride) per part.

    L1B and MAB serve one role each. The L2B axis is cut at the Group boundary: the Groups take
    one role or two (each over a factor of the Groups), and the L2Bs inside each Group another, or K, their
    partial sums added by the Data Engines on the way out. A Group's L2Bs then share one
    operand or split K: squarer tiles per Group and less Data Engine traffic."""
    inner = chain.l2_per_group
    if axis != chain.l2_axis or not 1 < inner <= size:
        return [((role, size, 1),) for role in roles]
    groups = size // inner
    group_options = [((role, groups, inner),) for role in roles]
    for d in range(2, groups):
        if groups % d == 0:
            group_options += [((hi, d, inner * groups // d), (lo, groups // d, inner))
                              for hi in roles for lo in roles if hi != lo]
    return [g + ((role, inner, 1),) for g in group_options for role in roles + ("k",)]


def tilings(cg: EmitContext, p: Problem, *, batched: bool, trans_b: bool, half: bool, staged_in_float32: bool,
            in_bytes: int, out_half: bool = False, a_runs: float | None = None, limit: int = CANDIDATES,
            pseudo: bool = False, float64: bool = False, spread: tuple[bool, bool] = (False, False),
            k_align: int | None = None, shifts: Shifts | None = None, dealt: bool = False) -> list[Tiling]:
    """The tilings that fit the PE memories and whose product has a storable image, the most
    promising first (by the work each step does, see `_cost`); the planner times the first few.
    The same product is asked for often (candidates, consumers' wishes): the answer is cached.
    `spread`: whether A and B are tensors the host writes (stored spread over the Groups' DRAMs
    when copied over them, read by distributed broadcast: cheaper to fetch). `k_align`: only
    tilings whose K chunks (and K parts over the chip) start at multiples of it or divide it, so
    that K read as (K / k_align, k_align) splits between factors (a convolution's weight read as
    B by block copies: K = (kernel position, channel)). `shifts`: a direct convolution's
    (`tiling.Shifts`; K is then the channels, each chunk a whole number of them). `dealt`: the best
    few also with C's columns dealt to the PEs (`_dealt_variants`), for a product whose output a
    reader takes with K dealt (`_dealt_columns_read`)."""
    pseudo, float64 = pseudo and not half, float64 and not half and not out_half
    modes = cg.hw.units[cg.chain.matrix_unit].matrix
    base = "float16" if half else "float32"
    if base not in modes:
        raise CompileError(f"a matrix product in {base} needs units.{cg.chain.matrix_unit}.matrix.{base}, which "
                           f"{cg.hw.name} does not describe (its matrix formats: {', '.join(modes) or 'none'})")
    for wanted, option, what in ((pseudo, "pfloat32", "pseudo-single"), (float64, "float64", "float64")):
        if wanted and option not in modes:
            raise CompileError(f"float_dtype {option!r} multiplies in {what}, but {cg.hw.name} has no "
                               f"units.{cg.chain.matrix_unit}.matrix.{option} (its matrix formats: {', '.join(modes)})")
    return list(_tilings(cg.hw, p, batched, trans_b, half, staged_in_float32, in_bytes, out_half,
                         None if a_runs is None else float(np.float32(a_runs)), limit, pseudo, float64, spread,
                         k_align, shifts, dealt))


@lru_cache(maxsize=256)
def _tilings(hw, p: Problem, batched: bool, trans_b: bool, half: bool, staged_in_float32: bool, in_bytes: int,
             out_half: bool, a_runs: float | None, limit: int, pseudo: bool, float64: bool,
             spread: tuple[bool, bool], k_align: int | None = None, shifts: Shifts | None = None,
             dealt: bool = False) -> tuple[Tiling, ...]:
    cg = EmitContext(hw)
    chain = Chain.of(cg.hw)
    axes = [a for a in cg.hw.axes if a != chain.pe_axis]
    sizes = cg.hw.axes
    pes = cg.params.pes_per_mab
    epl_in = cg.hw.elements_per_lw("float16" if half else "float32")
    col_unit = pes * max(epl_in, cg.hw.elements_per_lw("float32"))
    feasible: list[Tiling] = []
    roles = ROLES if batched else ROLES[1:]
    fit_cache: dict[tuple[int, int, int], bool] = {}

    double_cache: dict[tuple[int, int, int], bool] = {}

    def fitted(key: tuple[int, int, int], build: Callable[[], Tiling]) -> bool:
        """`_fits` of the tiling `build` makes, which depends on its (mt, kp, nt) `key` alone (many
        assignments share them): built only when the key is not known yet."""
        if key not in fit_cache:
            t = build()
            fit_cache[key] = _fits(cg, t, t.converts_in(staged_in_float32), out_half)
        return fit_cache[key]

    def overlapping(t: Tiling) -> bool:
        """Whether a step's transfers to the PEs can issue beside the step before's MATMUL."""
        if t.chunks == 1 or t.converts_in(staged_in_float32):
            return False
        key = (t.mt, t.kp, t.nt)
        if key not in double_cache:
            double_cache[key] = _double_regions(cg, t, out_half) is not None
        return double_cache[key]
    for assignment in product(*(_axis_options(a, sizes[a], roles, chain) for a in axes)):
        remaining = {"batch": p.batch if batched else 1, "m": p.m, "n": ceil(p.n / col_unit), "k": ceil(p.k / (pes * epl_in))}
        takes = []
        for axis, parts in zip(axes, assignment):
            for role, size, stride in parts:
                n = _take(remaining[role], size, exact=role == "batch")
                remaining[role] = ceil(remaining[role] / n)
                takes.append(Take(axis, role, n, stride))
        t0 = Tiling(tuple(takes), 1, 1, 1, 1, 1, 1, trans_b, half, pseudo, float64=float64, shifts=shifts)
        if t0.tiles("k") > 1 and not t0.places("c", chain.l2_axis):
            continue  # partial sums are added by an MV reduce into C's image, which must place L2B
        nb, nm, nn = t0.tiles("batch"), t0.tiles("m"), t0.tiles("n")
        bl = ceil((p.batch if batched else 1) / nb)
        m_tile = ceil(p.m / nm)
        nt = ceil(ceil(p.n / nn) / col_unit) * col_unit
        k_local = ceil(p.k / t0.tiles("k"))
        if k_align is not None and not _aligned(k_local, p.k, k_align):
            continue
        for kp in _kp_options(k_local, pes, epl_in) if k_align is None else _aligned_kp(k_local, pes, epl_in, k_align):
            chunks = ceil(k_local / (kp * pes))
            if shifts and (chunks * kp * pes != k_local or k_local * t0.tiles("k") != p.k):
                continue  # a direct convolution's K chunks cut its channels without padding
            # the fewest rounds whose row tile fits (fewer rounds are always at least as good;
            # a smaller tile never needs more memory): bisect on the rounds
            tiling = lambda rounds, overlap=NO_OVERLAP, cost=0.0: Tiling(  # noqa: E731
                tuple(takes), bl, rounds, ceil(m_tile / rounds), chunks, kp, nt, trans_b, half, pseudo,
                float64=float64, overlap=overlap, shifts=shifts, cost=cost)
            fits = lambda rounds: fitted((ceil(m_tile / rounds), kp, nt), partial(tiling, rounds))  # noqa: E731
            if m_tile == 0 or not fits(m_tile):
                continue
            low, high = 1, m_tile
            while low < high:
                mid = (low + high) // 2
                low, high = (low, mid) if fits(mid) else (mid + 1, high)
            t = tiling(low)
            overlaps = (OVERLAP_ALL, OVERLAP_EARLY)[:t.chunks - 1] if overlapping(t) else (NO_OVERLAP,)
            # the work but its overlap is the same for each (a product has hundreds of tilings)
            work = _work(cg, tiling(low, overlaps[0]), in_bytes, staged_in_float32, a_runs, spread=spread)
            for overlap in overlaps:
                w = replace(work, overlap=NO_OVERLAP if work.serial else overlap) if overlap != overlaps[0] else work
                feasible.append((tiling(low, overlap, _cost(cg, t, w)), w))
    # The product is stored in the image of its layout: that image needs notation.
    epl_staged = cg.hw.elements_per_lw("float32") if staged_in_float32 else epl_in
    out_dtype = "float16" if out_half else "float32"
    in_dtype = "float32" if staged_in_float32 or not half else "float16"
    front = sorted(pareto(feasible, lambda tw: tw[1].vector()), key=lambda tw: tw[0].cost)
    storable = []

    def keep_storable(ranked: list) -> None:
        for t, _ in ranked:
            la, lb, lc = layouts(t, p, chain, epl_staged, cg.hw.elements_per_lw(out_dtype), batched)
            if _storable(lc, cg.hw, out_dtype) and _storable(la, cg.hw, in_dtype) and _storable(lb, cg.hw, in_dtype):
                storable.append(t)
                if len(storable) == limit:
                    return
    keep_storable(front)
    if not storable:  # the front's images have no notation (a 2x648x10 product on mini): the dominated ones
        on_front = {id(tw) for tw in front}
        keep_storable(sorted((tw for tw in feasible if id(tw) not in on_front), key=lambda tw: tw[0].cost))
    if not storable:
        raise CompileError(f"no tiling of a {p.batch}x{p.m}x{p.k}x{p.n} product fits the PE memories of {cg.hw.name}")
    if not (out_half or float64 or staged_in_float32):
        works = {t: w for t, w in feasible}
        storable += _stationary_variants(cg, [(t, works[t]) for t in storable], p, batched, epl_staged, in_dtype)
    if dealt:
        storable += _dealt_variants(cg, storable, p, batched, trans_b, epl_staged, out_dtype, in_dtype)
    return tuple(storable)


def _stationary_variants(cg: EmitContext, ranked: list[tuple[Tiling, Work]], p: Problem, batched: bool,
                         epl_staged: int, in_dtype: str) -> list[Tiling]:
    """B-stationary versions of one-round tilings (compiler.kernels.stationary: their rows cut into
    rounds at whole MAU rows, as long as every round's C and all of B fit beside two steps' A in
    the PE memories, and the schedule's rings in L2BM), the best few by their estimate, for the
    planner to time beside the others."""
    found: dict[Tiling, Tiling] = {}
    rate = side_rates(cg.hw, cg.chain.dram_to_l2, "individual")[0]
    for t, work in ranked:
        if t.rounds != 1 or t.chunks < 2 or t.batch_local != 1 or t.shifts:
            continue
        rows = cg.hw.units[cg.chain.matrix_unit].matrix[t.mau_dtype].rows
        for rounds in range(2, MOST_STATIONARY_ROUNDS + 1):
            mt = -(-t.mt // (rounds * rows)) * rows  # rows per round: whole MAU rows, padding the last few
            if mt * rounds > t.mt * STATIONARY_PADDING:
                continue
            v = replace(t, rounds=rounds, mt=mt, b_stationary=True, overlap=OVERLAP_ALL, cost=0.0)
            if stationary_regions(cg, v) is None:
                continue
            la, lb, _ = layouts(v, p, cg.chain, epl_staged, epl_staged, batched)
            if not stationary_fits(cg, la, lb, in_dtype, in_dtype):
                continue
            padded = mt * rounds / t.mt  # the MAU multiplies the padding rows too, and A and C carry them
            (a_lw, b_lw), up_lw = work.operand_lw, work.upload_lw
            for first in range(1, rounds):
                w = replace(v, stationary_first=first)
                if w not in found:
                    found[w] = replace(w, cost=stationary_cost(cg, w, work.mau * padded, a_lw * padded / rate,
                                                              b_lw / rate, up_lw * padded / rate))
    return sorted(found.values(), key=lambda v: v.cost)[:STATIONARY_CANDIDATES]


def _dealt_variants(cg: EmitContext, ranked: list[Tiling], p: Problem, batched: bool, trans_b: bool,
                    epl_staged: int, out_dtype: str, in_dtype: str) -> list[Tiling]:
    """The best few tilings again with C's columns dealt to the PEs a long word at a time
    (`Tiling.n_dealt`), where that changes C's layout (at least two of C's long words a PE) and B's
    long words hold whole long words of C (B transposed, or as many lanes as C)."""
    epl_out = cg.hw.elements_per_lw(out_dtype)
    found: list[Tiling] = []
    for t in ranked:
        if t.shifts or t.b_stationary or (t.nt // cg.chain.pes_per_unit) // epl_out < 2 \
                or not (trans_b or epl_staged == epl_out):
            continue
        v = replace(t, n_dealt=True)
        if _storable(layouts(v, p, cg.chain, epl_staged, epl_out, batched)[1], cg.hw, in_dtype):
            found.append(v)
            if len(found) == DEALT_CANDIDATES:
                break
    return found


def _storable(layout: Layout, hw, dtype: str) -> bool:
    try:
        stage(Placement(layout, hw, "LM0", dtype, check_capacity=False))
        return True
    except LayoutError:
        return False


def _take(count: int, size: int, *, exact: bool) -> int:
    """Positions of an axis a dimension of `count` tiles uses: a divisor of the axis size (so that
    the layout's digits split evenly at every transfer chunk), the smallest that holds `count`
    tiles or the whole axis; with `exact`, the largest divisor of both."""
    if not exact:
        return min(d for d in range(1, size + 1) if size % d == 0 and (d >= count or d == size))
    return max(d for d in range(1, min(size, count) + 1) if count % d == 0 and size % d == 0)


def _kp_options(k: int, pes: int, epl: int) -> list[int]:
    """K per PE per chunk, largest first: whole multiples of the lanes."""
    full = ceil(ceil(k / pes) / epl) * epl
    options, kp = [], full
    while kp >= epl:
        options.append(kp)
        kp = ceil(kp // 2 / epl) * epl if kp > epl else 0
    return options


def _aligned(part: int, whole: int, align: int) -> bool:
    """Whether `part` (dividing `whole`) cuts K = (whole / align, align) between its factors."""
    return whole % part == 0 and (align % part == 0 or part % align == 0)


def _aligned_kp(k: int, pes: int, epl: int, align: int) -> list[int]:
    """K per PE per chunk whose chunks `_aligned` cuts K into, largest first."""
    return [kp for kp in range(k // pes, 0, -1) if kp % epl == 0 and _aligned(kp * pes, k, align)]


def emit_product(cg: EmitContext, t: Tiling, p: Problem, batched: bool, a: Source, b: Source, out_dtype: str,
                 out_ref: Ref) -> None:
    """C = A @ B for a tiling, into `out_ref` (the image of C's LM layout).

    Step by step (one K chunk of one round), the Data Engines fetch steps ahead into L2BM (`pipeline.Feed`)
    while the PE stream brings a step's operands down to the PEs and multiplies them. With
    `Tiling.overlap` the PE memories hold two steps' operands: step i + 1's transfers to the PEs
    issue beside step i's MATMUL, cut into pieces so that each bundle of the transfers' pipeline
    has one (the stream then pays the longer of the two, not their sum)."""
    if t.b_stationary:
        return emit_stationary(cg, t, p, batched, a, b, out_dtype, out_ref)
    half_in = a.ref.placement.dtype == "float16" and b.ref.placement.dtype == "float16"
    mm_dtype = t.mau_dtype
    la, lb, lc = layouts_for(cg, t, p, batched, half_in)
    lc_out = lc if out_dtype == "float32" else layouts_for(cg, t, p, batched, half_in, out_dtype)[2]
    # float32 in DRAM, half or float64 in the MAU: stage float32, convert in LM
    convert_in = t.float64 or (t.half and not half_in)
    out_half = out_dtype == "float16"
    feed = Feed(cg, (a, b), (la, lb))
    double = _double_regions(cg, t, out_half) if t.overlap and feed.pipelined else None
    sets = double or (_regions(cg, t, convert_in, out_half),)
    (mem_c, word_c) = sets[0].c
    c_at = word_c // 2 if t.float64 else word_c  # C's address in its elements (float64 for a float64 product)
    if out_half or t.float64:
        mem_up, word_up = sets[0].c_up
    hazard = cg.hw.hazards["lm_write_to_read"]
    mau_rows = cg.hw.units[cg.chain.matrix_unit].matrix[mm_dtype].rows

    def into(i: int) -> tuple[tuple[str, int], tuple[str, int]]:
        regs = sets[i % len(sets)]
        return (regs.a32, regs.b32) if convert_in else (regs.a, regs.b)

    def product(regs: Regions, accumulate: bool, axis: str = "m", first: int = 0, size: int = t.mt,
                into=None) -> None:
        multiply(cg, t, regs.a, regs.b, (mem_c, c_at), accumulate, axis, first, size, into)

    steps = [(bl, r, k) for bl in range(t.batch_local) for r in range(t.rounds) for k in range(t.chunks)]
    slices = lambda bl, r, k: ((bl * t.rounds + r) * t.chunks + k, bl * t.chunks + k)  # noqa: E731
    ahead = feed.depth - 1
    for i, (bl, r, k) in enumerate(steps):
        regs = sets[i % len(sets)]
        if double is not None:
            # A round starts afresh (an upload ends each round and uses the L2BM transit buffers);
            # its later steps' operands come down beside the MATMUL before, and the step `depth`
            # ahead comes into a step's L2BM region leg by leg, as that step's legs leave it.
            def refills(j: int) -> list[Callable[[], None]] | None:
                return feed.refills(j, *slices(*steps[j])) if j < len(steps) and steps[j][:2] == (bl, r) else None
            if k == 0:
                for j in range(i, i + min(feed.depth, t.chunks)):
                    feed.fetch(j, *slices(*steps[j]))
            last_hidden = t.chunks - (1 if t.overlap == OVERLAP_ALL else 2)  # the last step brought down beside
            if k == 0 or k > last_hidden:
                feed.drain(i, into(i), *slices(bl, r, k), refills=refills(i + feed.depth))
            if k + 1 <= last_hidden:
                feed.wait(i + 1)
                refill = refills(i + 1 + feed.depth)
                beside(cg, t, partial(product, regs, k > 0), leg_bundles(feed.legs(i + 1, into(i + 1)), feed.transit),
                       after=(lambda hop, refill=refill: refill[hop]()) if refill else None, fitted=False, spaced=False)
                continue
            if k + 1 < t.chunks:  # the round's last step comes down after this MATMUL, which need not wait for it
                product(regs, k > 0)
                continue
        else:
            # the Data Engines run `ahead` chunks ahead of the PE stream, within one round
            for j in range(i if k == 0 else i + ahead, min(i + ahead, i + t.chunks - 1 - k) + 1):
                feed.fetch(j, *slices(*steps[j]))
            feed.drain(i, into(i), *slices(bl, r, k))
            if convert_in:
                (mem_a, word_a), (mem_b, word_b) = regs.a, regs.b
                into_a, into_b = into(i)
                cg.b.vop("cvt", mm_dtype, 1, t.a_elements, (mem_a, t.element_at(word_a), 0, 1),
                         (into_a[0], into_a[1], 0, 1), src_dtype="float32")
                cg.b.vop("cvt", mm_dtype, 1, t.b_elements, (mem_b, t.element_at(word_b), 0, 1),
                         (into_b[0], into_b[1], 0, 1), src_dtype="float32")
                cg.b.nop(hazard)
            if k + 1 < t.chunks:  # the next chunk of this round is in L2BM or on its way: its first hop beside
                feed.with_next_hop(i + 1, into(i + 1), lambda: product(regs, k > 0))
                continue
        partial_sums = t.tiles("k") > 1
        converted = out_half or t.float64  # C converted for its upload: to half, or from float64 to float32
        up_dtype = out_dtype if out_half else "float32"
        finish = Epilogue(cg, t, partial(product, regs, k > 0), mau_rows, hazard, up_dtype,
                           convert=((mem_up, 2 * word_up if out_half else word_up), (mem_c, c_at),
                                    "float64" if t.float64 else "float32") if converted else None)
        cg.upload(cg.lm_placement(lc_out if converted else lc, up_dtype), out_ref,
                  memory=mem_up if converted else mem_c, word=word_up if converted else word_c,
                  slice_index=bl * t.rounds + r, reduce=partial_sums, ready=finish.rows_for)
        finish.rows_for(None)


class MatmulKernel(Kernel):
    """C = A @ B (mm, or bmm with equal batches) with one tiling."""

    def __init__(self, node: Node, tiling: Tiling, problem: Problem, batched: bool, ctx: EmitContext) -> None:
        self.node, self.nodes = node, (node,)
        self.t, self.p, self.batched, self.ctx = tiling, problem, batched, ctx
        a, b = node.args
        self.half_in = device_dtype(a) == "float16" and device_dtype(b) == "float16"
        self.la, self.lb, _ = layouts_for(ctx, tiling, problem, batched, self.half_in)
        self.out_dtype = device_dtype(node.out)
        self.lc_out, self.summed = output_layout(ctx, tiling, problem, batched, self.half_in, self.out_dtype)
        self.pads = {a: 0.0, b: 0.0}
        self.zero_padded: dict[Value, bool] = {}  # the planner's word on each operand's padding (`padding_known`)

    def reads(self) -> dict[Value, Layout]:
        a, b = self.node.args
        return {a: self.la, b: self.lb} if a is not b else {a: self.la}

    def sums_lane_padding(self, v: Value, layout: Layout) -> bool:
        """Whether operand `v`, read in `layout`, has padding in the lanes of K's long words: the
        MAU multiplies and sums it, so it must hold zeros, and a long word holding elements
        arrives whole with whatever its producer computed in those lanes (x @ (v / |v|^2).T with
        K = 5: 0 / 0 in v's padding lane made every product NaN). The planner relays an operand
        whose padding is not known to be zero into one whose padding is (zero_pad)."""
        k_dim = layout.rank - 1 if v is self.node.args[0] else layout.rank - 2  # A is (.., M, K), B (.., K, N)
        return k_dim in lane_padding_dims(layout)

    def padding_known(self, v: Value, zero: bool) -> None:
        """The planner says whether `v`'s padding holds zeros: an operand stored as its staging's
        image is then copied whole, padding included (`Source.zero_padded`), where it was gathered
        with zeros put in the padding, in runs its padding cut (a 1000-column B: 16 long words)."""
        self.zero_padded[v] = zero

    def reads_padding(self, v: Value, ref: Ref) -> bool:
        """Whether the program reads `v`'s padding where `ref` holds it, relying on its zeros (the
        planner asks for an operand known to hold them): lanes of K's long words, which arrive
        with their elements, and a padded operand stored as its staging's image, copied whole."""
        layout = self.reads()[v]
        if self.sums_lane_padding(v, layout):
            return True
        return layout.extents != layout.shape and \
            stored_staging(self.ctx.lm_placement(layout, ref.placement.dtype), ref.placement) is not None

    def writes(self) -> dict[Value, Layout]:
        return {self.node.out: self.summed}

    def output_refs(self, ctx: EmitContext, symbols: dict[Value, str]) -> dict[Value, Ref]:
        out = self.node.out
        image = stage(ctx.lm_placement(self.lc_out, self.out_dtype)).dram
        return {out: Ref(symbols[out], image, self.summed)}

    def least_cycles(self, ctx: EmitContext, refs: dict[Value, Ref]) -> float:
        """What the gathers of its operands not stored as their staging's image take at least
        (`context.gather_mvs`; the planner has asked for them already: they are cached)."""
        return (gather_mvs(ctx, refs, zip(self.node.args, (self.la, self.lb))) or 0) * ctx.gather_mv_cycles()

    def estimate(self, ctx: EmitContext, refs: dict[Value, Ref]) -> float:
        """The tiling's cost with A and B in blocks, and at least its operands' gathers."""
        return max(self.t.cost, self.least_cycles(ctx, refs))

    def key(self, refs: dict[Value, Ref]) -> tuple:
        a, b = self.node.args
        return ("matmul", self.t, self.p, self.batched, self.out_dtype, str(refs[a].placement.layout),
                refs[a].placement.dtype, str(refs[b].placement.layout), refs[b].placement.dtype,
                self.zero_padded.get(a, False), self.zero_padded.get(b, False))

    def emit(self, ctx: EmitContext, refs: dict[Value, Ref]) -> None:
        a, b = self.node.args
        if a is b:  # one input feeding both operands: B is staged from the same buffer
            refs = {**refs, b: refs[a]}
        emit_product(ctx, self.t, self.p, self.batched, Source(refs[a], zero_padded=self.zero_padded.get(a, False)),
                     Source(refs[b], zero_padded=self.zero_padded.get(b, False)), self.out_dtype, refs[self.node.out])


def problem_of(node: Node) -> tuple[Problem, bool]:
    a, b = node.args
    batched = a.rank == 3
    return Problem(a.shape[0] if batched else 1, a.shape[-2], a.shape[-1], b.shape[-1]), batched


def _tilings_for(node: Node, planner, trans_b: bool) -> list[Tiling]:
    a, b = node.args
    p, batched = problem_of(node)
    half_in = device_dtype(a) == "float16" and device_dtype(b) == "float16"
    inexact = not node.attrs.get("exact")
    half = half_in or (planner.options.get("float_dtype") == "mixed" and inexact)
    return tilings(planner.ctx, p, batched=batched, trans_b=trans_b, half=half, staged_in_float32=half and not half_in,
                   out_half=device_dtype(node.out) == "float16",
                   in_bytes=planner.hw.element_bytes("float16" if half_in else "float32"),
                   pseudo=planner.options.get("float_dtype") == "pfloat32" and inexact,
                   float64=planner.options.get("float_dtype") == "float64" and inexact,
                   spread=(planner.host_written(a), planner.host_written(b)), dealt=_dealt_columns_read(node, planner))


def plan(node: Node, planner) -> list[Kernel]:
    a, b = node.args
    if a.rank != b.rank or a.rank not in (2, 3) or (a.rank == 3 and a.shape[0] != b.shape[0]):
        raise CompileError(f"internal: matmul of {list(a.shape)} and {list(b.shape)} reached the kernel; "
                           f"compiler.planner.rewrite makes products 2-D or batched 3-D")
    p, batched = problem_of(node)
    out = []
    for trans_b in ((True,) if _state_read_transposed(b, planner) else (False, True)):
        for t in _tilings_for(node, planner, trans_b):
            out.append(MatmulKernel(node, t, p, batched, planner.ctx))
    return out


def _dealt_columns_read(node: Node, planner) -> bool:
    """Whether the product's output (or an element-wise function of it) has a reader that deals
    C's columns to the PEs a long word at a time, so that tilings with `Tiling.n_dealt` are worth
    timing: a resident tensor's update (a weight's gradient, whose weight a product reads as B with
    K dealt) or a product (reading it as A, K dealt). Not otherwise: the planner prices a product's
    output by its consumers' wished layouts, which do not show the two-step reductions across the
    PEs that C's columns in blocks allow (a 256 x 128 x 512 product's three row reductions on
    mncore2: 16,292 cycles with C in blocks, 191,782 dealt)."""
    return any(x in planner.updated_state or any(u.kind == "matmul" for u in planner.users.get(x, []))
               for x in planner.elementwise_reach(node.out))


def _state_read_transposed(b: Value, planner) -> bool:
    """B is W^T for a state W the program updates (a Linear layer's weight in a training step):
    the product reads it with lanes along K, which are W's rows' lanes, the lanes its gradient
    (dL/dW = G^T X) and the input gradient's product (G W) have, so the update needs no relayout."""
    src = b.producer.args[0] if b.producer is not None and b.producer.kind == "permute" else None
    return src is not None and src.kind == "input" and src.name in planner.graph.updates and src.rank == b.rank


def wishes(user: Node, v: Value, planner) -> list[Layout]:
    """The operand layouts of the product's most promising tilings, best first: a producer that
    cannot make the first (an operand it broadcasts would have to be staged in a way no transfer
    mode feeds, as an embedding's index under its one-hot) may make another."""
    a, b = user.args
    try:
        ranked = _tilings_for(user, planner, False)[:WISHED_TILINGS]
    except CompileError:
        return []
    p, batched = problem_of(user)
    found: list[Layout] = []
    for t in ranked:
        kernel = MatmulKernel(user, t, p, batched, planner.ctx)
        for value, layout in ((a, kernel.la), (b, kernel.lb)):
            if value is v and layout not in found:
                found.append(layout)
    return found

"""A matrix product whose B stays in the PE memories over its M rounds (`Tiling.b_stationary`:
B-stationary, in the dataflow literature's terms).

Why: C is final only after the last K chunk, so with one round the whole of C goes up after the
last MATMUL while the MAUs idle (1024^3 float on mncore2: 8,192 of 42,014 cycles, the Groups' Data
Engines reducing the two L2Bs' partial sums at 16 long words a cycle). Rounds make C final round
by round, but each round would fetch B again. Here B comes down once, chunk by chunk, and stays:

* first rounds 0 .. P-1 (`Tiling.stationary_first`), chunk by chunk (step (r, k) for each chunk
  k, for each round r): B's chunk k comes down with round 0's A into a bank of its own, and
  rounds 1 .. P-1 reuse it. The Data Engines fetch B while several rounds multiply it, which
  keeps the MAUs busy;
* then rounds P .. R-1, one after another, with A alone; between their steps the finished
  rounds' C go up, on the Data Engine time those rounds do not need for A;
* last, round R-1's C, its upload started while its last MATMUL still runs (`Epilogue`).

Each step's transfers to the PEs issue beside the step before's MATMUL (as `Tiling.overlap`), so
the PE memories hold two steps' A in one two-ported memory, B's chunks in two banks (even and odd
chunks) written while the other is read, and every round's C (`stationary_regions`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from functools import partial
from math import ceil

from ..errors import CompileError
from ..layout import Layout
from ..transfer.staging import Member, Transit, UploadPiece, emit_legs, leg_bundles, pipelined_pieces, stage, upload_pieces
from .context import TAGS, Arena, EmitContext, Ref
from .pipeline import Epilogue, Feed, beside, multiply
from .tiling import Problem, Source, Tiling, layouts_for

Region = tuple[str, int]  # (memory, word)
# Ring depths (regions of L2BM): B's chunk comes B_RING chunks ahead (several steps' MATMULs, more
# than its fetch takes); A's step A_RING steps ahead. Compile-time choices, not hardware numbers.
B_RING, A_RING = 3, 8


@dataclass(frozen=True)
class StationaryRegions:
    a: tuple[Region, Region]  # two steps' A, in one memory with separate read and write ports
    banks: tuple[Region, Region]  # B's even and odd chunks, one after another
    c: Region  # C of every round, one after another


def stationary_regions(cg: EmitContext, t: Tiling) -> StationaryRegions | None:
    """Where a B-stationary tiling's operands live, so that a MATMUL (reading A, B's bank of its
    chunk and C, each from its own memory) issues beside the transfers that write the next step's
    A and the next chunk of B (the issue model's memory rules, sim.issue). None when nothing fits."""
    pes = cg.params.pes_per_mab
    a_words, chunk_words = t.words(t.mt * t.kp), t.words(t.kp * t.nt)
    bank_words = ceil(t.chunks / 2) * chunk_words
    c_words = t.rounds * t.mt * (t.nt // pes)
    memories = cg.chain.scratch
    two_ported = [m for m in memories if cg.hw.memories[m].ports != "1RW"]
    for a_mem in two_ported:
        # C in a two-ported memory where one is left: the MATMUL's parts write disjoint rows of C
        # and read the next ones, which a one-ported memory's hazard separates by nops whatever
        # the addresses (sim.hazards, lm_write_to_read)
        for c_mem in sorted((m for m in memories if m != a_mem), key=lambda m: m not in two_ported):
            rest = [m for m in memories if m not in (a_mem, c_mem)]
            banks = [(x, y) for x in rest for y in rest if x != y] + [(x, x) for x in rest if x in two_ported]
            for b0, b1 in banks:
                arena = Arena(cg.hw)
                try:
                    a = (arena.alloc(a_words, prefer=(a_mem,), strict=True),
                         arena.alloc(a_words, prefer=(a_mem,), strict=True))
                    b = (arena.alloc(bank_words, prefer=(b0,), strict=True),
                         arena.alloc(bank_words, prefer=(b1,), strict=True))
                    c = arena.alloc(c_words, prefer=(c_mem,), strict=True)
                except CompileError:
                    continue
                return StationaryRegions(a, b, c)
    return None


def stationary_slices(cg: EmitContext, la: Layout, lb: Layout, a_dtype: str, b_dtype: str) -> tuple[int, int]:
    """L2BM long words of one step's slice of A and of B (the regions of their rings)."""
    return tuple(stage(cg.lm_placement(layout, dtype)).n_l2 for layout, dtype in ((la, a_dtype), (lb, b_dtype)))


def stationary_fits(cg: EmitContext, la: Layout, lb: Layout, a_dtype: str, b_dtype: str) -> bool:
    """Whether the schedule's L2BM regions fit: two of A's and of B's slices while B comes down,
    two of A's in the half the later rounds fetch through (the other half is the uploads')."""
    a_lw, b_lw = stationary_slices(cg, la, lb, a_dtype, b_dtype)
    l2 = cg.hw.memory_lw(cg.chain.l2)
    return 2 * (a_lw + b_lw) <= l2 and 2 * a_lw <= l2 // 2


def stationary_cost(cg: EmitContext, t: Tiling, mau: float, a: float, b: float, up: float) -> float:
    """An estimate of a B-stationary tiling's cycles, to rank the candidates by, from its one-round
    version's MAU cycles and its Data Engines' cycles for A, B and C's upload: the first rounds
    take the longer of their MAU time and B's and their A's fetch, the later rounds the longer of
    their MAU time and their A's fetch with all rounds' C but the last going up; then the last
    round's C goes up."""
    latency = cg.hw.transfers[cg.chain.dram_to_l2].latency_cycles
    first, later = t.stationary_first / t.rounds, 1 - t.stationary_first / t.rounds
    return (2 * latency + max(mau * first, b + a * first) + max(mau * later, a * later + up * (1 - 1 / t.rounds))
            + up / t.rounds)


@dataclass(frozen=True)
class _Fetch:
    """An operand's slice `slice` (the `ordinal`-th its ring brings, counting from 0) for a step,
    into `into`."""

    ordinal: int
    slice: int
    into: Region


@dataclass(frozen=True)
class _Step:
    fetches: tuple[_Fetch | None, ...]  # per ring (None: nothing from that ring this step)
    product: Callable[..., None]  # (axis, first, size): the step's MATMUL or a part of it


def _pipeline(cg: EmitContext, t: Tiling, rings: tuple[Feed, ...], steps: list[_Step], spaced: bool,
              extras: list[Member]) -> Iterator[int]:
    """Emit `steps`, each step's transfers to the PEs beside the step before's MATMUL (step 0's
    alone). Each operand
    has a ring of its own (A a region per step, B per chunk), its slices fetched as far ahead as
    the ring is deep: a slice comes into a region part by part, as the legs of the slice before in
    that region leave it. Yields after each MATMUL but the last, which the caller emits (whole, or
    cut by its upload). `extras`: PE-stream instructions (of other slots, touching neither the
    MATMUL's memories nor the legs') that the caller puts there before the generator goes on: they
    go into the next MATMUL's bundles.

    The MATMUL goes beside the transfers cut to their lengths, `spaced` or not (`pipeline.beside`)."""
    sequences = [[s.fetches[r] for s in steps if s.fetches[r] is not None] for r in range(len(rings))]
    for step in steps:  # the rings' first regions in the steps' order: the first step's operands first
        for ring, f in zip(rings, step.fetches):
            if f is not None and f.ordinal < ring.depth:
                ring.fetch(f.ordinal, f.slice)
    queued = extras
    for i in range(-1, len(steps) - 1):
        extras = list(queued)
        queued.clear()
        product = steps[i].product if i >= 0 else None
        legs, refills = [], []
        for ring, sequence, f in zip(rings, sequences, steps[i + 1].fetches):
            if f is None:
                continue
            ring.wait(f.ordinal)
            ahead = f.ordinal + ring.depth
            mine = ring.legs(f.ordinal, (f.into,))
            legs += mine
            refills += ring.refills(ahead, sequence[ahead].slice) if ahead < len(sequence) else [None] * len(mine)

        def after(hop: int, refills: list = refills) -> None:
            if refills[hop] is not None:
                refills[hop]()
        if product is None:
            emit_legs(cg.b, legs, rings[0].transit, after=after)
        else:
            beside(cg, t, product, leg_bundles(legs, rings[0].transit), after, extras, spaced=spaced)
        if i >= 0:
            yield i


def emit_stationary(cg: EmitContext, t: Tiling, p: Problem, batched: bool, a: Source, b: Source, out_dtype: str,
                  out_ref: Ref) -> None:
    """C = A @ B for a B-stationary tiling into `out_ref` (see the module's docstring)."""
    regs = stationary_regions(cg, t)
    if regs is None or not 0 < t.stationary_first < t.rounds or t.batch_local != 1 or out_dtype != "float32":
        raise CompileError(f"internal: {t} cannot keep B stationary")
    half_in = a.ref.placement.dtype == "float16" and b.ref.placement.dtype == "float16"
    la, lb, lc = layouts_for(cg, t, p, batched, half_in)
    pes = cg.params.pes_per_mab
    c_round = t.mt * (t.nt // pes)
    chunk_words = t.words(t.kp * t.nt)
    mem_c, word_c = regs.c
    partial_sums = t.tiles("k") > 1

    def bank(k: int) -> Region:
        memory, word = regs.banks[k % 2]
        return memory, word + k // 2 * chunk_words

    def step(i: int, r: int, k: int, with_b: bool) -> _Step:
        a_fetch = _Fetch(i, r * t.chunks + k, regs.a[i % 2])
        product = partial(multiply, cg, t, regs.a[i % 2], bank(k), (mem_c, word_c + r * c_round), k > 0)
        return _Step((a_fetch, _Fetch(k, k, bank(k)) if with_b else None), product)

    first = [step(i, r, k, r == 0) for i, (k, r) in enumerate((k, r) for k in range(t.chunks)
                                                               for r in range(t.stationary_first))]
    last = [step(len(first) + j, r, k, False)
            for j, (r, k) in enumerate((r, k) for r in range(t.stationary_first, t.rounds) for k in range(t.chunks))]
    # One ring of A for every round, in the lower half of L2BM and the first quarter of L1BM (the
    # later rounds' C go up through the rest), so that the later rounds' A is fetched as the first
    # rounds' leaves it, while they still multiply (a ring of its own for the later rounds was
    # first fetched after the first rounds' last MATMUL: 512^3 on mncore2 left the Data Engines
    # idle 1,452 cycles); B's ring in what A's leaves of L2BM.
    l2, l1 = cg.hw.memory_lw(cg.chain.l2), cg.hw.memory_lw(cg.chain.l1)
    a_lw, b_lw = stationary_slices(cg, la, lb, a.ref.placement.dtype, b.ref.placement.dtype)
    legs_transit = replace(cg.transit, l1=(0, l1 // 4), l1_room=l1 // 4)
    ring_a = Feed(cg, (a,), (la,), l2=(0, l2 // 2), transit=legs_transit,
                  depth=max(1, min(A_RING, (l2 - 2 * b_lw) // a_lw)))
    a_end = ring_a.depth * ring_a.plans[0][0].n_l2
    ring_b = Feed(cg, (b,), (lb,), l2=(a_end, l2), transit=legs_transit, first_tag=ring_a.tags[-1] + 1, depth=B_RING)
    if not (ring_a.pipelined and ring_b.pipelined):
        raise CompileError(f"internal: L2BM cannot hold two of A's and of B's slices for {t}")
    spaced = cg.hw.memories[mem_c].ports != "1RW"  # parts alone only where C's port has no gap between parts
    up_transit = Transit((l2 // 2, 3 * l2 // 4), (l1 // 2, 3 * l1 // 4), l2 // 4, l1 // 4, TAGS["drain"])
    extras: list[Member] = []
    rounds = _pipeline(cg, t, (ring_a, ring_b), first + last, spaced, extras)
    for _ in range(len(first)):  # the first rounds; then B's ring is drained: the uploads may use its L2BM
        next(rounds)
    up_lm = cg.lm_placement(lc, "float32")
    st = stage(up_lm)
    # All rounds' C but the last, piece by piece, spread evenly over the later rounds' steps, none
    # before its round is done: a piece is collected from the PEs between two steps, lifted into
    # L2BM beside the next step's MATMUL (early in it) and sent to DRAM after it (by then the lift
    # has landed: no nops for the MV).
    ups: list[UploadPiece] = []
    ready: list[int] = []  # steps of the later rounds emitted before each piece's round is done
    for r in range(t.rounds - 1):
        pieces = upload_pieces(cg.b, st, dram=out_ref.sym, lm_mem=mem_c, lm_word=word_c + r * c_round,
                               transit=up_transit, slice_index=r, reduce=partial_sums, after=len(ups),
                               at_least=pipelined_pieces(st, partial_sums))
        ups += pieces
        ready += [max(1, (r + 1 - t.stationary_first) * t.chunks)] * len(pieces)
    steps_done, left = 0, True

    def advance() -> None:
        """The next step; once none is left, lifts waiting for one are issued alone."""
        nonlocal steps_done, left
        left = left and next(rounds, None) is not None
        steps_done += left
        if not left:
            for member in extras:
                member(cg.b)
            extras.clear()

    for k, piece in enumerate(ups):
        while left and steps_done < max(ready[k], (len(last) - 1) * k // len(ups)):
            advance()
        piece.collect()
        extras.append(piece.lift)
        advance()
        piece.send()
    for _ in rounds:
        pass
    hazard = cg.hw.hazards["lm_write_to_read"]
    mau_rows = cg.hw.units[cg.chain.matrix_unit].matrix[t.mau_dtype].rows
    finish = Epilogue(cg, t, last[-1].product, mau_rows, hazard, "float32", convert=None)
    cg.upload(up_lm, out_ref, memory=mem_c, word=word_c + (t.rounds - 1) * c_round, slice_index=t.rounds - 1,
              reduce=partial_sums, ready=finish.rows_for, transit=up_transit, after=len(ups))
    finish.rows_for(None)

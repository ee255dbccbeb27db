"""The parts a matrix product's emission is built from: its MATMUL (whole or cut into parts),
the Data Engines' ring of L2BM regions that brings each step's operands (`Feed`), and the last
MATMUL of a round emitted as C's upload reads it (`Epilogue`)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from math import ceil

from sim import ProgramBuilder, SimError, Sym, pe_cycles
from sim.validate import check_offered

from ..errors import CompileError
from ..layout import Layout
from ..transfer.staging import (Bundle, Leg, Member, Transit, emit_fetch, emit_legs, emit_piece_fetch, first_hop,
                                slice_legs, slice_pieces)
from .context import FIRST_FREE_TAG, EmitContext
from .tiling import Source, Tiling


def multiply(cg: EmitContext, t: Tiling, a: tuple[str, int], b: tuple[str, int], c: tuple[str, int],
             accumulate: bool, axis: str = "m", first: int = 0, size: int | None = None,
             into: ProgramBuilder | None = None) -> None:
    """The MATMUL of one step (A and B at words `a` and `b`, C at element `c`), or of its rows
    [first, first + size) (axis "m") or its K per PE [first, first + size) (axis "k"); into the
    context's program, or `into` (a scratch program, to time it)."""
    pes = cg.params.pes_per_mab
    (mem_a, word_a), (mem_b, word_b), (mem_c, c_addr) = a, b, c
    a_addr, b_addr, m, kp = t.element_at(word_a), t.element_at(word_b), t.mt, t.kp
    a_pitch = t.row_step * t.kp  # A's rows as the product's rows read them
    if axis == "m":
        m, a_addr, c_addr = t.mt if size is None else size, a_addr + first * a_pitch, c_addr + first * (t.nt // pes)
    else:
        kp, a_addr, b_addr = t.kp if size is None else size, a_addr + first, b_addr + first * (1 if t.trans_b else t.nt)
    b = cg.b if into is None else into

    def position(p: int, offset: int) -> None:
        b.matmul(t.mau_dtype, m, kp * pes, t.nt, (mem_a, a_addr + offset * t.kp, a_pitch),
                 (mem_b, b_addr + p * t.kp * t.nt, t.kp if t.trans_b else t.nt), (mem_c, c_addr, t.nt // pes),
                 trans_b=t.trans_b, accumulate=accumulate or p > 0 or (axis == "k" and first > 0))
    # a direct convolution multiplies once per kernel position, into the same C; in a bundle, the
    # last goes with the transfers (one MAU slot a bundle), the others before it
    offsets = t.shifts.offsets if t.shifts else (0,)
    with b.ahead_of_bundle():
        for p, offset in enumerate(offsets[:-1]):
            position(p, offset)
    position(len(offsets) - 1, offsets[-1])


class Epilogue:
    """The last MATMUL of a round and C's conversion for its upload, emitted as the upload's
    pieces need them: the pieces are C's words in order (C is row-major in each PE), so the Data
    Engines take the first rows to DRAM while the PE stream still multiplies (cut by rows at
    multiples of the MAU's rows, as `cuts`: the parts' MAU cycles add up to the whole product's)
    or converts the later ones."""

    def __init__(self, cg: EmitContext, t: Tiling, product: Callable[[str, int, int], None], mau_rows: int,
                 hazard: int, up_dtype: str, convert: tuple | None) -> None:
        """`product(axis, first, size)` emits the round's last MATMUL or a part of it (as `cuts`)."""
        self.cg, self.t, self.product, self.mau_rows, self.hazard = cg, t, product, mau_rows, hazard
        self.up_dtype, self.convert = up_dtype, convert
        self.row_elements = t.nt // cg.params.pes_per_mab
        self.epl = cg.hw.elements_per_lw(up_dtype)
        self.multiplied = 0  # rows
        self.converted = 0  # elements

    def rows_for(self, lm_last: int | None) -> None:
        """Emit what C's upload reads from LM long words [0, lm_last) (all of C: None)."""
        t = self.t
        total = t.mt * self.row_elements
        elements = total if lm_last is None else min(total, lm_last * self.epl)
        rows = -(-elements // self.row_elements)  # the rows those elements lie in, then whole MAU rows
        rows = min(t.mt, -(-rows // self.mau_rows) * self.mau_rows)
        if rows > self.multiplied:
            self.product("m", self.multiplied, rows - self.multiplied)
            self.cg.b.nop(self.hazard)
            self.multiplied = rows
        if self.convert is not None and elements > self.converted:
            (mem_up, up_at), (mem_c, c_at), src_dtype = self.convert
            at = self.converted
            self.cg.b.vop("cvt", self.up_dtype, 1, elements - at, (mem_up, up_at + at, 0, 1), (mem_c, c_at + at, 0, 1),
                          src_dtype=src_dtype)
            self.cg.b.nop(self.hazard)
            self.converted = elements


def beside(cg: EmitContext, t: Tiling, product: Callable[..., None], bundles: list[Bundle],
           after: Callable[[int], None] | None = None, extras: list[Member] | None = None,
           fitted: bool = True, spaced: bool = True) -> None:
    """A step's MATMUL (`product(axis, first, size, into=None)`) cut into parts issued in one
    bundle each with the transfers of `bundles` (`leg_bundles`': the next step's legs);
    `after(leg)` right after each bundle a leg's L2BM hop ends in. Between two bundles a part goes alone:
    the second bundle reads what the first wrote (a leg's L1BM hop after its L2BM hop), and the
    hazard's gap is then MAU work instead of nops. `extras` (PE-stream instructions of other slots
    that touch neither the MATMUL's memories nor the legs') go into the first such part, then
    into parts of their own. Each part lasts as long as its bundle's transfers where the product's
    units allow (`cuts` by needs), so the stream pays the MATMUL, not the transfers; where they
    do not allow a part alone between bundles, the parts are equal (a part then also outlasts the
    write of the bundle before, which the next part's MATMUL may read). `fitted` False: equal
    parts (emit_product's steps: its convolutions got 0.4-1 % slower fitted, ResNet-18 at 64x64
    2,008,108 -> 2,011,436 cycles); `spaced` False: no part alone (when C is in a memory with one
    port, every part after another waits the port's gap anyway: a part alone only adds one).
    The B-stationary schedule's are fitted (1024^3: 36,710 cycles, 37,862 with equal parts)."""
    mau_rows = cg.hw.units[cg.chain.matrix_unit].matrix[t.mau_dtype].rows
    epl = cg.hw.elements_per_lw("float16" if t.half else "float32")
    extras = list(extras or [])
    laid = list(bundles)
    if spaced:
        laid = bundles[:1]
        for bundle in bundles[1:]:
            laid += [Bundle([]), bundle]
        if extras and len(laid) > 1:
            laid[1] = Bundle(extras[:1])
            extras = extras[1:]
    laid += [Bundle([member]) for member in extras]
    if fitted:
        whole = _cycles(cg, lambda scratch: product("m", 0, None, into=scratch))
        needs = [max((_cycles(cg, m) for m in bundle.members), default=0) for bundle in laid]
        parts = cuts(t, mau_rows, epl, len(laid), needs, whole)
    else:
        parts = cuts(t, mau_rows, epl, len(laid))
    if len(parts) < len(laid) and spaced:  # too few units for parts alone: the gaps left to nops
        laid = [bundle for bundle in laid if bundle.members]
        parts = cuts(t, mau_rows, epl, len(laid))
    for j in range(max(len(laid), len(parts))):
        bundle = laid[j] if j < len(laid) else Bundle([])
        with cg.b.together():
            if j < len(parts):
                product(*parts[j])
            for member in bundle.members:
                member(cg.b)
        if bundle.ends is not None and after is not None:
            after(bundle.ends)


def _cycles(cg: EmitContext, member: Member) -> int:
    """Cycles a bundle member holds the PE stream (the timing engine's rule)."""
    scratch = ProgramBuilder(cg.params)
    member(scratch)
    code = scratch.build(hazards=False).code
    try:
        check_offered(cg.params, code)
    except SimError as e:  # a transfer mode the chip lacks: the candidate cannot run there
        raise CompileError(f"{cg.hw.name}: {e}") from None
    return pe_cycles(cg.params, code[0])


def cuts(t: Tiling, rows: int, epl: int, count: int, needs: list[float] | None = None,
         cycles: float = 0) -> list[tuple[str, int, int]]:
    """At most `count` parts of a step's product, as (axis, first, size): its rows cut at multiples
    of the MAU's rows, or its K per PE at whole long words, whichever allows more parts. Equal;
    or, with `needs` (one per part: cycles of the transfers it goes beside) and the product's
    `cycles`, each part at least one unit and as long as its need where the units allow (the
    units left over in proportion to the needs), else all in proportion to the needs. Either way
    the parts' MAU cycles add up to the whole product's (sim.isa's MATMUL rule)."""
    by_m, by_k = ceil(t.mt / rows), t.kp // epl
    axis, units, unit, total = ("m", by_m, rows, t.mt) if by_m >= by_k else ("k", by_k, epl, t.kp)
    n = max(1, min(count, units))
    if needs is not None and n == len(needs):
        covering = [max(1, ceil(need * units / cycles)) if cycles > 0 else 1 for need in needs]
        if sum(covering) <= units:
            shares = [c + s - 1 for c, s in zip(covering, _shares(needs, units - sum(covering) + n))]
        else:
            shares = _shares(needs, units)
        ends = [0]
        for share in shares:
            ends.append(min(total, ends[-1] + unit * share))
        ends[-1] = total
    else:
        ends = [min(total, unit * (units * j // n)) for j in range(n)] + [total]
    return [(axis, ends[j], ends[j + 1] - ends[j]) for j in range(n)]


def _shares(weights: list[float], units: int) -> list[int]:
    """`units` (at least one per weight) split in proportion to `weights`, by largest remainder."""
    left, total = units - len(weights), sum(weights)
    if total <= 0:
        return [units // len(weights) + (j < units % len(weights)) for j in range(len(weights))]
    exact = [left * w / total for w in weights]
    shares = [int(e) for e in exact]
    for j in sorted(range(len(weights)), key=lambda j: shares[j] - exact[j])[:left - sum(shares)]:
        shares[j] += 1
    return [1 + s for s in shares]


class Feed:
    """Brings the operands' slices for each step to the PEs. When several steps' slices fit L2BM
    at once, L2BM holds a ring of them: the Data Engines fetch the steps ahead (each region with
    its own tag) while the PE stream drains step i (and multiplies it), which hides the DRAM
    latency; otherwise each slice is downloaded on its own, in pieces. Operands are padded along
    K with zeros: the padding is multiplied and summed. Long words of padding arrive as zeros;
    padding lanes beside elements arrive with their long word, so an operand whose padding is not
    known to be zero has been relaid first (MatmulKernel.sums_lane_padding)."""

    def __init__(self, cg: EmitContext, sources: tuple[Source, ...], layouts: tuple[Layout, ...],
                 l2: tuple[int, int] | None = None, transit: Transit | None = None, first_tag: int = FIRST_FREE_TAG,
                 depth: int | None = None) -> None:
        """`l2`: the L2BM long words [first, last) the ring may use (all of L2BM: None); `transit`:
        the L1BM buffers the legs pass through (the context's: None); `first_tag` and `depth`:
        where its tags start and at most how many regions it has (as many as fit: None)."""
        self.cg = cg
        self.transit = transit or cg.transit
        self.lms = tuple(cg.lm_placement(layout, src.ref.placement.dtype) for src, layout in zip(sources, layouts))
        self.plans = [cg.fetch_source(src.ref, lm, pad=0.0, index=src.index, window=src.window, blocks=src.blocks,
                                      zero_padded=src.zero_padded)
                      for src, lm in zip(sources, self.lms)]
        self.dram = tuple(Sym(src.ref.symbol) for src in sources)
        self.sources = sources
        self.offsets = (0, self.plans[0][0].n_l2)
        region = sum(st.n_l2 for st, _ in self.plans)
        first, last = l2 or (0, cg.hw.memory_lw("L2BM"))
        self.depth = min((last - first) // region, cg.params.tags + 1 - first_tag, depth or cg.params.tags)
        self.pipelined = self.depth >= 2
        self.depth = max(self.depth, 1)
        self.regions = tuple(range(first, first + self.depth * region, region))
        self.tags = tuple(range(first_tag, first_tag + self.depth))
        self.hopped = -1  # the step whose first L2BM hop went with the previous MATMUL

    def fetch(self, i: int, *slice_indices: int | None) -> None:
        """Step i's slices into its ring region (an operand whose slice index is None: not this step)."""
        if not self.pipelined:
            return
        for (st, source), dram, offset, s in zip(self.plans, self.dram, self.offsets, slice_indices):
            if s is not None:
                emit_fetch(self.cg.b, st, dram=dram, l2_addr=self.regions[i % self.depth] + offset, first=0,
                           count=st.n_l2, tag=self.tags[i % self.depth], slice_index=s, source=source)

    def refills(self, i: int, *slice_indices: int) -> list[Callable[[], None]]:
        """Step i's fetch in parts, one per leg (in `legs` order): each brings the L2BM long words
        of that leg's range of its region, so that it can be issued as soon as the leg of the step
        before in the same region (i - depth) has left them."""
        out = []
        for (st, source), dram, offset, s in zip(self.plans, self.dram, self.offsets, slice_indices):
            if s is None:
                continue
            for piece in slice_pieces(st, self.transit):
                out.append(partial(emit_piece_fetch, self.cg.b, st, piece, dram=dram,
                                   l2_addr=self.regions[i % self.depth] + offset, in_slice=True,
                                   tag=self.tags[i % self.depth], slice_index=s, source=source))
        return out

    def legs(self, i: int, into: tuple[tuple[str, int], tuple[str, int]]) -> list[Leg]:
        """Step i's pieces of A, then of B, from its L2BM region to their PE-memory regions `into`."""
        return [leg for (st, _), to, offset in zip(self.plans, into, self.offsets) if to is not None
                for leg in slice_legs(st, self.transit, l2_addr=self.regions[i % self.depth] + offset,
                                      lm_mem=to[0], lm_word=to[1])]

    def wait(self, i: int) -> None:
        """The stream waits for step i's fetch."""
        self.cg.b.wait(self.tags[i % self.depth])

    def drain(self, i: int, into: tuple[tuple[str, int], tuple[str, int]], *slice_indices: int,
              refills: list[Callable[[], None]] | None = None) -> None:
        """Step i's operands to their PE-memory regions `into`: A's and B's pieces in one pipeline
        (one piece's L2BM hop beside the previous one's LM hop), its first hop already issued if
        `with_next_hop` did; `refills[h]` right after leg h has left L2BM (see `refills`)."""
        if not self.pipelined:
            for src, lm, (memory, word), s in zip(self.sources, self.lms, into, slice_indices):
                self.cg.download(src.ref, lm, memory=memory, word=word, slice_index=s, pad=0.0, index=src.index,
                                 window=src.window, blocks=src.blocks, zero_padded=src.zero_padded)
            return
        started = self.hopped == i
        if not started:
            self.wait(i)
        emit_legs(self.cg.b, self.legs(i, into), self.transit, started=started,
                  after=(lambda h: refills[h]()) if refills else None)

    def with_next_hop(self, i: int, into: tuple[tuple[str, int], tuple[str, int]], instruction) -> None:
        """`instruction()` (step i - 1's MATMUL) in one bundle with step i's first L2BM -> L1BM hop,
        when step i's data is on its way into L2BM already (pipelined, same round), fetched two or
        more steps ahead: with a ring of two regions it is fetched while step i - 1 drains and is
        rarely in when the MATMUL starts, and waiting for it would stall the MATMUL (512^3 on
        mncore2: 14,258 cycles so, 12,658 without)."""
        if self.depth < 3:
            instruction()
            return
        self.wait(i)
        first_hop(self.cg.b, self.legs(i, into), self.transit, instruction)
        self.hopped = i

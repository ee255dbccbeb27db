"""Matrix products (mm, bmm, and so linear and matmul) on the MAUs of every MAB.

The output is cut into tiles, one per MAB: each level above the MAB (L2B, L1B, MAB) takes a
role, splitting the batch, the rows (M) or the columns (N); a level splitting M leaves B
broadcast over it, one splitting N leaves A broadcast. Inside a MAB the MATMUL instruction's
convention holds (sim.isa): K is split over the MAB's PEs in A and B, N in C. K is processed
in chunks and M in rounds when a tile does not fit the PEs' memories; chunks and rounds are
time slices of the operands' layouts, so each downloads with the usual staging.

Tilings are ranked by a model of the cycles they cost, from the YAML: MAU steps of each
MATMUL, and Data Engine time for the long words each chunk brings in (the chip's bottleneck
for large products), and the best is emitted.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from itertools import product
from math import ceil, prod

import numpy as np

from ..codegen import Arena, CodeGen, Ref
from ..errors import CompileError, UnsupportedOpError
from ..frontend.graph import Node, Value
from ..layout import TIME_AXIS, W_AXIS, Factor, Layout, Placement
from ..transfer.staging import Chain, stage
from . import lowering
from .kernel import lm_placement, ref_of

ROLES = ("batch", "m", "n")


@dataclass(frozen=True)
class Tiling:
    takes: tuple[tuple[str, str, int], ...]  # (axis, role, positions used), root to leaf
    batch_local: int  # batches each MAB computes one after another
    rounds: int  # M rounds
    mt: int  # rows per MAB per round
    chunks: int  # K chunks
    kp: int  # K per PE per chunk
    nt: int  # columns per MAB (a multiple of PEs x lanes)
    trans_b: bool
    half: bool  # the MAU multiplies in half (float16 operands, float32 accumulation)
    cost: float = 0.0

    def tiles(self, role: str) -> int:
        return prod(n for _, r, n in self.takes if r == role)


@dataclass(frozen=True)
class Problem:
    batch: int
    m: int
    k: int
    n: int


def _axis_factors(t: Tiling, role: str) -> list[Factor]:
    return [Factor(n, axis, 1) for axis, r, n in t.takes if r == role and n > 1]


def layouts(t: Tiling, p: Problem, chain: Chain, epl_in: int, epl_out: int, batched: bool) -> tuple[Layout, Layout, Layout]:
    """LM layouts of A (batch, M, K), B (batch, K, N) and C (batch, M, N) for a tiling."""
    pes = chain.pes_per_unit
    np_ = t.nt // pes
    bdim = lambda time_stride: _axis_factors(t, "batch") + (  # noqa: E731
        [Factor(t.batch_local, TIME_AXIS, time_stride)] if t.batch_local > 1 else [])
    rounds = [Factor(t.rounds, TIME_AXIS, t.chunks)] if t.rounds > 1 else []
    chunks = [Factor(t.chunks, TIME_AXIS, 1)] if t.chunks > 1 else []
    # K is dealt to the MAB's PEs a long word at a time (k = ..., local long word, PE, lane): a
    # PE's slice of K is any set of k's as long as A and B agree, and interleaving keeps
    # consecutive k's in consecutive long words of the staging image, so gathers (im2col) move
    # long runs.
    k_dim = chunks + [Factor(t.kp // epl_in, None, 1), Factor(pes, chain.pe_axis, 1), Factor(epl_in, W_AXIS, 1)]
    a = [_axis_factors(t, "m") + rounds + [Factor(t.mt, None, t.kp // epl_in)], k_dim]
    if t.trans_b:
        b = [k_dim, _axis_factors(t, "n") + [Factor(t.nt, None, t.kp // epl_in)]]
    else:
        b = [chunks + [Factor(t.kp // epl_in, None, epl_in * t.nt // epl_in), Factor(pes, chain.pe_axis, 1),
                       Factor(epl_in, None, t.nt // epl_in)],
             _axis_factors(t, "n") + [Factor(t.nt // epl_in, None, 1), Factor(epl_in, W_AXIS, 1)]]
    c = [_axis_factors(t, "m") + ([Factor(t.rounds, TIME_AXIS, 1)] if t.rounds > 1 else [])
         + [Factor(t.mt, None, np_ // epl_out)],
         _axis_factors(t, "n") + [Factor(pes, chain.pe_axis, 1), Factor(np_ // epl_out, None, 1), Factor(epl_out, W_AXIS, 1)]]
    if batched:
        a = [bdim(t.rounds * t.chunks)] + a
        b = [bdim(t.chunks)] + b
        c = [bdim(t.rounds)] + c
    shapes = ((p.batch, p.m, p.k), (p.batch, p.k, p.n), (p.batch, p.m, p.n)) if batched else \
        ((p.m, p.k), (p.k, p.n), (p.m, p.n))
    return tuple(Layout.of(dims, shape) for dims, shape in zip((a, b, c), shapes))


def _fits(cg: CodeGen, t: Tiling, staged_in_float32: bool) -> bool:
    words = cg.hw.memory_words
    per_word_in = 2 if t.half else 1
    a = t.mt * t.kp // per_word_in
    b = t.kp * t.nt // per_word_in
    c = t.mt * (t.nt // cg.params.pes_per_mab)
    staging = (t.mt * t.kp + t.kp * t.nt) if staged_in_float32 and t.half else 0
    budget = sum(words(m) for m in ("LM0", "LM1", "GRF0", "GRF1") if m in cg.hw.memories)
    largest = max(words("LM0"), words("LM1"))
    return a + b + c + staging <= budget * 0.9 and max(a, b, c) <= largest


def _cost(cg: CodeGen, t: Tiling, in_bytes: int) -> float:
    """Cycles of a tiling: the MATMULs and the Data Engine time to bring each chunk in, in series
    (the kernel waits for a chunk before multiplying it), from the YAML numbers."""
    hw, params = cg.hw, cg.params
    mode = hw.units["MAU"].matrix["float16" if t.half else "float32"]
    cycles = ceil(t.mt / mode.rows) * ceil(t.kp * params.pes_per_mab / mode.cols) * max(t.nt, ceil(mode.rows / mode.load_rows_per_cycle))
    mm = ceil(cycles / hw.step_cycles) * hw.step_cycles
    rate = hw.transfers["dram_to_l2bm"].modes["individual"].src_lw_per_cycle
    lw = hw.long_word_bytes
    groups = params.n_groups
    a_lw = t.tiles("batch") * t.tiles("m") * t.mt * t.kp * params.pes_per_mab * in_bytes / lw / groups
    b_lw = t.tiles("batch") * t.tiles("n") * t.kp * params.pes_per_mab * t.nt * in_bytes / lw / groups
    b_copies = max(1, min(groups, t.tiles("m")))  # B is needed by every Group whose L2Bs split M
    mv = (a_lw + b_lw * b_copies) / rate
    steps = t.batch_local * t.rounds * t.chunks
    c_lw = t.tiles("batch") * t.tiles("m") * t.tiles("n") * t.mt * t.nt * hw.element_bytes("float32") / lw / groups
    return steps * (mm + mv) + t.batch_local * t.rounds * c_lw / rate


def plan(cg: CodeGen, p: Problem, *, batched: bool, trans_b: bool, half: bool, staged_in_float32: bool,
         in_bytes: int) -> Tiling:
    chain = Chain.of(cg.hw)
    axes = [a for a in cg.hw.axes if a != chain.pe_axis]
    sizes = cg.hw.axes
    pes = cg.params.pes_per_mab
    epl_in = cg.hw.elements_per_lw("float16" if half else "float32")
    col_unit = pes * max(epl_in, cg.hw.elements_per_lw("float32"))
    feasible: list[Tiling] = []
    roles = ROLES if batched else ROLES[1:]
    for assignment in product(roles, repeat=len(axes)):
        remaining = {"batch": p.batch if batched else 1, "m": p.m, "n": ceil(p.n / col_unit)}
        takes = []
        for axis, role in zip(axes, assignment):
            n = _take(remaining[role], sizes[axis], exact=role == "batch")
            remaining[role] = ceil(remaining[role] / n)
            takes.append((axis, role, n))
        nb = prod(n for _, r, n in takes if r == "batch")
        nm = prod(n for _, r, n in takes if r == "m")
        nn = prod(n for _, r, n in takes if r == "n")
        bl = ceil((p.batch if batched else 1) / nb)
        m_tile = ceil(p.m / nm)
        nt = ceil(ceil(p.n / nn) / col_unit) * col_unit
        for kp in _kp_options(p.k, pes, epl_in):
            chunks = ceil(p.k / (kp * pes))
            for rounds in range(1, m_tile + 1):
                mt = ceil(m_tile / rounds)
                if rounds > 1 and ceil(m_tile / (rounds - 1)) == mt:
                    continue
                t = Tiling(tuple(takes), bl, rounds, mt, chunks, kp, nt, trans_b, half)
                if not _fits(cg, t, staged_in_float32):
                    continue
                feasible.append(replace(t, cost=_cost(cg, t, in_bytes)))
                break  # fewer rounds are always at least as good
    for t in sorted(feasible, key=lambda t: t.cost):
        _, _, lc = layouts(t, p, chain, epl_in, cg.hw.elements_per_lw("float32"), batched)
        if stage(Placement(lc, cg.hw, "LM0", "float32", check_capacity=False)).fitted is not None:
            return t  # the product is stored in the image of its layout: that image needs notation
    raise CompileError(f"no tiling of a {p.batch}x{p.m}x{p.k}x{p.n} product fits the PE memories of {cg.hw.name}")


def _take(count: int, size: int, *, exact: bool) -> int:
    """Positions of an axis a dimension of `count` tiles uses: all it can (a divisor when exact)."""
    if not exact:
        return max(1, min(size, count))
    return max(d for d in range(1, min(size, count) + 1) if count % d == 0)


def _kp_options(k: int, pes: int, epl: int) -> list[int]:
    """K per PE per chunk, largest first: whole multiples of the lanes."""
    full = ceil(ceil(k / pes) / epl) * epl
    options, kp = [], full
    while kp >= epl:
        options.append(kp)
        kp = ceil(kp // 2 / epl) * epl if kp > epl else 0
    return options


@dataclass(frozen=True)
class Source:
    """Where a matrix operand's elements come from: a value's ref, and optionally a gather map
    (flat element of the operand -> flat element of the ref's tensor, -1 for zero)."""

    ref: Ref
    index: np.ndarray | None = None


@lowering("mm.default", "bmm.default")
def lower_matmul(cg: CodeGen, node: Node) -> None:
    a, b = node.args[0], node.args[1]
    out = node.out
    batched = node.op.startswith("bmm")
    if {cg.device_dtype(a), cg.device_dtype(b)} - {"float32", "float16"}:
        raise UnsupportedOpError(node.op, [list(a.shape), list(b.shape)], node.source, "integer matrix products")
    p = Problem(a.shape[0] if batched else 1, a.shape[-2], a.shape[-1], b.shape[-1])
    t = plan_for(cg, p, batched, cg.device_dtype(a), cg.device_dtype(b), _lanes_along_k(cg, b))
    la, lb, _ = layouts_for(cg, t, p, batched, cg.device_dtype(a) == "float16" and cg.device_dtype(b) == "float16")
    ref, lc = emit_product(cg, t, p, batched, Source(ref_of(cg, a, la)), Source(ref_of(cg, b, lb)),
                           cg.device_dtype(out), out.name)
    cg.refs[out] = ref


def plan_for(cg: CodeGen, p: Problem, batched: bool, a_dtype: str, b_dtype: str, trans_b: bool) -> Tiling:
    half_in = a_dtype == "float16" and b_dtype == "float16"
    half = half_in or cg.options.get("float_dtype") == "mixed"
    return plan(cg, p, batched=batched, trans_b=trans_b, half=half, staged_in_float32=half and not half_in,
                in_bytes=cg.hw.element_bytes("float16" if half_in else "float32"))


def layouts_for(cg: CodeGen, t: Tiling, p: Problem, batched: bool, half_in: bool, out_dtype: str = "float32"):
    epl_in = cg.hw.elements_per_lw("float16" if half_in else "float32")
    return layouts(t, p, Chain.of(cg.hw), epl_in, cg.hw.elements_per_lw(out_dtype), batched)


def _lanes_along_k(cg: CodeGen, b: Value) -> bool:
    """B already in DRAM with its lanes packing K (a transposed weight, k of attention): use the
    MAU's transposed-B form so that no lane has to move."""
    ref = cg.refs.get(b)
    if ref is None:
        return False
    k_dim = len(b.shape) - 2
    return any(f.axis == W_AXIS and f.size > 1 for f in ref.placement.layout.dims[k_dim])


def emit_product(cg: CodeGen, t: Tiling, p: Problem, batched: bool, a: Source, b: Source, out_dtype: str,
                 name: str) -> tuple[Ref, Layout]:
    """C = A @ B for a tiling; returns C's ref (a new buffer in the image of its LM layout)."""
    pes = cg.params.pes_per_mab
    half_in = a.ref.placement.dtype == "float16" and b.ref.placement.dtype == "float16"
    mm_dtype = "float16" if t.half else "float32"
    la, lb, lc = layouts_for(cg, t, p, batched, half_in)
    lc_out = lc if out_dtype == "float32" else layouts_for(cg, t, p, batched, half_in, out_dtype)[2]
    st_out = stage(lm_placement(cg, lc_out, out_dtype))
    out_ref = cg.buffer("temp", st_out.dram, name, lm=lc_out)
    arena = Arena(cg.hw)
    per_word = 2 if t.half else 1
    a_words, b_words = t.mt * t.kp // per_word, t.kp * t.nt // per_word
    c_words = t.mt * (t.nt // pes)
    mem_a, word_a = arena.alloc(a_words)
    mem_b, word_b = arena.alloc(b_words)
    mem_c, word_c = arena.alloc(c_words, prefer=("GRF0", "GRF1", "LM0", "LM1"))
    convert_in = t.half and not half_in  # float32 in DRAM, half in the MAU: stage float32, convert in LM
    if convert_in:
        mem_a32, word_a32 = arena.alloc(t.mt * t.kp)
        mem_b32, word_b32 = arena.alloc(t.kp * t.nt)
    if out_dtype == "float16":
        mem_h, word_h = arena.alloc(c_words // 2 + 1)
    hazard = cg.hw.hazards["lm_write_to_read"]
    for bl in range(t.batch_local):
        for r in range(t.rounds):
            for k in range(t.chunks):
                sa, sb = (bl * t.rounds + r) * t.chunks + k, bl * t.chunks + k
                if convert_in:
                    _download(cg, a, la, mem_a32, word_a32, sa)
                    _download(cg, b, lb, mem_b32, word_b32, sb)
                    cg.b.vop("cvt", "float16", 1, t.mt * t.kp, (mem_a, 2 * word_a, 0, 1), (mem_a32, word_a32, 0, 1),
                             src_dtype="float32")
                    cg.b.vop("cvt", "float16", 1, t.kp * t.nt, (mem_b, 2 * word_b, 0, 1), (mem_b32, word_b32, 0, 1),
                             src_dtype="float32")
                    cg.b.nop(hazard)
                else:
                    _download(cg, a, la, mem_a, word_a, sa)
                    _download(cg, b, lb, mem_b, word_b, sb)
                cg.b.matmul(mm_dtype, t.mt, t.kp * pes, t.nt, (mem_a, word_a * per_word, t.kp),
                            (mem_b, word_b * per_word, t.kp if t.trans_b else t.nt), (mem_c, word_c, t.nt // pes),
                            trans_b=t.trans_b, accumulate=k > 0)
            cg.b.nop(hazard)
            if out_dtype == "float16":
                cg.b.vop("cvt", "float16", 1, c_words, (mem_h, 2 * word_h, 0, 1), (mem_c, word_c, 0, 1),
                         src_dtype="float32")
                cg.b.nop(hazard)
                cg.upload(lm_placement(cg, lc_out, out_dtype), out_ref, memory=mem_h, word=word_h,
                          slice_index=bl * t.rounds + r)
            else:
                cg.upload(lm_placement(cg, lc, "float32"), out_ref, memory=mem_c, word=word_c,
                          slice_index=bl * t.rounds + r)
    return out_ref, lc_out


def _download(cg: CodeGen, src: Source, layout: Layout, memory: str, word: int, slice_index: int) -> None:
    """Operands are padded along K with zeros: the padding is multiplied and summed."""
    cg.download(src.ref, lm_placement(cg, layout, src.ref.placement.dtype), memory=memory, word=word,
                slice_index=slice_index, zero_fill=True, index=src.index)

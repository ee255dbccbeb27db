"""A matrix product's tiling: which role (batch, rows M, columns N, or K) each hardware axis
takes, how the tile per MAB is cut into K chunks and M rounds, and the LM layouts of A, B and C
that follow from it (compiler.kernels.matmul chooses among tilings and emits them)."""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

import numpy as np

from ..chain import Chain
from ..layout import TIME_AXIS, W_AXIS, Broadcast, Factor, Layout
from ..transfer.separable import DimTerms
from .context import EmitContext, Ref

ROLES = ("batch", "m", "n")
NO_OVERLAP, OVERLAP_ALL, OVERLAP_EARLY = 0, 1, 2  # Tiling.overlap
OPERAND_ROLES = {"a": ("batch", "m", "k"), "b": ("batch", "k", "n"), "c": ("batch", "m", "n")}


@dataclass(frozen=True)
class Take:
    """A role on (part of) a hardware axis: `n` positions, `stride` apart."""

    axis: str
    role: str
    n: int
    stride: int = 1


@dataclass(frozen=True)
class Shifts:
    """A direct convolution's product (compiler.kernels.conv): A is not the im2col matrix but
    the input pixels a tile of output rows reads, `halo` rows more than the tile's, and each
    kernel position is one MATMUL over A's rows from `offsets[position]` on, with that position's
    block of B (B holds every position's block, one after another). Output row r reads pixel
    stride * r + offset of the flattened, padded input for the position's weights (the MATMUL
    reads A's rows `stride` apart)."""

    halo: int
    offsets: tuple[int, ...]
    stride: int = 1


@dataclass(frozen=True)
class Tiling:
    takes: tuple[Take, ...]  # root to leaf
    batch_local: int  # batches each MAB computes one after another
    rounds: int  # M rounds
    mt: int  # rows per MAB per round
    chunks: int  # K chunks
    kp: int  # K per PE per chunk
    nt: int  # columns per MAB (a multiple of PEs x lanes)
    trans_b: bool
    half: bool  # the MAU multiplies in half (float16 operands, float32 accumulation)
    pseudo: bool = False  # float32 operands multiplied as pseudo-single (options float_dtype "pfloat32")
    # float32 operands converted to float64 in LM and multiplied there, accumulating in float64 (options
    # float_dtype "float64"); C is rounded to float32 for its upload
    float64: bool = False
    # With the PE memories holding two steps' operands (`_double_regions`), a step's transfers to
    # the PEs issue beside the MATMUL of the step before: OVERLAP_ALL in every step of a round but
    # the first; OVERLAP_EARLY in all but the first and the last, so that the last MATMUL but one
    # does not wait for the round's last operands (better when the Data Engines are the bottleneck:
    # the planner times both). NO_OVERLAP: one step after the other.
    overlap: int = 0
    # B kept in the PE memories over the M rounds (compiler.kernels.stationary): fetched once while
    # the first `stationary_first` rounds go chunk by chunk; the later rounds' Data Engine time goes
    # to the finished rounds' C, on its way out while they multiply
    b_stationary: bool = False
    stationary_first: int = 0
    shifts: Shifts | None = None  # a direct convolution (see Shifts): A holds shifted windows
    # C's columns dealt to the MAB's PEs a long word at a time (column = ..., local long word, PE,
    # lane) instead of in a block per PE: B's columns are stored in the order the MAU writes C's
    # (see `layouts`), so C comes out in the layout a B-operand (or A-operand) layout of the same
    # tensor deals K in: a weight's gradient and the weight it updates then share their runs
    n_dealt: bool = False
    cost: float = 0.0

    @property
    def a_rows(self) -> int:
        """Rows of A per MAB per step: the tile's rows (`stride` times as many for a strided
        direct convolution), and a direct convolution's halo."""
        return self.row_step * self.mt + (self.shifts.halo if self.shifts else 0)

    @property
    def row_step(self) -> int:
        """Rows of A between two rows of the product (a direct convolution's stride, else 1)."""
        return self.shifts.stride if self.shifts else 1

    @property
    def positions(self) -> int:
        """MATMULs per step: a direct convolution's kernel positions, else one."""
        return len(self.shifts.offsets) if self.shifts else 1

    @property
    def a_elements(self) -> int:
        """A's elements per PE per step."""
        return self.a_rows * self.kp

    @property
    def b_elements(self) -> int:
        """B's elements per PE per step (a block per kernel position for a direct convolution)."""
        return self.positions * self.kp * self.nt

    @property
    def mau_dtype(self) -> str:
        """The MATMUL's format (units.MAU.matrix.<format>): its rate and its operand precision."""
        return "float16" if self.half else "pfloat32" if self.pseudo else "float64" if self.float64 else "float32"

    def converts_in(self, staged_in_float32: bool) -> bool:
        """Whether the operands are staged as float32 and converted in LM for the MAU (mixed, float64)."""
        return self.float64 or (self.half and staged_in_float32)

    def words(self, elements: int) -> int:
        """Words of `elements` MAU operand elements (half: two a word; float64: two words each)."""
        return elements // 2 if self.half else 2 * elements if self.float64 else elements

    def element_at(self, word: int) -> int:
        """The MATMUL address (in operand elements) of a region at `word` (even for float64)."""
        return 2 * word if self.half else word // 2 if self.float64 else word

    def tiles(self, role: str, axes: tuple[str, ...] | None = None) -> int:
        return prod(k.n for k in self.takes if k.role == role and (axes is None or k.axis in axes))

    def places(self, operand: str, axis: str) -> bool:
        """Whether an operand's layout places `axis` (it holds different data along it)."""
        return any(k.axis == axis and k.role in OPERAND_ROLES[operand] and k.n > 1 for k in self.takes)


@dataclass(frozen=True)
class Problem:
    batch: int
    m: int
    k: int
    n: int


def _axis_factors(t: Tiling, role: str) -> list[Factor]:
    return [Factor(k.n, k.axis, k.stride) for k in t.takes if k.role == role and k.n > 1]


def _copies(t: Tiling, operand: str, of_roles: tuple[str, ...] = ROLES + ("k",)) -> tuple[Broadcast, ...]:
    """Copies of an operand over the part of a split axis whose role it lacks (A over the L2Bs
    that split N, when the Groups split M): a sized B@ on an axis its other part places."""
    roles = OPERAND_ROLES[operand]
    return tuple(Broadcast(k.axis, k.n, k.stride) for k in t.takes
                 if k.role in of_roles and k.role not in roles and k.n > 1 and t.places(operand, k.axis))


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
    k_split = _axis_factors(t, "k")  # L2Bs of a Group that split K: C's copies there are partial sums
    k_dim = k_split + chunks + [Factor(t.kp // epl_in, None, 1), Factor(pes, chain.pe_axis, 1),
                                Factor(epl_in, W_AXIS, 1)]
    a = [_axis_factors(t, "m") + rounds + [Factor(t.a_rows, None, t.kp // epl_in)], k_dim]
    # a direct convolution's B: the kernel positions' blocks one after another in each PE
    positions = [Factor(t.positions, None, t.kp * t.nt // epl_in)] if t.shifts else []
    # B's columns in the order the MAU writes C's: column c = (PE p, long word l, lane e) of the
    # tile, in blocks per PE, or with dealt columns tile column (l, p, e) (see Tiling.n_dealt)
    n_axes = _axis_factors(t, "n")
    if t.trans_b:
        s = t.kp // epl_in  # B's rows (long words) from one column to the next
        cols = ([Factor(np_ // epl_out, None, epl_out * s), Factor(pes, None, np_ * s), Factor(epl_out, None, s)]
                if t.n_dealt else [Factor(t.nt, None, s)])
        b = [k_dim, n_axes + cols]
    else:
        cols = ([Factor(np_ // epl_in, None, 1), Factor(pes, None, np_ // epl_in), Factor(epl_in, W_AXIS, 1)]
                if t.n_dealt else [Factor(t.nt // epl_in, None, 1), Factor(epl_in, W_AXIS, 1)])
        b = [positions + k_split + chunks + [Factor(t.kp // epl_in, None, epl_in * t.nt // epl_in), Factor(pes, chain.pe_axis, 1),
                                 Factor(epl_in, None, t.nt // epl_in)], n_axes + cols]
    c = [_axis_factors(t, "m") + ([Factor(t.rounds, TIME_AXIS, 1)] if t.rounds > 1 else [])
         + [Factor(t.mt, None, np_ // epl_out)],
         n_axes + ([Factor(np_ // epl_out, None, 1), Factor(pes, chain.pe_axis, 1)] if t.n_dealt else
                   [Factor(pes, chain.pe_axis, 1), Factor(np_ // epl_out, None, 1)]) + [Factor(epl_out, W_AXIS, 1)]]
    if batched:
        a = [bdim(t.rounds * t.chunks)] + a
        b = [bdim(t.chunks)] + b
        c = [bdim(t.rounds)] + c
    a_m, b_k = p.m, p.k
    if t.shifts:  # A: every tile's rows with their halos; B: K per kernel position, every position
        a_m, b_k = prod(f.size for f in a[0]), t.positions * p.k
    shapes = ((p.batch, a_m, p.k), (p.batch, b_k, p.n), (p.batch, p.m, p.n)) if batched else \
        ((a_m, p.k), (b_k, p.n), (p.m, p.n))
    return tuple(Layout.of(dims, shape, _copies(t, operand))
                 for dims, shape, operand in zip((a, b, c), shapes, ("a", "b", "c")))


@dataclass(frozen=True)
class Source:
    """Where a matrix operand's elements come from: a value's ref, and optionally a gather map
    (flat element of the operand -> flat element of the ref's tensor, -1 for zero) or a window
    of the ref's storage that is the operand (a convolution's im2col matrix)."""

    ref: Ref
    index: np.ndarray | None = None
    window: DimTerms | None = None
    blocks: bool = False  # gathered into a block of L2BM per L1B (transfer.staging), where its layout allows
    # its padding is known to hold zeros: stored as its staging's image, it is copied whole, padding
    # and all, rather than gathered with zeros put in the padding (`EmitContext.fetch_source`)
    zero_padded: bool = False


def layouts_for(cg: EmitContext, t: Tiling, p: Problem, batched: bool, half_in: bool, out_dtype: str = "float32"):
    epl_in = cg.hw.elements_per_lw("float16" if half_in else "float32")
    return layouts(t, p, Chain.of(cg.hw), epl_in, cg.hw.elements_per_lw(out_dtype), batched)


def output_layout(cg: EmitContext, t: Tiling, p: Problem, batched: bool, half_in: bool, out_dtype: str
                  ) -> tuple[Layout, Layout]:
    """C's LM layout as computed (with copies over the L2Bs that split K, which hold partial sums)
    and as stored: once the partial sums are added on the way out, C without those copies, in
    the same DRAM image, so that consumers need not fetch it twice."""
    lc_out = layouts_for(cg, t, p, batched, half_in, out_dtype)[2]
    summed = Layout.of(lc_out.dims, lc_out.shape, tuple(b for b in lc_out.broadcast if b not in _copies(t, "c", ("k",))))
    return lc_out, summed

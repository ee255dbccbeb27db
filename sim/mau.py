"""MATMUL, functionally: C (+)= A @ B on every MAB at once.

Each MAB's four PEs hold its operands split as sim.isa describes: K over the PEs in A and B, N in
C, so every PE's slice is a row-major matrix at an address with a row pitch. Every MAB runs the
same instruction on its own operands; the simulator computes them as a stack of products, in one
of three ways, by the shape:

* loop (K-slices of at most `SHORT_SLICE` per PE, a training step's thin products): the slices
  gathered side by side and multiplied in a numba loop that sums each element along K in order,
  so the words are the same however the products are stacked (below). A BLAS call costs about a
  microsecond before it multiplies anything, against a few hundred multiply-adds a MAB. One
  entry of the stack at a time is gathered, multiplied and scattered (`_entries`), in buffers
  that stay in the core's cache.
* gathered: the same gather, one BLAS product per MAB (numpy's matmul over the stack).
* in place: one BLAS product per PE's K-slice, read where it lies, and the PEs' tiles summed,
  when that copies fewer words. ResNet-50 conv2_x's M=28 K=576 N=8 takes it (52 -> 15 ms a
  MATMUL against gathering).

An operand that a mab_broadcast left replicated over the MABs of an L1B (sim.replicas) is read
from the first of them. When A and B both are, the L1B's MABs compute the same product, computed
once and written into each MAB's C (ResNet-50 conv2_x's 14 products: 94 -> 10 ms a call), or into
the first MAB's C only, C's words then recorded replicated too, when C is one run per PE and is
either overwritten or replicated so already (an accumulation over K chunks, each MATMUL adding
to the same C: conv2_x's 66 products of 48 x 64 x 8 wrote 4,096 PE rows each, 46 -> 27 ms a
call). In the loop, when only A is, the L1B's MABs compute one product r times wider (A times their B's side by
side), and when only B is, r times taller (their A's stacked): one long innermost run instead of
r short ones (the compiled 1024^3 product: 80 -> 67 ms a call, its products 64 x 8 x 8 a MAB).
In place, only one replicated operand is read at stride 0 instead of written out first (an MNIST
training step's 4 x 128 x 8 products with B replicated over 16 MABs: 1.5 -> 0.7 ms each).

The products are split over the host's cores when they are large enough to pay for waking the
threads (numba kernels and BLAS release the GIL). Padding holds whatever its memory held, as on
the chip: inf x 0 there makes a NaN in padding only.
"""

from __future__ import annotations

import numpy as np
from numba import njit
from numpy.lib.stride_tricks import as_strided

from . import isa
from .hostpool import run_shares
from .index import at
from .isa import DType
from .params import MachineParams
from .replicas import Replicas, Replicated

K_PER_PASS = 4  # K steps `_multiply` adds to an output row per pass (host policy, see there)
ROWS_PER_PASS = 4  # output rows `_multiply` computes per pass (host policy, see there)
SHORT_SLICE = 16  # longest K-slice per PE that is multiplied in a loop (see the module docstring)
LOOP, GATHERED, IN_PLACE = "loop", "gathered", "in place"
# Multiply-adds of a MATMUL from which its products are split between the host's threads (host
# policy: waking the threads costs some 20-50 us; an MNIST step's products are 10^4-10^5
# multiply-adds a MAB-share, where that is about what they save, and conv2_x's 1.6 M, 0.26 ms
# each on one core: 2^22 left them on one, 2^20 splits them, 28 -> 24 ms a call).
SHARED_MACS = 1 << 20


def form(m: int, k: int, n: int, pes: int) -> str:
    """How `matmul` computes an M x K x N product whose K is split over `pes` PEs."""
    if k // pes <= SHORT_SLICE:
        return LOOP
    return IN_PLACE if (pes - 1) * m * n < m * k + k * n else GATHERED


def matmul(p: MachineParams, memories: list[np.ndarray], row: np.ndarray, replicas: Replicas | None = None) -> None:
    """Run one MATMUL row on `memories`. With `replicas`, an operand held replicated over the MABs
    of an L1B is read from its first MAB (see the module docstring for what the sharing saves)."""
    pes = p.pes_per_mab
    dtype = DType(int(row[isa.MM_DTYPE]))
    m, k, n = int(row[isa.MM_M]), int(row[isa.MM_K]), int(row[isa.MM_N])
    kp = k // pes
    trans = bool(row[isa.MM_FLAGS] & isa.MM_TRANS_B)
    accumulate = bool(row[isa.MM_FLAGS] & isa.MM_ACCUMULATE)
    shapes = {isa.MM_A_MEM: (m, kp), isa.MM_B_MEM: (n, kp) if trans else (kp, n), isa.MM_C_MEM: (m, n // pes)}
    how = form(m, k, n, pes)
    words = _words(p, row, shapes, dtype)
    share = _sharing(p, words, replicas, how) if replicas else {}

    wide = np.float64 if DType(int(p.mm_acc[dtype])) == DType.float64 else np.float32  # C's (and float64's) type

    def operand(mem_f: int) -> tuple[np.ndarray, int, int]:
        """(the PE rows as [PE, elements], address, row pitch) of an operand: the memory itself
        for float32 and float64 elements (and C), a decoded copy [PE, rows x columns] for halves
        and pseudo-singles."""
        mem, addr, pitch = memories[int(row[mem_f])], int(row[mem_f + 1]), int(row[mem_f + 2])
        if mem_f == isa.MM_C_MEM or dtype in (DType.float32, DType.float64):
            return mem.view(wide), addr, pitch
        rows, cols = shapes[mem_f]
        view = mem.view(np.uint16) if dtype == DType.float16 else mem.view(np.float32)
        words = as_strided(view.reshape(-1)[addr:], shape=(view.shape[0], rows, cols),
                           strides=(view.strides[0], pitch * view.itemsize, view.itemsize))
        if dtype == DType.float16:
            values = p.half.table[words]
        else:  # pseudo-single: float32 words, their low mantissa bits ignored (truncated); a NaN stays
            # NaN (clearing its payload could make it an infinity), as special values follow torch
            values = np.where(np.isnan(words), words,
                              (words.view(np.uint32) & np.uint32(p.pseudo_mask)).view(np.float32))
        return values.reshape(view.shape[0], rows * cols), 0, cols

    a, b, c = (operand(f) for f in (isa.MM_A_MEM, isa.MM_B_MEM, isa.MM_C_MEM))
    n_mab = a[0].shape[0] // pes
    a_share, b_share = share.get(isa.MM_A_MEM, 1), share.get(isa.MM_B_MEM, 1)
    every = a_share if a_share == b_share > 1 else 1  # MABs one product serves
    c_once = replicas is not None and _c_replicated(p, row, words, shapes, replicas, every, accumulate)
    if how == IN_PLACE:  # [units, MAB in the unit, PE, rows, columns]; replicated operands at stride 0
        unit = max(a_share, b_share)  # the MABs a replicated operand serves (1: none is)
        blocks = [_blocks(x, pes, unit, share.get(f, 1), *shapes[f])
                  for x, f in ((a, isa.MM_A_MEM), (b, isa.MM_B_MEM), (c, isa.MM_C_MEM))]
        if trans:
            blocks[1] = blocks[1].swapaxes(-1, -2)
        if every > 1:  # one product per unit, from its first MAB's operands, written into each MAB's C
            blocks[0], blocks[1] = blocks[0][:, :1], blocks[1][:, :1]
        if c_once:  # (or its first MAB's only, C replicated)
            blocks[2] = blocks[2][:, :1]

        def units(first: int, last: int) -> None:
            _in_place(*blocks, accumulate, first, last)
        count = n_mab // unit
    else:
        stack = _Stack(pes, n_mab, every, a_share, b_share, m, kp, n, how == LOOP, 1 if c_once else every)

        def units(first: int, last: int) -> None:
            stack.run(a, b, trans, c, accumulate, first, last)
        count = stack.count
    if m * k * n * n_mab // every >= SHARED_MACS:
        run_shares(units, count)
    else:
        units(0, count)


class _Stack:
    """The gathered products of one MATMUL as a stack of `count` matrix products: one per MAB that
    computes (every `every`-th), or, where one operand is replicated over `r` of them, one per
    replica, r times wider (A times the r B's side by side) or taller (the r A's stacked, times B).
    numba kernels gather the operands and write C, because their pieces are a few elements long
    (numpy's strided copies of 2-element rows took 1.7 ms of a 64 x 8 x 8 product on 1,024 MABs,
    the product itself 0.1 ms)."""

    def __init__(self, pes: int, n_mab: int, every: int, a_share: int, b_share: int, m: int, kp: int, n: int,
                 short: bool, served: int):
        self.short, self.served = short, served  # MABs whose C a product writes (every, or 1: C replicated)
        self.a_step, self.b_step = max(a_share, every), max(b_share, every)  # MABs between copies read
        self.wide = self.a_step // every  # products one A serves
        self.tall = self.b_step // every  # products one B serves (wide and tall are not both > 1)
        self.r = max(self.wide, self.tall)
        self.count = n_mab // every // self.r
        self.every, self.pes, self.m, self.kp, self.n = every, pes, m, kp, n

    def run(self, a: tuple, b: tuple, trans: bool, c: tuple, accumulate: bool, first: int, last: int) -> None:
        """Stack entries [first, last): a, b and c are (PE rows, address, pitch) of the operands.
        Entry e is A_e (rows x K) @ B_e (K x cols); in the loop, when it is taller than wide, it
        is computed as B_e^T @ A_e^T, so that the loop's innermost run is the longer side."""
        pes, m, kp, n, r = self.pes, self.m, self.kp, self.n, self.r
        k, count = pes * kp, last - first
        lo, hi = first * r, last * r  # the products
        rows, cols = m * self.tall, n * self.wide  # of an entry's C: product t at rows (t mod tall) * m..,
        # columns (t mod wide) * n.. of entry t div r
        turned = self.short and rows > cols
        entries = 1 if self.short else count  # the loop takes one entry at a time
        a_cat = np.empty((entries, k, rows) if turned else (entries, rows, k), a[0].dtype)
        b_cat = np.empty((entries, cols, k) if turned else (entries, k, cols), b[0].dtype)
        # where element (row, column) of a PE's slice lands: offsets for the PE, the row and the column
        if turned:  # A^T: A's (i, kk) of PE q at row q*kp + kk, column i; B^T: B's (kk, j) at row j, column q*kp + kk
            a_to, a_part = (kp * rows, 1, rows), m
            b_to, b_part = ((kp, k, 1) if trans else (kp, 1, k)), n * k
        else:  # A: (i, kk) at row i, column q*kp + kk; B: (kk, j) at row q*kp + kk, column j
            a_to, a_part = (kp, k, 1), m * k
            b_to, b_part = ((kp * cols, 1, cols) if trans else (kp * cols, cols, 1)), n
        b_shape = (n, kp) if trans else (kp, n)
        if self.short:  # entry by entry, its pieces in buffers that stay in the core's cache
            a_one, b_one = a_cat[:1], b_cat[:1]
            tile = np.empty((1, cols, rows) if turned else (1, rows, cols), a_cat.dtype)
            _entries(a, b, c, pes, m, kp, n, self.a_step, self.b_step, b_shape, self.every, self.served, r, self.wide,
                     self.tall, a_one, a_part, a_to, b_one, b_part, b_to, tile, turned, accumulate, first, last)
            return
        _gather(*a, self.a_step * pes, pes, m, kp, lo // self.wide, hi // self.wide, a_cat, rows * k, self.tall,
                a_part, *a_to)
        _gather(*b, self.b_step * pes, pes, *b_shape, lo // self.tall, hi // self.tall, b_cat, k * cols, self.wide,
                b_part, *b_to)
        with np.errstate(invalid="ignore", over="ignore"):
            tile = np.matmul(a_cat, b_cat)
        _scatter(tile.reshape(-1), rows * cols, cols, 1, *c, pes, n // pes, m, self.every, self.served, r, self.wide,
                 self.tall, lo, hi, accumulate)


@njit(cache=True, nogil=True)
def _entries(a, b, c, pes, m, kp, n, a_step, b_step, b_shape, every, served, r, wide, tall, a_one, a_part, a_to, b_one,
             b_part, b_to, tile, turned, accumulate, first, last):
    """The loop's entries [first, last) one at a time: gathered into `a_one` and `b_one` (one
    entry each), multiplied into `tile` and scattered into C before the next, so the pieces stay
    in the core's cache (all entries gathered first: an MNIST step's 64 x 8 x 8 products went
    through 2 MB tiles). a, b and c are (PE rows, address, pitch) of the operands."""
    k = pes * kp
    rows, cols = a_one.shape[2] if turned else a_one.shape[1], b_one.shape[1] if turned else b_one.shape[2]
    strides = (1, rows) if turned else (cols, 1)
    for e in range(first, last):
        lo, hi = e * r, (e + 1) * r
        _gather(a[0], a[1], a[2], a_step * pes, pes, m, kp, lo // wide, hi // wide, a_one, rows * k, tall, a_part,
                a_to[0], a_to[1], a_to[2])
        _gather(b[0], b[1], b[2], b_step * pes, pes, b_shape[0], b_shape[1], lo // tall, hi // tall, b_one, k * cols,
                wide, b_part, b_to[0], b_to[1], b_to[2])
        if turned:
            _multiply(b_one, a_one, tile)
        else:
            _multiply(a_one, b_one, tile)
        _scatter(tile.reshape(-1), rows * cols, strides[0], strides[1], c[0], c[1], c[2], pes, n // pes, m, every,
                 served, r, wide, tall, lo, hi, accumulate)


@njit(cache=True, nogil=True)
def _multiply(a, b, out):
    """out[e] = a[e] @ b[e], each element summed along K in order (multiply, then add): the same
    words whether products are stacked wide, tall or one by one, which BLAS does not promise (its
    kernels differ with the shape). The innermost loop runs along a row of b and out, so it
    vectorises (flat unsigned indices, sim.index). A pass adds K_PER_PASS K steps to
    ROWS_PER_PASS output rows, in order: each load of b's rows serves four output rows, and each
    output row is loaded and stored a quarter as often as step by step (one row and one step a
    pass was bound by those loads and stores: 64 x 16 x 128, the 1024^3 product's entries, 9.2 us;
    four steps 7.6 us; four rows and four steps 3.6 us)."""
    n_e, rows, k = a.shape
    cols = out.shape[2]
    fa, fb, fo = a.reshape(-1), b.reshape(-1), out.reshape(-1)
    k4 = k - k % K_PER_PASS
    r4 = rows - rows % ROWS_PER_PASS
    for e in range(n_e):
        for i in range(0, r4, ROWS_PER_PASS):
            _four_rows(fa, fb, fo, e, i, rows, k, k4, cols)
        for i in range(r4, rows):
            _one_row(fa, fb, fo, e, i, rows, k, k4, cols)


@njit(cache=True, inline="always")
def _four_rows(fa, fb, fo, e, i, rows, k, k4, cols):
    """Output rows i..i+3 of product e (`_multiply`; its body is written for four rows and four
    K steps a pass), then the K steps past the last whole four, row by row."""
    o0 = (e * rows + i) * cols
    o1, o2, o3 = o0 + cols, o0 + 2 * cols, o0 + 3 * cols
    a0 = (e * rows + i) * k
    a1, a2, a3 = a0 + k, a0 + 2 * k, a0 + 3 * k
    for j in range(4 * cols):
        fo[at(o0 + j)] = 0
    for kk in range(0, k4, K_PER_PASS):
        b0 = (e * k + kk) * cols
        b1, b2, b3 = b0 + cols, b0 + 2 * cols, b0 + 3 * cols
        x00, x01, x02, x03 = fa[at(a0 + kk)], fa[at(a0 + kk + 1)], fa[at(a0 + kk + 2)], fa[at(a0 + kk + 3)]
        x10, x11, x12, x13 = fa[at(a1 + kk)], fa[at(a1 + kk + 1)], fa[at(a1 + kk + 2)], fa[at(a1 + kk + 3)]
        x20, x21, x22, x23 = fa[at(a2 + kk)], fa[at(a2 + kk + 1)], fa[at(a2 + kk + 2)], fa[at(a2 + kk + 3)]
        x30, x31, x32, x33 = fa[at(a3 + kk)], fa[at(a3 + kk + 1)], fa[at(a3 + kk + 2)], fa[at(a3 + kk + 3)]
        for j in range(cols):
            v0, v1, v2, v3 = fb[at(b0 + j)], fb[at(b1 + j)], fb[at(b2 + j)], fb[at(b3 + j)]
            fo[at(o0 + j)] = (((fo[at(o0 + j)] + x00 * v0) + x01 * v1) + x02 * v2) + x03 * v3
            fo[at(o1 + j)] = (((fo[at(o1 + j)] + x10 * v0) + x11 * v1) + x12 * v2) + x13 * v3
            fo[at(o2 + j)] = (((fo[at(o2 + j)] + x20 * v0) + x21 * v1) + x22 * v2) + x23 * v3
            fo[at(o3 + j)] = (((fo[at(o3 + j)] + x30 * v0) + x31 * v1) + x32 * v2) + x33 * v3
    for r in range(4):
        _rest_of_k(fa, fb, fo, e, a0 + r * k, o0 + r * cols, k, k4, cols)


@njit(cache=True, inline="always")
def _one_row(fa, fb, fo, e, i, rows, k, k4, cols):
    """Output row i of product e, four K steps a pass, then the rest."""
    o, ai = (e * rows + i) * cols, (e * rows + i) * k
    for j in range(cols):
        fo[at(o + j)] = 0
    for kk in range(0, k4, K_PER_PASS):
        x0, x1, x2, x3 = fa[at(ai + kk)], fa[at(ai + kk + 1)], fa[at(ai + kk + 2)], fa[at(ai + kk + 3)]
        b0 = (e * k + kk) * cols
        b1, b2, b3 = b0 + cols, b0 + 2 * cols, b0 + 3 * cols
        for j in range(cols):
            r = fo[at(o + j)] + x0 * fb[at(b0 + j)]
            r = r + x1 * fb[at(b1 + j)]
            r = r + x2 * fb[at(b2 + j)]
            fo[at(o + j)] = r + x3 * fb[at(b3 + j)]
    _rest_of_k(fa, fb, fo, e, ai, o, k, k4, cols)


@njit(cache=True, inline="always")
def _rest_of_k(fa, fb, fo, e, ai, o, k, k4, cols):
    """K steps k4.. of the output row at `o` (A's row at `ai`), one at a time."""
    for kk in range(k4, k):
        x = fa[at(ai + kk)]
        bb = (e * k + kk) * cols
        for j in range(cols):
            fo[at(o + j)] += x * fb[at(bb + j)]


@njit(cache=True, nogil=True)
def _gather(mem, base, pitch, step, pes, rows, cols, first, last, out, per_entry, per, inner, qs, rs, cs):
    """Copies [first, last) of an operand (copy x from PE rows x*step..) into `out` (flat view of
    [entry, ...]): copy x is part x mod `per` of entry x div `per`, `inner` elements in; element
    (row, column) of PE q's slice lands at q*qs + row*rs + column*cs from there."""
    flat = out.reshape(-1)
    for x in range(first, last):
        to = (x - first) // per * per_entry + (x % per) * inner
        for q in range(pes):
            pe = x * step + q
            for i in range(rows):
                for j in range(cols):
                    flat[at(to + q * qs + i * rs + j * cs)] = mem[pe, at(base + i * pitch + j)]


@njit(cache=True, nogil=True)
def _scatter(tile, per_entry, rs, cs, c, c0, cp, pes, npe, m, every, served, r, wide, tall, lo, hi, accumulate):
    """Products [lo, hi) from `tile` (flat; product t lies in entry t div r at rows (t mod tall) * m..
    and columns (t mod wide) * n.., rows and columns `rs` and `cs` apart) into C of the first
    `served` MABs of the `every` it serves: PE q gets columns q*npe.. of its product."""
    for t in range(lo, hi):
        first = (t - lo) // r * per_entry + (t % tall) * m * rs + (t % wide) * npe * pes * cs  # its (0, 0)
        for mab in range(t * every, t * every + served):
            for q in range(pes):
                pe = mab * pes + q
                if npe == 2:  # one long word of C per row (N = 8 on 4 PEs: 1024^3's products), unrolled:
                    # a loop of two costs more than its adds (its scatter took as long as the product)
                    for i in range(m):
                        src, dst = first + i * rs + q * npe * cs, c0 + i * cp
                        if accumulate:
                            c[pe, at(dst)] += tile[at(src)]
                            c[pe, at(dst + 1)] += tile[at(src + cs)]
                        else:
                            c[pe, at(dst)] = tile[at(src)]
                            c[pe, at(dst + 1)] = tile[at(src + cs)]
                    continue
                for i in range(m):
                    src, dst = first + i * rs + q * npe * cs, c0 + i * cp
                    if accumulate:
                        for j in range(npe):
                            c[pe, at(dst + j)] += tile[at(src + j * cs)]
                    else:
                        for j in range(npe):
                            c[pe, at(dst + j)] = tile[at(src + j * cs)]


def _words(p: MachineParams, row: np.ndarray, shapes: dict, dtype: DType) -> dict[int, tuple[int, int, int]]:
    """Per operand field: (memory, first word, end word) of what each PE holds of it."""
    words = {}
    for f, (rows, cols) in shapes.items():
        addr, pitch = int(row[f + 1]), int(row[f + 2])
        first, last = p.word_span(DType(int(p.mm_acc[dtype])) if f == isa.MM_C_MEM else dtype, addr,
                                  addr + (rows - 1) * pitch + cols - 1)
        words[f] = (int(row[f]), first, last + 1)
    return words


def _c_replicated(p: MachineParams, row: np.ndarray, words: dict, shapes: dict, replicas: Replicas, every: int,
                  accumulate: bool) -> bool:
    """Whether a product writes C into the first of the `every` MABs it serves only, C's range
    then recorded replicated over them: when both operands are, C is one run of words per PE that
    meets neither, and the MATMUL overwrites it or it is replicated so already (every MAB's C
    would be the same words). Otherwise C is written out first, and into every MAB."""
    mem, lo, hi = words[isa.MM_C_MEM]
    rows, cols = shapes[isa.MM_C_MEM]
    pes = p.pes_per_mab
    held = replicas.holding(mem, lo, hi)
    alike = held is not None and (held.group, held.fan) == (pes, every * pes)
    apart = all(not (m == mem and a < hi and lo < b) for m, a, b in (words[isa.MM_A_MEM], words[isa.MM_B_MEM]))
    one_run = rows == 1 or int(row[isa.MM_C_MEM + 2]) == cols
    if every > 1 and apart and one_run and (alike or not accumulate):
        replicas.overwritten(Replicated(mem, lo, hi, pes, every * pes))
        return True
    replicas.materialize(mem, lo, hi)
    return False


def _sharing(p: MachineParams, words: dict, replicas: Replicas, how: str) -> dict[int, int]:
    """MABs per copy of each operand held replicated over the MABs of an upper instance (sim.replicas),
    by operand field. Whatever else a range meets is written out first: an operand a range holds
    only in part or over other groups than the MABs, a replicated operand beside an own one when
    the products are gathered for BLAS (stacked wider or taller, BLAS would round otherwise than
    MAB by MAB), and operands replicated over different numbers of MABs; C is `_c_replicated`'s."""
    share = {}
    for f in (isa.MM_A_MEM, isa.MM_B_MEM):
        r = replicas.holding(*words[f])
        if r is not None and r.group == p.pes_per_mab:
            share[f] = r.fan // r.group
        else:
            replicas.materialize(*words[f])
    if len(set(share.values())) > 1 or (how == GATHERED and len(share) == 1):
        for f in list(share):
            replicas.materialize(*words[f])
        share = {}
    return share


def _blocks(operand: tuple[np.ndarray, int, int], pes: int, unit: int, share: int, rows: int, cols: int
            ) -> np.ndarray:
    """An operand as [unit, MAB in the unit, PE, rows, columns] in place, units of `unit` MABs; an
    operand replicated over `share` MABs (the unit) repeats its first MAB's words at stride 0."""
    words, addr, pitch = operand
    item, pe = words.itemsize, words.strides[0]
    mab = 0 if share > 1 else pes * pe
    return as_strided(words.reshape(-1)[addr:], shape=(words.shape[0] // (pes * unit), unit, pes, rows, cols),
                      strides=(unit * pes * pe, mab, pe, pitch * item, item))


def _in_place(a: np.ndarray, b: np.ndarray, c: np.ndarray, accumulate: bool, first: int, last: int) -> None:
    """Units [first, last) (see `_blocks`), one product per MAB and PE's K-slice read in place, the
    PEs' tiles summed. A replicated operand is read at stride 0: every MAB's product is the same
    BLAS call on the same words as without replicas. A and B hold one MAB per unit when both are
    replicated: its product is written into every MAB's C."""
    _, a_mabs, pes, m, _ = a.shape
    count, mabs, n = last - first, max(a_mabs, b.shape[1]), b.shape[-1]
    with np.errstate(invalid="ignore", over="ignore"):
        tile = np.matmul(a[first:last, :, 0], b[first:last, :, 0])
        for q in range(1, pes):
            tile += np.matmul(a[first:last, :, q], b[first:last, :, q])
    result = tile.reshape(count, mabs, m, pes, n // pes).swapaxes(2, 3)  # [unit, MAB, PE, rows, columns]
    if accumulate:
        with np.errstate(invalid="ignore", over="ignore"):  # float32 overflow is inf, as the MAU's (no warning)
            c[first:last] += result
    else:
        c[first:last] = result

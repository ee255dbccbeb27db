"""MATMUL, functionally: C (+)= A @ B on every MAB at once.

Each MAB's four PEs hold its operands split as sim.isa describes: K over the PEs in A and B, N in
C, so every PE's slice is a row-major matrix at an address with a row pitch. Every MAB runs the
same instruction on its own operands; how the simulator computes them depends on the shape,
because what costs the host time differs:

* short K-slices (at most `SHORT_SLICE` per PE, as in a training step's thin products): a numba
  loop per MAB, which reads the slices in place and writes C directly. A BLAS call costs about a
  microsecond before it multiplies anything, and such a product is a few hundred multiply-adds;
  1,024 calls of it took 1 ms on MN-Core 2, the loop 0.1-0.5 ms (measured on this project's
  2-core machine, MNIST's step: M=4 K=40 N=8, M=2 K=8 N=8, M=64 K=8 N=8).
* longer slices: BLAS, either with the PEs' K-slices side by side (a copy of A and B, one product
  over the whole K per MAB) or one product per PE's K-slice read in place and summed (pes - 1
  additions of an M x N tile), whichever moves fewer words. ResNet-50 conv2_x's M=28 K=576 N=8
  takes the second (52 -> 15 ms a MATMUL against the first); the loop would take 24 ms.

An operand that a mab_broadcast left replicated over the MABs of an L1B (sim.replicas) is read
from the first of them; when A and B both are, the L1B's MABs compute the same product, which is
computed once and written into each MAB's C (ResNet-50 conv2_x's 14 products: 94 -> 10 ms a call).

The MABs are split over the host's cores (numba releases the GIL, and so does BLAS). Padding
holds whatever its memory held, as on the chip: inf x 0 there makes a NaN in padding only.
"""

from __future__ import annotations

import numpy as np
from numba import njit
from numpy.lib.stride_tricks import as_strided

from . import isa
from .index import at
from .hostpool import run_shares
from .isa import DType
from .params import MachineParams
from .replicas import Replicas

SHORT_SLICE = 16  # longest K-slice per PE the loop takes (from the measurements above)
LOOP, GATHERED, IN_PLACE = "loop", "gathered", "in place"


def form(m: int, k: int, n: int, pes: int) -> str:
    """How `matmul` computes an M x K x N product whose K is split over `pes` PEs."""
    kp = k // pes
    if kp <= SHORT_SLICE:
        return LOOP
    return IN_PLACE if (pes - 1) * m * n < m * k + k * n else GATHERED


def matmul(p: MachineParams, memories: list[np.ndarray], row: np.ndarray, replicas: Replicas | None = None) -> None:
    """Run one MATMUL row on `memories`. With `replicas`, an operand held replicated over the MABs
    of an L1B is read from its first MAB, and when A and B both are, each L1B's product is computed
    once and written to all of its MABs' C."""
    pes = p.pes_per_mab
    dtype = DType(int(row[isa.MM_DTYPE]))
    m, k, n = int(row[isa.MM_M]), int(row[isa.MM_K]), int(row[isa.MM_N])
    kp = k // pes
    trans = bool(row[isa.MM_FLAGS] & isa.MM_TRANS_B)
    accumulate = bool(row[isa.MM_FLAGS] & isa.MM_ACCUMULATE)
    shapes = {isa.MM_A_MEM: (m, kp), isa.MM_B_MEM: (n, kp) if trans else (kp, n), isa.MM_C_MEM: (m, n // pes)}
    how = form(m, k, n, pes)
    share = _sharing(p, row, shapes, replicas, dtype, how) if replicas else {}

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
    if how != LOOP:  # [L1B-sized units, MAB in the unit, PE, rows, columns]; replicated operands at stride 0
        blocks = [_blocks(x, pes, every, share.get(f, 1), *shapes[f])
                  for x, f in ((a, isa.MM_A_MEM), (b, isa.MM_B_MEM), (c, isa.MM_C_MEM))]
        if trans:
            blocks[1] = blocks[1].swapaxes(-1, -2)
        if every > 1:  # one product per unit, from its first MAB's operands
            blocks[0], blocks[1] = blocks[0][:, 0], blocks[1][:, 0]
        else:
            blocks[:] = [x[:, 0] for x in blocks]

    def units(first: int, last: int) -> None:
        if how == LOOP:
            _products(*a, a_share, *b, b_share, trans, *c, pes, m, kp, n, accumulate, every, first * every,
                      last * every, np.zeros(m * n, wide), np.zeros(kp * n, b[0].dtype))
        else:
            _blas(*blocks, accumulate, how == IN_PLACE, first, last)

    run_shares(units, n_mab // every)


def _sharing(p: MachineParams, row: np.ndarray, shapes: dict, replicas: Replicas, dtype: DType,
             how: str) -> dict[int, int]:
    """MABs per copy of each operand held replicated over the MABs of an upper instance (sim.replicas),
    by operand field. Whatever else a range meets is written out first: C (written), an operand
    a range holds only in part or over other groups than the MABs, and, for BLAS, a replicated
    operand beside an own one (BLAS reads replicas only when both operands are)."""
    words = {}
    for f, (rows, cols) in shapes.items():
        addr, pitch = int(row[f + 1]), int(row[f + 2])
        first, last = p.word_span(DType(int(p.mm_acc[dtype])) if f == isa.MM_C_MEM else dtype, addr,
                                  addr + (rows - 1) * pitch + cols - 1)
        words[f] = (int(row[f]), first, last + 1)
    replicas.materialize(*words[isa.MM_C_MEM])
    share = {}
    for f in (isa.MM_A_MEM, isa.MM_B_MEM):
        r = replicas.holding(*words[f])
        if r is not None and r.group == p.pes_per_mab:
            share[f] = r.fan // r.group
        else:
            replicas.materialize(*words[f])
    if len(share) < 2 or len(set(share.values())) > 1:
        if how != LOOP:
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


def _blas(a: np.ndarray, b: np.ndarray, c: np.ndarray, accumulate: bool, in_place: bool, first: int,
          last: int) -> None:
    """MABs [first, last) through numpy's matmul (see the module docstring for the two ways)."""
    count, pes, m, kp = last - first, a.shape[1], a.shape[2], a.shape[3]
    n = b.shape[3]
    with np.errstate(invalid="ignore", over="ignore"):
        if in_place:
            tile = np.matmul(a[first:last, 0], b[first:last, 0])
            for q in range(1, pes):
                tile += np.matmul(a[first:last, q], b[first:last, q])
        else:
            tile = np.matmul(a[first:last].transpose(0, 2, 1, 3).reshape(count, m, pes * kp),
                             b[first:last].reshape(count, pes * kp, n))
    result = tile.reshape(count, m, pes, n // pes).transpose(0, 2, 1, 3)
    if c.ndim == 5:  # one product for every MAB of a unit
        result = result[:, None]
    if accumulate:
        c[first:last] += result
    else:
        c[first:last] = result


@njit(cache=True, nogil=True)
def _products(a, a0, ap, a_share, b, b0, bp, b_share, trans, c, c0, cp, pes, m, kp, n, accumulate, every, first,
              last, tile, slice_):
    """MABs [first, last): each MAB's M x N tile (`tile`, in C's type: float32, or float64 for a
    float64 product) summed over its PEs' K-slices, then written (or added) into each PE's columns
    of C. a, b and c are the PE rows [PE, elements] with each operand's address and row pitch; B
    is N x K/PE when `trans`, and then each PE's slice is first turned K x N (into `slice_`). An
    operand replicated over `share` MABs is read from the first of them; the tile is computed on
    every `every`-th MAB and serves the ones up to the next. The innermost loop runs along N, unit
    stride in the tile and the slice, so it vectorises (a dot product along K per element measured
    slower: a chain of dependent adds)."""
    npe = n // pes
    for mab in range(first, last):
        if mab % every == 0:
            tile[:] = 0
            for q in range(pes):
                pa = (mab - mab % a_share) * pes + q
                pb = (mab - mab % b_share) * pes + q
                if trans:
                    for j in range(n):
                        for kk in range(kp):
                            slice_[at(kk * n + j)] = b[pb, at(b0 + j * bp + kk)]
                for i in range(m):
                    for kk in range(kp):
                        x = a[pa, at(a0 + i * ap + kk)]
                        if trans:
                            for j in range(n):
                                tile[at(i * n + j)] += x * slice_[at(kk * n + j)]
                        else:
                            for j in range(n):
                                tile[at(i * n + j)] += x * b[pb, at(b0 + kk * bp + j)]
        for q in range(pes):
            pe = mab * pes + q
            for i in range(m):
                for j in range(npe):
                    y = tile[at(i * n + q * npe + j)]
                    if accumulate:
                        c[pe, at(c0 + i * cp + j)] += y
                    else:
                        c[pe, at(c0 + i * cp + j)] = y

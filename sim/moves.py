"""Data movement kernels: MV (the Data Engines) and XFER (the PE stream's transfers), in numba.

Every memory is a uint32 array shaped [instances, words]; a kernel loops over all instances of
the level an instruction drives (every Group, every L2B, every PE) inside one call, so a program
costs per instruction, not per PE. Data patterns of the transfer modes follow
layout_notation.md section 7.2, with fan-outs and chunk sizes from the hardware description:

* distribute: upper LW q goes to child (q div chunk) mod F at chunk*(q div (chunk*F)) + q mod chunk
  (l2bmd: chunk 8 over 8 L1Bs; l1bmd: chunk 1 over the 64 PEs of an L1B); collect is its inverse;
* mab_broadcast: upper LW q goes to member q mod G at q div G of every group of G children
  (l1bmm: the 4 PEs of every MAB); individual (upward) reads a group the same way;
* broadcast: every child gets the same n long words;
* distributed_broadcast (mvb4, from every Group's DRAM at once): Group g's chunk j goes to local
  L2B j mod P (P per Group) of every Group, at chunk n_groups * (j div P) + g;
* transpose (mread, the matrix registers to the PEs): blocks of side x side elements, their rows
  across a group's members, come out as columns (sim.isa, "the matrix registers").

Reductions (MV and XFER mode reduce) compute, so they live in `sim.reduce`; `execute_moves` runs
a block of NOP, WAIT and the copying MV/XFER modes in one call, except mab_broadcast, which
`mab_broadcast` replicates with numpy, and transpose, which `transpose` runs in a kernel compiled for
the chip's block size.
It runs each instruction for a range of Groups, so that host threads can share a block of
`group_local` ones (`sim.functional`).
"""

from __future__ import annotations

import functools

import numpy as np
from numba import njit

from . import isa
from .index import at
from .isa import ALL_GROUPS, Dir, Mode, Op, Scope


@njit(cache=True, inline="always")
def word_addr(lw_addressed: np.ndarray, mem: int, addr: int, wpl: int) -> int:
    """The word index of an address field: long-word-addressed memories count long words."""
    return addr * wpl if lw_addressed[mem] else addr


@njit(cache=True, inline="always")
def item_addr(lw_addressed: np.ndarray, mem: int, addr: int, wpl: int, item_words: int) -> int:
    """The index of an address field in a memory viewed as items of `item_words` words (1: the
    uint32 rows; the words of a long word: one uint64 per long word, `execute_moves`)."""
    return word_addr(lw_addressed, mem, addr, wpl) // item_words


@njit(cache=True, inline="always")
def copy_lw(dst: np.ndarray, d_inst: int, d_word: int, src: np.ndarray, s_inst: int, s_word: int, n_lw: int,
            wpl: int) -> None:
    for i in range(wpl * n_lw):
        dst[d_inst, at(d_word + i)] = src[s_inst, at(s_word + i)]


@njit(cache=True)
def scope_range(mem_instances: np.ndarray, n_groups: int, mem: int, scope: int, group: int) -> tuple:
    """(first instance, count) of `mem` an MV in `scope` reaches from Group `group`."""
    if scope == Scope.chip:
        return 0, mem_instances[mem]
    per = mem_instances[mem] // n_groups
    return group * per, per


# Arguments of `_chunked` as run-time int64 values: literal True/False/1 at a call would each
# compile a signature of their own (three compiles of the same loops in a fresh checkout).
DOWN, UP, ONE_LW = np.int64(0), np.int64(1), np.int64(1)


@njit(cache=True, inline="always")
def _rounds(collect, up, u, uw, lo, first, lw, n, chunk, count, wpl):
    """Chunk q of the upper run (long words q*chunk..) and child q mod count at chunk round
    q div count: copied down (distribute) or up (`collect`). Child by child, so each child's row
    is swept once (children are whole memory rows apart: interleaving them thrashes the cache on
    aliasing addresses)."""
    for k in range(count):
        for r in range((n + chunk * count - 1) // (chunk * count)):
            q = chunk * (r * count + k)
            if q >= n:
                break
            if collect:
                copy_lw(up, u, uw + wpl * q, lo, first + k, lw + wpl * chunk * r, min(chunk, n - q), wpl)
            else:
                copy_lw(lo, first + k, lw + wpl * chunk * r, up, u, uw + wpl * q, min(chunk, n - q), wpl)


@njit(cache=True)
def _chunked(collect, up, u, uw, lo, first, lw, n, chunk, count, wpl):
    """`_rounds`, with one long word per child (the PE level) and two words per long word in a
    loop of its own, compiled with those sizes known: 4-7x faster than the general loop, whose
    copies of run-time length do not unroll (an MNIST training step spent 90 ms a step in PE
    transfers)."""
    if chunk == 1 and wpl == 1:
        _rounds(collect, up, u, uw, lo, first, lw, n, 1, count, 1)
    elif chunk == 1 and wpl == 2:
        _rounds(collect, up, u, uw, lo, first, lw, n, 1, count, 2)
    else:
        _rounds(collect, up, u, uw, lo, first, lw, n, chunk, count, wpl)


@njit(cache=True, inline="always")
def _deal(dst, first, dw, src, s, sw, n, chunk, count, wpl):
    """Distribute: chunk q of `src` (long words q*chunk..) goes to child q mod count at chunk
    round q div count."""
    _chunked(DOWN, src, s, sw, dst, first, dw, n, chunk, count, wpl)


@njit(cache=True, inline="always")
def _undeal(dst, d, dw, src, first, sw, n, chunk, count, wpl):
    """Collect, the inverse of `_deal`."""
    _chunked(UP, dst, d, dw, src, first, sw, n, chunk, count, wpl)


@njit(cache=True, inline="always")
def _mv_group(g, mode, n, s_inst, s_local, d_inst, d_local, scope, src, sw, sm, dst, dw, dm, mem_instances, n_groups,
              chunk, wpl):
    """An MV from Group g (every Group's: the instance fields count within it when negative)."""
    s_per, d_per = mem_instances[sm] // n_groups, mem_instances[dm] // n_groups
    s = s_inst if s_inst >= 0 else g * s_per + s_local
    d = d_inst if d_inst >= 0 else g * d_per + d_local
    if mode == Mode.individual:
        copy_lw(dst, d, dw, src, s, sw, n, wpl)
    elif mode == Mode.broadcast:
        first, count = scope_range(mem_instances, n_groups, dm, scope, s // s_per)
        for k in range(count):
            copy_lw(dst, first + k, dw, src, s, sw, n, wpl)
    elif mode == Mode.distribute:
        first, count = scope_range(mem_instances, n_groups, dm, scope, s // s_per)
        _deal(dst, first, dw, src, s, sw, n, chunk, count, wpl)
    elif mode == Mode.distributed_broadcast:
        for j in range(n // chunk):
            at_dst = dw + wpl * chunk * (n_groups * (j // d_per) + g)
            for h in range(n_groups):
                copy_lw(dst, h * d_per + j % d_per, at_dst, src, s, sw + wpl * chunk * j, chunk, wpl)
    else:  # collect
        first, count = scope_range(mem_instances, n_groups, sm, scope, d // d_per)
        _undeal(dst, d, dw, src, first, sw, n, chunk, count, wpl)


@njit(cache=True, inline="always")
def _mv(row, src, dst, mem_instances, lw_addressed, n_groups, chunk, wpl, item_words, g_first, g_last):
    """An MV, in Groups [g_first, g_last) when it runs in every Group; one that does not runs
    with the share holding Group 0 (`group_local`: such an MV is never split)."""
    mode, n, scope = row[isa.MV_MODE], row[isa.MV_N], row[isa.MV_SCOPE]
    sm, dm = row[isa.MV_SRC_MEM], row[isa.MV_DST_MEM]
    sw = item_addr(lw_addressed, sm, row[isa.MV_SRC_ADDR], wpl, item_words)
    dw = item_addr(lw_addressed, dm, row[isa.MV_DST_ADDR], wpl, item_words)
    s_inst, s_local, d_inst, d_local = row[isa.MV_SRC_INST], row[isa.MV_SRC_LOCAL], row[isa.MV_DST_INST], \
        row[isa.MV_DST_LOCAL]
    if s_inst == ALL_GROUPS or d_inst == ALL_GROUPS:
        first, last = g_first, g_last
    else:
        first, last = 0, 1 if g_first == 0 else 0
    for g in range(first, last):
        _mv_group(g, mode, n, s_inst, s_local, d_inst, d_local, scope, src, sw, sm, dst, dw, dm, mem_instances,
                  n_groups, chunk, wpl // item_words)


@njit(cache=True, inline="always")
def _xfer_instance(u, mode, down, index, up, uw, lo, lw, n, fan, chunk, group, wpl):
    """An XFER between upper instance u and its `fan` children. A broadcast's `index`, when not 0,
    is the subset of children it writes, as a bit mask (`l2bmb@set`)."""
    base = u * fan
    if down:
        if mode == Mode.broadcast:
            for k in range(fan):
                if index == 0 or (index >> k) & 1:
                    copy_lw(lo, base + k, lw, up, u, uw, n, wpl)
        else:  # distribute, a chunk of consecutive long words to each child in turn (mab_broadcast: below)
            _deal(lo, base, lw, up, u, uw, n, chunk, fan, wpl)
    elif mode == Mode.collect:
        _undeal(up, u, uw, lo, base, lw, n, chunk, fan, wpl)
    else:  # individual: group g's members read as a collect over them, one long word each in turn
        _undeal(up, u, uw, lo, base + index * group, lw, n, ONE_LW, group, wpl)


@njit(cache=True)
def _xfer(row, up, lo, mem_instances, lw_addressed, n_groups, group, chunk, wpl, item_words, g_first, g_last):
    """L2BM <-> L1BM and L1BM <-> PE, in every upper instance of Groups [g_first, g_last)."""
    mode, down, n, index = row[isa.X_MODE], row[isa.X_DIR] == Dir.down, row[isa.X_N], row[isa.X_INDEX]
    um, lm = row[isa.X_UP_MEM], row[isa.X_LO_MEM]
    uw = item_addr(lw_addressed, um, row[isa.X_UP_ADDR], wpl, item_words)
    lw = item_addr(lw_addressed, lm, row[isa.X_LO_ADDR], wpl, item_words)
    n_up = mem_instances[um]
    fan = mem_instances[lm] // n_up
    for u in range(g_first * n_up // n_groups, g_last * n_up // n_groups):  # all of them for 0, n_groups
        _xfer_instance(u, mode, down, index, up, uw, lo, lw, n, fan, chunk, group, wpl // item_words)


@njit(cache=True, nogil=True)
def execute_moves(code, start, end, mems, mem_instances, lw_addressed, n_groups, path_of, path_group, mode_chunk,
                  wpl, item_words, g_first, g_last):
    """Run instructions [start, end): NOP, WAIT (no effect on data) and copying MV/XFER modes, the
    part of each in Groups [g_first, g_last) (all of them: 0, n_groups). Threads may run a block
    of `group_local` instructions each for its own Groups.

    `mems` are the memories as arrays of items of `item_words` words: the uint32 rows (1), or
    views holding a long word per item (`wpl`; every address the run touches long-word aligned).
    A long word copied as one 64-bit item rather than two 32-bit words halves the loads and stores
    of a PE-level transfer, which deals one long word to each PE in turn (MN-Core 2's L1BM -> LM0
    distribute of 1 MB: 0.146 -> 0.071 ms).

    Kernels get the two memories an instruction touches, not the tuple of all of them: passing a
    tuple of arrays costs a reference count per array per call, 20 times the copy of a short MV."""
    for i in range(start, end):
        row = code[i]
        op = row[0]
        if op == Op.MV and row[isa.MV_MODE] == Mode.individual and row[isa.MV_SRC_INST] >= 0 \
                and row[isa.MV_DST_INST] >= 0:  # one instance to one: `_mv`'s case without its set-up, the most
            # common MV (an MNIST step's 17,632 of them a call, from DRAM to an L2B, 150 -> 40 ns each)
            if g_first == 0:
                sm, dm = row[isa.MV_SRC_MEM], row[isa.MV_DST_MEM]
                copy_lw(mems[dm], row[isa.MV_DST_INST],
                        item_addr(lw_addressed, dm, row[isa.MV_DST_ADDR], wpl, item_words),
                        mems[sm], row[isa.MV_SRC_INST],
                        item_addr(lw_addressed, sm, row[isa.MV_SRC_ADDR], wpl, item_words),
                        row[isa.MV_N], wpl // item_words)
        elif op == Op.MV and row[isa.MV_MODE] == Mode.individual:  # in every Group at once, each between
            # its own instances (a GPT-2 training step's gathers: 156,061 a call, 257 -> 107 ns each)
            _in_every_group(row, mems[row[isa.MV_SRC_MEM]], mems[row[isa.MV_DST_MEM]], mem_instances, lw_addressed,
                            n_groups, wpl, item_words, g_first, g_last)
        elif op == Op.MV:
            p = path_of[row[isa.MV_SRC_MEM], row[isa.MV_DST_MEM]]
            _mv(row, mems[row[isa.MV_SRC_MEM]], mems[row[isa.MV_DST_MEM]], mem_instances, lw_addressed, n_groups,
                mode_chunk[p, row[isa.MV_MODE]], wpl, item_words, g_first, g_last)
        elif op == Op.XFER:
            if row[isa.X_DIR] == Dir.down:
                p = path_of[row[isa.X_UP_MEM], row[isa.X_LO_MEM]]
            else:
                p = path_of[row[isa.X_LO_MEM], row[isa.X_UP_MEM]]
            _xfer(row, mems[row[isa.X_UP_MEM]], mems[row[isa.X_LO_MEM]], mem_instances, lw_addressed, n_groups,
                  path_group[p], mode_chunk[p, row[isa.X_MODE]], wpl, item_words, g_first, g_last)


@njit(cache=True, inline="always")
def _in_every_group(row, src, dst, mem_instances, lw_addressed, n_groups, wpl, item_words, g_first, g_last):
    """MV individual in every Group of [g_first, g_last), between the Group's own instances (an
    ALL_GROUPS instance field counts the Group's `local`-th): `_mv`'s case with the Group's
    instances worked out once per MV, and one or two items copied without a loop (most are a
    gather's single long words)."""
    sm, dm = row[isa.MV_SRC_MEM], row[isa.MV_DST_MEM]
    s0 = item_addr(lw_addressed, sm, row[isa.MV_SRC_ADDR], wpl, item_words)
    d0 = item_addr(lw_addressed, dm, row[isa.MV_DST_ADDR], wpl, item_words)
    n = row[isa.MV_N] * (wpl // item_words)
    si, di = row[isa.MV_SRC_INST], row[isa.MV_DST_INST]
    s_per, d_per = mem_instances[sm] // n_groups, mem_instances[dm] // n_groups
    s_local, d_local = row[isa.MV_SRC_LOCAL], row[isa.MV_DST_LOCAL]
    for g in range(g_first, g_last):
        s, d = si if si >= 0 else g * s_per + s_local, di if di >= 0 else g * d_per + d_local
        if n == 1:
            dst[d, at(d0)] = src[s, at(s0)]
        elif n == 2:
            dst[d, at(d0)] = src[s, at(s0)]
            dst[d, at(d0 + 1)] = src[s, at(s0 + 1)]
        else:
            for k in range(n):
                dst[d, at(d0 + k)] = src[s, at(s0 + k)]


def long_word_aligned(code: np.ndarray, lw_addressed: np.ndarray, wpl: int) -> np.ndarray:
    """Per instruction: whether every address an MV or XFER names is a whole long word (always so
    in a long-word-addressed memory), so that `execute_moves` may run it on long-word items."""
    ops = code[:, 0]
    aligned = np.ones(len(code), dtype=bool)
    for op, fields in ((Op.MV, ((isa.MV_SRC_MEM, isa.MV_SRC_ADDR), (isa.MV_DST_MEM, isa.MV_DST_ADDR))),
                       (Op.XFER, ((isa.X_UP_MEM, isa.X_UP_ADDR), (isa.X_LO_MEM, isa.X_LO_ADDR)))):
        rows = ops == op
        for mem_field, addr_field in fields:
            words = ~lw_addressed[code[:, mem_field].clip(0, len(lw_addressed) - 1)]
            aligned &= ~(rows & words & (code[:, addr_field] % wpl != 0))
    return aligned


def group_local(code: np.ndarray, mem_instances: np.ndarray, n_groups: int, wpl: int) -> tuple[np.ndarray, np.ndarray]:
    """Per instruction: whether it reads and writes only instances of the Group it runs for, so
    that threads may run a block of them each for its own Groups without meeting; and the words
    it moves. NOP and WAIT move nothing; an XFER stays under its upper instance, which lies in
    one Group; an MV is local when both its ends are the running Group's (ALL_GROUPS instance
    fields) and its scope is that Group."""
    ops = code[:, 0]
    mv, xfer = ops == Op.MV, ops == Op.XFER
    own = (code[:, isa.MV_SRC_INST] == ALL_GROUPS) & (code[:, isa.MV_DST_INST] == ALL_GROUPS)
    in_group = (code[:, isa.MV_MODE] == Mode.individual) | (code[:, isa.MV_SCOPE] == Scope.group)
    local = np.isin(ops, (Op.NOP, Op.WAIT)) | xfer | (mv & own & in_group)
    words = np.zeros(len(code), dtype=np.int64)
    words[mv] = code[mv, isa.MV_N] * wpl * np.where(own[mv], n_groups, 1)
    words[xfer] = code[xfer, isa.X_N] * wpl * mem_instances[code[xfer, isa.X_UP_MEM]]
    return local, words


def member_groups(row: np.ndarray, mems: list[np.ndarray], mem_instances: np.ndarray, lw_addressed: np.ndarray,
                  group: int, wpl: int) -> tuple[np.ndarray, np.ndarray, int]:
    """An XFER between every upper instance and its children in groups of `group` (mab_broadcast,
    reduce), as numpy views: the upper words [upper, words], the children's words
    [upper, group index, member, words of the member], and the long words of each member (the
    validator requires n to be a multiple of group)."""
    n, um, lm = int(row[isa.X_N]), int(row[isa.X_UP_MEM]), int(row[isa.X_LO_MEM])
    up, lo = mems[um], mems[lm]
    uw = word_addr(lw_addressed, um, int(row[isa.X_UP_ADDR]), wpl)
    lw = word_addr(lw_addressed, lm, int(row[isa.X_LO_ADDR]), wpl)
    n_up = int(mem_instances[um])
    fan = int(mem_instances[lm]) // n_up
    rounds = n // group
    children = lo[:n_up * fan].reshape(n_up, fan // group, group, -1)[..., lw:lw + wpl * rounds]
    return up[:, uw:uw + wpl * n], children, rounds


LW_ITEM = {1: np.uint32, 2: np.uint64}  # long words of one and two 32-bit words as single items


def mab_broadcast(row: np.ndarray, mems: list[np.ndarray], mem_instances: np.ndarray, lw_addressed: np.ndarray,
                  group: int, wpl: int) -> None:
    """XFER mab_broadcast: upper long word q goes to member q mod group, at q div group, of every
    group of children. Written into group 0 of every upper instance only: the caller records the
    range, and the other groups hold their copies as replicas (sim.replicas), written out when an
    instruction needs them."""
    upper, children, rounds = member_groups(row, mems, mem_instances, lw_addressed, group, wpl)
    lw = LW_ITEM.get(wpl)
    if lw is not None:  # a long word is one machine word: numpy deals them out in one strided copy
        members = upper.view(lw).reshape(upper.shape[0], rounds, group).transpose(0, 2, 1)  # [upper, member, round]
        children.view(lw)[:, :1] = members[:, None]
        return
    runs = np.empty((upper.shape[0], group, wpl * rounds), dtype=upper.dtype)
    _member_runs(upper, group, wpl, runs)
    children[:, :1] = runs[:, None]


@njit(cache=True)
def _member_runs(upper, group, wpl, out):
    """out[u, m] = the long words m, m + group, ... of upper instance u, side by side."""
    for u in range(out.shape[0]):
        for q in range(upper.shape[1] // wpl):
            m, start = q % group, wpl * (q // group)
            for w in range(wpl):
                out[u, m, at(start + w)] = upper[u, at(wpl * q + w)]


def transpose(row: np.ndarray, mems: list[np.ndarray], mem_instances: np.ndarray, lw_addressed: np.ndarray,
              group: int, wpl: int, elements_per_word: int) -> None:
    """XFER transpose: the upper long words are blocks of `side` rows of `group` long words
    (side = group x elements per long word); PE m of every group gets, at long word b*side + j,
    its elements of column j of block b. The same for every group of children (one on a MAB)."""
    n, um, lm = int(row[isa.X_N]), int(row[isa.X_UP_MEM]), int(row[isa.X_LO_MEM])
    item = np.uint32 if elements_per_word == 1 else np.uint16
    epl = wpl * elements_per_word
    uw = word_addr(lw_addressed, um, int(row[isa.X_UP_ADDR]), wpl) * elements_per_word
    lw = word_addr(lw_addressed, lm, int(row[isa.X_LO_ADDR]), wpl) * elements_per_word
    fan = int(mem_instances[lm] // mem_instances[um])
    _transposer(group * epl, epl)(mems[um].view(item), uw, n * epl, mems[lm].view(item), lw, fan, group)


@functools.cache
def _transposer(side: int, epl: int):
    """The transpose kernel for blocks `side` elements wide of `epl`-element long words, compiled
    with those sizes known: its loops are a few elements long, and unrolled they run 3x faster
    (1,024 MREGs' 64 long words on MN-Core 2: numpy's reshapes 0.24 ms, the general loop 0.10 ms,
    this 0.04 ms; an MNIST training step has 16). The closure holds only numbers, so numba's
    disk cache keeps it (sim.vector's loops do the same)."""

    def transpose_blocks(up, u0, n_items, lo, l0, fan, group):
        """lo[child, l0 + (b*side + j)*epl + lane] = element (member*epl + lane, j) of block b of
        its upper instance's items u0.. (blocks of side x side elements, row-major), for child =
        u*fan + g*group + member."""
        blocks = n_items // (side * side)
        for u in range(up.shape[0]):
            for child in range(u * fan, (u + 1) * fan):
                member = (child - u * fan) % group
                for b in range(blocks):
                    for lane in range(epl):
                        start = u0 + b * side * side + (member * epl + lane) * side
                        to = l0 + b * side * epl + lane
                        for j in range(side):
                            lo[child, at(to + j * epl)] = up[u, at(start + j)]

    transpose_blocks.__name__ = transpose_blocks.__qualname__ = f"transpose_blocks_{side}x{epl}"
    return njit(cache=True, nogil=True)(transpose_blocks)


def is_move(code: np.ndarray) -> np.ndarray:
    """Rows `execute_moves` runs: NOP, WAIT, and MV/XFER in every mode but reduce (and
    mab_broadcast and transpose, which `mab_broadcast` and `transpose` run)."""
    ops = code[:, 0]
    mv_red = (ops == Op.MV) & (code[:, isa.MV_MODE] == Mode.reduce)
    x_own = (ops == Op.XFER) & np.isin(code[:, isa.X_MODE], (Mode.reduce, Mode.mab_broadcast, Mode.transpose))
    return np.isin(ops, (Op.NOP, Op.WAIT, Op.MV, Op.XFER)) & ~mv_red & ~x_own

"""The functional engine: runs an instruction array on the memory arrays, so data really moves.

A program is cut into runs: consecutive data movements (NOP, WAIT, the copying MV and XFER
modes) run in one numba call (`moves.execute_moves`); every other instruction is dispatched from
here one at a time to the kernel of its kind: `vector.run_vop`, `reduce.mv_reduce` /
`reduce.xfer_reduce`, `moves.mab_broadcast`, `moves.transpose`, `mau.matmul`, or a caller's
handler (the machine runs HOST_DMA, whose host buffers it holds). What a mab_broadcast writes
stays replicated until something needs the copies (`sim.replicas`).

Why not one numba loop over everything: numba compiles a function together with everything it
may call, so a single executor compiled every kernel (about 40 s in a fresh checkout) before the
first result. Dispatched per kind, a program compiles the kernels it uses; the per-instruction
dispatch costs microseconds, against kernels that move whole memories.

A run of moves that stay inside their Groups (`moves.group_local`) and move enough words is
split between the host's threads by Group (`sim.hostpool`), as the Groups' Data Engines run
side by side on the chip. MN-Core 2's 4096 x 4096 add: its moves 55 -> 30 ms a call.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from . import isa
from .isa import Dir, DType, Mode, Op
from .fusion import fused_products
from .hostpool import run_shares
from .mau import matmul
from .moves import LW_ITEM, execute_moves, group_local, is_move, long_word_aligned, mab_broadcast, transpose
from .params import FMT_WPL, MachineParams
from .reduce import mv_reduce, xfer_reduce
from .replicas import Replicas, Touches, written_range
from .vector import run_vop

Handler = Callable[[np.ndarray], None]

# Words a run of Group-local moves moves from which threads split it by Group: below, waking
# the threads costs more than the copy (host policy, measured on 2 cores: an MNIST step's runs
# move a few thousand words, a 4096 x 4096 add's runs a million).
SHARED_WORDS = 1 << 18


def stepped_rows(code: np.ndarray) -> list[int]:
    """The instructions `execute` dispatches one at a time (everything but data movement)."""
    return np.flatnonzero(~is_move(code)).tolist()


def execute(p: MachineParams, memories: list[np.ndarray], code: np.ndarray, handlers: dict[Op, Handler],
            stepped: list[int] | None = None, derived: dict | None = None, replicas: Replicas | None = None) -> None:
    """Run `code` (validated) on `memories`; `handlers` run the ops this engine leaves to its caller
    (HOST_DMA, whose host buffers the machine holds). `stepped` is `stepped_rows(code)` and
    `derived` a dict of other tables of the code, when the caller keeps them between runs.
    `replicas` are those of `memories` the caller keeps between runs; without, the run leaves
    every word written out."""
    mems = tuple(memories)
    views = {}  # the memories as float32, half words, int32 and float64, made on first use

    def view(dtype: type) -> list[np.ndarray | None]:
        """The memories as `dtype` (a memory of an odd number of words has no float64 view)."""
        if dtype not in views:
            wide = max(1, np.dtype(dtype).itemsize // mems[0].itemsize)
            views[dtype] = [m.view(dtype) if m.shape[1] % wide == 0 else None for m in mems]
        return views[dtype]

    n_pe = int(p.mem_instances[p.pe_memories[0]])
    wpl = int(p.fmt[FMT_WPL])
    own = replicas is None
    replicas = Replicas(p, memories) if own else replicas
    derived = {} if derived is None else derived

    def shareable(start: int, end: int) -> bool:
        """Whether threads may split moves [start, end) by Group: all Group-local, and enough
        words to pay for the threads (host policy)."""
        key = ("group shares", p.hw.fingerprint)
        if key not in derived:
            local, words = group_local(code, p.mem_instances, p.n_groups, wpl)
            derived[key] = (np.concatenate([[0], np.cumsum(~local)]), np.concatenate([[0], np.cumsum(words)]))
        foreign, words = derived[key]
        return p.n_groups > 1 and foreign[end] == foreign[start] and words[end] - words[start] >= SHARED_WORDS

    def move_items(start: int, end: int) -> tuple[tuple, int]:
        """The memories moves [start, end) run on, and the words of each item: one item per long
        word when the chip's long word is one machine word and the moves' addresses allow."""
        key = ("misaligned moves", p.hw.fingerprint)
        if key not in derived:
            derived[key] = np.concatenate([[0], np.cumsum(~long_word_aligned(code, p.mem_lw_addressed, wpl))])
        wide = LW_ITEM.get(wpl)
        if wpl > 1 and wide is not None and derived[key][end] == derived[key][start]:
            items = view(wide)
            if all(m is not None for m in items):
                return tuple(items), wpl
        return mems, 1

    def touches() -> Touches:
        key = ("touches", p.hw.fingerprint)
        if key not in derived:
            derived[key] = Touches.of(p, code)
        return derived[key]

    plans = derived.setdefault(("vop plans", p.hw.fingerprint), {})
    key = ("fused products", p.hw.fingerprint)
    if key not in derived:
        derived[key] = fused_products(p, code)
    fused, skipped = derived[key]
    start = 0
    try:
        for i in [*(stepped_rows(code) if stepped is None else stepped), len(code)]:
            if i > start:
                replicas.touch(touches, start, i)
                _moves(p, code, start, i, *move_items(start, i), wpl, shareable(start, i))
            if i < len(code):
                row = code[i]
                op = Op(int(row[0]))
                if op == Op.MATMUL:
                    if i not in skipped:  # a later part of a product run whole at its first part (sim.fusion)
                        matmul(p, memories, fused.get(i, row), replicas)
                elif op == Op.XFER and row[isa.X_MODE] == Mode.mab_broadcast:
                    group = int(p.path_group[p.path_of[int(row[isa.X_UP_MEM]), int(row[isa.X_LO_MEM])]])
                    replicas.overwritten(written_range(p, row, group))  # first: a write cut short stays consistent
                    mab_broadcast(row, memories, p.mem_instances, p.mem_lw_addressed, group, wpl)
                else:
                    replicas.touch(touches, i, i + 1)
                    _dispatch(p, memories, row, op, handlers, view, n_pe, wpl, plans)
            start = i + 1
    finally:
        if own:
            replicas.materialize_all()


def _moves(p: MachineParams, code: np.ndarray, start: int, end: int, mems: tuple, item_words: int, wpl: int,
           shared: bool) -> None:
    """Moves [start, end) on `mems`, arrays of `item_words`-word items: on the calling thread, or
    each host thread for its own Groups."""
    def groups(first: int, last: int) -> None:
        execute_moves(code, start, end, mems, p.mem_instances, p.mem_lw_addressed, p.n_groups, p.path_of,
                      p.path_group, p.mode_chunk, wpl, item_words, first, last)
    if shared:
        run_shares(groups, p.n_groups)
    else:
        groups(0, p.n_groups)


def _dispatch(p: MachineParams, memories: list[np.ndarray], row: np.ndarray, op: Op, handlers: dict[Op, Handler],
              view: Callable[[type], list[np.ndarray]], n_pe: int, wpl: int, plans: dict) -> None:
    """Run one instruction that neither moves nor knows of replicas (`plans`: the VOPs', kept
    between runs of the code)."""
    if op == Op.VOP:
        run_vop(row, view(np.float32), view(np.uint16), view(np.int32), lambda: view(np.float64), n_pe, p.fmt, plans)
    elif op == Op.MV:
        mv_reduce(row, memories, p.mem_instances, p.mem_lw_addressed, p.n_groups, p.fmt)
    elif op == Op.XFER:
        lower, upper = int(row[isa.X_LO_MEM]), int(row[isa.X_UP_MEM])
        path = p.path_of[lower, upper] if row[isa.X_DIR] == Dir.up else p.path_of[upper, lower]
        if row[isa.X_MODE] == Mode.transpose:
            transpose(row, memories, p.mem_instances, p.mem_lw_addressed, int(p.path_group[path]), wpl,
                      p.elements_per_word(DType(int(row[isa.X_DTYPE]))))
        else:
            xfer_reduce(row, memories, p.mem_instances, p.mem_lw_addressed, int(p.path_group[path]), p.fmt)
    else:
        handlers[op](row)

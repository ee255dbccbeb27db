"""The functional engine: runs an instruction array on the memory arrays, so data really moves.

A program is cut into runs: consecutive data movements (NOP, WAIT, the copying MV and XFER
modes) run in one numba call (`moves.execute_moves`); every other instruction is dispatched from
here one at a time to the kernel of its kind: `vector.run_vop`, `reduce.mv_reduce` /
`reduce.xfer_reduce`, `moves.mab_broadcast`, `moves.transpose`, or a caller's handler (the machine runs MATMUL and HOST_DMA with numpy).

Why not one numba loop over everything: numba compiles a function together with everything it
may call, so a single executor compiled every kernel (about 40 s in a fresh checkout) before the
first result. Dispatched per kind, a program compiles the kernels it uses; the per-instruction
dispatch costs microseconds, against kernels that move whole memories.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from . import isa
from .isa import Dir, DType, Mode, Op
from .moves import execute_moves, is_move, mab_broadcast, transpose
from .params import FMT_WPL, MachineParams
from .reduce import mv_reduce, xfer_reduce
from .vector import run_vop

Handler = Callable[[np.ndarray], None]


def stepped_rows(code: np.ndarray) -> list[int]:
    """The instructions `execute` dispatches one at a time (everything but data movement)."""
    return np.flatnonzero(~is_move(code)).tolist()


def execute(p: MachineParams, memories: list[np.ndarray], code: np.ndarray, handlers: dict[Op, Handler],
            stepped: list[int] | None = None) -> None:
    """Run `code` (validated) on `memories`; `handlers` run the ops this engine leaves to its caller.
    `stepped` is `stepped_rows(code)`, when the caller keeps it from an earlier run."""
    mems = tuple(memories)
    views = {}  # the memories as float32, half words and int32, made on first use

    def view(dtype: type) -> list[np.ndarray]:
        if dtype not in views:
            views[dtype] = [m.view(dtype) for m in mems]
        return views[dtype]

    n_pe = int(p.mem_instances[p.pe_memories[0]])
    wpl = int(p.fmt[FMT_WPL])
    start = 0
    for i in [*(stepped_rows(code) if stepped is None else stepped), len(code)]:
        if i > start:
            execute_moves(code, start, i, mems, p.mem_instances, p.mem_lw_addressed, p.n_groups, p.path_of,
                          p.path_group, p.mode_chunk, wpl)
        if i < len(code):
            row = code[i]
            op = Op(int(row[0]))
            if op == Op.VOP:
                run_vop(row, view(np.float32), view(np.uint16), view(np.int32), n_pe, p.fmt)
            elif op == Op.MV:
                mv_reduce(row, memories, p.mem_instances, p.mem_lw_addressed, p.n_groups, p.fmt)
            elif op == Op.XFER:
                lower, upper = int(row[isa.X_LO_MEM]), int(row[isa.X_UP_MEM])
                path = p.path_of[lower, upper] if row[isa.X_DIR] == Dir.up else p.path_of[upper, lower]
                if row[isa.X_MODE] == Mode.mab_broadcast:
                    mab_broadcast(row, memories, p.mem_instances, p.mem_lw_addressed, int(p.path_group[path]), wpl)
                elif row[isa.X_MODE] == Mode.transpose:
                    transpose(row, memories, p.mem_instances, p.mem_lw_addressed, int(p.path_group[path]), wpl,
                              p.elements_per_word(DType(int(row[isa.X_DTYPE]))))
                else:
                    xfer_reduce(row, memories, p.mem_instances, p.mem_lw_addressed, int(p.path_group[path]), p.fmt)
            else:
                handlers[op](row)
        start = i + 1

"""Instructions in words, for error messages, traces and `mnsim` listings."""

from __future__ import annotations

import numpy as np

from . import isa
from .isa import ALL_GROUPS, IMM, DType, Dir, Mode, Op, Red, Scope, VOp, arity
from .params import MachineParams


def disassemble(row: np.ndarray, params: MachineParams) -> str:
    """One instruction in words, e.g. `MV distribute DRAM[each]+0 -> L2BM[each.0]+0 n=256 tag=1`."""
    op = Op(int(row[0]))
    mem = lambda i: params.memory_names[i] if 0 <= i < len(params.memory_names) else ("imm" if i == IMM else f"mem{i}")  # noqa: E731
    if op == Op.NOP:
        return f"NOP steps={row[isa.NOP_STEPS]}"
    if op == Op.WAIT:
        return f"WAIT tag={row[isa.WAIT_TAG]}"
    if op == Op.MV:
        def at(m, inst, local, addr):
            where = f"each.{local}" if inst == ALL_GROUPS else str(inst)
            return f"{mem(m)}[{where}]+{addr}"
        text = (f"MV {_name(Mode, row[isa.MV_MODE])} {at(row[isa.MV_SRC_MEM], row[isa.MV_SRC_INST], row[isa.MV_SRC_LOCAL], row[isa.MV_SRC_ADDR])}"
                f" -> {at(row[isa.MV_DST_MEM], row[isa.MV_DST_INST], row[isa.MV_DST_LOCAL], row[isa.MV_DST_ADDR])}"
                f" n={row[isa.MV_N]} tag={row[isa.MV_TAG]} scope={_name(Scope, row[isa.MV_SCOPE])}")
        return text + (f" {_name(Red, row[isa.MV_RED])}" if row[isa.MV_RED] else "")
    if op == Op.HOST_DMA:
        way = "host -> PDM" if row[isa.DMA_DIR] == 0 else "PDM -> host"
        return (f"HOST_DMA {way} pdm+{row[isa.DMA_PDM_ADDR]} buf{row[isa.DMA_HOST_BUF]}+{row[isa.DMA_HOST_OFF]} "
                f"n={row[isa.DMA_N]} tag={row[isa.DMA_TAG]}")
    if op == Op.XFER:
        return (f"XFER {_name(Mode, row[isa.X_MODE])} {_name(Dir, row[isa.X_DIR])} {mem(row[isa.X_UP_MEM])}+{row[isa.X_UP_ADDR]}"
                f" / {mem(row[isa.X_LO_MEM])}+{row[isa.X_LO_ADDR]} n={row[isa.X_N]}"
                + (f" {_name(Red, row[isa.X_RED])}" if row[isa.X_RED] else "")
                + (f" index={row[isa.X_INDEX]}" if row[isa.X_MODE] == Mode.individual and row[isa.X_DIR] == Dir.up else "")
                + (f" set={row[isa.X_INDEX]:#b}" if row[isa.X_MODE] == Mode.broadcast and row[isa.X_INDEX] else ""))
    if op == Op.VOP:
        ops = []
        for base in (isa.V_DST, isa.V_A, isa.V_B, isa.V_C):
            m = row[base]
            ops.append("imm" if m == IMM else f"{mem(m)}[{row[base + 1]}:{row[base + 2]},{row[base + 3]}]")
        return (f"VOP {_vop_name(row[isa.V_OP])}.{_name(DType, row[isa.V_DTYPE])} {row[isa.V_N_OUTER]}x{row[isa.V_N_INNER]} "
                + " ".join(ops[: 1 + arity(VOp(int(row[isa.V_OP])))]))
    if op == Op.MATMUL:
        return (f"MATMUL.{_name(DType, row[isa.MM_DTYPE])} M={row[isa.MM_M]} K={row[isa.MM_K]} N={row[isa.MM_N]} "
                f"A={mem(row[isa.MM_A_MEM])}+{row[isa.MM_A_ADDR]} B={mem(row[isa.MM_B_MEM])}+{row[isa.MM_B_ADDR]} "
                f"C={mem(row[isa.MM_C_MEM])}+{row[isa.MM_C_ADDR]} flags={row[isa.MM_FLAGS]}")
    return f"op {int(row[0])}"


def _vop_name(value: int) -> str:
    """A VOP's op as programs spell it (`and`, not the enum's `and_`)."""
    try:
        return isa.OP_NAME[VOp(int(value))]
    except ValueError:
        return f"?{int(value)}"


def _name(enum, value: int) -> str:
    try:
        return enum(int(value)).name
    except ValueError:
        return f"?{int(value)}"

"""The issue model's rules: which PE-stream instructions may issue together (sim.isa, "the issue
model"), checked by `sim.validate` before anything runs.

A bundle is a VOP, XFER or MATMUL followed by the ones flagged `isa.F_WITH_PREVIOUS`. The SDM's
constraints on one VLIW word, as they apply to whole macro-instructions:

* at most one expression per VLIW group: the members' slots (from the YAML) differ, and every
  member has one (a unit or path without a `slot` issues alone);
* no two writers to one operand, and multiple readers of one memory use one address pattern: here
  each memory is read by at most one member and written by at most one;
* at most 2 of the MAU's three groups (calc, mwrite, mread): a MATMUL holds calc and mwrite, so
  no XFER to or from the matrix registers (the memory at the MAU's level) issues with it;
* a memory of several faces (`memories.<m>.faces`: the matrix registers' two) gives each face to
  one member;
* a memory with one read/write port (`ports: 1RW`, the LMs) is not read by one member while
  another writes it; with separate ports (1R1W) it may be, at ranges that do not meet, since the
  members must not depend on each other (their order inside the bundle is not defined).
"""

from __future__ import annotations

import numpy as np

from . import isa
from .accesses import FIRST, LAST, MEM, accesses
from .disasm import disassemble
from .errors import SimError
from .isa import Dir, Op
from .params import MachineParams

PE_OPS = (Op.VOP, Op.XFER, Op.MATMUL)


def bundle_heads(code: np.ndarray) -> np.ndarray:
    """For each instruction, the index of the first instruction of its bundle (itself if alone)."""
    flagged = (code[:, isa.F_WITH_PREVIOUS] != 0) & np.isin(code[:, 0], PE_OPS)
    return np.maximum.accumulate(np.where(flagged, 0, np.arange(len(code))))


def slot_of(p: MachineParams, row: np.ndarray) -> int:
    op = Op(int(row[0]))
    if op == Op.VOP:
        return int(p.vop_slot[row[isa.V_OP], row[isa.V_DTYPE]])
    if op == Op.MATMUL:
        return int(p.mm_slot)
    um, lm = int(row[isa.X_UP_MEM]), int(row[isa.X_LO_MEM])
    path = p.path_of[um, lm] if row[isa.X_DIR] == Dir.down else p.path_of[lm, um]
    return int(p.path_slot[path])


def check(p: MachineParams, code: np.ndarray) -> None:
    """Raise SimError at the first bundle member that cannot issue with the others."""
    flagged = np.flatnonzero(code[:, isa.F_WITH_PREVIOUS] != 0)
    if len(flagged) == 0:
        return

    def fail(i: int, message: str) -> SimError:
        return SimError(message, index=i, instruction=disassemble(code[i], p))

    heads = bundle_heads(code)
    for i in flagged:
        i = int(i)
        if code[i, 0] not in PE_OPS:
            raise fail(i, f"only VOP, XFER and MATMUL issue with the previous instruction, not {Op(int(code[i, 0])).name}")
        if i == 0 or code[i - 1, 0] not in PE_OPS:
            raise fail(i, "it issues with the previous instruction, which is not a VOP, XFER or MATMUL")
    # bundles are contiguous: each runs from its head to the last flagged row with that head
    firsts, lasts = heads[flagged], flagged
    ends = np.r_[firsts[1:] != firsts[:-1], True]
    bundles = [np.arange(h, e + 1) for h, e in zip(firsts[ends].tolist(), lasts[ends].tolist())]
    members = np.concatenate(bundles)
    writes_all, reads_all = accesses(p, code[members])  # once for every bundle, in `members` order
    offset = 0
    for rows in bundles:
        head = int(rows[0])
        writes, reads = writes_all[offset: offset + len(rows)], reads_all[offset: offset + len(rows)]
        offset += len(rows)
        slots: dict[int, int] = {}
        for i in rows.tolist():
            slot = slot_of(p, code[i])
            if slot < 0:
                raise fail(i, "its unit or path names no VLIW slot (units.<u>.slot, transfers.<t>.slot), so it "
                              f"issues alone, not with instruction #{head}")
            if slot in slots:
                raise fail(i, f"it issues with instruction #{slots[slot]} in the same VLIW slot "
                              f"{p.slot_names[slot]}; a slot holds one instruction per step")
            slots[slot] = i
        _check_mau_groups(p, code, rows.tolist(), fail)
        _check_faces(p, rows.tolist(), writes, reads, fail)
        readers: dict[int, tuple[int, int, int]] = {}
        writers: dict[int, tuple[int, int, int]] = {}
        for k, i in enumerate(rows.tolist()):
            w = writes[k]
            for r in reads[k]:
                if r[MEM] >= 0 and readers.setdefault(int(r[MEM]), (i, int(r[FIRST]), int(r[LAST])))[0] != i:
                    other = readers[int(r[MEM])][0]
                    raise fail(i, f"it reads {p.memory_names[r[MEM]]}, which instruction #{other} of its bundle reads "
                                  f"too; one instruction word reads a memory with one address pattern")
            if w[MEM] >= 0:
                if int(w[MEM]) in writers:
                    raise fail(i, f"it writes {p.memory_names[w[MEM]]}, which instruction #{writers[int(w[MEM])][0]} "
                                  f"of its bundle writes too")
                writers[int(w[MEM])] = (i, int(w[FIRST]), int(w[LAST]))
        for mem, (wi, wlo, whi) in writers.items():
            if mem not in readers or readers[mem][0] == wi:
                continue
            ri, rlo, rhi = readers[mem]
            name = p.memory_names[mem]
            if p.hw.memories[name].ports == "1RW":
                raise fail(max(ri, wi), f"instructions #{wi} and #{ri} of one bundle write and read {name}, whose "
                                        f"one port (memories.{name}.ports: 1RW) serves one of them per cycle")
            if wlo <= rhi and rlo <= whi:
                raise fail(max(ri, wi), f"instruction #{ri} reads {name} {rlo}..{rhi}, which instruction #{wi} of "
                                        f"its bundle writes: members must not depend on each other")


def _check_mau_groups(p: MachineParams, code: np.ndarray, rows: list[int], fail) -> None:
    """A MATMUL (mau-calc and mau-mwrite) leaves no third MAU group for a matrix-register XFER."""
    matmul = next((i for i in rows if code[i, 0] == Op.MATMUL), None)
    if matmul is None:
        return
    for i in rows:
        if code[i, 0] == Op.XFER and p.mem_level[int(code[i, isa.X_UP_MEM])] == p.mab_level:
            raise fail(max(i, matmul), f"instruction #{i} moves the matrix registers "
                                       f"({p.memory_names[int(code[i, isa.X_UP_MEM])]}) while MATMUL #{matmul} holds "
                                       f"the MAU's calc and mwrite groups; one step issues at most 2 of its 3 groups")


def _check_faces(p: MachineParams, rows: list[int], writes: np.ndarray, reads: np.ndarray, fail) -> None:
    """Each face of a memory with several (the SDM: a given matrix-register face at most once per
    step) is touched by one member of the bundle."""
    owner: dict[tuple[int, int], int] = {}
    for k, i in enumerate(rows):
        for access in (writes[k], *reads[k]):
            mem = int(access[MEM])
            if mem < 0:
                continue
            faces = p.hw.memories[p.memory_names[mem]].faces
            if faces == 1:
                continue
            per_face = int(p.mem_words[mem]) // (p.words_per_lw if p.mem_lw_addressed[mem] else 1) // faces
            for face in range(int(access[FIRST]) // per_face, int(access[LAST]) // per_face + 1):
                other = owner.setdefault((mem, face), i)
                if other != i:
                    raise fail(i, f"instructions #{other} and #{i} of one bundle use face {face} of "
                                  f"{p.memory_names[mem]} (memories.{p.memory_names[mem]}.faces: {faces}); a face "
                                  f"serves one instruction per step")

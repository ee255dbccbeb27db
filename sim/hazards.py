"""Hazards: the gaps, in PE-stream steps, that a program must leave between dependent operations.

MN-Core 2 has no interlocks (SDM 3.6): a PE instruction that reads what an earlier one wrote
before the write has landed reads stale data, so the software leaves gaps (nops). The YAML's
`hazards` table gives each gap; this module says which pairs of instructions each one separates,
finds the violations of a program (`check`, called by `sim.validate`) and the nops that remove
them (`schedule`, used by `ProgramBuilder.build`, so the compiler honours what the validator
enforces: one analysis, two uses).

Which pairs each YAML key separates (W writes, R reads; "overlapping" = the address ranges meet):

* `lm_write_to_read`: W writes LM0 (or LM1), R reads the same LM, at any address (SDM: a port
  conflict, independent of the address).
* `grf_write_to_read`: W writes GRF0 (or GRF1), R reads an overlapping range of it.
* `alu_result_to_use`: W is a VOP on the ALU, R reads an overlapping range of its destination.
* `l2bm_to_l1bm_read`: W is an XFER from L2BM into L1BM, R an XFER reading an overlapping range.
* `l1bm_write_to_l2bm_read`: W an XFER from the PEs into L1BM, R an XFER from L1BM up to L2BM.
* `l1bm_reduce_to_read`: W a reducing XFER from the PEs into L1BM, R an XFER from L1BM back to
  the PEs.
* `l2bm_write_to_mv_read`: W an XFER from L1BM into L2BM, R an MV reading L2BM.

Distance is counted statically: the steps of the PE-stream instructions (NOPs included) between
the end of W and the start of R. MV, HOST_DMA and WAIT take no step (a WAIT's stall depends on
the run, and a program's correctness must not). When several rules apply to a pair, the largest
gap holds. A key absent from the YAML asks for no gap. A bundle (the issue model of sim.isa)
counts as one issue: its members start together, and the nops go before it.

Known deviation: inside one macro-instruction the gaps are not modelled. On the hardware a
multi-step VOP that writes an LM it also reads would need gaps between its own steps; mnsim
times it at full rate.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from . import isa
from .accesses import FIRST, LAST, MAX_READS, MEM, ON_ALU, PATH, REDUCES, accesses
from .disasm import disassemble
from .errors import SimError
from .issue import bundle_heads
from .isa import Dir, Op
from .params import MachineParams
from .timing import time_code

# The rules: key -> (written memories, how the pair is matched); see the module docstring.
LM_RULE = ("lm_write_to_read", ("LM0", "LM1"))
GRF_RULE = ("grf_write_to_read", ("GRF0", "GRF1"))
ALU_RULE = "alu_result_to_use"
# (key, writer path, writer must reduce, reader paths): reader "mv:<memory>" is every Data Engine
# path reading that memory.
PATH_RULES = (
    ("l2bm_to_l1bm_read", "l2bm_to_l1bm", False, ("l1bm_to_pe", "l1bm_to_l2bm")),
    ("l1bm_write_to_l2bm_read", "pe_to_l1bm", False, ("l1bm_to_l2bm",)),
    ("l1bm_reduce_to_read", "pe_to_l1bm", True, ("l1bm_to_pe",)),
    ("l2bm_write_to_mv_read", "l1bm_to_l2bm", False, ("mv:L2BM",)),
)
KEYS = (LM_RULE[0], GRF_RULE[0], ALU_RULE, *(r[0] for r in PATH_RULES))
NO_HAZARD = -1


@dataclass(frozen=True, eq=False)
class HazardTables:
    """The YAML gaps as arrays the kernel indexes; the rule ids index `KEYS`."""

    any_address: np.ndarray  # [memories] gap between a write and any read of the memory
    any_address_rule: np.ndarray
    overlap: np.ndarray  # [memories] gap between a write and a read of an overlapping range
    overlap_rule: np.ndarray
    alu_gap: int
    path_gap: np.ndarray  # [writer path, writer reduces (0/1), reader path]
    path_rule: np.ndarray
    alu_rule: int
    horizon: int  # the largest gap: writes older than this many steps cannot matter


@lru_cache(maxsize=None)  # one per chip in use
def tables(p: MachineParams) -> HazardTables:
    hz = p.hw.hazards
    n_mem, n_paths = len(p.memory_names), len(p.path_names)
    any_address = np.zeros(n_mem, dtype=np.int64)
    any_rule = np.full(n_mem, NO_HAZARD, dtype=np.int64)
    overlap = np.zeros(n_mem, dtype=np.int64)
    overlap_rule = np.full(n_mem, NO_HAZARD, dtype=np.int64)
    for (key, mems), gaps, rule in ((LM_RULE, any_address, any_rule), (GRF_RULE, overlap, overlap_rule)):
        for m in mems:
            if key in hz and m in p.memory_names:
                gaps[p.memory_id(m)], rule[p.memory_id(m)] = hz[key], KEYS.index(key)
    path_gap = np.zeros((n_paths, 2, n_paths), dtype=np.int64)
    path_rule = np.full((n_paths, 2, n_paths), NO_HAZARD, dtype=np.int64)
    for key, writer, reduces, readers in PATH_RULES:
        if key not in hz or writer not in p.path_names:
            continue
        w = p.path_names.index(writer)
        for r in _reader_paths(p, readers):
            for red in ((1,) if reduces else (0, 1)):
                if hz[key] > path_gap[w, red, r]:
                    path_gap[w, red, r], path_rule[w, red, r] = hz[key], KEYS.index(key)
    horizon = max((v for k, v in hz.items() if k in KEYS), default=0)
    return HazardTables(any_address, any_rule, overlap, overlap_rule, int(hz.get(ALU_RULE, 0)), path_gap,
                        path_rule, KEYS.index(ALU_RULE), horizon)


def _reader_paths(p: MachineParams, readers: tuple[str, ...]) -> list[int]:
    out = []
    for r in readers:
        if r.startswith("mv:"):
            mem = r[3:]
            out += [k for k, (name, t) in enumerate(p.hw.transfers.items())
                    if t.engine == "data_engine" and mem in t.src]
        elif r in p.path_names:
            out.append(p.path_names.index(r))
    return out


@dataclass(frozen=True)
class Shortfalls:
    """Every (reader, writer) pair that is closer than its rule allows, in program order of the
    readers: `short` steps are missing at distance `distance`."""

    reader: np.ndarray
    writer: np.ndarray
    rule: np.ndarray
    distance: np.ndarray
    short: np.ndarray
    reader_head: np.ndarray  # the first instruction of each reader's bundle (where nops can go)


def shortfalls(p: MachineParams, code: np.ndarray, rows: np.ndarray | None = None) -> Shortfalls:
    """The pairs of a (field-validated) program whose gap is short. Only the `involved` rows take
    part (pass them if known); the analysis runs on them alone, since the rest take no step."""
    t = tables(p)
    empty = np.zeros(0, dtype=np.int64)
    if t.horizon == 0 or len(code) == 0:
        return Shortfalls(empty, empty, empty, empty, empty, empty)
    rows = involved(code) if rows is None else rows
    sub = code[rows]  # below, indices are positions in `rows` until the end
    writes, reads = accesses(p, sub)
    steps = pe_steps(p, sub)
    heads = bundle_heads(sub)
    length = np.zeros(len(sub), dtype=np.int64)  # a bundle holds the stream for its longest member
    np.maximum.at(length, heads, steps)
    start = (np.cumsum(length) - length)[heads]  # members start with their bundle
    end = start + steps  # and each one's writes land after its own steps
    writers = np.flatnonzero(writes[:, MEM] >= 0)
    written = np.isin(reads[:, :, MEM], np.unique(writes[writers, MEM]))
    readers = np.flatnonzero(written.any(1))
    if len(writers) == 0 or len(readers) == 0:
        return Shortfalls(empty, empty, empty, empty, empty, empty)
    before = np.searchsorted(writers, readers)  # writers strictly before each reader
    # every bundle takes at least one step and holds at most one writer per slot, so only the
    # last `horizon` bundles' writers can be in reach
    k = np.arange(1, t.horizon * max(1, len(p.slot_names)) + 1)
    cand = before[:, None] - k[None, :]
    ok = cand >= 0
    w = writers[np.where(ok, cand, 0)]
    dist = start[readers][:, None] - end[w]
    ok &= (dist < t.horizon) & (heads[w] != heads[readers][:, None])  # a bundle's members are independent
    pair_r, pair_k = np.nonzero(ok)
    if len(pair_r) == 0:
        return Shortfalls(empty, empty, empty, empty, empty, empty)
    r_i, w_i, d = readers[pair_r], w[pair_r, pair_k], dist[pair_r, pair_k]
    wr = writes[w_i]
    gap = np.zeros((len(r_i), MAX_READS), dtype=np.int64)
    rule = np.full((len(r_i), MAX_READS), NO_HAZARD, dtype=np.int64)
    for j in range(MAX_READS):
        rd = reads[r_i, j]
        same = rd[:, MEM] == wr[:, MEM]
        meets = same & (wr[:, FIRST] <= rd[:, LAST]) & (rd[:, FIRST] <= wr[:, LAST])
        mem = np.where(same, rd[:, MEM], 0)
        path_ok = meets & (wr[:, PATH] >= 0) & (rd[:, PATH] >= 0)
        wp, red, rp = np.where(path_ok, wr[:, PATH], 0), np.where(path_ok, wr[:, REDUCES], 0), np.where(path_ok, rd[:, PATH], 0)
        for g, r in ((np.where(same, t.any_address[mem], 0), t.any_address_rule[mem]),
                     (np.where(meets, t.overlap[mem], 0), t.overlap_rule[mem]),
                     (np.where(meets & (wr[:, ON_ALU] == 1), t.alu_gap, 0), np.full(len(r_i), t.alu_rule)),
                     (np.where(path_ok, t.path_gap[wp, red, rp], 0), t.path_rule[wp, red, rp])):
            better = g > gap[:, j]
            gap[:, j], rule[:, j] = np.where(better, g, gap[:, j]), np.where(better, r, rule[:, j])
    j = gap.argmax(1)
    short = gap[np.arange(len(j)), j] - d
    bad = short > 0
    return Shortfalls(rows[r_i[bad]], rows[w_i[bad]], rule[np.arange(len(j)), j][bad], d[bad], short[bad],
                      rows[heads[r_i[bad]]])


def involved(code: np.ndarray) -> np.ndarray:
    """The rows a rule can concern: the PE-stream instructions (NOPs included, for their steps),
    and the MVs reading a memory an XFER writes upward (most MVs of a gather read DRAM, which
    nothing in the stream writes)."""
    op = code[:, 0]
    stream = np.isin(op, (Op.NOP, Op.VOP, Op.XFER, Op.MATMUL))
    up = (op == Op.XFER) & (code[:, isa.X_DIR] == Dir.up)
    return np.flatnonzero(stream | ((op == Op.MV) & np.isin(code[:, isa.MV_SRC_MEM], code[up, isa.X_UP_MEM])))


def pe_steps(p: MachineParams, code: np.ndarray) -> np.ndarray:
    """Steps each instruction occupies the PE stream on its own (the timing model's rule, applied
    to the PE-stream instructions alone: their steps depend on nothing else); 0 for the rest."""
    stream = np.flatnonzero(np.isin(code[:, 0], (Op.NOP, Op.VOP, Op.XFER, Op.MATMUL)))
    steps = np.zeros(len(code), dtype=np.int64)
    if len(stream):
        alone = code[stream].copy()
        alone[:, isa.F_WITH_PREVIOUS] = 0  # each one's own steps, not its bundle's
        stats = time_code(p, alone)
        steps[stream] = (stats.end - stats.start) // p.step_cycles
    return steps


def check(p: MachineParams, code: np.ndarray) -> None:
    """Raise SimError at the first instruction that reads too soon after a write it depends on."""
    found = shortfalls(p, code)
    if len(found.reader) == 0:
        return
    i, w, key = int(found.reader[0]), int(found.writer[0]), KEYS[int(found.rule[0])]
    d, short = int(found.distance[0]), int(found.short[0])
    raise SimError(f"hazard {key}: it reads {d} step(s) after instruction #{w} ({disassemble(code[w], p)}) "
                   f"wrote what it reads; {p.hw.name} needs {d + short} (hazards.{key}); insert NOP "
                   f"steps={short} before it", index=i, instruction=disassemble(code[i], p))


def schedule(p: MachineParams, code: np.ndarray, rows: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The program with the fewest nops inserted that clears every hazard (before a bundle, never
    inside one), and `moved`: where each
    original position went (`moved[i]` is the new position of the nop or instruction that now
    opens instruction i's place, `moved[n]` the new length), so labels and relocations follow.

    A nop inserted before a reader also lengthens every later pair that spans it, so the
    shortfalls are settled in program order, each less the nops already inserted between its
    writer and its reader."""
    found = shortfalls(p, code, rows)
    inserted: dict[int, int] = {}
    at: list[int] = []  # readers given nops (a bundle's first member for the others), ascending
    total: list[int] = [0]  # total[k]: the nops of at[:k]
    for i, w, short in zip(found.reader_head.tolist(), found.writer.tolist(), found.short.tolist()):
        covered = total[-1] - total[bisect.bisect_right(at, w)]  # nops after the writer, up to the reader
        more = short - covered
        if more <= 0:
            continue
        if i not in inserted:
            at.append(i)
            total.append(total[-1])
        inserted[i] = inserted.get(i, 0) + more
        total[-1] += more
    n = len(code)
    opens = np.zeros(n, dtype=np.int64)
    opens[at] = 1
    moved = np.arange(n + 1) + np.concatenate([[0], np.cumsum(opens)])  # + the nops before position i
    if not at:
        return code, moved
    out = np.zeros((n + len(at), code.shape[1]), dtype=np.int64)
    out[np.arange(n) + np.cumsum(opens)] = code  # each row after the nops inserted up to it
    nop_rows = moved[at]
    out[nop_rows, 0], out[nop_rows, isa.NOP_STEPS] = Op.NOP, [inserted[i] for i in at]
    return out, moved

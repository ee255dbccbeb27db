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
gap holds. A key absent from the YAML asks for no gap. A macro-instruction is checked against
the others, not against itself: its steps are the hardware's unrolled loop, whose order the
instruction's own semantics already fix.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from . import isa
from .disasm import disassemble
from .errors import SimError
from .isa import IMM, DType, Dir, Mode, Op, VOp
from .params import DTYPE_FORMAT, MachineParams
from .timing import UNIT_PE, time_code

# The rules: key -> (written memories, how the pair is matched); see the module docstring.
LM_RULE = ("lm_write_to_read", ("LM0", "LM1"))
GRF_RULE = ("grf_write_to_read", ("GRF0", "GRF1"))
ALU_RULE = "alu_result_to_use"
ALU_UNIT = "ALU"
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
# Columns of the access tables of `_accesses`: a read is (memory, first, last, path); a write also
# says whether it reduces and whether the ALU produced it. At most MAX_READS operands are read.
MEM, FIRST, LAST, PATH, REDUCES, ON_ALU = range(6)
READ_FIELDS, WRITE_FIELDS, MAX_READS = PATH + 1, ON_ALU + 1, 3


@dataclass(frozen=True, eq=False)
class HazardTables:
    """The YAML gaps as arrays the kernel indexes; the rule ids index `KEYS`."""

    any_address: np.ndarray  # [memories] gap between a write and any read of the memory
    any_address_rule: np.ndarray
    overlap: np.ndarray  # [memories] gap between a write and a read of an overlapping range
    overlap_rule: np.ndarray
    alu_gap: int
    vop_alu: np.ndarray  # [VOp, DType] the op runs on the ALU
    vop_arity: np.ndarray  # [VOp] operands read
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
    vop_alu = np.zeros((len(isa.VOp), len(isa.DType)), dtype=np.bool_)
    for op in isa.VOp:
        entry = p.hw.pe_ops.get(isa.COST_NAME[op])
        for dt in isa.DType:
            vop_alu[op, dt] = entry is not None and entry.cost(DTYPE_FORMAT[dt]).unit == ALU_UNIT
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
    arity = np.array([isa.arity(op) for op in isa.VOp], dtype=np.int64)
    return HazardTables(any_address, any_rule, overlap, overlap_rule, int(hz.get(ALU_RULE, 0)), vop_alu, arity, path_gap,
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


def _accesses(p: MachineParams, t: HazardTables, code: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """What each instruction writes and reads: writes [n, 6] = (memory, first, last, path, reduces,
    on the ALU) and reads [n, 3, 4] = (memory, first, last, path), memory -1 where none. Ranges are
    in the memory's own address units (words or long words), bounding boxes of strided operands."""
    n = len(code)
    op = code[:, 0]
    writes = np.full((n, WRITE_FIELDS), -1, dtype=np.int64)
    reads = np.full((n, MAX_READS, READ_FIELDS), -1, dtype=np.int64)
    half = DType.float16
    per_word = p.elements_per_word(half)

    def words(first, last, dtype):
        halves = dtype == half
        return np.where(halves, first // per_word, first), np.where(halves, last // per_word, last)

    rows = np.flatnonzero(op == Op.VOP)
    if len(rows):
        c = code[rows]
        vop, dt, no, ni = c[:, isa.V_OP], c[:, isa.V_DTYPE], c[:, isa.V_N_OUTER], c[:, isa.V_N_INNER]
        arity = t.vop_arity[vop]
        for k, base in enumerate((isa.V_DST, isa.V_A, isa.V_B, isa.V_C)):
            mem = c[:, base]
            used = (mem != IMM) & (k <= arity)
            d = np.where((k == 1) & (vop == VOp.cvt), c[:, isa.V_SRC_DTYPE], dt)
            first = c[:, base + 1]
            lo, hi = words(first, first + (no - 1) * c[:, base + 2] + (ni - 1) * c[:, base + 3], d)
            where = rows[used]
            if k == 0:
                writes[where, :PATH] = np.stack([mem, lo, hi], 1)[used]
                writes[where, REDUCES], writes[where, ON_ALU] = 0, t.vop_alu[vop, dt][used]
            else:
                reads[where, k - 1, :PATH] = np.stack([mem, lo, hi], 1)[used]
    rows = np.flatnonzero(op == Op.XFER)
    if len(rows):
        c = code[rows]
        mode, n_lw, um, lm = c[:, isa.X_MODE], c[:, isa.X_N], c[:, isa.X_UP_MEM], c[:, isa.X_LO_MEM]
        down = c[:, isa.X_DIR] == Dir.down
        path = np.where(down, p.path_of[um, lm], p.path_of[lm, um])
        fan = p.mem_instances[lm] // p.mem_instances[um]
        per = np.where(mode == Mode.broadcast, 1,
                       np.where((mode == Mode.distribute) | (mode == Mode.collect), fan, p.path_group[path]))
        lower_n = -(-n_lw // per)
        lo_first = c[:, isa.X_LO_ADDR]
        lo_last = lo_first + lower_n * np.where(p.mem_lw_addressed[lm], 1, p.words_per_lw) - 1
        up_first = c[:, isa.X_UP_ADDR]
        upper = np.stack([um, up_first, up_first + n_lw - 1, path], 1)
        lower = np.stack([lm, lo_first, lo_last, path], 1)
        src, dst = np.where(down[:, None], upper, lower), np.where(down[:, None], lower, upper)
        reads[rows, 0] = src
        writes[rows, :READ_FIELDS] = dst
        writes[rows, REDUCES], writes[rows, ON_ALU] = mode == Mode.reduce, 0
    rows = np.flatnonzero(op == Op.MATMUL)
    if len(rows):
        c = code[rows]
        dt, m, kp, np_ = c[:, isa.MM_DTYPE], c[:, isa.MM_M], c[:, isa.MM_K] // p.pes_per_mab, c[:, isa.MM_N] // p.pes_per_mab
        trans = (c[:, isa.MM_FLAGS] & isa.MM_TRANS_B) != 0
        shapes = ((isa.MM_A_MEM, m, kp, dt), (isa.MM_B_MEM, np.where(trans, c[:, isa.MM_N], kp),
                                               np.where(trans, kp, c[:, isa.MM_N]), dt),
                  (isa.MM_C_MEM, m, np_, np.full(len(c), DType.float32)))
        for k, (base, n_rows, cols, d) in enumerate(shapes):
            first = c[:, base + 1]
            lo, hi = words(first, first + (n_rows - 1) * c[:, base + 2] + cols - 1, d)
            access = np.stack([c[:, base], lo, hi, np.full(len(c), -1)], 1)
            if base == isa.MM_C_MEM:
                writes[rows, :READ_FIELDS] = access
                writes[rows, REDUCES], writes[rows, ON_ALU] = 0, 0
                accumulate = (c[:, isa.MM_FLAGS] & isa.MM_ACCUMULATE) != 0
                reads[rows[accumulate], 2] = access[accumulate]
            else:
                reads[rows, k] = access
    rows = np.flatnonzero(op == Op.MV)
    if len(rows):
        c = code[rows]
        sm, first = c[:, isa.MV_SRC_MEM], c[:, isa.MV_SRC_ADDR]
        reads[rows, 0] = np.stack([sm, first, first + c[:, isa.MV_N] - 1, p.path_of[sm, c[:, isa.MV_DST_MEM]]], 1)
    return writes, reads


@dataclass(frozen=True)
class Shortfalls:
    """Every (reader, writer) pair that is closer than its rule allows, in program order of the
    readers: `short` steps are missing at distance `distance`."""

    reader: np.ndarray
    writer: np.ndarray
    rule: np.ndarray
    distance: np.ndarray
    short: np.ndarray


def shortfalls(p: MachineParams, code: np.ndarray, steps: np.ndarray) -> Shortfalls:
    """The pairs of a (field-validated) program whose gap is short; `steps` are the PE-stream steps
    of each instruction (0 for MV, HOST_DMA, WAIT)."""
    t = tables(p)
    empty = np.zeros(0, dtype=np.int64)
    if t.horizon == 0 or len(code) == 0:
        return Shortfalls(empty, empty, empty, empty, empty)
    writes, reads = _accesses(p, t, code)
    end = np.cumsum(steps)
    start = end - steps
    writers = np.flatnonzero(writes[:, MEM] >= 0)
    readers = np.flatnonzero((reads[:, :, MEM] >= 0).any(1))
    if len(writers) == 0 or len(readers) == 0:
        return Shortfalls(empty, empty, empty, empty, empty)
    before = np.searchsorted(writers, readers)  # writers strictly before each reader
    # every writer takes at least one step, so only the last `horizon` of them can be in reach
    k = np.arange(1, t.horizon + 1)
    cand = before[:, None] - k[None, :]
    ok = cand >= 0
    w = writers[np.where(ok, cand, 0)]
    dist = start[readers][:, None] - end[w]
    ok &= dist < t.horizon
    pair_r, pair_k = np.nonzero(ok)
    if len(pair_r) == 0:
        return Shortfalls(empty, empty, empty, empty, empty)
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
    return Shortfalls(r_i[bad], w_i[bad], rule[np.arange(len(j)), j][bad], d[bad], short[bad])


def pe_steps(p: MachineParams, code: np.ndarray) -> np.ndarray:
    """Steps each instruction occupies the PE stream (the timing model's own rule)."""
    stats = time_code(p, code)
    return np.where(stats.unit == UNIT_PE, (stats.end - stats.start) // p.step_cycles, 0)


def check(p: MachineParams, code: np.ndarray) -> None:
    """Raise SimError at the first instruction that reads too soon after a write it depends on."""
    found = shortfalls(p, code, pe_steps(p, code))
    if len(found.reader) == 0:
        return
    i, w, key = int(found.reader[0]), int(found.writer[0]), KEYS[int(found.rule[0])]
    d, short = int(found.distance[0]), int(found.short[0])
    raise SimError(f"hazard {key}: it reads {d} step(s) after instruction #{w} ({disassemble(code[w], p)}) "
                   f"wrote what it reads; {p.hw.name} needs {d + short} (hazards.{key}); insert NOP "
                   f"steps={short} before it", index=i, instruction=disassemble(code[i], p))


def schedule(p: MachineParams, code: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The program with the fewest nops inserted that clears every hazard, and `moved`: where each
    original position went (`moved[i]` is the new position of the nop or instruction that now
    opens instruction i's place, `moved[n]` the new length), so labels and relocations follow.

    A nop inserted before a reader also lengthens every later pair that spans it, so the
    shortfalls are settled in program order, each less the nops already inserted between its
    writer and its reader."""
    found = shortfalls(p, code, pe_steps(p, code))
    inserted: dict[int, int] = {}
    at: list[int] = []  # readers given nops, ascending
    total: list[int] = [0]  # total[k]: the nops of at[:k]
    for i, w, short in zip(found.reader.tolist(), found.writer.tolist(), found.short.tolist()):
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
    rows = np.array(at, dtype=np.int64)
    nops = np.zeros((len(rows), code.shape[1]), dtype=np.int64)
    nops[:, 0], nops[:, isa.NOP_STEPS] = Op.NOP, [inserted[i] for i in at]
    return np.insert(code, rows, nops, axis=0), moved

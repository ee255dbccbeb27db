"""Checks a program against a chip before anything runs, so a bad program cannot half-run.

Every address range an instruction touches must lie inside its memory, every mode must be one
its path offers (from the YAML), operands must be aligned as the hardware requires, tags must
be in range, a WAIT must follow a transfer with its tag, and dependent instructions must be as
far apart as the YAML's hazards ask (`sim.hazards`). The first problem raises `SimError`
naming the instruction index and its decoded fields. The numba kernels do not bounds-check;
this is what keeps them safe.
"""

from __future__ import annotations

import numpy as np

from . import hazards, isa, issue
from .errors import SimError
from .isa import ALL_GROUPS, IMM, DType, Dir, Mode, Op, Red, Scope, VOp, arity
from .accesses import matmul_operands
from .disasm import disassemble
from .params import DTYPE_FORMAT, HOST, WORD_BITS, MachineParams


class _Checker:
    def __init__(self, params: MachineParams, code: np.ndarray, host_words: list[int] | None) -> None:
        self.p, self.code, self.host_words = params, code, host_words
        self.first_issue: dict[int, int] = {}  # tag -> first MV / HOST_DMA carrying it (see validate)

    def fail(self, i: int, message: str) -> SimError:
        return SimError(message, index=i, instruction=disassemble(self.code[i], self.p))

    def enum(self, i: int, enum, value: int, what: str):
        try:
            return enum(int(value))
        except ValueError:
            raise self.fail(i, f"{what} {int(value)} is not one of {', '.join(e.name for e in enum)}") from None

    def memory(self, i: int, m: int, what: str) -> int:
        if not 0 <= m < len(self.p.memory_names):
            raise self.fail(i, f"{what} memory id {m} does not exist; the chip has {', '.join(self.p.memory_names)}")
        return m

    def units(self, m: int) -> int:
        """Capacity of one instance in the memory's own address units."""
        words = int(self.p.mem_words[m])
        return words // self.p.words_per_lw if self.p.mem_lw_addressed[m] else words

    def in_range(self, i: int, m: int, first: int, count: int, what: str, unit_words: int = 1) -> None:
        """[first, first + count) in address units of `m` (or elements when `unit_words` is a fraction)."""
        cap = self.units(m) if unit_words == 1 else int(self.p.mem_words[m]) * unit_words
        if first < 0 or count < 0 or first + count > cap:
            raise self.fail(i, f"{what} {first}..{first + count - 1} are outside {self.p.memory_names[m]} "
                               f"(0..{cap - 1})")

    def instance(self, i: int, m: int, inst: int, local: int, what: str) -> None:
        n = int(self.p.mem_instances[m])
        if inst == ALL_GROUPS:
            per = n // self.p.n_groups
            if not 0 <= local < per:
                raise self.fail(i, f"{what} local instance {local} does not exist; {self.p.memory_names[m]} has {per} per Group")
        elif not 0 <= inst < n:
            raise self.fail(i, f"{what} instance {inst} does not exist; {self.p.memory_names[m]} has {n}")

    def path(self, i: int, src: int, dst: int, mode: Mode) -> int:
        p = self.p.path_id(src, dst)
        name = lambda m: "host" if m == HOST else self.p.memory_names[m]  # noqa: E731
        if p < 0:
            raise self.fail(i, f"{self.p.hw.name} has no transfer path from {name(src)} to {name(dst)}")
        if not self.p.mode_offered[p, mode]:
            offered = [m.name for m in Mode if self.p.mode_offered[p, m]]
            raise self.fail(i, f"path {self.p.path_names[p]} does not offer mode {mode.name}; it offers {', '.join(offered)}")
        return p

    def storage_dtype(self, i: int, value: int, per_element: bool) -> DType:
        """The dtype of a transfer (what a reducing one adds, what a transposing one moves between
        PEs, `per_element`): one that memories hold, and not float64 for those (not modelled)."""
        dtype = self.enum(i, DType, value, "dtype")
        if dtype == DType.pfloat32:
            raise self.fail(i, "pfloat32 (pseudo-single) exists only as MATMUL operands; memories hold float32")
        if dtype == DType.float64 and per_element:
            raise self.fail(i, "float64 elements are not reduced or transposed by transfers in mnsim (a transfer "
                               "of other modes moves their words whatever the dtype)")
        return dtype

    def elements(self, m: int, dtype: DType) -> int:
        """How many elements of `dtype` memory m holds per instance."""
        return int(self.p.mem_words[m]) * WORD_BITS // self.p.hw.formats[DTYPE_FORMAT[dtype]].bits

    def tag(self, i: int, tag: int) -> None:
        if not 1 <= tag <= self.p.tags:
            raise self.fail(i, f"tag {tag} is outside 1..{self.p.tags}")

    # ---- per opcode -------------------------------------------------------------------------

    def check(self, i: int) -> None:
        row = self.code[i]
        op = self.enum(i, Op, row[0], "opcode")
        getattr(self, f"_{op.name.lower()}")(i, row)

    def _nop(self, i, row):
        if row[isa.NOP_STEPS] < 0:
            raise self.fail(i, "a NOP cannot last a negative number of steps")

    def _wait(self, i, row):
        tag = int(row[isa.WAIT_TAG])
        self.tag(i, tag)
        if self.first_issue.get(tag, i) >= i:
            raise self.fail(i, f"WAIT on tag {tag}, which no earlier MV or HOST_DMA carries")

    def _mv(self, i, row):
        mode = self.enum(i, Mode, row[isa.MV_MODE], "mode")
        sm = self.memory(i, int(row[isa.MV_SRC_MEM]), "source")
        dm = self.memory(i, int(row[isa.MV_DST_MEM]), "destination")
        p = self.path(i, sm, dm, mode)
        if self.p.path_engine[p] != 0:
            raise self.fail(i, f"path {self.p.path_names[p]} is not driven by the Data Engine; use XFER or HOST_DMA")
        scope = self.enum(i, Scope, row[isa.MV_SCOPE], "scope")
        self.enum(i, Red, row[isa.MV_RED], "reduction")
        self.storage_dtype(i, row[isa.MV_DTYPE], row[isa.MV_MODE] == Mode.reduce)
        si, di = int(row[isa.MV_SRC_INST]), int(row[isa.MV_DST_INST])
        self.instance(i, sm, si, int(row[isa.MV_SRC_LOCAL]), "source")
        self.instance(i, dm, di, int(row[isa.MV_DST_LOCAL]), "destination")
        if (si == ALL_GROUPS) != (di == ALL_GROUPS) and mode == Mode.individual:
            raise self.fail(i, "an individual MV runs either in every Group (both instances -1) or between two instances")
        spread = mode == Mode.distributed_broadcast
        if spread and (si, di, scope) != (ALL_GROUPS, ALL_GROUPS, Scope.chip):
            raise self.fail(i, "a distributed_broadcast MV reads every Group's source and writes every Group's "
                               "destinations: both instances -1, scope chip")
        if scope == Scope.chip and ALL_GROUPS in (si, di) and mode != Mode.individual and not spread:
            raise self.fail(i, "a chip-wide MV has one source or destination instance, not one per Group")
        if mode in (Mode.reduce,) and row[isa.MV_RED] == Red.none:
            raise self.fail(i, "a reduce MV needs a reduction op (add, max, min)")
        n = int(row[isa.MV_N])
        if n <= 0:
            raise self.fail(i, f"n={n}: a transfer moves at least one long word")
        many = int(self.p.mem_instances[dm if mode in (Mode.broadcast, Mode.distribute) else sm])
        if scope == Scope.group:
            many //= self.p.n_groups
        chunk = int(self.p.mode_chunk[p, mode])
        src_n, dst_n = n, n
        if spread:
            per = int(self.p.mem_instances[dm]) // self.p.n_groups
            if n % (chunk * per):
                raise self.fail(i, f"n={n} must be a multiple of chunk {chunk} x {per} destinations per Group for "
                                   f"{mode.name}")
            dst_n = n * self.p.n_groups // per
        if mode in (Mode.distribute, Mode.collect):
            if n % (chunk * many):
                raise self.fail(i, f"n={n} must be a multiple of chunk {chunk} x {many} instances for {mode.name}")
            if mode == Mode.distribute:
                dst_n = n // many
            else:
                src_n = n // many
        self.in_range(i, sm, int(row[isa.MV_SRC_ADDR]), src_n, "source long words")
        self.in_range(i, dm, int(row[isa.MV_DST_ADDR]), dst_n, "destination long words")
        self.tag(i, int(row[isa.MV_TAG]))

    def _host_dma(self, i, row):
        to_device = row[isa.DMA_DIR] == 0
        link = self.p.host_path_in if to_device else self.p.host_path_out
        if link < 0:
            raise self.fail(i, f"{self.p.hw.name} has no host link in this direction")
        buf, off, n = int(row[isa.DMA_HOST_BUF]), int(row[isa.DMA_HOST_OFF]), int(row[isa.DMA_N])
        w = self.p.words_per_lw
        if n <= 0 or off < 0:
            raise self.fail(i, f"host long words {off}..{off + n - 1}: a DMA moves at least one, from offset 0 on")
        if self.host_words is not None:  # None: the buffers are not known yet (a program being built)
            if not 0 <= buf < len(self.host_words):
                raise self.fail(i, f"host buffer {buf} was not given to the run ({len(self.host_words)} given)")
            if w * (off + n) > self.host_words[buf]:
                raise self.fail(i, f"host buffer {buf} holds {self.host_words[buf] // w} long words; asked for "
                                   f"{off}..{off + n - 1}")
        window = int(self.p.hw.host_link.window_bytes) // self.p.hw.long_word_bytes
        pdm = int(row[isa.DMA_PDM_ADDR])
        if pdm < 0 or pdm + n > window:
            raise self.fail(i, f"PDM long words {pdm}..{pdm + n - 1} are outside the host window (0..{window - 1})")
        self.tag(i, int(row[isa.DMA_TAG]))

    def _xfer(self, i, row):
        mode = self.enum(i, Mode, row[isa.X_MODE], "mode")
        direction = self.enum(i, Dir, row[isa.X_DIR], "direction")
        um = self.memory(i, int(row[isa.X_UP_MEM]), "upper")
        lm = self.memory(i, int(row[isa.X_LO_MEM]), "lower")
        p = self.path(i, um, lm, mode) if direction == Dir.down else self.path(i, lm, um, mode)
        if self.p.path_engine[p] != 1:
            raise self.fail(i, f"path {self.p.path_names[p]} is not driven by the PE stream; use MV")
        self.enum(i, Red, row[isa.X_RED], "reduction")
        dtype = self.storage_dtype(i, row[isa.X_DTYPE], mode in (Mode.reduce, Mode.transpose))
        if mode == Mode.reduce and row[isa.X_RED] == Red.none:
            raise self.fail(i, "a reduce XFER needs a reduction op (add, max, min)")
        n = int(row[isa.X_N])
        fan = int(self.p.mem_instances[lm] // self.p.mem_instances[um])
        group = int(self.p.path_group[p])
        chunk = int(self.p.mode_chunk[p, mode])
        if n <= 0:
            raise self.fail(i, f"n={n}: a transfer moves at least one long word")
        if mode in (Mode.distribute, Mode.collect):
            if n % (chunk * fan):
                raise self.fail(i, f"n={n} must be a multiple of chunk {chunk} x {fan} children for {mode.name}")
            lower_n = n // fan
        elif mode == Mode.broadcast:
            lower_n = n
            subset = int(row[isa.X_INDEX])
            if subset and not (self.p.mode_subsets[p, mode] and row[isa.X_DIR] == Dir.down):
                raise self.fail(i, f"index {subset}: {self.p.path_names[p]}'s broadcast cannot name a subset of its "
                                   f"children (transfers.{self.p.path_names[p]}.modes.broadcast.subsets)")
            if not 0 <= subset < 1 << fan:
                raise self.fail(i, f"index {subset} is no subset of the {fan} children (a bit mask below {1 << fan})")
        else:
            if n % group:
                raise self.fail(i, f"n={n} must be a multiple of the {group} members of a group for {mode.name}")
            lower_n = n // group
            block = group * group * self.p.words_per_lw * self.p.elements_per_word(dtype)
            if mode == Mode.transpose and (n % block or row[isa.X_UP_ADDR] % block):
                raise self.fail(i, f"n={n} at {self.p.memory_names[um]} {row[isa.X_UP_ADDR]}: a transpose reads whole "
                                   f"blocks of {block // group} rows of {group} long words ({dtype.name}), each "
                                   f"starting at a multiple of {block} (inside one register face)")
            if mode == Mode.individual and not 0 <= row[isa.X_INDEX] < fan // group:
                raise self.fail(i, f"index {row[isa.X_INDEX]} names no group; there are {fan // group}")
        self.in_range(i, um, int(row[isa.X_UP_ADDR]), n, "upper long words")
        lo_addr = int(row[isa.X_LO_ADDR])
        if not self.p.mem_lw_addressed[lm]:
            if lo_addr % self.p.words_per_lw:
                raise self.fail(i, f"word address {lo_addr} of {self.p.memory_names[lm]} is not long-word aligned "
                                   f"(a multiple of {self.p.words_per_lw})")
            self.in_range(i, lm, lo_addr, self.p.words_per_lw * lower_n, "lower words")
        else:
            self.in_range(i, lm, lo_addr, lower_n, "lower long words")

    def _vop(self, i, row):
        op = self.enum(i, VOp, row[isa.V_OP], "op")
        dtype = self.enum(i, DType, row[isa.V_DTYPE], "dtype")
        src_dtype = self.enum(i, DType, row[isa.V_SRC_DTYPE], "source dtype") if op == VOp.cvt else dtype
        self._vop_offered(i, op, dtype, src_dtype)
        no, ni = int(row[isa.V_N_OUTER]), int(row[isa.V_N_INNER])
        if no <= 0 or ni <= 0:
            raise self.fail(i, f"{no}x{ni}: a VOP covers at least one element")
        for k, base in enumerate((isa.V_DST, isa.V_A, isa.V_B, isa.V_C)):
            if k > arity(op):
                continue
            m = int(row[base])
            if m == IMM:
                if k == 0:
                    raise self.fail(i, "the destination of a VOP cannot be an immediate")
                continue
            self.memory(i, m, "operand")
            if m not in self.p.pe_memories:
                raise self.fail(i, f"VOP operands live in PE memories; {self.p.memory_names[m]} is not one")
            addr, so, si = int(row[base + 1]), int(row[base + 2]), int(row[base + 3])
            if so < 0 or si < 0:
                raise self.fail(i, "VOP strides must not be negative")
            dt = src_dtype if k == 1 else dtype
            last = addr + (no - 1) * so + (ni - 1) * si
            cap = self.elements(m, dt)
            if addr < 0 or last >= cap:
                raise self.fail(i, f"operand {'dst a b c'.split()[k]} elements {addr}..{last} are outside "
                                   f"{self.p.memory_names[m]} (0..{cap - 1} {dt.name} elements)")
        self._read_fields(i, [(name, int(row[base]), (int(row[base + 1]), int(row[base + 2]), int(row[base + 3])))
                              for name, base in (("a", isa.V_A), ("b", isa.V_B), ("c", isa.V_C))[:arity(op)]
                              if row[base] != IMM])

    def _read_fields(self, i: int, operands: list[tuple[str, int, tuple]]) -> None:
        """An instruction has one read-address field per memory port (SDM: readers of one memory
        use identical address patterns), so operands read from one memory share their pattern."""
        for m in dict.fromkeys(mem for _, mem, _ in operands):
            mine = [(name, pattern) for name, mem, pattern in operands if mem == m]
            patterns = dict.fromkeys(pattern for _, pattern in mine)
            name = self.p.memory_names[m]
            ports = self.p.hw.memories[name].read_ports
            if len(patterns) > ports:
                names = " and ".join(n for n, _ in mine)
                raise self.fail(i, f"operands {names} read {name} at different addresses or strides; {name} has "
                                   f"{ports} read port(s) (memories.{name}.ports: {self.p.hw.memories[name].ports}), "
                                   f"so an instruction reads it with one address pattern")

    def _vop_offered(self, i: int, op: VOp, dtype: DType, src_dtype: DType) -> None:
        """The chip costs the op for each of its dtypes on a unit that has a vector mode for the
        dtype, and the op is defined on those dtypes (int32 has its own, smaller op set)."""
        name = isa.OP_NAME[op]
        cost = isa.COST_NAME[op]
        if cost not in self.p.hw.pe_ops:
            raise self.fail(i, f"{self.p.hw.name} has no cost for PE op {name} (pe_ops.{cost} is missing)")
        for dt in dict.fromkeys((src_dtype, dtype)):
            if self.p.vop_lanes[op, dt] == 0:
                fmt = DTYPE_FORMAT[dt]
                unit = self.p.hw.pe_ops[cost].cost(fmt).unit
                modes = ", ".join(self.p.hw.units[unit].vector) or "none"
                raise self.fail(i, f"PE op {name} has no unit with a vector mode for {dt.name}: pe_ops.{cost} runs "
                                   f"{fmt} on {unit}, whose vector modes are {modes} (pe_ops.{cost}.dtypes.{fmt} "
                                   f"may name another unit)")
            if dt == DType.int32 and op not in isa.INT32_OPS:
                ops = ", ".join(isa.OP_NAME[o] for o in sorted(isa.INT32_OPS))
                raise self.fail(i, f"PE op {name} is not defined on int32; the int32 ops are {ops}")
            if dt != DType.int32 and op in isa.INT32_ONLY_OPS:
                raise self.fail(i, f"PE op {name} shifts the bits of int32 words; it is not defined on {dt.name}")
        if DType.float64 in (src_dtype, dtype) and src_dtype != dtype and DType.float32 not in (src_dtype, dtype):
            raise self.fail(i, f"cvt between {src_dtype.name} and {dtype.name} is not modelled: float64 converts to "
                               "and from float32 (convert through it)")

    def _matmul(self, i, row):
        dtype = self.enum(i, DType, row[isa.MM_DTYPE], "dtype")
        if self.p.mm_rows[dtype] == 0:
            raise self.fail(i, f"the MAU of {self.p.hw.name} has no matrix mode for {dtype.name}")
        m, k, n = int(row[isa.MM_M]), int(row[isa.MM_K]), int(row[isa.MM_N])
        pes = self.p.pes_per_mab
        if m <= 0 or k <= 0 or n <= 0 or k % pes or n % pes:
            raise self.fail(i, f"M, K, N must be positive and K, N multiples of the {pes} PEs of a MAB (K is split "
                               f"over them in A and B, N in C)")
        acc = DType(int(self.p.mm_acc[dtype]))  # C's dtype: the matrix mode's accumulator (float32, float64)
        shapes = [(name, base, int(rows), int(cols), acc if name == "C" else dtype)
                  for name, base, rows, cols in matmul_operands(row, pes)]
        for name, base, rows, cols, dt in shapes:
            mem = self.memory(i, int(row[base]), name)
            if mem not in self.p.pe_memories:
                raise self.fail(i, f"MATMUL operand {name} must be in a PE memory, not {self.p.memory_names[mem]}")
            addr, pitch = int(row[base + 1]), int(row[base + 2])
            if pitch < cols and rows > 1:
                raise self.fail(i, f"operand {name}: row pitch {pitch} is smaller than a row ({cols} elements)")
            last = addr + (rows - 1) * pitch + cols - 1
            cap = self.elements(mem, dt)
            if addr < 0 or last >= cap:
                raise self.fail(i, f"operand {name} elements {addr}..{last} are outside {self.p.memory_names[mem]} (0..{cap - 1})")
        read = ("A", "B", "C") if row[isa.MM_FLAGS] & isa.MM_ACCUMULATE else ("A", "B")
        self._read_fields(i, [(name, int(row[base]), (int(row[base + 1]), int(row[base + 2]), rows, cols))
                              for name, base, rows, cols, _ in shapes if name in read])


def validate(params: MachineParams, code: np.ndarray, host_words: list[int] | None = None) -> None:
    """Raise SimError at the first instruction that cannot run on this chip: its fields first
    (`validate_fields`), then the bundles issued together (`sim.issue`), then the hazards between
    instructions (`sim.hazards`)."""
    validate_fields(params, code, host_words or [])
    issue.check(params, code)
    hazards.check(params, code)


def validate_fields(params: MachineParams, code: np.ndarray, host_words: list[int] | None) -> None:
    """Raise SimError at the first instruction whose fields cannot run on this chip; host buffer
    sizes are checked when `host_words` are given.

    Plain individual MVs (most of a gather-heavy program) are checked all at once with numpy;
    every other instruction, and any MV that fails the bulk check, goes through the per-
    instruction checker in program order, so the error is the same as checking one by one.
    A row equal to one already accepted is not checked again (only a WAIT's check depends on
    where it stands)."""
    checker = _Checker(params, code, host_words)
    checker.first_issue = _first_issue(code)
    passed: set[bytes] = set()  # rows already accepted: a compiled program repeats its rounds' rows
    for i in np.flatnonzero(~_plain_mvs_ok(params, code)).tolist():
        row = code[i]
        if row[0] == Op.WAIT:  # the one check that depends on the position (an earlier transfer)
            checker.check(i)
            continue
        key = row.tobytes()
        if key not in passed:
            checker.check(i)
            passed.add(key)


def check_offered(params: MachineParams, code: np.ndarray) -> None:
    """Raise SimError if `code` moves data in a mode its path does not offer, or runs a PE op the
    chip does not cost: what `validate_fields` refuses, checked in bulk (the first offending
    instruction gets validate's message). A compiler times candidate programs without validating
    them (compiler.planner.cost), and such a mode or op has no rate to time: the timing engine
    divided by zero, far from the YAML key that is missing (a description without
    transfers.l1bm_to_pe.modes.mab_broadcast, say)."""
    # each op's rows by index, their fields gathered for those rows only (whole columns read in
    # masks took 1.6 ms of a 50,000-row candidate, which the planner times by the thousand)
    ops = code[:, 0]
    mv, xfer, vop = (np.flatnonzero(ops == op) for op in (Op.MV, Op.XFER, Op.VOP))
    bad = []
    if len(mv):
        path = params.path_of[code[mv, isa.MV_SRC_MEM], code[mv, isa.MV_DST_MEM]]
        bad.append(mv[(path < 0) | ~params.mode_offered[np.maximum(path, 0), code[mv, isa.MV_MODE]]])
    if len(xfer):
        up, lo, down = code[xfer, isa.X_UP_MEM], code[xfer, isa.X_LO_MEM], code[xfer, isa.X_DIR] == Dir.down
        path = params.path_of[np.where(down, up, lo), np.where(down, lo, up)]
        bad.append(xfer[(path < 0) | ~params.mode_offered[np.maximum(path, 0), code[xfer, isa.X_MODE]]])
    if len(vop):
        op, dtype = code[vop, isa.V_OP], code[vop, isa.V_DTYPE]
        src_dtype = np.where(op == VOp.cvt, code[vop, isa.V_SRC_DTYPE], dtype)
        bad.append(vop[(params.vop_dtype_issues[op, dtype] == 0) | (params.vop_lanes[op, dtype] == 0)
                       | (params.vop_lanes[op, src_dtype] == 0)])
    if any(len(b) for b in bad):
        i = int(min(b.min() for b in bad if len(b)))
        _Checker(params, code, None).check(i)  # validate's message for it
        raise SimError(f"{params.hw.name} does not offer what instruction #{i} needs", index=i,
                       instruction=disassemble(code[i], params))


def _first_issue(code: np.ndarray) -> dict[int, int]:
    """Tag -> index of the first MV or HOST_DMA that carries it (a WAIT must come after)."""
    out: dict[int, int] = {}
    for op, field_ in ((Op.MV, isa.MV_TAG), (Op.HOST_DMA, isa.DMA_TAG)):
        rows = np.flatnonzero(code[:, 0] == op)
        tags, first = np.unique(code[rows, field_], return_index=True)
        for tag, k in zip(tags.tolist(), rows[first].tolist()):
            out[tag] = min(out.get(tag, k), k)
    return out


def _plain_mvs_ok(p: MachineParams, code: np.ndarray) -> np.ndarray:
    """Rows that are individual, group-scoped, non-reducing MVs on a Data Engine path whose every
    field is in range (what `_Checker._mv` accepts for such a row)."""
    ok = (code[:, 0] == Op.MV) & (code[:, isa.MV_MODE] == Mode.individual) & (code[:, isa.MV_SCOPE] == Scope.group)
    ok &= (code[:, isa.MV_RED] == Red.none) & np.isin(code[:, isa.MV_DTYPE], [d.value for d in DType
                                                                               if d != DType.pfloat32])
    n_mem = len(p.memory_names)
    sm, dm = code[:, isa.MV_SRC_MEM], code[:, isa.MV_DST_MEM]
    ok &= (sm >= 0) & (sm < n_mem) & (dm >= 0) & (dm < n_mem)
    if not ok.any():
        return ok
    sm, dm = np.where(ok, sm, 0), np.where(ok, dm, 0)
    path = p.path_of[sm, dm]
    ok &= path >= 0
    path = np.where(ok, path, 0)
    ok &= (p.path_engine[path] == 0) & p.mode_offered[path, Mode.individual]
    n = code[:, isa.MV_N]
    ok &= n > 0
    for mem, inst_f, local_f, addr_f in ((sm, isa.MV_SRC_INST, isa.MV_SRC_LOCAL, isa.MV_SRC_ADDR),
                                         (dm, isa.MV_DST_INST, isa.MV_DST_LOCAL, isa.MV_DST_ADDR)):
        count = p.mem_instances[mem]
        inst, local = code[:, inst_f], code[:, local_f]
        every = inst == ALL_GROUPS
        ok &= np.where(every, (local >= 0) & (local < count // p.n_groups), (inst >= 0) & (inst < count))
        cap = np.where(p.mem_lw_addressed[mem], p.mem_words[mem] // p.words_per_lw, p.mem_words[mem])
        addr = code[:, addr_f]
        ok &= (addr >= 0) & (addr + n <= cap)
    ok &= (code[:, isa.MV_SRC_INST] == ALL_GROUPS) == (code[:, isa.MV_DST_INST] == ALL_GROUPS)
    tag = code[:, isa.MV_TAG]
    ok &= (tag >= 1) & (tag <= p.tags)
    return ok


def symbol_extents(params: MachineParams, code: np.ndarray, relocs: np.ndarray,
                   symbols: tuple[str, ...]) -> dict[str, tuple[int, int]]:
    """For each relocatable buffer: (memory id, long words past its base that instructions reach).

    Relocated fields are MV source and destination addresses; a bound program is in range when
    every buffer's base plus its extent fits the memory."""
    if len(relocs) == 0:
        return {}
    instr, field_, sym = relocs[:, 0], relocs[:, 1], relocs[:, 2]
    rows = code[instr]
    bad = np.flatnonzero((rows[:, 0] != Op.MV) | ((field_ != isa.MV_SRC_ADDR) & (field_ != isa.MV_DST_ADDR)))
    if len(bad):
        i = int(instr[bad[0]])
        raise SimError("only MV addresses can be relocated", index=i, instruction=disassemble(code[i], params))
    mem = np.where(field_ == isa.MV_SRC_ADDR, rows[:, isa.MV_SRC_MEM], rows[:, isa.MV_DST_MEM])
    end = rows[np.arange(len(rows)), field_] + rows[:, isa.MV_N]
    # by symbol, each symbol's relocations in program order (one sort: a mask per symbol made a
    # training step of thousands of buffers and 10^5 relocations take 20 s here)
    order = np.argsort(sym, kind="stable")
    sym_s, mem_s = sym[order], mem[order]
    starts = np.flatnonzero(np.r_[True, sym_s[1:] != sym_s[:-1]])
    first_mem = mem_s[starts]
    other = np.flatnonzero(mem_s != np.repeat(first_mem, np.diff(np.r_[starts, len(order)])))
    if len(other):
        at, group = int(order[other[0]]), np.searchsorted(starts, other[0], side="right") - 1
        raise SimError(f"buffer {symbols[sym[at]]} is addressed in both {params.memory_names[int(first_mem[group])]} "
                       f"and {params.memory_names[int(mem[at])]}", index=int(instr[at]),
                       instruction=disassemble(code[instr[at]], params))
    reach = np.maximum.reduceat(end[order], starts)
    return {symbols[int(s)]: (int(m), int(r)) for s, m, r in zip(sym_s[starts], first_mem, reach)}


def max_addresses(params: MachineParams, code: np.ndarray) -> dict[int, int]:
    """The highest word each LW-addressed memory is touched at (to grow DRAM before a run)."""
    out: dict[int, int] = {}
    # the fields taken column by column (a copy of the MVs' whole rows took 44 ms of a training
    # step's 1.8 M instructions)
    mv = code[:, 0] == Op.MV
    n = code[mv, isa.MV_N]
    for mem_f, addr_f in ((isa.MV_SRC_MEM, isa.MV_SRC_ADDR), (isa.MV_DST_MEM, isa.MV_DST_ADDR)):
        mem, end = code[mv, mem_f], code[mv, addr_f] + n
        for m in np.unique(mem):
            top = int(params.words_per_lw * end[mem == m].max())
            out[int(m)] = max(out.get(int(m), 0), top)
    return out

"""What mnsim can simulate: bounds on values that are a valid chip but not one mnsim can serve.

A description can be well-typed and consistent and still break the simulator later, far from
the YAML line that caused it: a latency that overflows the int64 cycle counters, a PE count whose
memories do not fit the host, a word size the memory arrays do not have. `hw validate` (and every
load) rejects such values here, with the key, the bound and why it exists. Each bound is derived
from how mnsim stores or counts things, not from MN-Core 2's numbers.
"""

from __future__ import annotations

from .model import HwDesc
from .source import KeyPath

Problem = tuple[KeyPath, str]

WORD_BYTES = 4
"""mnsim's memories are arrays of 32-bit words (sim.params.WORD_BITS)."""
MAX_INSTRUCTIONS_LOG2 = 23
MAX_CYCLES_PER_ITEM = 2 ** (63 - MAX_INSTRUCTIONS_LOG2)
"""Cycles are int64: a program of 2^23 instructions, each this long, still fits."""
MIN_RATE = 2.0 ** -10
"""LW per cycle: below it, moving a whole DRAM (2^29 LW) takes more than MAX_CYCLES_PER_ITEM."""
MAX_ONCHIP_BYTES = 4 * 2 ** 30
"""A Machine allocates every memory but DRAM when it is made (mncore2: about 170 MB); more than
this would exhaust a workstation before the first instruction."""
MAX_LANE_GROUPS = 2 ** 20
"""A VOP covers at most this many lane groups (a whole 4 MiB memory of half words)."""
MAX_HAZARD_STEPS = 16
"""The hazard check looks this many steps back from each reader (mncore2's largest gap is 3)."""
LAZY_MEMORIES = ("DRAM",)
"""Grown to the highest address a program touches, so their capacity costs no host memory."""
HOST_FORMATS = {"float32": (32, 8, 23), "float64": (64, 11, 52), "int32": (32, 0, 31)}
"""Formats the simulator computes in the host's own types (numpy's float32 and float64, int32 in
two's complement): (bits, exponent bits, mantissa bits) they must have. Half and pseudo-single
are mnsim's own codecs and take the YAML's widths."""
MIN_TAGS = 10
"""mnsim's programs use completion tags 1..10 (compiler.kernels.context.TAGS, and the host
transfers' 7..10, compiler.transfer.host); kernels' pipelines use what lies above."""
MAX_SLOTS = 2 ** 16
"""Tags and queue slots: the timing engine keeps an array of each per run (a queue depth of 3e9
exhausted the host's memory; 1e8 took 25 s and 2 GB for a 64 x 96 add)."""
MIN_WINDOW_LW = 2
"""The host link's PDM window is used in two halves (double buffering), each of whole long words."""


def check_bounds(hw: HwDesc) -> list[Problem]:
    problems: list[Problem] = []
    if hw.word_bytes != WORD_BYTES:
        problems.append((("word_bytes",), f"{hw.word_bytes} is not supported: mnsim's memories are arrays of "
                                          f"{WORD_BYTES}-byte words"))
    for name, level in hw.levels.items():
        if level.axis is not None and level.count & (level.count - 1):
            problems.append((("levels", name, "count"),
                             f"{level.count} is not a power of two: mnsim's compiler lays tensors out only over "
                             f"axes of power-of-two sizes (its layouts must tile the transfers' round-robin chunks "
                             f"evenly; with 5 positions on an axis not even a 64x64 add has a layout)"))
    upfront = {n: hw.memory_instances(n) * int(m.capacity_bytes) for n, m in hw.memories.items()
               if m.level in hw.levels and n not in LAZY_MEMORIES}
    if sum(upfront.values()) > MAX_ONCHIP_BYTES:
        largest = max(upfront, key=upfront.get)
        problems.append((("levels", hw.memories[largest].level, "count"), f"the memories other than DRAM take {sum(upfront.values()) / 2 ** 30:.3g} GiB "
                                      f"({largest}: {hw.memory_instances(largest)} instances, "
                                      f"{upfront[largest] / 2 ** 30:.3g} GiB); mnsim allocates them when a machine "
                                      f"is made and serves at most {MAX_ONCHIP_BYTES // 2 ** 30} GiB"))
    for name, t in hw.transfers.items():
        if t.latency_cycles > MAX_CYCLES_PER_ITEM:
            problems.append((("transfers", name, "latency_cycles"),
                             f"{t.latency_cycles} cycles is above the bound {MAX_CYCLES_PER_ITEM} (2^"
                             f"{63 - MAX_INSTRUCTIONS_LOG2}): cycles are int64, and 2^{MAX_INSTRUCTIONS_LOG2} "
                             f"such transfers must not overflow them"))
        for mode_name, mode in t.modes.items():
            for side in ("src_lw_per_cycle", "dst_lw_per_cycle", "cross_group_lw_per_cycle"):
                rate = getattr(mode, side)
                if rate is not None and rate < MIN_RATE:
                    problems.append((("transfers", name, "modes", mode_name, side),
                                     f"{rate:g} LW/cycle is below the bound {MIN_RATE:g}: one transfer "
                                     f"could outlast the int64 cycle counters"))
    if hw.step_cycles > MAX_CYCLES_PER_ITEM // MAX_LANE_GROUPS:
        problems.append((("step_cycles",), f"{hw.step_cycles} is above the bound {MAX_CYCLES_PER_ITEM // MAX_LANE_GROUPS}"))
    else:
        most = MAX_CYCLES_PER_ITEM // (hw.step_cycles * MAX_LANE_GROUPS)
        for name, op in hw.pe_ops.items():
            costs = [(("pe_ops", name, "issues"), op.issues)]
            costs += [(("pe_ops", name, "dtypes", d, "issues"), c.issues) for d, c in op.dtypes.items()]
            problems += [(path, f"{issues} issues per lane group is above the bound {most}: a VOP over "
                                f"2^{MAX_LANE_GROUPS.bit_length() - 1} lane groups would overflow the int64 "
                                f"cycle counters") for path, issues in costs if issues > most]
    for name, (bits, exponent, mantissa) in HOST_FORMATS.items():
        fmt = hw.formats.get(name)
        for key, got, want in (("bits", fmt and fmt.bits, bits), ("exponent_bits", fmt and fmt.exponent_bits, exponent),
                               ("mantissa_bits", fmt and fmt.mantissa_bits, mantissa)):
            if fmt is not None and got != want:
                problems.append((("formats", name, key), f"{got} is not supported: mnsim computes {name} in the "
                                                         f"host's {bits}-bit type, 1-{exponent}-{mantissa}"))
    if hw.data_engine.tags < MIN_TAGS:
        problems.append((("data_engine", "tags"), f"{hw.data_engine.tags} is below the bound {MIN_TAGS}: mnsim's "
                                                  f"programs use completion tags 1..{MIN_TAGS}"))
    for key in ("tags", "queue_depth"):
        if getattr(hw.data_engine, key) > MAX_SLOTS:
            problems.append((("data_engine", key), f"{getattr(hw.data_engine, key)} is above the bound {MAX_SLOTS}: "
                                                   f"mnsim's timing keeps an array entry for each"))
    window = int(hw.host_link.window_bytes)
    if window < MIN_WINDOW_LW * hw.long_word_bytes:
        problems.append((("host_link", "window_bytes"), f"{window} bytes is below the bound "
                                                        f"{MIN_WINDOW_LW * hw.long_word_bytes}: the window is used in "
                                                        f"two halves of whole {hw.long_word_bytes}-byte long words"))
    problems += _units_fit(hw)
    for name, t in hw.transfers.items():
        if t.engine == "pe_stream" and t.latency_cycles:
            problems.append((("transfers", name, "latency_cycles"),
                             f"{t.latency_cycles} is not supported: the PE stream is lock-step, so its transfers "
                             f"have no latency of their own (the gaps before a reader are the YAML's hazards)"))
    problems += _inverse_chunks(hw)
    for name, gap in hw.hazards.items():
        if gap > MAX_HAZARD_STEPS:
            problems.append((("hazards", name), f"{gap} steps is above the bound {MAX_HAZARD_STEPS}: the hazard "
                                                f"check looks back at most {MAX_HAZARD_STEPS} steps"))
    return problems


def _units_fit(hw: HwDesc) -> list[Problem]:
    """A transfer's unit fits both its memories: every transfer moves whole units (a unit_lw of
    2e12 was accepted, and every program then failed to allocate that much DRAM)."""
    problems: list[Problem] = []
    for name, t in hw.transfers.items():
        sizes = [hw.memory_lw(m) for m in (*t.src, *t.dst) if m in hw.memories]
        if not sizes:
            continue
        for mode_name, mode in t.modes.items():
            if mode.unit_lw > min(sizes):
                problems.append((("transfers", name, "modes", mode_name, "unit_lw"),
                                 f"{mode.unit_lw} long words is above the bound {min(sizes)}: a transfer moves whole "
                                 f"units, and the smallest memory it joins holds {min(sizes)} long words"))
    return problems


def _inverse_chunks(hw: HwDesc) -> list[Problem]:
    """A collect must take back the chunks its path's distribute dealt: the compiler reads
    one chunk for both directions of a hop (a layout staged down is collected back up by it)."""
    problems: list[Problem] = []
    for name, up in hw.transfers.items():
        collect = up.modes.get("collect")
        if collect is None:
            continue
        for down_name, down in hw.transfers.items():
            deal = down.modes.get("distribute")
            if deal is not None and set(down.src) == set(up.dst) and set(down.dst) == set(up.src) \
                    and (collect.chunk_lw or 1) != (deal.chunk_lw or 1):
                problems.append((("transfers", name, "modes", "collect", "chunk_lw"),
                                 f"{collect.chunk_lw or 1} is not supported: a collect takes back the chunks of "
                                 f"its path's distribute (transfers.{down_name}.modes.distribute.chunk_lw: "
                                 f"{deal.chunk_lw or 1}), as mnsim's compiler assumes"))
    return problems


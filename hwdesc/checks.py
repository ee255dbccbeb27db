"""Cross-reference and plausibility checks that a schema alone cannot express.

The typed model rejects wrong types, unknown keys and non-positive numbers; these checks reject
descriptions that are well-typed but not a chip: a memory at a level that does not exist, a
transfer between memories that do not exist, an axis split over levels that are not adjacent.
Each problem is returned with its key path so that the loader can name the file and line.
"""

from __future__ import annotations

from .bounds import check_bounds
from .model import HwDesc
from .source import KeyPath

# The notation reserves these axis names (PFN layout notation): W is the element inside a long
# word and Time a slice index, so no level may use them.
RESERVED_AXES = ("W", "Time")
# The transfer-mode vocabulary the simulator implements; the numbers behind each live in YAML.
TRANSFER_MODES = ("individual", "broadcast", "mab_broadcast", "distribute", "collect", "reduce", "transpose",
                  "distributed_broadcast")
HOST = "host"
# The hazard vocabulary: sim.hazards says which pairs of instructions each key separates.
HAZARDS = ("lm_write_to_read", "grf_write_to_read", "alu_result_to_use", "l2bm_to_l1bm_read",
           "l1bm_write_to_l2bm_read", "l1bm_reduce_to_read", "l2bm_write_to_mv_read")

# A subset of an XFER's children is a bit mask in its int64 index field, the sign bit unused.
SUBSET_BITS = 63

Problem = tuple[KeyPath, str]


def check(hw: HwDesc) -> list[Problem]:
    """All the problems of a description, in file order; empty when it is a valid chip."""
    problems: list[Problem] = []
    problems += _check_levels(hw)
    problems += _check_memories(hw)
    problems += _check_formats(hw)
    problems += _check_units(hw)
    problems += _check_transfers(hw)
    problems += _check_host_link(hw)
    problems += [(("hazards", k), f"unknown hazard {k!r}; {_known('hazards', HAZARDS)}") for k in hw.hazards
                 if k not in HAZARDS]
    problems += [(("hazards",), f"hazard {k!r} is missing: the compiler and the hazard check read every one of "
                                f"{', '.join(HAZARDS)} (0 for none)") for k in HAZARDS if k not in hw.hazards]
    problems += check_bounds(hw)
    return problems


def _known(kind: str, names: object) -> str:
    return f"expected one of the {kind}: {', '.join(names)}"  # type: ignore[arg-type]


def _check_levels(hw: HwDesc) -> list[Problem]:
    problems: list[Problem] = []
    seen: list[str] = []
    for name, level in hw.levels.items():
        if level.axis is None:
            continue
        if level.axis in RESERVED_AXES:
            problems.append((("levels", name, "axis"), f"axis name {level.axis!r} is reserved by the layout notation"))
        if level.axis in seen and seen[-1] != level.axis:
            problems.append((("levels", name, "axis"),
                             f"axis {level.axis!r} must be fed by adjacent levels; expected it right below "
                             f"the level that last used it"))
        seen.append(level.axis)
    if not hw.axes:
        problems.append((("levels",), "no level names a layout axis; expected at least one `axis:`"))
    return problems


def _check_memories(hw: HwDesc) -> list[Problem]:
    problems: list[Problem] = []
    for name, mem in hw.memories.items():
        if mem.level not in hw.levels:
            problems.append((("memories", name, "level"), f"level {mem.level!r} does not exist; {_known('levels', hw.levels)}"))
            continue
        unit = hw.address_unit_bytes(name)
        if int(mem.capacity_bytes) % unit:
            problems.append((("memories", name, "capacity_bytes"),
                             f"{int(mem.capacity_bytes)} bytes is not a whole number of {unit}-byte address units"))
        elif int(mem.capacity_bytes) // unit % mem.faces:
            problems.append((("memories", name, "faces"), f"{mem.faces} faces do not split {int(mem.capacity_bytes) // unit} "
                                                          f"address units evenly"))
    return problems


def _check_formats(hw: HwDesc) -> list[Problem]:
    problems: list[Problem] = []
    lw_bits = hw.long_word_bytes * 8
    for name, fmt in hw.formats.items():
        if fmt.bits < 1 + fmt.exponent_bits + fmt.mantissa_bits:
            problems.append((("formats", name, "bits"),
                             f"{fmt.bits} bits cannot hold a sign, {fmt.exponent_bits} exponent and "
                             f"{fmt.mantissa_bits} mantissa bits"))
        if lw_bits % fmt.bits:
            problems.append((("formats", name, "bits"), f"a {lw_bits}-bit long word does not hold a whole number of {fmt.bits}-bit elements"))
    pseudo, single = hw.formats.get("pfloat32"), hw.formats.get("float32")
    if pseudo is not None and single is not None:  # single with mantissa bits ignored (fewer: the check above)
        for key, got, want in (("bits", pseudo.bits, single.bits), ("exponent_bits", pseudo.exponent_bits,
                                                                    single.exponent_bits)):
            if got != want:
                problems.append((("formats", "pfloat32", key), f"pseudo-single is stored as float32 with low "
                                 f"mantissa bits ignored: {key} must be float32's {want}, not {got}"))
    return problems


def _check_units(hw: HwDesc) -> list[Problem]:
    problems: list[Problem] = []
    for name, unit in hw.units.items():
        if unit.level not in hw.levels:
            problems.append((("units", name, "level"), f"level {unit.level!r} does not exist; {_known('levels', hw.levels)}"))
        for mode_name, table in (("matrix", unit.matrix), ("vector", unit.vector)):
            for dtype, mode in table.items():
                if dtype not in hw.formats:
                    problems.append((("units", name, mode_name, dtype), f"dtype {dtype!r} has no format; {_known('formats', hw.formats)}"))
                if mode.acc not in hw.formats:
                    problems.append((("units", name, mode_name, dtype, "acc"), f"accumulator {mode.acc!r} has no format; {_known('formats', hw.formats)}"))
    for name, op in hw.pe_ops.items():
        if op.unit not in hw.units:
            problems.append((("pe_ops", name, "unit"), f"unit {op.unit!r} does not exist; {_known('units', hw.units)}"))
        problems += _check_pe_op_dtypes(hw, name)
    return problems


def _check_pe_op_dtypes(hw: HwDesc, name: str) -> list[Problem]:
    """A per-format override must name a format and a unit that has a vector mode for it: an
    override the unit cannot execute would cost an op the chip cannot run."""
    problems: list[Problem] = []
    for dtype, cost in hw.pe_ops[name].dtypes.items():
        path = ("pe_ops", name, "dtypes", dtype)
        if dtype not in hw.formats:
            problems.append((path, f"dtype {dtype!r} has no format; {_known('formats', hw.formats)}"))
        elif cost.unit not in hw.units:
            problems.append(((*path, "unit"), f"unit {cost.unit!r} does not exist; {_known('units', hw.units)}"))
        elif dtype not in hw.units[cost.unit].vector:
            able = [u for u, unit in hw.units.items() if dtype in unit.vector]
            problems.append(((*path, "unit"), f"unit {cost.unit!r} has no vector mode for {dtype}; "
                                              f"{_known('units with one', able)}"))
    return problems


def _check_transfers(hw: HwDesc) -> list[Problem]:
    problems: list[Problem] = []
    endpoints = (*hw.memories, HOST)
    for name, t in hw.transfers.items():
        for side in ("src", "dst"):
            for i, mem in enumerate(getattr(t, side)):
                if mem not in endpoints:
                    problems.append((("transfers", name, side), f"memory {mem!r} does not exist; {_known('memories', endpoints)}"))
        for mode_name, mode in t.modes.items():
            if mode_name not in TRANSFER_MODES:
                problems.append((("transfers", name, "modes", mode_name), f"unknown transfer mode {mode_name!r}; {_known('modes', TRANSFER_MODES)}"))
            if mode.subsets and (mode_name != "broadcast" or t.engine != "pe_stream"):
                problems.append((("transfers", name, "modes", mode_name, "subsets"),
                                 "only a PE-stream broadcast names a subset of its children (l2bmb@set): an XFER's index "
                                 f"holds it, which {'an MV' if t.engine != 'pe_stream' else 'a ' + mode_name} has not"))
            elif mode.subsets and all(m in hw.memories for m in (*t.src, *t.dst)):
                fan = hw.memory_instances(t.dst[0]) // hw.memory_instances(t.src[0])
                if fan > SUBSET_BITS:
                    problems.append((("transfers", name, "modes", mode_name, "subsets"),
                                     f"{fan} children per {t.src[0]} do not fit the index's bit mask (at most "
                                     f"{SUBSET_BITS})"))
        if t.group_level is not None and t.group_level not in hw.levels:
            problems.append((("transfers", name, "group_level"), f"level {t.group_level!r} does not exist; {_known('levels', hw.levels)}"))
        if (t.slot is not None) != (t.engine == "pe_stream"):
            problems.append((("transfers", name, "slot"), "exactly the pe_stream transfers name the VLIW slot that drives them"))
        if (HOST in t.src or HOST in t.dst) != (t.engine == "host_link"):
            problems.append((("transfers", name, "engine"), "the host link drives exactly the transfers to and from the host"))
    return problems


def _check_host_link(hw: HwDesc) -> list[Problem]:
    problems: list[Problem] = []
    if hw.data_engine.level not in hw.levels:
        problems.append((("data_engine", "level"), f"level {hw.data_engine.level!r} does not exist; {_known('levels', hw.levels)}"))
    link = hw.host_link
    if link.memory not in hw.memories:
        return [(("host_link", "memory"), f"memory {link.memory!r} does not exist; {_known('memories', hw.memories)}")]
    n = hw.memory_instances(link.memory)
    for g in link.groups:
        if g >= n:
            problems.append((("host_link", "groups"), f"instance {g} of {link.memory} does not exist; the chip has {n}"))
    if int(link.window_bytes) > int(hw.memories[link.memory].capacity_bytes):
        problems.append((("host_link", "window_bytes"), f"the window is larger than {link.memory}"))
    return problems

"""Typed, immutable objects that mirror a hardware-description YAML one to one.

Each class is one section of the YAML; each field is one key. Validation is strict (a string
where a number belongs is an error, not a conversion) and unknown keys are rejected, so a typo
in a variant file cannot silently leave the base value in place. Cross-references (a memory's
level, a transfer's endpoints) are checked in `hwdesc.checks`, which knows the key paths.

The topology helpers at the end of `HwDesc` (instances per level, axis sizes, elements per long
word) are the navigation every other package needs; the figures a person reads (peaks,
bandwidths, totals) live in `hwdesc.figures`.
"""

from __future__ import annotations

import math
from functools import cached_property
from typing import Annotated, Any, Literal

from pydantic import (AfterValidator, BaseModel, BeforeValidator, ByteSize, ConfigDict, Field,
                      PrivateAttr)

from .errors import ReadOnlyError
from .source import Document, KeyPath, Location, Provenance


class FrozenDict(dict):
    """A dict that refuses to change, so that a loaded chip cannot be edited by accident."""

    def _read_only(self, *args: Any, **kwargs: Any) -> None:
        raise ReadOnlyError("hardware descriptions are immutable; copy the YAML and edit it instead")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = _read_only  # type: ignore[assignment]

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(tuple(self.items()))


def _as_tuple(value: Any) -> Any:
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list):
        return tuple(value)
    return value


Name = Annotated[str, Field(min_length=1)]
Names = Annotated[tuple[Name, ...], BeforeValidator(_as_tuple), Field(min_length=1)]
Count = Annotated[int, Field(gt=0)]
Rate = Annotated[float, Field(gt=0)]
Bytes = Annotated[ByteSize, Field(gt=0)]
PositiveBytes = Bytes


def Table(value_type: Any, *, min_length: int = 0) -> Any:
    """A mapping of names to entries, frozen after validation."""
    return Annotated[dict[Name, value_type], Field(min_length=min_length), AfterValidator(FrozenDict)]


class _Frozen(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class Level(_Frozen):
    """One level of the block tree (Group, L2B, L1B, MAB, PE)."""

    count: Count
    """Children per parent instance (Top has `Group.count` Groups)."""
    axis: Name | None = None
    """The layout axis this level contributes to; several consecutive levels may share one."""
    doc: str = ""


class Memory(_Frozen):
    """One kind of memory, present once per instance of its level."""

    level: Name
    capacity_bytes: Bytes
    address_unit: Literal["long_word", "word"]
    """What one address step selects: a 64-bit long word (DRAM..L1BM) or a 32-bit word (LM, GRF)."""
    ports: Literal["1RW", "1R1W"]
    """One read/write port, or one read and one write port. A PE instruction has one read-address
    field per memory, so all its operands read from one memory share an address pattern."""
    lw_per_cycle: Rate
    """Long words per cycle per port."""
    location: bool
    """Whether the compiler may keep a tensor here (MLSDK's Location: DRAM, LM0, LM1)."""
    faces: Count = 1
    """Equal parts of one instance (the matrix registers' two faces, $lx and $ly) that the
    instructions of one step use one each: a bundle's members touch distinct faces."""
    doc: str = ""

    @property
    def read_ports(self) -> int:
        """Ports that can read (the number before R in `ports`): the distinct read-address patterns
        one instruction may use here."""
        return int(self.ports.split("R", 1)[0])


class NumberFormat(_Frozen):
    """A number format; MN-Core's half is 1-6-9 with no denormals and no NaN."""

    bits: Count
    exponent_bits: Annotated[int, Field(ge=0)]
    mantissa_bits: Count
    denormals: bool
    nan: bool


class MatrixMode(_Frozen):
    """MAU matrix-vector mode for one dtype: y(rows) = A(rows x cols) b(cols) + c, once per cycle."""

    rows: Count
    cols: Count
    acc: Name
    """Format of c and y (half accumulates in float32)."""
    load_rows_per_cycle: Count
    """Matrix-register rows written per cycle when a new A is loaded."""


class VectorMode(_Frozen):
    """Element-wise mode for one dtype: lanes processed per cycle by one unit instance."""

    lanes_per_cycle: Count
    acc: Name


class Unit(_Frozen):
    """A compute unit (MAU per MAB, ALU per PE) and its throughput per dtype."""

    level: Name
    doc: str = ""
    slot: Name | None = None
    """The VLIW group its instructions issue in: PE-stream instructions in different groups may
    issue in the same steps (sim.isa, the issue model); none: it issues alone."""
    matrix: Table(MatrixMode) = FrozenDict()
    vector: Table(VectorMode) = FrozenDict()


class PeOpCost(_Frozen):
    """Where a PE operation runs and what it costs: `issues` PE instructions per lane-group of
    `unit` (a lane-group is what the unit's vector mode for the dtype processes in one step)."""

    unit: Name
    issues: Count


class PeOp(PeOpCost):
    """An element-wise PE operation: its default cost, and the number formats that run elsewhere.

    One op may be different instructions per format: a float32 add is the MAU's fvadd, an int32
    add the ALU's iadd, and an int32 multiply a whole ALU sequence. `dtypes` maps a format name
    to the unit and issues that replace the defaults for that format."""

    dtypes: Table(PeOpCost) = FrozenDict()
    """Per number format (e.g. int32): unit and issues that override the defaults above."""

    def cost(self, dtype: str) -> PeOpCost:
        """The unit and issues of this op on elements of format `dtype`."""
        return self.dtypes.get(dtype, self)


class TransferMode(_Frozen):
    """One mode of a transfer path (individual, broadcast, distribute, collect, reduce, ...)."""

    src_lw_per_cycle: Rate
    dst_lw_per_cycle: Rate
    unit_lw: Count = 1
    """Transfers are whole multiples of this many long words (the timing rounds up)."""
    chunk_lw: Count | None = None
    """Round-robin chunk of distribute/collect patterns."""
    cross_group_lw_per_cycle: Rate | None = None
    """Rate when source and destination are in different Groups (None: not offered)."""
    subsets: bool = False
    """A broadcast that can name a subset of the lower instances (the SDM's `l2bmb@set`): the
    XFER's index field holds the subset as a bit mask over the children of an upper instance."""


class Transfer(_Frozen):
    """A data path between memory kinds, the engine that drives it and its modes."""

    src: Names
    dst: Names
    engine: Literal["data_engine", "pe_stream", "host_link"]
    slot: Name | None = None
    """For PE-stream paths, the VLIW instruction group that drives them (l2bm, l1bm)."""
    group_level: Name | None = None
    """Level whose children the modes treat as one wide unit (MAB for the 16x1 l1bm modes);
    None: each instance of the lower memory stands alone."""
    latency_cycles: Annotated[int, Field(ge=0)]
    modes: Table(TransferMode, min_length=1)


class DataEngine(_Frozen):
    """Each Group's MV engine: asynchronous transfers joined by tags and waits."""

    level: Name
    """The level with one Data Engine per instance (Group)."""
    tags: Count
    queue_depth: Count


class HostLink(_Frozen):
    """The host connection: which memory of which Groups it reaches."""

    kind: Name
    memory: Name
    groups: Annotated[tuple[Annotated[int, Field(ge=0)], ...], BeforeValidator(_as_tuple), Field(min_length=1)]
    window_bytes: Bytes
    """How much of that memory the driver maps for host DMA."""


class HwDesc(_Frozen):
    """A whole chip: the root of a loaded hardware description."""

    name: Name
    summary: str = ""
    clock_hz: Count
    step_cycles: Count
    """Cycles per PE instruction (one step)."""
    long_word_bytes: Count
    word_bytes: Count
    levels: Table(Level, min_length=1)
    """The block tree, root to leaf."""
    memories: Table(Memory, min_length=1)
    formats: Table(NumberFormat, min_length=1)
    units: Table(Unit)
    pe_ops: Table(PeOp)
    transfers: Table(Transfer)
    data_engine: DataEngine
    host_link: HostLink
    hazards: Table(Annotated[int, Field(ge=0)])
    """Gaps in steps that software leaves between dependent PE-stream operations."""

    _document: Document | None = PrivateAttr(default=None)

    def attach_document(self, doc: Document) -> None:
        """Keep the YAML document this description was read from (its provenance and lines)."""
        self._document = doc

    def __eq__(self, other: object) -> bool:
        """Two descriptions are equal when they describe the same chip, wherever they were read."""
        return isinstance(other, HwDesc) and self.model_dump() == other.model_dump()

    def __hash__(self) -> int:
        return hash(self.fingerprint)

    # ---- provenance -------------------------------------------------------------------------

    def provenance(self, *path: str | int) -> Provenance | None:
        """Source, confidence and location of the value at a key path, e.g. ('clock_hz',)."""
        return self._document.provenance.get(tuple(path)) if self._document else None

    def location(self, *path: str | int) -> Location | None:
        """File and line where the key at `path` (or its nearest written parent) was written."""
        return self._document.location_of(tuple(path)) if self._document else None

    @property
    def provenance_table(self) -> dict[KeyPath, Provenance]:
        return dict(self._document.provenance) if self._document else {}

    @property
    def source_files(self) -> tuple[str, ...]:
        return self._document.files if self._document else ()

    @cached_property
    def fingerprint(self) -> str:
        """A stable digest of the chip's content, for cache keys and artifacts."""
        return _digest(self.model_dump(mode="json"))

    @cached_property
    def content_fingerprint(self) -> str:
        """The digest of what the chip is, without its name and summary: two descriptions of the
        same hardware under other names share it (a sweep keeps a point's rows by it)."""
        data = self.model_dump(mode="json")
        del data["name"], data["summary"]
        return _digest(data)

    # ---- topology -----------------------------------------------------------------------------

    @cached_property
    def level_names(self) -> tuple[str, ...]:
        return tuple(self.levels)

    def instances(self, level: str) -> int:
        """How many instances of `level` the chip has (product of counts from the root)."""
        total = 1
        for name in self.level_names[: self.level_names.index(level) + 1]:
            total *= self.levels[name].count
        return total

    def fanout(self, parent: str, child: str) -> int:
        """Instances of `child` under one instance of `parent`."""
        return self.instances(child) // self.instances(parent)

    def memory_instances(self, memory: str) -> int:
        return self.instances(self.memories[memory].level)

    def address_unit_bytes(self, memory: str) -> int:
        unit = self.memories[memory].address_unit
        return self.long_word_bytes if unit == "long_word" else self.word_bytes

    def memory_lw(self, memory: str) -> int:
        """Capacity of one instance in long words."""
        return int(self.memories[memory].capacity_bytes) // self.long_word_bytes

    def memory_words(self, memory: str) -> int:
        """Capacity of one instance in 32-bit words (the unit of mnsim's memory arrays)."""
        return int(self.memories[memory].capacity_bytes) // self.word_bytes

    @cached_property
    def axes(self) -> dict[str, int]:
        """Layout axes root to leaf and their sizes; an axis spans all the levels that feed it."""
        sizes: dict[str, int] = {}
        for name, level in self.levels.items():
            if level.axis is not None:
                sizes[level.axis] = sizes.get(level.axis, 1) * level.count
        return sizes

    def axis_levels(self, axis: str) -> tuple[str, ...]:
        return tuple(n for n, lv in self.levels.items() if lv.axis == axis)

    def axis_level(self, axis: str) -> str:
        """The deepest level of an axis: its instances are the axis positions."""
        return self.axis_levels(axis)[-1]

    def level_axis_stride(self, level: str) -> int:
        """How many positions of its axis one instance of `level` spans (L2B: 1, Group: 2)."""
        axis = self.levels[level].axis
        names = self.axis_levels(axis)
        return math.prod(self.levels[n].count for n in names[names.index(level) + 1:])

    def elements_per_lw(self, dtype: str) -> int:
        """How many elements of `dtype` one long word holds (the W axis size)."""
        return self.long_word_bytes * 8 // self.formats[dtype].bits

    def element_bytes(self, dtype: str) -> int:
        return self.formats[dtype].bits // 8

    def transfer(self, src: str, dst: str) -> tuple[str, Transfer] | None:
        """The path from memory kind `src` to `dst`, if the chip has one."""
        for name, t in self.transfers.items():
            if src in t.src and dst in t.dst:
                return name, t
        return None

    @property
    def leaf_level(self) -> str:
        return self.level_names[-1]


def _digest(data: dict) -> str:
    import hashlib
    import json
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]

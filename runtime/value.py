"""`DeviceValue`: a tensor held in a device buffer, in an IOSpec's layout.

What mlsdk's TensorProxy wraps. Where it came from matters to the runtime: a call's output
(`origin`) can be relocated into a consumer and its hand-over measured; a registered tensor's
handle (`registered`) follows the tensor's one device copy when a program or `load_from`
writes it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from compiler.iospec import IOSpec

from .device import DeviceBuffer

if TYPE_CHECKING:
    from .executable import Executable
    from .session import Call, Handover


@dataclass(frozen=True)
class Use:
    """One binding of a produced value: the consumer input, the spec it wanted, what binding cost."""

    consumer: str  # function name
    input: str
    spec: IOSpec
    cycles: int


@dataclass(eq=False)
class Origin:
    """The call that produced a value (which function and output, and what that call's
    counterfactuals need), and the uses of the value so far with their shared Handover record."""

    function: "Executable"
    output: str
    call: "CallContext"
    uses: list[Use] = field(default_factory=list)
    handover: "Handover | None" = None


@dataclass(eq=False)
class DeviceValue:
    buffer: DeviceBuffer
    spec: IOSpec
    shape: tuple[int, ...]
    producer: str | None = None  # how reports name it: "function.output", "registered name", ...
    origin: Origin | None = None
    registered: str | None = None  # the registered tensor this is a handle of
    owner: str = ""  # the label of the Runtime (Context) that holds it
    device_id: int = 0  # id() of the Device whose memory holds it
    version: int = 0  # bumped whenever the device value changes (host copies of older ones are stale)

    def show(self, buffer: DeviceBuffer, spec: IOSpec) -> None:
        """Point this handle at another device copy (its registered tensor was written)."""
        self.buffer, self.spec = buffer, spec
        self.version += 1


HOST, VALUE, RESIDENT = "host", "value", "resident"


@dataclass(frozen=True)
class Source:
    """Where a call's input came from: a host tensor, a device value (maybe another call's
    output), or a registered tensor's copy."""

    kind: str
    spec: IOSpec | None = None  # the layout it was in (device values and registered copies)
    origin: Origin | None = None
    cycles: int | None = 0  # what binding it cost as run (None: in functional mode)
    fresh: bool = False  # a registered tensor uploaded for this call (it had no device copy before)


@dataclass(frozen=True, eq=False)
class CallContext:
    """What a call's counterfactuals need after it ran: the function, its record, its inputs' sources."""

    function: Executable
    call: Call
    sources: dict[str, Source]

"""`DeviceValue`: a tensor held in a device buffer, in an IOSpec's layout.

What mlsdk's TensorProxy wraps. Where it came from matters to the runtime: a call's output
(`origin`) can be relocated into a consumer and its hand-over measured; a registered tensor's
handle (`registered`) follows the tensor's one device copy when a program or `load_from`
writes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from compiler.iospec import IOSpec

from .device import DeviceBuffer

if TYPE_CHECKING:
    from .executable import Executable
    from .session import Call


@dataclass(frozen=True, eq=False)
class Origin:
    """The call that produced a value: which function, which output, and that call's record."""

    function: "Executable"
    output: str
    call: "Call"


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

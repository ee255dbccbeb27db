"""`MNDevice(name)`: which (simulated) chip a Context runs on.

    "mncore2:auto", "mncore2:0" .. "mncore2:7", "emu2"   the simulated MN-Core 2
    "<chip>", "<chip>:auto", "<chip>:<n>"                 any hardware description (mini, mncore2_fastdram, ...)
    "path/to/chip.yaml" (optionally ":auto" / ":<n>")     a description file
    "pfvm:cpu"                                            the traced graph run by torch on the CPU (no cycles)
"""

from __future__ import annotations

import contextlib
import os
import threading
from typing import Iterator

import hwdesc
from hwdesc import HwDesc, HwDescError
from runtime import Device, DeviceError

from .collector import collector_held
from .errors import ArgumentError, DeviceNameError

BOARDS = 8  # mncore2:0 .. mncore2:7, as gpfn3-smi lists them on an 8-board server


_override: list[str | HwDesc] = []  # set by `mnsim run --device` and sweeps (innermost last)


@contextlib.contextmanager
def override(chip: str | HwDesc | None) -> Iterator[None]:
    """Inside, every MNDevice a script creates (except the pfvm:cpu reference) is `chip`, a
    device name or a description held in memory: how `mnsim run --device` runs an unmodified
    script on another chip, and how a sweep runs it on each variant it derives."""
    if chip is None:
        yield
        return
    if not isinstance(chip, HwDesc):
        _parse(chip)  # a bad name fails here, before the script runs
    _override.append(chip)
    try:
        yield
    finally:
        _override.pop()


class MNDevice:
    def __init__(self, device_name: str) -> None:
        if not isinstance(device_name, str):
            raise ArgumentError(f"MNDevice takes a device name string, got {type(device_name).__name__}")
        self.requested = device_name
        chip = _override[-1] if _override and device_name != "pfvm:cpu" else device_name
        if isinstance(chip, HwDesc):
            self._attach(chip.name, False, chip, None)
        else:
            with collector_held():  # reading a description allocates an object per YAML node
                self._attach(chip, *_parse(chip))

    def _attach(self, name: str, reference: bool, hw: HwDesc | None, index: int | None) -> None:
        self.name, self.reference, self.hw, self.index = name, reference, hw, index
        self._board: Device | None = None
        self._lock = threading.Lock()

    @property
    def board(self) -> Device:
        """The simulated chip (created on first use)."""
        if self.reference:
            raise DeviceError(f"{self.name} runs graphs with torch on the CPU; it has no simulated chip")
        with self._lock:  # two threads asking first get one chip
            if self._board is None:
                self._board = Device(self.hw)
        return self._board

    @property
    def chip(self) -> str:
        return "pfvm" if self.reference else self.hw.name

    @classmethod
    def of(cls, hw: HwDesc) -> "MNDevice":
        """A device on a description held in memory (a what-if variant that has no YAML file)."""
        device = cls.__new__(cls)
        device.requested = hw.name
        device._attach(hw.name, False, hw, None)
        return device

    def __repr__(self) -> str:
        return f"MNDevice({self.name!r})"


def _forms() -> str:
    return ("accepted device names: 'mncore2:auto', 'mncore2:0'..'mncore2:7', 'emu2', '<chip>', '<chip>:auto' or '<chip>:<n>' "
            f"for a hardware description, a path to a .yaml file, 'pfvm:cpu'; known chips: {', '.join(hwdesc.names())}")


def _parse(name: str) -> tuple[bool, HwDesc | None, int | None]:
    if name == "pfvm:cpu":
        return True, None, None
    if name.startswith("pfvm:"):
        raise DeviceNameError(f"{name!r}: this machine has no GPU; use 'pfvm:cpu' for reference runs. {_forms()}")
    if name == "emu2":
        return False, hwdesc.load("mncore2"), 0
    chip, _, index = name.rpartition(":") if ":" in name else (name, "", "")
    if not chip:
        chip, index = name, ""
    if index not in ("", "auto") and not (index.isascii() and index.isdigit()):
        chip, index = name, ""
    if len(index) > 1 and index.isdigit() and index.startswith("0"):  # '01' is not board 1's name
        raise DeviceNameError(f"{name!r}: a board number has no leading zeros ({chip}:{int(index)}). {_forms()}")
    if chip.endswith((".yaml", ".yml")) or os.sep in chip:
        if not os.path.isfile(chip):
            raise DeviceNameError(f"no hardware description file {chip!r}. {_forms()}")
    elif chip not in hwdesc.names():
        raise DeviceNameError(f"unknown device {name!r}. {_forms()}")
    n = None if index in ("", "auto") else int(index)
    if chip == "mncore2" and n is not None and n >= BOARDS:
        raise DeviceNameError(f"{name!r}: boards are numbered 0..{BOARDS - 1}. {_forms()}")
    try:
        return False, hwdesc.load(chip), n
    except HwDescError as e:
        raise DeviceNameError(f"device {name!r}: {e}") from None

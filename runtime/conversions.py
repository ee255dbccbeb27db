"""DRAM-to-DRAM conversion programs of one Context, and the timing of what-if transfers.

A conversion program is built once per pair of layouts (not of IO names) and kept with the fill
images it reads, placed on the device once. What-if transfers (a conversion that did not run, a
host round trip) are only timed: the timing model needs no data and no addresses.
"""

from __future__ import annotations

import json

from compiler.convert import Conversion, build_conversion
from compiler.errors import CompileError, LayoutError
from compiler.iospec import IOSpec

from .device import BOTH, TIMING, Device, DeviceBuffer, spec_placement
from .memory import allocating
from .session import LOAD, Run


def layout_key(spec: IOSpec) -> str:
    """What makes two copies interchangeable: everything but the IO name (as is_memcopyable_to)."""
    d = spec.to_json()
    d.pop("name")
    d.pop("lm_layout")
    return json.dumps(d, sort_keys=True)


def pair_key(src: IOSpec, dst: IOSpec) -> tuple[str, str, str, str]:
    """What a conversion program depends on: both layouts, and the LM layouts a transpose through
    the matrix registers takes as hints (compiler.kernels.transposer), so equal pairs with other
    hints get their own program."""
    return layout_key(src), layout_key(dst), str(src.lm_layout), str(dst.lm_layout)


class Conversions:
    def __init__(self, device: Device, record) -> None:
        self.device = device
        self._record = record  # Runtime.record: where the constants' uploads are reported
        self._programs: dict[tuple, Conversion | CompileError | LayoutError] = {}
        self._constants: dict[tuple, dict[str, DeviceBuffer]] = {}  # (pair_key..., zero_pad) -> placed fills
        self._timed: dict[tuple, int | None] = {}

    def __len__(self) -> int:
        """How many conversion programs were built to run."""
        return sum(not isinstance(p, Exception) for p in self._programs.values())

    def program(self, src: IOSpec, dst: IOSpec, zero_pad: bool = False) -> Conversion:
        """The DRAM-to-DRAM program that re-lays `src` as `dst` (writing zeros into its padding
        with `zero_pad`), built once per layout pair."""
        key = (*pair_key(src, dst), zero_pad)
        if key not in self._programs:
            try:
                self._programs[key] = build_conversion(src, dst, self.device.hw, zero_pad)
            except (CompileError, LayoutError) as e:  # (a gather too large to list: GatherTooLarge)
                self._programs[key] = e  # kept: a pair that has none is asked again on every call
        found = self._programs[key]
        if isinstance(found, Exception):
            raise found
        return found

    def run(self, src: IOSpec, src_buf: DeviceBuffer, dst: IOSpec, dst_buf: DeviceBuffer, mode: str = BOTH,
            zero_pad: bool = False):
        """Convert `src_buf` (in `src`) into `dst_buf` (in `dst`); the run's stats."""
        conv = self.program(src, dst, zero_pad)
        machine = self.device.machine
        with self.device.lock:
            with allocating(f"the scratch region of the conversion {conv.src.name} -> {conv.dst.name}"):
                scratch = machine.alloc_dram(conv.scratch_lw) if conv.scratch_lw else 0
            try:
                bases = {**conv.bases(src_buf.address, dst_buf.address, scratch), **self._placed(conv)}
                stats = machine.run(conv.program, bases=bases, mode=mode)
                dst_buf.valid = mode != TIMING and src_buf.valid
                return stats
            finally:
                if conv.scratch_lw:
                    machine.free_dram(scratch)

    def _placed(self, conv: Conversion) -> dict[str, int]:
        """The fill images a conversion reads, placed on the device once per conversion."""
        key = (*pair_key(conv.src, conv.dst), conv.zero_pad)
        if key not in self._constants:
            placed = {}
            for symbol, buffer in conv.constants.items():
                with allocating(f"constant {symbol!r} of the conversion {conv.src.name} -> {conv.dst.name}"):
                    placed[symbol] = self.device.alloc(buffer.placement, buffer.lw)
                if buffer.data is not None:
                    stats = self.device.upload(placed[symbol], buffer.data)
                    self._record(Run(LOAD, f"constants of convert {conv.src.name}", stats))
            self._constants[key] = placed
        return {symbol: buf.address for symbol, buf in self._constants[key].items()}

    def dst_lw(self, src: IOSpec, dst: IOSpec, zero_pad: bool = False) -> int:
        return self.program(src, dst, zero_pad).dst_lw

    # ---- what-if timing -----------------------------------------------------------------------

    def conversion_cycles(self, src: IOSpec, dst: IOSpec) -> int | None:
        """Cycles of converting `src` into `dst` (0 when one is memcopyable to the other; None
        when no conversion program exists for the pair)."""
        if src.is_memcopyable_to(dst):
            return 0
        key = ("conversion", *pair_key(src, dst))
        if key not in self._timed:
            try:
                self._timed[key] = self.device.machine.time(self.program(src, dst).program.code).total_cycles
            except (CompileError, LayoutError):  # (a gather too large to list: GatherTooLarge)
                self._timed[key] = None
        return self._timed[key]

    def upload_cycles(self, spec: IOSpec) -> int:
        return self._transfer_cycles(spec, upload=True)

    def download_cycles(self, spec: IOSpec) -> int:
        return self._transfer_cycles(spec, upload=False)

    def host_round_trip_cycles(self, src: IOSpec, dst: IOSpec) -> int:
        return self.download_cycles(src) + self.upload_cycles(dst)

    def _transfer_cycles(self, spec: IOSpec, upload: bool) -> int:
        key = ("upload" if upload else "download", layout_key(spec))
        if key not in self._timed:
            program = self.device.transfer_program(spec_placement(spec, self.device.hw), upload=upload)
            self._timed[key] = self.device.machine.time(program.code).total_cycles
        return self._timed[key]

    def held_lw(self) -> int:
        """Long words (per Group) of DRAM the conversion programs' constants hold."""
        return sum(buf.lw for placed in self._constants.values() for buf in placed.values())

    def free_all(self) -> None:
        for placed in self._constants.values():
            for buf in placed.values():
                self.device.free(buf)
        self._constants.clear()

"""`Runtime`: one Context's device state and what runs on it.

It owns the device buffers of the Context (call outputs, allocated input proxies, registered
tensors' copies, loaded programs, conversion programs and their constants), binds each call's
inputs (runtime.binder), runs programs, writes a training step's new state back into the
registered tensors' copies, and records every device run in its `Session`. Hand-overs between
calls are measured as they happen (runtime.whatif).

Calls, transfers and frees hold the device's lock: the simulated machine is one state, so calls
from several threads, or from Contexts sharing a device, run one after another and each sees the
values the one before it left.
"""

from __future__ import annotations

import itertools
import threading
import warnings
import weakref
from typing import Callable

import numpy as np
import torch

from compiler.iospec import IOSpec
from hwdesc.errors import MnsimError
from sim import DeviceMemoryError, RunStats

from .binder import Binder, Bound
from .conversions import Conversions
from .device import BOTH, FUNCTIONAL, Device, DeviceBuffer, check_host_value
from .errors import DeviceError, InputError, InvalidatedError, RegistrationError
from .executable import Executable
from .memory import Holder, explain, largest
from .resident import ResidentTensors
from .session import CALL, DOWNLOAD, LOAD, UPLOAD, Binding, Call, Run, Session, new_session
from .specs import default_spec
from .value import HOST, RESIDENT, VALUE, CallContext, DeviceValue, Origin, Source, Use
from .whatif import WhatIf

_ids = itertools.count(1)
_chain_ids = itertools.count()  # chains are numbered across Contexts (a report may cover several)


class Runtime:
    def __init__(self, device: Device | None, chip: str, device_name: str, clock_hz: int = 0) -> None:
        self.id = next(_ids)
        self.label = f"Context #{self.id} on {device_name}"  # how errors name the Context
        self.device = device
        self.session: Session = new_session(chip, clock_hz, self.label)
        self.observers: list[Callable[[Run], None]] = []
        self.lock = device.lock if device is not None else threading.RLock()
        self.invalidated = False
        self.executables: list[Executable] = []
        self._calls = 0  # calls run so far (Executable.last_call: which program to unload first)
        if device is not None:
            self.conversions = Conversions(device, self.record)
            self.binder = Binder(device, self.conversions, self.record)
            self.whatif = WhatIf(self.conversions)
        else:
            self.conversions = self.binder = self.whatif = None
        self.resident = ResidentTensors(self.binder, self.record, self.label)
        self._owned: "weakref.WeakSet[DeviceValue]" = weakref.WeakSet()
        self._stats: dict[tuple, list[RunStats]] = {}

    def __repr__(self) -> str:
        return f"Runtime({self.label})"

    @property
    def reference(self) -> bool:
        return self.device is None

    def check(self) -> None:
        if self.invalidated:
            raise InvalidatedError(f"{self.label} was invalidated; create a new Context")

    def board(self) -> Device:
        if self.device is None:
            raise DeviceError(f"{self.label} runs graphs with torch on the CPU; it has no simulated chip")
        return self.device

    def record(self, run: Run) -> None:
        """Every device run goes through here: into the session, then to the observers (traces).
        A run in functional mode has no stats and is not kept (it has no place on the clock)."""
        if run.stats is None:
            return
        run.stats = self._shared(run.stats)
        self.session.runs.append(run)
        for observer in self.observers:
            observer(run)

    # ---- programs -----------------------------------------------------------------------------

    def add(self, executable: Executable) -> Executable:
        """Keep a compiled function; a name another function of this Context has gets a number
        ("f#2"), so that records and reports tell them apart."""
        with self.lock:
            taken = {e.name for e in self.executables}
            if executable.name in taken:
                k = 2
                while f"{executable.name}#{k}" in taken:
                    k += 1
                executable.name = f"{executable.name}#{k}"
            self.executables.append(executable)
        return executable

    def _load(self, exe: Executable) -> None:
        if exe.loaded is None:
            loaded = self.board().load(exe.compiled)
            for stats in loaded.load_stats:
                self.record(Run(LOAD, f"constants of {exe.name}", stats))
            exe.loaded = loaded

    def call(self, exe: Executable, values: dict[str, "torch.Tensor | DeviceValue"]
             ) -> tuple[dict[str, DeviceValue], Call]:
        """Bind `values` (host tensors or device values, by input name), run the program, and
        return its outputs (the registered tensors' new values stay with them) and the call's
        record. A call that fails leaves no buffers and no runs behind."""
        with self.lock:
            self.check()
            while True:
                first_run = len(self.session.runs)
                try:
                    result = self._call(exe, values)
                    self._calls += 1
                    exe.last_call = self._calls
                    return result
                except MnsimError as e:
                    del self.session.runs[first_run:]  # its bindings were undone
                    if isinstance(e, DeviceMemoryError) and self._unload_least_recent(exe):
                        continue  # (after the call's own buffers were freed) room made: again
                    if isinstance(e, DeviceMemoryError):
                        self._explain_memory(e, f"{exe.name} ({self.label})")
                    e.add_note(f"while calling {exe.name} in {self.label}")
                    raise
                except BaseException:
                    del self.session.runs[first_run:]
                    raise

    def _unload_least_recent(self, keep: Executable) -> bool:
        """Unload the loaded program (its constants and temporaries) of the function called least
        recently but `keep`, to make room; False when none is loaded. It loads again when next
        called (its constants uploaded anew): a Context that compiles one function after another
        (a notebook cell run again, a sweep of shapes) would otherwise hold every one's DRAM."""
        loaded = [e for e in self.executables if e.loaded is not None and e is not keep]
        if not loaded:
            return False
        victim = min(loaded, key=lambda e: e.last_call)
        self.board().unload(victim.loaded)
        victim.loaded = None
        return True

    def _call(self, exe: Executable, values: dict) -> tuple[dict[str, DeviceValue], Call]:
        device, compiled = self.board(), exe.compiled
        for name, value in values.items():  # host values that cannot go to the device fail before anything runs
            if not isinstance(value, DeviceValue):
                check_host_value(value, compiled.inputs[name].dtype, f"{exe.name} input {name!r}")
            elif value.device_id != id(self.device):
                raise InputError(f"{exe.name}: input {name!r} is a proxy ({value.producer or 'a proxy'}) of "
                                 f"{value.owner}, whose device is not this one ({self.label}): pass proxy.cpu(), or "
                                 "compile both functions on one device")
            elif value.buffer.freed:  # checked under the device's lock: its Context was invalidated meanwhile
                raise InvalidatedError(f"{exe.name}: input {name!r} ({value.producer or 'a proxy'}) belongs to "
                                       f"{value.owner}, which was invalidated")
        self._load(exe)
        bound: dict[str, DeviceBuffer] = {}
        temporary: list[DeviceBuffer] = []
        bindings: list[Binding] = []
        sources: dict[str, Source] = {}
        first_run = len(self.session.runs)
        handed: list[tuple[int, DeviceValue]] = []
        try:
            for name, value in values.items():
                b = self._bind(exe, name, value)
                bound[name] = b.buffer
                bindings.append(b.binding)
                if b.temporary:
                    temporary.append(b.buffer)
                if isinstance(value, DeviceValue):
                    sources[name] = Source(VALUE, value.spec, value.origin, b.binding.cycles)
                    if value.origin is not None and value.origin.call.call.stats is not None:  # (a producer
                        # call in functional mode has no cycles to compare a hand-over with)
                        handed.append((len(bindings) - 1, value))
                else:
                    sources[name] = Source(HOST, cycles=b.binding.cycles)
            for name, registered in exe.resident.items():
                spec = compiled.inputs[name]
                fresh = not self.resident.has_copy(registered)
                b = self.resident.bind(exe.name, name, registered, spec, exe.need(name), exe.mode,
                                       clean=name in compiled.clean_inputs)
                bound[name] = b.buffer
                bindings.append(b.binding)
                sources[name] = Source(RESIDENT, spec, cycles=b.binding.cycles, fresh=fresh)
            # written in place when it fits, unless an input of the call reads the same buffer (a
            # registered tensor's handle passed as an input): the program would read it mid-update
            read_as_input = {id(bound[name]) for name in values}
            into = {out: bound[name] for name, out in compiled.updates.items()
                    if out in compiled.donated and bound[name].lw >= exe.output_lw(out)
                    and id(bound[name]) not in read_as_input}
            outputs, stats = device.call(exe.loaded, bound, into, exe.mode)
        finally:  # inputs uploaded or converted for this call only, also when a later one fails
            for buf in temporary:
                device.free(buf)
        for name, out in compiled.updates.items():  # the state the step leaves: its one device copy
            self.resident.replace(exe.resident[name], outputs.pop(out), compiled.inputs[name])
        timed = stats is not None
        if timed:
            stats = self._shared(stats)
            self.record(Run(CALL, exe.name, stats, compiled.program.labels))  # (its stats shared with earlier calls)
        self.session.resident_bytes = self.resident.resident_bytes()
        call = Call(exe.name, stats, compiled.program.labels, bindings, self.session.runs[first_run:],
                    compiled.phases, index=len(self.session.calls) if timed else -1, function_id=exe.id)
        if timed:
            self.session.calls.append(call)
        else:  # counted, not timed: reports say how many calls they leave out
            self.session.untimed_calls[exe.name] = self.session.untimed_calls.get(exe.name, 0) + 1
        context = CallContext(exe, call, sources)
        result = {}
        for name in exe.output_specs:  # owned first: whatever happens next, they are freed with their proxies
            value = DeviceValue(outputs[name], compiled.outputs[name], compiled.output_shapes[name],
                                f"{exe.name}.{name}", Origin(exe, name, context), owner=self.label,
                                device_id=id(self.device))
            result[name] = self.own(value)
        if handed and timed:
            try:
                self._measure(context, handed)
            except Exception as e:  # noqa: BLE001 - the call ran and its values stand; only its figures are missing
                warnings.warn(f"{exe.name} ({self.label}): hand-over figures not measured: {type(e).__name__}: {e}",
                              stacklevel=3)
        return result, call

    def _shared(self, stats: RunStats) -> RunStats:
        """The same timing as an earlier run (a program's timing does not depend on its data):
        that run's stats, so a loop of calls keeps one copy of the per-instruction arrays."""
        key = (stats.total_cycles, len(stats.start), stats.pe_busy, stats.host_busy, tuple(stats.engine_busy))
        for old in self._stats.setdefault(key, []):
            if all(np.array_equal(getattr(old, f), getattr(stats, f)) for f in ("start", "end", "unit", "engine_mask")) \
                    and old.bytes_per_path == stats.bytes_per_path and old.instructions == stats.instructions:
                return old
        self._stats[key].append(stats)
        return stats

    def _bind(self, exe: Executable, name: str, value: "torch.Tensor | DeviceValue") -> Bound:
        spec, need = exe.input_specs[name], exe.need(name)
        if not isinstance(value, DeviceValue):
            return self.binder.upload(exe.name, name, value, spec, need, exe.mode)
        return self.binder.bind_value(exe.name, name, value, spec, need, exe.mode)

    def _measure(self, consumer: CallContext, handed: list[tuple[int, DeviceValue]]) -> None:
        """Each hand-over of this call (the producer's output with all its uses so far), and the
        chain of calls it joins: the producers' calls and this one."""
        call = consumer.call
        chains = set()
        for index, value in handed:
            origin = value.origin
            binding = call.bindings[index]
            spec = consumer.function.input_specs[binding.input]
            origin.uses.append(Use(consumer.function.name, binding.input, spec, binding.cycles))
            measured = self.whatif.handover(origin)
            if origin.handover is None:
                origin.handover = measured
                self.session.handovers.append(measured)
            else:  # the output used again: its one record grows (every binding of it shows it)
                vars(origin.handover).update(vars(measured))
            binding.handover = origin.handover
            producer = origin.call.call
            if producer.unconstrained_cycles is None:
                producer.unconstrained_cycles = self.whatif.unconstrained_cycles(origin.call)
            if producer.chain is None:
                producer.chain = next(_chain_ids)
            chains.add(producer.chain)
        call.unconstrained_cycles = self.whatif.unconstrained_cycles(consumer)
        keep = min(chains)
        if len(chains) > 1:  # this call joins chains: they are one from now on
            for c in self.session.calls:
                if c.chain in chains:
                    c.chain = keep
        call.chain = keep

    def _explain_memory(self, e: DeviceMemoryError, where: str) -> None:
        """Name in `e` what holds the device's DRAM now, by what this Context keeps it for."""
        proxies: dict[str, int] = {}
        seen: set[int] = set()
        for value in list(self._owned):
            if not value.buffer.freed and id(value.buffer) not in seen:
                seen.add(id(value.buffer))
                key = value.producer or "a proxy"
                proxies[key] = proxies.get(key, 0) + value.buffer.lw
        programs = {exe.name: sum(b.lw for b in exe.loaded.resident.values())
                    + (exe.loaded.scratch.lw if exe.loaded.scratch is not None else 0)
                    for exe in self.executables if exe.loaded is not None}
        registered = self.resident.held_lw()
        holders = [Holder("registered tensors' device copies", len(registered), sum(registered.values()),
                          largest(registered)),
                   Holder("live output and input proxies", len(seen), sum(proxies.values()), largest(proxies)),
                   Holder("loaded programs' constants and temporaries", len(programs), sum(programs.values()),
                          largest(programs)),
                   Holder("conversion programs' constants", 0, self.conversions.held_lw())]
        explain(e, where, holders, self.device.allocated_lw(), self.device.params.lw_bytes)

    # ---- device values ------------------------------------------------------------------------

    def own(self, value: DeviceValue) -> DeviceValue:
        """Free the value's buffer when it is garbage (or when the Context is invalidated)."""
        self._owned.add(value)
        weakref.finalize(value, self.device.free, value.buffer)
        return value

    def allocate(self, exe: Executable, name: str) -> DeviceValue:
        """A device buffer for one of `exe`'s inputs, to be filled and passed to a call."""
        with self.lock:
            self.check()
            spec = exe.input_specs[name]
            try:
                buf = self.binder.alloc(spec, exe.need(name))
            except DeviceMemoryError as e:
                e.allocating = f"an input proxy for {name!r} ({spec.size_bytes} bytes)"
                self._explain_memory(e, f"{exe.name}.allocate_input_proxy ({self.label})")
                raise
            return self.own(DeviceValue(buf, spec, tuple(spec.shape), f"{exe.name}.allocate_input_proxy",
                                        owner=self.label, device_id=id(self.device)))

    def download(self, value: DeviceValue, record: bool = True) -> torch.Tensor:
        """The value on the host; `record=False` reads it again without timing (a value the
        report has already downloaded)."""
        with self.lock:
            self.check()
            tensor, stats = self.board().download(value.buffer, value.spec.dtype, value.shape,
                                                  value.producer or "this proxy",
                                                  mode=BOTH if record else FUNCTIONAL)
            if record:
                self.record(Run(DOWNLOAD, value.producer or "proxy", stats))
            return tensor

    def upload_into(self, value: DeviceValue, tensor: torch.Tensor) -> None:
        """Overwrite a device value from the host (a registered tensor's handle: its one copy)."""
        with self.lock:
            self.check()
            stats = self.board().upload(value.buffer, tensor, name=value.producer or "proxy")
            self.record(Run(UPLOAD, value.producer or "proxy", stats))
            value.version += 1
            if value.registered is not None:
                self.resident.written(value, uploaded=True)

    # ---- registered tensors -------------------------------------------------------------------

    def register(self, name: str, tensor: torch.Tensor) -> None:
        with self.lock:
            self.check()
            self.resident.register(name, tensor)

    def handle(self, tensor: torch.Tensor) -> DeviceValue:
        """The device value of a registered tensor, in the layout the first function reading it wants."""
        with self.lock:
            self.check()
            name = self.resident.name_of(tensor)
            if name is None:
                raise RegistrationError(f"{self.label}: this tensor is not registered (register_param / "
                                        "register_buffer)")
            spec, need = self.wanted_spec(name)
            return self.resident.handle(name, spec, need)

    def wanted_spec(self, name: str) -> tuple[IOSpec, int]:
        for exe in self.executables:
            if name in exe.compiled.resident:
                return exe.compiled.inputs[name], exe.need(name)
        return default_spec(name, self.resident.tensor(name), self.board().hw), 0

    def synchronize(self) -> None:
        with self.lock:
            self.check()
            if self.device is not None:
                self.resident.download_written()

    def resident_bytes(self) -> int:
        return 0 if self.device is None else self.resident.resident_bytes()

    def invalidate(self) -> None:
        """Release every device buffer of this Context; its values and functions stop working."""
        with self.lock:
            if not (self.invalidated or self.device is None):
                self.resident.free_all()
                self.conversions.free_all()
                for exe in self.executables:
                    if exe.loaded is not None:
                        self.device.unload(exe.loaded)
                        exe.loaded = None
                for value in list(self._owned):
                    self.device.free(value.buffer)
            self.invalidated = True



"""What a hand-over costs each way: the chain as run against its simulated counterfactuals.

For a producer output bound to a consumer input, the chain is the producer's call (its program
and its own input bindings) plus this binding. Three ways to run it, each timed by the
simulator's timing model on programs the compiler really builds:

* with the constraint: the producer compiled with `io_spec_constraints={output: consumer's
  spec}`, so the consumer relocates its buffer;
* without: the producer in its own preferred layout, plus the DRAM-to-DRAM conversion;
* host round trip: the producer in its own layout, plus download and upload.

The producer's own inputs are bound into each variant's layouts (an upload into the variant's
spec, a conversion from where the value was), so a constraint that changes the producer's input
layouts is counted too. "Saved" is the difference of whole-chain cycles and may be negative.

`unconstrained_cycles` gives a call's cycles with every function of its chain compiled without
constraints: summed over a chain (Session.chains) it is the chain's counterfactual as a whole.
"""

from __future__ import annotations

from dataclasses import dataclass

from compiler.compile import Compiled
from compiler.errors import CompileError
from compiler.iospec import IOSpec

from .conversions import Conversions
from .executable import Executable
from .session import Call, Handover
from .value import Origin

HOST, VALUE, RESIDENT = "host", "value", "resident"


@dataclass(frozen=True)
class Source:
    """Where a call's input came from: a host tensor, a device value (maybe another call's
    output), or a registered tensor's copy."""

    kind: str
    spec: IOSpec | None = None  # the layout it was in (device values and registered copies)
    origin: Origin | None = None


@dataclass(frozen=True, eq=False)
class CallContext:
    """What a call's counterfactuals need after it ran: the function, its record, its inputs' sources."""

    function: Executable
    call: Call
    sources: dict[str, Source]


class WhatIf:
    def __init__(self, conversions: Conversions) -> None:
        self.conversions = conversions
        self._program_cycles: dict[int, tuple[Compiled, int]] = {}

    def program_cycles(self, compiled: Compiled) -> int:
        key = id(compiled)
        if key not in self._program_cycles:
            machine = self.conversions.device.machine
            self._program_cycles[key] = (compiled, machine.time(compiled.program.code).total_cycles)
        return self._program_cycles[key][1]

    def transfer(self, src: IOSpec, dst: IOSpec) -> int:
        """Cycles to bring a device value in `src` into `dst`: nothing, a conversion, or the host."""
        cycles = self.conversions.conversion_cycles(src, dst)
        return cycles if cycles is not None else self.conversions.host_round_trip_cycles(src, dst)

    def bind_cycles(self, source: Source, dst: IOSpec, unconstrained_upstream: bool) -> int:
        if source.kind == HOST:
            return self.conversions.upload_cycles(dst)
        src = source.spec
        if unconstrained_upstream and source.origin is not None:
            src = source.origin.function.unconstrained().outputs[source.origin.output]
        return self.transfer(src, dst)

    def run_cycles(self, ctx: CallContext, variant: Compiled, unconstrained_upstream: bool = False) -> int:
        """A call of `variant` (the same function, other constraints) on the call's inputs."""
        if variant is ctx.function.compiled and not unconstrained_upstream:
            return ctx.call.cycles_with_bindings  # as run
        binds = sum(self.bind_cycles(src, variant.inputs[name], unconstrained_upstream)
                    for name, src in ctx.sources.items())
        return self.program_cycles(variant) + binds

    def unconstrained_cycles(self, ctx: CallContext) -> int | None:
        """The call with its bindings, every function of the chain compiled without constraints."""
        try:
            return self.run_cycles(ctx, ctx.function.unconstrained(), unconstrained_upstream=True)
        except CompileError:
            return None

    def handover(self, producer: CallContext, output: str, consumer: Executable, input_name: str,
                 spec: IOSpec, binding_cycles: int) -> Handover:
        fn = producer.function
        as_run = producer.call.cycles_with_bindings + binding_cycles
        constrained = output in fn.constraints
        notes = []
        without = host = with_ = None
        try:
            own = fn.without(output) if constrained else fn.compiled
            own_cycles = self.run_cycles(producer, own)
            conversion = self.transfer(own.outputs[output], spec)
            without = own_cycles + conversion
            host = own_cycles + self.conversions.host_round_trip_cycles(own.outputs[output], spec)
            if conversion == 0:
                notes.append("the layouts match without a constraint")
        except CompileError as e:
            notes.append(f"no unconstrained variant: {_first_line(e)}")
        try:
            if not constrained and without is not None and without == as_run and "match" in " ".join(notes):
                with_ = without  # relocated as it is: a constraint would change nothing
            elif constrained and fn.constraints[output].is_memcopyable_to(spec):
                with_ = self.run_cycles(producer, fn.compiled)
            else:
                variant = fn.constrained(output, spec)
                with_ = self.run_cycles(producer, variant) + self.transfer(variant.outputs[output], spec)
        except CompileError as e:
            notes.append(f"{fn.name} cannot be compiled with the constraint: {_first_line(e)}")
        handover = Handover(as_run, with_, without, host, constrained, "; ".join(notes))
        saved = handover.saved
        if saved is not None and "match" not in handover.note:
            if saved > 0 and not constrained:
                handover.advice = (f"compile {fn.name} with io_spec_constraints={{{output!r}: "
                                   f"{consumer.name}.input_specs[{input_name!r}]}} to relocate instead and save "
                                   f"{saved} cycles")
            elif saved <= 0 and not constrained:
                handover.note = _join(handover.note, f"a constraint would cost {-saved} cycles ({fn.name} gets "
                                                     "slower than the conversion it avoids)")
            elif saved < 0:
                handover.note = _join(handover.note, f"the constraint costs {-saved} cycles: {fn.name} compiled "
                                                     "without it and converted is faster")
        return handover


def _first_line(e: Exception) -> str:
    return str(e).splitlines()[0]


def _join(a: str, b: str) -> str:
    return f"{a}; {b}" if a else b

"""What a hand-over costs each way: the chain as run against its simulated counterfactuals.

For a producer call's output, the chain is that call (its program and its own input bindings)
plus every binding of the output so far (one output may feed several consumers, or one consumer
several times). Three ways to run it, each timed by the simulator's timing model on programs
the compiler really builds:

* with the constraint: the producer compiled with `io_spec_constraints={output: spec}` for the
  use whose layout makes the chain cheapest (as run, when it was constrained), so that use
  relocates the buffer and the others convert from it;
* without: the producer in its own preferred layout, plus a DRAM-to-DRAM conversion per use;
* host round trip: the producer in its own layout, plus a download and an upload per use.

The producer's own inputs are bound into each variant's layouts (an upload into the variant's
spec, a conversion from where the value was), so a constraint that changes the producer's input
layouts is counted too. "Saved" is the difference of whole-chain cycles and may be negative.

`unconstrained_cycles` gives a call's cycles with every function of its chain compiled without
constraints: summed over a chain (Session.chains) it is the chain's counterfactual as a whole.
"""

from __future__ import annotations

from compiler.compile import Compiled
from compiler.iospec import IOSpec
from hwdesc.errors import MnsimError

from .conversions import Conversions, layout_key
from .session import Handover
from .value import HOST, RESIDENT, CallContext, Origin, Use

class WhatIf:
    def __init__(self, conversions: Conversions) -> None:
        self.conversions = conversions
        self._program_cycles: dict[int, tuple[Compiled, int]] = {}
        self._resident_charge: dict[tuple[int, str], tuple[int, int]] = {}  # (variant, input) -> (call, cycles)

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

    def bind_cycles(self, ctx: CallContext, name: str, variant: Compiled, unconstrained_upstream: bool) -> int:
        source, dst = ctx.sources[name], variant.inputs[name]
        if source.kind == HOST:
            return self.conversions.upload_cycles(dst)
        if source.kind == RESIDENT:
            if source.spec.is_memcopyable_to(dst):
                return source.cycles  # the copy the call used serves the variant too
            # a registered tensor gets a copy in a new layout once and keeps it: uploaded straight
            # into it when the variant's first call is the first to read it (an upload, outside the
            # chain, as in the run), else converted from the copy there was, once
            first, cycles = self._resident_charge.setdefault(
                (id(variant), name), (ctx.call.index, 0 if source.fresh else self.transfer(source.spec, dst)))
            return cycles if first == ctx.call.index else 0
        src = source.spec
        if unconstrained_upstream and source.origin is not None:
            src = source.origin.function.unconstrained().outputs[source.origin.output]
        return self.transfer(src, dst)

    def run_cycles(self, ctx: CallContext, variant: Compiled, unconstrained_upstream: bool = False) -> int:
        """A call of `variant` (the same function, other constraints) on the call's inputs."""
        if variant is ctx.function.compiled and not unconstrained_upstream:
            return ctx.call.cycles_with_bindings  # as run
        binds = sum(self.bind_cycles(ctx, name, variant, unconstrained_upstream) for name in ctx.sources)
        return self.program_cycles(variant) + binds

    def unconstrained_cycles(self, ctx: CallContext) -> int | None:
        """The call with its bindings, every function of the chain compiled without constraints."""
        try:
            return self.run_cycles(ctx, ctx.function.unconstrained(), unconstrained_upstream=True)
        except MnsimError:  # no variant (a codegen_dir's program), or it does not fit: unknown
            return None

    def handover(self, origin: Origin) -> Handover:
        """The chain of a produced value and all its uses so far, as run and each other way."""
        producer, fn, output = origin.call, origin.function, origin.output
        uses = origin.uses
        as_run = producer.call.cycles_with_bindings + sum(u.cycles for u in uses)
        constrained = output in fn.constraints
        notes: list[str] = []
        without = host = with_ = target = None
        try:
            own = fn.without(output) if constrained else fn.compiled
            own_cycles = self.run_cycles(producer, own)
            conversions = [self.transfer(own.outputs[output], u.spec) for u in uses]
            without = own_cycles + sum(conversions)
            host = own_cycles + sum(self.conversions.host_round_trip_cycles(own.outputs[output], u.spec)
                                    for u in uses)
            if not any(conversions):
                notes.append("the layouts match without a constraint")
        except MnsimError as e:
            notes.append(f"no unconstrained variant of {fn.name}: {_first_line(e)}")
        if constrained:
            with_ = as_run  # it ran with the constraint
        elif without is not None and "match" in " ".join(notes):
            with_ = without  # relocated as it is: a constraint would change nothing
        else:  # the best of constraining the output to one of its uses' layouts
            for u in _distinct(uses):
                try:
                    variant = fn.constrained(output, u.spec)
                    cycles = self.run_cycles(producer, variant) + sum(
                        self.transfer(variant.outputs[output], v.spec) for v in uses)
                except MnsimError as e:
                    notes.append(f"{fn.name} cannot be compiled for {u.consumer}.{u.input}'s layout: {_first_line(e)}")
                    continue
                if with_ is None or cycles < with_:
                    with_, target = cycles, f"{u.consumer}.input_specs[{u.input!r}]"
        handover = Handover(f"{fn.name}.{output}", [f"{u.consumer}.{u.input}" for u in uses], as_run, with_, without,
                            host, constrained, "; ".join(notes), target)
        saved = handover.saved
        if saved is not None and not handover.note.startswith("the layouts match"):
            if saved == 0 and not constrained:
                handover.note = _join(handover.note, f"a constraint saves nothing here ({fn.name} gets slower by "
                                                     "what the conversions cost)")
            elif saved < 0 and not constrained:
                handover.note = _join(handover.note, f"a constraint would cost {-saved:,} cycles a call ({fn.name} gets "
                                                     "slower than the conversions it avoids)")
            elif saved < 0:
                handover.note = _join(handover.note, f"the constraint costs {-saved:,} cycles a call: {fn.name} compiled "
                                                     "without it and converted is faster")
        best = min(x for x in (with_, without) if x is not None) if (with_, without) != (None, None) else None
        if host is not None and best is not None and host < best:
            handover.note = _join(handover.note, f"a host round trip (download + upload) would be cheaper still: "
                                                 f"{host:,} cycles a call, {best - host:,} fewer")
        return handover


def _distinct(uses: list[Use]) -> list[Use]:
    """One use per layout wanted (the first that wants it)."""
    seen: dict[str, Use] = {}
    for u in uses:
        seen.setdefault(layout_key(u.spec), u)
    return list(seen.values())


def _first_line(e: Exception) -> str:
    return str(e).splitlines()[0]


def _join(a: str, b: str) -> str:
    return f"{a}; {b}" if a else b

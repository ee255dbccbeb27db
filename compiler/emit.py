"""Plan -> Program: every step's kernel emitted in order into one context.

Emission makes no decision: each kernel emits what the planner chose for it (the same code the
planner timed). What emission learns is recorded for scheduling: which buffer symbols each step
touches (temporaries a kernel makes for itself included) and how far into each buffer the
program's transfers reach.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from itertools import islice

from sim import Program
from sim.builder import InstructionLimit
from sim.validate import symbol_extents

from .errors import CompileError
from .hostmem import host_memory_available
from .kernels.context import Buffer, EmitContext
from .planner.plan import Plan

# Host memory one instruction takes at the peak of building, validating and simulating its
# program (24 int64 fields and the copies made of them: ResNet-18 at 224 x 224, 7.3 M
# instructions, peaked at 9.3 GB during its call). A host policy, not a hardware number.
HOST_BYTES_PER_INSTRUCTION = 1536


def instruction_budget() -> int | None:
    """The instructions a program may have so that building and simulating it fits the host's
    free memory: a larger one is refused at compile instead of exhausting the host."""
    available = host_memory_available()
    return None if available is None else available // HOST_BYTES_PER_INSTRUCTION


@dataclass
class Emitted:
    program: Program
    buffers: dict[str, Buffer]
    touched: list[set[str]]  # per step, the buffer symbols it reads or writes
    phases: list[tuple[int, int, str]]  # [start, end) instruction ranges per phase of a training step


def emit(plan: Plan) -> Emitted:
    budget = instruction_budget()
    ctx = EmitContext(plan.hw, plan.options, budget)
    ctx.buffers.update({s: replace(b) for s, b in plan.buffers.items()})
    touched: list[set[str]] = []
    phases: list[tuple[int, int, str]] = []
    phase = "forward"
    for number, step in enumerate(plan.steps, 1):
        before, first = len(ctx.buffers), ctx.b.count
        try:
            with ctx.label(step.label):
                step.kernel.emit(ctx, step.refs)
        except InstructionLimit:
            raise CompileError(
                f"the program passes {budget:,} instructions at {step.label} (step {number} of "
                f"{len(plan.steps)}): building and simulating it would take more than the "
                f"{budget * HOST_BYTES_PER_INSTRUCTION / 2 ** 30:.1f} GiB of host memory free; compile a smaller "
                f"batch or image, or split the model into several compiled functions") from None
        # the buffers the step made: ctx.buffers only grows, so they are its last entries (a set of
        # every buffer per step made a training step of thousands of buffers and steps take seconds)
        made = islice(reversed(ctx.buffers), len(ctx.buffers) - before)
        touched.append({r.symbol for r in step.refs.values()} | set(made))
        phase = step.kernel.nodes[0].phase if step.kernel.nodes else phase  # a copy belongs with its source
        if ctx.b.count > first:
            if phases and phases[-1][2] == phase and phases[-1][1] == first:
                phases[-1] = (phases[-1][0], ctx.b.count, phase)
            else:
                phases.append((first, ctx.b.count, phase))
    program = ctx.b.build()
    for symbol, (_, extent) in symbol_extents(ctx.params, program.code, program.relocs, program.symbols).items():
        ctx.buffers[symbol].reach = extent
    used = set(program.symbols) | set(plan.input_symbols.values()) | set(plan.output_symbols.values())
    buffers = {s: b for s, b in ctx.buffers.items() if s in used}
    return Emitted(program, buffers, touched, phases)

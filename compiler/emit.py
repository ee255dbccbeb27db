"""Plan -> Program: every step's kernel emitted in order into one context.

Emission makes no decision: each kernel emits what the planner chose for it (the same code the
planner timed). What emission learns is recorded for scheduling: which buffer symbols each step
touches (temporaries a kernel makes for itself included) and how far into each buffer the
program's transfers reach.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from sim import Program
from sim.validate import symbol_extents

from .kernels.context import Buffer, EmitContext
from .planner.plan import Plan


@dataclass
class Emitted:
    program: Program
    buffers: dict[str, Buffer]
    touched: list[set[str]]  # per step, the buffer symbols it reads or writes
    phases: list[tuple[int, int, str]]  # [start, end) instruction ranges per phase of a training step


def emit(plan: Plan) -> Emitted:
    ctx = EmitContext(plan.hw, plan.options)
    ctx.buffers.update({s: replace(b) for s, b in plan.buffers.items()})
    touched: list[set[str]] = []
    phases: list[tuple[int, int, str]] = []
    phase = "forward"
    for step in plan.steps:
        before, first = set(ctx.buffers), ctx.b.count
        with ctx.label(step.label):
            step.kernel.emit(ctx, step.refs)
        touched.append({r.symbol for r in step.refs.values()} | (set(ctx.buffers) - before))
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

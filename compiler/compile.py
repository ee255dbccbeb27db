"""`compile_function`: torch function + sample inputs -> a Program with IOSpecs, for one chip.

    trace (frontend: make_fx, decompositions, legalization to primitives)
    -> capacity check -> rewrite (primitives in the kernels' forms)
    -> plan (the whole graph: layouts, tilings, relayouts, each choice timed)
    -> emit (the plan's kernels, in order) -> schedule (temporaries share one scratch region)

The result, `Compiled`, is everything the runtime needs to run the function: the program with
relocatable buffer symbols, each buffer's role and layout, constants (placed on the device at
load), IOSpecs, and a summary for reports. It is plain data, so an artifact can store it.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from math import prod
from typing import Any, Callable

import torch

from hwdesc import HwDesc
from sim import DeviceMemoryError, Program

from .emit import emit
from .errors import CompileError, UnsupportedOpError
from .frontend.tracing import trace
from .donate import can_write_in_place, mv_ranges
from .iospec import IOSpec
from .ir import Graph, Value
from .kernels.base import device_dtype
from .kernels.context import Buffer
from .planner.rewrite import rewrite
from .planner.search import Planner
from .schedule import schedule


@dataclass
class Compiled:
    hw: HwDesc
    program: Program
    buffers: dict[str, Buffer]
    inputs: dict[str, IOSpec]
    outputs: dict[str, IOSpec]
    input_symbols: dict[str, str]  # IO name -> buffer symbol
    output_symbols: dict[str, str]
    output_shapes: dict[str, tuple[int, ...]]  # logical shapes (0-d tensors are laid out as (1,))
    out_spec: Any = None
    summary: dict = field(default_factory=dict)
    graph: Any = field(default=None, repr=False)  # the traced graph, when compiled in this process
    resident: dict[str, torch.Tensor] = field(default_factory=dict, repr=False)
    """Device-resident inputs (registered tensors) and their values at compile time: a codegen_dir
    carries them so that a loader need not register the model again."""
    scratch_lw: int = 0  # long words per Group of the region the temporaries share
    updates: dict[str, str] = field(default_factory=dict)
    """Resident input name -> the output holding its new value (a training step's state)."""
    donated: set[str] = field(default_factory=set)
    """Update outputs the program writes into their input's own buffer (every read of the old
    value comes first), so the state is updated in place."""
    phases: list[tuple[int, int, str]] = field(default_factory=list)
    """[start, end) instruction ranges of the forward, backward and optimizer parts of the program."""
    constraints: dict[str, IOSpec] = field(default_factory=dict)
    """The io_spec_constraints it was compiled with (what a hand-over's counterfactual drops)."""
    clean_inputs: set[str] = field(default_factory=set)
    """Resident inputs the program reads as if their padding held zeros (a weight whose padded
    channels a product sums, read by view or gathered with them): the runtime binds each a copy
    whose padding holds zeros."""


def compile_function(fn: Callable, inputs: Any, hw: HwDesc, *, options: dict | None = None,
                     constraints: dict[str, IOSpec] | None = None,
                     resident: Callable[[torch.Tensor], str | None] | None = None) -> Compiled:
    """`resident(t)` names captured tensors that live on the device between calls (registered
    parameters, buffers, optimizer state): they become inputs of that name instead of constants,
    and what the function writes into them becomes an update the program leaves for the next call."""
    start = time.perf_counter()
    return compile_traced(trace(fn, inputs, resident), hw, options=options, constraints=constraints, start=start)


def compile_traced(graph: Graph, hw: HwDesc, *, options: dict | None = None,
                   constraints: dict[str, IOSpec] | None = None, start: float | None = None) -> Compiled:
    """`compile_function` for a graph already traced (a cache lookup traces first)."""
    start = time.perf_counter() if start is None else start
    compiled = compile_graph(graph, hw, options=options or {}, constraints=constraints or {})
    compiled.graph = graph
    compiled.constraints = dict(constraints or {})
    compiled.resident = {name: t.detach() for name, t in graph.resident.items()}
    compiled.summary["compile_seconds"] = round(time.perf_counter() - start, 4)
    return compiled


def check_capacity(graph: Graph, hw: HwDesc) -> None:
    """Refuse, before any per-element work, a program whose tensors cannot fit the chip's DRAM."""
    from .chain import Chain
    chain = Chain.of(hw)
    capacity = hw.memory_lw(chain.dram) * chain.groups  # long words on the chip
    made_by = {v: n for n in graph.nodes for v in n.outputs}
    values = [*graph.inputs.values(), *graph.constants, *made_by]

    def lw(v: Value) -> int:
        return -(-prod(v.shape) // hw.elements_per_lw(device_dtype(v)))
    for v in values:
        if lw(v) > capacity:
            node = made_by.get(v)
            where = f", made by {node.aten or node.op}" + (f" at {node.source}" if node.source else "") if node else ""
            raise DeviceMemoryError(chain.dram, lw(v), capacity, capacity, "long words",
                                    what=f"tensor {v.name!r} ({v.dtype}{list(v.shape)}{where})")
    io = sum(lw(v) for v in [*graph.inputs.values(), *graph.constants, *set(graph.outputs.values())])
    if io > capacity:
        raise DeviceMemoryError(chain.dram, io, capacity, capacity, "long words",
                                what="the function's inputs, constants and outputs together")


_COMPILING = threading.RLock()


def compile_graph(graph: Graph, hw: HwDesc, *, options: dict, constraints: dict[str, IOSpec]) -> Compiled:
    """Plan, emit and schedule a traced graph. One compile runs at a time in a process: the
    planner's caches (placements, gathers) are shared, and a graph is rewritten in place."""
    with _COMPILING:
        return _compile_graph(graph, hw, options=options, constraints=constraints)


def _check_not_empty(graph: Graph) -> None:
    """Refuse tensors with no elements that the device would have to hold, naming the op that
    makes one (or the input): a slice of nothing that others read, an empty input read or
    returned. A sum over an empty dimension is folded to zeros before this, and an empty
    constant fill (torch.zeros(0, 3)) needs no storage, so both still compile."""
    returned = set(graph.outputs.values())
    for name, v in graph.inputs.items():
        if v.numel == 0 and (v in returned or any(v in n.inputs for n in graph.nodes)):
            raise CompileError(f"input {name!r} has no elements (shape {list(v.shape)}); mnsim cannot place an "
                               "empty tensor on the device")
    for node in graph.nodes:
        if node.kind in ("full", "iota"):
            continue
        for v in node.outputs:
            if v.numel == 0:
                raise UnsupportedOpError(node.aten or node.kind, [list(a.shape) for a in node.inputs], node.source,
                                         f"it makes a tensor with no elements (shape {list(v.shape)}), which mnsim "
                                         "cannot place on the device")


def _compile_graph(graph: Graph, hw: HwDesc, *, options: dict, constraints: dict[str, IOSpec]) -> Compiled:
    check_capacity(graph, hw)
    rewrite(graph, hw, options)
    graph.drop_dead()
    _check_not_empty(graph)
    plan = Planner(graph, hw, options, constraints).plan()
    emitted = emit(plan)
    buffers = emitted.buffers
    from .chain import Chain
    scratch_lw = schedule(buffers, emitted.touched, plan_params(hw), hw.memory_lw(Chain.of(hw).dram))
    program = emitted.program
    _check_dram(hw, buffers, scratch_lw)
    inputs = {name: _spec(name, graph.inputs[name], buffers[sym]) for name, sym in plan.input_symbols.items()}
    outputs = {name: _spec(name, graph.outputs[name], buffers[sym]) for name, sym in plan.output_symbols.items()}
    updates = graph.update_outputs()
    ranges = mv_ranges(program)
    donated = {out for name, out in updates.items()
               if can_write_in_place(program, plan.input_symbols[name], plan.output_symbols[out], ranges)}
    summary = {"chip": hw.name, "ops": [n.label for n in graph.nodes], "instructions": len(program),
               "steps": plan.describe(), "planned_cycles": plan.cycles,
               "layouts": {b.symbol: str(b.placement.layout) for b in buffers.values()}}
    return Compiled(hw, program, buffers, inputs, outputs, plan.input_symbols, plan.output_symbols,
                    {name: graph.outputs[name].shape for name in graph.outputs}, graph.out_spec, summary,
                    scratch_lw=scratch_lw, updates=updates, donated=donated, phases=emitted.phases,
                    clean_inputs=set(plan.clean_inputs))


def plan_params(hw: HwDesc):
    from sim import MachineParams
    return MachineParams.from_hw(hw)


def _check_dram(hw: HwDesc, buffers: dict[str, Buffer], scratch_lw: int) -> None:
    from .chain import Chain
    dram = Chain.of(hw).dram
    capacity = hw.memory_lw(dram)
    need = scratch_lw + sum(b.lw for b in buffers.values() if b.role != "temp")
    if need > capacity:
        largest = max((b for b in buffers.values() if b.role != "temp"), key=lambda b: b.lw, default=None)
        what = f"the program's buffers (largest: {largest.symbol}, {largest.lw} long words; scratch {scratch_lw})" \
            if largest else f"the program's scratch region ({scratch_lw} long words)"
        raise DeviceMemoryError(dram, need, capacity, capacity, "long words per Group", what=what)


def _spec(name: str, v: Value, buf: Buffer) -> IOSpec:
    return IOSpec.in_dram(name, v.shape, v.torch_dtype or v.dtype, buf.placement, buf.lm)

"""`compile_function`: torch function + sample inputs -> a Program with IOSpecs, for one chip.

    trace -> constraints -> lower every node (kernels) -> outputs into buffers of their own -> Program

The result, `Compiled`, is everything the runtime needs to run the function: the program with
relocatable buffer symbols, each buffer's role and layout, constants (placed on the device at
load), IOSpecs, and a summary for reports. It is plain data, so an artifact can store it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from hwdesc import HwDesc
from sim import Program
from sim.validate import symbol_extents

from .codegen import Buffer, CodeGen, Ref
from .errors import SpecMismatchError
from .frontend import Graph, Value, trace
from .iospec import IOSpec
from .lower import lower
from .lower.kernel import lshape, ref_of
from .plan import choose


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


def compile_function(fn: Callable, inputs: Any, hw: HwDesc, *, options: dict | None = None,
                     constraints: dict[str, IOSpec] | None = None,
                     resident: Callable[[torch.Tensor], str | None] | None = None) -> Compiled:
    """`resident(t)` names captured tensors that live on the device between calls (registered
    parameters): they become inputs of that name instead of constants."""
    start = time.perf_counter()
    return compile_traced(trace(fn, inputs), hw, options=options, constraints=constraints, resident=resident,
                          start=start)


def compile_traced(graph: Graph, hw: HwDesc, *, options: dict | None = None,
                   constraints: dict[str, IOSpec] | None = None,
                   resident: Callable[[torch.Tensor], str | None] | None = None,
                   start: float | None = None) -> Compiled:
    """`compile_function` for a graph already traced (a cache lookup traces first)."""
    start = time.perf_counter() if start is None else start
    promoted: dict[str, torch.Tensor] = {}
    if resident is not None:
        for value in list(graph.constants):
            name = resident(value.origin)
            if name is not None:
                graph.promote(value, name)
                promoted[name] = value.data
    compiled = compile_graph(graph, hw, options=options or {}, constraints=constraints or {})
    compiled.graph = graph
    compiled.resident = promoted
    compiled.summary["compile_seconds"] = round(time.perf_counter() - start, 4)
    return compiled


def compile_graph(graph: Graph, hw: HwDesc, *, options: dict, constraints: dict[str, IOSpec]) -> Compiled:
    cg = CodeGen(hw, options)
    _apply_constraints(cg, graph, constraints)
    for node in graph.nodes:
        lower(cg, node)
    in_symbols = {name: _input_ref(cg, v).symbol for name, v in graph.inputs.items()}
    out_symbols: dict[str, str] = {}
    taken: set[str] = set(in_symbols.values())
    for name, v in graph.outputs.items():
        ref = _output_ref(cg, v, name, taken, constraints.get(name))
        out_symbols[name] = ref.symbol
        taken.add(ref.symbol)
    program = cg.b.build()
    for symbol, (_, extent) in symbol_extents(cg.params, program.code, program.relocs, program.symbols).items():
        cg.buffers[symbol].reach = extent
    used = set(program.symbols)
    for symbol in list(cg.buffers):  # drop buffers no instruction touches (a view's base, say)
        if symbol not in used and symbol not in taken:
            del cg.buffers[symbol]
    inputs = {name: _spec(cg, name, graph.inputs[name], cg.buffers[sym]) for name, sym in in_symbols.items()}
    outputs = {name: _spec(cg, name, graph.outputs[name], cg.buffers[sym], cg.refs[graph.outputs[name]])
               for name, sym in out_symbols.items()}
    summary = {"chip": hw.name, "ops": [n.op for n in graph.nodes], "instructions": len(program),
               "layouts": {b.symbol: str(b.placement.layout) for b in cg.buffers.values()}}
    return Compiled(hw, program, cg.buffers, inputs, outputs, in_symbols, out_symbols,
                    {name: graph.outputs[name].shape for name in graph.outputs}, graph.out_spec, summary)


def _apply_constraints(cg: CodeGen, graph: Graph, constraints: dict[str, IOSpec]) -> None:
    for name, spec in constraints.items():
        if not isinstance(spec, IOSpec):
            raise SpecMismatchError(f"io_spec_constraints[{name!r}] is a {type(spec).__name__}, not an IOSpec")
        value = graph.inputs.get(name) or graph.outputs.get(name)
        if value is None:
            known = ", ".join([*graph.inputs, *graph.outputs])
            raise SpecMismatchError(f"io_spec_constraints names {name!r}, which is neither an input nor an output; "
                                    f"the function has {known}")
        if tuple(spec.shape) != value.shape or spec.dtype != value.dtype:
            raise SpecMismatchError(f"io_spec_constraints[{name!r}] is {spec.dtype}{list(spec.shape)} (from "
                                    f"{spec.name!r}) but {name!r} is {value.dtype}{list(value.shape)}")
        if spec.chip_fingerprint != cg.hw.fingerprint:
            raise SpecMismatchError(f"io_spec_constraints[{name!r}] was compiled for chip {spec.chip!r}; this compile "
                                    f"targets {cg.hw.name!r}")
        placement = spec.placement(cg.hw, cg.device_dtype(value))
        if name in graph.inputs:
            cg.refs[value] = cg.buffer("input", placement, value.name, lm=spec.lm_layout)
        elif spec.lm_layout is not None:
            cg.wishes[value] = spec.lm_layout


def _input_ref(cg: CodeGen, v: Value) -> Ref:
    """An input no kernel read (an unused or directly returned input) still gets a buffer."""
    if v not in cg.refs:
        layout = choose(lshape(v), cg.device_dtype(v), cg.hw, budget_lw=cg.hw.memory_lw("LM0"))
        ref_of(cg, v, layout)
    return cg.refs[v]


def _output_ref(cg: CodeGen, v: Value, name: str, taken: set[str], spec: IOSpec | None) -> Ref:
    """Each output in a buffer of its own, in the constrained layout if there is one."""
    if v not in cg.refs:
        _input_ref(cg, v)
    ref = cg.refs[v]
    wanted = spec.placement(cg.hw, cg.device_dtype(v)) if spec is not None else None
    shared = ref.symbol in taken or cg.buffers[ref.symbol].role in ("input", "const")
    if wanted is not None and not ref.placement.same_placement(wanted):
        ref = cg.convert(ref, wanted, "output", name)
    elif shared:
        ref = cg.convert(ref, ref.placement, "output", name)
    else:  # the output is this buffer, read as the ref says (a view, such as a conv's NCHW, included)
        buffer = cg.buffers[ref.symbol]
        buffer.role, buffer.placement, buffer.lm = "output", ref.placement, ref.lm
    cg.refs[v] = ref
    return ref


def _spec(cg: CodeGen, name: str, v: Value, buf: Buffer, ref: Ref | None = None) -> IOSpec:
    placement = ref.placement if ref is not None else buf.placement
    return IOSpec.in_dram(name, v.shape, v.dtype, placement, ref.lm if ref is not None else buf.lm)

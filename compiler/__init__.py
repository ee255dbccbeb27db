"""The compiler's public API: torch function + sample inputs -> a relocatable Program with IOSpecs.

    from compiler import compile_function
    compiled = compile_function(lambda d: {"y": d["x"] @ d["w"]}, {"x": x, "w": w}, hwdesc.load("mncore2"))
    compiled.summary["steps"]           # the whole-graph plan: each step's kernel, layouts, cycles
    runtime.Device(compiled.hw).execute(compiled, {"x": x, "w": w})  # run it (the runtime package)

Names are imported on first use (PEP 562), so that `import compiler.layout` (the layout CLI, hwdesc
tools) does not pay for torch's tracer.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "compile_function": "compile", "compile_traced": "compile", "compile_graph": "compile", "Compiled": "compile",
    "trace": "frontend.tracing",
    "Graph": "ir", "Node": "ir", "Value": "ir",
    "Plan": "planner.plan", "Step": "planner.plan", "Planner": "planner.search",
    "IOSpec": "iospec",
    "Layout": "layout", "Placement": "layout", "parse": "layout",
    "save": "artifact", "load": "artifact", "ArtifactError": "errors",
    "CompileError": "errors", "UnsupportedOpError": "errors", "SpecMismatchError": "errors", "LayoutError": "errors",
}
__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:
    from .artifact import load, save
    from .compile import Compiled, compile_function, compile_graph, compile_traced
    from .errors import ArtifactError, CompileError, LayoutError, SpecMismatchError, UnsupportedOpError
    from .frontend.tracing import trace
    from .iospec import IOSpec
    from .ir import Graph, Node, Value
    from .layout import Layout, Placement, parse
    from .planner.plan import Plan, Step
    from .planner.search import Planner


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'compiler' has no attribute {name!r}")
    value = getattr(import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value

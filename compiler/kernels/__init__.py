"""Kernels: one emitter per primitive kind, behind the planner's contract (kernels.base).

`plan_kernels(node, planner)` returns the candidate kernels of a node (layouts and tilings
decided); `wishes(user, value, planner)` the LM layouts a node would like one of its inputs in,
so that producers can compute it there. Element-wise groups, views and gathers are planned by the
planner itself (compiler.planner.search).
"""

from __future__ import annotations

from typing import Callable

from ..errors import CompileError, UnsupportedOpError
from ..ir import Node, Value
from ..layout import Layout
from . import across_pes, conv, elementwise, matmul, movement, reduce
from .base import Kernel
from .context import Ref

# a reduction's candidates: reduce.plan's inside the PEs, and across them where its input lies so
PLANNERS: dict[str, Callable] = {"reduce": across_pes.plan, "matmul": matmul.plan, "conv": conv.plan}
WISHES: dict[str, Callable] = {"reduce": reduce.wishes, "matmul": matmul.wishes, "conv": conv.wishes,
                               "window": movement.wishes, "ew": elementwise.wishes}
READS_AS_IS: dict[str, Callable] = {"conv": conv.reads_as_is, "reduce": across_pes.reduces_where_it_lies}


def plan_kernels(node: Node, planner) -> list[Kernel]:
    fn = PLANNERS.get(node.kind)
    if fn is None:
        raise UnsupportedOpError(node.aten or node.kind, [list(v.shape) for v in node.inputs], node.source,
                                 f"no kernel for primitive {node.kind}")
    try:
        return fn(node, planner)
    except CompileError as e:
        located(e, node)
        raise


def located(e: CompileError, node: Node) -> None:
    """Say in `e` which op of the user's it is about and where: a kernel's planner (a product's
    tiling search) knows sizes, not the op or the source line every other compile error names.
    The message is rebuilt in place, so the error keeps its class and attributes."""
    if isinstance(e, UnsupportedOpError) or "\n  at " in str(e):
        return
    shapes = [list(v.shape) for v in node.inputs]
    e.args = (f"{node.aten or node.kind} with shapes {shapes}: {e}\n  at {node.source or 'an unknown line'}",)


def wishes(user: Node, v: Value, planner) -> list[Layout]:
    fn = WISHES.get(user.kind)
    return fn(user, v, planner) if fn is not None else []


def reads_as_is(user: Node, v: Value, ref: Ref, planner) -> bool:
    """Whether `user` reads `v` stored as `ref` without a relayout, though not one of its wishes
    (its own candidates price how well)."""
    fn = READS_AS_IS.get(user.kind)
    return fn(user, v, ref, planner) if fn is not None else False

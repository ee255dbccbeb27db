"""Lowering graph nodes to simulator instructions, one registered function per ATen op."""

from __future__ import annotations

import os

from typing import Callable

from ..codegen import CodeGen
from ..errors import UnsupportedOpError
from ..frontend.graph import Node

Lowering = Callable[[CodeGen, Node], None]
LOWERINGS: dict[str, Lowering] = {}


def lowering(*ops: str) -> Callable[[Lowering], Lowering]:
    def register(fn: Lowering) -> Lowering:
        for op in ops:
            LOWERINGS[op] = fn
        return fn
    return register


def lower(cg: CodeGen, node: Node) -> None:
    fn = LOWERINGS.get(node.op)
    if fn is None:
        raise UnsupportedOpError(node.op, [list(v.shape) for v in node.inputs], node.source)
    with cg.label(op_label(node)):
        fn(cg, node)


def op_label(node: Node) -> str:
    """How reports name an op: 'mm_1 (mm) @ model.py:12' (the value, the ATen op, the user's line)."""
    op = node.op.split(".")[0]
    name = op if node.out.name == op else f"{node.out.name} ({op})"
    if node.source:
        file, line = node.source.split(":")[:2]
        name += f" @ {os.path.basename(file)}:{line}"
    return name


from . import conv, elementwise, matmul, reduce, views  # noqa: E402,F401  (register their lowerings)

"""The compiler's graph: values and the ATen-level nodes that produce them.

A thin mirror of the traced torch.fx graph that the rest of the compiler can read without fx:
every value has a name, a static shape and a dtype; inputs, constants (captured tensors) and
outputs keep the names the user gave them (key paths of the input and output pytrees).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

# torch dtype -> mnsim dtype. Booleans live on the device as float32 0.0 / 1.0.
DTYPES = {torch.float32: "float32", torch.float16: "float16", torch.bool: "bool", torch.int32: "int32"}
DEVICE_DTYPE = {"float32": "float32", "float16": "float16", "bool": "float32", "int32": "int32"}


@dataclass(eq=False)
class Value:
    name: str
    shape: tuple[int, ...]
    dtype: str  # float32 | float16 | bool | int32
    kind: str  # input | const | node
    producer: "Node | None" = None
    data: torch.Tensor | None = None  # the tensor of a constant (a captured parameter or literal)
    origin: torch.Tensor | None = None  # the captured tensor object itself (to find registered ones)

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    def __repr__(self) -> str:
        return f"%{self.name}:{self.dtype}{list(self.shape)}"


@dataclass(eq=False)
class Node:
    op: str  # ATen overload, e.g. "add.Tensor", "mm.default"
    args: tuple[Any, ...]  # Values, Python scalars, lists
    kwargs: dict[str, Any]
    out: Value
    source: str  # "file:line: code" of the user's call that produced it

    @property
    def inputs(self) -> list[Value]:
        found: list[Value] = []

        def visit(a: Any) -> None:
            if isinstance(a, Value):
                found.append(a)
            elif isinstance(a, (list, tuple)):
                for x in a:
                    visit(x)
        visit(self.args)
        visit(list(self.kwargs.values()))
        return found

    def __repr__(self) -> str:
        return f"{self.out!r} = {self.op}{tuple(self.args)}"


@dataclass(eq=False)
class Graph:
    inputs: dict[str, Value]
    outputs: dict[str, Value]
    nodes: list[Node]
    constants: list[Value] = field(default_factory=list)
    out_spec: Any = None  # pytree spec of the function's return value
    in_spec: Any = None
    module: Any = None  # the traced torch.fx GraphModule (flat tensors in, flat list out)

    def promote(self, value: Value, name: str) -> None:
        """Make a captured constant an input named `name` (a registered parameter: device-resident,
        bound at every call instead of embedded in the program)."""
        self.constants.remove(value)
        value.kind, value.name = "input", name
        self.inputs[name] = value

    def users(self) -> dict[Value, list[Node]]:
        out: dict[Value, list[Node]] = {}
        for n in self.nodes:
            for v in n.inputs:
                out.setdefault(v, []).append(n)
        return out

    def ops(self) -> list[str]:
        return sorted({n.op for n in self.nodes})

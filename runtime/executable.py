"""`Executable`: a compiled program as a Context runs it, and its what-if variants.

It knows which of the program's inputs are registered tensors (bound from the device copies the
Context keeps), which outputs are the new values of those tensors (a training step's state), how
large each input buffer must be, and, while the traced graph is at hand, how to build the same
function with other io_spec_constraints: what the runtime times to measure a hand-over.
"""

from __future__ import annotations

import itertools
import json
import threading
from typing import Any

from compiler.compile import Compiled, compile_traced
from compiler.errors import CompileError
from compiler.iospec import IOSpec

from .device import BOTH, Loaded

_ids = itertools.count(1)


class Executable:
    def __init__(self, name: str, compiled: Compiled, *, options: dict | None = None,
                 constraints: dict[str, IOSpec] | None = None, mode: str = BOTH) -> None:
        self.id = next(_ids)
        self.name = name
        self.mode = mode  # "both": data and timing; "timing": timing only (outputs hold no values)
        self.compiled = compiled
        self.options = dict(options or {})
        self.constraints_known = constraints is not None  # a codegen_dir does not say what it was compiled with
        self.constraints = dict(constraints or {})
        self.resident = {name: name for name in compiled.resident}  # input -> registered tensor name
        updates = set(compiled.updates.values())
        self.input_specs = {k: v for k, v in compiled.inputs.items() if k not in self.resident}
        self.output_specs = {k: v for k, v in compiled.outputs.items() if k not in updates}
        self.loaded: Loaded | None = None
        self.last_call = 0  # the runtime's call count at its latest call (0: never called)
        self._variants: dict[str, Compiled | CompileError] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"Executable({self.name!r})"

    def need(self, input_name: str) -> int:
        """Long words per Group the program reads of an input's buffer."""
        c = self.compiled
        return c.buffers[c.input_symbols[input_name]].lw

    def output_lw(self, output: str) -> int:
        c = self.compiled
        return c.buffers[c.output_symbols[output]].lw

    @property
    def can_vary(self) -> bool:
        """Whether what-if variants can be compiled (the traced graph is at hand; a function
        loaded from a codegen_dir has only its program)."""
        return self.compiled.graph is not None

    def variant(self, constraints: dict[str, IOSpec]) -> Compiled:
        """The function compiled with `constraints` instead of its own (built once per set; the
        program itself when they are its own). Raises CompileError when it cannot be built."""
        if self.constraints_known and _key(constraints) == _key(self.constraints):
            return self.compiled
        if not self.can_vary:
            raise CompileError(f"{self.name} was loaded from a codegen_dir; its traced graph is not at hand to "
                               "compile it with other io_spec_constraints")
        key = _key(constraints)
        with self._lock:
            if key not in self._variants:
                try:
                    self._variants[key] = compile_traced(self.compiled.graph, self.compiled.hw,
                                                         options=self.options, constraints=constraints)
                except CompileError as e:
                    self._variants[key] = e
            found = self._variants[key]
        if isinstance(found, CompileError):
            raise found
        return found

    def unconstrained(self) -> Compiled:
        return self.variant({})

    def without(self, output: str) -> Compiled:
        return self.variant({k: v for k, v in self.constraints.items() if k != output})

    def constrained(self, output: str, spec: IOSpec) -> Compiled:
        return self.variant({**self.constraints, output: spec})


def _key(constraints: dict[str, Any]) -> str:
    return json.dumps(sorted((k, v.to_json()) for k, v in constraints.items()), sort_keys=True)

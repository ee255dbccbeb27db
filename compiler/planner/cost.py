"""What a choice costs: the simulator's own timing of the instructions it would emit.

The planner emits a candidate kernel into a scratch context and runs the timing engine on that
code. There is no second model of the machine: a faster chip gives every fixed program fewer
cycles, so among the same candidates it never picks a slower program.
"""

from __future__ import annotations

import numpy as np

from sim import MachineParams, SimError, time_code
from sim.validate import check_offered

from ..errors import CompileError


def cycles_of(params: MachineParams, code: np.ndarray) -> int:
    """Total cycles of an instruction array on the chip `params` describes (timing only). A
    program using a transfer mode or PE op the chip lacks is a CompileError naming it: the
    candidate cannot run there (the planner tries others)."""
    if len(code) == 0:
        return 0
    try:
        check_offered(params, code)
    except SimError as e:
        raise CompileError(f"{params.hw.name}: {e}") from None
    return time_code(params, code).total_cycles

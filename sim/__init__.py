"""The simulated machine: memory state, instruction set, numba functional and timing engines.

    >>> import hwdesc, sim
    >>> m = sim.Machine(hwdesc.load("mini"))
    >>> b = sim.ProgramBuilder(m.params)
    >>> b.nop(3)
    >>> m.run(b.build()).total_cycles      # 3 steps x step_cycles
    12

The simulator knows nothing of torch or tensors: it runs instruction arrays (`sim.isa`) and
counts cycles from the hardware description.
"""

from .alloc import Allocator
from .builder import ProgramBuilder, Sym
from .errors import DeviceMemoryError, SimError
from .isa import ALL_GROUPS, TABLE, DType, Dir, Mode, Op, VOp
from .machine import Machine
from .params import MachineParams
from .program import Program
from .stats import RunStats, TraceEvent
from .timing import pe_cycles, time_code
from .disasm import disassemble
from .validate import validate
from . import jitcache as _jitcache

_jitcache.refresh_package()  # before any kernel is loaded

__all__ = ["ALL_GROUPS", "TABLE", "Allocator", "DType", "DeviceMemoryError", "Dir", "Machine", "MachineParams",
           "Mode", "Op", "Program", "ProgramBuilder", "RunStats", "SimError", "Sym", "TraceEvent", "VOp",
           "disassemble", "pe_cycles", "time_code", "validate"]

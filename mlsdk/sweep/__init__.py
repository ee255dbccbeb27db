"""Design-space sweeps: one SPEC, many variant chips, every workload timed on each.

    mnsim sweep examples/sweep_transformer.yaml --workers 2

`spec` reads the SPEC (base chip, axes, sample, workloads, cost); `axes` and `points` derive a
chip per point and validate it like any description; `workloads` compiles and times a workload
on a chip; `engine` runs the tasks serially, on a local Dask cluster or on a remote one; `store`
keeps finished rows on disk for resuming; `table` and `plots` write what came out. `suite` holds
the named programs a SPEC can run (also what the tests and benchmarks use).
"""

from ..errors import SweepSpecError
from .engine import Plan, plan, run
from .spec import load_spec
from .store import RowStore

__all__ = ["Plan", "RowStore", "SweepSpecError", "load_spec", "plan", "run"]

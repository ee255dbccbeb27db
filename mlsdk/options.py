"""Compile options: the MLSDK names, which mnsim uses and which it accepts and ignores."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Mapping
from typing import Iterator

from .errors import OptionError

# option -> what mnsim does with it
USED = {
    "float_dtype": "float keeps float32; mixed runs matrix products in half (1-6-9) with float32 accumulation; "
                   "pfloat32 (mnsim's name) runs them in pseudo-single: float32 operands whose low mantissa bits "
                   "the MAU ignores (formats.pfloat32), at the YAML's units.MAU.matrix.pfloat32 rate; float64 "
                   "(mnsim's name) converts their float32 operands to float64 in LM and multiplies and "
                   "accumulates in float64 at units.MAU.matrix.float64's rate, results rounded to float32",
    "simulation_mode": "both (default) moves data and times it; timing only times the run (outputs hold no "
                       "values; reports work); functional only moves data (values, no cycles: reports count its "
                       "calls, which leave the hand-over analysis out); PFN's own values (fake, default, fast, "
                       "best, full) choose how its compiler simulates candidate schedules, which mnsim does not "
                       "have: they run as both",
}
IGNORED = {
    "option_json": "preset of PFN's codegen (O0..O4, debug); mnsim has one planner",
    "envs": "CODEGEN_* environment variables of PFN's codegen",
    "scheduler": "PFN's recompute/spill scheduler",
    "layout_spec": "layout overrides per op type (mnsim plans layouts itself; constrain IO with io_spec_constraints)",
    "gemm_layout_spec": "GEMM layout overrides",
    "backprop": "legacy torch.onnx training path (False only: True is refused by Context.compile)",
    "layout_planner": "PFN's layout planner choice",
    "sram_budget": "fraction of LM the planner may use",
    "sa_expected_run_iters": "simulated-annealing budget of PFN's scheduler",
    "out_onnx": "dump of the exported ONNX",
    "num_threads": "compiler threads",
}
FLOAT_DTYPES = ("float", "mixed", "pfloat32", "float64")
SIMULATION_MODES = ("both", "timing", "functional")
PFN_SIMULATION_MODES = ("fake", "default", "fast", "best", "full")  # PFN's compiler's; run as "both"


def check(options: dict | None) -> dict:
    """Validated options: unknown keys warn (listing the known ones), bad values raise."""
    if options is not None and not isinstance(options, Mapping):
        raise OptionError(f"options must be a dict such as {{'float_dtype': 'mixed'}}, not "
                          f"{type(options).__name__} {options!r:.60}")
    options = dict(options or {})
    unknown = [k for k in options if k not in USED and k not in IGNORED]
    if unknown:
        warnings.warn(f"unknown compile option(s) {', '.join(map(repr, unknown))} ignored; known options: "
                      f"{', '.join([*USED, *IGNORED])}", stacklevel=3)
    dtype = options.get("float_dtype", "float")
    if dtype not in FLOAT_DTYPES:
        raise OptionError(f"options['float_dtype'] is {dtype!r}; expected one of {', '.join(FLOAT_DTYPES)}")
    return {"float_dtype": dtype}


_forced: list[str] = []  # set by sweeps around the scripts they run (innermost last)


@contextlib.contextmanager
def forced_simulation_mode(mode: str | None) -> Iterator[None]:
    """Inside, every function compiled is simulated in `mode`, whatever its options say: how a
    sweep runs an unmodified script in timing mode."""
    if mode is None:
        yield
        return
    if mode not in SIMULATION_MODES:
        raise OptionError(f"simulation mode {mode!r}; expected one of {', '.join(SIMULATION_MODES)}")
    _forced.append(mode)
    try:
        yield
    finally:
        _forced.pop()


def simulation_mode(options: dict | None) -> str:
    """How calls of the function are simulated: 'both', 'timing' or 'functional' (see USED)."""
    mode = _forced[-1] if _forced else (options or {}).get("simulation_mode", "both")
    if mode in PFN_SIMULATION_MODES:
        return "both"
    if mode not in SIMULATION_MODES:
        raise OptionError(f"options['simulation_mode'] is {mode!r}; expected one of "
                          f"{', '.join(SIMULATION_MODES + PFN_SIMULATION_MODES)}")
    return mode

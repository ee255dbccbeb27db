"""Running one workload on one point's chip, and what of the run goes into the results.

A program of the suite and a script are compiled for the point's chip (its layouts and tilings
may differ from the base chip's) and run once, in timing mode unless the workload asks for
both; a codegen_dir is a fixed program, timed as it is, and a point whose chip it cannot run on
(another structure, larger hazards) is a failed point that says so.

Each run gives a flat row: total cycles, busy cycles and utilisation per unit, bytes per path,
the chosen IO layouts. Nothing in a row depends on the host (wall time, worker, order), so a
sweep gives the same table whatever runs it.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
from importlib import metadata
from pathlib import Path
from typing import Any

from hwdesc import HwDesc
from runtime.session import io_layouts

from ..context import Context
from ..device import MNDevice
from ..errors import WorkloadError
from ..report import Report, build, for_program
from ..run import run_script
from .spec import Workload
from .suite import MODELS


def workload_hash(workload: Workload, folder: Path) -> str:
    """What a workload's results depend on besides the chip: what it runs, its arguments and
    mode, and mnsim's version. A resumed sweep recomputes a point when any of them changed."""
    h = hashlib.sha256(json.dumps([workload.kind, workload.target, workload.args, workload.mode,
                                   _version()]).encode())
    if workload.kind == "program":
        h.update(Path(__file__).with_name("suite.py").read_bytes())
    elif workload.kind == "script":
        h.update(_read(folder / workload.script, "script"))
    else:
        h.update(_read(folder / workload.codegen_dir / "manifest.json", "codegen_dir"))
    return h.hexdigest()[:20]


def measure(workload: Workload, folder: Path, hw: HwDesc) -> dict[str, Any]:
    """Run `workload` on `hw` once and return its row fields; WorkloadError if it cannot run."""
    if workload.kind == "program":
        report, layouts = _program(workload, hw)
    elif workload.kind == "script":
        report, layouts = _script(workload, folder / workload.script, hw)
    else:
        report, layouts = _codegen_dir(folder / workload.codegen_dir, hw)
    return row_fields(report, layouts)


def row_fields(report: Report, layouts: dict[str, str]) -> dict[str, Any]:
    fields: dict[str, Any] = {"cycles": report.total_cycles, "time_us": report.time_us}
    for unit in report.units:  # the table orders the columns
        fields[f"busy.{unit.unit}"] = unit.busy_cycles
        fields[f"util.{unit.unit}"] = unit.utilisation
    for path, n in sorted(report.paths.items()):
        fields[f"bytes.{path}"] = n
    fields["layouts"] = json.dumps(layouts, sort_keys=True)
    return fields


def _program(workload: Workload, hw: HwDesc) -> tuple[Report, dict[str, str]]:
    if workload.program not in MODELS:
        raise WorkloadError(f"no program {workload.program!r} in the suite; it has {', '.join(MODELS)}")
    fn, inputs = MODELS[workload.program]()
    ctx = Context(MNDevice.of(hw))
    try:
        compiled = ctx.compile(fn, inputs, None, options={"simulation_mode": workload.mode})
        compiled(inputs)
        return ctx.report(), dict(ctx.session.layouts)
    finally:
        ctx.invalidate()


def _script(workload: Workload, path: Path, hw: HwDesc) -> tuple[Report, dict[str, str]]:
    output = io.StringIO()
    with contextlib.redirect_stdout(output), contextlib.redirect_stderr(output):
        run = run_script(str(path), list(workload.args), hw, simulation_mode=workload.mode)
    sessions = [s for s in run.sessions if s.chip == hw.name and s.runs]
    if run.exit_code:
        tail = "\n".join(output.getvalue().strip().splitlines()[-6:])
        hint = (" (in timing mode outputs hold no values: give the workload mode: both if the script reads them)"
                if workload.mode == "timing" and "has no values" in tail else "")
        raise WorkloadError(f"{path.name} exited with code {run.exit_code}{hint}:\n{tail}")
    if not sessions:
        raise WorkloadError(f"{path.name} ran nothing on the simulated chip")
    layouts = {k: v for s in sessions for k, v in s.layouts.items()}
    return build(sessions, source=path.name), layouts


def _codegen_dir(path: Path, hw: HwDesc) -> tuple[Report, dict[str, str]]:
    from compiler import artifact
    from sim import MachineParams, SimError, time_code, validate
    compiled = artifact.load(path)
    params = MachineParams.from_hw(hw)
    try:
        validate(params, compiled.program.code)
    except SimError as e:
        raise WorkloadError(f"the program in {path.name} (compiled for {compiled.hw.name}) cannot run on this "
                            f"point: {e}. A codegen_dir is a fixed program; name a program or a script to "
                            "compile for every point") from None
    stats = time_code(params, compiled.program.code)  # no machine state: timing needs none
    layouts = io_layouts(path.name, compiled.inputs, compiled.outputs)
    return for_program(path.name, stats, compiled.program.labels, hw.name, source=str(path)), layouts


def _version() -> str:
    try:
        return metadata.version("mnsim")
    except metadata.PackageNotFoundError:  # run from a source tree that was not installed
        return "source"


def _read(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as e:
        raise WorkloadError(f"cannot read the {what} {path}: {e.strerror or e}") from None

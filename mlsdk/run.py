"""Run an MLSDK script on the simulator and collect what its Contexts did (for `mnsim run`)."""

from __future__ import annotations

import os
import runpy
import sys
import traceback
from dataclasses import dataclass, field

from hwdesc import HwDesc
from runtime.session import Session, collecting

from .context import Context
from .device import MNDevice, override
from .options import forced_simulation_mode
from .errors import ScriptError
from .report import Report, build
from .trace import Recorder, recording


@dataclass
class ScriptRun:
    script: str
    device: str | HwDesc | None
    exit_code: int
    sessions: list[Session] = field(default_factory=list)

    def reports(self) -> list[Report]:
        """One report per simulated chip the script used (pfvm:cpu sessions have no cycles)."""
        by_chip: dict[str, list[Session]] = {}
        for s in self.sessions:
            if s.chip != "pfvm" and (s.runs or s.untimed_calls):
                by_chip.setdefault(s.chip, []).append(s)
        name = os.path.basename(self.script)
        return [build(group, source=name) for group in by_chip.values()]


def run_script(script: str, args: list[str], device: str | HwDesc | None = None, trace_path: str | None = None,
               simulation_mode: str | None = None) -> ScriptRun:
    """Run `script` as `python script args...` would, in this process, with every MNDevice it
    creates redirected to `device` (a name or a description in memory, if given) and every
    function it compiles simulated in `simulation_mode` (if given, whatever its options say). An exception in the script is printed and gives
    exit code 1; what ran before it is still collected. The interpreter is left as it was:
    argv, sys.path, modules the script imported, the current Context."""
    if not os.path.isfile(script):
        raise ScriptError(f"no script {script!r}")
    if isinstance(device, str):
        try:
            MNDevice(device)
        except ValueError as e:
            raise ScriptError(f"--device: {e}") from None
    if trace_path is not None and not os.path.isdir(os.path.dirname(os.path.abspath(trace_path))):
        raise ScriptError(f"--trace: no directory {os.path.dirname(os.path.abspath(trace_path))!r} for the trace file")
    argv, path, modules, current = sys.argv, list(sys.path), set(sys.modules), Context.current()
    sys.argv = [script, *args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    code = 0
    recorder = Recorder() if trace_path else None
    with collecting() as sessions:
        try:
            with override(device), forced_simulation_mode(simulation_mode), recording(recorder):
                runpy.run_path(script, run_name="__main__")
        except SystemExit as e:
            if isinstance(e.code, int) or e.code is None:
                code = e.code or 0
            else:  # sys.exit("message"): python prints the message and exits with 1
                print(e.code, file=sys.stderr)
                code = 1
        except Exception:  # the script's own failure: show it as python would, then report
            traceback.print_exc()
            code = 1
        finally:
            sys.argv, sys.path[:] = argv, path
            _forget_modules_under(os.path.dirname(os.path.abspath(script)), modules)
            Context.switch_context(current)
            sys.stdout.flush()
    if recorder is not None:
        recorder.write(trace_path)
    return ScriptRun(script, device, code, sessions)


def _forget_modules_under(directory: str, before: set[str]) -> None:
    """Drop modules the script imported from its own directory, so that a second run (compare)
    imports its helpers afresh, with the second device. Libraries stay imported."""
    for name in set(sys.modules) - before:
        file = getattr(sys.modules[name], "__file__", None) or ""
        if os.path.abspath(file).startswith(directory + os.sep):
            del sys.modules[name]

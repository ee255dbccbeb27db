"""Run an MLSDK script on the simulator and collect what its Contexts did (for `mnsim run`)."""

from __future__ import annotations

import os
import runpy
import sys
import traceback
from dataclasses import dataclass, field

from . import session as session_mod
from .device import override
from .errors import ScriptError
from .report import Report, build
from .session import Session
from .trace import trace_scope


@dataclass
class ScriptRun:
    script: str
    device: str | None
    exit_code: int
    sessions: list[Session] = field(default_factory=list)

    def reports(self) -> list[Report]:
        """One report per simulated chip the script used (pfvm:cpu sessions have no cycles)."""
        by_chip: dict[str, list[Session]] = {}
        for s in self.sessions:
            if s.chip != "pfvm" and s.runs:
                by_chip.setdefault(s.chip, []).append(s)
        name = os.path.basename(self.script)
        return [build(group, source=name) for group in by_chip.values()]


def run_script(script: str, args: list[str], device: str | None = None, trace_path: str | None = None) -> ScriptRun:
    """Run `script` as `python script args...` would, in this process, with every MNDevice it
    creates redirected to `device` (if given). An exception in the script is printed and gives
    exit code 1; what ran before it is still collected."""
    if not os.path.isfile(script):
        raise ScriptError(f"no script {script!r}")
    first = len(session_mod.ALL)
    argv, path = sys.argv, list(sys.path)
    sys.argv = [script, *args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    code = 0
    try:
        with override(device), trace_scope(trace_path):
            runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except Exception:  # the script's own failure: show it as python would, then report
        traceback.print_exc()
        code = 1
    finally:
        sys.argv, sys.path[:] = argv, path
        sys.stdout.flush()
    return ScriptRun(script, device, code, session_mod.ALL[first:])

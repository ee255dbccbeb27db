"""Every error mnsim raises, under one base: `MLSDKError` (each also derives from the builtin that
fits, e.g. ValueError). A failed call leaves the Context usable.

    MLSDKError
      LocatedError          a YAML input that is not valid (file:line, key path)   ValueError
        HwDescError         a hardware description                                 ValueError
        SweepSpecError      a sweep SPEC                                           ValueError
      ReadOnlyError         a write into a loaded hardware description             TypeError
      LayoutError           a layout string or a layout that does not fit a chip   ValueError
      CompileError          a function that cannot be compiled (op, source line)   ValueError
        UnsupportedOpError  an op mnsim cannot lower                               NotImplementedError
        SpecMismatchError   an io_spec_constraints entry that does not fit         ValueError
        UnregisteredWriteError  writes into named tensors not registered           ValueError
      ArtifactError         a codegen_dir missing, corrupt, edited or foreign      OSError
      SimError              an instruction that cannot run                         RuntimeError
      DeviceMemoryError     a memory that is full                                  MemoryError
      InputError            call inputs that do not match the function             ValueError
      RegistrationError     registering or looking up registered tensors           ValueError
        NameTakenError      a name registered for another tensor                   ValueError
      InvalidatedError      a handle of an invalidated Context                     RuntimeError
      DeviceError           an operation the device cannot do                      RuntimeError
      DeviceNameError       an MNDevice name that names no chip                    ValueError
      OptionError           a compile option or argument with a bad value          ValueError
      ArgumentError         an argument of the wrong type                          TypeError
      ReportError           a report that cannot be built or read                  ValueError
      ScriptError           `mnsim run` cannot start a script                      OSError
      SweepError            `mnsim sweep` options or engine that do not go together ValueError
      WorkloadError         a sweep workload that did not run on a point           RuntimeError
"""

from __future__ import annotations

from compiler.errors import (ArtifactError, CompileError, LayoutError, SpecMismatchError, UnregisteredWriteError,
                             UnsupportedOpError)
from hwdesc.errors import HwDescError, LocatedError, ReadOnlyError
from hwdesc.errors import MnsimError as MLSDKError
from runtime.errors import DeviceError, InputError, InvalidatedError, NameTakenError, RegistrationError
from sim.errors import DeviceMemoryError, SimError


class DeviceNameError(MLSDKError, ValueError):
    """An MNDevice name that names no chip (the message lists the accepted forms)."""


class OptionError(MLSDKError, ValueError):
    """A compile option, or an argument of an MLSDK call, with a bad value or type."""


class ArgumentError(MLSDKError, TypeError):
    """An argument of an MLSDK call of the wrong type (says what was given and what is taken)."""


class ReportError(MLSDKError, ValueError):
    """A report that cannot be built (sessions on different chips, nothing simulated) or read."""


class ScriptError(MLSDKError, OSError):
    """`mnsim run` / `compare` cannot start the script (no such file)."""


class SweepSpecError(LocatedError):
    """A sweep SPEC that cannot be read or does not describe a sweep (file:line, key path)."""


class SweepError(MLSDKError, ValueError):
    """`mnsim sweep` options, or an engine, that do not go together."""


class WorkloadError(MLSDKError, RuntimeError):
    """A sweep workload that did not run on a point (the message says why); the sweep goes on."""


__all__ = [
    "ArgumentError", "ArtifactError", "CompileError", "DeviceError", "DeviceMemoryError", "DeviceNameError", "HwDescError",
    "InputError", "InvalidatedError", "LayoutError", "MLSDKError", "NameTakenError", "OptionError", "ReadOnlyError", "RegistrationError", "ReportError", "ScriptError",
    "SimError", "SpecMismatchError", "UnregisteredWriteError", "UnsupportedOpError", "LocatedError", "SweepError", "SweepSpecError", "WorkloadError",
]

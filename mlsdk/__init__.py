"""MLSDK-compatible API on the simulated MN-Core 2.

    from mlsdk import Context, MNDevice, storage
    context = Context(MNDevice("mncore2:auto"))
    add = context.compile(lambda d: {"out": d["x"] + d["y"]}, sample, storage.path("/tmp/add"))
    add({"x": x, "y": y})["out"].cpu()

The same programs run on a board with PFN's MLSDK; here they run on the chip that a hardware
description (hwdesc/) defines, and every call records its simulated cycles (mlsdk.report).
"""

from compiler.iospec import IOSpec

from . import storage
from .context import CacheOptions, Context
from .device import MNDevice
from .errors import (ArgumentError, ArtifactError, CompileError, DeviceError, DeviceMemoryError, DeviceNameError,
                     HwDescError, InputError, InvalidatedError, LayoutError, MLSDKError, NameTakenError, OptionError,
                     ReadOnlyError, RegistrationError, ReportError, ScriptError, SimError, SpecMismatchError,
                     UnregisteredWriteError, UnsupportedOpError, LocatedError, SweepError, SweepSpecError, WorkloadError)
from .function import CompiledFunction
from .naming import get_tensor_name, set_buffer_name_in_optimizer, set_tensor_name, set_tensor_name_in_module
from .optim import MNCoreAdam, MNCoreAdamW, MNCoreLRScheduler, MNCoreOptimizer, MNCoreSGD
from .proxy import TensorLike, TensorProxy
from .pytrees import register_pytree_dataclass, register_pytree_namedtuple
from .trace import trace_event, trace_scope

from .shutdown import skip_final_collection

path = storage.path  # mlsdk.path(), an alias some documentation uses
skip_final_collection()  # a script's exit 0.8 s quicker (mlsdk.shutdown)

__all__ = [
    "ArgumentError", "ArtifactError", "CacheOptions", "CompileError", "CompiledFunction", "Context", "DeviceError",
    "DeviceMemoryError", "DeviceNameError", "HwDescError", "IOSpec", "InputError", "InvalidatedError", "LayoutError",
    "MLSDKError", "NameTakenError", "OptionError", "ReadOnlyError", "RegistrationError", "ReportError", "ScriptError", "SimError", "SpecMismatchError",
    "UnregisteredWriteError", "UnsupportedOpError", "LocatedError", "SweepError", "SweepSpecError", "WorkloadError",
    "MNCoreAdam", "MNCoreAdamW", "MNCoreLRScheduler", "MNCoreOptimizer", "MNCoreSGD", "MNDevice", "TensorLike", "TensorProxy", "get_tensor_name", "path", "register_pytree_dataclass",
    "register_pytree_namedtuple", "set_buffer_name_in_optimizer", "set_tensor_name", "set_tensor_name_in_module",
    "storage", "trace_event", "trace_scope",
]

"""The runtime: a simulated device, its buffers, and what runs on it for one Context.

    mlsdk -> runtime -> compiler -> sim -> hwdesc

`Runtime` (one per Context) binds each call's inputs (upload, relocation, conversion, host round
trip; runtime.binder), keeps registered tensors' device copies by name (runtime.resident), runs
programs on the `Device`, measures every hand-over between calls against its counterfactuals
(runtime.whatif), and records all of it in a `Session` (runtime.session) for reports.
"""

from .device import Device, DeviceBuffer, Loaded, from_bits, spec_placement, to_bits
from .errors import DeviceError, InputError, InvalidatedError, NameTakenError, RegistrationError
from .executable import Executable
from .runtime import Runtime
from .session import Binding, Call, ChainSummary, Handover, Run, Session, collecting
from .specs import TORCH_DTYPES, default_spec, host_spec, run_reference
from .value import DeviceValue, Origin

__all__ = [
    "Binding", "Call", "ChainSummary", "Device", "DeviceBuffer", "DeviceError", "DeviceValue", "Executable",
    "Handover", "InputError", "InvalidatedError", "Loaded", "NameTakenError", "Origin", "RegistrationError", "Run", "Runtime",
    "Session", "TORCH_DTYPES", "collecting", "default_spec", "from_bits", "host_spec", "run_reference", "spec_placement", "to_bits",
]

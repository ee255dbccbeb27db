"""IOSpecs the runtime makes itself: a registered tensor's layout before any function reads it,
and the host specs of a reference (pfvm:cpu) function."""

from __future__ import annotations

import math
from typing import Any

import torch

from compiler.dtypes import DEVICE_DTYPE, DTYPES
from compiler.iospec import IOSpec
from compiler.layout import Factor, Layout, Placement
from compiler.layout.candidates import candidates
from hwdesc import HwDesc

from .errors import RegistrationError

TORCH_DTYPES = {name: dtype for dtype, name in DTYPES.items()}  # IOSpec dtype name -> torch dtype


def default_spec(name: str, tensor: torch.Tensor, hw: HwDesc) -> IOSpec:
    """A registered tensor's layout before any function asks for one: the first DRAM candidate."""
    if tensor.dtype not in DTYPES:
        raise RegistrationError(f"registered tensor {name!r} has dtype {tensor.dtype}; the device holds "
                                f"{', '.join(DTYPES.values())}")
    dtype = DTYPES[tensor.dtype]
    device_dtype = DEVICE_DTYPE[dtype]
    dram = candidates(tuple(tensor.shape) or (1,), device_dtype, hw, "DRAM")[0]
    return IOSpec.in_dram(name, tuple(tensor.shape), dtype, Placement(dram.layout, hw, "DRAM", device_dtype))


def host_spec(name: str, v: Any) -> IOSpec:
    """IOSpecs of a reference (pfvm:cpu) function: host tensors, row-major."""
    shape = tuple(v.shape)
    dtype = getattr(v, "torch_dtype", "") or (v.dtype if isinstance(v.dtype, str) else str(v.dtype).replace("torch.", ""))
    layout = Layout.of([[Factor(s, None, 1)] for s in shape] or [[Factor(1, None, 1)]], shape or (1,))
    size = math.prod(shape) * TORCH_DTYPES[dtype].itemsize
    return IOSpec(name, shape, dtype, "host", layout, size, "pfvm", "pfvm")


def run_reference(graph: Any, values: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A pfvm:cpu call: torch runs the traced program on host tensors (the registered tensors
    are the graph's resident inputs, written in place as the program updates them)."""
    host = {**values, **graph.resident}
    with torch.no_grad():
        results = graph.module(*[host[name] for name in graph.inputs])
    return {name: r.detach().clone() for name, r in zip(graph.outputs, results)}

"""The dtypes a compiled function takes and returns, and how the device holds each.

IOSpecs name the user's dtype (torch's, e.g. int64 for class labels); the device holds every
element in one of its formats: float32, MN-Core half (float16), int32 (int64 too: values must
fit, which the upload checks) and bool as float32 0.0 / 1.0.
"""

from __future__ import annotations

import torch

DTYPES = {torch.float32: "float32", torch.float16: "float16", torch.bool: "bool", torch.int32: "int32",
          torch.int64: "int64"}  # torch dtype -> IOSpec dtype name
TORCH_DTYPES = {name: dtype for dtype, name in DTYPES.items()}
DEVICE_DTYPE = {"float32": "float32", "float16": "float16", "bool": "float32", "int32": "int32", "int64": "int32"}
INT32_BITS = 32
INT32_MIN, INT32_MAX = -(2 ** (INT32_BITS - 1)), 2 ** (INT32_BITS - 1) - 1  # the range of torch's (and the IR's) int32

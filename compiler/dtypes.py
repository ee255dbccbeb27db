"""The dtypes a compiled function takes and returns, and how the device holds each.

IOSpecs name the user's dtype (torch's, e.g. int64 for class labels); the device holds every
element in one of its formats: float32, MN-Core half (float16), int32 (int64 too: values must
fit, which the upload checks; uint8, int8 and int16 always fit: an image read as uint8 is fed
as it is and converted inside the function) and bool as float32 0.0 / 1.0.
"""

from __future__ import annotations

import torch

# integers narrower than int32, held as int32; torch's arithmetic on them wraps at their width
NARROW_INTS = {torch.uint8: "uint8", torch.int8: "int8", torch.int16: "int16"}
DTYPES = {torch.float32: "float32", torch.float16: "float16", torch.bool: "bool", torch.int32: "int32",
          torch.int64: "int64", **NARROW_INTS}  # torch dtype -> IOSpec dtype name of an input or output
# A float64 the function computes (x.double()) is computed and held in float32 (the chip's vector
# units have no float64; compile warns, naming the op): an output keeps torch's dtype
OUTPUT_DTYPES = {**DTYPES, torch.float64: "float64"}
TORCH_DTYPES = {name: dtype for dtype, name in OUTPUT_DTYPES.items()}
DEVICE_DTYPE = {"float32": "float32", "float16": "float16", "bool": "float32", "int32": "int32", "int64": "int32",
                "float64": "float32", **{name: "int32" for name in NARROW_INTS.values()}}
INT32_BITS = 32
INT32_MIN, INT32_MAX = -(2 ** (INT32_BITS - 1)), 2 ** (INT32_BITS - 1) - 1  # the range of torch's (and the IR's) int32


def wrap_int32(v: int) -> int:
    """v as a two's-complement int32 word holds it (the device's int32 arithmetic wraps so)."""
    return (v - INT32_MIN) % (1 << INT32_BITS) + INT32_MIN

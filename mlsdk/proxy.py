"""`TensorProxy`: a handle to a tensor that lives on the (simulated) device.

Compiled functions return proxies; passing one to another compiled function binds its device
buffer without a host round trip. `cpu()` downloads it over the host link (and counts those
cycles). Torch functions and tensor methods applied to a proxy work on its host value, like
MLSDK's proxies; there is no `.device`, as in MLSDK.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from compiler.device import DeviceBuffer
from compiler.dtypes import DTYPES
from compiler.iospec import IOSpec

from .errors import InputError, InvalidatedError

if TYPE_CHECKING:
    from .context import Context

TORCH_DTYPES = {name: dtype for dtype, name in DTYPES.items()}  # IOSpec dtype name -> torch dtype


class TensorProxy:
    def __init__(self, context: "Context", spec: IOSpec, *, buffer: DeviceBuffer | None = None,
                 host: torch.Tensor | None = None, producer: str | None = None, shape: tuple[int, ...] | None = None,
                 on_write: Any = None, registered: str | None = None, origin: tuple[str, str] | None = None) -> None:
        self._context = context
        self._spec = spec
        self._buffer = buffer
        self._host = host  # reference runs (pfvm:cpu) keep the value on the host
        self._cache: torch.Tensor | None = None
        self._producer = producer
        self._shape = tuple(shape if shape is not None else spec.shape)
        self._on_write = on_write
        self._registered = registered  # the registered tensor this is a handle of
        self._origin = origin  # (function, output) that produced it: what io_spec_constraints would name

    # ---- what it is ---------------------------------------------------------------------------

    @property
    def spec(self) -> IOSpec:
        return self._spec

    @property
    def shape(self) -> torch.Size:
        return torch.Size(self._shape)

    @property
    def dtype(self) -> torch.dtype:
        return TORCH_DTYPES[self._spec.dtype]

    @property
    def producer(self) -> str | None:
        return self._producer

    def size(self, dim: int | None = None):
        return self.shape if dim is None else self.shape[dim]

    def dim(self) -> int:
        return len(self._shape)

    @property
    def ndim(self) -> int:
        return len(self._shape)

    def numel(self) -> int:
        return self.shape.numel()

    def __len__(self) -> int:
        return self._shape[0]

    def __repr__(self) -> str:
        where = "host (reference run)" if self._host is not None else f"{self._spec.location} {self._spec.layout}"
        return f"TensorProxy(shape={list(self._shape)}, dtype={self.dtype}, {where})"

    def _check(self) -> None:
        if self._context.invalidated:
            raise InvalidatedError("this TensorProxy belongs to a Context that was invalidated")

    # ---- host transfers -----------------------------------------------------------------------

    def cpu(self) -> torch.Tensor:
        """The value on the host (downloaded over the host link, once)."""
        self._check()
        if self._host is not None:
            return self._host.clone()
        if self._cache is None:
            self._cache = self._context._download(self)
        return self._cache.clone()

    def item(self) -> float | int | bool:
        return self.cpu().item()

    def numpy(self):
        return self.cpu().numpy()

    def tolist(self) -> list:
        return self.cpu().tolist()

    def load_from(self, src: "torch.Tensor | TensorProxy", clone: bool = False) -> None:
        """Overwrite the device value with `src` (a host tensor, uploaded; or another proxy).
        `clone` snapshots the host tensor first (MLSDK uploads asynchronously; the simulator copies
        at once, so the result is the same either way)."""
        self._check()
        value = src.cpu() if isinstance(src, TensorProxy) else src
        if not isinstance(value, torch.Tensor):
            raise InputError(f"load_from takes a tensor or a TensorProxy, got {type(value).__name__}")
        if tuple(value.shape) != self._shape:
            raise InputError(f"load_from: the source has shape {list(value.shape)}, this proxy {list(self._shape)}")
        value = value.clone() if clone else value
        if self._host is not None and self._on_write is not None:
            self._on_write(value)  # a registered tensor on pfvm:cpu: write the host tensor this views
        elif self._host is not None:
            self._host = value.to(self.dtype).clone()
        else:
            self._context._upload_into(self, value.to(self.dtype))
            if self._registered is not None:
                self._context._resident.written(self)
        self._cache = None

    # ---- torch interop ------------------------------------------------------------------------

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        host = lambda a: a.cpu() if isinstance(a, TensorProxy) else (  # noqa: E731
            type(a)(host(x) for x in a) if isinstance(a, (list, tuple)) else a)
        return func(*host(args), **{k: host(v) for k, v in kwargs.items()})

    def __getattr__(self, name: str) -> Any:
        if name == "device":
            raise AttributeError("TensorProxy has no 'device' attribute (as in MLSDK); call .cpu() for a host tensor")
        if name.startswith("_") or not hasattr(torch.Tensor, name):
            raise AttributeError(f"TensorProxy has no attribute {name!r}")
        attr = getattr(self.cpu(), name)
        return attr

    def __array__(self, dtype=None):
        a = self.cpu().numpy()
        return a.astype(dtype) if dtype is not None else a

    def __bool__(self) -> bool:
        return bool(self.cpu())

    def __float__(self) -> float:
        return float(self.cpu())

    def __int__(self) -> int:
        return int(self.cpu())

    def __getitem__(self, index: Any) -> torch.Tensor:
        return self.cpu()[index]


def _binary(name: str):
    def op(self: TensorProxy, other: Any) -> torch.Tensor:
        other = other.cpu() if isinstance(other, TensorProxy) else other
        return getattr(self.cpu(), name)(other)
    op.__name__ = name
    return op


for _name in ("__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__truediv__", "__rtruediv__",
              "__matmul__", "__rmatmul__", "__pow__", "__neg__", "__lt__", "__le__", "__gt__", "__ge__", "__eq__",
              "__ne__", "__abs__"):
    if _name in ("__neg__", "__abs__"):
        setattr(TensorProxy, _name, lambda self, _n=_name: getattr(self.cpu(), _n)())
    else:
        setattr(TensorProxy, _name, _binary(_name))
TensorProxy.__hash__ = object.__hash__  # __eq__ compares values; proxies stay hashable by identity

TensorLike = torch.Tensor | TensorProxy

"""`TensorProxy`: a handle to a tensor that lives on the (simulated) device.

Compiled functions return proxies; passing one to another compiled function binds its device
buffer without a host round trip. `cpu()` downloads it over the host link (and counts those
cycles). Torch functions, operators and tensor methods applied to a proxy work on its host value,
like MLSDK's proxies; there is no `.device`, as in MLSDK. What changes a tensor in place (`add_`,
`p[i] = v`, `p += 1`) writes through: the changed host value is uploaded into the proxy, so a
later `cpu()` or call sees it (a change kept on a downloaded copy would be lost without a word).
Copies and pickles of a proxy (`copy.deepcopy`, `torch.save`) are host tensors of its value. The
device side is a runtime `DeviceValue`; a proxy of a reference (pfvm:cpu) run holds a host tensor
instead.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from compiler.iospec import IOSpec
from runtime import TORCH_DTYPES, DeviceValue, Runtime

from .errors import InputError, InvalidatedError


class TensorProxy:
    def __init__(self, runtime: Runtime, spec: IOSpec, *, value: DeviceValue | None = None,
                 host: torch.Tensor | None = None, on_write: Callable[[torch.Tensor], None] | None = None) -> None:
        self._runtime = runtime
        self._spec = spec
        self._value = value
        self._host = host  # reference runs (pfvm:cpu) keep the value on the host
        self._cache: tuple[int, torch.Tensor] | None = None  # (value version, downloaded tensor)
        self._handed_out = -1  # the version whose first download was returned as it was
        self._on_write = on_write  # a registered tensor on pfvm:cpu: the host tensor this views

    # ---- what it is ---------------------------------------------------------------------------

    @property
    def spec(self) -> IOSpec:
        return self._value.spec if self._value is not None else self._spec

    @property
    def device_value(self) -> DeviceValue | None:
        """The runtime's device value (None for a reference-run proxy, which holds a host tensor)."""
        return self._value

    @property
    def shape(self) -> torch.Size:
        return torch.Size(self._value.shape if self._value is not None else self._spec.shape)

    @property
    def dtype(self) -> torch.dtype:
        return TORCH_DTYPES[self.spec.dtype]

    @property
    def producer(self) -> str | None:
        return self._value.producer if self._value is not None else None

    def size(self, dim: int | None = None):
        return self.shape if dim is None else self.shape[dim]

    def dim(self) -> int:
        return len(self.shape)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def numel(self) -> int:
        return self.shape.numel()

    def __len__(self) -> int:
        return self.shape[0]

    def __repr__(self) -> str:
        spec = self.spec
        where = "host (reference run)" if self._host is not None else f"{spec.location} {spec.layout}"
        return f"TensorProxy(shape={list(self.shape)}, dtype={self.dtype}, {where})"

    def check(self) -> None:
        """Raise InvalidatedError when the proxy's Context was invalidated."""
        if self._runtime.invalidated:
            raise InvalidatedError(f"this TensorProxy ({self.producer or 'a proxy'}) belongs to "
                                   f"{self._runtime.label}, which was invalidated")

    # ---- host transfers -----------------------------------------------------------------------

    def cpu(self) -> torch.Tensor:
        """The value on the host, downloaded over the host link once per device value (the
        report's one download).

        The first call returns the downloaded tensor itself: most values are read once, and a
        copy of a large one costs as much as its download (a 4096 x 4096 float32: 13 ms). The
        caller may change that tensor, so a second call downloads again, values only (no second
        transfer in the report), and keeps that download to copy from for later calls."""
        self.check()
        if self._host is not None:
            return self._host.clone()
        version = self._value.version
        if self._cache is not None and self._cache[0] == version:
            return self._cache[1].clone()
        if self._handed_out != version:
            self._handed_out = version
            return self._runtime.download(self._value)
        self._cache = (version, self._runtime.download(self._value, record=False))
        return self._cache[1].clone()

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
        self.check()
        value = src.cpu() if isinstance(src, TensorProxy) else src
        if not isinstance(value, torch.Tensor):
            raise InputError(f"load_from into {self.producer or 'a proxy'} ({self._runtime.label}) takes a tensor or "
                             f"a TensorProxy, got {type(value).__name__}")
        if tuple(value.shape) != tuple(self.shape):
            raise InputError(f"load_from into {self.producer or 'a proxy'} ({self._runtime.label}): the source has "
                             f"shape {list(value.shape)}, this proxy {list(self.shape)}")
        value = value.clone() if clone else value
        if self._host is not None and self._on_write is not None:
            self._on_write(value)
        elif self._host is not None:
            self._host = value.to(self.dtype).clone()
        else:
            self._runtime.upload_into(self._value, value.to(self.dtype))
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
        if _in_place(name):
            return _writing_through(self, name)
        return getattr(self.cpu(), name)

    def __setitem__(self, index: Any, value: Any) -> None:
        _writing_through(self, "__setitem__")(index, value)

    def __format__(self, spec: str) -> str:
        return format(self.cpu(), spec)

    def __reduce_ex__(self, protocol: int):
        """A pickle of a proxy is a host tensor of its value (a device buffer cannot leave its
        Context); so are its copies (`__copy__`, `__deepcopy__`)."""
        return self.cpu().__reduce_ex__(protocol)

    def __copy__(self) -> torch.Tensor:
        return self.cpu()

    def __deepcopy__(self, memo: dict) -> torch.Tensor:
        return self.cpu()

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


def _in_place(name: str) -> bool:
    """Whether tensor method `name` changes its tensor in place (torch's trailing underscore)."""
    return name.endswith("_") and not name.startswith("_") and callable(getattr(torch.Tensor, name, None))


def _writing_through(proxy: TensorProxy, name: str) -> Callable[..., TensorProxy]:
    """Tensor method `name` (in place) applied to the proxy's host value, uploaded back into it."""
    def method(*args: Any, **kwargs: Any) -> TensorProxy:
        host = proxy.cpu()
        getattr(host, name)(*(a.cpu() if isinstance(a, TensorProxy) else a for a in args),
                            **{k: v.cpu() if isinstance(v, TensorProxy) else v for k, v in kwargs.items()})
        proxy.load_from(host)
        return proxy
    method.__name__ = name
    return method


def _binary(name: str):
    def op(self: TensorProxy, other: Any) -> torch.Tensor:
        other = other.cpu() if isinstance(other, TensorProxy) else other
        return getattr(self.cpu(), name)(other)
    op.__name__ = name
    return op


def _augmented(name: str):
    """`p op= x`: the in-place tensor method (`__iadd__` -> `add_`), written through."""
    method = {"__ipow__": "pow_", "__ifloordiv__": "floor_divide_", "__itruediv__": "div_",
              "__imod__": "remainder_", "__iand__": "bitwise_and_", "__ior__": "bitwise_or_",
              "__ixor__": "bitwise_xor_", "__ilshift__": "bitwise_left_shift_",
              "__irshift__": "bitwise_right_shift_"}.get(name, name[3:-2] + "_")

    def op(self: TensorProxy, other: Any) -> TensorProxy:
        return _writing_through(self, method)(other)
    op.__name__ = name
    return op


for _name in ("__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__truediv__", "__rtruediv__",
              "__floordiv__", "__rfloordiv__", "__mod__", "__rmod__", "__pow__", "__rpow__", "__matmul__",
              "__rmatmul__", "__and__", "__rand__", "__or__", "__ror__", "__xor__", "__rxor__", "__lshift__",
              "__rlshift__", "__rshift__", "__rrshift__", "__lt__", "__le__", "__gt__", "__ge__", "__eq__", "__ne__"):
    setattr(TensorProxy, _name, _binary(_name))
for _name in ("__neg__", "__pos__", "__abs__", "__invert__"):
    setattr(TensorProxy, _name, lambda self, _n=_name: getattr(self.cpu(), _n)())
for _name in ("__iadd__", "__isub__", "__imul__", "__itruediv__", "__ifloordiv__", "__imod__", "__ipow__",
              "__iand__", "__ior__", "__ixor__", "__ilshift__", "__irshift__"):
    setattr(TensorProxy, _name, _augmented(_name))
TensorProxy.__hash__ = object.__hash__  # __eq__ compares values; proxies stay hashable by identity

TensorLike = torch.Tensor | TensorProxy

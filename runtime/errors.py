"""Errors of the runtime: bad call arguments, stale handles, misuse of registered tensors.

Each leaves the Context usable and its device state as it was before the failing call."""

from __future__ import annotations

from hwdesc.errors import MnsimError


class InputError(MnsimError, ValueError):
    """A call's inputs do not match the compiled function: missing or extra keys, wrong shape or
    dtype, a proxy of another Context or device."""


class InvalidatedError(MnsimError, RuntimeError):
    """A TensorProxy or CompiledFunction of a Context that was invalidated."""


class RegistrationError(MnsimError, ValueError):
    """A tensor cannot be registered (no name, a name taken by another tensor, a dtype the device
    does not hold) or is not registered where a registered one is needed."""


class NameTakenError(RegistrationError):
    """A name registered for one tensor asked of another (two models, or two optimizers, under one
    prefix)."""


class DeviceError(MnsimError, RuntimeError):
    """An operation the device cannot do (a reference device has no simulated chip, a proxy
    without device values)."""

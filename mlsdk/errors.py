"""Errors of the MLSDK layer: bad call arguments and stale handles. The Context stays usable."""

from __future__ import annotations

from hwdesc.errors import MnsimError


class MLSDKError(MnsimError):
    """Base of the runtime's errors."""


class InputError(MLSDKError, ValueError):
    """A call's inputs do not match the compiled function: missing or extra keys, wrong shape or dtype."""


class InvalidatedError(MLSDKError, RuntimeError):
    """A TensorProxy or CompiledFunction of a Context that was invalidated."""


class ScriptError(MLSDKError):
    """`mnsim run` / `compare` cannot start the script (no such file)."""

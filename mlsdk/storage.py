"""`storage.path`: MLSDK's path objects for codegen_dir and checkpoints (os.PathLike, joins with /)."""

from __future__ import annotations

import os
from pathlib import Path


class StoragePath(os.PathLike):
    """A local filesystem path; `storage.path("/tmp/x") / "step"` joins like pathlib."""

    def __init__(self, target: str | os.PathLike) -> None:
        self._path = Path(os.fspath(target))

    def __fspath__(self) -> str:
        return str(self._path)

    def __truediv__(self, other: str | os.PathLike) -> "StoragePath":
        return StoragePath(self._path / os.fspath(other))

    def __str__(self) -> str:
        return str(self._path)

    def __repr__(self) -> str:
        return f"storage.path({str(self._path)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, (StoragePath, str, os.PathLike)) and os.fspath(other) == str(self._path)

    def __hash__(self) -> int:
        return hash(str(self._path))

    @property
    def local(self) -> Path:
        return self._path


def path(target: str | os.PathLike) -> StoragePath:
    return StoragePath(target)

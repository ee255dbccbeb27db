"""`storage.path`: MLSDK's path objects for codegen_dir and checkpoints (os.PathLike, joins with /).

MLSDK's paths may name object stores (pfio, boto3: `s3://bucket/run`); mnsim has none. Such a
path keeps its URL as text (joins and prints as one) and refuses to be opened as a file, naming
the URL, instead of turning into a local directory called `s3:`.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from .errors import ArgumentError

URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


class StoragePath(os.PathLike):
    """A local filesystem path; `storage.path("/tmp/x") / "step"` joins like pathlib, and the
    pathlib members (`exists()`, `mkdir()`, `open()`, `parent`, `name`, ...) are those of the
    local path."""

    def __init__(self, target: str | os.PathLike) -> None:
        if not isinstance(target, (str, os.PathLike)):
            raise ArgumentError(f"storage.path takes a str or os.PathLike, not {type(target).__name__} {target!r:.60}")
        text = target if isinstance(target, str) else str(target) if isinstance(target, StoragePath) else \
            os.fspath(target)
        self._url = text.rstrip("/") if URL.match(text) else None
        self._path = Path(text) if self._url is None else None

    def __fspath__(self) -> str:
        return str(self.local)

    def __truediv__(self, other: str | os.PathLike) -> "StoragePath":
        if self._url is not None:
            return StoragePath(f"{self._url}/{os.fspath(other).lstrip('/')}")
        return StoragePath(self._path / os.fspath(other))

    def __str__(self) -> str:
        return self._url if self._url is not None else str(self._path)

    def __repr__(self) -> str:
        return f"storage.path({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        if isinstance(other, StoragePath):
            return str(other) == str(self)
        return isinstance(other, (str, os.PathLike)) and os.fspath(other) == str(self)

    def __hash__(self) -> int:
        return hash(str(self))

    @property
    def local(self) -> Path:
        """The local path; an object-store URL has none in mnsim."""
        if self._url is not None:
            raise ArgumentError(f"{self._url} is an object-store URL; mnsim reads and writes local paths only "
                                "(it has no pfio or boto3 store): use a local directory")
        return self._path

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or not hasattr(Path, name):
            raise AttributeError(f"storage path has no attribute {name!r}")
        found = getattr(self.local, name)
        return StoragePath(found) if isinstance(found, Path) else found


def path(target: str | os.PathLike) -> StoragePath:
    return StoragePath(target)

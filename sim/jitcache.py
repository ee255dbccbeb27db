"""numba's disk cache, kept consistent with the simulator's sources.

numba keys a cached kernel by a hash of the file that defines it, not of the files it calls into:
the VOP loops in `vector.py` inline `numerics.nan_max`, so after an edit of `numerics.py` (or an
upgrade that changes only it) numba would load the old machine code and compute the old results.
On import, `sim` compares a digest of all its source files with the one the cache was built from;
when they differ it removes the cache files of its own modules, and numba compiles them again.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
DIGEST_FILE = "mnsim-sim-sources.sha256"


def sources_digest(package: Path = PACKAGE) -> str:
    """sha256 over the names and contents of the package's Python files."""
    h = hashlib.sha256()
    for path in sorted(package.glob("*.py")):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def refresh(cache_dir: Path, digest: str, modules: set[str]) -> list[str]:
    """Remove the cache files of `modules` in `cache_dir` unless they were built from `digest`;
    returns the names removed. A cache directory that cannot be written is left alone (numba then
    keeps its cache elsewhere or compiles in memory)."""
    marker = cache_dir / DIGEST_FILE
    try:
        if marker.read_text() == digest:
            return []
    except OSError:
        pass
    removed = []
    try:
        for path in cache_dir.glob("*.nb[ic]"):
            if path.name.split(".", 1)[0] in modules:
                path.unlink(missing_ok=True)
                removed.append(path.name)
        cache_dir.mkdir(parents=True, exist_ok=True)
        marker.write_text(digest)
    except OSError:
        pass
    return removed


def refresh_package() -> list[str]:
    """`refresh` for the sim package, in the directory numba caches its kernels in (the same for
    every module of the package: numba places caches per source directory)."""
    from numba.core.caching import FunctionCache

    from .moves import execute_moves

    modules = {path.stem for path in PACKAGE.glob("*.py")}
    return refresh(Path(FunctionCache(execute_moves.py_func).cache_path), sources_digest(), modules)

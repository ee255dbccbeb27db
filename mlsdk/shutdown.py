"""A quicker exit for scripts that import mlsdk: no final garbage collection of torch's objects.

When the interpreter exits it clears its modules and runs a full garbage collection over every
object still alive. After importing torch and tracing with torch._dynamo's machinery those are
millions, and the collection took about 0.8 s of every run of the seed example (3.2-3.3 s from
the shell, 2.4 s of it the script). `gc.freeze()` at exit moves them out of the collector's
generations, so that collection has nothing to walk: the same command takes 2.4-2.6 s.

Nothing else changes. atexit handlers (logging's flush, weakref.finalize's cleanups, temporary
directories) still run, and the operating system reclaims the memory as before. Objects in
reference cycles are not collected at exit any more, so a `__del__` of such an object may not
run then; Python does not promise that it runs at exit anyway.
"""

from __future__ import annotations

import atexit
import gc

_registered = False


def skip_final_collection() -> None:
    """Freeze the heap when the interpreter exits (once per process)."""
    global _registered
    if not _registered:
        atexit.register(gc.freeze)
        _registered = True

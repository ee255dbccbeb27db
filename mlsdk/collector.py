"""Python's cyclic garbage collector held off while mlsdk compiles.

A full collection walks every object the process holds; after `import torch` that is over a
million, about 0.1 s a walk on this project's 2-core machine. Compiling allocates enough
objects (torch._dynamo's import inside make_fx, the traced graph, tilings, programs) to set off
several: in a new process that times one convolution (ResNet-50's conv2_x, timing only), the
three full collections after torch's import took 0.28 s of its 3.1 s, and holding them off saved
0.15-0.35 s of the whole. Its garbage is freed by reference counts as it goes; what survives is
walked once, at the first collection after the compile.

Held off, not turned off: the collector runs again when the last compile in the process ends
(compiles on several threads nest), and stays off after it if the caller had turned it off.
"""

from __future__ import annotations

import gc
import threading
from contextlib import contextmanager
from typing import Iterator

_lock = threading.Lock()
_holders = 0
_was_enabled = False


@contextmanager
def collector_held() -> Iterator[None]:
    """No automatic cyclic collection inside the block (see the module docstring)."""
    global _holders, _was_enabled
    with _lock:
        if _holders == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _holders += 1
    try:
        yield
    finally:
        with _lock:
            _holders -= 1
            if _holders == 0 and _was_enabled:
                gc.enable()

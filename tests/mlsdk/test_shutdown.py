"""mlsdk.shutdown: a process that imported mlsdk freezes its heap at exit (so the final
garbage collection skips torch's objects), and its other exit handlers still run."""

from __future__ import annotations

import subprocess
import sys

PROGRAM = """
import atexit, gc
atexit.register(lambda: print("frozen at exit:", gc.get_freeze_count() > 0))  # runs after mlsdk's (LIFO)
import mlsdk
print("frozen before exit:", gc.get_freeze_count() > 0)
"""


def test_the_heap_is_frozen_only_at_exit_and_exit_handlers_still_run():
    out = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[:2] == ["frozen before exit: False", "frozen at exit: True"]

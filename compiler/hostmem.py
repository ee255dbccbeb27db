"""The host's free memory: what compiling may build (a program's instructions, a gather matched
element by element) is bounded by it, so that a program too large is refused at compile instead
of exhausting the host."""

from __future__ import annotations

import os


def host_memory_available() -> int | None:
    """Bytes of memory the host can give now (None where the system does not say): Linux's
    MemAvailable, which counts the page cache it would drop (free pages alone can be a small part
    of it on a busy machine), else the free physical pages."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None

"""Naming a full DRAM: what a failed allocation was for, and what holds the memory.

The allocator (sim.alloc) knows only sizes. A user who meets "DRAM: cannot allocate 2097152 long
words" during a call needs to know which tensor did not fit and where the memory went (registered
tensors' device copies, output proxies still alive, loaded programs) to free the right thing.
The layers that allocate name what they allocate (`allocating`); the Runtime, which knows what
its Context holds, rebuilds the message (`explain`). The error stays a DeviceMemoryError.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator

from sim import DeviceMemoryError

MIB = float(1 << 20)
HINT = ("to free DRAM: drop output proxies you no longer need (del them; a tensor from .cpu() stays), "
        "invalidate() Contexts you no longer use (their registered copies, programs and proxies go with them), "
        "or register fewer tensors in one Context")


@contextlib.contextmanager
def allocating(what: str) -> Iterator[None]:
    """Name what a DeviceMemoryError raised inside was allocating. The outermost name wins: a
    registered tensor's copy says more than the 'input' its conversion binds."""
    try:
        yield
    except DeviceMemoryError as e:
        e.allocating = what
        raise


@dataclass(frozen=True)
class Holder:
    """One kind of thing that holds DRAM: how many, their long words (per Group), the largest ones."""

    kind: str
    count: int
    lw: int
    largest: tuple[tuple[str, int], ...] = ()


def explain(e: DeviceMemoryError, where: str, holders: list[Holder], total_lw: int, lw_bytes: int) -> None:
    """Rebuild `e`'s message: where it happened, what was being allocated, what holds the DRAM
    (largest first; what this Context does not account for belongs to other Contexts on the
    device), and how to free some. Explained once: the innermost caller knows most."""
    if getattr(e, "explained", False):
        return
    what = getattr(e, "allocating", None)
    lines = [f"{where}: no room for {what}: {e.args[0] if e.args else e}" if what else
             f"{where}: {e.args[0] if e.args else e}"]
    ours = sum(h.lw for h in holders)
    others = Holder("other Contexts on this device", 0, max(0, total_lw - ours))
    held = [h for h in sorted(holders, key=lambda h: -h.lw) if h.lw] + ([others] if others.lw else [])
    lines.append(f"DRAM held now: {_size(total_lw, lw_bytes)} per Group" + (":" if held else ""))
    for h in held:
        count = f"{h.count} " if h.count else ""
        largest = f" (largest: {', '.join(f'{name} {_size(lw, lw_bytes)}' for name, lw in h.largest)})" \
            if h.largest else ""
        lines.append(f"  {count}{h.kind}: {_size(h.lw, lw_bytes)}{largest}")
    lines.append(HINT)
    e.args = ("\n".join(lines),)
    e.explained = True


def largest(sizes: dict[str, int], k: int = 3) -> tuple[tuple[str, int], ...]:
    """The `k` largest entries of `sizes` (name -> long words)."""
    return tuple(sorted(sizes.items(), key=lambda kv: -kv[1])[:k])


def _size(lw: int, lw_bytes: int) -> str:
    return f"{lw} long words ({lw * lw_bytes / MIB:.1f} MiB)"

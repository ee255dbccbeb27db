"""Human-readable numbers for tables: bytes in binary units, rates in SI units."""

from __future__ import annotations

_BINARY = ("B", "KiB", "MiB", "GiB", "TiB")
_SI = ("", "k", "M", "G", "T", "P")


def human_bytes(n: float) -> str:
    """4294967296 -> '4 GiB'; 1536 -> '1.5 KiB'."""
    value, i = float(n), 0
    while abs(value) >= 1024 and i < len(_BINARY) - 1:
        value, i = value / 1024, i + 1
    text = f"{value:.2f}".rstrip("0").rstrip(".")
    return f"{text} {_BINARY[i]}"


def si(n: float, unit: str = "", digits: int = 4) -> str:
    """393216000000000.0, 'FLOP/s' -> '393.2 TFLOP/s'."""
    value, i = float(n), 0
    while abs(value) >= 1000 and i < len(_SI) - 1:
        value, i = value / 1000, i + 1
    return f"{value:.{digits}g} {_SI[i]}{unit}".strip()

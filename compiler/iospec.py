"""`IOSpec`: how one input or output of a compiled function is laid out on the device.

An IOSpec is metadata only: name, shape, dtype, location, layout and size, plus the chip it was
compiled for. Passing one as an `io_spec_constraints` entry hands its metadata to another
compile; it never carries a buffer or an address (MLSDK 0.8, io_spec_constraints.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hwdesc import HwDesc

from .layout import Layout, Placement, parse


@dataclass(frozen=True)
class IOSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str  # torch dtype name: float32, float16, bool, int32
    location: str  # DRAM (an MLSDK Location)
    layout: Layout
    size_bytes: int  # bytes the tensor occupies on the device, in all the memory instances it uses
    chip: str  # hardware description name
    chip_fingerprint: str = field(repr=False)
    lm_layout: Layout | None = field(default=None, compare=False, repr=False)
    """The LM layout whose staging image `layout` is (a hint for producers constrained to this spec)."""

    @staticmethod
    def in_dram(name: str, shape: tuple[int, ...], dtype: str, placement: Placement,
                lm_layout: Layout | None = None) -> "IOSpec":
        """The spec of a tensor stored in DRAM as `placement`; its size counts every instance used."""
        hw = placement.hw
        size = placement.footprint_lw * hw.long_word_bytes * len(placement.instances_used)
        return IOSpec(name, tuple(shape), dtype, "DRAM", placement.layout, size, hw.name, hw.fingerprint, lm_layout)

    def is_memcopyable_to(self, other: "IOSpec") -> bool:
        """True when the bytes of a tensor in this spec can be read as `other` with no conversion:
        same chip, shape, dtype, location and layout (by placement, not by string). Names may differ."""
        return (isinstance(other, IOSpec) and self.chip_fingerprint == other.chip_fingerprint
                and self.shape == other.shape and self.dtype == other.dtype and self.location == other.location
                and self.layout == other.layout)

    def placement(self, hw: HwDesc, device_dtype: str) -> Placement:
        return Placement(self.layout, hw, self.location, device_dtype)

    def __str__(self) -> str:
        return (f"IOSpec({self.name}: {self.dtype}{list(self.shape)} in {self.location} {self.layout}, "
                f"{self.size_bytes} B on {self.chip})")

    def to_json(self) -> dict:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype, "location": self.location,
                "layout": str(self.layout), "size_bytes": self.size_bytes, "chip": self.chip,
                "chip_fingerprint": self.chip_fingerprint,
                "lm_layout": str(self.lm_layout) if self.lm_layout is not None else None}

    @staticmethod
    def from_json(d: dict) -> "IOSpec":
        return IOSpec(d["name"], tuple(d["shape"]), d["dtype"], d["location"], parse(d["layout"]), d["size_bytes"],
                      d["chip"], d["chip_fingerprint"], parse(d["lm_layout"]) if d.get("lm_layout") else None)

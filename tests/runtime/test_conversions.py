"""DRAM-to-DRAM conversions the runtime prices for a binding: a pair no program can convert is
priced None (the binding then goes through the host), whatever the compiler refused it for."""

from __future__ import annotations

import hwdesc
from compiler.iospec import IOSpec
from compiler.layout import parse
from compiler.layout.placement import Placement
from compiler.transfer import gather, separable
from runtime import Device
from runtime.conversions import Conversions


def specs(hw):
    row_major, column_major = ("(64, 64)/((64:64), (64:1))", "(64, 64)/((64:1), (64:64))")
    return tuple(IOSpec.in_dram("x", (64, 64), "float32", Placement(parse(t), hw, "DRAM", "float32"))
                 for t in (row_major, column_major))


def test_a_conversion_whose_gather_is_too_large_to_list_is_priced_none(monkeypatch):
    """A transpose of a 64 x 64 float32 tensor on mini is a gather of single elements. With the
    run budget below its runs, GatherTooLarge (a LayoutError) means no program, as a conversion
    that cannot be built does: None, not an exception out of the binding."""
    hw = hwdesc.load("mini")
    src, dst = specs(hw)
    assert Conversions(Device(hw), lambda *a, **k: None).conversion_cycles(src, dst) > 0
    monkeypatch.setattr(gather, "_CACHE", type(gather._CACHE)())
    monkeypatch.setattr(gather, "_cached_bytes", [0])
    monkeypatch.setattr(separable, "MAX_GATHER_RUNS", 10)
    assert Conversions(Device(hw), lambda *a, **k: None).conversion_cycles(src, dst) is None

"""A split's parts stored in their source's digits (compiler.layout.part), and what that saves."""

from __future__ import annotations

import pytest
import torch

import hwdesc
from compiler.compile import compile_function
from compiler.layout.parse import parse
from compiler.layout.part import part_layout
from compiler.planner import search
from sim import Machine

# a 256 x 384 product's output as MN-Core 2's planner stores it: N over the Groups' L2Bs, then
# 8 blocks 64 long words apart of 8 consecutive long words
PROJECTION = parse("(256, 384)/((8:8, 32:512), (4_L2B:2, 8:64, 8:1, 2_W:1))")


@pytest.mark.parametrize("start", [0, 128, 256])
def test_each_third_keeps_the_digits_below_the_groups(start):
    assert str(part_layout(PROJECTION, 1, start, 128)) == "(256, 128)/((8:8, 32:512), (8:64, 8:1, 2_W:1))"


def test_parts_smaller_than_a_digit_take_part_of_it():
    assert str(part_layout(PROJECTION, 1, 0, 24)) == "(256, 24)/((8:8, 32:512), (2:64, 8:1, 2_W:1))"
    assert str(part_layout(PROJECTION, 1, 6, 4)) == "(256, 4)/((8:8, 32:512), (2:1, 2_W:1))"  # long words 3 and 4
    assert str(part_layout(PROJECTION, 0, 3, 5)) == "(5, 384)/((5:512), (4_L2B:2, 8:64, 8:1, 2_W:1))"
    assert str(part_layout(PROJECTION, 0, 64, 64)) == "(64, 384)/((2:8, 32:512), (4_L2B:2, 8:64, 8:1, 2_W:1))"


def test_the_whole_dimension_keeps_every_digit_it_fills():
    assert str(part_layout(PROJECTION, 1, 0, 384)) == "(256, 384)/((8:8, 32:512), (3_L2B:2, 8:64, 8:1, 2_W:1))"


@pytest.mark.parametrize("start, size", [(8, 128), (120, 16), (1, 2)])
def test_a_part_off_its_digit_boundaries_has_none(start, size):
    """Columns 8.. start inside a 16-column block; 120..136 straddles two; 1..3 splits a long word."""
    assert part_layout(PROJECTION, 1, start, size) is None


def test_attention_split_is_gathered_in_the_projections_runs(monkeypatch):
    """q, k, v = (x @ w).split(128, 1); (q @ k.T) @ v on MN-Core 2: the parts in the projection's
    digits, against the planner without them (756,298 cycles: the split alone 345,882, gathered
    in single long words, and q @ k.T reading its parts 252,066)."""
    hw = hwdesc.load("mncore2")
    torch.manual_seed(0)
    x, w = torch.randn(256, 128), torch.randn(128, 384)

    def attention(d):
        q, k, v = (d["x"] @ d["w"]).split(128, dim=1)
        return {"y": (q @ k.T) @ v}
    seen = []
    found = search.Planner.part_layouts

    def spy(self, node):
        seen.append(found(self, node))
        return seen[-1]
    monkeypatch.setattr(search.Planner, "part_layouts", spy)
    with_parts = compile_function(attention, {"x": x, "w": w}, hw)
    # the product's LM layout spreads N over the Groups' L2Bs: each part is one L2B position's block
    assert [str(p) for p in seen[0]] == ["(256, 128)/((8_L1B:1, 4_Time:1, 8:1), (16_MAB:1, 4_PE:1, 2_W:1))"] * 3
    monkeypatch.setattr(search.Planner, "part_layouts", lambda self, node: [None] * len(node.outputs))
    without = compile_function(attention, {"x": x, "w": w}, hw)
    cycles = [Machine(hw).time(c.program.code).total_cycles for c in (with_parts, without)]
    assert cycles[0] < 0.2 * cycles[1]

    from runtime.device import Device
    got = Device(hw).execute(with_parts, {"x": x, "w": w})["y"]
    q, k, v = (x.double() @ w.double()).split(128, dim=1)
    torch.testing.assert_close(got.double(), (q @ k.T) @ v, rtol=1e-5, atol=1.0)  # entries ~1e6

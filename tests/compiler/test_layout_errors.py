"""Malformed layout strings and layouts that do not fit a chip raise LayoutError saying why."""

from __future__ import annotations

import pytest

from compiler.errors import LayoutError
from compiler.layout import parse
from compiler.layout.placement import Placement


@pytest.mark.parametrize("text, position, expected", [
    ("((4:2), (2:1, 4_PE:1, 2_W:1)", 28, "',' and another dimension, ';' and B@[...], or ')' to close the layout"),
    ("((4:0))", 4, "a stride greater than 0"),
    ("((4_:2))", 4, "an axis name after '_'"),
    ("((4:2); B@[MAB)", 14, "',' and another axis, or ']'"),
    ("((4:2); C@[MAB])", 8, "'B@[' after ';'"),
    ("(256,16)((8_L2B:1))", 8, "'/' after the shape"),
    ("((,4:2))", 2, "a factor size"),
    ("4:2", 0, "'(' to open the layout"),
    ("((4:2)) extra", 8, "the end of the layout"),
    ("", 0, "'(' to open the layout"),
])
def test_malformed_strings_name_the_position_and_what_was_expected(text, position, expected):
    with pytest.raises(LayoutError) as info:
        parse(text)
    e = info.value
    assert (e.position, e.expected) == (position, expected)
    assert f"at character {position + 1}: expected {expected}" in str(e)
    assert str(e).splitlines()[-1] == "  " + " " * position + "^"


def test_shape_larger_than_its_factors():
    with pytest.raises(LayoutError, match=r"dimension 1 has size 16 but its factors cover only 8 positions"):
        parse("(256,16)/((8_L2B:1, 32:2), (4_PE:1, 2_W:1))")


@pytest.mark.parametrize("text, memory, dtype, message", [
    ("((8_L3B:1, 4:1))", "LM0", "float32", r"unknown axis 'L3B' in factor 8_L3B:1 of dimension 0; mncore2 has the axes L2B, L1B, MAB, PE, W, Time"),
    ("((16_L1B:1, 4:1))", "LM0", "float32", r"axis L1B reaches position 15 \(factor 16_L1B:1 of dimension 0\) but mncore2 has 8 L1B positions"),
    ("((4:1, 4_W:1))", "LM0", "float32", r"axis W reaches position 3 \(factor 4_W:1 of dimension 0\) but a long word holds 2 float32 elements"),
    ("((4096:1, 2_W:1))", "LM0", "float32", r"spans 4096 long words per LM0 instance .* but LM0 holds 2048 on mncore2"),
    ("((4:1), (4:2))", "LM0", "float32", r"address overlap: elements \(0, 1\) and \(2, 0\) both land on LM0 instance 0, long word 2, W 0; factors 4:1, 4:2 overlap"),
    ("((4_PE:1, 8:1))", "DRAM", "float32", r"axis PE in factor 4_PE:1 of dimension 0 does not exist at DRAM's level \(Group\)"),
    ("((8:1); B@[MAB])", "DRAM", "float32", r"B@ item MAB: axis MAB does not exist at DRAM's level"),
    ("((8:1); B@[16_L2B:1])", "LM0", "float32", r"B@ item 16_L2B:1 reaches position 15 but the axis has 8"),
])
def test_layouts_that_do_not_fit_the_chip(mncore2, text, memory, dtype, message):
    layout = parse(text)
    with pytest.raises(LayoutError, match=message):
        Placement(layout, mncore2, memory, dtype)


def test_an_axis_split_over_factors_sums_their_reach(mncore2):
    Placement(parse("((4_L1B:2, 2_L1B:1))"), mncore2, "LM0", "float32")  # reaches 6 + 1 = 7 of 8
    with pytest.raises(LayoutError, match="axis L1B reaches position 10"):  # 3 * 3 + 1
        Placement(parse("((4_L1B:3, 2_L1B:1))"), mncore2, "LM0", "float32")


def test_mini_has_fewer_positions(mini):
    with pytest.raises(LayoutError, match="mini has 2 L1B positions"):
        Placement(parse("((8_L1B:1, 4:1))"), mini, "LM0", "float32")
    with pytest.raises(LayoutError, match="LM0 holds 512 on mini"):
        Placement(parse("((1024:1, 2_W:1))"), mini, "LM0", "float32")


def test_unknown_memory_or_dtype(mncore2):
    with pytest.raises(LayoutError, match="memory 'LM2' does not exist on mncore2"):
        Placement(parse("((4:1))"), mncore2, "LM2", "float32")
    with pytest.raises(LayoutError, match="dtype 'bfloat16' has no number format"):
        Placement(parse("((4:1))"), mncore2, "LM0", "bfloat16")


def test_copies_between_placed_lanes_are_refused(mncore2):
    with pytest.raises(LayoutError, match=r"B@ item 2_W:2: lanes of a long word are either placed or all copies"):
        Placement(parse("((8:2), (2:1, 2_W:1); B@[2_W:2])"), mncore2, "LM0", "float16")

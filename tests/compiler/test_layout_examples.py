"""Every layout of layout_notation.md reproduces its stated footprint and placement on mncore2.

Each case gives: id, shape (None: the factor extents), layout text, memory, the stated footprint
in long words per holding unit, the number of holding units with distinct data, the replicas
per element on other units, and some elements with their stated position.
"""

from __future__ import annotations

import numpy as np
import pytest

from compiler.errors import LayoutError
from compiler.layout import Layout, parse
from compiler.layout.placement import Placement

LM, DRAM = "LM0", "DRAM"
CASES = [
    # id, shape, layout, memory, LW per unit, distinct units, replicas, {element: expected position}
    ("L1", None, "((2:1, 4_PE:1, 2_W:1))", LM, 2, 4, 1024, {(13,): dict(lw=1, PE=2, W=1)}),
    ("L2", None, "((16:2), (2:1, 4_PE:1, 2_W:1))", LM, 32, 4, 1024, {(5, 11): dict(lw=11, PE=1, W=1)}),
    ("L3", None, "((16:1), (8_MAB:2, 8_L1B:1, 2_MAB:1, 4_PE:1, 2_W:1))", LM, 16, 512, 8,
     {(7, 300): dict(lw=7, W=0, PE=2, MAB=5, L1B=2)}),
    ("L4", None, "((8_L2B:1, 16:2, 8_L1B:1), (2:1, 4_PE:1, 2_W:1))", LM, 32, 256, 16,
     {(300, 9): dict(L2B=2, L1B=4, lw=11, PE=0, W=1)}),
    ("L5", None, "((8_L2B:1, 4:2, 8_L1B:1), (2:1, 4_PE:1, 2_W:1))", LM, 8, 256, 16,
     {(33, 0): dict(L2B=1, L1B=1, lw=0), (8, 0): dict(lw=2, W=0, PE=0), (100, 13): dict(L2B=3, L1B=4, lw=1, PE=2, W=1)}),
    ("L6", None, "((8_L2B:1, 32:1), (8_MAB:2, 8_L1B:1, 2_MAB:1, 4_PE:1, 2_W:1))", LM, 32, 4096, 1,
     {(70, 300): dict(L2B=2, lw=6, PE=2, MAB=5, L1B=2)}),
    ("L7", None, "((4_L2B:2, 64:2), (2:1, 4_PE:1, 2_W:1))", LM, 128, 16, 128, {(130, 9): dict(L2B=4, lw=5, PE=0, W=1)}),
    ("L8", None, "((8_L2B:1, 32:2), (2:1, 4_PE:1, 2_W:1))", LM, 64, 32, 128, {(130, 9): dict(L2B=4, lw=5, PE=0, W=1)}),
    ("L9", None, "((4_L2B:2, 32:1, 2_W:1))", LM, 32, 4, 512, {(200,): dict(L2B=6, lw=4, W=0)}),
    ("D1", (1,), "((1:1, 2_W:1))", DRAM, 1, 1, 1, {(0,): dict(dram=0, lw=0, W=0)}),
    ("D2", (1,), "((1_W:1))", DRAM, 1, 1, 1, {(0,): dict(dram=0, lw=0, W=0)}),
    ("D3", None, "((8:1, 2_W:1))", DRAM, 8, 1, 1, {(13,): dict(dram=0, lw=6, W=1)}),
    ("D4", None, "((4_L2B:2, 32:1, 2_W:1))", DRAM, 32, 4, 1, {(200,): dict(dram=3, lw=4, W=0)}),
    ("D5", None, "((4_L2B:2, 4:8), (8:1, 2_W:1))", DRAM, 32, 4, 1, {(9, 13): dict(dram=2, lw=14, W=1)}),
    ("D6", None, "((4_L2B:2, 64:8), (8:1, 2_W:1))", DRAM, 512, 4, 1, {(130, 9): dict(dram=2, lw=20, W=1)}),
    ("D7", None, "((4_L2B:2, 256:8), (8:1, 2_W:1))", DRAM, 2048, 4, 1, {(600, 3): dict(dram=2, lw=705, W=1)}),
    ("D8", None, "((4_L2B:2, 4:512), (512:1, 2_W:1))", DRAM, 2048, 4, 1, {(9, 1000): dict(dram=2, lw=1012, W=0)}),
    ("D9", None, "((4_L2B:2, 64:512), (512:1, 2_W:1))", DRAM, 32768, 4, 1, {(130, 7): dict(dram=2, lw=1027, W=1)}),
    ("T1", None, "((8_L2B:1), (2:1, 4_PE:1, 2_W:1))", LM, 2, 32, 128, {(5, 11): dict(L2B=5, lw=1, PE=1, W=1)}),
    ("T2", None, "((2_L2B:3), (16:1), (8_MAB:2, 8_L1B:1, 2_MAB:1, 4_PE:1, 2_W:1))", LM, 16, 1024, 1,
     {(1, 7, 300): dict(L2B=3, lw=7, PE=2, MAB=5, L1B=2)}),
    ("C1", (128,), "((4_PE:1, 16:1, 2_W:1); B@[MAB,L1B,L2B])", LM, 16, 4, 1024,
     {(77,): dict(PE=2, lw=6, W=1)}),
    ("C2", None, "(256,16)/((8_L2B:1, 4:2, 8_L1B:1), (2:1, 4_PE:1, 2_W:1); B@[MAB])", LM, 8, 256, 16,
     {(33, 0): dict(L2B=1, L1B=1, lw=0)}),
    ("C3", None, "(256,16)/((4_L2B:2, 64:8), (8:1, 2_W:1))", DRAM, 512, 4, 1, {(130, 9): dict(dram=2, lw=20, W=1)}),
    ("C4", None, "(16,1024)/((16:1), (8_MAB:2, 8_L1B:1, 2_MAB:1, 4_PE:1, 2_W:1); B@[8_L2B:1])", LM, 16, 512, 8,
     {(7, 300): dict(lw=7, PE=2, MAB=5, L1B=2)}),
    ("C5", None, "((4_L2B:2, 256:8), (8:1, 2_W:1); B@[4_L2B:2])", DRAM, 2048, 4, 1, {(600, 3): dict(dram=2, lw=705, W=1)}),
    ("C6", None, "(( 4:2), (2:1, 4_PE:1, 2_W:1))", LM, 8, 4, 1024, {(3, 13): dict(lw=7, PE=2, W=1)}),
    ("M1", None, "(64,128)/((8_L2B:1, 8:2), (16_MAB:1, 2:1, 4_PE:1); B@[L1B,W])", LM, 16, 512, 8,
     {(19, 45): dict(L2B=2, lw=7, MAB=5, PE=1)}),
    ("stencil", None, "((2_L2B:1, 16_MAB, 4:64), (2_L1B:4, 4_PE, 2_W, 8:1), (4_L2B:2, 4_L1B:1, 8:8))", LM, 256, 4096, 1,
     {(70, 100, 77): dict(L2B=1 + 2 * 2, MAB=1, lw=64 * 2 + 4 + 8 * 5, L1B=4 + 1, PE=2, W=0)}),
]


def _placement(mncore2, shape, text, memory, dtype="float32", **kw):
    layout = parse(text)
    if shape is not None:
        layout = layout.with_shape(shape)
    return Placement(layout, mncore2, memory, dtype, **kw)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_footprint_and_units(mncore2, case):
    _, shape, text, memory, lw, distinct, replicas, _ = case
    p = _placement(mncore2, shape, text, memory)
    assert p.footprint_lw == lw
    assert p.distinct_instances == distinct
    assert p.instance_replicas == replicas
    assert len(p.instances_used) == distinct * replicas


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_stated_positions(mncore2, case):
    _, shape, text, memory, _, _, _, positions = case
    p = _placement(mncore2, shape, text, memory)
    for index, expected in positions.items():
        flat = np.ravel_multi_index(index, p.layout.shape)
        loc = p.locate(np.array([flat]), first_copy_only=True)
        got = {"lw": int(loc.lw[0]), "W": int(loc.w[0]), "dram": int(loc.instance[0])}
        got.update({axis: int(c[0]) for axis, c in loc.coords.items()})
        assert {k: got[k] for k in expected} == expected, (index, got)


def test_l5_row_33_goes_to_n0c1b1_and_row_8_to_lm4(mncore2):
    """layout_notation.md 3.2: both checked against PFN's test file."""
    p = _placement(mncore2, None, "((8_L2B:1, 4:2, 8_L1B:1), (2:1, 4_PE:1, 2_W:1))", LM)
    loc = p.locate(np.array([33 * 16]), first_copy_only=True)
    levels = p.level_coordinates(int(loc.instance[0]))
    assert (levels["Group"], levels["L2B"], levels["L1B"]) == (0, 1, 1)
    row8 = p.locate(np.array([8 * 16]), first_copy_only=True)
    assert 2 * int(row8.lw[0]) + int(row8.w[0]) == 4  # word address $lm4


def test_dram_layouts_skip_unreached_and_odd_l2bs(mncore2):
    l7 = _placement(mncore2, None, "((4_L2B:2, 64:2), (2:1, 4_PE:1, 2_W:1))", LM)
    assert all(l7.level_coordinates(int(i))["L2B"] == 0 for i in l7.instances_used)  # even L2Bs only
    d3 = _placement(mncore2, None, "((8:1, 2_W:1))", DRAM)
    assert d3.instances_used.tolist() == [0]  # DRAM 0 only


def test_c2_and_l5_are_the_same_placement(mncore2):
    c2 = _placement(mncore2, None, "(256,16)/((8_L2B:1, 4:2, 8_L1B:1), (2:1, 4_PE:1, 2_W:1); B@[MAB])", LM)
    l5 = _placement(mncore2, None, "((8_L2B:1, 4:2, 8_L1B:1), (2:1, 4_PE:1, 2_W:1))", LM)
    assert c2.same_placement(l5)
    c5 = _placement(mncore2, None, "((4_L2B:2, 256:8), (8:1, 2_W:1); B@[4_L2B:2])", DRAM)
    d7 = _placement(mncore2, None, "((4_L2B:2, 256:8), (8:1, 2_W:1))", DRAM)
    assert c5.same_placement(d7) and c5.layout == d7.layout
    l9_in_dram = _placement(mncore2, None, "((4_L2B:2, 32:1, 2_W:1))", DRAM)
    l9_in_lm = _placement(mncore2, None, "((4_L2B:2, 32:1, 2_W:1))", LM)
    assert len(l9_in_dram.instances_used) == 4 and len(l9_in_lm.instances_used) == 2048  # same string, D4 vs L9


def test_m2_time_slices_and_span(mncore2):
    """slm_sft's embedding layout: 25 time slices of a 4608-LW span each, too big for one LM."""
    text = "((25_Time:1, 3:1536, 8_L2B:1, 16_MAB:1, 4:1, 4:4), (96:16, 4_W:1, 4_PE:1); B@[L1B])"
    p = _placement(mncore2, None, text, LM, dtype="float16", check_capacity=False)
    assert p.layout.shape == (153600, 1536)
    assert (p.slice_span, p.time_slices) == (4608, 25)
    assert not p.fits and p.instance_replicas == 8
    per_pe_per_slice = 48 * 384
    assert p.layout.numel // (25 * 512) == per_pe_per_slice
    i, j = 6144 * 2 + 2048 + 256 * 3 + 16 * 5 + 4 * 2 + 1, 16 * 7 + 4 * 3 + 2
    loc = p.locate(np.array([i * 1536 + j]), first_copy_only=True)
    assert int(loc.time[0]) == 2 and loc.coords["L2B"][0] == 3 and loc.coords["MAB"][0] == 5
    assert loc.coords["PE"][0] == 2 and int(loc.w[0]) == 3
    assert int(loc.lw[0]) == 2 * 4608 + 1536 * 1 + 2 + 4 * 1 + 16 * 7
    from compiler.errors import LayoutError
    with pytest.raises(LayoutError, match="spans 115200 long words per LM0 instance .* holds 2048"):
        _placement(mncore2, None, text, LM, dtype="float16")


def test_equality_ignores_spelling(mncore2):
    a = parse("(256,16)/((8_L2B:1, 4:2, 8_L1B:1), (2:1, 4_PE:1, 2_W:1))")
    assert a == parse("((8_L2B, 4:2,8_L1B),(2:1,4_PE,2_W))")
    assert parse("((2:8, 8:1))") == parse("((16:1))") == parse("((16))")
    assert parse("((4:2, 1_PE:7), (2_W:1))") == parse("((4:2, 1_PE:1), (2_W:1))")
    # An explicit B@ is part of the value: on DRAM it replicates where leaving it out means DRAM 0
    # only, so only a Placement (which knows the memory) can call the two the same.
    assert a != parse("((8_L2B:1, 4:2, 8_L1B:1), (2:1, 4_PE:1, 2_W:1); B@[MAB])")
    assert parse("((4:2))") != parse("((4:1))")
    assert hash(parse("((2:8, 8:1))")) == hash(parse("((16:1))"))
    assert isinstance(a, Layout)


def test_a_sized_broadcast_between_placed_positions_makes_copies(mncore2):
    """`4_L2B:2` places rows on the even L2Bs; `B@[2_L2B:1]` copies each onto the next L2B, so
    both L2Bs of every Group hold the Group's rows (a matrix product splitting the L2Bs of a
    Group over N while the Groups split M)."""
    text = "(64,16)/((4_L2B:2, 16:2), (4_PE:1, 2:1, 2_W:1)%s)"
    shared = _placement(mncore2, None, text % "; B@[2_L2B:1]", LM)
    alone = _placement(mncore2, None, text % "", LM)
    assert shared.layout != alone.layout and str(shared.layout).endswith("B@[2_L2B:1])")
    assert shared.instance_replicas == 2 * alone.instance_replicas
    row = np.array([17 * 16])  # row 17: the second Group's rows
    first = {int(c) for c in shared.locate(row, first_copy_only=True).coords["L2B"]}
    every = {int(c) for c in shared.locate(row).coords["L2B"]}
    assert first == {2} and every == {2, 3}


def test_copies_onto_placed_positions_are_refused(mncore2):
    with pytest.raises(LayoutError, match=r"B@ item 4_L2B:1 puts copies on L2B positions the factors already use "
                                          r"\(placed at \[0, 2, 4, 6\]\)"):
        _placement(mncore2, None, "(64,16)/((4_L2B:2, 16:2), (4_PE:1, 2:1, 2_W:1); B@[4_L2B:1])", LM)

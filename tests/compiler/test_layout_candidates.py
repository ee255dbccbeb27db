"""Candidate layouts are legal, sorted by their hint, and follow the chip."""

from __future__ import annotations

import pytest

from compiler.errors import LayoutError
from compiler.layout import parse
from compiler.layout.candidates import candidates
from compiler.layout.placement import Placement


@pytest.mark.parametrize("shape", [(32, 64), (256, 16), (3, 4), (7,), (2, 3, 8, 8), (1,)])
@pytest.mark.parametrize("memory", ["LM0", "DRAM"])
def test_candidates_are_legal_and_sorted(mncore2, mini, shape, memory):
    for hw in (mncore2, mini):
        found = candidates(shape, "float32", hw, memory)
        assert found
        for c in found:
            p = Placement(c.layout, hw, memory, "float32")
            assert p.layout.shape == shape and p.footprint_lw == c.footprint_lw
        assert [c.hint for c in found] == sorted(c.hint for c in found)


@pytest.mark.parametrize("shape, published", [
    ((256, 16), "((4_L2B:2, 64:8), (8:1, 2_W:1))"),  # D6
    ((1024, 16), "((4_L2B:2, 256:8), (8:1, 2_W:1))"),  # D7
    ((16, 1024), "((4_L2B:2, 4:512), (512:1, 2_W:1))"),  # D8
    ((256,), "((4_L2B:2, 32:1, 2_W:1))"),  # D4
    ((16,), "((8:1, 2_W:1))"),  # D3: small tensors stay in DRAM 0
])
def test_dram_candidates_follow_the_educational_compilers_rule(mncore2, shape, published):
    assert candidates(shape, "float32", mncore2, "DRAM")[0].layout == parse(published).with_shape(shape)


def test_lm_candidates_spread_over_the_chips_pes(mncore2, mini):
    best = candidates((32, 64), "float32", mncore2, "LM0")[0]
    assert best.footprint_lw == 1  # 2048 elements over 4096 PEs' long words, 2 per LW
    small = candidates((32, 64), "float32", mini, "LM0")[0]
    assert small.footprint_lw == 64  # 2048 elements / 16 PEs / 2 per LW
    assert {str(c.layout) for c in candidates((32, 64), "float32", mncore2, "LM0")}.isdisjoint(
        {str(c.layout) for c in candidates((32, 64), "float32", mini, "LM0")})


def test_half_packs_four_per_long_word(mncore2):
    best = candidates((64, 64), "float16", mncore2, "LM0")[0]
    assert "4_W:1" in str(best.layout)


def test_too_big_for_lm(mini):
    with pytest.raises(LayoutError, match=r"no layout of a float32 tensor of shape \(1024, 1024\) fits LM0 on mini"):
        candidates((1024, 1024), "float32", mini, "LM0")

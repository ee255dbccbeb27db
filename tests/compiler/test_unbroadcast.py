"""A MAB-broadcast LM layout spread over the MABs: the same DRAM image, staged by distribute."""

from __future__ import annotations

import numpy as np
import pytest

import hwdesc
import sim
from compiler.chain import Chain
from compiler.layout import Placement, parse
from compiler.layout.hostio import gather, scatter
from compiler.layout.unbroadcast import spread_over_units
from compiler.transfer.staging import emit_download, stage

from .test_staging import transit_for

# A Linear layer's weight as the planner placed it for the MNIST classifier's forward product
# (bench/test_training_bench.py on mncore2), and the layout its update now runs in.
WEIGHT_B = "(256, 1024)/((4_L2B:2, 8_L1B:1, 8:32), (2_L2B:1, 2_Time:1, 32:1, 4_PE:1, 2_W:1))"
WEIGHT_SPREAD = "(256, 1024)/((4_L2B:2, 8_L1B:1, 8:2), (2_L2B:1, 2_Time:1, 2:1, 16_MAB:1, 4_PE:1, 2_W:1))"


def units(hw: hwdesc.HwDesc) -> tuple[int, str]:
    chain = Chain.of(hw)
    return chain.pes_per_l1 // chain.pes_per_unit, chain.unit_axis


def test_the_mnist_weight_spreads_its_lowest_sixteen_addresses_over_the_mabs(mncore2):
    """32 addresses per row of 8: the lowest 16 (stride 1) become the 16 MABs, 2 addresses stay,
    and the row digit's stride 32 becomes 2; the Time slices and lanes are untouched."""
    spread = spread_over_units(parse(WEIGHT_B), *units(mncore2))
    assert spread == parse(WEIGHT_SPREAD)
    before = stage(Placement(parse(WEIGHT_B), mncore2, "LM0", "float32"))
    after = stage(Placement(spread, mncore2, "LM0", "float32"))
    assert (before.pe_mode, after.pe_mode) == ("mab_broadcast", "distribute")
    assert after.dram.same_placement(before.dram)
    spans = [Placement(x, mncore2, "LM0", "float32").slice_span for x in (parse(WEIGHT_B), spread)]
    assert spans == [256, 16]  # long words per PE and slice: each MAB holds a sixteenth


@pytest.mark.parametrize("chip, lm", [
    ("mncore2", "((4_L2B:2, 64:2), (2:1, 4_PE:1, 2_W:1))"),  # PFN's L7: 128 addresses
    ("mncore2", "((4_L2B:2, 8_L1B:1, 8:32), (2_L2B:1, 32:1, 4_PE:1, 2_W:1))"),  # the weight's slice
    ("mini", "((2_L1B:1, 8:1), (2_PE:1, 2_W:1))"),
])
def test_the_spread_layout_downloads_the_same_values_from_the_same_image(chip, lm):
    """Staged from the broadcast layout's image, the spread layout holds, in every PE, the
    elements the layout says (checked by reading them back), and no MAB holds a copy."""
    hw = hwdesc.load(chip)
    layout = parse(lm)
    spread = spread_over_units(layout, *units(hw))
    assert spread is not None
    st = stage(Placement(spread, hw, "LM0", "float32"))
    assert st.pe_mode == "distribute"
    assert st.dram.same_placement(stage(Placement(layout, hw, "LM0", "float32")).dram)
    machine = sim.Machine(hw)
    src = machine.alloc_dram(st.dram_lw)
    x = np.random.default_rng(0).standard_normal(layout.shape, dtype=np.float32)
    scatter(st.dram, x, machine.memory("DRAM"), src)
    b = sim.ProgramBuilder(machine.params)
    emit_download(b, st, dram=src, lm_mem="LM1", lm_word=8, transit=transit_for(hw))
    machine.run(b.build())
    np.testing.assert_array_equal(gather(st.lm, machine.memory("LM1"), 4, check_replicas=True).view(np.float32), x)


@pytest.mark.parametrize("lm, why", [
    ("((4_L2B:2, 64:2), (2_MAB:1, 4_PE:1, 2_W:1))", "places the MAB axis already"),
    ("((4_L2B:2, 64:4), (2:1, 4_PE:1, 2_W:1))", "a gap below the boundary (no address 2, 3)"),
    ("((4_L2B:2, 3:1), (4_PE:1, 2_W:1))", "3 addresses do not divide 16"),
    ("((4_L2B:2, 2:1, 3:2), (4_PE:1, 2_W:1))", "6 addresses: 3 does not divide the 8 still needed"),
    ("((4_L2B:2, 8_L1B:1), (4_PE:1, 2_W:1))", "one long word per PE: nothing to move"),
    ("((8_L2B:1, 4:2, 8_L1B:1), (2:1, 4_PE:1, 2_W:1))", "PFN's L5: 8 addresses, fewer than 16 MABs"),
])
def test_layouts_whose_addresses_do_not_split_at_the_mab_boundary_are_left_alone(mncore2, lm, why):
    assert spread_over_units(parse(lm), *units(mncore2)) is None, why

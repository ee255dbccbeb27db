"""Property tests on mncore2 and mini: text round trip, scatter/gather round trip, injectivity."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import hwdesc
from compiler.layout import parse
from compiler.layout.hostio import gather, scatter
from compiler.layout.placement import Placement

from .layout_strategies import legal_layouts, spaced

CHIPS = {name: hwdesc.load(name) for name in ("mncore2", "mini")}
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("chip", CHIPS)
@pytest.mark.parametrize("memory", ["LM0", "DRAM"])
@SETTINGS
@given(data=st.data())
def test_print_then_parse_is_the_same_layout(chip, memory, data):
    layout = data.draw(legal_layouts(CHIPS[chip], memory))
    text = str(layout)
    assert parse(text) == layout
    assert parse(spaced(text, data.draw)) == layout
    assert str(parse(text)) == text  # printing is canonical


@pytest.mark.parametrize("chip", CHIPS)
@pytest.mark.parametrize("memory, dtype", [("LM0", "float32"), ("LM1", "float16"), ("DRAM", "float32"), ("DRAM", "float16")])
@SETTINGS
@given(data=st.data())
def test_gather_of_scatter_is_the_tensor(chip, memory, dtype, data):
    hw = CHIPS[chip]
    layout = data.draw(legal_layouts(hw, memory, dtype))
    p = Placement(layout, hw, memory, dtype)
    bits = hw.formats[dtype].bits
    x = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1))).integers(
        1, 2**bits - 1, size=layout.shape, dtype=np.uint64).astype({16: np.uint16, 32: np.uint32}[bits])
    base = data.draw(st.integers(0, 3))
    mem = np.zeros((p.instance_count, (base + p.span_lw) * 2 + 6), dtype=np.uint32)
    scatter(p, x, mem, base)
    assert np.array_equal(gather(p, mem, base, check_replicas=True), x)
    written = np.count_nonzero(mem.view({16: np.uint16, 32: np.uint32}[bits]))
    assert written == layout.numel * p.copies  # every copy written, nothing else touched
    again = np.zeros_like(mem)  # the same layout at another base: the cached element map, shifted
    other = (base + 1) % 4
    if (other + p.span_lw) * 2 + 6 <= mem.shape[1]:
        scatter(p, x, again, other)
        assert np.array_equal(gather(p, again, other), x) and np.count_nonzero(again) == np.count_nonzero(mem)


@pytest.mark.parametrize("chip", CHIPS)
@pytest.mark.parametrize("memory, dtype", [("DRAM", "float32"), ("DRAM", "float16")])
@SETTINGS
@given(data=st.data())
def test_lane_padding_dims_are_the_dimensions_whose_long_words_mix_elements_and_padding(chip, memory, dtype, data):
    """`lane_padding_dims` from the layout's digits against every long word of its placement: a
    long word some of whose lanes hold elements and others padding exists exactly when the
    function names a dimension (a zero-padding copy by the Data Engines relies on it)."""
    from compiler.layout import has_lanes, lane_padding_dims
    hw = CHIPS[chip]
    layout = data.draw(legal_layouts(hw, memory, dtype))
    assume(has_lanes(layout))  # one without lanes holds each element in every lane of its long word
    p = Placement(layout, hw, memory, dtype)
    epl = hw.elements_per_lw(dtype)
    slots = np.zeros((p.instance_count, p.span_lw * 2), dtype=np.uint32)
    ones = np.ones(layout.shape, dtype={16: np.uint16, 32: np.uint32}[hw.formats[dtype].bits])
    scatter(p, ones, slots, 0)
    filled = slots.view(ones.dtype).reshape(p.instance_count, p.span_lw, epl) != 0
    mixed = bool((filled.any(axis=-1) & ~filled.all(axis=-1)).any())
    assert mixed == bool(lane_padding_dims(layout, epl)), layout


@pytest.mark.parametrize("chip", CHIPS)
@pytest.mark.parametrize("memory", ["LM0", "DRAM"])
@SETTINGS
@given(data=st.data())
def test_placement_is_injective_on_non_broadcast_coordinates(chip, memory, data):
    hw = CHIPS[chip]
    p = Placement(data.draw(legal_layouts(hw, memory)), hw, memory, "float32")
    first = p.locate(first_copy_only=True)
    keys = np.stack([first.instance, first.lw, first.w, first.time])
    assert np.unique(keys, axis=1).shape[1] == p.layout.numel
    every = p.locate()
    assert (every.instance < p.instance_count).all() and (every.lw < p.span_lw).all() and (every.w < p.epl).all()
    assert np.unique(np.stack([every.instance, every.lw, every.w]), axis=1).shape[1] == p.layout.numel * p.copies
    assert np.array_equal(p.element_at(every.instance, every.lw, every.w), every.element)  # and back
    holes = p.instance_count * p.span_lw * p.epl - p.layout.numel * p.copies
    grid = np.indices((p.instance_count, p.span_lw, p.epl)).reshape(3, -1)
    assert int((p.element_at(*grid) == -1).sum()) == holes


@pytest.mark.parametrize("chip", CHIPS)
@pytest.mark.parametrize("memory", ["LM0", "DRAM"])
@SETTINGS
@given(data=st.data())
def test_locating_chosen_elements_agrees_with_locating_every_element(chip, memory, data):
    """Explicit elements (gathers by element map) are located by a lookup per dimension, every
    element by an outer sum: both give each copy of each element the same place."""
    hw = CHIPS[chip]
    p = Placement(data.draw(legal_layouts(hw, memory)), hw, memory, "float32")
    chosen = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1))).integers(0, p.layout.numel, size=17)
    every, some = p.locate(), p.locate(chosen)
    rows = (chosen[:, None] * p.copies + np.arange(p.copies)).ravel()  # every's rows: element-major, then copy
    for name in ("element", "instance", "lw", "w", "time"):
        assert np.array_equal(getattr(some, name), getattr(every, name)[rows]), name
    for axis, values in every.coords.items():
        assert np.array_equal(some.coords[axis], values[rows]), axis


@pytest.mark.parametrize("chip", CHIPS)
@pytest.mark.parametrize("memory", ["LM0", "DRAM"])
@SETTINGS
@given(data=st.data())
def test_digit_formulas_agree_with_every_element(chip, memory, data):
    """What the planner computes from the layout's digits alone (instances used, and whether two
    layouts place every element alike) is what locating every element says."""
    hw = CHIPS[chip]
    p = Placement(data.draw(legal_layouts(hw, memory)), hw, memory, "float32")
    every = p.locate()
    assert np.array_equal(p.instances_used, np.unique(every.instance))
    other = Placement(data.draw(legal_layouts(hw, memory)), hw, memory, "float32")
    if other.layout.shape == p.layout.shape:
        def keys(x):
            loc = x.locate()
            return set(zip(loc.element.tolist(), loc.instance.tolist(), loc.lw.tolist(), loc.w.tolist()))
        assert p.same_placement(other) == (keys(p) == keys(other))


@pytest.mark.parametrize("a, b, same", [
    ("(16,)/((4:4, 4:1))", "(16,)/((16:1))", True),  # a factor split in two: the same digits
    ("(16,)/((4:1, 4:4))", "(16,)/((16:1))", False),  # transposed digits
    ("(8, 4)/((2_L2B:2, 4:4), (4:1))", "(8, 4)/((2_L2B:2, 2:8, 2:4), (2:2, 2:1))", True),
    ("(8, 4)/((2_L2B:2, 4:4), (4:1))", "(8, 4)/((2_L2B:2, 4:1), (4:4))", False),
])
def test_same_placement_compares_elements_not_text(mncore2, a, b, same):
    pa, pb = (Placement(parse(x), mncore2, "DRAM", "float32") for x in (a, b))
    assert pa.same_placement(pb) == pb.same_placement(pa) == same


@pytest.mark.parametrize("chip", CHIPS)
@pytest.mark.parametrize("memory", ["LM0", "DRAM"])
@SETTINGS
@given(data=st.data())
def test_a_unit_dimension_added_or_dropped_reads_the_same_words(chip, memory, data):
    """reshape_layout of any layout, padded or not, to its shape with a size-1 dimension added
    (an embedding's (V, D) table read as (1, V, D)) places every element where it was; dropping
    that dimension again does too."""
    from compiler.layout.reshape import reshape_layout
    hw = CHIPS[chip]
    layout = data.draw(legal_layouts(hw, memory))
    at = data.draw(st.integers(0, len(layout.shape)))
    shape = layout.shape[:at] + (1,) + layout.shape[at:]
    viewed = reshape_layout(layout, shape)
    assert viewed is not None and viewed.shape == shape
    back = reshape_layout(viewed, layout.shape)
    assert back is not None
    x = np.arange(1, layout.numel + 1, dtype=np.uint32).reshape(layout.shape)
    p = Placement(layout, hw, memory, "float32")
    want = np.zeros((p.instance_count, p.span_lw * 2), dtype=np.uint32)
    scatter(p, x, want, 0)
    for other in (viewed, back):
        q = Placement(other, hw, memory, "float32")
        assert (q.instance_count, q.span_lw, q.copies) == (p.instance_count, p.span_lw, p.copies)
        got = np.zeros_like(want)
        scatter(q, x.reshape(other.shape), got, 0)
        assert np.array_equal(got, want)


def test_a_padded_unit_dimension_is_not_dropped_in_place():
    """A size-1 dimension whose factor spans several positions (padding) holds its element at
    one of them: dropping it would move the others, so reshape_layout refuses (the caller gathers)."""
    from compiler.layout.reshape import reshape_layout
    layout = parse("(1, 8)/((2:8), (8:1))")
    assert layout.extents != layout.shape
    assert reshape_layout(layout, (8,)) is None


@pytest.mark.parametrize("text, shape", [
    # a product's (B*T, N) output, N padded to the PEs' lanes, read as (B, T, N)
    ("(256, 20)/((8_L1B:1, 16_MAB:1, 2:1), (4_L2B:2, 4_PE:1, 2_W:1))", (2, 128, 20)),
    ("(256, 20)/((8_L1B:1, 16_MAB:1, 2:1), (4_L2B:2, 4_PE:1, 2_W:1))", (4, 4, 16, 20)),
    # the padded dimension first, the others regrouped
    ("(20, 256)/((4_L2B:2, 4_PE:1, 2_W:1), (8_L1B:1, 16_MAB:1, 2:1))", (20, 16, 16)),
])
def test_a_padded_layout_reshapes_around_its_padded_dimensions(mncore2, text, shape):
    """reshape_layout of a padded layout that keeps its padded leading or trailing dimensions as
    they are and regroups the unpadded ones between them places every element where it was (a
    Linear over (B, T, F) reads its product's output so, instead of gathering it)."""
    from compiler.layout.reshape import reshape_layout
    layout = parse(text)
    assert layout.extents != layout.shape
    viewed = reshape_layout(layout, shape)
    assert viewed is not None and viewed.shape == shape
    x = np.arange(1, layout.numel + 1, dtype=np.uint32).reshape(layout.shape)
    p, q = (Placement(v, mncore2, "LM0", "float32") for v in (layout, viewed))
    want = np.zeros((p.instance_count, p.span_lw * 2), dtype=np.uint32)
    scatter(p, x, want, 0)
    got = np.zeros_like(want)
    scatter(q, x.reshape(shape), got, 0)
    assert (q.instance_count, q.span_lw) == (p.instance_count, p.span_lw) and np.array_equal(got, want)


def test_a_padded_dimension_regrouped_is_refused():
    """Padding inside the dimensions a reshape regroups would move elements: refused (gathered)."""
    from compiler.layout.reshape import reshape_layout
    assert reshape_layout(parse("(6, 8)/((8:8), (8:1))"), (48,)) is None
    assert reshape_layout(parse("(2, 6, 8)/((2:64), (8:8), (8:1))"), (12, 8)) is None

"""Products whose sizes do not fill their tiles: the operand layouts carry padding (1000 columns over
1024 places), which the MAU multiplies and sums, so it must hold zeros. An operand whose padding is
known to hold zeros (an uploaded input, a constant, a resident weight the runtime binds clean) and
that is stored as its staging's image is copied whole, padding included, as the unpadded product's
is; otherwise its long words are gathered with zeros put in the padding, in runs the padding cuts.
A computed operand's padding lanes (beside elements in their long words) are zeroed in passing by a
select against a mask. And B-stationary tilings pad a row tile to whole MAU rows per round."""

from __future__ import annotations

import pytest
import torch

from compiler.compile import compile_function
from compiler.kernels import matmul, relayout
from runtime import Device
from sim import Machine


def matmul_fn(d):
    return {"c": d["a"] @ d["b"]}


def compiled(hw, m: int, k: int, n: int):
    torch.manual_seed(m + k + n)
    inputs = {"a": torch.randn(m, k), "b": torch.randn(k, n)}
    return compile_function(matmul_fn, inputs, hw, options={"float_dtype": "float"}), inputs


@pytest.fixture
def padding_unknown(monkeypatch):
    """The planner blind to operands' zero padding: each padded operand gathered with zeros."""
    known = matmul.MatmulKernel.padding_known
    monkeypatch.setattr(matmul.MatmulKernel, "padding_known", lambda self, v, zero: known(self, v, False))


@pytest.mark.parametrize("shape", [(256, 250, 256), (256, 256, 250), (250, 250, 250)])
def test_padded_uploaded_operands_are_copied_whole_as_the_unpadded_products_are(mini, shape):
    """K, N or all three short of their tiles on mini: the same cycles as 256^3 and no MV shorter
    than its unit (each operand one block copy per step), values against torch."""
    product, inputs = compiled(mini, *shape)
    machine = Machine(mini)
    stats = machine.time(product.program.code)
    full = machine.time(compiled(mini, 256, 256, 256)[0].program.code)
    assert stats.short_mvs == 0
    assert stats.total_cycles <= full.total_cycles
    got = Device(mini).execute(product, inputs)["c"]
    want = matmul_fn(inputs)["c"]
    assert (got - want).abs().max() <= 1e-5 * want.abs().max()


def test_without_the_padding_known_zero_the_operands_are_gathered_in_short_runs(mini, padding_unknown):
    """The control: the same K-padded product gathering its operands, with zeros in the padding,
    in runs of fewer long words than an MV's unit, is slower (158,056 against 141,800 cycles when
    measured) and gives the same values."""
    product, inputs = compiled(mini, 256, 250, 256)
    machine = Machine(mini)
    stats = machine.time(product.program.code)
    assert stats.short_mvs > 0
    assert stats.total_cycles > machine.time(compiled(mini, 256, 256, 256)[0].program.code).total_cycles
    got = Device(mini).execute(product, inputs)["c"]
    want = matmul_fn(inputs)["c"]
    assert (got - want).abs().max() <= 1e-5 * want.abs().max()


def test_a_thousand_column_product_on_mncore2_runs_as_fast_as_1024(mncore2):
    """1024 x 1024 x 1000 on MN-Core 2: B's 24 padding columns per row cut its distributed broadcast
    into 122,880 gathered MVs of 16 long words (563,078 cycles for the 1024-column tiling, 77,362 for
    the best one timed); copied whole, it takes the 1024-column product's 36,446."""
    product, _ = compiled(mncore2, 1024, 1024, 1000)
    machine = Machine(mncore2)
    stats = machine.time(product.program.code)
    assert stats.short_mvs == 0
    assert stats.total_cycles <= machine.time(compiled(mncore2, 1024, 1024, 1024)[0].program.code).total_cycles


def test_b_stationary_rounds_pad_the_row_tile_to_whole_mau_rows(mncore2):
    """1000 x 1024 x 1024 on MN-Core 2: 250 rows per Group are not 4 rounds of whole MAU rows; padded
    to 256 (2.4 % more MAU work) B stays stationary and C's first rounds go up while the last
    multiplies: under 1.1x the 1024-row product's cycles (41,798 before the padding)."""
    chosen = []
    emit = matmul.emit_product
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(matmul, "emit_product", lambda cg, t, *a, **k: (chosen.append(t), emit(cg, t, *a, **k))[1])
        product, inputs = compiled(mncore2, 1000, 1024, 1024)
    t = chosen[-1]
    assert t.b_stationary and t.mt * t.rounds * t.tiles("m") > 1000
    machine = Machine(mncore2)
    cycles = machine.time(product.program.code).total_cycles
    assert cycles < 1.1 * machine.time(compiled(mncore2, 1024, 1024, 1024)[0].program.code).total_cycles
    got = Device(mncore2).execute(product, inputs)["c"]
    want = matmul_fn(inputs)["c"]
    assert (got - want).abs().max() <= 1e-5 * want.abs().max()


def log_product(d):
    return {"y": torch.log(d["x"].abs()) @ d["w"]}


@pytest.fixture
def log_inputs():
    """K = 1001: the last long word of each row of A holds one element and one padding lane, where
    log(|x|) of the uploaded zero is -inf; -inf times B's zero padding would make every sum NaN."""
    torch.manual_seed(0)
    return {"x": torch.randn(64, 1001), "w": torch.randn(1001, 64)}


def test_a_computed_operand_has_its_padding_lanes_zeroed_in_passing(mini, log_inputs, monkeypatch):
    """The product relays A with its padding lanes zeroed: staged slice by slice as it is, a select
    against a mask of ones keeps the elements (`RelayoutKernel._zero_lanes_in_passing`). Values
    against torch, no NaN, and under a fifth of the cycles of the element-by-element copy through
    the PEs it replaces (133,086 against 767,054 when measured)."""
    product = compile_function(log_product, log_inputs, mini)
    got = Device(mini).execute(product, log_inputs)["y"]
    want = log_product(log_inputs)["y"]
    assert not got.isnan().any()
    assert (got - want).abs().max() <= 1e-5 * want.abs().max()
    monkeypatch.setattr(relayout.RelayoutKernel, "_zero_lanes_in_passing", lambda self, *a: False)
    element_wise = compile_function(log_product, log_inputs, mini)
    machine = Machine(mini)
    assert 5 * machine.time(product.program.code).total_cycles < machine.time(element_wise.program.code).total_cycles


def test_without_zeroing_the_padding_lanes_the_product_is_nan(mini, log_inputs, monkeypatch):
    """The control: a product told its operands' lanes need no zeros reads A's -inf padding."""
    monkeypatch.setattr(matmul.MatmulKernel, "sums_lane_padding", lambda self, v, layout: False)
    product = compile_function(log_product, log_inputs, mini)
    assert Device(mini).execute(product, log_inputs)["y"].isnan().any()

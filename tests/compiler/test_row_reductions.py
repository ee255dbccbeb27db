"""Reductions over the last dim of a product's output (a log-softmax's maximum and sum, a loss's
pick of the target's logit): the rows must lie inside PEs, so the product's output is relaid.

* A reduction that keeps a size-1 dim (torch's gather of the target, a where over (N, 1, C)
  summed over C) packs the lanes on the kept dim that fills them, as the same sum over (N, C)
  does, rather than on none: with no such candidate it gathered its input in single long words
  (a linear layer's cross-entropy step on mncore2, 256 x 512 logits: 461,230 cycles for the pick
  against 136,738 + 17,630 relaid).
* Readers that want one value in one layout share one relay of it (Planner.copy_of).
* A reduction whose input lies in runs of the reduced dim inside the PEs may go in two steps,
  over the runs where they lie, then over their results (Planner.plan_reduce)."""

from __future__ import annotations

import torch

import hwdesc
import compiler.planner.search as search
from compiler.compile import compile_function
from compiler.kernels.reduce import reduction_layout
from compiler.errors import LayoutError
from compiler.layout import W_AXIS
from mlsdk.report import op_cycles
from runtime import Device
from sim import Machine

MINI = hwdesc.load("mini")


def test_a_kept_size_one_dim_leaves_the_lanes_to_the_kept_dim_that_fills_them():
    budget = 1024
    kept_one = reduction_layout((256, 1, 512), (2,), "float32", MINI, budget, pack_reduced=False)
    plain = reduction_layout((256, 512), (1,), "float32", MINI, budget, pack_reduced=False)
    assert [f.axis for f in kept_one.dims[0]] == [f.axis for f in plain.dims[0]]
    assert any(f.axis == W_AXIS for f in kept_one.dims[0])
    assert not any(f.axis == W_AXIS for f in kept_one.dims[1] + kept_one.dims[2])


def _pick(d):
    """A cross-entropy's pick of each row's target logit, as torch decomposes gather: a where over
    (N, 1, C) summed over C."""
    logits = d["a"] @ d["b"]
    hit = torch.arange(logits.shape[1]).unsqueeze(0) == d["t"].unsqueeze(1)
    return {"p": torch.where(hit.unsqueeze(1), logits.unsqueeze(1), 0.0).sum(-1)}


def _row_sum(d):
    return {"p": (d["a"] @ d["b"]).sum(-1, keepdim=True)}


def _reduction_cycles(fn, inputs) -> int:
    """The cycles of `fn`'s sum over the rows and of any relayout that feeds it, on mini."""
    compiled = compile_function(fn, inputs, MINI)
    got = Device(MINI).execute(compiled, inputs)
    torch.testing.assert_close(got["p"], fn(inputs)["p"], rtol=1e-4, atol=1e-4)
    stats = Machine(MINI).time(compiled.program.code)
    return sum(cycles for label, cycles, _ in op_cycles(stats, compiled.program.labels)
               if label.startswith(("sum_1 ", "relayout ")))


def test_the_pick_of_a_target_costs_what_a_row_sum_does(monkeypatch):
    """On mini, when written: the pick's sum 1,190 cycles after a relayout of 12,182, the row sum's
    1,190 after one of 10,588; before, the pick's sum gathered the where's output in single long
    words (27,882 cycles). Both with the product's layout chosen blind to the reductions that read
    a layout where it lies (across the PEs, `across_pes.reduces_where_it_lies`): seeing that, the
    row sum's product is laid out so (866 cycles for its sum, no relayout); the pick's where, one
    op further from the product, is not (4,332)."""
    from compiler import kernels
    monkeypatch.delitem(kernels.READS_AS_IS, "reduce")
    g = torch.Generator().manual_seed(0)
    inputs = {"a": torch.randn(64, 32, generator=g), "b": torch.randn(32, 128, generator=g),
              "t": torch.randint(0, 128, (64,), generator=g)}
    pick = _reduction_cycles(_pick, inputs)
    row_sum = _reduction_cycles(_row_sum, {"a": inputs["a"], "b": inputs["b"]})
    assert pick <= 1.25 * row_sum, (pick, row_sum)


def _three_reductions(d):
    y = d["a"] @ d["b"]
    return {"m": y.amax(-1), "s": y.sum(-1), "n": (y * 2).amin(-1)}


def test_readers_of_a_value_in_one_layout_share_its_relay(monkeypatch):
    """The maximum and the sum both read the product row by row: one relayout of it (10,588
    cycles on mini), not one each (46,106 against 56,694 cycles in all when written). (Each
    reduction whole: in two steps, over the rows' runs first, neither relays the product.)"""
    monkeypatch.setattr(search.Planner, "_reduced_run", lambda self, node: None)
    g = torch.Generator().manual_seed(0)
    inputs = {"a": torch.randn(64, 32, generator=g), "b": torch.randn(32, 128, generator=g)}

    def compiled_and_cycles():
        compiled = compile_function(_three_reductions, inputs, MINI)
        got = Device(MINI).execute(compiled, inputs)
        for name, want in _three_reductions(inputs).items():
            torch.testing.assert_close(got[name], want, rtol=1e-4, atol=1e-4)
        relays = [label for *_, label in compiled.program.labels if label == "relayout mm"]
        return len(relays), Machine(MINI).time(compiled.program.code).total_cycles

    shared, shared_cycles = compiled_and_cycles()
    monkeypatch.setattr(search.Planner, "copy_of", lambda self, v, target, zero_pad: None)
    each, each_cycles = compiled_and_cycles()
    assert (shared, each) == (1, 2)
    assert shared_cycles < each_cycles, (shared_cycles, each_cycles)


def _bias_gradient(d):
    return {"g": (d["x"] @ d["w"] * d["dy"]).sum(0)}


def test_a_sum_over_rows_held_in_runs_goes_over_the_runs_first(monkeypatch):
    """A bias gradient on mini: the product's rows lie in runs of 16 per PE; summed over those
    where they lie, then over the runs' sums, 11,972 cycles when written, against 35,588 with the
    rows gathered into the PEs. The same values as torch either way."""
    g = torch.Generator().manual_seed(0)
    inputs = {"x": torch.randn(64, 32, generator=g), "w": torch.randn(32, 128, generator=g),
              "dy": torch.randn(64, 128, generator=g)}

    def compiled_cycles() -> tuple[int, int]:
        compiled = compile_function(_bias_gradient, inputs, MINI)
        got = Device(MINI).execute(compiled, inputs)
        torch.testing.assert_close(got["g"], _bias_gradient(inputs)["g"], rtol=1e-4, atol=1e-3)
        sums = [label for *_, label in compiled.program.labels if "(sum)" in label]
        return len(sums), Machine(MINI).time(compiled.program.code).total_cycles

    in_runs, in_runs_cycles = compiled_cycles()
    monkeypatch.setattr(search.Planner, "_reduced_run", lambda self, node: None)
    whole, whole_cycles = compiled_cycles()
    assert (in_runs, whole) == (2, 1)
    assert in_runs_cycles < whole_cycles / 2, (in_runs_cycles, whole_cycles)


def test_local_runs_are_the_innermost_digits_and_lanes_of_a_dim():
    from compiler.kernels.reduce import local_runs
    from compiler.layout import parse
    layout = parse("(64, 128)/((2_MAB:1, 2_Time:1, 16:8), (2_L1B:1, 4_PE:1, 8:1, 2_W:1))")
    assert local_runs(layout, 0) == [16]  # the time slices are not together in a PE at once
    assert local_runs(layout, 1) == [2, 16]


def test_a_two_step_plan_that_fails_midway_leaves_the_reduction_as_it_is(monkeypatch):
    """A layout error in the two-step plan, after it placed its first step, is undone: the
    reduction is planned whole, with torch's values and the whole plan's cycles."""
    g = torch.Generator().manual_seed(0)
    inputs = {"x": torch.randn(64, 32, generator=g), "w": torch.randn(32, 128, generator=g),
              "dy": torch.randn(64, 128, generator=g)}
    monkeypatch.setattr(search.Planner, "_reduced_run", lambda self, node: None)
    whole = Machine(MINI).time(compile_function(_bias_gradient, inputs, MINI).program.code).total_cycles
    monkeypatch.undo()
    two_steps = search.Planner._plan_reduce_in_runs

    def failing(self, node, dim, *digits):
        two_steps(self, node, dim, *digits)
        raise LayoutError("no layout")
    monkeypatch.setattr(search.Planner, "_plan_reduce_in_runs", failing)
    compiled = compile_function(_bias_gradient, inputs, MINI)
    torch.testing.assert_close(Device(MINI).execute(compiled, inputs)["g"], _bias_gradient(inputs)["g"],
                               rtol=1e-4, atol=1e-3)
    assert Machine(MINI).time(compiled.program.code).total_cycles == whole


def _across_and_relaid(monkeypatch, hw, shapes: tuple[int, int, int]) -> list[tuple[int, int]]:
    """(relayouts, cycles) of three row reductions of a product of `shapes` on `hw`, with
    reductions across PEs and without; torch's values both times."""
    import compiler.kernels.across_pes as across
    m, k, n = shapes
    g = torch.Generator().manual_seed(0)
    inputs = {"a": torch.randn(m, k, generator=g), "b": torch.randn(k, n, generator=g) * 10}
    found = []
    for allowed in (True, False):
        if not allowed:
            monkeypatch.setattr(across, "across_pes", lambda *args: False)
        compiled = compile_function(_three_reductions, inputs, hw)
        got = Device(hw).execute(compiled, inputs)
        for name, want in _three_reductions(inputs).items():
            torch.testing.assert_close(got[name], want, rtol=1e-5, atol=1e-3)
        relays = [label for *_, label in compiled.program.labels if label.startswith("relayout")]
        found.append((len(relays), Machine(hw).time(compiled.program.code).total_cycles))
    return found


def test_the_total_of_partials_over_an_l1bs_pes_reduces_on_the_way_up(monkeypatch, mncore2):
    """The second step of a row's maximum, sum and minimum finds one partial per PE of an L1B (on
    MN-Core 2 a 256 x 128 x 512 product keeps its columns over the MABs and PEs, in runs): reduced
    by the PE stream's reducing transfer where they lie, the same values as torch; when written
    16,292 cycles in all, against 368,522 relaying the partials into PEs first (116,754 each)."""
    (relays, cycles), (relays_before, cycles_before) = _across_and_relaid(monkeypatch, mncore2, (256, 128, 512))
    assert (relays, relays_before) == (0, 3)
    assert cycles < cycles_before / 10, (cycles, cycles_before)


def test_partials_over_the_l1bs_too_go_up_one_hop_further(monkeypatch):
    """On mini an 8 x 16 x 256 product keeps its columns over the L1Bs, MABs and PEs: the totals
    reduce over the MABs into L1BM, over the L1Bs into L2BM, and come back down; torch's values
    in 5,968 cycles when written, against 9,450 relaying the partials (1,274 each)."""
    (relays, cycles), (relays_before, cycles_before) = _across_and_relaid(monkeypatch, MINI, (8, 16, 256))
    assert (relays, relays_before) == (0, 3)
    assert cycles < 0.7 * cycles_before, (cycles, cycles_before)


def test_a_span_larger_than_the_transit_buffers_goes_through_them_in_pieces(monkeypatch):
    """Each PE's partials go up, across and back down in pieces the L1BM / L2BM transit buffers
    hold: with room for one long word a PE, the same values as torch (on mini, when written: the
    8 x 16 x 256 product's reductions 5,968 cycles in pieces of the whole span, 7,816 in pieces of
    one long word)."""
    import compiler.kernels.across_pes as across
    (_, whole), _ = _across_and_relaid(monkeypatch, MINI, (8, 16, 256))
    monkeypatch.undo()
    monkeypatch.setattr(across, "transit_room", lambda ctx, over_l1bs: ctx.chain.pes_per_unit)
    (relays, pieces), _ = _across_and_relaid(monkeypatch, MINI, (8, 16, 256))
    assert relays == 0 and pieces > whole, (pieces, whole)


def test_a_reduction_runs_across_pes_only_over_every_mab_and_pe_of_an_l1b_unpadded():
    from compiler.chain import Chain
    from compiler.kernels.across_pes import across_pes
    from compiler.layout import parse
    chain = Chain.of(MINI)
    mabs, pes = chain.pes_per_l1 // chain.pes_per_unit, chain.pes_per_unit
    rows = f"(2_L1B:1, 8:1)"
    partials = parse(f"(16, {mabs * pes})/({rows}, ({mabs}_MAB:1, {pes}_PE:1); B@[W])")
    assert across_pes(partials, (1,), chain, "sum", "float32")
    assert across_pes(partials, (1,), chain, "max", "float32")
    assert not across_pes(partials, (1,), chain, "prod", "float32")  # the transfer has no product
    assert not across_pes(partials, (1,), chain, "sum", "int32")
    assert not across_pes(partials, (0,), chain, "sum", "float32")  # the rows are not over the PEs
    fewer = parse(f"(16, {mabs * pes - 1})/({rows}, ({mabs}_MAB:1, {pes}_PE:1); B@[W])")  # one PE pads
    assert not across_pes(fewer, (1,), chain, "sum", "float32")
    half = parse(f"(16, {mabs})/({rows}, ({mabs}_MAB:1); B@[W, PE])")  # over the MABs only
    assert not across_pes(half, (1,), chain, "sum", "float32")
    l1bs = chain.l1_per_l2
    wider = parse(f"(16, {l1bs * mabs * pes})/((16:1), ({l1bs}_L1B:1, {mabs}_MAB:1, {pes}_PE:1); B@[W])")
    assert across_pes(wider, (1,), chain, "max", "float32")  # over the L1Bs of each L2B too
    no_mabs = parse(f"(16, {l1bs * pes})/((2_MAB:1, 8:1), ({l1bs}_L1B:1, {pes}_PE:1); B@[W])")
    assert not across_pes(no_mabs, (1,), chain, "max", "float32")  # rows over the MABs: l1bmr would add them


def test_a_reduction_reads_where_it_lies_a_layout_its_steps_reduce_across_the_pes(mncore2):
    """`across_pes.reduces_where_it_lies`, the producer's estimate: a row reduction of MN-Core 2's
    256 x 512 product output reads it where it lies when the columns lie over the MABs and PEs
    of an L1B, with or without runs inside each PE (two steps: the runs, then across the PEs);
    not when they spread over the L2Bs, nor in time slices, nor for an op the reducing transfers
    do not have, nor for a reader of another operand."""
    from compiler.frontend.tracing import trace
    from compiler.kernels.across_pes import reduces_where_it_lies
    from compiler.kernels.context import Ref
    from compiler.layout import parse
    g = torch.Generator().manual_seed(0)
    graph = trace(_three_reductions, {"a": torch.randn(256, 128, generator=g), "b": torch.randn(128, 512, generator=g)})
    planner = search.Planner(graph, mncore2, {}, {})
    amax = next(n for n in graph.nodes if n.kind == "reduce" and n.op == "max")
    y = amax.args[0]

    def reads(layout: str, user=amax, v=y) -> bool:
        lm = parse(layout)
        return reduces_where_it_lies(user, v, Ref("y", planner.ctx.lm_placement(lm, "float32"), lm), planner)

    assert reads("(256, 512)/((4_L2B:2, 8_L1B:1, 8:4), (16_MAB:1, 4_PE:1, 4:1, 2_W:1))")  # runs of 8, then across
    assert reads("(256, 512)/((4_L2B:2, 64:1), (8_L1B:1, 16_MAB:1, 4_PE:1))")  # across the L1Bs, MABs and PEs at once
    assert not reads("(256, 512)/((8_L1B:1, 4_Time:1, 8:1), (4_L2B:2, 16_MAB:1, 4_PE:1, 2_W:1))")
    assert not reads("(256, 512)/((4_L2B:2, 8_L1B:1, 2_Time:1, 4:4), (16_MAB:1, 4_PE:1, 4:1, 2_W:1))")
    assert not reads("(256, 512)/((4_L2B:2, 8_L1B:1, 8:8), (16_MAB:1, 4_PE:1, 8:1))", v=amax.out)
    mul = next(n for n in graph.nodes if n.kind == "ew")
    assert not reads("(256, 512)/((4_L2B:2, 8_L1B:1, 8:4), (16_MAB:1, 4_PE:1, 4:1, 2_W:1))", user=mul)


def test_a_product_is_laid_out_where_its_row_reductions_read_it(monkeypatch, mncore2):
    """A product's candidates are priced by what their output costs its readers, and a row
    reduction reads a layout its two steps reduce across the PEs where it lies. Priced blind to
    that (each reduction charged a relayout into its wished rows, alike for every candidate),
    MN-Core 2's 256 x 128 x 512 product took a tiling with its columns over the L2Bs, 1,094
    cycles faster alone, and each of its readers then relaid it (146,242 cycles a copy): 352,082
    cycles in all, against 16,292. Torch's values both ways."""
    from compiler import kernels
    g = torch.Generator().manual_seed(0)
    inputs = {"a": torch.randn(256, 128, generator=g), "b": torch.randn(128, 512, generator=g) * 10}

    def relays_and_cycles() -> tuple[int, int]:
        compiled = compile_function(_three_reductions, inputs, mncore2)
        got = Device(mncore2).execute(compiled, inputs)
        for name, want in _three_reductions(inputs).items():
            torch.testing.assert_close(got[name], want, rtol=1e-4, atol=1e-2)
        relays = [label for *_, label in compiled.program.labels if label.startswith("relayout")]
        return len(relays), Machine(mncore2).time(compiled.program.code).total_cycles

    (relays, cycles) = relays_and_cycles()
    monkeypatch.delitem(kernels.READS_AS_IS, "reduce")
    (relays_blind, cycles_blind) = relays_and_cycles()
    assert relays == 0 and relays_blind >= 1
    assert cycles < cycles_blind / 10, (cycles, cycles_blind)

"""Properties of the planner that hold for any program: a faster chip never gets a slower one, and
an IOSpec constraint never makes a producer -> consumer chain slower.

The planner picks every layout and tiling by timing candidates on the simulator's own rules, from
candidate sets that do not depend on rates (layouts from the chip's axes; tilings that no other
does less work than), so on a variant whose transfer rates are all higher it can pick the same
program, which the simulator never times slower.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import yaml

import hwdesc
from compiler.compile import compile_function
from compiler.convert import build_conversion
from sim import Machine

RATE_KEYS = ("src_lw_per_cycle", "dst_lw_per_cycle", "cross_group_lw_per_cycle")


def faster(base: hwdesc.HwDesc, factor: float, tmp_path) -> hwdesc.HwDesc:
    """A variant of `base` with every transfer rate multiplied by `factor`."""
    transfers = {}
    for name, t in base.transfers.items():
        modes = {}
        for mode, m in t.modes.items():
            modes[mode] = {k: getattr(m, k) * factor for k in RATE_KEYS if getattr(m, k) is not None}
        transfers[name] = {"modes": modes}
    doc = {"extends": base.name, "name": f"{base.name}_x{factor}", "transfers": transfers}
    path = tmp_path / f"{base.name}_x{factor}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return hwdesc.load(path)


def conv(d):
    return {"y": F.conv2d(d["x"], d["w"], padding=1)}


CASES = {
    "seed": (lambda d: {"shared": d["x"] * 2}, {"x": torch.randn(32, 64)}),
    "product_512": (lambda d: {"c": d["a"] @ d["b"]}, {"a": torch.randn(512, 512), "b": torch.randn(512, 512)}),
    "conv": (conv, {"x": torch.randn(1, 16, 14, 14), "w": torch.randn(16, 16, 3, 3)}),
    "large_add": (lambda d: {"y": d["x"] + d["y"]}, {"x": torch.randn(1024, 2048), "y": torch.randn(1024, 2048)}),
}


def cycles(fn, inputs, hw) -> int:
    return Machine(hw).time(compile_function(fn, inputs, hw).program.code).total_cycles


@pytest.mark.parametrize("case", list(CASES))
def test_a_faster_chip_never_gets_a_slower_program(mncore2, tmp_path, case):
    fn, inputs = CASES[case]
    base = cycles(fn, inputs, mncore2)
    quicker = cycles(fn, inputs, faster(mncore2, 1.25, tmp_path))
    quickest = cycles(fn, inputs, faster(mncore2, 2.0, tmp_path))
    assert quickest <= quicker <= base


def test_the_variant_is_faster_where_rates_matter(mncore2, tmp_path):
    """The property is not vacuous: the products' cycles do fall on the faster chip."""
    fn, inputs = CASES["product_512"]
    assert cycles(fn, inputs, faster(mncore2, 2.0, tmp_path)) < cycles(fn, inputs, mncore2)


@pytest.mark.parametrize("chip", ["mini", "mncore2"])
@pytest.mark.parametrize("consumer", ["softmax", "transpose"])
def test_a_constraint_never_makes_the_chain_slower(chip, consumer):
    """A producer compiled to its consumer's input spec costs at most what it costs unconstrained
    plus the conversion the constraint avoids (the planner considers producing its own layout and
    converting at the end)."""
    hw = hwdesc.load(chip)
    x = torch.randn(64, 96)
    producer = lambda d: {"h": torch.relu(d["x"] * 2 + 1)}  # noqa: E731
    consumers = {"softmax": lambda d: {"p": torch.softmax(d["h"], -1)},
                 "transpose": lambda d: {"t": d["h"].t() @ d["h"]}}
    used = compile_function(consumers[consumer], {"h": x}, hw)
    free = compile_function(producer, {"x": x}, hw)
    tied = compile_function(producer, {"x": x}, hw, constraints={"h": used.inputs["h"]})
    machine = Machine(hw)
    convert = build_conversion(free.outputs["h"], used.inputs["h"], hw)
    tied_cycles = machine.time(tied.program.code).total_cycles
    free_cycles = machine.time(free.program.code).total_cycles
    conversion = machine.time(convert.program.code).total_cycles if not free.outputs["h"].is_memcopyable_to(
        used.inputs["h"]) else 0
    assert tied.outputs["h"].is_memcopyable_to(used.inputs["h"])
    assert tied_cycles <= free_cycles + conversion


ESTIMATED = {
    "product_square": (lambda d: {"c": d["a"] @ d["b"]}, {"a": torch.randn(256, 256), "b": torch.randn(256, 256)}),
    "product_tall": (lambda d: {"c": d["a"] @ d["b"]}, {"a": torch.randn(1000, 48), "b": torch.randn(48, 200)}),
    "product_batched": (lambda d: {"c": d["a"] @ d["b"]}, {"a": torch.randn(3, 64, 96), "b": torch.randn(3, 96, 40)}),
    "conv_3x3": (conv, {"x": torch.randn(2, 16, 14, 14), "w": torch.randn(32, 16, 3, 3)}),
    "conv_rgb_stride": (lambda d: {"y": F.conv2d(d["x"], d["w"], stride=2, padding=2)},
                        {"x": torch.randn(1, 3, 32, 32), "w": torch.randn(8, 3, 5, 5)}),
    "conv_1x1": (lambda d: {"y": F.conv2d(d["x"], d["w"])}, {"x": torch.randn(2, 64, 8, 8), "w": torch.randn(32, 64, 1, 1)}),
}


def estimates_against_timing(fn, inputs, hw, monkeypatch, options=None) -> list[tuple[str, float, int]]:
    """(kernel kind, estimate, timed cycles) of every candidate the planner considers, none pruned."""
    from compiler.planner import search
    monkeypatch.setattr(search, "ESTIMATE_SLACK", float("inf"))
    monkeypatch.setattr(search, "TIMED_INSTRUCTIONS", None)
    monkeypatch.setattr(search, "STALE_CANDIDATES", float("inf"))
    seen: list[tuple[str, int, int]] = []
    timed = search.Planner.time

    def record(self, kernel, refs, limit=None):
        cycles = timed(self, kernel, refs, limit)
        estimate = kernel.estimate(self.ctx, refs)
        if estimate is not None:
            seen.append((type(kernel).__name__, estimate, cycles))
        return cycles
    monkeypatch.setattr(search.Planner, "time", record)
    compile_function(fn, inputs, hw, options=options)
    monkeypatch.undo()
    return seen


@pytest.mark.parametrize("chip", ["mini", "mncore2"])
@pytest.mark.parametrize("case", list(ESTIMATED))
def test_kernel_estimates_stay_within_the_pruning_slack(chip, case, monkeypatch):
    """The planner does not time a candidate whose formula estimate exceeds ESTIMATE_SLACK times the
    fastest timed one; that is safe only while every estimate is at most ESTIMATE_SLACK times the
    candidate's timed cycles. Time every candidate (no pruning) and check it."""
    from compiler.planner import search
    fn, inputs = ESTIMATED[case]
    seen = estimates_against_timing(fn, inputs, hwdesc.load(chip), monkeypatch)
    assert len(seen) >= 2, "the case should offer several estimated candidates"
    for kind, estimate, cycles in seen:
        assert estimate <= search.ESTIMATE_SLACK * cycles, (kind, estimate, cycles)


RELAID = {  # programs whose planning times kernels with a bound: relayouts (a consumer's wish, an operand), ...
    "product_after_scale": (lambda d: {"y": (d["a"] * 2) @ d["b"]}, {"a": torch.randn(64, 96), "b": torch.randn(96, 40)}),
    "embedding": (lambda d: {"y": F.embedding(d["ids"], d["w"])},
                  {"ids": torch.randint(0, 500, (1, 16), generator=torch.Generator().manual_seed(0)),
                   "w": torch.randn(500, 32)}),
    "sum_beside": (lambda d: {"y": (d["a"] * 3).sum(0), "z": d["a"] + 1}, {"a": torch.randn(128, 96)}),
    # element-wise kernels whose inputs are gathered
    "add_strided": (lambda d: {"y": d["a"] + d["b"][:, ::3]}, {"a": torch.randn(64, 96), "b": torch.randn(64, 288)}),
    "relu_after_conv": (lambda d: {"y": F.relu(F.conv2d(d["x"], d["w"], padding=1)) * d["x"][:, :8]},
                        {"x": torch.randn(1, 16, 14, 14), "w": torch.randn(8, 16, 3, 3)}),
    "max_pool": (lambda d: {"y": F.max_pool2d(d["x"].permute(0, 3, 1, 2), 3, 2, 1)}, {"x": torch.randn(1, 16, 16, 8)}),
}


@pytest.mark.parametrize("chip", ["mini", "mncore2"])
@pytest.mark.parametrize("case", list(RELAID))
def test_least_cycles_never_exceed_the_timing(chip, case, monkeypatch):
    """`Kernel.least_cycles` lets the planner skip emitting a kernel that cannot win (a relayout
    past a candidate's limit, a consumer's costlier wish): that is exact only while it is a lower
    bound of the timing. Time every kernel the planner considers (relayouts included) and check."""
    from compiler.planner import search
    fn, inputs = RELAID[case]
    monkeypatch.setattr(search, "TIMED_INSTRUCTIONS", None)
    monkeypatch.setattr(search, "SKIP_BY_BOUNDS", False)
    seen: list[tuple[str, float, int]] = []
    timed = search.Planner.time

    def record(self, kernel, refs, limit=None):
        cycles = timed(self, kernel, refs, limit)
        seen.append((kernel.label, kernel.least_cycles(self.ctx, refs), cycles))
        return cycles
    monkeypatch.setattr(search.Planner, "time", record)
    compile_function(fn, inputs, hwdesc.load(chip))
    assert any(least > 0 for _, least, _ in seen), "the case should time kernels with a bound"
    for label, least, cycles in seen:
        assert least <= cycles, (label, least, cycles)


def test_skipping_by_bounds_keeps_the_program(mncore2, monkeypatch):
    """Kernels skipped by their bound would not have won: the program is the one timing every
    candidate gives, for fewer kernels emitted and timed."""
    from compiler.planner import search
    fn, inputs = RELAID["embedding"]
    timed = search.Planner.time
    programs, counts = [], []
    for skip in (True, False):
        count = [0]

        def record(self, kernel, refs, limit=None, count=count):
            count[0] += 1
            return timed(self, kernel, refs, limit)
        monkeypatch.setattr(search.Planner, "time", record)
        monkeypatch.setattr(search, "SKIP_BY_BOUNDS", skip)
        programs.append(compile_function(fn, inputs, mncore2).program.code)
        counts.append(count[0])
    assert np.array_equal(programs[0], programs[1])
    assert counts[0] < counts[1]


@pytest.mark.xfail(strict=True, reason="known gap: for a small convolution multiplied in half, the gather "
                                       "estimate counts up to 6x the MVs the program issues (the L2BM image's "
                                       "runs join across rows), so pruning may skip a faster tiling there")
def test_small_mixed_precision_conv_estimates_stay_within_the_slack(mncore2, monkeypatch):
    from compiler.planner import search
    from mlsdk.sweep.suite import cnn
    fn, inputs = cnn()  # its second conv reads the max-pool's output
    seen = estimates_against_timing(fn, inputs, mncore2, monkeypatch, {"float_dtype": "mixed"})
    assert all(estimate <= search.ESTIMATE_SLACK * cycles for _, estimate, cycles in seen)


def test_relayouts_of_a_losing_candidate_are_not_timed(mini, monkeypatch):
    """A candidate's relayouts are timed only while it can still win (Planner.priced_within): an
    embedding's one-hot product offers tilings that each need its large operand relaid, and most
    lose before all their relayouts are priced. The program is the one that pricing every
    relayout picks, for fewer relayouts timed."""
    from compiler.planner import search
    fn = lambda d: {"y": F.embedding(d["ids"], d["w"])}  # noqa: E731
    inputs = {"ids": torch.randint(0, 2000, (1, 16), generator=torch.Generator().manual_seed(0)),
              "w": torch.randn(2000, 32)}
    timed_relayouts = Counter()
    timing = search.Planner.time

    def counting(planner, kernel, refs, limit=None):
        timed_relayouts[type(kernel).__name__ == "RelayoutKernel"] += 1
        return timing(planner, kernel, refs, limit)
    monkeypatch.setattr(search.Planner, "time", counting)
    lazy = cycles(fn, inputs, mini)
    lazily_timed = timed_relayouts[True]
    timed_relayouts.clear()
    monkeypatch.setattr(search.Planner, "priced_within",
                        lambda planner, steps, start, limit, budget=None: start + sum(planner.price(s) for s in steps))
    assert cycles(fn, inputs, mini) == lazy
    assert lazily_timed < timed_relayouts[True], (lazily_timed, timed_relayouts[True])


def test_once_a_candidate_is_timed_the_others_must_fit_the_instruction_budget(mini, monkeypatch):
    """Candidates that read their inputs where they are are timed first; after one is, a candidate
    whose program (or a relayout it needs) passes TIMED_INSTRUCTIONS is dropped, not emitted in
    full. With a budget of no instructions at all, every choice keeps its first timed candidate:
    fewer programs are timed, and the program still computes the function."""
    from runtime import Device
    from compiler.planner import search
    torch.manual_seed(0)
    w1, w2 = torch.randn(24, 40), torch.randn(10, 24)
    fn = lambda d: {"y": torch.relu(d["x"] @ w1.T) @ w2.T}  # noqa: E731
    inputs = {"x": torch.randn(16, 40)}
    emitted = Counter()
    timing = search.Planner.time

    def counting(planner, kernel, refs, limit=None):
        cycles = timing(planner, kernel, refs, limit)
        emitted[limit is None] += 1
        return cycles
    monkeypatch.setattr(search.Planner, "time", counting)
    compile_function(fn, inputs, mini)
    unlimited = sum(emitted.values())
    emitted.clear()
    monkeypatch.setattr(search, "TIMED_INSTRUCTIONS", 0)
    compiled = compile_function(fn, inputs, mini)
    assert sum(emitted.values()) < unlimited, (emitted, unlimited)
    torch.testing.assert_close(Device(mini).execute(compiled, inputs)["y"], fn(inputs)["y"], rtol=1e-5, atol=1e-5)

"""options={"simulation_mode": "timing"}: calls are timed, not computed. Reports and cycles are
those of a full run; outputs hold no values, and reading one says so. "functional": calls are
computed, not timed; reports count them apart."""

from __future__ import annotations

import pytest
import torch

import mlsdk
from mlsdk import Context, MNDevice


def scores(d):
    return {"s": d["q"] @ d["k"].T}


def softmax(d):
    return {"p": torch.softmax(d["s"], dim=-1)}


Q, K = torch.randn(16, 8), torch.randn(32, 8)


def test_timing_mode_gives_the_cycles_of_a_full_run_and_no_values():
    ctx = Context(MNDevice("mini:auto"))
    full = ctx.compile(scores, {"q": Q, "k": K}, None)
    timed = ctx.compile(scores, {"q": Q, "k": K}, None, options={"simulation_mode": "timing"})
    values = full({"q": Q, "k": K})["s"]
    assert torch.allclose(values.cpu(), Q @ K.T, atol=1e-5)
    out = timed({"q": Q, "k": K})["s"]
    assert timed.last_call.cycles == full.last_call.cycles > 0
    assert timed.last_call.cycles_with_bindings == full.last_call.cycles_with_bindings
    with pytest.raises(mlsdk.DeviceError, match=r"scores#2.s has no values: a timing-only run") as e:
        out.cpu()
    assert isinstance(e.value, mlsdk.MLSDKError) and isinstance(e.value, RuntimeError)
    assert ctx.report().total_cycles > 0


def test_values_computed_from_a_timing_only_output_have_none_either():
    ctx = Context(MNDevice("mini:auto"))
    consumer = ctx.compile(softmax, {"s": Q @ K.T}, None)
    producer = ctx.compile(scores, {"q": Q, "k": K}, None, options={"simulation_mode": "timing"})
    probs = consumer(producer({"q": Q, "k": K}))["p"]
    with pytest.raises(mlsdk.DeviceError, match=r"softmax.p has no values"):
        probs.cpu()
    assert torch.allclose(consumer({"s": Q @ K.T})["p"].cpu(), torch.softmax(Q @ K.T, dim=-1), atol=1e-5), \
        "host inputs give values again"
    (h,) = ctx.report().handovers
    assert h.as_run > 0, "hand-overs are measured in timing mode too"


def test_simulation_mode_values_are_checked():
    ctx = Context(MNDevice("mini:auto"))
    with pytest.raises(mlsdk.OptionError, match=r"simulation_mode'\] is 'quick'; expected one of both, timing, "
                                                r"functional, fake, default, fast, best, full"):
        ctx.compile(scores, {"q": Q, "k": K}, None, options={"simulation_mode": "quick"})


@pytest.mark.parametrize("mode", ["fake", "default", "fast", "best", "full"])
def test_pfn_simulation_modes_run_both(mode):
    """PFN's values steer its compiler's schedule simulation, which mnsim has not: a program that
    passes one runs as 'both' (values and cycles)."""
    ctx = Context(MNDevice("mini:auto"))
    fn = ctx.compile(scores, {"q": Q, "k": K}, None, options={"simulation_mode": mode})
    assert torch.allclose(fn({"q": Q, "k": K})["s"].cpu(), Q @ K.T, atol=1e-5)
    assert fn.last_call.cycles > 0


def test_functional_mode_computes_the_values_of_a_full_run_without_timing_anything(monkeypatch):
    ctx = Context(MNDevice("mini:auto"))
    full = ctx.compile(scores, {"q": Q, "k": K}, None)
    fast = ctx.compile(scores, {"q": Q, "k": K}, None, options={"simulation_mode": "functional"})
    expected = full({"q": Q, "k": K})["s"].cpu()
    before = ctx.report().total_cycles
    monkeypatch.setattr("sim.Machine.time", lambda *a: pytest.fail("functional mode timed a program"))
    out = fast({"q": Q, "k": K})["s"]
    monkeypatch.undo()
    assert torch.equal(out.cpu(), expected)
    with pytest.raises(mlsdk.DeviceError, match=r"this call of scores#2 ran in functional mode .* its cycles were not"):
        fast.last_call.cycles
    assert fast.last_call.bindings[0].cycles is None
    report = ctx.report()
    assert report.untimed_calls == {"scores#2": 1}
    assert report.total_cycles == before + report.runs[-1].cycles, "the call counts nothing; its output's download does"
    assert [(r.kind, r.what) for r in report.runs[-3:]] == [("call", "scores"), ("download", "scores.s"), ("download", "scores#2.s")]
    assert "not timed (simulation_mode='functional'), so not counted here: 1 call of scores#2" in _text(report)
    assert type(report).from_json(report.to_json()).untimed_calls == {"scores#2": 1}


def test_a_hand_over_from_a_functional_call_is_not_measured():
    ctx = Context(MNDevice("mini:auto"))
    consumer = ctx.compile(softmax, {"s": Q @ K.T}, None)
    producer = ctx.compile(scores, {"q": Q, "k": K}, None, options={"simulation_mode": "functional"})
    probs = consumer(producer({"q": Q, "k": K}))["p"]
    assert torch.allclose(probs.cpu(), torch.softmax(Q @ K.T, dim=-1), atol=1e-5)
    assert consumer.last_call.cycles > 0 and not ctx.report().handovers


def _text(report) -> str:
    from io import StringIO

    from rich.console import Console

    from mlsdk.render import text
    out = StringIO()
    text(report, Console(file=out, width=200))
    return out.getvalue()


def test_a_script_whose_calls_all_ran_in_functional_mode_is_reported(tmp_path):
    from mlsdk.run import run_script
    script = tmp_path / "fast.py"
    script.write_text("import torch\nfrom mlsdk import Context, MNDevice\n"
                      "ctx = Context(MNDevice('mini:auto'))\n"
                      "f = ctx.compile(lambda d: {'y': d['x'] * 2}, {'x': torch.ones(8, 8)}, None,\n"
                      "                options={'simulation_mode': 'functional'})\n"
                      "for _ in range(3):\n    f({'x': torch.ones(8, 8)})\n")
    (report,) = run_script(str(script), []).reports()
    assert report.untimed_calls == {"lambda@fast.py:4": 3} and not [r for r in report.runs if r.kind == "call"]

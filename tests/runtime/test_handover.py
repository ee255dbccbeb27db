"""Relocation measured end to end: the report's whole-chain "saved" is the difference of two
whole runs, both simulated here, the constrained chain and the unconstrained one."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mlsdk import Context, MNDevice
from mlsdk.report import build
from mlsdk.run import run_script
from runtime import Session

REPO = Path(__file__).resolve().parents[2]
SEED = REPO / "examples" / "io_spec_constraints.py"
CHAIN = REPO / "examples" / "chain_conversion.py"


def chain_cycles(session: Session) -> int:
    """Cycles of a session's calls and their input bindings (what a chain counts: no loads of
    constants, no downloads of results, which both chains share)."""
    return sum(c.cycles_with_bindings for c in session.calls)


def script_session(script: Path, device: str, *args: str) -> Session:
    run = run_script(str(script), ["--device", device, *args])
    assert run.exit_code == 0
    (session,) = [s for s in run.sessions if s.calls]
    return session


@pytest.mark.parametrize("device", ["mini:auto", "mncore2:auto"])
def test_seed_saving_is_the_difference_of_whole_runs(device, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    constrained = script_session(SEED, device)
    text = SEED.read_text()
    assert 'shared_names = {"shared"}' in text
    unconstrained_script = tmp_path / "seed_unconstrained.py"
    unconstrained_script.write_text(text.replace('shared_names = {"shared"}', "shared_names = set()"))
    unconstrained = script_session(unconstrained_script, device)
    report = build([constrained])
    (chain,) = report.chains
    (row,) = [b for b in report.bindings if b.handover]
    difference = chain_cycles(unconstrained) - chain_cycles(constrained)
    assert abs(chain.saved - difference) <= 1
    assert abs(row.saved - difference) <= 1, "two functions: the hand-over's saving is the chain's"
    assert row.path == "relocation" and row.as_run == row.with_constraint
    if unconstrained.calls[-1].bindings[0].path == "relocation":  # the layouts agree by themselves
        assert row.note == "the layouts match without a constraint" and row.advice is None


def test_chain_conversion_with_and_without_the_advice(tmp_path, monkeypatch):
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    plain = script_session(CHAIN, "mini:auto")
    followed = script_session(CHAIN, "mini:auto", "--follow-advice")
    plain_report, followed_report = build([plain]), build([followed])
    (advised,) = [b for b in plain_report.bindings if b.handover]
    (relocated,) = [b for b in followed_report.bindings if b.handover]
    difference = chain_cycles(plain) - chain_cycles(followed)
    assert advised.path == "conversion" and relocated.path == "relocation"
    assert advised.saved == difference > 0 and f"save {difference} cycles" in advised.advice
    assert relocated.saved == difference and relocated.advice is None
    assert abs(followed_report.chains[0].saved - difference) <= 1
    assert plain_report.chains[0].saved == 0, "nothing constrained: as run is the unconstrained chain"
    assert advised.without_constraint == relocated.without_constraint == advised.as_run
    assert advised.with_constraint == relocated.with_constraint == relocated.as_run


def scores(d):
    return {"scores": d["q"] @ d["k"].T}


def softmax_rows(d):
    return {"probs": torch.softmax(d["scores"] * 0.125, dim=-1)}


def weighted(d):
    return {"out": d["probs"] @ d["v"]}


def three_function_chain(device: str, constrained: bool, tmp: Path) -> tuple[Session, torch.Tensor]:
    q, k, v = torch.randn(32, 16), torch.randn(64, 16), torch.randn(64, 16)
    ctx = Context(MNDevice(device))
    c = ctx.compile(weighted, {"probs": torch.zeros(32, 64), "v": v}, tmp / "c")
    b = ctx.compile(softmax_rows, {"scores": torch.zeros(32, 64)}, tmp / "b",
                    io_spec_constraints={"probs": c.input_specs["probs"]} if constrained else None)
    a = ctx.compile(scores, {"q": q, "k": k}, tmp / "a",
                    io_spec_constraints={"scores": b.input_specs["scores"]} if constrained else None)
    out = c({"probs": b(a({"q": q, "k": k}))["probs"], "v": v})["out"].cpu()
    assert torch.allclose(out, torch.softmax(q @ k.T * 0.125, dim=-1) @ v, atol=1e-4)
    return ctx.session, out


def test_three_function_chain_saving_is_the_difference_of_whole_runs(tmp_path):
    torch.manual_seed(0)
    constrained, out_c = three_function_chain("mini:auto", True, tmp_path / "c")
    torch.manual_seed(0)
    unconstrained, out_u = three_function_chain("mini:auto", False, tmp_path / "u")
    assert torch.allclose(out_c, out_u, atol=1e-5)
    report = build([constrained])
    (chain,) = report.chains
    assert chain.functions == ["scores", "softmax_rows", "weighted"] and chain.calls == 3
    assert chain.as_run == chain_cycles(constrained)
    assert abs(chain.saved - (chain_cycles(unconstrained) - chain_cycles(constrained))) <= 1
    assert abs(chain.unconstrained - chain_cycles(unconstrained)) <= 1
    unconstrained_report = build([unconstrained])
    assert unconstrained_report.chains[0].saved == 0
    handed = [b for b in report.bindings if b.handover]
    assert [b.consumer for b in handed] == ["softmax_rows.scores", "weighted.probs"]
    for b in handed:  # each hand-over's own counterfactual: only its producer's constraint dropped
        assert b.saved == b.without_constraint - b.with_constraint
        assert (b.note.startswith("the constraint costs")) == (b.saved < 0)

"""The example programs run as users run them (`python examples/X.py --device D`), in this process."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
SEED = REPO.parent / "shared" / "seed" / "000_3e2a4b885ec9f8ec.txt"


def run_example(name: str, device: str, capsys, *extra: str) -> str:
    argv = sys.argv
    sys.argv = [str(EXAMPLES / name), "--device", device, *extra]
    try:
        runpy.run_path(str(EXAMPLES / name), run_name="__main__")
    finally:
        sys.argv = argv
    return capsys.readouterr().out


# sha256 of examples/io_spec_constraints.py as copied from the seed listing (checked against the
# listing itself below when ../shared is checked out next to the repository)
SEED_SHA256 = "c583bf9f4ba9463d984a42222f7377bec2ef7f0059d75a87dad3241df80923c9"


def test_the_seed_example_is_unchanged():
    import hashlib
    assert hashlib.sha256((EXAMPLES / "io_spec_constraints.py").read_bytes()).hexdigest() == SEED_SHA256


@pytest.mark.skipif(not SEED.exists(), reason="the shared seed listing is not checked out next to the repo")
def test_the_seed_example_is_the_listing_byte_for_byte():
    listing = SEED.read_text()
    program = listing[listing.index('"""Connect compiled'):]
    assert (EXAMPLES / "io_spec_constraints.py").read_text().rstrip("\n") == program.rstrip("\n")


@pytest.mark.parametrize("device", ["mncore2:auto", "mini:auto", "emu2", "pfvm:cpu"])
def test_seed_example_succeeds(device, capsys):
    assert run_example("io_spec_constraints.py", device, capsys).strip() == "producer -> consumer direct-use succeeded"


def test_add_then_load_codegen_dir(capsys, tmp_path, monkeypatch):
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    out = run_example("add.py", "mini:auto", capsys)
    assert out.startswith("result_on_cpu=tensor([[2., 2., 2., 2.],")
    assert (tmp_path / "add_two_tensors" / "manifest.json").exists()
    out = run_example("load_codegen_dir.py", "mini:auto", capsys)
    assert out.startswith("Result from loaded function: result_on_cpu=tensor([[2., 2., 2., 2.],")
    trace = tmp_path / "t.json"
    run_example("add_trace.py", "mini:auto", capsys, "--trace", str(trace))
    assert trace.stat().st_size > 0


@pytest.mark.parametrize("name", ["explicit_data_transfer_api.py", "infer.py", "infer_multi.py"])
def test_registered_model_examples(name, capsys, tmp_path, monkeypatch):
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    run_example(name, "mini:auto", capsys)  # each asserts its values against torch


def test_chain_advice_followed_saves_what_it_said(capsys, tmp_path, monkeypatch):
    """chain_conversion.py as printed: the advice's figure is the difference of the two runs'
    chain cycles (both simulated), and the followed run relocates."""
    import re
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    plain = run_example("chain_conversion.py", "mncore2:auto", capsys)
    followed = run_example("chain_conversion.py", "mncore2:auto", capsys, "--follow-advice")
    assert plain.splitlines()[0] == followed.splitlines()[0] == "producer -> consumer chain succeeded"
    assert "consumer.scores from producer.scores: conversion" in plain
    assert "consumer.scores from producer.scores: relocation (0 cycles)" in followed
    (saves,) = re.findall(r"io_spec_constraints=\{'scores': consumer.input_specs\['scores'\]\} to relocate instead "
                          r"and save (\d+) cycles", plain)
    chain = [int(re.search(r"chain: ([\d,]+) cycles", out).group(1).replace(",", "")) for out in (plain, followed)]
    assert chain[0] - chain[1] == int(saves) > 0
    assert "advice" not in followed


def test_train_mnist_loss_falls_and_it_classifies(capsys, tmp_path):
    """PFN's MNIST classifier trained on the generated data set: one epoch of four batches of 64
    on mini; the example itself asserts that the loss fell."""
    out = run_example("train_mnist.py", "mini:auto", capsys, "--epochs", "1", "--train-samples", "256",
                      "--outdir", str(tmp_path))
    lines = out.splitlines()
    assert lines[0].startswith("epoch 0, loss ")
    correct = int(lines[-1].split()[1])
    assert lines[-1].startswith("Correct: ") and correct >= 450  # of 500; chance is 50
    assert (tmp_path / "train_step" / "manifest.json").exists()


def test_every_example_is_tested():
    tested = {"io_spec_constraints.py", "add.py", "load_codegen_dir.py", "add_trace.py",
              "explicit_data_transfer_api.py", "infer.py", "infer_multi.py", "chain_conversion.py",
              "train_mnist.py", "resnet.py"}
    assert {p.name for p in EXAMPLES.glob("*.py")} - tested == set()


def test_resnet_example_matches_torch_and_lists_its_costliest_ops(capsys):
    """ResNet-18 at 32x32 on mini: its values within 1e-4 of torch, the cycles of the call and
    its three costliest ops (the example asserts nothing itself: its numbers are checked here)."""
    import re
    out = run_example("resnet.py", "mini:auto", capsys, "--size", "32", "--top", "3")
    error = float(re.search(r"largest difference from torch: (\S+)", out).group(1))
    assert error < 1e-4, out
    total = int(re.search(r"on mini:auto: ([\d,]+) cycles", out).group(1).replace(",", ""))
    ops = [int(line.split()[0].replace(",", "")) for line in out.splitlines()[2:]]
    assert len(ops) == 3 and ops == sorted(ops, reverse=True) and 0 < sum(ops) <= total, out

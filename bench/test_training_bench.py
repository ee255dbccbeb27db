"""A training step of PFN's MNIST classifier (examples/train_mnist.py: 1024 -> 256 -> 10,
cross-entropy, MNCoreSGD(0.1, 0.9, 0.0), batch 64) compiled through mlsdk for mncore2.

* wall time of one simulated step (the call and reading the loss), against the same step in
  torch on the host (eager forward, backward and torch.optim.SGD) in the same run;
* its simulated cycles against the roofline of its matrix products: the multiply-adds of the
  forward (x W1^T, h W2^T) and backward (dL/dW2, dL/dh, dL/dW1) at the MAUs' float32 matrix
  rate of the YAML (`units.MAU.matrix`), and the split into forward, backward and optimizer.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

import hwdesc
from hwdesc.figures import matrix_cycles
from mlsdk import Context, MNCoreSGD, MNDevice, set_buffer_name_in_optimizer, set_tensor_name_in_module

from .conftest import baseline_seconds, record_ratio

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from train_mnist import MNCoreClassifier, synthetic_mnist  # noqa: E402

BATCH = 64


def classifier_step(device: str):
    torch.manual_seed(0)
    model = MNCoreClassifier()
    model.train()
    ctx = Context(MNDevice(device))
    set_tensor_name_in_module(model, "model")
    for p in model.parameters():
        ctx.register_param(p)
    optimizer = MNCoreSGD(model.parameters(), 0.1, 0.9, 0.0)
    set_buffer_name_in_optimizer(optimizer, "optimizer")
    ctx.register_optimizer_buffers(optimizer)

    def train_step(inp):
        optimizer.zero_grad()
        loss = model(inp["x"], inp["t"])["loss"]
        loss.backward()
        optimizer.step()
        return {"loss": loss}
    batch = synthetic_mnist(BATCH, BATCH, seed=1)[0]
    start = time.perf_counter()
    step = ctx.compile(train_step, batch, None)
    return ctx, step, batch, time.perf_counter() - start


def torch_step(batch):
    torch.manual_seed(0)
    model = MNCoreClassifier()
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), 0.1, 0.9, 0.0)

    def step():
        optimizer.zero_grad()
        loss = model(batch["x"], batch["t"])["loss"]
        loss.backward()
        optimizer.step()
        return loss.item()
    return step


def test_mnist_training_step(benchmark):
    ctx, step, batch, compile_s = classifier_step("mncore2:auto")
    step(batch)["loss"].item()  # warm: programs loaded, parameters uploaded
    baseline = baseline_seconds(torch_step(batch), rounds=20, warmup=3)
    benchmark.pedantic(lambda: step(batch)["loss"].item(), rounds=5, iterations=1, warmup_rounds=1)
    ratio = record_ratio(benchmark, "ratio_vs_torch_step", baseline)
    call = ctx.session.calls[-1]
    cycles = call.stats.total_cycles
    hw = hwdesc.load("mncore2")
    macs = 2 * BATCH * 1024 * 256 + 3 * BATCH * 256 * 10
    bound = matrix_cycles(hw, macs, "float32")
    phases = {r.phase: r.cycles // r.calls for r in ctx.report().phases}
    benchmark.extra_info.update(simulated_cycles_per_step=cycles, matrix_roofline_cycles=round(bound),
                                fraction_of_roofline=round(bound / cycles, 4), compile_s=round(compile_s, 2),
                                resident_bytes=ctx.resident_bytes(), **{f"{k}_cycles": v for k, v in phases.items()})
    print(f"\nMNIST classifier training step (batch {BATCH}) on mncore2: {benchmark.stats.stats.median:.2f} s per "
          f"simulated step, {ratio:.0f}x torch's step on the host ({baseline * 1e3:.2f} ms); {cycles:,} cycles per "
          f"step ({phases}), matrix-product roofline {bound:,.0f} cycles -> {bound / cycles:.4f} of it; "
          f"compile {compile_s:.1f} s; resident state {ctx.resident_bytes():,} bytes")

"""Compile time and compile memory of programs compiled through `mlsdk.Context.compile`.

Programs: the seed's producer (x * 2 on 32x64), the model suite's pre-LN transformer block
(2x16x64, causal; mlsdk/sweep/suite.py), ResNet-50 conv2_x's 3x3 layer (64 channels, 56x56)
at batch 16, Hugging Face GPT-2's language-model forward (1 layer, 128 wide, a vocabulary of
1,000, 64 tokens: its embedding and tied LM head are one-hot and transposed products), a
16M-element add, and a whole training step (the same GPT-2's language-model loss, backward and
MNCoreSGD step; a vocabulary of 512, 4 x 64 tokens), compiled once. The baseline, in the same
process, is torch tracing the same function to ATen (`make_fx`), which any compiler of torch
functions does first: the ratio is what planning and emission add on top. Each figure also goes
to `benchmark.extra_info` in seconds.

Compile memory is measured in a new process: the peak resident set of the compile over the one
before it (the inputs already built), against the inputs' own bytes.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from mlsdk import Context, MNDevice
from mlsdk.sweep.suite import transformer_block

from .conftest import baseline_seconds, record_ratio


def seed():
    return (lambda d: {"shared": d["x"] * 2}), {"x": torch.randn(32, 64)}


def conv2_x(batch: int = 16):
    torch.manual_seed(0)
    w = torch.randn(64, 64, 3, 3)
    return (lambda d: {"y": F.conv2d(d["x"], w, padding=1)}), {"x": torch.randn(batch, 64, 56, 56)}


def gpt2():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=1, n_head=4, n_embd=128, vocab_size=1000, n_positions=128,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel(config).eval()
    return (lambda d: {"logits": model(input_ids=d["ids"]).logits}), {"ids": torch.randint(0, 1000, (1, 64))}


PROGRAMS = {"seed": seed, "transformer_block": transformer_block, "conv2_x_batch16": conv2_x, "gpt2": gpt2}


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_compile_time_warm(benchmark, name):
    """Compile in a process that has compiled before (imports done, numba kernels cached)."""
    fn, inputs = PROGRAMS[name]()
    context = Context(MNDevice("mncore2:auto"))
    compile_once = lambda: context.compile(fn, inputs, None, options={"float_dtype": "float"})  # noqa: E731
    compile_once()
    baseline = baseline_seconds(lambda: make_fx(fn)(inputs), rounds=3, warmup=1)
    compiled = benchmark.pedantic(compile_once, rounds=3, iterations=1)
    ratio = record_ratio(benchmark, "ratio_vs_make_fx", baseline, compile_s=round(benchmark.stats.stats.median, 3),
                         instructions=len(compiled.compiled.program),
                         planned_cycles=compiled.compiled.summary["planned_cycles"])
    print(f"\ncompile {name} on mncore2: {benchmark.stats.stats.median:.2f} s, {ratio:.0f}x torch's make_fx "
          f"trace of it ({baseline * 1e3:.0f} ms)")


def test_training_step_compile_time(benchmark):
    """A Hugging Face GPT-2 training step compiled once in a warm process; the baseline is make_fx
    tracing the same step on the host (forward, backward and torch.optim.SGD on a model of its own)."""
    transformers = pytest.importorskip("transformers")
    from mlsdk import MNCoreSGD, set_buffer_name_in_optimizer, set_tensor_name_in_module
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=1, n_head=4, n_embd=128, vocab_size=512, n_positions=128,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    ids = {"ids": torch.randint(0, 512, (4, 64))}

    def training_step(model, optimizer):
        def step(d):
            optimizer.zero_grad()
            loss = model(input_ids=d["ids"], labels=d["ids"]).loss
            loss.backward()
            optimizer.step()
            return {"loss": loss}
        return step
    host_model = transformers.GPT2LMHeadModel(config).train()
    host_step = training_step(host_model, torch.optim.SGD(host_model.parameters(), 0.1, 0.9))
    baseline = baseline_seconds(lambda: make_fx(host_step)(ids), rounds=1, warmup=1)
    model = transformers.GPT2LMHeadModel(config).train()
    context = Context(MNDevice("mncore2:auto"))
    set_tensor_name_in_module(model, "model")
    for p in model.parameters():
        context.register_param(p)
    optimizer = MNCoreSGD(model.parameters(), 0.1, 0.9)
    set_buffer_name_in_optimizer(optimizer, "optimizer")
    context.register_optimizer_buffers(optimizer)
    compiled = benchmark.pedantic(lambda: context.compile(training_step(model, optimizer), ids, None), rounds=1,
                                  iterations=1)
    ratio = record_ratio(benchmark, "ratio_vs_make_fx", baseline, compile_s=round(benchmark.stats.stats.median, 2),
                         instructions=len(compiled.compiled.program))
    print(f"\ncompile of GPT-2's training step on mncore2: {benchmark.stats.stats.median:.1f} s, "
          f"{len(compiled.compiled.program):,} instructions, {ratio:.0f}x torch's make_fx trace of it "
          f"({baseline:.1f} s)")


PEAK_SCRIPT = textwrap.dedent("""
    import sys, torch
    from mlsdk import Context, MNDevice

    def kib(field):  # VmRSS: resident now; VmHWM: the peak since the last reset
        return int(next(l for l in open("/proc/self/status") if l.startswith(field)).split()[1])
    context = Context(MNDevice("mncore2:auto"))
    context.compile(lambda d: {"y": d["x"] + 1}, {"x": torch.randn(64)}, None)  # imports, numba cache
    n = int(sys.argv[1])
    inputs = {"a": torch.randn(n), "b": torch.randn(n)}
    before = kib("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the peak to the current resident set (Linux)
    context.compile(lambda d: {"c": d["a"] + d["b"]}, inputs, None)
    print(before, kib("VmHWM"))
""")


def test_compile_peak_memory_of_a_16m_add(benchmark):
    n = 16 * 1024 * 1024

    def run() -> tuple[int, int]:
        out = subprocess.run([sys.executable, "-c", PEAK_SCRIPT, str(n)], capture_output=True, text=True, check=True)
        before, peak = map(int, out.stdout.split())
        return before, peak
    before, peak = benchmark.pedantic(run, rounds=1, iterations=1)
    grown_mb = (peak - before) / 1024
    input_mb = 2 * n * 4 / 2 ** 20
    benchmark.extra_info.update(peak_rss_mb=round(peak / 1024), compile_growth_mb=round(grown_mb, 1),
                                growth_vs_inputs=round(grown_mb / input_mb, 3))
    print(f"\ncompile of a 16M-element add: peak RSS {peak / 1024:.0f} MB, {grown_mb:.1f} MB over the process "
          f"with its {input_mb:.0f} MB of inputs built ({grown_mb / input_mb:.3f}x the inputs)")

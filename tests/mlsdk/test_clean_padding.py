"""A registered weight read by view with its padding summed (a patch convolution over 3-channel
images: its channels padded to the lanes' 4 in K) needs that padding to hold zeros. The upload
writes zeros there; a program that writes the weight (a training step) may not. The compiled
program says which resident inputs it reads so (`Compiled.clean_inputs`), and the runtime binds
each a copy whose padding holds zeros: the uploaded one as it is, a written one after a copy on
the device that zeroes its padding, once per write, recorded as a binding of the call."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from mlsdk import Context, MNCoreSGD, MNDevice, set_tensor_name_in_module
from runtime.device import spec_placement
from runtime.resident import ResidentTensors


def _poison_padding(ctx: Context, name: str) -> None:
    """Fill the padding of `name`'s device copy with NaN, as a program may leave it: its values
    uploaded again through a host image whose padding is NaN (below the runtime's records)."""
    rt = ctx.runtime
    buf, spec = rt.resident.any_copy(name)
    device = rt.board()
    values, _ = device.download(buf, spec.dtype, tuple(spec.shape))
    image = device.host_image(spec_placement(spec, device.hw), upload=True)
    image[:] = np.float32(np.nan).view(np.uint32)  # the upload writes the elements only
    device.upload(buf, values)
    image[:] = 0


def _setup():
    torch.manual_seed(0)
    patches = nn.Conv2d(3, 16, 4, stride=4, bias=False)  # a ViT-style patch embedding
    ctx = Context(MNDevice("mini:auto"))
    set_tensor_name_in_module(patches, "patches")
    ctx.register_param(patches.weight)
    x = torch.randn(2, 3, 16, 16)
    infer = ctx.compile(lambda d: {"y": patches(d["x"])}, {"x": x}, None)
    optimizer = MNCoreSGD(patches.parameters(), 0.1, 0.0, 0.0)

    def step(d):
        optimizer.zero_grad()
        loss = patches(d["x"]).pow(2).mean()
        loss.backward()
        optimizer.step()
        return {"loss": loss}
    train = ctx.compile(step, {"x": x}, None)
    return ctx, patches, x, infer, train


def _zeroings(ctx: Context) -> list[str]:
    return [run.what for run in ctx.session.calls[-1].runs if run.what.startswith("zero the padding")]


def test_a_weight_read_with_its_padding_gets_a_zeroed_copy_after_a_program_writes_it():
    ctx, patches, x, infer, train = _setup()
    assert infer.compiled.clean_inputs == {"patches@weight"}
    assert train.compiled.clean_inputs == set()  # it writes the weight itself
    with torch.no_grad():
        torch.testing.assert_close(infer({"x": x})["y"].cpu(), patches(x), rtol=1e-5, atol=1e-5)
    assert _zeroings(ctx) == []  # the uploaded copy's padding is zero
    train({"x": x})
    _poison_padding(ctx, "patches@weight")
    got = infer({"x": x})["y"].cpu()
    assert len(_zeroings(ctx)) == 1
    ctx.synchronize()
    with torch.no_grad():
        torch.testing.assert_close(got, patches(x), rtol=1e-5, atol=1e-5)
    infer({"x": x})
    assert _zeroings(ctx) == []  # once per write: the zeroed copy is kept


def test_without_the_zeroed_copy_the_written_padding_reaches_the_result(monkeypatch):
    """The same calls with the runtime binding the written copy as it is: NaN in the result."""
    bind = ResidentTensors.bind
    monkeypatch.setattr(ResidentTensors, "bind", lambda self, *a, clean=False, **k: bind(self, *a, **k))
    ctx, patches, x, infer, train = _setup()
    train({"x": x})
    _poison_padding(ctx, "patches@weight")
    assert infer({"x": x})["y"].cpu().isnan().any()


def test_a_weight_loaded_from_the_host_needs_no_zeroed_copy():
    """load_from uploads through a host image whose padding is zero: the written copy is clean."""
    ctx, patches, x, infer, train = _setup()
    infer({"x": x})
    train({"x": x})
    new = torch.randn_like(patches.weight)
    ctx.get_registered_value_proxy(patches.weight).load_from(new)
    got = infer({"x": x})["y"].cpu()
    assert _zeroings(ctx) == []
    torch.testing.assert_close(got, F.conv2d(x, new, stride=4), rtol=1e-5, atol=1e-5)


def test_a_linear_weight_copied_whole_with_its_padding_is_declared_clean_and_read_so():
    """Linear(250, 120): K padded to 256 over the PEs. The product copies the weight whole,
    padding and all (`Source.zero_padded`), so the program declares it reads that padding
    (`clean_inputs`): a copy whose padding held NaN, below the runtime's records, would reach the
    result, which is why the runtime binds such a weight clean."""
    torch.manual_seed(0)
    linear, x = nn.Linear(250, 120, bias=False), torch.randn(64, 250)
    ctx = Context(MNDevice("mini:auto"))
    set_tensor_name_in_module(linear, "linear")
    ctx.register_param(linear.weight)
    infer = ctx.compile(lambda d: {"y": linear(d["x"])}, {"x": x}, None)
    assert infer.compiled.clean_inputs == {"linear@weight"}
    with torch.no_grad():
        torch.testing.assert_close(infer({"x": x})["y"].cpu(), linear(x), rtol=1e-5, atol=1e-5)
    _poison_padding(ctx, "linear@weight")
    assert infer({"x": x})["y"].cpu().isnan().any()

"""runtime.host_outputs: a download's array is used again only once nothing refers to it."""

from __future__ import annotations

import gc

import numpy as np
import pytest
import torch

import hwdesc
from compiler.layout import parse
from compiler.layout.placement import Placement
from runtime import Device
from runtime.host_outputs import MIN_BYTES, HostOutputs

SHAPE = (MIN_BYTES // (4 * 64) * 2, 64)  # float32: twice the size from which arrays are recycled


@pytest.fixture
def device_and_buffer():
    device = Device(hwdesc.load("mini"))
    rows = SHAPE[0]
    placement = Placement(parse(f"({rows},64)/(({rows}:32), (32:1, 2_W:1))"), device.hw, "DRAM", "float32")
    buf = device.alloc(placement)
    return device, buf


def values(seed: int) -> torch.Tensor:
    return torch.randn(SHAPE, generator=torch.Generator().manual_seed(seed))


def test_the_array_of_a_dropped_tensor_is_used_again(device_and_buffer):
    device, buf = device_and_buffer
    device.upload(buf, values(0))
    first, _ = device.download(buf, "float32", SHAPE)
    address = first.data_ptr()
    del first
    gc.collect()
    device.upload(buf, values(1))
    second, _ = device.download(buf, "float32", SHAPE)
    assert second.data_ptr() == address and torch.equal(second, values(1))


@pytest.mark.parametrize("keep", [lambda t: t, lambda t: t[3:], lambda t: t.numpy(), lambda t: t.reshape(-1)[::2]],
                         ids=["tensor", "slice", "numpy", "strided view"])
def test_an_array_still_referred_to_is_never_written_again(device_and_buffer, keep):
    device, buf = device_and_buffer
    device.upload(buf, values(0))
    first, _ = device.download(buf, "float32", SHAPE)
    address, kept = first.data_ptr(), keep(first)
    snapshot = torch.as_tensor(kept).clone()
    del first
    gc.collect()
    device.upload(buf, values(1))
    second, _ = device.download(buf, "float32", SHAPE)
    assert second.data_ptr() != address and torch.equal(second, values(1))
    assert torch.equal(torch.as_tensor(kept), snapshot)


def test_small_arrays_are_not_kept_and_the_pool_keeps_to_its_budget():
    pool = HostOutputs(budget=2 * MIN_BYTES)
    small = pool.array((16,), np.float32)
    assert pool.array((16,), np.float32) is not small
    big = (MIN_BYTES // 4,)
    a = pool.array(big, np.float32)
    b = pool.array(big, np.float32)
    assert b is not a  # a is still held
    a_address = a.ctypes.data
    del a
    assert pool.array(big, np.float32).ctypes.data == a_address
    pool.array((MIN_BYTES // 2,), np.float32)  # three arrays over a budget of two: the oldest goes
    assert sum(x.nbytes for xs in pool._arrays.values() for x in xs) <= 2 * MIN_BYTES


def test_an_interpreter_that_counts_references_otherwise_gets_no_recycling(monkeypatch):
    import runtime.host_outputs as outputs
    monkeypatch.setattr(outputs, "_counts_as_expected", lambda: False)
    pool = outputs.HostOutputs()
    big = (MIN_BYTES // 4,)
    first = pool.array(big, np.float32)
    del first
    pool.array(big, np.float32)
    assert pool.budget == 0 and not pool._arrays  # nothing kept, so nothing handed out twice

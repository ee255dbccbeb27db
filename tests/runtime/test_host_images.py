"""runtime.host_images: a device reuses the host image of a placement between transfers, and a
reused image is the image a new one would be."""

from __future__ import annotations

import numpy as np
import torch

import hwdesc
from compiler.layout import parse
from compiler.layout.hostio import scatter
from compiler.layout.placement import Placement
from runtime import Device
from runtime.device import to_bits
from runtime.host_images import HostImages


def placements(hw, shape):
    """Two DRAM placements of (rows, 7) with different images, the lanes of some long words
    padding: rows apart, and columns apart."""
    rows, cols = shape
    return (Placement(parse(f"({rows},{cols})/(({rows}:4), (4:1, 2_W:1))"), hw, "DRAM", "float32"),
            Placement(parse(f"({rows},{cols})/(({rows}:1), (4:{rows}, 2_W:1))"), hw, "DRAM", "float32"))


def fresh_image(device: Device, p: Placement, values: torch.Tensor) -> np.ndarray:
    image = np.zeros((p.instance_count, max(1, p.span_lw) * device.params.words_per_lw), dtype=np.uint32)
    scatter(p, to_bits(values, "float32", device.hw).reshape(p.layout.shape), image)
    return image


def test_uploads_in_one_placement_reuse_its_image_and_match_a_new_one():
    device = Device(hwdesc.load("mini"))
    shape = (6, 7)  # 7 float32 columns: the lanes of some long words are padding
    p, q = placements(device.hw, shape)
    for placement in (p, q, p):
        for seed in range(2):
            values = torch.randn(shape, generator=torch.Generator().manual_seed(seed)) + 10
            buf = device.alloc(placement)
            device.upload(buf, values)
            image = device.images.image(placement, upload=True)
            np.testing.assert_array_equal(image, fresh_image(device, placement, values))  # padding still zero
            back, _ = device.download(buf, "float32", shape)
            assert torch.equal(back, values)
            device.free(buf)
    assert device.images.image(p, upload=True) is device.images.image(p, upload=True)
    assert device.images.image(p, upload=True) is not device.images.image(q, upload=True)
    assert device.images.image(p, upload=True) is not device.images.image(p, upload=False)


def test_the_pool_keeps_recent_images_within_its_budget():
    hw = hwdesc.load("mini")
    p, q = placements(hw, (64, 7))
    one = HostImages(2).image(p, upload=True).nbytes
    pool = HostImages(2, budget=one)
    first = pool.image(p, upload=True)
    assert pool.image(p, upload=True) is first
    pool.image(q, upload=True)  # over budget with both: p's, the older, goes
    assert pool.image(p, upload=True) is not first
    small = HostImages(2, budget=one - 1)  # an image over the budget is never kept
    assert small.image(p, upload=True) is not small.image(p, upload=True)

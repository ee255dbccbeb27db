"""Host-side images of tensors in DRAM layouts, kept for the next transfer in the same layout.

An upload arranges a tensor into its layout's per-Group image and DMA copies the image over the
host link; a download is the reverse. A new image of a large tensor costs its pages: the kernel
maps and zeroes each on first touch, and when the copy into it runs on two threads they queue
for that (MN-Core 2's 4096 x 4096 upload: 70 ms into a new image against 7 ms into a used one).
So the device keeps the images of its recent placements, and a program called again reuses them.

Reuse needs no clearing. An upload image is only ever written by `scatter`, which writes the
words of the placement's elements and no others, so the padding of the same placement is still
zero. A download image is written by the DMA before `gather` reads it.

Not thread-safe on its own: the device uses it under its lock.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from compiler.layout import Placement

# Bytes of images kept (host policy: a few of the largest tensors a program uploads); an image
# larger than this is made for its transfer and dropped after.
POOL_BYTES = 1 << 28


class HostImages:
    """Images of recent (placement, direction) pairs, least recently used dropped first."""

    def __init__(self, words_per_lw: int, budget: int = POOL_BYTES) -> None:
        self.words_per_lw = words_per_lw
        self.budget = budget
        self._images: OrderedDict[tuple, np.ndarray] = OrderedDict()

    def image(self, placement: Placement, upload: bool) -> np.ndarray:
        """The image of `placement` for an upload (zero outside the elements) or a download."""
        p = placement
        key = (p.layout.key(), p.hw.fingerprint, p.memory, p.dtype, upload)
        found = self._images.get(key)
        if found is not None:
            self._images.move_to_end(key)
            return found
        image = np.zeros((p.instance_count, max(1, p.span_lw) * self.words_per_lw), dtype=np.uint32)
        if image.nbytes <= self.budget:
            self._images[key] = image
            while sum(i.nbytes for i in self._images.values()) > self.budget:
                self._images.popitem(last=False)
        return image

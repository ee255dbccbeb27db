"""BatchNorm with momentum=None (a cumulative average of the batch statistics), traced.

torch's `_BatchNorm.forward` weighs the batch by `1.0 / float(self.num_batches_tracked)`: a
Python number, read once while tracing and frozen into the program, although the device counts
the batches on (tracing refuses reading a registered tensor so). While tracing, a module in
training mode with momentum=None runs `cumulative_forward` instead: the same normalisation
(F.batch_norm on the batch's statistics) and the same update of the running statistics,
running = (1 - w) running + w batch with w = 1 / num_batches_tracked, written with w a tensor,
so the program reads the count where the device keeps it. torch.optim.swa_utils.update_bn
sets momentum=None so.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm

_FORWARD = _BatchNorm.forward  # torch's own


def cumulative_forward(self: _BatchNorm, input: torch.Tensor) -> torch.Tensor:
    """`_BatchNorm.forward` with the cumulative average's weight a tensor (see the module
    docstring); any other module (momentum given, eval mode, untracked statistics) runs torch's."""
    if self.momentum is not None or not self.training or not self.track_running_stats \
            or self.num_batches_tracked is None:
        return _FORWARD(self, input)
    self._check_input_dim(input)
    self.num_batches_tracked.add_(1)
    weight = 1.0 / self.num_batches_tracked  # this batch's weight in the average of all so far
    out = F.batch_norm(input, None, None, self.weight, self.bias, True, 0.0, self.eps)
    dims = [d for d in range(input.dim()) if d != 1]
    with torch.no_grad():  # torch's update: the mean, and the variance with Bessel's correction
        self.running_mean.mul_(1 - weight).add_(input.mean(dims) * weight)
        self.running_var.mul_(1 - weight).add_(input.var(dims, correction=1) * weight)
    return out


@contextlib.contextmanager
def traced_cumulative_average() -> Iterator[None]:
    """BatchNorm modules run `cumulative_forward` inside the block. The patch is process-wide
    while a trace runs (traces queue, one at a time): a module run eagerly on another thread
    meanwhile computes the same update, rounded as this forward rounds it."""
    _BatchNorm.forward = cumulative_forward
    try:
        yield
    finally:
        _BatchNorm.forward = _FORWARD

"""Which of torch's own decompositions the tracer applies.

torch's core-ATen table turns composite ops into core ATen; a few core-ATen ops that are
themselves composites of our primitives (softmax, the norms, gelu, addmm, embedding, ...) are
decomposed further with torch's registered decompositions (torch._decomp.decomposition_table),
so the legalizer (frontend.legalize) only has to know small ops. Nothing here is a hand-written
decomposition: the ops we lower ourselves (convolution, pooling, matrix products, resampling) are simply
left out.
"""

from __future__ import annotations

import functools

import torch
from torch._decomp import core_aten_decompositions, decomposition_table

aten = torch.ops.aten

FURTHER = (
    aten._softmax.default, aten._log_softmax.default, aten.native_layer_norm.default,
    aten.native_batch_norm.default, aten._native_batch_norm_legit_no_training.default,
    aten._native_batch_norm_legit.default, aten._native_batch_norm_legit_functional.default,
    aten._native_batch_norm_legit.no_stats, aten.native_group_norm.default, aten.gelu.default,
    aten.addmm.default, aten.embedding.default, aten.any.dim, aten.any.default, aten.index_select.default,
    aten.mean.dim, aten.var_mean.correction, aten.var.correction, aten.std.correction,
    aten.hardtanh.default, aten.split_with_sizes.default,
    aten.log_sigmoid_forward.default, aten.hardswish.default, aten.hardsigmoid.default,
    aten.elu.default, aten.leaky_relu.default, aten.softplus.default, aten.mish.default,
    aten.baddbmm.default, aten.addbmm.default, aten.addmv.default, aten.mv.default, aten.dot.default,
    aten.linalg_vector_norm.default, aten.norm.ScalarOpt_dim, aten.logsumexp.default,
    aten.nll_loss_forward.default, aten.mse_loss.default, aten.l1_loss.default, aten.smooth_l1_loss.default,
    aten.huber_loss.default, aten.binary_cross_entropy.default, aten.binary_cross_entropy_with_logits.default,
    aten.glu.default, aten.silu.default, aten.prod.default, aten.prod.dim_int, aten.new_empty_strided.default,
    aten.unfold.default, aten.ldexp.Tensor,
)

KEEP = (  # lowered as primitives: never decomposed, even where core ATen would
    aten.convolution.default, aten.mm.default, aten.bmm.default, aten.max_pool2d_with_indices.default,
    aten.avg_pool2d.default, aten.upsample_nearest2d.default, aten.upsample_nearest2d.vec,
    # separable resampling: two products with constant matrices (frontend.legalize_resample)
    *(getattr(aten, f"{name}{part}").default for name in ("upsample_bilinear2d", "upsample_bicubic2d",
                                                          "_upsample_bilinear2d_aa", "_upsample_bicubic2d_aa")
      for part in ("", "_backward")),
    aten.upsample_bilinear2d.vec, aten.upsample_bicubic2d.vec, aten._upsample_bilinear2d_aa.vec,
    aten._upsample_bicubic2d_aa.vec, aten._adaptive_avg_pool2d.default, aten._adaptive_avg_pool2d_backward.default,
    aten.im2col.default,  # F.unfold: one window of the input (frontend.legalize_nn)
)


@functools.cache
def table() -> dict:
    """The decomposition table handed to make_fx."""
    out = dict(core_aten_decompositions())
    for op in FURTHER:
        if op in decomposition_table:
            out[op] = decomposition_table[op]
    for op in KEEP:
        out.pop(op, None)
    return out

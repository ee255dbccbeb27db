"""The 4-D causal mask of a left-padded batch, made on the host so the compiled function takes
it as an input (PFN's llm_infer.py with --prepare_attention_mask_on_cpu)."""

from __future__ import annotations

import torch

from ...errors import ArgumentError


def prepare_4d_causal_attention_mask_with_cache_position(attention_mask: torch.Tensor, position_ids: torch.Tensor,
                                                         dtype: torch.dtype) -> torch.Tensor:
    """(batch, 1, queries, keys) additive mask in `dtype`: 0 where query i may attend key j
    (j at or before i, by position, and not padding), the dtype's lowest value elsewhere, as
    Hugging Face's models build it. `attention_mask` is the tokenizer's (batch, keys) 1/0 mask,
    `position_ids` the queries' positions (batch, queries), as llm_infer makes them with
    `attention_mask.cumsum(1)`: a left-padded prompt's padding has position 0."""
    if attention_mask.dim() != 2 or position_ids.dim() != 2 or position_ids.shape[0] != attention_mask.shape[0]:
        raise ArgumentError("prepare_4d_causal_attention_mask_with_cache_position takes a (batch, keys) attention mask "
                            f"and (batch, queries) position ids, got {list(attention_mask.shape)} and "
                            f"{list(position_ids.shape)}")
    key_positions = attention_mask.long().cumsum(1)  # (batch, keys): each key's position, padding 0
    visible = (key_positions[:, None, :] <= position_ids[:, :, None]) & attention_mask.bool()[:, None, :]
    lowest = torch.finfo(dtype).min
    return torch.where(visible, 0.0, lowest).to(dtype)[:, None, :, :]

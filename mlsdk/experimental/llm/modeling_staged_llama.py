"""A Hugging Face causal LM split into pipeline stages, one compiled function (one board) each, as
PFN's compile_pp_llama.py and run_pp_llama.py use it.

`split_llama(model, n)` gives n modules: the embedding stage (token embedding and the rotary
position embedding), n - 2 decoder stages of consecutive layers, and the head stage (final norm and
LM head). Each takes and returns a dict of tensors, so that a stage's outputs are the next stage's
inputs under the names the examples pass along:

* embedding: `input_ids`, `position_ids` -> `hidden_states_out`, `position_embeddings_cos_out`,
  `position_embeddings_sin_out`;
* decoder: `hidden_states`, `position_embeddings_cos`, `position_embeddings_sin`, `attention_mask`
  (the 4-D additive mask, `attention_mask.prepare_4d_causal_attention_mask_with_cache_position`),
  `position_ids`, `past_key_values` (its own layers' cache, `kv_cache.kv_cache_to_legacy`, or None
  for a prefill) -> `hidden_states_out`, the cos and sin passed on, and `past_key_values_out`
  (the cache after this step, for `kv_cache.kv_cache_to_tensor`);
* head: `hidden_states` -> `logits`.

The stages share the model's modules (no weights are copied). A decoder stage's cache holds its
own layers only, numbered from 0: the layers keep their indices in the whole model, and the stage's
cache maps them (`stage_cache`), so the whole model still runs as it did.
"""

from __future__ import annotations

import functools
import inspect
from math import ceil
from typing import Any

import torch
from torch import nn

from ...errors import ArgumentError
from .kv_cache import cache_pairs

# What split_llama takes from a causal LM: (attribute path, what it is)
PARTS = (("model.embed_tokens", "token embedding"), ("model.rotary_emb", "rotary position embedding"),
         ("model.layers", "decoder layers"), ("model.norm", "final norm"), ("lm_head", "LM head"))


def split_llama(model: nn.Module, n_stages: int) -> list[nn.Module]:
    """The embedding stage, `n_stages` - 2 decoder stages of ceil(layers / (n_stages - 2)) layers
    each (the last may hold fewer), and the head stage. Works for models built as Hugging Face's
    Llama is (Llama, Mistral, Qwen2: `model.embed_tokens`, `model.rotary_emb`, `model.layers`,
    `model.norm`, `lm_head`)."""
    for path, what in PARTS:
        if _attribute(model, path) is None:
            raise ArgumentError(f"split_llama: {type(model).__name__} has no {path} ({what}); it splits causal LMs "
                                "built as Hugging Face's Llama")
    if not isinstance(n_stages, int) or n_stages < 3:
        raise ArgumentError(f"split_llama: n_stages={n_stages!r}; it needs at least 3 (embedding, one decoder stage, "
                            "head)")
    layers = list(model.model.layers)
    per_stage = ceil(len(layers) / (n_stages - 2))
    groups = [layers[k * per_stage:(k + 1) * per_stage] for k in range(n_stages - 2)]
    empty = [k + 1 for k, g in enumerate(groups) if not g]
    if empty:
        raise ArgumentError(f"split_llama: {len(layers)} layers in {n_stages - 2} decoder stages of {per_stage} leave "
                            f"stage(s) {empty} without a layer; use at most {ceil(len(layers) / per_stage) + 2} stages")
    decoders = [DecoderStage(g, first_layer=k * per_stage) for k, g in enumerate(groups)]
    return [EmbeddingStage(model.model.embed_tokens, model.model.rotary_emb), *decoders,
            HeadStage(model.model.norm, model.lm_head)]


def _attribute(obj: Any, path: str) -> Any:
    for name in path.split("."):
        obj = getattr(obj, name, None)
    return obj


class EmbeddingStage(nn.Module):
    """Token embedding, and the rotary embedding's cos and sin for the positions, which every
    decoder stage's attention takes."""

    def __init__(self, embed_tokens: nn.Module, rotary_emb: nn.Module) -> None:
        super().__init__()
        self.embed_tokens = embed_tokens
        self.rotary_emb = rotary_emb

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor) -> dict[str, torch.Tensor]:
        hidden = self.embed_tokens(input_ids)
        cos, sin = self.rotary_emb(hidden, position_ids)
        return {"hidden_states_out": hidden, "position_embeddings_cos_out": cos, "position_embeddings_sin_out": sin}


def stage_cache(pairs: list[tuple[torch.Tensor, torch.Tensor]], first_layer: int) -> Any:
    """A decoder stage's cache: a transformers DynamicCache holding `pairs` as layers 0, 1, ...,
    which the model's layers update under their indices in the whole model (first_layer on), so
    that it holds the stage's layers only (what `kv_cache_to_tensor` stacks)."""
    cache = _stage_cache_class()(ddp_cache_data=pairs or None)
    cache.first_layer = first_layer
    return cache


@functools.cache
def _stage_cache_class() -> type:
    """DynamicCache with layer indices offset by the cache's `first_layer` (made on first use:
    transformers is imported only by those who split a model)."""
    from transformers import DynamicCache

    class StageCache(DynamicCache):
        first_layer = 0

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any,
                   **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
            return super().update(key_states, value_states, layer_idx - self.first_layer, *args, **kwargs)

    return StageCache


class DecoderStage(nn.Module):
    """Consecutive decoder layers of the model, from layer `first_layer` on."""

    def __init__(self, layers: list[nn.Module], first_layer: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.first_layer = first_layer

    def forward(self, hidden_states: torch.Tensor, position_embeddings_cos: torch.Tensor,
                position_embeddings_sin: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, past_key_values: Any = None) -> dict[str, Any]:
        pairs = [] if past_key_values is None else cache_pairs(past_key_values)
        if pairs and len(pairs) != len(self.layers):
            last = self.first_layer + len(self.layers) - 1
            raise ArgumentError(f"decoder stage of layers {self.first_layer}..{last}: past_key_values holds "
                                f"{len(pairs)} layers, not {len(self.layers)}")
        cache = stage_cache(pairs, self.first_layer)
        position_embeddings = (position_embeddings_cos, position_embeddings_sin)
        for layer in self.layers:
            out = layer(hidden_states, attention_mask=attention_mask, position_ids=position_ids,
                        position_embeddings=position_embeddings, use_cache=True, **{_cache_keyword(layer): cache})
            hidden_states = out[0] if isinstance(out, tuple) else out
        return {"hidden_states_out": hidden_states, "position_embeddings_cos_out": position_embeddings_cos,
                "position_embeddings_sin_out": position_embeddings_sin, "past_key_values_out": cache}


def _cache_keyword(layer: nn.Module) -> str:
    """How the installed transformers' decoder layer takes the cache: `cache` (5.x) or
    `past_key_values` (earlier)."""
    return "cache" if "cache" in inspect.signature(layer.forward).parameters else "past_key_values"


class HeadStage(nn.Module):
    """Final norm and LM head."""

    def __init__(self, norm: nn.Module, lm_head: nn.Module) -> None:
        super().__init__()
        self.norm = norm
        self.lm_head = lm_head

    def forward(self, hidden_states: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"logits": self.lm_head(self.norm(hidden_states))}

"""The KV cache as one tensor, so that a compiled decode step takes and returns it like any other.

A Hugging Face model returns its cache as a `Cache` object (a `DynamicCache` of per-layer key
and value tensors); a compiled function's inputs and outputs are tensors. `kv_cache_to_tensor`
stacks a cache into (layers, 2, batch, kv heads, sequence, head dim), key before value, and
`kv_cache_to_legacy` turns such a tensor back into what the model's `past_key_values` takes.
Both are plain torch code: inside a compiled function they trace into stacks and slices.
"""

from __future__ import annotations

from typing import Any

import torch

from ...errors import ArgumentError, UnsupportedOpError

KEY_VALUE = 2  # the tensor's dimension 1: key, then value
CACHE_DIMS = ("layers", "key/value", "batch", "kv heads", "sequence", "head dim")


def kv_cache_to_tensor(past_key_values: Any) -> torch.Tensor:
    """(layers, 2, batch, kv heads, sequence, head dim) from a `Cache` (its layers' `keys` and
    `values`) or the legacy tuple of (key, value) pairs per layer."""
    pairs = cache_pairs(past_key_values)
    if not pairs:
        raise ArgumentError("kv_cache_to_tensor: the cache holds no layers (run the model with use_cache=True)")
    return torch.stack([torch.stack([key, value]) for key, value in pairs])


def kv_cache_to_legacy(cache: torch.Tensor) -> Any:
    """What the model's `past_key_values` takes for a tensor from `kv_cache_to_tensor`: a
    `DynamicCache` of its layers' (key, value) pairs where transformers has one (it no longer
    takes the legacy tuple itself), else that tuple."""
    if not isinstance(cache, torch.Tensor) or cache.dim() != len(CACHE_DIMS) or cache.shape[1] != KEY_VALUE:
        raise ArgumentError("kv_cache_to_legacy takes a (layers, 2, batch, kv heads, sequence, head dim) tensor, "
                            f"got {type(cache).__name__}{list(cache.shape) if isinstance(cache, torch.Tensor) else ''}")
    pairs = tuple((layer[0], layer[1]) for layer in cache.unbind(0))
    try:
        from transformers import DynamicCache
    except ImportError:
        return pairs
    return DynamicCache(ddp_cache_data=pairs)


def kv_cache_to_plamo(cache: torch.Tensor) -> Any:
    """PLaMo's cache class ships with the model's remote code, whose format mnsim does not know:
    refused, naming the way that works (models with Hugging Face's own cache classes)."""
    raise UnsupportedOpError("kv_cache_to_plamo", [list(cache.shape)] if isinstance(cache, torch.Tensor) else [],
                             "", "PLaMo's KV cache format (its cache class comes with the model's remote code); "
                             "kv_cache_to_legacy serves models with transformers' own cache classes")


def cache_pairs(past_key_values: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The (key, value) pairs of a cache, layer by layer: a `Cache` (its layers' keys and values)
    or the legacy tuple of pairs."""
    layers = getattr(past_key_values, "layers", None)
    if layers is not None:
        return [(layer.keys, layer.values) for layer in layers]
    if isinstance(past_key_values, (tuple, list)) and all(len(p) >= KEY_VALUE for p in past_key_values):
        return [(p[0], p[1]) for p in past_key_values]
    raise ArgumentError(f"a KV cache (kv_cache_to_tensor's argument, a decoder stage's past_key_values) is a "
                        "transformers Cache or a tuple of (key, value) pairs, "
                        f"got {type(past_key_values).__name__}")

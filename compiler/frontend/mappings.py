"""Mappings that are not dicts (a tokenizer's BatchEncoding, collections.UserDict) as pytree nodes.

torch's pytree walks dict, OrderedDict and defaultdict but takes any other Mapping for a leaf, so
`compile(f, tokenizer(text))` saw one input named 'out' of type BatchEncoding. MLSDK programs pass
such mappings for inputs (PFN's llm_infer.py does): each Mapping class met in inputs is registered
once, its items the children under their keys, and rebuilt as its own class from a dict of them
(a plain dict when the class cannot be built so), so a traced function gets what it was given.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from torch.utils import _pytree as pytree

_LOCK = threading.Lock()


def register_mappings(tree: Any) -> None:
    """Register, as pytree nodes, the Mapping classes in `tree` that torch's pytree does not walk."""
    if isinstance(tree, Mapping):
        _register(type(tree))
    children = tree.values() if isinstance(tree, Mapping) else tree if isinstance(tree, (list, tuple)) else ()
    for child in children:
        register_mappings(child)


def _register(cls: type) -> None:
    with _LOCK:
        if cls in pytree.SUPPORTED_NODES:
            return

        def flatten(m: Mapping) -> tuple[list, list]:
            return list(m.values()), list(m.keys())

        def unflatten(values: list, keys: list) -> Mapping:
            items = dict(zip(keys, values))
            try:
                return cls(items)
            except Exception:  # noqa: BLE001 - a class not built from a dict: the items as a dict
                return items

        pytree.register_pytree_node(
            cls, flatten, unflatten,
            flatten_with_keys_fn=lambda m: ([(pytree.MappingKey(k), v) for k, v in m.items()], list(m.keys())),
            serialized_type_name=f"{cls.__module__}.{cls.__qualname__}")

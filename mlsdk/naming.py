"""Tensor names: how a Context tells the parameters of different models apart.

MLSDK names parameters with `set_tensor_name_in_module(model, "model")` (names like
"model@linear@weight") before registering them; the name travels with the tensor object.
"""

from __future__ import annotations

import weakref

import torch
from torch.utils.weak import WeakIdKeyDictionary

from .errors import ArgumentError

_names = WeakIdKeyDictionary()  # by identity: tensors compare by value
_optimizer_prefixes: "weakref.WeakKeyDictionary[torch.optim.Optimizer, str]" = weakref.WeakKeyDictionary()


def _expect(value: object, kind: type, what: str, where: str) -> None:
    if not isinstance(value, kind):
        raise ArgumentError(f"{where} takes {what}, got {type(value).__name__} {value!r:.60}")


def _expect_name(name: object, where: str) -> None:
    """A name must be a non-empty str: names become buffer symbols and IOSpec keys, and a number
    failed only at compile, inside a regular expression."""
    _expect(name, str, "a str name", where)
    if not name:
        raise ArgumentError(f"{where}: the name is empty")


def set_tensor_name(tensor: torch.Tensor, name: str) -> None:
    _expect(tensor, torch.Tensor, "a torch.Tensor", "set_tensor_name")
    _expect_name(name, "set_tensor_name")
    _names[tensor] = name


def get_tensor_name(tensor: torch.Tensor) -> str | None:
    _expect(tensor, torch.Tensor, "a torch.Tensor", "get_tensor_name")
    return _names.get(tensor)


def set_tensor_name_in_module(module: torch.nn.Module, prefix: str, *, only_unnamed: bool = False) -> None:
    """Name every parameter and buffer `prefix@path@to@tensor` (with `only_unnamed`, keep the
    names tensors already have)."""
    _expect(module, torch.nn.Module, "an nn.Module", "set_tensor_name_in_module")
    _expect_name(prefix, "set_tensor_name_in_module")
    for name, t in [*module.named_parameters(), *module.named_buffers()]:
        if not (only_unnamed and get_tensor_name(t) is not None):
            set_tensor_name(t, f"{prefix}@{name.replace('.', '@')}")


def optimizer_tensors(optimizer: torch.optim.Optimizer) -> list[tuple[str, torch.Tensor]]:
    """An optimizer's state tensors with their names' suffixes: `<param index>@<state key>` (the
    index counts the parameters of all its groups) and, for tensors kept in a parameter group
    (MNCore optimizers' learning rates), `group<group index>@<key>`."""
    index = {id(p): i for i, p in enumerate(p for g in optimizer.param_groups for p in g["params"])}
    out = [(f"{index[id(param)]}@{key}", t) for param, state in optimizer.state.items()
           for key, t in state.items() if isinstance(t, torch.Tensor)]
    out += [(f"group{g}@{key}", t) for g, group in enumerate(optimizer.param_groups)
            for key, t in group.items() if key != "params" and isinstance(t, torch.Tensor) and key != "initial_lr"]
    return out


def set_buffer_name_in_optimizer(optimizer: torch.optim.Optimizer, prefix: str, *, only_unnamed: bool = False) -> None:
    """Name every state tensor of an optimizer `prefix@<suffix>` (see optimizer_tensors), for
    `Context.register_optimizer_buffers`."""
    _expect(optimizer, torch.optim.Optimizer, "a torch optimizer", "set_buffer_name_in_optimizer")
    _expect_name(prefix, "set_buffer_name_in_optimizer")
    for suffix, t in optimizer_tensors(optimizer):
        if not (only_unnamed and get_tensor_name(t) is not None):
            set_tensor_name(t, f"{prefix}@{suffix}")
    _optimizer_prefixes[optimizer] = prefix


def optimizer_prefix(optimizer: torch.optim.Optimizer, default: str = "optimizer") -> str:
    """The prefix `set_buffer_name_in_optimizer` named an optimizer's state with."""
    return _optimizer_prefixes.get(optimizer, default)

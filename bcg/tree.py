"""Tensor leaves of a call's output, and cloning an output while keeping its structure.

Handles what DiT forwards return: a tensor, tuples/lists (`return_dict=False` gives `(sample,)`),
dicts and dataclass outputs such as diffusers' `Transformer2DModelOutput`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch


def tensor_leaves(obj: Any) -> list[torch.Tensor]:
    """Every tensor in `obj`, depth first, in a fixed order."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    out: list[torch.Tensor] = []
    _collect(obj, out)
    return out


def _collect(obj: Any, out: list) -> None:
    if isinstance(obj, torch.Tensor):
        out.append(obj)
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            _collect(x, out)
    elif isinstance(obj, dict):
        for x in obj.values():
            _collect(x, out)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            _collect(getattr(obj, f.name), out)


def clone_tree(obj: Any) -> Any:
    """A copy of `obj` whose tensors are fresh clones: the caller may keep it across replays."""
    if isinstance(obj, torch.Tensor):
        return obj.clone()
    if isinstance(obj, (list, tuple)):
        items = [clone_tree(x) for x in obj]
        if type(obj) is tuple or type(obj) is list:
            return type(obj)(items)
        return type(obj)(*items) if hasattr(obj, "_fields") else type(obj)(items)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        # Checked before dict: diffusers' BaseOutput is both, and its __init__ rebuilds the dict view.
        return dataclasses.replace(obj, **{f.name: clone_tree(getattr(obj, f.name))
                                          for f in dataclasses.fields(obj) if f.init})
    if isinstance(obj, dict):
        return type(obj)((k, clone_tree(v)) for k, v in obj.items())
    return obj

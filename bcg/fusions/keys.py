"""What decides a fused kernel's bits, as hashable, run-independent keys.

    tensor        ("T", shape, strides, dtype, device type, pointer alignment)
    nn.Module     ("M", class name, eps, its own parameters' tensor keys)
    None / str / bool / int / float / dtype     (type name, value)
    tuple / list  (type name, child keys);  dict: sorted (name, key) pairs
    anything else ("O", qualified class name)

Alignment is the largest power of two up to 16 bytes that divides the data pointer: aten (and
our kernels) take vector loads only on aligned buffers, so a view offset by 2 bytes takes other
code than the aligned tensor it was sliced from and must be verified on its own. The keys hold no
object ids, so a verdict can be kept across runs (cache.py).
"""

from __future__ import annotations

from typing import Any, Hashable

import torch
from torch import nn

ALIGN = 16
"""The widest vector access (bytes) of aten's vectorized elementwise and norm kernels and of ours."""

Key = Hashable


def alignment(t: torch.Tensor) -> int:
    if t.numel() == 0:
        return ALIGN
    p = t.data_ptr()
    return ALIGN if p % ALIGN == 0 else p & -p


def tensor_key(t: torch.Tensor) -> tuple:
    return ("T", tuple(t.shape), t.stride(), str(t.dtype).replace("torch.", ""), t.device.type, alignment(t))


def module_key(m: nn.Module) -> tuple:
    # eps: a norm's only non-tensor setting that changes its bits
    return ("M", type(m).__name__, getattr(m, "eps", None)) + tuple(
        tensor_key(p) for p in m.parameters(recurse=False))


_PLAIN = (bool, int, float, str)


def value_key(obj: Any) -> Key:
    """The key of one argument (tensors, modules, plain values, containers of them)."""
    if isinstance(obj, torch.Tensor):
        return tensor_key(obj)
    if obj is None:
        return None
    if isinstance(obj, _PLAIN):
        return (type(obj).__name__, obj)
    if isinstance(obj, torch.dtype):
        return ("dtype", str(obj))
    if isinstance(obj, nn.Module):
        return module_key(obj)
    if isinstance(obj, (tuple, list)):
        return (type(obj).__name__,) + tuple(value_key(x) for x in obj)
    if isinstance(obj, dict):
        return ("dict",) + tuple((str(k), value_key(obj[k])) for k in sorted(obj, key=str))
    return ("O", f"{type(obj).__module__}.{type(obj).__qualname__}")


def call_key(args: tuple, kwargs: dict) -> tuple[Key, Key]:
    return (value_key(args), value_key(kwargs))

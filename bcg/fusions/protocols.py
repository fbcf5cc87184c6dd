"""diffusers' modules as the fused code reads them (attentions, GLUMBConv, RMSNorm), for the type checker.

`nn.Module` types every attribute it does not declare as `Tensor | Module` (its `__getattr__`):
read through an `nn.Module`, an attention's `heads` is a tensor or a module, and so is its `to_q`.
The rules read diffusers' modules by attribute name, and each rule's `check` pins at run time what
it relies on (the processor's class, the norms' kinds); these Protocols name what the helpers read.
Children that are handed on (to the verifier's chains, to torch) stay `nn.Module`. Nothing here
runs: the fused code never tests a module against a Protocol.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
from torch import nn


class Processor(Protocol):
    """The class attributes of diffusers' dispatching processors (`dispatch_attention_fn`'s
    backend and parallel config), handed through untouched."""

    _attention_backend: Any
    _parallel_config: Any


class Attention(Protocol):
    """What every inlined processor reads: the projections, the head count, the optional q/k
    norms and `to_out` ([Linear, Dropout])."""

    heads: int
    processor: Processor
    to_q: nn.Module
    to_k: nn.Module
    to_v: nn.Module
    to_out: nn.ModuleList
    norm_q: nn.Module | None
    norm_k: nn.Module | None

    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...


class RMSNorm(Protocol):
    """diffusers' RMSNorm as ops_rope reads it (matched by class name, and not a torch.nn.RMSNorm)."""

    eps: float
    weight: torch.Tensor | None
    bias: torch.Tensor | None


class GLUMBConv(Protocol):
    """SANA's (and SANA-Video's) GLUMBConv as the inlined feed-forward reads it."""

    conv_inverted: nn.Conv2d
    conv_depth: nn.Conv2d
    conv_point: nn.Conv2d

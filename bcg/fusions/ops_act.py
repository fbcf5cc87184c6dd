"""Activation chains: SwiGLU (Z-Image's FeedForward) and GELU-tanh into its concatenation (Flux's
and LongCat's single-stream blocks); kernels in kernels_act.py."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .applicable import NotApplicable, check
from .ops import Op, _r, register


def _ka():
    from . import kernels_act

    return kernels_act


# -- FeedForward's SwiGLU: silu(w1 x) * w3 x --------------------------------------------------------
def _swiglu_eager(a, b):
    return F.silu(a) * b


def _swiglu_reference(a, b):
    dt = a.dtype
    return (_r(F.silu(a.float()), dt) * b.float()).to(dt)


SWIGLU = register(Op("swiglu", _swiglu_eager, _swiglu_reference, lambda a, b: _ka().swiglu(a, b)))


# -- Flux's single-stream block: torch.cat([attn_output, gelu_tanh(proj_mlp(x))], dim=2) ---------------
def _gelu_cat_eager(first, x, act):
    return torch.cat([first, act(x)], dim=2)


def _gelu_cat_reference(first, x, act):
    # the CPU's GELU-tanh is not aten's CUDA formula (another tanh, other roundings): no CPU plan;
    # the kernel's formula is tested under Triton's interpreter, and against aten on the GPU
    raise NotApplicable("aten's CUDA GELU-tanh has no plain-torch twin on the CPU")


def _gelu_cat_fused(fma: bool):
    def fused(first, x, act):
        check(isinstance(act, nn.GELU) and act.approximate == "tanh", "not nn.GELU(approximate='tanh')")
        return _ka().gelu_cat(first, x, gelu_fma=fma)

    return fused


GELU_CAT = tuple(register(Op(f"gelu_tanh_cat_{name}", _gelu_cat_eager, _gelu_cat_reference, _gelu_cat_fused(fma)))
                 for name, fma in (("fma", True), ("plain", False)))
"""nvcc's contraction of GELU-tanh's `x + kKappa * x_cube` (an FMA, as it compiles by default) first."""

"""Activation chains: SwiGLU (Z-Image's FeedForward) and GELU-tanh into its concatenation (Flux's
and LongCat's single-stream blocks); kernels in kernels_act.py."""

from __future__ import annotations

import torch
import torch.nn.functional as F

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

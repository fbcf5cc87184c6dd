"""RMSNorm chains (diffusers' `RMSNorm`): its variance in aten's reduction orders, and what follows
it fused: `* scale` (Z-Image's modulation), adaLN's `* (1 + scale) + shift` (LTX-2's, after norms
with or without a weight), `x + gate * norm(y)` (Z-Image's residuals), q/k + RoPE.

diffusers' RMSNorm: var = x.float().pow(2).mean(-1, keepdim=True); x * rsqrt(var + eps) (fp32);
.to(weight.dtype) when the weight is half/bf16; * weight. The variance is a chain of its own
(`rms_variance_*`: aten's CUDA reduction order, or aten's mean itself); the norm chains take it as
an argument (eager ignores it and runs the module) and fuse everything after the mean.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from .applicable import NotApplicable
from .ops import ADALN, Op, _adaln_reference, _r, register


def _zk():
    from . import kernels_rms

    return kernels_rms


def _var_eager(x):
    return x.to(torch.float32).pow(2).mean(-1, keepdim=True)


def _var_reference(mode: str):
    def reference(x):
        if mode != "sq_mean":
            raise NotApplicable(f"the {mode} order is aten's CUDA reduction (no plain-torch plan)")
        return _var_eager(x)

    return reference


def _var_rows(x):
    """The invariant mode's order (bcg/invariant/reduce_triton.py): its row kernel squaring as it loads."""
    from bcg.invariant.reduce_triton import row_sum

    if x.stride(-1) != 1 or x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise NotApplicable("the mode's row kernel reads rows of stride 1 in a float dtype")
    return row_sum(x, mean=True, keepdim=True, out_dtype=torch.float32, square=True)


def _var_fused(mode: str):
    def fused(x):
        k = _zk()
        if mode == "sq_mean":  # our squares, aten's mean
            return k.rms_sq(x).mean(-1, keepdim=True)
        if mode == "rows":
            return _var_rows(x)
        return k.row_variance(x, mode)

    return fused


RMS_VARIANCE_MODES = ("vec_dec", "vec_inc", "strided_dec", "strided_inc", "rows", "sq_mean")
RMS_VARIANCE = tuple(register(Op(f"rms_variance_{m}", _var_eager, _var_reference(m), _var_fused(m)))
                     for m in RMS_VARIANCE_MODES)
"""RMSNorm's variance: aten's CUDA reduction orders first (kernels_rms.VAR_MODES: a default job's eager),
then the invariant mode's (`rows`: under `bcg.invariant` eager's mean is the mode's row kernel, and this
reads the activation once where `sq_mean` writes and reads an fp32 copy), and our squares with whatever
mean eager runs last."""


def _rms_applicable(x: torch.Tensor, norm: nn.Module, eps: float, weightless: bool = False) -> None:
    if type(norm).__name__ != "RMSNorm" or isinstance(norm, nn.RMSNorm) or getattr(norm, "bias", None) is not None:
        raise NotApplicable("not a diffusers RMSNorm without bias")
    weight = getattr(norm, "weight", None)
    if weight is None and not weightless:
        raise NotApplicable("not a diffusers RMSNorm with a weight")
    if (weight is not None and weight.dtype != x.dtype) or norm.eps != eps:
        raise NotApplicable("the norm's weight dtype differs from its input's (or eps is not the norm's)")


def _rms_plan(x: torch.Tensor, var: torch.Tensor, norm: nn.Module, eps: float,
              weightless: bool = False) -> torch.Tensor:
    """RMSNorm(x) given its variance, in fp32 holding storage-dtype values (every kernel's plan);
    without a weight (`weightless` allows it) the norm's `.to(input_dtype)` is the last rounding."""
    _rms_applicable(x, norm, eps, weightless)
    dt = x.dtype
    n = _r(x.float() * torch.rsqrt(var + eps), dt)
    weight = getattr(norm, "weight", None)
    assert weight is None or isinstance(weight, torch.Tensor)  # _rms_applicable: a diffusers RMSNorm
    return n if weight is None else _r(n * weight.float(), dt)


def _mul_r(a: torch.Tensor, b: torch.Tensor | None, dt: torch.dtype) -> torch.Tensor:
    return a if b is None else _r(b.float() * a, dt)


# -- norm(x) [* scale]: attention_norm1(x) * scale_msa, ffn_norm1(x) * scale_mlp ----------------
def _rms_scale_eager(x, var, norm, eps, scale):
    y = norm(x)
    return y if scale is None else y * scale


def _rms_scale_reference(x, var, norm, eps, scale):
    return _mul_r(_rms_plan(x, var, norm, eps), scale, x.dtype).to(x.dtype)


def _rms_scale_fused(x, var, norm, eps, scale):
    _rms_applicable(x, norm, eps)
    k = _zk()
    return k.rms_scale(x, k.rstd_input(var, eps), norm.weight, eps, scale)


RMS_SCALE = register(Op("rms_norm_scale", _rms_scale_eager, _rms_scale_reference, _rms_scale_fused))


# -- norm(x) [* (1 + scale) + shift]: LTX-2's norms (no weight in its releases) and their adaLN ------------
def _rms_adaln_eager(x, var, norm, eps, scale, shift):
    y = norm(x)
    return y if scale is None else y * (1 + scale) + shift


def _rms_adaln_reference(x, var, norm, eps, scale, shift):
    n = _rms_plan(x, var, norm, eps, weightless=True).to(x.dtype)
    if scale is None:
        return n
    if not (scale.dtype == shift.dtype == x.dtype):  # eager would promote: another plan
        raise NotApplicable("scale / shift must have x's dtype")
    return _adaln_reference(n, scale, shift)


def _rms_adaln_fused(x, var, norm, eps, scale, shift):
    _rms_applicable(x, norm, eps, weightless=True)
    k = _zk()
    return k.rms_adaln(x, k.rstd_input(var, eps), norm.weight, eps, scale, shift)


RMS_ADALN = register(Op("rms_norm_adaln", _rms_adaln_eager, _rms_adaln_reference, _rms_adaln_fused))


def rms_adaln(call: Callable, x: torch.Tensor, var: torch.Tensor, norm: nn.Module, scale, shift) -> torch.Tensor:
    """norm(x) * (1 + scale) + shift (norm(x) when scale is None) through the verifier, given x's variance
    (a chain of RMS_VARIANCE); its fallback is the module's norm, then the elementwise adaLN chain."""
    def fallback(x, var, norm, eps, scale, shift):
        return norm(x) if scale is None else call(ADALN, norm(x), scale, shift)

    return call(RMS_ADALN, x, var, norm, norm.eps, scale, shift, fallback=fallback)


# -- x + gate * norm(y): the block's two residuals ----------------------------------------------
def _rms_res_eager(x, gate, y, var, norm, eps):
    return x + norm(y) if gate is None else x + gate * norm(y)


def _rms_res_reference(x, gate, y, var, norm, eps):
    dt = x.dtype
    return (x.float() + _mul_r(_rms_plan(y, var, norm, eps), gate, dt)).to(dt)


def _rms_res_fused(x, gate, y, var, norm, eps):
    _rms_applicable(y, norm, eps)
    k = _zk()
    return k.rms_residual(x, gate, y, k.rstd_input(var, eps), norm.weight, eps)


RMS_RESIDUAL = register(Op("gated_rms_residual", _rms_res_eager, _rms_res_reference, _rms_res_fused))


# -- q/k: RMSNorm over the head dim, then ZSingleStreamAttnProcessor's apply_rotary_emb -----------
def _norm_rope_eager(x, var, norm, eps, freqs):
    x_in = norm(x)
    with torch.amp.autocast("cuda", enabled=False):
        xc = torch.view_as_complex(x_in.float().reshape(*x_in.shape[:-1], -1, 2))
        x_out = torch.view_as_real(xc * freqs.unsqueeze(2)).flatten(3)
        return x_out.type_as(x_in)


def _norm_rope_reference(mode: str):
    def reference(x, var, norm, eps, freqs):
        if mode != "plain":
            raise NotApplicable(f"the {mode} contraction is the GPU's (no FMA in the plain-torch plan)")
        n = _rms_plan(x, var, norm, eps)
        a, b = n[..., 0::2], n[..., 1::2]
        f = torch.view_as_real(freqs).unsqueeze(2).float()
        c, d = f[..., 0], f[..., 1]
        return torch.stack([a * c - b * d, a * d + b * c], dim=-1).flatten(3).to(x.dtype)

    return reference


def _norm_rope_fused(mode: str):
    def fused(x, var, norm, eps, freqs):
        _rms_applicable(x, norm, eps)
        from . import kernels_rope as KR

        return KR.rope(x, freqs, KR.Rope("complex", mode), norm="mean", weight=norm.weight, eps=eps,
                       var=_zk().rstd_input(var, eps))

    return fused


NORM_ROPE_MODES = ("fma_ac_ad", "fma_bd_bc", "fma_ac_bc", "fma_bd_ad", "plain")  # = kernels_rope.CMUL_MODES
NORM_ROPE = tuple(register(Op(f"rms_norm_rope_{m}", _norm_rope_eager, _norm_rope_reference(m), _norm_rope_fused(m)))
                  for m in NORM_ROPE_MODES)
"""One op per candidate contraction of aten's complex product; the Z-Image block tries them in
order and keeps the first the verifier finds equal to eager."""


# -- q/k: the same chain with the variance reduced in the RoPE kernel (aten's mean order, vec_dec: the
#    H200's for rows of 128); tried before the chain above, which needs its own variance kernel -------
def _norm_rope_in_eager(x, norm, eps, freqs):
    return _norm_rope_eager(x, None, norm, eps, freqs)


def _norm_rope_in_reference(mode: str):
    plan = _norm_rope_reference(mode)

    def reference(x, norm, eps, freqs):
        return plan(x, _var_eager(x), norm, eps, freqs)  # the CPU's mean stands in for the kernel's order

    return reference


def _norm_rope_in_fused(mode: str):
    def fused(x, norm, eps, freqs):
        _rms_applicable(x, norm, eps)
        from . import kernels_rope as KR

        return KR.rope(x, freqs, KR.Rope("complex", mode), norm="mean", weight=norm.weight, eps=eps)

    return fused


NORM_ROPE_IN = tuple(register(Op(f"rms_norm_rope_in_{m}", _norm_rope_in_eager, _norm_rope_in_reference(m),
                                 _norm_rope_in_fused(m))) for m in ("fma_ac_ad", "plain"))

"""LayerNorm + adaLN chains (SANA's `norm1`/`norm2` and their modulation), one kernel each.

Unlike ops.py's chains these fuse a reduction, so the Triton kernel (kernels_norm.py) must add in
aten's CUDA order. Its `reference` twin cannot: on the CPU it is aten's CPU LayerNorm followed by
adaLN's rounding plan, which equals CPU eager bit for bit; the GPU kernel's summation order is
proven only on the GPU (tests/gpu/test_fusions_gpu.py) and by the verifier on live inputs.

Where nvcc's FMA contraction is ambiguous (`nA * meanA + nB * meanB`) the kernel has forms
(`MEAN_FMA`). On the H200 form 0 reproduced aten's mean and rstd on every fp32 and bf16 row tried,
the others did not (benchmarks/results/ln_diagnosis_h200.json); form 0 is the chain. If a build of
aten contracts otherwise, the verifier rejects it and the fallback runs: aten's LayerNorm, then
the elementwise adaLN chain (and the residual's own chain before them).
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from .applicable import NotApplicable
from .ops import ADALN, GATED_RESIDUAL, Op, _adaln_eager, _adaln_reference, _gres_reference, register


def _kernels():
    from . import kernels_norm

    return kernels_norm


def _plain_layer_norm(norm: nn.Module) -> None:
    if not isinstance(norm, nn.LayerNorm) or norm.weight is not None or norm.bias is not None:
        raise NotApplicable("not an nn.LayerNorm without affine parameters")
    if len(norm.normalized_shape) != 1:
        raise NotApplicable("LayerNorm over more than the last axis")


# -- LN(x) * (1 + scale) + shift ----------------------------------------------------------
def _ln_adaln_eager(x, norm: nn.Module, scale, shift):
    return _adaln_eager(norm(x), scale, shift)


def _ln_adaln_reference(x, norm: nn.Module, scale, shift):
    _plain_layer_norm(norm)
    return _adaln_reference(norm(x), scale, shift)


def _ln_adaln_fused(x, norm: nn.Module, scale, shift):
    _plain_layer_norm(norm)
    return _kernels().ln_adaln(x, norm.eps, scale, shift)


LN_ADALN = register(Op("ln_adaln", _ln_adaln_eager, _ln_adaln_reference, _ln_adaln_fused))


# -- h' = a / r + h; (h', LN(h') * (1 + scale) + shift) -------------------------------------
def _res_ln_adaln_eager(a, r: float, h, norm: nn.Module, scale, shift):
    h = a / r + h
    return h, _ln_adaln_eager(h, norm, scale, shift)


def _res_ln_adaln_reference(a, r: float, h, norm: nn.Module, scale, shift):
    if r != 1.0:  # x / 1.0 is x, bit for bit
        raise NotApplicable("rescale_output_factor != 1")
    h = a + h
    return h, _ln_adaln_reference(h, norm, scale, shift)


def _res_ln_adaln_fused(a, r: float, h, norm: nn.Module, scale, shift):
    if r != 1.0:
        raise NotApplicable("rescale_output_factor != 1")
    _plain_layer_norm(norm)
    return _kernels().ln_adaln(a, norm.eps, scale, shift, residual=h)


RES_LN_ADALN = register(Op("res_ln_adaln", _res_ln_adaln_eager, _res_ln_adaln_reference, _res_ln_adaln_fused))


# -- h' = h + g * y; (h', LN(h') * (1 + scale) + shift): a block's last residual and the next block's
# norm1 (SANA: the feed-forward's gated residual, then the next block's norm1 + adaLN) ------------
def _gres_ln_adaln_eager(y, g, h, norm: nn.Module, scale, shift):
    h = h + g * y
    return h, _ln_adaln_eager(h, norm, scale, shift)


def _gres_ln_adaln_reference(y, g, h, norm: nn.Module, scale, shift):
    h = _gres_reference(h, g, y)
    return h, _ln_adaln_reference(h, norm, scale, shift)


def _gres_ln_adaln_fused(y, g, h, norm: nn.Module, scale, shift):
    _plain_layer_norm(norm)
    return _kernels().ln_adaln(y, norm.eps, scale, shift, residual=h, gate=g)


GRES_LN_ADALN = register(Op("gated_res_ln_adaln", _gres_ln_adaln_eager, _gres_ln_adaln_reference,
                            _gres_ln_adaln_fused))

OP_NAMES = (LN_ADALN.name, RES_LN_ADALN.name, GRES_LN_ADALN.name)


def ln_adaln(call: Callable, x: torch.Tensor, norm: nn.Module, scale, shift) -> torch.Tensor:
    """adaLN(norm(x)) through the verifier; its fallback is aten's LayerNorm, then the elementwise
    adaLN chain (which the verifier checks on its own)."""
    return call(LN_ADALN, x, norm, scale, shift,
                fallback=lambda x, norm, scale, shift: call(ADALN, norm(x), scale, shift))


def res_ln_adaln(call: Callable, residual_op: Op, a, r: float, h, norm: nn.Module, scale, shift):
    """(a / r + h, adaLN(norm(a / r + h))) through the verifier; its fallback is the residual's own
    chain, then `ln_adaln`."""
    def fallback(a, r, h, norm, scale, shift):
        h = call(residual_op, a, r, h)
        return h, ln_adaln(call, h, norm, scale, shift)

    return call(RES_LN_ADALN, a, r, h, norm, scale, shift, fallback=fallback)


def gated_res_ln_adaln(call: Callable, y, g, h, norm: nn.Module, scale, shift):
    """(h + g * y, adaLN(norm(h + g * y))) through the verifier; its fallback is the gated
    residual's own chain, then `ln_adaln`."""
    def fallback(y, g, h, norm, scale, shift):
        h = call(GATED_RESIDUAL, h, g, y)
        return h, ln_adaln(call, h, norm, scale, shift)

    return call(GRES_LN_ADALN, y, g, h, norm, scale, shift, fallback=fallback)


# == Wan: FP32LayerNorm on x.float(), its modulation in fp32, one rounding (`.type_as(x)`) ==========
def _fp32_layer_norm(norm: nn.Module, affine: bool) -> None:
    _plain_layer_norm_shape(norm)
    if type(norm).__name__ != "FP32LayerNorm":
        raise NotApplicable("not diffusers' FP32LayerNorm")
    if affine != (norm.weight is not None) or (norm.weight is None) != (norm.bias is None):
        raise NotApplicable("the norm's affine parameters are not what the plan expects")


def _plain_layer_norm_shape(norm: nn.Module) -> None:
    if not isinstance(norm, nn.LayerNorm) or len(norm.normalized_shape) != 1:
        raise NotApplicable("not a LayerNorm over the last axis")


def _ln_adaln_f32_eager(x, norm: nn.Module, scale, shift):
    return (norm(x.float()) * (1 + scale) + shift).type_as(x)


def _ln_adaln_f32_reference(x, norm: nn.Module, scale, shift):
    _fp32_layer_norm(norm, affine=False)
    return (norm(x.float()) * (1 + scale) + shift).to(x.dtype)  # aten's CPU LayerNorm, then the fp32 plan


def _ln_adaln_f32_fused(x, norm: nn.Module, scale, shift):
    _fp32_layer_norm(norm, affine=False)
    return _kernels().ln_adaln(x, norm.eps, scale, shift, f32=True)


LN_ADALN_F32 = register(Op("ln_adaln_f32", _ln_adaln_f32_eager, _ln_adaln_f32_reference, _ln_adaln_f32_fused))


# -- h' = h + a (bf16); (h', adaLN_f32(LN(h'))): Wan's cross-attention residual and norm3 ---------------
def _res_ln_adaln_f32_eager(a, h, norm: nn.Module, scale, shift):
    h = h + a
    return h, _ln_adaln_f32_eager(h, norm, scale, shift)


def _res_ln_adaln_f32_reference(a, h, norm: nn.Module, scale, shift):
    h = h + a
    return h, _ln_adaln_f32_reference(h, norm, scale, shift)


def _res_ln_adaln_f32_fused(a, h, norm: nn.Module, scale, shift):
    _fp32_layer_norm(norm, affine=False)
    return _kernels().ln_adaln(a, norm.eps, scale, shift, residual=h, f32=True)


RES_LN_ADALN_F32 = register(Op("res_ln_adaln_f32", _res_ln_adaln_f32_eager, _res_ln_adaln_f32_reference,
                               _res_ln_adaln_f32_fused))


# -- FP32LayerNorm with its own weight and bias (Wan's norm2, cross_attn_norm): norm(x.float()).type_as(x) ----
def _ln_affine_f32_eager(x, norm: nn.Module):
    return norm(x.float()).type_as(x)


def _ln_affine_f32_reference(x, norm: nn.Module):
    _fp32_layer_norm(norm, affine=True)
    return norm(x.float()).to(x.dtype)


def _ln_affine_f32_fused(x, norm: nn.Module):
    _fp32_layer_norm(norm, affine=True)
    return _kernels().ln_adaln(x, norm.eps, None, None, f32=True, weight=norm.weight, bias=norm.bias)


LN_AFFINE_F32 = register(Op("ln_affine_f32", _ln_affine_f32_eager, _ln_affine_f32_reference, _ln_affine_f32_fused))

WAN_OP_NAMES = (LN_ADALN_F32.name, RES_LN_ADALN_F32.name, LN_AFFINE_F32.name)

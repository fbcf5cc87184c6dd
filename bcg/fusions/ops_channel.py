"""Per-channel chains of image tensors: what SANA's DC-AE decoder runs between its convolutions.

    channel_rms          ResBlock's `norm(h.movedim(1, -1)).movedim(-1, 1) + x` (diffusers' RMSNorm over
                         the channels, with weight and bias; or the decoder's head, `relu(norm(...))`),
                         given its variance: a chain of
                         ops_rms.RMS_VARIANCE on the movedim view (aten's row order where the image is
                         channels-last; aten's mean of our squares, same strides, where it is NCHW)
    up_shortcut          DCUpBlock2d's `conv(up) + pixel_shuffle(x.repeat_interleave(R, dim=1), 2)`: the
                         conv without its bias (cuDNN's bias add is a separate kernel in eager), then one
                         kernel for the bias, the shortcut's gather and the add
    up_nearest           DCUpBlock2d's `F.interpolate(x, scale_factor=2, mode="nearest")`: a copy kernel
                         (aten's NHWC upsample ran at a tenth of the H200's bandwidth)

ResBlock's `silu(conv1(x))` is ops.CONV_BIAS_SILU, whose kernel takes either layout.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .applicable import NotApplicable
from .ops import Op, _conv_nobias, _r, register


def _kc():
    from . import kernels_channel

    return kernels_channel


def _norm_applicable(h: torch.Tensor, norm: nn.Module, eps: float) -> None:
    weight, bias = getattr(norm, "weight", None), getattr(norm, "bias", None)
    if type(norm).__name__ != "RMSNorm" or isinstance(norm, nn.RMSNorm) or weight is None or bias is None:
        raise NotApplicable("not a diffusers RMSNorm with a weight and a bias")
    if weight.dtype != h.dtype or bias.dtype != h.dtype or norm.eps != eps:
        # a mixed norm promotes (an fp32 weight on bf16 h keeps fp32): another rounding plan. All fp32 is
        # this plan with every rounding the identity.
        raise NotApplicable("the norm's weight and bias must have h's dtype (and eps the norm's)")


# -- ResBlock: norm over the channels (+ the residual); the decoder's head: norm, then ReLU -------
def _crms_eager(h, var, norm, eps, res, relu=False):
    y = norm(h.movedim(1, -1)).movedim(-1, 1)
    y = y if res is None else y + res
    return F.relu(y) if relu else y


def _crms_reference(h, var, norm, eps, res, relu=False):
    _norm_applicable(h, norm, eps)
    dt = h.dtype
    n = _r(h.movedim(1, -1).float() * torch.rsqrt(var + eps), dt)
    n = _r(_r(n * norm.weight.float(), dt) + norm.bias.float(), dt).movedim(-1, 1)
    n = n if res is None else _r(n + res.float(), dt)
    return (F.relu(n) if relu else n).to(dt)


def _crms_fused(h, var, norm, eps, res, relu=False):
    _norm_applicable(h, norm, eps)
    return _kc().channel_rms(h, var, norm.weight, norm.bias, eps, res, relu)


CHANNEL_RMS = register(Op("channel_rms", _crms_eager, _crms_reference, _crms_fused))


# -- DCUpBlock2d: conv + bias, + the repeat/pixel-shuffle shortcut --------------------------------
def _shortcut(x: torch.Tensor, repeats: int) -> torch.Tensor:
    return F.pixel_shuffle(x.repeat_interleave(repeats, dim=1, output_size=x.shape[1] * repeats), 2)


def _up_eager(up, x, conv, repeats):
    return conv(up) + _shortcut(x, repeats)


def _up_applicable(conv: nn.Conv2d) -> None:
    if conv.bias is None:
        raise NotApplicable("the up-block conv has no bias")


def _up_reference(up, x, conv, repeats):
    _up_applicable(conv)
    c = _conv_nobias(up, conv)
    dt = c.dtype
    c = _r(c.float() + conv.bias.float().view(1, -1, 1, 1), dt)
    return (c + _shortcut(x, repeats).float()).to(dt)


def _up_fused(up, x, conv, repeats):
    _up_applicable(conv)
    return _kc().up_shortcut_add_(_conv_nobias(up, conv), conv.bias, x, repeats)


UP_SHORTCUT = register(Op("up_shortcut", _up_eager, _up_reference, _up_fused))


# -- DCUpBlock2d: the nearest x2 up-sampling before its conv -------------------------------------
def _nearest_eager(x):
    return F.interpolate(x, scale_factor=2, mode="nearest")


def _nearest_reference(x):
    # output (Y, X) = input (Y // 2, X // 2): aten's nearest index floor(dst * 0.5) at scale factor 2
    fmt = torch.channels_last if x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous() \
        else torch.contiguous_format
    return x.repeat_interleave(2, dim=2).repeat_interleave(2, dim=3).contiguous(memory_format=fmt)


def _nearest_fused(x):
    return _kc().nearest2x(x)


UP_NEAREST = register(Op("up_nearest", _nearest_eager, _nearest_reference, _nearest_fused))

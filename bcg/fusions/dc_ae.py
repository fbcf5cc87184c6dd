"""SANA's DC-AE (diffusers' `AutoencoderDC`): its decoder's ResBlocks and up-sampling blocks, fused.

The decode is not a graph's work (it runs eager, a batch at a time, beside the denoiser), but its
elementwise chains dominate it: at 1024², batch 8, on the H200, eager's RMSNorm over the channels
took 18.1 ms a ResBlock against 10.1 ms for the block's two convs, and the decoder ran 41% of its GPU
time in aten's elementwise kernels and 20% in copies (benchmarks/results/vae_decode_h200_s34.md).

    ResBlock          x + norm(conv2(silu(conv1(x))))   conv1 + bias + SiLU: ops.CONV_BIAS_SILU;
                                                        norm + residual: ops_channel.CHANNEL_RMS, its
                                                        variance a chain of ops_rms.RMS_VARIANCE
    DCUpBlock2d       conv(interpolate(x)) + shortcut(x)  the nearest x2 interpolation: UP_NEAREST;
                                                        conv + bias + shortcut: ops_channel.UP_SHORTCUT
    Decoder           its head relu(norm_out(h))           CHANNEL_RMS (with the ReLU); the blocks before
                                                        it as installed above
    EfficientViTBlock conv_out(attn(x)): its GLUMBConv  x + norm(conv_point(glu(conv_depth(silu(
                                                        conv_inverted(x)))))): CONV_BIAS_SILU,
                                                        ops.CONV_BIAS_GLU, CHANNEL_RMS; the attention
                                                        as the module runs it

The convs stay aten's (cuDNN's). Each chain is verified against eager on first
sight (verify.py) and each rewritten forward against the block's own (guard.py).
"""

from __future__ import annotations

from typing import Callable, Protocol, cast

import torch
import torch.nn.functional as F
from torch import nn

from .guard import guarded
from .ops import CONV_BIAS_GLU, CONV_BIAS_SILU
from .ops_channel import CHANNEL_RMS, UP_NEAREST, UP_SHORTCUT
from .ops_rms import RMS_VARIANCE
from .verify import Verifier, chain

_MODULE = "diffusers.models.autoencoders.autoencoder_dc"


class _ResBlock(Protocol):  # what check_resblock pins (nn.Module types children as Tensor | Module)
    conv1: nn.Conv2d
    conv2: nn.Conv2d
    norm: nn.Module


class _GLUMBConv(Protocol):  # what check_efficientvit pins of the block's conv_out
    conv_inverted: nn.Conv2d
    conv_depth: nn.Conv2d
    conv_point: nn.Conv2d
    norm: nn.Module


class _EfficientViT(Protocol):
    attn: nn.Module
    conv_out: _GLUMBConv


class _Decoder(Protocol):  # what check_decoder pins
    conv_in: nn.Conv2d
    in_shortcut: bool
    in_shortcut_repeats: int
    up_blocks: nn.ModuleList
    norm_out: nn.Module
    conv_out: nn.Conv2d


class _UpBlock(Protocol):  # what check_up_block pins
    conv: nn.Conv2d
    repeats: int
    factor: int
    interpolation_mode: str


def qualified(name: str) -> str:
    """A rule's target: DC-AE's class of that name (other libraries have a `ResBlock` and a `Decoder`)."""
    return f"{_MODULE}.{name}"


def _dc_ae(m: nn.Module) -> str | None:
    if type(m).__module__ != _MODULE:  # the rules target qualified names; a direct call may pass anything
        return f"{type(m).__module__}.{type(m).__name__} is not DC-AE's"
    if m.training:
        return "DC-AE block in training mode"
    return None


def check_resblock(m: nn.Module) -> str | None:
    why = _dc_ae(m)
    if why is not None:
        return why
    norm = getattr(m, "norm", None)
    if getattr(m, "norm_type", None) != "rms_norm" or type(norm).__name__ != "RMSNorm":
        return "DC-AE ResBlock without its RMSNorm over channels"
    if getattr(norm, "weight", None) is None or getattr(norm, "bias", None) is None:
        return "DC-AE ResBlock whose RMSNorm has no weight or no bias"
    if not isinstance(getattr(m, "nonlinearity", None), nn.SiLU) or getattr(m.conv1, "bias", None) is None:
        return "DC-AE ResBlock without conv1's bias + SiLU"
    return None


def resblock_forward(block: nn.Module, fx: Verifier) -> Callable:
    call = fx.call
    variance = chain(call, RMS_VARIANCE)
    b = cast(_ResBlock, block)
    conv1, conv2, norm = b.conv1, b.conv2, b.norm
    eps = float(norm.eps)  # type: ignore[arg-type]  # diffusers' RMSNorm: a float

    def forward(hidden_states: torch.Tensor) -> torch.Tensor:
        h = conv2(call(CONV_BIAS_SILU, hidden_states, conv1))
        return call(CHANNEL_RMS, h, variance(h.movedim(1, -1)), norm, eps, hidden_states)

    return guarded("dc_ae_resblock", block, forward, fx)


def check_up_block(m: nn.Module) -> str | None:
    why = _dc_ae(m)
    if why is not None:
        return why
    if not (getattr(m, "interpolate", False) and getattr(m, "shortcut", False)) or getattr(m, "factor", 0) != 2:
        return "DC-AE up block without interpolation and shortcut at factor 2"
    if getattr(m.conv, "bias", None) is None:
        return "DC-AE up block whose conv has no bias"
    return None


def up_block_forward(block: nn.Module, fx: Verifier) -> Callable:
    call = fx.call
    b = cast(_UpBlock, block)
    conv, repeats, factor, mode = b.conv, b.repeats, b.factor, b.interpolation_mode

    def forward(hidden_states: torch.Tensor) -> torch.Tensor:
        if mode == "nearest":  # check_up_block pins factor 2
            up = call(UP_NEAREST, hidden_states)
        else:
            up = F.interpolate(hidden_states, scale_factor=factor, mode=mode)
        return call(UP_SHORTCUT, up, hidden_states, conv, repeats)

    return guarded("dc_ae_up_block", block, forward, fx)


def check_efficientvit(m: nn.Module) -> str | None:
    # The block, not its GLUMBConv, is the pattern: the transformer's GLUMBConvs (no norm, no residual)
    # are the same class and belong to sana_block.
    why = _dc_ae(m)
    if why is not None:
        return why
    ff = m.get_submodule("conv_out") if hasattr(m, "conv_out") else None
    if ff is None or type(ff).__name__ != "GLUMBConv" or getattr(ff, "norm_type", None) != "rms_norm" \
            or not getattr(ff, "residual_connection", False) or type(getattr(ff, "norm", None)).__name__ != "RMSNorm":
        return "DC-AE EfficientViT block without its GLUMBConv's RMSNorm and residual"
    convs = cast(_GLUMBConv, ff)
    if not isinstance(ff.nonlinearity, nn.SiLU) or convs.conv_inverted.bias is None or convs.conv_depth.bias is None:
        return "DC-AE EfficientViT block whose GLUMBConv has no conv biases or no SiLU"
    return None


def efficientvit_forward(block: nn.Module, fx: Verifier) -> Callable:
    call = fx.call
    variance = chain(call, RMS_VARIANCE)
    b = cast(_EfficientViT, block)
    attn, ff = b.attn, b.conv_out
    eps = float(ff.norm.eps)  # type: ignore[arg-type]  # diffusers' RMSNorm: a float

    def forward(x: torch.Tensor) -> torch.Tensor:
        x = attn(x)
        h = call(CONV_BIAS_GLU, call(CONV_BIAS_SILU, x, ff.conv_inverted), ff.conv_depth)
        h = ff.conv_point(h)
        return call(CHANNEL_RMS, h, variance(h.movedim(1, -1)), ff.norm, eps, x)

    return guarded("dc_ae_efficientvit", block, forward, fx)


def check_decoder(m: nn.Module) -> str | None:
    why = _dc_ae(m)
    if why is not None:
        return why
    if type(getattr(m, "norm_out", None)).__name__ != "RMSNorm" \
            or not isinstance(getattr(m, "conv_act", None), nn.ReLU):
        return "DC-AE decoder whose head is not RMSNorm + ReLU"
    if not isinstance(getattr(m, "conv_out", None), nn.Conv2d):
        return "DC-AE decoder whose output is an up block (layers_per_block[0] = 0)"
    return None


def decoder_forward(decoder: nn.Module, fx: Verifier) -> Callable:
    """Decoder.forward (diffusers 0.42) with its head's RMSNorm + ReLU fused; its up blocks' own forwards
    are the other rules' where they apply."""
    call = fx.call
    variance = chain(call, RMS_VARIANCE)
    d = cast(_Decoder, decoder)
    eps = float(d.norm_out.eps)  # type: ignore[arg-type]  # diffusers' RMSNorm: a float

    def forward(hidden_states: torch.Tensor) -> torch.Tensor:
        if d.in_shortcut:
            repeats = d.in_shortcut_repeats
            x = hidden_states.repeat_interleave(repeats, dim=1, output_size=hidden_states.shape[1] * repeats)
            hidden_states = d.conv_in(hidden_states) + x
        else:
            hidden_states = d.conv_in(hidden_states)
        for up_block in reversed(d.up_blocks):
            hidden_states = up_block(hidden_states)
        h = call(CHANNEL_RMS, hidden_states, variance(hidden_states.movedim(1, -1)), d.norm_out, eps, None, True)
        return d.conv_out(h)

    return guarded("dc_ae_decoder", decoder, forward, fx)

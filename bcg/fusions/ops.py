"""Fused elementwise chains: for each, the model's own ops (`eager`), the rounding plan in plain
torch (`reference`) and the Triton launcher (`fused`, GPU only).

A chain's `eager` is the code the diffusers module runs, op for op. Its `reference` computes each
op in fp32 and rounds to the storage dtype exactly where eager stores a tensor: CPU tests prove
reference == eager bit for bit, and kernels.py implements the same plan. Where a fused chain
changes which aten op runs around it (a conv called without its bias, a linear split into matmul
+ bias), it calls the very aten op that eager reaches inside (`F.conv2d` then cuDNN's separate
bias add; `at::linear` on a strided 3-D input is `matmul` then `add_(bias)`), and the verifier
checks the whole chain, ops around it included, against eager on first sight.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from .applicable import NotApplicable, check

_EPS = 1e-15  # SanaLinearAttnProcessor2_0's normaliser epsilon


@dataclass(frozen=True)
class Op:
    name: str
    eager: Callable
    reference: Callable
    fused: Callable
    """Looked up in kernels.py on first use: Triton is imported only on the GPU path."""


OPS: dict[str, Op] = {}


def register(op: Op) -> Op:
    if op.name in OPS:
        raise ValueError(f"fusion op {op.name!r} is already registered (known: {sorted(OPS)})")
    OPS[op.name] = op
    return op


def _r(t: torch.Tensor, dt: torch.dtype) -> torch.Tensor:
    """Round fp32 to the storage dtype and back: where eager stores a tensor."""
    return t.to(dt).float()


def _kernels():
    from . import kernels

    return kernels


# -- adaLN modulation ---------------------------------------------------------------------
def _adaln_eager(x, scale, shift):
    return x * (1 + scale) + shift


def _adaln_reference(x, scale, shift):
    dt = x.dtype
    y = _r(x.float() * _r(scale.float() + 1, dt), dt)
    return (y + shift.float()).to(dt)


ADALN = register(Op("adaln", _adaln_eager, _adaln_reference,
                    lambda x, s, t: _kernels().adaln(x, s, t)))


# -- gated residual -----------------------------------------------------------------------
def _gres_eager(h, g, y):
    return h + g * y


def _gres_reference(h, g, y):
    dt = h.dtype
    return (h.float() + _r(g.float() * y.float(), dt)).to(dt)


GATED_RESIDUAL = register(Op("gated_residual", _gres_eager, _gres_reference,
                             lambda h, g, y: _kernels().gated_residual(h, g, y)))


# -- gated residual around a linear whose input is strided (attention output projection) ----
def _grl_eager(h, g, x, linear: nn.Linear):
    return h + g * linear(x)


def _grl_reference(h, g, x, linear: nn.Linear):
    dt = h.dtype
    y = torch.matmul(x, linear.weight.t())
    if linear.bias is not None:
        y = _r(y.float() + linear.bias.float(), dt)
    return (h.float() + _r(g.float() * y.float(), dt)).to(dt)


def _grl_fused(h, g, x, linear: nn.Linear):
    check(x.dim() == 3 and not x.is_contiguous(), "the fused plan is at::linear's strided-input path")
    return _kernels().gated_residual(h, g, torch.matmul(x, linear.weight.t()), linear.bias)


GATED_RESIDUAL_LINEAR = register(Op("gated_residual_linear", _grl_eager, _grl_reference, _grl_fused))


# -- SANA linear attention (between the q/k/v projections and to_out) ---------------------
def _lin_eager(query, key, value, heads: int):
    # SanaLinearAttnProcessor2_0, op for op
    original_dtype = query.dtype
    query = query.transpose(1, 2).unflatten(1, (heads, -1))
    key = key.transpose(1, 2).unflatten(1, (heads, -1)).transpose(2, 3)
    value = value.transpose(1, 2).unflatten(1, (heads, -1))
    query = F.relu(query)
    key = F.relu(key)
    query, key, value = query.float(), key.float(), value.float()
    value = F.pad(value, (0, 0, 0, 1), mode="constant", value=1.0)
    scores = torch.matmul(value, key)
    hidden_states = torch.matmul(scores, query)
    hidden_states = hidden_states[:, :, :-1] / (hidden_states[:, :, -1:] + _EPS)
    hidden_states = hidden_states.flatten(1, 2).transpose(1, 2)
    return hidden_states.to(original_dtype)


def _lin_reference(query, key, value, heads: int):
    # relu + fp32 written straight into the contiguous layouts matmul's reshape copies to
    B, N, D = query.shape
    C = D // heads
    q32 = F.relu(query).float().view(B, N, heads, C).permute(0, 2, 3, 1).contiguous()
    k32 = F.relu(key).float().view(B, N, heads, C).permute(0, 2, 1, 3).contiguous()
    v32 = torch.ones((B, heads, C + 1, N), dtype=torch.float32, device=query.device)
    v32[:, :, :C] = value.float().view(B, N, heads, C).permute(0, 2, 3, 1)
    hs = torch.matmul(torch.matmul(v32, k32), q32)
    out = torch.empty((B, D, N), dtype=query.dtype, device=query.device)
    out.copy_((hs[:, :, :C] / (hs[:, :, C:] + _EPS)).reshape(B, D, N))
    return out.transpose(1, 2)


def _lin_fused(query, key, value, heads: int):
    k = _kernels()
    check(query.shape[0] > 1, "batch 1: eager's matmul sees a strided query (no reshape copy)")
    q32, k32, v32 = k.linear_attention_prep(query, key, value, heads)
    hs = torch.matmul(torch.matmul(v32, k32), q32)
    return k.linear_attention_div(hs, query.dtype, _EPS)


LINEAR_ATTENTION = register(Op("linear_attention", _lin_eager, _lin_reference, _lin_fused))


def _lin_fma_fused(query, key, value, heads: int):
    from . import kernels_linear

    return kernels_linear.linear_attention_fma(query, key, value, heads, _EPS)


# The whole attention in two kernels, its products FMA chains in k order: equal to eager only where
# cuBLAS's fp32 kernel sums in that order, so it runs first in a chain whose fallback is the op above.
LINEAR_ATTENTION_FMA = register(Op("linear_attention_fma", _lin_eager, _lin_reference, _lin_fma_fused))


# -- GLUMBConv ----------------------------------------------------------------------------
def _conv_nobias(x, conv: nn.Conv2d):
    return F.conv2d(x, conv.weight, None, conv.stride, conv.padding, conv.dilation, conv.groups)


def _cbs_eager(x, conv: nn.Conv2d):
    return F.silu(conv(x))


def _cbs_reference(x, conv: nn.Conv2d):
    assert conv.bias is not None  # the rule's check (sana.check_block) takes convs with a bias only
    y = _conv_nobias(x, conv)
    dt = y.dtype
    y = _r(y.float() + conv.bias.float().view(1, -1, 1, 1), dt)
    return F.silu(y).to(dt)


def _cbs_fused(x, conv: nn.Conv2d):
    return _kernels().bias_silu_(_conv_nobias(x, conv), conv.bias)


CONV_BIAS_SILU = register(Op("conv_bias_silu", _cbs_eager, _cbs_reference, _cbs_fused))


def _glu_eager(d):
    hidden_states, gate = torch.chunk(d, 2, dim=1)
    return hidden_states * F.silu(gate)


def _glu_reference(d, bias=None):
    dt = d.dtype
    d32 = d.float()
    if bias is not None:
        d32 = _r(d32 + bias.float().view(1, -1, 1, 1), dt)
    x, g = torch.chunk(d32, 2, dim=1)
    return (x * _r(F.silu(g), dt)).to(dt)


GLU = register(Op("glu", _glu_eager, _glu_reference, lambda d: _kernels().bias_glu(d, None)))


def _cbg_eager(x, conv: nn.Conv2d):
    return _glu_eager(conv(x))


def _cbg_reference(x, conv: nn.Conv2d):
    return _glu_reference(_conv_nobias(x, conv), conv.bias)


def _cbg_fused(x, conv: nn.Conv2d):
    return _kernels().bias_glu(_conv_nobias(x, conv), conv.bias)


CONV_BIAS_GLU = register(Op("conv_bias_glu", _cbg_eager, _cbg_reference, _cbg_fused))


# -- depthwise 3x3 conv + bias + GLU in one pass (cuDNN's tap order guessed; verified) -------
def _dw_reference(x, conv: nn.Conv2d, col_major: bool):
    _dw_applicable(conv)
    dt = x.dtype
    B, C2, H, W = x.shape
    xp = F.pad(x.float(), (1, 1, 1, 1))
    w = conv.weight.float()[:, 0]  # [C2, 3, 3]
    acc = torch.zeros((B, C2, H, W), dtype=torch.float32, device=x.device)
    taps = [(t % 3, t // 3) if col_major else (t // 3, t % 3) for t in range(9)]
    for ky, kx in taps:  # one rounding per add: bf16 products are exact in fp32
        acc = acc + xp[:, :, ky:ky + H, kx:kx + W] * w[:, ky, kx].view(1, -1, 1, 1)
    return _glu_reference(acc.to(dt).contiguous(memory_format=torch.channels_last), conv.bias)


def _dw_applicable(conv: nn.Conv2d) -> None:
    if not (conv.kernel_size == (3, 3) and conv.stride == (1, 1) and conv.padding == (1, 1)
            and conv.dilation == (1, 1) and conv.groups == conv.in_channels == conv.out_channels):
        raise NotApplicable("not a 3x3, stride 1, padding 1, depthwise conv")


def _dw_fused(col_major: bool):
    def fused(x, conv: nn.Conv2d):
        _dw_applicable(conv)
        if not col_major:  # row-major taps: the kernel that walks rows (each input row loaded once)
            return _kernels().dwconv_glu_rows(x, conv.weight, conv.bias)
        return _kernels().dwconv_glu(x, conv.weight, conv.bias, col_major)

    return fused


DWCONV_GLU_ROWS = register(Op("dwconv_glu_rows", _cbg_eager, lambda x, c: _dw_reference(x, c, False),
                              _dw_fused(False)))
DWCONV_GLU_COLS = register(Op("dwconv_glu_cols", _cbg_eager, lambda x, c: _dw_reference(x, c, True),
                              _dw_fused(True)))


# -- GLUMBConv from its input: 1x1 conv (cuDNN, no bias), then bias + SiLU + depthwise 3x3 + bias +
#    GLU in one pass (the activation between the two convs never reaches memory) -----------------
def _sdg_eager(x, conv_inv: nn.Conv2d, conv_dw: nn.Conv2d):
    return _glu_eager(conv_dw(F.silu(conv_inv(x))))


def silu_dw_glu_plan(y, b_inv, w_dw, b_dw, silu: Callable = F.silu):
    """The kernel's rounding plan on the raw 1x1 conv output y (channels-last): bias add rounded,
    SiLU rounded (zero padding applies to this activation), the 9 taps row-major in fp32, rounded,
    then `_glu_reference`'s bias + GLU. `silu` is a parameter so that a test can pin the exp."""
    dt = y.dtype
    a = silu(_r(y.float() + b_inv.float().view(1, -1, 1, 1), dt)).to(dt)
    B, C2, H, W = a.shape
    ap = F.pad(a.float(), (1, 1, 1, 1))
    w = w_dw.float()[:, 0]
    acc = torch.zeros((B, C2, H, W), dtype=torch.float32, device=y.device)
    for ky in range(3):
        for kx in range(3):  # one rounding per add: half-precision products are exact in fp32
            acc = acc + ap[:, :, ky:ky + H, kx:kx + W] * w[:, ky, kx].view(1, -1, 1, 1)
    d = _r(acc.to(dt).float() + b_dw.float().view(1, -1, 1, 1), dt)
    v, g = torch.chunk(d, 2, dim=1)
    return (v * _r(silu(g), dt)).to(dt).contiguous(memory_format=torch.channels_last)


def _sdg_applicable(x, conv_inv: nn.Conv2d, conv_dw: nn.Conv2d) -> None:
    _dw_applicable(conv_dw)
    if conv_inv.kernel_size != (1, 1) or conv_inv.groups != 1 or conv_inv.bias is None or conv_dw.bias is None:
        raise NotApplicable("conv_inverted is not a plain 1x1 conv with bias")
    if x.dtype not in (torch.bfloat16, torch.float16):
        raise NotApplicable("bf16 or fp16 only (fp32 tap products are not exact)")


def _sdg_reference(x, conv_inv: nn.Conv2d, conv_dw: nn.Conv2d):
    _sdg_applicable(x, conv_inv, conv_dw)
    return silu_dw_glu_plan(_conv_nobias(x, conv_inv), conv_inv.bias, conv_dw.weight, conv_dw.bias)


def _sdg_fused(x, conv_inv: nn.Conv2d, conv_dw: nn.Conv2d):
    _sdg_applicable(x, conv_inv, conv_dw)
    return _kernels().silu_dwconv_glu(_conv_nobias(x, conv_inv), conv_inv.bias, conv_dw.weight, conv_dw.bias)


SILU_DWCONV_GLU = register(Op("silu_dwconv_glu", _sdg_eager, _sdg_reference, _sdg_fused))


# -- every block's modulation at once: scale_shift_table[None] + timestep.reshape(B, 6, -1) ------
def _modulation_eager(tables, t, batch: int):
    """tables [L, 6, D] (the blocks' scale_shift_table, stacked) -> [L, B, 6, D]: each block's own
    add, as SanaTransformerBlock.forward writes it."""
    return torch.stack([tables[i][None] + t.reshape(batch, 6, -1) for i in range(tables.shape[0])])


def _modulation_stacked(tables, t, batch: int):
    # one broadcast add: the same fp32 add and rounding for every element, one launch instead of L
    return tables[:, None] + t.reshape(1, batch, 6, -1)


MODULATION = register(Op("modulation", _modulation_eager, _modulation_stacked, _modulation_stacked))


# -- cross-attention output: `/ rescale_output_factor` then the block's residual add ---------
def _rescale_residual_eager(a, r: float, h):
    return a / r + h


def _rescale_residual_plan(a, r: float, h):
    # x / 1.0 is x, bit for bit (aten divides by a host scalar as a multiply by 1 / 1.0)
    if r != 1.0:
        raise NotApplicable("rescale_output_factor != 1")
    return a + h


RESCALE_RESIDUAL = register(Op("rescale_residual", _rescale_residual_eager, _rescale_residual_plan,
                               _rescale_residual_plan))


# -- Wan's gated residuals: (h.float() + y.float() * gate).type_as(h), the gate fp32 ------------------
def _gres_f32_eager(h, g, y):
    return (h.float() + y.float() * g).type_as(h)


def _gres_f32_reference(h, g, y):
    return (h.float() + y.float() * g.float()).to(h.dtype)


GATED_RESIDUAL_F32 = register(Op("gated_residual_f32", _gres_f32_eager, _gres_f32_reference,
                                 lambda h, g, y: _kernels().gated_residual(h, g, y, f32=True)))


# -- Wan's modulation, every block at once: scale_shift_table + temb.float() ---------------------------
def _modulation_f32_eager(tables, t):
    """tables [L, 1, 6, D] (the blocks' scale_shift_table, stacked) -> [L, B, 6, D]: each block's own
    add, as WanTransformerBlock.forward writes it."""
    return torch.stack([tables[i] + t.float() for i in range(tables.shape[0])])


def _modulation_f32_stacked(tables, t):
    # t.float() once and one broadcast add: the same fp32 add for every element, 2 launches instead of 2L
    return tables + t.float()[None]


MODULATION_F32 = register(Op("modulation_f32", _modulation_f32_eager, _modulation_f32_stacked,
                             _modulation_f32_stacked))


# -- SANA-Video's and LTX-2's modulation, every block at once: table[None, None] + t.reshape(B, T, n, -1) --
def _modulation_video_eager(tables, t, batch: int):
    """tables [L, n, D] -> [L, B, T, n, D]: each block's own add, as SanaVideoTransformerBlock writes it
    (n = 6) and LTX2VideoTransformerBlock.get_mod_params (n = its table's rows)."""
    n = tables.shape[1]
    return torch.stack([tables[i][None, None] + t.reshape(batch, t.shape[1], n, -1) for i in range(tables.shape[0])])


def _modulation_video_stacked(tables, t, batch: int):
    return tables[:, None, None] + t.reshape(1, batch, t.shape[1], tables.shape[1], -1)


MODULATION_VIDEO = register(Op("modulation_video", _modulation_video_eager, _modulation_video_stacked,
                               _modulation_video_stacked))

"""Per-channel chains of image tensors [B, C, H, W] (Triton; GPU or Triton's CPU interpreter): what
SANA's DC-AE decoder runs between its convolutions.

Both kernels walk a dense image in memory order, channels-last or contiguous (NCHW), so every load
and store is coalesced whichever layout the decoder's convs left (kernels.image_layout). Same
rounding plan as kernels.py: fp32 arithmetic, `_r` wherever eager stores a tensor, no FMA
contraction (`OPTS`).

    channel_rms      diffusers' RMSNorm over the channels (ResBlock's `norm(h.movedim(1, -1))
                     .movedim(-1, 1)`, with its weight and bias) given the variance, then the block's
                     residual add: r(r(r(r(h * rstd) * w) + b) + x), rstd = rsqrt(var + eps); or, for
                     the decoder's head, ReLU instead of the residual
    up_shortcut_add_ DCUpBlock2d's tail, in place on its conv's output c (run without bias):
                     r(r(c + bias) + y), y = pixel_shuffle(h.repeat_interleave(R, dim=1), 2) read
                     straight from h (a copy in eager: no rounding)
    nearest2x        DCUpBlock2d's `F.interpolate(x, scale_factor=2, mode="nearest")`: a copy, each
                     output pixel (Y, X) the input's (Y // 2, X // 2), in x's layout. aten's NHWC kernel
                     ran at about 420 GB/s on the H200 (12.9 ms for the last up block at 1024², batch 8)
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from .applicable import check as _check
from .kernels import BLOCK, OPTS, _channel, _r, image_layout


@triton.jit
def _channel_rms_kernel(h_ptr, v_ptr, w_ptr, b_ptr, x_ptr, o_ptr, numel, C, HW, eps,
                        CL: tl.constexpr, HAS_RES: tl.constexpr, RELU: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offs < numel
    c = _channel(offs, C, HW, CL)
    if CL:
        pix = offs // C  # b * HW + p
    else:
        pix = (offs // (C * HW)) * HW + offs % HW
    h = tl.load(h_ptr + offs, mask=m).to(tl.float32)
    rstd = libdevice.rsqrt(tl.load(v_ptr + pix, mask=m) + eps)  # libdevice rsqrt == torch.rsqrt (H200)
    n = _r(h * rstd, o_ptr)  # bf16 * fp32 is an fp32 tensor; `.to(weight.dtype)` rounds it
    n = _r(n * tl.load(w_ptr + c, mask=m).to(tl.float32), o_ptr)
    n = _r(n + tl.load(b_ptr + c, mask=m).to(tl.float32), o_ptr)
    if HAS_RES:
        n = _r(n + tl.load(x_ptr + offs, mask=m).to(tl.float32), o_ptr)
    if RELU:  # aten's clamp_min(0) on a stored value: NaN stays NaN
        n = tl.where((n > 0.0) | (n != n), n, 0.0)
    tl.store(o_ptr + offs, n.to(o_ptr.dtype.element_ty), mask=m)


def channel_rms(h: torch.Tensor, var: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float,
                res: torch.Tensor | None = None, relu: bool = False) -> torch.Tensor:
    """RMSNorm over the channels of h [B, C, H, W] given var (eager's `mean(-1, keepdim=True)` of the
    `movedim(1, -1)` view: [B, H, W, 1]), * weight + bias, + res (same layout as h) when given, then
    ReLU when asked."""
    cl = image_layout(h)
    B, C, H, W = h.shape
    _check(var.shape == (B, H, W, 1) and var.dtype == torch.float32, "var must be the fp32 [B, H, W, 1] mean")
    _check(weight.shape == (C,) and bias.shape == (C,) and weight.dtype == bias.dtype == h.dtype,
           "weight and bias must be [C] of h's dtype")
    if res is not None:
        _check(res.shape == h.shape and res.stride() == h.stride() and res.dtype == h.dtype,
               "the residual must have h's shape, strides and dtype")
    v = var.reshape(B, H * W).contiguous()  # 1/C of h: the layout-free index b * HW + p
    out = torch.empty_like(h)  # h's layout: eager's ops on the movedim view keep it
    n = h.numel()
    _channel_rms_kernel[(triton.cdiv(n, BLOCK),)](h, v, weight, bias, res if res is not None else h, out, n, C,
                                                 H * W, eps, CL=cl, HAS_RES=res is not None, RELU=relu,
                                                 BLOCK=BLOCK, **OPTS)
    return out


@triton.jit
def _up_shortcut_kernel(c_ptr, b_ptr, h_ptr, numel, C, H2, W2, R, hs_b, hs_c, hs_h, hs_w,
                        CL: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offs < numel
    HW = H2 * W2
    ch = _channel(offs, C, HW, CL)
    if CL:
        pix = offs // C
    else:
        pix = (offs // (C * HW)) * HW + offs % HW
    b = pix // HW
    p = pix % HW
    Y = p // W2
    X = p % W2
    # pixel_shuffle(y0, 2)[b, ch, Y, X] = y0[b, 4 ch + 2 (Y % 2) + X % 2, Y // 2, X // 2]; y0[:, k] = h[:, k // R]
    src = (4 * ch + 2 * (Y % 2) + X % 2) // R
    y = tl.load(h_ptr + b * hs_b + src * hs_c + (Y // 2) * hs_h + (X // 2) * hs_w, mask=m).to(tl.float32)
    v = _r(tl.load(c_ptr + offs, mask=m).to(tl.float32) + tl.load(b_ptr + ch, mask=m).to(tl.float32), c_ptr)
    tl.store(c_ptr + offs, (v + y).to(c_ptr.dtype.element_ty), mask=m)


def up_shortcut_add_(c: torch.Tensor, bias: torch.Tensor, h: torch.Tensor, repeats: int) -> torch.Tensor:
    """In place on c [B, C, 2H, 2W], the up-block conv's output without its bias: c + bias[ch] (rounded,
    as cuDNN's separate bias add) + pixel_shuffle(h.repeat_interleave(repeats, dim=1), 2)."""
    cl = image_layout(c)
    B, C, H2, W2 = c.shape
    _check(h.dim() == 4 and h.shape[0] == B and h.shape[1] * repeats == 4 * C and 2 * h.shape[2] == H2
           and 2 * h.shape[3] == W2 and h.dtype == c.dtype, "h must be [B, 4 C / repeats, H, W] of c's dtype")
    _check(bias.shape == (C,) and bias.dtype == c.dtype, "bias must be [C] of c's dtype")
    n = c.numel()
    _up_shortcut_kernel[(triton.cdiv(n, BLOCK),)](c, bias, h, n, C, H2, W2, repeats, *h.stride(), CL=cl,
                                                 BLOCK=BLOCK, **OPTS)
    return c


@triton.jit
def _nearest2x_cl_kernel(x_ptr, o_ptr, NPIX, C, H, W, BP: tl.constexpr, BC: tl.constexpr):
    # channels-last: memory [B, 2H, 2W, C]; one tile of BP output pixels x BC channels
    pix = tl.program_id(0).to(tl.int64) * BP + tl.arange(0, BP)  # b * 4HW + Y * 2W + X
    c = tl.program_id(1) * BC + tl.arange(0, BC)
    W2 = 2 * W
    X = pix % W2
    Y = (pix // W2) % (2 * H)
    b = pix // (4 * H * W)
    src = (b * H + Y // 2) * W + X // 2
    m = (pix < NPIX)[:, None] & (c < C)[None, :]
    v = tl.load(x_ptr + src[:, None] * C + c[None, :], mask=m)
    tl.store(o_ptr + pix[:, None] * C + c[None, :], v, mask=m)


@triton.jit
def _nearest2x_nchw_kernel(x_ptr, o_ptr, H, W, BW: tl.constexpr):
    # contiguous: one output row (plane, Y) a program along axis 0, BW columns along axis 1
    row = tl.program_id(0).to(tl.int64)  # plane * 2H + Y
    X = tl.program_id(1) * BW + tl.arange(0, BW)
    plane = row // (2 * H)
    Y = row % (2 * H)
    m = X < 2 * W
    v = tl.load(x_ptr + (plane * H + Y // 2) * W + X // 2, mask=m)
    tl.store(o_ptr + row * (2 * W) + X, v, mask=m)


def nearest2x(x: torch.Tensor) -> torch.Tensor:
    """x [B, C, H, W] (channels-last or contiguous) -> [B, C, 2H, 2W] in x's layout: nearest x2."""
    cl = image_layout(x)
    B, C, H, W = x.shape
    fmt = torch.channels_last if cl else torch.contiguous_format
    out = torch.empty((B, C, 2 * H, 2 * W), dtype=x.dtype, device=x.device, memory_format=fmt)
    if out.numel() == 0:
        return out
    if cl:
        BC = min(128, triton.next_power_of_2(C))
        BP = max(1, 4096 // BC)
        npix = B * 4 * H * W
        _nearest2x_cl_kernel[(triton.cdiv(npix, BP), triton.cdiv(C, BC))](x, out, npix, C, H, W, BP=BP, BC=BC,
                                                                           **OPTS)
    else:
        BW = min(1024, triton.next_power_of_2(2 * W))
        _nearest2x_nchw_kernel[(B * C * 2 * H, triton.cdiv(2 * W, BW))](x, out, H, W, BW=BW, **OPTS)
    return out

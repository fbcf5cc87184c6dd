"""q/k rotary embeddings, after their RMSNorm, written where joint attention reads them (Triton).

One kernel for the RoPE of every family, parameterised by what eager runs before and around it
(and, for heads of 128 with adjacent pairs, `_head_rows_kernel`: the same arithmetic over several rows
a program, its pairs read and written as tiles, its reduction trees as sums over axes of two):

    norm     "none"   x is already normalised (aten's norm ran: the fallback)
             "mean"   diffusers' RMSNorm: the variance in aten's mean order (kernels_rms.mean_sq_rows,
                      in this kernel; or given, from row_variance), rsqrt, `_r(_r(x * r) * w)`
             "fused"  torch.nn.RMSNorm: aten's fused kernel's modelled order (kernels_rms.fused_rms_rstd),
                      `_r(w * (r * x))`; one row a program (its 128-thread layout is the order)
    rows     per head (the norm over the head dim: Z-Image, Qwen-Image, Flux, LongCat) or across
             heads (one norm over all heads of a token: Wan, SANA-Video, LTX-2); the RoPE pairs
             are always within a head
    style    "complex"  x viewed as complex64 pairs times complex64 freqs (Z-Image, Qwen-Image):
                        aten's c10::complex product as nvcc contracts it (`CMUL_MODES`; on the H200
                        `fma_ac_ad`: re = fma(a, c, -(b*d)), im = fma(a, d, b*c))
             "pairs"    interleaved real pairs (a, b) with fp32 cos/sin (Flux, LongCat, Wan, LTX-2's
                        interleaved RoPE):
                        even = a*cos[CE] - b*sin[SE], odd = b*cos[CO] + a*sin[SO], each product
                        and the sum rounded to fp32 (eager runs them as separate fp32 kernels),
                        the pair's element (0 even, 1 odd) that each output reads given by `index`:
                        Flux's `x*cos + rotate(x)*sin` reads (0, 0, 1, 1), Wan's (0, 1, 0, 1); cos / sin
                        in the storage dtype (Wan's rope buffers after a whole-model .to(bf16)) round
                        each product and the sum, as eager's bf16 ops do
             "split"    rotate-half pairs (j, j + D/2) of each head with fp32 cos / sin, one value a pair
                        (LTX-2's apply_split_rotary_emb; GLM-Image's and MiniMax-H3's rotate-half,
                        one call a half of its tables): the complex product's arithmetic (`CMUL_MODES`:
                        `x * cos` then aten's `addcmul_`, an FMA on CUDA and the CPU, is `fma_bd_ad`)
    freqs    one set for all heads, or a set a head ([.., S, H, W]: LTX-2's, whose frequencies span
             the whole width)
    out      a [B, S_out, H, D] tensor and a token offset: joint attention's concatenation of the
             text and image streams is written in place, one launch per stream (no torch.cat)

The output is rounded to the storage dtype once, as eager's `.to(x.dtype)` / `type_as` does.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from . import kernels_rms
from .applicable import check as _check
from .kernels import OPTS, _r
from .kernels_rms import _rstd, fused_rms_rstd, mean_sq_rows

CMUL_MODES = ("fma_ac_ad", "fma_bd_bc", "fma_ac_bc", "fma_bd_ad", "plain")
"""re = a*c - b*d, im = a*d + b*c with the FMA on: fma_ac_ad: re = fma(a, c, -(b*d)), im = fma(a, d, b*c);
fma_bd_bc: re = fma(-b, d, a*c), im = fma(b, c, a*d); the two mixed pairings; plain: no FMA."""

NORMS = ("none", "mean", "fused")
STYLES = ("complex", "pairs", "split")
FLUX_INDEX = (0, 0, 1, 1)  # cos / sin element each output of a pair reads: even cos, even sin, odd cos, odd sin
WAN_INDEX = (0, 1, 0, 1)

EXPLICIT_TREE = False
"""Spell out the fused RMSNorm's cross-thread tree (kernels_rms.fused_rms_rstd) instead of Triton's
own reduction: the same order on a GPU; Triton's CPU interpreter needs it (tests)."""


@triton.jit
def _cmul(a, b, c, d, MODE: tl.constexpr):
    if MODE == 0:  # fma_ac_ad
        re = tl.fma(a, c, -(b * d))
        im = tl.fma(a, d, b * c)
    elif MODE == 1:  # fma_bd_bc
        re = tl.fma(-b, d, a * c)
        im = tl.fma(b, c, a * d)
    elif MODE == 2:  # fma_ac_bc
        re = tl.fma(a, c, -(b * d))
        im = tl.fma(b, c, a * d)
    elif MODE == 3:  # fma_bd_ad
        re = tl.fma(-b, d, a * c)
        im = tl.fma(a, d, b * c)
    else:  # plain
        re = a * c - b * d
        im = a * d + b * c
    return re, im


@triton.jit
def _rope(a, b, fo, q, f_ptr, g_ptr, m, STYLE: tl.constexpr, MODE: tl.constexpr, CE: tl.constexpr,
          SE: tl.constexpr, CO: tl.constexpr, SO: tl.constexpr, LOW: tl.constexpr, o_ptr):
    """RoPE of the pairs (a, b) [R, P] (fp32 holding storage-dtype values); `fo` [R, P]: the offset of
    each pair's frequencies for its token and head, `q` [P]: each pair's index within its head. LOW:
    cos / sin in the storage dtype (a model cast whole with .to(bf16)): every product and sum rounded
    to it, as eager's bf16 ops round."""
    if STYLE == 0:  # freqs: view_as_real(complex64) [.., S, D/2, 2]
        c = tl.load(f_ptr + fo + 2 * q[None, :], mask=m)
        d = tl.load(f_ptr + fo + 2 * q[None, :] + 1, mask=m)
        return _cmul(a, b, c, d, MODE)
    if STYLE == 2:  # split: one cos / sin a pair [.., S, D/2], the complex product's arithmetic
        c = tl.load(f_ptr + fo + q[None, :], mask=m)
        d = tl.load(g_ptr + fo + q[None, :], mask=m)
        return _cmul(a, b, c, d, MODE)
    ce = tl.load(f_ptr + fo + (2 * q + CE)[None, :], mask=m)
    se = tl.load(g_ptr + fo + (2 * q + SE)[None, :], mask=m)
    co = tl.load(f_ptr + fo + (2 * q + CO)[None, :], mask=m)
    so = tl.load(g_ptr + fo + (2 * q + SO)[None, :], mask=m)
    if LOW:
        ce, se, co, so = ce.to(tl.float32), se.to(tl.float32), co.to(tl.float32), so.to(tl.float32)
        return (_r(_r(a * ce, o_ptr) - _r(b * se, o_ptr), o_ptr),
                _r(_r(b * co, o_ptr) + _r(a * so, o_ptr), o_ptr))
    return a * ce - b * se, b * co + a * so


@triton.jit
def _pairs(cols, D: tl.constexpr, STYLE: tl.constexpr):
    """For pair indices `cols` within a row: the offsets of their two elements in the row, their head
    within the row (rows across heads) and their index within that head. Adjacent elements (2j, 2j + 1)
    pair up, or, split (rotate-half), j and j + D/2 of each head."""
    h = cols // (D // 2)
    q = cols % (D // 2)
    if STYLE == 2:
        ea = h * D + q
        return ea, ea + D // 2, h, q
    return 2 * cols, 2 * cols + 1, h, q


@triton.jit
def _place(rows, RPT, S, s_b, s_s, L):
    """Offsets [R] of rows (RPT a token, S tokens a batch) in a tensor of batch / token strides s_b, s_s."""
    tok = rows // RPT
    return (tok // S) * s_b + (tok % S) * s_s + (rows % RPT) * L


@triton.jit
def _rope_kernel(x_ptr, v_ptr, w_ptr, f_ptr, g_ptr, o_ptr, M, RPT, S, o_sb, o_ss, f_sb, f_ss, f_sh, eps, factor,
                 L: tl.constexpr, LP: tl.constexpr, D: tl.constexpr, ROWS: tl.constexpr, NORM: tl.constexpr,
                 HAS_W: tl.constexpr, VAR_IN: tl.constexpr, RSTD: tl.constexpr, STYLE: tl.constexpr,
                 MODE: tl.constexpr, CE: tl.constexpr, SE: tl.constexpr, CO: tl.constexpr, SO: tl.constexpr,
                 LOW: tl.constexpr):
    # x: contiguous rows of L, RPT rows a token, S tokens a batch; LP: L / 2 up to a power of 2.
    # NORM 0: none; 1: diffusers' RMSNorm
    rows = (tl.program_id(0) * ROWS + tl.arange(0, ROWS)).to(tl.int64)
    cols = tl.arange(0, LP)
    cm = cols < L // 2
    rm = rows < M
    m = rm[:, None] & cm[None, :]
    base = rows * L
    ea, eb, h, q = _pairs(cols, D, STYLE)
    a = tl.load(x_ptr + base[:, None] + ea[None, :], mask=m, other=0.0).to(tl.float32)
    b = tl.load(x_ptr + base[:, None] + eb[None, :], mask=m, other=0.0).to(tl.float32)
    if NORM == 1:
        if VAR_IN:  # the variance in aten's mean order, from the rows just loaded (L1 / L2)
            r = libdevice.rsqrt(mean_sq_rows(x_ptr, base, rm, L, ROWS) * factor + eps)
        else:
            r = _rstd(tl.load(v_ptr + rows, mask=rm, other=1.0), eps, RSTD)
        a = _r(a * r[:, None], o_ptr)
        b = _r(b * r[:, None], o_ptr)
        if HAS_W:
            a = _r(a * tl.load(w_ptr + ea, mask=cm).to(tl.float32)[None, :], o_ptr)
            b = _r(b * tl.load(w_ptr + eb, mask=cm).to(tl.float32)[None, :], o_ptr)
    fo = _place(rows, RPT, S, f_sb, f_ss, f_sh)[:, None] + (h * f_sh)[None, :]
    re, im = _rope(a, b, fo, q, f_ptr, g_ptr, m, STYLE, MODE, CE, SE, CO, SO, LOW, o_ptr)
    ob = _place(rows, RPT, S, o_sb, o_ss, L)
    tl.store(o_ptr + ob[:, None] + ea[None, :], re.to(o_ptr.dtype.element_ty), mask=m)
    tl.store(o_ptr + ob[:, None] + eb[None, :], im.to(o_ptr.dtype.element_ty), mask=m)


@triton.jit
def _rope_fused_rms_kernel(x_ptr, w_ptr, f_ptr, g_ptr, o_ptr, RPT, S, o_sb, o_ss, f_sb, f_ss, f_sh, eps, L,
                           LP: tl.constexpr, D: tl.constexpr, ROUNDS: tl.constexpr, HAS_W: tl.constexpr,
                           SQ_FMA: tl.constexpr, EXPLICIT: tl.constexpr, STYLE: tl.constexpr,
                           MODE: tl.constexpr, CE: tl.constexpr, SE: tl.constexpr, CO: tl.constexpr,
                           SO: tl.constexpr, LOW: tl.constexpr):
    # one row of L a program, 4 warps (the fused RMSNorm's thread order); LP = next power of 2 of L/2
    row = tl.program_id(0).to(tl.int64)
    base = row * L
    r = fused_rms_rstd(x_ptr, base, L, eps, ROUNDS, SQ_FMA, EXPLICIT)
    rows = tl.full((1,), 0, tl.int64) + row
    cols = tl.arange(0, LP)
    cm = cols < L // 2
    m = (rows >= 0)[:, None] & cm[None, :]
    ea, eb, h, q = _pairs(cols, D, STYLE)
    a = tl.load(x_ptr + base + ea[None, :], mask=m, other=0.0).to(tl.float32)
    b = tl.load(x_ptr + base + eb[None, :], mask=m, other=0.0).to(tl.float32)
    if HAS_W:  # F.rms_norm on CUDA: w * (rstd * x) in fp32, rounded once
        a = _r(tl.load(w_ptr + ea, mask=cm).to(tl.float32)[None, :] * (r * a), o_ptr)
        b = _r(tl.load(w_ptr + eb, mask=cm).to(tl.float32)[None, :] * (r * b), o_ptr)
    else:
        a = _r(r * a, o_ptr)
        b = _r(r * b, o_ptr)
    fo = _place(rows, RPT, S, f_sb, f_ss, f_sh)[:, None] + (h * f_sh)[None, :]
    re, im = _rope(a, b, fo, q, f_ptr, g_ptr, m, STYLE, MODE, CE, SE, CO, SO, LOW, o_ptr)
    ob = _place(rows, RPT, S, o_sb, o_ss, L)
    tl.store(o_ptr + ob[:, None] + ea[None, :], re.to(o_ptr.dtype.element_ty), mask=m)
    tl.store(o_ptr + ob[:, None] + eb[None, :], im.to(o_ptr.dtype.element_ty), mask=m)


@triton.jit
def _pair_sum(t, ROWS: tl.constexpr, W: tl.constexpr):
    """[ROWS, W] -> [ROWS, W / 2]: lane l + W / 2 added to lane l (a shuffle-down step at offset
    W / 2). A sum over an axis of two is one addition, and a + b == b + a: the same bits whatever
    layout Triton picks, so no layout conversion is forced (lane_tree's permute is one)."""
    return tl.sum(tl.reshape(t, (ROWS, 2, W // 2)), axis=1)


@triton.jit
def _head_rows_kernel(x_ptr, v_ptr, w_ptr, f_ptr, g_ptr, o_ptr, M, RPT, S, o_sb, o_ss, f_sb, f_ss, eps, factor,
                      ROWS: tl.constexpr, NORM: tl.constexpr, HAS_W: tl.constexpr, VAR_IN: tl.constexpr,
                      RSTD: tl.constexpr, STYLE: tl.constexpr, MODE: tl.constexpr, CE: tl.constexpr,
                      SE: tl.constexpr, CO: tl.constexpr, SO: tl.constexpr, LOW: tl.constexpr):
    # ROWS rows of 128 (one head each) a program, read and written as [ROWS, 64, 2] pair tiles
    # (contiguous: vector loads and stores, where _rope_kernel reads every other element twice);
    # NORM 0: none, 1: diffusers' RMSNorm (aten's mean order, `vec_dec`), 2: torch's RMSNorm
    # (aten's fused kernel's order: for a row of 128, lane l's FMA chain over elements 4l .. 4l + 3,
    # then the shuffle-down tree; warps 1-3 hold zeros). Both trees are pairwise sums (_pair_sum).
    rows = (tl.program_id(0) * ROWS + tl.arange(0, ROWS)).to(tl.int64)
    rm = rows < M
    cols = tl.arange(0, 64)
    c2 = tl.arange(0, 2)
    m3 = rm[:, None, None] & (cols < 64)[None, :, None] & (c2 < 2)[None, None, :]
    offs = (2 * cols)[None, :, None] + c2[None, None, :]
    x2 = tl.load(x_ptr + (rows * 128)[:, None, None] + offs, mask=m3, other=0.0).to(tl.float32)
    if NORM != 0:
        if NORM == 2 or VAR_IN:
            # element 4l + 2p + c is (l, p, c) of [ROWS, 32, 2, 2]: lane l's four, in order
            if NORM == 1:
                even, odd = tl.split(tl.reshape(x2 * x2, (ROWS, 32, 2, 2)))
                e0, e2 = tl.split(even)
                e1, e3 = tl.split(odd)
                t = ((e0 + e1) + e2) + e3
            else:
                even, odd = tl.split(tl.reshape(x2, (ROWS, 32, 2, 2)))
                e0, e2 = tl.split(even)
                e1, e3 = tl.split(odd)
                t = tl.fma(e3, e3, tl.fma(e2, e2, tl.fma(e1, e1, e0 * e0)))
            t = _pair_sum(t, ROWS, 32)
            t = _pair_sum(t, ROWS, 16)
            t = _pair_sum(t, ROWS, 8)
            t = _pair_sum(t, ROWS, 4)
            t = tl.reshape(_pair_sum(t, ROWS, 2), (ROWS,))
            if NORM == 1:
                r = libdevice.rsqrt(t * factor + eps)
            else:  # fused_rms_rstd's last step
                r = tl.rsqrt(tl.div_rn(t, 128.0) + eps)
        else:
            r = _rstd(tl.load(v_ptr + rows, mask=rm, other=1.0), eps, RSTD)
        r3 = r[:, None, None]
        if NORM == 1:
            x2 = _r(x2 * r3, o_ptr)
            if HAS_W:
                x2 = _r(x2 * tl.load(w_ptr + offs).to(tl.float32), o_ptr)
        elif HAS_W:  # F.rms_norm on CUDA: w * (rstd * x) in fp32, rounded once
            x2 = _r(tl.load(w_ptr + offs).to(tl.float32) * (r3 * x2), o_ptr)
        else:
            x2 = _r(r3 * x2, o_ptr)
    a, b = tl.split(x2)
    m = rm[:, None] & (cols < 64)[None, :]
    fo = _place(rows, RPT, S, f_sb, f_ss, 0)[:, None]  # one set of frequencies for every head
    re, im = _rope(a, b, fo, cols, f_ptr, g_ptr, m, STYLE, MODE, CE, SE, CO, SO, LOW, o_ptr)
    ob = _place(rows, RPT, S, o_sb, o_ss, 128)
    tl.store(o_ptr + ob[:, None, None] + offs, tl.join(re, im).to(o_ptr.dtype.element_ty), mask=m3)


HEAD_ROWS = 4
"""Rows of 128 a program in _head_rows_kernel (benchmarks/bench_fusion_kernels.py --only rope sweeps it)."""
HEAD_WARPS = 1
HEAD_KERNEL = True
"""Rows of 128 per head take _head_rows_kernel; False: the general kernels (the benchmark's baseline)."""


@dataclass(frozen=True)
class Rope:
    """How eager rotates: `style` (STYLES), the complex product's contraction `mode` (CMUL_MODES),
    the pairs' cos / sin `index` (FLUX_INDEX, WAN_INDEX)."""

    style: str
    mode: str = "fma_ac_ad"
    index: tuple = FLUX_INDEX


def _freq_view(freqs, style: str, B: int, S: int, H: int, D: int, dtype: torch.dtype) -> tuple:
    """(f, g, batch stride, token stride, head stride) of the frequencies for S tokens (in elements):
    one set for every head ([B|1, S, W]) or a set a head ([B|1, S, H, W], any strides but the last),
    W = D ("pairs": cos / sin repeated for both elements of a pair) or D / 2 ("split", "complex")."""
    if style == "complex":
        _check(isinstance(freqs, torch.Tensor) and freqs.dtype == torch.complex64 and freqs.dim() == 3
               and freqs.shape[0] in (1, B) and freqs.shape[1:] == (S, D // 2) and freqs.stride(2) == 1,
               "freqs must be complex64 [B|1, S, D/2]")
        f = torch.view_as_real(freqs)
        return f, f, (f.stride(0) if freqs.shape[0] > 1 else 0), f.stride(1), 0
    cos, sin = freqs
    W = D if style == "pairs" else D // 2
    dtypes = (torch.float32, dtype) if style == "pairs" else (torch.float32,)
    shape = (S, W) if cos.dim() == 3 else (S, H, W)
    _check(cos.dtype == sin.dtype and cos.dtype in dtypes and cos.shape == sin.shape and cos.dim() in (3, 4)
           and cos.shape[0] in (1, B) and cos.shape[1:] == shape and cos.stride() == sin.stride()
           and cos.stride(-1) == 1,
           "cos / sin must be [B|1, S, (H,) W] of one layout, fp32 (pairs: or x's dtype), W the head dim (split: half)")
    return cos, sin, (cos.stride(0) if cos.shape[0] > 1 else 0), cos.stride(1), (cos.stride(2) if cos.dim() == 4 else 0)


def rope(x: torch.Tensor, freqs, rope_: Rope, out: torch.Tensor | None = None, t0: int = 0, norm: str = "none",
         weight: torch.Tensor | None = None, eps: float = 0.0, var: torch.Tensor | None = None,
         across_heads: bool = False, sq_fma: bool = True) -> torch.Tensor:
    """RoPE(norm(x)) for x [B, S, H, D] contiguous, written to out[:, t0:t0 + S] (out: [B, S_out, H, D],
    contiguous; a new [B, S, H, D] when None). `freqs`: complex64 [B|1, S, D/2] ("complex"), or (cos,
    sin) fp32 [B|1, S, D] ("pairs") or [B|1, S, D/2] ("split"), for x's S tokens, each optionally with a
    head axis before the last ([B|1, S, H, ..]: a set of frequencies a head). `norm` (NORMS) with
    `weight` [D] (per head) or [H * D] (`across_heads`), `eps`; "mean" reads `var` [B, S, H or 1, 1]
    (rstd_input of it) when given, else reduces in the kernel."""
    _check(x.dim() == 4 and x.is_contiguous() and x.dtype in (torch.bfloat16, torch.float16, torch.float32),
           "x must be a contiguous [B, S, H, D] of a float dtype")
    B, S, H, D = x.shape
    _check(D >= 2 and D % 2 == 0, "the head dim must be even (pairs)")
    L = H * D if across_heads else D
    RPT = 1 if across_heads else H
    M = B * S * RPT
    if out is None:
        out = torch.empty_like(x)
        t0 = 0
    _check(out.dim() == 4 and out.is_contiguous() and out.shape[0] == B and out.shape[2:] == (H, D)
           and out.dtype == x.dtype and 0 <= t0 and t0 + S <= out.shape[1], "out must be a contiguous [B, S_out, H, D]")
    o = out[:, t0:]
    f, g, f_sb, f_ss, f_sh = _freq_view(freqs, rope_.style, B, S, H, D, x.dtype)
    low = rope_.style == "pairs" and f.dtype != torch.float32
    _check(norm in NORMS and (norm == "none" or weight is None or (weight.shape == (L,) and weight.dtype == x.dtype
                                                                    and weight.is_contiguous())),
           "weight must be a contiguous [D] (or [H * D] across heads) of x's dtype")
    style, mode = STYLES.index(rope_.style), CMUL_MODES.index(rope_.mode)
    ce, se, co, so = rope_.index
    if norm == "fused":
        _check(L % 4 == 0 and M > 0, "aten's vectorized RMSNorm needs rows of a multiple of 4")
    if (HEAD_KERNEL and L == 128 and not across_heads and rope_.style != "split" and f_sh == 0
            and (norm != "fused" or sq_fma)):  # adjacent pairs, one set of frequencies, aten's FMA form
        return _head_rows(x, var, weight, f, g, o, out, M, RPT, S, f_sb, f_ss, eps, norm, style, mode,
                          rope_.index, low)
    if norm == "fused":
        _rope_fused_rms_kernel[(M,)](x, weight if weight is not None else x, f, g, o, RPT, S, o.stride(0),
                                     o.stride(1), f_sb, f_ss, f_sh, eps, L, LP=triton.next_power_of_2(L // 2), D=D,
                                     ROUNDS=triton.cdiv(L // 4, 128), HAS_W=weight is not None, SQ_FMA=sq_fma,
                                     EXPLICIT=EXPLICIT_TREE, STYLE=style, MODE=mode, CE=ce, SE=se, CO=co, SO=so,
                                     LOW=low,
                                     num_warps=4, **OPTS)
        return out
    var_in = _check_var(norm, var, L, M)
    rows = 1 << max(0, (2048 // L).bit_length() - 1)  # ~2048 elements a program, a power of two (tl.arange)
    factor = float(np.float32(M) / np.float32(M * L))  # aten: static_cast<float>(outputs) / numel
    _rope_kernel[(triton.cdiv(M, rows),)](x, var if var is not None else x, weight if weight is not None else x,
                                          f, g, o, M, RPT, S, o.stride(0), o.stride(1), f_sb, f_ss, f_sh, eps, factor,
                                          L=L, LP=triton.next_power_of_2(L // 2), D=D,
                                          ROWS=rows, NORM=0 if norm == "none" else 1, HAS_W=weight is not None,
                                          VAR_IN=var_in, RSTD=not kernels_rms.RSTD_IN_KERNEL, STYLE=style, MODE=mode,
                                          CE=ce, SE=se, CO=co, SO=so, LOW=low, **OPTS)
    return out


def _check_var(norm: str, var: torch.Tensor | None, L: int, M: int) -> bool:
    """Whether the "mean" variance is reduced in the kernel (no `var` given); checks `var` otherwise."""
    var_in = norm == "mean" and var is None
    if var_in:
        # aten's mean reduces one warp a row for these sizes (kernels_rms.row_variance)
        _check(L % 128 == 0 and L < 8192 and M >= 16,
               "the in-kernel variance is aten's order for rows of 128k, 16+ rows")
    if var is not None:
        _check(var.is_contiguous() and var.numel() == M and var.dtype == torch.float32, "var must be fp32 [rows]")
    return var_in


def _head_rows(x, var, weight, f, g, o, out, M, RPT, S, f_sb, f_ss, eps, norm, style, mode, index, low):
    """rope() for rows of 128, one head each (Flux, LongCat, Qwen-Image, Z-Image): _head_rows_kernel."""
    var_in = _check_var(norm, var, 128, M)
    ce, se, co, so = index
    factor = float(np.float32(M) / np.float32(M * 128))  # aten: static_cast<float>(outputs) / numel
    _head_rows_kernel[(triton.cdiv(M, HEAD_ROWS),)](
        x, var if var is not None else x, weight if weight is not None else x, f, g, o, M, RPT, S, o.stride(0),
        o.stride(1), f_sb, f_ss, eps, factor, ROWS=HEAD_ROWS, NORM=NORMS.index(norm), HAS_W=weight is not None,
        VAR_IN=var_in, RSTD=not kernels_rms.RSTD_IN_KERNEL, STYLE=style, MODE=mode, CE=ce, SE=se, CO=co, SO=so,
        LOW=low, num_warps=HEAD_WARPS, **OPTS)
    return out


# -- the GPU test's probe -----------------------------------------------------------------------
@triton.jit
def _cmul_kernel(x_ptr, y_ptr, o_ptr, npairs, MODE: tl.constexpr, BLOCK: tl.constexpr):
    p = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = p < npairs
    a = tl.load(x_ptr + 2 * p, mask=m)
    b = tl.load(x_ptr + 2 * p + 1, mask=m)
    c = tl.load(y_ptr + 2 * p, mask=m)
    d = tl.load(y_ptr + 2 * p + 1, mask=m)
    re, im = _cmul(a, b, c, d, MODE)
    tl.store(o_ptr + 2 * p, re, mask=m)
    tl.store(o_ptr + 2 * p + 1, im, mask=m)


def cmul(x: torch.Tensor, y: torch.Tensor, mode: str) -> torch.Tensor:
    """x * y for contiguous complex64 tensors of one shape, with the contraction `mode`."""
    xr, yr = torch.view_as_real(x.contiguous()), torch.view_as_real(y.contiguous())
    out = torch.empty_like(xr)
    n = x.numel()
    _cmul_kernel[(triton.cdiv(n, 1024),)](xr, yr, out, n, MODE=CMUL_MODES.index(mode), BLOCK=1024, **OPTS)
    return torch.view_as_complex(out)

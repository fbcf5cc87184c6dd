"""Triton kernels of the lossless fusions (imported only where Triton and CUDA exist).

Rounding plan: every kernel loads storage-dtype values, computes each op in fp32 and rounds to the
storage dtype (`_r`) exactly where eager's separate kernels store their outputs. Three details keep
it bit-exact with aten's CUDA kernels (built by nvcc without fast-math):
- FMA contraction is off (`enable_fp_fusion=False`): eager's `x * s + t` is two kernels, two
  roundings; a fused multiply-add would round once.
- Division is IEEE round-to-nearest (`tl.div_rn`, PTX div.rn.f32), as nvcc's `a / b`; Triton's
  `/` is div.full.f32 (2 ulp).
- exp is libdevice's `__nv_expf`, the function nvcc links for `expf`; `tl.exp` is ex2.approx.
  libdevice's flush-to-zero reflection is turned off where this Triton has the option.
Each launcher's Python `reference` twin lives in ops.py; the verifier compares against eager.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from .applicable import check as _check

try:  # compile options of this Triton: pass only the ones it knows
    from triton.backends.nvidia.compiler import CUDAOptions

    _FIELDS = set(CUDAOptions.__dataclass_fields__)
except Exception:  # noqa: BLE001 - older layouts: fp fusion is a long-standing option
    _FIELDS = {"enable_fp_fusion"}
OPTS = {k: v for k, v in (("enable_fp_fusion", False), ("enable_reflect_ftz", False)) if k in _FIELDS}

BLOCK = 1024


@triton.jit
def _r(x, like_ptr):
    """Round an fp32 value to the storage dtype of `like_ptr` and back (a store + load in eager)."""
    return x.to(like_ptr.dtype.element_ty).to(tl.float32)


@triton.jit
def _silu(x):
    # aten: x / (1 + expf(-x)) in fp32
    return tl.div_rn(x, 1.0 + libdevice.exp(-x))


# -- adaLN modulation: y = x * (1 + scale) + shift -------------------------------------------
@triton.jit
def _adaln_kernel(x_ptr, s_ptr, t_ptr, o_ptr, numel, ND, D, s_sb, s_sd, t_sb, t_sd,
                  BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offs < numel
    b = offs // ND
    d = offs % D
    x = tl.load(x_ptr + offs, mask=m).to(tl.float32)
    s = tl.load(s_ptr + b * s_sb + d * s_sd, mask=m).to(tl.float32)
    t = tl.load(t_ptr + b * t_sb + d * t_sd, mask=m).to(tl.float32)
    y = _r(x * _r(s + 1.0, o_ptr), o_ptr)
    tl.store(o_ptr + offs, (y + t).to(o_ptr.dtype.element_ty), mask=m)


def adaln(x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """x [B, N, D] contiguous; scale/shift broadcast as [B or 1, 1, D]."""
    _check(x.dim() == 3 and x.is_contiguous(), "x must be a contiguous [B, N, D]")
    _check(scale.dtype == shift.dtype == x.dtype, "one dtype for x, scale, shift")
    B, N, D = x.shape
    s, t = scale.expand(B, N, D), shift.expand(B, N, D)
    _check(s.stride(1) == 0 and t.stride(1) == 0, "scale/shift must broadcast over tokens")
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    n = x.numel()
    _adaln_kernel[(triton.cdiv(n, BLOCK),)](x, s, t, out, n, N * D, D, s.stride(0), s.stride(2),
                                           t.stride(0), t.stride(2), BLOCK=BLOCK, **OPTS)
    return out


# -- gated residual: h + g * (y [+ bias]) --------------------------------------------------
@triton.jit
def _gate_res_kernel(h_ptr, g_ptr, y_ptr, b_ptr, o_ptr, numel, ND, D, g_sb, g_sd,
                     HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr, F32: tl.constexpr = False):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offs < numel
    b = offs // ND
    d = offs % D
    h = tl.load(h_ptr + offs, mask=m).to(tl.float32)
    y = tl.load(y_ptr + offs, mask=m).to(tl.float32)
    g = tl.load(g_ptr + b * g_sb + d * g_sd, mask=m).to(tl.float32)
    if HAS_BIAS:  # aten linear on a strided input: matmul, then add_(bias) as its own kernel
        y = _r(y + tl.load(b_ptr + d, mask=m).to(tl.float32), o_ptr)
    if F32:  # Wan: (h.float() + y.float() * gate).type_as(h): the product stays fp32
        gy = g * y
    else:
        gy = _r(g * y, o_ptr)
    tl.store(o_ptr + offs, (h + gy).to(o_ptr.dtype.element_ty), mask=m)


def gated_residual(h: torch.Tensor, gate: torch.Tensor, y: torch.Tensor,
                   bias: torch.Tensor | None = None, f32: bool = False) -> torch.Tensor:
    """h + gate * (y [+ bias]) for h, y [B, N, D] contiguous; gate broadcast as [B or 1, 1, D]; bias [D]
    or None. `f32`: Wan's `(h.float() + y.float() * gate).type_as(h)` with an fp32 gate."""
    _check(h.dim() == 3 and h.is_contiguous() and y.is_contiguous() and y.shape == h.shape,
           "h and y must be contiguous [B, N, D]")
    _check(h.dtype == y.dtype and (bias is None or bias.dtype == h.dtype) and not (f32 and bias is not None)
           and (gate.dtype == h.dtype or (f32 and gate.dtype == torch.float32)), "one dtype (an fp32 gate: f32)")
    B, N, D = h.shape
    g = gate.expand(B, N, D)
    _check(g.stride(1) == 0, "gate must broadcast over tokens")
    if bias is not None:
        _check(bias.shape == (D,) and bias.is_contiguous(), "bias must be a contiguous [D]")
    out = torch.empty_like(h, memory_format=torch.contiguous_format)
    n = h.numel()
    _gate_res_kernel[(triton.cdiv(n, BLOCK),)](h, g, y, bias if bias is not None else y, out, n, N * D, D,
                                              g.stride(0), g.stride(2), HAS_BIAS=bias is not None,
                                              BLOCK=BLOCK, F32=f32, **OPTS)
    return out


# -- GLUMBConv: conv bias + SiLU (in place), conv bias + GLU gate -----------------------------
@triton.jit
def _bias_silu_kernel(y_ptr, b_ptr, numel, C, HW, CL: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offs < numel
    c = _channel(offs, C, HW, CL)
    y = tl.load(y_ptr + offs, mask=m).to(tl.float32)
    y = _r(y + tl.load(b_ptr + c, mask=m).to(tl.float32), y_ptr)
    tl.store(y_ptr + offs, _silu(y).to(y_ptr.dtype.element_ty), mask=m)


@triton.jit
def _channel(offs, C, HW, CL: tl.constexpr):
    """The channel of flat offset `offs` in a dense [B, C, H, W]: channels-last, or NCHW (contiguous)."""
    if CL:
        return offs % C
    return (offs // HW) % C


def image_layout(t: torch.Tensor) -> bool:
    """True for a channels-last [B, C, H, W], False for a contiguous one (NotApplicable for any other):
    the two dense layouts the per-channel kernels walk in memory order."""
    _check(t.dim() == 4, "a [B, C, H, W] image tensor")
    if t.is_contiguous(memory_format=torch.channels_last):
        return True
    _check(t.is_contiguous(), "the image must be contiguous or channels-last")
    return False


def bias_silu_(y: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """In place on a conv output y [B, C, H, W] (channels-last, as SANA's GLUMBConv runs, or contiguous,
    as DC-AE's ResBlocks may): silu(y + bias[c])."""
    cl = image_layout(y)
    B, C, H, W = y.shape
    _check(bias.shape == (C,) and bias.dtype == y.dtype, "bias must be [C] of y's dtype")
    n = y.numel()
    _bias_silu_kernel[(triton.cdiv(n, BLOCK),)](y, bias, n, C, H * W, CL=cl, BLOCK=BLOCK, **OPTS)
    return y


@triton.jit
def _bias_glu_kernel(d_ptr, b_ptr, o_ptr, numel, Hc, HW, HAS_BIAS: tl.constexpr, CL: tl.constexpr,
                     BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offs < numel
    if CL:
        p = offs // Hc  # pixel
        j = offs % Hc  # channel of the value half
        src = p * (2 * Hc) + j
        half = Hc  # the gate's offset from its value
    else:  # NCHW: out[b, j, p] from d[b, j, p] and d[b, Hc + j, p]
        rem = offs % (Hc * HW)
        j = rem // HW
        src = (offs // (Hc * HW)) * (2 * Hc * HW) + rem
        half = Hc * HW
    x = tl.load(d_ptr + src, mask=m).to(tl.float32)
    g = tl.load(d_ptr + src + half, mask=m).to(tl.float32)
    if HAS_BIAS:
        x = _r(x + tl.load(b_ptr + j, mask=m).to(tl.float32), o_ptr)
        g = _r(g + tl.load(b_ptr + j + Hc, mask=m).to(tl.float32), o_ptr)
    tl.store(o_ptr + offs, (x * _r(_silu(g), o_ptr)).to(o_ptr.dtype.element_ty), mask=m)


def bias_glu(d: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """d [B, 2H, h, w] -> x * silu(gate) [B, H, h, w] in d's layout (channels-last, as SANA's GLUMBConv
    runs, or contiguous, as DC-AE's may: eager's product of the two chunks keeps it), where
    x, gate = (d + bias).chunk(2, dim=1)."""
    cl = image_layout(d)
    B, C2, Hh, Ww = d.shape
    _check(C2 % 2 == 0, "even channels")
    if bias is not None:
        _check(bias.shape == (C2,) and bias.dtype == d.dtype, "bias must be [C] of d's dtype")
    fmt = torch.channels_last if cl else torch.contiguous_format
    out = torch.empty((B, C2 // 2, Hh, Ww), dtype=d.dtype, device=d.device, memory_format=fmt)
    n = out.numel()
    _bias_glu_kernel[(triton.cdiv(n, BLOCK),)](d, bias if bias is not None else d, out, n, C2 // 2, Hh * Ww,
                                              HAS_BIAS=bias is not None, CL=cl, BLOCK=BLOCK, **OPTS)
    return out


# -- SANA linear attention: relu + fp32 + the layouts bmm wants; the normalising division ----
@triton.jit
def _lin_prep_kernel(q_ptr, k_ptr, v_ptr, q32_ptr, k32_ptr, v32_ptr, N, D, C, HEADS,
                     BN: tl.constexpr, BD: tl.constexpr):
    # q, k, v: [B, N, D] contiguous (d = head * C + c)
    # q32: [B, heads, C, N]; k32: [B, heads, N, C]; v32: [B, heads, C + 1, N], row C = 1.0
    b = tl.program_id(2).to(tl.int64)
    n = tl.program_id(0) * BN + tl.arange(0, BN)
    d = tl.program_id(1) * BD + tl.arange(0, BD)
    m = (n[:, None] < N) & (d[None, :] < D)
    src = b * N * D + n[:, None] * D + d[None, :]
    hh = d // C
    cc = d % C
    q = tl.load(q_ptr + src, mask=m).to(tl.float32)
    k = tl.load(k_ptr + src, mask=m).to(tl.float32)
    v = tl.load(v_ptr + src, mask=m).to(tl.float32)
    q = tl.where(q != q, q, tl.maximum(q, 0.0))  # aten relu: NaN passes through
    k = tl.where(k != k, k, tl.maximum(k, 0.0))
    tl.store(q32_ptr + b * D * N + d[None, :] * N + n[:, None], q, mask=m)
    tl.store(k32_ptr + b * D * N + (hh[None, :] * N + n[:, None]) * C + cc[None, :], k, mask=m)
    vrow = (b * HEADS + hh[None, :]) * (C + 1) + cc[None, :]
    tl.store(v32_ptr + vrow * N + n[:, None], v, mask=m)
    ones_m = (n[:, None] < N) & (d[None, :] < D) & (cc[None, :] == 0)
    one_row = (b * HEADS + hh[None, :]) * (C + 1) + C
    tl.store(v32_ptr + one_row * N + n[:, None], tl.full((BN, BD), 1.0, tl.float32), mask=ones_m)


def linear_attention_prep(q, k, v, heads: int):
    _check(q.dim() == 3 and all(t.is_contiguous() and t.shape == q.shape and t.dtype == q.dtype
                                for t in (q, k, v)), "q, k, v must be contiguous [B, N, D] of one dtype")
    B, N, D = q.shape
    C = D // heads
    _check(C * heads == D, "D must divide into heads")
    dev = q.device
    q32 = torch.empty((B, heads, C, N), dtype=torch.float32, device=dev)
    k32 = torch.empty((B, heads, N, C), dtype=torch.float32, device=dev)
    v32 = torch.empty((B, heads, C + 1, N), dtype=torch.float32, device=dev)
    BN, BD = 64, 64
    grid = (triton.cdiv(N, BN), triton.cdiv(D, BD), B)
    _lin_prep_kernel[grid](q, k, v, q32, k32, v32, N, D, C, heads, BN=BN, BD=BD, **OPTS)
    return q32, k32, v32


@triton.jit
def _lin_div_kernel(hs_ptr, o_ptr, N, D, C, eps, BLOCK_N: tl.constexpr):
    # hs: [B, heads, C + 1, N] fp32; o: [B, D, N] storage dtype, d = head * C + c
    row = tl.program_id(0).to(tl.int64)  # b * D + d
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    m = n < N
    b = row // D
    d = row % D
    hh = d // C
    cc = d % C
    base = (b * (D // C) + hh) * (C + 1)
    num = tl.load(hs_ptr + (base + cc) * N + n, mask=m)
    den = tl.load(hs_ptr + (base + C) * N + n, mask=m, other=1.0)
    tl.store(o_ptr + row * N + n, tl.div_rn(num, den + eps).to(o_ptr.dtype.element_ty), mask=m)


def linear_attention_div(hs: torch.Tensor, dtype: torch.dtype, eps: float) -> torch.Tensor:
    """hs [B, heads, C + 1, N] fp32 contiguous -> [B, N, D] in `dtype`, laid out as eager's
    `.flatten(1, 2).transpose(1, 2).to(dtype)` leaves it (memory [B, D, N])."""
    _check(hs.is_contiguous() and hs.dtype == torch.float32, "hs must be contiguous fp32")
    B, H, C1, N = hs.shape
    D = H * (C1 - 1)
    out = torch.empty((B, D, N), dtype=dtype, device=hs.device)
    BLOCK_N = min(1024, triton.next_power_of_2(N))
    _lin_div_kernel[(B * D, triton.cdiv(N, BLOCK_N))](hs, out, N, D, C1 - 1, eps, BLOCK_N=BLOCK_N, **OPTS)
    return out.transpose(1, 2)


# -- GLUMBConv's depthwise 3x3 conv + bias + GLU in one pass ----------------------------------
@triton.jit
def _dw_glu_kernel(x_ptr, w_ptr, b_ptr, o_ptr, H, W, Hc, COL_MAJOR: tl.constexpr,
                   BP: tl.constexpr, BC: tl.constexpr):
    # x: [B, 2Hc, H, W] channels-last (memory [B, H, W, 2Hc]); w: [2Hc, 1, 3, 3]; bias [2Hc]
    # o: [B, Hc, H, W] channels-last. The 9 taps are summed in fp32 in a fixed order (row- or
    # column-major); bf16 x bf16 products are exact in fp32, so mul + add equals an FMA chain.
    b = tl.program_id(2).to(tl.int64)
    p = tl.program_id(0) * BP + tl.arange(0, BP)
    j = tl.program_id(1) * BC + tl.arange(0, BC)
    pm = p < H * W
    jm = j < Hc
    py = p // W
    px = p % W
    accx = tl.zeros((BP, BC), dtype=tl.float32)
    accg = tl.zeros((BP, BC), dtype=tl.float32)
    for t in tl.static_range(9):
        if COL_MAJOR:
            ky = t % 3
            kx = t // 3
        else:
            ky = t // 3
            kx = t % 3
        yy = py + (ky - 1)
        xx = px + (kx - 1)
        inb = pm & (yy >= 0) & (yy < H) & (xx >= 0) & (xx < W)
        base = ((b * H + yy) * W + xx) * (2 * Hc)
        m = inb[:, None] & jm[None, :]
        xv = tl.load(x_ptr + base[:, None] + j[None, :], mask=m, other=0.0).to(tl.float32)
        gv = tl.load(x_ptr + base[:, None] + (j + Hc)[None, :], mask=m, other=0.0).to(tl.float32)
        wx = tl.load(w_ptr + j * 9 + (ky * 3 + kx), mask=jm, other=0.0).to(tl.float32)
        wg = tl.load(w_ptr + (j + Hc) * 9 + (ky * 3 + kx), mask=jm, other=0.0).to(tl.float32)
        accx = accx + xv * wx[None, :]
        accg = accg + gv * wg[None, :]
    # cuDNN stores the conv output, then aten adds the bias in its own kernel
    xb = _r(_r(accx, o_ptr) + tl.load(b_ptr + j, mask=jm, other=0.0).to(tl.float32)[None, :], o_ptr)
    gb = _r(_r(accg, o_ptr) + tl.load(b_ptr + j + Hc, mask=jm, other=0.0).to(tl.float32)[None, :], o_ptr)
    out = (xb * _r(_silu(gb), o_ptr)).to(o_ptr.dtype.element_ty)
    dst = (b * H * W + p[:, None]) * Hc + j[None, :]
    tl.store(o_ptr + dst, out, mask=pm[:, None] & jm[None, :])


DW_TILE = (64, 32, 4)  # pixels, channels, warps a program: fastest at 16x16 (bench_fusion_kernels.py)


def dwconv_glu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, col_major: bool,
               tile: tuple[int, int, int] | None = None) -> torch.Tensor:
    """GLU(depthwise_conv3x3(x) + bias) for channels-last x [B, 2H, h, w] -> [B, H, h, w].
    `tile` (pixels, channels, warps) changes speed only: every tile sums the taps in one order."""
    _check(x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last), "x must be channels-last")
    B, C2, Hh, Ww = x.shape
    _check(weight.shape == (C2, 1, 3, 3) and weight.is_contiguous() and C2 % 2 == 0, "a 3x3 depthwise weight")
    _check(bias is not None and bias.shape == (C2,) and x.dtype == weight.dtype == bias.dtype, "bias, one dtype")
    out = torch.empty((B, C2 // 2, Hh, Ww), dtype=x.dtype, device=x.device, memory_format=torch.channels_last)
    BP, BC, warps = tile or DW_TILE
    grid = (triton.cdiv(Hh * Ww, BP), triton.cdiv(C2 // 2, BC), B)
    _dw_glu_kernel[grid](x, weight, bias, out, Hh, Ww, C2 // 2, COL_MAJOR=col_major, BP=BP, BC=BC,
                         num_warps=warps, **OPTS)
    return out


# -- the same, walking rows: each input row loaded once (its two shifted views from L1) ----------
# The gather kernel above loads all 9 taps of every output from memory, so each input element is
# read 9 times (through L1/L2): at SANA-1.6B's 1024², batch 8 (16 rows of 32x32 pixels, 11,200
# channels) that is 3.3 GB a call, and cuDNN's depthwise conv + the bias/GLU kernel beat it. Here a
# program owns ROWS output rows x BW columns x BC channels of both GLU halves and walks input rows
# y0-1 .. y0+ROWS once: each input row feeds output rows r+1, r, r-1 (kernel rows ky = 0, 1, 2),
# added to rolling accumulators in input-row order, so every output still sums its 9 taps row-major
# (DWCONV_GLU_ROWS's order, verified against cuDNN on first sight). The row's left and right views
# are two more loads of the same lines (L1 hits), not more memory traffic. Masks are vectors: Triton
# 3.9's interpreter cannot combine a scalar mask with a vector one (tests/test_fusions_dw_rows.py).
@triton.jit
def _row3(x_ptr, pix, x, rin, W, C2, ch, jm):
    """Input row at columns x-1, x, x+1 ([BW, BC] fp32 each; 0 outside the grid: the conv's padding)."""
    cm = jm[None, :]
    base = (pix + x)[:, None] * C2 + ch[None, :]
    left = tl.load(x_ptr + base - C2, mask=(rin & (x >= 1) & (x - 1 < W))[:, None] & cm, other=0.0)
    c = tl.load(x_ptr + base, mask=(rin & (x < W))[:, None] & cm, other=0.0)
    right = tl.load(x_ptr + base + C2, mask=(rin & (x + 1 < W))[:, None] & cm, other=0.0)
    return left.to(tl.float32), c.to(tl.float32), right.to(tl.float32)


@triton.jit
def _w3(wt_ptr, ch, jm, C2, KY: tl.constexpr):
    """Kernel row KY's three taps for channels ch, from the weight laid out [9, C] (each tap's channels
    contiguous: vector loads), as [1, BC] fp32 each. Loaded once a program, before the row walk: in
    the walk they were 18 loads a row step on the loop's critical path."""
    wl = tl.load(wt_ptr + (KY * 3) * C2 + ch, mask=jm, other=0.0).to(tl.float32)[None, :]
    wc = tl.load(wt_ptr + (KY * 3 + 1) * C2 + ch, mask=jm, other=0.0).to(tl.float32)[None, :]
    wr = tl.load(wt_ptr + (KY * 3 + 2) * C2 + ch, mask=jm, other=0.0).to(tl.float32)[None, :]
    return wl, wc, wr


@triton.jit
def _taps3w(acc, left, c, right, wl, wc, wr, FMA: tl.constexpr):
    """acc + the three taps of one kernel row, added left to right. Every input and weight is a bf16
    or fp16 value, so each product (at most 22 significant bits) is exact in fp32: a fused
    multiply-add rounds once where `acc + p * w` rounds twice, and the first rounding is exact, so
    both give the same bits (save a product that overflows fp32 or falls under about 1e-40, where
    its low bits leave fp32's subnormal grid; first-sight verification compares the sums with
    cuDNN's). With FMA a tap is one instruction, not two: the row walk's loop issues about a fifth
    fewer (session 58, its sm_90 SASS)."""
    if FMA:
        acc = tl.fma(left, wl, acc)
        acc = tl.fma(c, wc, acc)
        return tl.fma(right, wr, acc)
    else:
        acc = acc + left * wl
        acc = acc + c * wc
        return acc + right * wr


@triton.jit
def _dw_glu_rows_kernel(x_ptr, w_ptr, b_ptr, o_ptr, H, W, Hc, NWB, ROWS: tl.constexpr, BW: tl.constexpr,
                        BC: tl.constexpr, PREFETCH: tl.constexpr, FMA: tl.constexpr, STAGES: tl.constexpr):
    # x: [B, 2Hc, H, W] channels-last; w: the depthwise weight as [9, 2Hc] (tap-major); b: [2Hc];
    # o: [B, Hc, H, W] channels-last
    b = tl.program_id(2).to(tl.int64)
    y0 = (tl.program_id(0) // NWB) * ROWS
    x = (tl.program_id(0) % NWB) * BW + tl.arange(0, BW)
    j = tl.program_id(1) * BC + tl.arange(0, BC)
    jm = j < Hc
    C2 = 2 * Hc
    bx = tl.load(b_ptr + j, mask=jm, other=0.0).to(tl.float32)[None, :]
    bg = tl.load(b_ptr + j + Hc, mask=jm, other=0.0).to(tl.float32)[None, :]
    x0l, x0c, x0r = _w3(w_ptr, j, jm, C2, 0)  # the value half's taps, kernel rows 0..2
    x1l, x1c, x1r = _w3(w_ptr, j, jm, C2, 1)
    x2l, x2c, x2r = _w3(w_ptr, j, jm, C2, 2)
    g0l, g0c, g0r = _w3(w_ptr, j + Hc, jm, C2, 0)  # the gate half's
    g1l, g1c, g1r = _w3(w_ptr, j + Hc, jm, C2, 1)
    g2l, g2c, g2r = _w3(w_ptr, j + Hc, jm, C2, 2)
    zero = tl.zeros((BW, BC), dtype=tl.float32)
    ax0, ag0, ax1, ag1 = zero, zero, zero, zero  # output rows r-1 and r (value, gate halves)
    # With PREFETCH the next input row's six loads are issued before this row's arithmetic, so their
    # latency hides behind it; without, each step waits for its own loads. STAGES > 1 hands the walk's
    # loads to Triton's software pipeliner: STAGES - 1 rows ahead are copied into shared memory
    # (cp.async), so more bytes are in flight a program without more registers (the walk is
    # latency-bound at 12 warps an SM: benchmarks/results/ncu_dw_rows_h100_s58.txt). The sums are the same.
    rv = x * 0 + (y0 - 1)  # the row as a vector (module comment: the interpreter's masks)
    pix = (b * H + y0 - 1) * W  # int64: the row's first pixel
    rin = (rv >= 0) & (rv < H)
    nlx, ncx, nrx = _row3(x_ptr, pix, x, rin, W, C2, j, jm)
    nlg, ncg, nrg = _row3(x_ptr, pix, x, rin, W, C2, j + Hc, jm)
    for t in tl.range(0, ROWS + 2, num_stages=STAGES):
        r = y0 - 1 + t
        rv = x * 0 + r
        pix = (b * H + r) * W
        if PREFETCH:
            lx, cx, rx, lg, cg, rg = nlx, ncx, nrx, nlg, ncg, nrg
            nin = (rv + 1 >= 0) & (rv + 1 < H) & (rv + 1 <= y0 + ROWS)  # the next step's row, if any
            nlx, ncx, nrx = _row3(x_ptr, pix + W, x, nin, W, C2, j, jm)
            nlg, ncg, nrg = _row3(x_ptr, pix + W, x, nin, W, C2, j + Hc, jm)
        else:
            rin = (rv >= 0) & (rv < H)
            lx, cx, rx = _row3(x_ptr, pix, x, rin, W, C2, j, jm)
            lg, cg, rg = _row3(x_ptr, pix, x, rin, W, C2, j + Hc, jm)
        ax0 = _taps3w(ax0, lx, cx, rx, x2l, x2c, x2r, FMA)
        ag0 = _taps3w(ag0, lg, cg, rg, g2l, g2c, g2r, FMA)
        # output row r-1 is complete: cuDNN stores the conv, aten adds the bias, then the GLU
        om = (rv - 1 >= y0) & (rv - 1 < H) & (x < W)  # no output row in the first two steps
        xb = _r(_r(ax0, o_ptr) + bx, o_ptr)
        gb = _r(_r(ag0, o_ptr) + bg, o_ptr)
        out = (xb * _r(_silu(gb), o_ptr)).to(o_ptr.dtype.element_ty)
        dst = (pix - W + x)[:, None] * Hc + j[None, :]
        tl.store(o_ptr + dst, out, mask=om[:, None] & jm[None, :])
        ax0 = _taps3w(ax1, lx, cx, rx, x1l, x1c, x1r, FMA)
        ag0 = _taps3w(ag1, lg, cg, rg, g1l, g1c, g1r, FMA)
        ax1 = _taps3w(zero, lx, cx, rx, x0l, x0c, x0r, FMA)
        ag1 = _taps3w(zero, lg, cg, rg, g0l, g0c, g0r, FMA)


def _walk_flags(rest: list, dtype: torch.dtype) -> tuple[bool, bool]:
    """A row walk's optional tile flags (prefetch the next row, taps as FMAs), True where left out.
    FMA only for bf16 and fp16, whose products fp32 holds exactly (_taps3w)."""
    prefetch, fma = (*map(bool, rest), True, True)[:2]
    return prefetch, fma and dtype in (torch.bfloat16, torch.float16)


def dw_rows_tile(height: int, batch: int) -> tuple[int, int, int, int, bool, bool, int]:
    """The default tile (rows, columns, channels, warps, prefetch, FMA taps, pipeline stages) for a grid
    `height` rows tall, `batch` images (CFG rows) deep: the whole height up to 32 rows a program, 16
    columns, 32 channels, 4 warps, the next row prefetched, each tap one FMA (_taps3w; bf16 and fp16
    only), and the loads pipelined 4 stages deep where the grid holds 64 image rows or more.

    Session 58's H100 sweep (benchmarks/results/fusion_kernels_dw_rows_stages_h100_80gb_hbm3.md, 41
    tiles at SANA-1.6B's shapes, every one eager's bits): 346 against 400 us at 1024², batch 8 (the
    job's), 182 against 211 at batch 4, 54 against 57 at batch 1, 56 against 59 at 512², batch 4, but
    17.7 against 14.8 at 512², batch 1 (32 image rows: too few programs to fill the card twice over).
    The geometry is session 41's H200 sweep's best at every shape (fusion_kernels_dw_rows_silu_dw_h200.md)."""
    stages = 4 if batch * height >= 64 else 1
    return min(32, triton.next_power_of_2(max(1, height))), 16, 32, 4, True, True, stages


def dwconv_glu_rows(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                    tile: tuple | None = None) -> torch.Tensor:
    """dwconv_glu(x, weight, bias, col_major=False)'s bits, walking rows: GLU(depthwise_conv3x3(x) +
    bias) for channels-last x [B, 2H, h, w] -> [B, H, h, w]. `tile` (rows, columns, channels, warps[,
    prefetch[, fma[, stages]]]) changes speed only."""
    _check(x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last), "x must be channels-last")
    B, C2, Hh, Ww = x.shape
    _check(weight.shape == (C2, 1, 3, 3) and weight.is_contiguous() and C2 % 2 == 0, "a 3x3 depthwise weight")
    _check(bias is not None and bias.shape == (C2,) and x.dtype == weight.dtype == bias.dtype, "bias, one dtype")
    out = torch.empty((B, C2 // 2, Hh, Ww), dtype=x.dtype, device=x.device, memory_format=torch.channels_last)
    rows, cols, bc, warps, *rest = tile or dw_rows_tile(Hh, B)
    prefetch, fma = _walk_flags(rest[:2], x.dtype)
    stages = int(rest[2]) if len(rest) > 2 else 1
    bw = min(cols, triton.next_power_of_2(Ww))
    nwb = triton.cdiv(Ww, bw)
    grid = (triton.cdiv(Hh, rows) * nwb, triton.cdiv(C2 // 2, bc), B)
    taps = weight.view(C2, 9).t().contiguous()  # [9, C2]: 200 KB at SANA-1.6B, a small copy a call
    _dw_glu_rows_kernel[grid](x, taps, bias, out, Hh, Ww, C2 // 2, nwb, ROWS=rows, BW=bw, BC=bc, PREFETCH=prefetch,
                              FMA=fma, STAGES=stages, num_warps=warps, **OPTS)
    return out


# -- GLUMBConv from the raw 1x1 conv output: bias + SiLU, depthwise 3x3, bias + GLU in one pass --
# Eager: cuDNN's 1x1 conv (stored), + bias (stored), SiLU (stored: the activation, 2 x hidden
# channels, written once and read back by the depthwise conv), the depthwise conv (stored), + bias
# (stored), x * silu(gate). Here the activation never leaves the program: a program owns ROWS
# output rows x BW columns x BC channels of both GLU halves and walks the input rows y0-1 ..
# y0+ROWS once, activating each loaded element once. Each input row feeds three output rows
# (ky = 2, 1, 0 for rows r-1, r, r+1): adding its taps to a rolling pair of accumulators in input
# row order sums every output's 9 taps row-major, cuDNN's order (DWCONV_GLU_ROWS, verified).
# The depthwise conv zero-pads the ACTIVATION: out-of-grid taps are 0, not silu(bias).
@triton.jit
def _act(v, m, bias, like_ptr):
    """silu(v + bias) as eager stores it, for v loaded raw: the bias add rounded, then SiLU rounded;
    0 outside m (the conv's padding)."""
    return tl.where(m, _r(_silu(_r(v.to(tl.float32) + bias, like_ptr)), like_ptr), 0.0)


@triton.jit
def _halo(jm, rinc, ch, x0, W, BW: tl.constexpr, RIGHT: tl.constexpr):
    """[BC]: where the tile's left (column x0 - 1) or right (x0 + BW) halo column has pixels."""
    col = ch * 0 + (x0 + BW if RIGHT else x0 - 1)
    return jm & rinc & (col >= 0) & (col < W)


@triton.jit
def _raw_row(y_ptr, pix, rin, rinc, x, xm, W, C2, ch, jm, x0, SHIFT_DOT: tl.constexpr, BW: tl.constexpr):
    """The raw input row whose first pixel is `pix`, as loaded (0 where masked): with SHIFT_DOT the
    row ([BW, BC]) and its tile's two halo columns ([BC] each), else the row at columns x-1, x, x+1.
    `rin` and `rinc` are the row-in-grid test as [BW] and [BC] vectors (Triton 3.9's interpreter
    cannot combine a scalar mask with a vector one)."""
    if SHIFT_DOT:
        c = tl.load(y_ptr + (pix + x)[:, None] * C2 + ch[None, :], mask=(rin & xm)[:, None] & jm[None, :], other=0.0)
        hl = tl.load(y_ptr + (pix + x0 - 1) * C2 + ch, mask=_halo(jm, rinc, ch, x0, W, BW, 0), other=0.0)
        hr = tl.load(y_ptr + (pix + x0 + BW) * C2 + ch, mask=_halo(jm, rinc, ch, x0, W, BW, 1), other=0.0)
        return hl, c, hr
    else:
        left = tl.load(y_ptr + (pix + x - 1)[:, None] * C2 + ch[None, :],
                       mask=(rin & (x >= 1) & (x - 1 < W))[:, None] & jm[None, :], other=0.0)
        c = tl.load(y_ptr + (pix + x)[:, None] * C2 + ch[None, :], mask=(rin & xm)[:, None] & jm[None, :], other=0.0)
        right = tl.load(y_ptr + (pix + x + 1)[:, None] * C2 + ch[None, :],
                        mask=(rin & (x + 1 < W))[:, None] & jm[None, :], other=0.0)
        return left, c, right


@triton.jit
def _act_row(raw_l, raw_c, raw_r, bias, rin, rinc, x, xm, W, ch, jm, x0, like_ptr, SHIFT_DOT: tl.constexpr,
             BW: tl.constexpr):
    """The activated row at columns x-1, x, x+1 ([BW, BC] each, fp32) from _raw_row's loads."""
    if SHIFT_DOT:
        # activate the row once and shift it by one column with 0/1 matrices on the tensor cores:
        # one product per output is nonzero, so the dot is exact (for finite activations)
        c = _act(raw_c, (rin & xm)[:, None] & jm[None, :], bias[None, :], like_ptr)
        i = tl.arange(0, BW)
        cl = c.to(like_ptr.dtype.element_ty)
        left = tl.dot((i[None, :] == i[:, None] - 1).to(like_ptr.dtype.element_ty), cl)
        right = tl.dot((i[None, :] == i[:, None] + 1).to(like_ptr.dtype.element_ty), cl)
        # the tile's two halo columns (0 outside the grid)
        hl = _act(raw_l, _halo(jm, rinc, ch, x0, W, BW, 0), bias, like_ptr)
        hr = _act(raw_r, _halo(jm, rinc, ch, x0, W, BW, 1), bias, like_ptr)
        left = tl.where((i == 0)[:, None], hl[None, :], left)
        right = tl.where((i == BW - 1)[:, None], hr[None, :], right)
    else:  # the three shifted rows, each activated (3x the SiLU work, no tensor cores)
        left = _act(raw_l, (rin & (x >= 1) & (x - 1 < W))[:, None] & jm[None, :], bias[None, :], like_ptr)
        c = _act(raw_c, (rin & xm)[:, None] & jm[None, :], bias[None, :], like_ptr)
        right = _act(raw_r, (rin & (x + 1 < W))[:, None] & jm[None, :], bias[None, :], like_ptr)
    return left, c, right


@triton.jit
def _silu_dw_glu_kernel(y_ptr, bi_ptr, w_ptr, bd_ptr, o_ptr, H, W, Hc, NWB, ROWS: tl.constexpr,
                        BW: tl.constexpr, BC: tl.constexpr, SHIFT_DOT: tl.constexpr, PREFETCH: tl.constexpr,
                        FMA: tl.constexpr):
    # y: raw conv_inverted output [B, 2Hc, H, W] channels-last; bi: its bias [2Hc]
    # w: the depthwise weight as [9, 2Hc] (tap-major); bd: its bias [2Hc]; o: [B, Hc, H, W] channels-last
    b = tl.program_id(2).to(tl.int64)
    y0 = (tl.program_id(0) // NWB) * ROWS
    x0 = (tl.program_id(0) % NWB) * BW
    x = x0 + tl.arange(0, BW)
    xm = x < W
    j = tl.program_id(1) * BC + tl.arange(0, BC)
    jm = j < Hc
    C2 = 2 * Hc
    bx = tl.load(bd_ptr + j, mask=jm, other=0.0).to(tl.float32)[None, :]
    bg = tl.load(bd_ptr + j + Hc, mask=jm, other=0.0).to(tl.float32)[None, :]
    ix = tl.load(bi_ptr + j, mask=jm, other=0.0).to(tl.float32)  # conv_inverted's bias, value half
    ig = tl.load(bi_ptr + j + Hc, mask=jm, other=0.0).to(tl.float32)
    x0l, x0c, x0r = _w3(w_ptr, j, jm, C2, 0)  # the value half's taps, kernel rows 0..2
    x1l, x1c, x1r = _w3(w_ptr, j, jm, C2, 1)
    x2l, x2c, x2r = _w3(w_ptr, j, jm, C2, 2)
    g0l, g0c, g0r = _w3(w_ptr, j + Hc, jm, C2, 0)  # the gate half's
    g1l, g1c, g1r = _w3(w_ptr, j + Hc, jm, C2, 1)
    g2l, g2c, g2r = _w3(w_ptr, j + Hc, jm, C2, 2)
    zero = tl.zeros((BW, BC), dtype=tl.float32)
    ax0, ag0, ax1, ag1 = zero, zero, zero, zero  # output rows r-1 and r (value, gate halves)
    # With PREFETCH the next input row's raw loads are issued before this row's arithmetic (the
    # activation, the taps, the GLU), so their latency hides behind it. The sums are the same.
    rv = x * 0 + (y0 - 1)
    pix = (b * H + y0 - 1) * W  # int64: the row's first pixel
    rin = (rv >= 0) & (rv < H)
    rinc = (j * 0 + y0 - 1 >= 0) & (j * 0 + y0 - 1 < H)
    nxl, nxc, nxr = _raw_row(y_ptr, pix, rin, rinc, x, xm, W, C2, j, jm, x0, SHIFT_DOT, BW)
    ngl, ngc, ngr = _raw_row(y_ptr, pix, rin, rinc, x, xm, W, C2, j + Hc, jm, x0, SHIFT_DOT, BW)
    for t in range(ROWS + 2):
        r = y0 - 1 + t
        rv = x * 0 + r
        rin = (rv >= 0) & (rv < H)
        rc = j * 0 + r
        rinc = (rc >= 0) & (rc < H)
        pix = (b * H + r) * W
        if PREFETCH:
            pxl, pxc, pxr, pgl, pgc, pgr = nxl, nxc, nxr, ngl, ngc, ngr
            nin = (rv + 1 >= 0) & (rv + 1 < H) & (rv + 1 <= y0 + ROWS)  # the next step's row, if any
            ninc = (rc + 1 >= 0) & (rc + 1 < H) & (rc + 1 <= y0 + ROWS)
            nxl, nxc, nxr = _raw_row(y_ptr, pix + W, nin, ninc, x, xm, W, C2, j, jm, x0, SHIFT_DOT, BW)
            ngl, ngc, ngr = _raw_row(y_ptr, pix + W, nin, ninc, x, xm, W, C2, j + Hc, jm, x0, SHIFT_DOT, BW)
        else:
            pxl, pxc, pxr = _raw_row(y_ptr, pix, rin, rinc, x, xm, W, C2, j, jm, x0, SHIFT_DOT, BW)
            pgl, pgc, pgr = _raw_row(y_ptr, pix, rin, rinc, x, xm, W, C2, j + Hc, jm, x0, SHIFT_DOT, BW)
        lx, cx, rx = _act_row(pxl, pxc, pxr, ix, rin, rinc, x, xm, W, j, jm, x0, y_ptr, SHIFT_DOT, BW)
        lg, cg, rg = _act_row(pgl, pgc, pgr, ig, rin, rinc, x, xm, W, j + Hc, jm, x0, y_ptr, SHIFT_DOT, BW)
        ax0 = _taps3w(ax0, lx, cx, rx, x2l, x2c, x2r, FMA)
        ag0 = _taps3w(ag0, lg, cg, rg, g2l, g2c, g2r, FMA)
        # output row r-1 is complete: cuDNN stores the conv, aten adds the bias, then the GLU
        om = (rv - 1 >= y0) & (rv - 1 < H) & xm  # no output row in the first two steps
        xb = _r(_r(ax0, o_ptr) + bx, o_ptr)
        gb = _r(_r(ag0, o_ptr) + bg, o_ptr)
        out = (xb * _r(_silu(gb), o_ptr)).to(o_ptr.dtype.element_ty)
        dst = (pix - W + x)[:, None] * Hc + j[None, :]
        tl.store(o_ptr + dst, out, mask=om[:, None] & jm[None, :])
        ax0 = _taps3w(ax1, lx, cx, rx, x1l, x1c, x1r, FMA)
        ag0 = _taps3w(ag1, lg, cg, rg, g1l, g1c, g1r, FMA)
        ax1 = _taps3w(zero, lx, cx, rx, x0l, x0c, x0r, FMA)
        ag1 = _taps3w(zero, lg, cg, rg, g0l, g0c, g0r, FMA)


SILU_DW_TILE = (8, 16, 32, 4, True, True)
"""rows, columns (at most: a narrower grid takes the next power of 2, 16 or more), channels, warps,
shift by dot, prefetch the next row (session 41: the taps hoisted out of the walk and the next row's
loads issued early; the sweep below was before it). The H200 sweep's best at SANA-1.6B's 32x32 (207 us
a call, kernel alone) and within 4% of the best at 16x16 (benchmarks/results/fusion_kernels_silu_dw_h200.md);
still slower than cuDNN's pair, so bcg/fusions/sana.py leaves the op off by default."""


def silu_dwconv_glu(y: torch.Tensor, b_inv: torch.Tensor, w_dw: torch.Tensor, b_dw: torch.Tensor,
                    tile: tuple | None = None) -> torch.Tensor:
    """GLU(depthwise_conv3x3(silu(y + b_inv)) + b_dw) for the raw (bias-less) channels-last conv
    output y [B, 2H, h, w] -> [B, H, h, w] channels-last. `tile` changes speed only."""
    _check(y.dim() == 4 and y.is_contiguous(memory_format=torch.channels_last), "y must be channels-last")
    # fp32: the taps' products are not exact, so the sum's FMA contraction would decide the bits
    _check(y.dtype in (torch.bfloat16, torch.float16), "bf16 or fp16 (fp32 products are not exact)")
    B, C2, Hh, Ww = y.shape
    _check(C2 % 2 == 0 and w_dw.shape == (C2, 1, 3, 3) and w_dw.is_contiguous(), "a 3x3 depthwise weight")
    _check(all(t is not None and t.shape == (C2,) and t.is_contiguous() for t in (b_inv, b_dw)), "both biases [C]")
    _check(y.dtype == b_inv.dtype == w_dw.dtype == b_dw.dtype, "one dtype")
    out = torch.empty((B, C2 // 2, Hh, Ww), dtype=y.dtype, device=y.device, memory_format=torch.channels_last)
    rows, cols, bc, warps, dot, *rest = tile or SILU_DW_TILE
    prefetch, fma = _walk_flags(rest, y.dtype)
    bw = min(cols, max(16, triton.next_power_of_2(Ww)))  # tl.dot wants 16 or more
    nwb = triton.cdiv(Ww, bw)
    grid = (triton.cdiv(Hh, rows) * nwb, triton.cdiv(C2 // 2, bc), B)
    taps = w_dw.view(C2, 9).t().contiguous()  # [9, C2]: each tap's channels contiguous (vector loads)
    _silu_dw_glu_kernel[grid](y, b_inv, taps, b_dw, out, Hh, Ww, C2 // 2, nwb, ROWS=rows, BW=bw, BC=bc,
                              SHIFT_DOT=bool(dot), PREFETCH=prefetch, FMA=fma, num_warps=warps,
                              **OPTS)
    return out

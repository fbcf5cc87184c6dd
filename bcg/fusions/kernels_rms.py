"""RMSNorm in aten's reduction orders, and the chains that follow it (Triton; GPU or Triton's CPU
interpreter).

Two RMSNorms reach these models, and aten reduces them in two orders:
- diffusers' `RMSNorm` (Z-Image, Qwen-Image, SANA's caption norm, SANA-Video's q/k, LTX-2's block
  norms, most without a weight): eager's
  `x.float().pow(2).mean(-1, keepdim=True)` is aten's CUDA mean kernel (Reduce.cuh), reproduced
  here for rows of a multiple of 128 (`row_variance`, in candidate orders `VAR_MODES`; `mean_sq_rows`
  for a kernel that normalises the row it just reduced). On the H200 (torch 2.11) `vec_dec` equals
  aten's mean for rows of 3840 and of 128 (benchmarks/results/gpu_fusions_z_image_tests_h200.txt).
  The last resort, `rms_sq`, writes the fp32 squares eager's `x.float().pow(2)` writes and aten's
  `.mean(-1, keepdim=True)` reduces them (same op, shape and strides: same bits).
- `torch.nn.RMSNorm` (Flux's and LongCat's q/k, Wan's and LTX-2's q/k across heads) is `F.rms_norm`, on CUDA
  aten's fused `_fused_rms_norm`, the LayerNorm kernel's RMS variant (layer_norm_kernel.cu): 128
  threads a row, each summing the squares of its 4-wide vectors t, t + 128, ... in order (FMAs as
  nvcc contracts `sigma2 + x * x`), a shuffle-down tree within each warp, the 4 warps pairwise, then
  `rstd = rsqrtf(sum / N + eps)` and `y = w * (rstd * x)`, rounded once. `fused_rms_rstd` models that
  order; it is NOT proven on a GPU yet (the verifier compares it with F.rms_norm on first sight, and
  the chains fall back to aten's norm + the rest fused when it differs).

Same rounding plan as kernels.py (fp32 arithmetic, a rounding `_r` wherever eager stores a tensor,
no FMA contraction, `OPTS`). After diffusers' mean the kernels do:

    rstd = rsqrt(var + eps)             libdevice rsqrt (equal to torch.rsqrt on the H200), or
                                        aten's tensor when RSTD_IN_KERNEL is False
    n    = _r(_r(x * rstd) * weight)    `hidden_states.to(weight.dtype) * weight`; without a weight
                                        `_r(x * rstd)`, `hidden_states.to(input_dtype)`
    ...  the modulation (`* scale`, adaLN's `* (1 + scale) + shift`), gate and residual that follow,
         each rounded where eager stores.
"""

from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from .applicable import check as _check
from .kernels import OPTS, _r

RSTD_IN_KERNEL = True
"""rsqrt(var + eps) in the kernel (libdevice) rather than two aten kernels on the [rows, 1] variance."""

BLOCK = 1024


@triton.jit
def _rstd(v, eps, RSTD: tl.constexpr):
    if RSTD:  # v already holds aten's rsqrt(var + eps)
        return v
    return libdevice.rsqrt(v + eps)


# -- x.float().pow(2): what aten's mean reduces --------------------------------------------------
@triton.jit
def _sq_kernel(x_ptr, o_ptr, numel, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offs < numel
    x = tl.load(x_ptr + offs, mask=m).to(tl.float32)
    tl.store(o_ptr + offs, x * x, mask=m)


def rms_sq(x: torch.Tensor) -> torch.Tensor:
    """x.float().pow(2) for a dense x of any order of dimensions (a contiguous one, or DC-AE's
    `movedim(1, -1)` view of a contiguous image), with the strides eager's kernels give it (x's), so
    that aten's mean over it reduces the very tensor eager's mean reduces."""
    out = torch.empty_like(x, dtype=torch.float32)  # preserve_format: x's strides where x is dense
    _check(out.stride() == x.stride(), "x must be dense (contiguous up to an order of its dimensions)")
    n = x.numel()
    _sq_kernel[(triton.cdiv(n, BLOCK),)](x, out, n, BLOCK=BLOCK, **OPTS)
    return out


def rstd_input(var: torch.Tensor, eps: float) -> torch.Tensor:
    """What the kernels read as `v`: the variance, or aten's rsqrt(var + eps) when RSTD_IN_KERNEL is off."""
    return var if RSTD_IN_KERNEL else torch.rsqrt(var + eps)


# -- RMSNorm's variance in aten's reduction order ---------------------------------------------------
# aten's mean of a contiguous fp32 [M, L] over L (Reduce.cuh, MeanOps, 512 threads): one warp per row
# when M >= 16 and L / 32 < 256 (no split across warps or blocks). Each lane keeps 4 accumulators:
#   vectorized (L >= 128, 4-wide loads; older torch: L > 128): lane l, accumulator i sums, in order,
#       x²[(j * 32 + l) * 4 + i] for j = 0 .. L / 128 - 1
#   strided (unvectorized, L = 128): accumulator i holds x²[l + 32 i]
# then ((a0 + a1) + a2) + a3, a shuffle-down tree over the 32 lanes (offsets 16, 8, .., 1 in newer
# torch; 1, 2, .., 16 in older), and `sum * factor`, factor = float(M) / float(M * L) in fp32.
VAR_MODES = ("vec_dec", "vec_inc", "strided_dec", "strided_inc")


@triton.jit
def lane_tree(t, ROWS: tl.constexpr, W: tl.constexpr, DEC: tl.constexpr):
    # t [ROWS, W] summed over W as lane 0 of a warp's shuffle-down reduction
    if DEC:  # offset W/2 first: lane l += lane l + W/2
        a, b = tl.split(tl.permute(tl.reshape(t, (ROWS, 2, W // 2)), (0, 2, 1)))
    else:  # offset 1 first: lane 2k += lane 2k + 1
        a, b = tl.split(tl.reshape(t, (ROWS, W // 2, 2)))
    return a + b


@triton.jit
def _sq4(base, j, lane, c4, m):
    # x² of the [ROWS, 32, 4] tile of step j: lane l's 4 contiguous elements (j * 32 + l) * 4 + i
    v = tl.load(base[:, None, None] + ((j * 32 + lane) * 4)[None, :, None] + c4[None, None, :], mask=m,
                other=0.0).to(tl.float32)
    return v * v


@triton.jit
def mean_sq_rows(x_ptr, base, rm, L: tl.constexpr, ROWS: tl.constexpr):
    """aten's `x.float().pow(2).mean(-1)` reduction in the `vec_dec` order (the one the H200 runs) for
    ROWS rows of L (a multiple of 128) at element offsets `base` [ROWS], before the `* factor`."""
    lane = tl.arange(0, 32)
    c4 = tl.arange(0, 4)
    m = rm[:, None, None] & (lane < 32)[None, :, None] & (c4 < 4)[None, None, :]
    acc = tl.zeros((ROWS, 32, 4), dtype=tl.float32)
    for j in tl.static_range(L // 128):
        acc = acc + _sq4(x_ptr + base, j, lane, c4, m)
    even, odd = tl.split(tl.reshape(acc, (ROWS, 32, 2, 2)))
    a0, a2 = tl.split(even)
    a1, a3 = tl.split(odd)
    t = ((a0 + a1) + a2) + a3
    t = lane_tree(t, ROWS, 32, True)
    t = lane_tree(t, ROWS, 16, True)
    t = lane_tree(t, ROWS, 8, True)
    t = lane_tree(t, ROWS, 4, True)
    t = lane_tree(t, ROWS, 2, True)
    return tl.reshape(t, (ROWS,))


THREADS = 128  # aten's LayerNorm / RMSNorm block: 32 lanes x 4 warps (num_threads())


@triton.jit
def fused_rms_rstd(x_ptr, base, L, eps, ROUNDS: tl.constexpr, SQ_FMA: tl.constexpr, EXPLICIT: tl.constexpr):
    """rsqrt(sum(x^2) / L + eps) for one row of L (a multiple of 4) at `base`, in the modelled order
    of aten's `_fused_rms_norm` (module docstring). Run with num_warps=4: the [128] partial sums are
    one per thread, so Triton's tree reduction (butterflies within each warp, then the 4 warps'
    partials 2, 1: kernels_norm.py found it to merge as aten's shuffle-down does) is aten's; EXPLICIT
    spells that tree out instead (the same order whatever the layout: Triton's CPU interpreter sums
    in its own order otherwise)."""
    t = tl.arange(0, 128)
    s = tl.zeros((128,), tl.float32)
    nvec = L // 4
    for k in tl.static_range(ROUNDS):  # thread t's vectors t, t + 128, ..., in order
        v = t + k * 128
        vm = v < nvec
        for ii in tl.static_range(4):
            x = tl.load(x_ptr + base + v * 4 + ii, mask=vm, other=0.0).to(tl.float32)
            if SQ_FMA:
                s = tl.fma(x, x, s)
            else:
                s = s + x * x
    if EXPLICIT:
        w = tl.reshape(s, (4, 32))
        w = lane_tree(w, 4, 32, True)
        w = lane_tree(w, 4, 16, True)
        w = lane_tree(w, 4, 8, True)
        w = lane_tree(w, 4, 4, True)
        w = lane_tree(w, 4, 2, True)
        w = tl.reshape(w, (1, 4))
        w = lane_tree(w, 1, 4, True)  # warp w takes warp w + 2
        w = lane_tree(w, 1, 2, True)  # then warp 0 takes warp 1
        total = tl.sum(tl.reshape(w, (1,)), axis=0)
    else:
        total = tl.sum(s, axis=0)
    return tl.rsqrt(tl.div_rn(total, L.to(tl.float32)) + eps)  # c10::cuda::compat::rsqrt, as kernels_norm's RSQ 0


@triton.jit
def _row_var_kernel(x_ptr, o_ptr, M, factor, L: tl.constexpr, VEC: tl.constexpr, DEC: tl.constexpr,
                    ROWS: tl.constexpr, UNROLL: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    rm = rows < M
    lane = tl.arange(0, 32)
    base = x_ptr + rows.to(tl.int64) * L
    if VEC:
        # One [ROWS, 32, 4] load a step (8-byte vectors in bf16, coalesced across lanes); the four
        # accumulators are the last axis, each summed in its lane's order.
        c4 = tl.arange(0, 4)
        m = rm[:, None, None] & (lane < 32)[None, :, None] & (c4 < 4)[None, None, :]
        acc = tl.zeros((ROWS, 32, 4), dtype=tl.float32)
        if UNROLL:  # every step's load issued up front: a program's loads overlap
            for j in tl.static_range(L // 128):
                acc = acc + _sq4(base, j, lane, c4, m)
        else:
            for j in range(L // 128):
                acc = acc + _sq4(base, j, lane, c4, m)
        even, odd = tl.split(tl.reshape(acc, (ROWS, 32, 2, 2)))  # i = 2 * a + b: even holds i = 0, 2
        a0, a2 = tl.split(even)
        a1, a3 = tl.split(odd)
    else:
        m = rm[:, None] & (lane < 32)[None, :]
        p = base[:, None] + lane[None, :]
        v0 = tl.load(p, mask=m, other=0.0).to(tl.float32)
        v1 = tl.load(p + 32, mask=m, other=0.0).to(tl.float32)
        v2 = tl.load(p + 64, mask=m, other=0.0).to(tl.float32)
        v3 = tl.load(p + 96, mask=m, other=0.0).to(tl.float32)
        a0 = v0 * v0
        a1 = v1 * v1
        a2 = v2 * v2
        a3 = v3 * v3
    t = ((a0 + a1) + a2) + a3
    t = lane_tree(t, ROWS, 32, DEC)
    t = lane_tree(t, ROWS, 16, DEC)
    t = lane_tree(t, ROWS, 8, DEC)
    t = lane_tree(t, ROWS, 4, DEC)
    t = lane_tree(t, ROWS, 2, DEC)
    tl.store(o_ptr + rows, tl.reshape(t, (ROWS,)) * factor, mask=rm)


VAR_TILE = {"vec": (2, 1, True), "strided": (64, 1, False)}
"""(rows a program, warps, unroll the row loop) per order family, the fastest bit-exact tiles of
`bench_fusion_kernels.py --only row_var` on the H200 (results/fusion_kernels_row_var_h200.md), in
CUDA graphs: rows of 3840 (Z-Image 1024², 4,192 rows) 5.7 us a call, against 21.8 us for 16 rows a
program and 102 us for aten's pow + mean; rows of 128 (q/k norms, 125,760 rows) 18.6 us against 29.2
for 16 rows and 4 warps. Every tile sums in the same order: only the loads and the grid change."""


def row_variance(x: torch.Tensor, mode: str, tile: tuple | None = None) -> torch.Tensor:
    """`x.float().pow(2).mean(-1, keepdim=True)` in aten's CUDA reduction order `mode` (VAR_MODES)."""
    _check(x.is_contiguous() and x.dim() >= 2, "x must be contiguous")
    L = x.shape[-1]
    M = x.numel() // L
    _check(M >= 16, "fewer than 16 rows: aten's block is no longer one warp a row")
    vec = mode.startswith("vec")
    if vec:
        _check(L % 128 == 0 and L < 8192, "vectorized rows: a multiple of 128, under 8192 (one warp a row)")
    else:
        _check(L == 128, "the unvectorized order is modelled for rows of 128")
    out = torch.empty((*x.shape[:-1], 1), dtype=torch.float32, device=x.device)
    factor = float(np.float32(M) / np.float32(M * L))  # aten: static_cast<float>(outputs) / numel
    rows, warps, unroll = tile or VAR_TILE["vec" if vec else "strided"]
    _row_var_kernel[(triton.cdiv(M, rows),)](x, out, M, factor, L=L, VEC=vec, DEC=mode.endswith("dec"),
                                             ROWS=rows, UNROLL=unroll, num_warps=warps, **OPTS)
    return out


def _tile(D: int) -> tuple[int, int]:
    """(rows, columns) of a program's tile over [M, D]: ~2048 elements, columns a power of two."""
    bd = 256 if D % 256 == 0 else min(256, triton.next_power_of_2(D))
    return max(1, 2048 // bd), bd


def _bcast(t: torch.Tensor | None, B: int, D: int) -> tuple:
    """A [B or 1, 1, D] modulation tensor as (tensor, batch stride, column stride)."""
    if t is None:
        return None, 0, 0
    _check(t.dim() == 3 and t.shape[1] == 1 and t.shape[2] == D and t.shape[0] in (1, B),
           "scale/gate must broadcast over tokens: [B or 1, 1, D]")
    e = t.expand(B, 1, D)
    return e, e.stride(0), e.stride(2)


# -- RMSNorm, then its modulation: Z-Image's `* scale`, or adaLN's `* (1 + scale) + shift` --------------
MOD_NONE, MOD_SCALE, MOD_ADALN = 0, 1, 2


@triton.jit
def _rms_mod_kernel(x_ptr, v_ptr, w_ptr, s_ptr, t_ptr, o_ptr, M, D, ROWS_PER_B, s_sb, s_sd, t_sb, t_sd, eps,
                    HAS_W: tl.constexpr, MOD: tl.constexpr, RSTD: tl.constexpr, ROWS: tl.constexpr,
                    BD: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.program_id(1) * BD + tl.arange(0, BD)
    rm = rows < M
    cm = cols < D
    m = rm[:, None] & cm[None, :]
    off = rows.to(tl.int64)[:, None] * D + cols[None, :]
    x = tl.load(x_ptr + off, mask=m).to(tl.float32)
    r = _rstd(tl.load(v_ptr + rows, mask=rm, other=1.0), eps, RSTD)
    y = _r(x * r[:, None], o_ptr)  # `.to(input_dtype)` (no weight) or `.to(weight.dtype)`
    if HAS_W:
        w = tl.load(w_ptr + cols, mask=cm).to(tl.float32)
        y = _r(y * w[None, :], o_ptr)
    b = rows // ROWS_PER_B
    if MOD == 1:  # Z-Image: `* scale`, its `1 + scale` made by the caller
        s = tl.load(s_ptr + b[:, None] * s_sb + cols[None, :] * s_sd, mask=m).to(tl.float32)
        y = y * s
    elif MOD == 2:  # adaLN: `* (1 + scale) + shift`, each op rounded where eager stores it
        s = tl.load(s_ptr + b[:, None] * s_sb + cols[None, :] * s_sd, mask=m).to(tl.float32)
        t = tl.load(t_ptr + b[:, None] * t_sb + cols[None, :] * t_sd, mask=m).to(tl.float32)
        y = _r(y * _r(s + 1.0, o_ptr), o_ptr) + t
    tl.store(o_ptr + off, y.to(o_ptr.dtype.element_ty), mask=m)


def _rms_mod(x: torch.Tensor, var: torch.Tensor, weight: torch.Tensor | None, eps: float, mod: int,
             scale: torch.Tensor | None, shift: torch.Tensor | None) -> torch.Tensor:
    _check(x.dim() == 3 and x.is_contiguous() and var.is_contiguous() and var.numel() == x.numel() // x.shape[-1],
           "x must be a contiguous [B, N, D], var one value a row")
    B, N, D = x.shape
    _check(weight is None or (weight.shape == (D,) and weight.dtype == x.dtype and weight.is_contiguous()),
           "weight must be a contiguous [D] of x's dtype")
    _check(all(t is None or t.dtype == x.dtype for t in (scale, shift)), "scale / shift must have x's dtype")
    s, s_sb, s_sd = _bcast(scale, B, D)
    t, t_sb, t_sd = _bcast(shift, B, D)
    out = torch.empty_like(x)
    M = B * N
    rows, bd = _tile(D)
    grid = (triton.cdiv(M, rows), triton.cdiv(D, bd))
    _rms_mod_kernel[grid](x, var, weight if weight is not None else x, s if s is not None else x,
                          t if t is not None else x, out, M, D, N, s_sb, s_sd, t_sb, t_sd, eps,
                          HAS_W=weight is not None, MOD=mod, RSTD=not RSTD_IN_KERNEL, ROWS=rows, BD=bd, **OPTS)
    return out


def rms_scale(x: torch.Tensor, var: torch.Tensor, weight: torch.Tensor, eps: float,
              scale: torch.Tensor | None) -> torch.Tensor:
    """x [B, N, D] contiguous, var [B, N, 1] (rstd_input of x's variance), weight [D], scale [B|1, 1, D]."""
    _check(weight is not None, "Z-Image's norms have a weight")
    return _rms_mod(x, var, weight, eps, MOD_NONE if scale is None else MOD_SCALE, scale, None)


def rms_adaln(x: torch.Tensor, var: torch.Tensor, weight: torch.Tensor | None, eps: float,
              scale: torch.Tensor | None, shift: torch.Tensor | None) -> torch.Tensor:
    """RMSNorm(x) [* (1 + scale) + shift] for x [B, N, D] contiguous, var [B, N, 1] (rstd_input of x's
    variance), weight [D] or None (an RMSNorm without affine), scale and shift [B|1, 1, D] (both or neither)."""
    _check((scale is None) == (shift is None), "scale comes with shift")
    return _rms_mod(x, var, weight, eps, MOD_NONE if scale is None else MOD_ADALN, scale, shift)


# -- residual: x + gate * RMSNorm(y); optionally the next norm's squares of the result ---------------
@triton.jit
def _rms_residual_kernel(x_ptr, y_ptr, v_ptr, w_ptr, g_ptr, o_ptr, M, D, ROWS_PER_B, g_sb, g_sd, eps,
                         HAS_GATE: tl.constexpr, RSTD: tl.constexpr, ROWS: tl.constexpr, BD: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.program_id(1) * BD + tl.arange(0, BD)
    rm = rows < M
    cm = cols < D
    m = rm[:, None] & cm[None, :]
    off = rows.to(tl.int64)[:, None] * D + cols[None, :]
    y = tl.load(y_ptr + off, mask=m).to(tl.float32)
    r = _rstd(tl.load(v_ptr + rows, mask=rm, other=1.0), eps, RSTD)
    w = tl.load(w_ptr + cols, mask=cm).to(tl.float32)
    n = _r(_r(y * r[:, None], o_ptr) * w[None, :], o_ptr)
    if HAS_GATE:
        b = rows // ROWS_PER_B
        g = tl.load(g_ptr + b[:, None] * g_sb + cols[None, :] * g_sd, mask=m).to(tl.float32)
        n = _r(g * n, o_ptr)
    x = tl.load(x_ptr + off, mask=m).to(tl.float32)
    out = _r(x + n, o_ptr)
    tl.store(o_ptr + off, out.to(o_ptr.dtype.element_ty), mask=m)


def rms_residual(x: torch.Tensor, gate: torch.Tensor | None, y: torch.Tensor, var: torch.Tensor,
                 weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x + gate * RMSNorm(y) for x, y [B, N, D] contiguous; var: rstd_input of y's variance."""
    _check(x.dim() == 3 and x.is_contiguous() and y.is_contiguous() and y.shape == x.shape
           and var.is_contiguous(), "x and y must be contiguous [B, N, D]")
    B, N, D = x.shape
    _check(y.dtype == x.dtype and weight.shape == (D,) and weight.dtype == x.dtype, "one dtype, weight [D]")
    _check(gate is None or gate.dtype == x.dtype, "gate must have x's dtype")
    g, g_sb, g_sd = _bcast(gate, B, D)
    out = torch.empty_like(x)
    M = B * N
    rows, bd = _tile(D)
    grid = (triton.cdiv(M, rows), triton.cdiv(D, bd))
    _rms_residual_kernel[grid](x, y, var, weight, g if g is not None else x, out, M, D, N, g_sb, g_sd, eps,
                               HAS_GATE=g is not None, RSTD=not RSTD_IN_KERNEL, ROWS=rows, BD=bd, **OPTS)
    return out


# -- the GPU test's probes -------------------------------------------------------------------------
@triton.jit
def _rsqrt_kernel(x_ptr, o_ptr, numel, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offs < numel
    tl.store(o_ptr + offs, libdevice.rsqrt(tl.load(x_ptr + offs, mask=m)), mask=m)


def rsqrt(x: torch.Tensor) -> torch.Tensor:
    """libdevice's rsqrt of a contiguous fp32 tensor (to compare with torch.rsqrt)."""
    out = torch.empty_like(x)
    _rsqrt_kernel[(triton.cdiv(x.numel(), BLOCK),)](x, out, x.numel(), BLOCK=BLOCK, **OPTS)
    return out

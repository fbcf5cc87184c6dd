"""Activations of the feed-forwards (Triton): SwiGLU, and GELU-tanh written into its place in a
concatenation (Flux's single-stream block: `torch.cat([attn_output, gelu(proj_mlp(x))], dim=2)`
in one kernel).

GELU-tanh as aten's CUDA kernel computes it (ActivationGeluKernel.cu), in fp32:

    kBeta  = float(M_SQRT2 * M_2_SQRTPI * 0.5)      (a double product, rounded once)
    kKappa = float(0.044715)
    inner  = kBeta * (x + kKappa * ((x * x) * x))   nvcc contracts `x + kKappa * x_cube` to an FMA
    y      = (0.5 * x) * (1 + tanhf(inner))         tanhf: libdevice's __nv_tanhf

`GELU_FMA` False spells the inner sum without the FMA (the verifier keeps whichever equals eager;
neither is proven on a GPU yet). SiLU is kernels._silu (libdevice expf and an IEEE division,
proven on the H200 by SANA's chains).
"""

from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from .applicable import check as _check
from .kernels import OPTS, _r, _silu

BLOCK = 1024
K_BETA = float(np.float32(1.41421356237309504880 * 1.12837916709551257390 * 0.5))  # M_SQRT2 * M_2_SQRTPI * 0.5
K_KAPPA = float(np.float32(0.044715))


@triton.jit
def gelu_tanh(x, GELU_FMA: tl.constexpr):
    cube = (x * x) * x
    if GELU_FMA:
        inner = tl.fma(K_KAPPA_C, cube, x) * K_BETA_C
    else:
        inner = (x + K_KAPPA_C * cube) * K_BETA_C
    return (0.5 * x) * (1.0 + libdevice.tanh(inner))


K_BETA_C = tl.constexpr(K_BETA)
K_KAPPA_C = tl.constexpr(K_KAPPA)


# -- [first | gelu(x)] along the last dim -------------------------------------------------------
@triton.jit
def _gelu_cat_kernel(a_ptr, x_ptr, o_ptr, S, a_sb, a_ss, DA, DX, GELU_FMA: tl.constexpr,
                     BLOCK: tl.constexpr):
    # one program: BLOCK columns of one token row of out [B * S, DA + DX]
    row = tl.program_id(1).to(tl.int64)
    cols = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    W = DA + DX
    in_a = cols < DA
    in_x = (cols >= DA) & (cols < W)
    a = tl.load(a_ptr + (row // S) * a_sb + (row % S) * a_ss + cols, mask=in_a, other=0.0)
    x = tl.load(x_ptr + row * DX + (cols - DA), mask=in_x, other=0.0).to(tl.float32)
    y = tl.where(in_a, a.to(tl.float32), gelu_tanh(x, GELU_FMA))
    tl.store(o_ptr + row * W + cols, y.to(o_ptr.dtype.element_ty), mask=cols < W)


def gelu_cat(first: torch.Tensor | None, x: torch.Tensor, gelu_fma: bool = True) -> torch.Tensor:
    """torch.cat([first, gelu_tanh(x)], dim=-1) for x [B, S, DX] contiguous and first [B, S, DA] (its
    last dim contiguous; any token and batch strides) or None (gelu_tanh(x) alone)."""
    _check(x.dim() == 3 and x.is_contiguous() and x.dtype in (torch.bfloat16, torch.float16, torch.float32),
           "x must be a contiguous [B, S, D] of a float dtype")
    B, S, DX = x.shape
    if first is not None:
        _check(first.dim() == 3 and first.shape[:2] == (B, S) and first.stride(2) == 1 and first.dtype == x.dtype,
               "first must be [B, S, D] of x's dtype, its last dim contiguous")
    DA = 0 if first is None else first.shape[2]
    a = x if first is None else first
    out = torch.empty((B, S, DA + DX), dtype=x.dtype, device=x.device)
    grid = (triton.cdiv(DA + DX, BLOCK), B * S)
    _gelu_cat_kernel[grid](a, x, out, S, a.stride(0), a.stride(1), DA, DX, GELU_FMA=gelu_fma, BLOCK=BLOCK, **OPTS)
    return out


# -- SwiGLU: silu(x1) * x3 ------------------------------------------------------------------------
@triton.jit
def _swiglu_kernel(a_ptr, b_ptr, o_ptr, numel, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offs < numel
    a = tl.load(a_ptr + offs, mask=m).to(tl.float32)
    b = tl.load(b_ptr + offs, mask=m).to(tl.float32)
    tl.store(o_ptr + offs, (_r(_silu(a), o_ptr) * b).to(o_ptr.dtype.element_ty), mask=m)


def swiglu(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    _check(a.is_contiguous() and b.is_contiguous() and a.shape == b.shape and a.dtype == b.dtype,
           "a and b must be contiguous, one shape and dtype")
    out = torch.empty_like(a)
    n = a.numel()
    _swiglu_kernel[(triton.cdiv(n, BLOCK),)](a, b, out, n, BLOCK=BLOCK, **OPTS)
    return out

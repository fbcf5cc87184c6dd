"""SANA's linear attention in two Triton kernels, its two fp32 products in cuBLAS's summation order.

Eager (SanaLinearAttnProcessor2_0) runs, per head of C = 32 channels:

    scores = pad(v, ones row) @ relu(k)        [C + 1, N] @ [N, C]   fp32, cuBLAS (FFMA tiles)
    hs     = scores @ relu(q)                  [C + 1, C] @ [C, N]   fp32, cuBLAS
    out    = hs[:C] / (hs[C] + eps)            -> the storage dtype, memory [B, D, N]

with q, k and v first made fp32 and laid out for the products (ops.LINEAR_ATTENTION's fused form does
that in one kernel, kernels.linear_attention_prep, and the division in another). On the H200 the two
products ran cuBLAS's FFMA kernels (sm80_xmma_gemm_f32f32 ... ffma) at a few percent of the chip's
bandwidth: 1.5 of a 14.4 ms SANA-1.6B forward at 1024², batch 1
(benchmarks/results/profile_fusions_sana_1024_b1_h200.json), and the layouts and the division
another 0.56 ms.

Here each product is one `tl.dot` chain over fp32 values loaded straight from the bf16 q, k and v
(relu and the ones row applied on load), `input_precision="ieee"`: Triton lowers an fp32 dot that
is not TF32 to FMAs, one per k, in k order, onto the accumulator it is given. So each output is
fma(a[K-1], b[K-1], ... fma(a[0], b[0], 0)), the order of a GEMM that neither splits K nor
reorders it, which is what an FFMA tile does with one accumulator per output. That cuBLAS's
kernel at a given shape does exactly this is not assumed: the verifier compares with eager on
first sight of each key, and ops.LINEAR_ATTENTION (cuBLAS's products) stays the fallback.

    scores (_scores_kernel)   [B * heads, C + 1, C] fp32: pad(v)^T-side product, the whole N reduced
    attend (_out_kernel)      the second product, the division and the cast, written as eager's
                              `.flatten(1, 2).transpose(1, 2).to(dtype)` leaves it (memory [B, D, N])
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch
import triton
import triton.language as tl

from .applicable import check as _check
from .kernels import OPTS

ONES = tl.constexpr(16)  # the ones row of pad(v), the normaliser row of scores: a dot of its own, the smallest block


@triton.jit
def _relu(x):
    return tl.where(x != x, x, tl.maximum(x, 0.0))  # aten relu: NaN passes through


@triton.jit
def _scores_kernel(k_ptr, v_ptr, s_ptr, N, D, HEADS, C: tl.constexpr, BK: tl.constexpr):
    # k, v: [B, N, D] contiguous, d = head * C + c; s: [B * HEADS, C + 1, C] fp32.
    # Rows c < C of s: v^T @ relu(k); row C: ones @ relu(k), F.pad's row, as a dot of ONES equal rows
    # (each the same FMA chain fma(1, k, acc) that cuBLAS runs on the padded operand), not a 64-row
    # block for 33 rows. Tiles are loaded token-major, channels contiguous (coalesced), then transposed.
    pid = tl.program_id(0).to(tl.int64)  # b * HEADS + head
    b = pid // HEADS
    col0 = (pid % HEADS) * C
    cols = tl.arange(0, C)
    acc = tl.zeros((C, C), dtype=tl.float32)
    acc1 = tl.zeros((ONES, C), dtype=tl.float32)
    ones = tl.full((ONES, BK), 1.0, tl.float32)
    for n0 in range(0, N, BK):
        n = n0 + tl.arange(0, BK)
        nm = n < N
        tok = (b * N + n) * D + col0
        vt = tl.load(v_ptr + tok[:, None] + cols[None, :], mask=nm[:, None], other=0.0).to(tl.float32)
        kb = _relu(tl.load(k_ptr + tok[:, None] + cols[None, :], mask=nm[:, None], other=0.0).to(tl.float32))
        acc = tl.dot(tl.trans(vt), kb, acc, input_precision="ieee")
        # past N the ones meet k's zeros: fma(1, 0, acc) == acc (acc is never -0: it starts at +0)
        acc1 = tl.dot(ones, kb, acc1, input_precision="ieee")
    base = s_ptr + pid * (C + 1) * C
    tl.store(base + cols[:, None] * C + cols[None, :], acc)
    one_rows = tl.arange(0, ONES)
    tl.store(base + C * C + one_rows[:, None] * 0 + cols[None, :], acc1, mask=one_rows[:, None] == 0)


@triton.jit
def _out_kernel(q_ptr, s_ptr, o_ptr, N, D, HEADS, eps, C: tl.constexpr, BN: tl.constexpr):
    # q: [B, N, D]; s: [B * HEADS, C + 1, C] fp32; o: [B, D, N] storage dtype
    pid = tl.program_id(0).to(tl.int64)
    b = pid // HEADS
    col0 = (pid % HEADS) * C
    cols = tl.arange(0, C)
    one_rows = tl.arange(0, ONES)
    base = s_ptr + pid * (C + 1) * C
    s = tl.load(base + cols[:, None] * C + cols[None, :])
    s1 = tl.load(base + C * C + one_rows[:, None] * 0 + cols[None, :])  # row C, ONES times
    n = tl.program_id(1) * BN + tl.arange(0, BN)
    nm = n < N
    qt = _relu(tl.load(q_ptr + ((b * N + n) * D + col0)[:, None] + cols[None, :], mask=nm[:, None],
                       other=0.0).to(tl.float32))  # [BN, C], channels contiguous
    q = tl.trans(qt)
    num = tl.dot(s, q, input_precision="ieee")  # [C, BN]
    den = tl.dot(s1, q, input_precision="ieee")  # [ONES, BN], every row the normaliser
    den = tl.sum(tl.where(one_rows[:, None] == 0, den, 0.0), axis=0)  # row 0 alone: x + 0 + ... + 0 == x
    out = tl.div_rn(num, (den + eps)[None, :])
    tl.store(o_ptr + (b * D + col0 + cols[:, None]) * N + n[None, :], out.to(o_ptr.dtype.element_ty),
             mask=nm[None, :])


class Tiling(NamedTuple):
    """The two kernels' speed settings. The bits do not depend on them: each output is one FMA chain
    in k order whatever the tiles (benchmarks/results/linear_attention_h200_s35b.md, _s36.md: equal to
    eager at all 68 settings swept, 36 of the scores kernel and 32 of the second product, at six shapes)."""

    bk: int  # scores: tokens a loop step
    scores_warps: int
    scores_stages: int  # scores: the loop's software pipeline depth
    bn: int  # out: tokens a block
    out_warps: int


# Picked on the H200 by benchmarks/probe_linear_attention.py --sweep, each kernel timed alone over its
# settings at 2 and 16 rows of 256, 1,024 and 4,096 tokens (results/linear_attention_h200_s36.md): one
# warp a program of 64 tokens for the second product was the fastest at all six (0.23 against 0.29 ms
# at two warps, 0.56 at four: 16 rows of 1,024 tokens); token blocks of 64 at 4 warps within 6% of the
# fastest scores setting at each. Several token blocks a program (its scores loaded once) was slower.
TILING = Tiling(bk=64, scores_warps=4, scores_stages=3, bn=64, out_warps=1)


def scores(k: torch.Tensor, v: torch.Tensor, heads: int, t: Tiling) -> torch.Tensor:
    """[B * heads, C + 1, C] fp32: pad(v) @ relu(k) per head, each output one chain over the tokens."""
    B, N, D = k.shape
    C = D // heads
    out = torch.empty((B * heads, C + 1, C), dtype=torch.float32, device=k.device)
    _scores_kernel[(B * heads,)](k, v, out, N, D, heads, C=C, BK=t.bk, num_warps=t.scores_warps,
                                 num_stages=t.scores_stages, **OPTS)
    return out


def attend(q: torch.Tensor, s: torch.Tensor, heads: int, eps: float, t: Tiling) -> torch.Tensor:
    """scores @ relu(q), divided by its normaliser row, in q's dtype: memory [B, D, N], returned [B, N, D]."""
    B, N, D = q.shape
    C = D // heads
    out = torch.empty((B, D, N), dtype=q.dtype, device=q.device)
    _out_kernel[(B * heads, triton.cdiv(N, t.bn))](q, s, out, N, D, heads, eps, C=C, BN=t.bn, num_warps=t.out_warps,
                                                   **OPTS)
    return out.transpose(1, 2)


def linear_attention_fma(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int, eps: float,
                         tiling: Optional[Tiling] = None) -> torch.Tensor:
    """q, k, v [B, N, D] contiguous, one dtype -> [B, N, D] in that dtype (memory [B, D, N]). `tiling`
    (default: TILING) changes the speed, not the bits."""
    _check(q.dim() == 3 and all(t.is_contiguous() and t.shape == q.shape and t.dtype == q.dtype
                                for t in (q, k, v)), "q, k, v must be contiguous [B, N, D] of one dtype")
    B, N, D = q.shape
    C = D // heads
    _check(C * heads == D and C in (16, 32, 64), "head dim must be 16, 32 or 64")
    _check(N > 0, "no tokens")
    t = tiling or TILING
    return attend(q, scores(k, v, heads, t), heads, eps, t)

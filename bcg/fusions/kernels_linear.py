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

    linear_attention_scores   [B * heads, C + 1, C] fp32: pad(v)^T-side product, the whole N reduced
    linear_attention_out      the second product, the division and the cast, written as eager's
                              `.flatten(1, 2).transpose(1, 2).to(dtype)` leaves it (memory [B, D, N])
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .applicable import check as _check
from .kernels import OPTS

BM = 64  # the C + 1 = 33 rows of pad(v) / scores, padded to a dot's block


@triton.jit
def _relu(x):
    return tl.where(x != x, x, tl.maximum(x, 0.0))  # aten relu: NaN passes through


@triton.jit
def _scores_kernel(k_ptr, v_ptr, s_ptr, N, D, HEADS, C: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr):
    # k, v: [B, N, D] contiguous, d = head * C + c; s: [B * HEADS, C + 1, C] fp32
    pid = tl.program_id(0).to(tl.int64)  # b * HEADS + head
    b = pid // HEADS
    col0 = (pid % HEADS) * C
    rows = tl.arange(0, BM)
    cols = tl.arange(0, C)
    acc = tl.zeros((BM, C), dtype=tl.float32)
    for n0 in range(0, N, BK):
        n = n0 + tl.arange(0, BK)
        nm = n < N
        tok = (b * N + n) * D + col0
        va = tl.load(v_ptr + tok[None, :] + rows[:, None], mask=(rows[:, None] < C) & nm[None, :],
                     other=0.0).to(tl.float32)
        va = tl.where((rows[:, None] == C) & nm[None, :], 1.0, va)  # F.pad's ones row
        kb = _relu(tl.load(k_ptr + tok[:, None] + cols[None, :], mask=nm[:, None], other=0.0).to(tl.float32))
        acc = tl.dot(va, kb, acc, input_precision="ieee")
    tl.store(s_ptr + (pid * (C + 1) + rows[:, None]) * C + cols[None, :], acc, mask=rows[:, None] <= C)


@triton.jit
def _out_kernel(q_ptr, s_ptr, o_ptr, N, D, HEADS, eps, C: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    # q: [B, N, D]; s: [B * HEADS, C + 1, C] fp32; o: [B, D, N] storage dtype
    pid = tl.program_id(0).to(tl.int64)
    b = pid // HEADS
    col0 = (pid % HEADS) * C
    rows = tl.arange(0, BM)
    cols = tl.arange(0, C)
    s = tl.load(s_ptr + (pid * (C + 1) + rows[:, None]) * C + cols[None, :], mask=rows[:, None] <= C, other=0.0)
    n = tl.program_id(1) * BN + tl.arange(0, BN)
    nm = n < N
    qb = _relu(tl.load(q_ptr + ((b * N + n) * D + col0)[None, :] + cols[:, None], mask=nm[None, :],
                       other=0.0).to(tl.float32))
    hs = tl.dot(s, qb, input_precision="ieee")  # [BM, BN]: rows < C numerators, row C the normaliser
    den = tl.sum(tl.where(rows[:, None] == C, hs, 0.0), axis=0)  # row C alone: x + 0 + ... + 0 == x
    out = tl.div_rn(hs, (den + eps)[None, :])
    tl.store(o_ptr + (b * D + col0 + rows[:, None]) * N + n[None, :], out.to(o_ptr.dtype.element_ty),
             mask=(rows[:, None] < C) & nm[None, :])


def linear_attention_fma(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int, eps: float) -> torch.Tensor:
    """q, k, v [B, N, D] contiguous, one dtype -> [B, N, D] in that dtype (memory [B, D, N])."""
    _check(q.dim() == 3 and all(t.is_contiguous() and t.shape == q.shape and t.dtype == q.dtype
                                for t in (q, k, v)), "q, k, v must be contiguous [B, N, D] of one dtype")
    B, N, D = q.shape
    C = D // heads
    _check(C * heads == D and C in (16, 32), "head dim must be 16 or 32 (C + 1 rows fit the block)")
    _check(N > 0, "no tokens")
    scores = torch.empty((B * heads, C + 1, C), dtype=torch.float32, device=q.device)
    _scores_kernel[(B * heads,)](k, v, scores, N, D, heads, C=C, BM=BM, BK=32, **OPTS)
    out = torch.empty((B, D, N), dtype=q.dtype, device=q.device)
    BN = 64
    _out_kernel[(B * heads, triton.cdiv(N, BN))](q, scores, out, N, D, heads, eps, C=C, BM=BM, BN=BN, **OPTS)
    return out.transpose(1, 2)

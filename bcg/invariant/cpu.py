"""Batch-invariant GEMMs on the CPU, built from fixed-shape calls of aten's own kernels.

MKL picks its kernel (gemv for M = 1, small-M and large-M GEMM paths, K split across threads or
not) from the whole problem's shape, so a row of `x @ w` changes bits between M = 1, M = 2 and
M = 8 (benchmarks/results/batch_invariance_cpu.md). Here no call's shape depends on the batch:

- `mm`: every row is its own 1 x K product, computed as one item of a `bmm` whose shape is fixed
  (ROWS items of [1, K] @ [K, N], the weight broadcast with stride 0, the last chunk padded with
  zero rows). An item's product is the same whichever item it is and whatever the others hold; a
  fixed shape keeps MKL's threading choice fixed as well.
- `bmm`: the same for whole items: fixed chunks of ITEMS [m, k] @ [k, n] products.

Inputs are made contiguous first: a batch can reach an op in another layout than a single row
(a [B, C, H, W] view is channels-last for B > 1 and plain for B = 1 in AutoencoderKL's attention),
and MKL runs another kernel for a transposed operand. They call the `.out` overloads, whose kernels the mode leaves in place (so there is no recursion
into the overrides). Cost: about 2x aten's GEMM on the tiny presets' shapes (a gemv reads the
weight once a row); correctness first on the CPU, the GPU has its own path (gemm_triton).
"""

from __future__ import annotations

import torch

ROWS = 64  # rows per fixed-shape call
ITEMS = 8  # bmm items per fixed-shape call


def mm(a: torch.Tensor, b: torch.Tensor, rows: int = ROWS) -> torch.Tensor:
    """a [M, K] @ b [K, N], each row computed alone."""
    a, b = a.contiguous(), b.contiguous()
    m, k = a.shape
    n = b.shape[1]
    out = torch.empty((m, n), dtype=torch.result_type(a, b), device=a.device)
    if m == 0 or n == 0:
        return out
    w = b.unsqueeze(0).expand(rows, k, n)
    a3 = a.unsqueeze(1)
    for s in range(0, m, rows):
        e = min(s + rows, m)
        if e - s == rows:
            x = a3[s:e]
        else:
            x = a.new_zeros((rows, 1, k))
            x[: e - s] = a3[s:e]
        y = torch.empty((rows, 1, n), dtype=out.dtype, device=a.device)
        torch.bmm(x, w, out=y)
        out[s:e] = y[: e - s, 0]
    return out


def bmm(a: torch.Tensor, b: torch.Tensor, items: int = ITEMS) -> torch.Tensor:
    """a [B, m, k] @ b [B, k, n], each item computed in a call of one fixed shape."""
    a, b = a.contiguous(), b.contiguous()
    nb, m, k = a.shape
    n = b.shape[2]
    out = torch.empty((nb, m, n), dtype=torch.result_type(a, b), device=a.device)
    if nb == 0 or m == 0 or n == 0:
        return out
    for s in range(0, nb, items):
        e = min(s + items, nb)
        if e - s == items:
            x, w = a[s:e], b[s:e]
        else:
            x, w = a.new_zeros((items, m, k)), b.new_zeros((items, k, n))
            x[: e - s], w[: e - s] = a[s:e], b[s:e]
        y = torch.empty((items, m, n), dtype=out.dtype, device=a.device)
        torch.bmm(x, w, out=y)
        out[s:e] = y[: e - s]
    return out

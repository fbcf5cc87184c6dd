"""Batch-invariant GEMMs on the CPU, built from fixed-shape, aligned calls of aten's own kernels.

MKL picks its kernel (gemv for M = 1, small-M and large-M GEMM paths, K split across threads or
not) from the whole problem's shape, so a row of `x @ w` changes bits between M = 1, M = 2 and
M = 8 (benchmarks/results/batch_invariance_cpu.md). It also looks at alignment: the same
[5, 48] @ [48, 7] product written to a 64-byte-aligned and to a 4-byte-aligned output gave other
bits (measured, torch 2.13 / MKL 2024.2). So no call here depends on the batch in shape *or*
address:

- `mm`: every row is its own 1 x K product, one item of a `bmm` of a fixed shape (ROWS items of
  [1, Kp] @ [Kp, Np], the weight broadcast with stride 0, the last chunk padded with zero rows).
  K and N are padded with zeros to whole 64-byte lines (Kp, Np), so every item's operands and
  result start on a 64-byte boundary, whichever item it is. Zeros added to a sum leave it exact.
- `bmm`: the same for whole items: fixed chunks of ITEMS [m, kp] @ [kp, np] products.

Every buffer is fresh (the CPU allocator aligns to 64 bytes) and contiguous. They call the `.out`
overloads, whose kernels the mode leaves in place (so there is no recursion into the overrides).
Cost: a few x aten's GEMM on the tiny presets' shapes (a gemv reads the weight once a row);
correctness first on the CPU, the GPU has its own path (gemm_triton).
"""

from __future__ import annotations

import torch

ROWS = 64  # rows per fixed-shape call
ITEMS = 8  # bmm items per fixed-shape call
LINE = 64  # bytes: MKL's and the allocator's alignment


def _pad(n: int, t: torch.Tensor) -> int:
    q = max(1, LINE // t.element_size())
    return -(-n // q) * q


def mm(a: torch.Tensor, b: torch.Tensor, rows: int = ROWS) -> torch.Tensor:
    """a [M, K] @ b [K, N], each row computed alone."""
    m, k = a.shape
    n = b.shape[1]
    dtype = torch.result_type(a, b)
    out = torch.empty((m, n), dtype=dtype, device=a.device)
    if m == 0 or n == 0:
        return out
    kp, np_ = _pad(k, a), _pad(n, a)
    w = torch.zeros((kp, np_), dtype=dtype, device=a.device)
    w[:k, :n] = b
    w = w.unsqueeze(0).expand(rows, kp, np_)
    for s in range(0, m, rows):
        e = min(s + rows, m)
        x = torch.zeros((rows, 1, kp), dtype=dtype, device=a.device)
        x[: e - s, 0, :k] = a[s:e]
        y = torch.empty((rows, 1, np_), dtype=dtype, device=a.device)
        torch.bmm(x, w, out=y)
        out[s:e] = y[: e - s, 0, :n]
    return out


def bmm(a: torch.Tensor, b: torch.Tensor, items: int = ITEMS) -> torch.Tensor:
    """a [B, m, k] @ b [B, k, n], each item computed in a call of one fixed shape."""
    nb, m, k = a.shape
    n = b.shape[2]
    dtype = torch.result_type(a, b)
    out = torch.empty((nb, m, n), dtype=dtype, device=a.device)
    if nb == 0 or m == 0 or n == 0:
        return out
    kp, np_ = _pad(k, a), _pad(n, a)
    for s in range(0, nb, items):
        e = min(s + items, nb)
        x = torch.zeros((items, m, kp), dtype=dtype, device=a.device)
        w = torch.zeros((items, kp, np_), dtype=dtype, device=a.device)
        x[: e - s, :, :k], w[: e - s, :k, :n] = a[s:e], b[s:e]
        y = torch.empty((items, m, np_), dtype=dtype, device=a.device)
        torch.bmm(x, w, out=y)
        out[s:e] = y[: e - s, :, :n]
    return out

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
- `bmm`: every row of every item as `mm` computes it (an item's weight in place of the weight),
  so a row has one value whether aten's matmul folded it into an mm or not.
- `sdpa` (scaled_dot_product_attention): each batch item alone, on fresh contiguous buffers, with
  its keys cut after the last one its mask lets any query attend. A pipeline that pads a batch to
  its longest row (Z-Image: captions of other lengths) hands a row more keys, masked, in a batch
  than alone; masked keys weigh exactly 0, but the flash kernel's sums over the keys run in other
  blocks (benchmarks/results/batch_invariance_cpu.md). Cut, the row's call is its call alone.

Every buffer is fresh (the CPU allocator aligns to 64 bytes) and contiguous. They call the `.out`
overloads, whose kernels the mode leaves in place (so there is no recursion into the overrides).
Cost: a few x aten's GEMM on the tiny presets' shapes (a gemv reads the weight once a row);
correctness first on the CPU, the GPU has its own path (gemm_triton).
"""

from __future__ import annotations

from typing import Optional

import torch

ROWS = 64  # rows per fixed-shape call
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


def bmm(a: torch.Tensor, b: torch.Tensor, rows: int = ROWS) -> torch.Tensor:
    """a [B, m, k] @ b [B, k, n], every row of every item computed as `mm` computes a row.

    Not item by item in chunks of items: aten's matmul (so every linear) turns [B, S, K] @ [K, N]
    into one mm or into a bmm over B of the broadcast weight, and which one follows the input's
    strides and whether the weight requires grad: LongCat-Image's attention outputs (a slice of
    the joint sequence) took addmm at batch 1 and bmm at 16 once its weights did not require grad
    (measured), and einsum folds a batch into one item's rows ('bsk,kn->bsn': a [1, 40, 48] item at
    batch 1, [1, 640, 48] at 16, so the item's GEMM had M = 40 or 640). As mm's rows, a row has one
    value whichever way it comes. One matrix for all items (stride 0, or one item) is one mm over
    all the items' rows, which computes each row as item by item would. `rows`: mm's, so an mm and a
    bmm of one mode make their rows in calls of one shape."""
    nb, m, k = a.shape
    n = b.shape[2]
    if nb == 0 or m == 0 or n == 0:
        return torch.empty((nb, m, n), dtype=torch.result_type(a, b), device=a.device)
    if nb == 1 or b.stride(0) == 0:
        return mm(a.reshape(nb * m, k), b[0], rows).view(nb, m, n)
    return torch.stack([mm(a[i], b[i], rows) for i in range(nb)])


_SDPA = torch.ops.aten.scaled_dot_product_attention.default


def sdpa_aten(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: Optional[torch.Tensor] = None,
              dropout_p: float = 0.0, is_causal: bool = False, scale: Optional[float] = None,
              enable_gqa: bool = False) -> torch.Tensor:
    """aten's own scaled_dot_product_attention: its composite kernel called directly (the backend
    choice, the mask conversion, the flash or math kernel), so not the mode's override of it."""
    return _SDPA.decompose(q, k, v, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)


def attended_keys(mask: torch.Tensor, items: int) -> list:
    """Per item: 1 + the last key any query (of any head) may attend, or 0 if none may.
    Masked out: False (bool) or -inf (float: the one value whose weight is exactly 0 whatever the scores)."""
    keep = mask if mask.dtype == torch.bool else mask != float("-inf")
    per_key = keep.reshape(keep.shape[0], -1, keep.shape[-1]).any(1)  # [items or 1, keys]
    last = torch.where(per_key, torch.arange(1, per_key.shape[-1] + 1), 0).amax(-1)
    return last.expand(items).tolist()


def _fresh(t: torch.Tensor) -> torch.Tensor:
    """A copy in a buffer of its own: contiguous, and on the allocator's alignment whatever the
    offset `t` had in its batch (`.contiguous()` of an item of a contiguous batch is that offset)."""
    return t.clone(memory_format=torch.contiguous_format)


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: Optional[torch.Tensor] = None,
         dropout_p: float = 0.0, is_causal: bool = False, scale: Optional[float] = None,
         enable_gqa: bool = False) -> torch.Tensor:
    """q [N, ..., Lq, E] with k, v [N, ..., S, E]: item by item, each on fresh buffers (the call a
    row makes is one shape and alignment whatever its batch), its keys cut to `attended_keys`.
    Lossless: a cut key's weight is exactly 0 for every query (exp(-inf)), so the result is the
    same function of the attended keys (for finite values at the cut keys: 0 x inf would have been
    NaN); a mask left with nothing masked is dropped (adding 0 is exact). For self-attention
    (Lq == S) the queries are split at the cut too: each query's row of the result is its own, so
    the split changes no value, and it puts a row's real queries in the very call they make alone.
    Callers see to dropout_p == 0 (dropout draws from one generator across the batch: a batch-wide
    computation by definition)."""
    n, lq, s = q.shape[0], q.shape[-2], k.shape[-2]
    mask = None
    if attn_mask is not None:
        mask = attn_mask.reshape((1,) * (q.dim() - attn_mask.dim()) + tuple(attn_mask.shape))
    if n == 0 or any(t.shape[0] not in (1, n) for t in (k, v, *([mask] if mask is not None else []))):
        return sdpa_aten(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)  # aten's error, or nothing to do
    # a causal call's keys are not the mask's to cut (and torch refuses a mask with is_causal)
    cut = [c or s for c in attended_keys(mask, n)] if mask is not None and not is_causal else [s] * n

    def item(t: torch.Tensor, i: int) -> torch.Tensor:
        return t[i:i + 1] if t.shape[0] == n else t[:1]

    outs = []
    for i, c in enumerate(cut):
        ki, vi = _fresh(item(k, i)[..., :c, :]), _fresh(item(v, i)[..., :c, :])
        mi = None if mask is None else item(mask, i)[..., :c]
        if mi is not None and bool((mi if mi.dtype == torch.bool else mi == 0).all()):
            mi = None  # nothing masked: the call a row makes without a mask
        parts = []
        for a, b in ([(0, c), (c, lq)] if c < s and lq == s else [(0, lq)]):
            ma = None if mi is None else _fresh(mi[..., a:b, :] if mi.shape[-2] == lq else mi)
            parts.append(sdpa_aten(_fresh(item(q, i)[..., a:b, :]), ki, vi, ma, 0.0, is_causal, scale, enable_gqa))
        outs.append(torch.cat(parts, dim=-2) if len(parts) > 1 else parts[0])
    return torch.cat(outs)

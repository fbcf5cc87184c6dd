"""Batch-invariant CUDA attention: each row its own call, or the whole batch where that gave the same bits.

Which SDPA backend aten picks, and how that backend splits its work, can follow the batch: flash
splits the keys when batch x heads x query blocks is small, cuDNN picks a plan from the whole
problem. A row computed alone, though, meets the same problem in every batch. So the canonical
attention here is per row: aten's own composite, called on one row at a time (a fresh buffer in the
row's own strides, since the backend and its plan follow strides and alignment), under a backend
order fixed while the mode is installed: cuDNN first (on the H200 2.6x the memory-efficient kernel's
speed at SANA-1.6B's cross-attention, benchmarks/results/sdpa_rows_h200.md), then memory-efficient
and math; flash off. A backend that does not take a row's case is passed over for that row in every
batch alike: its checks read the call, and a row's call is the same in every batch.

One call for the whole batch is not invariant by construction, so it runs only at call shapes where
it gave the per-row bits on first sight (verified.py; on the H200 cuDNN's and the memory-efficient
kernel's rows were the same alone and in batches of 1 to 16 at every case probed). The bytes are the
per-row ones either way.

What this does not cover (aten's composite on the whole batch, counted as a fallback): a gradient,
dropout, nested tensors, and operands whose batch is not dim 0 of all three.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch.nn.attention import SDPBackend

from .verified import span

_SDPA = torch.ops.aten.scaled_dot_product_attention.default

#: the backend order while the mode is installed (flash is switched off: see the module docstring), as
#: the ints aten's priority order holds
ORDER: tuple = tuple(b.value for b in (SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH))


def composite(q, k, v, mask, dropout_p, is_causal, scale, enable_gqa) -> torch.Tensor:
    """aten's scaled_dot_product_attention itself (its composite kernel, not the mode's registration)."""
    return _SDPA.decompose(q, k, v, mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)


def covered(q, k, v, mask, dropout_p) -> bool:
    """Whether a call can run row by row: rows are dim 0 of q, k and v; the mask has that dim, a
    broadcast one, or none (fewer dims: it broadcasts over the batch)."""
    if q.is_nested or dropout_p != 0 or q.dim() < 3 or k.dim() != q.dim() or v.dim() != q.dim():
        return False
    n = q.shape[0]
    if k.shape[0] != n or v.shape[0] != n:
        return False
    return mask is None or mask.dim() < q.dim() or (mask.dim() == q.dim() and mask.shape[0] in (1, n))


def _row(t: torch.Tensor, i: int) -> torch.Tensor:
    """Row i as a tensor of its own: clone keeps a dense row's strides, in a fresh (aligned) buffer."""
    return t.narrow(0, i, 1).clone()


def _mask_row(mask: Optional[torch.Tensor], i: int, dims: int) -> Optional[torch.Tensor]:
    if mask is None or mask.dim() < dims or mask.shape[0] == 1:
        return mask  # no batch dim, or a broadcast one: every row sees the whole mask
    return _row(mask, i)


def per_row(q, k, v, mask, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False) -> torch.Tensor:
    """The canonical attention: one row a call, written into a batch laid out as the backend lays out one
    row (the batched call's layout too, so what reads the output meets the same strides either way)."""
    out = None
    for i in range(q.shape[0]):
        y = composite(_row(q, i), _row(k, i), _row(v, i), _mask_row(mask, i, q.dim()), dropout_p, is_causal,
                      scale, enable_gqa)
        if out is None:
            out = _rows_like(y, q.shape[0])
        out.narrow(0, i, 1).copy_(y)
    if out is None:  # an empty batch: aten's own answer for its shape
        out = composite(q, k, v, mask, dropout_p, is_causal, scale, enable_gqa)
    return out


def _rows_like(y: torch.Tensor, n: int) -> torch.Tensor:
    """An empty batch of n rows, each laid out as y's one row (rows outermost), where y's row is dense."""
    row = y[0]
    if span(row) != row.numel():  # not dense
        return y.new_empty((n, *y.shape[1:]))
    return torch.empty_strided((n, *y.shape[1:]), (row.numel(), *row.stride()), dtype=y.dtype, device=y.device)


def settings() -> tuple:
    """The process-wide SDPA switches (which backends are on, and their order): part of every verdict's
    key, so a switch flipped mid-run (an `sdpa_kernel` block elsewhere) decides its shapes anew."""
    c = torch._C
    order = tuple(c._get_sdp_priority_order()) if hasattr(c, "_get_sdp_priority_order") else ()
    return (c._get_flash_sdp_enabled(), c._get_cudnn_sdp_enabled(), c._get_mem_efficient_sdp_enabled(),
            c._get_math_sdp_enabled(), order)


def switch(kind: str = "rows") -> dict:
    """Set the SDPA backends the mode runs under; return what was there, for restore().

    "rows": cuDNN, memory-efficient and math on, in ORDER (the per-row path's order); "efficient": the
    older path's set, memory-efficient and math only (no order: aten's own among those). Flash is off in
    both, since it splits keys by the batch."""
    if kind not in ("rows", "efficient"):
        raise ValueError(f"bcg.invariant: attention={kind!r} has no SDPA backend set; use 'rows' or 'efficient'")
    c = torch._C
    saved: dict = {"flash": c._get_flash_sdp_enabled(), "cudnn": c._get_cudnn_sdp_enabled(),
                   "efficient": c._get_mem_efficient_sdp_enabled(), "math": c._get_math_sdp_enabled(),
                   "order": list(c._get_sdp_priority_order()) if hasattr(c, "_get_sdp_priority_order") else None}
    c._set_sdp_use_flash(False)
    c._set_sdp_use_cudnn(kind == "rows")
    c._set_sdp_use_mem_efficient(True)
    c._set_sdp_use_math(True)
    previous = saved["order"]
    if kind == "rows" and previous is not None:  # without a priority order (older torch) aten's own stands
        c._set_sdp_priority_order([*ORDER, *(b for b in previous if b not in ORDER)])
    return saved


def restore(saved: dict) -> None:
    """Put back the switches and order switch() found."""
    c = torch._C
    c._set_sdp_use_flash(saved["flash"])
    c._set_sdp_use_cudnn(saved["cudnn"])
    c._set_sdp_use_mem_efficient(saved["efficient"])
    c._set_sdp_use_math(saved["math"])
    if saved["order"] is not None:
        c._set_sdp_priority_order(saved["order"])

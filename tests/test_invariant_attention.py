"""bcg/invariant/attention.py on the CPU: the per-row attention the mode's CUDA registration runs, its
layout, what it covers, the verdict on the batched call, and the backend order it installs.

The GPU's own bits (cuDNN and the memory-efficient kernel, SANA-1.6B's and Gemma2's shapes) are
tests/gpu/test_batch_invariance_gpu.py's; aten's CPU composite is the same code path here.
"""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention import SDPBackend

from bcg.invariant import attention, verified


def _diffusers_layout(n, heads=2, lq=5, lk=7, d=8, seed=0):
    """q, k, v as diffusers hands them: [B, L, H, D] transposed to [B, H, L, D], and an additive mask
    [B, 1, 1, K] past each row's caption."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(n, length, heads, d, generator=g).transpose(1, 2) for length in (lq, lk, lk))
    mask = torch.zeros(n, 1, 1, lk)
    for i in range(n):
        mask[i, ..., 3 + i % 3:] = -10000.0
    return q, k, v, mask


def test_each_row_of_the_per_row_attention_is_that_row_alone_at_every_batch_and_position():
    q, k, v, mask = _diffusers_layout(6)
    full = attention.per_row(q, k, v, mask)
    batched = attention.composite(q, k, v, mask, 0.0, False, None, False)
    assert torch.allclose(full, batched, atol=1e-5)  # the same attention, whatever its rounding
    assert full.stride() == batched.stride()  # laid out as aten lays out the batched call
    for i in range(6):
        alone = attention.per_row(q[i:i + 1], k[i:i + 1], v[i:i + 1], mask[i:i + 1])
        assert torch.equal(full[i:i + 1], alone)
    rev = attention.per_row(q.flip(0), k.flip(0), v.flip(0), mask.flip(0)).flip(0)  # every row elsewhere
    assert torch.equal(rev, full)


def test_a_mask_without_a_batch_dim_or_with_a_broadcast_one_reaches_every_row_whole():
    q, k, v, _ = _diffusers_layout(3)
    for mask in (torch.randn(5, 7), torch.randn(1, 2, 5, 7), torch.rand(5, 7) > 0.3):
        mask = mask.clone()
        if mask.dtype == torch.bool:
            mask[:, 0] = True  # every query attends a key: no NaN rows
        full = attention.per_row(q, k, v, mask)
        for i in range(3):
            assert torch.equal(full[i:i + 1], attention.per_row(q[i:i + 1], k[i:i + 1], v[i:i + 1], mask))


def test_what_runs_row_by_row_and_what_is_left_to_aten():
    q, k, v, mask = _diffusers_layout(4)
    assert attention.covered(q, k, v, mask, 0.0)
    assert attention.covered(q, k, v, None, 0.0) and attention.covered(q, k, v, mask[:1], 0.0)
    assert attention.covered(q[:, 0], k[:, 0], v[:, 0], None, 0.0)  # no heads dim
    assert not attention.covered(q, k, v, mask, 0.1)  # dropout: a draw per row
    assert not attention.covered(q, k[:2], v[:2], mask, 0.0)  # rows of k are not q's
    assert not attention.covered(q, k, v, mask[:2], 0.0)  # a mask of another batch
    assert not attention.covered(q, k, v, mask[None], 0.0)  # a mask with more dims than q


def test_the_batched_call_runs_only_where_it_gave_the_per_row_bits():
    q, k, v, mask = _diffusers_layout(4)
    verdicts = verified.Verdicts("test attention")

    def per_row(*ops):
        return attention.per_row(*ops)

    def batched(*ops):
        return attention.composite(*ops, 0.0, False, None, False)

    def other(qq, kk, vv, mm):  # a batched call that sums another way: must never be trusted
        return batched(qq, kk, vv, mm) + 1e-3

    want = per_row(q, k, v, mask)
    for key, fast in (("same", batched), ("other", other)):
        for _ in range(2):
            ran_fast, out = verdicts.run((key,), per_row, fast, (q, k, v, mask))
            assert torch.equal(out, want)
    snap = verdicts.snapshot()
    assert snap[("other",)] is False
    assert snap[("same",)] is torch.equal(batched(q, k, v, mask), want)


def test_random_operands_keep_an_integer_or_boolean_mask():
    gen = torch.Generator().manual_seed(1)
    keep = torch.rand(2, 7) > 0.5
    assert verified.random_like(keep, gen) is keep
    x = torch.randn(4, 6).t()
    r = verified.random_like(x, gen)
    assert r.stride() == x.stride() and r.dtype == x.dtype and not torch.equal(r, x)


def test_the_backend_order_is_installed_and_given_back():
    c = torch._C
    before = attention.settings()
    saved = attention.switch("rows")
    try:
        flash, cudnn, efficient, math, order = attention.settings()
        assert (flash, cudnn, efficient, math) == (False, True, True, True)
        if order:
            assert tuple(order[:3]) == attention.ORDER
            assert sorted(order) == sorted(before[4])
            assert SDPBackend.FLASH_ATTENTION.value in order
    finally:
        attention.restore(saved)
    assert attention.settings() == before
    assert c._get_flash_sdp_enabled() == before[0]


def test_the_efficient_set_leaves_cudnn_and_flash_off_and_the_order_alone():
    before = attention.settings()
    saved = attention.switch("efficient")
    try:
        flash, cudnn, efficient, math, order = attention.settings()
        assert (flash, cudnn, efficient, math) == (False, False, True, True)
        assert order == before[4]
    finally:
        attention.restore(saved)
    assert attention.settings() == before


def test_an_unknown_attention_setting_is_refused_by_name_and_changes_nothing():
    before = attention.settings()
    with pytest.raises(ValueError, match="'fast'"):
        attention.switch("fast")
    assert attention.settings() == before

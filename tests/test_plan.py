"""Plan pieces the worker uses: pool-sized batches with dummy rows, stable seeds. (The planner's
determinism and sort order: tests/test_plan_units.py.)"""

from __future__ import annotations

import pytest

from jobs.plan import Batch, Item, Signature, cut_batches, derive_seed


def sig(bucket=64, h=128, steps=8, cfg=True):
    return Signature(height=h, width=h, text_bucket=bucket, steps=steps, guidance_scale=4.5 if cfg else 1.0,
                     cfg=cfg, dtype="float32")


def item(key, s):
    return Item(key=key, prompt=key, negative_prompt="", seed=derive_seed(0, key), signature=s, text_tokens=5,
                truncated=False, source=f"f.jsonl:{key}")


@pytest.mark.parametrize("n,sizes,pad,expect", [
    (15, [1, 2, 4, 8], True, [(8, 8), (4, 4), (2, 2), (1, 1)]),
    (3, [4, 8], True, [(3, 4)]),          # short tail padded up to the smallest pool size
    (3, [4, 8], False, [(3, 3)]),         # or run at its own size (eager) when padding is off
    (11, [4], True, [(4, 4), (4, 4), (3, 4)]),
])
def test_cut_batches(n, sizes, pad, expect):
    got = [(len(chunk), size) for chunk, size in cut_batches(list(range(n)), sizes, pad)]
    assert got == expect


def test_dummy_rows_counted():
    batches = [Batch(sig(), chunk, size) for chunk, size in cut_batches([item(f"k{i}", sig()) for i in range(3)],
                                                                        [4, 8], True)]
    assert [(len(b.items), b.size, b.n_dummy) for b in batches] == [(3, 4, 1)]


def test_derived_seed_depends_only_on_job_seed_and_key():
    assert derive_seed(0, "abc") == derive_seed(0, "abc")
    assert derive_seed(0, "abc") != derive_seed(1, "abc")
    assert derive_seed(0, "abc") != derive_seed(0, "abd")
    assert 0 <= derive_seed(7, "x") < 2**63

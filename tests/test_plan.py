"""The plan: deterministic, sorted by signature, pool-sized batches, stable seeds."""

from __future__ import annotations

import random

import pytest

from jobs.plan import Item, Signature, build_plan, cut_batches, derive_seed, without_keys


def sig(bucket=64, h=128, steps=8, cfg=True):
    return Signature(height=h, width=h, text_bucket=bucket, steps=steps, guidance_scale=4.5 if cfg else 1.0,
                     cfg=cfg, dtype="float32")


def item(key, s):
    return Item(key=key, prompt=key, negative_prompt="", seed=derive_seed(0, key), signature=s, text_tokens=5,
                truncated=False, source=f"f.jsonl:{key}")


def mixed_items(n=50):
    sigs = [sig(64), sig(128), sig(64, h=256), sig(256, cfg=False)]
    return [item(f"k{i:03d}", sigs[(i * 7) % len(sigs)]) for i in range(n)]


def test_plan_is_deterministic_whatever_the_input_order():
    items = mixed_items()
    shuffled = items[:]
    random.Random(1).shuffle(shuffled)
    a = build_plan(items, [1, 2, 4, 8], True)
    b = build_plan(shuffled, [1, 2, 4, 8], True)
    assert [(x.signature, [i.key for i in x.items], x.size) for x in a.batches] == \
           [(x.signature, [i.key for i in x.items], x.size) for x in b.batches]


def test_plan_sorted_by_signature_each_signature_one_run():
    plan = build_plan(mixed_items(), [1, 2, 4, 8], True)
    sigs = [b.signature for b in plan.batches]
    assert sigs == sorted(sigs)
    runs = [s for i, s in enumerate(sigs) if i == 0 or s != sigs[i - 1]]
    assert len(runs) == len(set(sigs)) == 4  # one contiguous run per signature
    assert sorted(plan.keys()) == sorted(it.key for it in mixed_items())


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
    plan = build_plan([item(f"k{i}", sig()) for i in range(3)], [4, 8], True)
    assert [(len(b.items), b.size, b.n_dummy) for b in plan.batches] == [(3, 4, 1)]


def test_derived_seed_depends_only_on_job_seed_and_key():
    assert derive_seed(0, "abc") == derive_seed(0, "abc")
    assert derive_seed(0, "abc") != derive_seed(1, "abc")
    assert derive_seed(0, "abc") != derive_seed(0, "abd")
    assert 0 <= derive_seed(7, "x") < 2**63


def test_resume_filter_recuts_batches():
    items = [item(f"k{i:02d}", sig()) for i in range(10)]
    plan = build_plan(items, [1, 2, 4, 8], True)
    rest = without_keys(plan, {f"k{i:02d}" for i in range(7)}, [1, 2, 4, 8], True)
    assert rest.keys() == ["k07", "k08", "k09"]
    assert [b.size for b in rest.batches] == [2, 1]

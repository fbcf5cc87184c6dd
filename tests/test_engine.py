"""Pipeline: the negative-prompt cache encodes each negative alone, at one shape, and gives exactly what
encoding each alone gives."""

from __future__ import annotations

import torch

import pytest

from jobs.worker.pipeline import Pipeline, row, stack_rows
from padding import TextEmbeds, get_padder
from tests.helpers import tiny_pipeline


@pytest.fixture(scope="module")
def engine():
    cfg, fam, pipe = tiny_pipeline("sana_tiny")
    padder = get_padder("sana", buckets=cfg.text_buckets, native_length=cfg.model.max_sequence_length)
    return Pipeline(cfg, fam, pipe, padder, None, "cpu")


def test_each_negative_is_encoded_alone_once_and_kept(engine):
    # Encoded together, a negative's bytes would follow which others were new in the same batch: a
    # dataset with a negative a row would break the one-shape contract (issue 30).
    cfg, fam, pipe = engine.cfg, engine.family, engine.pipe
    texts = ["", "blurry, low quality", "", "blurry, low quality", "watermark"]
    seen = []
    hook = pipe.text_encoder.register_forward_pre_hook(lambda m, args, kw: seen.append(len(kw.get(
        "input_ids", args[0] if args else None))), with_kwargs=True)
    try:
        with torch.no_grad():
            cached = engine._encode_negatives(texts)
            again = engine._encode_negatives(texts[::-1])  # all from the cache now
    finally:
        hook.remove()
    assert seen == [1, 1, 1], seen  # three distinct negatives, each alone, none twice
    with torch.no_grad():
        alone = stack_rows([fam.encode(pipe, [t], cfg.model, "cpu", instruction=False) for t in texts])
    assert torch.equal(cached.embeds, alone.embeds) and torch.equal(cached.mask, alone.mask)
    assert torch.equal(again.embeds, alone.embeds.flip(0))
    assert len(engine._negatives) == 3


def test_rows_keep_batch_first_extras():
    text = TextEmbeds(embeds=torch.randn(3, 4, 2), mask=torch.ones(3, 4), extras={"pooled": torch.randn(3, 5)})
    back = stack_rows([row(text, i) for i in (2, 0)])
    assert torch.equal(back.extras["pooled"], text.extras["pooled"][[2, 0]])
    assert torch.equal(back.embeds, text.embeds[[2, 0]])

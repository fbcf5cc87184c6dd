"""Pipeline: the negative-prompt cache gives exactly what encoding the batch directly gives."""

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


def test_negative_cache_matches_direct_encoding(engine):
    cfg, fam, pipe = engine.cfg, engine.family, engine.pipe
    texts = ["", "blurry, low quality", "", "blurry, low quality", "watermark"]
    with torch.no_grad():
        cached = engine._encode_negatives(texts)
        again = engine._encode_negatives(texts[::-1])  # all from the cache now
        direct = fam.encode(pipe, texts, cfg.model, "cpu", instruction=False)
    assert torch.equal(cached.embeds, direct.embeds) and torch.equal(cached.mask, direct.mask)
    assert torch.equal(again.embeds, direct.embeds.flip(0))
    assert len(engine._negatives) == 3


def test_rows_keep_batch_first_extras():
    text = TextEmbeds(embeds=torch.randn(3, 4, 2), mask=torch.ones(3, 4), extras={"pooled": torch.randn(3, 5)})
    back = stack_rows([row(text, i) for i in (2, 0)])
    assert torch.equal(back.extras["pooled"], text.extras["pooled"][[2, 0]])
    assert torch.equal(back.embeds, text.embeds[[2, 0]])

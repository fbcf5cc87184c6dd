"""SANA bucket padding: same signature for one bucket, and the same output as the native 300-long text.

SANA's cross-attention turns mask 0 into a -10000 additive bias, so softmax gives masked keys a
weight of exactly 0 in float32 (exp(-10000) underflows); the real tokens' outputs cannot change.
What can change is the reduction order inside the attention kernel when the key length changes,
so the tolerance is float32 rounding: 1e-5 of the output's largest magnitude (the trained demo
weights give outputs up to ~8; measured: 0, or 0.6-1.3e-6 of that with 1-2 CPU threads).
"""

from __future__ import annotations

import pytest
import torch

from jobs.models.registry import get_family
from padding import TextEmbeds, get_padder
from padding.bucket import effective_buckets
from tests.helpers import compose_cfg

TOL = 1e-5


@pytest.fixture(scope="module")
def tiny():
    cfg = compose_cfg(["output_dir=/tmp/x"])
    fam = get_family("sana")
    pipe = fam.build_tiny(cfg.model, torch.float32)
    pipe.set_progress_bar_config(disable=True)
    return cfg, fam, pipe


def test_buckets_above_native_length_are_capped():
    assert effective_buckets([64, 128, 256, 512, 1024], 300) == [64, 128, 256, 300]
    p = get_padder("sana", buckets=[64, 128, 256, 512], native_length=300)
    assert [p.bucket_for(n) for n in (1, 64, 65, 256, 257, 300)] == [64, 64, 128, 256, 300, 300]
    assert p.masks_padding


def test_unknown_family_lists_known():
    with pytest.raises(ValueError) as e:
        get_padder("dalle", buckets=[64], native_length=300)
    assert "dalle" in str(e.value) and "sana" in str(e.value)


def test_two_lengths_in_one_bucket_share_a_signature(tiny):
    cfg, fam, _ = tiny
    tok = fam.load_tokenizer(cfg.model)
    padder = get_padder("sana", buckets=cfg.text_buckets, native_length=cfg.model.max_sequence_length)
    short, longer = fam.text_lengths(tok, ["a cat", "a small grey cat asleep on a warm red brick wall"], cfg.model, True)
    assert short.used != longer.used
    assert padder.bucket_for(short.used) == padder.bucket_for(longer.used) == 64


def forward(pipe, text: TextEmbeds, seed=0):
    g = torch.Generator().manual_seed(seed)
    b = text.embeds.shape[0]
    x = torch.randn(b, 8, 16, 16, generator=g)
    t = torch.full((b,), 500.0)
    with torch.no_grad():
        return pipe.transformer(x, encoder_hidden_states=text.embeds, encoder_attention_mask=text.mask,
                                timestep=t, return_dict=False)[0]


@pytest.mark.parametrize("bucket", [64, 128, 300, 512])
def test_rebucketed_text_gives_the_native_output(tiny, bucket):
    cfg, fam, pipe = tiny
    prompts = ["a red fox", "a lighthouse on a cliff at dusk, waves crashing below, oil painting"]
    with torch.no_grad():
        native = fam.encode(pipe, prompts, cfg.model, "cpu", instruction=True)
    assert native.length == 300
    padder = get_padder("sana", buckets=[64, 128, 256, 512, 1024], native_length=300)
    padded = padder.pad(native, bucket) if bucket <= 300 else _grow(native, bucket)
    assert padded.length == bucket
    want = forward(pipe, native)
    diff = (forward(pipe, padded) - want).abs().max().item()
    scale = max(1.0, want.abs().max().item())
    assert diff <= TOL * scale, f"bucket {bucket}: max abs diff {diff} on outputs up to {scale}"


def _grow(text: TextEmbeds, bucket: int) -> TextEmbeds:
    # The padder never grows past the native length on its own (effective_buckets caps it); grow
    # by hand here to prove that zero embeddings under mask 0 are inert too.
    from padding.bucket import BucketPadder

    return BucketPadder([bucket], native_length=bucket + 1).pad(text, bucket)


def test_cutting_a_real_token_is_an_internal_error(tiny):
    cfg, fam, pipe = tiny
    with torch.no_grad():
        native = fam.encode(pipe, ["word " * 100], cfg.model, "cpu", instruction=True)
    padder = get_padder("sana", buckets=[64], native_length=300)
    with pytest.raises(AssertionError, match="cut real tokens"):
        padder.pad(native, 64)


def test_whole_pipeline_image_unchanged_by_bucketing(tiny):
    cfg, fam, pipe = tiny
    from jobs.models.base import DenoiseRequest

    with torch.no_grad():
        pos = fam.encode(pipe, ["a blue bird on a branch"], cfg.model, "cpu", instruction=True)
        neg = fam.encode(pipe, [""], cfg.model, "cpu", instruction=False)
    padder = get_padder("sana", buckets=[64], native_length=300)

    def image(p, n):
        return fam.denoise_decode(pipe, DenoiseRequest(positive=p, negative=n, seeds=[3], height=64, width=64,
                                                       steps=3, guidance_scale=4.5))

    native = image(pos, neg)
    bucketed = image(padder.pad(pos, 64), padder.pad(neg, 64))
    assert abs(native - bucketed).max() <= TOL


@pytest.mark.parametrize("chi", [None, ["Describe the image in detail:", "User Prompt: "]])
def test_plan_lengths_match_what_the_pipeline_encodes(chi):
    """The plan tokenizes without the encoder; its used lengths must equal the pipeline's masks,
    with and without SANA's complex-human-instruction prefix (and its select index)."""
    from tests.helpers import tiny_pipeline

    overrides = ["model.max_sequence_length=48"]
    if chi:
        overrides.append("model.complex_human_instruction=[" + ",".join(f"'{c}'" for c in chi) + "]")
    cfg, fam, pipe = tiny_pipeline("sana_tiny", *overrides)
    tok = fam.load_tokenizer(cfg.model)
    prompts = ["", "cat", "A Red Fox in the snow", "word " * 20, "a very long prompt " * 30]
    planned = fam.text_lengths(tok, prompts, cfg.model, instruction=True)
    with torch.no_grad():
        for p, length in zip(prompts, planned):
            enc = fam.encode(pipe, [p], cfg.model, "cpu", instruction=True)
            assert enc.length == 48
            assert length.used == enc.used_length(), (p[:30], length, enc.used_length())
    assert planned[-1].truncated and not planned[1].truncated

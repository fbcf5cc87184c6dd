"""Flux.1: T5 text at one fixed length, passed through; padding would change the image, so the
padder refuses it; the real preset loads a saved diffusers folder.

No tolerance is needed anywhere here: pass-through hands the transformer the very tensors the
pipeline made, so the comparisons that must match are exact, and the ones that must differ are
checked against a margin (1e-3) far above float32 rounding.
"""

from __future__ import annotations

import inspect

import pytest
import torch

from bcg.signature import signature
from jobs.models.base import DenoiseRequest
from jobs.preflight import check_config
from padding import PaddingRefused, TextEmbeds, get_padder
from tests.helpers import compose_cfg, tiny_pipeline

SHORT, LONGER = "a red fox", "a lighthouse on a cliff at dusk, waves crashing below, oil painting"


@pytest.fixture(scope="module")
def tiny():
    return tiny_pipeline("flux_tiny")


def encode(fam, pipe, cfg, prompts):
    with torch.no_grad():
        return fam.encode(pipe, prompts, cfg.model, "cpu", instruction=True)


def test_transformer_takes_no_text_mask(tiny):
    # The reason for pass-through: if diffusers adds a text mask, this padder can become a bucket padder.
    params = inspect.signature(type(tiny[2].transformer).forward).parameters
    assert not [p for p in params if "mask" in p]


def test_every_prompt_gets_the_fixed_length_bucket(tiny):
    cfg, fam, pipe = tiny
    padder = get_padder("flux", buckets=cfg.text_buckets, native_length=cfg.model.max_sequence_length)
    assert not padder.masks_padding
    lengths = fam.text_lengths(fam.load_tokenizer(cfg.model), [SHORT, LONGER, "word " * 600], cfg.model, True)
    assert lengths[0].used < lengths[1].used < lengths[2].used == 512 and lengths[2].truncated
    assert {padder.bucket_for(n.used) for n in lengths} == {512}
    # the plan's count equals the real tokens the pipeline's T5 tokenizer marks
    assert [n.used for n in lengths[:2]] == [encode(fam, pipe, cfg, [p]).used_length() for p in (SHORT, LONGER)]


def test_two_lengths_share_a_graph_signature(tiny):
    cfg, fam, pipe = tiny
    padder = get_padder("flux", buckets=cfg.text_buckets, native_length=512)
    keys = []
    for prompt in (SHORT, LONGER):
        calls = []
        handle = pipe.transformer.register_forward_pre_hook(lambda m, a, kw: calls.append(kw), with_kwargs=True)
        try:
            text = padder.pad(encode(fam, pipe, cfg, [prompt]), 512)
            fam.denoise_decode(pipe, DenoiseRequest(positive=text, negative=None, seeds=[1], height=64, width=64,
                                                    steps=1, guidance_scale=3.5))
        finally:
            handle.remove()
        keys.append(signature((), calls[0]))
    assert keys[0] == keys[1]


def forward(pipe, text: TextEmbeds, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(1, 64, 16, generator=g)  # 8x8 packed latent tokens of a 64x64 image
    s = text.embeds.shape[1]
    img_ids = torch.stack(torch.meshgrid(torch.zeros(1), torch.arange(8.0), torch.arange(8.0), indexing="ij"),
                          -1).reshape(64, 3)
    with torch.no_grad():
        return pipe.transformer(hidden_states=x, encoder_hidden_states=text.embeds,
                                pooled_projections=text.extras["pooled"], timestep=torch.full((1,), 0.5),
                                guidance=torch.full((1,), 3.5), txt_ids=torch.zeros(s, 3), img_ids=img_ids,
                                return_dict=False)[0]


def test_padding_would_change_the_output_and_is_refused(tiny):
    cfg, fam, pipe = tiny
    native = encode(fam, pipe, cfg, [SHORT])
    assert native.length == 512 and native.used_length() < 64
    base = forward(pipe, native)
    assert torch.equal(base, forward(pipe, native))  # the comparison itself is deterministic
    # What a bucket padder would do: cut the (attended) T5 pad tail to 64, or grow it with masked zeros.
    cut = native.with_length(native.embeds[:, :64], native.mask[:, :64])
    grown = native.with_length(torch.nn.functional.pad(native.embeds, (0, 0, 0, 128)),
                               torch.nn.functional.pad(native.mask, (0, 128)))
    assert (forward(pipe, cut) - base).abs().max().item() > 1e-3
    assert (forward(pipe, grown) - base).abs().max().item() > 1e-3
    padder = get_padder("flux", buckets=[64, 128, 512], native_length=512)
    assert padder.pad(native, 512) is native
    for bucket in (64, 640):
        with pytest.raises(PaddingRefused, match="no text mask"):
            padder.pad(native, bucket)


def test_guidance_scale_reaches_the_guidance_embedding(tiny):
    cfg, fam, pipe = tiny
    text = encode(fam, pipe, cfg, [SHORT])

    def image(g):
        return fam.denoise_decode(pipe, DenoiseRequest(positive=text, negative=None, seeds=[2], height=64, width=64,
                                                       steps=2, guidance_scale=g))

    assert (image(3.5) == image(3.5)).all() and abs(image(3.5) - image(1.0)).max() > 0


def test_real_preset_loads_saved_folder_and_matches(tiny, tmp_path):
    tiny_cfg, fam, pipe = tiny
    path = tmp_path / "flux_tiny_diffusers"
    pipe.save_pretrained(path, safe_serialization=True)
    cfg = compose_cfg(["model=flux", f"model.path={path}", "model.dtype=float32", "output_dir=/tmp/x"])
    check_config(cfg)
    loaded = fam.load(cfg.model, torch.float32)
    loaded.set_progress_bar_config(disable=True)
    assert fam.spatial_divisor(cfg.model) == fam.spatial_divisor(tiny_cfg.model) == 8

    def image(p, c):
        text = encode(fam, p, c, ["a castle in the clouds"])
        return fam.denoise_decode(p, DenoiseRequest(positive=text, negative=None, seeds=[5], height=64, width=64,
                                                    steps=2, guidance_scale=3.5))

    assert (image(pipe, tiny_cfg) == image(loaded, cfg)).all()

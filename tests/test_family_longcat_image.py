"""LongCat-Image: text at the fixed length 512, passed through; padding would change the image, so
the padder refuses it; the job's embeddings path equals the stock pipeline; the real preset loads a
saved diffusers folder.

No tolerance is needed: pass-through hands the transformer the very tensors the pipeline made, so
comparisons that must match are exact, and those that must differ use a 1e-3 margin, far above
float32 rounding.
"""

from __future__ import annotations

import inspect

import pytest
import torch

from bcg.signature import signature
from jobs.models.base import DenoiseRequest
from jobs.models.longcat_image import TEXT_LENGTH
from jobs.models.registry import get_family
from jobs.preflight import check_config
from padding import PaddingRefused, TextEmbeds, get_padder
from tests.helpers import compose_cfg, tiny_pipeline

SHORT, LONGER = "a red fox", "a sign that says 'OPEN' on a lighthouse door at dusk, oil painting"


@pytest.fixture(scope="module")
def tiny():
    return tiny_pipeline("longcat_image_tiny")


def encode(fam, pipe, cfg, prompts):
    with torch.no_grad():
        return fam.encode(pipe, prompts, cfg.model, "cpu", instruction=True)


def run(fam, pipe, pos, neg, seed=3, steps=2):
    return fam.denoise_decode(pipe, DenoiseRequest(positive=pos, negative=neg, seeds=[seed] * pos.embeds.shape[0],
                                                   height=64, width=64, steps=steps, guidance_scale=4.5))


def test_source_facts_the_policy_rests_on(tiny):
    _, _, pipe = tiny
    assert pipe.tokenizer_max_length == TEXT_LENGTH
    params = inspect.signature(type(pipe.transformer).forward).parameters
    assert not [p for p in params if "mask" in p]


def test_every_prompt_gets_the_fixed_length_bucket(tiny):
    cfg, fam, pipe = tiny
    padder = get_padder("longcat_image", buckets=cfg.text_buckets, native_length=512)
    assert not padder.masks_padding
    lengths = fam.text_lengths(fam.load_tokenizer(cfg.model), [SHORT, LONGER, "word " * 600], cfg.model, True)
    assert lengths[0].used < lengths[1].used < lengths[2].used == 512 and lengths[2].truncated
    assert {padder.bucket_for(n.used) for n in lengths} == {512}
    # the plan's count (quoted text character by character) equals the pipeline's real tokens
    texts = [encode(fam, pipe, cfg, [p]) for p in (SHORT, LONGER)]
    assert [t.length for t in texts] == [512, 512]
    assert [n.used for n in lengths[:2]] == [t.used_length() for t in texts]


def test_other_max_sequence_length_is_refused_before_loading(tiny):
    cfg = compose_cfg(["model=longcat_image_tiny", "model.max_sequence_length=300", "output_dir=/tmp/x"])
    fam = get_family("longcat_image")
    with pytest.raises(ValueError, match="model.max_sequence_length=512"):
        fam.text_lengths(fam.load_tokenizer(cfg.model), [SHORT], cfg.model, True)


def test_two_lengths_share_a_graph_signature(tiny):
    cfg, fam, pipe = tiny
    neg = encode(fam, pipe, cfg, [""])
    keys = []
    for prompt in (SHORT, LONGER):
        calls = []
        handle = pipe.transformer.register_forward_pre_hook(lambda m, a, kw: calls.append(kw), with_kwargs=True)
        try:
            run(fam, pipe, encode(fam, pipe, cfg, [prompt]), neg, steps=1)
        finally:
            handle.remove()
        keys.append([signature((), kw) for kw in calls])
    assert len(keys[0]) == 2 and keys[0] == keys[1]


def forward(pipe, text: TextEmbeds, seed=0):
    from diffusers.pipelines.longcat_image.pipeline_longcat_image import prepare_pos_ids

    g = torch.Generator().manual_seed(seed)
    x = torch.randn(1, 64, 64, generator=g)  # 8x8 packed latent tokens of a 64x64 image
    s = text.embeds.shape[1]
    with torch.no_grad():
        return pipe.transformer(hidden_states=x, encoder_hidden_states=text.embeds, timestep=torch.full((1,), 0.5),
                                txt_ids=prepare_pos_ids(0, "text", (0, 0), num_token=s),
                                img_ids=prepare_pos_ids(1, "image", (512, 512), height=8, width=8),
                                return_dict=False)[0]


def test_padding_would_change_the_output_and_is_refused(tiny):
    cfg, fam, pipe = tiny
    native = encode(fam, pipe, cfg, [SHORT])
    base = forward(pipe, native)
    assert torch.equal(base, forward(pipe, native))
    cut = native.with_length(native.embeds[:, :64], native.mask[:, :64])
    grown = native.with_length(torch.nn.functional.pad(native.embeds, (0, 0, 0, 128)),
                               torch.nn.functional.pad(native.mask, (0, 128)))
    assert (forward(pipe, cut) - base).abs().max().item() > 1e-3
    assert (forward(pipe, grown) - base).abs().max().item() > 1e-3
    padder = get_padder("longcat_image", buckets=[64, 512], native_length=512)
    assert padder.pad(native, 512) is native
    for bucket in (64, 640):
        with pytest.raises(PaddingRefused, match="attended"):
            padder.pad(native, bucket)


def test_embeddings_path_equals_the_stock_pipeline(tiny):
    cfg, fam, pipe = tiny
    ours = run(fam, pipe, encode(fam, pipe, cfg, [LONGER]), encode(fam, pipe, cfg, [""]))
    stock = pipe(prompt=[LONGER], negative_prompt="", guidance_scale=4.5, num_inference_steps=2, height=64, width=64,
                 generator=[torch.Generator().manual_seed(3)], enable_prompt_rewrite=False, output_type="np",
                 return_dict=False)[0]
    assert (ours == stock).all()
    # a batch of two (stock diffusers cannot take batched negative embeddings) gives each row its image
    both = run(fam, pipe, encode(fam, pipe, cfg, [SHORT, LONGER]), encode(fam, pipe, cfg, ["", ""]))
    assert both.shape == (2, 64, 64, 3) and abs(both[1] - ours[0]).max() <= 1e-5


def test_real_preset_loads_saved_folder_and_matches(tiny, tmp_path):
    tiny_cfg, fam, pipe = tiny
    path = tmp_path / "longcat_image_tiny_diffusers"
    pipe.save_pretrained(path, safe_serialization=True)
    cfg = compose_cfg(["model=longcat_image", f"model.path={path}", "model.dtype=float32", "output_dir=/tmp/x"])
    check_config(cfg)
    loaded = fam.load(cfg.model, torch.float32)
    loaded.set_progress_bar_config(disable=True)
    assert fam.spatial_divisor(cfg.model) == fam.spatial_divisor(tiny_cfg.model) == 8

    def image(p, c):
        return run(fam, p, encode(fam, p, c, ["a castle in the clouds"]), encode(fam, p, c, [""]), seed=5)

    assert (image(pipe, tiny_cfg) == image(loaded, cfg)).all()

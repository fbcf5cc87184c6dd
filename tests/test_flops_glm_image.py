"""jobs/models/flops/glm_image.py against torch's own FLOP counter, on tiny real GlmImageTransformer2DModels (CPU).

Inputs are built as GlmImagePipeline (diffusers 0.42.1) builds them for text-to-image: latents
[B, C, H / s, W / s] for the VAE's scale s, the prior tokens as the AR's 1/32 grid upsampled 2x by the
pipeline's own `_upsample_token_ids`, the glyph embeddings [B, t, text_embed_dim] (no mask), the
timestep t - 1 per row, target size and crop coordinates, and a fresh idle KV cache. Under CFG a step
is two calls: the prompt's glyph rows with the prior tokens kept, then the pipeline's own negative
(the glyph text of "") with the prior tokens dropped. The math SDPA backend is forced so attention's
two products reach the counter as bmm's."""

from __future__ import annotations

import functools
import inspect
import sys
import types
from pathlib import Path

import pytest
import torch
import yaml
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from jobs.models.flops import transformer_flops
from jobs.models.flops.glm_image import NEGATIVE_GLYPH_ROWS
from jobs.plan import Signature

ROOT = Path(__file__).resolve().parents[1]
PRESET = yaml.safe_load((ROOT / "conf/model/glm_image_tiny.yaml").read_text())["model"]["tiny"]
AR_GRID = 32  # the prior's grid is 1/32 of the image, upsampled 2x for the DiT

# 3 heads of 16 (d = 48), the timestep / condition / glyph widths all different from d and each other.
WIDE = dict(patch_size=2, in_channels=8, out_channels=8, num_layers=2, attention_head_dim=16, num_attention_heads=3,
            text_embed_dim=20, time_embed_dim=24, condition_dim=12, prior_vq_quantizer_codebook_size=32)


def _signature(height, width, text, steps=1, cfg=False):
    return Signature(height=height, width=width, text_bucket=text, steps=steps, guidance_scale=1.5 if cfg else 1.0,
                     cfg=cfg, dtype="float32")


def _model(config, family_calls=False):
    from diffusers import GlmImageTransformer2DModel

    torch.manual_seed(0)
    model = GlmImageTransformer2DModel(**config).eval()
    if family_calls:  # the job's DiT: the capturable forward and the graph-friendly pre-hook
        from jobs.models.glm_image import GlmImageFamily

        GlmImageFamily().patch(types.SimpleNamespace(transformer=model))
    return model


def _prior_ids(model, height, width, batch):
    """The pipeline's prior_token_ids: each row's AR grid (H / 32 x W / 32) upsampled 2x."""
    from diffusers import GlmImagePipeline

    h, w = height // AR_GRID, width // AR_GRID
    rows = [GlmImagePipeline._upsample_token_ids(
        torch.randint(0, model.config.prior_vq_quantizer_codebook_size, (h * w,)), h, w) for _ in range(batch)]
    return torch.cat(rows)


def _step(model, scale, height, width, text, batch=1, cfg=False) -> FlopCounterMode:
    """One denoising step's transformer calls as GlmImagePipeline.__call__ makes them, under the counter."""
    from diffusers.models.transformers.transformer_glm_image import GlmImageKVCache

    c = model.config
    latents = torch.randn(batch, c.in_channels, height // scale, width // scale)
    prior = _prior_ids(model, height, width, batch)
    timestep = torch.tensor(750.0).expand(batch) - 1
    kw = dict(hidden_states=latents, prior_token_id=prior, timestep=timestep,
              target_size=torch.tensor([[float(height), float(width)]]).repeat(batch, 1),
              crop_coords=torch.zeros(batch, 2), attention_kwargs=None, return_dict=False,
              kv_caches=GlmImageKVCache(num_layers=c.num_layers))
    glyphs = torch.randn(batch, text, c.text_embed_dim)
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        out = model(encoder_hidden_states=glyphs, prior_token_drop=torch.zeros_like(prior, dtype=torch.bool), **kw)[0]
        if cfg:
            empty = torch.randn(batch, NEGATIVE_GLYPH_ROWS, c.text_embed_dim)
            model(encoder_hidden_states=empty, prior_token_drop=torch.ones_like(prior, dtype=torch.bool), **kw)
    assert out.shape == latents.shape
    return counter


def _prompt_flops(counter) -> int:
    counts = counter.get_flop_counts()
    return sum(sum(counts[name].values()) for name in counts
               if name.endswith((".glyph_projector", ".prior_projector")))


# (config, vae config, the VAE's scale, height, width, glyph rows, batch, cfg, the family's patched calls)
CASES = {
    # the preset itself (8x VAE, patch 2): 64² -> 4 x 4 tokens, a prompt without quotes (1 glyph row)
    "preset": (PRESET["transformer"], PRESET["vae"], 8, 64, 64, 1, 1, False, False),
    # patch 4 on a 4x VAE (still 16 pixels a token): 96 x 64 -> 6 x 4 tokens; 9 glyph rows beside the
    # negative's 1 under CFG, a batch of 2 as the job batches one bucket
    "patch4_cfg": (dict(PRESET["transformer"], patch_size=4), {"block_out_channels": [8, 8, 8]}, 4, 96, 64, 9, 2,
                   True, False),
    # other widths, the default 8x VAE (no vae config), 128 x 64 -> 8 x 4 tokens, 5 glyph rows, CFG,
    # through the job's graph-friendly calls (the rotary table passed in, the where for the drop)
    "wide_cfg_job_calls": (WIDE, None, 8, 128, 64, 5, 1, True, True),
}


@pytest.mark.parametrize("case", list(CASES))
def test_glm_image_count_equals_the_flop_counter(case):
    config, vae, scale, height, width, text, batch, cfg, family_calls = CASES[case]
    model = _model(config, family_calls)
    counter = _step(model, scale, height, width, text, batch, cfg)
    count = transformer_flops("glm_image", model.config, vae, _signature(height, width, text, cfg=cfg))
    assert count.rows == (2 if cfg else 1)
    assert count.per_forward * count.rows * batch == counter.get_total_flops()
    # The prompt part: the glyph and prior projectors, fixed over the steps.
    prompt = _prompt_flops(counter)
    assert prompt > 0 and count.per_forward_prompt * count.rows * batch == prompt


def test_the_negative_row_is_the_pipelines_empty_glyph_text_whatever_the_prompts_length():
    """The job hands the pipeline prompt_embeds and no negative: encode_prompt makes the negative itself,
    the glyph embeddings of "" (ByT5's one eos token), 1 row, not the positive's length."""
    from diffusers import GlmImagePipeline
    from transformers import ByT5Tokenizer, T5Config, T5EncoderModel

    torch.manual_seed(0)
    encoder = T5EncoderModel(T5Config(vocab_size=384, d_model=16, d_kv=8, d_ff=32, num_layers=1, num_heads=2)).eval()
    pipe = types.SimpleNamespace(tokenizer=ByT5Tokenizer(), text_encoder=encoder)
    for method in ("get_glyph_texts", "_get_glyph_embeds"):  # the pipeline's own, on this stand-in
        setattr(pipe, method, functools.partial(getattr(GlmImagePipeline, method), pipe))
    positive = torch.randn(2, 9, 16)
    with torch.no_grad():
        pos, neg = GlmImagePipeline.encode_prompt(pipe, None, do_classifier_free_guidance=True, prompt_embeds=positive,
                                                  device="cpu", dtype=torch.float32)
    assert pos is positive and tuple(neg.shape) == (2, NEGATIVE_GLYPH_ROWS, 16)
    # so under CFG a longer glyph text costs only its own row: the pair is the mean of the two lengths
    long_, short = (transformer_flops("glm_image", {}, None, _signature(1024, 1024, t)) for t in (40, 1))
    both = transformer_flops("glm_image", {}, None, _signature(1024, 1024, 40, cfg=True))
    assert 2 * both.per_forward == long_.per_forward + short.per_forward
    assert long_.per_forward > short.per_forward


def test_the_tiny_presets_partial_config_counts_as_its_model():
    from diffusers import GlmImageTransformer2DModel

    sigs = (_signature(64, 64, 1, steps=4, cfg=True), _signature(1024, 768, 12, steps=50))
    preset = dict(PRESET["transformer"])
    # The preset names every constructor key; each partial below leaves one of them to the class default
    # (not the width or depth ones: their defaults build the 30-layer, 2560-wide model).
    partials = [preset] + [{k: v for k, v in preset.items() if k != key} for key in preset
                           if key not in ("num_layers", "num_attention_heads", "attention_head_dim")]
    assert len(partials) == 8
    for partial in partials:
        full = dict(GlmImageTransformer2DModel(**partial).config)
        assert set(full) >= set(partial)
        for sig in sigs:
            assert transformer_flops("glm_image", partial, PRESET["vae"], sig) == \
                transformer_flops("glm_image", full, PRESET["vae"], sig)
    # and the published config (the class defaults) counts the same as an empty partial config
    published = {k: v.default for k, v in inspect.signature(GlmImageTransformer2DModel.__init__).parameters.items()
                 if k != "self"}
    sig = _signature(1024, 1024, 1, steps=50, cfg=True)
    assert transformer_flops("glm_image", {}, None, sig) == transformer_flops("glm_image", published, None, sig)


def test_glm_image_dit_at_1024_is_about_2_46e15_an_image():
    """GLM-Image's DiT (the class defaults, benchmarks/families_video.py's REAL["glm_image"]), 1024², a prompt
    without quotes (1 glyph row), 50 steps with CFG 1.5 (conf/model/glm_image.yaml): 2 calls a step.

    By hand: d = 64 x 40 = 2560; a block's token-wise weights W = 4 d² (q, k, v, out) + 8 d² (the 4x MLP)
    = 78,643,200. Tokens: (1024 / 8 / 2)² = 4096 image + 1 glyph, s = 4097.
      30 blocks:          30 x (2 W s + 4 s² d)  = 30 x (6.444e11 + 1.719e11) = 2.4489e13
      prior projector:    2 x 2 x 4096 x d²                                  = 1.074e11
      patches in and out: 2 x 2 x 4096 x 64 x d                              = 2.7e9
      adaLN, timestep, condition and glyph linears                          ~ 1e9
    = 2.460e13 a forward; x 50 steps x 2 rows = 2.460e15 an image (without the attention: 1.94e15;
    one row: 1.23e15). The AR prior (a 9B GLM generating 1,025 tokens) is not in this count."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from diffusers import GlmImageTransformer2DModel
    from families_video import REAL

    published = dict(REAL["glm_image"])
    defaults = {k: v.default for k, v in inspect.signature(GlmImageTransformer2DModel.__init__).parameters.items()}
    assert all(v == defaults[k] for k, v in published.items())  # the class defaults are the released config
    vae = {"block_out_channels": [128, 256, 512, 512]}  # AutoencoderKL, 8x
    count = transformer_flops("glm_image", published, vae, _signature(1024, 1024, 1, steps=50, cfg=True))
    assert count.rows == 2 and count.steps == 50 and count.per_image == 100 * count.per_forward
    assert 2.45e15 < count.per_image < 2.47e15
    # The prompt part (the prior projector, the one glyph row's projector) is about 1.074e11 a forward.
    assert 1.07e11 < count.per_forward_prompt < 1.08e11

"""jobs/models/flops/sana_video.py against torch's own FLOP counter, on tiny real
SanaVideoTransformer3DModel's (CPU, float32), called as SanaVideoPipeline calls it.

The math SDPA backend is forced so the cross-attention's two products reach the counter as bmm's
on every machine (the fused CPU kernels are not all in its registry)."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import torch
import yaml
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from jobs.models.flops import transformer_flops
from jobs.plan import Signature

ROOT = Path(__file__).resolve().parents[1]
TINY = dict(in_channels=8, out_channels=8, num_attention_heads=2, attention_head_dim=16, num_layers=2,
            num_cross_attention_heads=2, cross_attention_head_dim=16, cross_attention_dim=32, caption_channels=24,
            mlp_ratio=2.5, rope_max_seq_len=32)
PROMPT_MODULES = ("caption_projection", "attn2.to_k", "attn2.to_v")


def _signature(height, width, text, frames=1, steps=1, cfg=False):
    return Signature(height=height, width=width, text_bucket=text, steps=steps, guidance_scale=6.0 if cfg else 1.0,
                     cfg=cfg, dtype="float32", frames=frames)


def _preset() -> dict:
    return yaml.safe_load((ROOT / "conf/model/sana_video_tiny.yaml").read_text())["model"]["tiny"]


def _class_defaults() -> dict:
    from diffusers import SanaVideoTransformer3DModel

    return {k: v.default for k, v in inspect.signature(SanaVideoTransformer3DModel.__init__).parameters.items()
            if k != "self"}


def _prompt_flops(counter: FlopCounterMode) -> int:
    by_module = counter.get_flop_counts()
    return sum(sum(by_module[name].values()) for name in by_module if name.endswith(PROMPT_MODULES))


# (config overrides, pixel frames, height, width, text length, CFG). Latents as SanaVideoPipeline.prepare_latents
# makes them with the Wan VAE's defaults: (frames - 1) // 4 + 1 latent frames of (H / 8) x (W / 8).
CASES = [
    ({}, 9, 64, 48, 7, True),  # patch (1, 2, 2): 3 latent frames of 4 x 3 tokens; CFG batch of 2
    (dict(patch_size=(1, 1, 1), guidance_embeds=True), 1, 32, 40, 12, False),  # an image; the guidance embedder
    (dict(patch_size=(2, 2, 2), out_channels=None, mlp_ratio=3.0, qk_norm=None), 13, 32, 64, 5, True),
]


@pytest.mark.parametrize("overrides,frames,height,width,text,cfg", CASES)
def test_count_equals_the_flop_counter(overrides, frames, height, width, text, cfg):
    from diffusers import SanaVideoTransformer3DModel

    torch.manual_seed(0)
    model = SanaVideoTransformer3DModel(**{**TINY, **overrides}).eval()
    rows = 2 if cfg else 1
    latents = torch.randn(1, 8, (frames - 1) // 4 + 1, height // 8, width // 8)
    embeds, mask = torch.randn(rows, text, 24), torch.ones(rows, text, dtype=torch.long)
    mask[0, 3:] = 0  # the negative's few real tokens (masked positions are computed all the same)
    # SanaVideoPipeline: torch.cat([latents] * 2) under CFG, [negative, positive] text, t.expand(rows)
    inputs = dict(hidden_states=torch.cat([latents] * rows), encoder_hidden_states=embeds, encoder_attention_mask=mask,
                  timestep=torch.tensor(999.0).expand(rows))
    if overrides.get("guidance_embeds"):
        inputs["guidance"] = torch.full((rows,), 6.0)  # the forward runs the guidance embedder only when given one
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model(**inputs, return_dict=False)
    count = transformer_flops("sana_video", dict(model.config), None,
                              _signature(height, width, text, frames=frames, cfg=cfg))
    assert count.rows == rows
    assert count.per_forward * rows == counter.get_total_flops()
    # The prompt part is what depends on the text alone: the caption projection and every block's K/V.
    assert count.per_forward_prompt * rows == _prompt_flops(counter) > 0


def _tiny_pipeline(vae_overrides: dict):
    from diffusers import AutoencoderKLWan, SanaVideoPipeline, SanaVideoTransformer3DModel

    from jobs.models.tiny import build_scheduler

    tiny = _preset()
    torch.manual_seed(0)
    pipe = SanaVideoPipeline(tokenizer=None, text_encoder=None, vae=AutoencoderKLWan(**tiny["vae"], **vae_overrides),
                             transformer=SanaVideoTransformer3DModel(**tiny["transformer"]),
                             scheduler=build_scheduler(tiny["scheduler"]))
    pipe.set_progress_bar_config(disable=True)
    return pipe, tiny


@pytest.mark.parametrize("vae_overrides,frames,cfg", [
    ({}, 9, True), ({}, 5, False), (dict(scale_factor_spatial=16, scale_factor_temporal=8), 17, True)])
def test_the_jobs_denoise_call_is_steps_times_rows_forwards(vae_overrides, frames, cfg):
    """The whole denoise stage as a job runs it (SanaVideoFamily.denoise: SanaVideoPipeline with the
    family's kwargs, latents out) on the tiny preset's model: the latent size comes from the
    pipeline's own reading of the VAE config, the text from the bucket, the rows from CFG."""
    import jobs.models.sana_video  # noqa: F401 - registers the family
    from jobs.models.base import DenoiseRequest
    from jobs.models.registry import get_family
    from padding import TextEmbeds

    pipe, tiny = _tiny_pipeline(vae_overrides)
    bucket, steps, height, width = 16, 2, 64, 64
    embeds, mask = torch.randn(1, bucket, 32), torch.ones(1, bucket, dtype=torch.long)
    mask[:, 9:] = 0
    negative = None
    if cfg:  # the negative at the same bucket, its few real tokens first
        negative = TextEmbeds(embeds=torch.randn(1, bucket, 32), mask=(torch.arange(bucket) < 2).long()[None])
    request = DenoiseRequest(positive=TextEmbeds(embeds=embeds, mask=mask), negative=negative, seeds=[0],
                             height=height, width=width, steps=steps, guidance_scale=6.0, num_frames=frames)
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        latents = get_family("sana_video").denoise(pipe, request)
    vae_config = {**tiny["vae"], **vae_overrides}
    count = transformer_flops("sana_video", tiny["transformer"], vae_config,
                              _signature(height, width, bucket, frames=frames, steps=steps, cfg=cfg))
    assert count.per_image == counter.get_total_flops()
    assert count.steps * count.rows * count.per_forward_prompt == _prompt_flops(counter)
    spatial = vae_overrides.get("scale_factor_spatial", 8)
    assert latents.shape[2:] == ((frames - 1) // vae_overrides.get("scale_factor_temporal", 4) + 1,
                                 height // spatial, width // spatial)


def test_partial_configs_count_as_the_class_defaults():
    """A missing key is the class's __init__ default: the tiny preset's partial section counts as
    the full config of the model built from it, and an empty config as the published defaults."""
    from diffusers import SanaVideoTransformer3DModel

    tiny = _preset()
    sig = _signature(64, 64, 64, frames=9, steps=4, cfg=True)  # the preset's sampling section, bucket 64
    model = SanaVideoTransformer3DModel(**tiny["transformer"])
    full = dict(model.config)
    assert transformer_flops("sana_video", tiny["transformer"], tiny["vae"], sig) == \
        transformer_flops("sana_video", full, tiny["vae"], sig)
    # A VAE config without the scale keys is AutoencoderKLWan's (scale_factor_spatial 8, temporal 4).
    from diffusers import AutoencoderKLWan

    vae_full = dict(AutoencoderKLWan(**tiny["vae"]).config)
    at_full_vae = transformer_flops("sana_video", full, vae_full, sig)
    assert transformer_flops("sana_video", full, tiny["vae"], sig) == at_full_vae
    assert transformer_flops("sana_video", full, None, sig) == at_full_vae
    with torch.device("meta"):  # the 2B model's config without its weights
        published = dict(SanaVideoTransformer3DModel().config)
    big = _signature(480, 832, 128, frames=81, steps=50, cfg=True)
    assert transformer_flops("sana_video", {}, None, big) == transformer_flops("sana_video", published, None, big)


def test_sana_video_2b_480p_81_frames_is_about_1_1e16_a_video():
    """SANA-Video 2B (the class defaults, which diffusers documents as the release's; benchmarks/
    families_video.py REAL), at the preset's 480x832, 81 frames, 50 steps, CFG 6 (2 rows):

    tokens: (81 - 1) // 4 + 1 = 21 latent frames of 60 x 104, patch (1, 2, 2): n = 21 x 30 x 52 = 32760.
    d = 20 x 112 = 2240, GLUMB hidden = 2.5 d = 5600. Multiply-adds per latent token and block:
    self-attn q, k, v, out 4 d² = 20.07M; cross q, out 2 d² = 10.04M; GLUMB 1x1 up d x 2h = 25.09M,
    depthwise 2h x 9 = 0.10M, 1x1 down h x d = 12.54M, temporal conv 3 d² = 15.05M: 82.89M, x 20
    blocks = 1.658e9 (the 1.91B parameters less the cross K/V, caption and time embedders), so
    2 x 1.658e9 x 32760 = 1.0862e14 per forward. Linear attention 20 x 20 heads x 4 x 112² x n =
    6.6e11; cross softmax at text 128: 20 x 4 x n x 128 x 2240 = 7.5e11; the prompt part (caption
    projection and K/V at 128) 5.4e10. A forward: ~1.1010e14; x 50 steps x 2 rows = ~1.101e16.
    Without the temporal conv it would be ~9.1e15, with one row ~5.5e15."""
    defaults = _class_defaults()
    count = transformer_flops("sana_video", defaults, None, _signature(480, 832, 128, frames=81, steps=50, cfg=True))
    assert count.rows == 2 and count.steps == 50
    assert 1.09e16 < count.per_image < 1.11e16
    # The plain pipeline's 300 positions: + 20 x 4 x n x 172 x 2240 of cross attention (~1.0e12) and the
    # K/V of 172 more rows (~7e10) a forward: ~1.112e16 a video.
    at_300 = transformer_flops("sana_video", defaults, None, _signature(480, 832, 300, frames=81, steps=50, cfg=True))
    assert 1.105e16 < at_300.per_image < 1.12e16

"""jobs/models/flops/ltx2.py against torch's FLOP counter, on tiny real LTX2VideoTransformer3DModels (CPU).

The transformer's calls are made as LTX2Pipeline makes them for one denoising step of one video:
with guidance the CFG batch [negative, positive], then the spatio-temporal guidance call and the
modality-isolation call on the positive row; without, one call. One test drives the family's own
tiny pipeline (jobs/models/ltx2.py pipeline_kwargs) and counts the transformer's share of it, so the
rows and the token counts are the job's. The math SDPA backend is forced so attention's two
products reach the counter as bmm's."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import torch
import yaml
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from jobs.models.flops import transformer_flops
from jobs.models.flops.ltx2 import FPS, STG_BLOCKS, ltx2_forward
from jobs.plan import Signature

PRESET = yaml.safe_load((Path(__file__).resolve().parents[1] / "conf/model/ltx2_tiny.yaml").read_text())
TINY = PRESET["model"]["tiny"]  # its transformer (2 layers, 16 / 8 wide) and its 8x / 4x VAE
ROOT = "LTX2VideoTransformer3DModel"


def _pipeline_default(name):
    from diffusers import LTX2Pipeline

    return inspect.signature(LTX2Pipeline.__call__).parameters[name].default


def _signature(height, width, frames, text, cfg, steps=1):
    return Signature(height=height, width=width, text_bucket=text, steps=steps, guidance_scale=3.0 if cfg else 1.0,
                     cfg=cfg, dtype="float32", frames=frames)


def _prompt_flops(counter, prompt_kv: bool) -> int:
    """The counter's FLOPs in the modules the rule calls the prompt part."""
    names = ("caption_projection", "attn2.to_k", "attn2.to_v") if prompt_kv else ("caption_projection",)
    by_module = counter.get_flop_counts()
    return sum(sum(by_module[k].values()) for k in by_module if k.startswith(ROOT + ".") and k.endswith(names))


def _step_calls(model, frames, height, width, text, spatial, temporal):
    """(CFG pair, STG, modality isolation) counters of LTX2Pipeline's three transformer calls of one
    step, their inputs laid out as __call__ lays them out (packed latents, connector text and mask,
    the rope's coordinates at 24 fps, CFG rows [negative, positive])."""
    c = model.config
    lf, lh, lw = (frames - 1) // temporal + 1, height // spatial, width // spatial
    audio_frames = round(frames / 24.0 * (16000 / 160 / float(4)))  # __call__: duration x latents per second
    text_dim = c.caption_channels if c.use_prompt_embeddings else c.cross_attention_dim
    audio_text_dim = c.caption_channels if c.use_prompt_embeddings else c.audio_cross_attention_dim
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, lf * lh * lw, c.in_channels, generator=g)
    a = torch.randn(1, audio_frames, c.audio_in_channels, generator=g)
    video_text = torch.randn(2, text, text_dim, generator=g)  # [negative, positive]
    audio_text = torch.randn(2, text, audio_text_dim, generator=g)
    mask = torch.ones(2, text, dtype=torch.int64)  # the connectors' mask: registers fill the padding
    video_coords = model.rope.prepare_video_coords(1, lf, lh, lw, "cpu", fps=24.0)
    audio_coords = model.audio_rope.prepare_audio_coords(1, audio_frames, "cpu")
    t = torch.tensor(900.0)

    def call(rows, **kw):
        timestep = t.expand(rows)
        pick = slice(0, 2) if rows == 2 else slice(1, 2)
        with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
            model(hidden_states=torch.cat([x] * rows), audio_hidden_states=torch.cat([a] * rows),
                  encoder_hidden_states=video_text[pick], audio_encoder_hidden_states=audio_text[pick],
                  timestep=timestep, sigma=timestep, encoder_attention_mask=mask[pick],
                  audio_encoder_attention_mask=mask[pick], num_frames=lf, height=lh, width=lw, fps=24.0,
                  audio_num_frames=audio_frames,
                  video_coords=video_coords.repeat((rows,) + (1,) * (video_coords.ndim - 1)),
                  audio_coords=audio_coords.repeat((rows,) + (1,) * (audio_coords.ndim - 1)), perturbation_mask=None,
                  use_cross_timestep=True, attention_kwargs=None, return_dict=False, **kw)
        return counter

    stg_blocks = _pipeline_default("spatio_temporal_guidance_blocks")
    return (call(2, isolate_modalities=False, spatio_temporal_guidance_blocks=None),
            call(1, isolate_modalities=False, spatio_temporal_guidance_blocks=stg_blocks),
            call(1, isolate_modalities=True, spatio_temporal_guidance_blocks=None))


CASES = [
    # the preset's transformer and VAE at its 9 frames of 64x64, text 128
    pytest.param({}, "tiny", (64, 64, 9, 128), id="preset"),
    # gated attention in both streams, LTX-2.3's cross-attention modulation with its timestep-dependent
    # prompt adaLN (the text K/V are then latent work), audio heads unlike the video's, another size,
    # more frames and text
    pytest.param(dict(gated_attn=True, audio_gated_attn=True, cross_attn_mod=True, audio_cross_attn_mod=True,
                      audio_num_attention_heads=4, audio_attention_head_dim=2),
                 "tiny", (96, 64, 13, 256), id="gated-prompt-adaln"),
    # 29 layers with the perturbed processor, so the STG call really skips block 28's self-attention;
    # the static prompt modulation (K/V stay prompt work) without caption projections; geglu MLPs;
    # no VAE config: the released 32x / 8x
    pytest.param(dict(num_layers=29, perturbed_attn=True, cross_attn_mod=True, use_prompt_adaln_single=False,
                      use_prompt_embeddings=False, activation_fn="geglu"),
                 None, (64, 128, 17, 128), id="stg-static-kv"),
]


@pytest.mark.parametrize("overrides,vae,shape", CASES)
def test_ltx2_count_equals_the_flop_counter(overrides, vae, shape):
    from diffusers import LTX2VideoTransformer3DModel

    torch.manual_seed(0)
    model = LTX2VideoTransformer3DModel(**{**TINY["transformer"], **overrides}).eval()
    vae_config = TINY["vae"] if vae == "tiny" else None
    spatial, temporal = (8, 4) if vae == "tiny" else (32, 8)
    height, width, frames, text = shape
    pair, stg, isolated = _step_calls(model, frames, height, width, text, spatial, temporal)
    config = dict(model.config)
    sig = _signature(height, width, frames, text, cfg=True)
    # each call on its own, per row
    for counter, rows, kw in ((pair, 2, {}), (stg, 1, {"stg": True}), (isolated, 1, {"isolate": True})):
        image, prompt = ltx2_forward(config, vae_config, sig, **kw)
        assert (image + prompt) * rows == counter.get_total_flops(), kw
    if overrides.get("perturbed_attn"):  # STG does skip work here, and isolation always does
        assert stg.get_total_flops() < pair.get_total_flops() / 2
    assert isolated.get_total_flops() < pair.get_total_flops() / 2
    # a step of a video under guidance: the four rows, each with the prompt part
    count = transformer_flops("ltx2", config, vae_config, sig)
    total = sum(c.get_total_flops() for c in (pair, stg, isolated))
    assert count.rows == 4 and count.per_forward * count.rows == total
    prompt_kv = not (model.config.cross_attn_mod and model.config.use_prompt_adaln_single)
    assert count.per_forward_prompt * count.rows == sum(_prompt_flops(c, prompt_kv) for c in (pair, stg, isolated))
    assert count.per_forward_prompt > 0
    # without guidance: one row, the plain call's
    plain = transformer_flops("ltx2", config, vae_config, _signature(height, width, frames, text, cfg=False))
    assert plain.rows == 1 and plain.per_forward * 2 == pair.get_total_flops()


@pytest.mark.parametrize("cfg", [True, False])
def test_the_jobs_pipeline_calls_are_counted(cfg):
    """The family's tiny pipeline, called with its own pipeline_kwargs for 2 steps (the job's denoise):
    the transformer's FLOPs in the whole call are steps x rows x per_forward, the text at the
    preset's 1024, the video and audio tokens as the pipeline derives them."""
    from jobs.models.base import DenoiseRequest
    from tests.helpers import tiny_pipeline

    config, fam, pipe = tiny_pipeline("ltx2_tiny")
    s = config.sampling
    frames = 17  # not the preset's 9: 9 frames at 24 fps give 9 audio tokens, as a rate of 25 would
    with torch.no_grad():
        pos = fam.encode(pipe, ["a red fox"], config.model, "cpu", instruction=True)
        neg = fam.encode(pipe, [""], config.model, "cpu", instruction=True) if cfg else None
    request = DenoiseRequest(positive=pos, negative=neg, seeds=[3], height=s.height, width=s.width, steps=2,
                             guidance_scale=s.guidance_scale, num_frames=frames, fps=s.fps)
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        fam.denoise(pipe, request)
    sig = _signature(s.height, s.width, frames, pos.length, cfg, steps=2)
    count = transformer_flops("ltx2", dict(pipe.transformer.config), dict(pipe.vae.config), sig)
    assert pos.length == 1024 and count.rows == (4 if cfg else 1)
    assert count.per_image == sum(counter.get_flop_counts()[ROOT].values())
    assert count.steps * count.rows * count.per_forward_prompt == _prompt_flops(counter, True)


def test_the_rule_reads_the_pipelines_defaults():
    """The STG blocks and the frame rate the rule assumes are LTX2Pipeline's, and the family passes
    neither under guidance (nor the preset another rate)."""
    from jobs.models.base import DenoiseRequest
    from jobs.models.ltx2 import LTX2Family
    from padding import TextEmbeds

    assert STG_BLOCKS == tuple(_pipeline_default("spatio_temporal_guidance_blocks"))
    assert FPS == _pipeline_default("frame_rate") == PRESET["sampling"]["fps"]
    text = TextEmbeds(embeds=torch.zeros(1, 4, 2), mask=torch.ones(1, 4))
    kwargs = LTX2Family().pipeline_kwargs(DenoiseRequest(positive=text, negative=text, seeds=[0], height=64, width=64,
                                                         steps=1, guidance_scale=3.0, num_frames=9, fps=24.0))
    assert "spatio_temporal_guidance_blocks" not in kwargs and "stg_scale" not in kwargs
    assert "modality_scale" not in kwargs and _pipeline_default("stg_scale") > 0
    assert _pipeline_default("modality_scale") > 1  # so both extra calls run under guidance


def test_ltx2_19b_at_the_preset_size():
    """LTX-2 (the class defaults, which benchmarks/families_video.py runs as the released 19B: 48
    layers, video 4096 wide, audio 2048), conf/model/ltx2.yaml's 512x768, 121 frames, 30 steps,
    guidance: per video ~2.3e16.

    By hand: 16 latent frames x 16 x 24 = 6144 video tokens, round(121 / 24 x 25) = 126 audio tokens,
    1024 text tokens. Per block, the video tokens go through 14 d² + 4 d a = 268M weights (self 4 d²,
    text q/out 2 d², MLP 8 d², a2v q/out and v2a k/v 4 d a): 2 x 268M x 6144 = 3.30e12; audio tokens
    18 a² = 75M weights: 1.9e10; text K/V 2 (4096² + 2048²) = 42M: 8.6e10; attention 4 x 6144² x 4096
    = 6.18e11 (video self), 4 x 6144 x 1024 x 4096 = 1.03e11 (video-text), 1.4e10 (the rest):
    4.14e12 a block, x 48 = 1.99e14 a full call. The isolation call drops a2v and v2a (4 x 6144 x
    4096 x 2048 x 2 + ~2e10 a block: 2.06e13), and the STG call is a full one (perturbed_attn off):
    a step is 3 x 1.99e14 + 1.78e14 = 7.74e14; x 30 steps = 2.32e16."""
    sig = _signature(512, 768, 121, 1024, cfg=True, steps=30)
    count = transformer_flops("ltx2", {}, None, sig)
    assert 2.25e16 < count.per_image < 2.40e16
    assert count.rows == 4 and count.steps == 30
    # the released VAE's explicit ratios give the same tokens as no VAE config
    released_vae = {"spatial_compression_ratio": 32, "temporal_compression_ratio": 8}
    assert transformer_flops("ltx2", {}, released_vae, sig) == count
    # one call without guidance: ~2.0e14 (the full call above)
    plain = transformer_flops("ltx2", {}, None, _signature(512, 768, 121, 1024, cfg=False, steps=30))
    assert 1.95e14 < plain.per_forward < 2.03e14


def test_the_tiny_presets_partial_config_counts_as_the_full_one():
    """model.tiny.transformer / .vae name a few constructor kwargs; the rule's defaults for the rest
    must be the classes' own."""
    from diffusers import AutoencoderKLLTX2Video, LTX2VideoTransformer3DModel

    torch.manual_seed(0)
    model = LTX2VideoTransformer3DModel(**TINY["transformer"])
    vae = AutoencoderKLLTX2Video(**TINY["vae"])
    for cfg in (True, False):
        sig = _signature(64, 96, 13, 1024, cfg=cfg, steps=4)
        partial = transformer_flops("ltx2", TINY["transformer"], TINY["vae"], sig)
        full = transformer_flops("ltx2", dict(model.config), dict(vae.config), sig)
        assert partial == full
    # and the class defaults as a partial config ({}) are the class's full config
    full_default = {k: v.default for k, v in inspect.signature(LTX2VideoTransformer3DModel.__init__).parameters.items()
                    if k != "self"}
    sig = _signature(512, 768, 121, 1024, cfg=True, steps=30)
    assert transformer_flops("ltx2", {}, None, sig) == transformer_flops("ltx2", full_default, None, sig)

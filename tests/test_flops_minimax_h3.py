"""jobs/models/flops/minimax_h3.py against torch's own FLOP counter, on tiny real MiniMaxH3Transformer3DModel's
(CPU, float32), called as the family's denoise calls it (jobs/models/minimax_h3.py: the packed t2va layout of
MiniMaxH3PrepareLayoutStep, the timestep plan of MiniMaxH3SetTimestepsStep).

The math SDPA backend is forced so attention's two products reach the counter as bmm's on every machine (the
fused CPU kernels are not all in its registry)."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import torch
import yaml
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from jobs.models.flops import transformer_flops
from jobs.models.flops.minimax_h3 import timestep_flops, timesteps_per_call
from jobs.plan import Signature

ROOT = Path(__file__).resolve().parents[1]
PROMPT_MODULES = (".context_embedder", ".token_refiner")  # the token refiner's own count holds its blocks'


def _signature(height, width, text, frames, steps=2):
    return Signature(height=height, width=width, text_bucket=text, steps=steps, guidance_scale=1.0, cfg=False,
                     dtype="float32", frames=frames)


def _preset() -> dict:
    return yaml.safe_load((ROOT / "conf/model/minimax_h3_tiny.yaml").read_text())["model"]["tiny"]


def _prompt_flops(counter: FlopCounterMode) -> int:
    by_module = counter.get_flop_counts()
    return sum(sum(by_module[name].values()) for name in by_module if name.endswith(PROMPT_MODULES))


def _family():
    import jobs.models.minimax_h3  # noqa: F401 - registers the family
    from jobs.models.registry import get_family

    return get_family("minimax_h3")


def _pipeline(transformer_overrides=None, vae_overrides=None):
    """The family's container (the modular pipeline) over the tiny preset's real components."""
    from diffusers import (
        AutoencoderKLMiniMaxH3,
        AutoencoderKLMiniMaxH3Audio,
        MiniMaxH3Scheduler,
        MiniMaxH3Transformer3DModel,
    )

    tiny = _preset()
    torch.manual_seed(0)
    return _family()._assemble(
        transformer=MiniMaxH3Transformer3DModel(**{**tiny["transformer"], **(transformer_overrides or {})}).eval(),
        vae=AutoencoderKLMiniMaxH3(**{**tiny["vae"], **(vae_overrides or {})}).eval(),
        audio_vae=AutoencoderKLMiniMaxH3Audio(**tiny["audio_vae"]).eval(),
        scheduler=MiniMaxH3Scheduler(**tiny["scheduler"]),
        audio_scheduler=MiniMaxH3Scheduler(**tiny["audio_scheduler"]))


def _request(text, rows, height, width, frames, steps):
    from jobs.models.base import DenoiseRequest
    from padding import TextEmbeds

    embeds = torch.randn(rows, text, 16)
    return DenoiseRequest(positive=TextEmbeds(embeds=embeds, mask=torch.ones(rows, text, dtype=torch.long)),
                          negative=None, seeds=list(range(rows)), height=height, width=width, steps=steps,
                          guidance_scale=1.0, num_frames=frames)


# (transformer overrides, VAE overrides, pixel frames, height, width, text length). The latent geometry is the
# pipeline's own (MiniMaxH3ModularPipeline's reading of the VAE: 16x space, 17-frame chunks kept as 5 latents, + 2).
CASES = [
    ({}, {}, 124, 64, 64, 5),  # the preset's clip: 37 latent frames of 2 x 2 tokens, 414 audio rows
    # a 4 x 2 patch (the layout takes a time patch of 1, the release's), one block, two refiners, 3 heads
    (dict(patch_size=(1, 4, 2), num_layers=1, num_refiner_layers=2, num_attention_heads=3), {}, 39, 128, 64, 11),
    (dict(patch_size=(1, 1, 1), ffn_dim=48, freq_dim=32, time_embed_dim=24, time_embed_hidden_dim=40),
     dict(block_out_channels=(8, 8, 8), spatial_downsample_factors=(2, 2, 2), temporal_downsample_factors=(1, 2, 1)),
     26, 32, 48, 3),  # a 1x1 patch; a VAE of 8x space, 2x time: 17-frame chunks kept as 9 latents
]


def _one_call(pipe, text, rows, height, width, frames, steps, call):
    """The transformer's `call`-th forward of the family's denoise, under the counter (inputs as denoise makes them)."""
    family = _family()
    request = _request(text, rows, height, width, frames, steps)
    geo = family.geometry(pipe, request)
    layout = family.layout(pipe, text, geo)
    timestep, indices = family.timestep_plan(pipe, steps, layout)[call]
    video, audio = family.noise(pipe, request.seeds, geo, "cpu")
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        pipe.transformer(hidden_states=video, audio_hidden_states=audio, encoder_hidden_states=request.positive.embeds,
                         timestep=timestep, timestep_indices=indices, return_dict=False, **layout)
    return counter, timestep.numel()


@pytest.mark.parametrize("overrides,vae_overrides,frames,height,width,text", CASES)
def test_count_equals_the_flop_counter(overrides, vae_overrides, frames, height, width, text):
    pipe = _pipeline(overrides, vae_overrides)
    counter, timesteps = _one_call(pipe, text, 1, height, width, frames, steps=2, call=0)
    assert timesteps == 1  # a 2-point schedule is one call, at t = 0 for video and audio alike
    count = transformer_flops("minimax_h3", dict(pipe.transformer.config), dict(pipe.vae.config),
                              _signature(height, width, text, frames))
    assert (count.rows, count.steps) == (1, 1)  # guidance-distilled: one row; the terminal sigma has no call
    assert count.per_forward == counter.get_total_flops()
    # The prompt part is what the text alone makes: the context embedder and the token refiner.
    assert count.per_forward_prompt == _prompt_flops(counter) > 0


def test_a_batch_shares_the_timestep_part():
    """Rows of a batch share one layout and one timestep embedding: the timestep MLP and the AdaLN projections run
    on the distinct timesteps (2 at a later call), once for the batch; everything else is per row."""
    pipe = _pipeline()
    counter, timesteps = _one_call(pipe, 6, 2, 64, 64, 22, steps=3, call=1)
    assert timesteps == 2
    alone, _ = _one_call(pipe, 6, 1, 64, 64, 22, steps=3, call=1)
    shared = timestep_flops(dict(pipe.transformer.config), 2)
    assert counter.get_total_flops() == 2 * alone.get_total_flops() - shared
    # and the rule's per-row count at 2 timesteps is that lone call's
    count = transformer_flops("minimax_h3", _preset()["transformer"], None, _signature(64, 64, 6, 22, steps=2))
    assert count.per_forward - timestep_flops(_preset()["transformer"], 1) + shared == alone.get_total_flops()


@pytest.mark.parametrize("steps,rows", [(4, 1), (3, 2)])
def test_the_jobs_denoise_is_every_call_of_the_clip(steps, rows):
    """The whole denoise stage as the job runs it (MiniMaxH3Family.denoise) on the tiny preset's model: steps - 1
    calls, the first at one distinct timestep, the others at two; per_image is their total for one row."""
    pipe = _pipeline()
    text, height, width, frames = 7, 64, 96, 22
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        video, audio, geo = _family().denoise(pipe, _request(text, rows, height, width, frames, steps))
    tiny = _preset()
    count = transformer_flops("minimax_h3", tiny["transformer"], tiny["vae"],
                              _signature(height, width, text, frames, steps=steps))
    assert count.steps == steps - 1
    # A batch makes the timestep part once a call, not once a row (the preset runs one video a batch).
    shared = (rows - 1) * sum(timestep_flops(tiny["transformer"], k) for k in timesteps_per_call(steps))
    assert rows * count.per_image - shared == pytest.approx(counter.get_total_flops(), rel=1e-12)
    assert rows * count.steps * count.per_forward_prompt == _prompt_flops(counter)
    assert video.shape[:2] == (rows, geo["num_latent_frames"] * (height // 32) * (width // 32))


@pytest.mark.parametrize("steps", [2, 3, 30, 50])
def test_the_calls_and_their_timesteps_are_the_familys_plan(steps):
    """The rule's calls per clip and distinct timesteps per call are MiniMaxH3SetTimestepsStep's plan as the family
    builds it with the preset's two schedules (video shift 12, audio 3, the release's)."""
    family = _family()
    pipe = _pipeline()
    layout = family.layout(pipe, 5, family.geometry(pipe, _request(5, 1, 64, 64, 124, steps)))
    plan = family.timestep_plan(pipe, steps, layout)
    assert [t.numel() for t, _ in plan] == timesteps_per_call(steps)
    assert transformer_flops("minimax_h3", {}, None, _signature(768, 1344, 77, 124, steps=steps)).steps == len(plan)


def test_partial_configs_count_as_the_class_defaults():
    """A missing key is the class's __init__ default: the tiny preset's partial sections count as the full configs
    of the models built from them, and empty configs as the published defaults."""
    from diffusers import AutoencoderKLMiniMaxH3, MiniMaxH3Transformer3DModel

    tiny = _preset()
    sig = _signature(64, 64, 9, 124, steps=3)  # the preset's sampling section
    full = dict(MiniMaxH3Transformer3DModel(**tiny["transformer"]).config)
    vae_full = dict(AutoencoderKLMiniMaxH3(**tiny["vae"]).config)
    assert transformer_flops("minimax_h3", tiny["transformer"], tiny["vae"], sig) == \
        transformer_flops("minimax_h3", full, vae_full, sig)
    with torch.device("meta"):  # the 30B model's and its VAE's configs without their weights
        published = dict(MiniMaxH3Transformer3DModel().config)
        vae_published = dict(AutoencoderKLMiniMaxH3().config)
    big = _signature(768, 1344, 77, 124, steps=30)
    assert transformer_flops("minimax_h3", {}, None, big) == \
        transformer_flops("minimax_h3", published, vae_published, big)
    defaults = {k: v.default for k, v in inspect.signature(MiniMaxH3Transformer3DModel.__init__).parameters.items()}
    assert (defaults["hidden_size"], defaults["num_layers"], defaults["ffn_dim"]) == (5376, 50, 14336)


def test_published_size_is_about_1_0e17_a_clip():
    """The release (the class defaults: 5376 wide, 56 x 128 heads, 50 layers, SwiGLU 14336) at the preset's
    768x1344, 124 frames, 30 grid points (29 calls), a 77-token prompt.

    By hand: 37 latent frames x (48 / 2) x (84 / 2) = 37296 video rows, round(124 / 24 x 40) = 207 x 2 = 414
    audio rows, 77 text: S = 37787. A block: 2 S (4 x 5376 x 7168 + 3 x 5376 x 14336) = 2.912e13 for the linears
    (19.3B block parameters), 4 S^2 x 7168 = 4.094e13 for attention; 50 blocks: 3.503e15 a call, 1.016e17 for
    29 calls. The heads, projections, refiner and timestep part add < 0.1%."""
    count = transformer_flops("minimax_h3", {}, None, _signature(768, 1344, 77, 124, steps=30))
    assert (count.steps, count.rows) == (29, 1)
    assert 1.014e17 < count.per_image < 1.020e17
    assert count.per_forward_prompt < 1e-3 * count.per_forward

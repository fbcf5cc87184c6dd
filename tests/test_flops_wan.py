"""jobs/models/flops/wan.py against torch's own FLOP counter, on a tiny real WanTransformer3DModel (CPU).

Each forward is built as WanPipeline.__call__ builds it: latents [B, C, (frames - 1) / 4 + 1, H / 8, W / 8],
the timestep as `t.expand(B)` (or, under Wan 2.2 TI2V's expand_timesteps, one a token of the latent's
[:, ::2, ::2] grid), the prompt embeddings cut to the prompt's tokens and re-padded with zero rows to the
text length (512), the negative prompt as a second call. The math SDPA backend is forced so attention's two
products reach the counter as bmm's."""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

import pytest
import torch
import yaml
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from jobs.models.flops import transformer_flops
from jobs.plan import Signature

ROOT = Path(__file__).resolve().parents[1]
TINY = yaml.safe_load((ROOT / "conf" / "model" / "wan_tiny.yaml").read_text())["model"]["tiny"]["transformer"]


def _signature(height, width, frames, text, steps=1, cfg=False):
    return Signature(height=height, width=width, text_bucket=text, steps=steps, guidance_scale=5.0 if cfg else 1.0,
                     cfg=cfg, dtype="float32", frames=frames)


def _model(**overrides):
    from diffusers import WanTransformer3DModel

    torch.manual_seed(0)
    return WanTransformer3DModel(**{**TINY, **overrides}).eval()


def _text(batch, real, length, width):
    """_get_t5_prompt_embeds: the encoder's rows for the prompt's tokens, then zero rows to `length`."""
    rows = torch.randn(batch, real, width)
    return torch.cat([rows, rows.new_zeros(batch, length - real, width)], dim=1)


def _timestep(latents, t, expand):
    if not expand:
        return t.expand(latents.shape[0])
    mask = torch.ones(latents.shape)
    return (mask[0][0][:, ::2, ::2] * t).flatten().unsqueeze(0).expand(latents.shape[0], -1)


def _denoise_step(model, latents, text, negative, expand=False) -> FlopCounterMode:
    """One step of WanPipeline's loop: the conditional call, and the unconditional one under CFG."""
    t = torch.tensor(999.0)
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        for embeds in [text] + ([negative] if negative is not None else []):
            model(hidden_states=latents, timestep=_timestep(latents, t, expand), encoder_hidden_states=embeds,
                  attention_kwargs=None, return_dict=False)
    return counter


# (transformer overrides, vae config, height, width, frames, text length, videos a call, cfg)
CASES = {
    "preset_cfg_two_videos": ({}, None, 64, 64, 9, 512, 2, True),
    "patch_2x2x2_short_text": (dict(patch_size=(2, 2, 2)), None, 48, 80, 13, 77, 1, False),
    "ti2v_expand_timesteps": (dict(in_channels=48, out_channels=48, num_layers=1, ffn_dim=48),
                              {"is_residual": True, "z_dim": 48, "scale_factor_spatial": 16,
                               "scale_factor_temporal": 4}, 96, 160, 5, 40, 1, True),
}


@pytest.mark.parametrize("case", list(CASES))
def test_wan_count_equals_the_flop_counter(case):
    overrides, vae, height, width, frames, text, batch, cfg = CASES[case]
    model = _model(**overrides)
    spatial = (vae or {}).get("scale_factor_spatial", 8)
    c = model.config.in_channels
    latents = torch.randn(batch, c, (frames - 1) // 4 + 1, height // spatial, width // spatial)
    positive = _text(batch, 7, text, model.config.text_dim)
    negative = _text(batch, 3, text, model.config.text_dim) if cfg else None
    counter = _denoise_step(model, latents, positive, negative, expand=bool(vae and vae.get("is_residual")))

    count = transformer_flops("wan", model.config, vae, _signature(height, width, frames, text, cfg=cfg))
    assert count.rows == (2 if cfg else 1)
    assert count.per_forward * count.rows * batch == counter.get_total_flops()
    # The prompt part: the text embedder and every block's cross-attention K/V, over the text alone.
    by_module = counter.get_flop_counts()
    prompt = sum(sum(by_module[name].values()) for name in by_module
                 if name.endswith(("condition_embedder.text_embedder", "attn2.to_k", "attn2.to_v")))
    assert prompt > 0
    assert count.per_forward_prompt * count.rows * batch == prompt


def test_expand_timesteps_embeds_the_time_once_a_token():
    """Wan 2.2 TI2V (residual VAE): the time embedder and its 6-way projection run over every token."""
    config = dict(TINY)
    sig = _signature(64, 64, 9, 512)
    wan21 = transformer_flops("wan", config, {"scale_factor_spatial": 8}, sig)
    wan22 = transformer_flops("wan", config, {"scale_factor_spatial": 8, "is_residual": True}, sig)
    tokens, d, freq = 3 * 4 * 4, 2 * 12, 32
    per_row = 2 * (freq * d + d * d + d * 6 * d)
    assert wan22.per_forward_image - wan21.per_forward_image == (tokens - 1) * per_row
    assert wan22.per_forward_prompt == wan21.per_forward_prompt


def test_defaults_are_the_classes():
    """An empty config is the class's own defaults, transformer and VAE alike."""
    from diffusers import AutoencoderKLWan, WanTransformer3DModel

    def defaults(cls):
        return {k: v.default for k, v in inspect.signature(cls.__init__).parameters.items() if k != "self"}

    sig = _signature(480, 832, 81, 512, steps=50, cfg=True)
    full = transformer_flops("wan", defaults(WanTransformer3DModel), defaults(AutoencoderKLWan), sig)
    assert transformer_flops("wan", {}, None, sig) == full
    assert transformer_flops("wan", {}, {}, sig) == full


def test_the_tiny_presets_partial_config_counts_as_its_models_full_config():
    model = _model()
    sig = _signature(64, 64, 9, 512, steps=4, cfg=True)  # the preset's sampling defaults
    partial = transformer_flops("wan", dict(TINY), None, sig)
    assert partial == transformer_flops("wan", dict(model.config), None, sig)
    # and the preset's own VAE section (which leaves the scale factors to AutoencoderKLWan's defaults)
    vae = yaml.safe_load((ROOT / "conf" / "model" / "wan_tiny.yaml").read_text())["model"]["tiny"]["vae"]
    assert transformer_flops("wan", dict(TINY), vae, sig) == partial


def test_wan_published_sizes_at_480x832x81():
    """Wan 2.1 T2V at the preset's defaults: 480x832, 81 frames, 50 steps, CFG (2 calls a step), text 512.

    Tokens: 81 frames -> 21 latent frames; 480x832 / 8 = 60x104 latent -> 30x52 patches: n = 21 x 1560 = 32,760.
    1.3B (benchmarks/families_video.py WAN_1_3B: width 1536, ffn 8960, 30 layers): per layer and video token
    6 x 1536^2 + 2 x 1536 x 8960 = 41.68M weights -> 2 x 41.68M x 30 x 32,760 = 8.19e13; self-attention
    4 n^2 d x 30 = 4 x 32,760^2 x 1536 x 30 = 1.978e14; cross-attention 4 n 512 d x 30 = 3.1e12; text and
    patch layers < 2e11. About 2.83e14 a forward, x 50 steps x 2 rows = 2.83e16 a video.
    14B (the class defaults: width 5120, ffn 13824, 40 layers): 6 x 5120^2 + 2 x 5120 x 13824 = 298.8M weights
    a layer -> 2 x 298.8M x 40 x 32,760 = 7.83e14; self-attention 4 x 32,760^2 x 5120 x 40 = 8.79e14;
    cross 1.37e13; text 2.2e12. About 1.678e15 a forward, 1.678e17 a video."""
    from diffusers import WanTransformer3DModel

    if str(ROOT / "benchmarks") not in sys.path:
        sys.path.insert(0, str(ROOT / "benchmarks"))
    from families_video import WAN_1_3B

    sig = _signature(480, 832, 81, 512, steps=50, cfg=True)
    small = transformer_flops("wan", dict(WAN_1_3B), None, sig).per_image
    assert 2.80e16 < small < 2.86e16
    defaults = {k: v.default for k, v in inspect.signature(WanTransformer3DModel.__init__).parameters.items()
                if k != "self"}
    large = transformer_flops("wan", defaults, None, sig).per_image
    assert 1.66e17 < large < 1.70e17

"""jobs/models/flops/ against torch's own FLOP counter, on tiny real diffusers transformers (CPU).

The math SDPA backend is forced so attention's two products reach the counter as bmm's on every
machine (the fused CPU kernels are not all in its registry)."""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from jobs.models.flops import flops_summary, transformer_flops
from jobs.plan import Signature

SANA_TINY = dict(in_channels=8, out_channels=8, num_attention_heads=4, attention_head_dim=16, num_layers=2,
                 num_cross_attention_heads=2, cross_attention_head_dim=32, cross_attention_dim=64, caption_channels=48,
                 mlp_ratio=2.5, sample_size=8)
FLUX_TINY = dict(patch_size=1, in_channels=16, num_layers=2, num_single_layers=3, attention_head_dim=16,
                 num_attention_heads=2, joint_attention_dim=24, pooled_projection_dim=12, axes_dims_rope=(4, 6, 6))


def _signature(height, width, text, steps=1, cfg=False):
    return Signature(height=height, width=width, text_bucket=text, steps=steps, guidance_scale=4.5 if cfg else 1.0,
                     cfg=cfg, dtype="float32")


def _counted(model, **inputs) -> FlopCounterMode:
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model(**inputs, return_dict=False)
    return counter


@pytest.mark.parametrize("patch,guidance_embeds", [(1, False), (2, False), (1, True)])
def test_sana_count_equals_the_flop_counter(patch, guidance_embeds):
    from diffusers import SanaTransformer2DModel

    torch.manual_seed(0)
    model = SanaTransformer2DModel(**SANA_TINY, patch_size=patch, guidance_embeds=guidance_embeds).eval()
    rows, text, h, w = 3, 7, 4, 6  # a latent of h x w; the default VAE rule is SANA's 32x DC-AE
    mask = torch.ones(rows, text, dtype=torch.long)
    mask[:, 5:] = 0  # masked positions are still computed: the count does not depend on the mask
    inputs = dict(hidden_states=torch.randn(rows, 8, h, w), encoder_hidden_states=torch.randn(rows, text, 48),
                  encoder_attention_mask=mask, timestep=torch.full((rows,), 500.0))
    if guidance_embeds:
        inputs["guidance"] = torch.full((rows,), 4.5)
    counter = _counted(model, **inputs)
    count = transformer_flops("sana", model.config, None, _signature(h * 32, w * 32, text))
    assert count.per_forward * rows == counter.get_total_flops()
    # The prompt part is exactly what a prompt memo makes once: the caption projection and every block's K/V.
    by_module = counter.get_flop_counts()
    prompt = sum(sum(by_module[name].values()) for name in by_module
                 if name.endswith(("caption_projection", "attn2.to_k", "attn2.to_v")))
    assert count.per_forward_prompt * rows == prompt


def test_sana_reads_the_vae_scale_from_its_config():
    from diffusers import SanaTransformer2DModel

    torch.manual_seed(0)
    model = SanaTransformer2DModel(**SANA_TINY).eval()
    vae = {"encoder_block_out_channels": [16, 32, 64, 64]}  # the tiny preset's 8x DC-AE
    counter = _counted(model, hidden_states=torch.randn(1, 8, 5, 3), encoder_hidden_states=torch.randn(1, 4, 48),
                       timestep=torch.full((1,), 10.0))
    assert transformer_flops("sana", model.config, vae, _signature(40, 24, 4)).per_forward == counter.get_total_flops()


@pytest.mark.parametrize("guidance_embeds", [False, True])
def test_flux_count_equals_the_flop_counter(guidance_embeds):
    from diffusers import FluxTransformer2DModel

    torch.manual_seed(0)
    model = FluxTransformer2DModel(**FLUX_TINY, guidance_embeds=guidance_embeds).eval()
    rows, text, h, w = 2, 5, 3, 4  # packed 2x2 tokens: an image of (16 h) x (16 w) with the 8x VAE
    inputs = dict(hidden_states=torch.randn(rows, h * w, 16), encoder_hidden_states=torch.randn(rows, text, 24),
                  pooled_projections=torch.randn(rows, 12), timestep=torch.full((rows,), 0.5),
                  img_ids=torch.zeros(h * w, 3), txt_ids=torch.zeros(text, 3))
    if guidance_embeds:
        inputs["guidance"] = torch.full((rows,), 3.5)
    counter = _counted(model, **inputs)
    count = transformer_flops("flux", model.config, {"block_out_channels": [8, 8, 8, 8]}, _signature(h * 16, w * 16, text))
    assert count.per_forward * rows == counter.get_total_flops()


def test_an_image_is_every_step_of_every_cfg_row():
    config = dict(SANA_TINY)
    one = transformer_flops("sana", config, None, _signature(128, 128, 64))
    image = transformer_flops("sana", config, None, _signature(128, 128, 64, steps=20, cfg=True))
    assert image.per_image == 20 * 2 * one.per_forward
    assert image.per_image_with_prompt_memo == 2 * (20 * one.per_forward_image + one.per_forward_prompt)


def test_sana_1600m_at_1024_is_about_1_1e14_an_image():
    """ANCHORS.md's figure: SANA-1.6B, 1024², 20 steps, CFG (text bucket 64; 300 in a plain pipeline)."""
    import inspect

    from diffusers import SanaTransformer2DModel

    # The class defaults are the published 1600M config (benchmarks/common.py SANA_1600M).
    defaults = {k: v.default for k, v in inspect.signature(SanaTransformer2DModel.__init__).parameters.items()
                if k != "self"}
    per_image = transformer_flops("sana", defaults, None, _signature(1024, 1024, 64, steps=20, cfg=True)).per_image
    assert 1.10e14 < per_image < 1.15e14
    at_300 = transformer_flops("sana", defaults, None, _signature(1024, 1024, 300, steps=20, cfg=True)).per_image
    assert 1.17e14 < at_300 < 1.20e14


def test_unknown_families_are_not_counted():
    sig = _signature(1024, 1024, 64, steps=20, cfg=True)
    assert transformer_flops("no_such_family", {}, None, sig) is None
    out = flops_summary("no_such_family", sig, images=10, seconds=5.0, transformer_config={})
    assert out["counted"] is False and "not counted" in out["reason"] and "sana" in out["reason"]


def test_summary_states_tflops_against_the_peak():
    sig = _signature(128, 128, 64, steps=20, cfg=True)
    per_image = transformer_flops("sana", SANA_TINY, None, sig).per_image
    out = flops_summary("sana", sig, images=50, seconds=2.0, transformer_config=SANA_TINY, peak_tflops=1e-3)
    assert out["flops_per_image"] == per_image
    assert out["tflops"] == round(per_image * 50 / 2.0 / 1e12, 2)
    assert out["peak_fraction"] == round(per_image * 50 / 2.0 / 1e12 / 1e-3, 4)


def test_a_mix_of_signatures_is_counted_image_by_image():
    from jobs.models.flops import flops_summary_mix

    a, b = _signature(128, 128, 64, steps=20, cfg=True), _signature(256, 128, 300, steps=8)
    per = {s: transformer_flops("sana", SANA_TINY, None, s).per_image for s in (a, b)}
    out = flops_summary_mix("sana", {a: 3, b: 1}, 2.0, transformer_config=SANA_TINY)
    assert out["flops_per_image"] == (3 * per[a] + per[b]) / 4
    assert out["tflops"] == round((3 * per[a] + per[b]) / 2.0 / 1e12, 2)


def test_flux_guidance_is_one_row_not_cfg():
    """The plan marks Flux.1-dev's guidance 3.5 as cfg (guidance > 1), but FluxPipeline runs it as an
    embedding, one transformer row a step: the count must not double it."""
    one = transformer_flops("flux", dict(FLUX_TINY), None, _signature(64, 64, 8, steps=4))
    guided = transformer_flops("flux", dict(FLUX_TINY), None, _signature(64, 64, 8, steps=4, cfg=True))
    assert guided.rows == 1 and guided.per_image == one.per_image == 4 * one.per_forward


def test_the_peak_is_the_boards_own():
    """An H100 PCIe board is not the SXM board's 989 TFLOP/s: the fraction would read a quarter low."""
    from jobs.models.flops.base import peak_by_name

    assert peak_by_name("NVIDIA H100 80GB HBM3") == 989.0  # SXM, as the device machine names it
    assert peak_by_name("NVIDIA H100 PCIe") == 756.0
    assert peak_by_name("NVIDIA H100 NVL") == 835.0
    assert peak_by_name("NVIDIA H200") == 989.0
    assert peak_by_name("NVIDIA A100-SXM4-80GB") == 312.0
    assert peak_by_name("NVIDIA GeForce RTX 4090") is None

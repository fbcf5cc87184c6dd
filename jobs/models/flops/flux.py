"""Flux's FLOPs rule: diffusers FluxTransformer2DModel with its AutoencoderKL (tests/test_flops.py)."""

from __future__ import annotations

from typing import Optional

from jobs.models.flops.base import FlopCount, get, linear, register_flops, vae_scale_kl


@register_flops("flux")
def flux_flops(config: dict, vae_config: Optional[dict], signature) -> FlopCount:
    """diffusers FluxTransformer2DModel, one row (Flux.1-dev is guidance-distilled: no CFG rows).
    FluxPipeline packs 2x2 latent patches into tokens (in_channels = 4 x the VAE's channels), so an
    image has (H / 16) x (W / 16) tokens with the 8x VAE. Double blocks: adaLN-zero linears of the
    image and text streams, their q/k/v and outputs, joint softmax attention over text + image,
    the two 4x GELU MLPs; single blocks over the joined sequence: adaLN, q/k/v, the 4x MLP, one
    output linear over attention and MLP together. The prompt part: the context embedder and the
    pooled text projection (the text stream is updated by every block, so nothing else is)."""
    scale = 2 * vae_scale_kl(vae_config, 8)  # 2x2 packing on top of the VAE
    p = int(get(config, "patch_size", 1))
    n = (signature.height // scale // p) * (signature.width // scale // p)
    t = int(signature.text_bucket)
    s = n + t
    d = int(get(config, "num_attention_heads", 24)) * int(get(config, "attention_head_dim", 128))
    c_in = int(get(config, "in_channels", 64))
    c_out = int(get(config, "out_channels", None) or c_in)
    ff = 4 * d  # FeedForward's default mult and the single blocks' mlp_ratio

    def attention(tokens: int) -> float:
        return 4.0 * tokens * tokens * d

    double = (2 * linear(1, d, 6 * d) + 4 * linear(n, d, d) + 4 * linear(t, d, d) + attention(s)
              + linear(n, d, ff) + linear(n, ff, d) + linear(t, d, ff) + linear(t, ff, d))
    single = linear(1, d, 3 * d) + 3 * linear(s, d, d) + attention(s) + linear(s, d, ff) + linear(s, d + ff, d)
    embedders = 2 if get(config, "guidance_embeds", False) else 1
    time = embedders * (linear(1, 256, d) + linear(1, d, d))
    image = (linear(n, c_in, d) + time + int(get(config, "num_layers", 19)) * double
             + int(get(config, "num_single_layers", 38)) * single + linear(1, d, 2 * d)
             + linear(n, d, p * p * c_out))
    pooled = int(get(config, "pooled_projection_dim", 768))
    prompt = linear(t, int(get(config, "joint_attention_dim", 4096)), d) + linear(1, pooled, d) + linear(1, d, d)
    # One row whatever signature.cfg says: the plan marks guidance > 1 as CFG, but FluxPipeline runs
    # Flux.1-dev's guidance as an embedding (true_cfg_scale=1: no negative branch, jobs/models/flux.py).
    return FlopCount(per_forward_image=image, per_forward_prompt=prompt, steps=int(signature.steps), rows=1)

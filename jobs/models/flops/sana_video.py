"""SANA-Video's FLOPs rule: diffusers SanaVideoTransformer3DModel with the Wan VAE
(tests/test_flops_sana_video.py)."""

from __future__ import annotations

from typing import Optional

from jobs.models.flops.base import FlopCount, get, linear, register_flops


def _vae_scales(vae_config: Optional[dict]) -> tuple:
    """(spatial, temporal) as SanaVideoPipeline reads them: AutoencoderKLWan's scale_factor_spatial /
    scale_factor_temporal (8 and 4 by default), LTX-2's VAE's *_compression_ratio."""
    vae = vae_config or {}
    spatial = vae.get("scale_factor_spatial") or vae.get("spatial_compression_ratio") or 8
    temporal = vae.get("scale_factor_temporal") or vae.get("temporal_compression_ratio") or 4
    return int(spatial), int(temporal)


@register_flops("sana_video")
def sana_video_flops(config: dict, vae_config: Optional[dict], signature) -> FlopCount:
    """diffusers SanaVideoTransformer3DModel (its config.json keys and defaults: SANA-Video 2B), one
    row. Latents: (frames - 1) // 4 + 1 latent frames of (H / 8) x (W / 8) (SanaVideoPipeline's
    prepare_latents, the Wan VAE's scales), cut into patch_size (1, 2, 2) tokens by a Conv3d patch
    embed. Per block: ReLU linear self-attention (q, k, v, out; with rotary q and k per head V K^T
    then that times Q, and the normalizer K-sum times Q), cross-attention (q, out on the latents;
    k, v on the projected caption; softmax attention over the text), GLUMBTempConv (1x1 up to 2x
    hidden, 3x3 depthwise, 1x1 down, then a 3-tap temporal conv over frames, d to d). The timestep
    embedding (256 -> d -> d) and adaLN-single's linear to 6 modulations, once a row; with
    guidance_embeds a second embedder of the guidance (counted as for a forward given `guidance`:
    SanaVideoPipeline passes none, and such a model's forward then fails); the output projection.
    The prompt part: the caption projection (two linears) and every block's cross-attention K/V
    over the text, which no block updates."""
    p_t, p_h, p_w = (int(x) for x in get(config, "patch_size", (1, 2, 2)))
    spatial, temporal = _vae_scales(vae_config)
    latent_frames = (int(getattr(signature, "frames", 1)) - 1) // temporal + 1
    n = (latent_frames // p_t) * (signature.height // spatial // p_h) * (signature.width // spatial // p_w)
    t = int(signature.text_bucket)
    heads, head_dim = int(get(config, "num_attention_heads", 20)), int(get(config, "attention_head_dim", 112))
    d = heads * head_dim
    x_dim = int(get(config, "num_cross_attention_heads", 20)) * int(get(config, "cross_attention_head_dim", 112))
    kv_in = int(get(config, "cross_attention_dim", 2240))
    hidden = int(float(get(config, "mlp_ratio", 2.5)) * d)
    layers = int(get(config, "num_layers", 20))
    c_in = int(get(config, "in_channels", 16))
    c_out = int(get(config, "out_channels", None) or c_in)
    caption = int(get(config, "caption_channels", 2304))
    patch = p_t * p_h * p_w

    # Linear attention per head of width c over n tokens: V K^T (2 c c n), times Q (2 c c n), and
    # the normalizer sum(K)^T Q (2 c n).
    self_attn = 4 * linear(n, d, d) + heads * (4.0 * head_dim * head_dim * n + 2.0 * head_dim * n)
    cross_image = linear(n, d, x_dim) + linear(n, x_dim, d) + 4.0 * n * t * x_dim
    ff = (linear(n, d, 2 * hidden) + 2.0 * n * 2 * hidden * 9 + linear(n, hidden, d)
          + 3 * linear(n, d, d))  # the temporal conv: kernel (3, 1) over (frames, h x w), d to d
    block_image = self_attn + cross_image + ff
    embedders = 2 if get(config, "guidance_embeds", False) else 1
    time = embedders * (linear(1, 256, d) + linear(1, d, d)) + linear(1, d, 6 * d)
    image = linear(n, c_in * patch, d) + layers * block_image + time + linear(n, d, patch * c_out)
    prompt = linear(t, caption, d) + linear(t, d, d) + layers * 2 * linear(t, kv_in, x_dim)
    # CFG: SanaVideoPipeline runs the negative and the positive as one batch of 2 (both at the bucket's length).
    return FlopCount(per_forward_image=image, per_forward_prompt=prompt, steps=int(signature.steps),
                     rows=2 if signature.cfg else 1)

